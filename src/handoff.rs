//! A row written and leased to this instance: what the expiry hands to the
//! publisher once its batch committed ([`Handoff`]), what the claim returns
//! ([`LeasedRow`]), and whose lease it is ([`LeaseOwner`]). Below both the
//! expiry and the publisher and below the SQL, so the three meet here
//! instead of in each other's internals.

use chrono::{DateTime, Utc};
use uuid::Uuid;

use crate::events::{Headers, OutboxMessage, key_hash};

/// An outbox row leased to this instance: claimed by its publisher, or
/// written leased to it by its expiry and handed over.
#[derive(Debug, Clone)]
pub struct LeasedRow {
    pub id: i64,
    pub event_id: Uuid,
    pub topic: String,
    pub message_key: String,
    pub payload: Vec<u8>,
    /// The stored headers, or why they are not a headers object (a row no
    /// worker wrote: it is parked, not sent without its `ce_*` headers).
    pub headers: Result<Headers, String>,
    pub created_at: DateTime<Utc>,
    /// The stored [`key_hash`]; `None` on rows written before it was.
    pub key_hash: Option<i32>,
    /// The partition count the row was written for (`None`: the writer
    /// knew none, or the row was handed over in process).
    pub partition_count: Option<i32>,
}

impl LeasedRow {
    /// The outbox row `message` became: row `id` of `topic`, written at
    /// `created_at`, as the publisher sends it.
    pub fn written(
        id: i64,
        topic: String,
        created_at: DateTime<Utc>,
        message: OutboxMessage,
    ) -> Self {
        Self {
            id,
            event_id: message.event_id,
            topic,
            key_hash: Some(message.key_hash),
            message_key: message.key,
            payload: message.payload,
            headers: Ok(message.headers),
            created_at,
            partition_count: None,
        }
    }

    /// Why this row cannot be sent as a Kafka record, if it cannot.
    pub fn defect(&self) -> Option<String> {
        if self.topic.is_empty() {
            return Some("the row has an empty topic".to_owned());
        }
        self.headers.as_ref().err().cloned()
    }

    /// The key's partition hash: the stored one, or (a row written before
    /// it was stored) hashed here.
    pub fn partition_hash(&self) -> i32 {
        self.key_hash.unwrap_or_else(|| key_hash(&self.message_key))
    }
}

/// Rows written leased to this process's publisher, handed to it once
/// their transaction committed: the expiry of `run` writes each outbox row
/// with a lease (`claimed_until`) already set, so no claim (a second row
/// version) is needed to reserve it, and no other instance takes it. Rows
/// the publisher has no room for are released (their lease cleared) for
/// any instance's claim; rows that never reach it (the process killed
/// between the commit and the handoff, the channel full) wait for their
/// lease to end, then any instance claims them: at-least-once either way.
#[derive(Debug, Clone)]
pub struct Handoff {
    pub sender: tokio::sync::mpsc::Sender<HandedRows>,
    /// The lease the rows are written with, and its owner (the publisher
    /// the rows are handed to).
    pub lease: std::time::Duration,
    pub owner: LeaseOwner,
}

impl Handoff {
    /// Hands `rows` to the publisher; false when it cannot take them now
    /// (the channel is full or closed): they wait for their lease to end.
    pub fn hand(&self, rows: Vec<LeasedRow>, leased_at: tokio::time::Instant) -> bool {
        rows.is_empty() || self.sender.try_send(HandedRows { rows, leased_at }).is_ok()
    }
}

/// One committed batch's outbox rows, leased to the publisher since
/// `leased_at` (taken before the writing statement started, so the lease
/// the database set ends later than the publisher counts).
#[derive(Debug)]
pub struct HandedRows {
    pub rows: Vec<LeasedRow>,
    pub leased_at: tokio::time::Instant,
}

/// The token of one publisher instance, written with every lease it holds
/// (`claimed_by`). Renewing, releasing, marking and parking touch only the
/// rows whose lease it holds, so an instance that was paused past its
/// lease and comes back never changes rows another instance claimed since.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct LeaseOwner(pub Uuid);

impl LeaseOwner {
    /// A new, random token.
    pub fn new() -> Self {
        Self(Uuid::new_v4())
    }
}

impl Default for LeaseOwner {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A row written before the hash was stored routes as the key says.
    #[test]
    fn a_row_without_a_stored_hash_is_hashed_from_its_key() {
        let mut row = LeasedRow {
            id: 1,
            event_id: Uuid::nil(),
            topic: "t".to_owned(),
            message_key: "00000000-0000-0000-0000-000000000001".to_owned(),
            payload: Vec::new(),
            headers: Ok(Headers::default()),
            created_at: DateTime::UNIX_EPOCH,
            key_hash: None,
            partition_count: None,
        };
        assert_eq!(row.partition_hash(), key_hash(&row.message_key));
        row.key_hash = Some(7);
        assert_eq!(
            row.partition_hash(),
            7,
            "the stored hash is not computed again"
        );
    }
}
