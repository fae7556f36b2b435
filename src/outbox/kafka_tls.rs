//! TLS to Kafka without C: an in-process SOCKS5-to-TLS bridge.
//!
//! rskafka 0.6's own TLS (`transport-tls`) switches on `ring`, which
//! compiles C. Its `transport-socks5` feature does not: with it, rskafka
//! opens every broker connection (bootstrap and discovered brokers alike)
//! as a plain TCP connection to a SOCKS5 proxy and asks the proxy for
//! `host:port`. [`TlsBridge`] is that proxy, inside this process, on an
//! ephemeral port of 127.0.0.1: for each request it opens TCP to the broker
//! and runs the TLS handshake itself, with rustls on the pure-Rust graviola
//! provider ([`crate::tls`]), then tells rskafka "connected" and copies
//! bytes both ways. rskafka's Kafka protocol and SASL run inside the
//! encrypted stream, unchanged.
//!
//! Security of the bridge:
//!
//! - It listens on 127.0.0.1 only, and accepts only this process's own
//!   connections: for each accepted socket it looks up the connecting
//!   socket in `/proc/self/net/tcp` (local address = the peer's, remote =
//!   the bridge's) and requires that socket's inode among this process's
//!   open files (`/proc/self/fd`). Another process on the host (another
//!   user, a sidecar in the same pod) is refused before a byte is read.
//!   rskafka 0.6 sends no SOCKS5 credentials (it calls `async_socks5`
//!   with no auth), so a shared secret was not available; the socket
//!   ownership check is stronger anyway, as it needs no secret at all.
//! - The plaintext leg never leaves the process's loopback socket pair.
//! - The broker's certificate is verified against `KAFKA_SSL_CA_LOCATION`
//!   (or the bundled webpki roots) and the host name rskafka asked for,
//!   always (SNI is that name too); an IP address is checked against the
//!   certificate's IP addresses.
//! - The CA, certificate and key files are read again for every new
//!   broker connection, so rotated files are used without a restart.
//!
//! A failed handshake answers rskafka's SOCKS5 request with an error, so
//! rskafka fails (and retries within `KAFKA_REQUEST_TIMEOUT`) instead of
//! hanging; the reason, in the words of the setting that fixes it, is kept
//! for [`super::kafka::KafkaSink`] to report ([`TlsBridge::take_failure`]).

use std::{
    net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4},
    path::Path,
    sync::{Arc, Mutex},
    time::Duration,
};

use rustls::{ClientConfig, client::WebPkiServerVerifier, pki_types::ServerName};
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::{TcpListener, TcpStream},
    task::JoinHandle,
};
use tokio_rustls::TlsConnector;

use crate::{
    config::{ConfigError, KafkaSettings, KafkaTls, SaslMechanism, SecurityProtocol},
    tls::{TlsFileError, key_problem, load_certs, load_key, provider},
};

/// A Kafka connection that failed for a reason of security settings, in
/// one line that names the setting to check. Never holds key material or
/// a password.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SecurityError {
    /// A CA, certificate or key file, read for a new connection.
    #[error("Kafka TLS: {0}")]
    File(#[from] TlsFileError),
    /// The local bridge could not start.
    #[error("Kafka TLS: cannot start the in-process TLS bridge ({0})")]
    Bridge(String),
    /// TCP to the broker failed (before any TLS).
    #[error("cannot connect to broker {broker} ({problem})")]
    Connect { broker: String, problem: String },
    /// The TLS handshake failed, or the broker refused the connection right
    /// after it.
    #[error("Kafka TLS: {problem} for broker {broker} ({hint})")]
    Handshake {
        broker: String,
        problem: String,
        hint: String,
    },
    /// The broker refused the SASL credentials (or, seen from the
    /// bridge, closed the connection during authentication).
    #[error(
        "Kafka SASL {mechanism} authentication failed at {servers} \
         (check KAFKA_SASL_USERNAME, KAFKA_SASL_PASSWORD and KAFKA_SASL_MECHANISM)"
    )]
    Sasl {
        mechanism: &'static str,
        servers: String,
    },
    /// A plaintext client whose broker closed the connection at the first
    /// request: what a TLS listener does with plaintext.
    #[error(
        "broker {servers} closed the connection at the first request \
         (a TLS listener? KAFKA_SECURITY_PROTOCOL is {protocol}; use SSL or SASL_SSL for TLS)"
    )]
    NotPlaintext {
        servers: String,
        protocol: SecurityProtocol,
    },
}

