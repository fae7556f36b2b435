//! Through a real PgBouncer (Debian's 1.18, `scripts/pgbouncer.sh`) in
//! transaction pooling mode, with two server connections per database so
//! clients share them as they do in production, handed out in turn
//! (`server_round_robin`: a statement sent outside a transaction is
//! prepared on one and run on the other, and fails): `once` processes in
//! parallel, `run` expiring and publishing, the commit wake-up over
//! `DATABASE_DIRECT_URL` and the polling fallback without it, two `run`
//! instances at the default 60 s interval taking bookings written while they
//! sleep (the next-deadline probe, a plain read), and `migrate`, which needs
//! a session.

use std::{
    collections::BTreeMap,
    process::Command,
    time::{Duration, Instant},
};

use testkit::pgbouncer::PgBouncer;

use crate::support::*;

/// A fresh database and a PgBouncer in front of the test PostgreSQL.
async fn pooled() -> (TestDb, PgBouncer, String) {
    let db = TestDb::new().await;
    let bouncer = PgBouncer::start(&tempdir("pgbouncer"), free_port(), &admin_url(), 2)
        .expect("start PgBouncer");
    let url = bouncer.url(&db.name);
    (db, bouncer, url)
}

fn through_pooler(command: &mut Command, pooled_url: &str) {
    command
        .env("DATABASE_URL", pooled_url)
        .env("DATABASE_POOLER", "transaction")
        .env("RUST_LOG", "info");
}

fn run_command(pooled_url: &str, topic: &str, extra: &[(&str, &str)]) -> Command {
    let mut command = binary();
    command.arg("run");
    through_pooler(&mut command, pooled_url);
    command
        .env("KAFKA_BOOTSTRAP_SERVERS", kafka_bootstrap().join(","))
        .env("KAFKA_TOPIC", topic)
        // A short tick: the seeded backlog and the events come quickly.
        .env("EXPIRATION_INTERVAL", "1s")
        .env("METRICS_ADDR", format!("127.0.0.1:{}", free_port()));
    for (name, value) in extra {
        command.env(name, value);
    }
    command
}

/// The distinct `ce_id`s per booking key on `topic`.
async fn events_by_key(topic: &str) -> BTreeMap<String, Vec<String>> {
    let mut by_key: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for record in read_topic(topic, 3).await {
        let ce_id = record.header("ce_id").expect("ce_id header");
        let ids = by_key.entry(record.key).or_default();
        if !ids.contains(&ce_id) {
            ids.push(ce_id);
        }
    }
    by_key
}

/// Waits until `n` bookings have an event on `topic`; checks each has one
/// `ce_id` (a duplicate may only repeat it).
async fn wait_for_events(topic: &str, n: usize, timeout: Duration) {
    wait_until(&format!("{n} bookings on {topic}"), timeout, || async {
        events_by_key(topic).await.len() >= n
    })
    .await;
    let by_key = events_by_key(topic).await;
    assert_eq!(
        by_key.len(),
        n,
        "no event for a booking that did not expire"
    );
    assert!(by_key.values().all(|ids| ids.len() == 1), "one ce_id each");
}

/// Invariant: four `once` processes at a time through transaction pooling
/// each exit 0 (today's failure was `prepared statement "s8" already
/// exists`), and between them expire every due booking exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn four_once_processes_in_parallel_through_transaction_pooling() {
    let (db, _bouncer, url) = pooled().await;
    const DUE: i64 = 2_000;
    db.seed_due(DUE as u64, wall_now()).await;
    let children: Vec<_> = (0..4)
        .map(|_| {
            let mut command = binary();
            command.arg("once").env("EXPIRATION_BATCH_SIZE", "50");
            through_pooler(&mut command, &url);
            command.output().expect("spawn once")
        })
        .collect();
    let mut expired = 0;
    for output in &children {
        assert!(
            output.status.success(),
            "once through PgBouncer: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        let report: serde_json::Value =
            serde_json::from_slice(&output.stdout).expect("once prints JSON");
        expired += report["reserve_expired_count"].as_i64().unwrap()
            + report["booking_expired_count"].as_i64().unwrap();
    }
    assert_eq!(expired, DUE, "the reports add up to the due bookings");
    assert_eq!(
        db.count("SELECT count(*) AS n FROM bookings WHERE version = 2")
            .await,
        DUE
    );
    assert_eq!(
        db.count("SELECT count(*) AS n FROM booking_expiration_audit")
            .await,
        DUE,
        "one audit row each: no booking expired twice"
    );
    // `status` and `outbox retry` read and write through the pooler too.
    let mut status = binary();
    status.args(["status", "--json"]);
    through_pooler(&mut status, &url);
    let output = status.output().expect("status");
    assert!(output.status.success(), "{output:?}");
    let report: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(report["outbox_unpublished"], DUE);
}

