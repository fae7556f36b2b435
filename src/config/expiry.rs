//! The expiry worker's settings: its sweep, what the events carry, and
//! the grace of a batch in flight at a stop.

use std::time::Duration;

use clap::Args;

use super::{
    defaults::{self, text},
    parse::{self, setting},
    ranges,
};

/// The expiry worker's sweep.
#[derive(Debug, Clone, PartialEq, Eq, Args)]
pub struct ExpirySettings {
    /// Cycle period (humantime: 500ms, 1s, 60s); 100ms to 1h.
    #[arg(id = "EXPIRATION_INTERVAL", long = "expiration-interval", env = "EXPIRATION_INTERVAL",
          default_value = text!(defaults::EXPIRATION_INTERVAL), value_parser = parse::within(&ranges::EXPIRATION_INTERVAL))]
    pub interval: Duration,
    /// Rows per phase per transaction; 1 to 100000.
    #[arg(id = "EXPIRATION_BATCH_SIZE", long = "expiration-batch-size", env = "EXPIRATION_BATCH_SIZE",
          default_value = text!(defaults::EXPIRATION_BATCH_SIZE),
          value_parser = parse::count_within::<u32>(&ranges::EXPIRATION_BATCH_SIZE))]
    pub batch_size: u32,
    /// Batches per phase per cycle while batches come back full (1 = one batch per cycle); 1 to 1000000.
    #[arg(id = "EXPIRATION_MAX_BATCHES_PER_CYCLE", long = "expiration-max-batches-per-cycle",
          env = "EXPIRATION_MAX_BATCHES_PER_CYCLE", default_value = text!(defaults::EXPIRATION_MAX_BATCHES_PER_CYCLE),
          value_parser = parse::count_within::<u32>(&ranges::EXPIRATION_MAX_BATCHES_PER_CYCLE))]
    pub max_batches_per_cycle: u32,
    /// No new batch starts after a cycle ran this long (the first batch of each phase always runs); 100ms to 1h.
    #[arg(id = "EXPIRATION_CYCLE_BUDGET", long = "expiration-cycle-budget", env = "EXPIRATION_CYCLE_BUDGET",
          default_value = text!(defaults::EXPIRATION_CYCLE_BUDGET), value_parser = parse::within(&ranges::EXPIRATION_CYCLE_BUDGET))]
    pub cycle_budget: Duration,
    /// as_of never runs ahead of the database clock by more than this ("off" disables the check); 0s to 1h, or off.
    // `std::option::Option`: one value that may say "none", not an optional flag.
    #[arg(id = "EXPIRATION_MAX_CLOCK_SKEW", long = "expiration-max-clock-skew", env = "EXPIRATION_MAX_CLOCK_SKEW",
          default_value = text!(defaults::EXPIRATION_MAX_CLOCK_SKEW), value_parser = parse::within_or_off(&ranges::EXPIRATION_MAX_CLOCK_SKEW))]
    pub max_clock_skew: std::option::Option<Duration>,
    /// Also wake just after the next known deadline, not only on the
    /// interval ("false": the fixed schedule alone).
    #[arg(id = "EXPIRATION_DEADLINE_WAKE", long = "expiration-deadline-wake", env = "EXPIRATION_DEADLINE_WAKE",
          default_value = text!(defaults::EXPIRATION_DEADLINE_WAKE), value_parser = setting(parse::switch),
          action = clap::ArgAction::Set)]
    pub deadline_wake: bool,
    /// No cycle starts sooner than this after the previous one ended, so
    /// deadlines close together share one cycle; 50ms to 60s.
    #[arg(id = "EXPIRATION_MIN_GAP", long = "expiration-min-gap", env = "EXPIRATION_MIN_GAP",
          default_value = text!(defaults::EXPIRATION_MIN_GAP), value_parser = parse::within(&ranges::EXPIRATION_MIN_GAP))]
    pub min_gap: Duration,
}

impl Default for ExpirySettings {
    fn default() -> Self {
        Self {
            interval: defaults::EXPIRATION_INTERVAL,
            batch_size: defaults::EXPIRATION_BATCH_SIZE,
            max_batches_per_cycle: defaults::EXPIRATION_MAX_BATCHES_PER_CYCLE,
            cycle_budget: defaults::EXPIRATION_CYCLE_BUDGET,
            max_clock_skew: defaults::EXPIRATION_MAX_CLOCK_SKEW,
            deadline_wake: defaults::EXPIRATION_DEADLINE_WAKE,
            min_gap: defaults::EXPIRATION_MIN_GAP,
        }
    }
}

/// What the events carry: the topic written on each outbox row and the
/// `ce_source` header.
#[derive(Debug, Clone, PartialEq, Eq, Args)]
pub struct EventSettings {
    /// `ce_source` header of the events.
    #[arg(id = "CE_SOURCE", long = "ce-source", env = "CE_SOURCE", default_value = defaults::CE_SOURCE)]
    pub ce_source: String,
    /// Topic written on outbox rows.
    #[arg(id = "KAFKA_TOPIC", long = "kafka-topic", env = "KAFKA_TOPIC", default_value = defaults::KAFKA_TOPIC,
          value_parser = setting(parse::topic))]
    pub topic: String,
}

impl Default for EventSettings {
    fn default() -> Self {
        Self {
            ce_source: defaults::CE_SOURCE.to_owned(),
            topic: defaults::KAFKA_TOPIC.to_owned(),
        }
    }
}

/// How long work in flight may take once a stop was requested.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Args)]
pub struct ShutdownSettings {
    /// On shutdown, how long an in-flight batch may take before it is rolled back; 0s to 10m.
    #[arg(id = "SHUTDOWN_GRACE", long = "shutdown-grace", env = "SHUTDOWN_GRACE",
          default_value = text!(defaults::SHUTDOWN_GRACE), value_parser = parse::within(&ranges::SHUTDOWN_GRACE))]
    pub grace: Duration,
}

impl Default for ShutdownSettings {
    fn default() -> Self {
        Self {
            grace: defaults::SHUTDOWN_GRACE,
        }
    }
}
