//! [`MemoryStore`]: an outbox in memory, with the claim's rules (oldest
//! first within each partition past where its last scan stopped, each
//! partition up to its room, leases, skipped topics).

use std::{
    collections::BTreeMap,
    sync::{Arc, Mutex, MutexGuard},
};

use chrono::{DateTime, Utc};
use tokio::time::Instant;
use uuid::Uuid;

use crate::{
    db::DbError,
    events::{Headers, key_hash},
    handoff::{LeaseOwner, LeasedRow},
    outbox::store::{Round, RoundResult, Store},
};

#[derive(Debug, Clone)]
struct Row {
    topic: String,
    key: String,
    key_hash: i32,
    headers: Headers,
    created_at: DateTime<Utc>,
    published: bool,
    parked: Option<String>,
    leased_until: Option<Instant>,
    /// Whose lease it is (set with the lease, cleared on release).
    owner: Option<LeaseOwner>,
}

impl Row {
    /// The row as a claim returns it.
    fn claimed(&self, id: i64, partition_count: Option<i32>) -> LeasedRow {
        LeasedRow {
            id,
            event_id: Uuid::nil(),
            topic: self.topic.clone(),
            message_key: self.key.clone(),
            payload: Vec::new(),
            headers: Ok(self.headers.clone()),
            created_at: self.created_at,
            key_hash: Some(self.key_hash),
            partition_count,
        }
    }
}

#[derive(Debug, Default)]
struct State {
    rows: BTreeMap<i64, Row>,
    /// Ids of the rows neither published nor parked (what a claim scans,
    /// as the partial index does).
    open: std::collections::BTreeSet<i64>,
    next_id: i64,
    fail_rounds: usize,
    /// How long a round takes (a database's round trip and statements).
    round_time: std::time::Duration,
    rounds: usize,
    /// The largest number of rows claimed and not yet published, parked
    /// or released at once.
    max_claimed: usize,
}

/// An outbox in memory; clones share it (and its instance's token:
/// [`MemoryStore::another_instance`] gives a second instance the same rows).
#[derive(Debug, Clone, Default)]
pub struct MemoryStore {
    state: Arc<Mutex<State>>,
    owner: LeaseOwner,
    /// This instance's rounds wait until then (it is frozen).
    frozen_until: Arc<Mutex<Option<Instant>>>,
}

impl MemoryStore {
    pub fn new() -> Self {
        Self::default()
    }

    /// The same outbox as seen by another publisher instance (a token of
    /// its own).
    pub fn another_instance(&self) -> Self {
        Self {
            state: Arc::clone(&self.state),
            owner: LeaseOwner::new(),
            frozen_until: Arc::default(),
        }
    }

    /// This instance's database rounds wait until `until` before they
    /// apply (the process paused: a frozen VM, SIGSTOP, a long stall);
    /// other instances' rounds go on.
    pub fn freeze_until(&self, until: Instant) {
        *self
            .frozen_until
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner()) = Some(until);
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Adds an unpublished row for `key` (its `ce_id` header is a fresh
    /// id); returns its id.
    pub fn insert(&self, topic: &str, key: &str) -> i64 {
        let mut state = self.state();
        state.next_id += 1;
        let id = state.next_id;
        let headers = Headers::from_static([("ce_id", Uuid::new_v4().to_string())]);
        state.rows.insert(
            id,
            Row {
                topic: topic.to_owned(),
                key: key.to_owned(),
                key_hash: key_hash(key),
                headers,
                created_at: DateTime::UNIX_EPOCH,
                published: false,
                parked: None,
                leased_until: None,
                owner: None,
            },
        );
        state.open.insert(id);
        id
    }

    /// Adds an unpublished row for `key` leased for `lease` from now, as
    /// the expiry of `run` writes it; returns it as the handoff carries it.
    pub fn insert_leased(&self, topic: &str, key: &str, lease: std::time::Duration) -> LeasedRow {
        let id = self.insert(topic, key);
        let mut state = self.state();
        let row = state.rows.get_mut(&id).expect("just inserted");
        row.leased_until = Some(Instant::now() + lease);
        row.owner = Some(self.owner);
        row.claimed(id, None)
    }

    /// The next `n` rounds fail (the database is gone).
    pub fn fail_rounds(&self, n: usize) {
        self.state().fail_rounds = n;
    }

    /// Each round from now on takes `time` before it applies (a busy
    /// database).
    pub fn set_round_time(&self, time: std::time::Duration) {
        self.state().round_time = time;
    }

    pub fn published(&self) -> usize {
        self.state().rows.values().filter(|r| r.published).count()
    }

    /// The keys of the rows marked published, sorted.
    pub fn published_keys(&self) -> Vec<String> {
        let mut keys: Vec<String> = self
            .state()
            .rows
            .values()
            .filter(|r| r.published)
            .map(|r| r.key.clone())
            .collect();
        keys.sort();
        keys
    }

    pub fn unpublished(&self) -> usize {
        self.state()
            .rows
            .values()
            .filter(|r| !r.published && r.parked.is_none())
            .count()
    }

    /// Parked rows: key and reason.
    pub fn parked(&self) -> Vec<(String, String)> {
        self.state()
            .rows
            .values()
            .filter_map(|r| r.parked.clone().map(|reason| (r.key.clone(), reason)))
            .collect()
    }

    /// Rows whose lease is running now.
    pub fn leased(&self) -> usize {
        let now = Instant::now();
        self.state()
            .rows
            .values()
            .filter(|r| !r.published && r.leased_until.is_some_and(|until| until > now))
            .count()
    }

    pub fn rounds(&self) -> usize {
        self.state().rounds
    }

    pub fn max_claimed(&self) -> usize {
        self.state().max_claimed
    }
}

impl Store for MemoryStore {
    fn owner(&self) -> LeaseOwner {
        self.owner
    }

