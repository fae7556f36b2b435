//! The partition queues (the Java producer's accumulator): claimed rows
//! routed by topic and partition, what is ready to send, what the next
//! claim may take, and the leases of the rows held. Pure: time comes in as
//! an argument, and the pipeline does the I/O.
//!
//! Memory is bounded: at most `max_held` rows in all. Each partition holds
//! at most its share, `max_held / (4 × the partitions)` (at least one
//! row): a claim asks each partition for the room it has left below its
//! share, and the rows of a topic whose partitions are not known yet for
//! at most a share. However many partitions stop taking records, their
//! rows fill at most a quarter of `max_held`.
//!
//! Fair by construction: a claim asks each partition for its own rows
//! (oldest first within the partition), so a partition draining a backlog
//! takes only its own room, and the other partitions' new rows are claimed
//! in the same round, as the Java producer appends to each partition's
//! queue on its own.

mod leases;
mod topics;

use std::collections::{BTreeMap, VecDeque};

use tokio::time::Instant;

use crate::{
    backoff::Backoff,
    db::outbox::{PartitionRoom, RoutedTopic},
};

use super::{
    partition::{Failed, Failing, Held, PartitionQueue},
    timing::Timing,
    transport::{OutgoingRecord, SendError},
};

/// A request to send: one partition's next records.
#[derive(Debug)]
pub(crate) struct Send {
    /// The request's id: its answer is matched to it by this.
    pub request: u64,
    pub topic: String,
    pub partition: i32,
    /// The partition count the records were routed for.
    pub partitions: i32,
    pub records: Vec<OutgoingRecord>,
}

/// What the next claim may take.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Room {
    /// Rows of topics whose partitions are not known.
    pub limit: usize,
    pub skip_topics: Vec<String>,
    /// Topics whose partitions are known, with their count.
    pub routed_topics: Vec<RoutedTopic>,
    /// The partitions with room, and how much.
    pub partitions: Vec<PartitionRoom>,
    /// The partitions without room: `(topic, partition)`. Once one of them
    /// sends, the next claim may take its rows.
    pub full: Vec<(String, i32)>,
}

impl Room {
    /// Whether the claim asks for nothing.
    pub(crate) fn is_empty(&self) -> bool {
        self.limit == 0 && self.partitions.is_empty()
    }
}

/// The partitions that cannot be written now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Failures<'a> {
    pub failing: usize,
    /// Of those, failing with an error no retry fixes.
    pub fatal: usize,
    /// The Kafka error of one of them (a non-retriable one first).
    pub code: Option<&'a str>,
}

/// What became of a request, for the pipeline to act on.
#[derive(Debug, Default)]
pub(crate) struct Completed {
    /// Rows the broker acknowledged.
    pub acked: Vec<Held>,
    /// A row the broker refused for good, and why.
    pub parked: Option<(Held, String)>,
    /// The partition publishes again after failing (how it failed).
    pub recovered: Option<Failing>,
}

#[derive(Debug)]
struct Topic {
    /// Empty until the partition count is known.
    partitions: Vec<PartitionQueue>,
    /// Rows claimed before the count is known.
    unrouted: VecDeque<Held>,
    fetched_at: Option<Instant>,
    not_before: Option<Instant>,
    retry: Backoff,
    failing: Option<Failing>,
    fetching: bool,
}

/// Every partition queue of the publisher.
#[derive(Debug)]
pub(crate) struct Queues {
    topics: BTreeMap<String, Topic>,
    /// The last request id given out.
    last_request: u64,
    /// Requests on the way when their topic was laid out anew (its
    /// partition count changed): their rows, by request id, until answered.
    retired: BTreeMap<u64, (String, Vec<Held>)>,
    /// The topic whose metadata is read even with no rows (readiness).
    pinned: String,
    timing: Timing,
    /// At most this many records per request.
    request_max: usize,
    max_held: usize,
    held: usize,
    rng: fastrand::Rng,
}

impl Queues {
    /// Queues that always watch `pinned` (its metadata is read even with
    /// no rows: the broker's readiness check).
    pub(crate) fn new(
        pinned: &str,
        timing: Timing,
        request_max: usize,
        max_held: usize,
        rng: fastrand::Rng,
    ) -> Self {
        let mut queues = Self {
            pinned: pinned.to_owned(),
            topics: BTreeMap::new(),
            last_request: 0,
            retired: BTreeMap::new(),
            timing,
            request_max: request_max.max(1),
            max_held: max_held.max(1),
            held: 0,
            rng,
        };
        queues.watch(pinned);
        queues
    }

    /// Makes `topic` known (its metadata is read even before rows arrive).
    pub(crate) fn watch(&mut self, topic: &str) {
        if !self.topics.contains_key(topic) {
            let topic_state = Topic {
                partitions: Vec::new(),
                unrouted: VecDeque::new(),
                fetched_at: None,
                not_before: None,
                retry: Backoff::with_rng(
                    self.timing.retry_first,
                    self.timing.retry_max,
                    self.rng.fork(),
                ),
                failing: None,
                fetching: false,
            };
            self.topics.insert(topic.to_owned(), topic_state);
        }
    }

