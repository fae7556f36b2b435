//! The Kafka side of the publisher, on rskafka: each call bounded by one
//! request timeout whatever steps it takes, keyed partitioning that agrees
//! with the Java client, and a connection that is rebuilt from scratch
//! after any failure.

use std::{
    collections::{BTreeMap, HashMap},
    sync::Arc,
    time::{Duration, Instant},
};

use booking_expired_proto::partition_for_key;
use futures_util::future::try_join_all;
use rskafka::{
    BackoffConfig,
    client::{
        Client, ClientBuilder, Credentials, SaslConfig,
        partition::{Compression as KafkaCompression, PartitionClient, UnknownTopicHandling},
    },
    record::Record,
};
use tokio::sync::Mutex;

pub use super::sink::OutgoingRecord;
use super::sink::{Sink, SinkError};
use crate::{
    config::{Compression, KafkaSettings, SaslMechanism},
    telemetry::ErrorChain,
};

/// Pause between metadata lookups while a topic just created appears.
const TOPIC_POLL: Duration = Duration::from_millis(50);

/// How long a topic's partition count is trusted before it is looked up again.
const METADATA_TTL: Duration = Duration::from_secs(60);

/// Errors of the Kafka layer.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum KafkaError {
    #[error("cannot reach Kafka at {servers}")]
    Connect {
        servers: String,
        #[source]
        source: rskafka::client::error::Error,
    },
    #[error("topic {0:?} does not exist (create it, or set KAFKA_CREATE_TOPIC=true)")]
    TopicMissing(String),
    #[error("topic {0:?} has no partitions")]
    NoPartitions(String),
    #[error("Kafka {operation} timed out after {timeout:?}")]
    Timeout {
        operation: &'static str,
        timeout: Duration,
    },
    #[error("Kafka {operation} failed")]
    Request {
        operation: &'static str,
        #[source]
        source: rskafka::client::error::Error,
    },
    #[error("broker acknowledged {acked} of {sent} records on partition {partition}")]
    ShortAck {
        partition: i32,
        sent: usize,
        acked: usize,
    },
}

/// The time budget of one call. Every step of a call (waiting for the
/// connection, connect, metadata, topic creation, leader lookups, produce)
/// runs against the same deadline, so a call on a fresh connection takes at
/// most one `KAFKA_REQUEST_TIMEOUT`, not one per step.
#[derive(Debug, Clone, Copy)]
struct Budget {
    deadline: tokio::time::Instant,
    timeout: Duration,
}

impl Budget {
    fn start(timeout: Duration) -> Self {
        Self {
            deadline: tokio::time::Instant::now() + timeout,
            timeout,
        }
    }

    fn remaining(&self) -> Duration {
        self.deadline
            .saturating_duration_since(tokio::time::Instant::now())
    }

    fn timed_out(&self, operation: &'static str) -> KafkaError {
        KafkaError::Timeout {
            operation,
            timeout: self.timeout,
        }
    }

    /// Runs one step of the call within what is left of the budget.
    async fn step<T>(
        &self,
        operation: &'static str,
        future: impl Future<Output = Result<T, rskafka::client::error::Error>>,
    ) -> Result<T, KafkaError> {
        match tokio::time::timeout_at(self.deadline, future).await {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(source)) => Err(KafkaError::Request { operation, source }),
            Err(_) => Err(self.timed_out(operation)),
        }
    }
}

struct TopicPartitions {
    partitions: Vec<Arc<PartitionClient>>,
    fetched_at: Instant,
}

struct Connection {
    client: Client,
    topics: HashMap<String, TopicPartitions>,
}

/// A lazily connected producer. Safe to share; produce calls are serialised
/// (batches meant to overlap each get a [`Sink::sibling`]).
pub struct KafkaSink {
    settings: KafkaSettings,
    connection: Mutex<Option<Connection>>,
}

impl std::fmt::Debug for KafkaSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KafkaSink")
            .field("settings", &self.settings)
            .finish_non_exhaustive()
    }
}

impl KafkaSink {
    pub fn new(settings: KafkaSettings) -> Self {
        Self {
            settings,
            connection: Mutex::new(None),
        }
    }

