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
//! that fresh metadata, and sends again after a jittered pause (the shared
//! `Backoff`, [`RETRY_MIN`] doubling to [`RETRY_MAX`]) while the call's
//! budget lasts.
//!
//! Partitions do not wait for each other: once one partition of a call is
//! acknowledged, a partition still failing or unanswered gets
//! [`STRAGGLER_GRACE`] (or as long again as the first one took, up to
//! 500 ms) and is then cut short. Its records stay pending for the next
//! batch, the others' acknowledgements count, and the connection stays
//! (only that partition's leader is looked up again first, and its retry
//! pause goes on growing from where the cut call left it), so a leader
//! moving off one broker stalls that broker's partitions, not the topic.

mod errors;
mod produce;
pub mod tls_bridge;

use std::{
    collections::{BTreeMap, HashMap},
    sync::Arc,
    time::{Duration, Instant},
};

use booking_expired_proto::partition_for_key;
use futures_util::{StreamExt, stream::FuturesUnordered};
use prometheus_client::metrics::{counter::Counter, family::Family};
use rskafka::{
    BackoffConfig,
    client::{
        Client, ClientBuilder, Credentials, SaslConfig,
        partition::{Compression as KafkaCompression, PartitionClient, UnknownTopicHandling},
    },
    record::Record,
};
use tokio::sync::Mutex;
use tokio_util::sync::CancellationToken;

pub use crate::outbox::sink::OutgoingRecord;
use crate::outbox::sink::{Delivery, Produced, Sink, SinkError};
use crate::{
    config::{Compression, KafkaSettings, SaslMechanism},
    telemetry::{ErrorChain, metrics::ReasonLabel},
};
use produce::{Budget, PartitionState, Target, produce_partition};
use tls_bridge::{TlsBridge, connect_operation, security_failure};

