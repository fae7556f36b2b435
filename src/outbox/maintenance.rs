//! Outbox upkeep beside the publisher, each a run-once step on a schedule of
//! its own: the lag gauges ([`LagStats`]) and the retention sweep
//! ([`RetentionSweep`]). Neither talks to Kafka, so neither waits for it.

use std::{future::Future, sync::Arc, time::Duration};

use diesel_async::{AsyncConnection, AsyncPgConnection};
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
/// The next count waits at least this many times as long as the last one
/// took: counting the unpublished rows reads every one of them, so a
/// backlog of millions (an outage's) would otherwise spend a core on its
/// own gauge while it drains. Up to [`STATS_PAUSE_MAX`], the count costs at
/// most 1/`STATS_PAUSE_FACTOR` of one connection's time, whatever the
/// backlog and however many instances run (one counts at a time).
const STATS_PAUSE_FACTOR: u32 = 50;
/// The longest pause between two counts: the gauges are what the lag
/// alerts read (5 min windows), so they are never older than this plus one
/// count (and [`STATS_INTERVAL`] on an instance that looked while another
/// counted). A count that took longer than `STATS_PAUSE_MAX /
/// STATS_PAUSE_FACTOR` (1.2 s: about 2,000,000 unpublished rows, warm) costs
/// more than 1/50 of a connection from there on.
const STATS_PAUSE_MAX: Duration = Duration::from_secs(60);
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
///
/// Every `run` keeps these gauges, but one instance at a time counts: the
/// count is shared in `booking_expiration_outbox_lag` with the time of the
/// next one (database clock), and the instance that finds that time come
/// and the row unlocked counts, holding the row, while the others read
/// what it left ([`Refresh`]). N instances cost the database one count per
/// pause, not N.
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

/// What one refresh of the lag gauges did.
#[derive(Debug)]
pub enum Refresh {
    /// This instance's turn: it counted, recorded the count for the others,
    /// and the next count is due after `pause`.
    Counted {
        stats: outbox::OutboxStats,
        pause: Duration,
    },
    /// This instance's turn, but the count failed (a statement timeout on a
    /// huge backlog): only the next count's time was recorded, `pause`
    /// away, as after a count that ended, so the instances do not all
    /// retry it at once.
    Failed { error: DbError, pause: Duration },
    /// Another instance's count, read; the next is due in `next_in`.
    Read {
        stats: outbox::OutboxStats,
        next_in: Duration,
    },
    /// Another instance is counting now; the gauges keep the last count
    /// (`None`: none was recorded yet).
    Busy { last: Option<outbox::OutboxStats> },
}

impl Refresh {
    /// How long until the next refresh: the pause this count set, the time
    /// left until the next count (at most [`STATS_PAUSE_MAX`]), or, while
    /// another instance counts, [`STATS_INTERVAL`].
    pub fn wait(&self) -> Duration {
        match self {
            Self::Counted { pause, .. } | Self::Failed { pause, .. } => *pause,
            Self::Read { next_in, .. } => (*next_in).min(STATS_PAUSE_MAX),
            Self::Busy { .. } => STATS_INTERVAL,
        }
    }

