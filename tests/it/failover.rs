//! Failover: a primary with a synchronous streaming standby (both started
//! here with `scripts/postgres.sh`), the `run` binary on a two-host
//! `DATABASE_URL` with `target_session_attrs=read-write`, the primary
//! killed (SIGKILL) mid-run and the standby promoted. The worker must move
//! to the new primary by itself, expire no booking twice and lose no
//! committed event.

use std::{
    collections::BTreeMap,
    time::{Duration, Instant},
};

use booking_expiration::db;
use diesel::{QueryableByName, sql_types::Text};
use diesel_async::{AsyncConnection, AsyncPgConnection, RunQueryDsl};
use testkit::postgres::Postgres;

use crate::support::*;

const BOOKINGS: i64 = 3_000;

async fn count(url: &str, sql: &str) -> Option<i64> {
    let mut conn = AsyncPgConnection::establish(url).await.ok()?;
    testkit::postgres::count(&mut conn, sql).await.ok()
}

#[derive(QueryableByName)]
struct OutboxEvent {
    #[diesel(sql_type = Text)]
    message_key: String,
    #[diesel(sql_type = Text)]
    event_id: String,
}

/// Invariant: with synchronous replication, a primary killed mid-run and
/// its standby promoted, the same worker process carries on against the
/// new primary; every booking is expired exactly once there, and every
/// expiry's event reaches Kafka, duplicates only with the same `ce_id`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_worker_follows_a_promoted_standby_and_loses_nothing() {
    let primary = Postgres::start(
        &tempdir("pg-primary"),
        free_port(),
        &["-c", "fsync=off", "-c", "wal_sender_timeout=5s"],
    )
    .expect("start the primary");
    let primary_url = testkit::postgres::create_database(&primary.admin_url, "failover")
        .await
        .expect("create the database");
    let settings = database_settings(&primary_url);
    db::migrate::run_migrations(&settings)
        .await
        .expect("migrations apply");
    // Deadlines from a few seconds before the worker starts to 15 s after:
    // expiries keep committing while the primary dies.
    let mut conn = AsyncPgConnection::establish(&primary_url).await.unwrap();
    db::seed::seed(
        &mut conn,
        &db::seed::SeedPlan {
            active: BOOKINGS as u64,
            due_fraction: 0.1,
            inactive: 0,
            poison: 0,
            as_of: wall_now() + chrono::Duration::seconds(3),
            spread: Duration::from_secs(15),
        },
    )
    .await
    .expect("seed");
    drop(conn);

    let standby = primary
        .start_standby(&tempdir("pg-standby"), free_port())
        .expect("start the standby");
    primary
        .require_sync_standby()
        .expect("synchronous replication");
    let standby_url = testkit::postgres::url_of(&standby.admin_url, "failover").unwrap();
    let password = url::Url::parse(&primary.admin_url)
        .unwrap()
        .password()
        .unwrap()
        .to_owned();
    let both = format!(
        "postgres://postgres:{password}@127.0.0.1:{},127.0.0.1:{}/failover?target_session_attrs=read-write",
        primary.port(),
        standby.port()
    );
    let topic = create_topic(3).await;
    let mut command = binary();
    command
        .arg("run")
        .env("DATABASE_URL", &both)
        .env("DATABASE_CONNECT_TIMEOUT", "2s")
        .env("KAFKA_BOOTSTRAP_SERVERS", kafka_bootstrap().join(","))
        .env("KAFKA_TOPIC", &topic)
        .env("EXPIRATION_INTERVAL", "500ms")
        .env("EXPIRATION_BATCH_SIZE", "100")
        .env("OUTBOX_POLL_INTERVAL", "500ms")
        .env("METRICS_ADDR", format!("127.0.0.1:{}", free_port()));
    let mut running = Running::spawn(command);

    let expired_sql = "SELECT count(*) AS n FROM bookings WHERE version > 1";
    wait_until(
        "a third of the bookings expired on the primary",
        Duration::from_secs(60),
        || async { count(&primary_url, expired_sql).await.unwrap_or(0) >= BOOKINGS / 3 },
    )
    .await;

    primary.kill().expect("SIGKILL the primary");
    let killed = Instant::now();
    // Deliberate fault timing: a failover manager takes a moment to decide.
    tokio::time::sleep(Duration::from_secs(1)).await;
    standby.promote().expect("promote the standby");
    let promoted = killed.elapsed();
    let at_promotion = count(&standby_url, expired_sql)
        .await
        .expect("the new primary answers");
    wait_until(
        "the worker expiring on the new primary",
        Duration::from_secs(30),
        || async { count(&standby_url, expired_sql).await.unwrap_or(0) > at_promotion },
    )
    .await;
    let resumed = killed.elapsed();
    wait_until(
        "every booking expired and published on the new primary",
        Duration::from_secs(90),
        || async {
            count(
                &standby_url,
                "SELECT count(*) AS n FROM booking_expiration_outbox WHERE published_at IS NOT NULL",
            )
            .await
            .unwrap_or(0)
                == BOOKINGS
        },
    )
    .await;
    let drained = killed.elapsed();
    running.terminate();
    let status = running.wait(Duration::from_secs(30)).await;
    let stderr = running.stderr();
    assert_eq!(status.code(), Some(0), "{stderr}");

    // The database: each booking expired exactly once on the new primary.
    let on_new = |sql: &'static str| {
        let url = standby_url.clone();
        async move { count(&url, sql).await.expect(sql) }
    };
    assert_eq!(on_new(expired_sql).await, BOOKINGS);
    assert_eq!(
        on_new("SELECT count(*) AS n FROM bookings WHERE version > 2").await,
        0,
        "no booking expired twice"
    );
    assert_eq!(
        on_new("SELECT count(*) AS n FROM booking_expiration_audit").await,
        BOOKINGS
    );
    assert_eq!(
        on_new("SELECT count(DISTINCT booking_id) AS n FROM booking_expiration_audit").await,
        BOOKINGS
    );

    // Kafka: every committed event, under the event id the new primary has.
    let mut conn = AsyncPgConnection::establish(&standby_url).await.unwrap();
    let outbox: BTreeMap<String, String> = diesel::sql_query(
        "SELECT message_key, event_id::text AS event_id FROM booking_expiration_outbox",
    )
    .load::<OutboxEvent>(&mut conn)
    .await
    .unwrap()
    .into_iter()
    .map(|row| (row.message_key, row.event_id))
    .collect();
    assert_eq!(outbox.len(), BOOKINGS as usize);
    let records = read_topic(&topic, 3).await;
    let mut on_kafka: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for record in &records {
        let ce_id = record.header("ce_id").expect("ce_id");
        on_kafka.entry(record.key.clone()).or_default().push(ce_id);
    }
    assert_eq!(on_kafka.len(), BOOKINGS as usize, "every booking on Kafka");
    for (key, ce_ids) in &on_kafka {
        let expected = outbox.get(key).expect("a Kafka key the outbox has");
        assert!(
            ce_ids.iter().all(|id| id == expected),
            "{key}: {ce_ids:?} vs {expected}: duplicates only with the same ce_id"
        );
    }
    let duplicates = records.len() - on_kafka.len();
    // What an operator sees in the log meanwhile.
    let errors: Vec<&str> = stderr
        .lines()
        .filter(|line| line.contains(" ERROR ") || line.contains(" WARN "))
        .collect();
    for line in errors.iter().take(8) {
        eprintln!("  log: {line}");
    }
    eprintln!(
        "FIGURES failover: {BOOKINGS} bookings; promoted {promoted:?} after the kill; \
         first expiry on the new primary {resumed:?} after the kill; all published {drained:?} \
         after the kill; duplicates on Kafka {duplicates} (same ce_id); {} ERROR/WARN log lines",
        errors.len()
    );
}

