//! The schedule: a cycle at once, then one per interval, and (unless
//! `EXPIRATION_DEADLINE_WAKE=false`, and only on the instance that holds
//! the [`Waker`]'s lease) one just after the next known deadline, at least
//! `EXPIRATION_MIN_GAP` after the previous cycle started. While it
//! sleeps longer than a probe interval it reads the next deadline again
//! every [`PROBE_INTERVAL`](super::wake::PROBE_INTERVAL), so a deadline
//! written meanwhile is not left for the tick. The loop is sequential, so a
//! cycle never overlaps the next; ticks missed while a cycle ran are
//! skipped, not queued. A failed cycle is tried again after a backoff
//! that doubles up to the interval. What to wait for is decided by the pure
//! [`next_wake`] and [`backlog_left`]; this task only sleeps, probes, runs
//! cycles and stops. It also carries each phase's [`Sweep`] from cycle to
//! cycle (poison rows are passed over, not read by every cycle), and while
//! the clock is out of skew it waits for the tick between cycles, says so
//! once a minute ([`SkewWarnings`]) and counts it.

use std::{sync::Arc, time::Duration};

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::{
    CycleError, CycleStart, ExpiryWorker,
    skew::{SkewWarnings, WARN_EVERY},
    sweep::Sweep,
    wake::{RETRY_FIRST, WakeInputs, WakeReason, backlog_left, next_wake},
    waker::{Waker, keep_lease},
};
use crate::{backoff::Backoff, context::TaskContext, telemetry::ErrorChain};

/// The backlog gauge costs a count per phase: with deadline wake-ups cycles
/// can come every `EXPIRATION_MIN_GAP`, so it is measured at most this often.
const BACKLOG_INTERVAL: Duration = Duration::from_secs(5);

/// Runs cycles until `shutdown`; returns once the current cycle ended.
pub async fn run(worker: Arc<ExpiryWorker>, context: TaskContext, shutdown: CancellationToken) {
    let TaskContext {
        clock,
        metrics,
        health,
        pool,
    } = context;
    let policy = worker.wake_policy();
    // With deadline wake-ups on, one instance at a time wakes at them (the
    // waker); without, every instance keeps the tick alone.
    let waker = Arc::new(Waker::default());
    let lease = policy.deadline_wake.then(|| {
        tokio::spawn(keep_lease(
            pool,
            Arc::clone(&waker),
            Arc::clone(&metrics),
            shutdown.clone(),
        ))
    });
    let mut next_tick = Instant::now();
    let mut last_start: Option<Instant> = None;
    let mut last_backlog: Option<Instant> = None;
    let mut next_deadline = None;
    let mut backlog = false;
    // The `as_of` of the last successful cycle: the probe asks for deadlines
    // from there on, so one written during that cycle is found too.
    let mut probe_from = None;
    let mut probe_failing = false;
    let mut sweep = Sweep::default();
    let mut clock_ahead = false;
    // After a failed cycle: when the next one tries again.
    let mut retry = Backoff::new(RETRY_FIRST, policy.interval);
    let mut retry_at: Option<Instant> = None;
    let mut skew_warnings = SkewWarnings::default();
    let max_skew_ms = worker
        .settings()
        .max_clock_skew
        .map_or(0, |skew| skew.as_millis() as u64);
    loop {
        let (wait, reason) = if waker.take_became_waker() && probe_from.is_some() {
            // Just became the waker: read the next deadline at once.
            (Duration::ZERO, WakeReason::Probe)
        } else {
            next_wake(
                &policy,
                &WakeInputs {
                    now: clock.now(),
                    until_tick: next_tick.saturating_duration_since(Instant::now()),
                    since_last_cycle: last_start.map(|start| start.elapsed()),
                    next_deadline,
                    backlog_left: backlog,
                    can_probe: probe_from.is_some(),
                    clock_ahead,
                    waker: waker.is_waker(),
                    helping: waker.helping(),
                    retry_in: retry_at.map(|at| at.saturating_duration_since(Instant::now())),
                },
            )
        };
        tokio::select! {
            biased;
            _ = shutdown.cancelled() => break,
            _ = tokio::time::sleep(wait) => {}
            // The waker changed hands, or started or stopped needing help:
            // decide anew.
            () = waker.changed() => continue,
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
            // A phase whose sweep reached the end starts over: poison rows
            // are tried again (logged and counted), skipped rows taken.
            sweep.tick();
        }
        while next_tick <= now {
            next_tick += policy.interval;
        }
        tracing::debug!(reason = reason.as_str(), "cycle wake-up");
        last_start = Some(now);
        next_deadline = None;
        backlog = false;
        probe_from = None;
        match worker
            .run_cycle(CycleStart::new(&shutdown).resuming(&mut sweep))
            .await
        {
            Ok(outcome) => {
                retry.reset();
                retry_at = None;
                let now = clock.now();
                health.record_cycle_success(now);
                metrics.last_success_timestamp_seconds.set(now.timestamp());
                backlog = backlog_left(outcome.budget_exhausted, outcome.batch_cap_reached);
                waker.set_backlog(backlog);
                clock_ahead = outcome.clamped_ahead_by.is_some();
                if let Some(ahead) = outcome.clamped_ahead_by {
                    metrics.clock_skew_backoffs.inc();
                    if let Some(cycles) = skew_warnings.clamped(Instant::now()) {
                        tracing::warn!(
                            skew_ms = ahead.num_milliseconds(),
                            max_skew_ms,
                            clamped_cycles = cycles,
                            warn_every_s = WARN_EVERY.as_secs(),
                            "local clock ahead of the database clock by more than \
                             EXPIRATION_MAX_CLOCK_SKEW; as_of clamped, one cycle per tick \
                             until it is back"
                        );
                    }
                } else if skew_warnings.within() {
                    tracing::info!("local clock back within EXPIRATION_MAX_CLOCK_SKEW");
                }
                probe_from = Some(outcome.as_of);
                if policy.deadline_wake && waker.is_waker() && !backlog && !clock_ahead {
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
                let delay = retry.next_delay();
                retry_at = Some(Instant::now() + delay);
                tracing::error!(
                    error = %ErrorChain(&error),
                    retry_in_ms = delay.as_millis() as u64,
                    "cycle failed; the next cycle retries"
                );
            }
        }
        if reason == WakeReason::Tick
            || last_backlog.is_none_or(|t| t.elapsed() >= BACKLOG_INTERVAL)
        {
            last_backlog = Some(Instant::now());
            if let Err(error) = worker.measure_backlog().await {
                tracing::warn!(error = %ErrorChain(&error), "backlog not measured");
            }
        }
    }
    if let Some(lease) = lease
        && let Err(error) = lease.await
    {
        tracing::warn!(%error, "the deadline waker's lease task ended abnormally");
    }
    tracing::info!("expiry worker stopped");
}
