//! The expiry worker: what it owns (the pool, the clock, the settings, the
//! handoff to this process's publisher, the subscribers), how it is built,
//! and the reads the scheduler makes between cycles (the checked clock, the
//! backlog, the next deadline). The cycle itself is `cycle` and `batch`.

use std::{sync::Arc, time::Duration};

use chrono::{DateTime, Utc};
use diesel_async::AsyncConnection;

use super::{
    outcome::CycleError,
    skew::{self, AsOf},
    wake::{PROBE_INTERVAL, WakePolicy},
};
use crate::{
    clock::Clock,
    config::{EventSettings, ExpirySettings, ShutdownSettings},
    context::TaskContext,
    db::{DbError, PgPool, bookings},
    domain::{DomainEventSubscriber, Phase},
    handoff::Handoff,
    telemetry::Metrics,
};

/// The expiry worker: owns the pool handle, the clock, the settings.
pub struct ExpiryWorker {
    pub(super) pool: PgPool,
    pub(super) clock: Arc<dyn Clock>,
    pub(super) settings: ExpirySettings,
    /// The topic and `ce_source` of the events it writes to the outbox.
    pub(super) events: EventSettings,
    /// How long a batch in flight may still take after a stop request.
    pub(super) shutdown_grace: Duration,
    pub(super) metrics: Arc<Metrics>,
    pub(super) subscribers: Vec<Arc<dyn DomainEventSubscriber>>,
    /// This process's publisher, when it runs one.
    pub(super) handoff: Option<Handoff>,
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
            probe_interval: PROBE_INTERVAL,
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
