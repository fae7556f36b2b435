//! Figures 1 and 2, expiry throughput: the worker's cycle against the
//! raw-SQL limit (one statement per batch), on fresh copies of the same
//! template, sides alternating who goes first. Also the expiry runner the
//! other figures use to prepare or profile a backlog ([`expire_all`]).

use std::{
    sync::Arc,
    time::{Duration, Instant},
};

use anyhow::{Result, ensure};
use booking_expiration::{
    clock::ManualClock,
    config::{EventSettings, ExpirySettings, ShutdownSettings},
    context::TaskContext,
    db::PgPool,
    domain::{Phase, RunId},
    expiry::{CycleStart, ExpiryWorker},
};
use chrono::{DateTime, Utc};
use diesel::{
    QueryableByName,
    sql_types::{BigInt, Double, Nullable, Text, Timestamptz, Uuid as SqlUuid},
};
use diesel_async::{AsyncConnection, AsyncPgConnection, RunQueryDsl};
use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use super::{SOURCE, TOPIC, pools, reps};
use crate::{
    phase_sql::{RawHeaders, raw_batch_sql},
    progress,
    support::{Services, Stat, loadavg, num},
    templates::{Backlog, DueSet, Templates},
};

/// One worker-vs-raw comparison to measure.
pub struct Config {
    /// Its key in `results.json`'s `expiry` object.
    pub key: &'static str,
    pub label: &'static str,
    pub backlog: Backlog,
    pub batch: u32,
    pub instances: usize,
    /// Repetitions of a full run.
    pub reps: usize,
    /// Read `pg_stat_database` around the first repetition of each side.
    pub pg_stat_database: bool,
}

/// Figure 1, the headline: 10k due among 90k other rows, batch 200.
pub const HEADLINE: Config = Config {
    key: "expiry_10k_b200_x1",
    label: "expiry 10k due / 100k rows, batch 200, 1 instance",
    backlog: Backlog::TenK,
    batch: 200,
    instances: 1,
    reps: 7,
    pg_stat_database: true,
};

const fn scaling(
    key: &'static str,
    label: &'static str,
    backlog: Backlog,
    batch: u32,
    instances: usize,
) -> Config {
    Config {
        key,
        label,
        backlog,
        batch,
        instances,
        reps: 5,
        pg_stat_database: false,
    }
}

/// Figure 2, scaling: instances, batch sizes, table size, due rows.
pub const SCALING: [Config; 6] = [
    scaling(
        "expiry_10k_b200_x2",
        "expiry 10k due / 100k rows, batch 200, 2 instances",
        Backlog::TenK,
        200,
        2,
    ),
    scaling(
        "expiry_10k_b200_x4",
        "expiry 10k due / 100k rows, batch 200, 4 instances",
        Backlog::TenK,
        200,
        4,
    ),
    scaling(
        "expiry_10k_b50_x1",
        "expiry 10k due / 100k rows, batch 50, 1 instance",
        Backlog::TenK,
        50,
        1,
    ),
    scaling(
        "expiry_10k_b1000_x1",
        "expiry 10k due / 100k rows, batch 1000, 1 instance",
        Backlog::TenK,
        1000,
        1,
    ),
    scaling(
        "expiry_1m_10k_b200_x1",
        "expiry 10k due / 1M rows, batch 200, 1 instance",
        Backlog::TenKOfOneM,
        200,
        1,
    ),
    scaling(
        "expiry_100k_b200_x1",
        "expiry 100k due / 190k rows, batch 200, 1 instance",
        Backlog::HundredK,
        200,
        1,
    ),
];

/// Every expiry figure, in the order of the table.
pub fn configs() -> impl Iterator<Item = &'static Config> {
    std::iter::once(&HEADLINE).chain(SCALING.iter())
}

/// A worker-vs-raw comparison, repeated (one entry of `results.json`'s
/// `expiry` object).
#[derive(Debug, Serialize, Deserialize)]
pub struct Comparison {
    pub label: String,
    /// Rows due at the measured `as_of`.
    pub due: u64,
    /// Bookings in the table.
    pub table_rows: u64,
    pub batch: u32,
    pub instances: usize,
    /// Worker median over raw-SQL median, bookings/s.
    pub ratio: f64,
    pub worker_bookings_per_s: Stat,
    pub raw_sql_bookings_per_s: Stat,
    pub worker_seconds: Stat,
    pub raw_sql_seconds: Stat,
    pub loadavg_at_start: [f64; 3],
    /// What the first repetition of each side wrote.
    pub details: Details,
}

