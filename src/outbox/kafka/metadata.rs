//! What the worker knows of the cluster: its brokers' addresses and, for
//! each topic it writes, the layout (its partitions and their leaders),
//! read for that topic only over a connection of its own.
//!
//! Metadata is read when a topic is first used, soon after a partition's
//! leader came into doubt (the next request of that partition reads it
//! first; partitions that failed together share one read), and on the
//! pipeline's slow period (`Timing::metadata_max_age`, through
//! [`super::KafkaTransport`]'s partition count). The metadata connection
//! goes to the bootstrap servers first, then to the brokers the cluster
//! advertised; one that fails or stays silent hands the next read to the
//! next address, so one dead bootstrap server does not stop the others
//! being tried.
//!
//! A layout is identified by its partition count (rskafka's metadata
//! request, versions 0 to 4, carries no topic id): a request routed for
//! another count than the topic has now is refused
//! ([`KafkaError::LayoutChanged`]) so its rows are routed again rather
//! than written to a partition their key no longer maps to.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
};

use rskafka::protocol::{
    messages::{MetadataRequest, MetadataRequestTopic, MetadataResponse},
    primitives::{Boolean, String_},
};
use tokio::time::Instant;

use super::{
    KafkaError,
    brokers::Shared,
    connection::{Connection, Endpoint},
};
use crate::config::KafkaSettings;

/// A topic's layout as last read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Layout {
    /// The leader's node id of each partition, by partition number
    /// (`None`: no leader now).
    pub leaders: Vec<Option<i32>>,
}

impl Layout {
    pub(super) fn partitions(&self) -> i32 {
        i32::try_from(self.leaders.len()).unwrap_or(i32::MAX)
    }
}

#[derive(Default)]
struct State {
    brokers: HashMap<i32, Endpoint>,
    topics: HashMap<String, Layout>,
    /// Partitions whose leader is in doubt, since when.
    suspects: HashMap<(String, i32), Instant>,
    /// The address the next metadata connection tries first.
    next: usize,
}

