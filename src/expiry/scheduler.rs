//! The schedule: a cycle at once, then one per interval, and (unless
//! `EXPIRATION_DEADLINE_WAKE=false`) one just after the next known deadline,
//! at least `EXPIRATION_MIN_GAP` after the previous cycle ended. While it
//! sleeps longer than a probe interval it reads the next deadline again
//! every [`PROBE_INTERVAL`](super::wake::PROBE_INTERVAL), so a deadline
//! written meanwhile is not left for the tick. The loop is sequential, so a
//! cycle never overlaps the next; ticks missed while a cycle ran are
//! skipped, not queued. What to wait for is decided by the pure
//! [`next_wake`] and [`backlog_left`]; this task only sleeps, probes, runs
//! cycles and stops. It also keeps the poison rows earlier cycles refused
//! ([`RefusedRows`]), left out of the cycles until the tick after next.

use std::{sync::Arc, time::Duration};

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::{
    CycleError, ExpiryWorker,
    refused::RefusedRows,
    wake::{WakeInputs, WakeReason, backlog_left, next_wake},
};
use crate::{context::TaskContext, domain::Phase, telemetry::ErrorChain};

/// The backlog gauge costs a count per phase: with deadline wake-ups cycles
/// can come every `EXPIRATION_MIN_GAP`, so it is measured at most this often.
const BACKLOG_INTERVAL: Duration = Duration::from_secs(5);

/// Runs cycles until `shutdown`; returns once the current cycle ended.
pub async fn run(worker: Arc<ExpiryWorker>, context: TaskContext, shutdown: CancellationToken) {
    let TaskContext {
        clock,
        metrics,
        health,
        ..
    } = context;
    let policy = worker.wake_policy();
    let mut next_tick = Instant::now();
    let mut last_end: Option<Instant> = None;
    let mut last_backlog: Option<Instant> = None;
    let mut next_deadline = None;
    let mut backlog = false;
    // The `as_of` of the last successful cycle: the probe asks for deadlines
    // from there on, so one written during that cycle is found too.
    let mut probe_from = None;
    let mut probe_failing = false;
    let mut refused = RefusedRows::new(worker.settings().batch_size);
    loop {
        let (wait, reason) = next_wake(
            &policy,
            &WakeInputs {
                now: clock.now(),
                until_tick: next_tick.saturating_duration_since(Instant::now()),
                since_last_cycle: last_end.map(|end| end.elapsed()),
                next_deadline,
                backlog_left: backlog,
                can_probe: probe_from.is_some(),
            },
        );
        tokio::select! {
            biased;
            _ = shutdown.cancelled() => break,
            _ = tokio::time::sleep(wait) => {}
        }
        if reason == WakeReason::Probe {
            let Some(as_of) = probe_from else { continue };
            // A probe is one index read per phase; a stop need not wait for it.
            let read = tokio::select! {
                biased;
                _ = shutdown.cancelled() => break,
                read = worker.next_deadline(as_of) => read,
            };
            match read {
                Ok(next) => {
                    next_deadline = next;
                    if std::mem::take(&mut probe_failing) {
                        tracing::info!("next deadline read again");
                    }
                }
                // Once per failing spell, not once a second.
                Err(error) if !probe_failing => {
                    probe_failing = true;
                    tracing::warn!(error = %ErrorChain(&error), "next deadline not read; probing on");
                }
                Err(_) => {}
            }
            continue;
        }
        // A wake at or after the tick serves the tick, whatever woke it; the
        // grid keeps its phase and skips the ticks that were missed.
        let now = Instant::now();
        if next_tick <= now {
            // Rows refused before the previous tick are tried again (logged
            // and counted); those refused since stay set aside.
            refused.tick();
        }
        while next_tick <= now {
            next_tick += policy.interval;
        }
        tracing::debug!(reason = reason.as_str(), "cycle wake-up");
        next_deadline = None;
        backlog = false;
        probe_from = None;
        match worker.run_cycle_leaving_out(&refused, &shutdown).await {
            Ok(outcome) => {
                let now = clock.now();
                health.record_cycle_success(now);
                metrics.last_success_timestamp_seconds.set(now.timestamp());
                let mut set_aside = 0;
                for (phase, ids) in Phase::ALL.into_iter().zip(&outcome.refused_ids) {
                    set_aside += refused.remember(phase, ids);
                }
                backlog = backlog_left(
                    outcome.budget_exhausted,
                    outcome.batch_cap_reached,
                    outcome.expired_in_capped_batches,
                    set_aside,
                );
                probe_from = Some(outcome.as_of);
                if policy.deadline_wake && !backlog {
                    match worker.next_deadline(outcome.as_of).await {
                        Ok(next) => next_deadline = next,
                        Err(error) => {
                            tracing::warn!(error = %ErrorChain(&error), "next deadline not read; the next probe reads it again")
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
