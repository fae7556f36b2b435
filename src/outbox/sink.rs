//! The seam between the publisher and the broker: a [`Sink`] takes keyed
//! records for a topic and reports, record by record, whether the broker
//! acknowledged it, refused it for good, or could not be asked. The
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
    /// Records the broker will never accept (see [`Produced::into_result`]).
    #[error("the broker refused {0} record(s) for good")]
    RecordsRefused(usize),
}

impl SinkError {
    /// The Kafka error, when the sink is Kafka.
    pub fn as_kafka(&self) -> Option<&KafkaError> {
        match self {
            SinkError::Kafka(error) => Some(error),
            SinkError::Refused(_) | SinkError::RecordsRefused(_) => None,
        }
    }

    /// The Kafka error name for the produce-errors metric: the broker's
    /// code when it answered with one, otherwise a `CLIENT_…` name.
    pub fn code(&self) -> String {
        match self {
            SinkError::Kafka(error) => error.code(),
            SinkError::Refused(_) => "CLIENT_REFUSED".to_owned(),
            SinkError::RecordsRefused(_) => "CLIENT_RECORDS_REFUSED".to_owned(),
        }
    }
}

/// The broker refused a record for a reason no retry fixes (the record
/// itself is the problem): the publisher parks its row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    /// The Kafka error name, e.g. `MESSAGE_TOO_LARGE`.
    pub code: String,
    /// What was tried, for the operator.
    pub message: String,
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.code, self.message)
    }
}

/// What became of one record of a produce call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Delivery {
    /// The broker acknowledged it (acks = all).
    Acked,
    /// The broker will never take it as it is.
    Refused(Refusal),
    /// Not acknowledged (a retriable failure, or not tried after one):
    /// send it again later. It may have been written (at least once).
    Pending,
}

/// The outcome of one produce call, record by record.
#[derive(Debug)]
pub struct Produced {
    /// One per record, in the order given to [`Sink::produce`].
    pub deliveries: Vec<Delivery>,
    /// The first retriable failure, when any record is [`Delivery::Pending`].
    pub error: Option<SinkError>,
    /// The error code of every failed request of the call (refusals and
    /// retriable failures, a split's too-large answers included), for the
    /// produce-errors metric.
    pub error_codes: Vec<String>,
}

impl Produced {
    /// Every one of `n` records acknowledged.
    pub fn all_acked(n: usize) -> Self {
        Self {
            deliveries: vec![Delivery::Acked; n],
            error: None,
            error_codes: Vec::new(),
        }
    }

    /// `Ok` when every record was acknowledged; otherwise the retriable
    /// error, or [`SinkError::RecordsRefused`] when records were refused.
    pub fn into_result(self) -> Result<(), SinkError> {
        if let Some(error) = self.error {
            return Err(error);
        }
        let refused = self
            .deliveries
            .iter()
            .filter(|d| matches!(d, Delivery::Refused(_)))
            .count();
        if refused > 0 {
            return Err(SinkError::RecordsRefused(refused));
        }
        Ok(())
    }

    /// None of `n` records acknowledged because of `error`.
    pub fn failed(n: usize, error: SinkError) -> Self {
        Self {
            deliveries: vec![Delivery::Pending; n],
            error_codes: vec![error.code()],
            error: Some(error),
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
    /// Produces `records` to `topic` and reports what became of each: the
    /// acknowledged ones may be marked published even when others failed
    /// (so a retry never sends them again); a refused one is parked; a
    /// pending one is sent again later (it may have been written: delivery
    /// is at least once).
    fn produce(
        &self,
        topic: &str,
        records: Vec<OutgoingRecord>,
    ) -> impl Future<Output = Produced> + Send;

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