    /// Rows held: waiting and on the way.
    pub(crate) fn held(&self) -> usize {
        self.held
    }

    /// A partition's share of `max_held`: what it holds at most.
    fn share(&self) -> usize {
        let known: usize = self
            .topics
            .values()
            .map(|t| t.partitions.len().max(1))
            .sum();
        (self.max_held / (4 * known.max(1))).max(1)
    }

    /// Whether the queue of the row of `topic` with `key_hash` can take it
    /// now (a row handed over by the expiry, which no claim sized).
    pub(crate) fn has_room(&self, topic: &str, key_hash: i32) -> bool {
        if self.held >= self.max_held {
            return false;
        }
        let share = self.share();
        match self.topics.get(topic) {
            Some(t) if !t.partitions.is_empty() => {
                t.partitions[partition_of(key_hash, t.partitions.len())].len() < share
            }
            Some(t) => t.unrouted.len() < share,
            None => true,
        }
    }

    /// Adds a claimed row to its partition's queue.
    pub(crate) fn add(&mut self, topic: &str, row: Held) {
        self.watch(topic);
        self.held += 1;
        if let Some(t) = self.topics.get_mut(topic) {
            route(t, row);
        }
    }

    /// The requests that can go now: one per partition that has rows, has
    /// nothing on the way and is not pausing.
    pub(crate) fn ready(&mut self, now: Instant) -> Vec<Send> {
        let max = self.request_max;
        let mut sends = Vec::new();
        for (topic, t) in &mut self.topics {
            let partitions = t.partitions.len() as i32;
            for (partition, queue) in t.partitions.iter_mut().enumerate() {
                let request = self.last_request + 1;
                if let Some(records) = queue.take(now, max, request) {
                    self.last_request = request;
                    sends.push(Send {
                        request,
                        topic: topic.clone(),
                        partition: partition as i32,
                        partitions,
                        records,
                    });
                }
            }
        }
        sends
    }

    /// The request `request` to `partition` of `topic` ended with `result`
    /// at `now`. The answer is matched to its request by id: a request of
    /// a layout that changed since it left completes the rows it carried,
    /// whatever queue now has that partition's number.
    pub(crate) fn complete(
        &mut self,
        topic: &str,
        partition: i32,
        request: u64,
        result: &Result<(), SendError>,
        now: Instant,
    ) -> Completed {
        let timing = self.timing;
        let queue = self
            .topics
            .get_mut(topic)
            .and_then(|t| t.partitions.get_mut(usize::try_from(partition).ok()?))
            .filter(|queue| queue.on_the_way() == Some(request));
        let Some(queue) = queue else {
            return self.complete_retired(request, result);
        };
        let completed = match result {
            Ok(()) => {
                let (acked, recovered) = queue.acked();
                Completed {
                    acked,
                    parked: None,
                    recovered,
                }
            }
            Err(error) => match queue.failed(error, now, &timing) {
                Failed::Park { row, reason } => Completed {
                    parked: Some((*row, reason)),
                    ..Completed::default()
                },
                Failed::Retry | Failed::Split => Completed::default(),
            },
        };
        self.held -= completed.acked.len() + usize::from(completed.parked.is_some());
        completed
    }

    /// The answer of a request whose topic was laid out anew while it was
    /// on the way: acknowledged, its rows are done; failed, they are routed
    /// again by the topic's new count. An id no one knows (the queues were
    /// emptied at shutdown) completes nothing.
    fn complete_retired(&mut self, request: u64, result: &Result<(), SendError>) -> Completed {
        let Some((topic, rows)) = self.retired.remove(&request) else {
            return Completed::default();
        };
        match result {
            Ok(()) => {
                self.held -= rows.len();
                Completed {
                    acked: rows,
                    ..Completed::default()
                }
            }
            Err(_) => {
                if let Some(t) = self.topics.get_mut(&topic) {
                    for row in rows {
                        route(t, row);
                    }
                }
                Completed::default()
            }
        }
    }

    /// The earliest time something pauses until: a partition with rows, or
    /// a topic's next metadata read.
    pub(crate) fn next_wake(&self) -> Option<Instant> {
        let max_age = self.timing.metadata_max_age;
        self.topics
            .values()
            .flat_map(|t| {
                let partitions = t
                    .partitions
                    .iter()
                    .filter(|q| q.len() > 0 && !q.in_flight())
                    .filter_map(PartitionQueue::ready_at);
                let metadata = (!t.fetching)
                    .then(|| t.not_before.or(t.fetched_at.map(|at| at + max_age)))
                    .flatten();
                partitions.chain(metadata)
            })
            .min()
    }

