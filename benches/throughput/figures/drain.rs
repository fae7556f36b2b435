//! Figure 19 (`drain`): the outbox backlog an outage leaves, drained by
//! the release binary's publisher (`run --no-worker`, its defaults, logs at
//! the default level into a file) against the bench's broker, at 20,000,
//! 200,000 and 2,000,000 unpublished rows. A claim's cost is what it takes,
//! not the backlog, so events/s and PostgreSQL's CPU per event stay flat as
//! the backlog grows.
//!
//! Each size's rows are written once into a template database (rows as
//! the expiry writes them while the broker is unreachable: the topic's
//! layout known, each row born with its partition; keys are booking ids
//! with their Java-partitioner hash, payloads and CloudEvents headers of
//! the real events' size), `VACUUM ANALYZE`d, and every repetition drains a
//! file copy into a fresh 3-partition topic; a small backlog is drained
//! more times than a large one ([`repetitions`]). Measured per repetition:
//! events/s from the first claim to the last mark (the process's start
//! left out), PostgreSQL's CPU (`support::tree_cpu_ms` of the postmaster,
//! autovacuum included, the backend of the bench's own queries left out)
//! and WAL per 1,000 events over the drain.
//! Goals (issue #41): 200,000 rows at >= 0.9x the events/s of 20,000,
//! 2,000,000 at >= 0.8x; CPU per event within 1.2x across the sizes.

use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use booking_expiration::{events::key_hash, outbox::Timing};
use diesel::{
    QueryableByName,
    sql_types::{Array, BigInt, Binary, Double, Integer, Text},
};
use diesel_async::{AsyncConnection, AsyncPgConnection, RunQueryDsl, SimpleAsyncConnection};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use super::{deadline_wake::fresh_db, drain_stats::Counters};
use crate::{
    progress,
    support::{
        Services, Stat, backend_pid, create_topic, env_flag, env_list, kafka_client, loadavg,
        records_on, run_time_ms, tree_cpu_ms,
    },
};

