//! The Kafka side of the publisher, on rskafka: each call bounded by one
//! request timeout whatever steps it takes, keyed partitioning that agrees
//! with the Java client, a partition whose produce fails retried against
//! its leader looked up again from fresh metadata (within the same call),
//! the topic's partition count re-read every [`METADATA_MAX_AGE`], and a
//! connection that is rebuilt from scratch after a call that failed.
//!
//! Why the sink retries itself: rskafka's own retry loops (produce, leader
//! detection) keep going until their backoff deadline, and after a leader
//! died they kept reconnecting to its address for that long. Their deadline
//! is now short ([`RSKAFKA_RETRY_DEADLINE`]); the sink then refreshes the
//! client's metadata (rskafka keeps a cached copy it fails to drop when a
//! broker answers that it no longer leads: during a controlled shutdown it
//! kept sending to the old leader until that broker closed its port),
//! builds a new partition client, which finds the partition's leader in
//! that fresh metadata, and sends again, every [`RETRY_MIN`]..[`RETRY_MAX`]
//! while the call's budget lasts.

use std::{
    collections::{BTreeMap, HashMap},
    sync::Arc,
    time::{Duration, Instant},
};

use booking_expired_proto::partition_for_key;
use futures_util::future::join_all;
use prometheus_client::metrics::{counter::Counter, family::Family};
use rskafka::{
    BackoffConfig,
    client::{
        Client, ClientBuilder, Credentials, SaslConfig,
        error::{Error as ClientError, ProtocolError},
        partition::{Compression as KafkaCompression, PartitionClient, UnknownTopicHandling},
    },
    record::Record,
};
use tokio::sync::Mutex;

pub use super::sink::OutgoingRecord;
use super::{
    kafka_tls::{SecurityError, TlsBridge, connect_operation, security_failure},
    sink::{Delivery, Produced, Refusal, Sink, SinkError},
};
use crate::{
    config::{Compression, KafkaSettings, SaslMechanism},
    telemetry::{ErrorChain, metrics::ReasonLabel},
};

/// Pause between metadata lookups while a topic just created appears.
const TOPIC_POLL: Duration = Duration::from_millis(50);

/// How long a topic's partition count is trusted: the first call after
/// this re-reads it (one metadata request), so partitions added to the
/// topic get records at most this long (plus one call) after they appear.
/// Kafka's Java producer uses `metadata.max.age.ms` (5 min by default) for
/// the same; a metadata request every 10 s costs nothing.
pub const METADATA_MAX_AGE: Duration = Duration::from_secs(10);

/// First pause of rskafka's own retry loops.
const RSKAFKA_RETRY_FIRST: Duration = Duration::from_millis(10);

/// Deadline of rskafka's own retry loops (the sum of their backoff
/// sleeps): one or two quick retries (a broken connection to the broker it
/// asks for metadata is replaced), then a produce or a leader lookup that
/// still fails comes back to the sink, which refreshes the metadata and
/// looks the leader up afresh. rskafka's retry of NOT_LEADER_OR_FOLLOWER
/// asks its stale metadata cache again, so a longer deadline only delays.
const RSKAFKA_RETRY_DEADLINE: Duration = Duration::from_millis(30);

/// First pause before the sink retries a partition whose produce failed
/// (after a leader change the new leader is usually known at once).
pub const RETRY_MIN: Duration = Duration::from_millis(20);

/// Longest pause between the sink's retries of a partition.
pub const RETRY_MAX: Duration = Duration::from_millis(500);

/// A retry is not started with less of the call's budget left than this.
const RETRY_FLOOR: Duration = Duration::from_millis(250);

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
    /// TLS or SASL refused the connection (the text names the setting).
    #[error(transparent)]
    Security(#[from] SecurityError),
}

