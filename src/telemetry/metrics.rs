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

/// Every metric the process exports. Counters are registered without the
/// `_total` suffix because the OpenMetrics encoder appends it.
pub struct Metrics {
    registry: Registry,
    pub cycle_duration_seconds: Histogram,
    pub items: Family<PhaseLabel, Counter>,
    /// `expired_at` minus the booking's deadline, per phase.
    pub lateness_seconds: Family<PhaseLabel, Histogram, fn() -> Histogram>,
    pub backlog: Gauge,
    pub skip_locked: Counter,
    pub errors: Counter,
    pub cycles_failed: Counter,
    pub last_success_timestamp_seconds: Gauge,
    pub clock_skew_seconds: Gauge<f64, std::sync::atomic::AtomicU64>,
    /// 1 while the last clock check found the local clock further ahead of
    /// the database clock than `EXPIRATION_MAX_CLOCK_SKEW`, else 0.
    pub clock_skew_exceeded: Gauge,
    /// Cycles after which the scheduler waited for the tick because their
    /// `as_of` was clamped.
    pub clock_skew_backoffs: Counter,
    pub outbox_unpublished: Gauge,
    pub outbox_oldest_unpublished_age_seconds: Gauge,
    pub outbox_published: Counter,
    pub outbox_publish_errors: Counter,
    pub outbox_produce_duration_seconds: Histogram,
    pub outbox_commit_to_ack_seconds: Histogram,
    pub outbox_deleted: Counter,
    /// Outbox rows parked (refused by the broker for good).
    pub outbox_parked: Gauge,
    /// Failed produce requests, by Kafka error code.
    pub outbox_produce_errors: Family<CodeLabel, Counter>,
    /// Kafka metadata lookups, by reason.
    pub kafka_metadata_refreshes: Family<ReasonLabel, Counter>,
    /// 1 while this instance is the deadline waker (the one instance that
    /// wakes at each deadline), else 0.
    pub expiry_waker: Gauge,
    /// Kafka answers that asked this client to hold its next request (a
    /// quota), and the holds asked for in seconds.
    pub kafka_throttled_responses: Counter,
    pub kafka_throttle_seconds: Counter<f64, std::sync::atomic::AtomicU64>,
    /// Claimed outbox rows in this instance's partition queues (waiting or
    /// on the way), not yet acknowledged.
    pub outbox_held: Gauge,
    /// Partitions whose last produce failed while rows wait for them.
    pub outbox_partitions_failing: Gauge,
    /// Outbox rows written leased to this process's publisher that did not
    /// reach it (its intake full or closed): they wait for their lease.
    pub outbox_handoff_missed: Counter,
    /// Outbox rows handed to the publisher without room in their
    /// partition's queue: their lease is cleared for any instance's claim.
    pub outbox_handoff_released: Counter,
}

