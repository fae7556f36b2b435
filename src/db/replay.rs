//! The replay repository: reads expiry records (the audit trail completed
//! from the bookings) page by page, and re-enqueues rebuilt messages as
//! outbox rows of one replay. Reads bookings only, never locks or writes
//! them.
//!
//! A page costs what it returns, not what the audit trail holds (a year of
//! a busy crm is about 10,000,000 records): it walks an index in audit id
//! order and stops at the page's end. By booking ids: the `booking_id`
//! index. By tenant: the `(tenant_id, id)` index, one ordered scan per
//! tenant, merged. By window: the `id` index from the window's first audit
//! id to its last, both read once per replay from the `(at, id)` index
//! ([`id_bounds`]); `at` and the id grow together (both follow the cycles),
//! so the rows between the two ids are the window's, but for the few that
//! straddle its edges.

use std::{collections::HashSet, sync::LazyLock};

use chrono::{DateTime, Utc};
use diesel::{
    QueryableByName,
    sql_types::{Array, BigInt, Nullable, Text, Timestamptz, Uuid as SqlUuid},
};
use diesel_async::{AsyncPgConnection, RunQueryDsl};
use uuid::Uuid;

use super::{
    DbError,
    outbox::{self, MessageColumns, OutboxValues},
};
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

    /// Whether the window selects nothing (`--expired-from` not before
    /// `--expired-to`).
    pub fn window_is_empty(&self) -> bool {
        matches!((self.expired_from, self.expired_to), (Some(from), Some(to)) if from >= to)
    }

    /// The tenants, each once, in order: what `$3` binds.
    pub fn distinct_tenants(&self) -> Vec<Uuid> {
        let mut tenants = self.tenant_ids.clone();
        tenants.sort_unstable();
        tenants.dedup();
        tenants
    }

    /// The page query: audit records of expiries after the cursor `$1`, in
    /// audit id order, at most `$6`, within the audit ids `$7`..=`$8` (the
    /// window's, [`IdBounds`]). Only the set filters are in the text, so a
    /// selection by booking ids probes the audit's booking_id index, one by
    /// tenant walks each tenant's `(tenant_id, id)` index entries in order
    /// (one branch per tenant, `$3` their [`Self::distinct_tenants`], so a
    /// page reads at most a page per tenant), and one by window walks the id
    /// index between its bounds. Run it as [`page`] does: in index order
    /// only.
    pub fn page_sql(&self, bounds: &IdBounds) -> String {
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
        // Within the window's ids the time filter only drops the few rows
        // that straddle its edges. Written so that no index on `at` can
        // serve it: PostgreSQL takes the id range and the time range for
        // independent, underestimates the rows by orders of magnitude, and
        // would read the whole window through the `(at, id)` index and sort
        // it for every page instead of walking the id index to the page's end.
        let at = if bounds.first.is_some() || bounds.last.is_some() {
            "(a.at + interval '0')"
        } else {
            "a.at"
        };
        if self.expired_from.is_some() {
            filters.push(format!("{at} >= $4"));
        }
        if self.expired_to.is_some() {
            filters.push(format!("{at} < $5"));
        }
        if bounds.first.is_some() {
            filters.push("a.id >= $7".to_owned());
        }
        if bounds.last.is_some() {
            filters.push("a.id <= $8".to_owned());
        }
        // By tenant (unless booking ids, a narrower index, are given): each
        // tenant's first page in id order from its own index, then the
        // first page of their union. `($3)[k]` is a constant when the
        // statement is planned (its parameters are known then), so the
        // planner sees each tenant's own share of the trail.
        let tenants = self.distinct_tenants().len();
        let records = if tenants > 0 && self.booking_ids.is_empty() {
            let branches: Vec<String> = (1..=tenants)
                .map(|k| {
                    format!(
                        "(SELECT * FROM booking_expiration_audit a \
                          WHERE a.tenant_id = ($3::uuid[])[{k}] AND {} ORDER BY a.id LIMIT $6)",
                        filters.join(" AND ")
                    )
                })
                .collect();
            format!("({}) a", branches.join(" UNION ALL "))
        } else {
            if !self.tenant_ids.is_empty() {
                filters.push("a.tenant_id = ANY($3)".to_owned());
            }
            format!(
                "(SELECT * FROM booking_expiration_audit a WHERE {} ORDER BY a.id LIMIT $6) a",
                filters.join(" AND ")
            )
        };
        format!(
            "SELECT a.id AS audit_id, a.booking_id, a.tenant_id, a.from_status, a.to_status, \
                    a.correlation_id, a.at, a.ce_source, \
                    coalesce(a.version, b.version) AS version, \
                    coalesce(a.deal_id, b.deal_id) AS deal_id, \
                    coalesce(a.property_object_id, b.property_object_id) AS property_object_id, \
                    b.reserve_expires_at, b.booking_expires_at \
             FROM {records} LEFT JOIN bookings b ON b.id = a.booking_id \
             ORDER BY a.id LIMIT $6"
        )
    }
}

