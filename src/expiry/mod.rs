//! The sweep: [`ExpiryWorker::run_cycle`] is one cycle over both phases,
//! [`scheduler::run`] repeats it until shutdown, waking at each regular tick
//! and (unless turned off) just after the next known deadline
//! ([`wake::next_wake`], pure), and leaving out the poison rows earlier
//! cycles refused for an interval or two ([`refused::RefusedRows`]).

mod cycle;
pub(crate) mod refused;
pub mod scheduler;
pub(crate) mod wake;

pub use cycle::{CycleError, CycleOutcome, CycleReport, ExpiryWorker};
