//! The Kafka transport: connections the worker opens and owns, with
//! rskafka's protocol layer (its codec and message types, through its
//! `unstable-fuzzing` feature, pinned to one version) spoken over them.
//!
//! - `connection`: one broker connection: TCP with `TCP_NODELAY` and
//!   keepalive, TLS on rustls + graviola, rskafka's `Messenger`, API
//!   versions, SASL.
//! - `brokers`: one produce connection per broker, shared by the
//!   partitions it leads; each broker's throttle hold (KIP-219).
//! - `metadata`: the topic's layout and the brokers' addresses, over a
//!   connection of its own; read at first use, after a leader error, and
//!   on the pipeline's slow period.
//! - `produce`: the request (one record batch, `acks = all`, stamped when
//!   built) and what its answer says.
//! - `errors`: Kafka's error table and this layer's errors, classified.
//! - `security`: TLS configuration and what a refused connection means.
//!
//! Every call is bounded by `KAFKA_REQUEST_TIMEOUT`, connecting included
//! (a throttle hold, which the broker asked for, is waited out before the
//! clock starts). Nothing is retried inside a call: every error goes back
//! to the pipeline, which backs off per partition. An answer is never
//! followed by a resend of the records it acknowledged: a throttled answer
//! is a success.
//!
//! Why not rskafka's `Client` and `PartitionClient`: they re-send a
//! produce the broker throttled (its records were already appended, so
//! each resend is a duplicate, throttled in turn), open one connection per
//! partition client, set no socket options and take TLS only through
//! `ring` (C). Its protocol layer is public only behind a feature it marks
//! unstable: the version is pinned exactly (`rskafka = "=0.6.0"`) and the
//! scripted-broker tests (`tests.rs`) and the real-broker ones catch a
//! change on upgrade.

mod brokers;
mod connection;
mod errors;
mod metadata;
mod produce;
pub mod security;
#[cfg(test)]
mod tests;

use std::{sync::Arc, time::Duration};

use prometheus_client::metrics::{counter::Counter, family::Family};
use rskafka::protocol::{
    messages::{CreateTopicRequest, CreateTopicsRequest},
    primitives::{Int16, Int32, String_},
};
use tokio::time::Instant;

pub use crate::outbox::transport::OutgoingRecord;
use crate::{
    clock::{Clock, SystemClock},
    config::KafkaSettings,
    outbox::transport::{SendError, Transport},
    telemetry::{ErrorChain, metrics::ReasonLabel},
};
use brokers::Brokers;
pub use brokers::ThrottleMetrics;
use metadata::Metadata;

pub use errors::{ERROR_CODES, ErrorCode, KafkaError, by_code, class_of, code_of, error_name};

/// Pause between metadata reads while a topic just created appears.
const TOPIC_POLL: Duration = Duration::from_millis(50);

/// The publisher's connection to Kafka. Safe to share: requests of
/// different partitions run side by side.
pub struct KafkaTransport {
    settings: KafkaSettings,
    metadata: Metadata,
    brokers: Brokers,
    clock: Arc<dyn Clock>,
    /// Metadata reads for leaders (`leader`); the pipeline counts its own
    /// (`connect`, `periodic`).
    metadata_reads: Family<ReasonLabel, Counter>,
    throttle: ThrottleMetrics,
}

impl std::fmt::Debug for KafkaTransport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KafkaTransport")
            .field("settings", &self.settings)
            .finish_non_exhaustive()
    }
}

impl KafkaTransport {
    pub fn new(settings: KafkaSettings) -> Self {
        Self {
            metadata: Metadata::new(&settings),
            settings,
            brokers: Brokers::default(),
            clock: Arc::new(SystemClock),
            metadata_reads: Family::default(),
            throttle: ThrottleMetrics::default(),
        }
    }

    /// Counts metadata reads into `reads` (the process's
    /// `crm_booking_expiration_kafka_metadata_refreshes_total`).
    pub fn with_metadata_refreshes(mut self, reads: Family<ReasonLabel, Counter>) -> Self {
        self.metadata_reads = reads;
        self
    }

    /// Counts throttled answers into `throttle`.
    pub fn with_throttle_metrics(mut self, throttle: ThrottleMetrics) -> Self {
        self.throttle = throttle;
        self
    }

