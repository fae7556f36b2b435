//! The real scheduler with the default 60 s interval and deadline wake-up
//! on (the defaults): bookings expire just after their deadline, never at or
//! before it; a deadline moved later before it passes is honoured; a booking
//! added with an earlier deadline than the one the worker sleeps towards is
//! not left for the next tick, nor one written while the worker sleeps with
//! no deadline in sight (inserted, or moved earlier), nor rows left due by
//! the batch cap, nor good rows behind a batch of poison rows.

use std::time::Duration;

use crate::support::*;
use booking_expiration::{
    clock::{Clock, SystemClock},
    config::ExpirySettings,
    domain::Phase,
};
use chrono::{DateTime, Duration as ChronoDuration, Utc};
use std::sync::Arc;

/// The defaults: a 60 s interval and deadline wake-up on.
fn default_settings() -> ExpirySettings {
    let settings = ExpirySettings::default();
    assert_eq!(
        settings.interval,
        Duration::from_secs(60),
        "the default interval"
    );
    assert!(settings.deadline_wake, "deadline wake-up is on by default");
    settings
}

fn now() -> DateTime<Utc> {
    SystemClock.now()
}

fn ms(n: i64) -> ChronoDuration {
    ChronoDuration::milliseconds(n)
}

async fn wait_expired(db: &TestDb, id: uuid::Uuid, within: Duration) {
    wait_until("the booking to expire", within, || async {
        db.booking(id).await.expired_at.is_some()
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bookings_due_over_the_next_seconds_expire_within_a_second_of_their_deadline() {
    let db = TestDb::new().await;
    let start = now();
    // 12 bookings, both phases, deadlines spread over the next 6 s: each is
    // found by the probe after the previous wake-up, not by the 60 s tick.
    let bookings: Vec<NewBooking> = (0..12)
        .map(|i| {
            let deadline = start + ms(700 + 450 * i);
            if i % 3 == 2 {
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
    db.insert_all(&bookings).await;
    let scheduler = Scheduler::start(&db, default_settings());
    for booking in &bookings {
        wait_expired(&db, booking.id, Duration::from_secs(15)).await;
    }
    let metrics = scheduler.metrics.encode();
    scheduler.stop().await;

    let mut worst = ChronoDuration::zero();
    for booking in &bookings {
        let stored = db.booking(booking.id).await;
        let deadline = stored
            .reserve_expires_at
            .filter(|_| stored.status == "ReserveExpired")
            .or(stored.booking_expires_at)
            .expect("a deadline");
        let expired_at = stored.expired_at.expect("expired");
        assert!(
            expired_at > deadline,
            "{}: expired at {expired_at}, not after its deadline {deadline}",
            booking.id
        );
        let late = expired_at - deadline;
        assert!(
            late < ChronoDuration::seconds(1),
            "{}: {} ms late (deadline {deadline})",
            booking.id,
            late.num_milliseconds()
        );
        worst = worst.max(late);
    }
    eprintln!(
        "deadline wake-up: 12 bookings over 6 s, worst lateness {} ms",
        worst.num_milliseconds()
    );
    assert!(
        metrics.contains("crm_booking_expiration_lateness_seconds_count{phase=\"reserve\"} 8"),
        "lateness observed per expiry:\n{metrics}"
    );
    assert!(metrics.contains("crm_booking_expiration_lateness_seconds_count{phase=\"booking\"} 4"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_booking_extended_just_before_its_deadline_is_left_alone() {
    let db = TestDb::new().await;
    let deadline = now() + ms(5000);
    let extended = NewBooking::new("Reserved").reserve_deadline(deadline);
    // Same deadline, not extended: once it expired, the worker has woken for
    // that deadline and looked at the extended booking afresh.
    let control = NewBooking::new("Reserved").reserve_deadline(deadline);
    db.insert_all(&[extended.clone(), control.clone()]).await;
    let scheduler = Scheduler::start(&db, default_settings());
    // The worker's first cycle ran, so it now sleeps towards `deadline`.
    wait_until("the first cycle", Duration::from_secs(10), || async {
        scheduler.metrics.last_success_timestamp_seconds.get() > 0
    })
    .await;
    let before = (deadline - ms(1000) - now()).to_std();
    let before = before.expect("the first cycle ended more than 1 s before the deadline");
    // Deliberate timing: the Extend comes 1 s before the deadline.
    tokio::time::sleep(before).await;
    db.exec_sql(&format!(
        "UPDATE bookings SET reserve_expires_at = reserve_expires_at + interval '1 hour', \
         version = version + 1, updated_at = now() WHERE id = '{}'",
        extended.id
    ))
    .await;
    wait_expired(&db, control.id, Duration::from_secs(10)).await;
    scheduler.stop().await;
    let stored = db.booking(extended.id).await;
    assert_eq!(
        stored.status, "Reserved",
        "the extended booking stays active"
    );
    assert_eq!(stored.expired_at, None);
    assert_eq!(stored.version, 2, "only the manager's change");
    assert_eq!(
        db.count(&format!(
            "SELECT count(*) AS n FROM booking_expiration_outbox WHERE message_key = '{}'",
            extended.id
        ))
        .await,
        0,
        "no event for the extended booking"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_booking_added_with_an_earlier_deadline_is_not_left_for_the_tick() {
    let db = TestDb::new().await;
    let later = NewBooking::new("Booked").booking_deadline(now() + ms(4000));
    db.insert(&later).await;
    let scheduler = Scheduler::start(&db, default_settings());
    wait_until("the first cycle", Duration::from_secs(10), || async {
        scheduler.metrics.last_success_timestamp_seconds.get() > 0
    })
    .await;
    // The worker sleeps towards `later`'s deadline; this one falls due first.
    let earlier_deadline = now() + ms(1000);
    let earlier = NewBooking::new("Reserved").reserve_deadline(earlier_deadline);
    db.insert(&earlier).await;
    // The 60 s tick is far away: only a deadline wake-up can take it in time.
    wait_expired(&db, earlier.id, Duration::from_secs(10)).await;
    wait_expired(&db, later.id, Duration::from_secs(10)).await;
    scheduler.stop().await;
    let earlier_row = db.booking(earlier.id).await;
    let later_row = db.booking(later.id).await;
    let expired_at = earlier_row.expired_at.expect("expired");
    assert!(expired_at > earlier_deadline, "never before its deadline");
    assert!(
        expired_at <= later_row.expired_at.expect("expired"),
        "expired no later than the wake-up the worker slept towards"
    );
    assert!(
        later_row.expired_at.expect("expired") - later.booking_expires_at.expect("deadline")
            < ChronoDuration::seconds(1)
    );
}

/// `expired_at − deadline` of a stored booking (the deadline of the phase it
/// expired from), read from the row: the database's own record, whatever the
/// test runner's load.
fn lateness(stored: &StoredBooking) -> ChronoDuration {
    let deadline = match stored.status.as_str() {
        "ReserveExpired" => stored.reserve_expires_at,
        "BookingExpired" => stored.booking_expires_at,
        other => panic!("{}: not expired ({other})", stored.id),
    }
    .expect("a deadline");
    stored.expired_at.expect("expired") - deadline
}

/// The case: bookings written while the worker sleeps towards the
/// 60 s tick with no deadline in sight, each with a deadline 2–4 s after its
/// commit, and one booking whose far deadline crm moves 2.5 s ahead. Each
/// expires after its deadline and within a second of it. Before the probe
/// they all waited for the tick.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bookings_written_while_the_worker_sleeps_expire_within_a_second_of_their_deadline() {
    let db = TestDb::new().await;
    let moved =
        NewBooking::new("AwaitingPayment").reserve_deadline(now() + ChronoDuration::hours(1));
    db.insert(&moved).await;
    let scheduler = Scheduler::start(&db, default_settings());
    wait_until("the first cycle", Duration::from_secs(10), || async {
        scheduler.metrics.last_success_timestamp_seconds.get() > 0
    })
    .await;
    // Deliberate timing, the load itself: one booking every 700 ms, at
    // moments unrelated to the worker's schedule, each due 2–4 s after its
    // commit (the deadline is set before the insert, so the commit comes
    // a little later: at least 2 s before the deadline).
    let mut written = Vec::new();
    for i in 0..8i64 {
        let deadline = now() + ms(2_100 + 250 * i);
        let booking = if i % 3 == 2 {
            NewBooking::new("Booked").booking_deadline(deadline)
        } else {
            NewBooking::new("Reserved").reserve_deadline(deadline)
        };
        db.insert(&booking).await;
        written.push(booking.id);
        if i == 3 {
            // Extend's opposite: crm brings a far deadline 2.5 s near.
            db.exec_sql(&format!(
                "UPDATE bookings SET reserve_expires_at = now() + interval '2500 ms', \
                 version = version + 1, updated_at = now() WHERE id = '{}'",
                moved.id
            ))
            .await;
            written.push(moved.id);
        }
        tokio::time::sleep(Duration::from_millis(700)).await;
    }
    // The tick is about 50 s away: only the probe can take them in time.
    for id in &written {
        wait_expired(&db, *id, Duration::from_secs(20)).await;
    }
    scheduler.stop().await;
    let mut worst = ChronoDuration::zero();
    for id in &written {
        let stored = db.booking(*id).await;
        let late = lateness(&stored);
        assert!(
            late > ChronoDuration::zero(),
            "{id}: expired at or before its deadline"
        );
        assert!(
            late < ChronoDuration::seconds(1),
            "{id}: {} ms late",
            late.num_milliseconds()
        );
        worst = worst.max(late);
    }
    eprintln!(
        "written while asleep: {} bookings, worst lateness {} ms",
        written.len(),
        worst.num_milliseconds()
    );
}

/// Settings with batches of 5 and one batch per phase per cycle (the
/// draft's literal behaviour), the default 60 s interval otherwise.
fn one_small_batch_per_cycle() -> ExpirySettings {
    ExpirySettings {
        batch_size: 5,
        max_batches_per_cycle: 1,
        ..default_settings()
    }
}

/// With `EXPIRATION_MAX_BATCHES_PER_CYCLE=1`, 23 due rows take five
/// cycles: each follows the previous one after `EXPIRATION_MIN_GAP`, not at
/// the 60 s tick.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rows_left_due_by_the_batch_cap_are_taken_after_the_gap_not_at_the_tick() {
    let db = TestDb::new().await;
    let due: Vec<NewBooking> = (0..23)
        .map(|i| {
            NewBooking::new("Reserved").reserve_deadline(now() - ChronoDuration::minutes(30 - i))
        })
        .collect();
    db.insert_all(&due).await;
    let scheduler = Scheduler::start(&db, one_small_batch_per_cycle());
    wait_until("every due row expired", Duration::from_secs(20), || async {
        db.count("SELECT count(*) AS n FROM bookings WHERE status = 'Reserved'")
            .await
            == 0
    })
    .await;
    scheduler.stop().await;
    assert_eq!(
        db.count("SELECT count(*) AS n FROM booking_expiration_outbox")
            .await,
        23
    );
}

/// A cycle that takes longer than `EXPIRATION_MIN_GAP` (here a batch held
/// on a lock of the outbox for 3.5 s, a gap of 3 s) is followed at once by
/// the cycle of a deadline that passed meanwhile: the gap counts from the
/// previous cycle's start, so it bounds the cycles a second without adding
/// idle time after a long one. Counted from the end, the booking due during
/// the long cycle waited another 3 s after it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cycle_longer_than_the_gap_is_followed_at_once_not_after_another_gap() {
    let db = TestDb::new().await;
    let due = NewBooking::new("Reserved").reserve_deadline(now() - ChronoDuration::minutes(1));
    let during = NewBooking::new("Reserved").reserve_deadline(now() + ms(1_000));
    db.insert_all(&[due.clone(), during.clone()]).await;

    let holder = db.lock_outbox().await;
    let gap = Duration::from_secs(3);
    let scheduler = Scheduler::start(
        &db,
        ExpirySettings {
            min_gap: gap,
            ..default_settings()
        },
    );
    let started = std::time::Instant::now();
    wait_until(
        "the first cycle's batch to wait on the outbox lock",
        Duration::from_secs(10),
        || async { db.worker_sessions("wait_event_type = 'Lock'").await == 1 },
    )
    .await;
    tokio::time::sleep((gap + Duration::from_millis(500)).saturating_sub(started.elapsed())).await;
    let released = now();
    drop(holder);

    wait_expired(&db, during.id, Duration::from_secs(10)).await;
    scheduler.stop().await;
    let first = db.booking(due.id).await.expired_at.expect("expired");
    let next = db.booking(during.id).await.expired_at.expect("expired");
    assert!(first < released, "the first cycle took the due booking");
    let after = next - released;
    eprintln!(
        "a cycle longer than the gap: the next one started {} ms after it could go on",
        after.num_milliseconds()
    );
    // One commit and one probe of the next deadline after the release; the
    // old schedule started the next cycle a whole gap (3 s) later.
    assert!(
        after < ChronoDuration::milliseconds(1_500),
        "the booking due during the long cycle expired {} ms after the lock was released \
         (the gap is {gap:?}): the next cycle waited for the gap after the long one",
        after.num_milliseconds()
    );
}

/// Inserts `poison` due rows of `phase` the domain refuses (no deal), with
/// the oldest deadlines, and `good` due rows behind them; returns both.
async fn poison_at_the_head(
    db: &TestDb,
    phase: Phase,
    poison: i64,
    good: i64,
) -> (Vec<NewBooking>, Vec<NewBooking>) {
    let due = |at: DateTime<Utc>, i: i64| {
        let statuses = phase.active_statuses();
        let status = statuses[i as usize % statuses.len()].as_str();
        match phase {
            Phase::Reserve => NewBooking::new(status).reserve_deadline(at),
            Phase::Booking => NewBooking::new(status).booking_deadline(at),
        }
    };
    let oldest = now() - ChronoDuration::hours(2);
    let poison: Vec<NewBooking> = (0..poison)
        .map(|i| due(oldest + ChronoDuration::seconds(i), i).without_deal())
        .collect();
    let good: Vec<NewBooking> = (0..good)
        .map(|i| due(now() - ChronoDuration::minutes(30 - i), i))
        .collect();
    db.insert_all(&poison).await;
    db.insert_all(&good).await;
    (poison, good)
}

/// A batch's worth of poison rows with the oldest deadlines, and good rows
/// behind them, with one batch per cycle: the good rows expire, cycle after
/// cycle, long before the tick; the poison rows stay untouched, each
/// logged and counted when refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_of_poison_rows_at_the_head_never_keeps_the_rows_behind_it() {
    let db = TestDb::new().await;
    let (poison, good) = poison_at_the_head(&db, Phase::Reserve, 5, 12).await;
    let scheduler = Scheduler::start(&db, one_small_batch_per_cycle());
    for booking in &good {
        wait_expired(&db, booking.id, Duration::from_secs(20)).await;
    }
    let errors = scheduler.metrics.errors.get();
    scheduler.stop().await;
    for booking in &poison {
        let stored = db.booking(booking.id).await;
        assert_eq!(
            stored.status, booking.status,
            "poison rows stay as they are"
        );
        assert_eq!((stored.expired_at, stored.version), (None, 1));
    }
    assert!(
        errors >= 5,
        "each poison row counted when refused: {errors}"
    );
    assert_eq!(
        db.count("SELECT count(*) AS n FROM booking_expiration_outbox")
            .await,
        12
    );
}

/// The poison rows a sweep passed over are tried again (and counted again)
/// by the sweep that starts over at each tick, so they are never forgotten.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn poison_rows_passed_over_are_tried_again_at_the_ticks() {
    let db = TestDb::new().await;
    let poison = NewBooking::new("Booked")
        .booking_deadline(now() - ChronoDuration::minutes(5))
        .without_property_object();
    db.insert(&poison).await;
    let scheduler = Scheduler::start(
        &db,
        ExpirySettings {
            interval: Duration::from_secs(1),
            ..one_small_batch_per_cycle()
        },
    );
    // Refused at the first cycle (a tick), whose sweep reaches the end, then
    // by the sweeps that start over at the next two ticks: about 2 s.
    wait_until(
        "the poison row refused three times",
        Duration::from_secs(15),
        || async { scheduler.metrics.errors.get() >= 3 },
    )
    .await;
    scheduler.stop().await;
    assert_eq!(db.booking(poison.id).await.status, "Booked");
}

/// The same head of poison rows on the fixed schedule
/// (`EXPIRATION_DEADLINE_WAKE=false`, every cycle a tick) with one batch per
/// cycle, the draft's literal behaviour: every other cycle leaves the poison
/// rows out and takes the rows behind them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_of_poison_rows_never_keeps_the_rows_behind_it_on_the_fixed_schedule() {
    let db = TestDb::new().await;
    let (poison, good) = poison_at_the_head(&db, Phase::Booking, 5, 8).await;
    let scheduler = Scheduler::start(
        &db,
        ExpirySettings {
            interval: Duration::from_secs(1),
            deadline_wake: false,
            ..one_small_batch_per_cycle()
        },
    );
    // Cycle 1 refuses the poison rows (a full batch: the sweep goes on),
    // cycles 2 and 3 take the 8 behind them; the sweep reached the end, so
    // cycle 4 starts over and refuses the poison rows again.
    for booking in &good {
        wait_expired(&db, booking.id, Duration::from_secs(20)).await;
    }
    scheduler.stop().await;
    for booking in &poison {
        assert_eq!(db.booking(booking.id).await.status, booking.status);
    }
}

/// An instance clock a fixed span ahead of the system's.
#[derive(Debug)]
struct AheadClock(ChronoDuration);

impl Clock for AheadClock {
    fn now(&self) -> DateTime<Utc> {
        SystemClock.now() + self.0
    }
}

/// Issue 33: a local clock an hour ahead of the database's, far beyond
/// `EXPIRATION_MAX_CLOCK_SKEW`, and deadlines the local clock sees as past
/// but the clamped `as_of` does not. The scheduler used to run a cycle every
/// minimum gap (every 5 ms at 0); now it waits for the tick between cycles,
/// and says so in its metrics. Nothing expires early.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clock_out_of_skew_backs_off_to_the_tick() {
    let db = TestDb::new().await;
    let due_locally: Vec<NewBooking> = (0..5)
        .map(|i| {
            NewBooking::new("Reserved").reserve_deadline(now() + ChronoDuration::minutes(10 + i))
        })
        .collect();
    db.insert_all(&due_locally).await;
    let started = std::time::Instant::now();
    let scheduler = Scheduler::start_with_clock(
        &db,
        ExpirySettings {
            interval: Duration::from_secs(1),
            min_gap: Duration::from_millis(50),
            max_clock_skew: Some(Duration::from_secs(2)),
            ..default_settings()
        },
        Arc::new(AheadClock(ChronoDuration::hours(1))),
    );
    wait_until("three clamped cycles", Duration::from_secs(20), || async {
        scheduler.metrics.clock_skew_backoffs.get() >= 3
    })
    .await;
    let elapsed = started.elapsed();
    let exceeded = scheduler.metrics.clock_skew_exceeded.get();
    scheduler.stop().await;
    // The first cycle at start, the next two at the 1 s ticks: at the
    // minimum gap they would have taken about 0.1 s.
    assert!(
        elapsed >= Duration::from_millis(1_900),
        "three clamped cycles within {elapsed:?}: not one per tick"
    );
    assert_eq!(exceeded, 1, "the out-of-skew gauge");
    for booking in &due_locally {
        assert_eq!(db.booking(booking.id).await.expired_at, None, "never early");
    }
}
