//! Logs, metrics, health state and the HTTP endpoints that expose them.

pub(crate) mod health;
pub(crate) mod http;
pub mod logging;
pub(crate) mod metrics;
pub mod trace;

pub use health::{BrokerState, Health};
pub use metrics::Metrics;

/// Displays an error with its whole cause chain (`outer: inner: root`), for
/// log fields where `%error` alone would drop the causes.
#[derive(Debug)]
pub struct ErrorChain<'a>(pub &'a (dyn std::error::Error + 'static));

impl std::fmt::Display for ErrorChain<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.0)?;
        let mut source = self.0.source();
        while let Some(cause) = source {
            write!(f, ": {cause}")?;
            source = cause.source();
        }
        Ok(())
    }
}
