//! The seam between the publisher and the broker: a [`Sink`] takes keyed
//! records for a topic and returns once the broker acknowledged them. The
//! publisher's claim/mark logic, lanes, backoff and shutdown are written
//! against this trait; [`super::KafkaSink`] is the real one and
//! [`super::memory::MemorySink`] stands in for it in tests whose subject
//! is not the broker.

use std::{collections::BTreeMap, future::Future};

use chrono::{DateTime, Utc};

use super::KafkaError;

/// A record to produce, with its key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutgoingRecord {
    pub key: String,
    pub value: Vec<u8>,
    pub headers: BTreeMap<String, Vec<u8>>,
    pub timestamp: DateTime<Utc>,
}

/// Why a sink did not take the records (or could not check the topic).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SinkError {
    #[error(transparent)]
    Kafka(#[from] KafkaError),
    /// An in-memory sink was told to fail this call.
    #[error("the in-memory sink refused the {0} call")]
    Refused(&'static str),
}

impl SinkError {
    /// The Kafka error, when the sink is Kafka.
    pub fn as_kafka(&self) -> Option<&KafkaError> {
        match self {
            SinkError::Kafka(error) => Some(error),
            SinkError::Refused(_) => None,
        }
    }
}

/// Where the publisher sends records.
///
/// Why a generic parameter with `-> impl Future + Send` rather than
/// `Arc<dyn Sink>` with boxed futures: a process has exactly one sink type,
/// so dynamic dispatch buys nothing; implementations are plain `async fn`s
/// with no allocation per call; and `Send` (a lane is a spawned task) is
/// checked where each implementation is written, not at a distant spawn.
/// The cost is a type parameter on `Publisher`, defaulted to `KafkaSink` so
/// production code never names it.
pub trait Sink: Send + Sync + 'static {
    /// Produces `records` to `topic` and returns once the broker
    /// acknowledged every one of them. An error means none may be treated
    /// as delivered (some may have been: delivery is at least once).
    fn produce(
        &self,
        topic: &str,
        records: Vec<OutgoingRecord>,
    ) -> impl Future<Output = Result<(), SinkError>> + Send;

    /// Asks the broker whether `topic` exists; returns its partition count.
    /// A success is a real exchange with the broker (readiness relies on it).
    fn check_topic(&self, topic: &str) -> impl Future<Output = Result<usize, SinkError>> + Send;

    /// A sink with the same settings for another lane. For Kafka it has a
    /// connection of its own: the broker serves one request per connection
    /// at a time, so lanes that share one would not overlap.
    fn sibling(&self) -> Self
    where
        Self: Sized;
}
