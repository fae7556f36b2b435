//! Figure 18 (`sustained`): bookings falling due at a steady rate, step by
//! step (250 to 8,000 a second), with 1 and 4 instances of the release
//! binary's `run` at their defaults (publisher on, logs at the default
//! level into a file), on the bench's own PostgreSQL (default settings) and
//! Kafka broker. Per step: how late the expiring commit is, how late the
//! event is acknowledged on Kafka, the most unpublished rows and due rows,
//! and what each event costs the worker, PostgreSQL and the broker.
//!
//! Each step has its own database (migrations applied) holding
//! `rate × step` bookings whose deadlines are spread evenly (jittered within
//! each slot) over the step, starting a few seconds after the insert
//! (`VACUUM ANALYZE`d, so neither hint bits nor an insert-driven autovacuum
//! of the seed land in the window), and its own 3-partition topic. The
//! instances start meanwhile. The window runs from the first deadline until
//! every booking is expired and published (or the drain bound passes: what
//! is left is counted, and the lateness of the rows left is counted as of
//! then, a lower bound). Over the window: CPU time of the instances
//! (`/proc/PID/stat`, all threads), of every PostgreSQL process
//! (`support::tree_cpu_ms`, the bench's sampling connection taken out),
//! of the broker's JVM, of the whole machine (`/proc/stat`), and the WAL
//! written. Autovacuum runs as it does by default: its work is in the
//! numbers when it falls in a window (the autovacuum and autoanalyze runs
//! of each window are recorded).
//!
//! Lateness is read from the rows afterwards: the expiring commit as the
//! outbox row's `created_at` (the worker's clock just before its batch
//! commits) − the deadline; deadline → acknowledged as `published_at`
//! (set by the round that marks the row, right after the broker's
//! acknowledgement: an upper bound of the acknowledgement) − the deadline.
//!
//! Steps of the two configurations take turns at each rate (1 instance,
//! then 4), so a change in the machine's load hits both.

use std::time::{Duration, Instant};

use anyhow::{Context, Result, ensure};
use booking_expiration::{db::bookings, domain::Phase};
use chrono::{DateTime, Utc};
use diesel::{
    QueryableByName,
    sql_types::{BigInt, Double, Timestamptz},
};
use diesel_async::{AsyncConnection, AsyncPgConnection, RunQueryDsl, SimpleAsyncConnection};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use super::deadline_wake::{
    Instance, Load, Mode, fresh_db, insert_spread, seconds_between, secs, sleep_until,
};
use crate::{
    phase_sql::due_deadline_expr,
    progress,
    support::{
        Services, backend_pid, create_topic, env_list, kafka_client, loadavg, machine_cpu_ms,
        pid_cpu_ms, process_cpu_ms, records_on, run_time_ms, tree_cpu_ms, wall_now,
    },
};

/// Rates of the full run, bookings falling due per second.
const RATES: [f64; 6] = [250.0, 500.0, 1_000.0, 2_000.0, 4_000.0, 8_000.0];
/// Rates of the quick run.
const QUICK_RATES: [f64; 3] = [500.0, 2_000.0, 8_000.0];
/// Seconds of deadlines per step (quick: 10).
const STEP_S: f64 = 40.0;
const QUICK_STEP_S: f64 = 10.0;
/// Instance counts, in the order they take turns.
const INSTANCES: [u32; 3] = [1, 2, 4];
/// How often the backlog is sampled.
const SAMPLE_EVERY: Duration = Duration::from_millis(500);
/// From the instances' start to the first deadline, beyond the insert.
const LEAD_S: f64 = 5.0;
/// Partitions of each step's topic (`KAFKA_TOPIC_PARTITIONS`' default).
const PARTITIONS: i32 = 3;

/// The figure (`results.json`'s `sustained`).
#[derive(Debug, Serialize, Deserialize)]
pub struct Sustained {
    pub step_s: f64,
    pub rates: Vec<f64>,
    pub configs: Vec<SustainedConfig>,
    /// Wall seconds of the whole figure.
    pub duration_s: f64,
    pub loadavg_at_start: [f64; 3],
    pub loadavg_at_end: [f64; 3],
}

/// The steps of one instance count.
#[derive(Debug, Serialize, Deserialize)]
pub struct SustainedConfig {
    pub instances: u32,
    pub steps: Vec<Step>,
}

