//! What every long-running task shares: the pool, the clock, the metrics
//! and the health the probes read. `app` builds one [`TaskContext`] per
//! process and hands a clone to each task (the expiry scheduler, the
//! publisher, its upkeep tasks), instead of four separate arguments.

use std::sync::Arc;

use crate::{
    clock::Clock,
    db::PgPool,
    telemetry::{Health, Metrics},
};

/// The shared parts of the running tasks; cloning shares them.
#[derive(Clone)]
pub struct TaskContext {
    pub pool: PgPool,
    pub clock: Arc<dyn Clock>,
    pub metrics: Arc<Metrics>,
    pub health: Arc<Health>,
}

impl TaskContext {
    /// A context on `pool` and `clock` with fresh metrics and the health of
    /// an instance that both expires and publishes, started at the clock's
    /// now (tests and one-shot commands; `run` sets its roles' health).
    pub fn new(pool: PgPool, clock: Arc<dyn Clock>) -> Self {
        let health = Arc::new(Health::new(clock.now(), true, true));
        Self {
            pool,
            clock,
            metrics: Arc::new(Metrics::new()),
            health,
        }
    }
}

impl std::fmt::Debug for TaskContext {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TaskContext")
            .field("clock", &self.clock)
            .finish_non_exhaustive()
    }
}
