//! The pipeline's database side: one round at a time, in one short
//! transaction (the `Store`): the marks and parks since the last round,
//! the leases to renew or release, and a claim when rows may be waiting and
//! the queues have room. Claimed rows go to their partition's queue.

use std::sync::Arc;

use tokio::time::Instant;

use super::{CORRUPT_ROW, Run};
use crate::{
    db::{DbError, outbox::Claim},
    handoff::{HandedRows, LeasedRow},
    outbox::{
        partition::Held,
        store::{Round, RoundResult, Store},
        transport::{OutgoingRecord, Transport},
    },
    telemetry::ErrorChain,
};

impl<T: Transport, S: Store> Run<'_, T, S> {
    /// Starts a database round when one is due and none is on the way.
    pub(super) fn start_round(&mut self, now: Instant) {
        if self.round.is_none() && now >= self.database_ready_at && !self.released {
            let release = std::mem::take(&mut self.release_next);
            self.start_round_with(release, now);
        }
    }

    /// Rows the expiry of this process wrote leased to it: each to its
    /// partition's queue, or released for any claim when it has no room
    /// (a partition that cannot be written holds its share and no more).
    pub(super) fn handed(&mut self, handed: HandedRows) {
        for row in handed.rows {
            if self.queues.has_room(&row.topic, row.partition_hash()) {
                self.claimed(row, handed.leased_at);
            } else {
                self.parts.metrics.outbox_handoff_released.inc();
                self.release_next.push(row.id);
            }
        }
    }

    pub(super) fn start_round_with(&mut self, release: Vec<i64>, now: Instant) {
        let timing = self.parts.timing;
        let mut renew = std::mem::take(&mut self.renew_again);
        renew.extend(self.queues.renew_due(now));
        let room = self.queues.room();
        let claim = (self.stopping.is_none() && self.more && !room.is_empty()).then(|| Claim {
            limit: room.limit as u32,
            lease: timing.lease,
            skip_topics: room.skip_topics.clone(),
            routed_topics: room.routed_topics.clone(),
            partitions: room.partitions.clone(),
        });
        let round = Round {
            published: std::mem::take(&mut self.published),
            parked: std::mem::take(&mut self.parked),
            renew,
            lease: timing.lease,
            release,
            claim,
            layouts: std::mem::take(&mut self.layouts),
        };
        if round.is_empty() {
            return;
        }
        if let Some(claim) = &round.claim {
            // Taken now: what arrives from here on (a notification, a
            // partition that drained) asks for the next claim.
            self.more = false;
            self.queues.claim_asked(&claim.partitions, now);
            self.skipped = room;
        }
        let store = Arc::clone(&self.parts.store);
        self.round = Some(tokio::spawn(async move {
            let result = store.round(round.clone()).await;
            (round, result, now)
        }));
    }

    pub(super) fn round_done(
        &mut self,
        round: Round,
        result: Result<RoundResult, DbError>,
        started: Instant,
        now: Instant,
    ) {
        match result {
            Ok(RoundResult {
                claimed: rows,
                lost,
                relayout_left,
            }) => {
                // Rows still to lay out: again with the next round.
                self.layouts.extend(
                    round
                        .layouts
                        .iter()
                        .filter(|(topic, _)| relayout_left.contains(topic))
                        .cloned(),
                );
                let renewed: Vec<i64> = round
                    .renew
                    .iter()
                    .copied()
                    .filter(|id| !lost.contains(id))
                    .collect();
                self.queues.renewed(&renewed, started + round.lease);
                if !lost.is_empty() {
                    let dropped = self.queues.drop_lost(&lost);
                    tracing::warn!(
                        rows = lost.len(),
                        dropped,
                        "leases found held by another instance (this one was paused past them): their rows are left to it, not sent from here"
                    );
                }
                self.database_retry.reset();
                if self.reports.recovered("database") {
                    tracing::info!("outbox database rounds succeed again");
                }
                if let Some(claim) = &round.claim {
                    let took = Took::of(claim, &rows);
                    if took.filled(claim) {
                        self.more = true;
                    }
                    for (asked, (taken, last)) in claim.partitions.iter().zip(took.partitions) {
                        self.queues.claimed_through(asked, taken, last, now);
                    }
                }
                if !round.release.is_empty() {
                    // Released behind the scans (the statement notifies
                    // the other instances).
                    self.queues.rows_announced();
                }
                for (topic, _) in &round.layouts {
                    // Rows laid out into its partitions, behind their scans.
                    self.queues.claim_from_start(topic);
                }
                self.done.parked += round.parked.len() as u64;
                for row in rows {
                    self.claimed(row, started);
                }
            }
            Err(error) => {
                self.parts.metrics.outbox_publish_errors.inc();
                let pause = self.database_retry.next_delay();
                self.database_ready_at = now + pause;
                if self.reports.failed("database", now).is_some() {
                    tracing::warn!(error = %ErrorChain(&error), retry_in_ms = pause.as_millis() as u64, "outbox database round failed; acknowledged rows are marked with the next round, the rows stay in the outbox");
                }
                self.published.extend(round.published);
                self.parked.extend(round.parked);
                self.layouts.extend(round.layouts);
                self.renew_again.extend(round.renew);
                if round.claim.is_some() {
                    self.more = true;
                }
                if self.released && !round.release.is_empty() {
                    // Stopping: the leases end on their own.
                    tracing::warn!(
                        rows = round.release.len(),
                        "could not release the rows this instance held; another instance takes them when their lease ends"
                    );
                } else {
                    self.release_next.extend(round.release);
                }
            }
        }
    }

    /// A claimed row: to its partition's queue, or parked when it cannot
    /// become a record.
    fn claimed(&mut self, row: LeasedRow, leased_at: Instant) {
        if let Some(defect) = row.defect() {
            tracing::warn!(event_id = %row.event_id, reason = %defect, "outbox row parked: it is not a record");
            self.parked
                .push((row.id, format!("{CORRUPT_ROW}: {defect}")));
            return;
        }
        let key_hash = row.partition_hash();
        let Ok(headers) = row.headers else { return };
        let held = Held {
            id: row.id,
            key_hash,
            record: OutgoingRecord {
                key: row.message_key,
                value: row.payload,
                headers,
            },
            created_at: row.created_at,
            leased_at,
            lease_until: leased_at + self.parts.timing.lease,
        };
        self.queues.add(&row.topic, held);
    }
}

