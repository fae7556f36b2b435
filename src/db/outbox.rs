//! The outbox repository: claim unpublished rows, mark them published,
//! sweep old published rows, report the lag.

use chrono::{DateTime, Utc};
use diesel::{
    QueryableByName,
    sql_types::{Array, BigInt, Bytea, Jsonb, Nullable, Text, Timestamptz, Uuid as SqlUuid},
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
    #[diesel(sql_type = Jsonb)]
    pub headers: serde_json::Value,
    #[diesel(sql_type = Timestamptz)]
    pub created_at: DateTime<Utc>,
}

impl OutboxRow {
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

/// Locks up to `limit` unpublished rows, oldest first, skipping rows
/// another publisher holds. Must run inside the publishing transaction.
pub async fn claim_unpublished(
    conn: &mut AsyncPgConnection,
    limit: u32,
) -> Result<Vec<OutboxRow>, DbError> {
    Ok(diesel::sql_query(
        "SELECT id, event_id, topic, message_key, payload, headers, created_at \
         FROM booking_expiration_outbox WHERE published_at IS NULL \
         ORDER BY id LIMIT $1 FOR UPDATE SKIP LOCKED",
    )
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

/// The outbox lag.
#[derive(Debug, Clone, Copy, PartialEq, Eq, QueryableByName)]
pub struct OutboxStats {
    #[diesel(sql_type = BigInt)]
    pub unpublished: i64,
    #[diesel(sql_type = Nullable<Timestamptz>)]
    pub oldest_unpublished_at: Option<DateTime<Utc>>,
}

/// Counts unpublished rows and finds the oldest (partial index scan).
pub async fn stats(conn: &mut AsyncPgConnection) -> Result<OutboxStats, DbError> {
    Ok(diesel::sql_query(
        "SELECT count(*) AS unpublished, min(created_at) AS oldest_unpublished_at \
         FROM booking_expiration_outbox WHERE published_at IS NULL",
    )
    .get_result(conn)
    .await?)
}
