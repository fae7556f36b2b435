//! The relay between rskafka's plaintext socket and the broker's TLS
//! stream, with the sniffer that spots a refused SASL login.

use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::TcpStream,
};

use super::Shared;
use super::diagnostics::{SecurityError, explain, rustls_error};

/// The Kafka API keys of the login, and how many frames each way are
/// looked at (the login comes first on every connection).
pub(super) const SASL_HANDSHAKE: i16 = 17;
pub(super) const SASL_AUTHENTICATE: i16 = 36;
pub(super) const SNIFFED_FRAMES: usize = 8;

/// Reads the first frames of one direction of a Kafka connection, only
/// their first bytes: request headers (api key, version, correlation id)
/// one way, response headers and error codes the other. Nothing is
/// changed or kept beyond the login's error codes.
#[derive(Default)]
pub(super) struct Sniffer {
    /// Bytes of the current frame's length and head read so far.
    head: Vec<u8>,
    /// Bytes of the current frame still to skip.
    skip: usize,
    frames: usize,
}

/// The bytes of a frame's head the sniffer looks at.
pub(super) const HEAD: usize = 12;

impl Sniffer {
    /// Feeds bytes; calls `frame` with the head (up to [`HEAD`] bytes
    /// after the length) of every frame that starts in them.
    fn feed(&mut self, mut data: &[u8], mut frame: impl FnMut(&[u8])) {
        while !data.is_empty() && self.frames < SNIFFED_FRAMES {
            if self.skip > 0 {
                let n = self.skip.min(data.len());
                self.skip -= n;
                data = &data[n..];
                continue;
            }
            let length = if self.head.len() >= 4 {
                Some(i32::from_be_bytes([
                    self.head[0],
                    self.head[1],
                    self.head[2],
                    self.head[3],
                ]))
            } else {
                None
            };
            let wanted = match length {
                None => 4,
                Some(length) => 4 + usize::try_from(length).unwrap_or(0).min(HEAD),
            };
            let n = (wanted - self.head.len()).min(data.len());
            self.head.extend_from_slice(&data[..n]);
            data = &data[n..];
            if let Some(length) = length
                && self.head.len() == wanted
            {
                frame(&self.head[4..]);
                self.skip = usize::try_from(length).unwrap_or(0) - (wanted - 4);
                self.head.clear();
                self.frames += 1;
            }
        }
    }
}

/// The login requests seen so far: correlation id → (api key, version).
pub(super) type LoginRequests = std::sync::Mutex<Vec<(i32, i16, i16)>>;

/// The error code of a response to a login request, if it is one.
pub(super) fn login_error(head: &[u8], requests: &LoginRequests) -> Option<i16> {
    let correlation = i32::from_be_bytes(head.get(..4)?.try_into().ok()?);
    let (_, key, version) = *requests
        .lock()
        .ok()?
        .iter()
        .find(|(id, _, _)| *id == correlation)?;
    // SaslAuthenticate v2+ is a flexible version: its response header
    // carries tagged fields (one zero byte when there are none).
    let at = if key == SASL_AUTHENTICATE && version >= 2 {
        5
    } else {
        4
    };
    Some(i16::from_be_bytes(head.get(at..at + 2)?.try_into().ok()?))
}

/// Bytes read at once on each side of a relayed connection: a loopback
/// segment (64 KB), so a 500-record request crosses in a few reads.
const RELAY_BUFFER: usize = 64 * 1024;

