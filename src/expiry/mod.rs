//! The sweep: [`ExpiryWorker::run_cycle`] is one cycle over both phases,
//! started as a [`CycleStart`] says, [`scheduler::run`] repeats it until
//! shutdown, waking at each regular tick and (unless turned off, and only
//! the instance holding the [`waker`]'s lease) just after the next known
//! deadline ([`wake::next_wake`], pure), going on from where the last cycle
//! left each phase ([`sweep::Sweep`]) so poison rows are passed over, and
//! backing off to the tick while the clock is out of skew ([`skew`]). The
//! worker and what the scheduler reads between cycles are `worker`; a
//! cycle's loop is `cycle`, one batch of it `batch`; what a cycle reports,
//! `outcome`.

mod batch;
mod cycle;
mod outcome;
pub mod scheduler;
pub mod skew;
pub mod sweep;
pub(crate) mod wake;
pub mod waker;
mod worker;

pub use cycle::CycleStart;
pub use outcome::{CycleError, CycleOutcome, CycleReport};
pub use worker::ExpiryWorker;
