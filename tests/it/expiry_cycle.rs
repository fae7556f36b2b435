//! The expiry cycle against a real PostgreSQL: every case of spec §8
//! except the Kafka half of the SLO (see `publisher.rs`).

use std::{
    sync::{Arc, Mutex},
    time::Duration,
};

use crate::support::*;
use booking_expiration::{
    config::{EventSettings, ExpirySettings, ShutdownSettings},
    db::bookings,
    domain::{BookingExpired, DomainEventSubscriber, Phase, RunId},
    expiry::{CycleError, CycleStart, sweep::Sweep},
};
use booking_expired_proto::{decode_record, v1};
use chrono::Duration as ChronoDuration;
use diesel::{
    QueryableByName,
    sql_types::{Bytea, Json, Text, Timestamptz, Uuid as SqlUuid},
};
use diesel_async::{AsyncConnection, RunQueryDsl};
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

#[derive(Debug, QueryableByName)]
struct OutboxEntry {
    #[diesel(sql_type = SqlUuid)]
    event_id: Uuid,
    #[diesel(sql_type = Text)]
    message_key: String,
    #[diesel(sql_type = Text)]
    topic: String,
    #[diesel(sql_type = Bytea)]
    payload: Vec<u8>,
    #[diesel(sql_type = Json)]
    headers: serde_json::Value,
    #[diesel(sql_type = SqlUuid)]
    correlation_id: Uuid,
}

#[derive(Debug, QueryableByName)]
struct AuditEntry {
    #[diesel(sql_type = SqlUuid)]
    booking_id: Uuid,
    #[diesel(sql_type = Text)]
    from_status: String,
    #[diesel(sql_type = Text)]
    to_status: String,
    #[diesel(sql_type = Text)]
    actor: String,
    #[diesel(sql_type = SqlUuid)]
    correlation_id: Uuid,
    #[diesel(sql_type = Timestamptz)]
    at: chrono::DateTime<chrono::Utc>,
}

async fn outbox_of(db: &TestDb, booking: Uuid) -> Vec<OutboxEntry> {
    let mut conn = db.conn().await;
    diesel::sql_query(
        "SELECT event_id, message_key, topic, payload, headers, correlation_id \
         FROM booking_expiration_outbox WHERE message_key = $1",
    )
    .bind::<Text, _>(booking.to_string())
    .load(&mut conn)
    .await
    .unwrap()
}

async fn audit_of(db: &TestDb, booking: Uuid) -> Vec<AuditEntry> {
    let mut conn = db.conn().await;
    diesel::sql_query(
        "SELECT booking_id, from_status, to_status, actor, correlation_id, at \
         FROM booking_expiration_audit WHERE booking_id = $1",
    )
    .bind::<SqlUuid, _>(booking)
    .load(&mut conn)
    .await
    .unwrap()
}

