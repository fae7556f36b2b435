//! The broker frozen (SIGSTOP) for 20 s while bookings fall due (issue 32):
//! no database transaction waits on Kafka, expiry goes on as before, and
//! everything is published once the broker answers again.
//!
//! Each test starts a Kafka broker of its own (`scripts/kafka.sh`, the
//! same single node as the suite's; the suite's shared broker is never
//! frozen), seeds bookings falling due at [`RATE`] a second over
//! [`BASELINE`] + [`FREEZE`] + [`AFTER`], and runs the `run` binary at its
//! defaults with `EXPIRATION_INTERVAL=1s` (the setting). From the
//! first deadline on, a sampler on a connection of its own looks every
//! [`SAMPLE_EVERY`] at `pg_stat_activity` (every client backend of the
//! test's database but its own: `now() - xact_start` of the oldest open
//! transaction), at the bookings (how many fell due, how many expired, and
//! how long ago the oldest due but unexpired one fell due: the expiry's
//! commit lag) and, behind PgBouncer, at `SHOW POOLS`. After the baseline
//! the broker is sent SIGSTOP, 20 s later SIGCONT: its connections stay
//! open and nothing answers (a GC pause, a VM paused), the produce
//! requests on the way hang for the whole freeze (`KAFKA_REQUEST_TIMEOUT`
//! is 35 s).
//!
//! Bounds, asserted (figures printed first, `FIGURES broker-freeze[…]`):
//!
//! - **No transaction of the worker older than 1 s** at any sample during
//!   the freeze ([`XACT_MAX`], the bound).
//! - **Expiry unaffected**: the lateness (`expired_at` − deadline) p99 of
//!   the bookings that fell due during the freeze at most
//!   [`LATENESS_SLACK`] (0.5 s) above the baseline's p99 (the same run,
//!   before the freeze; `EXPIRATION_INTERVAL`, 1 s, when the baseline's is
//!   below it), and the commit lag (how long ago the oldest due but
//!   unexpired booking fell due, sampled: what `expired_at`, the cycle's
//!   start, does not show) never above [`COMMIT_LAG_MAX`] (3 s:
//!   `EXPIRATION_INTERVAL` plus 2 s for a cycle on a loaded 2-core
//!   machine), or the baseline's longest plus [`COMMIT_LAG_SLACK`] (1 s)
//!   when the machine is loaded more than that, during the freeze. A
//!   worker whose expiry waited on the broker would fall behind by the
//!   whole freeze (20 s).
//! - **Everything published after SIGCONT**: every booking on the topic,
//!   duplicates only with the same `ce_id` and bytes (counted, printed).
//! - **Behind PgBouncer** (transaction pooling, `default_pool_size=2`,
//!   `DATABASE_POOLER=transaction`, the commit wake-up over
//!   `DATABASE_DIRECT_URL`): the same bounds, and the expiry never waits
//!   for a connection the publisher holds: PgBouncer's `maxwait` (how long
//!   the oldest client waiting for a server connection has waited) stays
//!   under [`POOL_WAIT_MAX`] at every sample during the freeze. A worker
//!   holding a server connection across its Kafka call would leave the
//!   other clients waiting for the rest of the freeze; a wait of a
//!   transaction's length (milliseconds) is the pool of 2 doing its job.
//!
//! The figures also cover the recovery (from SIGCONT until everything is
//! published: 6,000-odd rows at once), which the bounds do not
//! speak of: printed, not asserted.
//!
//! Both tests are `#[ignore]`d in the parallel suite: their bounds are
//! timings of a second, which the suite's load (dozens of tests hammering
//! the same PostgreSQL) would blur. `scripts/test.sh` runs them alone after
//! the suite; by hand: `bash scripts/test.sh --test it broker_freeze --
//! --include-ignored --nocapture`. Each takes about 1.5 min (most of it the
//! broker's start and the 35 s of deadlines).

use std::{
    collections::HashMap,
    time::{Duration, Instant},
};

