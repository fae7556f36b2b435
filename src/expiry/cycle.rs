//! One expiry cycle: lock, transition, audit, outbox, commit, batch after
//! batch, for both phases, each batch after the last row of the one before
//! ([`Sweep`]).

use std::{
    collections::{HashMap, HashSet},
    sync::Arc,
    time::{Duration, Instant},
};

use chrono::{DateTime, SubsecRound as _, Utc};
use diesel_async::{AsyncConnection, AsyncPgConnection};
use serde::Serialize;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;
use uuid::Uuid;

use super::{
    skew::{self, AsOf},
    sweep::Sweep,
    wake::WakePolicy,
};
use crate::{
    clock::Clock,
    config::{EventSettings, ExpirySettings, ShutdownSettings},
    context::TaskContext,
    db::{
        DbError, PgPool,
        bookings::{self, ExpiryWrite, Position},
    },
    domain::{BookingExpired, DomainEventSubscriber, ExpireError, Phase, RunId},
    events,
    handoff::{Handoff, LeasedRow},
    telemetry::{Metrics, trace},
};

/// The result of a cycle, exactly the JSON line `once` prints.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct CycleReport {
    pub reserve_expired_count: u64,
    pub booking_expired_count: u64,
    pub skipped_locked_count: u64,
    pub duration_ms: u64,
}

impl CycleReport {
    /// Bookings the cycle expired, both phases.
    pub fn expired(&self) -> u64 {
        self.reserve_expired_count + self.booking_expired_count
    }
}

/// The report plus what logs and tests need besides.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CycleOutcome {
    pub run_id: RunId,
    pub as_of: DateTime<Utc>,
    pub report: CycleReport,
    /// Rows the domain refused (left untouched for the next cycle).
    pub poison_count: u64,
    /// Rows whose version or status changed between read and write.
    pub version_conflicts: u64,
    pub batches: u32,
    /// Stopped early: the time budget ran out while batches were still full.
    pub budget_exhausted: bool,
    /// A phase stopped at `EXPIRATION_MAX_BATCHES_PER_CYCLE` with its last
    /// batch full: more of its rows may be due (after the sweep's position).
    pub batch_cap_reached: bool,
    /// How far the local clock ran ahead of the database clock when that
    /// was more than `EXPIRATION_MAX_CLOCK_SKEW` (`as_of` was clamped).
    pub clamped_ahead_by: Option<chrono::Duration>,
}

/// Why a cycle ended without completing. Batches committed before the
/// error stay committed; the failed batch rolled back whole.
#[derive(Debug, thiserror::Error)]
pub enum CycleError {
    #[error("database error in the {phase} phase")]
    Database {
        phase: Phase,
        #[source]
        source: DbError,
    },
    #[error("cannot get a database connection")]
    Connection(#[source] DbError),
    #[error("stopped by shutdown")]
    Cancelled,
}

/// What one committed batch did.
#[derive(Debug, Default)]
struct BatchResult {
    selected: usize,
    /// The last row it took, where the sweep goes on from.
    last: Option<Position>,
    expired: Vec<BookingExpired>,
    refused: Vec<(Uuid, ExpireError)>,
    conflicts: Vec<Uuid>,
    skipped_locked: u64,
    /// The outbox rows written leased to this process's publisher, and
    /// since when (see [`Handoff`]).
    handed: Vec<LeasedRow>,
    leased_at: Option<tokio::time::Instant>,
}

/// Per-phase progress within a cycle.
#[derive(Debug, Default, Clone, Copy)]
struct PhaseProgress {
    finished: bool,
    batches: u32,
}

/// The expiry worker: owns the pool handle, the clock, the settings.
pub struct ExpiryWorker {
    pool: PgPool,
    clock: Arc<dyn Clock>,
    settings: ExpirySettings,
    /// The topic and `ce_source` of the events it writes to the outbox.
    events: EventSettings,
    /// How long a batch in flight may still take after a stop request.
    shutdown_grace: Duration,
    metrics: Arc<Metrics>,
    subscribers: Vec<Arc<dyn DomainEventSubscriber>>,
    /// This process's publisher, when it runs one.
    handoff: Option<Handoff>,
}

impl std::fmt::Debug for ExpiryWorker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ExpiryWorker")
            .field("clock", &self.clock)
            .field("settings", &self.settings)
            .field("events", &self.events)
            .field("shutdown_grace", &self.shutdown_grace)
            .field("subscribers", &self.subscribers.len())
            .field("handoff", &self.handoff.is_some())
            .finish_non_exhaustive()
    }
}

