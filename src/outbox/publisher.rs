//! The publisher loop. One batch = one transaction: claim unpublished rows
//! with SKIP LOCKED, produce them, mark the acknowledged ones published and
//! park the ones the broker refused for good, commit. The row locks keep
//! other publishers off these rows while the produce runs; a crash before
//! the commit leaves them unpublished, so they are sent again with the same
//! `ce_id` (at-least-once, never lost). Rows a failed partition did not get
//! acknowledged stay unpublished and the error is returned after the
//! commit, so a retry sends only them: at once when other partitions were
//! acknowledged (one partition's leader moving does not pause the rest),
//! after a short pause when the broker answered with an error, after a
//! growing backoff when it could not be reached.

use std::{
    collections::BTreeMap,
    sync::{Arc, Mutex, MutexGuard},
    time::{Duration, Instant},
};

use diesel_async::AsyncConnection;
use futures_util::future::join_all;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use super::{
    Backoff, KafkaError, KafkaSink,
    held::HeldBack,
    sink::{Delivery, OutgoingRecord, Refusal, Sink, SinkError},
};
use crate::{
    clock::Clock,
    config::PublisherSettings,
    context::TaskContext,
    db::{DbError, PgPool, outbox},
    telemetry::{ErrorChain, Health, Metrics},
};

/// How long [`Publisher::run`] drains before it starts over (resetting the
/// backoff and looking at shutdown between batches is per batch anyway).
const DRAIN_BUDGET: Duration = Duration::from_secs(5);
/// How often the broker is asked about the topic (readiness).
pub const BROKER_CHECK_INTERVAL: Duration = Duration::from_secs(30);
/// How often the broker is checked while it is unready.
pub const BROKER_RECHECK_INTERVAL: Duration = Duration::from_secs(2);

/// The longest pause after a batch the broker answered with an error (too
/// few in-sync replicas, a leader moving): it is reachable, so publishing
/// resumes within about this long of the cluster being writable again.
/// Failures to reach it at all back off up to [`UNREACHABLE_BACKOFF_MAX`].
pub const BROKER_ERROR_PAUSE_MAX: Duration = Duration::from_millis(500);
/// The longest pause while the broker cannot be reached.
pub const UNREACHABLE_BACKOFF_MAX: Duration = Duration::from_secs(30);

/// How long the rows a partly acknowledged batch left pending are kept out
/// of the next batches (see [`HeldBack`]): the pause between two tries of a
/// failing partition's backlog (its new rows are tried with every batch).
pub const HOLD: Duration = Duration::from_millis(500);
/// At most this many batches' worth of rows are held at once.
const HELD_BATCHES: usize = 4;

/// The park reason's code for a row that cannot be turned into a record.
pub const CORRUPT_ROW: &str = "CORRUPT_ROW";

/// Errors of one publishing round.
#[derive(Debug, thiserror::Error)]
pub enum PublishError {
    #[error(transparent)]
    Sink(#[from] SinkError),
    #[error(transparent)]
    Database(#[from] DbError),
    #[error("publishing task ended: {0}")]
    Lane(String),
}

impl From<diesel::result::Error> for PublishError {
    fn from(error: diesel::result::Error) -> Self {
        PublishError::Database(error.into())
    }
}

/// What [`Publisher::drain`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Drained {
    pub published: usize,
    /// The last batch was full: more rows may be waiting.
    pub more: bool,
}

/// What one batch did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Batch {
    published: usize,
    parked: usize,
    /// Rows claimed: a full claim means more rows may be waiting.
    claimed: usize,
    /// Some rows were not acknowledged while others were: they wait in the
    /// outbox for the next batch, which goes at once.
    partial: bool,
}

impl Batch {
    /// Another batch should follow at once.
    fn more(&self, full: usize) -> bool {
        self.claimed >= full || self.partial
    }
}

/// The outbox publisher. Clones share the pool, the sinks and the metrics.
pub struct Publisher<S = KafkaSink> {
    pool: PgPool,
    /// One per batch in flight (`concurrency`).
    sinks: Arc<[S]>,
    /// The readiness check's own sink, so a check never waits behind a
    /// produce on a lane's connection.
    checker: Arc<S>,
    clock: Arc<dyn Clock>,
    settings: PublisherSettings,
    metrics: Arc<Metrics>,
    health: Arc<Health>,
    /// The topic checked for readiness.
    topic: String,
    /// Rows kept out of the next batches for a moment (shared by lanes).
    held: Arc<Mutex<HeldBack>>,
}

impl<S> std::fmt::Debug for Publisher<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Publisher")
            .field("settings", &self.settings)
            .field("topic", &self.topic)
            .field("lanes", &self.sinks.len())
            .finish_non_exhaustive()
    }
}

