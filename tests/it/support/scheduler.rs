//! The real expiry scheduler on a test database, with the system clock.

use std::sync::Arc;

use booking_expiration::{
    clock::{Clock, SystemClock},
    config::{EventSettings, ExpirySettings, ShutdownSettings},
    expiry::{ExpiryWorker, scheduler},
    telemetry::{Health, Metrics},
};
use tokio_util::sync::CancellationToken;

use super::TestDb;

/// A running `scheduler::run`; [`Scheduler::stop`] cancels it and waits.
pub struct Scheduler {
    token: CancellationToken,
    task: tokio::task::JoinHandle<()>,
    pub metrics: Arc<Metrics>,
}

impl Scheduler {
    pub fn start(db: &TestDb, settings: ExpirySettings) -> Self {
        let clock: Arc<dyn Clock> = Arc::new(SystemClock);
        let metrics = Arc::new(Metrics::new());
        let worker = Arc::new(ExpiryWorker::new(
            db.pool.clone(),
            Arc::clone(&clock),
            settings,
            EventSettings::default(),
            ShutdownSettings::default(),
            Arc::clone(&metrics),
        ));
        let health = Arc::new(Health::new(clock.now(), true, false));
        let token = CancellationToken::new();
        let task = tokio::spawn(scheduler::run(
            worker,
            clock,
            Arc::clone(&metrics),
            health,
            token.clone(),
        ));
        Self {
            token,
            task,
            metrics,
        }
    }

    pub async fn stop(self) {
        self.token.cancel();
        self.task.await.expect("scheduler task");
    }
}
