//! The HTTP endpoints' settings.

use std::{net::SocketAddr, time::Duration};

use clap::Args;

use super::{
    defaults::{self, text},
    parse::{self, setting},
    ranges,
};

/// The HTTP endpoints.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Args)]
pub struct HttpSettings {
    /// HTTP address for /metrics, /healthz and /readyz.
    #[arg(id = "METRICS_ADDR", long = "metrics-addr", env = "METRICS_ADDR",
          default_value = text!(defaults::METRICS_ADDR), value_parser = setting(parse::socket_addr))]
    pub metrics_addr: SocketAddr,
    /// /healthz fails when no cycle succeeded for this long (run: longer than EXPIRATION_INTERVAL); 1s to 24h.
    #[arg(id = "LIVENESS_WINDOW", long = "liveness-window", env = "LIVENESS_WINDOW",
          default_value = text!(defaults::LIVENESS_WINDOW), value_parser = parse::within(&ranges::LIVENESS_WINDOW))]
    pub liveness_window: Duration,
}

impl Default for HttpSettings {
    fn default() -> Self {
        Self {
            metrics_addr: defaults::METRICS_ADDR,
            liveness_window: defaults::LIVENESS_WINDOW,
        }
    }
}
