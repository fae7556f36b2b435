//! TLS to Kafka without C, and `TCP_NODELAY` on rskafka's sockets: an
//! in-process SOCKS5 bridge every broker connection goes through.
//!
//! Every security protocol uses it. rskafka 0.6 never sets `TCP_NODELAY`
//! and writes a request's length and its body in two writes: with Nagle's
//! algorithm on, the last part of a body waited for the broker's
//! acknowledgement of what went before, which a broker with nothing to
//! answer yet delays by up to 40 ms (29 of 60 rounds of requests to three
//! partitions at once took 35 ms or more: `publisher_seams::
//! requests_are_not_held_back_by_nagles_algorithm`). The bridge finds the
//! connecting socket among this process's files (the peer check below)
//! and sets `TCP_NODELAY` on it (`peer::OwnSocket::set_nodelay`); its own
//! sockets have it too. Under `PLAINTEXT` and `SASL_PLAINTEXT` it then
//! copies bytes to a plain TCP connection to the broker.
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
//! for [`super::KafkaTransport`] to report ([`TlsBridge::take_failure`]).

mod diagnostics;
mod peer;
mod relay;
mod socks5;
mod tls;

use std::{
    net::{IpAddr, Ipv4Addr, SocketAddr, SocketAddrV4},
    sync::{Arc, Mutex},
    time::Duration,
};

use tokio::{
    net::{TcpListener, TcpStream},
    task::JoinHandle,
};

use crate::config::{KafkaSettings, KafkaTls, SaslMechanism};
use diagnostics::mechanism_name;
use peer::own_socket;
use relay::relay;
use socks5::{REPLY_COMMAND_UNSUPPORTED, REPLY_HOST_UNREACHABLE, REPLY_OK, reply, socks_request};
use tls::{connect_tcp, connect_tls};

pub use diagnostics::{SecurityError, connect_operation, security_failure};
pub use tls::{check, client_config};

/// State shared by the bridge's tasks.
struct Shared {
    /// `None`: the broker's side is plain TCP (`PLAINTEXT`,
    /// `SASL_PLAINTEXT`).
    tls: Option<KafkaTls>,
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
    /// `tls`: the TLS files (`SSL`, `SASL_SSL`), or `None` for plain TCP to
    /// the brokers (`PLAINTEXT`, `SASL_PLAINTEXT`: the bridge then only
    /// gives rskafka's sockets `TCP_NODELAY`).
    pub async fn start(
        tls: Option<&KafkaTls>,
        settings: &KafkaSettings,
    ) -> Result<Self, SecurityError> {
        Self::listen(
            tls.cloned(),
            settings.sasl.as_ref().map(|sasl| sasl.mechanism),
            settings.request_timeout,
        )
        .await
    }

    async fn listen(
        tls: Option<KafkaTls>,
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
            match own_socket(peer, shared.address) {
                Ok(Some(socket)) => {
                    if let Err(error) = socket.set_nodelay() {
                        tracing::debug!(%error, "Kafka TLS bridge: rskafka's socket keeps Nagle's algorithm");
                    }
                    serve(stream, shared).await;
                }
                Ok(None) => tracing::warn!(
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

/// One SOCKS5 CONNECT from rskafka: the broker's TCP (and TLS), then
/// bytes both ways.
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
    let connect = async {
        let tcp = connect_tcp(&host, port, &broker).await?;
        match &shared.tls {
            Some(tls) => connect_tls(tcp, &host, &broker, tls).await.map(Broker::Tls),
            None => Ok(Broker::Plain(tcp)),
        }
    };
    let connected = tokio::time::timeout(shared.timeout, connect)
        .await
        .unwrap_or_else(|_| {
            let error = match shared.tls {
                Some(_) => SecurityError::Handshake {
                    broker: broker.clone(),
                    problem: format!(
                        "no TLS handshake within KAFKA_REQUEST_TIMEOUT ({:?})",
                        shared.timeout
                    ),
                    hint: "check KAFKA_BOOTSTRAP_SERVERS and that the listener speaks TLS"
                        .to_owned(),
                },
                // Plain TCP: a broker host that does not answer, no refusal.
                None => SecurityError::Connect {
                    broker: broker.clone(),
                    problem: format!(
                        "no TCP connection within KAFKA_REQUEST_TIMEOUT ({:?})",
                        shared.timeout
                    ),
                },
            };
            Err((REPLY_HOST_UNREACHABLE, error))
        });
    let broker_stream = match connected {
        Ok(stream) => stream,
        Err((code, error)) => {
            shared.fail(error);
            let _ = reply(&mut client, code).await;
            return;
        }
    };
    if reply(&mut client, REPLY_OK).await.is_err() {
        return;
    }
    match broker_stream {
        Broker::Tls(tls) => relay(client, *tls, &broker, &shared).await,
        Broker::Plain(tcp) => relay(client, tcp, &broker, &shared).await,
    }
}

/// The broker's side of a bridged connection.
enum Broker {
    Tls(Box<tokio_rustls::client::TlsStream<TcpStream>>),
    Plain(TcpStream),
}