use booking_expiration::db;
use chrono::{DateTime, Utc};
use diesel::{QueryableByName, sql_types::Double};
use testkit::{kafka::Kafka, pgbouncer::PgBouncer};
use tokio_util::sync::CancellationToken;

use crate::support::*;

/// Bookings falling due per second.
const RATE: u64 = 300;
/// From the seeding to the first deadline (the seeding itself takes time).
const LEAD: Duration = Duration::from_secs(3);
/// Deadlines before the freeze: the lateness without a fault.
const BASELINE: Duration = Duration::from_secs(10);
/// The broker frozen this long (the scenario).
const FREEZE: Duration = Duration::from_secs(20);
/// Deadlines after SIGCONT.
const AFTER: Duration = Duration::from_secs(5);
const SAMPLE_EVERY: Duration = Duration::from_millis(100);
const PARTITIONS: i32 = 3;

/// No transaction of the worker older than this during the freeze.
const XACT_MAX: Duration = Duration::from_secs(1);
/// `EXPIRATION_INTERVAL`: the longest a due booking waits for a cycle
/// when the deadline wake-up misses it.
const INTERVAL: Duration = Duration::from_secs(1);
/// The freeze's lateness p99 at most this above the baseline's (or above
/// [`INTERVAL`] when the baseline's is below it).
const LATENESS_SLACK: Duration = Duration::from_millis(500);
/// The oldest due but unexpired booking never older than this during the
/// freeze: [`INTERVAL`] plus 2 s for a cycle on a loaded 2-core machine
/// (up to 2.4 s measured there without a fault, in the baseline) ...
const COMMIT_LAG_MAX: Duration = Duration::from_secs(3);
/// ... or than the baseline's longest plus this, when the machine's load
/// makes the baseline's longer.
const COMMIT_LAG_SLACK: Duration = Duration::from_secs(1);
/// PgBouncer's `maxwait` under this at every sample during the freeze.
const POOL_WAIT_MAX: Duration = Duration::from_millis(500);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Pooling {
    Direct,
    PgBouncer,
}

impl Pooling {
    fn name(self) -> &'static str {
        match self {
            Self::Direct => "direct",
            Self::PgBouncer => "pgbouncer",
        }
    }
}

/// What the sampler saw at one look.
#[derive(Debug, Clone)]
struct Sample {
    at: Instant,
    /// Age of the oldest open transaction of the database's other client
    /// backends (0 when none), and what it was.
    xact_age: f64,
    xact_what: String,
    /// Bookings due by then, and expired.
    due: i64,
    expired: i64,
    /// Age of the oldest due but unexpired booking's deadline (0 if none).
    commit_lag: f64,
    /// PgBouncer's pool of the database: clients waiting, the oldest's wait.
    cl_waiting: i64,
    maxwait: f64,
}

const SAMPLE_SQL: &str = "\
WITH x AS (
  SELECT extract(epoch FROM clock_timestamp() - xact_start)::float8 AS age,
         coalesce(application_name, '') || ' ' || coalesce(state, '') || ' ('
           || coalesce(wait_event_type || '/' || wait_event, 'on CPU') || '): '
           || regexp_replace(left(query, 100), '\\s+', ' ', 'g') AS what
    FROM pg_stat_activity
   WHERE datname = current_database() AND pid <> pg_backend_pid()
     AND backend_type = 'client backend' AND xact_start IS NOT NULL
   ORDER BY xact_start LIMIT 1),
b AS (SELECT least(reserve_expires_at, booking_expires_at) AS deadline, version FROM bookings)
SELECT coalesce((SELECT age FROM x), 0)::float8,
       coalesce((SELECT what FROM x), ''),
       (SELECT count(*) FROM b WHERE deadline <= clock_timestamp()),
       (SELECT count(*) FROM b WHERE version = 2),
       coalesce((SELECT extract(epoch FROM clock_timestamp() - min(deadline))
                   FROM b WHERE version = 1 AND deadline <= clock_timestamp()), 0)::float8";

