//! The fault suite: each test states its invariant, runs the real binary
//! against real PostgreSQL and Kafka, injects faults, and prints figures.

use std::{
    collections::{BTreeMap, HashMap},
    process::Command,
    time::{Duration, Instant},
};

use crate::support::*;
use testkit::{kafka::Kafka, postgres::Postgres};

fn run_command(db_url: &str, topic: &str, extra: &[(&str, &str)]) -> Command {
    let mut command = binary();
    command
        .arg("run")
        .env("DATABASE_URL", db_url)
        .env("KAFKA_BOOTSTRAP_SERVERS", kafka_bootstrap().join(","))
        .env("KAFKA_TOPIC", topic)
        .env("EXPIRATION_INTERVAL", "200ms")
        .env("METRICS_ADDR", format!("127.0.0.1:{}", free_port()))
        .env("RUST_LOG", "warn");
    for (k, v) in extra {
        command.env(k, v);
    }
    command
}

/// The database half of every fault invariant: each due booking expired
/// exactly once — version + 1, one audit row, one outbox row.
async fn assert_expired_exactly_once(db: &TestDb, due: i64) {
    assert_eq!(
        db.count("SELECT count(*) AS n FROM bookings WHERE status IN ('ReserveExpired','BookingExpired') AND version = 2")
            .await,
        due,
        "every due booking expired, version + 1"
    );
    assert_eq!(
        db.count("SELECT count(*) AS n FROM bookings WHERE version > 2")
            .await,
        0
    );
    assert_eq!(
        db.count("SELECT count(*) AS n FROM (SELECT booking_id FROM booking_expiration_audit GROUP BY 1 HAVING count(*) = 1) x").await,
        due,
        "one audit row each"
    );
    assert_eq!(
        db.count("SELECT count(*) AS n FROM booking_expiration_audit")
            .await,
        due
    );
    assert_eq!(
        db.count("SELECT count(DISTINCT message_key) AS n FROM booking_expiration_outbox")
            .await,
        due
    );
    assert_eq!(
        db.count("SELECT count(*) AS n FROM booking_expiration_outbox")
            .await,
        due,
        "one outbox row each"
    );
}

/// The Kafka half: every booking reached the topic at least once, and any
/// duplicate carries the same `ce_id` and bytes as the original.
async fn assert_on_kafka_at_least_once(topic: &str, due: usize) -> usize {
    let records = read_topic(topic, 3).await;
    let mut by_key: HashMap<String, Vec<&ConsumedRecord>> = HashMap::new();
    for r in &records {
        by_key.entry(r.key.clone()).or_default().push(r);
    }
    assert_eq!(by_key.len(), due, "every booking on Kafka");
    for copies in by_key.values() {
        for c in copies {
            assert_eq!(
                c.header("ce_id"),
                copies[0].header("ce_id"),
                "duplicates share ce_id"
            );
            assert_eq!(c.value, copies[0].value);
        }
    }
    records.len() - due
}

/// Invariant: however often the process is killed with SIGKILL mid-cycle or
/// mid-publish, every due booking expires exactly once and reaches Kafka at
/// least once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_at_random_points_loses_nothing_and_expires_once() {
    let db = TestDb::new().await;
    let topic = create_topic(3).await;
    const DUE: i64 = 20_000;
    db.seed_due(DUE as u64, wall_now()).await;
    let started = Instant::now();
    let mut kills = 0;
    for round in 0..12 {
        let mut running = Running::spawn(run_command(
            &db.url,
            &topic,
            &[("EXPIRATION_BATCH_SIZE", "200")],
        ));
        let delay = Duration::from_millis(150 + fastrand::u64(0..900));
        // Deliberate fault timing: SIGKILL at a random point of the run.
        tokio::time::sleep(delay).await;
        running.child.kill().expect("SIGKILL");
        let _ = running.child.wait();
        kills += 1;
        let expired = db
            .count("SELECT count(*) AS n FROM bookings WHERE version = 2")
            .await;
        let published = db.published().await;
        eprintln!("kill {round}: after {delay:?}: expired {expired}, published {published}");
    }
    // Recovery: one more process runs to completion.
    let mut running = Running::spawn(run_command(&db.url, &topic, &[]));
    wait_until(
        "backlog and outbox drained",
        Duration::from_secs(120),
        || async { db.published().await == DUE },
    )
    .await;
    running.terminate();
    assert_eq!(running.wait(Duration::from_secs(30)).await.code(), Some(0));
    assert_expired_exactly_once(&db, DUE).await;
    let duplicates = assert_on_kafka_at_least_once(&topic, DUE as usize).await;
    eprintln!(
        "FIGURES kill-9: faults injected {kills}, rows checked {DUE}, duplicates on Kafka {duplicates} (all same ce_id), total {:?}",
        started.elapsed()
    );
}

