//! The outbox repository: claim unpublished rows, mark them published or
//! park them, put parked rows back, sweep old published rows, report the
//! lag and the parked rows.

use chrono::{DateTime, Utc};
use diesel::{
    QueryableByName,
    sql_types::{Array, BigInt, Bytea, Json, Nullable, Text, Timestamptz, Uuid as SqlUuid},
};
use diesel_async::{AsyncPgConnection, RunQueryDsl};
use uuid::Uuid;

use super::DbError;

/// An outbox row as the publisher needs it.
#[derive(Debug, Clone, QueryableByName)]
pub struct OutboxRow {
    #[diesel(sql_type = BigInt)]
    pub id: i64,
    #[diesel(sql_type = SqlUuid)]
    pub event_id: Uuid,
    #[diesel(sql_type = Text)]
    pub topic: String,
    #[diesel(sql_type = Text)]
    pub message_key: String,
    #[diesel(sql_type = Bytea)]
    pub payload: Vec<u8>,
    /// The `json` column: the object as the worker wrote it.
    #[diesel(sql_type = Json)]
    pub headers: serde_json::Value,
    #[diesel(sql_type = Timestamptz)]
    pub created_at: DateTime<Utc>,
}

impl OutboxRow {
    /// Why this row cannot be sent as a Kafka record, if it cannot: the
    /// worker writes a non-empty topic and a JSON object of headers, so
    /// anything else is a corrupt row, parked rather than sent without its
    /// `ce_*` headers.
    pub fn defect(&self) -> Option<String> {
        if self.topic.is_empty() {
            return Some("the row has an empty topic".to_owned());
        }
        if !self.headers.is_object() {
            return Some(format!(
                "the row's headers are not a JSON object: {}",
                truncate(&self.headers.to_string(), 80)
            ));
        }
        None
    }

    /// Header name → bytes; non-string JSON values (never written by the
    /// worker) are sent as their JSON text rather than dropped.
    pub fn header_pairs(&self) -> Vec<(String, Vec<u8>)> {
        match &self.headers {
            serde_json::Value::Object(map) => map
                .iter()
                .map(|(name, value)| {
                    let bytes = match value {
                        serde_json::Value::String(s) => s.as_bytes().to_vec(),
                        other => other.to_string().into_bytes(),
                    };
                    (name.clone(), bytes)
                })
                .collect(),
            _ => Vec::new(),
        }
    }
}

/// At most `max` characters of `text`.
fn truncate(text: &str, max: usize) -> String {
    match text.char_indices().nth(max) {
        Some((end, _)) => format!("{}…", &text[..end]),
        None => text.to_owned(),
    }
}

/// The unpublished rows the publisher may claim. Keep it the predicate of
/// `ix_booking_expiration_outbox_unpublished`, word for word in meaning, so
/// the claim and the lag count are index scans.
const CLAIMABLE: &str = "published_at IS NULL AND parked_at IS NULL";

/// The claim statement (`$1` = limit); public for the EXPLAIN test.
pub fn claim_sql() -> String {
    format!(
        "SELECT id, event_id, topic, message_key, payload, headers, created_at \
         FROM booking_expiration_outbox WHERE {CLAIMABLE} \
         ORDER BY id LIMIT $1 FOR UPDATE SKIP LOCKED"
    )
}

/// Locks up to `limit` unpublished, unparked rows, oldest first, skipping
/// rows another publisher holds. Must run inside the publishing transaction.
pub async fn claim_unpublished(
    conn: &mut AsyncPgConnection,
    limit: u32,
) -> Result<Vec<OutboxRow>, DbError> {
    Ok(diesel::sql_query(claim_sql())
        .bind::<BigInt, _>(i64::from(limit))
        .load(conn)
        .await?)
}

/// Marks claimed rows published at `at`.
pub async fn mark_published(
    conn: &mut AsyncPgConnection,
    ids: &[i64],
    at: DateTime<Utc>,
) -> Result<usize, DbError> {
    Ok(diesel::sql_query(
        "UPDATE booking_expiration_outbox SET published_at = $2 WHERE id = ANY($1)",
    )
    .bind::<Array<BigInt>, _>(ids)
    .bind::<Timestamptz, _>(at)
    .execute(conn)
    .await?)
}

/// Parks a claimed row the broker will never accept as it is: the claim
/// skips it from now on and retention keeps it.
pub async fn park(
    conn: &mut AsyncPgConnection,
    id: i64,
    reason: &str,
    at: DateTime<Utc>,
) -> Result<usize, DbError> {
    Ok(diesel::sql_query(
        "UPDATE booking_expiration_outbox SET parked_at = $2, park_reason = $3 WHERE id = $1",
    )
    .bind::<BigInt, _>(id)
    .bind::<Timestamptz, _>(at)
    .bind::<Text, _>(reason)
    .execute(conn)
    .await?)
}