/// One step: `bookings` deadlines at `rate` a second.
#[derive(Debug, Serialize, Deserialize)]
pub struct Step {
    pub rate: f64,
    pub bookings: u64,
    /// From the first deadline until every booking was expired and
    /// published (or the drain bound).
    pub window_s: f64,
    /// From the last deadline until every booking was expired, and until
    /// every one was published.
    pub expired_after_last_deadline_s: f64,
    pub published_after_last_deadline_s: f64,
    pub expired: u64,
    pub published: u64,
    /// Records on the topic (high watermarks) at the end.
    pub on_kafka: u64,
    /// Not expired, not published when the step ended (0 in a step that
    /// kept up).
    pub left_active: u64,
    pub left_unpublished: u64,
    /// Expiring commit − deadline (outbox `created_at`), seconds.
    pub commit_p50_s: f64,
    pub commit_p99_s: f64,
    pub commit_max_s: f64,
    /// `expired_at` (the cycle's time) − deadline, seconds.
    pub expired_at_p99_s: f64,
    /// Acknowledged on Kafka (`published_at`) − deadline, seconds.
    pub acked_p50_s: f64,
    pub acked_p99_s: f64,
    /// Rows expired at or before their deadline (must be 0).
    pub early: u64,
    /// The most unpublished outbox rows and the most due, not yet expired
    /// bookings seen by the sampling.
    pub max_unpublished: u64,
    pub max_due: u64,
    /// CPU milliseconds per 1,000 events: the instances (all threads),
    /// PostgreSQL (every process, the sampling connection taken out), the
    /// broker.
    pub worker_cpu_ms_per_1000: f64,
    pub pg_cpu_ms_per_1000: f64,
    pub kafka_cpu_ms_per_1000: f64,
    /// WAL bytes per 1,000 events.
    pub wal_bytes_per_1000: f64,
    /// Cores used on average over the window: the instances, PostgreSQL,
    /// the broker, and the whole machine (everyone's work on it).
    pub worker_cores: f64,
    pub pg_cores: f64,
    pub kafka_cores: f64,
    pub machine_busy_cores: f64,
    /// What the rest of the machine used meanwhile (other users' work):
    /// the machine less the instances, PostgreSQL, the broker and this
    /// bench.
    #[serde(default)]
    pub others_cores: f64,
    /// Autovacuum and autoanalyze runs on the step's tables in the window.
    pub autovacuum_runs: i64,
    /// Log bytes the instances wrote per event.
    pub log_bytes_per_event: f64,
    pub clean_exit: bool,
    pub loadavg_at_start: [f64; 3],
    /// Seconds since the first deadline, due bookings, unpublished rows.
    pub samples: Vec<(f64, u64, u64)>,
}

/// The rates and step length of this run: `BENCH_SUSTAINED_RATES` (a
/// comma-separated list) and `BENCH_SUSTAINED_STEP_S` override the
/// defaults (for trying; the committed run uses the defaults).
fn plan(quick: bool) -> Result<(Vec<f64>, f64)> {
    let rates = match env_list("BENCH_SUSTAINED_RATES", "numbers")? {
        Some(rates) => rates,
        None if quick => QUICK_RATES.to_vec(),
        None => RATES.to_vec(),
    };
    let step_s = match std::env::var("BENCH_SUSTAINED_STEP_S") {
        Ok(v) if !v.trim().is_empty() => v.trim().parse().context("BENCH_SUSTAINED_STEP_S")?,
        _ if quick => QUICK_STEP_S,
        _ => STEP_S,
    };
    Ok((rates, step_s))
}

pub async fn measure(svc: &Services, quick: bool) -> Result<Sustained> {
    let (rates, step_s) = plan(quick)?;
    let started = Instant::now();
    let loadavg_at_start = loadavg();
    progress!(
        "18. sustained rate: steps of {} bookings/s, {step_s:.0} s each, {} instances in turn, binary `run` at its defaults",
        rates
            .iter()
            .map(|r| format!("{r:.0}"))
            .collect::<Vec<_>>()
            .join(", "),
        INSTANCES
            .iter()
            .map(u32::to_string)
            .collect::<Vec<_>>()
            .join(" and ")
    );
    let mut configs: Vec<SustainedConfig> = INSTANCES
        .iter()
        .map(|&instances| SustainedConfig {
            instances,
            steps: Vec::new(),
        })
        .collect();
    // Rows inserted per second, measured as the run goes: how much lead the
    // next insert needs.
    let mut insert_rate = 20_000.0;
    for &rate in &rates {
        for config in &mut configs {
            let step = run_step(svc, rate, step_s, config.instances, &mut insert_rate).await?;
            config.steps.push(step);
        }
    }
    Ok(Sustained {
        step_s,
        rates,
        configs,
        duration_s: started.elapsed().as_secs_f64(),
        loadavg_at_start,
        loadavg_at_end: loadavg(),
    })
}

