//! The bookings repository: lock due candidates, write transitions with
//! their audit and outbox rows, count what is due.
//!
//! Status values appear as SQL literals, never as parameters: PostgreSQL
//! can only use a partial index when it can prove the query's predicate
//! implies the index's `WHERE`, and it cannot do that for a bound value.
//! They are built once, from the domain's phases (`Phase::active_statuses`,
//! `Phase::deadline_field`), never spelled out here.

use std::sync::LazyLock;

use chrono::{DateTime, Utc};
use diesel::{
    QueryableByName,
    sql_types::{Array, BigInt, Nullable, Text, Timestamptz, Uuid as SqlUuid},
};
use diesel_async::{AsyncPgConnection, RunQueryDsl};
use uuid::Uuid;

use super::{
    Count, DbError,
    outbox::{self, MessageColumns, OutboxValues},
};
use crate::{
    config::EventSettings,
    domain::{
        Booking, BookingId, DealId, Expiry, Phase, PropertyObjectId, RunId, SYSTEM_ACTOR, Status,
        TenantId, UnknownStatus,
    },
    events::OutboxMessage,
    handoff::LeaseOwner,
};

/// One `bookings` row as stored.
#[derive(Debug, Clone, PartialEq, QueryableByName)]
pub struct BookingRow {
    #[diesel(sql_type = SqlUuid)]
    pub id: Uuid,
    #[diesel(sql_type = SqlUuid)]
    pub tenant_id: Uuid,
    #[diesel(sql_type = Nullable<SqlUuid>)]
    pub deal_id: Option<Uuid>,
    #[diesel(sql_type = Nullable<SqlUuid>)]
    pub property_object_id: Option<Uuid>,
    #[diesel(sql_type = Text)]
    pub status: String,
    #[diesel(sql_type = Nullable<Timestamptz>)]
    pub reserve_expires_at: Option<DateTime<Utc>>,
    #[diesel(sql_type = Nullable<Timestamptz>)]
    pub booking_expires_at: Option<DateTime<Utc>>,
    #[diesel(sql_type = Nullable<Timestamptz>)]
    pub expired_at: Option<DateTime<Utc>>,
    #[diesel(sql_type = Timestamptz)]
    pub updated_at: DateTime<Utc>,
    #[diesel(sql_type = BigInt)]
    pub version: i64,
}

impl BookingRow {
    /// The row's deadline of `phase`, whatever its status.
    pub fn deadline(&self, phase: Phase) -> Option<DateTime<Utc>> {
        phase.deadline_of(self.reserve_expires_at, self.booking_expires_at)
    }

    /// The row as a domain booking; fails only for an unknown status.
    pub fn to_domain(&self) -> Result<Booking, UnknownStatus> {
        Ok(Booking {
            id: BookingId::new(self.id),
            tenant_id: TenantId::new(self.tenant_id),
            deal_id: self.deal_id.map(DealId::new),
            property_object_id: self.property_object_id.map(PropertyObjectId::new),
            status: self.status.parse::<Status>()?,
            reserve_expires_at: self.reserve_expires_at,
            booking_expires_at: self.booking_expires_at,
            expired_at: self.expired_at,
            updated_at: self.updated_at,
            version: self.version,
        })
    }
}

/// A status no phase knows is a value the row type cannot represent.
impl From<UnknownStatus> for DbError {
    fn from(unknown: UnknownStatus) -> Self {
        DbError::Query(diesel::result::Error::DeserializationError(Box::new(
            unknown,
        )))
    }
}

const COLUMNS: &str = "id, tenant_id, deal_id, property_object_id, status, reserve_expires_at, \
                       booking_expires_at, expired_at, updated_at, version";

/// The SQL of one phase, built once from the domain's definition of the
/// phase (active statuses, deadline field).
#[derive(Debug)]
struct PhaseSql {
    index_predicate: String,
    due_predicate: String,
    partial_index: String,
    lock_due: String,
    count_due: String,
    count_due_excluding: String,
    oldest_due_deadline: String,
    due_poison_rows: String,
}

