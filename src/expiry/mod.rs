//! The sweep: [`ExpiryWorker::run_cycle`] is one cycle over both phases,
//! [`scheduler::run`] repeats it on the interval until shutdown.

mod cycle;
pub mod scheduler;

pub use cycle::{CycleError, CycleOutcome, CycleReport, ExpiryWorker};
