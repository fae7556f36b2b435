//! `republish` against the real PostgreSQL and Kafka: the replayed events
//! equal the originals record by record as read back from the broker (trace
//! context aside), selected by booking ids, tenant or `expired_at` window;
//! a dry run changes nothing; a replay beside the running worker and
//! publisher changes no booking.

use std::{
    collections::{BTreeMap, BTreeSet},
    time::Duration,
};

use crate::support::*;
use booking_expiration::{clock::SystemClock, outbox::KafkaTransport};
use chrono::{DateTime, Utc};
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

const PARTITIONS: i32 = 3;

/// A record without its trace context, for comparing replays with originals.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Record {
    key: String,
    value: Vec<u8>,
    headers: BTreeMap<String, Vec<u8>>,
}

fn untraced(record: &ConsumedRecord) -> Record {
    Record {
        key: record.key.clone(),
        value: record.value.clone(),
        headers: record
            .headers
            .iter()
            .filter(|(name, _)| !booking_expiration::events::is_trace_header(name))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect(),
    }
}

fn ce_id(record: &ConsumedRecord) -> Uuid {
    record
        .header("ce_id")
        .and_then(|id| id.parse().ok())
        .expect("ce_id")
}

fn trace_id(record: &ConsumedRecord) -> String {
    let traceparent = record.header("traceparent").expect("traceparent header");
    traceparent.split('-').nth(1).expect("trace id").to_owned()
}

fn publisher(db: &TestDb, topic: &str) -> Rig<KafkaTransport> {
    let settings = publisher_settings(100);
    let timing = timing_for(&settings, Duration::from_secs(35));
    Rig::new(
        db.pool.clone(),
        KafkaTransport::new(kafka_settings(kafka_bootstrap())),
        &settings,
        timing,
        topic,
    )
}

async fn publish_all(publisher: &Rig<KafkaTransport>) {
    publisher.publish_until_idle(Duration::from_secs(60)).await;
}

/// md5 of every booking column of every row, in id order.
async fn bookings_checksum(db: &TestDb) -> String {
    #[derive(diesel::QueryableByName)]
    struct Sum {
        #[diesel(sql_type = diesel::sql_types::Text)]
        sum: String,
    }
    use diesel_async::RunQueryDsl;
    let mut conn = db.conn().await;
    let row: Sum = diesel::sql_query(
        "SELECT coalesce(md5(string_agg(b::text, '|' ORDER BY b.id)), '') AS sum FROM bookings b",
    )
    .get_result(&mut conn)
    .await
    .expect("checksum");
    row.sum
}

/// Runs `republish` with `args`; returns (stdout lines, stderr lines).
fn republish(db: &TestDb, topic: &str, args: &[&str]) -> (Vec<String>, Vec<String>) {
    let output = binary()
        .arg("republish")
        .args(args)
        .env("DATABASE_URL", &db.url)
        .env("KAFKA_TOPIC", topic)
        .env("RUST_LOG", "warn")
        .output()
        .expect("run republish");
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    assert!(output.status.success(), "republish {args:?}: {stderr}");
    let lines = |text: &str| text.lines().map(str::to_owned).collect::<Vec<_>>();
    (
        lines(&String::from_utf8_lossy(&output.stdout)),
        lines(&stderr),
    )
}

fn json(line: &str) -> serde_json::Value {
    serde_json::from_str(line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}"))
}

/// Two tenants, bookings of both phases, expired by two cycles an hour
/// apart; the originals published and read back.
struct Fixture {
    db: TestDb,
    topic: String,
    tenants: [Uuid; 2],
    first_cycle: DateTime<Utc>,
    first: BTreeSet<Uuid>,
    originals: BTreeMap<Uuid, ConsumedRecord>,
    by_booking: BTreeMap<String, Uuid>,
}

