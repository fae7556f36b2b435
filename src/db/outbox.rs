//! The outbox repository: the one writer of outbox rows (its column list,
//! used by the expiring statement and by `republish`) and of their event
//! records (`booking_expiration_outbox_event`), the one reader (the
//! lease claim), and the publisher's other statements: mark published,
//! park, renew and release leases; put parked rows back; sweep old
//! published rows; report the lag and the parked rows, and share that
//! count among the instances (`booking_expiration_outbox_lag`).
//!
//! # Leases
//!
//! The publisher reserves the rows it is about to send with a lease
//! (`claimed_until`, on the database's clock: a lease is compared across
//! instances, and the database clock is the one they share) instead of
//! holding their row locks across the Kafka call. The claim is one
//! `UPDATE … WHERE id IN (SELECT … FOR UPDATE SKIP LOCKED)` statement:
//! concurrent claims skip each other's rows while they run, and a claim
//! that reaches a row another claim just leased re-checks it against the
//! new version (PostgreSQL's re-evaluation of a locked row in READ
//! COMMITTED) and leaves it, so two instances never hold the same row. A
//! lease that ends (its instance was killed) makes the row claimable
//! again: at-least-once.

use std::sync::LazyLock;

use chrono::{DateTime, Utc};
use diesel::{
    OptionalExtension, QueryableByName,
    sql_types::{
        Array, BigInt, Binary, Bool, Integer, Nullable, Text, Timestamptz, Uuid as SqlUuid,
    },
};
use diesel_async::{AsyncPgConnection, RunQueryDsl};
use uuid::Uuid;

use super::{Count, DbError};
use crate::{
    events::{Headers, OutboxMessage},
    handoff::{LeaseOwner, LeasedRow},
};

// ---------------------------------------------------------------------------
// The writer

/// Inserts outbox rows. `values` are the statement's value expressions,
/// one per column of the list below and in its order: the list is written
/// here once, for the expiring statement and `republish`.
pub(crate) fn insert_sql(values: OutboxValues<'_>) -> String {
    let OutboxValues {
        message,
        topic,
        correlation_id,
        created_at,
        replay_id,
        claimed_until,
        claimed_by,
        from,
    } = values;
    // The topic's layout as the publishers last read it (an uncorrelated
    // subquery: read once per statement): each row is born with its
    // partition, which the claim's index is ordered by.
    let count = format!(
        "(SELECT l.partitions FROM booking_expiration_topic_layout l WHERE l.topic = {topic})"
    );
    format!(
        "INSERT INTO booking_expiration_outbox \
             (event_id, topic, message_key, key_hash, payload, headers, \
              correlation_id, tenant_id, created_at, replay_id, claimed_until, claimed_by, \
              partition_count, kafka_partition) \
         SELECT {message}.event_id, {topic}, {message}.message_key, {message}.key_hash, \
                {message}.payload, {message}.headers::json, {correlation_id}, \
                {message}.tenant_id, {created_at}, {replay_id}, {claimed_until}, {claimed_by}, \
                {count}, {message}.key_hash % {count} \
         {from}"
    )
}

/// Records the events of new outbox rows in `booking_expiration_outbox_event`
/// (one row each, never updated: its unique index on `(event_id,
/// replay_id)` gets one entry per event, where an index of the outbox
/// would get one more on every update that leaves its page). `rows` is the
/// alias of the inserted rows (`id`, `event_id`); `replay_id` the value
/// expression of the replay that wrote them (`NULL`: originals). A second
/// original of an event, or a second row of one replay for an event, fails
/// the statement with a unique violation.
pub(crate) fn record_events_sql(rows: &str, replay_id: &str) -> String {
    format!(
        "INSERT INTO booking_expiration_outbox_event (event_id, replay_id, outbox_id) \
         SELECT {rows}.event_id, {replay_id}, {rows}.id FROM {rows}"
    )
}

/// Whether an outbox row of event `event_id` (an SQL expression) waits to
/// be sent (unpublished, parked or not): a lookup by event id through
/// `booking_expiration_outbox_event`'s unique index.
pub(crate) fn event_waiting_sql(event_id: &str) -> String {
    format!(
        "EXISTS (SELECT 1 FROM booking_expiration_outbox_event e \
                   JOIN booking_expiration_outbox o ON o.id = e.outbox_id \
                  WHERE e.event_id = {event_id} AND o.published_at IS NULL)"
    )
}