    async fn round(&self, round: Round) -> Result<RoundResult, DbError> {
        let frozen = *self
            .frozen_until
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some(until) = frozen {
            tokio::time::sleep_until(until).await;
        }
        let time = self.state().round_time;
        if !time.is_zero() {
            tokio::time::sleep(time).await;
        }
        let mut state = self.state();
        state.rounds += 1;
        if state.fail_rounds > 0 {
            state.fail_rounds -= 1;
            return Err(DbError::Pool(
                "the in-memory outbox was told to fail".into(),
            ));
        }
        let now = Instant::now();
        let owner = Some(self.owner);
        let state = &mut *state;
        // As the SQL: only the rows whose lease this instance holds.
        for id in &round.published {
            if let Some(row) = state.rows.get_mut(id).filter(|r| r.owner == owner) {
                row.published = true;
                state.open.remove(id);
            }
        }
        for (id, reason) in &round.parked {
            if let Some(row) = state.rows.get_mut(id).filter(|r| r.owner == owner) {
                row.parked = Some(reason.clone());
                state.open.remove(id);
            }
        }
        let mut lost = Vec::new();
        for id in &round.renew {
            match state
                .rows
                .get_mut(id)
                .filter(|r| !r.published && r.owner == owner)
            {
                Some(row) => row.leased_until = Some(now + round.lease),
                None => lost.push(*id),
            }
        }
        for id in &round.release {
            if let Some(row) = state
                .rows
                .get_mut(id)
                .filter(|r| !r.published && r.owner == owner)
            {
                row.leased_until = None;
                row.owner = None;
            }
        }
        let mut claimed = Vec::new();
        if let Some(claim) = &round.claim {
            let mut taken = vec![0u32; claim.partitions.len()];
            let mut unrouted = 0u32;
            for id in &state.open {
                let Some(row) = state.rows.get_mut(id) else {
                    continue;
                };
                if row.published
                    || row.parked.is_some()
                    || row.leased_until.is_some_and(|u| u > now)
                    || claim.skip_topics.contains(&row.topic)
                {
                    continue;
                }
                let (count, room, laid_out) =
                    if claim.routed_topics.iter().any(|r| r.topic == row.topic) {
                        let Some(i) = claim
                            .partitions
                            .iter()
                            .position(|p| p.holds(&row.topic, row.key_hash))
                        else {
                            // A partition without room.
                            continue;
                        };
                        if *id <= claim.partitions[i].after {
                            // Behind the partition's scan.
                            continue;
                        }
                        (
                            &mut taken[i],
                            claim.partitions[i].room,
                            Some(claim.partitions[i].count),
                        )
                    } else {
                        (&mut unrouted, claim.limit, None)
                    };
                if *count >= room {
                    continue;
                }
                *count += 1;
                row.leased_until = Some(now + claim.lease);
                row.owner = owner;
                claimed.push(row.claimed(*id, laid_out));
            }
        }
        let held = state
            .open
            .iter()
            .filter_map(|id| state.rows.get(id))
            .filter(|r| r.leased_until.is_some_and(|u| u > now))
            .count();
        state.max_claimed = state.max_claimed.max(held);
        Ok(RoundResult {
            claimed,
            lost,
            relayout_left: Vec::new(),
        })
    }
}
