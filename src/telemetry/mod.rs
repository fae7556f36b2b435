//! Logs, metrics, health state and the HTTP endpoints that expose them.

pub mod health;
pub mod http;
pub mod logging;
pub mod metrics;

pub use health::Health;
pub use metrics::Metrics;