/// `WITH gone AS ({delete} RETURNING id, event_id)`, the event records of
/// the deleted rows deleted with them, and the number of outbox rows
/// deleted as `count`. The records are found by the arrays of the deleted
/// rows' event ids (through the unique index) and ids: a join with `gone`
/// would leave the plan to a guess of its size, and a generic plan's guess
/// hashes the whole records table.
fn delete_with_events_sql(delete: &str) -> String {
    format!(
        "WITH gone AS ({delete} RETURNING id, event_id), \
              forgotten AS (DELETE FROM booking_expiration_outbox_event e \
                             WHERE e.event_id = ANY(ARRAY(SELECT event_id FROM gone)) \
                               AND e.outbox_id = ANY(ARRAY(SELECT id FROM gone))) \
         SELECT count(*) AS count FROM gone"
    )
}

/// The value expressions of [`insert_sql`]: `message` is the alias of a row
/// set with the columns [`MessageColumns::NAMES`].
#[derive(Debug, Clone, Copy)]
pub(crate) struct OutboxValues<'a> {
    pub message: &'a str,
    pub topic: &'a str,
    pub correlation_id: &'a str,
    pub created_at: &'a str,
    pub replay_id: &'a str,
    /// The lease the row is born with (`NULL`: none, any publisher may
    /// claim it), see [`crate::handoff::Handoff`].
    pub claimed_until: &'a str,
    /// The lease's owner (`NULL` with no lease), see [`LeaseOwner`].
    pub claimed_by: &'a str,
    /// `FROM …` (and `WHERE …`) that yields `message`.
    pub from: &'a str,
}

/// The per-message columns of outbox rows as arrays, one element per
/// message, for an `unnest` of their bound parameters.
#[derive(Debug, Default)]
pub(crate) struct MessageColumns<'a> {
    pub event_ids: Vec<Uuid>,
    pub keys: Vec<&'a str>,
    pub key_hashes: Vec<i32>,
    pub payloads: Vec<&'a [u8]>,
    pub headers: Vec<String>,
    pub tenant_ids: Vec<Uuid>,
}

