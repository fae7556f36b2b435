//! One partition's queue: the claimed rows waiting for it, oldest first,
//! the request on the way (at most one: a partition's records stay in
//! order and a row is never sent while an earlier send of it may still be
//! written), and the partition's own backoff. Pure: time comes in as an
//! argument.

use std::collections::VecDeque;

use chrono::{DateTime, Utc};
use tokio::time::Instant;

use crate::backoff::Backoff;

use super::{
    scan::Scan,
    timing::Timing,
    transport::{ErrorClass, OutgoingRecord, SendError},
};

/// A claimed row, waiting for its partition or on the way.
#[derive(Debug, Clone)]
pub(crate) struct Held {
    pub id: i64,
    pub record: OutgoingRecord,
    /// The key's partition hash: the row's partition is `key_hash %
    /// partitions`, for whatever count the topic has when it is routed.
    pub key_hash: i32,
    /// When the row was written (the outbox lag starts there).
    pub created_at: DateTime<Utc>,
    /// When its lease was taken or last renewed (renewal is due at half
    /// the lease from here).
    pub leased_at: Instant,
    /// When its lease ends, as last confirmed by the database: the row is
    /// not sent past it until a renewal confirms it is still this
    /// instance's (it may be another's by then).
    pub lease_until: Instant,
}

/// Why a partition's last try failed, while it lasts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Failing {
    pub class: ErrorClass,
    pub code: String,
    pub since: Instant,
}

/// What became of a failed request.
#[derive(Debug)]
pub(crate) enum Failed {
    /// The rows stay at the head of the queue and go again after the
    /// partition's pause ([`PartitionQueue::ready_at`]).
    Retry,
    /// The broker refused a request of several records: they go again in
    /// requests of half the size, at once.
    Split,
    /// The broker refused this row on its own: it leaves the queue to be
    /// parked with `reason`.
    Park { row: Box<Held>, reason: String },
}

#[derive(Debug)]
pub(crate) struct PartitionQueue {
    rows: VecDeque<Held>,
    /// The first `in_flight` rows are in the request on the way.
    in_flight: usize,
    /// That request's id (its answer is matched to it by id, never by the
    /// partition's place in a list).
    request: u64,
    /// No request before this (the partition's backoff).
    not_before: Option<Instant>,
    retry: Backoff,
    failing: Option<Failing>,
    /// After a refusal of several records: at most `cap` records per
    /// request until the `left` rows of the refused request are through.
    split: Option<(usize, usize)>,
    /// Where the next claim of this partition's rows starts.
    pub(crate) scan: Scan,
}

impl PartitionQueue {
    pub(crate) fn new(timing: &Timing, rng: fastrand::Rng) -> Self {
        Self {
            rows: VecDeque::new(),
            in_flight: 0,
            request: 0,
            not_before: None,
            retry: Backoff::with_rng(timing.retry_first, timing.retry_max, rng),
            failing: None,
            split: None,
            scan: Scan::default(),
        }
    }

    pub(crate) fn push(&mut self, row: Held) {
        self.rows.push_back(row);
    }

    /// Rows held: waiting and on the way.
    pub(crate) fn len(&self) -> usize {
        self.rows.len()
    }

    pub(crate) fn in_flight(&self) -> bool {
        self.in_flight > 0
    }

    /// The id of the request on the way, if one is.
    pub(crate) fn on_the_way(&self) -> Option<u64> {
        (self.in_flight > 0).then_some(self.request)
    }

    /// Takes the rows of the request on the way out of the queue (the
    /// topic is laid out anew: they wait for its answer elsewhere).
    pub(crate) fn take_on_the_way(&mut self) -> Vec<Held> {
        let sent = std::mem::take(&mut self.in_flight);
        self.rows.drain(..sent).collect()
    }

    /// The records of the next request, at most `max`, when the partition
    /// can send now: nothing on the way, its pause over, rows waiting. The
    /// request is known as `request` from now on.
    pub(crate) fn take(
        &mut self,
        now: Instant,
        max: usize,
        request: u64,
    ) -> Option<Vec<OutgoingRecord>> {
        if self.in_flight > 0 || self.rows.is_empty() || self.ready_at().is_some_and(|at| at > now)
        {
            return None;
        }
        let cap = self.split.map_or(max, |(cap, _)| cap.min(max)).max(1);
        let n = cap.min(self.rows.len());
        if self.rows.iter().take(n).any(|row| row.lease_until <= now) {
            // A lease ran out (the process was paused, or its renewal
            // failed): the renewal on its way says whether the rows are
            // still this instance's to send.
            return None;
        }
        self.in_flight = n;
        self.request = request;
        Some(
            self.rows
                .iter()
                .take(self.in_flight)
                .map(|row| row.record.clone())
                .collect(),
        )
    }