async fn fixture() -> Fixture {
    let db = TestDb::new().await;
    let topic = create_topic(PARTITIONS).await;
    let tenants = [Uuid::new_v4(), Uuid::new_v4()];
    let first_cycle = t0();
    let second_cycle = t0() + chrono::Duration::hours(1);
    let mut bookings = Vec::new();
    for i in 0..12i64 {
        let tenant = tenants[(i % 2) as usize];
        let deadline = first_cycle - chrono::Duration::minutes(i + 1);
        let late = second_cycle - chrono::Duration::minutes(i + 1);
        let mut reserve = NewBooking::new("Reserved").reserve_deadline(deadline);
        let mut booked = NewBooking::new("Booked")
            .reserve_deadline(deadline - chrono::Duration::days(1))
            .booking_deadline(late);
        reserve.tenant_id = tenant;
        booked.tenant_id = tenant;
        reserve.version = 1 + i;
        bookings.push(reserve);
        bookings.push(booked);
    }
    db.insert_all(&bookings).await;
    let first: BTreeSet<Uuid> = bookings
        .iter()
        .filter(|b| b.status == "Reserved")
        .map(|b| b.id)
        .collect();
    for as_of in [first_cycle, second_cycle] {
        let clock = booking_expiration::clock::ManualClock::new(as_of);
        db.worker_for(&clock, expiry_settings(5), events_on(&topic))
            .run_cycle(&CancellationToken::new())
            .await
            .expect("cycle");
    }
    publish_all(&publisher(&db, &topic)).await;
    let records = read_topic(&topic, PARTITIONS).await;
    assert_eq!(records.len(), bookings.len());
    let originals: BTreeMap<Uuid, ConsumedRecord> =
        records.into_iter().map(|r| (ce_id(&r), r)).collect();
    let by_booking = originals
        .values()
        .map(|r| (r.key.clone(), ce_id(r)))
        .collect();
    Fixture {
        db,
        topic,
        tenants,
        first_cycle,
        first,
        originals,
        by_booking,
    }
}