impl<'a> MessageColumns<'a> {
    /// The SQL types of the arrays, in the order of the fields.
    pub const UNNEST: [&'static str; 6] =
        ["uuid[]", "text[]", "int[]", "bytea[]", "text[]", "uuid[]"];

    pub fn with_capacity(n: usize) -> Self {
        Self {
            event_ids: Vec::with_capacity(n),
            keys: Vec::with_capacity(n),
            key_hashes: Vec::with_capacity(n),
            payloads: Vec::with_capacity(n),
            headers: Vec::with_capacity(n),
            tenant_ids: Vec::with_capacity(n),
        }
    }

    pub fn push(&mut self, message: &'a OutboxMessage) {
        self.event_ids.push(message.event_id);
        self.keys.push(message.key.as_str());
        self.key_hashes.push(message.key_hash);
        self.payloads.push(message.payload.as_slice());
        self.headers.push(message.headers.to_json());
        self.tenant_ids.push(message.tenant_id);
    }

    /// The column names of the arrays in an `unnest(…) AS alias(…)`.
    pub const NAMES: &'static str = "event_id, message_key, key_hash, payload, headers, tenant_id";

    /// The arrays' parameters, `$first::uuid[], …`, for an `unnest`
    /// whose aliases end with [`Self::NAMES`].
    pub fn params(first: usize) -> String {
        let params: Vec<String> = Self::UNNEST
            .iter()
            .enumerate()
            .map(|(i, ty)| format!("${}::{ty}", first + i))
            .collect();
        params.join(", ")
    }
}

/// Binds [`MessageColumns`]' arrays in the order of [`MessageColumns::UNNEST`].
macro_rules! bind_message_columns {
    ($query:expr, $columns:expr) => {
        $query
            .bind::<diesel::sql_types::Array<diesel::sql_types::Uuid>, _>(&$columns.event_ids)
            .bind::<diesel::sql_types::Array<diesel::sql_types::Text>, _>(&$columns.keys)
            .bind::<diesel::sql_types::Array<diesel::sql_types::Integer>, _>(&$columns.key_hashes)
            .bind::<diesel::sql_types::Array<diesel::sql_types::Binary>, _>(&$columns.payloads)
            .bind::<diesel::sql_types::Array<diesel::sql_types::Text>, _>(&$columns.headers)
            .bind::<diesel::sql_types::Array<diesel::sql_types::Uuid>, _>(&$columns.tenant_ids)
    };
}
pub(crate) use bind_message_columns;

// ---------------------------------------------------------------------------
// The reader

/// An outbox row as the claim's `RETURNING` lists it.
#[derive(QueryableByName)]
struct StoredRow {
    #[diesel(sql_type = BigInt)]
    id: i64,
    #[diesel(sql_type = SqlUuid)]
    event_id: Uuid,
    #[diesel(sql_type = Text)]
    topic: String,
    #[diesel(sql_type = Text)]
    message_key: String,
    #[diesel(sql_type = Binary)]
    payload: Vec<u8>,
    /// The `json` column as text (exactly the bytes the writer stored).
    #[diesel(sql_type = Text)]
    headers: String,
    #[diesel(sql_type = Timestamptz)]
    created_at: DateTime<Utc>,
    #[diesel(sql_type = Nullable<Integer>)]
    key_hash: Option<i32>,
    #[diesel(sql_type = Nullable<Integer>)]
    partition_count: Option<i32>,
}

impl From<StoredRow> for LeasedRow {
    fn from(row: StoredRow) -> Self {
        Self {
            id: row.id,
            event_id: row.event_id,
            topic: row.topic,
            message_key: row.message_key,
            payload: row.payload,
            headers: Headers::from_json(row.headers.as_bytes()),
            created_at: row.created_at,
            key_hash: row.key_hash,
            partition_count: row.partition_count,
        }
    }
}

/// The unpublished rows the publisher may claim, leases aside. Keep it the
/// predicate of `ix_booking_expiration_outbox_claim`, word for word in
/// meaning, so the claim and the lag count are index scans.
const CLAIMABLE: &str = "published_at IS NULL AND parked_at IS NULL";

/// What one claim takes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Claim {
    /// At most this many rows of the topics `partitions` does not cover
    /// (topics whose partition count is not known yet) and of rows written
    /// without a `key_hash`.
    pub limit: u32,
    /// How long the lease lasts.
    pub lease: std::time::Duration,
    /// Topics none of whose rows are taken (a topic that cannot take
    /// records now: missing, refused, or with enough of its rows held).
    pub skip_topics: Vec<String>,
    /// Topics whose partition count is known, with the count: their rows
    /// written for that count are taken only through `partitions`, each
    /// partition for itself; their rows written for another count or none
    /// within `limit`.
    pub routed_topics: Vec<RoutedTopic>,
    /// Per partition of a routed topic: at most `room` of its rows (those
    /// with `key_hash % count = partition`), oldest first. A partition not
    /// listed takes nothing. Each partition's rows are claimed apart from
    /// the others, so a partition with a backlog never fills a claim that
    /// the other partitions' new rows needed.
    pub partitions: Vec<PartitionRoom>,
}

/// A topic whose partition count the publisher knows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RoutedTopic {
    pub topic: String,
    pub count: i32,
}

/// One partition's part of a claim.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartitionRoom {
    pub topic: String,
    /// The topic's partition count.
    pub count: i32,
    pub partition: i32,
    pub room: u32,
    /// Only rows with a greater id (0: from the partition's first row).
    /// Each claim starts where the one before it ended, so the rows it
    /// published (whose index entries stay until VACUUM removes them) are
    /// not walked again: a claim costs what it takes, not the rows drained
    /// before it. The publisher's `Scan` says when the scan starts again
    /// from the first row.
    pub after: i64,
}

impl PartitionRoom {
    /// Whether the row of `topic` with `key_hash` is this partition's.
    pub fn holds(&self, topic: &str, key_hash: i32) -> bool {
        self.topic == topic && key_hash % self.count == self.partition
    }
}

/// Rows no lease holds.
const LEASE_FREE: &str = "(c.claimed_until IS NULL OR c.claimed_until < statement_timestamp())";

