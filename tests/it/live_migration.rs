//! `migrate` against crm's live `bookings` table: the partial indexes are
//! built CONCURRENTLY while crm keeps writing, an interrupted build is
//! recovered, parallel runs serialise without deadlocking the concurrent
//! build, and a database migrated by the first release keeps its indexes.
//!
//! Each test starts from crm's side: the table exists (with rows) before the
//! worker's first `migrate`, as on a first rollout onto a crm database.
//!
//! The 1,000,000-row test is `#[ignore]`d in the parallel suite and run
//! alone by `scripts/test.sh` afterwards; by hand:
//! `bash scripts/test.sh --test it live_migration:: -- --include-ignored --nocapture`.

use std::{
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

use booking_expiration::db;
use diesel::{
    QueryableByName,
    sql_types::{BigInt, Bool, Text},
};
use diesel_async::{AsyncPgConnection, RunQueryDsl};

use crate::support::{Running, TestDb, binary, wait_until};

/// crm's table as crm created it (spec §9), without the worker's indexes.
/// The primary key is added after the rows (faster than row by row).
const CRM_BOOKINGS: &str = "CREATE TABLE bookings (
    id                 uuid        NOT NULL,
    tenant_id          uuid        NOT NULL,
    deal_id            uuid        NULL,
    property_object_id uuid        NULL,
    status             text        NOT NULL,
    reserve_expires_at timestamptz NULL,
    booking_expires_at timestamptz NULL,
    expired_at         timestamptz NULL,
    created_at         timestamptz NOT NULL DEFAULT now(),
    updated_at         timestamptz NOT NULL DEFAULT now(),
    version            bigint      NOT NULL DEFAULT 1
)";

/// The id of generated row `g` (1-based).
fn row_id(g: u64) -> String {
    format!("00000000-0000-4000-8000-{g:012}")
}

/// crm's `bookings` with `rows` rows: every status, one in seven of each,
/// deadlines spread over the rows.
async fn crm_bookings(db: &TestDb, rows: u64) {
    db.exec_sql(CRM_BOOKINGS).await;
    db.exec_sql(&format!(
        "INSERT INTO bookings (id, tenant_id, deal_id, property_object_id, status, \
                               reserve_expires_at, booking_expires_at) \
         SELECT u, u, u, u, \
                (ARRAY['Reserved', 'AwaitingPayment', 'Booked', 'ReserveExpired', \
                       'BookingExpired', 'Cancelled', 'Confirmed'])[1 + g % 7], \
                timestamptz '2027-01-01' + g * interval '1 second', \
                timestamptz '2027-02-01' + g * interval '1 second' \
           FROM generate_series(1, {rows}) AS g, \
                LATERAL (SELECT ('00000000-0000-4000-8000-' || lpad(g::text, 12, '0'))::uuid AS u) AS ids"
    ))
    .await;
    db.exec_sql("ALTER TABLE bookings ADD PRIMARY KEY (id)")
        .await;
    db.exec_sql("ANALYZE bookings").await;
}

#[derive(QueryableByName, Debug, PartialEq)]
struct IndexState {
    #[diesel(sql_type = Text)]
    name: String,
    #[diesel(sql_type = BigInt)]
    oid: i64,
    #[diesel(sql_type = Bool)]
    valid: bool,
}

/// The worker's partial indexes on `bookings` that exist, by name.
async fn worker_indexes(db: &TestDb) -> Vec<IndexState> {
    let mut conn = db.conn().await;
    diesel::sql_query(
        "SELECT c.relname::text AS name, c.oid::int8 AS oid, i.indisvalid AS valid \
           FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid \
          WHERE i.indrelid = 'bookings'::regclass \
            AND c.relname IN ('ix_bookings_reserve_expires_at', 'ix_bookings_booking_expires_at') \
          ORDER BY c.relname",
    )
    .load(&mut conn)
    .await
    .expect("read pg_index")
}

