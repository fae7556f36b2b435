//! The publisher's timing table: every duration it waits on, in one place,
//! each with the goal it comes from. Tests inject their own.
//!
//! Nothing here bounds how long one partition may hold up another: the
//! pipeline does not need a timer for that (a partition waits only for its
//! own request and its own backoff; see `pipeline`).

use std::time::Duration;

use crate::config::{KafkaSettings, PublisherSettings};

/// How long the publisher waits, and why.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timing {
    /// First pause of a partition after a retriable error. Kafka's
    /// `retry.backoff.ms`: a leader that moved is usually known again by
    /// then, and a partition whose produce failed is retried soon.
    pub retry_first: Duration,
    /// Longest pause between two tries of a partition that keeps failing
    /// with a retriable error (each pause doubles up to this, drawn from half
    /// to all of its step). The goal: a partition writable again publishes
    /// within a second, so the pause plus one produce round trip stays under
    /// it (Kafka's `retry.backoff.max.ms` is 1 s, with 20% jitter above).
    pub retry_max: Duration,
    /// Pause of a partition or topic after a non-retriable error
    /// (authorization, an unsupported request, a missing topic): nothing
    /// changes until an operator acts, so one try per this long (one request
    /// per partition, no new connection) is enough to resume soon after the
    /// fix; a second is the floor the issue sets for connection attempts.
    pub fatal_pause: Duration,
    /// A failure that lasts is reported at most once per this long (per
    /// partition or topic, with how many tries failed meanwhile); the
    /// metrics count every one.
    pub report_every: Duration,
    /// Bound of one Kafka request on this side (`KAFKA_REQUEST_TIMEOUT`).
    /// Longer than the broker's own produce timeout (30 s in rskafka's
    /// requests), so a live broker that waits for its replicas answers
    /// first; only a silent broker reaches it.
    pub request_timeout: Duration,
    /// How long a claimed row stays reserved for this instance. Another
    /// instance takes the row when the lease ends, so this bounds how late
    /// a killed instance's rows are sent (the spec's minute, with room for
    /// the send); rows held longer are renewed at half of it.
    pub lease: Duration,
    /// How often a topic's partition count is read again: partitions added
    /// to a topic get records at most this long after they appear (Kafka's
    /// `metadata.max.age.ms` is 5 min); it is also the readiness check of
    /// the broker while nothing is sent.
    pub metadata_max_age: Duration,
    /// Polling period when no commit notification arrives
    /// (`OUTBOX_POLL_INTERVAL`).
    pub poll_interval: Duration,
    /// First pause after a failed database round (it doubles up to
    /// [`Self::database_retry_max`]).
    pub database_retry_first: Duration,
    /// Longest pause after failed database rounds: a database back from a
    /// restart or failover is used again within this long.
    pub database_retry_max: Duration,
    /// At shutdown, how long requests in flight may still be acknowledged
    /// before their rows are released for another instance (a release after
    /// a write the broker did take is a duplicate): `SHUTDOWN_GRACE`, the
    /// grace the expiry's batch in flight gets too.
    pub stop_wait: Duration,
}

impl Timing {
    /// The table for `run`: the constants above with the operator's
    /// settings (`KAFKA_REQUEST_TIMEOUT`, `OUTBOX_POLL_INTERVAL`, and
    /// `SHUTDOWN_GRACE` as the stop wait).
    pub fn new(
        kafka: &KafkaSettings,
        publisher: &PublisherSettings,
        shutdown_grace: Duration,
    ) -> Self {
        Self {
            request_timeout: kafka.request_timeout,
            poll_interval: publisher.poll_interval,
            stop_wait: shutdown_grace,
            ..Self::default()
        }
    }
}

impl Default for Timing {
    fn default() -> Self {
        Self {
            retry_first: Duration::from_millis(100),
            retry_max: Duration::from_millis(800),
            fatal_pause: Duration::from_secs(5),
            report_every: Duration::from_secs(60),
            request_timeout: crate::config::defaults::KAFKA_REQUEST_TIMEOUT,
            lease: Duration::from_secs(15),
            metadata_max_age: Duration::from_secs(10),
            poll_interval: crate::config::defaults::OUTBOX_POLL_INTERVAL,
            database_retry_first: Duration::from_millis(100),
            database_retry_max: Duration::from_secs(2),
            stop_wait: Duration::from_secs(5),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The goals the table is derived from hold for its defaults.
    #[test]
    fn the_defaults_meet_their_goals() {
        let t = Timing::default();
        // Writable again -> publishing within a second, a round trip included.
        assert!(t.retry_max + Duration::from_millis(100) < Duration::from_secs(1));
        assert!(t.retry_first <= t.retry_max);
        // At most one try a second of a partition that cannot be written for good.
        assert!(t.fatal_pause >= Duration::from_secs(1));
        // A live broker answers before this side gives up (rskafka asks for 30 s).
        assert!(t.request_timeout > Duration::from_secs(30));
        // A killed instance's rows are on Kafka within the spec's minute.
        assert!(t.lease + t.poll_interval < Duration::from_secs(60));
        // Renewed at half the lease: one renewal round has half a lease to land.
        assert!(t.lease / 2 > t.database_retry_max);
    }
}
