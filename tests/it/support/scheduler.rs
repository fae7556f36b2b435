//! The real expiry scheduler on a test database, with the system clock
//! (or one the test gives it).

use std::sync::Arc;

use booking_expiration::context::TaskContext;
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
        Self::start_with_clock(db, settings, Arc::new(SystemClock))
    }

    /// The scheduler with an instance clock of the test's own.
    pub fn start_with_clock(db: &TestDb, settings: ExpirySettings, clock: Arc<dyn Clock>) -> Self {
        let context = TaskContext {
            health: Arc::new(Health::new(clock.now(), true, false)),
            ..TaskContext::new(db.pool.clone(), clock)
        };
        let worker = Arc::new(ExpiryWorker::new(
            &context,
            settings,
            EventSettings::default(),
            ShutdownSettings::default(),
        ));
        let token = CancellationToken::new();
        let metrics = Arc::clone(&context.metrics);
        let task = tokio::spawn(scheduler::run(worker, context, token.clone()));
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