pub use errors::{
    Disposition, ERROR_CODES, ErrorCode, KafkaError, by_code, code_of, disposition, error_name,
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

/// First step of the pause before the sink retries a partition whose
/// produce failed (after a leader change the new leader is usually known at
/// once); each pause is drawn from half to all of its step.
pub const RETRY_MIN: Duration = Duration::from_millis(20);

/// Longest pause between the sink's retries of a partition.
pub const RETRY_MAX: Duration = Duration::from_millis(500);

/// A retry is not started with less of the call's budget left than this.
const RETRY_FLOOR: Duration = Duration::from_millis(250);

/// How long a call waits, after its first partition was acknowledged, for
/// partitions still failing or unanswered (at least; as long again as that
/// first partition took when that is longer, up to
/// [`STRAGGLER_GRACE_MAX`], so a uniformly slow cluster cuts nothing).
/// Then they are cut short and go again with the next batch. A plain Kafka
/// producer sends each partition's batches on their own; this bounds how
/// long one partition whose leader is moving holds up the others to about
/// this much.
pub const STRAGGLER_GRACE: Duration = Duration::from_millis(250);

/// The grace never exceeds this, however long the first partition took (a
/// call that waited seconds for the cluster does not give a partition
/// whose leader is gone that long again).
const STRAGGLER_GRACE_MAX: Duration = Duration::from_millis(500);

/// A partition's client: `None` when its leader could not be reached when
/// the topic was loaded (the produce looks it up first).
type Slot = Option<Arc<PartitionClient>>;

struct TopicPartitions {
    partitions: Vec<Slot>,
    /// What each partition's last call left for the next.
    state: Vec<PartitionState>,
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
        // A partition whose leader cannot be reached now (it just died, a
        // new one is not elected yet) does not keep the others from being
        // written: its produce looks the leader up again. Only when no
        // partition has a reachable leader does loading fail.
        let mut partitions = Vec::with_capacity(count);
        let mut last_error = None;
        for partition in 0..count as i32 {
            let lookup = budget
                .step(
                    "leader lookup",
                    client.partition_client(topic, partition, UnknownTopicHandling::Error),
                )
                .await;
            match lookup {
                Ok(found) => partitions.push(Some(Arc::new(found))),
                Err(error) => {
                    tracing::info!(topic, partition, error = %ErrorChain(&error), "partition leader not reachable; looked up again at its first produce");
                    partitions.push(None);
                    last_error = Some(error);
                }
            }
        }
        if let Some(error) = last_error
            && partitions.iter().all(Option::is_none)
        {
            return Err(error);
        }
        Ok(TopicPartitions {
            state: vec![PartitionState::default(); partitions.len()],
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
            .map(|(partitions, _)| partitions.len());
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
    ) -> Result<(Vec<Slot>, Vec<PartitionState>), KafkaError> {
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
                        known.partitions.push(Some(Arc::new(client)));
                        known.state.push(PartitionState::default());
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
        let known = &connection.topics[topic];
        Ok((known.partitions.clone(), known.state.clone()))
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
    /// [`Delivery::Refused`]. Any other failure, or a partition cut short
    /// after [`STRAGGLER_GRACE`], leaves that partition's remaining records
    /// [`Delivery::Pending`]; other partitions' acks still count. When some
    /// partition was acknowledged the connection stays and only the failed
    /// partitions look their leader up again next time; when none was, the
    /// connection is dropped so the next call starts from scratch.
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
        let (partitions, state) = match self.partitions_locked(&mut guard, topic, &budget).await {
            Ok(known) => known,
            Err(error) => {
                *guard = None;
                return Produced::failed(n, error.into());
            }
        };
        let Some(connection) = guard.as_mut() else {
            unreachable!("partitions_locked connected");
        };
        let (produced, outcomes) = self
            .produce_to(
                &connection.client,
                (&partitions, state),
                topic,
                records,
                &budget,
            )
            .await;
        // Nothing acknowledged and the broker did not even answer: the
        // connection itself may be what failed.
        let progress = outcomes.iter().any(|o| o.settled);
        let answered = produced
            .error
            .as_ref()
            .and_then(SinkError::as_kafka)
            .is_some_and(KafkaError::answered_by_broker);
        if produced.error.is_some() && !progress && !answered {
            *guard = None;
        } else if let Some(known) = connection.topics.get_mut(topic) {
            for outcome in outcomes {
                let index = outcome.partition as usize;
                if let Some(client) = outcome.replaced
                    && let Some(slot) = known.partitions.get_mut(index)
                {
                    *slot = Some(client);
                }
                if let Some(slot) = known.state.get_mut(index) {
                    *slot = outcome.state;
                }
            }
        }
        produced
    }

    async fn produce_to(
        &self,
        client: &Client,
        (partitions, state): (&[Slot], Vec<PartitionState>),
        topic: &str,
        records: Vec<OutgoingRecord>,
        budget: &Budget,
    ) -> (Produced, Vec<Settled>) {
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
        let cut = CancellationToken::new();
        let cut = &cut;
        let started = tokio::time::Instant::now();
        let mut sends: FuturesUnordered<_> = by_partition
            .into_iter()
            .map(|(partition, records)| {
                let current = partitions[partition as usize].clone();
                let target = Target {
                    client,
                    topic,
                    partition,
                    compression,
                    budget,
                    sink: self,
                    refreshed,
                    cut,
                };
                let state = state[partition as usize].clone();
                produce_partition(target, current, state, records)
            })
            .collect();
        let mut produced = Produced {
            deliveries: vec![Delivery::Pending; n],
            error: None,
            error_codes: Vec::new(),
        };
        let mut outcomes = Vec::new();
        // Set when the first partition is acknowledged: the others have
        // until then.
        let mut grace_ends: Option<tokio::time::Instant> = None;
        loop {
            let next = match grace_ends {
                Some(at) if !cut.is_cancelled() => {
                    match tokio::time::timeout_at(at, sends.next()).await {
                        Ok(next) => next,
                        Err(_) => {
                            cut.cancel();
                            continue;
                        }
                    }
                }
                _ => sends.next().await,
            };
            let Some(outcome) = next else { break };
            let settled = outcome.settled();
            if settled && grace_ends.is_none() {
                let grace = started
                    .elapsed()
                    .clamp(STRAGGLER_GRACE, STRAGGLER_GRACE_MAX);
                grace_ends = Some(tokio::time::Instant::now() + grace);
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
            outcomes.push(Settled {
                partition: outcome.partition,
                settled,
                state: outcome.state,
                replaced: outcome.replaced,
            });
        }
        (produced, outcomes)
    }
}

/// What a call leaves for the next ones about one partition.
struct Settled {
    partition: i32,
    /// Every record acknowledged or refused.
    settled: bool,
    state: PartitionState,
    replaced: Option<Arc<PartitionClient>>,
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