    /// When the partition may send again, while it pauses.
    pub(crate) fn ready_at(&self) -> Option<Instant> {
        self.not_before
    }

    /// The request on the way was acknowledged: its rows leave the queue.
    /// Returns them, and how long the partition had been failing if it was.
    pub(crate) fn acked(&mut self) -> (Vec<Held>, Option<Failing>) {
        let sent = std::mem::take(&mut self.in_flight);
        let rows: Vec<Held> = self.rows.drain(..sent).collect();
        self.retry.reset();
        self.not_before = None;
        if let Some((cap, left)) = self.split {
            self.split = (left > sent).then(|| (cap, left - sent));
        }
        let recovered = self.failing.take();
        (rows, recovered)
    }

    /// The request on the way failed with `error` at `now`.
    pub(crate) fn failed(&mut self, error: &SendError, now: Instant, timing: &Timing) -> Failed {
        let sent = std::mem::take(&mut self.in_flight);
        if self
            .failing
            .as_ref()
            .is_none_or(|f| f.code != error.code || f.class != error.class)
        {
            self.failing = Some(Failing {
                class: error.class,
                code: error.code.clone(),
                since: now,
            });
        }
        match error.class {
            ErrorClass::Refused if sent > 1 => {
                // Within an earlier split, its region stays the one to get through.
                let left = self.split.map_or(sent, |(_, left)| left.max(sent));
                self.split = Some((sent / 2, left));
                self.not_before = None;
                Failed::Split
            }
            ErrorClass::Refused => {
                let Some(row) = self.rows.pop_front() else {
                    // Nothing was on the way (the queue was reset): nothing to park.
                    return Failed::Retry;
                };
                if let Some((cap, left)) = self.split {
                    self.split = (left > 1).then(|| (cap, left - 1));
                }
                self.failing = None;
                Failed::Park {
                    row: Box::new(row),
                    reason: format!("{}: {}", error.code, error.message),
                }
            }
            ErrorClass::Retriable => {
                self.not_before = Some(now + self.retry.next_delay());
                Failed::Retry
            }
            ErrorClass::Fatal => {
                self.not_before = Some(now + timing.fatal_pause);
                Failed::Retry
            }
        }
    }

    /// The last try failed (and its rows still wait).
    pub(crate) fn failing(&self) -> Option<&Failing> {
        self.failing.as_ref().filter(|_| !self.rows.is_empty())
    }

    pub(crate) fn rows(&self) -> impl Iterator<Item = &Held> {
        self.rows.iter()
    }

    pub(crate) fn rows_mut(&mut self) -> impl Iterator<Item = &mut Held> {
        self.rows.iter_mut()
    }

    /// Takes the rows that are not on the way (the topic is re-routed).
    pub(crate) fn drain_waiting(&mut self) -> Vec<Held> {
        self.rows.drain(self.in_flight..).collect()
    }

