//! `cargo bench --bench throughput`: the worker and the publisher against
//! baselines measured in the same run, on a PostgreSQL cluster (default
//! settings: fsync and synchronous commit on) and a Kafka 4.4.0 broker that
//! this program starts itself. Prints a table of ratios and writes
//! `results.json` and `scaling.svg` (default folder `docs/bench`, or
//! `BENCH_OUT`). `BENCH_QUICK=1` runs fewer repetitions and writes to a
//! temporary folder unless `BENCH_OUT` is set. See docs/benchmarks.md.

mod support;

use std::{
    collections::BTreeMap,
    path::PathBuf,
    sync::Arc,
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail, ensure};
use booking_expiration::{
    clock::{ManualClock, SystemClock},
    config::{
        Compression, EventSettings, ExpirySettings, KafkaSettings, PublisherSettings,
        ShutdownSettings,
    },
    db::{self, PgPool, bookings, outbox, seed::SeedPlan},
    domain::{Phase, RunId},
    expiry::ExpiryWorker,
    outbox::{KafkaSink, Publisher, kafka::OutgoingRecord},
    telemetry::{Health, Metrics},
};
use chrono::{DateTime, Utc};
use diesel::{
    QueryableByName,
    sql_types::{Array, BigInt, Double, Nullable, Text, Timestamptz, Uuid as SqlUuid},
};
use diesel_async::{AsyncConnection, AsyncPgConnection, RunQueryDsl, SimpleAsyncConnection};
use serde_json::{Value, json};
use support::{Services, Stat, count, create_topic, db_settings, kafka_client, loadavg, num, plot};
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

const TOPIC: &str = "pin.crm.booking-expired.v1";
const SOURCE: &str = "/pin/crm/booking-expiration";
const PUBLISH_BATCH: u32 = 500;
/// `OUTBOX_CONCURRENCY`'s default: batches in flight while draining.
fn publish_concurrency() -> u32 {
    booking_expiration::config::defaults::OUTBOX_CONCURRENCY
}

// ---------------------------------------------------------------------------
// The raw-SQL limit of one expiry batch: lock, update, audit and outbox in
// ONE statement, one transaction per batch. Same rows, same columns, same
// audit and outbox rows as the worker; the payload is built in SQL with the
// same fields (UUID strings, phase, timestamp), so its size is close to the
// worker's protobuf (both sizes are printed).
// ---------------------------------------------------------------------------

fn raw_batch_sql(phase: Phase) -> String {
    let target = phase.target_status();
    // The protobuf enum's name, as the worker's payload carries it.
    let phase_name = format!("PHASE_{}", phase.as_str().to_ascii_uppercase());
    format!(
        "WITH c AS (
    SELECT id, status FROM bookings
     WHERE {predicate} AND deal_id IS NOT NULL AND property_object_id IS NOT NULL
     ORDER BY {deadline} LIMIT $2 FOR UPDATE SKIP LOCKED
), u AS (
    UPDATE bookings b
       SET status = '{target}', expired_at = $1, updated_at = $1, version = b.version + 1
      FROM c WHERE b.id = c.id
    RETURNING b.id, b.tenant_id, b.deal_id, b.property_object_id, b.version, c.status AS from_status
), e AS (
    SELECT u.*, gen_random_uuid() AS event_id FROM u
), a AS (
    INSERT INTO booking_expiration_audit
           (booking_id, tenant_id, from_status, to_status, actor, correlation_id, at)
    SELECT id, tenant_id, from_status, '{target}', 'system', $3, $1 FROM e
)
INSERT INTO booking_expiration_outbox
       (event_id, topic, message_key, payload, headers, correlation_id, tenant_id, created_at)
SELECT event_id, $4, id::text,
       convert_to(concat_ws('|', event_id, 1, 'Booking', id, tenant_id, deal_id, property_object_id,
                            '{phase_name}', $5::text, $3::uuid, version), 'UTF8'),
       jsonb_build_object('ce_id', event_id::text, 'ce_source', $6::text, 'ce_specversion', '1.0',
                          'ce_time', $5::text, 'ce_type', $4::text,
                          'content-type', 'application/protobuf',
                          'correlation_id', $3::text, 'tenant_id', tenant_id::text),
       $3, tenant_id, $7
  FROM e",
        predicate = bookings::due_predicate(phase),
        deadline = bookings::deadline_column(phase),
    )
}