/// Lateness buckets: fine below a second (the deadline wake-up's goal), then
/// up to the fixed schedule's interval and beyond.
fn lateness_histogram() -> Histogram {
    Histogram::new([
        0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 0.75, 1.0, 2.0, 5.0, 15.0, 30.0, 60.0, 120.0, 300.0,
    ])
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
    pub fn new() -> Self {
        let mut registry = Registry::default();
        let cycle_duration_seconds = Histogram::new([
            0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
        ]);
        let latency_buckets = [
            0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
            60.0,
        ];
        let outbox_produce_duration_seconds = Histogram::new(latency_buckets);
        let outbox_commit_to_ack_seconds = Histogram::new(latency_buckets);
        let metrics = Self {
            cycle_duration_seconds,
            items: Family::default(),
            lateness_seconds: Family::new_with_constructor(lateness_histogram),
            backlog: Gauge::default(),
            skip_locked: Counter::default(),
            errors: Counter::default(),
            cycles_failed: Counter::default(),
            last_success_timestamp_seconds: Gauge::default(),
            clock_skew_seconds: Gauge::default(),
            clock_skew_exceeded: Gauge::default(),
            clock_skew_backoffs: Counter::default(),
            outbox_unpublished: Gauge::default(),
            outbox_oldest_unpublished_age_seconds: Gauge::default(),
            outbox_published: Counter::default(),
            outbox_publish_errors: Counter::default(),
            outbox_produce_duration_seconds,
            outbox_commit_to_ack_seconds,
            outbox_deleted: Counter::default(),
            outbox_parked: Gauge::default(),
            outbox_produce_errors: Family::default(),
            kafka_metadata_refreshes: Family::default(),
            expiry_waker: Gauge::default(),
            kafka_throttled_responses: Counter::default(),
            kafka_throttle_seconds: Counter::default(),
            outbox_held: Gauge::default(),
            outbox_partitions_failing: Gauge::default(),
            outbox_handoff_missed: Counter::default(),
            outbox_handoff_released: Counter::default(),
            registry: Registry::default(),
        };
        registry.register(
            "crm_booking_expiration_cycle_duration_seconds",
            "Duration of one expiry cycle",
            metrics.cycle_duration_seconds.clone(),
        );
        registry.register(
            "crm_booking_expiration_items",
            "Bookings expired, by phase",
            metrics.items.clone(),
        );
        registry.register(
            "crm_booking_expiration_lateness_seconds",
            "Time from a booking's deadline to its expiry (expired_at minus the deadline), by phase",
            metrics.lateness_seconds.clone(),
        );
        registry.register(
            "crm_booking_expiration_backlog",
            "Active bookings whose deadline passed and that are not expired yet",
            metrics.backlog.clone(),
        );
        registry.register(
            "crm_booking_expiration_skip_locked",
            "Due bookings skipped because another transaction held their row lock",
            metrics.skip_locked.clone(),
        );
        registry.register(
            "crm_booking_expiration_errors",
            "Poison bookings refused by the domain plus failed cycles",
            metrics.errors.clone(),
        );
        registry.register(
            "crm_booking_expiration_cycles_failed",
            "Cycles that ended with an infrastructure error",
            metrics.cycles_failed.clone(),
        );
        registry.register(
            "crm_booking_expiration_last_success_timestamp_seconds",
            "Unix time of the last cycle that completed without an infrastructure error",
            metrics.last_success_timestamp_seconds.clone(),
        );
        registry.register(
            "crm_booking_expiration_clock_skew_seconds",
            "Local clock minus database clock at the last cycle start",
            metrics.clock_skew_seconds.clone(),
        );
        registry.register(
            "crm_booking_expiration_clock_skew_exceeded",
            "1 while the local clock is ahead of the database clock by more than EXPIRATION_MAX_CLOCK_SKEW (as_of clamped), else 0",
            metrics.clock_skew_exceeded.clone(),
        );
        registry.register(
            "crm_booking_expiration_clock_skew_backoffs",
            "Cycles whose as_of was clamped for clock skew, after which the scheduler waited for the tick",
            metrics.clock_skew_backoffs.clone(),
        );
        registry.register(
            "crm_booking_expiration_outbox_unpublished",
            "Outbox rows not yet published to Kafka",
            metrics.outbox_unpublished.clone(),
        );
        registry.register(
            "crm_booking_expiration_outbox_oldest_unpublished_age_seconds",
            "Age of the oldest unpublished outbox row (outbox lag)",
            metrics.outbox_oldest_unpublished_age_seconds.clone(),
        );
        registry.register(
            "crm_booking_expiration_outbox_published",
            "Outbox rows acknowledged by Kafka",
            metrics.outbox_published.clone(),
        );
        registry.register(
            "crm_booking_expiration_outbox_publish_errors",
            "Publish attempts that failed (rows stay in the outbox)",
            metrics.outbox_publish_errors.clone(),
        );
        registry.register(
            "crm_booking_expiration_outbox_produce_duration_seconds",
            "Duration of one produce round to Kafka",
            metrics.outbox_produce_duration_seconds.clone(),
        );
        registry.register(
            "crm_booking_expiration_outbox_commit_to_ack_seconds",
            "Time from an outbox row's commit to the broker's acknowledgement",
            metrics.outbox_commit_to_ack_seconds.clone(),
        );
        registry.register(
            "crm_booking_expiration_outbox_deleted",
            "Published outbox rows removed by retention",
            metrics.outbox_deleted.clone(),
        );
        registry.register(
            "crm_booking_expiration_outbox_parked",
            "Outbox rows parked because the broker refused them for a reason no retry fixes",
            metrics.outbox_parked.clone(),
        );
        registry.register(
            "crm_booking_expiration_outbox_produce_errors",
            "Failed produce requests to Kafka, by Kafka error code",
            metrics.outbox_produce_errors.clone(),
        );
        registry.register(
            "crm_booking_expiration_kafka_metadata_refreshes",
            "Kafka metadata lookups by reason: connect, periodic (partition count), leader (after a failed produce)",
            metrics.kafka_metadata_refreshes.clone(),
        );
        registry.register(
            "crm_booking_expiration_expiry_waker",
            "1 while this instance is the deadline waker (the one instance that wakes at each deadline; the others keep the interval tick), else 0",
            metrics.expiry_waker.clone(),
        );
        registry.register(
            "crm_booking_expiration_kafka_throttled_responses",
            "Kafka answers that asked this client to hold its next request to that broker (a quota; the records they acknowledged stand)",
            metrics.kafka_throttled_responses.clone(),
        );
        registry.register(
            "crm_booking_expiration_kafka_throttle_seconds",
            "Time Kafka brokers asked this client to hold its requests (quota throttling), in seconds",
            metrics.kafka_throttle_seconds.clone(),
        );
        registry.register(
            "crm_booking_expiration_outbox_held",
            "Claimed outbox rows in this instance's partition queues, not yet acknowledged by Kafka",
            metrics.outbox_held.clone(),
        );
        registry.register(
            "crm_booking_expiration_outbox_handoff_missed",
            "Outbox rows written leased to this process's publisher that did not reach it; they are claimed when their lease ends",
            metrics.outbox_handoff_missed.clone(),
        );
        registry.register(
            "crm_booking_expiration_outbox_handoff_released",
            "Outbox rows handed to the publisher while their partition's queue was full; released for any instance's claim",
            metrics.outbox_handoff_released.clone(),
        );
        registry.register(
            "crm_booking_expiration_outbox_partitions_failing",
            "Partitions whose last produce failed while outbox rows wait for them",
            metrics.outbox_partitions_failing.clone(),
        );
        Self {
            registry,
            ..metrics
        }
    }

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