impl PhaseSql {
    fn build(phase: Phase) -> Self {
        let deadline = phase.deadline_field();
        // Literals, not parameters (see the module doc). The statuses are
        // plain identifiers (a domain test checks it), so quoting is safe.
        let index_predicate = match phase.active_statuses() {
            [status] => format!("status = '{status}'"),
            statuses => {
                let quoted: Vec<String> = statuses.iter().map(|s| format!("'{s}'")).collect();
                format!("status IN ({})", quoted.join(", "))
            }
        };
        let due_predicate = format!("{index_predicate} AND {deadline} < $1");
        // Rows after a position of the sweep (`$2` deadline, `$3` id; both
        // NULL: from the start). The `>=` is the index condition, so the
        // scan starts at the position instead of reading past every row
        // before it; the rest breaks ties between equal deadlines by id.
        let after = format!(
            "{deadline} >= coalesce($2, '-infinity'::timestamptz) \
             AND ($2 IS NULL OR {deadline} > $2 OR id > $3)"
        );
        Self {
            partial_index: format!("ix_bookings_{deadline}"),
            lock_due: format!(
                "SELECT {COLUMNS} FROM bookings WHERE {due_predicate} AND {after} \
                 ORDER BY {deadline}, id LIMIT $4 FOR UPDATE SKIP LOCKED"
            ),
            count_due: format!("SELECT count(*) AS count FROM bookings WHERE {due_predicate}"),
            count_due_excluding: format!(
                "SELECT count(*) AS count FROM bookings WHERE {due_predicate} AND {after} \
                 AND id <> ALL($4)"
            ),
            oldest_due_deadline: format!(
                "SELECT min({deadline}) AS oldest FROM bookings WHERE {due_predicate}"
            ),
            due_poison_rows: format!(
                "SELECT {COLUMNS} FROM bookings WHERE {due_predicate} \
                 AND (deal_id IS NULL OR property_object_id IS NULL) ORDER BY {deadline} LIMIT $2"
            ),
            index_predicate,
            due_predicate,
        }
    }
}

/// Indexed by `phase as usize`, which is the phase's place in `Phase::ALL`.
static PHASE_SQL: LazyLock<[PhaseSql; 2]> = LazyLock::new(|| Phase::ALL.map(PhaseSql::build));

fn phase_sql(phase: Phase) -> &'static PhaseSql {
    &PHASE_SQL[phase as usize]
}

/// The `WHERE` of the phase's partial index: its active statuses, e.g.
/// `status IN ('Reserved', 'AwaitingPayment')` or `status = 'Booked'`.
/// The migration states the
/// same predicate; a test compares the two as PostgreSQL renders them.
pub fn index_predicate(phase: Phase) -> &'static str {
    &phase_sql(phase).index_predicate
}

/// The predicate of a phase: exactly the partial index's `WHERE` plus the
/// strict deadline comparison against `$1` (as_of).
pub fn due_predicate(phase: Phase) -> &'static str {
    &phase_sql(phase).due_predicate
}

/// The deadline column of a phase (the domain's deadline field).
pub const fn deadline_column(phase: Phase) -> &'static str {
    phase.deadline_field()
}

/// The name of the phase's partial index, `ix_bookings_<deadline column>`.
pub fn partial_index(phase: Phase) -> &'static str {
    &phase_sql(phase).partial_index
}

/// A due row's place in the order a sweep takes the rows of a phase in:
/// its deadline, then its id (which breaks ties between equal deadlines).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Position {
    pub deadline: DateTime<Utc>,
    pub id: Uuid,
}

impl BookingRow {
    /// The row's place among the due rows of `phase` (`None` without a
    /// deadline of that phase: such a row is never due).
    pub fn position(&self, phase: Phase) -> Option<Position> {
        self.deadline(phase).map(|deadline| Position {
            deadline,
            id: self.id,
        })
    }
}

/// The candidate query of a phase: due rows after a position, in deadline
/// then id order, rows locked by anyone else skipped without waiting.
/// Binds `$1` as_of, `$2` and `$3` the position's deadline and id (NULL:
/// from the start), `$4` the limit.
pub fn lock_due_sql(phase: Phase) -> &'static str {
    &phase_sql(phase).lock_due
}

/// The count behind [`count_due_excluding`]. Binds `$1` as_of, `$2` and
/// `$3` the position (NULL: from the start), `$4` the ids to leave out.
pub fn count_due_excluding_sql(phase: Phase) -> &'static str {
    &phase_sql(phase).count_due_excluding
}