/// The claim statement. `$1` the limit of the rows the partitions do not
/// cover, `$2` the lease in milliseconds, `$3` topics to skip, `$4`/`$5`
/// the routed topics and their counts, `$6`–`$9` and `$11` the partitions
/// (topic, count, partition, room, after), `$10` the lease's owner.
///
/// The ids are gathered first (`ARRAY(…)`, locked as they are read) and the
/// update finds them by primary key: a join would let the planner scan the
/// table. Every branch is an index range scan of `ix_booking_expiration_outbox_claim`
/// (topic, partition_count, kafka_partition, id) that starts where its rows
/// start and stops at its limit, whatever the backlog:
///
/// - each listed partition: its rows written for the topic's current
///   count past its `after`, oldest first, up to its room (the scan starts
///   at `(topic, count, partition, after)`: `BETWEEN` is inclusive, so the
///   index's start key takes the `id` bound too);
/// - each routed topic: its rows written for another count (below it,
///   above it) or for none, in the index's order, within `$1`;
/// - topics the publisher does not know yet (a `republish` to another
///   topic): found by a loose scan of the index's first column (one probe
///   per topic) in the gaps between the routed topics, so that it never
///   walks a routed topic's entries, then their rows within `$1`.
fn claim_sql() -> &'static str {
    static SQL: LazyLock<String> = LazyLock::new(|| {
        let take = |filter: &str, order: &str, limit: &str| {
            format!(
                "SELECT c.id FROM booking_expiration_outbox c \
                  WHERE {CLAIMABLE} AND {LEASE_FREE} AND {filter} \
                  ORDER BY {order} LIMIT {limit} FOR UPDATE SKIP LOCKED"
            )
        };
        // Every branch orders by columns of the claim index that its filter
        // does not fix by equality, so that index alone gives the order and
        // a plan on any other index would sort every row it matches. The
        // partition's own branch bounds `kafka_partition` as a range of one
        // value for that reason: with `= s.p` the order would shrink to
        // `id`, which the primary key gives too, and where the statistics
        // say the partition holds half the table the planner walks the
        // primary key past every other partition's rows (2,000,000 rows
        // read for a claim of 200 in `claim_plans_at_20k_and_2m_rows`).
        let layout_order = "c.partition_count, c.kafka_partition, c.id";
        let partition = take(
            "c.topic = s.topic AND c.partition_count = s.n \
             AND c.kafka_partition BETWEEN s.p AND s.p AND c.id > s.after",
            "c.kafka_partition, c.id",
            "s.room",
        );
        let below = take(
            "c.topic = r.topic AND c.partition_count < r.n",
            layout_order,
            "$1",
        );
        let above = take(
            "c.topic = r.topic AND c.partition_count > r.n",
            layout_order,
            "$1",
        );
        let none = take(
            "c.topic = r.topic AND c.partition_count IS NULL",
            layout_order,
            "$1",
        );
        let unknown = take("c.topic = t.topic", layout_order, "$1");
        // The loose scan for topics not routed probes only the gaps
        // between routed topics (below the first, between two, above the
        // last): a routed topic's own entries, among them those of every
        // row it published until VACUUM removes them, are never walked.
        let first =
            format!("SELECT min(c.topic) FROM booking_expiration_outbox c WHERE {CLAIMABLE}");
        let next = format!("{first} AND c.topic > t.topic");
        // A probe bounded above by the next routed topic, if any.
        let bounded = |probe: &str, hi: &str| {
            format!("CASE WHEN {hi} IS NULL THEN ({probe}) ELSE ({probe} AND c.topic < {hi}) END")
        };
        let (first, next) = (bounded(&first, "g.hi"), bounded(&next, "t.hi"));
        format!(
            "WITH RECURSIVE topics(topic, hi) AS ( \
                  (SELECT {first}, g.hi \
                     FROM (SELECT min(r) AS hi FROM unnest($4::text[]) AS r) g \
                   UNION ALL \
                   SELECT r, lead(r) OVER (ORDER BY r) FROM unnest($4::text[]) AS r) \
                  UNION ALL \
                  SELECT {next}, t.hi \
                    FROM topics t WHERE t.topic IS NOT NULL) \
             UPDATE booking_expiration_outbox o \
                SET claimed_until = statement_timestamp() + $2 * interval '1 millisecond', \
                    claimed_by = $10 \
              WHERE o.id = ANY (ARRAY( \
                    SELECT x.id \
                      FROM unnest($6::text[], $7::int[], $8::int[], $9::int[], $11::bigint[]) \
                           AS s(topic, n, p, room, after) \
                     CROSS JOIN LATERAL ({partition}) x \
                    UNION ALL \
                    SELECT y.id FROM ( \
                           SELECT x.id \
                             FROM unnest($4::text[], $5::int[]) AS r(topic, n) \
                            CROSS JOIN LATERAL ( \
                                  SELECT b.id FROM ({below}) b \
                                  UNION ALL SELECT a.id FROM ({above}) a \
                                  UNION ALL SELECT z.id FROM ({none}) z) x \
                            WHERE r.topic <> ALL($3::text[]) \
                           UNION ALL \
                           SELECT x.id FROM topics t \
                            CROSS JOIN LATERAL ({unknown}) x \
                            WHERE t.topic IS NOT NULL \
                              AND t.topic <> ALL($3::text[]) AND t.topic <> ALL($4::text[]) \
                           LIMIT $1) y)) \
             RETURNING o.id, o.event_id, o.topic, o.message_key, o.payload, \
                       o.headers::text AS headers, o.created_at, o.key_hash, o.partition_count"
        )
    });
    &SQL
}