/// The first repetition of each side (fields in the order they print).
#[derive(Debug, Serialize, Deserialize)]
pub struct Details {
    pub raw_sql: SideDetails,
    pub worker: SideDetails,
}

#[derive(Debug, Serialize, Deserialize)]
pub struct SideDetails {
    pub headers_bytes_avg: Option<f64>,
    pub payload_bytes_avg: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pg_stat_database: Option<PgStatDatabase>,
    pub transactions: u32,
}

/// `pg_stat_database` deltas over one run, per expired booking.
#[derive(Debug, Serialize, Deserialize)]
pub struct PgStatDatabase {
    pub commits: f64,
    pub rows_inserted_per_booking: f64,
    pub rows_returned_per_booking: f64,
    pub rows_updated_per_booking: f64,
}

/// Measures `config`: `config.reps` repetitions (a third in quick mode),
/// worker and raw SQL alternating who goes first.
pub async fn measure(
    svc: &Services,
    templates: &Templates,
    config: &Config,
    quick: bool,
) -> Result<Comparison> {
    let set = templates.backlog(config.backlog)?;
    let reps = reps(quick, config.reps);
    let label = config.label;
    let load = loadavg();
    let (mut w_rate, mut r_rate, mut w_secs, mut r_secs) = (vec![], vec![], vec![], vec![]);
    let (mut worker_details, mut raw_details) = (None, None);
    for rep in 0..reps {
        // Alternate who goes first, so drift in the machine's state hits both.
        let order = if rep % 2 == 0 {
            [Side::Worker, Side::Raw]
        } else {
            [Side::Raw, Side::Worker]
        };
        for side in order {
            let m = measure_once(
                svc,
                &set,
                side,
                config.batch,
                config.instances,
                config.pg_stat_database && rep == 0,
            )
            .await?;
            let rate = m.run.expired as f64 / m.run.secs;
            progress!(
                "{label}: rep {}/{reps} {:<6} {} rows in {:.3} s = {} bookings/s ({} transactions)",
                rep + 1,
                format!("{side:?}"),
                m.run.expired,
                m.run.secs,
                num(rate),
                m.run.batches
            );
            let (rates, secs, details) = match side {
                Side::Worker => (&mut w_rate, &mut w_secs, &mut worker_details),
                Side::Raw | Side::RawWith(_) => (&mut r_rate, &mut r_secs, &mut raw_details),
            };
            rates.push(rate);
            secs.push(m.run.secs);
            if rep == 0 {
                *details = Some(m.details());
            }
        }
    }
    let (Some(worker), Some(raw_sql)) = (worker_details, raw_details) else {
        anyhow::bail!("{label}: no repetition ran");
    };
    let worker_rate = Stat::of(&w_rate);
    let raw_rate = Stat::of(&r_rate);
    Ok(Comparison {
        label: label.into(),
        due: set.due,
        table_rows: set.template.rows,
        batch: config.batch,
        instances: config.instances,
        ratio: worker_rate.median / raw_rate.median,
        worker_bookings_per_s: worker_rate,
        raw_sql_bookings_per_s: raw_rate,
        worker_seconds: Stat::of(&w_secs),
        raw_sql_seconds: Stat::of(&r_secs),
        loadavg_at_start: load,
        details: Details { raw_sql, worker },
    })
}

// ---------------------------------------------------------------------------
// One expiry run, either side.
// ---------------------------------------------------------------------------

/// Who expires: the project's worker or the raw-SQL limit.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Side {
    Worker,
    /// The raw statement on the schema as migrated ([`RawHeaders::Json`]).
    Raw,
    /// The raw statement writing other headers (the schema-cost figures).
    RawWith(RawHeaders),
}

/// What one expiry run did.
pub struct ExpiryRun {
    pub expired: u64,
    pub secs: f64,
    pub batches: u32,
}

fn expiry_settings(batch: u32) -> ExpirySettings {
    ExpirySettings {
        interval: Duration::from_secs(60),
        batch_size: batch,
        max_batches_per_cycle: 100_000,
        // One cycle takes the whole backlog, however long it runs.
        cycle_budget: Duration::from_secs(3600),
        // as_of is set explicitly (ManualClock), not read from the clock.
        max_clock_skew: None,
        ..ExpirySettings::default()
    }
}

