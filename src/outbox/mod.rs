//! The built-in outbox publisher: claim unpublished rows, produce them to
//! Kafka keyed by booking id, mark them published, commit.
//!
//! - [`publisher`]: the claim/produce/mark batch, lanes, and `run` (wake-up,
//!   backoff, shutdown); the broker readiness check. `held`: the rows a
//!   partly acknowledged batch left pending, kept out of the next batches
//!   for a moment so a failing partition does not hold back the others.
//! - [`sink`]: the [`Sink`] seam; [`kafka`] is the real sink (its
//!   per-partition produce, Kafka's error codes, and the TLS bridge in
//!   rooms of their own), [`memory`] an in-memory one for tests whose
//!   subject is not the broker.
//! - [`maintenance`]: lag gauges and retention, each on its own schedule.
//! - `listener`: LISTEN for commits, to wake the publisher.

mod backoff;
mod held;
pub mod kafka;
mod listener;
pub(crate) mod maintenance;
pub(crate) mod memory;
pub(crate) mod publisher;
pub mod sink;

pub use backoff::Backoff;
pub use kafka::{KafkaError, KafkaSink};
pub use listener::{ListenError, listen_for_commits};
pub use maintenance::{LagStats, RetentionSweep};
pub use memory::MemorySink;
pub use publisher::{HOLD, PublishError, Publisher};
pub use sink::{OutgoingRecord, Sink, SinkError};