async fn assert_both_indexes_valid(db: &TestDb) -> Vec<IndexState> {
    let indexes = worker_indexes(db).await;
    assert_eq!(
        indexes
            .iter()
            .map(|i| (i.name.as_str(), i.valid))
            .collect::<Vec<_>>(),
        [
            ("ix_bookings_booking_expires_at", true),
            ("ix_bookings_reserve_expires_at", true)
        ],
        "both partial indexes exist and are valid"
    );
    indexes
}

/// How many migrations the binary embeds (one folder each under migrations/).
fn migration_count() -> usize {
    std::fs::read_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/migrations"))
        .expect("migrations/")
        .filter(|entry| entry.as_ref().is_ok_and(|e| e.path().is_dir()))
        .count()
}

/// One timed single-row update of crm's writer.
#[derive(Clone, Copy)]
struct Write {
    started: Instant,
    took: Duration,
}

/// crm's writer: single-row updates, one after the other on its own
/// connection, each timed, until `stop`.
fn spawn_writer(
    mut conn: AsyncPgConnection,
    rows: u64,
    stop: Arc<AtomicBool>,
    log: Arc<Mutex<Vec<Write>>>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut i: u64 = 0;
        while !AtomicBool::load(&stop, Ordering::Relaxed) {
            // A stride over the whole table, so writes land on every page.
            let id = row_id((i * 7919) % rows + 1);
            i += 1;
            let started = Instant::now();
            diesel::sql_query(
                "UPDATE bookings \
                    SET status = CASE status WHEN 'Reserved' THEN 'AwaitingPayment' \
                                             WHEN 'AwaitingPayment' THEN 'Reserved' \
                                             ELSE status END, \
                        updated_at = now(), version = version + 1 \
                  WHERE id = $1::uuid",
            )
            .bind::<Text, _>(&id)
            .execute(&mut conn)
            .await
            .expect("crm's update");
            let took = started.elapsed();
            log.lock().unwrap().push(Write { started, took });
        }
    })
}

fn median(mut values: Vec<Duration>) -> Duration {
    values.sort_unstable();
    values.get(values.len() / 2).copied().unwrap_or_default()
}

/// The longest any single-row update may wait while `migrate` builds the
/// indexes. The first release's in-transaction build held every write for
/// the whole build (655 ms on 1,000,000 rows on an idle machine, longer on
/// a busy one); a concurrent build takes no lock a write waits for, so what
/// is left is scheduling noise on a shared CI machine.
const MAX_WRITE_WAIT: Duration = Duration::from_millis(300);

