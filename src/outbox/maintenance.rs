//! Outbox upkeep beside the publisher, each a run-once step on a schedule of
//! its own: the lag gauges ([`LagStats`]) and the retention sweep
//! ([`RetentionSweep`]). Neither talks to Kafka, so neither waits for it.

use std::{future::Future, sync::Arc, time::Duration};

use diesel_async::AsyncConnection;
use tokio::time::MissedTickBehavior;
use tokio_util::sync::CancellationToken;

use crate::{
    clock::Clock,
    context::TaskContext,
    db::{DbError, PgPool, outbox},
    telemetry::{ErrorChain, Metrics},
};

/// How often the lag gauges are refreshed, at most.
pub const STATS_INTERVAL: Duration = Duration::from_secs(5);
/// A refresh waits at least this many times as long as the last one took:
/// counting the unpublished rows reads every one of them, so a backlog of
/// millions (an outage's) would otherwise spend a core on its own gauge
/// while it drains. The count costs at most 1/`STATS_PAUSE_FACTOR` of one
/// connection's time, whatever the backlog (2,000,000 rows: about a second
/// per count, a count a minute).
const STATS_PAUSE_FACTOR: u32 = 50;
/// How often published rows past the retention are swept.
pub const RETENTION_INTERVAL: Duration = Duration::from_secs(60);
/// Rows deleted per statement by the sweep.
const RETENTION_BATCH: u32 = 1000;

/// Runs `step` at once and then every `interval` until `shutdown`. A step in
/// progress finishes before this returns (the loop is sequential); ticks
/// missed while a step ran are skipped, not queued.
pub async fn every<F, Fut>(interval: Duration, shutdown: &CancellationToken, mut step: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = ()>,
{
    let mut ticker = tokio::time::interval(interval);
    ticker.set_missed_tick_behavior(MissedTickBehavior::Skip);
    loop {
        tokio::select! {
            biased;
            _ = shutdown.cancelled() => return,
            _ = ticker.tick() => step().await,
        }
    }
}

/// Refreshes `outbox_unpublished`, `outbox_oldest_unpublished_age_seconds`
/// and `outbox_parked`.
#[derive(Clone)]
pub struct LagStats {
    pool: PgPool,
    clock: Arc<dyn Clock>,
    metrics: Arc<Metrics>,
}

impl std::fmt::Debug for LagStats {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LagStats").finish_non_exhaustive()
    }
}

impl LagStats {
    pub fn new(context: &TaskContext) -> Self {
        Self {
            pool: context.pool.clone(),
            clock: Arc::clone(&context.clock),
            metrics: Arc::clone(&context.metrics),
        }
    }

    /// Reads the outbox lag once and sets the gauges.
    pub async fn run_once(&self) -> Result<outbox::OutboxStats, DbError> {
        let mut conn = self.pool.get().await?;
        // Every unit of work is a transaction (see `db`), a read too.
        let stats = conn
            .transaction(async |conn| outbox::stats(conn).await)
            .await?;
        self.metrics.outbox_unpublished.set(stats.unpublished);
        self.metrics.outbox_parked.set(stats.parked);
        let age = stats
            .oldest_unpublished_at
            .map_or(0, |oldest| (self.clock.now() - oldest).num_seconds().max(0));
        self.metrics.outbox_oldest_unpublished_age_seconds.set(age);
        Ok(stats)
    }

    /// [`Self::run_once`] at once, then after [`stats_pause`] each time,
    /// until `shutdown`.
    pub async fn run(self, shutdown: CancellationToken) {
        loop {
            let started = tokio::time::Instant::now();
            if let Err(error) = self.run_once().await {
                tracing::warn!(error = %ErrorChain(&error), "outbox stats not refreshed");
            }
            tokio::select! {
                biased;
                _ = shutdown.cancelled() => return,
                _ = tokio::time::sleep(stats_pause(started.elapsed())) => {}
            }
        }
    }
}

/// The pause after a refresh of the lag that took `took`:
/// [`STATS_INTERVAL`], or [`STATS_PAUSE_FACTOR`] times `took` when that is
/// longer.
fn stats_pause(took: Duration) -> Duration {
    STATS_INTERVAL.max(took.saturating_mul(STATS_PAUSE_FACTOR))
}

/// Deletes published rows older than the retention.
#[derive(Clone)]
pub struct RetentionSweep {
    pool: PgPool,
    clock: Arc<dyn Clock>,
    retention: Duration,
    metrics: Arc<Metrics>,
}

impl std::fmt::Debug for RetentionSweep {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RetentionSweep").finish_non_exhaustive()
    }
}

impl RetentionSweep {
    pub fn new(context: &TaskContext, retention: Duration) -> Self {
        Self {
            pool: context.pool.clone(),
            clock: Arc::clone(&context.clock),
            retention,
            metrics: Arc::clone(&context.metrics),
        }
    }

    /// One sweep, in small batches until none is left; returns how many
    /// rows it deleted.
    pub async fn run_once(&self) -> Result<usize, DbError> {
        let retention = chrono::Duration::from_std(self.retention).unwrap_or(chrono::Duration::MAX);
        let Some(cutoff) = self.clock.now().checked_sub_signed(retention) else {
            return Ok(0);
        };
        let mut conn = self.pool.get().await?;
        let mut total = 0;
        loop {
            let deleted = conn
                .transaction(async |conn| {
                    outbox::delete_published_before(conn, cutoff, RETENTION_BATCH).await
                })
                .await?;
            total += deleted;
            if deleted < RETENTION_BATCH as usize {
                break;
            }
        }
        self.metrics.outbox_deleted.inc_by(total as u64);
        Ok(total)
    }

    /// [`Self::run_once`] every [`RETENTION_INTERVAL`] until `shutdown`.
    pub async fn run(self, shutdown: CancellationToken) {
        every(RETENTION_INTERVAL, &shutdown, || async {
            match self.run_once().await {
                Ok(0) => {}
                Ok(deleted) => {
                    tracing::info!(deleted, "published outbox rows removed by retention")
                }
                Err(error) => {
                    tracing::warn!(error = %ErrorChain(&error), "outbox retention sweep failed")
                }
            }
        })
        .await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_slow_count_of_the_lag_waits_in_proportion() {
        let ms = Duration::from_millis;
        assert_eq!(stats_pause(ms(3)), STATS_INTERVAL);
        assert_eq!(stats_pause(ms(100)), STATS_INTERVAL);
        assert_eq!(stats_pause(ms(1_200)), Duration::from_secs(60));
        assert_eq!(stats_pause(Duration::MAX), Duration::MAX);
    }
}
