//! A topic's side of the queues: its partition count read from metadata
//! (when unknown, and every `Timing::metadata_max_age`), what a failed
//! read does, which topics are watched.

use tokio::time::Instant;

use super::{Queues, route};
use crate::outbox::{
    partition::{Failing, Held, PartitionQueue},
    transport::{ErrorClass, SendError},
};

impl Queues {
    /// The partition count of `topic` was read at `now`. Returns the count
    /// before and after when it changed.
    pub(crate) fn set_partitions(
        &mut self,
        topic: &str,
        count: i32,
        now: Instant,
    ) -> Option<(usize, usize)> {
        self.watch(topic);
        let (timing, rng, retired) = (self.timing, &mut self.rng, &mut self.retired);
        let t = self.topics.get_mut(topic)?;
        t.fetching = false;
        t.fetched_at = Some(now);
        t.not_before = None;
        t.failing = None;
        t.retry.reset();
        let count = usize::try_from(count).unwrap_or(0).max(1);
        let before = t.partitions.len();
        if before > 0 && count != before {
            // A new layout (the topic grew, or was created again with
            // another count): every waiting row is routed again by the new
            // count, and each request on the way keeps its rows apart until
            // its answer, matched by its id, completes them. Queues are never
            // renumbered under a request.
            let mut waiting: Vec<Held> = Vec::new();
            for queue in &mut t.partitions {
                if let Some(request) = queue.on_the_way() {
                    retired.insert(request, (topic.to_owned(), queue.take_on_the_way()));
                }
                waiting.extend(queue.drain_waiting());
            }
            waiting.sort_by_key(|row| row.id);
            t.partitions.clear();
            t.unrouted.extend(waiting);
        }
        while t.partitions.len() < count {
            t.partitions.push(PartitionQueue::new(&timing, rng.fork()));
        }
        for row in std::mem::take(&mut t.unrouted) {
            route(t, row);
        }
        (before != count).then_some((before, count))
    }

    /// Reading `topic`'s partition count failed at `now`.
    pub(crate) fn metadata_failed(
        &mut self,
        topic: &str,
        error: &SendError,
        now: Instant,
    ) -> Option<Failing> {
        let fatal_pause = self.timing.fatal_pause;
        let t = self.topics.get_mut(topic)?;
        t.fetching = false;
        let pause = match error.class {
            ErrorClass::Retriable => t.retry.next_delay(),
            _ => fatal_pause,
        };
        t.not_before = Some(now + pause);
        if t.failing.as_ref().is_none_or(|f| f.code != error.code) {
            t.failing = Some(Failing {
                class: error.class,
                code: error.code.clone(),
                since: now,
            });
        }
        t.failing.clone()
    }

    /// A topic whose partition count is to be read now: unknown (or failed
    /// and its pause over), or older than `metadata_max_age`. It is marked
    /// as being read.
    pub(crate) fn metadata_due(&mut self, now: Instant) -> Option<String> {
        let max_age = self.timing.metadata_max_age;
        // A topic other than the pinned one is watched while it has rows
        // (a `republish --kafka-topic` of long ago is not read forever).
        let pinned = &self.pinned;
        self.topics.retain(|name, t| {
            name == pinned
                || t.fetching
                || !t.unrouted.is_empty()
                || t.partitions.iter().any(|q| q.len() > 0)
        });
        let (name, t) = self.topics.iter_mut().find(|(_, t)| {
            !t.fetching
                && t.not_before.is_none_or(|at| at <= now)
                && t.fetched_at.is_none_or(|at| at + max_age <= now)
        })?;
        t.fetching = true;
        Some(name.clone())
    }

    /// `topic`'s partition count is read again at the next chance: a
    /// request found the topic laid out otherwise than its rows were
    /// routed.
    pub(crate) fn read_again(&mut self, topic: &str) {
        let max_age = self.timing.metadata_max_age;
        if let Some(t) = self.topics.get_mut(topic) {
            // Due now, still known (the read is counted as `periodic`).
            t.fetched_at = t.fetched_at.and_then(|at| at.checked_sub(max_age));
            t.not_before = None;
        }
    }

    /// Whether the partition count of `topic` has been read.
    pub(crate) fn topic_known(&self, topic: &str) -> bool {
        self.topics
            .get(topic)
            .is_some_and(|t| t.fetched_at.is_some())
    }
}