/// The check at start of the Kafka TLS settings, before anything
/// connects: the CPU can run the TLS library, and the files
/// [`client_config`] will read for every connection are readable and
/// well-formed. Its error names the setting to fix (an exit 2).
pub fn check(kafka: &KafkaSettings) -> Result<(), ConfigError> {
    let Some(tls) = &kafka.tls else {
        return Ok(());
    };
    if !crate::tls::cpu_supported() {
        return Err(ConfigError::new(
            "KAFKA_SECURITY_PROTOCOL",
            format!(
                "{} needs TLS, and this CPU cannot run the TLS library \
                 (graviola needs x86_64 with AVX2, ADX and BMI2, or aarch64)",
                kafka.security_protocol()
            ),
        ));
    }
    client_config(tls)
        .map(drop)
        .map_err(|e| ConfigError::new(e.setting, format!("{}: {}", e.path.display(), e.problem)))
}

/// The rustls configuration for one new broker connection, the files read
/// now: the trusted CAs and the client certificate of `tls`, host names
/// always verified.
pub fn client_config(tls: &KafkaTls) -> Result<ClientConfig, TlsFileError> {
    let provider = provider();
    let roots = match &tls.ca {
        Some(path) => crate::tls::root_store_from("KAFKA_SSL_CA_LOCATION", path)?,
        None => crate::tls::bundled_roots(),
    };
    let ca_error = |problem: String| {
        TlsFileError::new(
            "KAFKA_SSL_CA_LOCATION",
            tls.ca
                .as_deref()
                .unwrap_or(Path::new("(bundled webpki roots)")),
            problem,
        )
    };
    let verifier = WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider.clone())
        .build()
        .map_err(|e| ca_error(format!("no usable root certificate ({e})")))?;
    let builder = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| ca_error(format!("the TLS provider refuses TLS 1.2/1.3 ({e})")))?
        .with_webpki_verifier(verifier);
    match &tls.client {
        None => Ok(builder.with_no_client_auth()),
        Some(client) => {
            let certs = load_certs("KAFKA_SSL_CERTIFICATE_LOCATION", &client.cert)?;
            let key = load_key("KAFKA_SSL_KEY_LOCATION", &client.key)?;
            builder.with_client_auth_cert(certs, key).map_err(|e| {
                TlsFileError::new(
                    "KAFKA_SSL_KEY_LOCATION",
                    &client.key,
                    format!(
                        "cannot be used with KAFKA_SSL_CERTIFICATE_LOCATION ({})",
                        key_problem(&e)
                    ),
                )
            })
        }
    }
}

/// Why a connect failed, if for a security reason: what the bridge saw
/// (a refused handshake or login), else what rskafka's error says.
pub fn security_failure(
    settings: &KafkaSettings,
    bridge: Option<&TlsBridge>,
    error: Option<&rskafka::client::error::Error>,
) -> Option<SecurityError> {
    bridge.and_then(TlsBridge::take_failure).or_else(|| {
        explain_connect(
            settings.security_protocol(),
            settings.sasl.as_ref().map(|sasl| sasl.mechanism),
            &settings.bootstrap_servers.join(","),
            error?,
        )
    })
}

/// The name of a connect that timed out. A TLS listener answers plaintext
/// with a TLS alert, which rskafka reads as the length of a huge response
/// and waits for: under a plaintext protocol the name says so.
pub fn connect_operation(settings: &KafkaSettings) -> &'static str {
    match settings.security_protocol() {
        SecurityProtocol::Plaintext => {
            "connect (KAFKA_SECURITY_PROTOCOL=PLAINTEXT: a TLS listener?)"
        }
        SecurityProtocol::SaslPlaintext => {
            "connect (KAFKA_SECURITY_PROTOCOL=SASL_PLAINTEXT: a TLS listener?)"
        }
        SecurityProtocol::Ssl | SecurityProtocol::SaslSsl => "connect",
    }
}

/// The security reason of a failed rskafka connection that did not go
/// through the bridge's handshake: refused SASL credentials, or a TLS
/// listener reached in plaintext. rskafka 0.6 does not export its
/// connection error type, so this reads the error's text.
fn explain_connect(
    protocol: SecurityProtocol,
    mechanism: Option<SaslMechanism>,
    servers: &str,
    error: &rskafka::client::error::Error,
) -> Option<SecurityError> {
    let text = error.to_string();
    if let Some(mechanism) = mechanism
        && text.contains("Sasl handshake failed")
    {
        return Some(SecurityError::Sasl {
            mechanism: mechanism_name(mechanism),
            servers: servers.to_owned(),
        });
    }
    let lower = text.to_ascii_lowercase();
    let closed = ["eof", "reset by peer", "broken pipe"]
        .iter()
        .any(|sign| lower.contains(sign));
    (!protocol.tls() && closed).then(|| SecurityError::NotPlaintext {
        servers: servers.to_owned(),
        protocol,
    })
}