    fn compression(&self) -> KafkaCompression {
        match self.settings.compression {
            Compression::None => KafkaCompression::NoCompression,
            Compression::Gzip => KafkaCompression::Gzip,
            Compression::Snappy => KafkaCompression::Snappy,
            #[cfg(feature = "kafka-lz4")]
            Compression::Lz4 => KafkaCompression::Lz4,
            #[cfg(feature = "kafka-zstd")]
            Compression::Zstd => KafkaCompression::Zstd,
        }
    }

    async fn connect(&self, budget: &Budget) -> Result<Client, KafkaError> {
        // rskafka retries forever by default; the deadline turns a dead
        // broker into an error the publisher can count and back off from.
        // It is the client's for its whole life (its partition clients
        // retry with it too); each call's own budget cuts in first anyway.
        let backoff = BackoffConfig {
            init_backoff: Duration::from_millis(50),
            max_backoff: Duration::from_secs(1),
            base: 2.0,
            deadline: Some(self.settings.request_timeout),
        };
        let mut builder = ClientBuilder::new(self.settings.bootstrap_servers.clone())
            .client_id(self.settings.client_id.clone())
            .backoff_config(backoff);
        if let Some(sasl) = &self.settings.sasl {
            let credentials = Credentials::new(sasl.username.clone(), sasl.password.clone());
            builder = builder.sasl_config(match sasl.mechanism {
                SaslMechanism::Plain => SaslConfig::Plain(credentials),
                SaslMechanism::ScramSha256 => SaslConfig::ScramSha256(credentials),
                SaslMechanism::ScramSha512 => SaslConfig::ScramSha512(credentials),
            });
        }
        let servers = self.settings.bootstrap_servers.join(",");
        match tokio::time::timeout_at(budget.deadline, builder.build()).await {
            Ok(Ok(client)) => Ok(client),
            Ok(Err(source)) => Err(KafkaError::Connect { servers, source }),
            Err(_) => Err(budget.timed_out("connect")),
        }
    }

    async fn partition_count(
        &self,
        client: &Client,
        topic: &str,
        budget: &Budget,
    ) -> Result<Option<usize>, KafkaError> {
        let topics = budget.step("metadata", client.list_topics()).await?;
        Ok(topics
            .into_iter()
            .find(|t| t.name == topic)
            .map(|t| t.partitions.len()))
    }

    async fn load_topic(
        &self,
        client: &Client,
        topic: &str,
        budget: &Budget,
    ) -> Result<TopicPartitions, KafkaError> {
        let mut count = self.partition_count(client, topic, budget).await?;
        if count.is_none() && self.settings.create_topic {
            let controller = client
                .controller_client()
                .map_err(|source| KafkaError::Request {
                    operation: "create topic",
                    source,
                })?;
            let timeout_ms = i32::try_from(budget.remaining().as_millis()).unwrap_or(i32::MAX);
            let created = budget
                .step(
                    "create topic",
                    controller.create_topic(
                        topic,
                        self.settings.topic_partitions,
                        self.settings.replication_factor,
                        timeout_ms,
                    ),
                )
                .await;
            match created {
                Ok(()) => tracing::info!(
                    topic,
                    partitions = self.settings.topic_partitions,
                    "topic created"
                ),
                // Another instance may have created it first; the lookup below decides.
                Err(error) => {
                    tracing::warn!(topic, error = %ErrorChain(&error), "topic creation failed")
                }
            }
            // A broker answers CreateTopics before its metadata cache lists
            // the new topic: look again until it does or the budget ends.
            loop {
                count = self.partition_count(client, topic, budget).await?;
                if count.is_some_and(|n| n > 0) || budget.remaining() < TOPIC_POLL {
                    break;
                }
                tokio::time::sleep(TOPIC_POLL).await;
            }
        }
        let count = count.ok_or_else(|| KafkaError::TopicMissing(topic.to_owned()))?;
        if count == 0 {
            return Err(KafkaError::NoPartitions(topic.to_owned()));
        }
        let mut partitions = Vec::with_capacity(count);
        for partition in 0..count as i32 {
            let client = budget
                .step(
                    "leader lookup",
                    client.partition_client(topic, partition, UnknownTopicHandling::Error),
                )
                .await?;
            partitions.push(Arc::new(client));
        }
        Ok(TopicPartitions {
            partitions,
            fetched_at: Instant::now(),
        })
    }

