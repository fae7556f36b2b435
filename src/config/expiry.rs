//! The expiry worker's settings: its sweep, what the events carry, and
//! the grace of a batch in flight at a stop.

use std::time::Duration;

use super::{catalog::*, setting::group};

group! {
    /// The expiry worker's sweep.
    #[derive(Debug, Clone, PartialEq, Eq)]
    pub struct ExpirySettings: Default {
        pub interval: Duration = EXPIRATION_INTERVAL,
        pub batch_size: u32 = EXPIRATION_BATCH_SIZE,
        pub max_batches_per_cycle: u32 = EXPIRATION_MAX_BATCHES_PER_CYCLE,
        pub cycle_budget: Duration = EXPIRATION_CYCLE_BUDGET,
        /// `None`: `off`, no check.
        pub max_clock_skew: Option<Duration> = EXPIRATION_MAX_CLOCK_SKEW,
        pub deadline_wake: bool = EXPIRATION_DEADLINE_WAKE,
        pub min_gap: Duration = EXPIRATION_MIN_GAP,
    }
}

group! {
    /// What the events carry: the topic written on each outbox row and the
    /// `ce_source` header.
    #[derive(Debug, Clone, PartialEq, Eq)]
    pub struct EventSettings: Default {
        pub ce_source: String = CE_SOURCE,
        pub topic: String = KAFKA_TOPIC,
    }
}

group! {
    /// How long work in flight may take once a stop was requested.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub struct ShutdownSettings: Default {
        pub grace: Duration = SHUTDOWN_GRACE,
    }
}