/// A worker as the figures run it: batch `batch`, a budget for the whole
/// backlog, the clock fixed at `as_of`.
pub fn worker(pool: PgPool, as_of: DateTime<Utc>, batch: u32) -> ExpiryWorker {
    worker_with(pool, as_of, expiry_settings(batch))
}

/// [`worker`] with at most `batches` batches a cycle.
pub fn worker_of_cycles(
    pool: PgPool,
    as_of: DateTime<Utc>,
    batch: u32,
    batches: u32,
) -> ExpiryWorker {
    let settings = ExpirySettings {
        max_batches_per_cycle: batches,
        ..expiry_settings(batch)
    };
    worker_with(pool, as_of, settings)
}

fn worker_with(pool: PgPool, as_of: DateTime<Utc>, settings: ExpirySettings) -> ExpiryWorker {
    ExpiryWorker::new(
        &TaskContext::new(pool, Arc::new(ManualClock::new(as_of))),
        settings,
        EventSettings {
            ce_source: SOURCE.into(),
            topic: TOPIC.into(),
        },
        ShutdownSettings {
            grace: Duration::from_secs(10),
        },
    )
}

/// One raw-SQL instance: phases take turns batch by batch (as the worker's
/// do) until each phase returned a short batch.
async fn raw_instance(
    pool: PgPool,
    as_of: DateTime<Utc>,
    batch: u32,
    headers: RawHeaders,
) -> Result<(u64, u32)> {
    let sql = Phase::ALL.map(|phase| raw_batch_sql(phase, headers));
    let mut conn = pool.get().await?;
    let run_id = Uuid::new_v4();
    let as_of_text = as_of.to_rfc3339_opts(chrono::SecondsFormat::Micros, true);
    let mut finished = [false, false];
    let (mut total, mut batches) = (0u64, 0u32);
    while !finished.iter().all(|f| *f) {
        for (i, sql) in sql.iter().enumerate() {
            if finished[i] {
                continue;
            }
            let n = conn
                .transaction(async |c| {
                    diesel::sql_query(sql.as_str())
                        .bind::<Timestamptz, _>(as_of)
                        .bind::<BigInt, _>(i64::from(batch))
                        .bind::<SqlUuid, _>(run_id)
                        .bind::<Text, _>(TOPIC)
                        .bind::<Text, _>(&as_of_text)
                        .bind::<Text, _>(SOURCE)
                        .bind::<Timestamptz, _>(as_of)
                        .execute(c)
                        .await
                })
                .await?;
            batches += 1;
            total += n as u64;
            if n < batch as usize {
                finished[i] = true;
            }
        }
    }
    Ok((total, batches))
}

/// Expires everything due at `as_of` in the database at `url` with
/// `instances` parallel instances of `side`; returns after `expected` rows
/// expired (more rounds only if parallel instances left rows to each other).
pub async fn expire_all(
    url: &str,
    side: Side,
    as_of: DateTime<Utc>,
    batch: u32,
    instances: usize,
    expected: u64,
) -> Result<ExpiryRun> {
    let pools = pools(url, instances).await?;
    let workers: Vec<Arc<ExpiryWorker>> = pools
        .iter()
        .map(|pool| Arc::new(worker(pool.clone(), as_of, batch)))
        .collect();
    let token = CancellationToken::new();
    let started = Instant::now();
    let (mut expired, mut batches) = (0u64, 0u32);
    for _round in 0..10 {
        let mut tasks = tokio::task::JoinSet::new();
        for i in 0..instances {
            let (worker, pool, token) = (Arc::clone(&workers[i]), pools[i].clone(), token.clone());
            tasks.spawn(async move {
                match side {
                    Side::Worker => {
                        let outcome = worker
                            .run_cycle(CycleStart::new(&token).at(as_of, RunId::generate()))
                            .await?;
                        Ok::<_, anyhow::Error>((outcome.report.expired(), outcome.batches))
                    }
                    Side::Raw => raw_instance(pool, as_of, batch, RawHeaders::Json).await,
                    Side::RawWith(headers) => raw_instance(pool, as_of, batch, headers).await,
                }
            });
        }
        let mut round = 0;
        while let Some(result) = tasks.join_next().await {
            let (n, b) = result??;
            round += n;
            batches += b;
        }
        expired += round;
        if expired >= expected || round == 0 {
            break;
        }
    }
    let secs = started.elapsed().as_secs_f64();
    ensure!(
        expired == expected,
        "{side:?}: expired {expired}, expected {expected}"
    );
    Ok(ExpiryRun {
        expired,
        secs,
        batches,
    })
}