    /// What the next claim may take: each known partition the room it has
    /// below its share, and up to a share of rows of the topics whose
    /// partitions are not known (the room left permitting), less the topics
    /// that hold a share.
    pub(crate) fn room(&self) -> Room {
        let share = self.share();
        let mut room = Room {
            limit: self
                .max_held
                .saturating_sub(self.held)
                .min(self.request_max)
                .min(share),
            ..Room::default()
        };
        for (name, t) in &self.topics {
            if t.partitions.is_empty() {
                if t.unrouted.len() >= share {
                    room.skip_topics.push(name.clone());
                }
                continue;
            }
            let count = t.partitions.len() as i32;
            room.routed_topics.push(RoutedTopic {
                topic: name.clone(),
                count,
            });
            for (partition, queue) in t.partitions.iter().enumerate() {
                match share.saturating_sub(queue.len()) {
                    0 => room.full.push((name.clone(), partition as i32)),
                    free => room.partitions.push(PartitionRoom {
                        topic: name.clone(),
                        count,
                        partition: partition as i32,
                        room: u32::try_from(free).unwrap_or(u32::MAX),
                        after: queue.scan.after(),
                    }),
                }
            }
        }
        room
    }

    /// A claim is on its way with `partitions`, asked at `now` (see
    /// [`Scan`](crate::outbox::scan::Scan)).
    pub(crate) fn claim_asked(&mut self, partitions: &[PartitionRoom], now: Instant) {
        for asked in partitions {
            if let Some(queue) = self.queue_asked(asked) {
                queue.scan.asked(now);
            }
        }
    }

    /// A claim `asked` a partition for its room and took `taken` rows, the
    /// greatest id of them `last`; where the partition's next claim starts
    /// ([`Scan`](crate::outbox::scan::Scan)).
    pub(crate) fn claimed_through(
        &mut self,
        asked: &PartitionRoom,
        taken: u32,
        last: i64,
        now: Instant,
    ) {
        let lease = self.timing.lease;
        if let Some(queue) = self.queue_asked(asked) {
            queue
                .scan
                .claimed(asked.after, asked.room, (taken, last), now, lease);
        }
    }

    /// The queue a claim asked for, while the topic has the partition
    /// count it was asked with.
    fn queue_asked(&mut self, asked: &PartitionRoom) -> Option<&mut PartitionQueue> {
        self.topics
            .get_mut(&asked.topic)
            .filter(|t| t.partitions.len() == usize::try_from(asked.count).unwrap_or(0))
            .and_then(|t| t.partitions.get_mut(usize::try_from(asked.partition).ok()?))
    }

    /// Rows may have come back behind every partition's scan: a commit
    /// notification (a late commit, a release, rows put back from the
    /// parked ones), or rows this instance released.
    pub(crate) fn rows_announced(&mut self) {
        for queue in self.topics.values_mut().flat_map(|t| &mut t.partitions) {
            queue.scan.announce();
        }
    }

    /// The next claim of each partition of `topic` starts at its first row
    /// (rows were laid out into its partitions behind their scans).
    pub(crate) fn claim_from_start(&mut self, topic: &str) {
        if let Some(t) = self.topics.get_mut(topic) {
            for queue in &mut t.partitions {
                queue.scan.restart();
            }
        }
    }

    /// Partitions (and topics) whose last try failed and whose rows wait:
    /// how many, how many of them with a non-retriable error, and the
    /// Kafka error of one (a non-retriable one first).
    pub(crate) fn failing(&self) -> Failures<'_> {
        let mut failing = Vec::new();
        for t in self.topics.values() {
            failing.extend(
                t.failing
                    .iter()
                    .filter(|_| !t.unrouted.is_empty() || t.partitions.is_empty()),
            );
            failing.extend(t.partitions.iter().filter_map(PartitionQueue::failing));
        }
        let fatal: Vec<&Failing> = failing
            .iter()
            .copied()
            .filter(|f| f.class != super::transport::ErrorClass::Retriable)
            .collect();
        Failures {
            failing: failing.len(),
            fatal: fatal.len(),
            code: fatal.first().or(failing.first()).map(|f| f.code.as_str()),
        }
    }
}

/// Puts `row` in its partition's queue, or with the unrouted rows while
/// the count is unknown.
fn route(t: &mut Topic, row: Held) {
    if t.partitions.is_empty() {
        t.unrouted.push_back(row);
        return;
    }
    let partition = partition_of(row.key_hash, t.partitions.len());
    t.partitions[partition].push(row);
}

/// The partition of the row with `key_hash` among `count` (at least one):
/// `key_hash % count`, the Java partitioner's choice, as the hash is
/// positive (`events::key_hash`); `rem_euclid` keeps even a stored value
/// that is not in range.
fn partition_of(key_hash: i32, count: usize) -> usize {
    let count = i32::try_from(count).unwrap_or(i32::MAX);
    key_hash.rem_euclid(count) as usize
}
