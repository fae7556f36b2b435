//! The publisher loop. One batch = one transaction: claim unpublished rows
//! with SKIP LOCKED, produce them, mark them published, commit. The row
//! locks keep other publishers off these rows while the produce runs; a
//! crash before the commit leaves them unpublished, so they are sent again
//! with the same `ce_id` (at-least-once, never lost).

use std::{
    collections::BTreeMap,
    sync::Arc,
    time::{Duration, Instant},
};

use diesel_async::AsyncConnection;
use futures_util::future::join_all;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use super::{
    Backoff,
    kafka::{KafkaError, KafkaSink, OutgoingRecord},
};
use crate::{
    clock::Clock,
    config::PublisherSettings,
    db::{DbError, PgPool, outbox},
    telemetry::{ErrorChain, Health, Metrics},
};

const STATS_INTERVAL: Duration = Duration::from_secs(5);
const RETENTION_INTERVAL: Duration = Duration::from_secs(60);
const RETENTION_BATCH: u32 = 1000;
/// When idle, how often the broker is asked for metadata (readiness).
const BROKER_CHECK_INTERVAL: Duration = Duration::from_secs(30);

/// Errors of one publishing round.
#[derive(Debug, thiserror::Error)]
pub enum PublishError {
    #[error(transparent)]
    Kafka(#[from] KafkaError),
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

/// The outbox publisher. Clones share the pool, the Kafka connections and
/// the metrics.
#[derive(Clone)]
pub struct Publisher {
    pool: PgPool,
    /// One per batch in flight (`concurrency`); the first also serves the
    /// readiness check.
    sinks: Arc<[KafkaSink]>,
    clock: Arc<dyn Clock>,
    settings: PublisherSettings,
    metrics: Arc<Metrics>,
    health: Arc<Health>,
    /// The topic checked for readiness while idle.
    topic: String,
}

impl Publisher {
    pub fn new(
        pool: PgPool,
        sink: KafkaSink,
        clock: Arc<dyn Clock>,
        settings: PublisherSettings,
        metrics: Arc<Metrics>,
        health: Arc<Health>,
        topic: String,
    ) -> Self {
        let siblings: Vec<KafkaSink> = (1..settings.concurrency.max(1))
            .map(|_| sink.sibling())
            .collect();
        let sinks: Vec<KafkaSink> = std::iter::once(sink).chain(siblings).collect();
        Self {
            pool,
            sinks: sinks.into(),
            clock,
            settings,
            metrics,
            health,
            topic,
        }
    }

    /// Publishes one batch; returns how many rows it published.
    pub async fn publish_batch(&self) -> Result<usize, PublishError> {
        self.publish_batch_with(&self.sinks[0]).await
    }

    async fn publish_batch_with(&self, sink: &KafkaSink) -> Result<usize, PublishError> {
        let mut conn = self.pool.get().await.map_err(DbError::from)?;
        let limit = self.settings.batch_size;
        let delete = self.settings.retention.is_zero();
        let (published, oldest_commit) = conn
            .transaction(async |conn| {
                let rows = outbox::claim_unpublished(conn, limit).await?;
                if rows.is_empty() {
                    return Ok::<_, PublishError>((0, Vec::new()));
                }
                let ids: Vec<i64> = rows.iter().map(|r| r.id).collect();
                let created: Vec<_> = rows.iter().map(|r| r.created_at).collect();
                let mut by_topic: BTreeMap<String, Vec<OutgoingRecord>> = BTreeMap::new();
                // The broker rejects timestamps far from its own clock, so the
                // record carries the publish time; the event time is `ce_time`.
                let produced_at = self.clock.now();
                for row in rows {
                    let headers = row.header_pairs().into_iter().collect();
                    by_topic.entry(row.topic).or_default().push(OutgoingRecord {
                        key: row.message_key,
                        value: row.payload,
                        headers,
                        timestamp: produced_at,
                    });
                }
                let started = Instant::now();
                for (topic, records) in by_topic {
                    sink.produce(&topic, records).await?;
                }
                self.metrics
                    .outbox_produce_duration_seconds
                    .observe(started.elapsed().as_secs_f64());
                if delete {
                    outbox::delete_rows(conn, &ids).await?;
                } else {
                    outbox::mark_published(conn, &ids, self.clock.now()).await?;
                }
                Ok((ids.len(), created))
            })
            .await?;
        if published > 0 {
            let acked_at = self.clock.now();
            for created_at in oldest_commit {
                let lag = (acked_at - created_at).num_microseconds().unwrap_or(0) as f64 / 1e6;
                self.metrics
                    .outbox_commit_to_ack_seconds
                    .observe(lag.max(0.0));
            }
            self.metrics.outbox_published.inc_by(published as u64);
            tracing::debug!(published, "outbox batch published");
        }
        self.health.set_broker_reachable(true);
        Ok(published)
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
        let first = self.publish_batch().await?;
        if first < full {
            return Ok(Drained {
                published: first,
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
            published: first,
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
            let n = self.publish_batch_with(&self.sinks[lane]).await?;
            published += n;
            if n < full {
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

    /// Refreshes the outbox lag gauges.
    pub async fn refresh_stats(&self) -> Result<outbox::OutboxStats, DbError> {
        let mut conn = self.pool.get().await?;
        let stats = outbox::stats(&mut conn).await?;
        self.metrics.outbox_unpublished.set(stats.unpublished);
        let age = stats
            .oldest_unpublished_at
            .map_or(0, |oldest| (self.clock.now() - oldest).num_seconds().max(0));
        self.metrics.outbox_oldest_unpublished_age_seconds.set(age);
        Ok(stats)
    }

    /// Deletes published rows older than the retention, in small batches.
    pub async fn sweep_retention(&self) -> Result<usize, DbError> {
        let retention =
            chrono::Duration::from_std(self.settings.retention).unwrap_or(chrono::Duration::MAX);
        let Some(cutoff) = self.clock.now().checked_sub_signed(retention) else {
            return Ok(0);
        };
        let mut conn = self.pool.get().await?;
        let mut total = 0;
        loop {
            let deleted =
                outbox::delete_published_before(&mut conn, cutoff, RETENTION_BATCH).await?;
            total += deleted;
            if deleted < RETENTION_BATCH as usize {
                break;
            }
        }
        self.metrics.outbox_deleted.inc_by(total as u64);
        Ok(total)
    }

    /// Publishes until `shutdown`: [`Self::drain`] while batches come back full,
    /// then on each commit notification or poll tick; with backoff while
    /// Kafka or the database fails. A batch in flight at shutdown finishes
    /// (it is bounded by the Kafka request timeout).
    pub async fn run(&self, wake: Arc<Notify>, shutdown: CancellationToken) {
        let mut backoff = Backoff::new(Duration::from_millis(100), Duration::from_secs(30));
        let mut last_stats: Option<Instant> = None;
        let mut last_retention: Option<Instant> = None;
        let mut last_broker_check: Option<Instant> = None;
        let due =
            |last: Option<Instant>, every: Duration| last.is_none_or(|t| t.elapsed() >= every);
        while !shutdown.is_cancelled() {
            // After a failure only the backoff (not a commit notification)
            // ends the wait, so an outage is not hammered at commit rate.
            let mut wake_on_commit = true;
            let wait = match self.drain(&shutdown, STATS_INTERVAL).await {
                Ok(drained) => {
                    backoff.reset();
                    if drained.more {
                        None
                    } else {
                        Some(self.settings.poll_interval)
                    }
                }
                Err(error) => {
                    self.metrics.outbox_publish_errors.inc();
                    if matches!(error, PublishError::Kafka(_)) {
                        self.health.set_broker_reachable(false);
                    }
                    wake_on_commit = false;
                    let delay = backoff.next_delay();
                    tracing::error!(error = %ErrorChain(&error), retry_in_ms = delay.as_millis() as u64, "outbox publish failed; rows stay in the outbox");
                    Some(delay)
                }
            };
            if due(last_stats, STATS_INTERVAL) {
                last_stats = Some(Instant::now());
                if let Err(error) = self.refresh_stats().await {
                    tracing::warn!(error = %ErrorChain(&error), "outbox stats not refreshed");
                }
            }
            if !self.settings.retention.is_zero() && due(last_retention, RETENTION_INTERVAL) {
                last_retention = Some(Instant::now());
                match self.sweep_retention().await {
                    Ok(0) => {}
                    Ok(deleted) => {
                        tracing::info!(deleted, "published outbox rows removed by retention")
                    }
                    Err(error) => {
                        tracing::warn!(error = %ErrorChain(&error), "outbox retention sweep failed")
                    }
                }
            }
            let Some(wait) = wait else { continue };
            if due(last_broker_check, BROKER_CHECK_INTERVAL) {
                last_broker_check = Some(Instant::now());
                match self.sinks[0].check_topic(&self.topic).await {
                    Ok(_) => self.health.set_broker_reachable(true),
                    Err(error) => {
                        self.health.set_broker_reachable(false);
                        tracing::warn!(error = %ErrorChain(&error), "Kafka check failed");
                    }
                }
            }
            tokio::select! {
                _ = shutdown.cancelled() => break,
                _ = wake.notified(), if wake_on_commit => {}
                _ = tokio::time::sleep(wait) => {}
            }
        }
        tracing::info!("outbox publisher stopped");
    }
}