fn mechanism_name(mechanism: SaslMechanism) -> &'static str {
    match mechanism {
        SaslMechanism::Plain => "PLAIN",
        SaslMechanism::ScramSha256 => "SCRAM-SHA-256",
        SaslMechanism::ScramSha512 => "SCRAM-SHA-512",
    }
}

/// State shared by the bridge's tasks.
struct Shared {
    tls: KafkaTls,
    /// The SASL mechanism spoken inside the TLS stream (`SASL_SSL`).
    sasl: Option<&'static str>,
    /// Bounds TCP connect plus handshake of one broker connection.
    timeout: Duration,
    address: SocketAddr,
    last_failure: Mutex<Option<SecurityError>>,
}

impl Shared {
    fn fail(&self, error: SecurityError) {
        tracing::debug!(error = %error, "Kafka TLS bridge: connection failed");
        if let Ok(mut last) = self.last_failure.lock() {
            *last = Some(error);
        }
    }
}

/// The in-process SOCKS5-to-TLS proxy of one Kafka client (see the module
/// docs). Its listener task ends when the bridge is dropped; connections
/// already bridged live on until either side closes.
pub struct TlsBridge {
    shared: Arc<Shared>,
    task: JoinHandle<()>,
}

impl std::fmt::Debug for TlsBridge {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsBridge")
            .field("address", &self.shared.address)
            .finish_non_exhaustive()
    }
}

impl Drop for TlsBridge {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl TlsBridge {
    /// Listens on an ephemeral port of 127.0.0.1 (within a tokio runtime),
    /// for the TLS files `tls` of `settings`.
    pub async fn start(tls: &KafkaTls, settings: &KafkaSettings) -> Result<Self, SecurityError> {
        Self::listen(
            tls.clone(),
            settings.sasl.as_ref().map(|sasl| sasl.mechanism),
            settings.request_timeout,
        )
        .await
    }

    async fn listen(
        tls: KafkaTls,
        sasl: Option<SaslMechanism>,
        timeout: Duration,
    ) -> Result<Self, SecurityError> {
        let listener = TcpListener::bind(SocketAddrV4::new(Ipv4Addr::LOCALHOST, 0))
            .await
            .map_err(|e| SecurityError::Bridge(e.to_string()))?;
        let address = listener
            .local_addr()
            .map_err(|e| SecurityError::Bridge(e.to_string()))?;
        let shared = Arc::new(Shared {
            tls,
            sasl: sasl.map(mechanism_name),
            timeout,
            address,
            last_failure: Mutex::new(None),
        });
        let task = tokio::spawn(accept_loop(listener, Arc::clone(&shared)));
        Ok(Self { shared, task })
    }

    /// The proxy address for rskafka's `socks5_proxy`.
    pub fn proxy(&self) -> String {
        self.shared.address.to_string()
    }

    /// [`Self::proxy`] for a new rskafka client, forgetting the failure of
    /// an earlier connect (it is not this one's).
    pub fn proxy_for_new_connect(&self) -> String {
        self.take_failure();
        self.proxy()
    }

