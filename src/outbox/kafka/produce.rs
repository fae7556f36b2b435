//! One partition's produce within a call's time budget: split in halves
//! while the broker refuses the records, retried against a leader looked up
//! again from fresh metadata, and cut short once the call's other
//! partitions are done and this one lags behind (see
//! [`super::STRAGGLER_GRACE`]).

use std::{sync::Arc, time::Duration};

use rskafka::{
    client::{
        Client,
        error::ProtocolError,
        partition::{Compression as KafkaCompression, PartitionClient, UnknownTopicHandling},
    },
    record::Record,
};
use tokio::sync::Mutex;
use tokio_util::sync::CancellationToken;

use super::{
    KafkaSink, RETRY_FLOOR, RETRY_MAX, RETRY_MIN,
    errors::{KafkaError, server_error},
};
use crate::{
    outbox::{
        Backoff,
        sink::{Delivery, Refusal},
    },
    telemetry::ErrorChain,
};

/// What a partition's last call leaves for its next one (kept per
/// partition on the connection).
#[derive(Debug, Clone)]
pub(super) struct PartitionState {
    /// The last call ended on an error that puts the leader in doubt: the
    /// next call looks the leader up again before it sends.
    pub(super) leader_suspect: bool,
    /// The pause before the next retry of a partition that keeps failing
    /// goes on growing across calls (a call cut short after its grace does
    /// not start the partition's retries over at [`RETRY_MIN`]); reset
    /// once the partition is acknowledged.
    pub(super) retry: Backoff,
}

impl Default for PartitionState {
    fn default() -> Self {
        Self {
            leader_suspect: false,
            retry: Backoff::new(RETRY_MIN, RETRY_MAX),
        }
    }
}

/// What one partition's produce did, record by record (by index into the
/// call's records).
#[derive(Default)]
pub(super) struct PartitionOutcome {
    pub(super) partition: i32,
    pub(super) deliveries: Vec<(usize, Delivery)>,
    pub(super) error: Option<KafkaError>,
    pub(super) error_codes: Vec<String>,
    /// A partition client built during the call (the leader looked up
    /// again), to keep for the next calls.
    pub(super) replaced: Option<Arc<PartitionClient>>,
    /// What the next call of this partition starts from.
    pub(super) state: PartitionState,
}

impl PartitionOutcome {
    /// Every record of the partition acknowledged or refused.
    pub(super) fn settled(&self) -> bool {
        self.error.is_none()
    }

    /// `chunk`'s records were not acknowledged: they go with a later call.
    fn pending(&mut self, chunk: Vec<(usize, Record)>) {
        self.deliveries
            .extend(chunk.into_iter().map(|(i, _)| (i, Delivery::Pending)));
    }

    /// The partition stops at `error` for this call: `chunk` (and every
    /// chunk after it) stays pending, and the next call looks the leader
    /// up again first if `error` puts it in doubt.
    fn give_up(&mut self, chunk: Vec<(usize, Record)>, error: KafkaError) {
        self.state.leader_suspect = leader_suspect(&error);
        self.pending(chunk);
        self.error = Some(error);
    }
}

/// The time budget of one call. Every step of a call (waiting for the
/// connection, connect, metadata, topic creation, leader lookups, produce)
/// runs against the same deadline, so a call on a fresh connection takes at
/// most one `KAFKA_REQUEST_TIMEOUT`, not one per step.
#[derive(Debug, Clone, Copy)]
pub(super) struct Budget {
    pub(super) deadline: tokio::time::Instant,
    pub(super) timeout: Duration,
}

impl Budget {
    pub(super) fn start(timeout: Duration) -> Self {
        Self {
            deadline: tokio::time::Instant::now() + timeout,
            timeout,
        }
    }

    pub(super) fn remaining(&self) -> Duration {
        self.deadline
            .saturating_duration_since(tokio::time::Instant::now())
    }

    pub(super) fn timed_out(&self, operation: &'static str) -> KafkaError {
        KafkaError::Timeout {
            operation,
            timeout: self.timeout,
        }
    }

