//! Synthetic bookings for the demo, the benchmarks and load tests: a mix
//! of both phases, some already due, the rest due over the next minutes,
//! plus terminal rows that the worker must never touch.

use std::sync::LazyLock;

use chrono::{DateTime, Utc};
use diesel::sql_types::{Array, BigInt, Interval, Text, Timestamptz};
use diesel_async::{AsyncPgConnection, RunQueryDsl};

use super::DbError;
use crate::domain::{Phase, Status};

/// What to insert.
#[derive(Debug, Clone)]
pub struct SeedPlan {
    /// Active bookings (Reserved / AwaitingPayment / Booked in turn).
    pub active: u64,
    /// Share of the active bookings already due at `as_of` (0.0–1.0).
    pub due_fraction: f64,
    /// Terminal or inactive rows (expired, cancelled, confirmed).
    pub inactive: u64,
    /// Due rows without `deal_id` (poison).
    pub poison: u64,
    /// Reference time: due rows have deadlines up to 10 minutes before it.
    pub as_of: DateTime<Utc>,
    /// Not-yet-due deadlines are spread uniformly over this span after `as_of`.
    pub spread: std::time::Duration,
}

impl SeedPlan {
    pub fn due(&self) -> u64 {
        ((self.active as f64) * self.due_fraction.clamp(0.0, 1.0)).round() as u64
    }
}

/// Inserts the plan's rows in chunks; returns the number of rows inserted.
pub async fn seed(conn: &mut AsyncPgConnection, plan: &SeedPlan) -> Result<u64, DbError> {
    const CHUNK: u64 = 50_000;
    let due = plan.due();
    let spread = diesel::data_types::PgInterval::from_microseconds(
        i64::try_from(plan.spread.as_micros()).unwrap_or(i64::MAX),
    );
    let (active, first_phase, inactive) = status_lists();
    let mut inserted = 0;
    let mut start = 0;
    while start < plan.active {
        let end = (start + CHUNK).min(plan.active);
        inserted += diesel::sql_query(ACTIVE_SQL.as_str())
            .bind::<BigInt, _>(start as i64 + 1)
            .bind::<BigInt, _>(end as i64)
            .bind::<BigInt, _>(due as i64)
            .bind::<Timestamptz, _>(plan.as_of)
            .bind::<Interval, _>(spread)
            .bind::<Array<Text>, _>(&active)
            .bind::<Array<Text>, _>(&first_phase)
            .execute(conn)
            .await? as u64;
        start = end;
    }
    let mut start = 0;
    while start < plan.inactive {
        let end = (start + CHUNK).min(plan.inactive);
        inserted += diesel::sql_query(INACTIVE_SQL.as_str())
            .bind::<BigInt, _>(start as i64 + 1)
            .bind::<BigInt, _>(end as i64)
            .bind::<Timestamptz, _>(plan.as_of)
            .bind::<Array<Text>, _>(&inactive)
            .execute(conn)
            .await? as u64;
        start = end;
    }
    if plan.poison > 0 {
        inserted += diesel::sql_query(POISON_SQL.as_str())
            .bind::<BigInt, _>(plan.poison as i64)
            .bind::<Timestamptz, _>(plan.as_of)
            .bind::<Text, _>(first_phase[0])
            .execute(conn)
            .await? as u64;
    }
    diesel::sql_query("ANALYZE bookings").execute(conn).await?;
    Ok(inserted)
}

/// The active statuses in turn (all phases), the statuses of the first
/// phase, the inactive statuses: all from the domain.
fn status_lists() -> (Vec<&'static str>, Vec<&'static str>, Vec<&'static str>) {
    let active = Phase::all_active_statuses().map(Status::as_str).collect();
    let first_phase = Phase::ALL[0]
        .active_statuses()
        .iter()
        .map(|s| s.as_str())
        .collect();
    let inactive = Status::ALL
        .into_iter()
        .filter(|s| s.active_phase().is_none())
        .map(Status::as_str)
        .collect();
    (active, first_phase, inactive)
}