/// Locks up to `limit` due rows of `phase` after `after` (the sweep's
/// position; `None`: from the oldest deadline), in deadline then id order.
/// Must run inside the batch's transaction.
pub async fn lock_due(
    conn: &mut AsyncPgConnection,
    phase: Phase,
    as_of: DateTime<Utc>,
    after: Option<Position>,
    limit: u32,
) -> Result<Vec<BookingRow>, DbError> {
    Ok(diesel::sql_query(lock_due_sql(phase))
        .bind::<Timestamptz, _>(as_of)
        .bind::<Nullable<Timestamptz>, _>(after.map(|p| p.deadline))
        .bind::<Nullable<SqlUuid>, _>(after.map(|p| p.id))
        .bind::<BigInt, _>(i64::from(limit))
        .load(conn)
        .await?)
}

/// Due rows of `phase` after `after` other than `exclude`. Run in the
/// batch's transaction right after a short [`lock_due`] from the same
/// position, with the ids it returned, it counts the due rows someone else
/// holds locked.
pub async fn count_due_excluding(
    conn: &mut AsyncPgConnection,
    phase: Phase,
    as_of: DateTime<Utc>,
    after: Option<Position>,
    exclude: &[Uuid],
) -> Result<i64, DbError> {
    let row: Count = diesel::sql_query(count_due_excluding_sql(phase))
        .bind::<Timestamptz, _>(as_of)
        .bind::<Nullable<Timestamptz>, _>(after.map(|p| p.deadline))
        .bind::<Nullable<SqlUuid>, _>(after.map(|p| p.id))
        .bind::<Array<SqlUuid>, _>(exclude)
        .get_result(conn)
        .await?;
    Ok(row.count)
}

/// Due rows of `phase` at `as_of` (the backlog).
pub async fn count_due(
    conn: &mut AsyncPgConnection,
    phase: Phase,
    as_of: DateTime<Utc>,
) -> Result<i64, DbError> {
    let row: Count = diesel::sql_query(phase_sql(phase).count_due.as_str())
        .bind::<Timestamptz, _>(as_of)
        .get_result(conn)
        .await?;
    Ok(row.count)
}

/// The oldest due deadline of `phase`, if any row is due.
pub async fn oldest_due_deadline(
    conn: &mut AsyncPgConnection,
    phase: Phase,
    as_of: DateTime<Utc>,
) -> Result<Option<DateTime<Utc>>, DbError> {
    #[derive(QueryableByName)]
    struct Oldest {
        #[diesel(sql_type = Nullable<Timestamptz>)]
        oldest: Option<DateTime<Utc>>,
    }
    let row: Oldest = diesel::sql_query(phase_sql(phase).oldest_due_deadline.as_str())
        .bind::<Timestamptz, _>(as_of)
        .get_result(conn)
        .await?;
    Ok(row.oldest)
}

/// One statement, one probe on each partial index: the earliest deadline
/// among active rows that is not yet due at `$1` (`deadline >= as_of`; due
/// rows the cycle could not take are the regular tick's). `least` skips a
/// phase with no such row.
static NEXT_DEADLINE: LazyLock<String> = LazyLock::new(|| {
    let probes: Vec<String> = Phase::ALL
        .map(|phase| {
            let deadline = phase.deadline_field();
            format!(
                "(SELECT min({deadline}) FROM bookings WHERE {} AND {deadline} >= $1)",
                index_predicate(phase)
            )
        })
        .into();
    format!("SELECT least({}) AS next", probes.join(", "))
});

/// The next deadline after `as_of` among active bookings of both phases:
/// when the scheduler wakes for the next expiry.
pub async fn next_deadline(
    conn: &mut AsyncPgConnection,
    as_of: DateTime<Utc>,
) -> Result<Option<DateTime<Utc>>, DbError> {
    #[derive(QueryableByName)]
    struct Next {
        #[diesel(sql_type = Nullable<Timestamptz>)]
        next: Option<DateTime<Utc>>,
    }
    let row: Next = diesel::sql_query(NEXT_DEADLINE.as_str())
        .bind::<Timestamptz, _>(as_of)
        .get_result(conn)
        .await?;
    Ok(row.next)
}

/// The probe statement of [`next_deadline`] (EXPLAIN tests).
pub fn next_deadline_sql() -> &'static str {
    NEXT_DEADLINE.as_str()
}