/// `migrate` needs a session (its advisory lock): through a transaction
/// pooler it refuses without `DATABASE_DIRECT_URL` (exit 2, one line naming
/// the setting) and migrates over that URL when given.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrate_through_a_transaction_pooler_uses_the_direct_url() {
    let (db, _bouncer, url) = pooled().await;
    let mut refused = binary();
    refused.arg("migrate");
    through_pooler(&mut refused, &url);
    let output = refused.output().expect("migrate");
    assert_eq!(output.status.code(), Some(2), "{output:?}");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(
        stderr.contains(
            "DATABASE_DIRECT_URL: is required by migrate when DATABASE_POOLER=transaction"
        ),
        "{stderr}"
    );
    // A failing direct connection is named as such.
    let mut wrong = url::Url::parse(&db.url).unwrap();
    wrong.set_password(Some("not-the-password")).unwrap();
    let mut failing = binary();
    failing
        .arg("migrate")
        .env("DATABASE_DIRECT_URL", wrong.as_str());
    through_pooler(&mut failing, &url);
    let output = failing.output().expect("migrate");
    assert_eq!(output.status.code(), Some(1), "{output:?}");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains(
            "cannot connect to PostgreSQL at DATABASE_DIRECT_URL: password authentication failed"
        ),
        "{stderr}"
    );
    assert!(!stderr.contains("not-the-password"), "{stderr}");
    for args in [&["migrate"][..], &["migrate", "--check"]] {
        let mut direct = binary();
        direct.args(args).env("DATABASE_DIRECT_URL", &db.url);
        through_pooler(&mut direct, &url);
        let output = direct.output().expect("migrate");
        assert!(output.status.success(), "{args:?}: {output:?}");
    }
}

/// Invariant: `run` through the pooler expires and publishes; with
/// `DATABASE_DIRECT_URL` the commit wake-up publishes a new expiry long
/// before the (60 s) poll would.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_through_the_pooler_wakes_up_over_the_direct_url() {
    let (db, _bouncer, url) = pooled().await;
    let topic = create_topic(3).await;
    db.seed_due(300, wall_now()).await;
    let mut running = Running::spawn(run_command(
        &url,
        &topic,
        &[
            ("DATABASE_DIRECT_URL", &db.url),
            ("OUTBOX_POLL_INTERVAL", "60s"),
        ],
    ));
    wait_for_events(&topic, 300, Duration::from_secs(60)).await;

    // Due in one second: the worker wakes at the deadline and commits, the
    // trigger's NOTIFY reaches the LISTEN on the direct connection.
    let due_at = wall_now() + chrono::Duration::seconds(1);
    let late: Vec<NewBooking> = (0..20)
        .map(|_| NewBooking::new("Reserved").reserve_deadline(due_at))
        .collect();
    db.insert_all(&late).await;
    let started = Instant::now();
    wait_for_events(&topic, 320, Duration::from_secs(20)).await;
    let took = started.elapsed();
    eprintln!("FIGURES pgbouncer wake-up: deadline + publish in {took:?} (poll interval 60 s)");
    assert!(took < Duration::from_secs(20));
    running.terminate();
    assert_eq!(running.wait(Duration::from_secs(30)).await.code(), Some(0));
    let stderr = running.stderr();
    assert!(!stderr.contains("no commit wake-up"), "{stderr}");
    assert!(!stderr.contains("ERROR"), "{stderr}");
}

