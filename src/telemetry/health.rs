//! Liveness and readiness state shared by the tasks and the HTTP server.

use std::{
    sync::atomic::{AtomicBool, AtomicI64, AtomicUsize, Ordering},
    time::Duration,
};

use chrono::{DateTime, Utc};

/// What `/healthz` and `/readyz` report.
#[derive(Debug)]
pub struct Health {
    started_at: DateTime<Utc>,
    worker_enabled: bool,
    publisher_enabled: bool,
    /// Unix millis of the last successful cycle; 0 = none yet.
    last_cycle_success_ms: AtomicI64,
    /// The last read of the topic's metadata succeeded.
    broker_reachable: AtomicBool,
    /// Partitions (or topics) whose last try failed while rows wait for
    /// them. A broker can answer metadata while produces fail (two of three
    /// brokers down: NOT_ENOUGH_REPLICAS), so the metadata alone does not
    /// make it ready.
    partitions_failing: AtomicUsize,
    /// Of those, the ones failing with an error no retry fixes
    /// (authorization, a missing topic): they wait for an operator.
    partitions_refusing: AtomicUsize,
    /// The Kafka error of a failing partition (an operator's first, when
    /// there is one), for `/readyz`'s body.
    failing_code: std::sync::Mutex<Option<String>>,
}

/// The publisher's side of readiness.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BrokerState {
    Ready,
    Unreachable,
    /// Some partitions cannot be written (`refusing` of them for a reason
    /// an operator has to fix).
    Failing {
        partitions: usize,
        refusing: usize,
    },
}

impl std::fmt::Display for BrokerState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            BrokerState::Ready => f.write_str("ok"),
            BrokerState::Unreachable => f.write_str("unreachable"),
            BrokerState::Failing {
                partitions,
                refusing,
            } => write!(
                f,
                "{partitions} partition(s) cannot be written, {refusing} of them until an operator acts"
            ),
        }
    }
}

impl Health {
    pub fn new(started_at: DateTime<Utc>, worker_enabled: bool, publisher_enabled: bool) -> Self {
        Self {
            started_at,
            worker_enabled,
            publisher_enabled,
            last_cycle_success_ms: AtomicI64::new(0),
            broker_reachable: AtomicBool::new(false),
            partitions_failing: AtomicUsize::new(0),
            partitions_refusing: AtomicUsize::new(0),
            failing_code: std::sync::Mutex::new(None),
        }
    }

    pub fn record_cycle_success(&self, at: DateTime<Utc>) {
        self.last_cycle_success_ms
            .store(at.timestamp_millis(), Ordering::Relaxed);
    }

    pub fn set_broker_reachable(&self, reachable: bool) {
        self.broker_reachable.store(reachable, Ordering::Relaxed);
    }

    /// How many partitions cannot be written now (see [`BrokerState`]),
    /// and the Kafka error of one of them.
    pub fn set_partitions_failing(&self, failing: usize, refusing: usize, code: Option<&str>) {
        self.partitions_failing.store(failing, Ordering::Relaxed);
        self.partitions_refusing.store(refusing, Ordering::Relaxed);
        if let Ok(mut last) = self.failing_code.lock()
            && last.as_deref() != code
        {
            *last = code.map(str::to_owned);
        }
    }

    /// The Kafka error of a failing partition, while one fails.
    pub fn failing_code(&self) -> Option<String> {
        self.failing_code.lock().ok().and_then(|code| code.clone())
    }

    pub fn broker_state(&self) -> BrokerState {
        if !self.publisher_enabled {
            return BrokerState::Ready;
        }
        if !self.broker_reachable.load(Ordering::Relaxed) {
            return BrokerState::Unreachable;
        }
        match self.partitions_failing.load(Ordering::Relaxed) {
            0 => BrokerState::Ready,
            partitions => BrokerState::Failing {
                partitions,
                refusing: self.partitions_refusing.load(Ordering::Relaxed),
            },
        }
    }

    pub fn broker_ready(&self) -> bool {
        self.broker_state() == BrokerState::Ready
    }

    /// Live while a cycle succeeded within `window`, or the process started
    /// less than `window` ago (the first cycles may still be retrying).
    pub fn is_live(&self, now: DateTime<Utc>, window: Duration) -> bool {
        if !self.worker_enabled {
            return true;
        }
        let window_ms = i64::try_from(window.as_millis()).unwrap_or(i64::MAX);
        let last = self.last_cycle_success_ms.load(Ordering::Relaxed);
        let reference = last.max(self.started_at.timestamp_millis());
        now.timestamp_millis().saturating_sub(reference) <= window_ms
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;

    #[test]
    fn liveness_follows_the_last_success() {
        let t0 = Utc.timestamp_opt(1_800_000_000, 0).unwrap();
        let health = Health::new(t0, true, true);
        let window = Duration::from_secs(300);
        assert!(health.is_live(t0 + chrono::Duration::seconds(299), window));
        assert!(!health.is_live(t0 + chrono::Duration::seconds(301), window));
        health.record_cycle_success(t0 + chrono::Duration::seconds(200));
        assert!(health.is_live(t0 + chrono::Duration::seconds(499), window));
        assert!(!health.broker_ready());
        health.set_broker_reachable(true);
        assert!(health.broker_ready());
    }

    #[test]
    fn a_failing_partition_keeps_it_unready_whatever_the_metadata_says() {
        let health = Health::new(Utc.timestamp_opt(1_800_000_000, 0).unwrap(), true, true);
        health.set_broker_reachable(true);
        health.set_partitions_failing(1, 0, Some("NOT_ENOUGH_REPLICAS"));
        assert_eq!(
            health.broker_state(),
            BrokerState::Failing {
                partitions: 1,
                refusing: 0
            }
        );
        assert!(!health.broker_ready());
        assert_eq!(
            health.failing_code().as_deref(),
            Some("NOT_ENOUGH_REPLICAS")
        );
        health.set_partitions_failing(0, 0, None);
        assert_eq!(health.failing_code(), None);
        assert!(health.broker_ready());
        health.set_broker_reachable(false);
        assert_eq!(health.broker_state(), BrokerState::Unreachable);
        let worker_only = Health::new(Utc.timestamp_opt(1_800_000_000, 0).unwrap(), true, false);
        assert!(worker_only.broker_ready());
    }
}