impl KafkaError {
    /// The Kafka error name when the broker answered with an error code
    /// (`MESSAGE_TOO_LARGE`, `NOT_ENOUGH_REPLICAS`, …), otherwise a
    /// `CLIENT_…` name for what failed on this side.
    pub fn code(&self) -> String {
        match self {
            KafkaError::Request { source, .. } | KafkaError::Connect { source, .. } => {
                match server_error(source) {
                    Some(error) => error_name(error),
                    None if matches!(self, KafkaError::Connect { .. }) => "CLIENT_CONNECT".into(),
                    None => "CLIENT_REQUEST".into(),
                }
            }
            KafkaError::TopicMissing(_) => "UNKNOWN_TOPIC_OR_PARTITION".into(),
            KafkaError::NoPartitions(_) => "CLIENT_NO_PARTITIONS".into(),
            KafkaError::Timeout { .. } => "CLIENT_TIMEOUT".into(),
            KafkaError::ShortAck { .. } => "CLIENT_SHORT_ACK".into(),
            KafkaError::Security(_) => "CLIENT_SECURITY".into(),
        }
    }

    /// The broker refused the records for a reason no retry fixes: the
    /// record itself is at fault, not the cluster's state or this client's
    /// settings ([`super::kafka_errors`], Kafka's own classification).
    fn refusal(&self) -> Option<ProtocolError> {
        let KafkaError::Request { source, .. } = self else {
            return None;
        };
        let error = server_error(source)?;
        (super::kafka_errors::disposition(error) == super::kafka_errors::Disposition::Refuse)
            .then_some(*error)
    }
}

/// The broker's error code inside a client error, if it carries one.
fn server_error(error: &ClientError) -> Option<&ProtocolError> {
    match error {
        ClientError::ServerError { protocol_error, .. } => Some(protocol_error),
        _ => None,
    }
}

/// The Kafka name of an error code: `MessageTooLarge` → `MESSAGE_TOO_LARGE`.
pub fn error_name(error: &ProtocolError) -> String {
    if let ProtocolError::Unknown(code) = error {
        return format!("UNKNOWN_CODE_{code}");
    }
    let camel = format!("{error:?}");
    let mut name = String::with_capacity(camel.len() + 8);
    for (i, c) in camel.chars().enumerate() {
        if i > 0 && c.is_ascii_uppercase() {
            name.push('_');
        }
        name.push(c.to_ascii_uppercase());
    }
    name
}