/// Invariant: four instances and managers' commands at the same time — a
/// booking a manager changed first is never expired and gets no event;
/// every other due booking gets exactly one.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn four_instances_with_concurrent_manager_commands() {
    let db = TestDb::new().await;
    let topic = create_topic(3).await;
    db.seed_due(10_000, wall_now()).await;
    db.exec_sql("CREATE TABLE manager_log (booking_id uuid PRIMARY KEY, action text NOT NULL)")
        .await;
    let mut workers: Vec<Running> = (0..4)
        .map(|_| {
            Running::spawn(run_command(
                &db.url,
                &topic,
                &[("NO_PUBLISHER", "true"), ("EXPIRATION_BATCH_SIZE", "100")],
            ))
        })
        .collect();
    // Manager commands: lock the row (waiting, like a real command), act
    // only if still active, commit. Expired bookings are terminal: refused.
    let manager_url = db.url.clone();
    let manager = tokio::spawn(async move {
        use diesel_async::{AsyncConnection, RunQueryDsl};
        let mut conn = diesel_async::AsyncPgConnection::establish(&manager_url)
            .await
            .unwrap();
        let (mut applied, mut refused) = (0, 0);
        for i in 0..400 {
            let action = ["Cancelled", "Confirmed", "Extend"][i % 3];
            let sql = format!(
                "WITH target AS (SELECT id FROM bookings WHERE id = (SELECT id FROM bookings TABLESAMPLE SYSTEM (5) LIMIT 1) FOR UPDATE), \
                 changed AS (UPDATE bookings b SET {set}, version = b.version + 1, updated_at = now() FROM target t \
                   WHERE b.id = t.id AND b.status IN ('Reserved','AwaitingPayment','Booked') RETURNING b.id) \
                 INSERT INTO manager_log SELECT id, '{action}' FROM changed ON CONFLICT DO NOTHING",
                set = if action == "Extend" {
                    "reserve_expires_at = now() + interval '1 day', booking_expires_at = now() + interval '1 day'".to_owned()
                } else {
                    format!("status = '{action}'")
                }
            );
            match diesel::sql_query(sql).execute(&mut conn).await {
                Ok(1) => applied += 1,
                Ok(_) => refused += 1,
                Err(e) => panic!("manager command: {e}"),
            }
        }
        (applied, refused)
    });
    let (applied, refused) = manager.await.unwrap();
    wait_until("all instances done", Duration::from_secs(120), || async {
        db.count("SELECT count(*) AS n FROM bookings WHERE status IN ('Reserved','AwaitingPayment','Booked') \
                  AND id NOT IN (SELECT booking_id FROM manager_log WHERE action = 'Extend')")
            .await
            == 0
    })
    .await;
    for w in &workers {
        w.terminate();
    }
    for w in &mut workers {
        assert_eq!(w.wait(Duration::from_secs(30)).await.code(), Some(0));
    }
    let changed = db.count("SELECT count(*) AS n FROM manager_log").await;
    assert_eq!(
        db.count("SELECT count(*) AS n FROM manager_log m JOIN booking_expiration_audit a ON a.booking_id = m.booking_id").await,
        0,
        "no booking expired after a manager's change committed first"
    );
    assert_eq!(
        db.count("SELECT count(*) AS n FROM manager_log m JOIN booking_expiration_outbox o ON o.message_key = m.booking_id::text").await,
        0
    );
    let expired = 10_000 - changed;
    assert_eq!(
        db.count("SELECT count(*) AS n FROM booking_expiration_outbox")
            .await,
        expired
    );
    assert_eq!(
        db.count("SELECT count(DISTINCT message_key) AS n FROM booking_expiration_outbox")
            .await,
        expired
    );
    assert_eq!(
        db.count("SELECT count(*) AS n FROM booking_expiration_audit")
            .await,
        expired
    );
    eprintln!(
        "FIGURES manager-race: instances 4, manager commands applied {applied}, refused (already terminal) {refused}, expired {expired}, double events 0"
    );
}

