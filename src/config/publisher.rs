//! The outbox publisher's settings (`OUTBOX_*`).

use std::time::Duration;

use super::{catalog::*, setting::group};

group! {
    /// The outbox publisher's claim, wake-up and retention.
    #[derive(Debug, Clone, PartialEq, Eq)]
    pub struct PublisherSettings: Default {
        pub batch_size: u32 = OUTBOX_BATCH_SIZE,
        pub poll_interval: Duration = OUTBOX_POLL_INTERVAL,
        pub retention: Duration = OUTBOX_RETENTION,
    }
}