/// Copies bytes both ways until both sides are done. It reads the
/// login's error codes as they pass (a refused SASL login is reported by
/// the broker in a response, and then rskafka closes) and a refusal into
/// the broker's way of ending the connection.
pub(super) async fn relay<S>(client: TcpStream, broker_stream: S, broker: &str, shared: &Shared)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Unpin,
{
    let (mut client_read, mut client_write) = client.into_split();
    let (mut tls_read, mut tls_write) = tokio::io::split(broker_stream);
    let requests = LoginRequests::default();
    let refused = std::sync::atomic::AtomicBool::new(false);
    let up = async {
        let mut sniffer = Sniffer::default();
        let mut buffer = vec![0u8; RELAY_BUFFER];
        loop {
            let n = match client_read.read(&mut buffer).await {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            sniffer.feed(&buffer[..n], |head| {
                if let (Some(key), Some(version), Some(id)) = (
                    head.get(..2).map(|b| i16::from_be_bytes([b[0], b[1]])),
                    head.get(2..4).map(|b| i16::from_be_bytes([b[0], b[1]])),
                    head.get(4..8)
                        .map(|b| i32::from_be_bytes([b[0], b[1], b[2], b[3]])),
                ) && (key == SASL_HANDSHAKE || key == SASL_AUTHENTICATE)
                    && let Ok(mut seen) = requests.lock()
                {
                    seen.push((id, key, version));
                }
            });
            // rustls keeps what the socket did not take: flush, or a
            // request could wait there for the next one.
            if tls_write.write_all(&buffer[..n]).await.is_err() || tls_write.flush().await.is_err()
            {
                break;
            }
        }
        let _ = tls_write.shutdown().await;
    };
    // The client's side is closed only after a refusal was recorded (at
    // the end), so rskafka, which reads the end of the stream, finds the
    // reason when it asks the bridge.
    let down = async {
        let mut sniffer = Sniffer::default();
        let mut buffer = vec![0u8; RELAY_BUFFER];
        let mut received = 0u64;
        let ended = loop {
            let n = match tls_read.read(&mut buffer).await {
                Ok(0) => break Ok(received),
                Ok(n) => n,
                Err(error) => break Err(error),
            };
            received += n as u64;
            sniffer.feed(&buffer[..n], |head| {
                if login_error(head, &requests).is_some_and(|code| code != 0) {
                    refused.store(true, std::sync::atomic::Ordering::Relaxed);
                }
            });
            if client_write.write_all(&buffer[..n]).await.is_err() {
                break Ok(received);
            }
        };
        (ended, client_write)
    };
    tokio::pin!(up, down);
    let (broker_ended, mut client_write) = tokio::select! {
        // The client (rskafka) closed first: the usual end.
        () = &mut up => {
            let (_, client_write) = down.await;
            (None, client_write)
        }
        (ended, client_write) = &mut down => (Some(ended), client_write),
    };
    record_refusal(
        broker_ended,
        refused.load(std::sync::atomic::Ordering::Relaxed),
        broker,
        shared,
    );
    let _ = client_write.shutdown().await;
    // The client may still be writing (the broker ended first): it stops
    // at the closed stream.
    drop(client_write);
}

/// Records why the broker ended a connection, if it refused this client:
/// a SASL login answered with an error, a TLS alert, or the connection
/// closed right after the handshake.
fn record_refusal(
    broker_ended: Option<std::io::Result<u64>>,
    login_refused: bool,
    broker: &str,
    shared: &Shared,
) {
    if login_refused {
        shared.fail(SecurityError::Sasl {
            mechanism: shared.sasl.unwrap_or("login"),
            servers: broker.to_owned(),
        });
        return;
    }
    // Plain TCP: a connection the broker ends is no refusal of this
    // client's (it restarts, or closes an idle connection).
    let Some(tls) = &shared.tls else {
        return;
    };
    match broker_ended {
        // TLS 1.3 finishes the client's side of the handshake before the
        // broker checks the client certificate: its refusal arrives here,
        // as an alert, or (Java) as the connection closing at once.
        Some(Err(error)) if rustls_error(&error).is_some() => {
            if let Some(tls_error) = rustls_error(&error) {
                shared.fail(explain(tls_error, broker, tls));
            }
        }
        Some(Ok(0) | Err(_)) => shared.fail(SecurityError::Handshake {
            broker: broker.to_owned(),
            problem: "the broker closed the connection right after the TLS handshake".to_owned(),
            hint: if tls.client.is_some() {
                "it refused the client certificate? check KAFKA_SSL_CERTIFICATE_LOCATION".to_owned()
            } else {
                "it requires a client certificate? set KAFKA_SSL_CERTIFICATE_LOCATION and \
                 KAFKA_SSL_KEY_LOCATION"
                    .to_owned()
            },
        }),
        _ => {}
    }
}

/// Acknowledges at once what rskafka sends. Its SOCKS5 client writes the
/// request a byte or a field at a time on a socket with Nagle's algorithm
/// on, so each write waits for the ACK of the one before: with Linux's
/// delayed ACK that cost 40 ms per new broker connection (seen with
/// strace). The flag does not stick, hence before every read.
pub(super) fn quick_ack(stream: &TcpStream) {
    #[cfg(target_os = "linux")]
    let _ = socket2::SockRef::from(stream).set_tcp_quickack(true);
    #[cfg(not(target_os = "linux"))]
    let _ = stream;
}

/// `read_exact`, acknowledging at once ([`quick_ack`]).
pub(super) async fn read_acked(
    stream: &mut TcpStream,
    buffer: &mut [u8],
) -> std::io::Result<usize> {
    quick_ack(stream);
    stream.read_exact(buffer).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_sniffer_finds_a_refused_sasl_login_across_split_reads() {
        // SaslAuthenticate v2, correlation id 7; then its response with
        // error 58 (SASL_AUTHENTICATION_FAILED) after a tagged-field byte.
        let mut request = vec![0, 0, 0, 20, 0, 36, 0, 2, 0, 0, 0, 7];
        request.extend([0u8; 12]);
        let mut response = vec![0, 0, 0, 9, 0, 0, 0, 7, 0, 0, 58];
        response.extend([0u8; 2]);
        let requests = LoginRequests::default();
        let mut up = Sniffer::default();
        for chunk in request.chunks(5) {
            up.feed(chunk, |head| {
                let key = i16::from_be_bytes([head[0], head[1]]);
                let version = i16::from_be_bytes([head[2], head[3]]);
                let id = i32::from_be_bytes([head[4], head[5], head[6], head[7]]);
                requests.lock().unwrap().push((id, key, version));
            });
        }
        assert_eq!(*requests.lock().unwrap(), [(7, SASL_AUTHENTICATE, 2)]);
        let mut codes = Vec::new();
        let mut down = Sniffer::default();
        for chunk in response.chunks(3) {
            down.feed(chunk, |head| codes.push(login_error(head, &requests)));
        }
        assert_eq!(codes, [Some(58)]);
    }
}
