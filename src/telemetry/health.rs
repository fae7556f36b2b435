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
    broker_reachable: AtomicBool,
}

impl Health {
    pub fn new(started_at: DateTime<Utc>, worker_enabled: bool, publisher_enabled: bool) -> Self {
        Self {
            started_at,
            worker_enabled,
            publisher_enabled,
            last_cycle_success_ms: AtomicI64::new(0),
            broker_reachable: AtomicBool::new(false),
        }
    }

    pub fn record_cycle_success(&self, at: DateTime<Utc>) {
        self.last_cycle_success_ms
            .store(at.timestamp_millis(), Ordering::Relaxed);
    }

    pub fn set_broker_reachable(&self, reachable: bool) {
        self.broker_reachable.store(reachable, Ordering::Relaxed);
    }

    pub fn broker_ready(&self) -> bool {
        !self.publisher_enabled || self.broker_reachable.load(Ordering::Relaxed)
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
}
