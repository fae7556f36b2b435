//! Two `run` instances on one database and topic, one of them paused
//! (SIGSTOP: a frozen VM, a node under pressure) past its 15 s lease while
//! it holds rows, then resumed (SIGCONT): every lease has an owner, so the
//! instance that comes back finds its rows claimed by the other, drops
//! them unsent (its renewal comes back short, said in one line) and
//! changes nothing of them. Asserted: every booking expired once and on
//! the topic, no event more than twice (a request the paused instance had
//! on the way, once more by the other), and both stop with exit 0. Whether
//! the paused one still had rows waiting to renew when it came back (its
//! log then says it left them) depends on where the pause caught it: the
//! line is counted and printed; the rule itself is pinned by
//! `outbox::tests::a_paused_instance_leaves_the_rows_another_claimed_since`.
//!
//! Bookings fall due at [`RATE`] a second for [`SPREAD`], so both
//! instances expire and publish all along; the pause comes once the
//! instance holds rows (`crm_booking_expiration_outbox_held` > 0).

use std::{
    collections::BTreeMap,
    time::{Duration, Instant},
};

use crate::support::*;

const RATE: u64 = 200;
const SPREAD: Duration = Duration::from_secs(30);
const PARTITIONS: i32 = 3;
/// Longer than the lease (15 s), so the other instance claims its rows.
const PAUSE: Duration = Duration::from_secs(20);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_instance_paused_past_its_lease_leaves_the_other_its_rows() {
    let db = TestDb::new().await;
    let topic = create_topic(PARTITIONS).await;
    let due = RATE * SPREAD.as_secs();
    let first = wall_now() + chrono::Duration::seconds(3);
    let bookings = falling_due(due, first, SPREAD, |at| {
        NewBooking::new("Booked").booking_deadline(at)
    });
    db.insert_all(&bookings).await;
    let start = |addr: &str| Running::spawn(run_on(&db, &topic, addr));
    let (addr_a, addr_b) = (
        format!("127.0.0.1:{}", free_port()),
        format!("127.0.0.1:{}", free_port()),
    );
    let mut a = start(&addr_a);
    // A is the deadline waker before B starts: it expires the bookings and
    // holds their rows (a follower would hold none).
    wait_until("A is the waker", Duration::from_secs(15), || async {
        metric(&addr_a, "crm_booking_expiration_expiry_waker").await == 1.0
    })
    .await;
    let mut b = start(&addr_b);
    // Pause A once it holds rows (written leased to it, claimed, or on
    // the way to the broker).
    let deadline = Instant::now() + SPREAD;
    loop {
        assert!(Instant::now() < deadline, "A never held a row");
        if metric(&addr_a, "crm_booking_expiration_outbox_held").await > 0.0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    signal(a.child.id(), "STOP");
    tokio::time::sleep(PAUSE).await;
    signal(a.child.id(), "CONT");
    wait_until(
        "every booking expired and published",
        SPREAD + Duration::from_secs(60),
        || async { db.published().await == due as i64 },
    )
    .await;
    for running in [&a, &b] {
        running.terminate();
    }
    assert!(a.wait(Duration::from_secs(30)).await.success(), "A stops");
    assert!(b.wait(Duration::from_secs(30)).await.success(), "B stops");
    let log_a = a.stderr();

    assert_eq!(
        db.count(
            "SELECT count(*) AS n FROM bookings WHERE status = 'BookingExpired' AND version = 2"
        )
        .await,
        due as i64,
        "each booking expired once"
    );
    let records = read_topic(&topic, PARTITIONS).await;
    let mut copies: BTreeMap<String, usize> = BTreeMap::new();
    for record in &records {
        *copies
            .entry(record.header("ce_id").expect("ce_id"))
            .or_default() += 1;
    }
    let twice = copies.values().filter(|n| **n == 2).count();
    let most = copies.values().copied().max().unwrap_or(0);
    let left = log_a
        .lines()
        .filter(|line| line.contains("leases found held by another instance"))
        .count();
    eprintln!(
        "FIGURES paused-instance: {} records for {due} bookings, {twice} written twice, at most {most} copies; \
         A's log says {left} time(s) it left rows to B",
        records.len()
    );
    assert_eq!(copies.len() as u64, due, "every booking on the topic");
    assert!(most <= 2, "no event more than twice (at most {most})");
}