impl ExpiryWorker {
    /// A worker on `context`'s pool, clock and metrics.
    pub fn new(
        context: &TaskContext,
        settings: ExpirySettings,
        events: EventSettings,
        shutdown: ShutdownSettings,
    ) -> Self {
        Self {
            pool: context.pool.clone(),
            clock: Arc::clone(&context.clock),
            settings,
            events,
            shutdown_grace: shutdown.grace,
            metrics: Arc::clone(&context.metrics),
            subscribers: Vec::new(),
            handoff: None,
        }
    }

    /// Writes the outbox rows leased to this process's publisher and hands
    /// them to it after each commit ([`Handoff`]).
    pub fn hand_off(mut self, handoff: Handoff) -> Self {
        self.handoff = Some(handoff);
        self
    }

    /// Adds an in-process subscriber of committed `BookingExpired` events.
    pub fn subscribe(mut self, subscriber: Arc<dyn DomainEventSubscriber>) -> Self {
        self.subscribers.push(subscriber);
        self
    }

    pub fn settings(&self) -> &ExpirySettings {
        &self.settings
    }

    /// One cycle with `as_of` from the clock (bounded by the database
    /// clock, see [`Self::checked_now`]) and a fresh run id, sweeping from
    /// the oldest deadline (`once`). A clamped `as_of` is logged.
    pub async fn run_cycle(
        &self,
        shutdown: &CancellationToken,
    ) -> Result<CycleOutcome, CycleError> {
        let outcome = self
            .run_cycle_resuming(&mut Sweep::default(), shutdown)
            .await?;
        if let Some(ahead) = outcome.clamped_ahead_by {
            tracing::warn!(
                skew_ms = ahead.num_milliseconds(),
                "local clock ahead of the database clock by more than \
                 EXPIRATION_MAX_CLOCK_SKEW; as_of clamped"
            );
        }
        Ok(outcome)
    }

    /// One cycle as [`Self::run_cycle`] that goes on with `sweep` (the
    /// scheduler's, carried from cycle to cycle) and leaves saying a clamped
    /// `as_of` to the caller, which says it once a minute.
    pub async fn run_cycle_resuming(
        &self,
        sweep: &mut Sweep,
        shutdown: &CancellationToken,
    ) -> Result<CycleOutcome, CycleError> {
        let as_of = self.checked_now().await?;
        let mut outcome = self
            .run_cycle_at_resuming(as_of.at, RunId::generate(), sweep, shutdown)
            .await?;
        outcome.clamped_ahead_by = as_of.clamped_ahead_by;
        Ok(outcome)
    }

    /// The clock's now, never more than `max_clock_skew` ahead of the
    /// database clock: instances with differing clocks share one reference,
    /// so a fast clock can never expire a booking early. A slow clock only
    /// delays expiry; both directions are exported as the skew gauge, and a
    /// clamp as the out-of-skew gauge.
    pub async fn checked_now(&self) -> Result<AsOf, CycleError> {
        let local = self.clock.now();
        let Some(max_skew) = self.settings.max_clock_skew else {
            return Ok(AsOf {
                at: local,
                clamped_ahead_by: None,
            });
        };
        let mut conn = self
            .pool
            .get()
            .await
            .map_err(|e| CycleError::Connection(e.into()))?;
        // Every unit of work is a transaction (see `db`), a read too.
        let database = conn
            .transaction(async |conn| bookings::database_now(conn).await)
            .await
            .map_err(CycleError::Connection)?;
        let skew = local - database;
        self.metrics
            .clock_skew_seconds
            .set(skew.num_milliseconds() as f64 / 1000.0);
        let as_of = skew::bounded(local, database, max_skew);
        self.metrics
            .clock_skew_exceeded
            .set(i64::from(as_of.clamped_ahead_by.is_some()));
        Ok(as_of)
    }

    /// One cycle at a given `as_of`, sweeping from the oldest deadline.
    pub async fn run_cycle_at(
        &self,
        as_of: DateTime<Utc>,
        run_id: RunId,
        shutdown: &CancellationToken,
    ) -> Result<CycleOutcome, CycleError> {
        self.run_cycle_at_resuming(as_of, run_id, &mut Sweep::default(), shutdown)
            .await
    }

