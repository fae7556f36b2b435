//! The SOCKS5 subset rskafka speaks: one CONNECT to a host name and port,
//! no authentication.

use std::net::{Ipv4Addr, Ipv6Addr};

use tokio::{io::AsyncWriteExt, net::TcpStream};

use super::relay::read_acked;

/// SOCKS5 reply codes (RFC 1928).
pub(super) const REPLY_OK: u8 = 0x00;
pub(super) const REPLY_FAILURE: u8 = 0x01;
pub(super) const REPLY_HOST_UNREACHABLE: u8 = 0x04;
pub(super) const REPLY_COMMAND_UNSUPPORTED: u8 = 0x07;

pub(super) async fn reply(stream: &mut TcpStream, code: u8) -> std::io::Result<()> {
    // Bound address 0.0.0.0:0: rskafka does not use it.
    stream.write_all(&[5, code, 0, 1, 0, 0, 0, 0, 0, 0]).await
}

/// Reads the SOCKS5 greeting (no authentication) and CONNECT request;
/// `None` for anything but CONNECT.
pub(super) async fn socks_request(
    stream: &mut TcpStream,
) -> std::io::Result<Option<(String, u16)>> {
    let invalid =
        |what: &str| std::io::Error::new(std::io::ErrorKind::InvalidData, what.to_owned());
    let mut head = [0u8; 2];
    read_acked(stream, &mut head).await?;
    if head[0] != 5 {
        return Err(invalid("not SOCKS5"));
    }
    let mut methods = vec![0u8; usize::from(head[1])];
    read_acked(stream, &mut methods).await?;
    if !methods.contains(&0) {
        stream.write_all(&[5, 0xFF]).await?;
        return Err(invalid("no acceptable SOCKS5 method"));
    }
    stream.write_all(&[5, 0]).await?;
    let mut request = [0u8; 4];
    read_acked(stream, &mut request).await?;
    if request[0] != 5 {
        return Err(invalid("not SOCKS5"));
    }
    let host = match request[3] {
        1 => {
            let mut ip = [0u8; 4];
            read_acked(stream, &mut ip).await?;
            Ipv4Addr::from(ip).to_string()
        }
        3 => {
            let mut len = [0u8; 1];
            read_acked(stream, &mut len).await?;
            let mut name = vec![0u8; usize::from(len[0])];
            read_acked(stream, &mut name).await?;
            String::from_utf8(name).map_err(|_| invalid("host name is not UTF-8"))?
        }
        4 => {
            let mut ip = [0u8; 16];
            read_acked(stream, &mut ip).await?;
            Ipv6Addr::from(ip).to_string()
        }
        _ => return Err(invalid("unknown SOCKS5 address type")),
    };
    let mut port = [0u8; 2];
    read_acked(stream, &mut port).await?;
    Ok((request[1] == 1).then(|| (host, u16::from_be_bytes(port))))
}