// ---------------------------------------------------------------------------
// One measured run on a fresh copy, with what it wrote.
// ---------------------------------------------------------------------------

#[derive(QueryableByName, Debug)]
pub struct WrittenRows {
    #[diesel(sql_type = BigInt)]
    pub audit: i64,
    #[diesel(sql_type = BigInt)]
    pub outbox: i64,
    #[diesel(sql_type = Nullable<Double>)]
    pub payload_bytes: Option<f64>,
    #[diesel(sql_type = Nullable<Double>)]
    pub headers_bytes: Option<f64>,
}

/// What `side` wrote into the database at `url`, checked: one audit row
/// and one outbox row per booking it `expired`.
pub async fn written_rows(url: &str, side: Side, expired: u64) -> Result<WrittenRows> {
    let mut conn = AsyncPgConnection::establish(url).await?;
    let rows: WrittenRows = diesel::sql_query(
        "SELECT (SELECT count(*) FROM booking_expiration_audit)::bigint AS audit,
                count(*)::bigint AS outbox,
                avg(octet_length(payload))::float8 AS payload_bytes,
                avg(pg_column_size(headers))::float8 AS headers_bytes
           FROM booking_expiration_outbox",
    )
    .get_result(&mut conn)
    .await?;
    ensure!(
        rows.audit as u64 == expired && rows.outbox as u64 == expired,
        "{side:?}: {expired} expired but {} audit and {} outbox rows",
        rows.audit,
        rows.outbox
    );
    Ok(rows)
}

/// Per-database activity counters (read after the measured sessions
/// closed, so every backend flushed its statistics).
#[derive(QueryableByName, Debug, Clone, Copy)]
struct DbActivity {
    #[diesel(sql_type = BigInt)]
    xact_commit: i64,
    #[diesel(sql_type = BigInt)]
    tup_inserted: i64,
    #[diesel(sql_type = BigInt)]
    tup_updated: i64,
    #[diesel(sql_type = BigInt)]
    tup_returned: i64,
}

async fn db_activity(svc: &Services, db: &str) -> Result<DbActivity> {
    let mut conn = svc.admin().await?;
    diesel::sql_query("SELECT pg_stat_clear_snapshot()")
        .execute(&mut conn)
        .await?;
    Ok(diesel::sql_query(
        "SELECT xact_commit, tup_inserted, tup_updated, tup_returned
           FROM pg_stat_database WHERE datname = $1",
    )
    .bind::<Text, _>(db)
    .get_result(&mut conn)
    .await?)
}

/// One measured expiry run on a fresh copy of the template.
struct Measured {
    run: ExpiryRun,
    rows: WrittenRows,
    activity: Option<(DbActivity, DbActivity)>,
}

impl Measured {
    fn details(&self) -> SideDetails {
        let n = self.run.expired as f64;
        SideDetails {
            headers_bytes_avg: self.rows.headers_bytes,
            payload_bytes_avg: self.rows.payload_bytes,
            pg_stat_database: self.activity.map(|(before, after)| PgStatDatabase {
                commits: (after.xact_commit - before.xact_commit) as f64,
                rows_inserted_per_booking: (after.tup_inserted - before.tup_inserted) as f64 / n,
                rows_returned_per_booking: (after.tup_returned - before.tup_returned) as f64 / n,
                rows_updated_per_booking: (after.tup_updated - before.tup_updated) as f64 / n,
            }),
            transactions: self.run.batches,
        }
    }
}

async fn measure_once(
    svc: &Services,
    set: &DueSet<'_>,
    side: Side,
    batch: u32,
    instances: usize,
    with_activity: bool,
) -> Result<Measured> {
    let db = svc.copy(&set.template.name).await?;
    let url = svc.url_of(&db);
    let before = if with_activity {
        Some(db_activity(svc, &db).await?)
    } else {
        None
    };
    let run = expire_all(&url, side, set.as_of, batch, instances, set.due).await?;
    let rows = written_rows(&url, side, run.expired).await?;
    let activity = match before {
        Some(before) => {
            svc.wait_idle(&db).await?;
            // Statistics of a closed backend are flushed at its exit.
            tokio::time::sleep(Duration::from_millis(600)).await;
            Some((before, db_activity(svc, &db).await?))
        }
        None => None,
    };
    svc.drop_db(&db).await?;
    Ok(Measured {
        run,
        rows,
        activity,
    })
}
