//! The Kafka transport, on rskafka: one client (its metadata connection)
//! and one partition client per partition, each with its own connection to
//! the partition's leader. A broker serves one request per connection at a
//! time, so partitions that share a leader still do not queue behind each
//! other's requests: a request waiting for a slow follower on partition 0
//! holds up partition 0 only.
//!
//! rskafka's own retry loops are cut to a single try (its backoff deadline
//! is zero): every error comes back to the pipeline, which classifies it
//! (`errors.rs`) and backs off per partition. A partition whose error puts
//! its leader in doubt (and one whose request was abandoned: a timeout, a
//! shutdown) has its partition client rebuilt before its next request,
//! from metadata read afresh (`partitions.rs`).

mod errors;
mod partitions;
pub mod tls_bridge;

use std::sync::Arc;

use prometheus_client::metrics::{counter::Counter, family::Family};
use rskafka::{
    BackoffConfig,
    client::{
        Client, ClientBuilder, Credentials, SaslConfig, partition::Compression as KafkaCompression,
    },
};
use tokio::sync::Mutex;

pub use crate::outbox::transport::OutgoingRecord;
use crate::{
    config::{Compression, KafkaSettings, SaslMechanism},
    outbox::transport::{SendError, Transport},
    telemetry::{ErrorChain, metrics::ReasonLabel},
};
use partitions::PartitionClients;
use tls_bridge::{TlsBridge, connect_operation, security_failure};

pub use errors::{
    Disposition, ERROR_CODES, ErrorCode, KafkaError, by_code, code_of, disposition, error_name,
};

/// Pause between metadata reads while a topic just created appears.
const TOPIC_POLL: std::time::Duration = std::time::Duration::from_millis(50);

/// rskafka's backoff: one try, no retry of its own (the first pause is
/// never slept: the deadline is already over). rskafka needs a non-empty
/// range to draw its pause from, hence the millisecond.
fn single_try() -> BackoffConfig {
    BackoffConfig {
        init_backoff: std::time::Duration::from_millis(1),
        max_backoff: std::time::Duration::from_millis(1),
        base: 2.0,
        deadline: Some(std::time::Duration::ZERO),
    }
}