/// The audit ids a window selection lies between (both inclusive; `None`:
/// that side is open). Read once per replay ([`id_bounds`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct IdBounds {
    pub first: Option<i64>,
    pub last: Option<i64>,
}

/// The statement of [`id_bounds`]: `$1` from, `$2` to (either may be NULL:
/// open). The subquery (`OFFSET 0` keeps the planner from flattening it)
/// stops PostgreSQL from answering `min(id)` by walking the id index from
/// its start until a row falls in the window, which reads every record
/// before a recent window; it scans the window's `(at, id)` entries instead.
pub const ID_BOUNDS_SQL: &str = "SELECT min(id) AS first, max(id) AS last \
     FROM (SELECT id FROM booking_expiration_audit \
            WHERE at >= coalesce($1, '-infinity') AND at < coalesce($2, 'infinity') \
           OFFSET 0) w";

/// The first and last audit id of the records in the selection's window,
/// from the `(at, id)` index: `Some(IdBounds::default())` without a window,
/// `None` when the window holds no record. An open side of the window stays
/// open, so records written while the replay runs are still found. Must run
/// in a transaction (see [`index_order_only`]).
pub async fn id_bounds(
    conn: &mut AsyncPgConnection,
    selection: &Selection,
) -> Result<Option<IdBounds>, DbError> {
    #[derive(QueryableByName)]
    struct Bounds {
        #[diesel(sql_type = Nullable<BigInt>)]
        first: Option<i64>,
        #[diesel(sql_type = Nullable<BigInt>)]
        last: Option<i64>,
    }
    if selection.expired_from.is_none() && selection.expired_to.is_none() {
        return Ok(Some(IdBounds::default()));
    }
    index_order_only(conn).await?;
    let found: Bounds = diesel::sql_query(ID_BOUNDS_SQL)
        .bind::<Nullable<Timestamptz>, _>(selection.expired_from)
        .bind::<Nullable<Timestamptz>, _>(selection.expired_to)
        .get_result(conn)
        .await?;
    let (Some(first), Some(last)) = (found.first, found.last) else {
        return Ok(None);
    };
    Ok(Some(IdBounds {
        first: selection.expired_from.map(|_| first),
        last: selection.expired_to.map(|_| last),
    }))
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

/// Turns off sequential and bitmap scans for the rest of the transaction
/// (`set_config(…, true)` is `SET LOCAL`: nothing stays on the session, also
/// through a transaction pooler). The replay reads the audit trail through
/// its indexes only, in their order. A bitmap scan returns rows out of id
/// order, so a page would read every remaining record of its range and sort
/// them to keep one page; a sequential scan reads the whole trail.
/// PostgreSQL picks them when it expects few rows, and for a window or a
/// tenant in a window it underestimates the rows by orders of magnitude (it
/// takes the id and time ranges for independent).
async fn index_order_only(conn: &mut AsyncPgConnection) -> Result<(), DbError> {
    diesel::sql_query(
        "SELECT set_config('enable_seqscan', 'off', true), \
                set_config('enable_bitmapscan', 'off', true)",
    )
    .execute(conn)
    .await?;
    Ok(())
}

/// The next page of expiry records after `after` (an audit id), within
/// `bounds` (from [`id_bounds`]). Must run in a transaction (see
/// [`index_order_only`]).
pub async fn page(
    conn: &mut AsyncPgConnection,
    selection: &Selection,
    bounds: &IdBounds,
    after: i64,
    limit: u32,
) -> Result<Vec<RecordRow>, DbError> {
    index_order_only(conn).await?;
    Ok(diesel::sql_query(selection.page_sql(bounds))
        .bind::<BigInt, _>(after)
        .bind::<Array<SqlUuid>, _>(&selection.booking_ids)
        .bind::<Array<SqlUuid>, _>(selection.distinct_tenants())
        .bind::<Nullable<Timestamptz>, _>(selection.expired_from)
        .bind::<Nullable<Timestamptz>, _>(selection.expired_to)
        .bind::<BigInt, _>(i64::from(limit))
        .bind::<Nullable<BigInt>, _>(bounds.first)
        .bind::<Nullable<BigInt>, _>(bounds.last)
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
/// one) is skipped, and so is one this replay already enqueued. Both are
/// found through the event records ([`outbox::record_events_sql`]); the
/// rows written are recorded in the same statement, so a concurrent run
/// with the same replay id fails with a unique violation instead of
/// enqueueing an event twice. Returns the event ids enqueued. `$1` topic,
/// `$2` created_at, `$3` replay id, `$4` the correlation ids, `$5`-`$10`
/// the messages ([`MessageColumns`]).
static ENQUEUE_SQL: LazyLock<String> = LazyLock::new(|| {
    let from = format!(
        "FROM unnest($4::uuid[], {messages}) AS i(correlation_id, {names}) \
         WHERE NOT {waiting} \
           AND NOT EXISTS (SELECT 1 FROM booking_expiration_outbox_event r \
                            WHERE r.event_id = i.event_id AND r.replay_id = $3)",
        messages = MessageColumns::params(5),
        names = MessageColumns::NAMES,
        waiting = outbox::event_waiting_sql("i.event_id"),
    );
    let insert = outbox::insert_sql(OutboxValues {
        message: "i",
        topic: "$1",
        correlation_id: "i.correlation_id",
        created_at: "$2",
        replay_id: "$3",
        claimed_until: "NULL",
        claimed_by: "NULL",
        from: &from,
    });
    format!(
        "WITH queued AS ({insert} RETURNING id, event_id), recorded AS ({record}) \
         SELECT event_id FROM queued",
        record = outbox::record_events_sql("queued", "$3::uuid"),
    )
});

#[derive(QueryableByName)]
struct Enqueued {
    #[diesel(sql_type = SqlUuid)]
    event_id: Uuid,
}

/// Writes the replay's outbox rows (see [`ENQUEUE_SQL`]); the insert
/// trigger wakes the publishers at commit. A page may name one event twice
/// (two audit records of a booking written before records kept their
/// version both take the booking's, so they name the same event): only the
/// first is written, and the second is not enqueued, as one already
/// enqueued by this replay is not.
pub async fn enqueue(
    conn: &mut AsyncPgConnection,
    topic: &str,
    created_at: DateTime<Utc>,
    replay_id: Uuid,
    writes: &[ReplayWrite],
) -> Result<Vec<Uuid>, DbError> {
    let mut seen = HashSet::with_capacity(writes.len());
    let writes: Vec<&ReplayWrite> = writes
        .iter()
        .filter(|w| seen.insert(w.message.event_id))
        .collect();
    if writes.is_empty() {
        return Ok(Vec::new());
    }
    let correlation_ids: Vec<Uuid> = writes.iter().map(|w| w.correlation_id).collect();
    let mut messages = MessageColumns::with_capacity(writes.len());
    for write in &writes {
        messages.push(&write.message);
    }
    let query = diesel::sql_query(ENQUEUE_SQL.as_str())
        .bind::<Text, _>(topic)
        .bind::<Timestamptz, _>(created_at)
        .bind::<SqlUuid, _>(replay_id)
        .bind::<Array<SqlUuid>, _>(&correlation_ids);
    let rows: Vec<Enqueued> = outbox::bind_message_columns!(query, messages)
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
        let open = IdBounds::default();
        let sql = ids.page_sql(&open);
        assert!(sql.contains("a.booking_id = ANY($2)"));
        assert!(!sql.contains("$3") && !sql.contains("$4") && !sql.contains("$5"));
        assert!(!sql.contains("$7") && !sql.contains("$8"));
        assert!(sql.contains("a.to_status IN ('ReserveExpired', 'BookingExpired')"));
        let window = Selection {
            expired_from: Some(DateTime::<Utc>::MIN_UTC),
            expired_to: Some(DateTime::<Utc>::MAX_UTC),
            tenant_ids: vec![Uuid::nil()],
            ..Selection::default()
        };
        let bounded = IdBounds {
            first: Some(10),
            last: Some(20),
        };
        let sql = window.page_sql(&open);
        assert!(sql.contains("a.at >= $4") && sql.contains("a.at < $5"));
        let sql = window.page_sql(&bounded);
        assert!(
            sql.contains("(a.at + interval '0') >= $4")
                && sql.contains("(a.at + interval '0') < $5")
        );
        assert!(sql.contains("a.id >= $7") && sql.contains("a.id <= $8"));
        assert_eq!(window.distinct_tenants().len(), 1);
        assert!(sql.contains("a.tenant_id = ($3::uuid[])[1]") && !sql.contains("[2]"));
        assert!(!sql.contains("$2") && !sql.contains("ANY($3)"));
        let two = Selection {
            tenant_ids: vec![Uuid::from_u128(2), Uuid::nil(), Uuid::from_u128(2)],
            ..Selection::default()
        };
        assert_eq!(two.distinct_tenants(), [Uuid::nil(), Uuid::from_u128(2)]);
        let sql = two.page_sql(&open);
        assert!(sql.contains("[2]") && !sql.contains("[3]") && sql.contains(" UNION ALL "));
        assert!(window.is_restricted());
        assert!(!Selection::default().is_restricted());
        // Booking ids and tenants: the booking index, the tenant a filter.
        let both = Selection {
            booking_ids: vec![Uuid::nil()],
            ..window.clone()
        };
        let sql = both.page_sql(&bounded);
        assert!(sql.contains("a.tenant_id = ANY($3)") && !sql.contains("UNION ALL"));
    }

    #[test]
    fn only_a_window_from_after_its_end_is_empty() {
        let at = |s: i64| DateTime::from_timestamp(1_800_000_000 + s, 0);
        let window = |from, to| Selection {
            expired_from: at(from),
            expired_to: at(to),
            ..Selection::default()
        };
        assert!(window(1, 0).window_is_empty());
        assert!(window(0, 0).window_is_empty());
        assert!(!window(0, 1).window_is_empty());
        let open = Selection {
            expired_from: at(5),
            ..Selection::default()
        };
        assert!(!open.window_is_empty());
    }
}
