//! One connection to one broker, opened and owned by the worker: TCP with
//! `TCP_NODELAY` and keepalive set on its own socket, TLS when the
//! security protocol says so, then rskafka's `Messenger` over the stream
//! (rskafka's codec: framing, API versions, correlation ids, requests
//! multiplexed on the connection), the versions negotiated and SASL done.
//!
//! Each step is bounded by the caller's deadline, and a step that does not
//! finish in time is named in the error (`TLS handshake`, `SASL
//! authentication`), so a silent broker reads differently from a refusing
//! one.
//!
//! A request whose future is dropped half-written is finished by rskafka
//! (its send runs to the end in a task of its own), so the connection's
//! framing never breaks; its answer, when it comes, is dropped.

use std::{
    fmt,
    io::Cursor,
    pin::Pin,
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU16, Ordering},
    },
    task::{Context, Poll},
    time::Duration,
};

use rskafka::{
    client::{Credentials, SaslConfig},
    messenger::{Messenger, RequestError, SaslError, SyncVersionsError},
    protocol::messages::{ReadVersionedType, RequestBody, WriteVersionedType},
};
use tokio::{
    io::{AsyncRead, AsyncWrite, BufStream, ReadBuf},
    net::TcpStream,
    time::Instant,
};
use tokio_rustls::client::TlsStream;
use tokio_util::either::Either;

use super::{
    KafkaError,
    security::{
        SecurityError, Step, explain, handshake, mechanism_name, rustls_error, stalled_step,
    },
};
use crate::config::{KafkaSettings, SaslMechanism};

/// The largest response read (rskafka's own default): a produce answer is
/// a few hundred bytes, a metadata answer for one topic a few kilobytes.
const MAX_MESSAGE_SIZE: usize = 100 * 1024 * 1024;

/// TCP keepalive on every broker socket. Requests are bounded by
/// `KAFKA_REQUEST_TIMEOUT`; keepalive finds a connection whose peer
/// vanished without a reset while it is idle (a broker host powered off
/// between two bursts), after about `idle + interval × probes` (90 s), so
/// the next request does not start on a dead connection.
const KEEPALIVE_IDLE: Duration = Duration::from_secs(60);
const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(10);
const KEEPALIVE_PROBES: u32 = 3;

/// A broker's address: a bootstrap server as configured, or a broker as
/// the cluster's metadata advertises it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(super) struct Endpoint {
    pub host: String,
    pub port: u16,
}

impl Endpoint {
    /// `host:port` (`[v6]:port` for an IPv6 address), as
    /// `KAFKA_BOOTSTRAP_SERVERS` lists them; `None` when malformed (the
    /// settings were checked at start).
    pub(super) fn parse(server: &str) -> Option<Self> {
        let (host, port) = server.rsplit_once(':')?;
        let host = host.trim_start_matches('[').trim_end_matches(']');
        Some(Self {
            host: host.to_owned(),
            port: port.parse().ok()?,
        })
    }
}

impl fmt::Display for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.host.contains(':') {
            write!(f, "[{}]:{}", self.host, self.port)
        } else {
            write!(f, "{}:{}", self.host, self.port)
        }
    }
}

/// What runs under rskafka's codec: TCP, or TLS over TCP, buffered so a
/// request leaves in one write when it fits the buffer.
type Stream = BufStream<Watched<Either<TcpStream, TlsStream<TcpStream>>>>;

/// An open, authenticated connection to one broker.
pub(super) struct Connection {
    messenger: Messenger<Stream>,
    pub endpoint: Endpoint,
    watch: Watch,
}

impl fmt::Debug for Connection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Connection")
            .field("endpoint", &self.endpoint)
            .finish_non_exhaustive()
    }
}