    /// One cycle at a given `as_of` that goes on with `sweep`, and moves it
    /// on with every batch it commits (also when a later batch fails).
    pub async fn run_cycle_at_resuming(
        &self,
        as_of: DateTime<Utc>,
        run_id: RunId,
        sweep: &mut Sweep,
        shutdown: &CancellationToken,
    ) -> Result<CycleOutcome, CycleError> {
        // PostgreSQL keeps microseconds: the event's expired_at must equal the row's.
        let as_of = as_of.trunc_subsecs(6);
        let span = tracing::info_span!(
            "expiry_cycle",
            run_id = %run_id,
            correlation_id = %run_id,
            tenant_count = tracing::field::Empty,
        );
        self.cycle(as_of, run_id, sweep, shutdown)
            .instrument(span)
            .await
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
        let mut outcome = CycleOutcome {
            run_id,
            as_of,
            report: CycleReport::default(),
            poison_count: 0,
            version_conflicts: 0,
            batches: 0,
            budget_exhausted: false,
            batch_cap_reached: false,
            clamped_ahead_by: None,
        };
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
                let after = sweep.after(phase);
                let mut batch = self
                    .batch_with_grace(&mut conn, phase, as_of, run_id, after, shutdown)
                    .await?;
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

    /// Runs one batch. On shutdown the batch gets `shutdown_grace` to
    /// commit; after that it is dropped, which discards the connection
    /// mid-transaction so the server rolls the batch back whole.
    async fn batch_with_grace(
        &self,
        conn: &mut AsyncPgConnection,
        phase: Phase,
        as_of: DateTime<Utc>,
        run_id: RunId,
        after: Option<Position>,
        shutdown: &CancellationToken,
    ) -> Result<BatchResult, CycleError> {
        let grace = self.shutdown_grace;
        let deadline = async {
            shutdown.cancelled().await;
            tokio::time::sleep(grace).await;
        };
        tokio::select! {
            biased;
            result = self.run_batch(conn, phase, as_of, run_id, after) => {
                result.map_err(|source| CycleError::Database { phase, source })
            }
            _ = deadline => {
                tracing::warn!(%phase, "batch did not finish within the shutdown grace; rolled back");
                Err(CycleError::Cancelled)
            }
        }
    }

    async fn run_batch(
        &self,
        conn: &mut AsyncPgConnection,
        phase: Phase,
        as_of: DateTime<Utc>,
        run_id: RunId,
        after: Option<Position>,
    ) -> Result<BatchResult, DbError> {
        let settings = &self.settings;
        let span = tracing::info_span!(
            "expiry_batch",
            %phase,
            run_id = %run_id,
            correlation_id = %run_id,
            selected = tracing::field::Empty,
            tenant_count = tracing::field::Empty,
        );
        // Every outbox row of the batch names this span in `traceparent`.
        let trace = trace::headers_of(&span);
        conn.transaction(async |conn| {
            let rows = bookings::lock_due(conn, phase, as_of, after, settings.batch_size).await?;
            // An empty batch says nothing an operator needs: with several
            // instances woken at the same deadline, most batches are empty.
            if rows.is_empty() {
                tracing::debug!(%phase, count = 0, "batch selected");
            } else {
                tracing::info!(%phase, count = rows.len(), "batch selected");
            }
            let current = tracing::Span::current();
            current.record("selected", rows.len());
            let tenants: HashSet<Uuid> = rows.iter().map(|r| r.tenant_id).collect();
            current.record("tenant_count", tenants.len());
            let mut result = BatchResult {
                selected: rows.len(),
                last: rows.last().and_then(|row| row.position(phase)),
                ..BatchResult::default()
            };
            let mut writes = Vec::with_capacity(rows.len());
            for row in &rows {
                // The lock query selects only rows whose status is one of the
                // phase's active statuses, written into it as literals from
                // the domain, so every status here parses: an unknown status
                // cannot reach this point, and there is no path for one. If
                // the query and the domain ever disagreed, the batch would
                // fail and roll back, not skip the row quietly.
                let booking = row.to_domain()?;
                match booking.expire(as_of) {
                    Ok(expiry) => writes.push(ExpiryWrite {
                        read_version: row.version,
                        message: events::outbox_message(
                            &expiry.event,
                            run_id,
                            &self.events.ce_source,
                            &trace,
                        ),
                        expiry,
                    }),
                    Err(error) => result.refused.push((row.id, error)),
                }
            }
            let lease = self
                .handoff
                .as_ref()
                .map(|handoff| (handoff.lease, handoff.owner));
            result.leased_at = lease.map(|_| tokio::time::Instant::now());
            let written_at = self.clock.now();
            let updated = bookings::persist_expiries(
                conn,
                as_of,
                written_at,
                run_id,
                &self.events,
                &writes,
                lease,
            )
            .await?;
            let updated: HashMap<Uuid, i64> = updated.into_iter().collect();
            for write in writes {
                let id = write.expiry.event.booking_id.as_uuid();
                match updated.get(&id) {
                    Some(&outbox_id) => {
                        if lease.is_some() {
                            result.handed.push(LeasedRow::written(
                                outbox_id,
                                self.events.topic.clone(),
                                written_at,
                                write.message,
                            ));
                        }
                        result.expired.push(write.expiry.event);
                    }
                    None => result.conflicts.push(id),
                }
            }
            // A short batch means every due row after the sweep's position
            // that we could lock is in it, so the due rows there still
            // outside it are held by someone else.
            if rows.len() < settings.batch_size as usize {
                let seen: Vec<Uuid> = rows.iter().map(|r| r.id).collect();
                let others =
                    bookings::count_due_excluding(conn, phase, as_of, after, &seen).await?;
                result.skipped_locked = u64::try_from(others).unwrap_or(0);
            }
            Ok(result)
        })
        .instrument(span)
        .await
    }

    /// Logs, counts and dispatches a committed batch, and hands its outbox
    /// rows to the publisher.
    fn after_commit(&self, phase: Phase, batch: &mut BatchResult, outcome: &mut CycleOutcome) {
        if let (Some(handoff), Some(leased_at)) = (&self.handoff, batch.leased_at) {
            let rows = std::mem::take(&mut batch.handed);
            let count = rows.len() as u64;
            if !handoff.hand(rows, leased_at) {
                // They wait for their lease to end, then any instance
                // claims them.
                self.metrics.outbox_handoff_missed.inc_by(count);
            }
        }
        for (booking_id, error) in &batch.refused {
            tracing::error!(%booking_id, %phase, %error, "item failed: booking refused by the domain, left for the next cycle");
        }
        for booking_id in &batch.conflicts {
            tracing::warn!(%booking_id, %phase, "booking changed since it was read; left as it is");
        }
        let refused = batch.refused.len() as u64;
        outcome.poison_count += refused;
        outcome.version_conflicts += batch.conflicts.len() as u64;
        outcome.report.skipped_locked_count += batch.skipped_locked;
        let expired = batch.expired.len() as u64;
        match phase {
            Phase::Reserve => outcome.report.reserve_expired_count += expired,
            Phase::Booking => outcome.report.booking_expired_count += expired,
        }
        self.metrics.errors.inc_by(refused);
        self.metrics.skip_locked.inc_by(batch.skipped_locked);
        self.metrics
            .items
            .get_or_create(&phase.into())
            .inc_by(expired);
        let lateness = self.metrics.lateness_seconds.get_or_create(&phase.into());
        for event in &batch.expired {
            let late = (event.expired_at - event.deadline).num_microseconds();
            lateness.observe(late.unwrap_or(i64::MAX) as f64 / 1e6);
        }
        for event in &batch.expired {
            tracing::info!(
                booking_id = %event.booking_id,
                deal_id = %event.deal_id,
                phase = %event.phase,
                tenant_id = %event.tenant_id,
                "booking expired"
            );
        }
        if !batch.expired.is_empty() {
            for subscriber in &self.subscribers {
                subscriber.on_booking_expired(&batch.expired);
            }
        }
    }

    /// Due bookings not yet expired at `now` (the backlog gauge).
    pub async fn measure_backlog(&self) -> Result<i64, DbError> {
        let now = self.clock.now();
        let mut conn = self.pool.get().await?;
        let total = conn
            .transaction(async |conn| {
                let mut total = 0;
                for phase in Phase::ALL {
                    total += bookings::count_due(conn, phase, now).await?;
                }
                Ok::<_, DbError>(total)
            })
            .await?;
        self.metrics.backlog.set(total);
        Ok(total)
    }

    /// The schedule's settings.
    pub fn wake_policy(&self) -> WakePolicy {
        WakePolicy {
            interval: self.settings.interval,
            deadline_wake: self.settings.deadline_wake,
            min_gap: self.settings.min_gap,
            probe_interval: super::wake::PROBE_INTERVAL,
        }
    }

    /// The earliest deadline among active bookings that was not yet due at
    /// `as_of` (one cheap probe on each partial index).
    pub async fn next_deadline(
        &self,
        as_of: DateTime<Utc>,
    ) -> Result<Option<DateTime<Utc>>, DbError> {
        let mut conn = self.pool.get().await?;
        conn.transaction(async |conn| bookings::next_deadline(conn, as_of).await)
            .await
    }
}
