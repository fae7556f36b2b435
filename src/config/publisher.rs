//! The outbox publisher's settings (`OUTBOX_*`).

use std::time::Duration;

use clap::Args;

use super::{
    defaults::{self, text},
    parse, ranges,
};

/// The outbox publisher's claim, wake-up and retention.
#[derive(Debug, Clone, PartialEq, Eq, Args)]
pub struct PublisherSettings {
    /// Most records in one produce request and rows in one claim; 1 to 10000.
    #[arg(id = "OUTBOX_BATCH_SIZE", long = "outbox-batch-size", env = "OUTBOX_BATCH_SIZE",
          default_value = text!(defaults::OUTBOX_BATCH_SIZE),
          value_parser = parse::count_within::<u32>(&ranges::OUTBOX_BATCH_SIZE))]
    pub batch_size: u32,
    /// Polling period when no commit notification arrives; 10ms to 10m.
    #[arg(id = "OUTBOX_POLL_INTERVAL", long = "outbox-poll-interval", env = "OUTBOX_POLL_INTERVAL",
          default_value = text!(defaults::OUTBOX_POLL_INTERVAL), value_parser = parse::within(&ranges::OUTBOX_POLL_INTERVAL))]
    pub poll_interval: Duration,
    /// How long published rows are kept (0s = delete right after publishing); 0s to 365d.
    #[arg(id = "OUTBOX_RETENTION", long = "outbox-retention", env = "OUTBOX_RETENTION",
          default_value = text!(defaults::OUTBOX_RETENTION), value_parser = parse::within(&ranges::OUTBOX_RETENTION))]
    pub retention: Duration,
}

impl Default for PublisherSettings {
    fn default() -> Self {
        Self {
            batch_size: defaults::OUTBOX_BATCH_SIZE,
            poll_interval: defaults::OUTBOX_POLL_INTERVAL,
            retention: defaults::OUTBOX_RETENTION,
        }
    }
}
