//! Figure 14 (`migrations`): how long the migrations that lock the worker's
//! own outbox hold the worker's writes, on an outbox of 24 hours at the
//! default `OUTBOX_RETENTION` (`24h`): `20261204000003` (a unique index on
//! `(event_id, replay_id)`, built inside its transaction, and new columns)
//! and `20261204000004` (the headers column rewritten from jsonb to json,
//! which rewrites the table and its indexes under an exclusive lock).
//!
//! Each repetition makes a database migrated up to just before
//! `20261204000003`, fills the outbox with a day of published events (and
//! the audit trail with their records) as the worker wrote them then, and
//! starts a writer that does what an expiry batch does to the worker's own
//! tables, one audit row and one outbox row per transaction, every 10 ms,
//! timing each. Then the two migrations run as `migrate` runs them (the
//! diesel harness, each in its own transaction, on a session with
//! `migrate`'s settings: 30 s statement and lock timeouts), one second
//! apart. The figure: each migration's duration, and the longest write
//! that overlapped it, against the writer's median before the migrations.
//!
//! A day of events: 10,000,000 expiries a year (the replay figure's busy
//! crm) is 27,397 a day; the peak size is ten times that.

use std::{
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use anyhow::{Context, Result, ensure};
use booking_expiration::{
    config::DatabaseSettings,
    db::{self, migrate::MIGRATIONS},
    libpq::DatabaseUrl,
};
use diesel_async::{
    AsyncConnection, AsyncMigrationHarness, AsyncPgConnection, SimpleAsyncConnection,
};
use diesel_migrations::MigrationHarness;
use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;

use super::reps;
use crate::{
    progress,
    support::{Services, Stat, loadavg, num},
};

/// A day of events at 10,000,000 a year.
pub const DAY_OF_EVENTS: u64 = 10_000_000 / 365;
/// The last migration applied before the measured ones.
const BEFORE: &str = "20261204000002";
/// The measured migrations, in order, with what each does to the outbox.
const MEASURED: [(&str, &str); 2] = [
    (
        "20261204000003",
        "unique index on the outbox's (event_id, replay_id), in its transaction",
    ),
    (
        "20261204000004",
        "outbox headers jsonb -> json: the table and its indexes rewritten",
    ),
];
/// How often the writer writes.
const WRITE_EVERY: Duration = Duration::from_millis(10);

/// Figure 14 (`results.json`'s `migrations`).
#[derive(Debug, Serialize, Deserialize)]
pub struct MigrationsFigure {
    pub sizes: Vec<MigrationSize>,
    /// `DATABASE_STATEMENT_TIMEOUT` of the session (statement and lock
    /// timeout of `migrate`'s migrations).
    pub statement_timeout_s: f64,
    pub loadavg_at_start: [f64; 3],
}

/// One outbox size.
#[derive(Debug, Serialize, Deserialize)]
pub struct MigrationSize {
    /// Rows in the outbox (and records in the audit trail).
    pub outbox_rows: u64,
    /// The writer's median transaction before the migrations, ms.
    pub write_median_ms: Stat,
    pub migrations: Vec<MigrationTiming>,
}

/// One migration at one size.
#[derive(Debug, Serialize, Deserialize)]
pub struct MigrationTiming {
    pub version: String,
    pub what: String,
    /// From the start of the migration to its commit, ms.
    pub ms: Stat,
    /// The longest writer transaction that overlapped it, ms.
    pub longest_write_ms: Stat,
}

/// One timed write: when it started and how long it took, since `t0`.
#[derive(Clone, Copy)]
struct Write {
    start_ms: f64,
    ms: f64,
}

/// Figure 14.
pub async fn measure(svc: &Services, quick: bool) -> Result<MigrationsFigure> {
    let sizes: &[u64] = if quick {
        &[DAY_OF_EVENTS]
    } else {
        &[DAY_OF_EVENTS, DAY_OF_EVENTS * 10]
    };
    let reps = reps(quick, 3);
    progress!(
        "14. migrations 20261204000003 and 20261204000004 on a 24 h outbox ({} rows; {} reps)",
        sizes
            .iter()
            .map(|n| num(*n as f64))
            .collect::<Vec<_>>()
            .join(", "),
        reps
    );
    let loadavg_at_start = loadavg();
    let settings = migrate_settings(&svc.admin_url)?;
    let mut out = Vec::new();
    for &rows in sizes {
        let mut medians = Vec::new();
        let mut ms = [Vec::new(), Vec::new()];
        let mut longest = [Vec::new(), Vec::new()];
        for rep in 0..reps {
            let run = run_once(svc, rows).await?;
            progress!(
                "migrations: {} rows, rep {}/{reps}: writes median {:.1} ms; 000003 {:.0} ms (longest write {:.0} ms); 000004 {:.0} ms (longest write {:.0} ms)",
                num(rows as f64),
                rep + 1,
                run.median_ms,
                run.ms[0],
                run.longest_ms[0],
                run.ms[1],
                run.longest_ms[1]
            );
            medians.push(run.median_ms);
            for i in 0..2 {
                ms[i].push(run.ms[i]);
                longest[i].push(run.longest_ms[i]);
            }
        }
        out.push(MigrationSize {
            outbox_rows: rows,
            write_median_ms: Stat::of(&medians),
            migrations: MEASURED
                .iter()
                .zip(ms.iter().zip(&longest))
                .map(|((version, what), (ms, longest))| MigrationTiming {
                    version: (*version).into(),
                    what: (*what).into(),
                    ms: Stat::of(ms),
                    longest_write_ms: Stat::of(longest),
                })
                .collect(),
        });
    }
    Ok(MigrationsFigure {
        sizes: out,
        statement_timeout_s: settings.statement_timeout.as_secs_f64(),
        loadavg_at_start,
    })
}

/// `migrate`'s session: the defaults (`DATABASE_STATEMENT_TIMEOUT` 30 s
/// as statement and lock timeout).
fn migrate_settings(url: &str) -> Result<DatabaseSettings> {
    Ok(DatabaseSettings::new(DatabaseUrl::parse(url)?))
}

struct Run {
    median_ms: f64,
    ms: [f64; 2],
    longest_ms: [f64; 2],
}

async fn run_once(svc: &Services, rows: u64) -> Result<Run> {
    let name = "mg_outbox";
    svc.drop_db(name).await?;
    svc.admin_exec(&format!("CREATE DATABASE {name}")).await?;
    let url = svc.url_of(name);
    let settings = migrate_settings(&url)?;
    // Up to the measured ones, as `migrate` would have left the database.
    let conn = db::establish(&settings).await?;
    let mut harness = AsyncMigrationHarness::new(conn);
    loop {
        let version = harness
            .run_next_migration(MIGRATIONS)
            .map_err(|e| anyhow::anyhow!("migration: {e}"))?
            .to_string();
        if version == BEFORE {
            break;
        }
    }
    let mut conn = harness.into_inner();
    conn.batch_execute(&fill_sql(rows)).await?;
    conn.batch_execute("VACUUM ANALYZE booking_expiration_outbox, booking_expiration_audit")
        .await?;

    let t0 = Instant::now();
    let writes = Arc::new(Mutex::new(Vec::<Write>::new()));
    let stop = CancellationToken::new();
    let writer = tokio::spawn(write_loop(
        url.clone(),
        t0,
        Arc::clone(&writes),
        stop.clone(),
    ));
    tokio::time::sleep(Duration::from_secs(1)).await;
    let mut spans = Vec::new();
    let mut harness = AsyncMigrationHarness::new(conn);
    for (version, _) in MEASURED {
        let start = t0.elapsed().as_secs_f64() * 1e3;
        // The harness blocks its thread (block_in_place); the writer runs on
        // the runtime's other worker.
        let applied = harness
            .run_next_migration(MIGRATIONS)
            .map_err(|e| anyhow::anyhow!("migration {version}: {e}"))?
            .to_string();
        ensure!(applied == version, "applied {applied}, expected {version}");
        spans.push((start, t0.elapsed().as_secs_f64() * 1e3));
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    stop.cancel();
    writer.await.context("writer task")??;
    drop(harness);
    let writes = writes
        .lock()
        .map_err(|_| anyhow::anyhow!("poisoned"))?
        .clone();
    ensure!(writes.len() > 100, "only {} writes", writes.len());
    let before: Vec<f64> = writes
        .iter()
        .filter(|w| w.start_ms + w.ms < spans[0].0)
        .map(|w| w.ms)
        .collect();
    let longest = |(start, end): (f64, f64)| {
        writes
            .iter()
            .filter(|w| w.start_ms < end && w.start_ms + w.ms > start)
            .map(|w| w.ms)
            .fold(0.0, f64::max)
    };
    svc.drop_db(name).await?;
    Ok(Run {
        median_ms: Stat::of(&before).median,
        ms: [spans[0].1 - spans[0].0, spans[1].1 - spans[1].0],
        longest_ms: [longest(spans[0]), longest(spans[1])],
    })
}

/// A day of published events in the outbox as the worker wrote them before
/// `20261204000003` (jsonb headers with the CloudEvents, correlation,
/// tenant and trace keys; a 254-byte payload), over the last 24 hours, and
/// their audit records.
fn fill_sql(rows: u64) -> String {
    format!(
        "SET synchronous_commit = off;
         INSERT INTO booking_expiration_outbox
                (event_id, topic, message_key, payload, headers, correlation_id, tenant_id,
                 created_at, published_at)
         SELECT md5('e' || i)::uuid, 'pin.crm.booking-expired.v1', md5('b' || i)::uuid::text,
                substr(decode(repeat(md5(i::text), 8), 'hex'), 1, 254),
                jsonb_build_object(
                    'ce_specversion', '1.0', 'ce_id', md5('e' || i)::uuid,
                    'ce_source', '/pin/crm/booking-expiration',
                    'ce_type', 'pin.crm.booking-expired.v1', 'ce_time', t,
                    'content-type', 'application/protobuf',
                    'correlation_id', md5('r' || (i / 50))::uuid,
                    'tenant_id', md5('t' || (i % 200))::uuid,
                    'traceparent', '00-' || md5('tr' || (i / 50)) || '-' || left(md5('s' || i), 16) || '-01'),
                md5('r' || (i / 50))::uuid, md5('t' || (i % 200))::uuid, t, t + interval '100 ms'
           FROM generate_series(1, {rows}) AS i,
                LATERAL (SELECT now() - interval '24 hours' + i * (interval '24 hours' / {rows})) AS g(t);
         INSERT INTO booking_expiration_audit
                (booking_id, tenant_id, from_status, to_status, actor, correlation_id, at)
         SELECT md5('b' || i)::uuid, md5('t' || (i % 200))::uuid, 'Reserved', 'ReserveExpired',
                'system', md5('r' || (i / 50))::uuid,
                now() - interval '24 hours' + i * (interval '24 hours' / {rows})
           FROM generate_series(1, {rows}) AS i;"
    )
}

/// One audit row and one outbox row per transaction, the columns every
/// schema version has, every [`WRITE_EVERY`], until `stop`; each timed
/// from BEGIN to COMMIT.
async fn write_loop(
    url: String,
    t0: Instant,
    writes: Arc<Mutex<Vec<Write>>>,
    stop: CancellationToken,
) -> Result<()> {
    let mut conn = AsyncPgConnection::establish(&url).await?;
    let mut n = 0u64;
    while !stop.is_cancelled() {
        n += 1;
        let sql = format!(
            "BEGIN;
             INSERT INTO booking_expiration_audit
                    (booking_id, tenant_id, from_status, to_status, actor, correlation_id, at)
             VALUES (md5('w' || {n})::uuid, md5('t')::uuid, 'Reserved', 'ReserveExpired',
                     'system', md5('wr')::uuid, now());
             INSERT INTO booking_expiration_outbox
                    (event_id, topic, message_key, payload, headers, correlation_id, tenant_id,
                     created_at)
             VALUES (md5('we' || {n})::uuid, 'pin.crm.booking-expired.v1', 'k', '\\x01',
                     '{{\"ce_id\":\"x\",\"ce_specversion\":\"1.0\"}}', md5('wr')::uuid,
                     md5('t')::uuid, now());
             COMMIT;"
        );
        let start = Instant::now();
        conn.batch_execute(&sql).await?;
        let ms = start.elapsed().as_secs_f64() * 1e3;
        writes
            .lock()
            .map_err(|_| anyhow::anyhow!("poisoned"))?
            .push(Write {
                start_ms: (start - t0).as_secs_f64() * 1e3,
                ms,
            });
        tokio::time::sleep(WRITE_EVERY).await;
    }
    Ok(())
}