/// Due rows of `phase` the domain will refuse (legacy rows without
/// `deal_id` or `property_object_id`), oldest first.
pub async fn due_poison_rows(
    conn: &mut AsyncPgConnection,
    phase: Phase,
    as_of: DateTime<Utc>,
    limit: u32,
) -> Result<Vec<BookingRow>, DbError> {
    Ok(diesel::sql_query(phase_sql(phase).due_poison_rows.as_str())
        .bind::<Timestamptz, _>(as_of)
        .bind::<BigInt, _>(i64::from(limit))
        .load(conn)
        .await?)
}

/// The database server's clock.
pub async fn database_now(conn: &mut AsyncPgConnection) -> Result<DateTime<Utc>, DbError> {
    #[derive(QueryableByName)]
    struct Now {
        #[diesel(sql_type = Timestamptz)]
        now: DateTime<Utc>,
    }
    let row: Now = diesel::sql_query("SELECT clock_timestamp() AS now")
        .get_result(conn)
        .await?;
    Ok(row.now)
}

/// One transition to persist with its outbox message.
#[derive(Debug, Clone)]
pub struct ExpiryWrite {
    /// The version the row had when it was read.
    pub read_version: i64,
    pub expiry: Expiry,
    pub message: OutboxMessage,
}

/// The transitions, their audit rows and their outbox rows (with their
/// event records, [`outbox::record_events_sql`]) in one statement. Each
/// update is conditioned on the version and status that were read, so a
/// row changed by anyone else since is left alone and gets neither audit
/// nor outbox row. Returns the ids actually expired.
/// Parameters in order: `$1`-`$7` the per-booking arrays, in the order of
/// `t(…)`, `$8`-`$13` the messages' arrays ([`MessageColumns`]); then
/// `$14` as_of, `$15` actor, `$16` run id, `$17` topic, `$18` written_at,
/// `$19` ce_source, `$20` the outbox rows' lease in milliseconds (NULL: none;
/// see [`crate::handoff::Handoff`]) and `$21` its owner. Returns each expired
/// booking's id with its outbox row's id.
static PERSIST_SQL: LazyLock<String> = LazyLock::new(|| {
    let queue = outbox::insert_sql(OutboxValues {
        message: "i",
        topic: "$17",
        correlation_id: "$16",
        created_at: "$18",
        replay_id: "NULL",
        claimed_until: "statement_timestamp() + $20 * interval '1 millisecond'",
        claimed_by: "$21",
        from: "FROM input i JOIN updated u ON u.id = i.id",
    });
    format!(
        "\
WITH input AS (
    SELECT * FROM unnest($1::uuid[], $2::bigint[], $3::text[], $4::text[], $5::bigint[],
                         $6::uuid[], $7::uuid[], {messages})
        AS t(id, read_version, from_status, to_status, version, deal_id, property_object_id,
             {names})
), updated AS (
    UPDATE bookings b
       SET status = i.to_status, expired_at = $14, updated_at = $14, version = b.version + 1
      FROM input i
     WHERE b.id = i.id AND b.version = i.read_version AND b.status = i.from_status
    RETURNING b.id
), audited AS (
    INSERT INTO booking_expiration_audit
           (booking_id, tenant_id, from_status, to_status, actor, correlation_id, at,
            version, deal_id, property_object_id, ce_source)
    SELECT i.id, i.tenant_id, i.from_status, i.to_status, $15, $16, $14,
           i.version, i.deal_id, i.property_object_id, $19
      FROM input i JOIN updated u ON u.id = i.id
), queued AS (
    {queue}
    RETURNING id, event_id
), recorded AS (
    {record}
)
SELECT i.id, q.id AS outbox_id FROM input i JOIN queued q ON q.event_id = i.event_id",
        record = outbox::record_events_sql("queued", "NULL"),
        messages = MessageColumns::params(8),
        names = MessageColumns::NAMES,
    )
});

#[derive(QueryableByName)]
struct UpdatedId {
    #[diesel(sql_type = SqlUuid)]
    id: Uuid,
    #[diesel(sql_type = BigInt)]
    outbox_id: i64,
}

