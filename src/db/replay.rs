//! The replay repository: reads expiry records (the audit trail completed
//! from the bookings) page by page, and re-enqueues rebuilt messages as
//! outbox rows of one replay. Reads bookings only, never locks or writes
//! them.

use chrono::{DateTime, Utc};
use diesel::{
    QueryableByName,
    sql_types::{Array, BigInt, Binary, Nullable, Text, Timestamptz, Uuid as SqlUuid},
};
use diesel_async::{AsyncPgConnection, RunQueryDsl};
use uuid::Uuid;

use super::{DbError, bookings::headers_json};
use crate::{
    domain::{BookingId, DealId, ExpiryRecord, Phase, PropertyObjectId, Status, TenantId},
    events::OutboxMessage,
};

/// Which expiries to replay; the filters that are set all apply.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Selection {
    /// Only these bookings (empty: any).
    pub booking_ids: Vec<Uuid>,
    /// Only these tenants (empty: any).
    pub tenant_ids: Vec<Uuid>,
    /// `expired_at >= from`.
    pub expired_from: Option<DateTime<Utc>>,
    /// `expired_at < to`.
    pub expired_to: Option<DateTime<Utc>>,
}

impl Selection {
    /// Whether any filter is set (a replay of everything is never implied).
    pub fn is_restricted(&self) -> bool {
        !self.booking_ids.is_empty()
            || !self.tenant_ids.is_empty()
            || self.expired_from.is_some()
            || self.expired_to.is_some()
    }

    /// The page query: audit records of expiries after the cursor `$1`, in
    /// audit id order, at most `$6`. Only the set filters are in the text,
    /// so a selection by booking ids probes the audit's booking_id index.
    pub fn page_sql(&self) -> String {
        let expiries: Vec<String> = Phase::ALL
            .iter()
            .map(|phase| format!("'{}'", phase.target_status()))
            .collect();
        let mut filters = vec![
            "a.id > $1".to_owned(),
            format!("a.to_status IN ({})", expiries.join(", ")),
        ];
        if !self.booking_ids.is_empty() {
            filters.push("a.booking_id = ANY($2)".to_owned());
        }
        if !self.tenant_ids.is_empty() {
            filters.push("a.tenant_id = ANY($3)".to_owned());
        }
        if self.expired_from.is_some() {
            filters.push("a.at >= $4".to_owned());
        }
        if self.expired_to.is_some() {
            filters.push("a.at < $5".to_owned());
        }
        format!(
            "SELECT a.id AS audit_id, a.booking_id, a.tenant_id, a.from_status, a.to_status, \
                    a.correlation_id, a.at, a.ce_source, \
                    coalesce(a.version, b.version) AS version, \
                    coalesce(a.deal_id, b.deal_id) AS deal_id, \
                    coalesce(a.property_object_id, b.property_object_id) AS property_object_id, \
                    b.reserve_expires_at, b.booking_expires_at \
             FROM booking_expiration_audit a LEFT JOIN bookings b ON b.id = a.booking_id \
             WHERE {} ORDER BY a.id LIMIT $6",
            filters.join(" AND ")
        )
    }
}

/// One audit record of an expiry with what the booking adds to it.
#[derive(Debug, Clone, PartialEq, Eq, QueryableByName)]
pub struct RecordRow {
    #[diesel(sql_type = BigInt)]
    pub audit_id: i64,
    #[diesel(sql_type = SqlUuid)]
    pub booking_id: Uuid,
    #[diesel(sql_type = SqlUuid)]
    pub tenant_id: Uuid,
    #[diesel(sql_type = Text)]
    pub from_status: String,
    #[diesel(sql_type = Text)]
    pub to_status: String,
    /// The run id of the cycle that expired the booking.
    #[diesel(sql_type = SqlUuid)]
    pub correlation_id: Uuid,
    #[diesel(sql_type = Timestamptz)]
    pub at: DateTime<Utc>,
    /// `ce_source` in force then (NULL in records older than the column).
    #[diesel(sql_type = Nullable<Text>)]
    pub ce_source: Option<String>,
    /// NULL only when neither the record nor the booking has it.
    #[diesel(sql_type = Nullable<BigInt>)]
    pub version: Option<i64>,
    #[diesel(sql_type = Nullable<SqlUuid>)]
    pub deal_id: Option<Uuid>,
    #[diesel(sql_type = Nullable<SqlUuid>)]
    pub property_object_id: Option<Uuid>,
    #[diesel(sql_type = Nullable<Timestamptz>)]
    pub reserve_expires_at: Option<DateTime<Utc>>,
    #[diesel(sql_type = Nullable<Timestamptz>)]
    pub booking_expires_at: Option<DateTime<Utc>>,
}

impl RecordRow {
    /// The domain's record; `Err` names what is missing or unknown.
    pub fn to_domain(&self) -> Result<ExpiryRecord, String> {
        let from_status: Status = self.from_status.parse().map_err(|e| format!("{e}"))?;
        let to_status: Status = self.to_status.parse().map_err(|e| format!("{e}"))?;
        let version = self
            .version
            .ok_or_else(|| "the version is unknown (booking deleted)".to_owned())?;
        let deadline = from_status
            .active_phase()
            .and_then(|phase| phase.deadline_of(self.reserve_expires_at, self.booking_expires_at));
        Ok(ExpiryRecord {
            booking_id: BookingId::new(self.booking_id),
            tenant_id: TenantId::new(self.tenant_id),
            deal_id: self.deal_id.map(DealId::new),
            property_object_id: self.property_object_id.map(PropertyObjectId::new),
            from_status,
            to_status,
            deadline,
            expired_at: self.at,
            version,
        })
    }
}

