//! The seam between the pipeline and the broker: a [`Transport`] reads a
//! topic's partition count and produces records to one partition. Its
//! errors arrive already classified ([`SendError`]); no Kafka type crosses
//! it. [`super::kafka::KafkaTransport`] is the real one,
//! `outbox::memory::ScriptedTransport` a scripted one for tests.

use std::future::Future;

use crate::events::Headers;

/// A record to produce.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutgoingRecord {
    /// The Kafka key (the booking id).
    pub key: String,
    pub value: Vec<u8>,
    pub headers: Headers,
}

/// What the pipeline does after an error, as Kafka classifies it
/// (`kafka/errors.rs` holds the table).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorClass {
    /// Retriable in Kafka (a leader moving, too few in-sync replicas, a
    /// connection lost, a request unanswered): the partition backs off
    /// (`Timing::retry_first` up to `Timing::retry_max`) and sends again.
    Retriable,
    /// Not retriable and not about the records (authorization, an
    /// unsupported request, a missing topic): nothing changes until an
    /// operator acts. The partition or topic pauses for
    /// `Timing::fatal_pause`, readiness fails, the rows wait.
    Fatal,
    /// The broker will never accept these records as they are (too large,
    /// invalid): a request of several is split; a single record is parked.
    Refused,
}

/// A failed transport call.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct SendError {
    pub class: ErrorClass,
    /// Kafka's name of the error (`NOT_ENOUGH_REPLICAS`, …) or a `CLIENT_…`
    /// name for a failure on this side: the produce-errors metric's label.
    pub code: String,
    /// What failed, with its causes (for the log).
    pub message: String,
}

impl SendError {
    pub fn new(class: ErrorClass, code: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            class,
            code: code.into(),
            message: message.into(),
        }
    }
}

/// The code of a produce refused because the topic's partition count is
/// not the one its records were routed for.
pub const LAYOUT_CHANGED: &str = "CLIENT_LAYOUT_CHANGED";

/// Where the pipeline sends records.
///
/// A generic parameter with `-> impl Future + Send` rather than a boxed
/// trait object: a process has exactly one transport type, and each
/// implementation is plain `async fn`s. The pipeline never has two
/// produce calls in flight for one partition, so an implementation may
/// keep per-partition state without locking against itself.
///
/// Each call returns within the transport's own bound
/// (`KAFKA_REQUEST_TIMEOUT` for Kafka), with a retriable `CLIENT_TIMEOUT`
/// when nothing answered: the transport, not the pipeline, knows what a
/// request cut short leaves to clean up (a connection to drop, a leader to
/// look up again). A call the pipeline drops (at shutdown) must leave the
/// transport usable.
pub trait Transport: Send + Sync + 'static {
    /// The number of partitions of `topic` (creating the topic when the
    /// settings allow it). A success is a real exchange with the broker.
    fn partitions(&self, topic: &str) -> impl Future<Output = Result<i32, SendError>> + Send;

    /// Produces `records`, in order, to `partition` of `topic` with
    /// acks = all, each stamped with the time the request is built (its
    /// create time; the event's own time is `ce_time`). `Ok` when the
    /// broker acknowledged every one. `partitions` is the partition count
    /// the records were routed for: when the topic has another count now,
    /// nothing is sent and the error's code is [`LAYOUT_CHANGED`] (the
    /// rows are to be routed again).
    fn produce(
        &self,
        topic: &str,
        partition: i32,
        partitions: i32,
        records: Vec<OutgoingRecord>,
    ) -> impl Future<Output = Result<(), SendError>> + Send;
}
