//! The HTTP endpoints' settings.

use std::{net::SocketAddr, time::Duration};

use super::{catalog::*, setting::group};

group! {
    /// The HTTP endpoints.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub struct HttpSettings: Default {
        pub metrics_addr: SocketAddr = METRICS_ADDR,
        pub liveness_window: Duration = LIVENESS_WINDOW,
    }
}
