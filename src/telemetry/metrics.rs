//! The Prometheus metrics of the worker and the publisher. One [`Metrics`]
//! is built in `main` and passed to every task; nothing is global.

use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{counter::Counter, family::Family, gauge::Gauge, histogram::Histogram},
    registry::Registry,
};

use crate::domain::Phase;

/// The `phase` label.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PhaseLabel {
    pub phase: &'static str,
}

impl From<Phase> for PhaseLabel {
    fn from(phase: Phase) -> Self {
        Self {
            phase: phase.as_str(),
        }
    }
}

/// The `code` label: a Kafka error name (`MESSAGE_TOO_LARGE`, …) or a
/// `CLIENT_…` name for a failure on this side.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CodeLabel {
    pub code: String,
}

/// The `reason` label of metadata lookups: `connect` (a new connection
/// loads the topic), `periodic` (the partition count re-read after
/// `METADATA_MAX_AGE`), `leader` (a partition's leader looked up again
/// after a failed produce).
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabel {
    pub reason: &'static str,
}

/// Declares [`Metrics`]: each metric once, with its field, type, initial
/// value (the type's default unless given) and its registration (name and
/// help text), so a field cannot be added without being registered. They
/// are registered in the order listed, which is the exposition's order.
macro_rules! metrics {
    ($(
        $(#[$doc:meta])*
        $field:ident: $ty:ty $(= $init:expr)?,
            register($name:literal, $help:literal);
    )*) => {
        /// Every metric the process exports. Counters are registered without
        /// the `_total` suffix because the OpenMetrics encoder appends it.
        pub struct Metrics {
            registry: Registry,
            $($(#[$doc])* pub $field: $ty,)*
        }

        impl Metrics {
            pub fn new() -> Self {
                let mut registry = Registry::default();
                $(
                    let $field: $ty = metrics!(@init $($init)?);
                    registry.register($name, $help, $field.clone());
                )*
                Self { registry, $($field,)* }
            }
        }
    };
    (@init) => { Default::default() };
    (@init $init:expr) => { $init };
}

/// Lateness buckets: fine below a second (the deadline wake-up's goal), then
/// up to the fixed schedule's interval and beyond.
fn lateness_histogram() -> Histogram {
    Histogram::new([
        0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 0.75, 1.0, 2.0, 5.0, 15.0, 30.0, 60.0, 120.0, 300.0,
    ])
}

/// Cycle duration buckets.
const CYCLE_BUCKETS: [f64; 13] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
];

/// Kafka latency buckets: a produce call, commit to acknowledgement.
const LATENCY_BUCKETS: [f64; 15] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
];

/// A gauge of seconds with a fraction.
type FloatGauge = Gauge<f64, std::sync::atomic::AtomicU64>;

metrics! {
    cycle_duration_seconds: Histogram = Histogram::new(CYCLE_BUCKETS),
        register("crm_booking_expiration_cycle_duration_seconds", "Duration of one expiry cycle");
    items: Family<PhaseLabel, Counter>,
        register("crm_booking_expiration_items", "Bookings expired, by phase");
    /// `expired_at` minus the booking's deadline, per phase.
    lateness_seconds: Family<PhaseLabel, Histogram, fn() -> Histogram> =
        Family::new_with_constructor(lateness_histogram),
        register("crm_booking_expiration_lateness_seconds", "Time from a booking's deadline to its expiry (expired_at minus the deadline), by phase");
    backlog: Gauge,
        register("crm_booking_expiration_backlog", "Active bookings whose deadline passed and that are not expired yet");
    skip_locked: Counter,
        register("crm_booking_expiration_skip_locked", "Due bookings skipped because another transaction held their row lock");
    errors: Counter,
        register("crm_booking_expiration_errors", "Poison bookings refused by the domain plus failed cycles");
    cycles_failed: Counter,
        register("crm_booking_expiration_cycles_failed", "Cycles that ended with an infrastructure error");
    last_success_timestamp_seconds: Gauge,
        register("crm_booking_expiration_last_success_timestamp_seconds", "Unix time of the last cycle that completed without an infrastructure error");
    clock_skew_seconds: FloatGauge,
        register("crm_booking_expiration_clock_skew_seconds", "Local clock minus database clock at the last cycle start");
    /// 1 while the last clock check found the local clock further ahead of
    /// the database clock than `EXPIRATION_MAX_CLOCK_SKEW`, else 0.
    clock_skew_exceeded: Gauge,
        register("crm_booking_expiration_clock_skew_exceeded", "1 while the local clock is ahead of the database clock by more than EXPIRATION_MAX_CLOCK_SKEW (as_of clamped), else 0");
    /// Cycles after which the scheduler waited for the tick because their
    /// `as_of` was clamped.
    clock_skew_backoffs: Counter,
        register("crm_booking_expiration_clock_skew_backoffs", "Cycles whose as_of was clamped for clock skew, after which the scheduler waited for the tick");
    outbox_unpublished: Gauge,
        register("crm_booking_expiration_outbox_unpublished", "Outbox rows not yet published to Kafka");
    outbox_oldest_unpublished_age_seconds: Gauge,
        register("crm_booking_expiration_outbox_oldest_unpublished_age_seconds", "Age of the oldest unpublished outbox row (outbox lag)");
    outbox_published: Counter,
        register("crm_booking_expiration_outbox_published", "Outbox rows acknowledged by Kafka");
    outbox_publish_errors: Counter,
        register("crm_booking_expiration_outbox_publish_errors", "Publish attempts that failed (rows stay in the outbox)");
    outbox_produce_duration_seconds: Histogram = Histogram::new(LATENCY_BUCKETS),
        register("crm_booking_expiration_outbox_produce_duration_seconds", "Duration of one produce round to Kafka");
    outbox_commit_to_ack_seconds: Histogram = Histogram::new(LATENCY_BUCKETS),
        register("crm_booking_expiration_outbox_commit_to_ack_seconds", "Time from an outbox row's commit to the broker's acknowledgement");
    outbox_deleted: Counter,
        register("crm_booking_expiration_outbox_deleted", "Published outbox rows removed by retention");
    /// Outbox rows parked (refused by the broker for good).
    outbox_parked: Gauge,
        register("crm_booking_expiration_outbox_parked", "Outbox rows parked because the broker refused them for a reason no retry fixes");
    /// Failed produce requests, by Kafka error code.
    outbox_produce_errors: Family<CodeLabel, Counter>,
        register("crm_booking_expiration_outbox_produce_errors", "Failed produce requests to Kafka, by Kafka error code");
    /// Kafka metadata lookups, by reason.
    kafka_metadata_refreshes: Family<ReasonLabel, Counter>,
        register("crm_booking_expiration_kafka_metadata_refreshes", "Kafka metadata lookups by reason: connect, periodic (partition count), leader (after a failed produce)");
    /// 1 while this instance is the deadline waker (the one instance that
    /// wakes at each deadline), else 0.
    expiry_waker: Gauge,
        register("crm_booking_expiration_expiry_waker", "1 while this instance is the deadline waker (the one instance that wakes at each deadline; the others keep the interval tick), else 0");
    /// Kafka answers that asked this client to hold its next request (a
    /// quota), and the holds asked for in seconds.
    kafka_throttled_responses: Counter,
        register("crm_booking_expiration_kafka_throttled_responses", "Kafka answers that asked this client to hold its next request to that broker (a quota; the records they acknowledged stand)");
    kafka_throttle_seconds: Counter<f64, std::sync::atomic::AtomicU64>,
        register("crm_booking_expiration_kafka_throttle_seconds", "Time Kafka brokers asked this client to hold its requests (quota throttling), in seconds");
    /// Claimed outbox rows in this instance's partition queues (waiting or
    /// on the way), not yet acknowledged.
    outbox_held: Gauge,
        register("crm_booking_expiration_outbox_held", "Claimed outbox rows in this instance's partition queues, not yet acknowledged by Kafka");
    /// Outbox rows written leased to this process's publisher that did not
    /// reach it (its intake full or closed): they wait for their lease.
    outbox_handoff_missed: Counter,
        register("crm_booking_expiration_outbox_handoff_missed", "Outbox rows written leased to this process's publisher that did not reach it; they are claimed when their lease ends");
    /// Outbox rows handed to the publisher without room in their
    /// partition's queue: their lease is cleared for any instance's claim.
    outbox_handoff_released: Counter,
        register("crm_booking_expiration_outbox_handoff_released", "Outbox rows handed to the publisher while their partition's queue was full; released for any instance's claim");
    /// Partitions whose last produce failed while rows wait for them.
    outbox_partitions_failing: Gauge,
        register("crm_booking_expiration_outbox_partitions_failing", "Partitions whose last produce failed while outbox rows wait for them");
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// Counts one failed produce request with its error code.
    pub fn produce_error(&self, code: &str) {
        self.outbox_produce_errors
            .get_or_create(&CodeLabel {
                code: code.to_owned(),
            })
            .inc();
    }

    /// The OpenMetrics text exposition.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exposes_the_specified_names() {
        let metrics = Metrics::new();
        metrics.items.get_or_create(&Phase::Reserve.into()).inc();
        metrics
            .lateness_seconds
            .get_or_create(&Phase::Booking.into())
            .observe(0.3);
        metrics
            .kafka_metadata_refreshes
            .get_or_create(&ReasonLabel { reason: "periodic" })
            .inc();
        let text = metrics.encode();
        for name in [
            "crm_booking_expiration_cycle_duration_seconds_bucket",
            "crm_booking_expiration_items_total{phase=\"reserve\"} 1",
            "crm_booking_expiration_backlog ",
            "crm_booking_expiration_lateness_seconds_bucket{le=\"0.5\",phase=\"booking\"} 1",
            "crm_booking_expiration_skip_locked_total ",
            "crm_booking_expiration_errors_total ",
            "crm_booking_expiration_clock_skew_exceeded ",
            "crm_booking_expiration_clock_skew_backoffs_total ",
            "crm_booking_expiration_outbox_oldest_unpublished_age_seconds ",
            "crm_booking_expiration_outbox_parked ",
            "crm_booking_expiration_kafka_metadata_refreshes_total{reason=\"periodic\"} 1",
        ] {
            assert!(text.contains(name), "{name} missing in\n{text}");
        }
    }
}
