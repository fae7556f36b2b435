//! Liveness and readiness state shared by the tasks and the HTTP server.

use std::{
    sync::atomic::{AtomicBool, AtomicI64, Ordering},
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
    /// The broker check (a metadata request) succeeded last time.
    broker_reachable: AtomicBool,
    /// The last produce failed and rows still wait. A broker can answer
    /// metadata while produces fail (two of three brokers down:
    /// NOT_ENOUGH_REPLICAS), so the check alone does not make it ready.
    produce_failing: AtomicBool,
}

impl Health {
    pub fn new(started_at: DateTime<Utc>, worker_enabled: bool, publisher_enabled: bool) -> Self {
        Self {
            started_at,
            worker_enabled,
            publisher_enabled,
            last_cycle_success_ms: AtomicI64::new(0),
            broker_reachable: AtomicBool::new(false),
            produce_failing: AtomicBool::new(false),
        }
    }

    pub fn record_cycle_success(&self, at: DateTime<Utc>) {
        self.last_cycle_success_ms
            .store(at.timestamp_millis(), Ordering::Relaxed);
    }

    pub fn set_broker_reachable(&self, reachable: bool) {
        self.broker_reachable.store(reachable, Ordering::Relaxed);
    }

    /// Records a produce round: `ok` when every record was acknowledged
    /// (or nothing waited to be sent). A success also proves the broker
    /// reachable.
    pub fn record_produce(&self, ok: bool) {
        self.produce_failing.store(!ok, Ordering::Relaxed);
        if ok {
            self.broker_reachable.store(true, Ordering::Relaxed);
        }
    }

    /// Nothing waits in the outbox: a past produce failure no longer
    /// holds readiness back (the broker check decides alone).
    pub fn record_nothing_waiting(&self) {
        self.produce_failing.store(false, Ordering::Relaxed);
    }

    pub fn broker_ready(&self) -> bool {
        !self.publisher_enabled
            || (self.broker_reachable.load(Ordering::Relaxed)
                && !self.produce_failing.load(Ordering::Relaxed))
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
    fn a_failing_produce_keeps_it_unready_whatever_the_check_says() {
        let health = Health::new(Utc.timestamp_opt(1_800_000_000, 0).unwrap(), true, true);
        health.set_broker_reachable(true);
        health.record_produce(false);
        health.set_broker_reachable(true);
        assert!(!health.broker_ready());
        health.record_produce(true);
        assert!(health.broker_ready());
        health.record_produce(false);
        health.record_nothing_waiting();
        assert!(health.broker_ready());
        health.set_broker_reachable(false);
        health.record_nothing_waiting();
        assert!(!health.broker_ready());
    }
}