/// One raw-SQL instance: phases take turns batch by batch (as the worker's
/// do) until each phase returned a short batch.
async fn raw_instance(pool: PgPool, as_of: DateTime<Utc>, batch: u32) -> Result<(u64, u32)> {
    let sql = [raw_batch_sql(Phase::Reserve), raw_batch_sql(Phase::Booking)];
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

fn events() -> EventSettings {
    EventSettings {
        ce_source: SOURCE.into(),
        topic: TOPIC.into(),
    }
}

/// A worker as the benchmarks run it: `as_of` set by the clock given.
fn worker(pool: PgPool, as_of: DateTime<Utc>, batch: u32) -> ExpiryWorker {
    ExpiryWorker::new(
        pool,
        Arc::new(ManualClock::new(as_of)),
        expiry_settings(batch),
        events(),
        ShutdownSettings {
            grace: Duration::from_secs(10),
        },
        Arc::new(Metrics::new()),
    )
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Side {
    Worker,
    Raw,
}

/// What one expiry run did.
struct ExpiryRun {
    expired: u64,
    secs: f64,
    batches: u32,
}

/// Opens `instances` pools on `url` (one warm connection each, so the
/// timing starts with connections open, as in a running service).
async fn pools(url: &str, instances: usize) -> Result<Vec<PgPool>> {
    let mut out = Vec::new();
    for _ in 0..instances {
        let pool = db::build_pool(&db_settings(url, 2));
        drop(pool.get().await?);
        out.push(pool);
    }
    Ok(out)
}

/// Expires everything due at `as_of` in the database at `url` with
/// `instances` parallel instances of `side`; returns after `expected` rows
/// expired (more rounds only if parallel instances left rows to each other).
async fn expire_all(
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
                            .run_cycle_at(as_of, RunId::generate(), &token)
                            .await?;
                        Ok::<_, anyhow::Error>((
                            outcome.report.reserve_expired_count
                                + outcome.report.booking_expired_count,
                            outcome.batches,
                        ))
                    }
                    Side::Raw => raw_instance(pool, as_of, batch).await,
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

#[derive(QueryableByName, Debug)]
struct WrittenRows {
    #[diesel(sql_type = BigInt)]
    audit: i64,
    #[diesel(sql_type = BigInt)]
    outbox: i64,
    #[diesel(sql_type = Nullable<Double>)]
    payload_bytes: Option<f64>,
    #[diesel(sql_type = Nullable<Double>)]
    headers_bytes: Option<f64>,
}

async fn written_rows(url: &str) -> Result<WrittenRows> {
    let mut conn = AsyncPgConnection::establish(url).await?;
    Ok(diesel::sql_query(
        "SELECT (SELECT count(*) FROM booking_expiration_audit)::bigint AS audit,
                count(*)::bigint AS outbox,
                avg(octet_length(payload))::float8 AS payload_bytes,
                avg(pg_column_size(headers))::float8 AS headers_bytes
           FROM booking_expiration_outbox",
    )
    .get_result(&mut conn)
    .await?)
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

/// One measured expiry run on a fresh copy of `template`.
struct Measured {
    run: ExpiryRun,
    rows: WrittenRows,
    activity: Option<(DbActivity, DbActivity)>,
}

#[allow(clippy::too_many_arguments)]
async fn measure_expiry(
    svc: &Services,
    template: &str,
    side: Side,
    as_of: DateTime<Utc>,
    batch: u32,
    instances: usize,
    expected: u64,
    with_activity: bool,
) -> Result<Measured> {
    let db = svc.copy(template).await?;
    let url = svc.url_of(&db);
    let before = if with_activity {
        Some(db_activity(svc, &db).await?)
    } else {
        None
    };
    let run = expire_all(&url, side, as_of, batch, instances, expected).await?;
    let rows = written_rows(&url).await?;
    ensure!(
        rows.audit as u64 == run.expired && rows.outbox as u64 == run.expired,
        "{side:?}: {} expired but {} audit and {} outbox rows",
        run.expired,
        rows.audit,
        rows.outbox
    );
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

/// A worker-vs-raw comparison, repeated.
struct Comparison {
    key: String,
    label: String,
    due: u64,
    table_rows: u64,
    batch: u32,
    instances: usize,
    worker_rate: Stat,
    raw_rate: Stat,
    worker_secs: Stat,
    raw_secs: Stat,
    load: [f64; 3],
    extra: Value,
}

impl Comparison {
    fn ratio(&self) -> f64 {
        self.worker_rate.median / self.raw_rate.median
    }
}

#[allow(clippy::too_many_arguments)]
async fn compare_expiry(
    svc: &Services,
    key: &str,
    label: &str,
    template: &Template,
    as_of: DateTime<Utc>,
    expected: u64,
    batch: u32,
    instances: usize,
    reps: usize,
    profile: bool,
) -> Result<Comparison> {
    let load = loadavg();
    let (mut w_rate, mut r_rate, mut w_secs, mut r_secs) = (vec![], vec![], vec![], vec![]);
    let mut extra = serde_json::Map::new();
    for rep in 0..reps {
        // Alternate who goes first, so drift in the machine's state hits both.
        let order = if rep % 2 == 0 {
            [Side::Worker, Side::Raw]
        } else {
            [Side::Raw, Side::Worker]
        };
        for side in order {
            let m = measure_expiry(
                svc,
                &template.name,
                side,
                as_of,
                batch,
                instances,
                expected,
                profile && rep == 0,
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
            let (rates, secs, name) = match side {
                Side::Worker => (&mut w_rate, &mut w_secs, "worker"),
                Side::Raw => (&mut r_rate, &mut r_secs, "raw_sql"),
            };
            rates.push(rate);
            secs.push(m.run.secs);
            if rep == 0 {
                let mut info = json!({
                    "payload_bytes_avg": m.rows.payload_bytes,
                    "headers_bytes_avg": m.rows.headers_bytes,
                    "transactions": m.run.batches,
                });
                if let Some((before, after)) = m.activity {
                    let n = m.run.expired as f64;
                    let commits = (after.xact_commit - before.xact_commit) as f64;
                    info["pg_stat_database"] = json!({
                        "commits": commits,
                        "rows_inserted_per_booking": (after.tup_inserted - before.tup_inserted) as f64 / n,
                        "rows_updated_per_booking": (after.tup_updated - before.tup_updated) as f64 / n,
                        "rows_returned_per_booking": (after.tup_returned - before.tup_returned) as f64 / n,
                    });
                }
                extra.insert(name.into(), info);
            }
        }
    }
    Ok(Comparison {
        key: key.into(),
        label: label.into(),
        due: expected,
        table_rows: template.rows,
        batch,
        instances,
        worker_rate: Stat::of(&w_rate),
        raw_rate: Stat::of(&r_rate),
        worker_secs: Stat::of(&w_secs),
        raw_secs: Stat::of(&r_secs),
        load,
        extra: Value::Object(extra),
    })
}

// ---------------------------------------------------------------------------
// Templates: seeded once, copied per measurement.
// ---------------------------------------------------------------------------

struct Template {
    name: String,
    as_of: DateTime<Utc>,
    rows: u64,
}

async fn build_template(svc: &Services, name: &str, plan: &SeedPlan) -> Result<Template> {
    let started = Instant::now();
    svc.admin_exec(&format!("CREATE DATABASE {name}")).await?;
    let url = svc.url_of(name);
    db::migrate::run_migrations(&db_settings(&url, 1)).await?;
    let mut conn = AsyncPgConnection::establish(&url).await?;
    let rows = db::seed::seed(&mut conn, plan).await?;
    // Hint bits, visibility map and statistics set once, copied to every run.
    conn.batch_execute("VACUUM ANALYZE").await?;
    drop(conn);
    svc.wait_idle(name).await?;
    progress!(
        "template {name}: {rows} bookings ({} active, {} due at as_of, {} inactive) in {:.1} s",
        plan.active,
        plan.due(),
        plan.inactive,
        started.elapsed().as_secs_f64()
    );
    Ok(Template {
        name: name.into(),
        as_of: plan.as_of,
        rows,
    })
}

/// Due rows (both phases) at `as_of` in `db`.
async fn due_at(svc: &Services, db: &str, as_of: DateTime<Utc>) -> Result<u64> {
    let mut conn = AsyncPgConnection::establish(&svc.url_of(db)).await?;
    let mut total = 0;
    for phase in Phase::ALL {
        total += bookings::count_due(&mut conn, phase, as_of).await?;
    }
    drop(conn);
    svc.wait_idle(db).await?;
    Ok(total as u64)
}

fn plan(active: u64, due: u64, inactive: u64, as_of: DateTime<Utc>, spread_days: u64) -> SeedPlan {
    SeedPlan {
        active,
        due_fraction: due as f64 / active as f64,
        inactive,
        poison: 0,
        as_of,
        spread: Duration::from_secs(spread_days * 86_400),
    }
}

// ---------------------------------------------------------------------------
// Idle cycle over 1M bookings, with the plans.
// ---------------------------------------------------------------------------

#[derive(QueryableByName)]
struct PlanLine {
    #[diesel(sql_type = Text, column_name = "QUERY PLAN")]
    line: String,
}

async fn explain(
    conn: &mut AsyncPgConnection,
    sql: &str,
    as_of: DateTime<Utc>,
    limit: Option<i64>,
) -> Result<String> {
    let query = diesel::sql_query(format!("EXPLAIN (ANALYZE, BUFFERS) {sql}"))
        .bind::<Timestamptz, _>(as_of)
        .bind::<Array<SqlUuid>, _>(Vec::<Uuid>::new());
    let lines: Vec<PlanLine> = match limit {
        Some(limit) => query.bind::<BigInt, _>(limit).load(conn).await?,
        None => query.load(conn).await?,
    };
    Ok(lines
        .into_iter()
        .map(|l| l.line)
        .collect::<Vec<_>>()
        .join("\n"))
}

struct Idle {
    ms: Stat,
    load: [f64; 3],
    plans: Vec<(String, String, String)>,
    indexes_used: bool,
}

async fn idle_cycles(svc: &Services, template: &Template, reps: usize) -> Result<Idle> {
    let db = svc.copy(&template.name).await?;
    let url = svc.url_of(&db);
    let load = loadavg();
    let pool = pools(&url, 1).await?.remove(0);
    let worker = worker(pool.clone(), template.as_of, 200);
    let token = CancellationToken::new();
    // One untimed cycle prepares the statements, as in a running worker.
    worker
        .run_cycle_at(template.as_of, RunId::generate(), &token)
        .await?;
    let mut ms = Vec::new();
    for _ in 0..reps {
        let started = Instant::now();
        let outcome = worker
            .run_cycle_at(template.as_of, RunId::generate(), &token)
            .await?;
        ms.push(started.elapsed().as_secs_f64() * 1e3);
        ensure!(
            outcome.report.reserve_expired_count + outcome.report.booking_expired_count == 0,
            "idle cycle expired rows"
        );
    }
    let ms = Stat::of(&ms);
    progress!(
        "idle cycle over {} bookings: {} ms (min/median/max of {reps})",
        template.rows,
        ms.show(|v| format!("{v:.2}"))
    );
    let mut conn = AsyncPgConnection::establish(&url).await?;
    let mut plans = Vec::new();
    let mut indexes_used = true;
    for phase in Phase::ALL {
        let lock = bookings::lock_due_sql(phase).to_owned();
        let lock_plan = explain(&mut conn, &lock, template.as_of, Some(200)).await?;
        let count_sql = bookings::count_due_excluding_sql(phase).to_owned();
        let count_plan = explain(&mut conn, &count_sql, template.as_of, None).await?;
        let index = bookings::partial_index(phase);
        indexes_used &= lock_plan.contains(index) && count_plan.contains(index);
        plans.push((format!("{phase} lock_due"), lock, lock_plan));
        plans.push((
            format!("{phase} count_due_excluding"),
            count_sql,
            count_plan,
        ));
    }
    drop(conn);
    drop(worker);
    drop(pool);
    svc.drop_db(&db).await?;
    Ok(Idle {
        ms,
        load,
        plans,
        indexes_used,
    })
}

// ---------------------------------------------------------------------------
// Publisher vs the DB-only limit.
// ---------------------------------------------------------------------------

fn kafka_settings(svc: &Services) -> KafkaSettings {
    KafkaSettings {
        bootstrap_servers: vec![svc.kafka_bootstrap.clone()],
        client_id: "booking-expiration-bench".into(),
        request_timeout: Duration::from_secs(30),
        create_topic: false,
        topic_partitions: 3,
        replication_factor: 1,
        compression: Compression::None,
        sasl: None,
    }
}

/// `<name>_sum` of a histogram in the Prometheus text of `metrics`.
fn histogram_sum(metrics: &Metrics, name: &str) -> f64 {
    let prefix = format!("{name}_sum ");
    metrics
        .encode()
        .lines()
        .find_map(|l| l.strip_prefix(&prefix).and_then(|v| v.trim().parse().ok()))
        .unwrap_or(f64::NAN)
}

/// Rows published after the first (warm-up) batch, the time they took, and
/// (Kafka side) the part of it spent in `produce` (the publisher's own
/// `outbox_produce_duration_seconds`).
async fn publish_all(
    svc: &Services,
    template: &str,
    kafka: bool,
    total: u64,
) -> Result<(u64, f64, f64)> {
    let db = svc.copy(template).await?;
    let url = svc.url_of(&db);
    let pool = pools(&url, 1).await?.remove(0);
    let produce_metric = "crm_booking_expiration_outbox_produce_duration_seconds";
    let (rows, secs, produce_secs) = if kafka {
        let metrics = Arc::new(Metrics::new());
        let publisher = Publisher::new(
            pool.clone(),
            KafkaSink::new(kafka_settings(svc)),
            Arc::new(SystemClock),
            PublisherSettings {
                batch_size: PUBLISH_BATCH,
                poll_interval: Duration::from_secs(1),
                retention: Duration::from_secs(86_400),
                concurrency: publish_concurrency(),
            },
            Arc::clone(&metrics),
            Arc::new(Health::new(Utc::now(), false, true)),
            TOPIC.into(),
        );
        // Both pooled connections open, as in a running service.
        let warm = (pool.get().await?, pool.get().await?);
        drop(warm);
        // Warm-up batch: connects to the broker and loads the metadata.
        let first = publisher.publish_batch().await?;
        let produce_before = histogram_sum(&metrics, produce_metric);
        let started = Instant::now();
        let mut rows = 0;
        let never = CancellationToken::new();
        loop {
            let drained = publisher.drain(&never, Duration::from_secs(3600)).await?;
            rows += drained.published;
            if !drained.more {
                break;
            }
        }
        ensure!(
            (first + rows) as u64 == total,
            "published {} of {total}",
            first + rows
        );
        let produce_secs = histogram_sum(&metrics, produce_metric) - produce_before;
        (rows as u64, started.elapsed().as_secs_f64(), produce_secs)
    } else {
        let mut conn = pool.get().await?;
        let batch = async |conn: &mut AsyncPgConnection| -> Result<usize> {
            Ok(conn
                .transaction(async |c| {
                    let rows = outbox::claim_unpublished(c, PUBLISH_BATCH).await?;
                    if rows.is_empty() {
                        return Ok::<_, db::DbError>(0);
                    }
                    let ids: Vec<i64> = rows.iter().map(|r| r.id).collect();
                    outbox::mark_published(c, &ids, Utc::now()).await?;
                    Ok(ids.len())
                })
                .await?)
        };
        let first = batch(&mut conn).await?;
        let started = Instant::now();
        let mut rows = 0;
        loop {
            let n = batch(&mut conn).await?;
            if n == 0 {
                break;
            }
            rows += n;
        }
        ensure!(
            (first + rows) as u64 == total,
            "marked {} of {total}",
            first + rows
        );
        (rows as u64, started.elapsed().as_secs_f64(), 0.0)
    };
    let mut conn = AsyncPgConnection::establish(&url).await?;
    let left = count(
        &mut conn,
        "SELECT count(*)::bigint AS n FROM booking_expiration_outbox WHERE published_at IS NULL",
    )
    .await?;
    ensure!(left == 0, "{left} outbox rows left unpublished");
    drop(conn);
    drop(pool);
    svc.drop_db(&db).await?;
    Ok((rows, secs, produce_secs))
}

/// `n` publisher instances (own pool, own Kafka connection each) draining
/// one outbox at once: what overlapping DB and Kafka work gives.
async fn publish_parallel(
    svc: &Services,
    template: &str,
    n: usize,
    total: u64,
) -> Result<(u64, f64)> {
    let db = svc.copy(template).await?;
    let url = svc.url_of(&db);
    let mut publishers = Vec::new();
    let mut warm = 0;
    for pool in pools(&url, n).await? {
        let publisher = Arc::new(Publisher::new(
            pool,
            KafkaSink::new(kafka_settings(svc)),
            Arc::new(SystemClock),
            PublisherSettings {
                batch_size: PUBLISH_BATCH,
                poll_interval: Duration::from_secs(1),
                retention: Duration::from_secs(86_400),
                concurrency: 1,
            },
            Arc::new(Metrics::new()),
            Arc::new(Health::new(Utc::now(), false, true)),
            TOPIC.into(),
        ));
        // Warm-up batch per instance (connect, metadata).
        warm += publisher.publish_batch().await?;
        publishers.push(publisher);
    }
    let started = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for publisher in publishers {
        tasks.spawn(async move {
            let mut rows = 0;
            loop {
                let k = publisher.publish_batch().await?;
                if k == 0 {
                    return Ok::<_, anyhow::Error>(rows);
                }
                rows += k;
            }
        });
    }
    let mut rows = 0;
    while let Some(r) = tasks.join_next().await {
        rows += r??;
    }
    let secs = started.elapsed().as_secs_f64();
    ensure!(
        (warm + rows) as u64 == total,
        "published {} of {total}",
        warm + rows
    );
    svc.drop_db(&db).await?;
    Ok((rows as u64, secs))
}

/// The Kafka-only limit: the same records (read from the outbox template
/// without locking), produced by the project's `KafkaSink` in batches of
/// the same size, one batch at a time, no database in the loop.
async fn kafka_only(svc: &Services, template: &str) -> Result<(u64, f64)> {
    let mut conn = AsyncPgConnection::establish(&svc.url_of(template)).await?;
    let rows: Vec<outbox::OutboxRow> = diesel::sql_query(
        "SELECT id, event_id, topic, message_key, payload, headers, created_at \
         FROM booking_expiration_outbox ORDER BY id",
    )
    .load(&mut conn)
    .await?;
    drop(conn);
    svc.wait_idle(template).await?;
    let sink = KafkaSink::new(kafka_settings(svc));
    sink.check_topic(TOPIC).await?;
    let records = |chunk: &[outbox::OutboxRow]| -> Vec<OutgoingRecord> {
        let now = Utc::now();
        chunk
            .iter()
            .map(|row| OutgoingRecord {
                key: row.message_key.clone(),
                value: row.payload.clone(),
                headers: row.header_pairs().into_iter().collect(),
                timestamp: now,
            })
            .collect()
    };
    let mut chunks = rows.chunks(PUBLISH_BATCH as usize);
    if let Some(first) = chunks.next() {
        sink.produce(TOPIC, records(first)).await?;
    }
    let started = Instant::now();
    let mut n = 0;
    for chunk in chunks {
        sink.produce(TOPIC, records(chunk)).await?;
        n += chunk.len() as u64;
    }
    Ok((n, started.elapsed().as_secs_f64()))
}

// ---------------------------------------------------------------------------
// End to end with the release binary as a child process.
// ---------------------------------------------------------------------------

#[derive(QueryableByName, Debug)]
struct Latency {
    #[diesel(sql_type = BigInt)]
    n: i64,
    #[diesel(sql_type = Double)]
    p50: f64,
    #[diesel(sql_type = Double)]
    p99: f64,
    #[diesel(sql_type = Double)]
    max: f64,
    #[diesel(sql_type = Double)]
    first_write: f64,
    #[diesel(sql_type = Double)]
    last_write: f64,
    #[diesel(sql_type = Double)]
    last_ack: f64,
}

struct E2e {
    events: u64,
    wall_secs: f64,
    expiry_secs: f64,
    latency: Latency,
    start_epoch: f64,
    peak_rss_kib: u64,
    exit_ok: bool,
}

fn proc_status_kib(pid: u32, field: &str) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find(|l| l.starts_with(field))?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

async fn end_to_end(svc: &Services, template: &Template, rep: usize) -> Result<E2e> {
    let db = svc.copy(&template.name).await?;
    let url = svc.url_of(&db);
    let expected = due_at(svc, &db, Utc::now()).await?;
    let topic = format!("bench-e2e-{}", Uuid::new_v4().simple());
    create_topic(svc, &topic, 3).await?;
    let client = kafka_client(svc).await?;
    let mut partitions = Vec::new();
    for p in 0..3 {
        partitions.push(
            client
                .partition_client(
                    topic.as_str(),
                    p,
                    rskafka::client::partition::UnknownTopicHandling::Retry,
                )
                .await?,
        );
    }
    let metrics_port = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    let log_path = svc.work.join(format!("e2e-{rep}.log"));
    let log = std::fs::File::create(&log_path)?;
    let binary = env!("CARGO_BIN_EXE_booking-expiration");
    let mut command = tokio::process::Command::new(binary);
    for name in [
        "EXPIRATION_BATCH_SIZE",
        "OUTBOX_BATCH_SIZE",
        "OUTBOX_RETENTION",
        "NO_WORKER",
        "NO_PUBLISHER",
    ] {
        command.env_remove(name);
    }
    command
        .arg("run")
        .env("DATABASE_URL", &url)
        .env("KAFKA_BOOTSTRAP_SERVERS", &svc.kafka_bootstrap)
        .env("KAFKA_TOPIC", &topic)
        .env("EXPIRATION_INTERVAL", "5s")
        // A long poll: the publisher is driven by the commit notification.
        .env("OUTBOX_POLL_INTERVAL", "10s")
        .env("METRICS_ADDR", format!("127.0.0.1:{metrics_port}"))
        .env("RUST_LOG", "info")
        .stdin(std::process::Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log)
        .kill_on_drop(true);
    let start_epoch = Utc::now().timestamp_micros() as f64 / 1e6;
    let started = Instant::now();
    let mut child = command
        .spawn()
        .context("start the booking-expiration binary")?;
    let pid = child.id().context("child pid")?;
    let mut peak_rss_kib = 0;
    let deadline = started + Duration::from_secs(180);
    let mut last_report = Instant::now();
    loop {
        let mut on_kafka = 0i64;
        for pc in &partitions {
            on_kafka += pc
                .get_offset(rskafka::client::partition::OffsetAt::Latest)
                .await?;
        }
        if let Some(hwm) = proc_status_kib(pid, "VmHWM:") {
            peak_rss_kib = peak_rss_kib.max(hwm);
        }
        if on_kafka as u64 >= expected {
            break;
        }
        if let Ok(Some(status)) = child.try_wait() {
            bail!(
                "the binary exited early ({status}); log: {}",
                log_path.display()
            );
        }
        if Instant::now() > deadline {
            bail!(
                "only {on_kafka} of {expected} events on Kafka after 180 s; log: {}",
                log_path.display()
            );
        }
        if last_report.elapsed() > Duration::from_secs(5) {
            progress!("end to end: {on_kafka} of {expected} on Kafka");
            last_report = Instant::now();
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let wall_secs = started.elapsed().as_secs_f64();
    // Peak RSS of the whole run, read while the process still lives.
    if let Some(hwm) = proc_status_kib(pid, "VmHWM:") {
        peak_rss_kib = peak_rss_kib.max(hwm);
    }
    // Graceful stop of the child we started, by its pid.
    let _ = std::process::Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status();
    let exit_ok = match tokio::time::timeout(Duration::from_secs(30), child.wait()).await {
        Ok(Ok(status)) => status.success(),
        _ => {
            let _ = child.kill().await;
            false
        }
    };
    let mut conn = AsyncPgConnection::establish(&url).await?;
    let latency: Latency = diesel::sql_query(
        "SELECT count(*)::bigint AS n,
                percentile_cont(0.5) WITHIN GROUP (ORDER BY extract(epoch FROM published_at - created_at))::float8 AS p50,
                percentile_cont(0.99) WITHIN GROUP (ORDER BY extract(epoch FROM published_at - created_at))::float8 AS p99,
                max(extract(epoch FROM published_at - created_at))::float8 AS max,
                extract(epoch FROM min(created_at))::float8 AS first_write,
                extract(epoch FROM max(created_at))::float8 AS last_write,
                extract(epoch FROM max(published_at))::float8 AS last_ack
           FROM booking_expiration_outbox WHERE published_at IS NOT NULL",
    )
    .get_result(&mut conn)
    .await?;
    drop(conn);
    ensure!(
        latency.n as u64 == expected,
        "{} rows published, {expected} expected",
        latency.n
    );
    svc.drop_db(&db).await?;
    Ok(E2e {
        events: expected,
        wall_secs,
        expiry_secs: latency.last_write - latency.first_write,
        latency,
        start_epoch,
        peak_rss_kib,
        exit_ok,
    })
}

// ---------------------------------------------------------------------------

// ---------------------------------------------------------------------------
// Profile pass (after every timed figure): pg_stat_statements loaded, one
// run per side, statements and server time per batch. Not a timed figure.
// ---------------------------------------------------------------------------

#[derive(QueryableByName, Debug)]
struct StatementStat {
    #[diesel(sql_type = Text)]
    query: String,
    #[diesel(sql_type = BigInt)]
    calls: i64,
    #[diesel(sql_type = BigInt)]
    rows: i64,
    #[diesel(sql_type = Double)]
    exec_ms: f64,
    #[diesel(sql_type = Double)]
    plan_ms: f64,
    #[diesel(sql_type = BigInt)]
    plans: i64,
    #[diesel(sql_type = BigInt)]
    wal_records: i64,
}

async fn enable_pg_stat_statements(svc: &Services) -> Result<()> {
    // ALTER SYSTEM cannot share a (simple-query) transaction: one at a time.
    svc.admin_exec("ALTER SYSTEM SET shared_preload_libraries = 'pg_stat_statements'")
        .await?;
    let pg_dir = svc.work.join("pg");
    let status = std::process::Command::new("bash")
        .current_dir(support::repo())
        .args([
            "scripts/postgres.sh",
            "restart",
            pg_dir.to_str().unwrap_or_default(),
        ])
        .stdout(std::process::Stdio::null())
        .status()?;
    ensure!(status.success(), "scripts/postgres.sh restart failed");
    // Its own parameters exist only once the library is loaded.
    svc.admin_exec("ALTER SYSTEM SET pg_stat_statements.track_planning = on")
        .await?;
    svc.admin_exec("SELECT pg_reload_conf()").await?;
    svc.admin_exec("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        .await
}

async fn profile_run(
    svc: &Services,
    template: &Template,
    side: Side,
    batch: u32,
    expected: u64,
) -> Result<Value> {
    let db = svc.copy(&template.name).await?;
    let url = svc.url_of(&db);
    svc.admin_exec("SELECT pg_stat_statements_reset()").await?;
    let cpu_before = support::process_cpu_ms();
    let run = expire_all(&url, side, template.as_of, batch, 1, expected).await?;
    let client_cpu_ms = support::process_cpu_ms() - cpu_before;
    svc.wait_idle(&db).await?;
    let mut conn = svc.admin().await?;
    let stats: Vec<StatementStat> = diesel::sql_query(
        "SELECT s.query, s.calls, s.rows, s.total_exec_time AS exec_ms,
                s.total_plan_time AS plan_ms, s.plans, s.wal_records
           FROM pg_stat_statements s JOIN pg_database d ON d.oid = s.dbid
          WHERE d.datname = $1 AND s.toplevel
          ORDER BY s.total_exec_time DESC",
    )
    .bind::<Text, _>(&db)
    .load(&mut conn)
    .await?;
    drop(conn);
    svc.drop_db(&db).await?;
    let tx = f64::from(run.batches);
    let wall_ms = run.secs * 1e3;
    let server_ms: f64 = stats.iter().map(|s| s.exec_ms + s.plan_ms).sum();
    // The measured work only: the pools' session SETs run once per connection.
    let per_batch: Vec<&StatementStat> = stats
        .iter()
        .filter(|s| {
            !s.query
                .trim_start()
                .to_ascii_uppercase()
                .starts_with("SET ")
        })
        .collect();
    let statements: i64 = per_batch.iter().map(|s| s.calls).sum();
    let wal: i64 = per_batch.iter().map(|s| s.wal_records).sum();
    progress!(
        "profile {side:?} batch {batch}: {} rows, {} transactions, {:.2} statements/transaction, \
         server {:.0} ms of {:.0} ms wall ({:.0}%), client CPU {:.0} ms, {:.1} WAL records/booking",
        run.expired,
        run.batches,
        statements as f64 / tx,
        server_ms,
        wall_ms,
        100.0 * server_ms / wall_ms,
        client_cpu_ms,
        wal as f64 / run.expired as f64
    );
    for s in &per_batch {
        let text: String = s.query.split_whitespace().collect::<Vec<_>>().join(" ");
        let short: String = text.chars().take(110).collect();
        progress!(
            "    {:>6} calls {:>7} rows {:>8.1} ms exec {:>6.1} ms plan ({} plans) {:>7} WAL | {short}",
            s.calls,
            s.rows,
            s.exec_ms,
            s.plan_ms,
            s.plans,
            s.wal_records
        );
    }
    Ok(json!({
        "side": format!("{side:?}"), "batch": batch, "rows": run.expired, "transactions": run.batches,
        "wall_ms": wall_ms, "server_ms": server_ms, "client_and_network_ms": wall_ms - server_ms,
        "client_cpu_ms": client_cpu_ms,
        "statements_per_transaction": statements as f64 / tx,
        "wal_records_per_booking": wal as f64 / run.expired as f64,
        "statements": per_batch.iter().map(|s| json!({
            "query": s.query.split_whitespace().collect::<Vec<_>>().join(" "),
            "calls": s.calls, "rows": s.rows, "exec_ms": s.exec_ms, "plan_ms": s.plan_ms,
            "plans": s.plans, "wal_records": s.wal_records,
        })).collect::<Vec<_>>(),
    }))
}

// ---------------------------------------------------------------------------

fn reps(quick: bool, full: usize) -> usize {
    if quick { (full / 3).max(1) } else { full }
}

struct Row {
    figure: String,
    project: String,
    baseline: String,
    ratio: String,
    goal: String,
    met: String,
    load: [f64; 3],
}

fn rate_fmt(v: f64) -> String {
    num(v)
}

fn print_table(rows: &[Row]) -> String {
    let mut out = String::new();
    out.push_str("| figure | project (min / median / max) | baseline (min / median / max) | ratio (median) | goal | met | load 1/5/15 |\n");
    out.push_str("|---|---|---|---|---|---|---|\n");
    for r in rows {
        out.push_str(&format!(
            "| {} | {} | {} | {} | {} | {} | {:.2} {:.2} {:.2} |\n",
            r.figure,
            r.project,
            r.baseline,
            r.ratio,
            r.goal,
            r.met,
            r.load[0],
            r.load[1],
            r.load[2]
        ));
    }
    out
}

fn comparison_row(c: &Comparison, goal: Option<f64>) -> Row {
    let ratio = c.ratio();
    Row {
        figure: c.label.clone(),
        project: format!("{} bookings/s", c.worker_rate.show(rate_fmt)),
        baseline: format!("{} bookings/s", c.raw_rate.show(rate_fmt)),
        ratio: format!("{ratio:.2}x"),
        goal: goal.map_or("-".into(), |g| format!(">= {g}x")),
        met: goal.map_or("-".into(), |g| {
            if ratio >= g {
                "yes".into()
            } else {
                "NO".into()
            }
        }),
        load: c.load,
    }
}

fn comparison_json(c: &Comparison) -> Value {
    json!({
        "label": c.label, "due": c.due, "table_rows": c.table_rows, "batch": c.batch,
        "instances": c.instances, "ratio": c.ratio(),
        "worker_bookings_per_s": c.worker_rate, "raw_sql_bookings_per_s": c.raw_rate,
        "worker_seconds": c.worker_secs, "raw_sql_seconds": c.raw_secs,
        "loadavg_at_start": c.load, "details": c.extra,
    })
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    support::start_clock();
    // `cargo bench` passes `--bench`; nothing else is accepted.
    if std::env::args().skip(1).any(|a| a != "--bench") {
        eprintln!(
            "usage: cargo bench --bench throughput   (BENCH_QUICK=1 for fewer repetitions, BENCH_OUT=DIR)"
        );
        std::process::exit(2);
    }
    if let Err(error) = run().await {
        eprintln!("benchmark failed: {error:#}");
        std::process::exit(1);
    }
}

async fn run() -> Result<()> {
    let quick = std::env::var("BENCH_QUICK").is_ok_and(|v| !v.is_empty() && v != "0");
    let out_dir = match std::env::var_os("BENCH_OUT") {
        Some(dir) => PathBuf::from(dir),
        None if quick => std::env::temp_dir().join("booking-expiration-bench-quick"),
        None => support::repo().join("docs/bench"),
    };
    std::fs::create_dir_all(&out_dir)?;
    let load_start = loadavg();
    progress!(
        "mode {}, results to {}, load average {:.2} {:.2} {:.2}",
        if quick { "quick" } else { "full" },
        out_dir.display(),
        load_start[0],
        load_start[1],
        load_start[2]
    );
    let svc = Services::start()?;
    let mut settings = BTreeMap::new();
    for name in [
        "server_version",
        "fsync",
        "synchronous_commit",
        "full_page_writes",
        "shared_buffers",
        "wal_level",
        "max_wal_size",
    ] {
        settings.insert(name, svc.show(name).await?);
    }
    progress!("PostgreSQL settings: {settings:?}");
    create_topic(&svc, TOPIC, 3).await?;

    // Templates. The 10k and 100k sets keep their not-yet-due rows ten years
    // out, so none becomes due during the run (the end-to-end run uses the
    // real clock); the 1M set spreads them over 30 days so that one day
    // later about 10k are due.
    let now = Utc::now();
    progress!("seeding templates (1M rows take a while)");
    let t10k = build_template(&svc, "tpl_10k", &plan(40_000, 10_000, 60_000, now, 3650)).await?;
    let t100k =
        build_template(&svc, "tpl_100k", &plan(130_000, 100_000, 60_000, now, 3650)).await?;
    let t1m = build_template(&svc, "tpl_1m", &plan(300_000, 0, 700_000, now, 30)).await?;
    let due_10k = due_at(&svc, &t10k.name, t10k.as_of).await?;
    let due_100k = due_at(&svc, &t100k.name, t100k.as_of).await?;
    let as_of_1m_10k = t1m.as_of + chrono::Duration::days(1);
    let due_1m_10k = due_at(&svc, &t1m.name, as_of_1m_10k).await?;
    progress!(
        "due: {due_10k} in {}, {due_100k} in {}, {due_1m_10k} in {} one day later",
        t10k.name,
        t100k.name,
        t1m.name
    );

    let mut comparisons = Vec::new();
    // 1. The headline: 10k due among 90k other rows, batch 200.
    progress!(
        "1. expiry throughput, 10k due among {} rows, batch 200",
        t10k.rows
    );
    let headline = compare_expiry(
        &svc,
        "expiry_10k_b200_x1",
        "expiry 10k due / 100k rows, batch 200, 1 instance",
        &t10k,
        t10k.as_of,
        due_10k,
        200,
        1,
        reps(quick, 7),
        true,
    )
    .await?;
    comparisons.push(headline);

    // 3. Idle cycle over 1M bookings.
    progress!("3. idle cycle over {} bookings", t1m.rows);
    let idle = idle_cycles(&svc, &t1m, if quick { 10 } else { 30 }).await?;

    // 4. Publisher vs DB-only.
    progress!("4. publisher: {due_10k} outbox rows, batch {PUBLISH_BATCH}");
    svc.admin_exec("CREATE DATABASE tpl_pub TEMPLATE tpl_10k STRATEGY FILE_COPY")
        .await?;
    expire_all(
        &svc.url_of("tpl_pub"),
        Side::Worker,
        t10k.as_of,
        200,
        1,
        due_10k,
    )
    .await?;
    svc.wait_idle("tpl_pub").await?;
    {
        let mut conn = AsyncPgConnection::establish(&svc.url_of("tpl_pub")).await?;
        conn.batch_execute("VACUUM ANALYZE").await?;
    }
    // The broker is a fresh JVM: warm its JIT (untimed) so the first timed
    // publisher run does not pay for it.
    for round in 1..=3 {
        let (rows, secs) = kafka_only(&svc, "tpl_pub").await?;
        progress!("publisher: broker warm-up {round}/3, {rows} records in {secs:.3} s (not timed)");
    }
    let pub_load = loadavg();
    let (mut pub_rates, mut dbo_rates, mut ko_rates, mut produce_share, mut par_rates) =
        (vec![], vec![], vec![], vec![], vec![]);
    let pub_reps = reps(quick, 5);
    for rep in 0..pub_reps {
        let order = if rep % 2 == 0 {
            [true, false]
        } else {
            [false, true]
        };
        for kafka in order {
            let (rows, secs, produce_secs) = publish_all(&svc, "tpl_pub", kafka, due_10k).await?;
            let rate = rows as f64 / secs;
            let share = if kafka {
                format!(
                    " ({:.0}% of it inside produce)",
                    100.0 * produce_secs / secs
                )
            } else {
                String::new()
            };
            progress!(
                "publisher: rep {}/{pub_reps} {:<8} {rows} rows in {secs:.3} s = {} events/s{share}",
                rep + 1,
                if kafka { "Kafka" } else { "DB-only" },
                num(rate)
            );
            if kafka {
                pub_rates.push(rate);
                produce_share.push(produce_secs / secs);
            } else {
                dbo_rates.push(rate)
            }
        }
        let (rows, secs) = kafka_only(&svc, "tpl_pub").await?;
        progress!(
            "publisher: rep {}/{pub_reps} Kafka-only {rows} records in {secs:.3} s = {} records/s",
            rep + 1,
            num(rows as f64 / secs)
        );
        ko_rates.push(rows as f64 / secs);
        let (rows, secs) = publish_parallel(&svc, "tpl_pub", 2, due_10k).await?;
        progress!(
            "publisher: rep {}/{pub_reps} 2 instances {rows} rows in {secs:.3} s = {} events/s",
            rep + 1,
            num(rows as f64 / secs)
        );
        par_rates.push(rows as f64 / secs);
    }
    let pub_rate = Stat::of(&pub_rates);
    let dbo_rate = Stat::of(&dbo_rates);
    let ko_rate = Stat::of(&ko_rates);
    let produce_share = Stat::of(&produce_share);
    let par_rate = Stat::of(&par_rates);
    // One batch after the other: DB time and Kafka time add up.
    let serial_model = 1.0 / (1.0 / dbo_rate.median + 1.0 / ko_rate.median);

    // 5 and 6. End to end with the release binary.
    progress!(
        "5. end to end with {}",
        env!("CARGO_BIN_EXE_booking-expiration")
    );
    let e2e_load = loadavg();
    let mut e2e = Vec::new();
    let e2e_reps = reps(quick, 5);
    for rep in 0..e2e_reps {
        let r = end_to_end(&svc, &t10k, rep).await?;
        progress!(
            "end to end: rep {}/{e2e_reps} {} events on Kafka in {:.2} s (expiry {:.2} s), write->ack p50 {:.1} ms p99 {:.1} ms, peak RSS {:.1} MiB, clean exit {}",
            rep + 1,
            r.events,
            r.wall_secs,
            r.expiry_secs,
            r.latency.p50 * 1e3,
            r.latency.p99 * 1e3,
            r.peak_rss_kib as f64 / 1024.0,
            r.exit_ok
        );
        e2e.push(r);
    }
    let binary_bytes = std::fs::metadata(env!("CARGO_BIN_EXE_booking-expiration"))?.len();

    // 2. Scaling.
    progress!("2. scaling: instances, batch sizes, due rows, table size");
    let r5 = reps(quick, 5);
    for (key, label, batch, instances) in [
        (
            "expiry_10k_b200_x2",
            "expiry 10k due / 100k rows, batch 200, 2 instances",
            200,
            2,
        ),
        (
            "expiry_10k_b200_x4",
            "expiry 10k due / 100k rows, batch 200, 4 instances",
            200,
            4,
        ),
        (
            "expiry_10k_b50_x1",
            "expiry 10k due / 100k rows, batch 50, 1 instance",
            50,
            1,
        ),
        (
            "expiry_10k_b1000_x1",
            "expiry 10k due / 100k rows, batch 1000, 1 instance",
            1000,
            1,
        ),
    ] {
        comparisons.push(
            compare_expiry(
                &svc, key, label, &t10k, t10k.as_of, due_10k, batch, instances, r5, false,
            )
            .await?,
        );
    }
    comparisons.push(
        compare_expiry(
            &svc,
            "expiry_1m_10k_b200_x1",
            "expiry 10k due / 1M rows, batch 200, 1 instance",
            &t1m,
            as_of_1m_10k,
            due_1m_10k,
            200,
            1,
            r5,
            false,
        )
        .await?,
    );
    comparisons.push(
        compare_expiry(
            &svc,
            "expiry_100k_b200_x1",
            "expiry 100k due / 190k rows, batch 200, 1 instance",
            &t100k,
            t100k.as_of,
            due_100k,
            200,
            1,
            r5,
            false,
        )
        .await?,
    );

    // Profile (pg_stat_statements loaded from here on; no timed figure follows).
    progress!("profile pass: restarting PostgreSQL with pg_stat_statements");
    enable_pg_stat_statements(&svc).await?;
    let mut profile = Vec::new();
    for batch in [50, 200, 1000] {
        for side in [Side::Worker, Side::Raw] {
            profile.push(profile_run(&svc, &t10k, side, batch, due_10k).await?);
        }
    }

    // ---- the table
    let mut rows = Vec::new();
    for (i, c) in comparisons.iter().enumerate() {
        rows.push(comparison_row(c, if i == 0 { Some(0.9) } else { None }));
    }
    rows.push(Row {
        figure: format!("idle cycle (0 due) over {} bookings", t1m.rows),
        project: format!("{} ms", idle.ms.show(|v| format!("{v:.2}"))),
        baseline: "-".into(),
        ratio: "-".into(),
        goal: "<= 10 ms, partial indexes used".into(),
        met: if idle.ms.median <= 10.0 && idle.indexes_used {
            "yes".into()
        } else {
            "NO".into()
        },
        load: idle.load,
    });
    let pub_ratio = pub_rate.median / dbo_rate.median;
    rows.push(Row {
        figure: format!(
            "publisher {due_10k} rows, batch {PUBLISH_BATCH}, events/s vs DB-only claim+mark"
        ),
        project: format!("{} events/s", pub_rate.show(rate_fmt)),
        baseline: format!("{} rows/s", dbo_rate.show(rate_fmt)),
        ratio: format!("{pub_ratio:.2}x"),
        goal: ">= 0.8x".into(),
        met: if pub_ratio >= 0.8 {
            "yes".into()
        } else {
            "NO".into()
        },
        load: pub_load,
    });
    rows.push(Row {
        figure: format!(
            "  profile: Kafka-only produce (KafkaSink, batch {PUBLISH_BATCH}, no DB) vs serial DB+Kafka model"
        ),
        project: format!("{} records/s", ko_rate.show(rate_fmt)),
        baseline: format!("model {} events/s", num(serial_model)),
        ratio: format!("publisher {:.2}x of model", pub_rate.median / serial_model),
        goal: "-".into(),
        met: format!("{:.0}% of publisher time in produce", produce_share.median * 100.0),
        load: pub_load,
    });
    rows.push(Row {
        figure: "  profile: 2 publisher instances in parallel (DB and Kafka work overlap)".into(),
        project: format!("{} events/s", par_rate.show(rate_fmt)),
        baseline: format!("{} rows/s", dbo_rate.show(rate_fmt)),
        ratio: format!("{:.2}x", par_rate.median / dbo_rate.median),
        goal: "-".into(),
        met: "-".into(),
        load: pub_load,
    });
    let wall = Stat::of(&e2e.iter().map(|r| r.wall_secs).collect::<Vec<_>>());
    let p50 = Stat::of(&e2e.iter().map(|r| r.latency.p50 * 1e3).collect::<Vec<_>>());
    let p99 = Stat::of(&e2e.iter().map(|r| r.latency.p99 * 1e3).collect::<Vec<_>>());
    let rss = Stat::of(
        &e2e.iter()
            .map(|r| r.peak_rss_kib as f64 / 1024.0)
            .collect::<Vec<_>>(),
    );
    rows.push(Row {
        figure: format!("end to end: {due_10k} due -> all on Kafka (binary `run`, start included)"),
        project: format!("{} s", wall.show(|v| format!("{v:.2}"))),
        baseline: "-".into(),
        ratio: "-".into(),
        goal: "< 60 s (spec SLO)".into(),
        met: if wall.max < 60.0 {
            "yes".into()
        } else {
            "NO".into()
        },
        load: e2e_load,
    });
    rows.push(Row {
        figure: "outbox write -> broker ack, p50".into(),
        project: format!("{} ms", p50.show(|v| format!("{v:.1}"))),
        baseline: "-".into(),
        ratio: "-".into(),
        goal: "-".into(),
        met: "-".into(),
        load: e2e_load,
    });
    rows.push(Row {
        figure: "outbox write -> broker ack, p99".into(),
        project: format!("{} ms", p99.show(|v| format!("{v:.1}"))),
        baseline: "-".into(),
        ratio: "-".into(),
        goal: "< 10 s poll interval (wake-up on commit)".into(),
        met: if p99.max < 10_000.0 {
            "yes".into()
        } else {
            "NO".into()
        },
        load: e2e_load,
    });
    rows.push(Row {
        figure: "peak RSS (VmHWM) of the binary during end to end".into(),
        project: format!("{} MiB", rss.show(|v| format!("{v:.1}"))),
        baseline: "-".into(),
        ratio: "-".into(),
        goal: "< 64 MiB".into(),
        met: if rss.max < 64.0 {
            "yes".into()
        } else {
            "NO".into()
        },
        load: e2e_load,
    });
    rows.push(Row {
        figure: "release binary size (bench profile = release: thin LTO, stripped)".into(),
        project: format!("{:.2} MiB", binary_bytes as f64 / 1048576.0),
        baseline: "-".into(),
        ratio: "-".into(),
        goal: "-".into(),
        met: "-".into(),
        load: loadavg(),
    });
    let table = print_table(&rows);

    println!();
    println!(
        "booking-expiration throughput ({} mode, {} cores, PostgreSQL {}, fsync={}, synchronous_commit={})",
        if quick { "quick" } else { "full" },
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        settings["server_version"],
        settings["fsync"],
        settings["synchronous_commit"]
    );
    println!();
    print!("{table}");
    println!();
    for (name, sql, plan) in &idle.plans {
        println!(
            "EXPLAIN (ANALYZE, BUFFERS) {name} at as_of with 0 due over {} rows:\n{sql}\n{plan}\n",
            t1m.rows
        );
    }
    for c in &comparisons {
        if let Some(details) = c.extra.as_object() {
            println!("{}: {}", c.label, Value::Object(details.clone()));
        }
    }

    // ---- JSON
    let results = json!({
        "command": if quick { "BENCH_QUICK=1 cargo bench --bench throughput" } else { "cargo bench --bench throughput" },
        "mode": if quick { "quick" } else { "full" },
        "finished_at": Utc::now().to_rfc3339(),
        "duration_s": support::elapsed_s(),
        "machine": {
            "cores": std::thread::available_parallelism().map_or(0, |n| n.get()),
            "loadavg_at_start": load_start,
            "loadavg_at_end": loadavg(),
        },
        "postgresql": settings,
        "table_markdown": table,
        "expiry": comparisons.iter().map(|c| (c.key.clone(), comparison_json(c))).collect::<serde_json::Map<_, _>>(),
        "idle_cycle": {
            "table_rows": t1m.rows, "ms": idle.ms, "loadavg_at_start": idle.load,
            "partial_indexes_used": idle.indexes_used,
            "plans": idle.plans.iter().map(|(n, s, p)| json!({"name": n, "sql": s, "plan": p})).collect::<Vec<_>>(),
        },
        "publisher": {
            "rows": due_10k, "batch": PUBLISH_BATCH, "warm_up_batch_excluded": true,
            "kafka_events_per_s": pub_rate, "db_only_rows_per_s": dbo_rate, "ratio": pub_ratio,
            "kafka_only_records_per_s": ko_rate, "produce_share_of_publisher_time": produce_share,
            "serial_model_events_per_s": serial_model,
            "two_instances_events_per_s": par_rate,
            "loadavg_at_start": pub_load,
        },
        "end_to_end": {
            "events": due_10k, "wall_s": wall, "write_to_ack_p50_ms": p50, "write_to_ack_p99_ms": p99,
            "peak_rss_mib": rss, "loadavg_at_start": e2e_load,
            "runs": e2e.iter().map(|r| json!({
                "wall_s": r.wall_secs, "expiry_span_s": r.expiry_secs,
                "first_write_after_start_s": r.latency.first_write - r.start_epoch,
                "last_ack_after_start_s": r.latency.last_ack - r.start_epoch,
                "p50_ms": r.latency.p50 * 1e3, "p99_ms": r.latency.p99 * 1e3, "max_ms": r.latency.max * 1e3,
                "peak_rss_kib": r.peak_rss_kib, "clean_exit": r.exit_ok,
            })).collect::<Vec<_>>(),
        },
        "binary": { "path": env!("CARGO_BIN_EXE_booking-expiration"), "bytes": binary_bytes },
        "profile_pg_stat_statements": profile,
    });
    let json_path = out_dir.join("results.json");
    std::fs::write(&json_path, serde_json::to_string_pretty(&results)? + "\n")?;

    // ---- the plot, from this run's numbers
    let by_key = |k: &str| comparisons.iter().find(|c| c.key == k).expect("measured");
    let h = by_key("expiry_10k_b200_x1");
    let big = by_key("expiry_100k_b200_x1");
    let wide = by_key("expiry_1m_10k_b200_x1");
    let per_row_us = |c: &Comparison, s: &Stat| s.median * 1e6 / c.due as f64;
    let series = |name: &str, color, points: Vec<(f64, f64)>| plot::Series {
        name: name.into(),
        color,
        points,
    };
    let panels = vec![
        plot::Panel {
            title: "cycle time vs due rows (batch 200, 1 instance)".into(),
            x_desc: "due bookings".into(),
            y_desc: "seconds (median)".into(),
            series: vec![
                series(
                    "worker",
                    plot::PROJECT,
                    vec![
                        (0.0, idle.ms.median / 1e3),
                        (h.due as f64, h.worker_secs.median),
                        (big.due as f64, big.worker_secs.median),
                    ],
                ),
                series(
                    "raw SQL",
                    plot::BASELINE,
                    vec![
                        (h.due as f64, h.raw_secs.median),
                        (big.due as f64, big.raw_secs.median),
                    ],
                ),
            ],
        },
        plot::Panel {
            title: "cost per expired booking vs table size (batch 200)".into(),
            x_desc: "bookings in the table".into(),
            y_desc: "microseconds per booking (median)".into(),
            series: vec![
                series("worker", plot::PROJECT, {
                    let mut v = vec![
                        (h.table_rows as f64, per_row_us(h, &h.worker_secs)),
                        (big.table_rows as f64, per_row_us(big, &big.worker_secs)),
                        (wide.table_rows as f64, per_row_us(wide, &wide.worker_secs)),
                    ];
                    v.sort_by(|a, b| a.0.total_cmp(&b.0));
                    v
                }),
                series("raw SQL", plot::BASELINE, {
                    let mut v = vec![
                        (h.table_rows as f64, per_row_us(h, &h.raw_secs)),
                        (big.table_rows as f64, per_row_us(big, &big.raw_secs)),
                        (wide.table_rows as f64, per_row_us(wide, &wide.raw_secs)),
                    ];
                    v.sort_by(|a, b| a.0.total_cmp(&b.0));
                    v
                }),
            ],
        },
        plot::Panel {
            title: "throughput vs batch size (10k due, 1 instance)".into(),
            x_desc: "batch size".into(),
            y_desc: "bookings/s (median)".into(),
            series: {
                let cs = [
                    by_key("expiry_10k_b50_x1"),
                    h,
                    by_key("expiry_10k_b1000_x1"),
                ];
                vec![
                    series(
                        "worker",
                        plot::PROJECT,
                        cs.iter()
                            .map(|c| (c.batch as f64, c.worker_rate.median))
                            .collect(),
                    ),
                    series(
                        "raw SQL",
                        plot::BASELINE,
                        cs.iter()
                            .map(|c| (c.batch as f64, c.raw_rate.median))
                            .collect(),
                    ),
                ]
            },
        },
        plot::Panel {
            title: "throughput vs parallel instances (10k due, batch 200)".into(),
            x_desc: "instances".into(),
            y_desc: "bookings/s (median)".into(),
            series: {
                let cs = [
                    h,
                    by_key("expiry_10k_b200_x2"),
                    by_key("expiry_10k_b200_x4"),
                ];
                vec![
                    series(
                        "worker",
                        plot::PROJECT,
                        cs.iter()
                            .map(|c| (c.instances as f64, c.worker_rate.median))
                            .collect(),
                    ),
                    series(
                        "raw SQL",
                        plot::BASELINE,
                        cs.iter()
                            .map(|c| (c.instances as f64, c.raw_rate.median))
                            .collect(),
                    ),
                ]
            },
        },
    ];
    let svg_path = out_dir.join("scaling.svg");
    plot::draw(
        &svg_path,
        &format!(
            "booking-expiration scaling — {} run {}, {} cores, load {:.2} at start",
            if quick { "quick" } else { "full" },
            Utc::now().format("%Y-%m-%d %H:%M UTC"),
            std::thread::available_parallelism().map_or(0, |n| n.get()),
            load_start[0]
        ),
        &panels,
    )?;
    progress!("wrote {} and {}", json_path.display(), svg_path.display());
    drop(svc);
    Ok(())
}
