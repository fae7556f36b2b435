//! The binary as operators use it (spec §9): commands, the JSON line of
//! `once`, exit codes, configuration errors, graceful stop.

use std::{process::Stdio, time::Duration};

use crate::support::*;

/// `migrate --check` on `db`: exit code and the `pending` list it printed.
fn migrate_check(db: &TestDb) -> (Option<i32>, Vec<String>) {
    let output = binary()
        .args(["migrate", "--check"])
        .env("DATABASE_URL", &db.url)
        .output()
        .unwrap();
    let report: serde_json::Value = serde_json::from_slice(&output.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", stderr_of(&output)));
    let pending = report["pending"]
        .as_array()
        .expect("pending list")
        .iter()
        .map(|v| v.as_str().expect("a version").to_owned())
        .collect();
    (output.status.code(), pending)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrate_check_reports_pending_migrations_without_applying_them() {
    let db = TestDb::empty().await;
    let embedded = std::fs::read_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/migrations"))
        .expect("migrations/")
        .count();
    let (code, pending) = migrate_check(&db);
    assert_eq!(code, Some(3), "pending migrations exit 3");
    assert_eq!(pending.len(), embedded, "{pending:?}");
    assert_eq!(
        db.count(
            "SELECT count(*) AS n FROM information_schema.tables \
             WHERE table_name IN ('bookings', '__diesel_schema_migrations')"
        )
        .await,
        0,
        "--check applies nothing"
    );
    run_ok(&db.url, &["migrate"]);
    assert_eq!(migrate_check(&db), (Some(0), Vec::new()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrate_is_idempotent() {
    let db = TestDb::empty().await;
    for _ in 0..2 {
        run_ok(&db.url, &["migrate"]);
    }
    for table in [
        "bookings",
        "booking_expiration_audit",
        "booking_expiration_outbox",
    ] {
        assert_eq!(
            db.count(&format!(
                "SELECT count(*) AS n FROM information_schema.tables WHERE table_name = '{table}'"
            ))
            .await,
            1
        );
    }
    for index in [
        "ix_bookings_reserve_expires_at",
        "ix_bookings_booking_expires_at",
    ] {
        assert_eq!(
            db.count(&format!(
                "SELECT count(*) AS n FROM pg_indexes WHERE indexname = '{index}'"
            ))
            .await,
            1
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn once_prints_exactly_the_report_line() {
    let db = TestDb::new().await;
    let now = wall_now();
    db.insert_all(&[
        NewBooking::new("Reserved").reserve_deadline(now - chrono::Duration::minutes(1)),
        NewBooking::new("AwaitingPayment").reserve_deadline(now - chrono::Duration::minutes(2)),
        NewBooking::new("Booked").booking_deadline(now - chrono::Duration::minutes(3)),
        NewBooking::new("Booked").booking_deadline(now + chrono::Duration::hours(1)),
    ])
    .await;
    let stdout = run_ok(&db.url, &["once"]);
    assert_eq!(stdout.lines().count(), 1, "one line: {stdout:?}");
    let report: serde_json::Value = serde_json::from_str(stdout.trim()).unwrap();
    let keys: Vec<&str> = report
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    assert_eq!(
        keys,
        [
            "booking_expired_count",
            "duration_ms",
            "reserve_expired_count",
            "skipped_locked_count"
        ]
    );
    assert_eq!(report["reserve_expired_count"], 2);
    assert_eq!(report["booking_expired_count"], 1);
    assert_eq!(report["skipped_locked_count"], 0);
    assert!(report["duration_ms"].is_u64());
    assert!(
        stdout.starts_with("{\"reserve_expired_count\":"),
        "{stdout}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_once_processes_expire_each_booking_exactly_once() {
    let db = TestDb::new().await;
    db.seed_due(10_000, wall_now()).await;
    let spawn = || {
        binary()
            .arg("once")
            .env("DATABASE_URL", &db.url)
            .env("RUST_LOG", "warn")
            .stdout(Stdio::piped())
            .spawn()
            .unwrap()
    };
    let (a, b) = (spawn(), spawn());
    let mut total = 0;
    for child in [a, b] {
        let output = child.wait_with_output().unwrap();
        assert!(output.status.success());
        let report: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
        total += report["reserve_expired_count"].as_u64().unwrap()
            + report["booking_expired_count"].as_u64().unwrap();
    }
    assert_eq!(total, 10_000);
    assert_eq!(
        db.count("SELECT count(*) AS n FROM bookings WHERE version <> 2")
            .await,
        0
    );
    assert_eq!(
        db.count("SELECT count(*) AS n FROM booking_expiration_outbox")
            .await,
        10_000
    );
    assert_eq!(
        db.count("SELECT count(*) AS n FROM booking_expiration_audit")
            .await,
        10_000
    );
}

#[test]
fn bad_configuration_exits_2_with_one_line_naming_the_setting() {
    type Case<'a> = (&'a [&'a str], &'a [(&'a str, &'a str)], &'a str);
    let cases: &[Case] = &[
        (&["once"], &[], "DATABASE_URL"),
        (
            &["once"],
            &[("DATABASE_URL", "mysql://u:hunter2@h/db")],
            "DATABASE_URL",
        ),
        (
            &["once"],
            // No host at all is libpq's default socket (issue 33); an
            // empty one in a list is refused.
            &[("DATABASE_URL", "postgres://u:hunter2@h,/db")],
            "DATABASE_URL",
        ),
        (
            &["once"],
            &[("DATABASE_URL", "not a url hunter2")],
            "DATABASE_URL",
        ),
        (
            &["once"],
            &[
                ("DATABASE_URL", "postgres://u:hunter2@h/db"),
                ("EXPIRATION_BATCH_SIZE", "0"),
            ],
            "EXPIRATION_BATCH_SIZE",
        ),
        (
            &["once"],
            &[
                ("DATABASE_URL", "postgres://u:hunter2@h/db"),
                ("EXPIRATION_BATCH_SIZE", "-3"),
            ],
            "EXPIRATION_BATCH_SIZE",
        ),
        (
            &["once"],
            &[
                ("DATABASE_URL", "postgres://u:hunter2@h/db"),
                ("EXPIRATION_INTERVAL", "soon"),
            ],
            "EXPIRATION_INTERVAL",
        ),
        (
            &["run"],
            &[("DATABASE_URL", "postgres://u:hunter2@h/db")],
            "KAFKA_BOOTSTRAP_SERVERS",
        ),
        (
            &["run"],
            &[
                ("DATABASE_URL", "postgres://u:hunter2@h/db"),
                ("KAFKA_BOOTSTRAP_SERVERS", "localhost"),
            ],
            "KAFKA_BOOTSTRAP_SERVERS",
        ),
        (
            &["run"],
            &[
                ("DATABASE_URL", "postgres://u:hunter2@h/db"),
                ("KAFKA_BOOTSTRAP_SERVERS", "127.0.0.1:9092"),
                ("METRICS_ADDR", "everywhere"),
            ],
            "METRICS_ADDR",
        ),
        (
            &["run"],
            &[
                ("DATABASE_URL", "postgres://u:hunter2@h/db"),
                ("KAFKA_BOOTSTRAP_SERVERS", "127.0.0.1:9092"),
                ("KAFKA_SASL_MECHANISM", "PLAIN"),
                ("KAFKA_SASL_PASSWORD", "hunter2"),
            ],
            "KAFKA_SASL_USERNAME",
        ),
        (&["migrate"], &[("DATABASE_URL", "")], "DATABASE_URL"),
        // A reversed or empty window selects nothing: bad input, not a
        // replay of nothing that exits 0.
        (
            &[
                "republish",
                "--expired-from",
                "2026-12-02T00:00:00Z",
                "--expired-to",
                "2026-12-01T00:00:00Z",
            ],
            &[("DATABASE_URL", "postgres://u:hunter2@h/db")],
            "--expired-from",
        ),
        (
            &[
                "republish",
                "--tenant",
                "6f0c51f2-3a6e-4c39-9a53-7d9e1f2a0b11",
                "--expired-from",
                "2026-12-01T00:00:00Z",
                "--expired-to",
                "2026-12-01T00:00:00Z",
            ],
            &[("DATABASE_URL", "postgres://u:hunter2@h/db")],
            "--expired-to",
        ),
    ];
    for (args, env, setting) in cases {
        let mut command = binary();
        command.args(*args);
        for (name, value) in *env {
            command.env(name, value);
        }
        let output = command.output().unwrap();
        let stderr = stderr_of(&output);
        assert_eq!(output.status.code(), Some(2), "{args:?} {env:?}: {stderr}");
        assert_eq!(stderr.trim().lines().count(), 1, "one line: {stderr}");
        assert!(stderr.contains(setting), "names {setting}: {stderr}");
        assert!(!stderr.contains("hunter2"), "no password: {stderr}");
        assert!(!stderr.contains("panicked"), "{stderr}");
        assert!(output.stdout.is_empty());
    }
}

/// Issue 33's defects, through the binary: a huge clock skew (a panic in
/// chrono's addition), a statement timeout past PostgreSQL's int
/// milliseconds once doubled, a minimum gap of 0 (a cycle every 5 ms). Each
/// value outside its range is one line, exit 2, naming the setting and the
/// range, before anything connects.
#[test]
fn a_value_outside_its_range_exits_2_naming_the_setting_and_the_range() {
    let cases = [
        ("once", "EXPIRATION_MAX_CLOCK_SKEW", "10000000d", "0s to 1h"),
        ("once", "DATABASE_STATEMENT_TIMEOUT", "12d 12h", "1s to 12d"),
        ("once", "EXPIRATION_MIN_GAP", "0", "50ms to 60s"),
        (
            "once",
            "EXPIRATION_BATCH_SIZE",
            "18446744073709551616",
            "1 to 100000",
        ),
        ("run", "OUTBOX_RETENTION", "-1s", "0s to 365d"),
        ("run", "KAFKA_REQUEST_TIMEOUT", "soon", "100ms to 10m"),
    ];
    for (command, setting, value, range) in cases {
        let output = binary()
            .arg(command)
            .env("DATABASE_URL", "postgres://u:hunter2@127.0.0.1:1/db")
            .env("KAFKA_BOOTSTRAP_SERVERS", "127.0.0.1:9092")
            .env(setting, value)
            .output()
            .unwrap();
        let stderr = stderr_of(&output);
        assert_eq!(output.status.code(), Some(2), "{setting}={value}: {stderr}");
        assert_eq!(stderr.trim().lines().count(), 1, "one line: {stderr}");
        assert!(
            stderr.contains(&format!("{setting}: must be")) && stderr.contains(range),
            "{setting}={value}: {stderr}"
        );
        assert!(!stderr.contains("panicked"), "{stderr}");
    }
}

/// `once` with every setting it takes at the bottom, then at the top of its
/// range: each starts and completes its cycle. At the top the session
/// limits are 12 days and 24 days (PostgreSQL's int milliseconds hold
/// them); at the bottom the connect timeout stays at 1 s, as a connection
/// on a test machine busy with the parallel suite may take longer than its
/// 100 ms floor (the floor is parsed by the unit tests).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn once_starts_with_every_setting_at_either_bound() {
    let db = TestDb::new().await;
    let bounds: [&[(&str, &str)]; 2] = [
        &[
            ("DATABASE_POOL_SIZE", "1"),
            ("DATABASE_CONNECT_TIMEOUT", "1s"),
            ("DATABASE_STATEMENT_TIMEOUT", "1s"),
            ("EXPIRATION_INTERVAL", "100ms"),
            ("EXPIRATION_BATCH_SIZE", "1"),
            ("EXPIRATION_MAX_BATCHES_PER_CYCLE", "1"),
            ("EXPIRATION_CYCLE_BUDGET", "100ms"),
            ("EXPIRATION_MAX_CLOCK_SKEW", "0s"),
            ("EXPIRATION_MIN_GAP", "50ms"),
            ("SHUTDOWN_GRACE", "0s"),
        ],
        &[
            ("DATABASE_POOL_SIZE", "1000"),
            ("DATABASE_CONNECT_TIMEOUT", "10m"),
            ("DATABASE_STATEMENT_TIMEOUT", "12d"),
            ("EXPIRATION_INTERVAL", "1h"),
            ("EXPIRATION_BATCH_SIZE", "100000"),
            ("EXPIRATION_MAX_BATCHES_PER_CYCLE", "1000000"),
            ("EXPIRATION_CYCLE_BUDGET", "1h"),
            ("EXPIRATION_MAX_CLOCK_SKEW", "1h"),
            ("EXPIRATION_MIN_GAP", "60s"),
            ("SHUTDOWN_GRACE", "10m"),
        ],
    ];
    for settings in bounds {
        db.insert(
            &NewBooking::new("Booked").booking_deadline(wall_now() - chrono::Duration::minutes(1)),
        )
        .await;
        let mut command = binary();
        command.arg("once").env("DATABASE_URL", &db.url);
        for (name, value) in settings {
            command.env(name, value);
        }
        let output = command.output().unwrap();
        let stderr = stderr_of(&output);
        assert_eq!(output.status.code(), Some(0), "{settings:?}: {stderr}");
        let report: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
        assert_eq!(report["booking_expired_count"], 1, "{settings:?}");
    }
}

/// `run` with every setting at the top of its range starts, expires and
/// publishes, serves its endpoints and stops on SIGTERM with exit 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_starts_with_every_setting_at_the_top_of_its_range() {
    let db = TestDb::new().await;
    db.seed_due(50, wall_now()).await;
    let topic = create_topic(3).await;
    let addr = format!("127.0.0.1:{}", free_port());
    let mut command = run_on(&db, &topic, &addr);
    for (name, value) in [
        ("DATABASE_POOL_SIZE", "1000"),
        ("DATABASE_CONNECT_TIMEOUT", "10m"),
        ("DATABASE_STATEMENT_TIMEOUT", "12d"),
        ("EXPIRATION_INTERVAL", "1h"),
        ("EXPIRATION_BATCH_SIZE", "100000"),
        ("EXPIRATION_MAX_BATCHES_PER_CYCLE", "1000000"),
        ("EXPIRATION_CYCLE_BUDGET", "1h"),
        ("EXPIRATION_MAX_CLOCK_SKEW", "1h"),
        ("EXPIRATION_MIN_GAP", "60s"),
        ("SHUTDOWN_GRACE", "10m"),
        ("LIVENESS_WINDOW", "24h"),
        ("OUTBOX_BATCH_SIZE", "10000"),
        ("OUTBOX_POLL_INTERVAL", "10m"),
        ("OUTBOX_RETENTION", "365d"),
        ("KAFKA_REQUEST_TIMEOUT", "10m"),
        ("KAFKA_TOPIC_PARTITIONS", "10000"),
        ("KAFKA_REPLICATION_FACTOR", "32"),
    ] {
        command.env(name, value);
    }
    let mut running = Running::spawn(command);
    wait_until("every event on Kafka", Duration::from_secs(60), || async {
        db.published().await == 50
    })
    .await;
    assert_eq!(http_get(&addr, "/healthz").await.map(|(s, _)| s), Some(200));
    running.terminate();
    let status = running.wait(Duration::from_secs(30)).await;
    let stderr = running.stderr();
    assert_eq!(status.code(), Some(0), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
}

/// A publish transaction sits idle while Kafka takes its batch, for up to
/// one KAFKA_REQUEST_TIMEOUT; the server ends it after twice
/// DATABASE_STATEMENT_TIMEOUT. Settings that leave the produce no room
/// are refused at start, before anything connects.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_password_and_unreachable_database_fail_clearly() {
    let mut url = url::Url::parse(&admin_url()).unwrap();
    url.set_password(Some("definitely-wrong-pw")).unwrap();
    let output = binary()
        .arg("once")
        .env("DATABASE_URL", url.as_str())
        .output()
        .unwrap();
    let stderr = stderr_of(&output);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("password authentication failed"),
        "{stderr}"
    );
    assert!(!stderr.contains("definitely-wrong-pw"), "{stderr}");

    let dead = format!("postgres://u:hunter2@127.0.0.1:{}/db", free_port());
    let started = std::time::Instant::now();
    let output = binary()
        .arg("once")
        .env("DATABASE_URL", &dead)
        .output()
        .unwrap();
    let stderr = stderr_of(&output);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("cannot connect to PostgreSQL"), "{stderr}");
    assert!(!stderr.contains("hunter2"), "{stderr}");
    assert!(started.elapsed() < Duration::from_secs(10));
}

/// An instance that only publishes (`NO_WORKER`) has no expiry to hand it
/// rows: at SIGTERM its publisher does not wait `SHUTDOWN_GRACE` (10 s at
/// the default) for one, it stops as soon as its last round is done.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_publisher_only_instance_stops_without_waiting_out_the_grace() {
    let db = TestDb::new().await;
    let topic = create_topic(3).await;
    let addr = format!("127.0.0.1:{}", free_port());
    let mut command = run_on(&db, &topic, &addr);
    command.env("NO_WORKER", "true");
    let mut running = Running::spawn(command);
    wait_http_status(&addr, "/readyz", 200, Duration::from_secs(30)).await;
    let stop = std::time::Instant::now();
    running.terminate();
    let status = running.wait(Duration::from_secs(30)).await;
    let took = stop.elapsed();
    assert_eq!(status.code(), Some(0), "graceful stop exits 0");
    assert!(
        took < Duration::from_secs(5),
        "stopped {took:?} after SIGTERM (SHUTDOWN_GRACE is 10 s)"
    );
}

/// Invariant: an instance that only expires (`NO_PUBLISHER=true`) still
/// reports the outbox lag: with no publisher anywhere, the rows it wrote
/// show in `outbox_unpublished` and the oldest one's age grows, so the lag
/// alerts fire (docs/runbooks/outbox-backlog.md).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expiry_only_instance_reports_the_outbox_lag() {
    const DUE: u64 = 40;
    let db = TestDb::new().await;
    db.seed_due(DUE, wall_now()).await;
    let topic = create_topic(3).await;
    let addr = format!("127.0.0.1:{}", free_port());
    let mut command = run_on(&db, &topic, &addr);
    command.env("NO_PUBLISHER", "true");
    let mut running = Running::spawn(command);
    let unpublished = "crm_booking_expiration_outbox_unpublished";
    let age = "crm_booking_expiration_outbox_oldest_unpublished_age_seconds";
    // The first count runs at start, the next ones 5 s apart.
    wait_until(
        "the lag gauges to show the rows",
        Duration::from_secs(30),
        || async {
            metric(&addr, unpublished).await == DUE as f64 && metric(&addr, age).await >= 1.0
        },
    )
    .await;
    assert_eq!(db.published().await, 0, "no instance publishes");
    running.terminate();
    assert_eq!(running.wait(Duration::from_secs(30)).await.code(), Some(0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_serves_endpoints_and_stops_gracefully_on_sigterm() {
    let db = TestDb::new().await;
    db.seed_due(500, wall_now()).await;
    let topic = create_topic(3).await;
    let addr = format!("127.0.0.1:{}", free_port());
    let mut command = run_on(&db, &topic, &addr);
    command
        .env("EXPIRATION_INTERVAL", "1s")
        .env("LOG_FORMAT", "json");
    let mut running = Running::spawn(command);
    wait_until("every event on Kafka", Duration::from_secs(60), || async {
        db.published().await == 500
    })
    .await;
    let (status, metrics) = http_get(&addr, "/metrics").await.expect("metrics served");
    assert_eq!(status, 200);
    for line in [
        "crm_booking_expiration_items_total{phase=\"reserve\"}",
        "crm_booking_expiration_items_total{phase=\"booking\"}",
        "crm_booking_expiration_cycle_duration_seconds_count",
        "crm_booking_expiration_backlog",
        "crm_booking_expiration_skip_locked_total",
        "crm_booking_expiration_errors_total",
    ] {
        assert!(metrics.contains(line), "{line} missing:\n{metrics}");
    }
    let expired: u64 = metrics
        .lines()
        .filter(|l| l.starts_with("crm_booking_expiration_items_total{"))
        .map(|l| l.rsplit(' ').next().unwrap().parse::<u64>().unwrap())
        .sum();
    assert_eq!(expired, 500, "items_total moved");
    assert_eq!(http_get(&addr, "/healthz").await.unwrap().0, 200);
    wait_http_status(&addr, "/readyz", 200, Duration::from_secs(10)).await;
    assert_eq!(read_topic(&topic, 3).await.len(), 500);

    running.terminate();
    let status = running.wait(Duration::from_secs(30)).await;
    assert_eq!(status.code(), Some(0), "graceful stop exits 0");
    let stderr = running.stderr();
    let lines: Vec<serde_json::Value> = stderr
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect();
    let message = |m: &'static str| lines.iter().filter(move |l| l["fields"]["message"] == m);
    let expired_line = message("booking expired")
        .next()
        .expect("booking expired logged");
    for field in ["booking_id", "deal_id", "phase", "tenant_id"] {
        assert!(
            expired_line["fields"][field].is_string(),
            "{field} in {expired_line}"
        );
    }
    assert!(
        expired_line["span"]["run_id"].is_string(),
        "run id on the cycle span"
    );
    let completed = message("cycle completed")
        .next()
        .expect("cycle completed logged");
    for field in [
        "reserve_expired_count",
        "booking_expired_count",
        "skipped_locked",
        "duration_ms",
    ] {
        assert!(
            completed["fields"][field].is_number(),
            "{field} in {completed}"
        );
    }
    assert!(message("cycle started").next().is_some());
    assert!(message("batch selected").next().is_some());
    assert!(message("stopped").next().is_some());
    let password = url::Url::parse(&db.url)
        .unwrap()
        .password()
        .unwrap()
        .to_owned();
    assert!(!stderr.contains(&password), "no secret in logs");
}

/// A reader that goes away before the result is written (`status | head`
/// that stopped early) is not a failure of the command: exit 0, no panic.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_closed_stdout_is_not_a_failure() {
    let db = TestDb::new().await;
    let mut child = binary()
        .arg("status")
        .env("DATABASE_URL", &db.url)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Close the read end before the command (still connecting) writes.
    drop(child.stdout.take());
    let output = child.wait_with_output().unwrap();
    let stderr = stderr_of(&output);
    assert_eq!(output.status.code(), Some(0), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
}