const BUSY_TABLE_ROWS: u64 = 1_000_000;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "loads the server for a while: scripts/test.sh runs it alone after the suite"]
async fn migrating_a_busy_million_row_bookings_table_never_holds_its_writers() {
    let db = TestDb::empty().await;
    let seeded = Instant::now();
    crm_bookings(&db, BUSY_TABLE_ROWS).await;
    let seeded = seeded.elapsed();

    let stop = Arc::new(AtomicBool::new(false));
    let log = Arc::new(Mutex::new(Vec::new()));
    let writer = spawn_writer(db.conn().await, BUSY_TABLE_ROWS, stop.clone(), log.clone());
    wait_until(
        "crm's writer to make 300 updates",
        Duration::from_secs(60),
        || async { log.lock().unwrap().len() >= 300 },
    )
    .await;

    let mut migrate = Running::spawn({
        let mut command = binary();
        command.arg("migrate").env("DATABASE_URL", &db.url);
        command
    });
    let migrate_started = Instant::now();
    let status = migrate.wait(Duration::from_secs(120)).await;
    let migrate_ended = Instant::now();
    assert!(status.success(), "migrate: {}", migrate.stderr());
    // A few writes after the run, then stop.
    let written = log.lock().unwrap().len();
    wait_until(
        "crm's writer to go on after migrate",
        Duration::from_secs(30),
        || async { log.lock().unwrap().len() >= written + 20 },
    )
    .await;
    stop.store(true, Ordering::Relaxed);
    writer.await.expect("writer");

    let writes = log.lock().unwrap().clone();
    let before: Vec<Duration> = writes
        .iter()
        .filter(|w| w.started + w.took <= migrate_started)
        .map(|w| w.took)
        .collect();
    let during: Vec<Duration> = writes
        .iter()
        .filter(|w| w.started < migrate_ended && w.started + w.took > migrate_started)
        .map(|w| w.took)
        .collect();
    let longest = during.iter().max().copied().unwrap_or_default();
    println!(
        "live migration: {BUSY_TABLE_ROWS} rows (seeded in {seeded:.1?}); migrate took {:.0?}; \
         crm's single-row updates: median {:.2?} before ({} updates), during migrate {} updates, \
         median {:.2?}, longest {longest:.1?}",
        migrate_ended - migrate_started,
        median(before.clone()),
        before.len(),
        during.len(),
        median(during.clone()),
    );
    assert!(
        during.len() >= 10,
        "the writer kept writing during migrate: {} updates",
        during.len()
    );
    assert!(
        longest < MAX_WRITE_WAIT,
        "a single-row update waited {longest:?} during migrate (bound {MAX_WRITE_WAIT:?})"
    );

    // The concurrently built indexes hold every row they should, written
    // during the build included (amcheck reads the heap against them).
    assert_both_indexes_valid(&db).await;
    db.exec_sql("CREATE EXTENSION IF NOT EXISTS amcheck").await;
    for index in [
        "ix_bookings_reserve_expires_at",
        "ix_bookings_booking_expires_at",
    ] {
        db.exec_sql(&format!(
            "SELECT bt_index_check('{index}'::regclass, heapallindexed => true)"
        ))
        .await;
    }
}