/// Samples until `stop`; returns the samples.
async fn sample(
    database_url: String,
    bouncer_admin: Option<(String, String)>,
    stop: CancellationToken,
) -> Vec<Sample> {
    let (client, connection) = tokio_postgres::connect(&database_url, tokio_postgres::NoTls)
        .await
        .expect("the sampler connects");
    tokio::spawn(connection);
    let bouncer = match &bouncer_admin {
        Some((url, _)) => {
            let (admin, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
                .await
                .expect("the sampler connects to PgBouncer's console");
            tokio::spawn(connection);
            Some(admin)
        }
        None => None,
    };
    let mut samples = Vec::new();
    let mut tick = tokio::time::interval(SAMPLE_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    while !stop.is_cancelled() {
        tick.tick().await;
        let at = Instant::now();
        let row = client
            .query_one(SAMPLE_SQL, &[])
            .await
            .expect("the sample query");
        let (mut cl_waiting, mut maxwait) = (0, 0.0);
        if let (Some(admin), Some((_, database))) = (&bouncer, &bouncer_admin) {
            for message in admin.simple_query("SHOW POOLS").await.expect("SHOW POOLS") {
                if let tokio_postgres::SimpleQueryMessage::Row(pool) = message
                    && pool.get("database") == Some(database.as_str())
                {
                    let number = |column: &str| -> i64 {
                        pool.get(column)
                            .and_then(|v| v.parse().ok())
                            .unwrap_or_default()
                    };
                    cl_waiting += number("cl_waiting");
                    maxwait = f64::max(
                        maxwait,
                        number("maxwait") as f64 + number("maxwait_us") as f64 / 1e6,
                    );
                }
            }
        }
        samples.push(Sample {
            at,
            xact_age: row.get(0),
            xact_what: row.get(1),
            due: row.get(2),
            expired: row.get(3),
            commit_lag: row.get(4),
            cl_waiting,
            maxwait,
        });
    }
    samples
}

/// The broker under SIGSTOP; SIGCONT on [`Frozen::thaw`] or drop (a test
/// that fails mid-freeze leaves no frozen broker behind).
struct Frozen(Option<u32>);

impl Frozen {
    fn freeze(pid: u32) -> Self {
        signal(pid, "STOP");
        Self(Some(pid))
    }

    fn thaw(mut self) {
        if let Some(pid) = self.0.take() {
            signal(pid, "CONT");
        }
    }
}

impl Drop for Frozen {
    fn drop(&mut self) {
        if let Some(pid) = self.0.take() {
            let _ = std::process::Command::new("kill")
                .args(["-CONT", &pid.to_string()])
                .status();
        }
    }
}

/// CPU time (user + system) the process `pid` used so far, in seconds
/// (`/proc/PID/stat`, in clock ticks of 1/100 s).
fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // The fields after the command's closing parenthesis: state is the
    // first, utime the 12th and stime the 13th.
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map(|(_, rest)| rest.split_whitespace().collect())
        .unwrap_or_default();
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|f| f.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    (ticks(11) + ticks(12)) / 100.0
}

fn blocking<T>(f: impl FnOnce() -> anyhow::Result<T>) -> T {
    tokio::task::block_in_place(f).unwrap_or_else(|e| panic!("{e:#}"))
}

/// p50, p99 and max of `values` (seconds), sorted in place.
fn spread_of(values: &mut [f64]) -> (f64, f64, f64) {
    if values.is_empty() {
        return (0.0, 0.0, 0.0);
    }
    values.sort_by(f64::total_cmp);
    let at = |q: f64| values[((values.len() - 1) as f64 * q).round() as usize];
    (at(0.5), at(0.99), values[values.len() - 1])
}

#[derive(QueryableByName)]
struct Expired {
    /// Deadline, seconds after the first deadline of the seeding.
    #[diesel(sql_type = Double)]
    deadline: f64,
    #[diesel(sql_type = Double)]
    late: f64,
}

/// Per window of deadlines: the bookings' lateness `expired_at − deadline`.
async fn lateness(db: &TestDb, as_of: DateTime<Utc>) -> Vec<Expired> {
    use diesel_async::RunQueryDsl;
    let mut conn = db.conn().await;
    diesel::sql_query(
        "SELECT extract(epoch FROM least(reserve_expires_at, booking_expires_at) - $1)::float8 AS deadline, \
                extract(epoch FROM expired_at - least(reserve_expires_at, booking_expires_at))::float8 AS late \
           FROM bookings WHERE version = 2",
    )
    .bind::<diesel::sql_types::Timestamptz, _>(as_of)
    .load(&mut conn)
    .await
    .expect("lateness")
}

/// One window of the run, for the figures.
struct Window {
    name: &'static str,
    /// Deadlines (seconds after the first deadline) in it: `from..to`.
    from: f64,
    to: f64,
    /// Samples in it: `from..samples_to` (the last window's go on until
    /// everything is published).
    samples_to: f64,
}

async fn freeze_scenario(pooling: Pooling) {
    let name = pooling.name();
    let kafka = blocking(|| Kafka::start(&tempdir("kafka-freeze"), free_port_pair()));
    let topic = format!("freeze-{}", uuid::Uuid::new_v4().simple());
    blocking(|| kafka.create_topic(&topic, PARTITIONS));
    let db = TestDb::new().await;
    let bouncer = (pooling == Pooling::PgBouncer).then(|| {
        PgBouncer::start(&tempdir("pgbouncer-freeze"), free_port(), &admin_url(), 2)
            .expect("start PgBouncer")
    });
    let metrics_addr = format!("127.0.0.1:{}", free_port());
    let mut command = binary();
    command
        .arg("run")
        .env("KAFKA_BOOTSTRAP_SERVERS", kafka.bootstrap())
        .env("KAFKA_TOPIC", &topic)
        .env("EXPIRATION_INTERVAL", format!("{}s", INTERVAL.as_secs()))
        .env("METRICS_ADDR", &metrics_addr);
    match &bouncer {
        None => command.env("DATABASE_URL", &db.url),
        Some(bouncer) => command
            .env("DATABASE_URL", bouncer.url(&db.name))
            .env("DATABASE_POOLER", "transaction")
            .env("DATABASE_DIRECT_URL", &db.url),
    };
    let mut running = Running::spawn(command);
    let worker = running.child.id();
    wait_http_status(&metrics_addr, "/readyz", 200, Duration::from_secs(90)).await;

    // Bookings falling due at RATE a second from `as_of` on.
    let spread = BASELINE + FREEZE + AFTER;
    let due = (RATE * spread.as_secs()) as i64;
    let as_of = wall_now() + chrono::Duration::from_std(LEAD).unwrap();
    let first_deadline = Instant::now() + LEAD;
    let cpu_at_seeding = cpu_seconds(worker);
    let mut conn = db.conn().await;
    db::seed::seed(
        &mut conn,
        &db::seed::SeedPlan {
            active: due as u64,
            due_fraction: 0.0,
            inactive: 0,
            poison: 0,
            as_of,
            spread,
        },
    )
    .await
    .expect("seed");
    drop(conn);
    let stop_sampling = CancellationToken::new();
    let sampler = tokio::spawn(sample(
        db.url.clone(),
        bouncer
            .as_ref()
            .map(|b| (b.url("pgbouncer"), db.name.clone())),
        stop_sampling.clone(),
    ));

    // The scenario: the baseline's deadlines, then the freeze.
    tokio::time::sleep_until((first_deadline + BASELINE).into()).await;
    let published_before = db.published().await;
    assert!(
        published_before > 0,
        "publishing before the freeze (nothing published {BASELINE:?} into the deadlines)"
    );
    let freeze_from = Instant::now();
    let cpu_at_freeze = cpu_seconds(worker);
    let frozen = Frozen::freeze(blocking(|| kafka.pid()));
    tokio::time::sleep(FREEZE).await;
    let unpublished_at_thaw = db.unpublished().await;
    frozen.thaw();
    let freeze_to = Instant::now();
    let cpu_at_thaw = cpu_seconds(worker);

    wait_until(
        "every booking expired",
        AFTER + Duration::from_secs(60),
        || async {
            db.count("SELECT count(*) AS n FROM bookings WHERE version = 2")
                .await
                == due
        },
    )
    .await;
    db.wait_all_published(Duration::from_secs(120)).await;
    let all_published_after = freeze_to.elapsed();
    let cpu_at_end = cpu_seconds(worker);
    stop_sampling.cancel();
    let samples = sampler.await.expect("the sampler");
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    running.terminate();
    let status = running.wait(Duration::from_secs(60)).await;
    assert_eq!(status.code(), Some(0), "{}", running.stderr());

    // Every booking on the topic; a duplicate is the same record again.
    let records = read_topic_from(vec![kafka.bootstrap()], &topic, PARTITIONS).await;
    let mut by_key: HashMap<&str, Vec<&ConsumedRecord>> = HashMap::new();
    for record in &records {
        by_key.entry(&record.key).or_default().push(record);
    }
    for copies in by_key.values() {
        for copy in copies {
            assert_eq!(copy.header("ce_id"), copies[0].header("ce_id"));
            assert_eq!(
                copy.value, copies[0].value,
                "a duplicate has the same bytes"
            );
        }
    }
    let duplicates = records.len() - by_key.len();

    // The figures, per window (seconds after the first deadline).
    let at = |t: Instant| (t - first_deadline).as_secs_f64();
    let windows = [
        Window {
            name: "baseline",
            from: 0.0,
            to: at(freeze_from),
            samples_to: at(freeze_from),
        },
        Window {
            name: "freeze",
            from: at(freeze_from),
            to: at(freeze_to),
            samples_to: at(freeze_to),
        },
        Window {
            name: "after",
            from: at(freeze_to),
            to: spread.as_secs_f64(),
            samples_to: f64::INFINITY,
        },
    ];
    let expired = lateness(&db, as_of).await;
    let mut lines = Vec::new();
    let mut figures = HashMap::new();
    for w in &windows {
        let mut late: Vec<f64> = expired
            .iter()
            .filter(|e| e.deadline >= w.from && e.deadline < w.to)
            .map(|e| e.late)
            .collect();
        let (p50, p99, max) = spread_of(&mut late);
        let seen: Vec<&Sample> = samples
            .iter()
            .filter(|s| at(s.at) >= w.from && at(s.at) < w.samples_to)
            .collect();
        let oldest = seen.iter().max_by(|a, b| a.xact_age.total_cmp(&b.xact_age));
        let lag = seen.iter().map(|s| s.commit_lag).fold(0.0, f64::max);
        let waiting = seen.iter().map(|s| s.cl_waiting).max().unwrap_or(0);
        let waited = seen.iter().map(|s| s.maxwait).fold(0.0, f64::max);
        let (first, last) = (seen.first(), seen.last());
        let (due_in, expired_in) = match (first, last) {
            (Some(a), Some(b)) => (b.due - a.due, b.expired - a.expired),
            _ => (0, 0),
        };
        lines.push(format!(
            "{}: {} bookings, lateness p50 {p50:.2} s p99 {p99:.2} s max {max:.2} s; {} samples: \
             oldest transaction {:.3} s ({}), commit lag max {lag:.2} s, {expired_in} expired of \
             {due_in} that fell due{}",
            w.name,
            late.len(),
            seen.len(),
            oldest.map_or(0.0, |s| s.xact_age),
            oldest.map_or("", |s| s.xact_what.as_str()),
            if pooling == Pooling::PgBouncer {
                format!("; PgBouncer cl_waiting max {waiting}, maxwait max {waited:.3} s")
            } else {
                String::new()
            }
        ));
        figures.insert(
            w.name,
            (
                late.len(),
                p99,
                seen.len(),
                oldest.map_or(0.0, |s| s.xact_age),
                lag,
                waited,
            ),
        );
    }
    for line in &lines {
        eprintln!("FIGURES broker-freeze[{name}]: {line}");
    }
    eprintln!(
        "FIGURES broker-freeze[{name}]: {due} bookings over {spread:?} ({RATE}/s); {published_before} \
         published before the freeze, {unpublished_at_thaw} waiting at SIGCONT; all published \
         {:.1} s after SIGCONT; {} records on the topic, {duplicates} duplicates (same ce_id and \
         bytes); worker CPU {:.1} s before the freeze (from the seeding, {:.0} s), {:.1} s during \
         it, {:.1} s in the {:.1} s from SIGCONT to all published; load average {}",
        all_published_after.as_secs_f64(),
        records.len(),
        cpu_at_freeze - cpu_at_seeding,
        (freeze_from - first_deadline + LEAD).as_secs_f64(),
        cpu_at_thaw - cpu_at_freeze,
        cpu_at_end - cpu_at_thaw,
        all_published_after.as_secs_f64(),
        load.split_whitespace()
            .take(3)
            .collect::<Vec<_>>()
            .join(" ")
    );

    assert_eq!(by_key.len() as i64, due, "every booking on the topic");
    assert!(
        unpublished_at_thaw > 0,
        "the frozen broker held publishing up (nothing waited at SIGCONT)"
    );
    let (baseline_n, baseline_p99, _, _, baseline_lag, _) = figures["baseline"];
    let (freeze_n, freeze_p99, freeze_samples, oldest_xact, lag, waited) = figures["freeze"];
    assert!(baseline_n > 0 && freeze_n > 0, "bookings in both windows");
    let lag_bound = COMMIT_LAG_MAX
        .as_secs_f64()
        .max(baseline_lag + COMMIT_LAG_SLACK.as_secs_f64());
    assert!(
        freeze_samples as f64 >= FREEZE.as_secs_f64() / SAMPLE_EVERY.as_secs_f64() / 2.0,
        "the freeze was sampled: {freeze_samples} samples"
    );
    assert!(
        oldest_xact < XACT_MAX.as_secs_f64(),
        "no transaction older than {XACT_MAX:?} during the freeze: {oldest_xact:.3} s"
    );
    let lateness_bound = baseline_p99.max(INTERVAL.as_secs_f64()) + LATENESS_SLACK.as_secs_f64();
    assert!(
        freeze_p99 <= lateness_bound,
        "lateness p99 during the freeze {freeze_p99:.2} s, bound {lateness_bound:.2} s (baseline \
         {baseline_p99:.2} s)"
    );
    assert!(
        lag <= lag_bound,
        "the oldest due booking waited {lag:.2} s during the freeze (bound {lag_bound:.2} s, \
         baseline {baseline_lag:.2} s)"
    );
    if pooling == Pooling::PgBouncer {
        assert!(
            waited < POOL_WAIT_MAX.as_secs_f64(),
            "a client waited {waited:.3} s for a server connection during the freeze (bound {POOL_WAIT_MAX:?})"
        );
    }
    drop(bouncer);
}

/// The broker frozen 20 s, the worker straight on PostgreSQL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "timing bounds of a second: scripts/test.sh runs it alone after the suite"]
async fn frozen_broker_holds_no_transaction_and_expiry_goes_on() {
    freeze_scenario(Pooling::Direct).await;
}

/// The broker frozen 20 s, the worker behind PgBouncer in transaction
/// mode with a pool of 2 server connections.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "timing bounds of a second: scripts/test.sh runs it alone after the suite"]
async fn frozen_broker_behind_pgbouncer_pool_of_2_never_makes_expiry_wait() {
    freeze_scenario(Pooling::PgBouncer).await;
}