/// The cluster as this worker knows it.
pub(super) struct Metadata {
    bootstrap: Vec<Endpoint>,
    connection: Shared,
    state: Mutex<State>,
    /// When the last read started: a partition in doubt since before then
    /// needs no read of its own.
    last_read: tokio::sync::Mutex<Option<Instant>>,
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl Metadata {
    pub(super) fn new(settings: &KafkaSettings) -> Self {
        Self {
            bootstrap: settings
                .bootstrap_servers
                .iter()
                .filter_map(|server| Endpoint::parse(server))
                .collect(),
            connection: Shared::default(),
            state: Mutex::new(State::default()),
            last_read: tokio::sync::Mutex::new(None),
        }
    }

    /// The leader of `partition`, from the layout known, or read now when
    /// the topic is unknown or the partition's leader in doubt. `routed`:
    /// the partition count its rows were routed for.
    pub(super) async fn leader(
        &self,
        topic: &str,
        partition: i32,
        routed: i32,
        settings: &KafkaSettings,
        deadline: Instant,
    ) -> Result<Endpoint, KafkaError> {
        let doubt = {
            let state = lock(&self.state);
            match state.topics.get(topic) {
                None => Some(None),
                Some(_) => state
                    .suspects
                    .get(&(topic.to_owned(), partition))
                    .map(|since| Some(*since)),
            }
        };
        if let Some(since) = doubt {
            // Partitions in doubt together wait for one read, each within
            // its own deadline.
            let mut last = tokio::time::timeout_at(deadline, self.last_read.lock())
                .await
                .map_err(|_| KafkaError::Timeout {
                    operation: "metadata (a read for another partition)".into(),
                    timeout: settings.request_timeout,
                })?;
            let fresh = match since {
                Some(since) => last.is_some_and(|started| started > since),
                None => lock(&self.state).topics.contains_key(topic),
            };
            if !fresh {
                let started = Instant::now();
                self.read(topic, settings, deadline).await?;
                *last = Some(started);
            }
        }
        let state = lock(&self.state);
        let layout = state
            .topics
            .get(topic)
            .ok_or_else(|| KafkaError::TopicMissing(topic.to_owned()))?;
        if layout.partitions() != routed {
            return Err(KafkaError::LayoutChanged {
                topic: topic.to_owned(),
                routed,
                now: layout.partitions(),
            });
        }
        let no_leader = || KafkaError::NoLeader {
            topic: topic.to_owned(),
            partition,
        };
        let leader = usize::try_from(partition)
            .ok()
            .and_then(|p| layout.leaders.get(p).copied().flatten())
            .ok_or_else(no_leader)?;
        state.brokers.get(&leader).cloned().ok_or_else(no_leader)
    }

    /// `partition`'s leader is in doubt from now: its next request reads
    /// the metadata first.
    pub(super) fn suspect(&self, topic: &str, partition: i32) {
        lock(&self.state)
            .suspects
            .entry((topic.to_owned(), partition))
            .or_insert_with(Instant::now);
    }

    /// Reads `topic`'s layout now and keeps it (and the brokers' addresses).
    pub(super) async fn read(
        &self,
        topic: &str,
        settings: &KafkaSettings,
        deadline: Instant,
    ) -> Result<Layout, KafkaError> {
        let started = Instant::now();
        let request = || MetadataRequest {
            topics: Some(vec![MetadataRequestTopic {
                name: String_(topic.to_owned()),
            }]),
            // A read never creates the topic (KAFKA_CREATE_TOPIC decides).
            allow_auto_topic_creation: Some(Boolean(false)),
        };
        let response = self
            .on_connection(settings, deadline, |connection| async move {
                connection
                    .request_by("metadata", request(), deadline, settings.request_timeout)
                    .await
            })
            .await?;
        let layout = layout_of(topic, &response)?;
        let mut state = lock(&self.state);
        for broker in &response.brokers {
            if let Ok(port) = u16::try_from(broker.port.0) {
                state.brokers.insert(
                    broker.node_id.0,
                    Endpoint {
                        host: broker.host.0.clone(),
                        port,
                    },
                );
            }
        }
        state.topics.insert(topic.to_owned(), layout.clone());
        state
            .suspects
            .retain(|(t, _), since| t != topic || *since >= started);
        Ok(layout)
    }

    /// Forgets `topic`'s layout (it does not exist now).
    pub(super) fn forget(&self, topic: &str) {
        lock(&self.state).topics.remove(topic);
    }

    /// Runs `exchange` on the metadata connection, opening one when there
    /// is none. A connection that fails hands over to the next address at
    /// once; each address is tried at most once per call.
    pub(super) async fn on_connection<T, F>(
        &self,
        settings: &KafkaSettings,
        deadline: Instant,
        exchange: impl Fn(Arc<Connection>) -> F,
    ) -> Result<T, KafkaError>
    where
        F: Future<Output = Result<T, KafkaError>>,
    {
        let candidates = self.candidates();
        let mut last_error = None;
        for _ in 0..candidates.len().max(1) {
            let connection = match self.connection.current() {
                Some(open) => open,
                None => {
                    let endpoint = {
                        let mut state = lock(&self.state);
                        let endpoint = candidates
                            .get(state.next % candidates.len().max(1))
                            .cloned();
                        // Moved on before the try: a try cut short by the
                        // deadline leaves the next read to the next address.
                        state.next = state.next.wrapping_add(1);
                        endpoint
                    };
                    let Some(endpoint) = endpoint else {
                        break;
                    };
                    match self.connection.get(&endpoint, settings, deadline).await {
                        Ok(open) => {
                            // This one works: the next connection starts here.
                            let mut state = lock(&self.state);
                            state.next = state.next.wrapping_sub(1);
                            open
                        }
                        Err(error) if error.class() == crate::outbox::ErrorClass::Retriable => {
                            last_error = Some(error);
                            continue;
                        }
                        Err(error) => return Err(error),
                    }
                }
            };
            match exchange(Arc::clone(&connection)).await {
                Err(error) if error.connection_suspect() => {
                    self.connection.forget(&connection);
                    last_error = Some(error);
                }
                other => return other,
            }
        }
        Err(last_error.unwrap_or_else(|| KafkaError::Connect {
            broker: "KAFKA_BOOTSTRAP_SERVERS".to_owned(),
            source: std::io::Error::other("no usable bootstrap server address"),
        }))
    }

    /// Where a metadata connection may go: the bootstrap servers, then the
    /// brokers the cluster advertised (by node id), each once.
    fn candidates(&self) -> Vec<Endpoint> {
        let state = lock(&self.state);
        let mut known: Vec<(&i32, &Endpoint)> = state.brokers.iter().collect();
        known.sort_by_key(|(id, _)| **id);
        let mut candidates = self.bootstrap.clone();
        for (_, endpoint) in known {
            if !candidates.contains(endpoint) {
                candidates.push(endpoint.clone());
            }
        }
        candidates
    }
}

/// `topic`'s layout in a metadata answer, or why there is none.
fn layout_of(topic: &str, response: &MetadataResponse) -> Result<Layout, KafkaError> {
    let Some(entry) = response.topics.iter().find(|t| t.name.0 == topic) else {
        return Err(KafkaError::TopicMissing(topic.to_owned()));
    };
    match entry.error {
        Some(rskafka::client::error::ProtocolError::UnknownTopicOrPartition) => {
            return Err(KafkaError::TopicMissing(topic.to_owned()));
        }
        // A topic being created or moved answers LEADER_NOT_AVAILABLE for
        // the topic as a whole: its partitions say more.
        Some(rskafka::client::error::ProtocolError::LeaderNotAvailable) | None => {}
        Some(error) => {
            return Err(KafkaError::Broker {
                operation: "metadata",
                error,
                message: None,
            });
        }
    }
    let count = entry
        .partitions
        .iter()
        .filter_map(|p| usize::try_from(p.partition_index.0).ok())
        .map(|p| p + 1)
        .max()
        .unwrap_or(0);
    if count == 0 {
        return Err(KafkaError::NoPartitions(topic.to_owned()));
    }
    let mut leaders = vec![None; count];
    for p in &entry.partitions {
        if let Ok(index) = usize::try_from(p.partition_index.0)
            && p.leader_id.0 >= 0
        {
            leaders[index] = Some(p.leader_id.0);
        }
    }
    Ok(Layout { leaders })
}