/// The next page of expiry records after `after` (an audit id).
pub async fn page(
    conn: &mut AsyncPgConnection,
    selection: &Selection,
    after: i64,
    limit: u32,
) -> Result<Vec<RecordRow>, DbError> {
    Ok(diesel::sql_query(selection.page_sql())
        .bind::<BigInt, _>(after)
        .bind::<Array<SqlUuid>, _>(&selection.booking_ids)
        .bind::<Array<SqlUuid>, _>(&selection.tenant_ids)
        .bind::<Nullable<Timestamptz>, _>(selection.expired_from)
        .bind::<Nullable<Timestamptz>, _>(selection.expired_to)
        .bind::<BigInt, _>(i64::from(limit))
        .load(conn)
        .await?)
}

/// A rebuilt message and the run id of its original cycle.
#[derive(Debug, Clone)]
pub struct ReplayWrite {
    pub message: OutboxMessage,
    pub correlation_id: Uuid,
}

/// New outbox rows of replay `replay_id`; an event with a row still waiting
/// to be sent (unpublished: the original, an earlier replay's, or a parked
/// one) is skipped, and so is one this replay already enqueued. Returns the
/// event ids enqueued.
const ENQUEUE_SQL: &str = "\
INSERT INTO booking_expiration_outbox
       (event_id, topic, message_key, payload, headers, correlation_id, tenant_id, created_at, replay_id)
SELECT i.event_id, $1, i.message_key, i.payload, i.headers::json, i.correlation_id, i.tenant_id, $2, $3
  FROM unnest($4::uuid[], $5::text[], $6::bytea[], $7::text[], $8::uuid[], $9::uuid[])
       AS i(event_id, message_key, payload, headers, correlation_id, tenant_id)
 WHERE NOT EXISTS (SELECT 1 FROM booking_expiration_outbox o
                    WHERE o.event_id = i.event_id AND o.published_at IS NULL)
ON CONFLICT (event_id, replay_id) DO NOTHING
RETURNING event_id";

#[derive(QueryableByName)]
struct Enqueued {
    #[diesel(sql_type = SqlUuid)]
    event_id: Uuid,
}

/// Writes the replay's outbox rows (see [`ENQUEUE_SQL`]); the insert
/// trigger wakes the publishers at commit.
pub async fn enqueue(
    conn: &mut AsyncPgConnection,
    topic: &str,
    created_at: DateTime<Utc>,
    replay_id: Uuid,
    writes: &[ReplayWrite],
) -> Result<Vec<Uuid>, DbError> {
    if writes.is_empty() {
        return Ok(Vec::new());
    }
    let mut event_ids = Vec::with_capacity(writes.len());
    let mut keys = Vec::with_capacity(writes.len());
    let mut payloads = Vec::with_capacity(writes.len());
    let mut headers = Vec::with_capacity(writes.len());
    let mut correlation_ids = Vec::with_capacity(writes.len());
    let mut tenant_ids = Vec::with_capacity(writes.len());
    for write in writes {
        event_ids.push(write.message.event_id);
        keys.push(write.message.key.as_str());
        payloads.push(write.message.payload.as_slice());
        headers.push(headers_json(&write.message.headers)?);
        correlation_ids.push(write.correlation_id);
        tenant_ids.push(write.message.tenant_id);
    }
    let rows: Vec<Enqueued> = diesel::sql_query(ENQUEUE_SQL)
        .bind::<Text, _>(topic)
        .bind::<Timestamptz, _>(created_at)
        .bind::<SqlUuid, _>(replay_id)
        .bind::<Array<SqlUuid>, _>(&event_ids)
        .bind::<Array<Text>, _>(&keys)
        .bind::<Array<Binary>, _>(&payloads)
        .bind::<Array<Text>, _>(&headers)
        .bind::<Array<SqlUuid>, _>(&correlation_ids)
        .bind::<Array<SqlUuid>, _>(&tenant_ids)
        .load(conn)
        .await?;
    Ok(rows.into_iter().map(|r| r.event_id).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn page_sql_names_only_the_set_filters() {
        let ids = Selection {
            booking_ids: vec![Uuid::nil()],
            ..Selection::default()
        };
        let sql = ids.page_sql();
        assert!(sql.contains("a.booking_id = ANY($2)"));
        assert!(!sql.contains("$3") && !sql.contains("$4") && !sql.contains("$5"));
        assert!(sql.contains("a.to_status IN ('ReserveExpired', 'BookingExpired')"));
        let window = Selection {
            expired_from: Some(DateTime::<Utc>::MIN_UTC),
            expired_to: Some(DateTime::<Utc>::MAX_UTC),
            tenant_ids: vec![Uuid::nil()],
            ..Selection::default()
        };
        let sql = window.page_sql();
        assert!(sql.contains("a.at >= $4") && sql.contains("a.at < $5"));
        assert!(sql.contains("a.tenant_id = ANY($3)") && !sql.contains("$2"));
        assert!(window.is_restricted());
        assert!(!Selection::default().is_restricted());
    }
}
