//! The built-in outbox publisher: claim unpublished rows, produce them to
//! Kafka keyed by booking id, mark them published, commit.

mod backoff;
pub mod kafka;
mod listener;
mod publisher;

pub use backoff::Backoff;
pub use kafka::{KafkaError, KafkaSink};
pub use listener::listen_for_commits;
pub use publisher::{PublishError, Publisher};