/// Rows `$1..=$2` with the statuses `$6` in turn; the first `$3` are due
/// (deadlines in the 10 minutes before `$4`), the rest spread over `$5`
/// after it. A row in the first phase (statuses `$7`) has that phase's
/// deadline and a later second deadline; a row in the second phase has
/// only the second deadline.
static ACTIVE_SQL: LazyLock<String> = LazyLock::new(|| {
    let [first, second] = Phase::ALL.map(Phase::deadline_field);
    format!(
        "\
INSERT INTO bookings (id, tenant_id, deal_id, property_object_id, status,
                      {first}, {second}, created_at, updated_at, version)
SELECT gen_random_uuid(),
       ('00000000-0000-4000-8000-' || lpad((i % 1000)::text, 12, '0'))::uuid,
       gen_random_uuid(), gen_random_uuid(),
       s.status,
       CASE WHEN s.status = ANY($7::text[]) THEN d.deadline END,
       CASE WHEN s.status = ANY($7::text[]) THEN d.deadline + interval '7 days' ELSE d.deadline END,
       $4 - interval '1 day', $4 - interval '1 day', 1
  FROM generate_series($1::bigint, $2::bigint) AS i
 CROSS JOIN LATERAL (SELECT ($6::text[])[1 + (i % cardinality($6::text[]))::int] AS status) s
 CROSS JOIN LATERAL (SELECT CASE WHEN i <= $3
                                 THEN $4 - random() * interval '10 minutes' - interval '1 millisecond'
                                 ELSE $4 + random() * $5 + interval '1 millisecond' END AS deadline) d"
    )
});

/// Rows `$1..=$2` with the inactive statuses `$4` in turn and past
/// deadlines: never to be touched.
static INACTIVE_SQL: LazyLock<String> = LazyLock::new(|| {
    let [first, second] = Phase::ALL.map(Phase::deadline_field);
    format!(
        "\
INSERT INTO bookings (id, tenant_id, deal_id, property_object_id, status,
                      {first}, {second}, expired_at, created_at, updated_at, version)
SELECT gen_random_uuid(),
       ('00000000-0000-4000-8000-' || lpad((i % 1000)::text, 12, '0'))::uuid,
       gen_random_uuid(), gen_random_uuid(),
       ($4::text[])[1 + (i % cardinality($4::text[]))::int],
       $3 - interval '30 days', $3 - interval '20 days', NULL,
       $3 - interval '40 days', $3 - interval '20 days', 3
  FROM generate_series($1::bigint, $2::bigint) AS i"
    )
});

/// Legacy rows: `$1` due bookings in the first phase's first status `$3`
/// without a deal.
static POISON_SQL: LazyLock<String> = LazyLock::new(|| {
    let deadline = Phase::ALL[0].deadline_field();
    format!(
        "\
INSERT INTO bookings (id, tenant_id, deal_id, property_object_id, status,
                      {deadline}, created_at, updated_at, version)
SELECT gen_random_uuid(), '00000000-0000-4000-8000-000000000000', NULL, gen_random_uuid(),
       $3, $2 - interval '1 hour', $2 - interval '2 days', $2 - interval '2 days', 1
  FROM generate_series(1, $1::bigint)"
    )
});

#[cfg(test)]
mod tests {
    use super::*;

    /// The seeder's mix is the one it had when the statuses were written
    /// out here: benchmark figures stay comparable.
    #[test]
    fn status_lists_follow_the_domain() {
        let (active, first_phase, inactive) = status_lists();
        assert_eq!(active, ["Reserved", "AwaitingPayment", "Booked"]);
        assert_eq!(first_phase, ["Reserved", "AwaitingPayment"]);
        assert_eq!(
            inactive,
            ["ReserveExpired", "BookingExpired", "Cancelled", "Confirmed"]
        );
        assert!(ACTIVE_SQL.contains("reserve_expires_at, booking_expires_at"));
        assert!(POISON_SQL.contains("reserve_expires_at"));
    }
}
