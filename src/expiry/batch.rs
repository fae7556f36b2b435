//! One batch of a cycle, for one phase: lock the due rows after the
//! sweep's position, transition them, write their audit and outbox rows
//! in one statement, commit; then log, count, hand the outbox rows to the
//! publisher and tell the subscribers ([`BatchResult`]).

use std::collections::{HashMap, HashSet};

use chrono::{DateTime, Utc};
use diesel_async::{AsyncConnection, AsyncPgConnection};
use tokio_util::sync::CancellationToken;
use tracing::Instrument;
use uuid::Uuid;

use super::{
    outcome::{CycleError, CycleOutcome},
    worker::ExpiryWorker,
};
use crate::{
    db::{
        DbError,
        bookings::{self, ExpiryWrite, Position},
    },
    domain::{BookingExpired, ExpireError, Phase, RunId},
    events,
    handoff::LeasedRow,
    telemetry::trace,
};

/// The target of a batch's log lines and span: the cycle's module, where
/// batches ran before they had a room of their own, so `RUST_LOG`
/// directives and log queries that name it see the same lines as before.
const LOG_TARGET: &str = "booking_expiration::expiry::cycle";

/// What one committed batch did.
#[derive(Debug, Default)]
pub(super) struct BatchResult {
    pub selected: usize,
    /// The last row it took, where the sweep goes on from.
    pub last: Option<Position>,
    pub expired: Vec<BookingExpired>,
    refused: Vec<(Uuid, ExpireError)>,
    conflicts: Vec<Uuid>,
    skipped_locked: u64,
    /// The outbox rows written leased to this process's publisher, and
    /// since when (see [`crate::handoff::Handoff`]).
    handed: Vec<LeasedRow>,
    leased_at: Option<tokio::time::Instant>,
}

/// Where a batch is taken: its phase, the cycle's `as_of` and run id, and
/// the sweep's position in the phase.
#[derive(Debug, Clone, Copy)]
pub(super) struct BatchAt {
    pub phase: Phase,
    pub as_of: DateTime<Utc>,
    pub run_id: RunId,
    pub after: Option<Position>,
}

impl ExpiryWorker {
    /// Runs one batch. On shutdown the batch gets `shutdown_grace` to
    /// commit; after that it is dropped, which discards the connection
    /// mid-transaction so the server rolls the batch back whole.
    pub(super) async fn batch_with_grace(
        &self,
        conn: &mut AsyncPgConnection,
        at: BatchAt,
        shutdown: &CancellationToken,
    ) -> Result<BatchResult, CycleError> {
        let phase = at.phase;
        let grace = self.shutdown_grace;
        let deadline = async {
            shutdown.cancelled().await;
            tokio::time::sleep(grace).await;
        };
        tokio::select! {
            biased;
            result = self.run_batch(conn, at) => {
                result.map_err(|source| CycleError::Database { phase, source })
            }
            _ = deadline => {
                tracing::warn!(target: LOG_TARGET, %phase, "batch did not finish within the shutdown grace; rolled back");
                Err(CycleError::Cancelled)
            }
        }
    }

    async fn run_batch(
        &self,
        conn: &mut AsyncPgConnection,
        BatchAt {
            phase,
            as_of,
            run_id,
            after,
        }: BatchAt,
    ) -> Result<BatchResult, DbError> {
        let settings = &self.settings;
        let span = tracing::info_span!(
            target: LOG_TARGET,
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
                tracing::debug!(target: LOG_TARGET, %phase, count = 0, "batch selected");
            } else {
                tracing::info!(target: LOG_TARGET, %phase, count = rows.len(), "batch selected");
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
    pub(super) fn after_commit(
        &self,
        phase: Phase,
        batch: &mut BatchResult,
        outcome: &mut CycleOutcome,
    ) {
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
            tracing::error!(target: LOG_TARGET, %booking_id, %phase, %error, "item failed: booking refused by the domain, left for the next cycle");
        }
        for booking_id in &batch.conflicts {
            tracing::warn!(target: LOG_TARGET, %booking_id, %phase, "booking changed since it was read; left as it is");
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
            tracing::info!(target: LOG_TARGET,
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
}
