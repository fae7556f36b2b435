//! The schema and its edges against a real PostgreSQL: the migration's
//! partial indexes state the repository's predicates, down migrations
//! leave crm's table alone (live-table migration: live_migration.rs), and a
//! batch is all or nothing under shutdown and failed writes (with the
//! domain-event subscriber's contract).

use std::{
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use crate::support::{NewBooking, TestDb, clock, expiry_settings, t0, wait_until};
use booking_expiration::context::TaskContext;
use booking_expiration::{
    config::{EventSettings, ShutdownSettings},
    db::{
        self,
        bookings::{self, BookingRow},
        migrate::MIGRATIONS,
    },
    domain::{BookingExpired, DomainEventSubscriber, Phase},
    expiry::{CycleError, ExpiryWorker},
};
use diesel::{
    QueryableByName,
    sql_types::{BigInt, Text},
};
use diesel_async::{
    AsyncConnection, AsyncMigrationHarness, AsyncPgConnection, RunQueryDsl, SimpleAsyncConnection,
};
use diesel_migrations::MigrationHarness;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

#[derive(QueryableByName)]
struct IndexDef {
    #[diesel(sql_type = Text)]
    indexdef: String,
}

/// `pg_indexes.indexdef` of a public index, if it exists.
async fn indexdef(conn: &mut AsyncPgConnection, name: &str) -> Option<String> {
    let rows: Vec<IndexDef> = diesel::sql_query(
        "SELECT indexdef FROM pg_indexes WHERE schemaname = 'public' AND indexname = $1",
    )
    .bind::<Text, _>(name)
    .load(conn)
    .await
    .expect("read pg_indexes");
    rows.into_iter().next().map(|row| row.indexdef)
}

/// The repository's partial index of `phase` as PostgreSQL renders it: the
/// same deadline column and `WHERE`, created under a probe name in a
/// transaction that is rolled back. PostgreSQL's own rendering is the
/// normal form, so `status IN ('Reserved', 'AwaitingPayment')` and
/// `(status = ANY (ARRAY['Reserved'::text, 'AwaitingPayment'::text]))`
/// compare equal and nothing is parsed by hand.
async fn repository_indexdef(conn: &mut AsyncPgConnection, phase: Phase) -> String {
    const PROBE: &str = "ix_schema_test_probe";
    let create = format!(
        "CREATE INDEX {PROBE} ON bookings ({}) WHERE {}",
        bookings::deadline_column(phase),
        bookings::index_predicate(phase)
    );
    conn.begin_test_transaction().await.expect("begin");
    diesel::sql_query(create)
        .execute(conn)
        .await
        .expect("the repository's predicate is valid index SQL");
    let rendered = indexdef(conn, PROBE).await.expect("probe index exists");
    rendered.replacen(
        &format!("INDEX {PROBE} ON"),
        &format!("INDEX {} ON", bookings::partial_index(phase)),
        1,
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migration_index_predicates_are_the_repository_predicates() {
    let db = TestDb::new().await;
    for phase in Phase::ALL {
        let mut conn = db.conn().await;
        let migrated = indexdef(&mut conn, bookings::partial_index(phase))
            .await
            .unwrap_or_else(|| panic!("{} exists", bookings::partial_index(phase)));
        // A fresh connection: the probe's test transaction is never committed.
        let mut probe_conn = db.conn().await;
        let repository = repository_indexdef(&mut probe_conn, phase).await;
        assert_eq!(
            migrated, repository,
            "{phase}: the migration's partial index and the repository's predicate differ"
        );
        assert!(
            migrated.contains(" WHERE "),
            "{phase}: not partial: {migrated}"
        );
    }
}

#[derive(QueryableByName)]
struct N {
    #[diesel(sql_type = BigInt)]
    n: i64,
}

async fn count(conn: &mut AsyncPgConnection, sql: &str) -> i64 {
    let row: N = diesel::sql_query(sql)
        .get_result(conn)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"));
    row.n
}

/// Whether a relation (table, index) or function of this worker exists.
async fn exists(db: &TestDb, what: &str) -> bool {
    db.count(&format!(
        "SELECT (to_regclass('public.{what}') IS NOT NULL \
            OR to_regproc('public.{what}') IS NOT NULL)::int::int8 AS n"
    ))
    .await
        == 1
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn down_migrations_remove_only_what_the_worker_owns() {
    let db = TestDb::new().await;
    let booking = NewBooking::new("Reserved").reserve_deadline(t0());
    db.insert(&booking).await;
    // An index of crm's own on its table.
    db.exec_sql("CREATE INDEX crm_bookings_tenant ON bookings (tenant_id)")
        .await;
    let columns_sql = "SELECT count(*) AS n FROM information_schema.columns \
                        WHERE table_schema = 'public' AND table_name = 'bookings'";
    let columns = db.count(columns_sql).await;

    let mut harness = AsyncMigrationHarness::new(db.conn().await);
    let reverted: Vec<String> = harness
        .revert_all_migrations(MIGRATIONS)
        .expect("every migration reverts")
        .iter()
        .map(ToString::to_string)
        .collect();
    drop(harness);
    assert_eq!(reverted.len(), migration_count(), "{reverted:?}");

    // crm's table and its row are untouched.
    assert!(exists(&db, "bookings").await, "the bookings table is gone");
    let stored: BookingRow = db.booking(booking.id).await;
    assert_eq!(stored.status, "Reserved");
    assert_eq!(stored.reserve_expires_at, Some(t0()));
    assert!(
        exists(&db, "crm_bookings_tenant").await,
        "crm's index is gone"
    );
    assert_eq!(
        db.count(columns_sql).await,
        columns,
        "crm's columns changed"
    );
    // Everything the worker owns is gone.
    for owned in [
        bookings::partial_index(Phase::Reserve),
        bookings::partial_index(Phase::Booking),
        "booking_expiration_audit",
        "booking_expiration_outbox",
        "booking_expiration_outbox_notify",
        "booking_expiration_outbox_lag",
        "booking_expiration_outbox_event",
        "booking_expiration_topic_layout",
        "booking_expiration_waker",
    ] {
        assert!(!exists(&db, owned).await, "{owned} is left after revert");
    }

    // And the schema comes back over the kept table.
    let applied = db::migrate::run_migrations(&db.settings)
        .await
        .expect("migrations apply again");
    assert_eq!(applied.len(), migration_count(), "{applied:?}");
    assert!(exists(&db, bookings::partial_index(Phase::Reserve)).await);
    assert_eq!(db.booking(booking.id).await, stored);
}

/// How many migrations the binary embeds (one folder each under migrations/).
fn migration_count() -> usize {
    std::fs::read_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/migrations"))
        .expect("migrations/")
        .filter(|entry| entry.as_ref().is_ok_and(|e| e.path().is_dir()))
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_still_running_when_the_shutdown_grace_ends_rolls_back() {
    let db = TestDb::new().await;
    db.seed_due(10, t0()).await;
    let grace = Duration::from_millis(500);
    let clock = clock();
    let worker = Arc::new(ExpiryWorker::new(
        &TaskContext::new(db.pool.clone(), Arc::new(clock.clone())),
        expiry_settings(100),
        EventSettings::default(),
        ShutdownSettings { grace },
    ));

    // Blocks the batch's write. The pool's sessions wait for a lock up to
    // their lock_timeout (the statement timeout, 30 s in tests), far past
    // the grace, so only the grace can end the batch.
    let holder = db.lock_outbox().await;

    let token = CancellationToken::new();
    let cycle = {
        let worker = Arc::clone(&worker);
        let token = token.clone();
        tokio::spawn(async move { worker.run_cycle(&token).await })
    };
    wait_until(
        "the batch to wait on the outbox lock",
        Duration::from_secs(10),
        || async { db.worker_sessions("wait_event_type = 'Lock'").await == 1 },
    )
    .await;

    let cancelled_at = Instant::now();
    token.cancel();
    let result = tokio::time::timeout(grace + Duration::from_secs(3), cycle)
        .await
        .expect("the cycle ends within the grace plus a margin")
        .expect("task");
    let took = cancelled_at.elapsed();
    assert!(matches!(result, Err(CycleError::Cancelled)), "{result:?}");
    assert!(took >= grace, "ended before the grace ran out ({took:?})");

    // Let the abandoned statement go on: the server finds the client gone
    // and rolls the transaction back.
    drop(holder);
    wait_until(
        "the abandoned batch's transaction to end",
        Duration::from_secs(10),
        || async { db.worker_sessions("xact_start IS NOT NULL").await == 0 },
    )
    .await;
    let mut conn = db.conn().await;
    assert_eq!(
        count(
            &mut conn,
            "SELECT count(*) AS n FROM bookings WHERE expired_at IS NULL AND version = 1 \
               AND status IN ('Reserved', 'AwaitingPayment', 'Booked')"
        )
        .await,
        10,
        "every booking is still active"
    );
    for table in ["booking_expiration_audit", "booking_expiration_outbox"] {
        assert_eq!(
            count(&mut conn, &format!("SELECT count(*) AS n FROM {table}")).await,
            0,
            "{table} has rows of the rolled-back batch"
        );
    }
}

/// Records each call: one entry per call, the booking ids in event order.
#[derive(Default)]
struct Recorder {
    calls: Mutex<Vec<Vec<Uuid>>>,
}

impl DomainEventSubscriber for Recorder {
    fn on_booking_expired(&self, events: &[BookingExpired]) {
        self.calls
            .lock()
            .unwrap()
            .push(events.iter().map(|e| e.booking_id.as_uuid()).collect());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn subscribers_get_each_committed_batch_and_never_a_rolled_back_one() {
    let db = TestDb::new().await;
    let hours = |h: i64| t0() - chrono::Duration::hours(h);
    // Oldest deadline first: batches of two are [a, b] then [c, d].
    let [a, b, c, d] = [4, 3, 2, 1].map(|h| NewBooking::new("Reserved").reserve_deadline(hours(h)));
    db.insert_all(&[c.clone(), a.clone(), d.clone(), b.clone()])
        .await;
    // The second batch's write fails inside the database: its outbox row
    // for `d` is refused, so the whole statement and transaction fail.
    db.exec_sql(&format!(
        "CREATE FUNCTION refuse_outbox_row() RETURNS trigger LANGUAGE plpgsql AS $$
         BEGIN
             IF NEW.message_key = '{}' THEN
                 RAISE EXCEPTION 'test: outbox row refused';
             END IF;
             RETURN NEW;
         END $$",
        d.id
    ))
    .await;
    db.exec_sql(
        "CREATE TRIGGER refuse_outbox_row BEFORE INSERT ON booking_expiration_outbox \
         FOR EACH ROW EXECUTE FUNCTION refuse_outbox_row()",
    )
    .await;

    let recorder = Arc::new(Recorder::default());
    let clock = clock();
    let worker = db.worker(&clock, 2).subscribe(recorder.clone());
    let error = worker
        .run_cycle(&CancellationToken::new())
        .await
        .expect_err("the second batch fails");
    assert!(
        matches!(
            error,
            CycleError::Database {
                phase: Phase::Reserve,
                ..
            }
        ),
        "{error}"
    );
    assert_eq!(
        *recorder.calls.lock().unwrap(),
        [vec![a.id, b.id]],
        "one call, for the committed batch only, with exactly its events"
    );
    for id in [c.id, d.id] {
        let row = db.booking(id).await;
        assert_eq!((row.status.as_str(), row.version), ("Reserved", 1));
    }
    assert_eq!(
        db.count("SELECT count(*) AS n FROM booking_expiration_audit")
            .await,
        2
    );

    // With the fault gone the rolled-back rows expire and are delivered.
    db.exec_sql("DROP TRIGGER refuse_outbox_row ON booking_expiration_outbox")
        .await;
    worker
        .run_cycle(&CancellationToken::new())
        .await
        .expect("the retry commits");
    assert_eq!(
        *recorder.calls.lock().unwrap(),
        [vec![a.id, b.id], vec![c.id, d.id]]
    );
}

/// Sorted names from a one-column (`name`) query.
async fn names(db: &TestDb, sql: &str) -> Vec<String> {
    db.names(sql).await
}

const WORKER_INDEXES: &str = "SELECT indexname AS name FROM pg_indexes \
     WHERE schemaname = 'public' \
       AND tablename IN ('booking_expiration_audit', 'booking_expiration_outbox', \
                         'booking_expiration_outbox_event')";
const HEADERS_TYPE: &str = "SELECT data_type AS name FROM information_schema.columns \
     WHERE table_name = 'booking_expiration_outbox' AND column_name = 'headers'";

/// Every index an expiry's insert pays for is one a query needs (the
/// `lean_outbox` migration and the replay's audit index migrations say
/// which query); a new one must be added here on purpose.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_worker_tables_carry_only_the_indexes_their_queries_use() {
    let db = TestDb::new().await;
    assert_eq!(
        names(&db, WORKER_INDEXES).await,
        [
            "booking_expiration_outbox_pkey",
            "ix_booking_expiration_audit_at_id",
            "ix_booking_expiration_audit_booking_id",
            "ix_booking_expiration_audit_id",
            "ix_booking_expiration_audit_tenant_id_id",
            "ix_booking_expiration_outbox_claim",
            "ix_booking_expiration_outbox_parked",
            "ix_booking_expiration_outbox_published_at",
            "ux_booking_expiration_outbox_event",
        ]
    );
    assert_eq!(names(&db, HEADERS_TYPE).await, ["json"]);
    // The audit rows of a booking are found by its index.
    let mut conn = db.conn().await;
    conn.begin_test_transaction().await.expect("begin");
    diesel::sql_query("SET LOCAL enable_seqscan = off")
        .execute(&mut conn)
        .await
        .expect("set");
    #[derive(QueryableByName)]
    struct Plan {
        #[diesel(sql_type = Text, column_name = "QUERY PLAN")]
        line: String,
    }
    let plan: Vec<Plan> = diesel::sql_query(
        "EXPLAIN SELECT * FROM booking_expiration_audit \
          WHERE booking_id = '00000000-0000-4000-8000-000000000001'",
    )
    .load(&mut conn)
    .await
    .expect("explain");
    let plan: Vec<String> = plan.into_iter().map(|p| p.line).collect();
    assert!(
        plan.iter()
            .any(|l| l.contains("ix_booking_expiration_audit_booking_id")),
        "{}",
        plan.join("\n")
    );
}

/// The `lean_outbox` migration's down runs over a republished event (two
/// rows of one event id, the second a replay's), keeps both rows, and its up
/// applies again over the restored schema.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_lean_outbox_migration_reverts_over_a_republished_event() {
    let db = TestDb::new().await;
    // The original, published; its republished copy, published too.
    db.exec_sql(&earlier_release_row("NULL", "now()")).await;
    db.exec_sql(&earlier_release_row("gen_random_uuid()", "now()"))
        .await;
    let mut harness = AsyncMigrationHarness::new(db.conn().await);
    // Diesel names a migration by its version, the folder name's digits.
    // The replay's audit indexes, the outbox leases, their owner, the claim
    // by partition, the waker, the shared lag count and the event records
    // came after the lean_outbox migration.
    for expected in [
        "20261208000001",
        "20261207000001",
        "20261206000004",
        "20261206000003",
        "20261206000002",
        "20261206000001",
        "20261205000003",
        "20261205000002",
        "20261205000001",
        "20261204000004",
    ] {
        let reverted = harness
            .revert_last_migration(MIGRATIONS)
            .expect("the down migration runs")
            .to_string();
        assert_eq!(reverted, expected);
    }
    drop(harness);
    assert_eq!(
        db.count("SELECT count(*) AS n FROM booking_expiration_outbox")
            .await,
        2
    );
    assert_eq!(names(&db, HEADERS_TYPE).await, ["jsonb"]);
    let indexes = names(&db, WORKER_INDEXES).await;
    for restored in [
        "booking_expiration_audit_pkey",
        "ux_booking_expiration_outbox_event_id_replay_id",
    ] {
        assert!(indexes.iter().any(|i| i == restored), "{indexes:?}");
    }
    let applied = db::migrate::run_migrations(&db.settings)
        .await
        .expect("the migration applies again");
    assert_eq!(applied.len(), 10, "{applied:?}");
    assert_eq!(names(&db, HEADERS_TYPE).await, ["json"]);
}

/// An outbox row as the earlier release wrote it, of event `EVENT`:
/// published or not, the original (`replay_id` `NULL`) or a replay's.
fn earlier_release_row(replay_id: &str, published_at: &str) -> String {
    format!(
        "INSERT INTO booking_expiration_outbox \
            (event_id, topic, message_key, payload, headers, correlation_id, tenant_id, \
             created_at, published_at, replay_id) \
         VALUES ('{EVENT}', 't', 'k', '\\x01', '{{\"ce_id\": \"{EVENT}\"}}', \
                 gen_random_uuid(), gen_random_uuid(), now(), {published_at}, {replay_id})"
    )
}

const EVENT: &str = "6c1f3b1e-9a52-4d0b-8c43-2f7e5d9a0b11";

/// The `outbox_event_key` migration records the events of the rows already
/// in the outbox (so republish finds an event that still waits, and a
/// second original is refused), drops the outbox's own unique index, and
/// its down brings that index back over the same rows; the runbook's
/// clean-up after a rolling upgrade records the rows the earlier release
/// wrote without one and removes records whose rows are gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_outbox_event_migration_records_the_rows_already_there_and_reverts() {
    let db = TestDb::new().await;
    let mut harness = AsyncMigrationHarness::new(db.conn().await);
    let reverted = harness
        .revert_last_migration(MIGRATIONS)
        .expect("the down migration runs")
        .to_string();
    assert_eq!(reverted, "20261208000001");
    drop(harness);
    // The original, published; a replay's copy, still waiting.
    db.exec_sql(&earlier_release_row("NULL", "now()")).await;
    db.exec_sql(&earlier_release_row("gen_random_uuid()", "NULL"))
        .await;
    let applied = db::migrate::run_migrations(&db.settings)
        .await
        .expect("the migration applies");
    assert_eq!(applied.len(), 1, "{applied:?}");
    assert_eq!(db.event_records().await, (2, 2));
    let indexes = names(&db, WORKER_INDEXES).await;
    assert!(
        !indexes
            .iter()
            .any(|i| i == "ux_booking_expiration_outbox_event_id_replay_id"),
        "{indexes:?}"
    );
    // The runbook's clean-up after a rolling upgrade: a row the earlier
    // release wrote after the copy gets its record, and a record whose row
    // its retention deleted goes.
    db.exec_sql(&earlier_release_row("gen_random_uuid()", "NULL"))
        .await;
    db.exec_sql(
        "INSERT INTO booking_expiration_outbox_event (event_id, replay_id, outbox_id) \
         VALUES (gen_random_uuid(), NULL, -1)",
    )
    .await;
    db.conn()
        .await
        .batch_execute(runbook_sql("run this once; it gives every"))
        .await
        .expect("the runbook's clean-up runs");
    assert_eq!(db.event_records().await, (3, 3));
    // A second original of the event, recorded as the expiring statement
    // records its rows, is refused.
    let mut conn = db.conn().await;
    let second = diesel::sql_query(format!(
        "WITH queued AS ({} RETURNING id, event_id) \
         INSERT INTO booking_expiration_outbox_event (event_id, replay_id, outbox_id) \
         SELECT event_id, NULL, id FROM queued",
        earlier_release_row("NULL", "NULL")
    ))
    .execute(&mut conn)
    .await
    .expect_err("a second original is refused");
    assert!(
        second
            .to_string()
            .contains("\"ux_booking_expiration_outbox_event\""),
        "{second}"
    );
    drop(conn);

    let mut harness = AsyncMigrationHarness::new(db.conn().await);
    harness
        .revert_last_migration(MIGRATIONS)
        .expect("the down migration runs over the rows");
    drop(harness);
    assert!(!exists(&db, "booking_expiration_outbox_event").await);
    let indexes = names(&db, WORKER_INDEXES).await;
    assert!(
        indexes
            .iter()
            .any(|i| i == "ux_booking_expiration_outbox_event_id_replay_id"),
        "{indexes:?}"
    );
    assert_eq!(
        db.count("SELECT count(*) AS n FROM booking_expiration_outbox")
            .await,
        3
    );
}

/// The first ```` ```sql ```` block of docs/runbooks/migrations.md after
/// the line holding `after`.
fn runbook_sql(after: &str) -> &'static str {
    const RUNBOOK: &str = include_str!("../../docs/runbooks/migrations.md");
    let from = RUNBOOK.find(after).expect("the runbook's sentence");
    let block = &RUNBOOK[from..];
    let start = block.find("```sql\n").expect("an sql block") + "```sql\n".len();
    let end = block[start..].find("```").expect("the block's end");
    &block[start..start + end]
}
