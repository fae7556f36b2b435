//! Least privilege, against the test PostgreSQL: crm owns `bookings`; an
//! owner role runs `migrate` (a member of crm's role, for the two indexes
//! on `bookings`); the worker's role holds exactly
//! `deploy/postgres/grants.sql` and runs every command with it. Each grant
//! taken away in turn makes the commands that need it fail at start with
//! one line naming the table and the privilege.

use std::time::Duration;

use booking_expiration::db::privileges::{GRANTS, Use};

use crate::support::*;

const BOOKINGS_SQL: &str =
    include_str!("../../migrations/2026-12-01-000001_create_bookings/up.sql");

/// `url` with another user and password.
fn as_role(url: &str, role: &str, password: &str) -> String {
    let mut url = url::Url::parse(url).expect("a URL");
    url.set_username(role).expect("a user");
    url.set_password(Some(password)).expect("a password");
    url.to_string()
}

/// The grants `role` holds in the test database, as `table PRIVILEGE` or
/// `table PRIVILEGE (columns)`, sorted.
async fn grants_of(db: &TestDb, role: &str) -> Vec<String> {
    db.names(&format!(
        "SELECT c.relname || ' ' || a.privilege_type AS name \
           FROM pg_class c, aclexplode(c.relacl) a WHERE a.grantee = '{role}'::regrole \
         UNION ALL \
         SELECT c.relname || ' ' || x.privilege_type || ' (' \
                || string_agg(att.attname, ', ' ORDER BY att.attnum) || ')' \
           FROM pg_attribute att JOIN pg_class c ON c.oid = att.attrelid, aclexplode(att.attacl) x \
          WHERE x.grantee = '{role}'::regrole GROUP BY c.relname, x.privilege_type"
    ))
    .await
}

/// [`GRANTS`] in the form of [`grants_of`].
fn documented() -> Vec<String> {
    let mut lines: Vec<String> = GRANTS
        .iter()
        .map(|g| match g.columns {
            [] => format!("{} {}", g.table, g.privilege),
            columns => format!("{} {} ({})", g.table, g.privilege, columns.join(", ")),
        })
        .collect();
    lines.sort();
    lines
}