/// The claim statement with `claim`'s parameters for `owner`, after
/// `prefix` (empty, or an `EXPLAIN …`).
fn claim_query(
    prefix: &str,
    claim: &Claim,
    owner: LeaseOwner,
) -> diesel::query_builder::BoxedSqlQuery<'static, diesel::pg::Pg, diesel::query_builder::SqlQuery>
{
    let parts = &claim.partitions;
    let routed = &claim.routed_topics;
    diesel::sql_query(format!("{prefix}{}", claim_sql()))
        .into_boxed()
        .bind::<BigInt, _>(i64::from(claim.limit))
        .bind::<BigInt, _>(millis(claim.lease))
        .bind::<Array<Text>, _>(claim.skip_topics.clone())
        .bind::<Array<Text>, _>(routed.iter().map(|r| r.topic.clone()).collect::<Vec<_>>())
        .bind::<Array<Integer>, _>(routed.iter().map(|r| r.count).collect::<Vec<_>>())
        .bind::<Array<Text>, _>(parts.iter().map(|p| p.topic.clone()).collect::<Vec<_>>())
        .bind::<Array<Integer>, _>(parts.iter().map(|p| p.count).collect::<Vec<_>>())
        .bind::<Array<Integer>, _>(parts.iter().map(|p| p.partition).collect::<Vec<_>>())
        .bind::<Array<Integer>, _>(
            parts
                .iter()
                .map(|p| i32::try_from(p.room).unwrap_or(i32::MAX))
                .collect::<Vec<_>>(),
        )
        .bind::<SqlUuid, _>(owner.0)
        .bind::<Array<BigInt>, _>(parts.iter().map(|p| p.after).collect::<Vec<_>>())
}

/// Leases the rows `claim` allows to `owner`: unpublished, unparked rows
/// that no lease holds, oldest first within each partition, skipping rows
/// another claim is taking. Returns them oldest first.
pub async fn claim(
    conn: &mut AsyncPgConnection,
    claim: &Claim,
    owner: LeaseOwner,
) -> Result<Vec<LeasedRow>, DbError> {
    let mut rows: Vec<StoredRow> = claim_query("", claim, owner).load(conn).await?;
    // RETURNING keeps no order.
    rows.sort_unstable_by_key(|row| row.id);
    Ok(rows.into_iter().map(LeasedRow::from).collect())
}

/// The plan of `claim`'s statement, one line per row: `EXPLAIN` with
/// `options` (`""`, or `"(ANALYZE, BUFFERS)"`: that one runs the claim,
/// so roll it back).
pub async fn explain_claim(
    conn: &mut AsyncPgConnection,
    claim: &Claim,
    options: &str,
) -> Result<Vec<String>, DbError> {
    #[derive(QueryableByName)]
    struct Plan {
        #[diesel(sql_type = Text, column_name = "QUERY PLAN")]
        line: String,
    }
    let plan: Vec<Plan> = claim_query(&format!("EXPLAIN {options} "), claim, LeaseOwner::new())
        .load(conn)
        .await?;
    Ok(plan.into_iter().map(|p| p.line).collect())
}

/// A duration as whole milliseconds for a statement's parameter (a lease).
pub(crate) fn millis(duration: std::time::Duration) -> i64 {
    i64::try_from(duration.as_millis()).unwrap_or(i64::MAX)
}

/// Extends the leases of `owner`'s rows among `ids` (their lease would end
/// before they are sent: a partition that cannot be written). Returns the
/// ids renewed: a row missing from them is no longer `owner`'s (its lease
/// ended and another instance claimed it, or it was published), and is not
/// to be sent by `owner` again.
pub async fn renew(
    conn: &mut AsyncPgConnection,
    ids: &[i64],
    lease: std::time::Duration,
    owner: LeaseOwner,
) -> Result<Vec<i64>, DbError> {
    #[derive(QueryableByName)]
    struct Renewed {
        #[diesel(sql_type = BigInt)]
        id: i64,
    }
    let renewed: Vec<Renewed> = diesel::sql_query(
        "UPDATE booking_expiration_outbox \
            SET claimed_until = statement_timestamp() + $2 * interval '1 millisecond' \
          WHERE id = ANY($1) AND published_at IS NULL AND claimed_by = $3 \
          RETURNING id",
    )
    .bind::<Array<BigInt>, _>(ids)
    .bind::<BigInt, _>(millis(lease))
    .bind::<SqlUuid, _>(owner.0)
    .load(conn)
    .await?;
    Ok(renewed.into_iter().map(|row| row.id).collect())
}