    /// The lag this refresh shows, if it has one.
    pub fn stats(&self) -> Option<&outbox::OutboxStats> {
        match self {
            Self::Counted { stats, .. } | Self::Read { stats, .. } => Some(stats),
            Self::Busy { last } => last.as_ref(),
            Self::Failed { .. } => None,
        }
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

    /// Counts the outbox lag now, whoever's turn it is, and sets the gauges
    /// (not recorded for the other instances).
    pub async fn run_once(&self) -> Result<outbox::OutboxStats, DbError> {
        let mut conn = self.pool.get().await?;
        // Every unit of work is a transaction (see `db`), a read too.
        let stats = conn
            .transaction(async |conn| outbox::stats(conn).await)
            .await?;
        self.show(&stats);
        Ok(stats)
    }

    /// One refresh: counts if it is this instance's turn, else reads the
    /// shared count; sets the gauges from whichever it has.
    pub async fn refresh(&self) -> Result<Refresh, DbError> {
        let mut conn = self.pool.get().await?;
        self.refresh_on(&mut conn).await
    }

    async fn refresh_on(&self, conn: &mut AsyncPgConnection) -> Result<Refresh, DbError> {
        let refresh = conn
            .transaction(async |conn| {
                // A plain read first: a look at a count that is not due
                // locks nothing and writes nothing.
                if let Some(shared) = outbox::shared_lag(conn).await? {
                    if !shared.due() {
                        return Ok(Refresh::Read {
                            stats: shared.stats,
                            next_in: Duration::from_millis(
                                u64::try_from(shared.next_in_ms).unwrap_or(0),
                            ),
                        });
                    }
                    if !outbox::take_lag_turn(conn).await? {
                        return Ok(Refresh::Busy {
                            last: (!shared.never_counted).then_some(shared.stats),
                        });
                    }
                }
                // This transaction holds the row (or it is gone: nothing is
                // shared). The count runs in a savepoint, so one that fails
                // still records when the next is due.
                let started = tokio::time::Instant::now();
                let counted = conn
                    .transaction(async |conn| outbox::stats(conn).await)
                    .await;
                let pause = stats_pause(started.elapsed());
                outbox::record_lag(conn, counted.as_ref().ok(), pause).await?;
                Ok::<_, DbError>(match counted {
                    Ok(stats) => Refresh::Counted { stats, pause },
                    Err(error) => Refresh::Failed { error, pause },
                })
            })
            .await?;
        if let Some(stats) = refresh.stats() {
            self.show(stats);
        }
        Ok(refresh)
    }

    fn show(&self, stats: &outbox::OutboxStats) {
        self.metrics.outbox_unpublished.set(stats.unpublished);
        self.metrics.outbox_parked.set(stats.parked);
        let age = stats
            .oldest_unpublished_at
            .map_or(0, |oldest| (self.clock.now() - oldest).num_seconds().max(0));
        self.metrics.outbox_oldest_unpublished_age_seconds.set(age);
    }

    /// [`Self::refresh`] at once, then after [`Refresh::wait`], until
    /// `shutdown`. A refresh that failed outside the count (the database
    /// down, the pool busy) is tried again after [`STATS_INTERVAL`].
    pub async fn run(self, shutdown: CancellationToken) {
        loop {
            let (pause, failed) = match self.refresh().await {
                Ok(Refresh::Failed { error, pause }) => (pause, Some(error)),
                Ok(refresh) => (refresh.wait(), None),
                Err(error) => (STATS_INTERVAL, Some(error)),
            };
            if let Some(error) = failed {
                tracing::warn!(error = %ErrorChain(&error), "outbox stats not refreshed");
            }
            tokio::select! {
                biased;
                _ = shutdown.cancelled() => return,
                _ = tokio::time::sleep(pause) => {}
            }
        }
    }
}

/// The pause after a count of the lag that took `took`:
/// [`STATS_PAUSE_FACTOR`] times `took`, within [`STATS_INTERVAL`] and
/// [`STATS_PAUSE_MAX`].
fn stats_pause(took: Duration) -> Duration {
    took.saturating_mul(STATS_PAUSE_FACTOR)
        .clamp(STATS_INTERVAL, STATS_PAUSE_MAX)
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
    fn a_slow_count_of_the_lag_waits_in_proportion_up_to_a_minute() {
        let ms = Duration::from_millis;
        assert_eq!(stats_pause(ms(3)), STATS_INTERVAL);
        assert_eq!(stats_pause(ms(100)), STATS_INTERVAL);
        assert_eq!(stats_pause(ms(400)), Duration::from_secs(20));
        assert_eq!(stats_pause(ms(1_200)), STATS_PAUSE_MAX);
        assert_eq!(stats_pause(Duration::from_secs(12)), STATS_PAUSE_MAX);
        assert_eq!(stats_pause(Duration::MAX), STATS_PAUSE_MAX);
    }
}
