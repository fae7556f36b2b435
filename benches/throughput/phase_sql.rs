//! The one place where the bench spells out, per phase, what the phase
//! mapping (phase → active statuses → deadline column → target status)
//! means in SQL: the raw-SQL baseline's batch statement ([`raw_batch_sql`]), the worker's own
//! statements whose plans the idle figure reads, and the partial index those
//! plans must name. Everything else in the bench asks [`phase_sql`].

use booking_expiration::{db::bookings, domain::Phase};

/// The SQL of one phase, as the bench runs and checks it.
pub struct PhaseSql {
    /// The worker's lock query (`$1` as_of, `$2` excluded ids, `$3` limit).
    pub lock_due: String,
    /// The worker's count of the rows still due (`$1` as_of, `$2` excluded ids).
    pub count_due_excluding: String,
    /// The partial index both statements must use.
    pub partial_index: &'static str,
}

/// The headers the raw statement writes into the outbox row.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RawHeaders {
    /// The worker's eight keys as `json`: the project's schema as migrated.
    Json,
    /// The eight keys as `jsonb`: the schema before the `lean_outbox`
    /// migration.
    Jsonb,
    /// The four keys that differ per event (`ce_id`, `ce_time`,
    /// `correlation_id`, `tenant_id`), as jsonb: the lean schema's.
    JsonbFourKeys,
}

/// Everything the bench writes per phase.
pub fn phase_sql(phase: Phase) -> PhaseSql {
    PhaseSql {
        lock_due: bookings::lock_due_sql(phase).to_owned(),
        count_due_excluding: bookings::count_due_excluding_sql(phase).to_owned(),
        partial_index: bookings::partial_index(phase),
    }
}

/// The raw-SQL limit of one expiry batch of `phase`: lock, update, audit
/// and outbox (with the outbox rows' event records) in ONE statement, one
/// transaction per batch. Same rows, same columns, same audit and outbox
/// rows as the worker; the payload is built
/// in SQL with the same fields (UUID strings, phase, timestamp), so its size
/// is close to the worker's protobuf (both sizes are recorded); `headers`
/// says which headers the outbox row gets.
///
/// Binds: `$1` as_of, `$2` batch size, `$3` run id, `$4` topic,
/// `$5` as_of as text, `$6` ce_source, `$7` created_at.
pub fn raw_batch_sql(phase: Phase, headers: RawHeaders) -> String {
    // Derived from the domain's definition of the phase, like the worker's.
    let target = phase.target_status();
    // The protobuf enum's name, as the worker's payload carries it.
    let proto_phase = format!("PHASE_{}", phase.as_str().to_ascii_uppercase());
    let predicate = bookings::due_predicate(phase);
    let eight_keys = "'ce_id', event_id::text, 'ce_source', $6::text, 'ce_specversion', '1.0',
                          'ce_time', $5::text, 'ce_type', $4::text,
                          'content-type', 'application/protobuf',
                          'correlation_id', $3::text, 'tenant_id', tenant_id::text";
    let headers = match headers {
        RawHeaders::Json => format!("json_build_object({eight_keys})"),
        RawHeaders::Jsonb => format!("jsonb_build_object({eight_keys})"),
        RawHeaders::JsonbFourKeys => {
            "jsonb_build_object('ce_id', event_id::text, 'ce_time', $5::text, \
             'correlation_id', $3::text, 'tenant_id', tenant_id::text)"
                .to_owned()
        }
    };
    format!(
        "WITH c AS (
    SELECT id, status FROM bookings
     WHERE {predicate} AND deal_id IS NOT NULL AND property_object_id IS NOT NULL
     ORDER BY {deadline} LIMIT $2 FOR UPDATE SKIP LOCKED
), u AS (
    UPDATE bookings b
       SET status = '{target}', expired_at = $1, updated_at = $1, version = b.version + 1
      FROM c WHERE b.id = c.id
    RETURNING b.id, b.tenant_id, b.deal_id, b.property_object_id, b.version, c.status AS from_status
), e AS (
    SELECT u.*, gen_random_uuid() AS event_id FROM u
), a AS (
    INSERT INTO booking_expiration_audit
           (booking_id, tenant_id, from_status, to_status, actor, correlation_id, at)
    SELECT id, tenant_id, from_status, '{target}', 'system', $3, $1 FROM e
), o AS (
    INSERT INTO booking_expiration_outbox
           (event_id, topic, message_key, payload, headers, correlation_id, tenant_id, created_at)
    SELECT event_id, $4, id::text,
           convert_to(concat_ws('|', event_id, 1, 'Booking', id, tenant_id, deal_id,
                                property_object_id, '{proto_phase}', $5::text, $3::uuid, version),
                      'UTF8'),
           {headers},
           $3, tenant_id, $7
      FROM e
    RETURNING id, event_id
)
INSERT INTO booking_expiration_outbox_event (event_id, replay_id, outbox_id)
SELECT event_id, NULL, id FROM o",
        deadline = bookings::deadline_column(phase),
    )
}

/// Bookings `0..$1` in the active statuses in turn (all phases), with
/// deadlines spread evenly (jittered within each slot) over `$3` seconds
/// from `$2`, in the phase of their status: a first-phase row has that
/// phase's deadline and the second a week later; a second-phase row only
/// the second. Every row has a deal and a property object (no poison).
pub fn spread_insert_sql() -> String {
    let [first, second] = Phase::ALL.map(Phase::deadline_field);
    let active: Vec<String> = Phase::all_active_statuses()
        .map(|s| format!("'{}'", s.as_str()))
        .collect();
    let first_phase: Vec<String> = Phase::ALL[0]
        .active_statuses()
        .iter()
        .map(|s| format!("'{}'", s.as_str()))
        .collect();
    format!(
        "INSERT INTO bookings (id, tenant_id, deal_id, property_object_id, status,
                      {first}, {second}, created_at, updated_at, version)
SELECT gen_random_uuid(), '00000000-0000-4000-8000-000000000001'::uuid,
       gen_random_uuid(), gen_random_uuid(), s.status,
       CASE WHEN s.status IN ({first_phase}) THEN d.deadline END,
       CASE WHEN s.status IN ({first_phase}) THEN d.deadline + interval '7 days' ELSE d.deadline END,
       now(), now(), 1
  FROM generate_series(0, $1::bigint - 1) AS i
 CROSS JOIN LATERAL (SELECT (ARRAY[{active}])[1 + (i % {n})::int] AS status) s
 CROSS JOIN LATERAL (SELECT $2::timestamptz
                            + make_interval(secs => $3::float8 * (i + random()) / $1::bigint) AS deadline) d",
        first_phase = first_phase.join(", "),
        active = active.join(", "),
        n = active.len(),
    )
}

/// The deadline a row of [`spread_insert_sql`] expires at: its first
/// phase's deadline if it has one, else the second's.
pub fn due_deadline_expr() -> String {
    let [first, second] = Phase::ALL.map(Phase::deadline_field);
    format!("coalesce({first}, {second})")
}