/// A reading of everything the step accounts for.
#[derive(Clone, Copy, Debug)]
struct Reading {
    worker_ms: f64,
    pg_ms: f64,
    monitor_ms: f64,
    kafka_ms: f64,
    machine_busy_ms: f64,
    bench_ms: f64,
    wal: f64,
    autovacuum: i64,
}

#[derive(QueryableByName)]
struct WalAndVacuum {
    #[diesel(sql_type = Double)]
    wal: f64,
    #[diesel(sql_type = BigInt)]
    autovacuum: i64,
}

async fn reading(
    svc: &Services,
    monitor: &mut AsyncPgConnection,
    monitor_pid: u32,
    instances: &[Instance],
) -> Result<Reading> {
    let row: WalAndVacuum = diesel::sql_query(
        "SELECT pg_wal_lsn_diff(pg_current_wal_insert_lsn(), '0/0')::float8 AS wal,
                (SELECT coalesce(sum(autovacuum_count + autoanalyze_count), 0)::bigint
                   FROM pg_stat_user_tables) AS autovacuum",
    )
    .get_result(monitor)
    .await?;
    let (busy, _) = machine_cpu_ms();
    Ok(Reading {
        worker_ms: instances
            .iter()
            .map(|i| pid_cpu_ms(i.pid).unwrap_or(f64::NAN))
            .sum(),
        pg_ms: tree_cpu_ms(svc.postmaster_pid()?),
        monitor_ms: run_time_ms(monitor_pid),
        kafka_ms: pid_cpu_ms(svc.kafka_pid()?).unwrap_or(f64::NAN),
        machine_busy_ms: busy,
        bench_ms: process_cpu_ms(),
        wal: row.wal,
        autovacuum: row.autovacuum,
    })
}

#[derive(QueryableByName)]
struct Unpublished {
    #[diesel(sql_type = BigInt)]
    n: i64,
}

/// Due bookings not yet expired, and unpublished outbox rows (the same
/// partial-index scans `status` and the lag gauge use).
async fn backlog(conn: &mut AsyncPgConnection) -> Result<(u64, u64)> {
    let now = wall_now();
    let mut due = 0;
    for phase in Phase::ALL {
        due += bookings::count_due(conn, phase, now).await?;
    }
    let unpublished: Unpublished = diesel::sql_query(
        "SELECT count(*)::bigint AS n FROM booking_expiration_outbox
          WHERE published_at IS NULL AND parked_at IS NULL",
    )
    .get_result(conn)
    .await?;
    Ok((due as u64, unpublished.n as u64))
}