/// Ends `owner`'s leases of `ids` (it will not send them: it is stopping,
/// or had no room): another instance may claim them at once, and is told
/// so at the commit (they are behind its scan).
pub async fn release(
    conn: &mut AsyncPgConnection,
    ids: &[i64],
    owner: LeaseOwner,
) -> Result<usize, DbError> {
    let released = diesel::sql_query(
        "UPDATE booking_expiration_outbox SET claimed_until = NULL, claimed_by = NULL \
          WHERE id = ANY($1) AND published_at IS NULL AND claimed_by = $2",
    )
    .bind::<Array<BigInt>, _>(ids)
    .bind::<SqlUuid, _>(owner.0)
    .execute(conn)
    .await?;
    if released > 0 {
        notify_publishers(conn).await?;
    }
    Ok(released)
}

/// The channel the publishers listen on: the insert trigger
/// (`booking_expiration_outbox_notify()`, in the migrations) notifies it
/// when rows commit, and [`notify_publishers`] when rows come back.
pub const CHANNEL: &str = "booking_expiration_outbox";

/// Notifies [`CHANNEL`], delivered at the commit: rows came back for any
/// claim (released, put back from the parked ones), so the publishers wake
/// at once rather than at their next poll, and look behind their scans.
async fn notify_publishers(conn: &mut AsyncPgConnection) -> Result<(), DbError> {
    diesel::sql_query("SELECT pg_notify($1, '')")
        .bind::<Text, _>(CHANNEL)
        .execute(conn)
        .await?;
    Ok(())
}

/// Marks `owner`'s rows among `ids` published at `at`. A row another
/// instance claimed since (this one was paused past the lease) is left to
/// that instance, which sends it again: a copy, never a row marked for a
/// request that did not carry it.
pub async fn mark_published(
    conn: &mut AsyncPgConnection,
    ids: &[i64],
    at: DateTime<Utc>,
    owner: LeaseOwner,
) -> Result<usize, DbError> {
    Ok(diesel::sql_query(
        "UPDATE booking_expiration_outbox SET published_at = $2 \
          WHERE id = ANY($1) AND claimed_by = $3",
    )
    .bind::<Array<BigInt>, _>(ids)
    .bind::<Timestamptz, _>(at)
    .bind::<SqlUuid, _>(owner.0)
    .execute(conn)
    .await?)
}

/// Records `topic`'s partition count as read from the brokers, so writers
/// give each new row its partition (a write only when it changed).
pub async fn set_layout(
    conn: &mut AsyncPgConnection,
    topic: &str,
    partitions: i32,
    at: DateTime<Utc>,
) -> Result<usize, DbError> {
    Ok(diesel::sql_query(
        "INSERT INTO booking_expiration_topic_layout AS l (topic, partitions, read_at) \
         VALUES ($1, $2, $3) \
         ON CONFLICT (topic) DO UPDATE SET partitions = EXCLUDED.partitions, read_at = EXCLUDED.read_at \
         WHERE l.partitions <> EXCLUDED.partitions",
    )
    .bind::<Text, _>(topic)
    .bind::<Integer, _>(partitions)
    .bind::<Timestamptz, _>(at)
    .execute(conn)
    .await?)
}

/// Lays out up to `limit` unpublished rows of `topic` written for another
/// partition count than `partitions`, or for none (written before any
/// publisher read the topic): their partition in the topic's layout now,
/// so each is claimed by its partition's own scan. Rows another statement
/// holds locked are skipped (an instance laying out the same topic, a
/// claim): the next round takes them. Returns how many.
pub async fn relayout(
    conn: &mut AsyncPgConnection,
    topic: &str,
    partitions: i32,
    limit: u32,
) -> Result<usize, DbError> {
    // One branch per kind of row, each in a subquery of its own (FOR
    // UPDATE is not allowed on a UNION's members).
    let branch = |filter: &str| {
        format!(
            "SELECT q.id FROM (SELECT c.id FROM booking_expiration_outbox c \
               WHERE {CLAIMABLE} AND c.topic = $1 AND {filter} \
               LIMIT $3 FOR UPDATE SKIP LOCKED) q"
        )
    };
    Ok(diesel::sql_query(format!(
        "UPDATE booking_expiration_outbox o \
            SET partition_count = $2, kafka_partition = o.key_hash % $2 \
          WHERE o.id = ANY (ARRAY( \
                SELECT x.id FROM ({} UNION ALL {} UNION ALL {}) x \
                 LIMIT $3))",
        branch("c.partition_count IS NULL AND c.key_hash IS NOT NULL"),
        branch("c.partition_count < $2"),
        branch("c.partition_count > $2"),
    ))
    .bind::<Text, _>(topic)
    .bind::<Integer, _>(partitions)
    .bind::<BigInt, _>(i64::from(limit))
    .execute(conn)
    .await?)
}

