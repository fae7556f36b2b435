//! One expiry cycle: batch after batch, for both phases taking turns, each
//! batch after the last row of the one before ([`Sweep`]), until the due
//! rows run out, the time budget or the batch cap is reached, or shutdown.
//! [`ExpiryWorker::run_cycle`] is the one way to start one; [`CycleStart`]
//! says at what `as_of` and from where.

use std::{collections::HashSet, time::Instant};

use chrono::{DateTime, SubsecRound as _, Utc};
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use super::{
    batch::BatchAt,
    outcome::{CycleError, CycleOutcome},
    sweep::Sweep,
    worker::ExpiryWorker,
};
use crate::domain::{Phase, RunId};

/// How a cycle starts. From a shutdown token alone
/// (`worker.run_cycle(&shutdown)`, the `once` command): `as_of` from the
/// clock, bounded by the database clock ([`ExpiryWorker::checked_now`]),
/// a fresh run id, each phase swept from its oldest deadline, and a
/// clamped `as_of` logged. [`CycleStart::at`] and [`CycleStart::resuming`]
/// change that.
#[derive(Debug)]
pub struct CycleStart<'a> {
    shutdown: &'a CancellationToken,
    at: Option<(DateTime<Utc>, RunId)>,
    sweep: Option<&'a mut Sweep>,
}

impl<'a> CycleStart<'a> {
    /// A cycle that stops at `shutdown`, otherwise as the type says.
    pub fn new(shutdown: &'a CancellationToken) -> Self {
        Self {
            shutdown,
            at: None,
            sweep: None,
        }
    }

    /// At `as_of` with `run_id`, as given: neither read from the clock nor
    /// bounded by the database clock (tests and benchmarks pin them).
    pub fn at(mut self, as_of: DateTime<Utc>, run_id: RunId) -> Self {
        self.at = Some((as_of, run_id));
        self
    }

    /// Going on with `sweep` (the scheduler's, carried from cycle to
    /// cycle), moved on with every batch the cycle commits (also when a
    /// later batch fails). Saying a clamped `as_of` is left to the caller,
    /// which says it once a minute rather than every cycle.
    pub fn resuming(mut self, sweep: &'a mut Sweep) -> Self {
        self.sweep = Some(sweep);
        self
    }
}

impl<'a> From<&'a CancellationToken> for CycleStart<'a> {
    fn from(shutdown: &'a CancellationToken) -> Self {
        Self::new(shutdown)
    }
}

/// Per-phase progress within a cycle.
#[derive(Debug, Default, Clone, Copy)]
struct PhaseProgress {
    finished: bool,
    batches: u32,
}

impl ExpiryWorker {
    /// One cycle over both phases, started as `start` says ([`CycleStart`]).
    pub async fn run_cycle<'a>(
        &self,
        start: impl Into<CycleStart<'a>>,
    ) -> Result<CycleOutcome, CycleError> {
        let CycleStart {
            shutdown,
            at,
            sweep,
        } = start.into();
        let say_clamp = sweep.is_none();
        let mut from_oldest = Sweep::default();
        let sweep = sweep.unwrap_or(&mut from_oldest);
        let (as_of, run_id, clamped_ahead_by) = match at {
            Some((as_of, run_id)) => (as_of, run_id, None),
            None => {
                let as_of = self.checked_now().await?;
                (as_of.at, RunId::generate(), as_of.clamped_ahead_by)
            }
        };
        // PostgreSQL keeps microseconds: the event's expired_at must equal the row's.
        let as_of = as_of.trunc_subsecs(6);
        let span = tracing::info_span!(
            "expiry_cycle",
            run_id = %run_id,
            correlation_id = %run_id,
            tenant_count = tracing::field::Empty,
        );
        let mut outcome = self
            .cycle(as_of, run_id, sweep, shutdown)
            .instrument(span)
            .await?;
        outcome.clamped_ahead_by = clamped_ahead_by;
        if say_clamp && let Some(ahead) = clamped_ahead_by {
            tracing::warn!(
                skew_ms = ahead.num_milliseconds(),
                "local clock ahead of the database clock by more than \
                 EXPIRATION_MAX_CLOCK_SKEW; as_of clamped"
            );
        }
        Ok(outcome)
    }

    async fn cycle(
        &self,
        as_of: DateTime<Utc>,
        run_id: RunId,
        sweep: &mut Sweep,
        shutdown: &CancellationToken,
    ) -> Result<CycleOutcome, CycleError> {
        let started = Instant::now();
        tracing::info!(%as_of, "cycle started");
        let mut conn = tokio::select! {
            biased;
            _ = shutdown.cancelled() => return Err(CycleError::Cancelled),
            conn = self.pool.get() => conn.map_err(|e| CycleError::Connection(e.into()))?,
        };
        let mut outcome = CycleOutcome::started(run_id, as_of);
        let mut progress = [PhaseProgress::default(); 2];
        // The tenants of the expired bookings: their number is a field of
        // the cycle span, recorded once when the cycle ends (each booking's
        // own line and outbox record name its tenant).
        let mut tenants = HashSet::new();
        // Phases take turns batch by batch, so a large backlog in one phase
        // cannot use up the budget before the other phase had a batch.
        while progress.iter().any(|p| !p.finished) {
            for (phase, state) in Phase::ALL.into_iter().zip(progress.iter_mut()) {
                if state.finished {
                    continue;
                }
                if shutdown.is_cancelled() {
                    return Err(CycleError::Cancelled);
                }
                // The first batch of each phase always runs, so however
                // short the budget, a cycle gets somewhere.
                if state.batches > 0 && started.elapsed() >= self.settings.cycle_budget {
                    outcome.budget_exhausted = true;
                    tracing::warn!(
                        budget_ms = self.settings.cycle_budget.as_millis() as u64,
                        "cycle budget used up with full batches; the next cycle continues"
                    );
                    return Ok(self.finish(outcome, started, tenants.len()));
                }
                let at = BatchAt {
                    phase,
                    as_of,
                    run_id,
                    after: sweep.after(phase),
                };
                let mut batch = self.batch_with_grace(&mut conn, at, shutdown).await?;
                let full = batch.selected >= self.settings.batch_size as usize;
                sweep.batch_done(phase, batch.last, full);
                state.batches += 1;
                outcome.batches += 1;
                tenants.extend(batch.expired.iter().map(|e| e.tenant_id.as_uuid()));
                self.after_commit(phase, &mut batch, &mut outcome);
                if !full {
                    state.finished = true;
                } else if state.batches >= self.settings.max_batches_per_cycle {
                    state.finished = true;
                    outcome.batch_cap_reached = true;
                }
            }
        }
        Ok(self.finish(outcome, started, tenants.len()))
    }

    fn finish(
        &self,
        mut outcome: CycleOutcome,
        started: Instant,
        tenant_count: usize,
    ) -> CycleOutcome {
        tracing::Span::current().record("tenant_count", tenant_count);
        let elapsed = started.elapsed();
        outcome.report.duration_ms = elapsed.as_millis() as u64;
        self.metrics
            .cycle_duration_seconds
            .observe(elapsed.as_secs_f64());
        let report = outcome.report;
        tracing::info!(
            reserve_expired_count = report.reserve_expired_count,
            booking_expired_count = report.booking_expired_count,
            // The log field is spec §6's `skipped_locked`; the report (`once`) keeps `skipped_locked_count`.
            skipped_locked = report.skipped_locked_count,
            poison_count = outcome.poison_count,
            version_conflicts = outcome.version_conflicts,
            batches = outcome.batches,
            duration_ms = report.duration_ms,
            "cycle completed"
        );
        outcome
    }
}