async fn run_step(
    svc: &Services,
    rate: f64,
    step_s: f64,
    n_instances: u32,
    insert_rate: &mut f64,
) -> Result<Step> {
    let bookings = (rate * step_s).round() as u64;
    let name = format!("sus_{}_{:.0}", n_instances, rate);
    let db = fresh_db(svc, &name).await?;
    let url = svc.url_of(&db);
    let topic = format!("bench-sustained-{}", Uuid::new_v4().simple());
    create_topic(svc, &topic, PARTITIONS).await?;
    // The first deadline leaves room for the insert (at the rate measured
    // so far, with a margin), the vacuum and the instances' start.
    let lead = LEAD_S + 1.5 * bookings as f64 / *insert_rate;
    let first = wall_now() + secs(lead);
    let last = first + secs(step_s);
    let insert_started = Instant::now();
    insert_spread(&url, Load::of(bookings, step_s), first).await?;
    let took = insert_started.elapsed().as_secs_f64();
    *insert_rate = (bookings as f64 / took.max(0.01)).min(200_000.0);
    {
        let mut conn = AsyncPgConnection::establish(&url).await?;
        conn.batch_execute("VACUUM ANALYZE bookings").await?;
    }
    let mut instances = Vec::new();
    for k in 0..n_instances {
        instances.push(Instance::spawn(
            svc,
            &url,
            Mode::DeadlineDriven,
            Some(topic.as_str()),
            &format!("{name}-{k}"),
        )?);
    }
    let margin = seconds_between(wall_now(), first);
    progress!(
        "sustained x{n_instances} {rate:.0}/s: {bookings} bookings inserted in {took:.1} s; first deadline in {margin:.1} s"
    );
    ensure!(
        margin > 1.0,
        "sustained: the insert took too long ({took:.1} s): the first deadline is {margin:.1} s away"
    );
    let mut monitor = AsyncPgConnection::establish(&url).await?;
    let monitor_pid = backend_pid(&mut monitor).await?;
    let loadavg_at_start = loadavg();
    sleep_until(first - secs(0.2)).await;
    for instance in &mut instances {
        instance.ensure_running().await?;
    }
    let r0 = reading(svc, &mut monitor, monitor_pid, &instances).await?;
    let t0 = Instant::now();
    // Drain bound: after the last deadline, as long as the step again (at
    // least 30 s).
    let give_up = last + secs(step_s.max(30.0));
    let mut samples = Vec::new();
    let (mut max_due, mut max_unpublished) = (0, 0);
    let (mut expired_after, mut published_after) = (f64::NAN, f64::NAN);
    let mut next = t0;
    loop {
        next += SAMPLE_EVERY;
        tokio::time::sleep_until(next.into()).await;
        let (due, unpublished) = backlog(&mut monitor).await?;
        let now = wall_now();
        samples.push((seconds_between(first, now), due, unpublished));
        max_due = max_due.max(due);
        max_unpublished = max_unpublished.max(unpublished);
        if now > last {
            let after = seconds_between(last, now);
            if due == 0 && expired_after.is_nan() {
                expired_after = after;
            }
            if due == 0 && unpublished == 0 {
                published_after = after;
                break;
            }
        }
        if now > give_up {
            progress!(
                "sustained x{n_instances} {rate:.0}/s: gave up {:.0} s after the last deadline with {due} due and {unpublished} unpublished",
                seconds_between(last, now)
            );
            break;
        }
        if samples.len() % 20 == 0 {
            for instance in &mut instances {
                instance.ensure_running().await?;
            }
        }
    }
    let r1 = reading(svc, &mut monitor, monitor_pid, &instances).await?;
    let window_s = t0.elapsed().as_secs_f64();
    let ended = wall_now();
    let mut clean_exit = true;
    let mut log_bytes = 0;
    for instance in instances {
        log_bytes += std::fs::metadata(&instance.log).map_or(0, |m| m.len());
        clean_exit &= instance.stop().await;
    }
    let on_kafka = records_on(&kafka_client(svc).await?, &topic, PARTITIONS).await?;
    let rows = lateness(&mut monitor, ended).await?;
    drop(monitor);
    svc.drop_db(&db).await?;

    let events = rows.published.max(1) as f64;
    let per_1000 = |ms: f64| ms * 1000.0 / events;
    let pg_ms = (r1.pg_ms - r0.pg_ms) - (r1.monitor_ms - r0.monitor_ms);
    let window_ms = window_s * 1e3;
    let step = Step {
        rate,
        bookings,
        window_s,
        expired_after_last_deadline_s: expired_after,
        published_after_last_deadline_s: published_after,
        expired: rows.expired as u64,
        published: rows.published as u64,
        on_kafka,
        left_active: bookings - rows.expired as u64,
        left_unpublished: bookings - rows.published as u64,
        commit_p50_s: rows.commit_p50,
        commit_p99_s: rows.commit_p99,
        commit_max_s: rows.commit_max,
        expired_at_p99_s: rows.expired_p99,
        acked_p50_s: rows.acked_p50,
        acked_p99_s: rows.acked_p99,
        early: rows.early as u64,
        max_unpublished,
        max_due,
        worker_cpu_ms_per_1000: per_1000(r1.worker_ms - r0.worker_ms),
        pg_cpu_ms_per_1000: per_1000(pg_ms),
        kafka_cpu_ms_per_1000: per_1000(r1.kafka_ms - r0.kafka_ms),
        wal_bytes_per_1000: (r1.wal - r0.wal) * 1000.0 / events,
        worker_cores: (r1.worker_ms - r0.worker_ms) / window_ms,
        pg_cores: pg_ms / window_ms,
        kafka_cores: (r1.kafka_ms - r0.kafka_ms) / window_ms,
        machine_busy_cores: (r1.machine_busy_ms - r0.machine_busy_ms) / window_ms,
        others_cores: ((r1.machine_busy_ms - r0.machine_busy_ms)
            - (r1.worker_ms - r0.worker_ms)
            - (r1.pg_ms - r0.pg_ms)
            - (r1.kafka_ms - r0.kafka_ms)
            - (r1.bench_ms - r0.bench_ms))
            / window_ms,
        autovacuum_runs: r1.autovacuum - r0.autovacuum,
        log_bytes_per_event: log_bytes as f64 / events,
        clean_exit,
        loadavg_at_start,
        samples,
    };
    progress!(
        "sustained x{n_instances} {rate:.0}/s: commit lateness p50 {:.3} s p99 {:.3} s max {:.3} s, acked p99 {:.3} s; most due {}, most unpublished {}; \
         per 1,000 events: worker {:.0} ms, PostgreSQL {:.0} ms, Kafka {:.0} ms CPU, WAL {:.2} MB; cores: worker {:.2}, PostgreSQL {:.2}, Kafka {:.2}, machine {:.2} (others {:.2}); \
         expired +{:.1} s, published +{:.1} s after the last deadline; left {} / {}; {} on Kafka; {} autovacuum runs",
        step.commit_p50_s,
        step.commit_p99_s,
        step.commit_max_s,
        step.acked_p99_s,
        step.max_due,
        step.max_unpublished,
        step.worker_cpu_ms_per_1000,
        step.pg_cpu_ms_per_1000,
        step.kafka_cpu_ms_per_1000,
        step.wal_bytes_per_1000 / 1e6,
        step.worker_cores,
        step.pg_cores,
        step.kafka_cores,
        step.machine_busy_cores,
        step.others_cores,
        step.expired_after_last_deadline_s,
        step.published_after_last_deadline_s,
        step.left_active,
        step.left_unpublished,
        step.on_kafka,
        step.autovacuum_runs
    );
    Ok(step)
}