impl<S> Clone for Publisher<S> {
    fn clone(&self) -> Self {
        Self {
            pool: self.pool.clone(),
            sinks: Arc::clone(&self.sinks),
            checker: Arc::clone(&self.checker),
            clock: Arc::clone(&self.clock),
            settings: self.settings.clone(),
            metrics: Arc::clone(&self.metrics),
            health: Arc::clone(&self.health),
            topic: self.topic.clone(),
            held: Arc::clone(&self.held),
        }
    }
}

impl<S: Sink> Publisher<S> {
    /// A publisher on `context`'s pool, clock, metrics and health, sending
    /// through `sink` (and its siblings, one per lane).
    pub fn new(context: &TaskContext, sink: S, settings: PublisherSettings, topic: String) -> Self {
        let checker = Arc::new(sink.sibling());
        let siblings: Vec<S> = (1..settings.concurrency.max(1))
            .map(|_| sink.sibling())
            .collect();
        let sinks: Vec<S> = std::iter::once(sink).chain(siblings).collect();
        let held = HeldBack::new(HELD_BATCHES * settings.batch_size as usize);
        Self {
            held: Arc::new(Mutex::new(held)),
            pool: context.pool.clone(),
            sinks: sinks.into(),
            checker,
            clock: Arc::clone(&context.clock),
            settings,
            metrics: Arc::clone(&context.metrics),
            health: Arc::clone(&context.health),
            topic,
        }
    }

    /// Publishes one batch; returns how many rows it published.
    pub async fn publish_batch(&self) -> Result<usize, PublishError> {
        match self.publish_batch_with(&self.sinks[0]).await? {
            (_, Some(error)) => Err(error.into()),
            (batch, None) => Ok(batch.published),
        }
    }

    /// One batch of a drain: a batch that got some rows acknowledged made
    /// progress even when a partition failed, so its failure is counted
    /// and logged and the next batch goes at once (the sink paces a
    /// failing partition's retries); a batch that got nothing acknowledged
    /// fails the drain, and the run loop pauses.
    async fn drain_batch(&self, sink: &S) -> Result<Batch, PublishError> {
        match self.publish_batch_with(sink).await? {
            (batch, None) => Ok(batch),
            (batch, Some(error)) if batch.published > 0 => {
                self.metrics.outbox_publish_errors.inc();
                tracing::warn!(
                    error = %ErrorChain(&error),
                    published = batch.published,
                    "outbox batch partly published; the rest goes with the next batch"
                );
                Ok(Batch {
                    partial: true,
                    ..batch
                })
            }
            (_, Some(error)) => Err(error.into()),
        }
    }