/// What a claim took: per partition it asked, how many rows and the
/// greatest id among them; and the rows outside the partitions' branches.
struct Took {
    partitions: Vec<(u32, i64)>,
    unrouted: u32,
}

impl Took {
    fn of(claim: &Claim, rows: &[LeasedRow]) -> Self {
        let mut took = Self {
            partitions: vec![(0, 0); claim.partitions.len()],
            unrouted: 0,
        };
        for row in rows {
            // A row of its partition's branch: written for the count the
            // claim asked with. The others came within `limit`.
            let partition = row.key_hash.and_then(|hash| {
                claim
                    .partitions
                    .iter()
                    .position(|p| row.partition_count == Some(p.count) && p.holds(&row.topic, hash))
            });
            match partition {
                Some(i) => {
                    let (taken, last) = &mut took.partitions[i];
                    *taken += 1;
                    *last = (*last).max(row.id);
                }
                None => took.unrouted += 1,
            }
        }
        took
    }

    /// Whether the claim took all it asked for somewhere (more rows may
    /// wait): a partition its whole room, or the unrouted rows their limit.
    fn filled(&self, claim: &Claim) -> bool {
        self.unrouted >= claim.limit
            || claim
                .partitions
                .iter()
                .zip(&self.partitions)
                .any(|(p, (taken, _))| *taken >= p.room)
    }
}