    /// Checks that the broker answers and the topic exists (creating it
    /// when allowed); returns its partition count.
    pub async fn check_topic(&self, topic: &str) -> Result<usize, KafkaError> {
        let budget = Budget::start(self.settings.request_timeout);
        let mut guard = self.lock(&budget).await?;
        let result = self
            .partitions_locked(&mut guard, topic, &budget)
            .await
            .map(|p| p.len());
        if result.is_err() {
            *guard = None;
        }
        result
    }

    /// The connection, waited for within the call's budget (another call
    /// on this sink may hold it).
    async fn lock(
        &self,
        budget: &Budget,
    ) -> Result<tokio::sync::MutexGuard<'_, Option<Connection>>, KafkaError> {
        tokio::time::timeout_at(budget.deadline, self.connection.lock())
            .await
            .map_err(|_| budget.timed_out("connection wait"))
    }

    async fn partitions_locked(
        &self,
        guard: &mut Option<Connection>,
        topic: &str,
        budget: &Budget,
    ) -> Result<Vec<Arc<PartitionClient>>, KafkaError> {
        if guard.is_none() {
            *guard = Some(Connection {
                client: self.connect(budget).await?,
                topics: HashMap::new(),
            });
        }
        let Some(connection) = guard.as_mut() else {
            unreachable!("connection was just set");
        };
        let fresh = connection
            .topics
            .get(topic)
            .is_some_and(|t| t.fetched_at.elapsed() < METADATA_TTL);
        if !fresh {
            let loaded = self.load_topic(&connection.client, topic, budget).await?;
            if let Some(previous) = connection.topics.get(topic)
                && previous.partitions.len() != loaded.partitions.len()
            {
                tracing::warn!(
                    topic,
                    before = previous.partitions.len(),
                    after = loaded.partitions.len(),
                    "partition count changed; keys map to new partitions from now on"
                );
            }
            connection.topics.insert(topic.to_owned(), loaded);
        }
        Ok(connection.topics[topic].partitions.clone())
    }

    /// Produces records to `topic`, each to the partition the Java client
    /// would choose for its key, and returns once every partition's leader
    /// acknowledged (acks = all). The whole call, connection setup
    /// included, takes at most one request timeout. Any failure drops the
    /// connection so the next call starts from fresh metadata.
    pub async fn produce(
        &self,
        topic: &str,
        records: Vec<OutgoingRecord>,
    ) -> Result<(), KafkaError> {
        if records.is_empty() {
            return Ok(());
        }
        let budget = Budget::start(self.settings.request_timeout);
        let mut guard = self.lock(&budget).await?;
        let result = self
            .produce_locked(&mut guard, topic, records, &budget)
            .await;
        if result.is_err() {
            *guard = None;
        }
        result
    }

    async fn produce_locked(
        &self,
        guard: &mut Option<Connection>,
        topic: &str,
        records: Vec<OutgoingRecord>,
        budget: &Budget,
    ) -> Result<(), KafkaError> {
        let partitions = self.partitions_locked(guard, topic, budget).await?;
        let count = partitions.len() as i32;
        let mut by_partition: BTreeMap<i32, Vec<Record>> = BTreeMap::new();
        for record in records {
            let partition = partition_for_key(record.key.as_bytes(), count);
            by_partition.entry(partition).or_default().push(Record {
                key: Some(record.key.into_bytes()),
                value: Some(record.value),
                headers: record.headers,
                timestamp: record.timestamp,
            });
        }
        let compression = self.compression();
        let sends = by_partition.into_iter().map(|(partition, records)| {
            let client = Arc::clone(&partitions[partition as usize]);
            async move {
                let sent = records.len();
                let offsets = budget
                    .step("produce", client.produce(records, compression))
                    .await?;
                if offsets.len() != sent {
                    return Err(KafkaError::ShortAck {
                        partition,
                        sent,
                        acked: offsets.len(),
                    });
                }
                Ok(())
            }
        });
        try_join_all(sends).await?;
        Ok(())
    }
}

impl Sink for KafkaSink {
    async fn produce(&self, topic: &str, records: Vec<OutgoingRecord>) -> Result<(), SinkError> {
        Ok(KafkaSink::produce(self, topic, records).await?)
    }

    async fn check_topic(&self, topic: &str) -> Result<usize, SinkError> {
        Ok(KafkaSink::check_topic(self, topic).await?)
    }

    /// Same settings, its own connection (see [`Sink::sibling`]).
    fn sibling(&self) -> Self {
        Self::new(self.settings.clone())
    }
}