    /// Claims a batch, produces it through `sink`, and in the same
    /// transaction marks the rows the broker acknowledged published (or
    /// deletes them at retention 0) and parks the rows it refused for good.
    /// When some rows were not acknowledged (a partition failed), what was
    /// acknowledged is still committed and the error is returned beside
    /// the batch: those rows are never produced again, the others stay.
    async fn publish_batch_with(
        &self,
        sink: &S,
    ) -> Result<(Batch, Option<SinkError>), PublishError> {
        let mut conn = self.pool.get().await.map_err(DbError::from)?;
        let limit = self.settings.batch_size;
        let delete = self.settings.retention.is_zero();
        let (batch, created_at, error, pending) = conn
            .transaction(async |conn| {
                // Held rows are claimed too (so the batch still gets up to
                // `limit` others) but not sent; they stay as they are.
                let held_now = self.held().release(Instant::now());
                let extra = u32::try_from(held_now).unwrap_or(u32::MAX);
                let claimed_rows =
                    outbox::claim_unpublished(conn, limit.saturating_add(extra)).await?;
                let any_claimed = !claimed_rows.is_empty();
                let rows: Vec<_> = {
                    let (held, now) = (self.held(), Instant::now());
                    claimed_rows
                        .into_iter()
                        .filter(|row| !held.holds(row.id, now))
                        .take(limit as usize)
                        .collect()
                };
                if rows.is_empty() {
                    if !any_claimed {
                        // Nothing was sent: says nothing about the broker,
                        // but nothing waits either, so a past produce
                        // failure no longer holds readiness back (the check
                        // decides).
                        self.health.record_nothing_waiting();
                    }
                    return Ok::<_, PublishError>((Batch::default(), Vec::new(), None, Vec::new()));
                }
                let claimed = rows.len();
                let ids: Vec<i64> = rows.iter().map(|r| r.id).collect();
                let created: Vec<_> = rows.iter().map(|r| r.created_at).collect();
                let mut by_topic: BTreeMap<String, (Vec<usize>, Vec<OutgoingRecord>)> =
                    BTreeMap::new();
                // The broker rejects timestamps far from its own clock, so the
                // record carries the publish time; the event time is `ce_time`.
                let produced_at = self.clock.now();
                let mut deliveries = vec![Delivery::Pending; claimed];
                for (index, row) in rows.into_iter().enumerate() {
                    // A row that cannot become a record is parked, not sent.
                    if let Some(defect) = row.defect() {
                        deliveries[index] = Delivery::Refused(Refusal {
                            code: CORRUPT_ROW.to_owned(),
                            message: defect,
                        });
                        continue;
                    }
                    let headers = row.header_pairs().into_iter().collect();
                    let (indexes, records) = by_topic.entry(row.topic).or_default();
                    indexes.push(index);
                    records.push(OutgoingRecord {
                        key: row.message_key,
                        value: row.payload,
                        headers,
                        timestamp: produced_at,
                    });
                }
                let started = Instant::now();
                let mut error = None;
                for (topic, (indexes, records)) in by_topic {
                    let produced = sink.produce(&topic, records).await;
                    for code in &produced.error_codes {
                        self.metrics.produce_error(code);
                    }
                    for (index, delivery) in indexes.into_iter().zip(produced.deliveries) {
                        deliveries[index] = delivery;
                    }
                    if error.is_none() {
                        error = produced.error;
                    }
                }
                // Any answer at all is a real exchange with the broker; a
                // failure on any partition is not ready.
                self.health.record_produce(error.is_none());
                self.metrics
                    .outbox_produce_duration_seconds
                    .observe(started.elapsed().as_secs_f64());
                let mut acked = Vec::with_capacity(claimed);
                let mut acked_created = Vec::with_capacity(claimed);
                let mut pending = Vec::new();
                let mut parked = 0;
                let now = self.clock.now();
                for (index, delivery) in deliveries.into_iter().enumerate() {
                    match delivery {
                        Delivery::Acked => {
                            acked.push(ids[index]);
                            acked_created.push(created[index]);
                        }
                        Delivery::Refused(refusal) => {
                            outbox::park(conn, ids[index], &refusal.to_string(), now).await?;
                            parked += 1;
                        }
                        Delivery::Pending => pending.push(ids[index]),
                    }
                }
                if !acked.is_empty() {
                    if delete {
                        outbox::delete_rows(conn, &acked).await?;
                    } else {
                        outbox::mark_published(conn, &acked, now).await?;
                    }
                }
                let batch = Batch {
                    published: acked.len(),
                    parked,
                    claimed,
                    partial: false,
                };
                Ok((batch, acked_created, error, pending))
            })
            .await?;
        // A partition failed while others were acknowledged: its rows wait
        // out the hold, so the next batches carry the others' new rows.
        if error.is_some() && batch.published > 0 && !pending.is_empty() {
            let held = self.held().hold(pending, Instant::now() + HOLD);
            tracing::debug!(held, "rows of failing partitions held back");
        }
        if batch.published > 0 {
            let acked_at = self.clock.now();
            for created_at in created_at {
                let lag = (acked_at - created_at).num_microseconds().unwrap_or(0) as f64 / 1e6;
                self.metrics
                    .outbox_commit_to_ack_seconds
                    .observe(lag.max(0.0));
            }
            self.metrics.outbox_published.inc_by(batch.published as u64);
            tracing::debug!(published = batch.published, "outbox batch published");
        }
        if batch.parked > 0 {
            tracing::warn!(
                parked = batch.parked,
                "outbox rows parked: the broker refused them for good (see `status`, then `outbox retry`)"
            );
        }
        Ok((batch, error))
    }

    fn held(&self) -> MutexGuard<'_, HeldBack> {
        // The holds are plain data: a panic elsewhere leaves them usable.
        self.held
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// How long to wait for more rows: the poll interval, or less when a
    /// hold ends before it (those rows are then due).
    fn idle_wait(&self) -> Duration {
        let next = self.held().next_release(Instant::now());
        next.map_or(self.settings.poll_interval, |release| {
            release.min(self.settings.poll_interval)
        })
    }

    /// Asks the broker about the topic and records the answer as broker
    /// readiness (`/readyz`).
    pub async fn check_broker(&self) -> Result<usize, SinkError> {
        let result = self.checker.check_topic(&self.topic).await;
        self.health.set_broker_reachable(result.is_ok());
        result
    }

    /// [`Self::check_broker`] at once and then every
    /// [`BROKER_CHECK_INTERVAL`] until `shutdown`; every
    /// [`BROKER_RECHECK_INTERVAL`] while the broker is unready, so `/readyz`
    /// turns ready soon after the broker is back even when the outbox is
    /// empty and no produce would tell.
    pub async fn run_broker_check(&self, shutdown: CancellationToken) {
        loop {
            if let Err(error) = self.check_broker().await {
                tracing::warn!(error = %ErrorChain(&error), "Kafka check failed");
            }
            let wait = if self.health.broker_ready() {
                BROKER_CHECK_INTERVAL
            } else {
                BROKER_RECHECK_INTERVAL
            };
            tokio::select! {
                biased;
                _ = shutdown.cancelled() => return,
                _ = tokio::time::sleep(wait) => {}
            }
        }
    }

