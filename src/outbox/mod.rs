//! The built-in outbox publisher: a per-partition pipeline after the Java
//! producer's design (docs/design.md, "The publisher").
//!
//! Rooms, each with one job (the layering test orders them):
//!
//! - [`publisher`]: what `run` starts and how tests build one;
//!   `pipeline`: the one task that claims, routes, sends and marks.
//! - `queues` and `partition`: the partition queues (the accumulator):
//!   what is ready to send, what the next claim may take, each partition's
//!   own backoff. Pure.
//! - [`store`]: the database side, one short transaction per round, behind
//!   the [`Store`] seam; the SQL is `db::outbox`.
//! - [`transport`]: the seam to the broker ([`Transport`], classified
//!   [`SendError`]s, no Kafka type); [`kafka`] is the real transport (its
//!   broker connections, metadata, Kafka's error table, TLS), `memory`
//!   scripted stand-ins for tests (only in test builds and with the
//!   `testkit` feature).
//! - [`timing`]: every duration the publisher waits on, with its reason.
//! - `report`: failures that last, logged once a minute.
//! - [`maintenance`]: lag gauges and retention; `listener`: LISTEN for
//!   commits, to wake the publisher.

pub mod kafka;
mod listener;
pub(crate) mod maintenance;
// Test doubles: the crate's own tests, and tests/it and benches through
// the `testkit` feature (Cargo.toml); not in the binary.
#[cfg(any(test, feature = "testkit"))]
pub mod memory;
mod partition;
mod pipeline;
pub mod publisher;
mod queues;
mod report;
mod scan;
pub mod store;
pub mod timing;
pub mod transport;

#[cfg(test)]
mod tests;

pub use kafka::{KafkaError, KafkaTransport};
pub use listener::{ListenError, listen_for_commits};
pub use maintenance::{LagStats, Refresh, RetentionSweep};
#[cfg(any(test, feature = "testkit"))]
pub use memory::{MemoryStore, ScriptedTransport};
pub use pipeline::{CORRUPT_ROW, Published};
pub use publisher::Publisher;
pub use store::{PgStore, Round, RoundResult, Store};
pub use timing::Timing;
pub use transport::{ErrorClass, OutgoingRecord, SendError, Transport};