/// Runs the binary; (exit code, stdout, stderr).
fn run(url: &str, args: &[&str], env: &[(&str, String)]) -> (Option<i32>, String, String) {
    let output = binary()
        .args(args)
        .env("DATABASE_URL", url)
        .env("RUST_LOG", "off")
        .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
        .output()
        .expect("run the binary");
    (
        output.status.code(),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_command_runs_with_exactly_the_documented_grants() {
    let roles = TestRoles::create(&[
        ("crm", "NOLOGIN"),
        ("owner", "LOGIN PASSWORD 'owner-pw-7'"),
        ("worker", "LOGIN PASSWORD 'worker-pw-7'"),
    ])
    .await;
    let [crm, owner, worker] = [&roles.names[0], &roles.names[1], &roles.names[2]];
    let db = TestDb::empty().await;
    // crm's table, as crm's deployment has it; the owner role may build
    // indexes on it (a member of crm's role) and create tables.
    db.exec_sql(BOOKINGS_SQL).await;
    for sql in [
        format!("ALTER TABLE bookings OWNER TO {crm}"),
        format!("GRANT {crm} TO {owner}"),
        format!("GRANT CREATE ON SCHEMA public TO {owner}"),
    ] {
        db.exec_sql(&sql).await;
    }
    let owner_url = as_role(&db.url, owner, "owner-pw-7");
    let worker_url = as_role(&db.url, worker, "worker-pw-7");

    let (code, _, stderr) = run(&owner_url, &["migrate"], &[]);
    assert_eq!(code, Some(0), "migrate as the owner role: {stderr}");
    let owners = db
        .count(&format!(
            "SELECT count(*) AS n FROM pg_tables WHERE schemaname = 'public' AND \
             ((tablename = 'bookings' AND tableowner = '{crm}') OR \
              (tablename IN ('booking_expiration_audit', 'booking_expiration_outbox') \
               AND tableowner = '{owner}'))"
        ))
        .await;
    assert_eq!(
        owners, 3,
        "crm keeps bookings; the owner role owns the rest"
    );
    db.grant_worker(&owner_url, worker).await;
    assert_eq!(grants_of(&db, worker).await, documented());

    // Every command with these grants alone. The topic is written on each
    // outbox row: every command that writes one gets it.
    let topic = create_topic(1).await;
    let on_topic = [("KAFKA_TOPIC", topic.clone())];
    let past = wall_now() - chrono::Duration::minutes(5);
    let bookings: Vec<NewBooking> = (0..4)
        .map(|_| NewBooking::new("Reserved").reserve_deadline(past))
        .collect();
    db.insert_all(&bookings).await;
    let (code, stdout, stderr) = run(&worker_url, &["once"], &on_topic);
    assert_eq!(code, Some(0), "once: {stderr}");
    assert!(stdout.contains("\"reserve_expired_count\":4"), "{stdout}");
    for args in [&["status"][..], &["status", "--json"]] {
        let (code, _, stderr) = run(&worker_url, args, &[]);
        assert_eq!(code, Some(0), "{args:?}: {stderr}");
    }
    db.exec_sql(
        "UPDATE booking_expiration_outbox SET parked_at = now(), park_reason = 'TEST' \
         WHERE id = (SELECT min(id) FROM booking_expiration_outbox)",
    )
    .await;
    let (code, stdout, stderr) = run(&worker_url, &["outbox", "retry", "--all-parked"], &[]);
    assert_eq!(
        (code, stdout.trim()),
        (Some(0), r#"{"put_back":1}"#),
        "{stderr}"
    );
    let booking = bookings[0].id.to_string();
    for args in [
        &["republish", "--booking-id", &booking][..],
        &["republish", "--booking-id", &booking, "--dry-run"],
    ] {
        let (code, _, stderr) = run(&worker_url, args, &on_topic);
        assert_eq!(code, Some(0), "{args:?}: {stderr}");
    }
    // run: expire, publish, and delete what was published (retention 0s).
    let more: Vec<NewBooking> = (0..3)
        .map(|_| NewBooking::new("Booked").booking_deadline(past))
        .collect();
    db.insert_all(&more).await;
    let addr = format!("127.0.0.1:{}", free_port());
    let mut command = binary();
    command
        .arg("run")
        .env("DATABASE_URL", &worker_url)
        .env("KAFKA_BOOTSTRAP_SERVERS", kafka_bootstrap().join(","))
        .env("KAFKA_TOPIC", &topic)
        .env("OUTBOX_RETENTION", "0s")
        .env("EXPIRATION_INTERVAL", "1s")
        .env("METRICS_ADDR", &addr)
        .env("RUST_LOG", "warn");
    let mut running = Running::spawn(command);
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let left = db
            .count(
                "SELECT (SELECT count(*) FROM bookings WHERE expired_at IS NULL) \
                      + (SELECT count(*) FROM booking_expiration_outbox) AS n",
            )
            .await;
        if left == 0 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{left} bookings or outbox rows left after 60 s:\n{}",
            running.stderr()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    wait_http_status(&addr, "/readyz", 200, Duration::from_secs(10)).await;
    running.terminate();
    assert_eq!(running.wait(Duration::from_secs(30)).await.code(), Some(0));
    let stderr = running.stderr();
    assert!(!stderr.contains("permission denied"), "{stderr}");
    // Republish found the rows of `once` still waiting, so it added none.
    assert_eq!(read_topic(&topic, 1).await.len(), 4 + 3);

    // Each grant taken away: every command that needs it stops at start
    // with one line naming the table and the privilege.
    let kafka = [
        ("KAFKA_BOOTSTRAP_SERVERS", kafka_bootstrap().join(",")),
        ("KAFKA_TOPIC", topic.clone()),
        ("METRICS_ADDR", format!("127.0.0.1:{}", free_port())),
    ];
    for grant in GRANTS {
        let columns = match grant.columns {
            [] => String::new(),
            columns => format!(" ({})", columns.join(", ")),
        };
        let on = format!("{}{columns} ON {} ", grant.privilege, grant.table);
        testkit::postgres::exec(&owner_url, &format!("REVOKE {on}FROM {worker}"))
            .await
            .expect("revoke");
        for used in grant.needed_by {
            let args: &[&str] = match used {
                Use::Expire => &["once"],
                Use::Publish | Use::Lag => &["run", "--no-worker"],
                Use::Wake => &["run", "--no-publisher"],
                Use::Status => &["status"],
                Use::Unpark => &["outbox", "retry", "--all-parked"],
                Use::Republish => &["republish", "--booking-id", &booking],
            };
            let (code, _, stderr) = run(&worker_url, args, &kafka);
            assert_eq!(code, Some(1), "{args:?} without {on}: {stderr}");
            assert_eq!(stderr.trim_end().lines().count(), 1, "{stderr}");
            let expected = format!(
                "lacks {} on table {}{columns} (the worker's grants: docs/security.md",
                grant.privilege, grant.table
            );
            assert!(stderr.contains(&expected), "{expected:?} in: {stderr}");
            assert!(stderr.contains(&format!("\"{worker}\"")), "{stderr}");
        }
        testkit::postgres::exec(&owner_url, &format!("GRANT {on}TO {worker}"))
            .await
            .expect("grant again");
    }
    assert_eq!(grants_of(&db, worker).await, documented());
}