/// Parks `owner`'s row `id`, which the broker will never accept as it is:
/// the claim skips it from now on and retention keeps it.
pub async fn park(
    conn: &mut AsyncPgConnection,
    id: i64,
    reason: &str,
    at: DateTime<Utc>,
    owner: LeaseOwner,
) -> Result<usize, DbError> {
    Ok(diesel::sql_query(
        "UPDATE booking_expiration_outbox SET parked_at = $2, park_reason = $3 \
          WHERE id = $1 AND claimed_by = $4",
    )
    .bind::<BigInt, _>(id)
    .bind::<Timestamptz, _>(at)
    .bind::<Text, _>(reason)
    .bind::<SqlUuid, _>(owner.0)
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
                "UPDATE booking_expiration_outbox \
                    SET parked_at = NULL, park_reason = NULL, claimed_until = NULL, claimed_by = NULL \
                  WHERE parked_at IS NOT NULL",
            )
            .execute(conn)
            .await?
        }
        Unpark::Events(ids) => {
            diesel::sql_query(
                "UPDATE booking_expiration_outbox \
                    SET parked_at = NULL, park_reason = NULL, claimed_until = NULL, claimed_by = NULL \
                  WHERE parked_at IS NOT NULL AND event_id = ANY($1)",
            )
            .bind::<Array<SqlUuid>, _>(ids)
            .execute(conn)
            .await?
        }
    };
    if put_back > 0 {
        notify_publishers(conn).await?;
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

/// Deletes `owner`'s rows among `ids` with their event records (retention
/// zero: nothing is kept once published; a row another instance claimed
/// since is left to it, as in [`mark_published`]).
pub async fn delete_rows(
    conn: &mut AsyncPgConnection,
    ids: &[i64],
    owner: LeaseOwner,
) -> Result<usize, DbError> {
    static SQL: LazyLock<String> = LazyLock::new(|| {
        delete_with_events_sql(
            "DELETE FROM booking_expiration_outbox WHERE id = ANY($1) AND claimed_by = $2",
        )
    });
    let deleted: Count = diesel::sql_query(SQL.as_str())
        .bind::<Array<BigInt>, _>(ids)
        .bind::<SqlUuid, _>(owner.0)
        .get_result(conn)
        .await?;
    Ok(usize::try_from(deleted.count).unwrap_or(0))
}

/// Deletes up to `limit` rows published before `cutoff` with their event
/// records; small batches keep each transaction short.
pub async fn delete_published_before(
    conn: &mut AsyncPgConnection,
    cutoff: DateTime<Utc>,
    limit: u32,
) -> Result<usize, DbError> {
    static SQL: LazyLock<String> = LazyLock::new(|| {
        delete_with_events_sql(
            "DELETE FROM booking_expiration_outbox WHERE id IN (\
                 SELECT id FROM booking_expiration_outbox \
                 WHERE published_at IS NOT NULL AND published_at < $1 \
                 LIMIT $2 FOR UPDATE SKIP LOCKED)",
        )
    });
    let deleted: Count = diesel::sql_query(SQL.as_str())
        .bind::<Timestamptz, _>(cutoff)
        .bind::<BigInt, _>(i64::from(limit))
        .get_result(conn)
        .await?;
    Ok(usize::try_from(deleted.count).unwrap_or(0))
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

/// The lag as the last instance that counted it left it
/// (`booking_expiration_outbox_lag`, one row), and whether the next count
/// is due, on the database's clock.
#[derive(Debug, Clone, Copy, PartialEq, Eq, QueryableByName)]
pub struct SharedLag {
    #[diesel(embed)]
    pub stats: OutboxStats,
    /// No count has been recorded yet (the row as the migration left it).
    #[diesel(sql_type = Bool)]
    pub never_counted: bool,
    /// Milliseconds until the next count is due (0 once it is).
    #[diesel(sql_type = BigInt)]
    pub next_in_ms: i64,
}

impl SharedLag {
    /// The next count's time has come.
    pub fn due(&self) -> bool {
        self.next_in_ms == 0
    }
}

/// Reads the shared count without locking it; `None` if its row is gone
/// (deleted by hand: every instance then counts for itself).
pub async fn shared_lag(conn: &mut AsyncPgConnection) -> Result<Option<SharedLag>, DbError> {
    Ok(diesel::sql_query(
        "SELECT unpublished, oldest_unpublished_at, parked, \
                counted_at = '-infinity' AS never_counted, \
                CASE WHEN next_at <= statement_timestamp() THEN 0 \
                     ELSE ceil(extract(epoch FROM next_at - statement_timestamp()) * 1000)::bigint \
                END AS next_in_ms \
           FROM booking_expiration_outbox_lag WHERE id = 1",
    )
    .get_result(conn)
    .await
    .optional()?)
}

/// Takes this transaction's turn to count the lag: locks the shared row if
/// its next count is due and no other transaction holds it (`SKIP
/// LOCKED`: an instance counting now). A row that is not due is not
/// locked, so a look that finds nothing to do writes nothing. Returns
/// whether the turn is this transaction's; it lasts until it ends, and a
/// count that dies with its instance leaves the row unlocked and due.
pub async fn take_lag_turn(conn: &mut AsyncPgConnection) -> Result<bool, DbError> {
    let taken = diesel::sql_query(
        "SELECT 1 FROM booking_expiration_outbox_lag \
          WHERE id = 1 AND next_at <= statement_timestamp() FOR UPDATE SKIP LOCKED",
    )
    .execute(conn)
    .await?;
    Ok(taken == 1)
}

/// Records a count of the lag (`None`: the count failed, only its next
/// time is set, so a failing count is not tried by every instance at
/// once) and when the next one is due, `pause` from now on the database's
/// clock. Updates the row the migration wrote: without it (deleted by
/// hand) nothing is shared and every instance counts for itself.
pub async fn record_lag(
    conn: &mut AsyncPgConnection,
    stats: Option<&OutboxStats>,
    pause: std::time::Duration,
) -> Result<(), DbError> {
    let pause_ms = i64::try_from(pause.as_millis()).unwrap_or(i64::MAX);
    match stats {
        Some(stats) => {
            diesel::sql_query(
                "UPDATE booking_expiration_outbox_lag \
                    SET unpublished = $1, oldest_unpublished_at = $2, parked = $3, \
                        counted_at = statement_timestamp(), \
                        next_at = statement_timestamp() + $4 * interval '1 millisecond' \
                  WHERE id = 1",
            )
            .bind::<BigInt, _>(stats.unpublished)
            .bind::<Nullable<Timestamptz>, _>(stats.oldest_unpublished_at)
            .bind::<BigInt, _>(stats.parked)
            .bind::<BigInt, _>(pause_ms)
            .execute(conn)
            .await?
        }
        None => {
            diesel::sql_query(
                "UPDATE booking_expiration_outbox_lag \
                    SET next_at = statement_timestamp() + $1 * interval '1 millisecond' \
                  WHERE id = 1",
            )
            .bind::<BigInt, _>(pause_ms)
            .execute(conn)
            .await?
        }
    };
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_insert_lists_each_column_once_with_a_value() {
        let sql = insert_sql(OutboxValues {
            message: "m",
            topic: "$1",
            correlation_id: "$2",
            created_at: "$3",
            replay_id: "NULL",
            claimed_until: "NULL",
            claimed_by: "NULL",
            from: "FROM x m",
        });
        let columns = sql
            .split_once('(')
            .and_then(|(_, rest)| rest.split_once(')'))
            .map(|(list, _)| list.split(',').count())
            .unwrap();
        let values = sql
            .split_once("SELECT")
            .and_then(|(_, rest)| rest.split_once("FROM x"))
            .map(|(list, _)| list.split(',').count())
            .unwrap();
        assert_eq!((columns, values), (14, 14), "{sql}");
        assert_eq!(
            MessageColumns::params(4),
            "$4::uuid[], $5::text[], $6::int[], $7::bytea[], $8::text[], $9::uuid[]"
        );
        assert_eq!(
            MessageColumns::NAMES.split(',').count(),
            MessageColumns::UNNEST.len()
        );
    }
}