    /// Publishes until the backlog is drained (a batch comes back short),
    /// `shutdown` is requested, or `budget` has passed. A full first batch
    /// brings in `concurrency` batches in flight (a task and a Kafka
    /// connection each: the broker serves one request per connection at a
    /// time), so one batch's database work overlaps another's Kafka round
    /// trip. SKIP LOCKED keeps their rows disjoint, and with one event per
    /// booking no key is in two batches.
    /// Every batch in flight finishes; the first error is returned after.
    pub async fn drain(
        &self,
        shutdown: &CancellationToken,
        budget: Duration,
    ) -> Result<Drained, PublishError> {
        let started = Instant::now();
        let full = self.settings.batch_size as usize;
        let first = self.drain_batch(&self.sinks[0]).await?;
        if !first.more(full) {
            return Ok(Drained {
                published: first.published,
                more: false,
            });
        }
        // One task per lane, so their client-side work runs on separate
        // runtime threads as well.
        let lanes: Vec<_> = (0..self.sinks.len())
            .map(|lane| {
                let publisher = self.clone();
                let shutdown = shutdown.clone();
                tokio::spawn(
                    async move { publisher.drain_lane(lane, &shutdown, started, budget).await },
                )
            })
            .collect();
        let mut drained = Drained {
            published: first.published,
            more: false,
        };
        let mut first_error = None;
        for lane in join_all(lanes).await {
            match lane {
                Ok(Ok(lane)) => {
                    drained.published += lane.published;
                    drained.more |= lane.more;
                }
                Ok(Err(error)) => {
                    first_error.get_or_insert(error);
                }
                Err(join) if join.is_panic() => std::panic::resume_unwind(join.into_panic()),
                Err(join) => {
                    first_error.get_or_insert(PublishError::Lane(join.to_string()));
                }
            }
        }
        first_error.map_or(Ok(drained), Err)
    }

    /// One lane of [`Self::drain`]: full batches through its own sink.
    async fn drain_lane(
        &self,
        lane: usize,
        shutdown: &CancellationToken,
        started: Instant,
        budget: Duration,
    ) -> Result<Drained, PublishError> {
        let full = self.settings.batch_size as usize;
        let mut published = 0;
        while !shutdown.is_cancelled() && started.elapsed() < budget {
            let batch = self.drain_batch(&self.sinks[lane]).await?;
            published += batch.published;
            if !batch.more(full) {
                return Ok(Drained {
                    published,
                    more: false,
                });
            }
        }
        Ok(Drained {
            published,
            more: true,
        })
    }

    /// Publishes until `shutdown`: [`Self::drain`] while batches come back
    /// full, then on each commit notification or poll tick; after a failure
    /// only when the backoff ends. A batch in flight at shutdown finishes
    /// (it is bounded by the Kafka request timeout). Stats, retention and
    /// the broker check are separate tasks (see `app::run`).
    pub async fn run(&self, wake: Arc<Notify>, shutdown: CancellationToken) {
        let mut backoff = Backoff::new(Duration::from_millis(100), UNREACHABLE_BACKOFF_MAX);
        while !shutdown.is_cancelled() {
            let (wait, wake_on_commit) = match self.drain(&shutdown, DRAIN_BUDGET).await {
                Ok(drained) if drained.more => {
                    backoff.reset();
                    continue;
                }
                Ok(_) => {
                    backoff.reset();
                    (self.idle_wait(), true)
                }
                Err(error) => {
                    self.metrics.outbox_publish_errors.inc();
                    let delay = backoff.next_delay();
                    let delay = match &error {
                        PublishError::Sink(sink)
                            if sink.as_kafka().is_some_and(KafkaError::answered_by_broker) =>
                        {
                            delay.min(BROKER_ERROR_PAUSE_MAX)
                        }
                        _ => delay,
                    };
                    tracing::error!(error = %ErrorChain(&error), retry_in_ms = delay.as_millis() as u64, "outbox publish failed; rows stay in the outbox");
                    // Only the backoff (not a commit notification) ends this
                    // wait, so an outage is not hammered at commit rate.
                    (delay, false)
                }
            };
            tokio::select! {
                _ = shutdown.cancelled() => break,
                _ = wake.notified(), if wake_on_commit => {}
                _ = tokio::time::sleep(wait) => {}
            }
        }
        tracing::info!("outbox publisher stopped");
    }
}
