//! The outbox publisher's settings (`OUTBOX_*`).

use std::time::Duration;

use clap::Args;

use super::{
    defaults::{self, text},
    parse::{self, setting},
};

/// The outbox publisher's claim, wake-up and retention.
#[derive(Debug, Clone, PartialEq, Eq, Args)]
pub struct PublisherSettings {
    /// Outbox rows claimed per transaction.
    #[arg(id = "OUTBOX_BATCH_SIZE", long = "outbox-batch-size", env = "OUTBOX_BATCH_SIZE",
          default_value = text!(defaults::OUTBOX_BATCH_SIZE),
          value_parser = setting(parse::count::<u32, { parse::MAX_OUTBOX_BATCH_SIZE }>))]
    pub batch_size: u32,
    /// Polling period when no commit notification arrives.
    #[arg(id = "OUTBOX_POLL_INTERVAL", long = "outbox-poll-interval", env = "OUTBOX_POLL_INTERVAL",
          default_value = text!(defaults::OUTBOX_POLL_INTERVAL), value_parser = setting(parse::positive_duration))]
    pub poll_interval: Duration,
    /// How long published rows are kept (0s = delete right after publishing).
    #[arg(id = "OUTBOX_RETENTION", long = "outbox-retention", env = "OUTBOX_RETENTION",
          default_value = text!(defaults::OUTBOX_RETENTION), value_parser = setting(parse::duration))]
    pub retention: Duration,
    /// Batches in flight at once while a backlog drains (each its own
    /// transaction and pooled connection; SKIP LOCKED keeps them disjoint).
    #[arg(id = "OUTBOX_CONCURRENCY", long = "outbox-concurrency", env = "OUTBOX_CONCURRENCY",
          default_value = text!(defaults::OUTBOX_CONCURRENCY),
          value_parser = setting(parse::count::<u32, { parse::MAX_OUTBOX_CONCURRENCY }>))]
    pub concurrency: u32,
}

impl Default for PublisherSettings {
    fn default() -> Self {
        Self {
            batch_size: defaults::OUTBOX_BATCH_SIZE,
            poll_interval: defaults::OUTBOX_POLL_INTERVAL,
            retention: defaults::OUTBOX_RETENTION,
            concurrency: defaults::OUTBOX_CONCURRENCY,
        }
    }
}