fn decode(entry: &OutboxEntry) -> booking_expired_proto::ReceivedEvent {
    let headers: Vec<(String, Vec<u8>)> = entry
        .headers
        .as_object()
        .unwrap()
        .iter()
        .map(|(k, v)| (k.clone(), v.as_str().unwrap().as_bytes().to_vec()))
        .collect();
    decode_record(
        &entry.payload,
        headers.iter().map(|(k, v)| (k.as_str(), v.as_slice())),
    )
    .expect("outbox payload decodes")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn empty_batch_is_a_no_op() {
    let db = TestDb::new().await;
    let clock = clock();
    let as_of = t0();
    db.insert_all(&[
        NewBooking::new("Reserved").reserve_deadline(as_of + ChronoDuration::minutes(5)),
        NewBooking::new("Booked").booking_deadline(as_of + ChronoDuration::seconds(1)),
        // Terminal and inactive rows with long-past deadlines.
        NewBooking::new("Cancelled").reserve_deadline(as_of - ChronoDuration::days(3)),
        NewBooking::new("Confirmed").booking_deadline(as_of - ChronoDuration::days(3)),
        NewBooking::new("ReserveExpired").reserve_deadline(as_of - ChronoDuration::days(3)),
        NewBooking::new("BookingExpired").booking_deadline(as_of - ChronoDuration::days(3)),
        // Active without a deadline: never expires.
        NewBooking::new("Reserved"),
        NewBooking::new("Booked").reserve_deadline(as_of - ChronoDuration::days(3)),
        // Deadline equal to as_of: the predicate is strict.
        NewBooking::new("AwaitingPayment").reserve_deadline(as_of),
    ])
    .await;
    let before = db.all_bookings().await;
    let outcome = db
        .worker(&clock, 200)
        .run_cycle(&CancellationToken::new())
        .await
        .unwrap();
    assert_eq!(outcome.report.reserve_expired_count, 0);
    assert_eq!(outcome.report.booking_expired_count, 0);
    assert_eq!(outcome.report.skipped_locked_count, 0);
    assert_eq!(outcome.poison_count, 0);
    assert_eq!(db.all_bookings().await, before, "no mutation");
    assert_eq!(
        db.count("SELECT count(*) AS n FROM booking_expiration_outbox")
            .await,
        0
    );
    assert_eq!(
        db.count("SELECT count(*) AS n FROM booking_expiration_audit")
            .await,
        0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reserve_phase_expires_with_audit_and_outbox() {
    let db = TestDb::new().await;
    let clock = clock();
    let as_of = t0();
    let reserved = NewBooking::new("Reserved").reserve_deadline(as_of - ChronoDuration::seconds(1));
    let awaiting = NewBooking::new("AwaitingPayment")
        .reserve_deadline(as_of - ChronoDuration::minutes(10))
        .booking_deadline(as_of + ChronoDuration::days(7));
    db.insert_all(&[reserved.clone(), awaiting.clone()]).await;

    let run_id = RunId::new(Uuid::new_v4());
    let outcome = db
        .worker(&clock, 200)
        .run_cycle(CycleStart::new(&CancellationToken::new()).at(as_of, run_id))
        .await
        .unwrap();
    assert_eq!(outcome.report.reserve_expired_count, 2);
    assert_eq!(outcome.report.booking_expired_count, 0);

    for (input, from) in [(&reserved, "Reserved"), (&awaiting, "AwaitingPayment")] {
        let stored = db.booking(input.id).await;
        assert_eq!(stored.status, "ReserveExpired");
        assert_eq!(stored.expired_at, Some(as_of));
        assert_eq!(stored.updated_at, as_of);
        assert_eq!(stored.version, input.version + 1);

        let audit = audit_of(&db, input.id).await;
        assert_eq!(audit.len(), 1);
        assert_eq!(audit[0].booking_id, input.id);
        assert_eq!(audit[0].from_status, from);
        assert_eq!(audit[0].to_status, "ReserveExpired");
        assert_eq!(audit[0].actor, "system");
        assert_eq!(audit[0].correlation_id, run_id.as_uuid());
        assert_eq!(audit[0].at, as_of);

        let outbox = outbox_of(&db, input.id).await;
        assert_eq!(outbox.len(), 1, "exactly one outbox record");
        let event = decode(&outbox[0]);
        assert_eq!(outbox[0].topic, "pin.crm.booking-expired.v1");
        assert_eq!(outbox[0].message_key, input.id.to_string());
        assert_eq!(outbox[0].correlation_id, run_id.as_uuid());
        assert_eq!(event.phase, v1::Phase::Reserve);
        assert_eq!(event.booking_id, input.id);
        assert_eq!(event.tenant_id, input.tenant_id);
        assert_eq!(Some(event.deal_id), input.deal_id);
        assert_eq!(Some(event.property_object_id), input.property_object_id);
        assert_eq!(event.expired_at.seconds, as_of.timestamp());
        assert_eq!(event.event_id, outbox[0].event_id);
        assert_eq!(event.correlation_id, run_id.as_uuid());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn event_time_equals_the_stored_time_at_nanosecond_clocks() {
    let db = TestDb::new().await;
    let as_of = t0() + ChronoDuration::nanoseconds(123_456_789);
    let booking = NewBooking::new("Reserved").reserve_deadline(t0());
    db.insert(&booking).await;
    db.worker(&clock(), 200)
        .run_cycle(CycleStart::new(&CancellationToken::new()).at(as_of, RunId::generate()))
        .await
        .unwrap();
    let stored = db.booking(booking.id).await.expired_at.expect("expired");
    let event = decode(&outbox_of(&db, booking.id).await[0]).expired_at;
    assert_eq!(stored, t0() + ChronoDuration::microseconds(123_456));
    assert_eq!(
        (event.seconds, event.nanos),
        (stored.timestamp(), stored.timestamp_subsec_nanos() as i32)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn booking_phase_expires_to_booking_expired() {
    let db = TestDb::new().await;
    let clock = clock();
    let as_of = t0();
    // The reserve deadline is long past but irrelevant once Booked.
    let booked = NewBooking::new("Booked")
        .reserve_deadline(as_of - ChronoDuration::days(2))
        .booking_deadline(as_of - ChronoDuration::milliseconds(1));
    db.insert(&booked).await;
    let outcome = db
        .worker(&clock, 200)
        .run_cycle(&CancellationToken::new())
        .await
        .unwrap();
    assert_eq!(outcome.report.booking_expired_count, 1);
    assert_eq!(outcome.report.reserve_expired_count, 0);
    let stored = db.booking(booked.id).await;
    assert_eq!(stored.status, "BookingExpired");
    assert_eq!(stored.version, 2);
    let outbox = outbox_of(&db, booked.id).await;
    assert_eq!(decode(&outbox[0]).phase, v1::Phase::Booking);

    // Terminal now: a later cycle never touches it again (INV-BKG-8).
    clock.advance(ChronoDuration::days(30));
    let again = db
        .worker(&clock, 200)
        .run_cycle(&CancellationToken::new())
        .await
        .unwrap();
    assert_eq!(again.report.booking_expired_count, 0);
    assert_eq!(db.booking(booked.id).await, stored);
    assert_eq!(outbox_of(&db, booked.id).await.len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn poison_rows_are_left_out_and_retried_next_cycle() {
    let db = TestDb::new().await;
    let clock = clock();
    let as_of = t0();
    // Poison rows have the oldest deadlines, so they come first in every
    // batch; batch size 2 checks they cannot starve the rows behind them.
    let poison_a = NewBooking::new("Reserved")
        .reserve_deadline(as_of - ChronoDuration::hours(3))
        .without_deal();
    let poison_b = NewBooking::new("Booked")
        .booking_deadline(as_of - ChronoDuration::hours(3))
        .without_property_object();
    let poison_c = NewBooking::new("AwaitingPayment")
        .reserve_deadline(as_of - ChronoDuration::hours(2))
        .without_deal()
        .without_property_object();
    let good: Vec<NewBooking> = (0..5)
        .map(|i| {
            NewBooking::new(if i % 2 == 0 { "Reserved" } else { "Booked" })
                .reserve_deadline(as_of - ChronoDuration::minutes(i + 1))
                .booking_deadline(as_of - ChronoDuration::minutes(i + 1))
        })
        .collect();
    db.insert_all(&[poison_a.clone(), poison_b.clone(), poison_c.clone()])
        .await;
    db.insert_all(&good).await;

    let worker = db.worker(&clock, 2);
    let outcome = worker.run_cycle(&CancellationToken::new()).await.unwrap();
    assert_eq!(outcome.poison_count, 3);
    assert_eq!(
        outcome.report.expired(),
        5,
        "the rest of the batches committed"
    );
    for p in [&poison_a, &poison_b, &poison_c] {
        let stored = db.booking(p.id).await;
        assert_eq!(stored.status, p.status, "poison row untouched");
        assert_eq!(stored.version, 1);
        assert!(outbox_of(&db, p.id).await.is_empty());
    }
    // The next cycle tries the poison rows again.
    let next = worker.run_cycle(&CancellationToken::new()).await.unwrap();
    assert_eq!(next.poison_count, 3);
    assert_eq!(next.report.expired(), 0);
}

/// Issue 33: poison rows at volume. Ten times the 1,000 per phase that the
/// memory of refused rows used to keep, all with one deadline (the oldest:
/// `seed --poison` writes legacy rows that way), and good rows behind them,
/// at one batch of `B` rows per cycle. A sweep goes on after the last row it
/// took, so each good row expires within `⌈(P + G) / B⌉` cycles of the
/// sweep's start, each poison row is refused exactly once per sweep, and
/// nothing is remembered but the position: the cycles woken after the
/// sweep ended take new rows without reading a poison row again, and only
/// the sweep that starts over at a tick tries them again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_poison_rows_never_keep_the_good_rows_behind_them() {
    const POISON: u64 = 10_000;
    const BATCH: u32 = 200;
    let db = TestDb::new().await;
    let clock = clock();
    let as_of = t0();
    let mut conn = db.conn().await;
    booking_expiration::db::seed::seed(
        &mut conn,
        &booking_expiration::db::seed::SeedPlan {
            active: 0,
            due_fraction: 0.0,
            inactive: 0,
            poison: POISON,
            as_of,
            spread: Duration::ZERO,
        },
    )
    .await
    .unwrap();
    drop(conn);
    // Behind them (the seeder's poison deadline is an hour before as_of):
    // good rows of both phases.
    let good: Vec<NewBooking> = (0..150)
        .map(|i| {
            let deadline = as_of - ChronoDuration::minutes(50) + ChronoDuration::seconds(i);
            if i % 3 == 0 {
                NewBooking::new("Booked").booking_deadline(deadline)
            } else {
                NewBooking::new(if i % 2 == 0 {
                    "Reserved"
                } else {
                    "AwaitingPayment"
                })
                .reserve_deadline(deadline)
            }
        })
        .collect();
    db.insert_all(&good).await;
    let active = "SELECT count(*) AS n FROM bookings \
                  WHERE status IN ('Reserved', 'AwaitingPayment', 'Booked') AND deal_id IS NOT NULL";
    assert_eq!(db.count(active).await, 150);

    let worker = db.worker_with(
        &clock,
        ExpirySettings {
            max_batches_per_cycle: 1,
            ..expiry_settings(BATCH)
        },
    );
    let mut sweep = Sweep::default();
    let bound = (POISON + 150).div_ceil(u64::from(BATCH));
    let (mut cycles, mut refused) = (0, 0);
    while db.count(active).await > 0 {
        assert!(
            cycles < bound,
            "good rows still due after {cycles} cycles (bound {bound})"
        );
        let outcome = worker
            .run_cycle(
                CycleStart::new(&CancellationToken::new())
                    .at(as_of, RunId::generate())
                    .resuming(&mut sweep),
            )
            .await
            .unwrap();
        refused += outcome.poison_count;
        cycles += 1;
    }
    assert_eq!(refused, POISON, "each poison row refused once in the sweep");
    assert_eq!(
        db.count("SELECT count(*) AS n FROM bookings WHERE deal_id IS NULL AND version = 1 AND status = 'Reserved'")
            .await,
        POISON as i64,
        "poison rows untouched"
    );
    assert_eq!(
        db.count("SELECT count(*) AS n FROM booking_expiration_outbox")
            .await,
        150
    );

    // The sweep reached the end: a cycle woken for a new deadline goes on
    // from there and reads no poison row.
    let late = NewBooking::new("Reserved").reserve_deadline(as_of - ChronoDuration::seconds(10));
    db.insert(&late).await;
    let outcome = worker
        .run_cycle(
            CycleStart::new(&CancellationToken::new())
                .at(as_of, RunId::generate())
                .resuming(&mut sweep),
        )
        .await
        .unwrap();
    assert_eq!((outcome.report.expired(), outcome.poison_count), (1, 0));

    // At the tick the sweep starts over: the poison rows are tried again.
    sweep.tick();
    let outcome = worker
        .run_cycle(
            CycleStart::new(&CancellationToken::new())
                .at(as_of, RunId::generate())
                .resuming(&mut sweep),
        )
        .await
        .unwrap();
    assert_eq!(outcome.poison_count, u64::from(BATCH));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backlog_beyond_one_batch_is_drained_in_one_cycle_unless_limited() {
    let db = TestDb::new().await;
    let clock = clock();
    db.seed_due(900, t0()).await;
    // One batch per phase per cycle: the draft's literal behaviour.
    let mut literal = expiry_settings(100);
    literal.max_batches_per_cycle = 1;
    let first = db
        .worker_with(&clock, literal)
        .run_cycle(&CancellationToken::new())
        .await
        .unwrap();
    assert_eq!(first.report.reserve_expired_count, 100);
    assert_eq!(first.report.booking_expired_count, 100);
    // Default: batches continue while full.
    let rest = db
        .worker(&clock, 100)
        .run_cycle(&CancellationToken::new())
        .await
        .unwrap();
    assert_eq!(rest.report.expired(), 700);
    assert_eq!(
        db.count("SELECT count(*) AS n FROM bookings WHERE status IN ('Reserved','AwaitingPayment','Booked')")
            .await,
        0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn candidate_queries_use_the_partial_indexes() {
    let db = TestDb::new().await;
    let mut conn = db.conn().await;
    booking_expiration::db::seed::seed(
        &mut conn,
        &booking_expiration::db::seed::SeedPlan {
            active: 3_000,
            due_fraction: 0.1,
            inactive: 30_000,
            poison: 0,
            as_of: t0(),
            spread: Duration::from_secs(3600),
        },
    )
    .await
    .unwrap();
    #[derive(QueryableByName)]
    struct Plan {
        #[diesel(sql_type = Text, column_name = "QUERY PLAN")]
        line: String,
    }
    use diesel::sql_types::{Array, BigInt, Nullable};
    // From the start of a sweep, and from a position in it: the position is
    // an index condition, so the scan starts there.
    let position = Some(t0() - ChronoDuration::minutes(30));
    for (phase, index) in [
        (Phase::Reserve, "ix_bookings_reserve_expires_at"),
        (Phase::Booking, "ix_bookings_booking_expires_at"),
    ] {
        for after in [None, position] {
            let lock = diesel::sql_query(format!("EXPLAIN {}", bookings::lock_due_sql(phase)))
                .bind::<Timestamptz, _>(t0())
                .bind::<Nullable<Timestamptz>, _>(after)
                .bind::<Nullable<SqlUuid>, _>(after.map(|_| Uuid::nil()))
                .bind::<BigInt, _>(200_i64)
                .load::<Plan>(&mut conn)
                .await
                .unwrap();
            let count = diesel::sql_query(format!(
                "EXPLAIN {}",
                bookings::count_due_excluding_sql(phase)
            ))
            .bind::<Timestamptz, _>(t0())
            .bind::<Nullable<Timestamptz>, _>(after)
            .bind::<Nullable<SqlUuid>, _>(after.map(|_| Uuid::nil()))
            .bind::<Array<SqlUuid>, _>(vec![Uuid::nil()])
            .load::<Plan>(&mut conn)
            .await
            .unwrap();
            for plan in [lock, count] {
                let text: Vec<String> = plan.into_iter().map(|p| p.line).collect();
                assert!(
                    text.iter().any(|l| l.contains(index)),
                    "{phase} {after:?}: plan does not use {index}:\n{}",
                    text.join("\n")
                );
                assert!(
                    !text.iter().any(|l| l.contains("Seq Scan")),
                    "{}",
                    text.join("\n")
                );
                if after.is_some() {
                    assert!(
                        text.iter()
                            .any(|l| l.contains("Index Cond") && l.contains(">=")),
                        "{phase}: the position is not an index condition:\n{}",
                        text.join("\n")
                    );
                }
            }
        }
    }
    // The deadline wake-up's probe: one index probe on each partial index.
    let plan: Vec<Plan> = diesel::sql_query(format!("EXPLAIN {}", bookings::next_deadline_sql()))
        .bind::<Timestamptz, _>(t0())
        .load(&mut conn)
        .await
        .unwrap();
    let text: Vec<String> = plan.into_iter().map(|p| p.line).collect();
    for index in [
        "ix_bookings_reserve_expires_at",
        "ix_bookings_booking_expires_at",
    ] {
        assert!(
            text.iter().any(|l| l.contains(index)),
            "next deadline probe does not use {index}:\n{}",
            text.join("\n")
        );
    }
    assert!(
        !text.iter().any(|l| l.contains("Seq Scan")),
        "{}",
        text.join("\n")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn parallel_instances_expire_each_booking_exactly_once() {
    let db = TestDb::new().await;
    let clock = clock();
    db.seed_due(10_000, t0()).await;
    let mut handles = Vec::new();
    for _ in 0..4 {
        // Each instance has a pool of its own, like a separate process.
        let pool = booking_expiration::db::connect_pool(&db.settings)
            .await
            .unwrap();
        let worker = booking_expiration::expiry::ExpiryWorker::new(
            &booking_expiration::context::TaskContext::new(pool, Arc::new(clock.clone())),
            expiry_settings(200),
            EventSettings::default(),
            ShutdownSettings::default(),
        );
        handles.push(tokio::spawn(async move {
            worker.run_cycle(&CancellationToken::new()).await.unwrap()
        }));
    }
    let mut total = 0;
    for handle in handles {
        let outcome = handle.await.unwrap();
        total += outcome.report.expired();
    }
    assert_eq!(total, 10_000, "every booking expired once across instances");
    assert_eq!(
        db.count("SELECT count(*) AS n FROM bookings WHERE version <> 2")
            .await,
        0
    );
    assert_eq!(
        db.count("SELECT count(*) AS n FROM (SELECT booking_id FROM booking_expiration_audit GROUP BY booking_id HAVING count(*) = 1) x").await,
        10_000
    );
    assert_eq!(
        db.count("SELECT count(DISTINCT message_key) AS n FROM booking_expiration_outbox")
            .await,
        10_000
    );
    assert_eq!(
        db.count("SELECT count(*) AS n FROM booking_expiration_outbox")
            .await,
        10_000
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn row_locked_by_a_manager_is_skipped_without_waiting_and_manager_wins() {
    let db = TestDb::new().await;
    let clock = clock();
    let as_of = t0();
    let contested =
        NewBooking::new("Reserved").reserve_deadline(as_of - ChronoDuration::minutes(1));
    let free = NewBooking::new("Reserved").reserve_deadline(as_of - ChronoDuration::minutes(1));
    db.insert_all(&[contested.clone(), free.clone()]).await;

    // The manager's Extend command holds the row lock in an open transaction.
    let mut manager = db.conn().await;
    diesel::sql_query("BEGIN")
        .execute(&mut manager)
        .await
        .unwrap();
    diesel::sql_query("SELECT id FROM bookings WHERE id = $1 FOR UPDATE")
        .bind::<SqlUuid, _>(contested.id)
        .execute(&mut manager)
        .await
        .unwrap();

    let worker = db.worker(&clock, 200);
    let outcome = tokio::time::timeout(
        Duration::from_secs(5),
        worker.run_cycle(&CancellationToken::new()),
    )
    .await
    .expect("the cycle does not wait for the lock")
    .unwrap();
    assert_eq!(outcome.report.reserve_expired_count, 1);
    assert_eq!(outcome.report.skipped_locked_count, 1);
    assert_eq!(db.booking(free.id).await.status, "ReserveExpired");
    assert_eq!(db.booking(contested.id).await.status, "Reserved");

    // The extension commits first: the booking is no longer due.
    diesel::sql_query(
        "UPDATE bookings SET reserve_expires_at = $2, version = version + 1 WHERE id = $1",
    )
    .bind::<SqlUuid, _>(contested.id)
    .bind::<Timestamptz, _>(as_of + ChronoDuration::hours(1))
    .execute(&mut manager)
    .await
    .unwrap();
    diesel::sql_query("COMMIT")
        .execute(&mut manager)
        .await
        .unwrap();

    let next = worker.run_cycle(&CancellationToken::new()).await.unwrap();
    assert_eq!(next.report.reserve_expired_count, 0);
    let stored = db.booking(contested.id).await;
    assert_eq!(stored.status, "Reserved");
    assert_eq!(stored.version, 2, "only the manager's change");
    assert!(outbox_of(&db, contested.id).await.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stale_version_is_not_written_and_gets_no_event() {
    // The repository guard behind "a lost race leaves the booking as the
    // manager set it": an update conditioned on an old version does nothing.
    let db = TestDb::new().await;
    let as_of = t0();
    let booking = NewBooking::new("Booked").booking_deadline(as_of - ChronoDuration::minutes(1));
    db.insert(&booking).await;
    let mut conn = db.conn().await;
    let row = {
        let rows = bookings::lock_due(&mut conn, Phase::Booking, as_of, None, 10)
            .await
            .unwrap();
        rows.into_iter().next().unwrap()
    };
    db.exec_sql(&format!(
        "UPDATE bookings SET status = 'Confirmed', version = version + 1 WHERE id = '{}'",
        booking.id
    ))
    .await;
    let expiry = row.to_domain().unwrap().expire(as_of).unwrap();
    let run_id = RunId::generate();
    let events = booking_expiration::config::EventSettings {
        topic: "t".to_owned(),
        ..Default::default()
    };
    let write = bookings::ExpiryWrite {
        read_version: row.version,
        message: booking_expiration::events::outbox_message(
            &expiry.event,
            run_id,
            "/test",
            &booking_expiration::events::TraceHeaders::default(),
        ),
        expiry,
    };
    let updated =
        bookings::persist_expiries(&mut conn, as_of, as_of, run_id, &events, &[write], None)
            .await
            .unwrap();
    assert!(updated.is_empty());
    let stored = db.booking(booking.id).await;
    assert_eq!(stored.status, "Confirmed");
    assert_eq!(
        db.count("SELECT count(*) AS n FROM booking_expiration_outbox")
            .await,
        0
    );
    assert_eq!(
        db.count("SELECT count(*) AS n FROM booking_expiration_audit")
            .await,
        0
    );
}

/// Records committed domain events; checks at delivery time that they are
/// already visible to another connection (i.e. committed).
struct CommitCheckingSubscriber {
    url: String,
    seen: Mutex<Vec<BookingExpired>>,
    uncommitted: Mutex<usize>,
}

impl DomainEventSubscriber for CommitCheckingSubscriber {
    fn on_booking_expired(&self, events: &[BookingExpired]) {
        let url = self.url.clone();
        let ids: Vec<Uuid> = events.iter().map(|e| e.booking_id.as_uuid()).collect();
        // A plain thread with its own runtime: the subscriber API is sync.
        let committed = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            rt.block_on(async {
                let mut conn = diesel_async::AsyncPgConnection::establish(&url).await.unwrap();
                #[derive(QueryableByName)]
                struct N {
                    #[diesel(sql_type = diesel::sql_types::BigInt)]
                    n: i64,
                }
                let n: N = diesel::sql_query(
                    "SELECT count(*) AS n FROM bookings WHERE id = ANY($1) AND expired_at IS NOT NULL",
                )
                .bind::<diesel::sql_types::Array<SqlUuid>, _>(&ids)
                .get_result(&mut conn)
                .await
                .unwrap();
                n.n as usize
            })
        })
        .join()
        .unwrap();
        *self.uncommitted.lock().unwrap() += events.len() - committed;
        self.seen.lock().unwrap().extend_from_slice(events);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn domain_events_are_dispatched_only_after_commit() {
    let db = TestDb::new().await;
    let clock = clock();
    db.seed_due(450, t0()).await;
    let subscriber = Arc::new(CommitCheckingSubscriber {
        url: db.url.clone(),
        seen: Mutex::new(Vec::new()),
        uncommitted: Mutex::new(0),
    });
    let worker = db.worker(&clock, 100).subscribe(subscriber.clone());
    let outcome = worker.run_cycle(&CancellationToken::new()).await.unwrap();
    assert_eq!(outcome.report.expired(), 450);
    assert_eq!(subscriber.seen.lock().unwrap().len(), 450);
    assert_eq!(*subscriber.uncommitted.lock().unwrap(), 0);

    // An infrastructure failure rolls the batch back: no event, no change.
    let db2 = TestDb::new().await;
    db2.seed_due(50, t0()).await;
    db2.exec_sql("ALTER TABLE booking_expiration_outbox RENAME TO outbox_gone")
        .await;
    let subscriber2 = Arc::new(CommitCheckingSubscriber {
        url: db2.url.clone(),
        seen: Mutex::new(Vec::new()),
        uncommitted: Mutex::new(0),
    });
    let failing = db2.worker(&clock, 100).subscribe(subscriber2.clone());
    let error = failing
        .run_cycle(&CancellationToken::new())
        .await
        .unwrap_err();
    assert!(matches!(error, CycleError::Database { .. }), "{error}");
    assert!(subscriber2.seen.lock().unwrap().is_empty());
    assert_eq!(
        db2.count("SELECT count(*) AS n FROM bookings WHERE version <> 1")
            .await,
        0
    );
    assert_eq!(
        db2.count("SELECT count(*) AS n FROM booking_expiration_audit")
            .await,
        0
    );
    // Fixed, the next cycle retries the same rows (idempotent by state).
    db2.exec_sql("ALTER TABLE outbox_gone RENAME TO booking_expiration_outbox")
        .await;
    let retried = failing.run_cycle(&CancellationToken::new()).await.unwrap();
    assert_eq!(retried.report.expired(), 50);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancellation_mid_cycle_leaves_whole_batches_and_no_locks() {
    let db = TestDb::new().await;
    let clock = clock();
    db.seed_due(20_000, t0()).await;
    let worker = Arc::new(db.worker(&clock, 200));
    let token = CancellationToken::new();
    let cycle = {
        let worker = Arc::clone(&worker);
        let token = token.clone();
        tokio::spawn(async move { worker.run_cycle(&token).await })
    };
    wait_until(
        "the first batch to commit",
        Duration::from_secs(30),
        || async {
            db.count("SELECT count(*) AS n FROM booking_expiration_outbox")
                .await
                > 0
        },
    )
    .await;
    token.cancel();
    let result = tokio::time::timeout(Duration::from_secs(15), cycle)
        .await
        .expect("the cycle stops promptly")
        .unwrap();
    assert!(matches!(result, Err(CycleError::Cancelled)), "{result:?}");

    let expired = db
        .count("SELECT count(*) AS n FROM bookings WHERE expired_at IS NOT NULL")
        .await;
    assert!(
        expired > 0 && expired < 20_000,
        "stopped part-way ({expired})"
    );
    assert_eq!(expired % 200, 0, "only whole batches committed");
    assert_eq!(
        db.count("SELECT count(*) AS n FROM booking_expiration_outbox")
            .await,
        expired
    );
    assert_eq!(
        db.count("SELECT count(*) AS n FROM booking_expiration_audit")
            .await,
        expired
    );
    assert_eq!(
        db.count("SELECT count(*) AS n FROM bookings WHERE (expired_at IS NULL) <> (version = 1)")
            .await,
        0
    );
    // No row lock is left: locking every row without waiting succeeds.
    let mut conn = db.conn().await;
    diesel::sql_query("BEGIN").execute(&mut conn).await.unwrap();
    diesel::sql_query("SELECT id FROM bookings FOR UPDATE NOWAIT")
        .execute(&mut conn)
        .await
        .expect("no row is still locked");
    diesel::sql_query("ROLLBACK")
        .execute(&mut conn)
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slo_booking_due_at_t_expires_by_t_plus_interval_plus_cycle() {
    use booking_expiration::clock::{Clock, SystemClock};
    let db = TestDb::new().await;
    let interval = Duration::from_secs(1);
    let now = SystemClock.now();
    let due_at = now + ChronoDuration::milliseconds(1500);
    let booking = NewBooking::new("Reserved").reserve_deadline(due_at);
    db.insert(&booking).await;
    // The draft's fixed schedule: the SLO holds without deadline wake-up.
    let settings = booking_expiration::config::ExpirySettings {
        interval,
        deadline_wake: false,
        ..expiry_settings(200)
    };
    let scheduler = Scheduler::start(&db, settings);
    wait_until("the booking to expire", Duration::from_secs(10), || async {
        db.booking(booking.id).await.status == "ReserveExpired"
    })
    .await;
    scheduler.stop().await;
    let stored = db.booking(booking.id).await;
    let expired_at = stored.expired_at.unwrap();
    assert!(expired_at > due_at, "never before the deadline");
    // Cycle durations here are milliseconds; allow one second for them.
    let bound = due_at + ChronoDuration::from_std(interval).unwrap() + ChronoDuration::seconds(1);
    assert!(
        expired_at <= bound,
        "expired at {expired_at}, bound {bound}"
    );
    assert_eq!(
        outbox_of(&db, booking.id).await.len(),
        1,
        "event in the outbox at once"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fast_clock_never_expires_a_booking_early() {
    // This instance's clock runs an hour ahead of the database's.
    let db = TestDb::new().await;
    let db_now = wall_now();
    let fast = booking_expiration::clock::ManualClock::new(db_now + ChronoDuration::hours(1));
    let soon = NewBooking::new("Reserved").reserve_deadline(db_now + ChronoDuration::minutes(30));
    let past = NewBooking::new("Booked").booking_deadline(db_now - ChronoDuration::minutes(1));
    db.insert_all(&[soon.clone(), past.clone()]).await;
    let mut settings = expiry_settings(200);
    settings.max_clock_skew = Some(Duration::from_secs(2));
    let outcome = db
        .worker_with(&fast, settings)
        .run_cycle(&CancellationToken::new())
        .await
        .unwrap();
    assert_eq!(outcome.report.booking_expired_count, 1);
    assert_eq!(
        outcome.report.reserve_expired_count, 0,
        "not due by the database clock"
    );
    assert!(outcome.as_of <= wall_now() + ChronoDuration::seconds(2));
    assert_eq!(db.booking(soon.id).await.status, "Reserved");
}