    /// Runs one step of the call within what is left of the budget.
    pub(super) async fn step<T>(
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

/// Where one partition's records go, and what a retry needs.
#[derive(Clone, Copy)]
pub(super) struct Target<'a> {
    pub(super) client: &'a Client,
    pub(super) topic: &'a str,
    pub(super) partition: i32,
    pub(super) compression: KafkaCompression,
    pub(super) budget: &'a Budget,
    pub(super) sink: &'a KafkaSink,
    /// When the last metadata refresh of this call started: partitions
    /// that failed together share one refresh.
    pub(super) refreshed: &'a Mutex<Option<tokio::time::Instant>>,
    /// Cancelled when the call's other partitions are done and this one
    /// has had its grace: it stops at once, in a request or a pause, and
    /// its records not yet acknowledged stay [`Delivery::Pending`] for the
    /// next call. rskafka's requests are cancellation-safe (a request cut
    /// mid-write is finished in the background), so the connection stays
    /// usable.
    pub(super) cut: &'a CancellationToken,
}

/// Whether the leader is looked up again before retrying after `error`:
/// yes, unless the broker answered as the leader and only lacks replicas
/// or asks to slow down.
pub(super) fn leader_suspect(error: &KafkaError) -> bool {
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
pub(super) async fn refresh_metadata(
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
/// pause (the shared [`Backoff`], [`RETRY_MIN`] doubling to [`RETRY_MAX`],
/// jittered), through a partition
/// client built afresh from freshly requested metadata (a live broker
/// names the current leader) unless the leader itself answered (see [`leader_suspect`]), while the
/// call's budget lasts; then the rest stay [`Delivery::Pending`]. Halves
/// go in order, so the partition's records keep their order. A retry
/// after a lost answer can write a record twice (same `ce_id`, same bytes).
pub(super) async fn produce_partition(
    target: Target<'_>,
    mut current: Option<Arc<PartitionClient>>,
    state: PartitionState,
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
        cut,
    } = target;
    let PartitionState {
        leader_suspect: suspect,
        retry: mut backoff,
    } = state;
    // The leader in doubt after the last call, or no client yet (its
    // leader could not be reached when the topic was loaded): look the
    // leader up first.
    let mut find_leader = suspect || current.is_none();
    let mut outcome = PartitionOutcome {
        partition,
        ..PartitionOutcome::default()
    };
    let mut pause = backoff.next_delay();
    let mut failed_at = tokio::time::Instant::now();
    // Chunks still to send, the next one last.
    let mut chunks = vec![records];
    while let Some(mut chunk) = chunks.pop() {
        if outcome.error.is_some() {
            outcome.pending(chunk);
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
                        let fresh = Arc::new(fresh);
                        outcome.replaced = Some(Arc::clone(&fresh));
                        current = Some(fresh);
                        find_leader = false;
                    });
            }
        }
        let result = match (attempt, &current) {
            (Ok(()), Some(current)) => tokio::select! {
                biased;
                result = budget.step("produce", current.produce(batch, compression)) => result,
                () = cut.cancelled() => Err(KafkaError::Straggler { partition }),
            },
            (Ok(()), None) => {
                unreachable!("a partition without a client looks its leader up first")
            }
            (Err(error), _) => Err(error),
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
            None if !matches!(
                error,
                KafkaError::Timeout { .. } | KafkaError::Straggler { .. }
            ) && budget.remaining() > pause + RETRY_FLOOR =>
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
                tokio::select! {
                    biased;
                    () = cut.cancelled() => {
                        // Cut during the pause: the error stands.
                        outcome.give_up(chunk, error);
                        continue;
                    }
                    () = tokio::time::sleep(pause) => {}
                }
                pause = backoff.next_delay();
                chunks.push(chunk);
            }
            None => outcome.give_up(chunk, error),
        }
    }
    if outcome.error.is_some() {
        outcome.state.retry = backoff;
    }
    outcome
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::outbox::kafka::errors::tests::server;

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
}