impl Fixture {
    /// Publishes what a replay enqueued and returns the records new on the
    /// topic (neither original nor in `seen`, which it extends), each
    /// checked equal to its original.
    async fn replayed(&self, seen: &mut BTreeSet<(i32, i64)>) -> Vec<ConsumedRecord> {
        publish_all(&publisher(&self.db, &self.topic)).await;
        let all = read_topic(&self.topic, PARTITIONS).await;
        let original_offsets: BTreeSet<(i32, i64)> = self
            .originals
            .values()
            .map(|r| (r.partition, r.offset))
            .collect();
        let new: Vec<ConsumedRecord> = all
            .into_iter()
            .filter(|r| {
                let at = (r.partition, r.offset);
                !original_offsets.contains(&at) && seen.insert(at)
            })
            .collect();
        for record in &new {
            let original = &self.originals[&ce_id(record)];
            assert_eq!(
                untraced(record),
                untraced(original),
                "the replay of {} equals the original",
                record.key
            );
            assert_eq!(
                record.partition, original.partition,
                "same key, same partition"
            );
            assert_ne!(
                trace_id(record),
                trace_id(original),
                "the replay carries its own trace"
            );
        }
        new
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replayed_events_equal_the_originals_by_ids_tenant_and_window() {
    let f = fixture().await;
    let checksum = bookings_checksum(&f.db).await;
    let audit =
        f.db.count("SELECT count(*) AS n FROM booking_expiration_audit")
            .await;

    // By booking ids.
    let picked: Vec<String> = f.by_booking.keys().take(3).cloned().collect();
    let mut args = Vec::new();
    for id in &picked {
        args.extend(["--booking-id", id.as_str()]);
    }
    let (stdout, _) = republish(&f.db, &f.topic, &args);
    let summary = json(stdout.last().expect("summary"));
    assert_eq!(summary["enqueued"], 3, "{summary}");
    assert_eq!(summary["complete"], true);
    let mut seen = BTreeSet::new();
    let replayed = f.replayed(&mut seen).await;
    let keys: BTreeSet<String> = replayed.iter().map(|r| r.key.clone()).collect();
    assert_eq!(keys, picked.iter().cloned().collect());

    // By tenant.
    let tenant = f.tenants[0].to_string();
    let (stdout, _) = republish(&f.db, &f.topic, &["--tenant", &tenant]);
    assert_eq!(json(stdout.last().unwrap())["enqueued"], 12);
    let replayed = f.replayed(&mut seen).await;
    assert_eq!(replayed.len(), 12);
    assert!(
        replayed
            .iter()
            .all(|r| r.header("tenant_id").as_deref() == Some(tenant.as_str()))
    );

    // By window: the first cycle only, in batches of 5 with progress, and
    // a stopped run resumed from the cursor with the same replay id.
    let from = (f.first_cycle - chrono::Duration::seconds(1)).to_rfc3339();
    let to = (f.first_cycle + chrono::Duration::seconds(1)).to_rfc3339();
    let window = ["--expired-from", from.as_str(), "--expired-to", to.as_str()];
    let replay_id = Uuid::new_v4().to_string();
    let (stdout, stderr) = republish(
        &f.db,
        &f.topic,
        &[
            &window[..],
            &["--batch-size", "5", "--replay-id", &replay_id],
        ]
        .concat(),
    );
    let progress: Vec<serde_json::Value> = stderr
        .iter()
        .filter(|l| l.starts_with('{'))
        .map(|l| json(l))
        .collect();
    assert_eq!(progress.len(), 3, "12 records in batches of 5: {stderr:?}");
    assert!(
        progress
            .windows(2)
            .all(|w| w[0]["after"].as_i64() < w[1]["after"].as_i64())
    );
    assert_eq!(json(stdout.last().unwrap())["enqueued"], 12);
    // The same replay again before publishing: every row is still pending.
    let (stdout, _) = republish(
        &f.db,
        &f.topic,
        &[&window[..], &["--replay-id", &replay_id]].concat(),
    );
    let again = json(stdout.last().unwrap());
    assert_eq!(
        (
            again["enqueued"].as_u64(),
            again["skipped_pending"].as_u64()
        ),
        (Some(0), Some(12))
    );
    // Resuming after the first progress cursor enqueues nothing new either.
    let after = progress[0]["after"].to_string();
    let (stdout, _) = republish(
        &f.db,
        &f.topic,
        &[&window[..], &["--replay-id", &replay_id, "--after", &after]].concat(),
    );
    assert_eq!(json(stdout.last().unwrap())["selected"], 7);
    let replayed = f.replayed(&mut seen).await;
    let keys: BTreeSet<Uuid> = replayed.iter().map(|r| r.key.parse().unwrap()).collect();
    assert_eq!(
        keys, f.first,
        "exactly the first cycle's bookings, once each"
    );

    assert_eq!(
        bookings_checksum(&f.db).await,
        checksum,
        "no booking changed"
    );
    assert_eq!(
        f.db.count("SELECT count(*) AS n FROM booking_expiration_audit")
            .await,
        audit
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dry_run_changes_nothing_and_a_stopped_replay_resumes() {
    let f = fixture().await;
    let checksum = bookings_checksum(&f.db).await;
    let outbox = "SELECT count(*) AS n FROM booking_expiration_outbox";
    let rows = f.db.count(outbox).await;
    let tenant = f.tenants[1].to_string();
    let (stdout, stderr) = republish(
        &f.db,
        &f.topic,
        &["--tenant", &tenant, "--dry-run", "--batch-size", "4"],
    );
    assert_eq!(stdout.len(), 12, "one line per event: {stderr:?}");
    for line in &stdout {
        let event = json(line);
        let id: Uuid = event["event_id"].as_str().unwrap().parse().unwrap();
        let original = untraced(&f.originals[&id]);
        assert_eq!(event["key"], original.key.as_str());
        assert_eq!(event["topic"], f.topic.as_str());
        let value: String = original.value.iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(event["value_hex"], value.as_str());
        let headers: BTreeMap<String, Vec<u8>> = event["headers"]
            .as_object()
            .unwrap()
            .iter()
            .filter(|(k, _)| !booking_expiration::events::is_trace_header(k))
            .map(|(k, v)| (k.clone(), v.as_str().unwrap().as_bytes().to_vec()))
            .collect();
        assert_eq!(headers, original.headers);
        assert!(event["headers"]["traceparent"].is_string());
    }
    let summary = json(stderr.iter().rev().find(|l| l.starts_with('{')).unwrap());
    assert_eq!(summary["dry_run"], true);
    assert_eq!(summary["enqueued"], 12);
    assert_eq!(f.db.count(outbox).await, rows, "no outbox row written");
    assert_eq!(bookings_checksum(&f.db).await, checksum);

    // Stopped after its first batch (as by SIGTERM), then resumed from the
    // cursor with the same replay id: every event queued exactly once.
    let stop = CancellationToken::new();
    let mut request = booking_expiration::app::RepublishRequest {
        selection: booking_expiration::db::replay::Selection {
            tenant_ids: vec![f.tenants[1]],
            ..Default::default()
        },
        dry_run: false,
        batch_size: 5,
        after: 0,
        replay_id: None,
    };
    let events = events_on(&f.topic);
    let stopped = booking_expiration::app::republish(
        &f.db.settings,
        &events,
        &request,
        &SystemClock,
        stop.clone(),
        |_| {},
        |_| stop.cancel(),
    )
    .await
    .unwrap();
    assert!(!stopped.complete);
    assert_eq!((stopped.batches, stopped.enqueued), (1, 5));
    request.after = stopped.after;
    request.replay_id = Some(stopped.replay_id);
    let resumed = booking_expiration::app::republish(
        &f.db.settings,
        &events,
        &request,
        &SystemClock,
        CancellationToken::new(),
        |_| {},
        |_| {},
    )
    .await
    .unwrap();
    assert!(resumed.complete);
    assert_eq!(resumed.enqueued, 7);
    assert_eq!(
        f.db.count(&format!(
            "SELECT count(DISTINCT event_id) AS n FROM booking_expiration_outbox \
             WHERE replay_id = '{}'",
            stopped.replay_id
        ))
        .await,
        12
    );
    assert_eq!(bookings_checksum(&f.db).await, checksum);

    // Nothing selected is an error, not a replay of everything.
    let output = binary()
        .arg("republish")
        .env("DATABASE_URL", &f.db.url)
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replay_beside_the_running_worker_and_publisher_changes_nothing_else() {
    let f = fixture().await;
    // Active bookings the running worker looks at but must leave alone.
    let later = wall_now() + chrono::Duration::hours(2);
    let waiting: Vec<NewBooking> = (0..20)
        .map(|_| NewBooking::new("Reserved").reserve_deadline(later))
        .collect();
    f.db.insert_all(&waiting).await;
    let checksum = bookings_checksum(&f.db).await;
    let audit =
        f.db.count("SELECT count(*) AS n FROM booking_expiration_audit")
            .await;

    let addr = format!("127.0.0.1:{}", free_port());
    let mut worker = binary();
    worker
        .arg("run")
        .env("DATABASE_URL", &f.db.url)
        .env("KAFKA_BOOTSTRAP_SERVERS", kafka_bootstrap().join(","))
        .env("KAFKA_TOPIC", &f.topic)
        .env("EXPIRATION_INTERVAL", "200ms")
        .env("EXPIRATION_MAX_CLOCK_SKEW", "off")
        .env("METRICS_ADDR", &addr);
    let mut running = Running::spawn(worker);
    wait_http_status(&addr, "/readyz", 200, Duration::from_secs(30)).await;

    let tenant = f.tenants[0].to_string();
    let (stdout, _) = republish(&f.db, &f.topic, &["--tenant", &tenant, "--batch-size", "3"]);
    assert_eq!(json(stdout.last().unwrap())["enqueued"], 12);
    wait_until("the replay published", Duration::from_secs(60), || async {
        f.db.count(
            "SELECT count(*) AS n FROM booking_expiration_outbox \
             WHERE replay_id IS NOT NULL AND published_at IS NULL",
        )
        .await
            == 0
    })
    .await;
    running.terminate();
    assert_eq!(running.wait(Duration::from_secs(30)).await.code(), Some(0));

    let all = read_topic(&f.topic, PARTITIONS).await;
    assert_eq!(
        all.len(),
        f.originals.len() + 12,
        "only the replay was added"
    );
    let mut replays = 0;
    for record in &all {
        let original = &f.originals[&ce_id(record)];
        if (record.partition, record.offset) != (original.partition, original.offset) {
            assert_eq!(untraced(record), untraced(original));
            replays += 1;
        }
    }
    assert_eq!(replays, 12);
    assert_eq!(
        bookings_checksum(&f.db).await,
        checksum,
        "no booking row touched"
    );
    assert_eq!(
        f.db.count("SELECT count(*) AS n FROM booking_expiration_audit")
            .await,
        audit
    );
}

/// `n` bookings of `tenant` expired at `at` by one cycle, with their audit
/// records as the worker writes them (version, deal, property object and
/// `ce_source` in the record), written straight in SQL: a large audit trail
/// in a moment.
async fn expired_in_sql(db: &TestDb, tenant: Uuid, n: u32, at: DateTime<Utc>) {
    db.exec_sql(&format!(
        "WITH b AS (
             INSERT INTO bookings (id, tenant_id, deal_id, property_object_id, status,
                                   reserve_expires_at, expired_at, version)
             SELECT gen_random_uuid(), '{tenant}', gen_random_uuid(), gen_random_uuid(),
                    'ReserveExpired', '{at}'::timestamptz - interval '1 minute', '{at}', 2
               FROM generate_series(1, {n})
             RETURNING id, tenant_id, deal_id, property_object_id, expired_at)
         INSERT INTO booking_expiration_audit
                (booking_id, tenant_id, from_status, to_status, actor, correlation_id, at,
                 version, deal_id, property_object_id, ce_source)
         SELECT id, tenant_id, 'Reserved', 'ReserveExpired', 'system', gen_random_uuid(),
                expired_at, 2, deal_id, property_object_id, '/pin/crm/booking-expiration'
           FROM b",
        at = at.to_rfc3339()
    ))
    .await;
}

/// The audit ids of the events a dry run printed on stdout.
fn printed_audit_ids(stdout: &[u8]) -> Vec<i64> {
    String::from_utf8_lossy(stdout)
        .lines()
        .map(|line| json(line)["audit_id"].as_i64().expect("audit_id"))
        .collect()
}

/// A replay stopped by SIGTERM prints, as its last line, the whole command
/// that resumes it (selection, batch size, dry run, replay id, cursor), and
/// that command, run as printed, does the rest: every selected record once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_replay_prints_the_whole_command_that_resumes_it() {
    let db = TestDb::new().await;
    let (tenant, other) = (Uuid::new_v4(), Uuid::new_v4());
    // 4,000 records in the window for the tenant, one batch each: the run
    // takes seconds, and the signal reaches it after its first batch.
    expired_in_sql(&db, tenant, 4_000, t0()).await;
    expired_in_sql(&db, other, 50, t0()).await;
    expired_in_sql(&db, tenant, 50, t0() + chrono::Duration::days(1)).await;
    let selection = [
        "--tenant",
        &tenant.to_string(),
        "--expired-from",
        "2027-03-01T11:00:00Z",
        "--expired-to",
        "2027-03-01T13:00:00Z",
    ]
    .map(str::to_owned);
    let mut command = binary();
    command
        .arg("republish")
        .args(&selection)
        .args(["--batch-size", "1", "--dry-run"])
        .env("DATABASE_URL", &db.url)
        .env("RUST_LOG", "warn")
        .stdout(std::process::Stdio::piped());
    let mut running = Running::spawn(command);
    // Drained as it comes: a full pipe would stop the replay mid-write.
    let mut pipe = running.child.stdout.take().expect("stdout pipe");
    let reader = std::thread::spawn(move || {
        let mut out = Vec::new();
        std::io::Read::read_to_end(&mut pipe, &mut out).map(|_| out)
    });
    running
        .wait_for_log("{\"replay_id\"", Duration::from_secs(30))
        .await;
    running.terminate();
    let status = running.wait(Duration::from_secs(30)).await;
    let stderr = running.stderr();
    assert_eq!(status.code(), Some(1), "{stderr}");
    let stdout = reader.join().expect("reader").expect("read stdout");
    let first = printed_audit_ids(&stdout);
    let last = stderr.lines().last().expect("a last line");
    let (_, resume) = last
        .split_once("resume with ")
        .unwrap_or_else(|| panic!("no resume command: {last}"));
    let words: Vec<&str> = resume.split_whitespace().collect();
    assert_eq!(&words[..2], ["booking-expiration", "republish"], "{resume}");
    for pair in selection.chunks(2) {
        assert!(
            resume.contains(&format!("{} {}", pair[0], pair[1])),
            "{pair:?} in {resume}"
        );
    }
    let summary = json(stderr.lines().rev().find(|l| l.starts_with('{')).unwrap());
    assert!(resume.contains(&format!(
        "--replay-id {}",
        summary["replay_id"].as_str().unwrap()
    )));
    assert!(
        resume.contains(&format!("--after {}", summary["after"])),
        "{resume}"
    );
    assert!(resume.contains("--batch-size 1") && resume.contains("--dry-run"));
    assert!(
        !first.is_empty() && first.len() < 4_000,
        "stopped part-way: {} printed",
        first.len()
    );

    // The printed command, run as it is.
    let resumed = binary()
        .args(&words[1..])
        .env("DATABASE_URL", &db.url)
        .env("RUST_LOG", "warn")
        .output()
        .expect("run the resume command");
    assert!(
        resumed.status.success(),
        "{}",
        String::from_utf8_lossy(&resumed.stderr)
    );
    let mut all = first;
    all.extend(printed_audit_ids(&resumed.stdout));
    let distinct: BTreeSet<i64> = all.iter().copied().collect();
    assert_eq!(all.len(), 4_000, "every selected record once");
    assert_eq!(distinct.len(), 4_000);
}

/// Buffers the top node of an `EXPLAIN (ANALYZE, BUFFERS)` touched (hit or
/// read): the pages the statement read, whatever the machine's load.
fn buffers(plan: &[PlanLine]) -> u64 {
    let line = plan
        .iter()
        .map(|p| p.line.trim_start())
        .find(|l| l.starts_with("Buffers:"))
        .unwrap_or_else(|| panic!("no Buffers line:\n{}", plan_text(plan)));
    let count = |key: &str| -> u64 {
        line.split_whitespace()
            .find_map(|w| w.strip_prefix(key))
            .map_or(0, |n| n.parse().expect("a number"))
    };
    count("hit=") + count("read=")
}

fn plan_text(plan: &[PlanLine]) -> String {
    plan.iter()
        .map(|p| p.line.as_str())
        .collect::<Vec<_>>()
        .join("\n")
}

#[derive(diesel::QueryableByName)]
struct PlanLine {
    #[diesel(sql_type = diesel::sql_types::Text, column_name = "QUERY PLAN")]
    line: String,
}

/// Over a large audit trail (300,000 records, 60 tenants, one every 5 s
/// over 17 days), a page of a tenant, window or tenant-and-window
/// selection reads pages in proportion to the page, wherever the cursor
/// is, not the trail: a few hundred buffers where the trail has thousands
/// of pages (before the replay indexes, every page was a full scan and a
/// sort). The window's bounds are read once, in proportion to the window.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replay_page_reads_about_what_it_returns_however_long_the_trail() {
    use booking_expiration::db::replay::{self, IdBounds, Selection};
    use diesel::sql_types::{Array, BigInt, Nullable, Timestamptz, Uuid as SqlUuid};
    use diesel_async::{RunQueryDsl, SimpleAsyncConnection};

    const RECORDS: i64 = 300_000;
    const PAGE: i64 = 100;
    let db = TestDb::new().await;
    let tenants: Vec<Uuid> = (0..60).map(|_| Uuid::new_v4()).collect();
    let list: Vec<String> = tenants.iter().map(|t| format!("'{t}'")).collect();
    let start = t0() - chrono::Duration::days(17);
    db.exec_sql(&format!(
        "INSERT INTO booking_expiration_audit
                (booking_id, tenant_id, from_status, to_status, actor, correlation_id, at,
                 version, deal_id, property_object_id, ce_source)
         SELECT gen_random_uuid(), (ARRAY[{}]::uuid[])[1 + i % 60], 'Reserved', 'ReserveExpired',
                'system', gen_random_uuid(), '{}'::timestamptz + i * interval '5 s', 2,
                gen_random_uuid(), gen_random_uuid(), '/pin/crm/booking-expiration'
           FROM generate_series(1, {RECORDS}) AS i",
        list.join(", "),
        start.to_rfc3339()
    ))
    .await;
    let mut conn = db.conn().await;
    conn.batch_execute("VACUUM ANALYZE booking_expiration_audit")
        .await
        .expect("vacuum");
    let table_pages = db
        .count(
            "SELECT relpages::bigint AS n FROM pg_class WHERE relname = 'booking_expiration_audit'",
        )
        .await as u64;
    // One tenant (5,000 records), a 6-hour window (4,320), and one tenant
    // within a 2-day window (576).
    let window = (
        start + chrono::Duration::days(9),
        start + chrono::Duration::days(9) + chrono::Duration::hours(6),
    );
    let selections = [
        (
            "tenant",
            Selection {
                tenant_ids: vec![tenants[7]],
                ..Selection::default()
            },
        ),
        (
            "window",
            Selection {
                expired_from: Some(window.0),
                expired_to: Some(window.1),
                ..Selection::default()
            },
        ),
        (
            "tenant in a window",
            Selection {
                tenant_ids: vec![tenants[7], tenants[7]],
                expired_from: Some(window.0),
                expired_to: Some(window.0 + chrono::Duration::days(2)),
                ..Selection::default()
            },
        ),
    ];
    // What `replay::page` and `id_bounds` do in their transaction (`SET
    // LOCAL`), for the whole session here.
    conn.batch_execute("SET enable_seqscan = off; SET enable_bitmapscan = off")
        .await
        .expect("set");
    for (name, selection) in selections {
        let bounds: IdBounds = replay::id_bounds(&mut conn, &selection)
            .await
            .expect("bounds")
            .expect("records in the window");
        // Pages at the start, in the middle and at the end of the selection.
        let all = replay::page(&mut conn, &selection, &bounds, 0, 100_000)
            .await
            .expect("whole selection");
        assert!(all.len() > 3 * PAGE as usize, "{name}: {}", all.len());
        assert!(all.windows(2).all(|w| w[0].audit_id < w[1].audit_id));
        for after in [
            0,
            all[all.len() / 2].audit_id,
            all[all.len() - PAGE as usize / 2].audit_id,
        ] {
            let explain = diesel::sql_query(format!(
                "EXPLAIN (ANALYZE, BUFFERS) {}",
                selection.page_sql(&bounds)
            ))
            .bind::<BigInt, _>(after)
            .bind::<Array<SqlUuid>, _>(selection.booking_ids.clone())
            .bind::<Array<SqlUuid>, _>(selection.distinct_tenants())
            .bind::<Nullable<Timestamptz>, _>(selection.expired_from)
            .bind::<Nullable<Timestamptz>, _>(selection.expired_to)
            .bind::<BigInt, _>(PAGE)
            .bind::<Nullable<BigInt>, _>(bounds.first)
            .bind::<Nullable<BigInt>, _>(bounds.last);
            let plan: Vec<PlanLine> = explain.load(&mut conn).await.expect("explain");
            let read = buffers(&plan);
            eprintln!(
                "{name}, page after {after}: {read} buffers (the trail: {table_pages} pages)"
            );
            // `SHOW_PLANS=1 bash scripts/test.sh --test it replay::a_replay_page
            // -- --nocapture` prints every plan, not only a failing one.
            if std::env::var_os("SHOW_PLANS").is_some() {
                eprintln!("{}", plan_text(&plan));
            }
            assert!(
                read <= 6 * PAGE as u64,
                "{name}: a page of {PAGE} read {read} buffers (the trail has {table_pages} pages):\n{}",
                plan_text(&plan)
            );
        }
        // The bounds, read once per replay, cost about the window's index
        // entries (a tenant in a window: the window's, not the tenant's).
        let (Some(from), Some(to)) = (selection.expired_from, selection.expired_to) else {
            continue;
        };
        let explain = diesel::sql_query(format!(
            "EXPLAIN (ANALYZE, BUFFERS) {}",
            replay::ID_BOUNDS_SQL
        ))
        .bind::<Nullable<Timestamptz>, _>(from)
        .bind::<Nullable<Timestamptz>, _>(to);
        let plan: Vec<PlanLine> = explain.load(&mut conn).await.expect("explain");
        let read = buffers(&plan);
        let window_records = (to - from).num_seconds() as u64 / 5;
        eprintln!("{name}, bounds: {read} buffers for a window of {window_records} records");
        // About one index page per 200 entries and, where the visibility
        // map is not yet set (another test's snapshot holds VACUUM back),
        // one heap page per ~47 records: a twentieth of the window's records
        // at most, and far below a scan of the trail.
        let budget = window_records / 20 + 50;
        assert!(
            budget < table_pages / 3,
            "{name}: the window is too large to tell a scan apart"
        );
        assert!(
            read <= budget,
            "{name}: the bounds read {read} buffers (budget {budget}, the trail: {table_pages} pages):\n{}",
            plan_text(&plan)
        );
    }
    assert!(
        table_pages > 3_000,
        "the trail is large: {table_pages} pages"
    );
}

/// Two audit records of one booking written before records kept their
/// version both take the booking's version, so they name one event: the
/// replay writes it once and counts the second as not enqueued, instead of
/// failing its batch on the event's unique record.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_audit_records_of_one_event_enqueue_it_once() {
    let db = TestDb::new().await;
    let tenant = Uuid::new_v4();
    db.exec_sql(&format!(
        "WITH b AS (
             INSERT INTO bookings (id, tenant_id, deal_id, property_object_id, status,
                                   reserve_expires_at, expired_at, version)
             VALUES (gen_random_uuid(), '{tenant}', gen_random_uuid(), gen_random_uuid(),
                     'ReserveExpired', '{at}'::timestamptz - interval '1 minute', '{at}', 3)
             RETURNING id, tenant_id, expired_at)
         INSERT INTO booking_expiration_audit
                (booking_id, tenant_id, from_status, to_status, actor, correlation_id, at)
         SELECT id, tenant_id, 'Reserved', 'ReserveExpired', 'system', gen_random_uuid(),
                expired_at - make_interval(secs => g)
           FROM b, generate_series(0, 1) AS g",
        at = t0().to_rfc3339()
    ))
    .await;
    let (stdout, _) = republish(&db, "replay-dup", &["--tenant", &tenant.to_string()]);
    let report = json(stdout.last().expect("the report"));
    assert_eq!(
        (
            report["selected"].as_u64(),
            report["enqueued"].as_u64(),
            report["skipped_pending"].as_u64()
        ),
        (Some(2), Some(1), Some(1)),
        "{report}"
    );
    assert_eq!(
        db.count("SELECT count(*) AS n FROM booking_expiration_outbox")
            .await,
        1
    );
    assert_eq!(db.event_records().await, (1, 1));
}