    /// Why the latest broker connection failed, if one did since the last
    /// call (a connect takes the old one first, then asks after a failure).
    pub fn take_failure(&self) -> Option<SecurityError> {
        self.shared
            .last_failure
            .lock()
            .ok()
            .and_then(|mut last| last.take())
    }
}

async fn accept_loop(listener: TcpListener, shared: Arc<Shared>) {
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(error) => {
                // EMFILE and the like: wait a little instead of spinning.
                tracing::warn!(%error, "Kafka TLS bridge: accept failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let shared = Arc::clone(&shared);
        tokio::spawn(async move {
            match is_own_connection(peer, shared.address) {
                Ok(true) => serve(stream, shared).await,
                Ok(false) => tracing::warn!(
                    %peer,
                    "Kafka TLS bridge: refused a connection that is not this process's own"
                ),
                Err(error) => tracing::warn!(
                    %peer, %error,
                    "Kafka TLS bridge: refused a connection whose owner cannot be checked"
                ),
            }
        });
    }
}

/// Whether the TCP connection from `peer` to `bridge` was opened by this
/// process: the connecting socket (local `peer`, remote `bridge`) is found
/// in this network namespace's TCP table, and its inode is one of this
/// process's open files.
fn is_own_connection(peer: SocketAddr, bridge: SocketAddr) -> std::io::Result<bool> {
    let (SocketAddr::V4(peer), SocketAddr::V4(bridge)) = (peer, bridge) else {
        return Ok(false);
    };
    let table = std::fs::read_to_string("/proc/self/net/tcp")?;
    let Some(inode) = socket_inode(&table, peer, bridge) else {
        return Ok(false);
    };
    let wanted = format!("socket:[{inode}]");
    for entry in std::fs::read_dir("/proc/self/fd")? {
        let Ok(entry) = entry else { continue };
        if std::fs::read_link(entry.path()).is_ok_and(|target| target.as_os_str() == &*wanted) {
            return Ok(true);
        }
    }
    Ok(false)
}

/// The inode of the socket with this local and remote address in a
/// `/proc/net/tcp` table (addresses as the kernel prints them: the IPv4
/// address as a native-endian hex word, the port as hex).
fn socket_inode(table: &str, local: SocketAddrV4, remote: SocketAddrV4) -> Option<u64> {
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

/// SOCKS5 reply codes (RFC 1928).
const REPLY_OK: u8 = 0x00;
const REPLY_FAILURE: u8 = 0x01;
const REPLY_HOST_UNREACHABLE: u8 = 0x04;
const REPLY_COMMAND_UNSUPPORTED: u8 = 0x07;

async fn reply(stream: &mut TcpStream, code: u8) -> std::io::Result<()> {
    // Bound address 0.0.0.0:0: rskafka does not use it.
    stream.write_all(&[5, code, 0, 1, 0, 0, 0, 0, 0, 0]).await
}

/// One SOCKS5 CONNECT from rskafka: the broker's TCP and TLS, then bytes
/// both ways.
async fn serve(mut client: TcpStream, shared: Arc<Shared>) {
    let _ = client.set_nodelay(true);
    let target = match tokio::time::timeout(shared.timeout, socks_request(&mut client)).await {
        Ok(Ok(Some(target))) => target,
        Ok(Ok(None)) => {
            let _ = reply(&mut client, REPLY_COMMAND_UNSUPPORTED).await;
            return;
        }
        Ok(Err(_)) | Err(_) => return,
    };
    let (host, port) = target;
    let broker = match host.parse::<IpAddr>() {
        Ok(IpAddr::V6(ip)) => format!("[{ip}]:{port}"),
        _ => format!("{host}:{port}"),
    };
    let connected =
        tokio::time::timeout(shared.timeout, connect_tls(&host, port, &broker, &shared))
            .await
            .unwrap_or_else(|_| {
                Err((
                    REPLY_HOST_UNREACHABLE,
                    SecurityError::Handshake {
                        broker: broker.clone(),
                        problem: format!(
                            "no TLS handshake within KAFKA_REQUEST_TIMEOUT ({:?})",
                            shared.timeout
                        ),
                        hint: "check KAFKA_BOOTSTRAP_SERVERS and that the listener speaks TLS"
                            .to_owned(),
                    },
                ))
            });
    let tls = match connected {
        Ok(tls) => tls,
        Err((code, error)) => {
            shared.fail(error);
            let _ = reply(&mut client, code).await;
            return;
        }
    };
    if reply(&mut client, REPLY_OK).await.is_err() {
        return;
    }
    relay(client, tls, &broker, &shared).await;
}

/// The Kafka API keys of the login, and how many frames each way are
/// looked at (the login comes first on every connection).
const SASL_HANDSHAKE: i16 = 17;
const SASL_AUTHENTICATE: i16 = 36;
const SNIFFED_FRAMES: usize = 8;

/// Reads the first frames of one direction of a Kafka connection, only
/// their first bytes: request headers (api key, version, correlation id)
/// one way, response headers and error codes the other. Nothing is
/// changed or kept beyond the login's error codes.
#[derive(Default)]
struct Sniffer {
    /// Bytes of the current frame's length and head read so far.
    head: Vec<u8>,
    /// Bytes of the current frame still to skip.
    skip: usize,
    frames: usize,
}

/// The bytes of a frame's head the sniffer looks at.
const HEAD: usize = 12;

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
type LoginRequests = std::sync::Mutex<Vec<(i32, i16, i16)>>;

/// The error code of a response to a login request, if it is one.
fn login_error(head: &[u8], requests: &LoginRequests) -> Option<i16> {
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

/// Copies bytes both ways until both sides are done. It reads the
/// login's error codes as they pass (a refused SASL login is reported by
/// the broker in a response, and then rskafka closes) and a refusal into
/// the broker's way of ending the connection.
async fn relay(
    client: TcpStream,
    tls: tokio_rustls::client::TlsStream<TcpStream>,
    broker: &str,
    shared: &Shared,
) {
    let (mut client_read, mut client_write) = client.into_split();
    let (mut tls_read, mut tls_write) = tokio::io::split(tls);
    let requests = LoginRequests::default();
    let refused = std::sync::atomic::AtomicBool::new(false);
    let up = async {
        let mut sniffer = Sniffer::default();
        let mut buffer = vec![0u8; 16 * 1024];
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
    let down = async {
        let mut sniffer = Sniffer::default();
        let mut buffer = vec![0u8; 16 * 1024];
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
        let _ = client_write.shutdown().await;
        ended
    };
    tokio::pin!(up, down);
    let broker_ended = tokio::select! {
        // The client (rskafka) closed first: the usual end.
        () = &mut up => {
            let _ = down.await;
            None
        }
        ended = &mut down => {
            up.await;
            Some(ended)
        }
    };
    if refused.load(std::sync::atomic::Ordering::Relaxed) {
        shared.fail(SecurityError::Sasl {
            mechanism: shared.sasl.unwrap_or("login"),
            servers: broker.to_owned(),
        });
        return;
    }
    match broker_ended {
        // TLS 1.3 finishes the client's side of the handshake before the
        // broker checks the client certificate: its refusal arrives here,
        // as an alert, or (Java) as the connection closing at once.
        Some(Err(error)) if rustls_error(&error).is_some() => {
            if let Some(tls_error) = rustls_error(&error) {
                shared.fail(explain(tls_error, broker, &shared.tls));
            }
        }
        Some(Ok(0) | Err(_)) => shared.fail(SecurityError::Handshake {
            broker: broker.to_owned(),
            problem: "the broker closed the connection right after the TLS handshake".to_owned(),
            hint: if shared.tls.client.is_some() {
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
fn quick_ack(stream: &TcpStream) {
    #[cfg(target_os = "linux")]
    let _ = socket2::SockRef::from(stream).set_tcp_quickack(true);
    #[cfg(not(target_os = "linux"))]
    let _ = stream;
}

/// `read_exact`, acknowledging at once ([`quick_ack`]).
async fn read_acked(stream: &mut TcpStream, buffer: &mut [u8]) -> std::io::Result<usize> {
    quick_ack(stream);
    stream.read_exact(buffer).await
}

/// Reads the SOCKS5 greeting (no authentication) and CONNECT request;
/// `None` for anything but CONNECT.
async fn socks_request(stream: &mut TcpStream) -> std::io::Result<Option<(String, u16)>> {
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

type Failed = (u8, SecurityError);

async fn connect_tls(
    host: &str,
    port: u16,
    broker: &str,
    shared: &Shared,
) -> Result<tokio_rustls::client::TlsStream<TcpStream>, Failed> {
    // The files are read again for this connection (rotation).
    let config = client_config(&shared.tls).map_err(|e| (REPLY_FAILURE, e.into()))?;
    let name = ServerName::try_from(host.to_owned()).map_err(|_| {
        (
            REPLY_FAILURE,
            SecurityError::Handshake {
                broker: broker.to_owned(),
                problem: "not a valid host name to verify".to_owned(),
                hint: "check KAFKA_BOOTSTRAP_SERVERS and the broker's advertised listeners"
                    .to_owned(),
            },
        )
    })?;
    let tcp = TcpStream::connect((host, port)).await.map_err(|e| {
        (
            REPLY_HOST_UNREACHABLE,
            SecurityError::Connect {
                broker: broker.to_owned(),
                problem: e.to_string(),
            },
        )
    })?;
    let _ = tcp.set_nodelay(true);
    TlsConnector::from(Arc::new(config))
        .connect(name, tcp)
        .await
        .map_err(|error| {
            let failure = match rustls_error(&error) {
                Some(tls_error) => explain(tls_error, broker, &shared.tls),
                None => no_tls_answer(broker, &error.to_string()),
            };
            (REPLY_FAILURE, failure)
        })
}

fn no_tls_answer(broker: &str, what: &str) -> SecurityError {
    SecurityError::Handshake {
        broker: broker.to_owned(),
        problem: format!("no TLS answer ({what})"),
        hint: "a PLAINTEXT or SASL_PLAINTEXT listener? check KAFKA_SECURITY_PROTOCOL".to_owned(),
    }
}

/// The rustls error inside an I/O error from tokio-rustls, if any.
fn rustls_error(error: &std::io::Error) -> Option<&rustls::Error> {
    error.get_ref()?.downcast_ref::<rustls::Error>()
}

/// A TLS failure in the words of the settings that fix it.
fn explain(error: &rustls::Error, broker: &str, tls: &KafkaTls) -> SecurityError {
    use rustls::{AlertDescription as Alert, CertificateError as Cert, Error as E};
    let roots = match &tls.ca {
        Some(path) => format!("KAFKA_SSL_CA_LOCATION {}", path.display()),
        None => "the bundled webpki roots (KAFKA_SSL_CA_LOCATION is not set)".to_owned(),
    };
    let (problem, hint) = match error {
        E::InvalidCertificate(Cert::UnknownIssuer) => (
            "certificate verify failed: not signed by a trusted CA".to_owned(),
            format!("check KAFKA_SSL_CA_LOCATION; trusted: {roots}"),
        ),
        E::InvalidCertificate(Cert::NotValidForName | Cert::NotValidForNameContext { .. }) => (
            "certificate verify failed: not valid for the host name".to_owned(),
            "host names are always verified; check the host in KAFKA_BOOTSTRAP_SERVERS \
             and the broker's advertised listeners"
                .to_owned(),
        ),
        E::InvalidCertificate(Cert::Expired | Cert::ExpiredContext { .. }) => (
            "certificate verify failed: the broker's certificate has expired".to_owned(),
            "renew the broker's certificate; KAFKA_SSL_CA_LOCATION cannot help".to_owned(),
        ),
        E::InvalidCertificate(Cert::NotValidYet | Cert::NotValidYetContext { .. }) => (
            "certificate verify failed: the broker's certificate is not valid yet".to_owned(),
            "check the clocks".to_owned(),
        ),
        E::InvalidCertificate(other) => (
            format!("certificate verify failed: {other:?}"),
            format!("check KAFKA_SSL_CA_LOCATION; trusted: {roots}"),
        ),
        E::AlertReceived(
            Alert::CertificateRequired
            | Alert::HandshakeFailure
            | Alert::BadCertificate
            | Alert::CertificateUnknown,
        ) if tls.client.is_none() => (
            "the broker requires a client certificate".to_owned(),
            "set KAFKA_SSL_CERTIFICATE_LOCATION and KAFKA_SSL_KEY_LOCATION".to_owned(),
        ),
        E::AlertReceived(
            Alert::UnknownCA
            | Alert::BadCertificate
            | Alert::CertificateUnknown
            | Alert::HandshakeFailure
            | Alert::CertificateExpired
            | Alert::AccessDenied,
        ) => (
            "the broker refused the client certificate".to_owned(),
            "check KAFKA_SSL_CERTIFICATE_LOCATION and KAFKA_SSL_KEY_LOCATION".to_owned(),
        ),
        E::InvalidMessage(_) | E::InappropriateMessage { .. } => {
            return no_tls_answer(broker, &error.to_string());
        }
        other => (
            format!("TLS handshake failed ({other})"),
            "check KAFKA_SECURITY_PROTOCOL and KAFKA_SSL_CA_LOCATION".to_owned(),
        ),
    };
    SecurityError::Handshake {
        broker: broker.to_owned(),
        problem,
        hint,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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

    #[tokio::test]
    async fn accepts_its_own_connections_and_refuses_others() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        let client = TcpStream::connect(address).await.unwrap();
        let (_accepted, peer) = listener.accept().await.unwrap();
        assert!(is_own_connection(peer, address).unwrap());
        // A peer address no socket of this process has.
        let stranger = SocketAddr::from((Ipv4Addr::LOCALHOST, 1));
        assert!(!is_own_connection(stranger, address).unwrap());
        drop(client);
    }

    #[tokio::test]
    async fn another_process_is_refused() {
        // A connection made by a child process (bash's /dev/tcp) must be
        // closed before anything is read or answered.
        let tls = KafkaTls {
            ca: None,
            client: None,
        };
        let bridge = TlsBridge::listen(tls, None, Duration::from_secs(2))
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