/// Invariant: without `DATABASE_DIRECT_URL` through a transaction pooler,
/// `run` says once that it has no commit wake-up, and publishing still
/// happens on the poll.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_through_the_pooler_without_the_direct_url_polls() {
    let (db, _bouncer, url) = pooled().await;
    let topic = create_topic(3).await;
    db.seed_due(300, wall_now()).await;
    let mut running = Running::spawn(run_command(&url, &topic, &[("OUTBOX_POLL_INTERVAL", "1s")]));
    wait_for_events(&topic, 300, Duration::from_secs(60)).await;
    let due_at = wall_now() + chrono::Duration::seconds(1);
    let late: Vec<NewBooking> = (0..20)
        .map(|_| NewBooking::new("Booked").booking_deadline(due_at))
        .collect();
    db.insert_all(&late).await;
    wait_for_events(&topic, 320, Duration::from_secs(20)).await;
    running.terminate();
    assert_eq!(running.wait(Duration::from_secs(30)).await.code(), Some(0));
    let stderr = running.stderr();
    assert_eq!(
        stderr.matches("no commit wake-up").count(),
        1,
        "logged once: {stderr}"
    );
    assert!(!stderr.contains("ERROR"), "{stderr}");
    assert!(!stderr.contains("LISTEN connection lost"), "{stderr}");
}

/// Invariant: through the pooler, with the default 60 s interval and two
/// instances, a booking written while they sleep with nothing due, 2.5 s
/// before its deadline, expires after its deadline and within a second of
/// it: the probe of the next deadline and the deadline waker's lease are
/// plain statements in a transaction, so they need no session.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_through_the_pooler_takes_bookings_written_while_it_sleeps() {
    let (db, _bouncer, url) = pooled().await;
    let topic = create_topic(3).await;
    let mut instances: Vec<Running> = (0..2)
        .map(|_| {
            let mut command = run_command(&url, &topic, &[("EXPIRATION_INTERVAL", "60s")]);
            command.arg("--no-publisher");
            Running::spawn(command)
        })
        .collect();
    for instance in &mut instances {
        instance
            .wait_for_log("cycle completed", Duration::from_secs(30))
            .await;
    }
    // Deliberate timing, the load itself: three bookings 700 ms apart.
    let mut written = Vec::new();
    for _ in 0..3 {
        let booking = NewBooking::new("Reserved")
            .reserve_deadline(wall_now() + chrono::Duration::milliseconds(2_500));
        db.insert(&booking).await;
        written.push(booking.id);
        tokio::time::sleep(Duration::from_millis(700)).await;
    }
    for id in &written {
        wait_until("the booking to expire", Duration::from_secs(20), || async {
            db.booking(*id).await.expired_at.is_some()
        })
        .await;
    }
    for instance in &mut instances {
        instance.terminate();
        assert_eq!(instance.wait(Duration::from_secs(30)).await.code(), Some(0));
        let stderr = instance.stderr();
        assert!(!stderr.contains("ERROR"), "{stderr}");
        assert!(!stderr.contains("next deadline not read"), "{stderr}");
        // The waker's lease is one statement too: in a transaction, or
        // PgBouncer (round robin) runs it on another server connection
        // than the one that prepared it.
        assert!(!stderr.contains("lease not read"), "{stderr}");
    }
    for id in &written {
        let stored = db.booking(*id).await;
        let late =
            stored.expired_at.expect("expired") - stored.reserve_expires_at.expect("deadline");
        eprintln!(
            "FIGURES pgbouncer probe: expired {} ms after the deadline",
            late.num_milliseconds()
        );
        assert!(
            late > chrono::Duration::zero() && late < chrono::Duration::seconds(1),
            "{late:?}"
        );
    }
}