#[derive(QueryableByName)]
struct ServerPort {
    #[diesel(sql_type = diesel::sql_types::Integer)]
    port: i32,
}

async fn server_port(pool: &db::PgPool) -> i32 {
    let mut conn = pool.get().await.expect("a pooled connection");
    diesel::sql_query("SELECT inet_server_port() AS port")
        .get_result::<ServerPort>(&mut *conn)
        .await
        .expect("server port")
        .port
}

/// Invariant: with `target_session_attrs=read-write`, a pooled connection
/// whose server stops taking writes without dropping its sessions (fenced
/// read-only, as some failover managers do to the old primary) is
/// discarded at the next checkout, and the new one goes to the writable
/// host.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pooled_connections_leave_a_server_that_turned_read_only() {
    let first = Postgres::start(&tempdir("pg-fenced"), free_port(), &["-c", "fsync=off"])
        .expect("start a server");
    let name = format!("be_test_{}", uuid::Uuid::new_v4().simple());
    testkit::postgres::create_database(&first.admin_url, &name)
        .await
        .unwrap();
    testkit::postgres::create_database(&admin_url(), &name)
        .await
        .unwrap();
    // One password for both hosts, as for the nodes of one cluster.
    let shared = url::Url::parse(&admin_url()).unwrap();
    let password = shared.password().unwrap().to_owned();
    let second_port = shared.port().unwrap();
    testkit::postgres::exec(
        &first.admin_url,
        &format!("ALTER ROLE postgres PASSWORD '{password}'"),
    )
    .await
    .unwrap();
    let both = format!(
        "postgres://postgres:{password}@127.0.0.1:{},127.0.0.1:{second_port}/{name}?target_session_attrs=read-write",
        first.port()
    );
    let settings = booking_expiration::config::DatabaseSettings {
        pool_size: 1,
        ..database_settings(&both)
    };
    let pool = db::build_pool(&settings);
    assert_eq!(server_port(&pool).await, i32::from(first.port()));

    let first_admin = format!(
        "postgres://postgres:{password}@127.0.0.1:{}/postgres",
        first.port()
    );
    for sql in [
        "ALTER SYSTEM SET default_transaction_read_only = on",
        "SELECT pg_reload_conf()",
    ] {
        testkit::postgres::exec(&first_admin, sql).await.unwrap();
    }
    wait_until(
        "the pool on the writable host",
        Duration::from_secs(10),
        || async { server_port(&pool).await == i32::from(second_port) },
    )
    .await;
    drop(pool);
    testkit::postgres::drop_database(&admin_url(), &name)
        .await
        .unwrap();
}