/// Persists a batch of transitions (see [`PERSIST_SQL`]). Must run inside
/// the transaction that locked the rows. `written_at` (the clock now, close
/// to the commit) becomes the outbox rows' `created_at`, the start of the
/// outbox lag; `lease`, when set, the lease the outbox rows are written
/// with ([`crate::handoff::Handoff`]). Returns the bookings expired, each with its
/// outbox row's id.
pub async fn persist_expiries(
    conn: &mut AsyncPgConnection,
    as_of: DateTime<Utc>,
    written_at: DateTime<Utc>,
    run_id: RunId,
    events: &EventSettings,
    writes: &[ExpiryWrite],
    lease: Option<(std::time::Duration, LeaseOwner)>,
) -> Result<Vec<(Uuid, i64)>, DbError> {
    if writes.is_empty() {
        return Ok(Vec::new());
    }
    let n = writes.len();
    let mut ids = Vec::with_capacity(n);
    let mut read_versions = Vec::with_capacity(n);
    let mut from_statuses = Vec::with_capacity(n);
    let mut to_statuses = Vec::with_capacity(n);
    let mut versions = Vec::with_capacity(n);
    let mut deal_ids = Vec::with_capacity(n);
    let mut property_object_ids = Vec::with_capacity(n);
    let mut messages = MessageColumns::with_capacity(n);
    for write in writes {
        let event = &write.expiry.event;
        ids.push(event.booking_id.as_uuid());
        read_versions.push(write.read_version);
        from_statuses.push(event.from_status.as_str());
        to_statuses.push(event.to_status.as_str());
        versions.push(event.version);
        deal_ids.push(event.deal_id.as_uuid());
        property_object_ids.push(event.property_object_id.as_uuid());
        messages.push(&write.message);
    }
    let query = diesel::sql_query(PERSIST_SQL.as_str())
        .bind::<Array<SqlUuid>, _>(&ids)
        .bind::<Array<BigInt>, _>(&read_versions)
        .bind::<Array<Text>, _>(&from_statuses)
        .bind::<Array<Text>, _>(&to_statuses)
        .bind::<Array<BigInt>, _>(&versions)
        .bind::<Array<SqlUuid>, _>(&deal_ids)
        .bind::<Array<SqlUuid>, _>(&property_object_ids);
    let updated: Vec<UpdatedId> = outbox::bind_message_columns!(query, messages)
        .bind::<Timestamptz, _>(as_of)
        .bind::<Text, _>(SYSTEM_ACTOR)
        .bind::<SqlUuid, _>(run_id.as_uuid())
        .bind::<Text, _>(&events.topic)
        .bind::<Timestamptz, _>(written_at)
        .bind::<Text, _>(&events.ce_source)
        .bind::<Nullable<BigInt>, _>(lease.map(|(lease, _)| outbox::millis(lease)))
        .bind::<Nullable<SqlUuid>, _>(lease.map(|(_, owner)| owner.0))
        .load(conn)
        .await?;
    Ok(updated
        .into_iter()
        .map(|row| (row.id, row.outbox_id))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The SQL literals must be exactly the domain's active statuses.
    #[test]
    fn predicates_name_the_domain_statuses() {
        for phase in Phase::ALL {
            let predicate = due_predicate(phase);
            for status in Status::ALL {
                let quoted = format!("'{}'", status.as_str());
                assert_eq!(
                    predicate.contains(&quoted),
                    phase.active_statuses().contains(&status),
                    "{phase} / {status}"
                );
            }
            assert!(predicate.contains(&format!("{} < $1", deadline_column(phase))));
            assert!(predicate.starts_with(index_predicate(phase)));
            assert!(lock_due_sql(phase).contains(predicate));
        }
    }

    #[test]
    fn phase_sql_is_indexed_by_the_phase() {
        for (i, phase) in Phase::ALL.into_iter().enumerate() {
            assert_eq!(phase as usize, i);
            assert_eq!(phase_sql(phase).lock_due, PhaseSql::build(phase).lock_due);
        }
        assert_eq!(
            index_predicate(Phase::Reserve),
            "status IN ('Reserved', 'AwaitingPayment')"
        );
        assert_eq!(index_predicate(Phase::Booking), "status = 'Booked'");
        assert_eq!(
            partial_index(Phase::Reserve),
            "ix_bookings_reserve_expires_at"
        );
        assert_eq!(
            partial_index(Phase::Booking),
            "ix_bookings_booking_expires_at"
        );
    }
}