/// Invariant: bad rows never crash a cycle or block the rest; poison rows
/// are refused, counted and shown by `status`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_rows_are_isolated() {
    let db = TestDb::new().await;
    let now = wall_now();
    let past = now - chrono::Duration::days(36_500);
    let future = now + chrono::Duration::days(36_500);
    let good = NewBooking::new("Reserved").reserve_deadline(now - chrono::Duration::seconds(5));
    let ancient = NewBooking::new("Booked").booking_deadline(past);
    let far_future = NewBooking::new("Booked").booking_deadline(future);
    let no_deadline = NewBooking::new("AwaitingPayment");
    let no_deal = NewBooking::new("Reserved")
        .reserve_deadline(past)
        .without_deal();
    let no_object = NewBooking::new("Booked")
        .booking_deadline(past)
        .without_property_object();
    let mut unknown = NewBooking::new("Reserved").reserve_deadline(past);
    unknown.status = "Frozen".into();
    db.insert_all(&[
        good.clone(),
        ancient.clone(),
        far_future.clone(),
        no_deadline.clone(),
        no_deal.clone(),
        no_object.clone(),
        unknown.clone(),
    ])
    .await;
    let output = binary()
        .arg("once")
        .env("DATABASE_URL", &db.url)
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let report: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(report["reserve_expired_count"], 1);
    assert_eq!(report["booking_expired_count"], 1);
    let stderr = String::from_utf8_lossy(&output.stderr);
    for poison in [no_deal.id, no_object.id] {
        assert!(
            stderr
                .lines()
                .any(|l| l.contains("ERROR") && l.contains(&poison.to_string())),
            "poison {poison} logged at ERROR:\n{stderr}"
        );
    }
    assert_eq!(db.booking(good.id).await.status, "ReserveExpired");
    assert_eq!(db.booking(ancient.id).await.status, "BookingExpired");
    for untouched in [&far_future, &no_deadline, &no_deal, &no_object, &unknown] {
        assert_eq!(
            db.booking(untouched.id).await.version,
            1,
            "{} untouched",
            untouched.status
        );
    }
    let status = binary()
        .args(["status", "--json"])
        .env("DATABASE_URL", &db.url)
        .output()
        .unwrap();
    assert!(status.status.success());
    let status: serde_json::Value = serde_json::from_slice(&status.stdout).unwrap();
    let poison: Vec<String> = status["poison"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["booking_id"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(poison.len(), 2, "{status}");
    assert!(poison.contains(&no_deal.id.to_string()) && poison.contains(&no_object.id.to_string()));
    let password = url::Url::parse(&db.url)
        .unwrap()
        .password()
        .unwrap()
        .to_owned();
    assert!(!stderr.contains(&password) && !status.to_string().contains(&password));
}

/// `crm_booking_expiration_cycles_failed_total` as `/metrics` shows it (0 when unreachable).
async fn failed_cycles(addr: &str) -> f64 {
    let Some((_, metrics)) = http_get(addr, "/metrics").await else {
        return 0.0;
    };
    metrics
        .lines()
        .find(|l| l.starts_with("crm_booking_expiration_cycles_failed_total "))
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
        .unwrap_or(0.0)
}

/// Invariant: a database restart and killed connections mid-run never
/// stop the process; the batch in flight rolls back, the pool heals, the
/// backlog drains, each booking expires exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn database_restart_and_killed_connections_heal() {
    // A server of its own (stopped on drop, after the database below).
    let pg = Postgres::start(&tempdir("pg-fault"), free_port(), &[]).expect("start PostgreSQL");
    let db = TestDb::on(&pg.admin_url).await;
    const DUE: i64 = 20_000;
    db.seed_due(DUE as u64, wall_now()).await;
    let addr = format!("127.0.0.1:{}", free_port());
    let mut command = binary();
    command
        .arg("run")
        .env("DATABASE_URL", &db.url)
        .env("NO_PUBLISHER", "true")
        .env("EXPIRATION_INTERVAL", "300ms")
        .env("EXPIRATION_BATCH_SIZE", "100")
        .env("EXPIRATION_MAX_BATCHES_PER_CYCLE", "5")
        .env("LIVENESS_WINDOW", "1500ms")
        .env("METRICS_ADDR", &addr)
        .env("RUST_LOG", "warn");
    let mut running = Running::spawn(command);
    wait_until("first expiries", Duration::from_secs(30), || async {
        db.count("SELECT count(*) AS n FROM bookings WHERE version = 2")
            .await
            > 0
    })
    .await;
    // Database taken away: cycles fail, liveness goes, the process stays.
    pg.stop().expect("stop PostgreSQL");
    wait_http_status(&addr, "/healthz", 503, Duration::from_secs(15)).await;
    assert_eq!(http_get(&addr, "/readyz").await.map(|r| r.0), Some(503));
    // A cycle waits up to DATABASE_CONNECT_TIMEOUT (5 s) for a connection, so
    // the database stays away until a failed cycle is counted.
    wait_until(
        "a failed cycle counted while the database is down",
        Duration::from_secs(30),
        || async { failed_cycles(&addr).await >= 1.0 },
    )
    .await;
    pg.start_again().expect("start PostgreSQL again");
    // And a fast restart mid-cycle.
    let restart_at = Instant::now();
    pg.restart().expect("restart PostgreSQL");
    let mut killed = 0;
    for _ in 0..3 {
        // Deliberate fault timing: cut the worker's connections three times,
        // 700 ms apart, while it recovers from the restart.
        tokio::time::sleep(Duration::from_millis(700)).await;
        killed += db
            .count("SELECT count(*) AS n FROM (SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = 'booking-expiration') x")
            .await;
    }
    assert!(
        running.child.try_wait().unwrap().is_none(),
        "the process kept running"
    );
    wait_until(
        "backlog drained after the faults",
        Duration::from_secs(120),
        || async {
            db.count("SELECT count(*) AS n FROM bookings WHERE version = 2")
                .await
                == DUE
        },
    )
    .await;
    let recovery = restart_at.elapsed();
    let errors = failed_cycles(&addr).await;
    assert!(errors >= 1.0, "failed cycles counted: {errors}");
    wait_http_status(&addr, "/healthz", 200, Duration::from_secs(10)).await;
    running.terminate();
    assert_eq!(running.wait(Duration::from_secs(30)).await.code(), Some(0));
    assert_expired_exactly_once(&db, DUE).await;
    eprintln!(
        "FIGURES db-restart: stop+start 1 (/healthz 503 meanwhile), restarts 1, connections terminated {killed}, failed cycles counted {errors}, rows checked {DUE}, drained {recovery:?} after the restart"
    );
}

