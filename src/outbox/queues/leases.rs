//! The leases of the rows held: which are due for renewal (half their
//! lease gone) and, when the publisher stops, every row to release.

use tokio::time::Instant;

use super::Queues;
use crate::outbox::partition::{Held, PartitionQueue};

impl Queues {
    /// The ids of rows whose lease reaches its half by `now`; their lease
    /// is counted from `now` on (the renewal is on its way).
    pub(crate) fn renew_due(&mut self, now: Instant) -> Vec<i64> {
        let half = self.timing.lease / 2;
        let mut due = Vec::new();
        for row in self.rows_mut() {
            if row.leased_at + half <= now {
                row.leased_at = now;
                due.push(row.id);
            }
        }
        due
    }

    /// The database confirmed the leases of `ids` until `until`.
    pub(crate) fn renewed(&mut self, ids: &[i64], until: Instant) {
        if ids.is_empty() {
            return;
        }
        let ids: std::collections::HashSet<i64> = ids.iter().copied().collect();
        for row in self.rows_mut() {
            if ids.contains(&row.id) {
                row.lease_until = row.lease_until.max(until);
            }
        }
    }

    /// When the next lease reaches its half.
    pub(crate) fn next_renewal(&self) -> Option<Instant> {
        let half = self.timing.lease / 2;
        self.rows().map(|row| row.leased_at + half).min()
    }

    /// Drops the rows among `ids` that wait (not on the way): their lease
    /// is another instance's now, so this one must not send them. Returns
    /// how many.
    pub(crate) fn drop_lost(&mut self, ids: &[i64]) -> usize {
        let ids: std::collections::HashSet<i64> = ids.iter().copied().collect();
        let mut dropped = 0;
        for t in self.topics.values_mut() {
            let before = t.unrouted.len();
            t.unrouted.retain(|row| !ids.contains(&row.id));
            dropped += before - t.unrouted.len();
            for queue in &mut t.partitions {
                dropped += queue.drop_waiting(&ids);
            }
        }
        self.held -= dropped;
        dropped
    }

    /// Empties every queue (the publisher stops); returns the ids.
    pub(crate) fn release_all(&mut self) -> Vec<i64> {
        let ids = self.rows().map(|row| row.id).collect();
        self.retired.clear();
        for t in self.topics.values_mut() {
            t.unrouted.clear();
            for queue in &mut t.partitions {
                *queue = PartitionQueue::new(&self.timing, self.rng.fork());
            }
        }
        self.held = 0;
        ids
    }

    /// Every row held: waiting, on the way, and on the way in a request
    /// of an older layout of its topic.
    fn rows(&self) -> impl Iterator<Item = &Held> {
        self.topics
            .values()
            .flat_map(|t| {
                t.unrouted
                    .iter()
                    .chain(t.partitions.iter().flat_map(PartitionQueue::rows))
            })
            .chain(self.retired.values().flat_map(|(_, rows)| rows))
    }

    fn rows_mut(&mut self) -> impl Iterator<Item = &mut Held> {
        self.topics
            .values_mut()
            .flat_map(|t| {
                t.unrouted
                    .iter_mut()
                    .chain(t.partitions.iter_mut().flat_map(PartitionQueue::rows_mut))
            })
            .chain(self.retired.values_mut().flat_map(|(_, rows)| rows))
    }
}