impl Connection {
    /// Connects to `endpoint` as `settings` say, every step done by
    /// `deadline`.
    pub(super) async fn open(
        endpoint: &Endpoint,
        settings: &KafkaSettings,
        deadline: Instant,
    ) -> Result<Self, KafkaError> {
        let broker = endpoint.to_string();
        let protocol = settings.security_protocol();
        let step = |step: Step| StepTimeout {
            broker: broker.clone(),
            step: stalled_step(protocol, step),
            timeout: settings.request_timeout,
        };
        let tcp = tokio::time::timeout_at(deadline, connect_tcp(endpoint, &broker))
            .await
            .map_err(|_| step(Step::Tcp).error())?
            .map_err(|source| KafkaError::Connect {
                broker: broker.clone(),
                source,
            })?;
        let stream = match &settings.tls {
            None => Either::Left(tcp),
            Some(tls) => Either::Right(
                tokio::time::timeout_at(deadline, handshake(tcp, &endpoint.host, &broker, tls))
                    .await
                    .map_err(|_| step(Step::Tls).error())??,
            ),
        };
        let (stream, watch) = Watched::new(stream);
        let mut messenger = Messenger::new(
            BufStream::new(stream),
            MAX_MESSAGE_SIZE,
            Arc::from(settings.client_id.as_str()),
        );
        tokio::time::timeout_at(deadline, messenger.sync_versions())
            .await
            .map_err(|_| step(Step::Versions).error())?
            .map_err(|source| versions_failed(&broker, settings, &watch, source))?;
        if let Some(sasl) = &settings.sasl {
            let config = sasl_config(sasl);
            tokio::time::timeout_at(deadline, messenger.do_sasl(config))
                .await
                .map_err(|_| step(Step::Sasl).error())?
                .map_err(|error| sasl_failed(&broker, settings, sasl.mechanism, error))?;
        }
        Ok(Self {
            messenger,
            endpoint: endpoint.clone(),
            watch,
        })
    }

    /// Whether the broker closed the connection (or it broke) since it
    /// was opened: rskafka's reader reads all the time, so a broker that
    /// closed an idle connection (`connections.max.idle.ms`, 10 minutes by
    /// default) is seen at once, and the connection is not used again.
    pub(super) fn is_closed(&self) -> bool {
        self.watch.closed.load(Ordering::Relaxed)
    }

    /// One request and its answer. Requests of several callers share the
    /// connection (rskafka matches answers by correlation id); the broker
    /// handles them in the order sent.
    pub(super) async fn request<R>(
        &self,
        operation: &'static str,
        request: R,
    ) -> Result<R::ResponseBody, KafkaError>
    where
        R: RequestBody + Send + WriteVersionedType<Vec<u8>>,
        R::ResponseBody: ReadVersionedType<Cursor<Vec<u8>>>,
    {
        self.messenger
            .request(request)
            .await
            .map_err(|source| KafkaError::Request {
                operation,
                broker: self.endpoint.to_string(),
                source,
            })
    }
}

impl Connection {
    /// [`Self::request`], answered by `deadline` or a timeout error
    /// (`timeout` is the setting the deadline came from, for the message).
    pub(super) async fn request_by<R>(
        &self,
        operation: &'static str,
        request: R,
        deadline: Instant,
        timeout: Duration,
    ) -> Result<R::ResponseBody, KafkaError>
    where
        R: RequestBody + Send + WriteVersionedType<Vec<u8>>,
        R::ResponseBody: ReadVersionedType<Cursor<Vec<u8>>>,
    {
        tokio::time::timeout_at(deadline, self.request(operation, request))
            .await
            .unwrap_or_else(|_| {
                Err(KafkaError::Timeout {
                    operation: format!("{operation} with broker {}", self.endpoint),
                    timeout,
                })
            })
    }
}

/// TCP to `endpoint`, the worker's [`socket_options`] set on the socket.
async fn connect_tcp(endpoint: &Endpoint, broker: &str) -> std::io::Result<TcpStream> {
    let tcp = TcpStream::connect((endpoint.host.as_str(), endpoint.port)).await?;
    socket_options(&tcp, broker);
    Ok(tcp)
}

/// `TCP_NODELAY`: a request is sent at once, not held back by Nagle's
/// algorithm until the broker acknowledges the previous segment (which a
/// broker with nothing to answer yet delays by up to 40 ms). Keepalive: see
/// [`KEEPALIVE_IDLE`]. Neither fails on a connected TCP socket; if one
/// did, the line says which option this connection goes without.
fn socket_options(tcp: &TcpStream, broker: &str) {
    if let Err(error) = tcp.set_nodelay(true) {
        tracing::warn!(broker, %error, "Kafka connection: TCP_NODELAY could not be set; requests may wait for delayed ACKs");
    }
    let keepalive = socket2::TcpKeepalive::new()
        .with_time(KEEPALIVE_IDLE)
        .with_interval(KEEPALIVE_INTERVAL)
        .with_retries(KEEPALIVE_PROBES);
    if let Err(error) = socket2::SockRef::from(tcp).set_tcp_keepalive(&keepalive) {
        tracing::warn!(broker, %error, "Kafka connection: TCP keepalive could not be set");
    }
}