/// The publisher's connection to Kafka. Safe to share: requests of
/// different partitions run side by side.
pub struct KafkaTransport {
    settings: KafkaSettings,
    /// The client (metadata connection), built at first use and dropped
    /// when it fails to reach any broker.
    client: Mutex<Option<Arc<Client>>>,
    partitions: PartitionClients,
    /// Metadata reads by reason (`connect`, `periodic`, `leader`).
    metadata_reads: Family<ReasonLabel, Counter>,
    /// The in-process bridge every broker connection goes through (TLS for
    /// `SSL` and `SASL_SSL`; `TCP_NODELAY` on rskafka's sockets for all),
    /// started at the first connect.
    tls_bridge: tokio::sync::OnceCell<TlsBridge>,
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
            settings,
            client: Mutex::new(None),
            partitions: PartitionClients::default(),
            metadata_reads: Family::default(),
            tls_bridge: tokio::sync::OnceCell::new(),
        }
    }

    /// Counts metadata reads into `reads` (the process's
    /// `crm_booking_expiration_kafka_metadata_refreshes_total`).
    pub fn with_metadata_refreshes(mut self, reads: Family<ReasonLabel, Counter>) -> Self {
        self.metadata_reads = reads;
        self
    }

    fn count_read(&self, reason: &'static str) {
        self.metadata_reads
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

    /// The client, connecting first when there is none.
    async fn client(&self) -> Result<Arc<Client>, KafkaError> {
        let mut slot = self.client.lock().await;
        if let Some(client) = slot.as_ref() {
            return Ok(Arc::clone(client));
        }
        let client = Arc::new(self.connect().await?);
        *slot = Some(Arc::clone(&client));
        Ok(client)
    }

    /// Drops the client after it failed to reach any broker: the next
    /// call connects afresh (partition clients keep their own connections).
    async fn forget_client(&self, failed: &Arc<Client>) {
        let mut slot = self.client.lock().await;
        if slot
            .as_ref()
            .is_some_and(|current| Arc::ptr_eq(current, failed))
        {
            *slot = None;
        }
    }

    async fn connect(&self) -> Result<Client, KafkaError> {
        let mut builder = ClientBuilder::new(self.settings.bootstrap_servers.clone())
            .client_id(self.settings.client_id.clone())
            .backoff_config(single_try());
        if let Some(sasl) = &self.settings.sasl {
            let credentials = Credentials::new(sasl.username.clone(), sasl.password.clone());
            builder = builder.sasl_config(match sasl.mechanism {
                SaslMechanism::Plain => SaslConfig::Plain(credentials),
                SaslMechanism::ScramSha256 => SaslConfig::ScramSha256(credentials),
                SaslMechanism::ScramSha512 => SaslConfig::ScramSha512(credentials),
            });
        }
        // Every broker connection goes through the in-process bridge: TLS
        // where configured, and `TCP_NODELAY` on rskafka's sockets always.
        let bridge = self
            .tls_bridge
            .get_or_try_init(|| TlsBridge::start(self.settings.tls.as_ref(), &self.settings))
            .await?;
        builder = builder.socks5_proxy(bridge.proxy_for_new_connect());
        // A TLS or SASL refusal is reported as such, naming its setting.
        match builder.build().await {
            Ok(client) => Ok(client),
            Err(source) => Err(
                match security_failure(&self.settings, Some(bridge), Some(&source)) {
                    Some(error) => error.into(),
                    None => KafkaError::Connect {
                        servers: self.settings.bootstrap_servers.join(","),
                        source,
                    },
                },
            ),
        }
    }

    /// The partition count of `topic`, or `None` when it does not exist.
    async fn partition_count(
        &self,
        client: &Client,
        topic: &str,
    ) -> Result<Option<usize>, KafkaError> {
        let topics = client
            .list_topics()
            .await
            .map_err(|source| KafkaError::Request {
                operation: "metadata",
                source,
            })?;
        Ok(topics
            .into_iter()
            .find(|t| t.name == topic)
            .map(|t| t.partitions.len()))
    }

    /// Creates `topic` (another instance may do so first) and waits until
    /// the broker lists it; the caller bounds the wait.
    async fn create_topic(
        &self,
        client: &Client,
        topic: &str,
    ) -> Result<Option<usize>, KafkaError> {
        let request = |source| KafkaError::Request {
            operation: "create topic",
            source,
        };
        let controller = client.controller_client().map_err(request)?;
        let timeout_ms =
            i32::try_from(self.settings.request_timeout.as_millis()).unwrap_or(i32::MAX);
        let created = controller
            .create_topic(
                topic,
                self.settings.topic_partitions,
                self.settings.replication_factor,
                timeout_ms,
            )
            .await;
        match created {
            Ok(()) => tracing::info!(
                topic,
                partitions = self.settings.topic_partitions,
                "topic created"
            ),
            // Another instance may have created it first; the read below decides.
            Err(error) => {
                tracing::warn!(topic, error = %ErrorChain(&error), "topic creation failed")
            }
        }
        // A broker answers CreateTopics before its metadata lists the topic.
        loop {
            if let Some(count) = self
                .partition_count(client, topic)
                .await?
                .filter(|n| *n > 0)
            {
                return Ok(Some(count));
            }
            tokio::time::sleep(TOPIC_POLL).await;
        }
    }

    async fn read_partitions(&self, topic: &str) -> Result<i32, KafkaError> {
        let client = self.client().await?;
        let read = async {
            let mut count = self.partition_count(&client, topic).await?;
            if count.is_none() && self.settings.create_topic {
                count = self.create_topic(&client, topic).await?;
            }
            match count {
                None => Err(KafkaError::TopicMissing(topic.to_owned())),
                Some(0) => Err(KafkaError::NoPartitions(topic.to_owned())),
                Some(n) => Ok(i32::try_from(n).unwrap_or(i32::MAX)),
            }
        };
        let result = read.await;
        if let Err(error) = &result
            && error.class() == crate::outbox::transport::ErrorClass::Retriable
        {
            self.forget_client(&client).await;
        }
        result
    }
}

impl Transport for KafkaTransport {
    /// Bounded by `KAFKA_REQUEST_TIMEOUT`; a timeout drops the client (its
    /// metadata connection may be stuck on a silent broker) and says what
    /// was not answered (the TLS handshake or SASL exchange, when that is
    /// where it stopped).
    async fn partitions(&self, topic: &str) -> Result<i32, SendError> {
        let timeout = self.settings.request_timeout;
        match tokio::time::timeout(timeout, self.read_partitions(topic)).await {
            Ok(result) => result.map_err(|e| e.to_send_error()),
            Err(_) => {
                let connected = self.client.lock().await.take().is_some();
                let error = match security_failure(&self.settings, self.tls_bridge.get(), None) {
                    Some(error) => error.into(),
                    None => KafkaError::Timeout {
                        operation: if connected {
                            "metadata"
                        } else {
                            connect_operation(&self.settings)
                        },
                        timeout,
                    },
                };
                Err(error.to_send_error())
            }
        }
    }

    /// Bounded by `KAFKA_REQUEST_TIMEOUT` (longer than the broker's own
    /// produce timeout, so a live broker answers first); a request cut
    /// short has its partition's leader looked up again.
    async fn produce(
        &self,
        topic: &str,
        partition: i32,
        records: Vec<OutgoingRecord>,
    ) -> Result<(), SendError> {
        let timeout = self.settings.request_timeout;
        let produce = self.partitions.produce(
            || self.client(),
            topic,
            partition,
            records,
            self.compression(),
            |reason| self.count_read(reason),
        );
        match tokio::time::timeout(timeout, produce).await {
            Ok(result) => result.map_err(|e| e.to_send_error()),
            Err(_) => Err(KafkaError::Timeout {
                operation: "produce",
                timeout,
            }
            .to_send_error()),
        }
    }
}