/// What one partition's produce did, record by record (by index into the
/// call's records).
#[derive(Default)]
struct PartitionOutcome {
    partition: i32,
    deliveries: Vec<(usize, Delivery)>,
    error: Option<KafkaError>,
    error_codes: Vec<String>,
    /// A partition client built during the call (the leader looked up
    /// again), to keep for the next calls.
    replaced: Option<Arc<PartitionClient>>,
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
    /// Metadata lookups by reason (`connect`, `periodic`, `leader`).
    metadata_refreshes: Family<ReasonLabel, Counter>,
    /// The in-process TLS bridge (`SSL`, `SASL_SSL`), started at the first
    /// connect and shared with siblings.
    tls_bridge: Arc<tokio::sync::OnceCell<TlsBridge>>,
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
            metadata_refreshes: Family::default(),
            tls_bridge: Arc::default(),
        }
    }

    /// Counts metadata lookups into `refreshes` (the process's
    /// `crm_booking_expiration_kafka_metadata_refreshes_total`).
    pub fn with_metadata_refreshes(mut self, refreshes: Family<ReasonLabel, Counter>) -> Self {
        self.metadata_refreshes = refreshes;
        self
    }

    fn count_refresh(&self, reason: &'static str) {
        self.metadata_refreshes
            .get_or_create(&ReasonLabel { reason })
            .inc();
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
        // broker into an error. It is the client's for its whole life (its
        // partition clients retry with it too) and short: the sink retries
        // a failed partition itself, from fresh metadata (module docs).
        let backoff = BackoffConfig {
            init_backoff: RSKAFKA_RETRY_FIRST,
            max_backoff: RSKAFKA_RETRY_DEADLINE,
            base: 2.0,
            deadline: Some(RSKAFKA_RETRY_DEADLINE.min(self.settings.request_timeout)),
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
        let bridge = match &self.settings.tls {
            None => None,
            Some(tls) => {
                let bridge = self
                    .tls_bridge
                    .get_or_try_init(|| TlsBridge::start(tls, &self.settings))
                    .await?;
                builder = builder.socks5_proxy(bridge.proxy_for_new_connect());
                Some(bridge)
            }
        };
        let servers = self.settings.bootstrap_servers.join(",");
        // A TLS or SASL refusal is reported as such, naming its setting.
        let security = |source| security_failure(&self.settings, bridge, source);
        match tokio::time::timeout_at(budget.deadline, builder.build()).await {
            Ok(Ok(client)) => Ok(client),
            Ok(Err(source)) => Err(match security(Some(&source)) {
                Some(error) => error.into(),
                None => KafkaError::Connect { servers, source },
            }),
            Err(_) => Err(match security(None) {
                Some(error) => error.into(),
                None => budget.timed_out(connect_operation(&self.settings)),
            }),
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
        match connection.topics.get_mut(topic) {
            None => {
                self.count_refresh("connect");
                let loaded = self.load_topic(&connection.client, topic, budget).await?;
                connection.topics.insert(topic.to_owned(), loaded);
            }
            Some(known) if known.fetched_at.elapsed() >= METADATA_MAX_AGE => {
                // Only the count is re-read: the partition clients follow
                // their leaders on their own (and are rebuilt on failures).
                self.count_refresh("periodic");
                let before = known.partitions.len();
                let count = self
                    .partition_count(&connection.client, topic, budget)
                    .await?
                    .ok_or_else(|| KafkaError::TopicMissing(topic.to_owned()))?;
                if count < before {
                    // Kafka never shrinks a topic; a recreated one starts over.
                    let loaded = self.load_topic(&connection.client, topic, budget).await?;
                    *known = loaded;
                } else {
                    for partition in before..count {
                        let client = budget
                            .step(
                                "leader lookup",
                                connection.client.partition_client(
                                    topic,
                                    partition as i32,
                                    UnknownTopicHandling::Retry,
                                ),
                            )
                            .await?;
                        known.partitions.push(Arc::new(client));
                    }
                    known.fetched_at = Instant::now();
                }
                if count != before {
                    tracing::warn!(
                        topic,
                        before,
                        after = count,
                        "partition count changed; keys map to new partitions from now on"
                    );
                }
            }
            Some(_) => {}
        }
        Ok(connection.topics[topic].partitions.clone())
    }

    /// Produces records to `topic`, each to the partition the Java client
    /// would choose for its key, one request per partition (acks = all),
    /// and reports each record's fate. The whole call, connection setup
    /// and splits included, takes at most one request timeout.
    ///
    /// A request the broker refuses as too large (or as holding an
    /// invalid or corrupt record) is split in halves, each sent on its own,
    /// down to single records, as the Java producer splits a batch: every
    /// record that fits gets through and only the record at fault is
    /// [`Delivery::Refused`]. Any other failure leaves that partition's
    /// remaining records [`Delivery::Pending`] and drops the connection so
    /// the next call starts from fresh metadata; other partitions' acks
    /// still count.
    pub async fn produce(&self, topic: &str, records: Vec<OutgoingRecord>) -> Produced {
        if records.is_empty() {
            return Produced::all_acked(0);
        }
        let n = records.len();
        let budget = Budget::start(self.settings.request_timeout);
        let mut guard = match self.lock(&budget).await {
            Ok(guard) => guard,
            Err(error) => return Produced::failed(n, error.into()),
        };
        let partitions = match self.partitions_locked(&mut guard, topic, &budget).await {
            Ok(partitions) => partitions,
            Err(error) => {
                *guard = None;
                return Produced::failed(n, error.into());
            }
        };
        let Some(connection) = guard.as_mut() else {
            unreachable!("partitions_locked connected");
        };
        let (produced, replaced) = self
            .produce_to(&connection.client, &partitions, topic, records, &budget)
            .await;
        if produced.error.is_some() {
            *guard = None;
        } else if let Some(known) = connection.topics.get_mut(topic) {
            for (partition, client) in replaced {
                if let Some(slot) = known.partitions.get_mut(partition as usize) {
                    *slot = client;
                }
            }
        }
        produced
    }

    async fn produce_to(
        &self,
        client: &Client,
        partitions: &[Arc<PartitionClient>],
        topic: &str,
        records: Vec<OutgoingRecord>,
        budget: &Budget,
    ) -> (Produced, Vec<(i32, Arc<PartitionClient>)>) {
        let n = records.len();
        let count = partitions.len() as i32;
        let mut by_partition: BTreeMap<i32, Vec<(usize, Record)>> = BTreeMap::new();
        for (index, record) in records.into_iter().enumerate() {
            let partition = partition_for_key(record.key.as_bytes(), count);
            by_partition.entry(partition).or_default().push((
                index,
                Record {
                    key: Some(record.key.into_bytes()),
                    value: Some(record.value),
                    headers: record.headers,
                    timestamp: record.timestamp,
                },
            ));
        }
        let compression = self.compression();
        let refreshed = Mutex::new(None);
        let refreshed = &refreshed;
        let sends = by_partition.into_iter().map(|(partition, records)| {
            let current = Arc::clone(&partitions[partition as usize]);
            let target = Target {
                client,
                topic,
                partition,
                compression,
                budget,
                sink: self,
                refreshed,
            };
            async move { produce_partition(target, current, records).await }
        });
        let mut produced = Produced {
            deliveries: vec![Delivery::Pending; n],
            error: None,
            error_codes: Vec::new(),
        };
        let mut replaced = Vec::new();
        for outcome in join_all(sends).await {
            if let Some(client) = outcome.replaced {
                replaced.push((outcome.partition, client));
            }
            for (index, delivery) in outcome.deliveries {
                produced.deliveries[index] = delivery;
            }
            produced.error_codes.extend(outcome.error_codes);
            if produced.error.is_none()
                && let Some(error) = outcome.error
            {
                produced.error = Some(error.into());
            }
        }
        (produced, replaced)
    }
}

/// Where one partition's records go, and what a retry needs.
#[derive(Clone, Copy)]
struct Target<'a> {
    client: &'a Client,
    topic: &'a str,
    partition: i32,
    compression: KafkaCompression,
    budget: &'a Budget,
    sink: &'a KafkaSink,
    /// When the last metadata refresh of this call started: partitions
    /// that failed together share one refresh.
    refreshed: &'a Mutex<Option<tokio::time::Instant>>,
}