fn sasl_config(sasl: &crate::config::SaslSettings) -> SaslConfig {
    let credentials = Credentials::new(sasl.username.clone(), sasl.password.clone());
    match sasl.mechanism {
        SaslMechanism::Plain => SaslConfig::Plain(credentials),
        SaslMechanism::ScramSha256 => SaslConfig::ScramSha256(credentials),
        SaslMechanism::ScramSha512 => SaslConfig::ScramSha512(credentials),
    }
}

/// A connection step that did not finish by the deadline.
struct StepTimeout {
    broker: String,
    step: &'static str,
    timeout: Duration,
}

impl StepTimeout {
    fn error(self) -> KafkaError {
        KafkaError::Timeout {
            operation: format!("{} with broker {}", self.step, self.broker),
            timeout: self.timeout,
        }
    }
}

/// The first request failed. Under a plaintext protocol, a broker that
/// answered with a TLS record is a TLS listener: a setting to fix, said as
/// such. Otherwise the connection failed (a broker going down closes it),
/// or the broker speaks no version of what this worker sends.
fn versions_failed(
    broker: &str,
    settings: &KafkaSettings,
    watch: &Watch,
    source: SyncVersionsError,
) -> KafkaError {
    let protocol = settings.security_protocol();
    // Under TLS 1.3 the broker checks the client certificate after the
    // handshake: its refusal arrives as an alert on the first read.
    if let Some(tls) = &settings.tls
        && let Some(alert) = tls_alert(&source)
    {
        return explain(alert, broker, tls).into();
    }
    if !protocol.tls() && watch.tls_record() {
        return SecurityError::NotPlaintext {
            servers: broker.to_owned(),
            protocol,
        }
        .into();
    }
    KafkaError::Versions {
        broker: broker.to_owned(),
        plaintext: !protocol.tls(),
        source,
    }
}