/// Which parked rows to put back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Unpark {
    Events(Vec<Uuid>),
    All,
}

/// Clears `parked_at` and `park_reason` of parked rows so the publisher
/// tries them again, and wakes running publishers; returns how many rows
/// it put back (rows not parked are left alone).
pub async fn unpark(conn: &mut AsyncPgConnection, which: &Unpark) -> Result<usize, DbError> {
    let put_back = match which {
        Unpark::All => {
            diesel::sql_query(
                "UPDATE booking_expiration_outbox SET parked_at = NULL, park_reason = NULL \
                 WHERE parked_at IS NOT NULL",
            )
            .execute(conn)
            .await?
        }
        Unpark::Events(ids) => {
            diesel::sql_query(
                "UPDATE booking_expiration_outbox SET parked_at = NULL, park_reason = NULL \
                 WHERE parked_at IS NOT NULL AND event_id = ANY($1)",
            )
            .bind::<Array<SqlUuid>, _>(ids)
            .execute(conn)
            .await?
        }
    };
    if put_back > 0 {
        // The insert trigger's channel: publishers wake at once rather
        // than at their next poll.
        diesel::sql_query("SELECT pg_notify('booking_expiration_outbox', '')")
            .execute(conn)
            .await?;
    }
    Ok(put_back)
}

/// A parked row, as `status` lists it.
#[derive(Debug, Clone, PartialEq, Eq, QueryableByName, serde::Serialize)]
pub struct ParkedRow {
    #[diesel(sql_type = SqlUuid)]
    pub event_id: Uuid,
    /// The Kafka message key (the booking id).
    #[diesel(sql_type = Text)]
    pub message_key: String,
    #[diesel(sql_type = Text)]
    pub reason: String,
    #[diesel(sql_type = Timestamptz)]
    pub parked_at: DateTime<Utc>,
}

/// The first `limit` parked rows, oldest first.
pub async fn parked_rows(
    conn: &mut AsyncPgConnection,
    limit: u32,
) -> Result<Vec<ParkedRow>, DbError> {
    Ok(diesel::sql_query(
        "SELECT event_id, message_key, coalesce(park_reason, '') AS reason, parked_at \
         FROM booking_expiration_outbox WHERE parked_at IS NOT NULL ORDER BY id LIMIT $1",
    )
    .bind::<BigInt, _>(i64::from(limit))
    .load(conn)
    .await?)
}

/// Deletes claimed rows (retention zero: nothing is kept once published).
pub async fn delete_rows(conn: &mut AsyncPgConnection, ids: &[i64]) -> Result<usize, DbError> {
    Ok(
        diesel::sql_query("DELETE FROM booking_expiration_outbox WHERE id = ANY($1)")
            .bind::<Array<BigInt>, _>(ids)
            .execute(conn)
            .await?,
    )
}

/// Deletes up to `limit` rows published before `cutoff`; small batches keep
/// each transaction short.
pub async fn delete_published_before(
    conn: &mut AsyncPgConnection,
    cutoff: DateTime<Utc>,
    limit: u32,
) -> Result<usize, DbError> {
    Ok(diesel::sql_query(
        "DELETE FROM booking_expiration_outbox WHERE id IN (\
             SELECT id FROM booking_expiration_outbox \
             WHERE published_at IS NOT NULL AND published_at < $1 \
             LIMIT $2 FOR UPDATE SKIP LOCKED)",
    )
    .bind::<Timestamptz, _>(cutoff)
    .bind::<BigInt, _>(i64::from(limit))
    .execute(conn)
    .await?)
}

/// The outbox lag. Parked rows are counted apart: they wait for an
/// operator, not for the publisher, so they are not lag.
#[derive(Debug, Clone, Copy, PartialEq, Eq, QueryableByName)]
pub struct OutboxStats {
    /// Unpublished rows the publisher will claim (parked ones excluded).
    #[diesel(sql_type = BigInt)]
    pub unpublished: i64,
    #[diesel(sql_type = Nullable<Timestamptz>)]
    pub oldest_unpublished_at: Option<DateTime<Utc>>,
    /// Parked rows.
    #[diesel(sql_type = BigInt)]
    pub parked: i64,
}

/// Counts unpublished rows, finds the oldest, and counts parked rows (two
/// partial index scans).
pub async fn stats(conn: &mut AsyncPgConnection) -> Result<OutboxStats, DbError> {
    Ok(diesel::sql_query(format!(
        "SELECT count(*) AS unpublished, min(created_at) AS oldest_unpublished_at, \
                (SELECT count(*) FROM booking_expiration_outbox WHERE parked_at IS NOT NULL) AS parked \
         FROM booking_expiration_outbox WHERE {CLAIMABLE}"
    ))
    .get_result(conn)
    .await?)
}