/// Whether the leader is looked up again before retrying after `error`:
/// yes, unless the broker answered as the leader and only lacks replicas
/// or asks to slow down.
fn leader_suspect(error: &KafkaError) -> bool {
    let KafkaError::Request { source, .. } = error else {
        return true;
    };
    !matches!(
        server_error(source),
        Some(
            ProtocolError::NotEnoughReplicas
                | ProtocolError::NotEnoughReplicasAfterAppend
                | ProtocolError::ThrottlingQuotaExceeded
                | ProtocolError::PolicyViolation
        )
    )
}

/// Refreshes `client`'s metadata cache (a full metadata request, which is
/// what `list_topics` sends) unless a refresh started after `failed_at`:
/// partitions of one call that failed together wait for the refresh in
/// flight and use it.
async fn refresh_metadata(
    client: &Client,
    budget: &Budget,
    refreshed: &Mutex<Option<tokio::time::Instant>>,
    failed_at: tokio::time::Instant,
) -> Result<(), KafkaError> {
    let mut last = tokio::time::timeout_at(budget.deadline, refreshed.lock())
        .await
        .map_err(|_| budget.timed_out("metadata"))?;
    if last.is_some_and(|started| started > failed_at) {
        return Ok(());
    }
    let started = tokio::time::Instant::now();
    budget.step("metadata", client.list_topics()).await?;
    *last = Some(started);
    Ok(())
}