/// Invariant: at the default 60 s interval, a cycle that failed is tried
/// again after a backoff (500 ms, doubling), not at the next tick: a
/// booking whose deadline passed while its cycles failed expires within
/// the backoff's step of the fault's end. The fault: the outbox table
/// renamed away, so every batch rolls back at its insert.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_cycle_is_retried_within_its_backoff_not_at_the_tick() {
    let db = TestDb::new().await;
    let mut command = binary();
    command
        .arg("run")
        .env("DATABASE_URL", &db.url)
        .env("NO_PUBLISHER", "true")
        .env("METRICS_ADDR", format!("127.0.0.1:{}", free_port()))
        .env("RUST_LOG", "info");
    let mut running = Running::spawn(command);
    running
        .wait_for_log("cycle completed", Duration::from_secs(30))
        .await;
    db.exec_sql("ALTER TABLE booking_expiration_outbox RENAME TO booking_expiration_outbox_away")
        .await;
    let booking = NewBooking::new("Reserved")
        .reserve_deadline(wall_now() + chrono::Duration::milliseconds(1_500));
    db.insert(&booking).await;
    // The deadline wake-up runs a cycle just after the deadline; it fails.
    running
        .wait_for_log("cycle failed", Duration::from_secs(20))
        .await;
    // Deliberate fault timing: a second more of failures (the backoff's
    // step grows to 1-2 s), then the table back.
    tokio::time::sleep(Duration::from_secs(1)).await;
    db.exec_sql("ALTER TABLE booking_expiration_outbox_away RENAME TO booking_expiration_outbox")
        .await;
    let fixed = wall_now();
    wait_until("the booking to expire", Duration::from_secs(20), || async {
        db.booking(booking.id).await.expired_at.is_some()
    })
    .await;
    let expired_at = db.booking(booking.id).await.expired_at.expect("expired");
    let after_fix = expired_at - fixed;
    let failures = running.stderr().matches("cycle failed").count();
    eprintln!(
        "FIGURES retry: expired {} ms after the fault ended, {failures} failed cycles before",
        after_fix.num_milliseconds()
    );
    // The bound: the step after about 1.5 s of failures (500 ms, 1 s, 2 s:
    // at most 2 s) plus a cycle; the tick would be 60 s after the start.
    assert!(after_fix < chrono::Duration::seconds(3), "{after_fix:?}");
    assert!(
        (2..=4).contains(&failures),
        "a backoff, not a retry per minimum gap: {failures} failed cycles"
    );
    running.terminate();
    assert_eq!(running.wait(Duration::from_secs(30)).await.code(), Some(0));
    assert_expired_exactly_once(&db, 1).await;
}

