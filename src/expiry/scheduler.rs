//! The schedule: a cycle at once, then one per interval, and (unless
//! `EXPIRATION_DEADLINE_WAKE=false`) one just after the next known deadline,
//! at least `EXPIRATION_MIN_GAP` after the previous cycle ended. The loop is
//! sequential, so a cycle never overlaps the next; ticks missed while a cycle
//! ran are skipped, not queued. What to wait for is decided by the pure
//! [`next_wake`]; this task only sleeps, runs cycles and stops.

use std::{sync::Arc, time::Duration};

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::{
    CycleError, ExpiryWorker,
    wake::{WakeInputs, WakeReason, next_wake},
};
use crate::{
    clock::Clock,
    telemetry::{ErrorChain, Health, Metrics},
};

/// The backlog gauge costs a count per phase: with deadline wake-ups cycles
/// can come every `EXPIRATION_MIN_GAP`, so it is measured at most this often.
const BACKLOG_INTERVAL: Duration = Duration::from_secs(5);

/// Runs cycles until `shutdown`; returns once the current cycle ended.
pub async fn run(
    worker: Arc<ExpiryWorker>,
    clock: Arc<dyn Clock>,
    metrics: Arc<Metrics>,
    health: Arc<Health>,
    shutdown: CancellationToken,
) {
    let policy = worker.wake_policy();
    let mut next_tick = Instant::now();
    let mut last_end: Option<Instant> = None;
    let mut last_backlog: Option<Instant> = None;
    let mut next_deadline = None;
    let mut backlog_left = false;
    loop {
        let (wait, reason) = next_wake(
            &policy,
            &WakeInputs {
                now: clock.now(),
                until_tick: next_tick.saturating_duration_since(Instant::now()),
                since_last_cycle: last_end.map(|end| end.elapsed()),
                next_deadline,
                backlog_left,
            },
        );
        tokio::select! {
            biased;
            _ = shutdown.cancelled() => break,
            _ = tokio::time::sleep(wait) => {}
        }
        // A wake at or after the tick serves the tick, whatever woke it; the
        // grid keeps its phase and skips the ticks that were missed.
        let now = Instant::now();
        while next_tick <= now {
            next_tick += policy.interval;
        }
        tracing::debug!(reason = reason.as_str(), "cycle wake-up");
        next_deadline = None;
        backlog_left = false;
        match worker.run_cycle(&shutdown).await {
            Ok(outcome) => {
                let now = clock.now();
                health.record_cycle_success(now);
                metrics.last_success_timestamp_seconds.set(now.timestamp());
                backlog_left = outcome.budget_exhausted;
                if policy.deadline_wake && !backlog_left {
                    match worker.next_deadline(outcome.as_of).await {
                        Ok(next) => next_deadline = next,
                        Err(error) => {
                            tracing::warn!(error = %ErrorChain(&error), "next deadline not read; waiting for the tick")
                        }
                    }
                }
            }
            Err(CycleError::Cancelled) => break,
            Err(error) => {
                metrics.errors.inc();
                metrics.cycles_failed.inc();
                tracing::error!(error = %ErrorChain(&error), "cycle failed; the next cycle retries");
            }
        }
        last_end = Some(Instant::now());
        if reason == WakeReason::Tick
            || last_backlog.is_none_or(|t| t.elapsed() >= BACKLOG_INTERVAL)
        {
            last_backlog = Some(Instant::now());
            if let Err(error) = worker.measure_backlog().await {
                tracing::warn!(error = %ErrorChain(&error), "backlog not measured");
            }
        }
    }
    tracing::info!("expiry worker stopped");
}
