//! One rskafka partition client per partition, each with its own
//! connection to the partition's leader, and when to build it again.
//!
//! A partition client is kept while it works. After an error that puts the
//! leader in doubt ([`KafkaError::leader_suspect`]), or a request that was
//! abandoned (a timeout, a shutdown: its future was dropped before it
//! answered), it is dropped, and the next request of the partition first
//! reads the metadata afresh (rskafka caches it, and its cached leader can
//! be the broker that just stopped leading) and then builds a new client,
//! which finds the leader in that metadata. Partitions that failed at the
//! same time share one metadata read. An error the leader answered as
//! leader (too few replicas, an authorization failure, a refused record)
//! keeps the client and its connection.

use std::{collections::HashMap, sync::Arc, sync::Mutex};

use rskafka::{
    client::{
        Client,
        partition::{Compression, PartitionClient, UnknownTopicHandling},
    },
    record::Record,
};
use tokio::time::Instant;

use super::{KafkaError, OutgoingRecord};

type Key = (String, i32);

#[derive(Default)]
struct Slot {
    client: Option<Arc<PartitionClient>>,
    /// The leader is in doubt since then: read the metadata before
    /// building the next client.
    suspect_since: Option<Instant>,
}

/// The partition clients of a transport.
#[derive(Default)]
pub(super) struct PartitionClients {
    slots: Mutex<HashMap<Key, Slot>>,
    /// When the last metadata read for leaders started.
    refreshed: tokio::sync::Mutex<Option<Instant>>,
}

impl PartitionClients {
    fn slots(&self) -> std::sync::MutexGuard<'_, HashMap<Key, Slot>> {
        // Plain data: a panic elsewhere leaves it usable.
        self.slots
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Drops the partition's client: its leader is in doubt from now.
    fn suspect(&self, key: &Key) {
        let mut slots = self.slots();
        let slot = slots.entry(key.clone()).or_default();
        slot.client = None;
        slot.suspect_since.get_or_insert_with(Instant::now);
    }

    /// Produces `records` to the partition, in order, in one request. The
    /// client (the metadata connection) is asked for only when the
    /// partition needs a new partition client: a partition that works
    /// never waits for a connect another one needs.
    pub(super) async fn produce<F>(
        &self,
        client: impl FnOnce() -> F,
        topic: &str,
        partition: i32,
        records: Vec<OutgoingRecord>,
        compression: Compression,
        count_read: impl Fn(&'static str),
    ) -> Result<(), KafkaError>
    where
        F: Future<Output = Result<Arc<Client>, KafkaError>>,
    {
        let key = (topic.to_owned(), partition);
        // Dropped before it is settled (the request was abandoned): the
        // connection may be stuck on a silent broker, so the leader is in
        // doubt.
        let abandoned = Abandoned {
            clients: self,
            key: Some(key.clone()),
        };
        let result = async {
            let partition_client = match self.cached(&key) {
                Some(cached) => cached,
                None => self.build(&*client().await?, &key, count_read).await?,
            };
            produce_on(&partition_client, key.1, records, compression).await
        }
        .await;
        if let Err(error) = &result
            && error.leader_suspect()
        {
            self.suspect(&key);
        }
        abandoned.settle();
        result
    }

    fn cached(&self, key: &Key) -> Option<Arc<PartitionClient>> {
        self.slots().get(key).and_then(|slot| slot.client.clone())
    }

    /// A new client for the partition, after a metadata read when its
    /// leader is in doubt.
    async fn build(
        &self,
        client: &Client,
        key: &Key,
        count_read: impl Fn(&'static str),
    ) -> Result<Arc<PartitionClient>, KafkaError> {
        let suspect_since = self.slots().get(key).and_then(|slot| slot.suspect_since);
        if let Some(since) = suspect_since {
            count_read("leader");
            self.refresh(client, since).await?;
        }
        let fresh = client
            .partition_client(key.0.clone(), key.1, UnknownTopicHandling::Error)
            .await
            .map_err(|source| KafkaError::Request {
                operation: "leader lookup",
                source,
            })?;
        let fresh = Arc::new(fresh);
        let mut slots = self.slots();
        let slot = slots.entry(key.clone()).or_default();
        slot.client = Some(Arc::clone(&fresh));
        slot.suspect_since = None;
        Ok(fresh)
    }

    /// Reads the cluster's metadata (replacing rskafka's cached copy)
    /// unless a read started after `since`.
    async fn refresh(&self, client: &Client, since: Instant) -> Result<(), KafkaError> {
        let mut last = self.refreshed.lock().await;
        if last.is_some_and(|started| started > since) {
            return Ok(());
        }
        let started = Instant::now();
        client
            .list_topics()
            .await
            .map_err(|source| KafkaError::Request {
                operation: "metadata",
                source,
            })?;
        *last = Some(started);
        Ok(())
    }
}

/// One request on `partition_client`, every record acknowledged or an error.
async fn produce_on(
    partition_client: &PartitionClient,
    partition: i32,
    records: Vec<OutgoingRecord>,
    compression: Compression,
) -> Result<(), KafkaError> {
    let sent = records.len();
    let records = records.into_iter().map(to_record).collect();
    let offsets = partition_client
        .produce(records, compression)
        .await
        .map_err(|source| KafkaError::Request {
            operation: "produce",
            source,
        })?;
    if offsets.len() != sent {
        return Err(KafkaError::ShortAck {
            partition,
            sent,
            acked: offsets.len(),
        });
    }
    Ok(())
}

/// Marks the partition's leader in doubt if dropped before [`Self::settle`].
struct Abandoned<'a> {
    clients: &'a PartitionClients,
    key: Option<Key>,
}

impl Abandoned<'_> {
    fn settle(mut self) {
        self.key = None;
    }
}

impl Drop for Abandoned<'_> {
    fn drop(&mut self) {
        if let Some(key) = self.key.take() {
            self.clients.suspect(&key);
        }
    }
}

/// The record as rskafka sends it: the headers' one typed form becomes the
/// record's header map here, at the edge.
fn to_record(record: OutgoingRecord) -> Record {
    Record {
        key: Some(record.key.into_bytes()),
        value: Some(record.value),
        headers: record
            .headers
            .into_pairs()
            .map(|(name, value)| (name, value.into_bytes()))
            .collect(),
        timestamp: record.timestamp,
    }
}