/// Invariant: the broker stopped during publishing, then started again —
/// no hung task, rows wait, the worker keeps expiring, everything arrives.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn broker_stopped_and_restarted_loses_nothing() {
    // A broker of its own (stopped on drop).
    let kafka = Kafka::start(&tempdir("kafka-fault"), free_port_pair()).expect("start Kafka");
    let bootstrap = kafka.bootstrap();
    let topic = "pin.crm.booking-expired.v1";
    kafka.create_topic(topic, 3).expect("create the topic");

    let db = TestDb::new().await;
    const FIRST: i64 = 3_000;
    db.seed_due(FIRST as u64, wall_now()).await;
    let addr = format!("127.0.0.1:{}", free_port());
    let mut command = binary();
    command
        .arg("run")
        .env("DATABASE_URL", &db.url)
        .env("KAFKA_BOOTSTRAP_SERVERS", &bootstrap)
        .env("EXPIRATION_INTERVAL", "300ms")
        .env("KAFKA_REQUEST_TIMEOUT", "2s")
        .env("METRICS_ADDR", &addr)
        .env("RUST_LOG", "warn");
    let mut running = Running::spawn(command);
    wait_until(
        "first events published",
        Duration::from_secs(60),
        || async { db.published().await > 0 },
    )
    .await;
    kafka.stop().expect("stop Kafka");
    let down_at = Instant::now();
    // While Kafka is down: more bookings become due and still expire.
    db.seed_due(2_000, wall_now()).await;
    wait_until(
        "worker keeps expiring with Kafka down",
        Duration::from_secs(60),
        || async {
            db.count("SELECT count(*) AS n FROM bookings WHERE version = 2")
                .await
                == FIRST + 2_000
        },
    )
    .await;
    wait_http_status(&addr, "/readyz", 503, Duration::from_secs(30)).await;
    let waiting = db.unpublished().await;
    assert!(waiting > 0, "rows wait in the outbox");
    assert!(running.child.try_wait().unwrap().is_none());
    kafka.start_again().expect("start Kafka again");
    let up_at = Instant::now();
    wait_until(
        "everything published after the broker returned",
        Duration::from_secs(120),
        || async {
            db.count(
                "SELECT count(*) AS n FROM booking_expiration_outbox WHERE published_at IS NULL",
            )
            .await
                == 0
        },
    )
    .await;
    let resumed = up_at.elapsed();
    running.terminate();
    assert_eq!(running.wait(Duration::from_secs(30)).await.code(), Some(0));
    assert_expired_exactly_once(&db, FIRST + 2_000).await;
    // Read back from this test's broker.
    let records = read_topic_from(vec![bootstrap.clone()], topic, 3).await;
    let mut keys = BTreeMap::new();
    for r in &records {
        *keys.entry(r.key.clone()).or_insert(0i64) += 1;
    }
    assert_eq!(keys.len() as i64, FIRST + 2_000, "every booking on Kafka");
    let duplicates: i64 = keys.values().map(|n| n - 1).sum();
    eprintln!(
        "FIGURES broker-restart: down {:?}, rows waiting {waiting}, resumed in {resumed:?}, rows checked {}, duplicates {duplicates}",
        up_at - down_at,
        FIRST + 2_000
    );
}