/// The TLS error under an exchange that failed, if TLS is why.
fn tls_alert<'a>(error: &'a (dyn std::error::Error + 'static)) -> Option<&'a rustls::Error> {
    let mut next = Some(error);
    while let Some(error) = next {
        if let Some(tls) = error.downcast_ref::<rustls::Error>() {
            return Some(tls);
        }
        if let Some(tls) = error
            .downcast_ref::<std::io::Error>()
            .and_then(rustls_error)
        {
            return Some(tls);
        }
        next = match error.downcast_ref::<RequestError>() {
            // rskafka keeps the error that broke a connection in an Arc,
            // which `source()` does not lend out.
            Some(RequestError::Poisoned(cause)) => Some(cause.as_ref()),
            _ => error.source(),
        };
    }
    None
}

/// SASL failed: refused credentials (or a connection closed during the
/// login, which is how some brokers refuse), a mechanism the broker does
/// not offer, or the connection failing on the way.
fn sasl_failed(
    broker: &str,
    settings: &KafkaSettings,
    mechanism: SaslMechanism,
    error: SaslError,
) -> KafkaError {
    if let Some(tls) = &settings.tls
        && let Some(alert) = tls_alert(&error)
    {
        return explain(alert, broker, tls).into();
    }
    let mechanism = mechanism_name(mechanism);
    match error {
        SaslError::UnsupportedSaslMechanism => SecurityError::SaslMechanism {
            mechanism,
            broker: broker.to_owned(),
            offered: "see the broker's sasl.enabled.mechanisms".to_owned(),
        }
        .into(),
        SaslError::RequestError(source @ RequestError::NoVersionMatch { .. }) => {
            KafkaError::Request {
                operation: "SASL handshake",
                broker: broker.to_owned(),
                source,
            }
        }
        _ => SecurityError::Sasl {
            mechanism,
            servers: broker.to_owned(),
        }
        .into(),
    }
}

/// What the reading side of a connection saw: the first byte the broker
/// sent, and whether the stream ended.
struct Watched<S> {
    inner: S,
    watch: Watch,
}

/// The first byte read on a connection, as `0x100 | byte` once read (0
/// before): a Kafka answer starts with its length, whose first byte is 0
/// for anything under 16 MiB; a TLS record starts with its content type,
/// 20 to 23. And whether the stream ended (end of file or an error).
#[derive(Clone, Default)]
struct Watch(Arc<WatchState>);

#[derive(Default)]
struct WatchState {
    first: AtomicU16,
    closed: AtomicBool,
}

impl std::ops::Deref for Watch {
    type Target = WatchState;

    fn deref(&self) -> &WatchState {
        &self.0
    }
}

impl Watch {
    fn tls_record(&self) -> bool {
        (0x100 + 20..=0x100 + 23).contains(&self.first.load(Ordering::Relaxed))
    }
}

impl<S> Watched<S> {
    fn new(inner: S) -> (Self, Watch) {
        let watch = Watch::default();
        (
            Self {
                inner,
                watch: watch.clone(),
            },
            watch,
        )
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Watched<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let room = buf.remaining() > 0;
        let polled = Pin::new(&mut self.inner).poll_read(cx, buf);
        match &polled {
            Poll::Ready(Ok(())) if room && buf.filled().len() == before => {
                self.watch.closed.store(true, Ordering::Relaxed);
            }
            Poll::Ready(Err(_)) => self.watch.closed.store(true, Ordering::Relaxed),
            _ => {}
        }
        if let Some(&first) = buf.filled().get(before) {
            // Only the connection's very first byte is kept.
            let _ = self.watch.first.compare_exchange(
                0,
                0x100 | u16::from(first),
                Ordering::Relaxed,
                Ordering::Relaxed,
            );
        }
        polled
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Watched<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_parse_and_print_as_configured() {
        let plain = Endpoint::parse("kafka-1.example.com:9092").expect("valid");
        assert_eq!(
            (plain.host.as_str(), plain.port),
            ("kafka-1.example.com", 9092)
        );
        assert_eq!(plain.to_string(), "kafka-1.example.com:9092");
        let v6 = Endpoint::parse("[::1]:9093").expect("valid");
        assert_eq!((v6.host.as_str(), v6.port), ("::1", 9093));
        assert_eq!(v6.to_string(), "[::1]:9093");
        assert_eq!(Endpoint::parse("no-port"), None);
        assert_eq!(Endpoint::parse("host:port"), None);
    }

    /// The options as the kernel reports them back on a real socket: the
    /// worker sets them itself, so nothing (no `/proc`, no other process's
    /// descriptor) stands between it and its own socket.
    #[tokio::test]
    async fn a_broker_socket_has_nodelay_and_keepalive_set() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind a loopback port");
        let addr = listener.local_addr().expect("bound");
        let endpoint = Endpoint {
            host: addr.ip().to_string(),
            port: addr.port(),
        };
        let tcp = connect_tcp(&endpoint, &endpoint.to_string())
            .await
            .expect("connect to the listener");
        assert!(tcp.nodelay().expect("read TCP_NODELAY"), "TCP_NODELAY");
        let socket = socket2::SockRef::from(&tcp);
        assert!(socket.keepalive().expect("read SO_KEEPALIVE"), "keepalive");
        assert_eq!(socket.tcp_keepalive_time().expect("idle"), KEEPALIVE_IDLE);
        assert_eq!(
            socket.tcp_keepalive_interval().expect("interval"),
            KEEPALIVE_INTERVAL
        );
        assert_eq!(
            socket.tcp_keepalive_retries().expect("probes"),
            KEEPALIVE_PROBES
        );
    }

    #[tokio::test]
    async fn the_first_byte_tells_a_tls_record_from_a_kafka_answer() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        for (sent, tls) in [
            (&[0x15, 0x03, 0x03, 0x00, 0x02][..], true),
            (&[0x16, 0x03, 0x01][..], true),
            (&[0x00, 0x00, 0x00, 0x10][..], false),
            // A zero first byte is remembered too: a later 0x15 is not first.
            (&[0x00, 0x15, 0x03, 0x03][..], false),
        ] {
            let (mut broker, client) = tokio::io::duplex(64);
            let (mut client, seen) = Watched::new(client);
            broker.write_all(sent).await.expect("in memory");
            let mut buf = vec![0; sent.len()];
            client.read_exact(&mut buf).await.expect("in memory");
            assert_eq!(seen.tls_record(), tls, "{sent:?}");
            assert!(!seen.closed.load(Ordering::Relaxed));
            drop(broker);
            let mut rest = Vec::new();
            client.read_to_end(&mut rest).await.expect("in memory");
            assert!(seen.closed.load(Ordering::Relaxed), "the end is seen");
        }
    }
}