/// The session of `migrate` waiting for a lock, if any (its only session
/// here; `pg_stat_activity.query` shows the start of the migration's text,
/// its comments, not the statement).
async fn waiting_build_pid(db: &TestDb) -> Option<i64> {
    #[derive(QueryableByName)]
    struct Pid {
        #[diesel(sql_type = BigInt)]
        pid: i64,
    }
    let mut conn = db.conn().await;
    let pids: Vec<Pid> = diesel::sql_query(
        "SELECT pid::int8 AS pid FROM pg_stat_activity \
          WHERE datname = current_database() AND wait_event_type = 'Lock' \
            AND application_name = 'booking-expiration'",
    )
    .load(&mut conn)
    .await
    .expect("read pg_stat_activity");
    pids.into_iter().next().map(|p| p.pid)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_interrupted_concurrent_build_leaves_an_invalid_index_that_the_next_migrate_rebuilds() {
    let db = TestDb::empty().await;
    crm_bookings(&db, 1000).await;

    let mut crm = open_crm_write(&db).await;

    let run = {
        let settings = db.settings.clone();
        tokio::spawn(async move { db::migrate::run_migrations(&settings).await })
    };
    wait_until(
        "the concurrent build to wait for crm's transaction",
        Duration::from_secs(30),
        || async {
            assert!(!run.is_finished(), "migrate ended before building");
            waiting_build_pid(&db).await.is_some()
        },
    )
    .await;
    // Interrupt it, as an operator's pg_cancel_backend (or a lost
    // connection, or a timeout) would.
    let pid = waiting_build_pid(&db).await.expect("the build's session");
    assert_eq!(
        db.count(&format!("SELECT pg_cancel_backend({pid})::int::int8 AS n"))
            .await,
        1
    );
    let error = tokio::time::timeout(Duration::from_secs(30), run)
        .await
        .expect("migrate ends")
        .expect("task")
        .expect_err("the interrupted build fails the run");
    assert!(error.to_string().contains("canceling statement"), "{error}");
    let left = worker_indexes(&db).await;
    assert_eq!(
        left.iter()
            .map(|i| (i.name.as_str(), i.valid))
            .collect::<Vec<_>>(),
        [("ix_bookings_reserve_expires_at", false)],
        "the interrupted build left its index INVALID"
    );
    let pending = db::migrate::pending_migrations(&db.settings)
        .await
        .expect("pending");
    assert_eq!(
        pending[..2],
        ["20261204000001", "20261204000002"],
        "both builds still pending: {pending:?}"
    );

    diesel::sql_query("COMMIT")
        .execute(&mut crm)
        .await
        .expect("commit");
    let applied = db::migrate::run_migrations(&db.settings)
        .await
        .expect("the next migrate recovers");
    assert_eq!(applied, pending, "the two builds are applied now");
    let rebuilt = assert_both_indexes_valid(&db).await;
    assert_ne!(
        rebuilt[1].oid, left[0].oid,
        "the INVALID index was dropped and built again, not kept"
    );
    assert!(
        db::migrate::pending_migrations(&db.settings)
            .await
            .expect("pending")
            .is_empty()
    );
}

/// Opens a crm transaction with an uncommitted write on `bookings`: a
/// concurrent build waits for it to end before it scans the table.
async fn open_crm_write(db: &TestDb) -> AsyncPgConnection {
    let mut crm = db.conn().await;
    diesel::sql_query("BEGIN")
        .execute(&mut crm)
        .await
        .expect("begin");
    diesel::sql_query("UPDATE bookings SET version = version + 1 WHERE id = $1::uuid")
        .bind::<Text, _>(row_id(1))
        .execute(&mut crm)
        .await
        .expect("crm's write");
    crm
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_concurrent_build_waits_out_old_transactions_past_the_session_timeouts() {
    let db = TestDb::empty().await;
    crm_bookings(&db, 1000).await;
    let mut crm = open_crm_write(&db).await;

    // The worker's sessions give up on a statement or a lock after this;
    // a concurrent build must not (it blocks no write, and giving up
    // would leave an INVALID index on every large or busy table).
    let timeout = Duration::from_millis(500);
    let mut settings = db.settings.clone();
    settings.statement_timeout = timeout;
    let run = tokio::spawn(async move { db::migrate::run_migrations(&settings).await });
    wait_until(
        "the concurrent build to wait for crm's transaction",
        Duration::from_secs(30),
        || async { waiting_build_pid(&db).await.is_some() },
    )
    .await;
    // Deliberate fault timing: crm's transaction stays open past the timeouts.
    tokio::time::sleep(timeout * 3).await;
    assert!(!run.is_finished(), "the build gave up waiting");
    diesel::sql_query("COMMIT")
        .execute(&mut crm)
        .await
        .expect("commit");
    let applied = tokio::time::timeout(Duration::from_secs(60), run)
        .await
        .expect("migrate ends")
        .expect("task")
        .expect("migrate succeeds once crm's transaction ended");
    assert_eq!(applied.len(), migration_count(), "{applied:?}");
    assert_both_indexes_valid(&db).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn four_parallel_migrate_processes_all_succeed_and_apply_once() {
    let db = TestDb::empty().await;
    crm_bookings(&db, 100_000).await;

    // Hold the migration lock so that all four runs start waiting for it
    // before one of them can build an index.
    let mut holder = db.conn().await;
    diesel::sql_query("SELECT pg_advisory_lock($1)")
        .bind::<BigInt, _>(db::migrate::MIGRATION_LOCK_KEY)
        .execute(&mut holder)
        .await
        .expect("take the migration lock");
    let mut runs: Vec<Running> = (0..4)
        .map(|_| {
            let mut command = binary();
            command.arg("migrate").env("DATABASE_URL", &db.url);
            Running::spawn(command)
        })
        .collect();
    wait_until(
        "the four runs to wait for the migration lock",
        Duration::from_secs(30),
        || async { db.worker_sessions("query ILIKE '%advisory_lock%'").await == 4 },
    )
    .await;
    // Deliberate fault timing: while the lock is held, nothing migrates.
    tokio::time::sleep(Duration::from_millis(300)).await;
    for run in &mut runs {
        assert!(
            run.child.try_wait().expect("poll").is_none(),
            "{}",
            run.stderr()
        );
    }
    assert_eq!(
        db.count("SELECT (to_regclass('booking_expiration_outbox') IS NOT NULL)::int::int8 AS n")
            .await,
        0
    );

    diesel::sql_query("SELECT pg_advisory_unlock($1)")
        .bind::<BigInt, _>(db::migrate::MIGRATION_LOCK_KEY)
        .execute(&mut holder)
        .await
        .expect("release the migration lock");
    let mut appliers = 0;
    for run in &mut runs {
        let status = run.wait(Duration::from_secs(120)).await;
        let stderr = run.stderr();
        assert!(status.success(), "a parallel migrate failed: {stderr}");
        if stderr.contains("migrations applied") {
            appliers += 1;
        } else {
            assert!(stderr.contains("schema is up to date"), "{stderr}");
        }
    }
    assert_eq!(appliers, 1, "exactly one run applies the migrations");
    assert_eq!(
        db.count("SELECT count(*) AS n FROM __diesel_schema_migrations")
            .await,
        i64::try_from(migration_count()).expect("small")
    );
    assert_both_indexes_valid(&db).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_migrated_by_the_first_release_keeps_its_indexes() {
    let db = TestDb::empty().await;
    crm_bookings(&db, 1000).await;
    // What the first release left: its three migrations recorded, the
    // worker's tables, and the two partial indexes built by its first
    // migration (exactly its statements) inside a transaction.
    db::migrate::run_migrations(&db.settings)
        .await
        .expect("migrate");
    // Migrations added after the concurrent builds are reverted first, newest
    // first, by their own down.sql: the first release had none of them.
    let later = later_migrations();
    for dir in later.iter().rev() {
        let down = std::fs::read_to_string(dir.join("down.sql")).expect("read down.sql");
        testkit::postgres::exec(&db.url, &down)
            .await
            .expect("revert a later migration");
    }
    testkit::postgres::exec(
        &db.url,
        "DROP INDEX ix_bookings_reserve_expires_at; \
         DROP INDEX ix_bookings_booking_expires_at; \
         CREATE INDEX IF NOT EXISTS ix_bookings_reserve_expires_at \
             ON bookings (reserve_expires_at) \
             WHERE status IN ('Reserved', 'AwaitingPayment'); \
         CREATE INDEX IF NOT EXISTS ix_bookings_booking_expires_at \
             ON bookings (booking_expires_at) \
             WHERE status = 'Booked'; \
         DELETE FROM __diesel_schema_migrations WHERE version >= '20261204'",
    )
    .await
    .expect("the first release's state");
    let first_release = assert_both_indexes_valid(&db).await;

    let applied = db::migrate::run_migrations(&db.settings)
        .await
        .expect("the upgrade applies");
    let mut expected = vec!["20261204000001".to_owned(), "20261204000002".to_owned()];
    expected.extend(later.iter().map(|dir| version_of(dir)));
    assert_eq!(applied, expected);
    assert_eq!(
        assert_both_indexes_valid(&db).await,
        first_release,
        "the first release's indexes are kept, not rebuilt"
    );
}

/// The migration folders that sort after the two concurrent index builds.
fn later_migrations() -> Vec<std::path::PathBuf> {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("migrations");
    let mut dirs: Vec<_> = std::fs::read_dir(&root)
        .expect("read migrations/")
        .map(|entry| entry.expect("migrations/ entry").path())
        .filter(|dir| version_of(dir).as_str() > "20261204000002")
        .collect();
    dirs.sort();
    dirs
}

/// diesel's version of a migration folder: its leading date and number
/// without the dashes.
fn version_of(dir: &std::path::Path) -> String {
    let name = dir
        .file_name()
        .and_then(|n| n.to_str())
        .expect("UTF-8 name");
    name.split('_')
        .next()
        .expect("a dated name")
        .replace('-', "")
}
