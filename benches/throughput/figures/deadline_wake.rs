//! The deadline wake-up figures, each with the release binary's `run` on
//! the real clock and the default 60 s `EXPIRATION_INTERVAL`: lateness
//! (`expired_at` − deadline, read from the rows) of bookings due over
//! minutes, deadline-driven (the defaults) versus the fixed schedule
//! (`EXPIRATION_DEADLINE_WAKE=false`), both at the same time on two
//! databases; statements per minute against PostgreSQL
//! (`pg_stat_statements`, per database) for 1 and 4 instances in both modes;
//! deadline → record on Kafka (the record's timestamp, set by the publisher
//! when it produces) with the publisher on; and bookings written while the
//! instances sleep (late arrivals), with statements per minute idle.

use std::{
    collections::BTreeMap,
    path::PathBuf,
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail, ensure};
use booking_expiration::db;
use chrono::{DateTime, Utc};
use diesel::{
    QueryableByName,
    sql_types::{BigInt, Double, Nullable, Text, Timestamptz},
};
use diesel_async::{AsyncConnection, AsyncPgConnection, RunQueryDsl, SimpleAsyncConnection};
use rskafka::client::partition::{OffsetAt, PartitionClient, UnknownTopicHandling};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use super::profile;
use crate::{
    phase_sql::{due_deadline_expr, spread_insert_sql},
    progress,
    support::{Services, create_topic, db_settings, kafka_client, loadavg, wall_now},
};

/// The binary the bench was built with (bench profile = release profile).
const BINARY: &str = env!("CARGO_BIN_EXE_booking-expiration");
/// The default `EXPIRATION_INTERVAL`, which every run keeps.
const INTERVAL_S: f64 = 60.0;
/// From inserting the bookings to the first deadline: the binaries start
/// (and run their first cycle, with nothing due) meanwhile.
const LEAD: Duration = Duration::from_secs(12);
/// Partitions of the deadline → Kafka topic.
const PARTITIONS: i32 = 3;

/// How the scheduler is configured.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Mode {
    /// The defaults: deadline wake-up on, minimum gap 250 ms.
    DeadlineDriven,
    /// `EXPIRATION_DEADLINE_WAKE=false`: the draft's fixed schedule.
    Fixed,
}

impl Mode {
    pub fn label(self) -> &'static str {
        match self {
            Mode::DeadlineDriven => "deadline-driven",
            Mode::Fixed => "fixed",
        }
    }
}

/// Bookings and the window their deadlines are spread over.
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
pub struct Load {
    pub bookings: u64,
    pub spread_s: f64,
}

impl Load {
    pub fn lateness(quick: bool) -> Self {
        if quick {
            Self::of(1_000, 60.0)
        } else {
            Self::of(10_000, 600.0)
        }
    }
    /// A spread that fits, with 2 s before it and some after it, in a
    /// window of whole intervals ([`statements_window_s`]).
    pub fn statements(quick: bool) -> Self {
        if quick {
            Self::of(500, 50.0)
        } else {
            Self::of(2_000, 110.0)
        }
    }
    pub fn kafka(quick: bool) -> Self {
        if quick {
            Self::of(300, 15.0)
        } else {
            Self::of(1_000, 30.0)
        }
    }
    pub(crate) fn of(bookings: u64, spread_s: f64) -> Self {
        Self { bookings, spread_s }
    }
}

// ---------------------------------------------------------------- lateness

/// The lateness figure (`results.json`'s `lateness`).
#[derive(Debug, Serialize, Deserialize)]
pub struct Lateness {
    /// Per database (one per mode).
    pub load: Load,
    pub interval_s: f64,
    pub deadline_driven: LatenessSide,
    pub fixed: LatenessSide,
    pub loadavg_at_start: [f64; 3],
}

/// One mode's bookings, read back from the rows after the run.
#[derive(Debug, Serialize, Deserialize)]
pub struct LatenessSide {
    pub mode: Mode,
    pub expired: u64,
    /// Still active when the run gave up (0 in a good run).
    pub pending: u64,
    /// `expired_at <= deadline`: must be 0.
    pub at_or_before_deadline: u64,
    pub p50_s: f64,
    pub p99_s: f64,
    pub max_s: f64,
    /// From the last deadline to the moment every row had expired.
    pub done_after_last_deadline_s: f64,
    pub clean_exit: bool,
}

