//! The peer check: the bridge serves only sockets of its own process,
//! found through the kernel's TCP table and `/proc/self/fd`.

use std::net::{SocketAddr, SocketAddrV4};

/// A socket of this process that connected to the bridge: its file
/// descriptor and the inode that names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct OwnSocket {
    fd: i32,
    inode: u64,
}

/// The socket of this process that opened the TCP connection from `peer`
/// to `bridge`, if one did: the connecting socket (local `peer`, remote
/// `bridge`) is found in this network namespace's TCP table, and its inode
/// is one of this process's open files. `None`: another process's.
pub(super) fn own_socket(
    peer: SocketAddr,
    bridge: SocketAddr,
) -> std::io::Result<Option<OwnSocket>> {
    let (SocketAddr::V4(peer), SocketAddr::V4(bridge)) = (peer, bridge) else {
        return Ok(None);
    };
    let table = std::fs::read_to_string("/proc/self/net/tcp")?;
    let Some(inode) = socket_inode(&table, peer, bridge) else {
        return Ok(None);
    };
    let wanted = format!("socket:[{inode}]");
    for entry in std::fs::read_dir("/proc/self/fd")? {
        let Ok(entry) = entry else { continue };
        if std::fs::read_link(entry.path()).is_ok_and(|target| target.as_os_str() == &*wanted)
            && let Some(fd) = entry.file_name().to_str().and_then(|n| n.parse().ok())
        {
            return Ok(Some(OwnSocket { fd, inode }));
        }
    }
    Ok(None)
}

impl OwnSocket {
    /// Turns Nagle's algorithm off on this socket (`TCP_NODELAY`), which
    /// rskafka opened and never sets: it writes a request's length and its
    /// body in two writes, and with Nagle's algorithm on, a body's last
    /// part waited for the acknowledgement of what went before, which the
    /// broker may delay by 40 ms. The socket is reached through a copy of
    /// its descriptor (`pidfd_getfd` on this process), checked to be the
    /// same socket (its inode) before the option is set.
    pub(super) fn set_nodelay(self) -> std::io::Result<()> {
        use rustix::process::{PidfdFlags, PidfdGetfdFlags, getpid, pidfd_getfd, pidfd_open};
        let me = pidfd_open(getpid(), PidfdFlags::empty())?;
        let socket = pidfd_getfd(&me, self.fd, PidfdGetfdFlags::empty())?;
        if rustix::fs::fstat(&socket)?.st_ino != self.inode {
            return Err(std::io::Error::other(
                "the descriptor names another file now",
            ));
        }
        rustix::net::sockopt::set_tcp_nodelay(&socket, true)?;
        Ok(())
    }
}

/// The inode of the socket with this local and remote address in a
/// `/proc/net/tcp` table (addresses as the kernel prints them: the IPv4
/// address as a native-endian hex word, the port as hex).
pub(super) fn socket_inode(table: &str, local: SocketAddrV4, remote: SocketAddrV4) -> Option<u64> {
    let hex = |a: SocketAddrV4| {
        format!(
            "{:08X}:{:04X}",
            u32::from_ne_bytes(a.ip().octets()),
            a.port()
        )
    };
    let (local, remote) = (hex(local), hex(remote));
    table.lines().skip(1).find_map(|line| {
        let fields: Vec<&str> = line.split_whitespace().collect();
        (fields.len() > 9 && fields[1] == local && fields[2] == remote)
            .then(|| fields[9].parse().ok())
            .flatten()
            .filter(|inode| *inode != 0)
    })
}

#[cfg(test)]
mod tests {
    use std::{net::Ipv4Addr, time::Duration};

    use tokio::{
        io::{AsyncReadExt, AsyncWriteExt},
        net::{TcpListener, TcpStream},
    };

    use super::*;
    use crate::{config::KafkaTls, outbox::kafka::tls_bridge::TlsBridge};

    #[test]
    fn finds_the_connecting_socket_in_the_tcp_table() {
        // Kernel format: local 127.0.0.1:40000, remote 127.0.0.1:8080.
        let table = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n   \
            0: 0100007F:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 111 1 0 100 0 0 10 0\n   \
            1: 0100007F:9C40 0100007F:1F90 01 00000000:00000000 00:00000000 00000000     0        0 222 1 0 20 4 30 10 -1\n   \
            2: 0100007F:1F90 0100007F:9C40 01 00000000:00000000 00:00000000 00000000     0        0 333 1 0 20 4 30 10 -1\n";
        let local = SocketAddrV4::new(Ipv4Addr::LOCALHOST, 40000);
        let bridge = SocketAddrV4::new(Ipv4Addr::LOCALHOST, 8080);
        if cfg!(target_endian = "little") {
            assert_eq!(socket_inode(table, local, bridge), Some(222));
            assert_eq!(socket_inode(table, bridge, local), Some(333));
        }
        let elsewhere = SocketAddrV4::new(Ipv4Addr::LOCALHOST, 40001);
        assert_eq!(socket_inode(table, elsewhere, bridge), None);
    }

    /// A connection of this process to a listener of its own: the client's
    /// socket, the accepted one, the client's address and the listener's.
    async fn own_connection() -> (TcpStream, TcpStream, SocketAddr, SocketAddr) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        let client = TcpStream::connect(address).await.unwrap();
        let (accepted, peer) = listener.accept().await.unwrap();
        (client, accepted, peer, address)
    }

    #[tokio::test]
    async fn accepts_its_own_connections_and_refuses_others() {
        let (client, _accepted, peer, address) = own_connection().await;
        assert!(own_socket(peer, address).unwrap().is_some());
        // A peer address no socket of this process has.
        let stranger = SocketAddr::from((Ipv4Addr::LOCALHOST, 1));
        assert_eq!(own_socket(stranger, address).unwrap(), None);
        drop(client);
    }

    #[tokio::test]
    async fn sets_nodelay_on_the_connecting_socket() {
        let (client, _accepted, peer, address) = own_connection().await;
        assert!(!client.nodelay().unwrap());
        let socket = own_socket(peer, address).unwrap().unwrap();
        socket.set_nodelay().unwrap();
        assert!(
            client.nodelay().unwrap(),
            "TCP_NODELAY on the client's socket"
        );
    }

    #[tokio::test]
    async fn another_process_is_refused() {
        // A connection made by a child process (bash's /dev/tcp) must be
        // closed before anything is read or answered.
        let tls = KafkaTls {
            ca: None,
            client: None,
        };
        let bridge = TlsBridge::listen(Some(tls), None, Duration::from_secs(2))
            .await
            .unwrap();
        let port = bridge.shared.address.port();
        let script = format!(
            "exec 3<>/dev/tcp/127.0.0.1/{port}; printf '\\005\\001\\000' >&3; \
             timeout 2 head -c 2 <&3 | od -An -tx1"
        );
        let output = tokio::process::Command::new("bash")
            .args(["-c", &script])
            .output()
            .await
            .unwrap();
        let answer = String::from_utf8_lossy(&output.stdout);
        assert_eq!(answer.trim(), "", "the bridge answered another process");
        // This process itself is served: the SOCKS5 greeting is answered.
        let mut own = TcpStream::connect(bridge.proxy()).await.unwrap();
        own.write_all(&[5, 1, 0]).await.unwrap();
        let mut answer = [0u8; 2];
        own.read_exact(&mut answer).await.unwrap();
        assert_eq!(answer, [5, 0]);
    }
}