const BINARY: &str = env!("CARGO_BIN_EXE_booking-expiration");
const SIZES: [u64; 3] = [20_000, 200_000, 2_000_000];
const QUICK_SIZES: [u64; 2] = [20_000, 200_000];
const REPEAT: usize = 3;
const QUICK_REPEAT: usize = 2;
/// Rows drained per size at least, over its repetitions: a backlog of
/// 20,000 rows drains in about a second, and single such drains ranged
/// from 19,000 to 32,000 events/s on one machine in one hour, so the
/// small sizes repeat until their median is as steady as the large
/// ones' (20 repetitions of 20,000 rows; quick: 10).
const ROWS_PER_SIZE: u64 = 400_000;
const QUICK_ROWS_PER_SIZE: u64 = 200_000;
const PARTITIONS: i32 = 3;
/// Rows per insert statement while the template is written.
const CHUNK: u64 = 50_000;

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct DrainFigure {
    pub sizes: Vec<DrainSize>,
    pub loadavg_at_start: [f64; 3],
    pub duration_s: f64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct DrainSize {
    pub rows: u64,
    pub events_per_s: Stat,
    pub pg_cpu_ms_per_1000: Stat,
    pub wal_bytes_per_event: Stat,
}

/// The sizes of this run: `BENCH_DRAIN_SIZES` (a comma-separated list of
/// row counts) overrides them (for trying; the committed run uses the
/// defaults).
fn sizes(quick: bool) -> Result<Vec<u64>> {
    Ok(match env_list("BENCH_DRAIN_SIZES", "row counts")? {
        Some(sizes) => sizes,
        None if quick => QUICK_SIZES.to_vec(),
        None => SIZES.to_vec(),
    })
}

/// How many times a backlog of `rows` is drained: at least [`REPEAT`],
/// and as many as [`ROWS_PER_SIZE`] rows take.
fn repetitions(rows: u64, quick: bool) -> usize {
    let (least, total) = if quick {
        (QUICK_REPEAT, QUICK_ROWS_PER_SIZE)
    } else {
        (REPEAT, ROWS_PER_SIZE)
    };
    least.max(usize::try_from(total / rows.max(1)).unwrap_or(least))
}

/// Diagnoses of the figure, none of them in the committed run: switched
/// on by `BENCH_DRAIN_CHECKPOINT=1`, `BENCH_DRAIN_STATS=1` and
/// `BENCH_DRAIN_FILLFACTOR` (the outbox's fill factor in the templates
/// instead of the migrations') and `BENCH_DRAIN_DROP_INDEX` (indexes the
/// templates drop, comma-separated: what one costs the drain).
#[derive(Debug, Clone, Default)]
struct Diagnoses {
    /// Each drain starts from a checkpoint, and its CPU includes the one
    /// after it ([`drain_once`]).
    checkpoints: bool,
    /// The server's counters per drain ([`super::drain_stats`]).
    stats: bool,
    fillfactor: Option<u32>,
    drop_indexes: Vec<String>,
}

impl Diagnoses {
    fn from_env() -> Result<Self> {
        let fillfactor = match std::env::var("BENCH_DRAIN_FILLFACTOR") {
            Ok(v) if !v.is_empty() => Some(
                v.parse()
                    .ok()
                    .filter(|f| (10..=100).contains(f))
                    .with_context(|| format!("BENCH_DRAIN_FILLFACTOR={v}: not 10-100"))?,
            ),
            _ => None,
        };
        let drop_indexes: Vec<String> = std::env::var("BENCH_DRAIN_DROP_INDEX")
            .unwrap_or_default()
            .split(',')
            .map(str::trim)
            .filter(|name| !name.is_empty())
            .map(str::to_owned)
            .collect();
        if let Some(bad) = drop_indexes.iter().find(|name| {
            !name
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
        }) {
            bail!("BENCH_DRAIN_DROP_INDEX: {bad:?} is not an index name (a-z, 0-9, _)");
        }
        Ok(Self {
            checkpoints: env_flag("BENCH_DRAIN_CHECKPOINT"),
            stats: env_flag("BENCH_DRAIN_STATS"),
            fillfactor,
            drop_indexes,
        })
    }
}

pub async fn measure(svc: &Services, quick: bool) -> Result<DrainFigure> {
    let sizes = sizes(quick)?;
    let diagnoses = Diagnoses::from_env()?;
    let started = Instant::now();
    let loadavg_at_start = loadavg();
    progress!(
        "19. drain: outbox backlogs of {} rows (repetitions), `run --no-worker` at its defaults",
        sizes
            .iter()
            .map(|&rows| format!("{rows} ({})", repetitions(rows, quick)))
            .collect::<Vec<_>>()
            .join(", ")
    );
    let mut out = Vec::new();
    for &rows in &sizes {
        // One topic per size: each repetition appends its rows to it.
        let topic = format!("bench-drain-{rows}-{}", Uuid::new_v4().simple());
        create_topic(svc, &topic, PARTITIONS).await?;
        let template = template(svc, rows, &topic, &diagnoses).await?;
        let (mut rate, mut cpu, mut wal) = (Vec::new(), Vec::new(), Vec::new());
        for k in 0..repetitions(rows, quick) {
            let run = drain_once(svc, &template, &topic, rows, &diagnoses).await?;
            progress!(
                "drain {rows} #{k}: {:.0} events/s, PostgreSQL {:.1} ms CPU and {:.0} bytes of WAL per 1,000 events",
                run.events_per_s,
                run.pg_cpu_ms_per_1000,
                run.wal_bytes_per_event * 1000.0
            );
            rate.push(run.events_per_s);
            cpu.push(run.pg_cpu_ms_per_1000);
            wal.push(run.wal_bytes_per_event);
        }
        svc.drop_db(&template).await?;
        out.push(DrainSize {
            rows,
            events_per_s: Stat::of(&rate),
            pg_cpu_ms_per_1000: Stat::of(&cpu),
            wal_bytes_per_event: Stat::of(&wal),
        });
    }
    Ok(DrainFigure {
        sizes: out,
        loadavg_at_start,
        duration_s: started.elapsed().as_secs_f64(),
    })
}

/// A migrated database holding `rows` unpublished outbox rows of `topic`
/// (laid out in 3 partitions), vacuumed.
async fn template(svc: &Services, rows: u64, topic: &str, diagnoses: &Diagnoses) -> Result<String> {
    let db = fresh_db(svc, &format!("drain_tpl_{rows}")).await?;
    let mut conn = AsyncPgConnection::establish(&svc.url_of(&db)).await?;
    let started = Instant::now();
    if let Some(fillfactor) = diagnoses.fillfactor {
        conn.batch_execute(&format!(
            "ALTER TABLE booking_expiration_outbox SET (fillfactor = {fillfactor})"
        ))
        .await?;
    }
    if diagnoses.stats {
        super::drain_stats::prepare(&mut conn).await;
    }
    for index in &diagnoses.drop_indexes {
        conn.batch_execute(&format!("DROP INDEX {index}")).await?;
    }
    diesel::sql_query(
        "INSERT INTO booking_expiration_topic_layout (topic, partitions, read_at) \
         VALUES ($2, $1, now())",
    )
    .bind::<Integer, _>(PARTITIONS)
    .bind::<Text, _>(topic)
    .execute(&mut conn)
    .await?;
    // The headers of a real event (its size matters for the WAL).
    let headers = r#"{"ce_id":"0b9f6a1e-8d2c-4f3a-9e1b-7c5d4a3b2e10","ce_source":"/pin/crm/booking-expiration","ce_specversion":"1.0","ce_time":"2026-12-06T00:00:00.000000Z","ce_type":"pin.crm.booking-expired.v1","content-type":"application/protobuf","correlation_id":"5d7e9f0a-1b2c-4d3e-8f4a-6b7c8d9e0f1a","tenant_id":"00000000-0000-4000-8000-000000000042","traceparent":"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}"#;
    let mut written = 0;
    while written < rows {
        let n = CHUNK.min(rows - written);
        let keys: Vec<String> = (0..n).map(|_| Uuid::new_v4().to_string()).collect();
        let hashes: Vec<i32> = keys.iter().map(|k| key_hash(k)).collect();
        let payloads: Vec<Vec<u8>> = (0..n).map(|i| vec![(i % 251) as u8; 180]).collect();
        // Each row with its event record, as the expiring statement writes
        // them.
        diesel::sql_query(
            "WITH queued AS (\
               INSERT INTO booking_expiration_outbox \
                 (event_id, topic, message_key, key_hash, partition_count, kafka_partition, \
                  payload, headers, correlation_id, tenant_id, created_at) \
               SELECT gen_random_uuid(), $6, k, h, $4, h % $4, p, $5::json, gen_random_uuid(), \
                      gen_random_uuid(), now() \
                 FROM unnest($1::text[], $2::int[], $3::bytea[]) AS u(k, h, p) \
               RETURNING id, event_id) \
             INSERT INTO booking_expiration_outbox_event (event_id, replay_id, outbox_id) \
             SELECT event_id, NULL, id FROM queued",
        )
        .bind::<Array<Text>, _>(&keys)
        .bind::<Array<Integer>, _>(&hashes)
        .bind::<Array<Binary>, _>(&payloads)
        .bind::<Integer, _>(PARTITIONS)
        .bind::<Text, _>(headers)
        .bind::<Text, _>(topic)
        .execute(&mut conn)
        .await?;
        written += n;
    }
    conn.batch_execute("VACUUM ANALYZE booking_expiration_outbox, booking_expiration_outbox_event")
        .await?;
    progress!(
        "drain: template of {rows} rows written in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    Ok(db)
}

struct Drained {
    events_per_s: f64,
    pg_cpu_ms_per_1000: f64,
    wal_bytes_per_event: f64,
}

#[derive(QueryableByName)]
struct Wal {
    #[diesel(sql_type = Double)]
    wal: f64,
}

#[derive(QueryableByName)]
struct Span {
    #[diesel(sql_type = Double)]
    seconds: f64,
}

async fn wal_now(conn: &mut AsyncPgConnection) -> Result<f64> {
    Ok(diesel::sql_query(
        "SELECT pg_wal_lsn_diff(pg_current_wal_insert_lsn(), '0/0')::float8 AS wal",
    )
    .get_result::<Wal>(conn)
    .await?
    .wal)
}

/// The lease `run` writes with a claim, in milliseconds.
fn lease_ms() -> i64 {
    i64::try_from(Timing::default().lease.as_millis()).unwrap_or(i64::MAX)
}

/// Drains a copy of `template` into `topic` with `run --no-worker`. The
/// CPU is the cluster's less the backend that serves the bench's own
/// queries (the poll for the last marks reads the whole table). With
/// `diagnoses.checkpoints` (`BENCH_DRAIN_CHECKPOINT=1`, not the committed
/// figure) the drain starts from a checkpoint, with no page of the copy
/// left to write, and its CPU includes the checkpoint that writes back the
/// pages it dirtied, as a drain too long to end between two checkpoints
/// pays within it.
async fn drain_once(
    svc: &Services,
    template: &str,
    topic: &str,
    rows: u64,
    diagnoses: &Diagnoses,
) -> Result<Drained> {
    let checkpoints = diagnoses.checkpoints;
    let db = svc.copy(template).await?;
    let url = svc.url_of(&db);
    let client = kafka_client(svc).await?;
    let before = records_on(&client, topic, PARTITIONS).await?;
    let mut admin = AsyncPgConnection::establish(&url).await?;
    let postmaster = svc.postmaster_pid()?;
    if checkpoints {
        admin.batch_execute("CHECKPOINT").await?;
    }
    let own = backend_pid(&mut admin).await?;
    let counters = if diagnoses.stats {
        Some(Counters::read(&mut admin).await?)
    } else {
        None
    };
    let (cpu0, wal0) = (
        tree_cpu_ms(postmaster) - run_time_ms(own),
        wal_now(&mut admin).await?,
    );
    let log = svc.work.join(format!("{db}-drain.log"));
    let file = std::fs::File::create(&log)?;
    let mut child = tokio::process::Command::new(BINARY)
        .env_clear()
        .args(["run", "--no-worker"])
        .env("DATABASE_URL", &url)
        .env("KAFKA_BOOTSTRAP_SERVERS", &svc.kafka_bootstrap)
        .env("KAFKA_TOPIC", topic)
        .env("METRICS_ADDR", "127.0.0.1:0")
        .stdin(std::process::Stdio::null())
        .stdout(file.try_clone()?)
        .stderr(file)
        .kill_on_drop(true)
        .spawn()
        .context("start the booking-expiration binary")?;
    // Done when the topic holds every row (no query of the outbox meanwhile).
    let give_up = Instant::now() + Duration::from_secs(60 + rows / 1_000);
    loop {
        tokio::time::sleep(Duration::from_millis(250)).await;
        if let Some(status) = child.try_wait()? {
            bail!(
                "the publisher exited early ({status}); log: {}",
                log.display()
            );
        }
        let total = records_on(&client, topic, PARTITIONS).await? - before;
        if total >= rows {
            break;
        }
        if Instant::now() > give_up {
            bail!(
                "drain of {rows}: {total} on the topic when the bound passed; log: {}",
                log.display()
            );
        }
    }
    // The last marks: the round after the last acknowledgement.
    let marked = Instant::now() + Duration::from_secs(30);
    loop {
        let left: i64 = diesel::sql_query(
            "SELECT count(*)::float8 AS seconds FROM booking_expiration_outbox WHERE published_at IS NULL",
        )
        .get_result::<Span>(&mut admin)
        .await?
        .seconds as i64;
        if left == 0 {
            break;
        }
        if Instant::now() > marked {
            bail!("drain of {rows}: {left} rows not marked published");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    if checkpoints {
        admin.batch_execute("CHECKPOINT").await?;
    }
    let (cpu1, wal1) = (
        tree_cpu_ms(postmaster) - run_time_ms(own),
        wal_now(&mut admin).await?,
    );
    // From the first claim (its statement's time: the lease it wrote less
    // the lease's length; a drain renews none) to the last mark. From the
    // first mark instead, the first claim (up to `OUTBOX_BATCH_SIZE` x 16
    // rows, 40% of 20,000) fell outside the window: a larger share of a
    // small drain than of a large one.
    let span = diesel::sql_query(
        "SELECT extract(epoch FROM max(published_at) \
                 - (min(claimed_until) - $1 * interval '1 millisecond'))::float8 AS seconds \
           FROM booking_expiration_outbox",
    )
    .bind::<BigInt, _>(lease_ms())
    .get_result::<Span>(&mut admin)
    .await?
    .seconds;
    let _ = child.start_kill();
    let _ = child.wait().await;
    if let Some(before) = counters {
        Counters::report(&before, &mut admin, rows).await?;
    }
    drop(admin);
    svc.drop_db(&db).await?;
    let events = rows as f64;
    Ok(Drained {
        events_per_s: events / span.max(0.001),
        pg_cpu_ms_per_1000: (cpu1 - cpu0) * 1000.0 / events,
        wal_bytes_per_event: (wal1 - wal0) / events,
    })
}