#[derive(QueryableByName)]
struct Late {
    #[diesel(sql_type = BigInt)]
    expired: i64,
    #[diesel(sql_type = BigInt)]
    published: i64,
    #[diesel(sql_type = BigInt)]
    early: i64,
    #[diesel(sql_type = Double)]
    commit_p50: f64,
    #[diesel(sql_type = Double)]
    commit_p99: f64,
    #[diesel(sql_type = Double)]
    commit_max: f64,
    #[diesel(sql_type = Double)]
    expired_p99: f64,
    #[diesel(sql_type = Double)]
    acked_p50: f64,
    #[diesel(sql_type = Double)]
    acked_p99: f64,
}

/// Lateness over every booking of the step; a booking not expired (not
/// published) by `ended` counts as expired (published) then.
async fn lateness(conn: &mut AsyncPgConnection, ended: DateTime<Utc>) -> Result<Late> {
    let sql = format!(
        "WITH j AS (
            SELECT b.expired_at, o.published_at,
                   extract(epoch FROM coalesce(o.created_at, $1) - {dl})::float8 AS commit_s,
                   extract(epoch FROM coalesce(b.expired_at, $1) - {dl})::float8 AS expired_s,
                   extract(epoch FROM coalesce(o.published_at, $1) - {dl})::float8 AS acked_s
              FROM bookings b
              LEFT JOIN booking_expiration_outbox o ON o.message_key = b.id::text
        )
        SELECT count(expired_at)::bigint AS expired,
               count(published_at)::bigint AS published,
               count(*) FILTER (WHERE commit_s <= 0)::bigint AS early,
               percentile_cont(0.5) WITHIN GROUP (ORDER BY commit_s)::float8 AS commit_p50,
               percentile_cont(0.99) WITHIN GROUP (ORDER BY commit_s)::float8 AS commit_p99,
               max(commit_s)::float8 AS commit_max,
               percentile_cont(0.99) WITHIN GROUP (ORDER BY expired_s)::float8 AS expired_p99,
               percentile_cont(0.5) WITHIN GROUP (ORDER BY acked_s)::float8 AS acked_p50,
               percentile_cont(0.99) WITHIN GROUP (ORDER BY acked_s)::float8 AS acked_p99
          FROM j",
        dl = due_deadline_expr()
    );
    Ok(diesel::sql_query(sql)
        .bind::<Timestamptz, _>(ended)
        .get_result(conn)
        .await?)
}

/// The knee of one configuration: the first rate whose commit lateness p99
/// left its floor (more than twice the lowest step's, and at least 0.25 s
/// above it) or that did not keep up (rows left when the drain bound
/// passed, or the backlog not gone 2 s after the last deadline). `None`
/// when every step kept up.
pub fn knee(config: &SustainedConfig) -> Option<&Step> {
    let floor = config
        .steps
        .iter()
        .map(|s| s.commit_p99_s)
        .fold(f64::INFINITY, f64::min);
    config.steps.iter().find(|s| {
        s.commit_p99_s > (2.0 * floor).max(floor + 0.25)
            || s.left_active > 0
            || s.left_unpublished > 0
            // NaN (never published) counts as a miss.
            || !matches!(
                s.published_after_last_deadline_s.partial_cmp(&2.0),
                Some(std::cmp::Ordering::Less | std::cmp::Ordering::Equal)
            )
    })
}
