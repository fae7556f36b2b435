//! A deliberately small HTTP/1.1 server for `/metrics`, `/healthz` and
//! `/readyz`: GET only, one request per connection, bounded reads and
//! timeouts, so a scraper or a probe can never tie up the process.

use std::{future::Future, net::SocketAddr, pin::Pin, sync::Arc, time::Duration};

use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::{TcpListener, TcpStream},
};
use tokio_util::sync::CancellationToken;

use super::{Health, Metrics, health::BrokerState};
use crate::clock::Clock;

const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);
const MAX_REQUEST_BYTES: usize = 8 * 1024;

/// The readiness probe's database check: true when a query answers in
/// time. `app` wires the pool's ping (`db::ping`) in.
pub type DatabasePing = Arc<dyn Fn() -> Pin<Box<dyn Future<Output = bool> + Send>> + Send + Sync>;

/// What the handlers read.
#[derive(Clone)]
pub struct HttpState {
    /// The liveness check's notion of now.
    pub clock: Arc<dyn Clock>,
    pub metrics: Arc<Metrics>,
    pub health: Arc<Health>,
    pub database: DatabasePing,
    /// No successful cycle for longer is unhealthy (spec §6: 5 minutes).
    pub liveness_window: Duration,
}

impl std::fmt::Debug for HttpState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HttpState")
            .field("liveness_window", &self.liveness_window)
            .finish_non_exhaustive()
    }
}

/// Errors of the HTTP layer.
#[derive(Debug, thiserror::Error)]
pub enum HttpError {
    #[error("cannot listen on METRICS_ADDR {addr}")]
    Bind {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
}

/// Binds the listener (fails fast at start on a taken port).
pub async fn bind(addr: SocketAddr) -> Result<TcpListener, HttpError> {
    TcpListener::bind(addr)
        .await
        .map_err(|source| HttpError::Bind { addr, source })
}

/// Serves until `shutdown` fires.
pub async fn serve(listener: TcpListener, state: HttpState, shutdown: CancellationToken) {
    loop {
        let accepted = tokio::select! {
            _ = shutdown.cancelled() => return,
            accepted = listener.accept() => accepted,
        };
        match accepted {
            Ok((stream, _)) => {
                let state = state.clone();
                tokio::spawn(async move {
                    let _ = tokio::time::timeout(REQUEST_TIMEOUT, handle(stream, state)).await;
                });
            }
            Err(error) => {
                tracing::warn!(%error, "accept failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

async fn handle(mut stream: TcpStream, state: HttpState) -> std::io::Result<()> {
    let mut buffer = Vec::with_capacity(1024);
    let mut chunk = [0u8; 1024];
    while !buffer.windows(4).any(|w| w == b"\r\n\r\n") {
        let n = stream.read(&mut chunk).await?;
        if n == 0 || buffer.len() + n > MAX_REQUEST_BYTES {
            break;
        }
        buffer.extend_from_slice(&chunk[..n]);
    }
    let request = String::from_utf8_lossy(&buffer);
    let mut parts = request.lines().next().unwrap_or("").split_whitespace();
    let method = parts.next().unwrap_or("");
    let path = parts.next().unwrap_or("").split('?').next().unwrap_or("");
    let (status, content_type, body) = if method != "GET" && method != "HEAD" {
        (405, "text/plain", "method not allowed\n".to_owned())
    } else {
        route(path, &state).await
    };
    let reason = match status {
        200 => "OK",
        404 => "Not Found",
        405 => "Method Not Allowed",
        _ => "Service Unavailable",
    };
    let head = format!(
        "HTTP/1.1 {status} {reason}\r\ncontent-type: {content_type}\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes()).await?;
    if method != "HEAD" {
        stream.write_all(body.as_bytes()).await?;
    }
    stream.shutdown().await
}

async fn route(path: &str, state: &HttpState) -> (u16, &'static str, String) {
    match path {
        "/metrics" => (
            200,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
            state.metrics.encode(),
        ),
        "/healthz" => {
            if state
                .health
                .is_live(state.clock.now(), state.liveness_window)
            {
                (200, "text/plain", "ok\n".to_owned())
            } else {
                (
                    503,
                    "text/plain",
                    format!(
                        "no successful expiry cycle within {}\n",
                        humantime::format_duration(state.liveness_window)
                    ),
                )
            }
        }
        "/readyz" => {
            let database = (state.database)().await;
            let broker = state.health.broker_state();
            let code = match (broker, state.health.failing_code()) {
                (BrokerState::Failing { .. }, Some(code)) => format!(" ({code})"),
                _ => String::new(),
            };
            let body = format!(
                "database: {}\nbroker: {broker}{code}\n",
                if database { "ok" } else { "unreachable" },
            );
            (
                if database && broker == BrokerState::Ready {
                    200
                } else {
                    503
                },
                "text/plain",
                body,
            )
        }
        _ => (404, "text/plain", "not found\n".to_owned()),
    }
}