    /// Drops the waiting rows among `ids` (their lease is another
    /// instance's now); returns how many. Rows on the way stay until
    /// answered (their mark will not apply).
    pub(crate) fn drop_waiting(&mut self, ids: &std::collections::HashSet<i64>) -> usize {
        let before = self.rows.len();
        let mut index = 0;
        let in_flight = self.in_flight;
        self.rows.retain(|row| {
            let keep = index < in_flight || !ids.contains(&row.id);
            index += 1;
            keep
        });
        before - self.rows.len()
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::events::Headers;

    fn row(id: i64, now: Instant) -> Held {
        Held {
            id,
            record: OutgoingRecord {
                key: format!("k{id}"),
                value: vec![],
                headers: Headers::default(),
            },
            key_hash: 0,
            created_at: DateTime::UNIX_EPOCH,
            leased_at: now,
            lease_until: now + Duration::from_secs(15),
        }
    }

    fn queue(ids: std::ops::Range<i64>, now: Instant) -> PartitionQueue {
        let mut q = PartitionQueue::new(&Timing::default(), fastrand::Rng::with_seed(1));
        for id in ids {
            q.push(row(id, now));
        }
        q
    }

    fn keys(records: &[OutgoingRecord]) -> Vec<&str> {
        records.iter().map(|r| r.key.as_str()).collect()
    }

    #[test]
    fn one_request_at_a_time_in_order() {
        let t0 = Instant::now();
        let mut q = queue(0..5, t0);
        assert_eq!(keys(&q.take(t0, 3, 1).unwrap()), ["k0", "k1", "k2"]);
        assert!(
            q.take(t0, 3, 1).is_none(),
            "nothing while a request is on the way"
        );
        let (acked, recovered) = q.acked();
        assert_eq!(acked.iter().map(|r| r.id).collect::<Vec<_>>(), [0, 1, 2]);
        assert!(recovered.is_none());
        assert_eq!(keys(&q.take(t0, 3, 1).unwrap()), ["k3", "k4"]);
    }

    #[test]
    fn a_retriable_failure_pauses_and_sends_the_same_rows_again() {
        let t0 = Instant::now();
        let timing = Timing::default();
        let mut q = queue(0..2, t0);
        q.take(t0, 10, 1).unwrap();
        let error = SendError::new(ErrorClass::Retriable, "NOT_ENOUGH_REPLICAS", "x");
        assert!(matches!(q.failed(&error, t0, &timing), Failed::Retry));
        let pause = q.ready_at().unwrap() - t0;
        assert!(pause >= timing.retry_first / 2 && pause <= timing.retry_first);
        assert!(q.take(t0 + pause / 2, 10, 1).is_none(), "pausing");
        assert!(q.failing().is_some());
        let later = t0 + pause;
        assert_eq!(keys(&q.take(later, 10, 1).unwrap()), ["k0", "k1"]);
        // The pauses grow to the cap and no further.
        let mut now = later;
        for _ in 0..10 {
            assert!(matches!(q.failed(&error, now, &timing), Failed::Retry));
            let pause = q.ready_at().unwrap() - now;
            assert!(pause <= timing.retry_max);
            now += pause;
            q.take(now, 10, 1).unwrap();
        }
        let (acked, recovered) = q.acked();
        assert_eq!(acked.len(), 2);
        assert_eq!(
            recovered.unwrap().since,
            t0,
            "failing since the first failure"
        );
        assert!(q.failing().is_none());
    }

    #[test]
    fn a_fatal_failure_pauses_for_the_fatal_pause() {
        let t0 = Instant::now();
        let timing = Timing::default();
        let mut q = queue(0..1, t0);
        q.take(t0, 10, 1).unwrap();
        let error = SendError::new(ErrorClass::Fatal, "TOPIC_AUTHORIZATION_FAILED", "x");
        q.failed(&error, t0, &timing);
        assert!(
            q.take(t0 + timing.fatal_pause - Duration::from_millis(1), 10, 1)
                .is_none()
        );
        assert!(q.take(t0 + timing.fatal_pause, 10, 1).is_some());
    }

    #[test]
    fn a_refused_request_is_split_down_to_the_record_at_fault() {
        let t0 = Instant::now();
        let timing = Timing::default();
        let mut q = queue(0..4, t0);
        let refused = SendError::new(ErrorClass::Refused, "MESSAGE_TOO_LARGE", "too large");
        q.take(t0, 10, 1).unwrap();
        assert!(matches!(q.failed(&refused, t0, &timing), Failed::Split));
        assert_eq!(keys(&q.take(t0, 10, 1).unwrap()), ["k0", "k1"]);
        assert!(matches!(q.failed(&refused, t0, &timing), Failed::Split));
        assert_eq!(keys(&q.take(t0, 10, 1).unwrap()), ["k0"]);
        q.acked();
        assert_eq!(keys(&q.take(t0, 10, 1).unwrap()), ["k1"]);
        let Failed::Park {
            row: parked,
            reason,
        } = q.failed(&refused, t0, &timing)
        else {
            panic!("park")
        };
        assert_eq!(
            (parked.id, reason.as_str()),
            (1, "MESSAGE_TOO_LARGE: too large")
        );
        assert_eq!(keys(&q.take(t0, 10, 1).unwrap()), ["k2"], "still split");
        q.acked();
        assert_eq!(keys(&q.take(t0, 10, 1).unwrap()), ["k3"]);
        q.acked();
        q.push(row(4, t0));
        q.push(row(5, t0));
        assert_eq!(
            keys(&q.take(t0, 10, 1).unwrap()),
            ["k4", "k5"],
            "whole again"
        );
    }
}