/// Both modes at the same time, each on its own database with the same
/// spread of deadlines; each instance is stopped once its rows have all
/// expired.
pub async fn lateness(svc: &Services, quick: bool) -> Result<Lateness> {
    let load = Load::lateness(quick);
    progress!(
        "7. lateness: {} bookings over {:.0} s, interval {INTERVAL_S} s, deadline-driven and fixed at the same time",
        load.bookings,
        load.spread_s
    );
    let loadavg_at_start = loadavg();
    let modes = [Mode::DeadlineDriven, Mode::Fixed];
    let names = modes.map(|mode| format!("late_{}", mode_name(mode)));
    let (dbs, _, last) = spread_dbs(svc, &names, load).await?;
    let mut instances = Vec::new();
    for (mode, db) in modes.iter().zip(&dbs) {
        instances.push(Some(Instance::spawn(
            svc,
            &svc.url_of(db),
            *mode,
            None,
            &format!("late-{}", mode_name(*mode)),
        )?));
    }
    let give_up = last + secs(INTERVAL_S + 60.0);
    let mut conns = Vec::new();
    for db in &dbs {
        conns.push(AsyncPgConnection::establish(&svc.url_of(db)).await?);
    }
    let mut done_after = [f64::NAN; 2];
    let mut clean = [false; 2];
    let mut last_report = Instant::now();
    loop {
        let mut pending = [0i64; 2];
        for i in 0..2 {
            let Some(instance) = instances[i].as_mut() else {
                continue;
            };
            instance.ensure_running().await?;
            pending[i] = pending_rows(&mut conns[i]).await?;
            if pending[i] == 0 {
                done_after[i] = seconds_between(last, wall_now());
                if let Some(instance) = instances[i].take() {
                    clean[i] = instance.stop().await;
                }
                progress!(
                    "lateness: {} done {:.1} s after the last deadline",
                    modes[i].label(),
                    done_after[i]
                );
            }
        }
        if instances.iter().all(Option::is_none) {
            break;
        }
        if wall_now() > give_up {
            bail!(
                "lateness: rows still active {:.0} s after the last deadline: {pending:?}",
                seconds_between(last, wall_now())
            );
        }
        if last_report.elapsed() > Duration::from_secs(30) {
            progress!(
                "lateness: still active {} (deadline-driven) and {} (fixed); last deadline in {:.0} s",
                pending[0],
                pending[1],
                seconds_between(wall_now(), last)
            );
            last_report = Instant::now();
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    let mut sides = Vec::new();
    for i in 0..2 {
        let row = lateness_of(&mut conns[i]).await?;
        sides.push(LatenessSide::of(
            "lateness",
            modes[i],
            &row,
            done_after[i],
            clean[i],
        ));
    }
    drop(conns);
    for db in &dbs {
        svc.drop_db(db).await?;
    }
    let fixed = sides.pop().context("fixed side")?;
    let deadline_driven = sides.pop().context("deadline-driven side")?;
    Ok(Lateness {
        load,
        interval_s: INTERVAL_S,
        deadline_driven,
        fixed,
        loadavg_at_start,
    })
}

#[derive(QueryableByName)]
struct LateRow {
    #[diesel(sql_type = BigInt)]
    expired: i64,
    #[diesel(sql_type = BigInt)]
    pending: i64,
    #[diesel(sql_type = BigInt)]
    early: i64,
    #[diesel(sql_type = Nullable<Double>)]
    p50: Option<f64>,
    #[diesel(sql_type = Nullable<Double>)]
    p99: Option<f64>,
    #[diesel(sql_type = Nullable<Double>)]
    max: Option<f64>,
}

impl LatenessSide {
    /// One mode's rows read back, reported as a progress line of `figure`.
    fn of(figure: &str, mode: Mode, row: &LateRow, done_after: f64, clean: bool) -> Self {
        let side = Self {
            mode,
            expired: row.expired as u64,
            pending: row.pending as u64,
            at_or_before_deadline: row.early as u64,
            p50_s: row.p50.unwrap_or(f64::NAN),
            p99_s: row.p99.unwrap_or(f64::NAN),
            max_s: row.max.unwrap_or(f64::NAN),
            done_after_last_deadline_s: done_after,
            clean_exit: clean,
        };
        progress!(
            "{figure} {}: {} expired, {} at or before the deadline, p50 {:.3} s, p99 {:.3} s, max {:.3} s",
            side.mode.label(),
            side.expired,
            side.at_or_before_deadline,
            side.p50_s,
            side.p99_s,
            side.max_s
        );
        side
    }
}

/// `expired_at` − deadline over the rows, in seconds.
async fn lateness_of(conn: &mut AsyncPgConnection) -> Result<LateRow> {
    let late = format!("extract(epoch FROM expired_at - {})", due_deadline_expr());
    Ok(diesel::sql_query(format!(
        "SELECT count(expired_at)::bigint AS expired,
                (count(*) - count(expired_at))::bigint AS pending,
                count(*) FILTER (WHERE expired_at <= {dl})::bigint AS early,
                percentile_cont(0.5) WITHIN GROUP (ORDER BY {late})::float8 AS p50,
                percentile_cont(0.99) WITHIN GROUP (ORDER BY {late})::float8 AS p99,
                max({late})::float8 AS max
           FROM bookings",
        dl = due_deadline_expr()
    ))
    .get_result(conn)
    .await?)
}

async fn pending_rows(conn: &mut AsyncPgConnection) -> Result<i64> {
    crate::support::count(
        conn,
        "SELECT count(*)::bigint AS n FROM bookings WHERE expired_at IS NULL",
    )
    .await
}

// -------------------------------------------------------------- statements

/// The statements figure (`results.json`'s `statements`).
#[derive(Debug, Serialize, Deserialize)]
pub struct Statements {
    /// Per configuration (each on its own database).
    pub load: Load,
    pub interval_s: f64,
    pub runs: Vec<StatementsRun>,
    pub loadavg_at_start: [f64; 3],
}

/// One configuration: its instances against one database.
#[derive(Debug, Serialize, Deserialize)]
pub struct StatementsRun {
    pub mode: Mode,
    pub instances: u32,
    /// `pg_stat_statements.calls` summed over the database's top-level
    /// statements, from the reset to the snapshot.
    pub statements: i64,
    pub window_s: f64,
    pub per_minute: f64,
    /// Expired by the snapshot (of `load.bookings`).
    pub expired_in_window: u64,
    /// The most frequent statements: (calls, query on one line).
    pub top: Vec<(i64, String)>,
}

/// The counting window: whole intervals (so it holds as many ticks of the
/// fixed schedule wherever they fall), at least the spread and 4 s.
fn statements_window_s(load: Load) -> f64 {
    ((load.spread_s + 4.0) / INTERVAL_S).ceil() * INTERVAL_S
}

/// The four configurations at the same time on four databases: one reset
/// of `pg_stat_statements` 2 s before the first deadline (every instance
/// has started and run its first cycle), one snapshot a whole number of
/// intervals later, after the last deadline.
pub async fn statements(svc: &Services, quick: bool) -> Result<Statements> {
    let load = Load::statements(quick);
    let configs = [
        (Mode::DeadlineDriven, 1u32),
        (Mode::DeadlineDriven, 4),
        (Mode::Fixed, 1),
        (Mode::Fixed, 4),
    ];
    progress!(
        "9. statements per minute: {} bookings over {:.0} s per configuration, {} configurations at the same time",
        load.bookings,
        load.spread_s,
        configs.len()
    );
    profile::enable_pg_stat_statements(svc).await?;
    let loadavg_at_start = loadavg();
    let names: Vec<String> = configs
        .iter()
        .map(|(mode, n)| format!("stmt_{}_{n}", mode_name(*mode)))
        .collect();
    let (dbs, first, last) = spread_dbs(svc, &names, load).await?;
    let mut instances = Vec::new();
    for ((mode, n), db) in configs.iter().zip(&dbs) {
        for k in 0..*n {
            instances.push(Instance::spawn(
                svc,
                &svc.url_of(db),
                *mode,
                None,
                &format!("stmt-{}-{n}-{k}", mode_name(*mode)),
            )?);
        }
    }
    sleep_until(first - secs(2.0)).await;
    for instance in &mut instances {
        instance.ensure_running().await?;
    }
    svc.admin_exec("SELECT pg_stat_statements_reset()").await?;
    let reset = Instant::now();
    let window = Duration::from_secs_f64(statements_window_s(load));
    progress!(
        "statements: counters reset; snapshot in {:.0} s",
        window.as_secs_f64()
    );
    ensure!(
        wall_now() + secs(window.as_secs_f64()) > last,
        "the window must hold every deadline"
    );
    tokio::time::sleep_until((reset + window).into()).await;
    let mut counted = Vec::new();
    {
        let mut admin = svc.admin().await?;
        for db in &dbs {
            counted.push(calls_of(&mut admin, db).await?);
        }
    }
    let window_s = reset.elapsed().as_secs_f64();
    for instance in &mut instances {
        instance.ensure_running().await?;
    }
    let mut expired = Vec::new();
    for db in &dbs {
        expired.push(expired_count(&svc.url_of(db)).await?);
    }
    for instance in instances {
        instance.stop().await;
    }
    let mut runs = Vec::new();
    for (i, (mode, n)) in configs.into_iter().enumerate() {
        let run = StatementsRun::of(mode, n, &counted[i], window_s, expired[i]);
        progress!(
            "statements {} x{n}: {} in {:.1} s = {:.0}/min, {} of {} expired",
            mode.label(),
            run.statements,
            window_s,
            run.per_minute,
            run.expired_in_window,
            load.bookings
        );
        runs.push(run);
    }
    for db in &dbs {
        svc.drop_db(db).await?;
    }
    Ok(Statements {
        load,
        interval_s: INTERVAL_S,
        runs,
        loadavg_at_start,
    })
}

#[derive(QueryableByName)]
struct CallsRow {
    #[diesel(sql_type = BigInt)]
    calls: i64,
    #[diesel(sql_type = Text)]
    query: String,
}

/// The top-level statements `db` ran since the last reset, most frequent
/// first; a bench writer's `INSERT INTO bookings` is not the worker's.
async fn calls_of(admin: &mut AsyncPgConnection, db: &str) -> Result<Vec<CallsRow>> {
    Ok(diesel::sql_query(
        "SELECT s.calls, s.query FROM pg_stat_statements s
           JOIN pg_database d ON d.oid = s.dbid
          WHERE d.datname = $1 AND s.toplevel AND s.query NOT LIKE 'INSERT INTO bookings%'
          ORDER BY s.calls DESC",
    )
    .bind::<Text, _>(db)
    .load(admin)
    .await?)
}

/// Bookings expired so far in the database at `url`.
async fn expired_count(url: &str) -> Result<u64> {
    let mut conn = AsyncPgConnection::establish(url).await?;
    Ok(crate::support::count(
        &mut conn,
        "SELECT count(*)::bigint AS n FROM bookings WHERE expired_at IS NOT NULL",
    )
    .await? as u64)
}

impl StatementsRun {
    /// One configuration's counts over a window of `window_s`.
    fn of(mode: Mode, instances: u32, calls: &[CallsRow], window_s: f64, expired: u64) -> Self {
        let statements: i64 = calls.iter().map(|r| r.calls).sum();
        Self {
            mode,
            instances,
            statements,
            window_s,
            per_minute: statements as f64 * 60.0 / window_s,
            expired_in_window: expired,
            top: calls
                .iter()
                .take(8)
                .map(|r| {
                    let one_line = r.query.split_whitespace().collect::<Vec<_>>().join(" ");
                    (r.calls, one_line.chars().take(160).collect())
                })
                .collect(),
        }
    }
}

// ------------------------------------------------------- deadline -> Kafka

/// The deadline → Kafka figure (`results.json`'s `deadline_to_kafka`).
#[derive(Debug, Serialize, Deserialize)]
pub struct DeadlineToKafka {
    pub load: Load,
    /// Records read back (the first per booking if one was sent twice).
    pub records: u64,
    /// Deadline → the record's timestamp (the publisher's clock when it
    /// produced the batch), seconds.
    pub record_p50_s: f64,
    pub record_p99_s: f64,
    pub record_max_s: f64,
    /// Deadline → `expired_at` (the expiry alone), seconds.
    pub expired_p50_s: f64,
    pub expired_p99_s: f64,
    /// Deadline → `published_at` (after the broker's ack), seconds.
    pub acked_p50_s: f64,
    pub acked_p99_s: f64,
    pub clean_exit: bool,
    pub loadavg_at_start: [f64; 3],
}

/// One `run` with the publisher on and the defaults; bookings due over the
/// next seconds; every record read back from a fresh topic.
pub async fn deadline_to_kafka(svc: &Services, quick: bool) -> Result<DeadlineToKafka> {
    let load = Load::kafka(quick);
    progress!(
        "8. deadline -> record on Kafka: {} bookings over {:.0} s, binary `run` with the defaults",
        load.bookings,
        load.spread_s
    );
    let loadavg_at_start = loadavg();
    let db = fresh_db(svc, "kafka_deadline").await?;
    let url = svc.url_of(&db);
    let topic = format!("bench-deadline-{}", Uuid::new_v4().simple());
    create_topic(svc, &topic, PARTITIONS).await?;
    let client = kafka_client(svc).await?;
    let mut partitions = Vec::new();
    for p in 0..PARTITIONS {
        partitions.push(
            client
                .partition_client(topic.as_str(), p, UnknownTopicHandling::Retry)
                .await?,
        );
    }
    let first = wall_now() + LEAD;
    let last = first + secs(load.spread_s);
    insert_spread(&url, load, first).await?;
    let mut instance = Instance::spawn(svc, &url, Mode::DeadlineDriven, Some(&topic), "kafka")?;
    let give_up = last + secs(INTERVAL_S + 30.0);
    loop {
        let mut on_kafka = 0i64;
        for pc in &partitions {
            on_kafka += pc.get_offset(OffsetAt::Latest).await?;
        }
        if on_kafka as u64 >= load.bookings {
            break;
        }
        instance.ensure_running().await?;
        if wall_now() > give_up {
            bail!(
                "only {on_kafka} of {} records on Kafka {:.0} s after the last deadline; log: {}",
                load.bookings,
                seconds_between(last, wall_now()),
                instance.log.display()
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let clean_exit = instance.stop().await;
    // First record per booking: its timestamp.
    let mut produced: BTreeMap<String, DateTime<Utc>> = BTreeMap::new();
    for pc in &partitions {
        for (key, ts) in read_partition(pc).await? {
            produced
                .entry(key)
                .and_modify(|t| *t = (*t).min(ts))
                .or_insert(ts);
        }
    }
    let mut conn = AsyncPgConnection::establish(&url).await?;
    let rows: Vec<DeliveredRow> = diesel::sql_query(format!(
        "SELECT b.id::text AS id,
                extract(epoch FROM b.expired_at - {dl})::float8 AS expired_s,
                extract(epoch FROM o.published_at - {dl})::float8 AS acked_s,
                {dl} AS deadline
           FROM bookings b JOIN booking_expiration_outbox o ON o.message_key = b.id::text",
        dl = due_deadline_expr()
    ))
    .load(&mut conn)
    .await?;
    drop(conn);
    ensure!(
        rows.len() as u64 == load.bookings && produced.len() as u64 == load.bookings,
        "{} outbox rows and {} records on Kafka for {} bookings",
        rows.len(),
        produced.len(),
        load.bookings
    );
    let mut record = Vec::new();
    let mut expired = Vec::new();
    let mut acked = Vec::new();
    for row in &rows {
        let ts = produced
            .get(&row.id)
            .with_context(|| format!("no record for booking {}", row.id))?;
        record.push(seconds_between(row.deadline, *ts));
        expired.push(row.expired_s);
        acked.push(row.acked_s.unwrap_or(f64::NAN));
    }
    svc.drop_db(&db).await?;
    let figure = DeadlineToKafka {
        load,
        records: produced.len() as u64,
        record_p50_s: percentile(&record, 0.5),
        record_p99_s: percentile(&record, 0.99),
        record_max_s: percentile(&record, 1.0),
        expired_p50_s: percentile(&expired, 0.5),
        expired_p99_s: percentile(&expired, 0.99),
        acked_p50_s: percentile(&acked, 0.5),
        acked_p99_s: percentile(&acked, 0.99),
        clean_exit,
        loadavg_at_start,
    };
    progress!(
        "deadline -> record: p50 {:.3} s, p99 {:.3} s, max {:.3} s (expiry alone p50 {:.3} s, p99 {:.3} s)",
        figure.record_p50_s,
        figure.record_p99_s,
        figure.record_max_s,
        figure.expired_p50_s,
        figure.expired_p99_s
    );
    Ok(figure)
}

#[derive(QueryableByName)]
struct DeliveredRow {
    #[diesel(sql_type = Text)]
    id: String,
    #[diesel(sql_type = Double)]
    expired_s: f64,
    #[diesel(sql_type = Nullable<Double>)]
    acked_s: Option<f64>,
    #[diesel(sql_type = Timestamptz)]
    deadline: DateTime<Utc>,
}

/// Every record of one partition up to its high watermark: key and timestamp.
async fn read_partition(pc: &PartitionClient) -> Result<Vec<(String, DateTime<Utc>)>> {
    let mut out = Vec::new();
    let mut offset = 0;
    loop {
        let (records, high_watermark) = pc.fetch_records(offset, 1..5_000_000, 500).await?;
        for r in &records {
            let key = String::from_utf8(r.record.key.clone().unwrap_or_default())
                .context("a UTF-8 key")?;
            out.push((key, r.record.timestamp));
        }
        if let Some(last) = records.last() {
            offset = last.offset + 1;
        }
        if records.is_empty() || offset >= high_watermark {
            return Ok(out);
        }
    }
}

// ----------------------------------------------------------- late arrivals

/// The late-arrivals figure (`results.json`'s `late_arrivals`).
#[derive(Debug, Serialize, Deserialize)]
pub struct LateArrivals {
    /// The counting window (whole intervals) and, within it, the writes.
    pub window_s: f64,
    /// Bookings written while the instances ran (into each late database).
    pub written: u64,
    /// Each booking's deadline came this long after its insert (min, max).
    pub lead_s: [f64; 2],
    pub interval_s: f64,
    pub deadline_driven: LatenessSide,
    pub fixed: LatenessSide,
    /// One instance per configuration: with the writes (`expired_in_window`
    /// > 0) and idle, each in both modes. Statements exclude the writer's.
    pub statements: Vec<StatementsRun>,
    pub loadavg_at_start: [f64; 3],
}

/// Shortest and longest time from a booking's insert to its deadline: the
/// issue's case (deadlines 2–8 s after their commit).
const LATE_LEAD_S: [f64; 2] = [2.05, 8.0];

/// Bookings written while the instances sleep: one instance per mode on a
/// database that starts empty, and a writer that inserts a booking into
/// both every 0.5–2.5 s (a fixed pseudo-random sequence), each due 2–8 s
/// after its insert, for the counting window less 10 s; two more instances
/// (one per mode) on empty databases nobody writes to. Statements per
/// minute per database over the window (`pg_stat_statements`, the writer's
/// inserts left out), then lateness from the rows once every booking
/// expired (the fixed schedule needs up to one interval more).
pub async fn late_arrivals(svc: &Services, quick: bool) -> Result<LateArrivals> {
    let window_s = if quick { INTERVAL_S } else { 2.0 * INTERVAL_S };
    progress!(
        "15. late arrivals: bookings written while the worker sleeps, each due 2-8 s after its insert, for {window_s:.0} s; and idle statements"
    );
    profile::enable_pg_stat_statements(svc).await?;
    let loadavg_at_start = loadavg();
    let configs = [
        (Mode::DeadlineDriven, true),
        (Mode::Fixed, true),
        (Mode::DeadlineDriven, false),
        (Mode::Fixed, false),
    ];
    let mut dbs = Vec::new();
    let mut instances = Vec::new();
    for (mode, writes) in configs {
        let name = format!(
            "la_{}_{}",
            mode_name(mode),
            if writes { "late" } else { "idle" }
        );
        let db = fresh_db(svc, &name).await?;
        instances.push(Instance::spawn(svc, &svc.url_of(&db), mode, None, &name)?);
        dbs.push(db);
    }
    // Every instance started and ran its first cycle (nothing due).
    tokio::time::sleep(Duration::from_secs(5)).await;
    for instance in &mut instances {
        instance.ensure_running().await?;
    }
    let mut writers = Vec::new();
    for db in &dbs[..2] {
        writers.push(AsyncPgConnection::establish(&svc.url_of(db)).await?);
    }
    svc.admin_exec("SELECT pg_stat_statements_reset()").await?;
    let reset = Instant::now();
    let window = Duration::from_secs_f64(window_s);
    let writes_until = reset + window - Duration::from_secs(10);
    // xorshift64: the same sequence of gaps and leads in every run.
    let mut state = 0x9e37_79b9_7f4a_7c15_u64;
    let mut uniform = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        (state >> 11) as f64 / (1u64 << 53) as f64
    };
    let mut written = 0u64;
    let mut last_deadline = wall_now();
    while Instant::now() < writes_until {
        tokio::time::sleep(Duration::from_secs_f64(0.5 + 2.0 * uniform())).await;
        let lead = LATE_LEAD_S[0] + (LATE_LEAD_S[1] - LATE_LEAD_S[0]) * uniform();
        let deadline = wall_now() + secs(lead);
        for conn in &mut writers {
            let n = diesel::sql_query(spread_insert_sql())
                .bind::<BigInt, _>(1)
                .bind::<Timestamptz, _>(deadline)
                .bind::<Double, _>(0.0)
                .execute(conn)
                .await?;
            ensure!(n == 1, "inserted {n} bookings");
        }
        written += 1;
        last_deadline = deadline;
    }
    progress!("late arrivals: {written} bookings written; counting until the window ends");
    tokio::time::sleep_until((reset + window).into()).await;
    let mut runs = Vec::new();
    {
        let mut admin = svc.admin().await?;
        let window_s = reset.elapsed().as_secs_f64();
        for ((mode, writes), db) in configs.iter().zip(&dbs) {
            let calls = calls_of(&mut admin, db).await?;
            let expired = expired_count(&svc.url_of(db)).await?;
            let run = StatementsRun::of(*mode, 1, &calls, window_s, expired);
            progress!(
                "late arrivals: statements {} {}: {} in {window_s:.1} s = {:.0}/min",
                mode.label(),
                if *writes { "with the writes" } else { "idle" },
                run.statements,
                run.per_minute
            );
            runs.push(run);
        }
    }
    // Every booking expired: at once for the deadline-driven instance, by
    // the next tick for the fixed one.
    let give_up = last_deadline + secs(INTERVAL_S + 30.0);
    let mut sides = Vec::new();
    let mut instances: Vec<Option<Instance>> = instances.into_iter().map(Some).collect();
    for (i, writer) in writers.iter_mut().enumerate() {
        while pending_rows(writer).await? > 0 {
            ensure!(
                wall_now() < give_up,
                "late arrivals: rows still active {:.0} s after the last deadline",
                seconds_between(last_deadline, wall_now())
            );
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
        let done_after = seconds_between(last_deadline, wall_now());
        let clean = match instances[i].take() {
            Some(instance) => instance.stop().await,
            None => false,
        };
        let row = lateness_of(writer).await?;
        sides.push(LatenessSide::of(
            "late arrivals",
            configs[i].0,
            &row,
            done_after,
            clean,
        ));
    }
    for instance in instances.into_iter().flatten() {
        instance.stop().await;
    }
    drop(writers);
    for db in &dbs {
        svc.drop_db(db).await?;
    }
    let fixed = sides.pop().context("fixed side")?;
    let deadline_driven = sides.pop().context("deadline-driven side")?;
    Ok(LateArrivals {
        window_s,
        written,
        lead_s: LATE_LEAD_S,
        interval_s: INTERVAL_S,
        deadline_driven,
        fixed,
        statements: runs,
        loadavg_at_start,
    })
}

// ---------------------------------------------------------------- plumbing

/// A `booking-expiration run` child process (its own environment only:
/// nothing of the bench's environment leaks in).
pub(crate) struct Instance {
    child: tokio::process::Child,
    pub(crate) pid: u32,
    pub(crate) log: PathBuf,
}

impl Instance {
    /// `run --no-publisher` unless `topic` is given (then the publisher
    /// sends to it); defaults otherwise, `EXPIRATION_DEADLINE_WAKE=false`
    /// for the fixed mode.
    pub(crate) fn spawn(
        svc: &Services,
        url: &str,
        mode: Mode,
        topic: Option<&str>,
        name: &str,
    ) -> Result<Self> {
        let metrics_port = std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port();
        let log = svc.work.join(format!("{name}.log"));
        let file = std::fs::File::create(&log)?;
        let mut command = tokio::process::Command::new(BINARY);
        command.env_clear().arg("run");
        match topic {
            Some(topic) => {
                command
                    .env("KAFKA_BOOTSTRAP_SERVERS", &svc.kafka_bootstrap)
                    .env("KAFKA_TOPIC", topic);
            }
            None => {
                command.arg("--no-publisher");
            }
        }
        if mode == Mode::Fixed {
            command.env("EXPIRATION_DEADLINE_WAKE", "false");
        }
        command
            .env("DATABASE_URL", url)
            .env("METRICS_ADDR", format!("127.0.0.1:{metrics_port}"))
            .env_remove("RUST_LOG")
            .stdin(std::process::Stdio::null())
            .stdout(file.try_clone()?)
            .stderr(file)
            .kill_on_drop(true);
        let child = command
            .spawn()
            .context("start the booking-expiration binary")?;
        let pid = child.id().context("child pid")?;
        Ok(Self { child, pid, log })
    }

    pub(crate) async fn ensure_running(&mut self) -> Result<()> {
        if let Some(status) = self.child.try_wait()? {
            bail!(
                "the binary exited early ({status}); log: {}",
                self.log.display()
            );
        }
        Ok(())
    }

    /// SIGTERM to this child, by its pid; `true` on a clean exit.
    pub(crate) async fn stop(mut self) -> bool {
        let _ = std::process::Command::new("kill")
            .args(["-TERM", &self.pid.to_string()])
            .status();
        match tokio::time::timeout(Duration::from_secs(30), self.child.wait()).await {
            Ok(Ok(status)) => status.success(),
            _ => {
                let _ = self.child.kill().await;
                false
            }
        }
    }
}

fn mode_name(mode: Mode) -> &'static str {
    match mode {
        Mode::DeadlineDriven => "deadline",
        Mode::Fixed => "fixed",
    }
}

/// A new database `dw_<name>` with the migrations applied.
pub(crate) async fn fresh_db(svc: &Services, name: &str) -> Result<String> {
    let db = format!("dw_{name}");
    svc.drop_db(&db).await?;
    svc.admin_exec(&format!("CREATE DATABASE {db}")).await?;
    db::migrate::run_migrations(&db_settings(&svc.url_of(&db), 1)).await?;
    Ok(db)
}

/// `load.bookings` active bookings, deadlines spread from `first` over
/// `load.spread_s`; then `ANALYZE`.
/// A fresh database per name, each with the same `load` of deadlines
/// spread from `first` (a lead from now) to `last`; returns them with
/// `first` and `last`.
async fn spread_dbs(
    svc: &Services,
    names: &[String],
    load: Load,
) -> Result<(Vec<String>, DateTime<Utc>, DateTime<Utc>)> {
    let mut dbs = Vec::new();
    for name in names {
        dbs.push(fresh_db(svc, name).await?);
    }
    let first = wall_now() + LEAD;
    let last = first + secs(load.spread_s);
    for db in &dbs {
        insert_spread(&svc.url_of(db), load, first).await?;
    }
    Ok((dbs, first, last))
}

pub(crate) async fn insert_spread(url: &str, load: Load, first: DateTime<Utc>) -> Result<()> {
    let mut conn = AsyncPgConnection::establish(url).await?;
    let n = diesel::sql_query(spread_insert_sql())
        .bind::<BigInt, _>(load.bookings as i64)
        .bind::<Timestamptz, _>(first)
        .bind::<Double, _>(load.spread_s)
        .execute(&mut conn)
        .await?;
    ensure!(n as u64 == load.bookings, "inserted {n} bookings");
    conn.batch_execute("ANALYZE bookings").await?;
    Ok(())
}

pub(crate) fn secs(s: f64) -> chrono::Duration {
    chrono::Duration::microseconds((s * 1e6) as i64)
}

/// `to − from` in seconds.
pub(crate) fn seconds_between(from: DateTime<Utc>, to: DateTime<Utc>) -> f64 {
    (to - from).num_microseconds().unwrap_or(i64::MAX) as f64 / 1e6
}

pub(crate) async fn sleep_until(at: DateTime<Utc>) {
    let left = seconds_between(wall_now(), at);
    if left > 0.0 {
        tokio::time::sleep(Duration::from_secs_f64(left)).await;
    }
}

/// Linear interpolation between closest ranks (as `percentile_cont`).
fn percentile(values: &[f64], q: f64) -> f64 {
    let mut sorted = values.to_vec();
    sorted.sort_by(|a, b| a.total_cmp(b));
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = q * (sorted.len() - 1) as f64;
    let (lo, hi) = (rank.floor() as usize, rank.ceil() as usize);
    sorted[lo] + (sorted[hi] - sorted[lo]) * (rank - lo as f64)
}