/// Produces one partition's records: one request, split in halves while
/// the broker refuses a multi-record request for a reason that is about
/// the records (see [`KafkaError::refusal`]); a single record refused so
/// is [`Delivery::Refused`]. Any other failure is retried after a short
/// pause ([`RETRY_MIN`] doubling to [`RETRY_MAX`]), through a partition
/// client built afresh from freshly requested metadata (a live broker
/// names the current leader) unless the leader itself answered (see [`leader_suspect`]), while the
/// call's budget lasts; then the rest stay [`Delivery::Pending`]. Halves
/// go in order, so the partition's records keep their order. A retry
/// after a lost answer can write a record twice (same `ce_id`, same bytes).
async fn produce_partition(
    target: Target<'_>,
    mut current: Arc<PartitionClient>,
    records: Vec<(usize, Record)>,
) -> PartitionOutcome {
    let Target {
        client,
        topic,
        partition,
        compression,
        budget,
        sink,
        refreshed,
    } = target;
    let mut outcome = PartitionOutcome {
        partition,
        ..PartitionOutcome::default()
    };
    let mut pause = RETRY_MIN;
    let mut find_leader = false;
    let mut failed_at = tokio::time::Instant::now();
    // Chunks still to send, the next one last.
    let mut chunks = vec![records];
    while let Some(mut chunk) = chunks.pop() {
        if outcome.error.is_some() {
            outcome
                .deliveries
                .extend(chunk.into_iter().map(|(i, _)| (i, Delivery::Pending)));
            continue;
        }
        let sent = chunk.len();
        let batch: Vec<Record> = chunk.iter().map(|(_, record)| record.clone()).collect();
        let mut attempt = Ok(());
        if find_leader {
            sink.count_refresh("leader");
            // rskafka finds a leader in its cached metadata, which it fails
            // to drop when a broker says it no longer leads (it did so for
            // as long as the old leader kept its port open, 1–1.5 s of a
            // controlled shutdown): a full metadata request (what
            // `list_topics` sends) replaces that cache first.
            attempt = refresh_metadata(client, budget, refreshed, failed_at).await;
            if attempt.is_ok() {
                attempt = budget
                    .step(
                        "leader lookup",
                        client.partition_client(topic, partition, UnknownTopicHandling::Retry),
                    )
                    .await
                    .map(|fresh| {
                        current = Arc::new(fresh);
                        outcome.replaced = Some(Arc::clone(&current));
                        find_leader = false;
                    });
            }
        }
        let result = match attempt {
            Ok(()) => {
                budget
                    .step("produce", current.produce(batch, compression))
                    .await
            }
            Err(error) => Err(error),
        };
        let error = match result {
            Ok(offsets) if offsets.len() == sent => {
                outcome
                    .deliveries
                    .extend(chunk.into_iter().map(|(i, _)| (i, Delivery::Acked)));
                continue;
            }
            Ok(offsets) => KafkaError::ShortAck {
                partition,
                sent,
                acked: offsets.len(),
            },
            Err(error) => error,
        };
        let code = error.code();
        outcome.error_codes.push(code.clone());
        match error.refusal() {
            Some(_) if sent > 1 => {
                tracing::info!(
                    topic,
                    partition,
                    records = sent,
                    code,
                    "produce request refused; splitting it"
                );
                let second = chunk.split_off(sent / 2);
                chunks.push(second);
                chunks.push(chunk);
            }
            Some(_) => {
                let (index, record) = &chunk[0];
                let bytes = record.approximate_size();
                let refusal = Refusal {
                    code,
                    message: format!(
                        "the broker refused this record ({bytes} bytes) on its own, on partition {partition} of topic {topic}"
                    ),
                };
                tracing::warn!(topic, partition, bytes, reason = %refusal, "record refused by the broker");
                outcome
                    .deliveries
                    .push((*index, Delivery::Refused(refusal)));
            }
            None if !matches!(error, KafkaError::Timeout { .. })
                && budget.remaining() > pause + RETRY_FLOOR =>
            {
                find_leader = leader_suspect(&error);
                tracing::info!(
                    topic,
                    partition,
                    code,
                    error = %ErrorChain(&error),
                    retry_in_ms = pause.as_millis() as u64,
                    find_leader,
                    "produce failed; retrying"
                );
                failed_at = tokio::time::Instant::now();
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(RETRY_MAX);
                chunks.push(chunk);
            }
            None => {
                outcome
                    .deliveries
                    .extend(chunk.into_iter().map(|(i, _)| (i, Delivery::Pending)));
                outcome.error = Some(error);
            }
        }
    }
    outcome
}