    /// Stamps records with `clock`'s time (tests).
    pub fn with_clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
    }

    /// Open produce connections per broker address (the metadata
    /// connection is not counted): one per broker while requests to it do
    /// not overlap, never more than its requests on the way at once.
    pub fn produce_connections(&self) -> Vec<(String, usize)> {
        self.brokers.open()
    }

    fn deadline(&self) -> Instant {
        Instant::now() + self.settings.request_timeout
    }

    /// The partition count of `topic`, creating the topic when it is
    /// missing and the settings allow it.
    async fn read_partitions(&self, topic: &str, deadline: Instant) -> Result<i32, KafkaError> {
        match self.metadata.read(topic, &self.settings, deadline).await {
            Ok(layout) => Ok(layout.partitions()),
            Err(KafkaError::TopicMissing(_)) if self.settings.create_topic => {
                self.create_topic(topic, deadline).await
            }
            Err(error) => {
                if matches!(error, KafkaError::TopicMissing(_)) {
                    self.metadata.forget(topic);
                }
                Err(error)
            }
        }
    }

    /// Creates `topic` (another instance may do so first) and waits until
    /// the broker lists it, by `deadline`.
    async fn create_topic(&self, topic: &str, deadline: Instant) -> Result<i32, KafkaError> {
        let timeout_ms =
            i32::try_from(self.settings.request_timeout.as_millis()).unwrap_or(i32::MAX);
        let request = || CreateTopicsRequest {
            topics: vec![CreateTopicRequest {
                name: String_(topic.to_owned()),
                num_partitions: Int32(self.settings.topic_partitions),
                replication_factor: Int16(self.settings.replication_factor),
                assignments: vec![],
                configs: vec![],
                tagged_fields: None,
            }],
            timeout_ms: Int32(timeout_ms),
            validate_only: None,
            tagged_fields: None,
        };
        // Sent to the broker of the metadata connection, which forwards it
        // to the controller (KIP-590).
        let created = self
            .metadata
            .on_connection(&self.settings, deadline, |connection| async move {
                connection
                    .request_by(
                        "create topic",
                        request(),
                        deadline,
                        self.settings.request_timeout,
                    )
                    .await
            })
            .await?;
        match created.topics.first().and_then(|t| t.error) {
            None => tracing::info!(
                topic,
                partitions = self.settings.topic_partitions,
                "topic created"
            ),
            // Another instance may have created it first; the read below decides.
            Some(error) => tracing::warn!(
                topic,
                error = %ErrorChain(&KafkaError::Broker { operation: "create topic", error, message: created.topics.first().and_then(|t| t.error_message.clone()).and_then(|m| m.0) }),
                "topic creation failed"
            ),
        }
        // A broker answers CreateTopics before its metadata lists the topic.
        loop {
            match self.metadata.read(topic, &self.settings, deadline).await {
                Ok(layout) => return Ok(layout.partitions()),
                Err(KafkaError::TopicMissing(_) | KafkaError::NoPartitions(_)) => {
                    if Instant::now() + TOPIC_POLL >= deadline {
                        return Err(KafkaError::TopicMissing(topic.to_owned()));
                    }
                    tokio::time::sleep(TOPIC_POLL).await;
                }
                Err(error) => return Err(error),
            }
        }
    }

    /// One produce request to the partition's leader: its leader looked
    /// up (read when in doubt), the broker's throttle hold waited out, the
    /// request sent on the broker's connection and its answer read.
    async fn produce_to(
        &self,
        topic: &str,
        partition: i32,
        routed: i32,
        records: Vec<OutgoingRecord>,
    ) -> Result<(), KafkaError> {
        // One bound for the call, from its start: the lookup, a connect
        // and the request share it. The broker's throttle hold is not
        // counted: the broker asked for it.
        let deadline = self.deadline();
        let endpoint = match self
            .metadata
            .leader(topic, partition, routed, &self.settings, deadline)
            .await
        {
            Ok(endpoint) => endpoint,
            Err(error) => {
                if error.leader_suspect() {
                    self.metadata.suspect(topic, partition);
                }
                return Err(error);
            }
        };
        let broker = self.brokers.get(&endpoint);
        let deadline = deadline + broker.hold().await;
        let lease = broker
            .connections
            .take(&endpoint, &self.settings, deadline)
            .await
            .inspect_err(|error| {
                if error.leader_suspect() {
                    self.metadata.suspect(topic, partition);
                }
            })?;
        let connection = lease.connection();
        let request = produce::request(
            topic,
            partition,
            records,
            self.settings.compression,
            self.clock.now(),
        );
        let answered = connection
            .request_by("produce", request, deadline, self.settings.request_timeout)
            .await;
        let result = answered.and_then(|response| {
            // Counted before the outcome: a throttled answer's records are
            // appended (or refused) like any other's.
            if let Some(hold) = produce::throttle(&response) {
                broker.throttled(hold, Instant::now(), &self.throttle);
            }
            produce::outcome(
                &response,
                topic,
                partition,
                &connection.endpoint.to_string(),
            )
        });
        // An answer (an error code included) leaves the connection idle; one
        // that broke, answered out of turn or went silent is closed.
        if !result.as_ref().is_err_and(KafkaError::connection_suspect) {
            lease.give_back();
        }
        if let Err(error) = &result
            && error.leader_suspect()
        {
            self.metadata_reads
                .get_or_create(&ReasonLabel { reason: "leader" })
                .inc();
            self.metadata.suspect(topic, partition);
        }
        result
    }
}

impl Transport for KafkaTransport {
    /// Bounded by `KAFKA_REQUEST_TIMEOUT`, connecting included; a timeout
    /// says which step was not answered (the TLS handshake, the SASL
    /// exchange, the request).
    async fn partitions(&self, topic: &str) -> Result<i32, SendError> {
        let deadline = self.deadline();
        let read = tokio::time::timeout_at(deadline, self.read_partitions(topic, deadline)).await;
        read.unwrap_or_else(|_| {
            Err(KafkaError::Timeout {
                operation: "metadata".into(),
                timeout: self.settings.request_timeout,
            })
        })
        .map_err(|error| error.to_send_error())
    }

    /// Bounded by `KAFKA_REQUEST_TIMEOUT` (longer than the broker's own
    /// produce timeout, so a live broker answers first) once the broker's
    /// throttle hold is over; a request cut short has its connection given
    /// up and its partition's leader looked up again.
    async fn produce(
        &self,
        topic: &str,
        partition: i32,
        partitions: i32,
        records: Vec<OutgoingRecord>,
    ) -> Result<(), SendError> {
        if records.is_empty() {
            return Ok(());
        }
        self.produce_to(topic, partition, partitions, records)
            .await
            .map_err(|error| error.to_send_error())
    }
}
