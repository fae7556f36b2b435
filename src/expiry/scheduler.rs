//! The schedule: a cycle at once, then one per interval; a tick never
//! starts while a cycle runs (the loop is sequential) and missed ticks are
//! skipped, not queued.

use std::sync::Arc;

use tokio::time::MissedTickBehavior;
use tokio_util::sync::CancellationToken;

use super::{CycleError, ExpiryWorker};
use crate::{
    clock::Clock,
    telemetry::{ErrorChain, Health, Metrics},
};

/// Runs cycles until `shutdown`; returns once the current cycle ended.
pub async fn run(
    worker: Arc<ExpiryWorker>,
    clock: Arc<dyn Clock>,
    metrics: Arc<Metrics>,
    health: Arc<Health>,
    shutdown: CancellationToken,
) {
    let mut ticker = tokio::time::interval(worker.interval());
    ticker.set_missed_tick_behavior(MissedTickBehavior::Skip);
    loop {
        tokio::select! {
            biased;
            _ = shutdown.cancelled() => break,
            _ = ticker.tick() => {}
        }
        match worker.run_cycle(&shutdown).await {
            Ok(_) => {
                let now = clock.now();
                health.record_cycle_success(now);
                metrics.last_success_timestamp_seconds.set(now.timestamp());
            }
            Err(CycleError::Cancelled) => break,
            Err(error) => {
                metrics.errors.inc();
                metrics.cycles_failed.inc();
                tracing::error!(error = %ErrorChain(&error), "cycle failed; the next cycle retries");
            }
        }
        if let Err(error) = worker.measure_backlog().await {
            tracing::warn!(error = %ErrorChain(&error), "backlog not measured");
        }
    }
    tracing::info!("expiry worker stopped");
}