impl Sink for KafkaSink {
    async fn produce(&self, topic: &str, records: Vec<OutgoingRecord>) -> Produced {
        KafkaSink::produce(self, topic, records).await
    }

    async fn check_topic(&self, topic: &str) -> Result<usize, SinkError> {
        Ok(KafkaSink::check_topic(self, topic).await?)
    }

    /// Same settings, its own connection (see [`Sink::sibling`]).
    fn sibling(&self) -> Self {
        Self {
            tls_bridge: Arc::clone(&self.tls_bridge),
            ..Self::new(self.settings.clone())
        }
        .with_metadata_refreshes(self.metadata_refreshes.clone())
    }
}

#[cfg(test)]
mod tests {
    use rskafka::client::error::RequestContext;

    use super::*;

    fn server(protocol_error: ProtocolError) -> KafkaError {
        KafkaError::Request {
            operation: "produce",
            source: ClientError::ServerError {
                protocol_error,
                error_message: None,
                request: RequestContext::Partition("t".into(), 0),
                response: None,
                is_virtual: false,
            },
        }
    }

    #[test]
    fn error_codes_carry_kafka_names() {
        assert_eq!(
            server(ProtocolError::MessageTooLarge).code(),
            "MESSAGE_TOO_LARGE"
        );
        assert_eq!(
            server(ProtocolError::NotEnoughReplicas).code(),
            "NOT_ENOUGH_REPLICAS"
        );
        assert_eq!(
            server(ProtocolError::NotLeaderOrFollower).code(),
            "NOT_LEADER_OR_FOLLOWER"
        );
        assert_eq!(
            server(ProtocolError::Unknown(999)).code(),
            "UNKNOWN_CODE_999"
        );
        let timeout = KafkaError::Timeout {
            operation: "produce",
            timeout: Duration::from_secs(1),
        };
        assert_eq!(timeout.code(), "CLIENT_TIMEOUT");
    }

    #[test]
    fn the_leader_is_looked_up_again_unless_it_answered_as_leader() {
        for suspect in [
            ProtocolError::NotLeaderOrFollower,
            ProtocolError::LeaderNotAvailable,
            ProtocolError::UnknownTopicOrPartition,
            ProtocolError::RequestTimedOut,
        ] {
            assert!(leader_suspect(&server(suspect)), "{suspect:?}");
        }
        for leader_fine in [
            ProtocolError::NotEnoughReplicas,
            ProtocolError::NotEnoughReplicasAfterAppend,
            ProtocolError::ThrottlingQuotaExceeded,
        ] {
            assert!(!leader_suspect(&server(leader_fine)), "{leader_fine:?}");
        }
        let timeout = KafkaError::Timeout {
            operation: "produce",
            timeout: Duration::from_secs(1),
        };
        assert!(leader_suspect(&timeout));
    }

    #[test]
    fn only_errors_about_the_records_are_refusals() {
        for permanent in [
            ProtocolError::MessageTooLarge,
            ProtocolError::RecordListTooLarge,
            ProtocolError::InvalidRecord,
            ProtocolError::InvalidTimestamp,
        ] {
            assert_eq!(server(permanent).refusal(), Some(permanent));
        }
        for retriable in [
            ProtocolError::NotLeaderOrFollower,
            ProtocolError::LeaderNotAvailable,
            ProtocolError::NotEnoughReplicas,
            ProtocolError::NotEnoughReplicasAfterAppend,
            ProtocolError::RequestTimedOut,
            ProtocolError::ThrottlingQuotaExceeded,
            ProtocolError::NetworkException,
            ProtocolError::UnknownTopicOrPartition,
            ProtocolError::TopicAuthorizationFailed,
            // Kafka retries a CRC mismatch (issue 25: it parked rows).
            ProtocolError::CorruptMessage,
        ] {
            assert_eq!(server(retriable).refusal(), None, "{retriable:?}");
        }
        let timeout = KafkaError::Timeout {
            operation: "produce",
            timeout: Duration::from_secs(1),
        };
        assert_eq!(timeout.refusal(), None);
    }
}
