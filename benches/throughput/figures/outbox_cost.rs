//! Figure 17 (`outbox_cost`): PostgreSQL's work per event before and after
//! the publisher became a pipeline (#32: "PostgreSQL work per event may grow
//! by at most 10%: server CPU and WAL per event measured before and after,
//! in one run").
//!
//! Every side runs on a fresh copy of `tpl_10k` (10,000 due bookings, an
//! empty outbox) and does the whole life of the events on one pool whose
//! connections stay open until the last reading, so the server's CPU time
//! is read exactly (`support::tree_cpu_ms`: every PostgreSQL process,
//! live ones to the nanosecond) together with the WAL insert position:
//!
//! 1. the worker's cycle expires the 10,000 bookings (batch 200): status,
//!    audit row and outbox row per booking, as `run` does;
//! 2. the side's publisher drains the outbox (batch 500);
//! 3. `VACUUM booking_expiration_outbox`: the dead row versions the
//!    publisher left, which autovacuum would clean up later.
//!
//! "Publisher" is step 2, "whole event" steps 1 and 2, "+ vacuum" adds
//! step 3. Autovacuum is off on the copy's tables (it would land on
//! whichever side runs when it wakes). `CREATE DATABASE … FILE_COPY` makes a
//! checkpoint, so the expiry writes the first full-page images of the
//! bookings' pages on every side alike, and the outbox pages the expiry
//! fills are new (no full-page image): the publisher's updates of them
//! within the same checkpoint cycle log no page images, as in production.
//!
//! Sides, taking turns within each repetition (the first rotates):
//! - `before`: [`BEFORE_CLAIM_SQL`] + [`BEFORE_MARK_SQL`] in one
//!   transaction per batch, the publisher's database work before #32 (its
//!   Kafka call, between the two, left out);
//! - `after`: `Publisher::on_database` with `ScriptedTransport` (every
//!   request acknowledged at once): the pipeline's rounds on `PgStore`,
//!   each marking what was acknowledged and claiming with a lease, on the
//!   outbox as the migrations leave it (`fillfactor` 70);
//! - `after_kafka`: the same pipeline on `KafkaTransport` (the real broker:
//!   acknowledgements arrive as they do, so rounds may be smaller);
//! - `after_ff100`, `after_ff50`: `after` with the outbox's `fillfactor`
//!   set otherwise on the copy before the expiry writes (100: no room on a
//!   page for the lease's new row version, so no HOT update; 50: more);
//! - `handoff`: `run`'s path: the expiry writes each outbox row leased to
//!   its own publisher (running beside it, `ScriptedTransport`) and hands
//!   the committed rows over, so no claim reserves them; cycles of 5
//!   batches, each once the publisher holds nothing (production's steady
//!   state: no queue at its share). Its expiry and publishing overlap, so
//!   only its whole event (steps 1 + 2) is compared;
//! - `split`: the breakdown of `after`: every claim (lease) first, then
//!   every mark, with a reading between, through the same `db::outbox`
//!   functions the pipeline's store calls.

use std::{sync::Arc, time::Instant};

use anyhow::{Result, ensure};
use booking_expiration::{
    db::{
        PgPool,
        outbox::{self, Claim},
    },
    domain::RunId,
    expiry::CycleStart,
    handoff::LeaseOwner,
    outbox::ScriptedTransport,
};
use diesel::{
    QueryableByName,
    sql_types::{Array, BigInt, Binary, Double, Text, Timestamptz, Uuid as SqlUuid},
};
use diesel_async::{AsyncConnection, AsyncPgConnection, RunQueryDsl, SimpleAsyncConnection};
use serde::{Deserialize, Serialize};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use super::{
    expiry, pools,
    publisher::{PUBLISH_BATCH, publisher, publisher_context, warm_transport},
    reps,
};
use crate::{
    progress,
    support::{Services, Stat, loadavg, tree_cpu_ms, wall_now},
    templates::DueSet,
};

/// The publisher's claim before #32 (`db::outbox::claim_sql` then): row
/// locks taken in the publishing transaction and held across the Kafka
/// call. The baseline of this figure, kept here as it was.
pub const BEFORE_CLAIM_SQL: &str = "SELECT id, event_id, topic, message_key, payload, \
     headers::text AS headers, created_at FROM booking_expiration_outbox \
     WHERE published_at IS NULL AND parked_at IS NULL \
     ORDER BY id LIMIT $1 FOR UPDATE SKIP LOCKED";

/// The publisher's mark before #32, in the claim's transaction.
pub const BEFORE_MARK_SQL: &str =
    "UPDATE booking_expiration_outbox SET published_at = $2 WHERE id = ANY($1)";

/// The expiry's batch (`EXPIRATION_BATCH_SIZE`'s default).
const EXPIRY_BATCH: u32 = 200;

/// Who publishes, on which outbox.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Publish {
    Before,
    Pipeline,
    Handoff,
    PipelineKafka,
    Split,
}

struct SideSpec {
    key: &'static str,
    label: &'static str,
    publish: Publish,
    fillfactor: u32,
}

const SIDES: [SideSpec; 7] = [
    SideSpec {
        key: "before",
        label: "before #32: claim (SELECT … FOR UPDATE SKIP LOCKED) + mark in one transaction per batch",
        publish: Publish::Before,
        fillfactor: 100,
    },
    SideSpec {
        key: "after",
        label: "after: the pipeline on PgStore (lease claim + mark rounds), broker acks at once",
        publish: Publish::Pipeline,
        fillfactor: 70,
    },
    SideSpec {
        key: "handoff",
        label: "run's path: rows written leased to the instance's publisher, handed over after the commit",
        publish: Publish::Handoff,
        fillfactor: 70,
    },
    SideSpec {
        key: "after_kafka",
        label: "after: the pipeline on PgStore, the real broker (KafkaTransport)",
        publish: Publish::PipelineKafka,
        fillfactor: 70,
    },
    SideSpec {
        key: "after_ff100",
        label: "after, outbox fillfactor 100 (no room for HOT updates)",
        publish: Publish::Pipeline,
        fillfactor: 100,
    },
    SideSpec {
        key: "after_ff50",
        label: "after, outbox fillfactor 50",
        publish: Publish::Pipeline,
        fillfactor: 50,
    },
    SideSpec {
        key: "split",
        label: "after, split: every lease claim first, then every mark (breakdown)",
        publish: Publish::Split,
        fillfactor: 70,
    },
];

/// The figure (`results.json`'s `outbox_cost`).
#[derive(Debug, Serialize, Deserialize)]
pub struct OutboxCost {
    /// Events per run (the template's due bookings).
    pub events: u64,
    pub expiry_batch: u32,
    pub publish_batch: u32,
    pub before_claim_sql: String,
    pub before_mark_sql: String,
    pub sides: Vec<CostSide>,
    pub loadavg_at_start: [f64; 3],
    pub loadavg_at_end: [f64; 3],
}

/// One side over its repetitions; per event, samples in repetition order
/// (so side A's i-th sample and side B's ran in the same repetition).
#[derive(Debug, Serialize, Deserialize)]
pub struct CostSide {
    pub key: String,
    pub label: String,
    pub fillfactor: u32,
    /// Server CPU microseconds per event: the expiry (step 1).
    pub expiry_cpu_us: Stat,
    pub expiry_wal_bytes: Stat,
    /// The publisher (step 2).
    pub publish_cpu_us: Stat,
    pub publish_wal_bytes: Stat,
    /// `VACUUM` of the outbox after it (step 3).
    pub vacuum_cpu_us: Stat,
    pub vacuum_wal_bytes: Stat,
    /// The `split` side only: the claims (leases) of step 2 alone; the
    /// marks are the rest of step 2.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease_cpu_us: Option<Stat>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease_wal_bytes: Option<Stat>,
    /// Wall seconds of step 2.
    pub publish_s: Stat,
    /// Outbox row updates per event and the share of them that were HOT
    /// (`pg_stat_user_tables`), first repetition.
    pub outbox_updates_per_event: f64,
    pub outbox_hot_share: f64,
    /// Outbox pages after step 2 (`pg_relation_size` / 8 kB), first
    /// repetition.
    pub outbox_pages: f64,
}

impl CostSide {
    /// Step 1 + 2, per repetition.
    pub fn event_cpu_us(&self) -> Stat {
        sum(&self.expiry_cpu_us, &self.publish_cpu_us)
    }
    pub fn event_wal_bytes(&self) -> Stat {
        sum(&self.expiry_wal_bytes, &self.publish_wal_bytes)
    }
    /// Step 2 + 3.
    pub fn publish_vacuum_cpu_us(&self) -> Stat {
        sum(&self.publish_cpu_us, &self.vacuum_cpu_us)
    }
    pub fn publish_vacuum_wal_bytes(&self) -> Stat {
        sum(&self.publish_wal_bytes, &self.vacuum_wal_bytes)
    }
    /// Steps 1 to 3.
    pub fn event_vacuum_cpu_us(&self) -> Stat {
        sum(&self.event_cpu_us(), &self.vacuum_cpu_us)
    }
    pub fn event_vacuum_wal_bytes(&self) -> Stat {
        sum(&self.event_wal_bytes(), &self.vacuum_wal_bytes)
    }
}

fn sum(a: &Stat, b: &Stat) -> Stat {
    Stat::of(
        &a.samples
            .iter()
            .zip(&b.samples)
            .map(|(x, y)| x + y)
            .collect::<Vec<_>>(),
    )
}

/// `after / before` per repetition (the i-th samples ran in the same
/// repetition), as min / median / max.
pub fn paired_ratio(after: &Stat, before: &Stat) -> Stat {
    Stat::of(
        &after
            .samples
            .iter()
            .zip(&before.samples)
            .map(|(a, b)| a / b)
            .collect::<Vec<_>>(),
    )
}

impl OutboxCost {
    pub fn side(&self, key: &str) -> Option<&CostSide> {
        self.sides.iter().find(|s| s.key == key)
    }
}

/// A reading of the server: CPU milliseconds of every PostgreSQL process
/// and the WAL insert position.
#[derive(Clone, Copy)]
struct Usage {
    cpu_ms: f64,
    wal: f64,
}

async fn usage(svc: &Services, admin: &mut AsyncPgConnection) -> Result<Usage> {
    #[derive(QueryableByName)]
    struct Lsn {
        #[diesel(sql_type = Double)]
        lsn: f64,
    }
    let lsn: Lsn = diesel::sql_query(
        "SELECT pg_wal_lsn_diff(pg_current_wal_insert_lsn(), '0/0')::float8 AS lsn",
    )
    .get_result(admin)
    .await?;
    Ok(Usage {
        cpu_ms: tree_cpu_ms(svc.postmaster_pid()?),
        wal: lsn.lsn,
    })
}

/// Per event between two readings: (CPU µs, WAL bytes).
fn per_event(a: Usage, b: Usage, events: u64) -> (f64, f64) {
    let n = events as f64;
    ((b.cpu_ms - a.cpu_ms) * 1e3 / n, (b.wal - a.wal) / n)
}

/// One run of one side.
struct Run {
    expiry: (f64, f64),
    publish: (f64, f64),
    vacuum: (f64, f64),
    lease: Option<(f64, f64)>,
    publish_s: f64,
    updates_per_event: f64,
    hot_share: f64,
    pages: f64,
}

/// Every side `reps` times (7; quick 2), taking turns.
pub async fn measure(svc: &Services, set: &DueSet<'_>, quick: bool) -> Result<OutboxCost> {
    let reps = if quick { 2 } else { reps(false, 7) };
    progress!(
        "17. PostgreSQL work per event, before and after the pipeline: {} events, {} sides, {reps} repetitions",
        set.due,
        SIDES.len()
    );
    let load = loadavg();
    let mut runs: Vec<Vec<Run>> = SIDES.iter().map(|_| Vec::new()).collect();
    for rep in 0..reps {
        for k in 0..SIDES.len() {
            let i = (rep + k) % SIDES.len();
            let side = &SIDES[i];
            let run = run_side(svc, set, side).await?;
            progress!(
                "outbox cost: rep {}/{reps} {:<11} expiry {:.0} µs {:.0} B, publisher {:.0} µs {:.0} B ({:.2} s), vacuum {:.0} µs {:.0} B per event; {:.2} outbox updates per event, {:.0}% HOT, {:.0} pages",
                rep + 1,
                side.key,
                run.expiry.0,
                run.expiry.1,
                run.publish.0,
                run.publish.1,
                run.publish_s,
                run.vacuum.0,
                run.vacuum.1,
                run.updates_per_event,
                run.hot_share * 100.0,
                run.pages
            );
            runs[i].push(run);
        }
    }
    let sides = SIDES
        .iter()
        .zip(runs)
        .map(|(spec, runs)| {
            let stat = |f: fn(&Run) -> f64| Stat::of(&runs.iter().map(f).collect::<Vec<_>>());
            let lease = runs.iter().map(|r| r.lease).collect::<Option<Vec<_>>>();
            CostSide {
                key: spec.key.into(),
                label: spec.label.into(),
                fillfactor: spec.fillfactor,
                expiry_cpu_us: stat(|r| r.expiry.0),
                expiry_wal_bytes: stat(|r| r.expiry.1),
                publish_cpu_us: stat(|r| r.publish.0),
                publish_wal_bytes: stat(|r| r.publish.1),
                vacuum_cpu_us: stat(|r| r.vacuum.0),
                vacuum_wal_bytes: stat(|r| r.vacuum.1),
                lease_cpu_us: lease
                    .as_ref()
                    .map(|l| Stat::of(&l.iter().map(|x| x.0).collect::<Vec<_>>())),
                lease_wal_bytes: lease
                    .as_ref()
                    .map(|l| Stat::of(&l.iter().map(|x| x.1).collect::<Vec<_>>())),
                publish_s: stat(|r| r.publish_s),
                outbox_updates_per_event: runs[0].updates_per_event,
                outbox_hot_share: runs[0].hot_share,
                outbox_pages: runs[0].pages,
            }
        })
        .collect();
    Ok(OutboxCost {
        events: set.due,
        expiry_batch: EXPIRY_BATCH,
        publish_batch: PUBLISH_BATCH,
        before_claim_sql: BEFORE_CLAIM_SQL.into(),
        before_mark_sql: BEFORE_MARK_SQL.into(),
        sides,
        loadavg_at_start: load,
        loadavg_at_end: loadavg(),
    })
}

async fn run_side(svc: &Services, set: &DueSet<'_>, side: &SideSpec) -> Result<Run> {
    let db = svc.copy(&set.template.name).await?;
    let url = svc.url_of(&db);
    {
        let mut conn = AsyncPgConnection::establish(&url).await?;
        conn.batch_execute(&format!(
            "ALTER TABLE booking_expiration_outbox SET (autovacuum_enabled = off, fillfactor = {});
             ALTER TABLE bookings SET (autovacuum_enabled = off);
             ALTER TABLE booking_expiration_audit SET (autovacuum_enabled = off);",
            side.fillfactor
        ))
        .await?;
    }
    svc.wait_idle(&db).await?;
    // The Kafka side's connection and metadata are made before the clock.
    let kafka = match side.publish {
        Publish::PipelineKafka => Some(warm_transport(svc).await?),
        _ => None,
    };
    let pool = pools(&url, 1).await?.remove(0);
    // Both of the pool's connections open: none is made (or closes)
    // between two readings.
    {
        let a = pool.get().await?;
        let b = pool.get().await?;
        drop((a, b));
    }
    let mut admin = svc.admin().await?;
    let n = set.due;

    if side.publish == Publish::Handoff {
        let r0 = usage(svc, &mut admin).await?;
        let started = Instant::now();
        let (expiry_done, published) = expire_and_hand_over(&pool, set).await?;
        let r1 = usage(svc, &mut admin).await?;
        let publish_s = started.elapsed().as_secs_f64();
        ensure!(
            expiry_done == n && published == n,
            "{}: expired {expiry_done}, published {published} of {n}",
            side.key
        );
        return finish_side(
            svc,
            &db,
            &url,
            pool,
            admin,
            (r0, r1, r1),
            None,
            publish_s,
            n,
        )
        .await;
    }
    let r0 = usage(svc, &mut admin).await?;
    let worker = expiry::worker(pool.clone(), set.as_of, EXPIRY_BATCH);
    let outcome = worker
        .run_cycle(CycleStart::new(&CancellationToken::new()).at(set.as_of, RunId::generate()))
        .await?;
    drop(worker);
    ensure!(
        outcome.report.expired() == n,
        "{}: expired {} of {n}",
        side.key,
        outcome.report.expired()
    );
    let r1 = usage(svc, &mut admin).await?;

    let started = Instant::now();
    let mut lease_reading = None;
    let published = match side.publish {
        Publish::Before => publish_before(&pool).await?,
        Publish::Pipeline => {
            let context = publisher_context(pool.clone());
            let p = publisher(&context, ScriptedTransport::new(super::TOPIC, 3));
            p.publish_until_idle().await.published
        }
        Publish::PipelineKafka => {
            let context = publisher_context(pool.clone());
            let transport = kafka.expect("a warm transport");
            let p = publisher(&context, transport);
            p.publish_until_idle().await.published
        }
        Publish::Split => {
            let owner = LeaseOwner::new();
            let ids = lease_all(&pool, owner).await?;
            lease_reading = Some(usage(svc, &mut admin).await?);
            mark_all(&pool, &ids, owner).await?;
            ids.len() as u64
        }
        Publish::Handoff => unreachable!("measured above"),
    };
    let publish_s = started.elapsed().as_secs_f64();
    ensure!(published == n, "{}: published {published} of {n}", side.key);
    let r2 = usage(svc, &mut admin).await?;
    finish_side(
        svc,
        &db,
        &url,
        pool,
        admin,
        (r0, r1, r2),
        lease_reading.map(|r| (r1, r)),
        publish_s,
        n,
    )
    .await
}

/// Step 3 (VACUUM) and the outbox's statistics, then the side's figures
/// from the readings before the expiry, after it and after publishing.
#[allow(clippy::too_many_arguments)]
async fn finish_side(
    svc: &Services,
    db: &str,
    url: &str,
    pool: PgPool,
    mut admin: AsyncPgConnection,
    (r0, r1, r2): (Usage, Usage, Usage),
    lease: Option<(Usage, Usage)>,
    publish_s: f64,
    n: u64,
) -> Result<Run> {
    {
        let mut conn = pool.get().await?;
        conn.batch_execute("VACUUM booking_expiration_outbox")
            .await?;
    }
    let r3 = usage(svc, &mut admin).await?;
    drop(pool);
    drop(admin);
    // The backends exit and flush their table statistics.
    svc.wait_idle(db).await?;
    let (updates, hot, pages) = outbox_stats(url).await?;
    svc.drop_db(db).await?;
    Ok(Run {
        expiry: per_event(r0, r1, n),
        publish: per_event(r1, r2, n),
        vacuum: per_event(r2, r3, n),
        lease: lease.map(|(a, b)| per_event(a, b, n)),
        publish_s,
        updates_per_event: updates / n as f64,
        hot_share: if updates > 0.0 { hot / updates } else { 0.0 },
        pages,
    })
}

/// `run`'s path: a publisher (acknowledging at once) runs beside the
/// expiry, which writes its rows leased to it and hands them over; cycles
/// of 5 batches, each once the publisher holds nothing. Returns the
/// bookings expired and the rows published once the publisher stopped.
async fn expire_and_hand_over(pool: &PgPool, set: &DueSet<'_>) -> Result<(u64, u64)> {
    let context = publisher_context(pool.clone());
    let publisher = Arc::new(publisher(&context, ScriptedTransport::new(super::TOPIC, 3)));
    let worker = expiry::worker_of_cycles(pool.clone(), set.as_of, EXPIRY_BATCH, 5)
        .hand_off(publisher.handoff());
    let shutdown = CancellationToken::new();
    let task = tokio::spawn({
        let (publisher, shutdown) = (Arc::clone(&publisher), shutdown.clone());
        async move { publisher.run(Arc::new(Notify::new()), shutdown).await }
    });
    let mut expired = 0;
    loop {
        let outcome = worker
            .run_cycle(CycleStart::new(&CancellationToken::new()).at(set.as_of, RunId::generate()))
            .await?;
        expired += outcome.report.expired();
        if outcome.report.expired() == 0 {
            break;
        }
        while context.metrics.outbox_held.get() > 0 {
            tokio::time::sleep(std::time::Duration::from_millis(2)).await;
        }
    }
    // The expiry stops (its end of the handoff closes), then the publisher
    // marks what is left and stops.
    drop(worker);
    shutdown.cancel();
    let published = task.await?.published;
    Ok((expired, published))
}

/// The old publisher's database work: one transaction per batch, claim
/// then mark, until a claim comes back empty.
async fn publish_before(pool: &PgPool) -> Result<u64> {
    #[derive(QueryableByName)]
    #[allow(dead_code)]
    struct Row {
        #[diesel(sql_type = BigInt)]
        id: i64,
        #[diesel(sql_type = SqlUuid)]
        event_id: uuid::Uuid,
        #[diesel(sql_type = Text)]
        topic: String,
        #[diesel(sql_type = Text)]
        message_key: String,
        #[diesel(sql_type = Binary)]
        payload: Vec<u8>,
        #[diesel(sql_type = Text)]
        headers: String,
        #[diesel(sql_type = Timestamptz)]
        created_at: chrono::DateTime<chrono::Utc>,
    }
    let mut conn = pool.get().await?;
    let mut total = 0;
    loop {
        let n = conn
            .transaction(async |c| {
                let rows: Vec<Row> = diesel::sql_query(BEFORE_CLAIM_SQL)
                    .bind::<BigInt, _>(i64::from(PUBLISH_BATCH))
                    .load(c)
                    .await?;
                if rows.is_empty() {
                    return Ok::<_, diesel::result::Error>(0);
                }
                let ids: Vec<i64> = rows.iter().map(|r| r.id).collect();
                diesel::sql_query(BEFORE_MARK_SQL)
                    .bind::<Array<BigInt>, _>(&ids)
                    .bind::<Timestamptz, _>(wall_now())
                    .execute(c)
                    .await?;
                Ok(ids.len() as u64)
            })
            .await?;
        if n == 0 {
            return Ok(total);
        }
        total += n;
    }
}

/// Every row leased, a claim of a batch per transaction (the pipeline's
/// claim, `db::outbox::claim`, with its default lease).
async fn lease_all(pool: &PgPool, owner: LeaseOwner) -> Result<Vec<i64>> {
    let lease = booking_expiration::outbox::Timing::default().lease;
    let mut conn = pool.get().await?;
    let mut ids = Vec::new();
    loop {
        let claim = Claim {
            limit: PUBLISH_BATCH,
            lease,
            ..Claim::default()
        };
        let rows = conn
            .transaction(async |c| outbox::claim(c, &claim, owner).await)
            .await?;
        if rows.is_empty() {
            return Ok(ids);
        }
        ids.extend(rows.iter().map(|r| r.id));
    }
}

/// `ids` marked published, a batch per transaction (`db::outbox::mark_published`).
async fn mark_all(pool: &PgPool, ids: &[i64], owner: LeaseOwner) -> Result<()> {
    let mut conn = pool.get().await?;
    for chunk in ids.chunks(PUBLISH_BATCH as usize) {
        conn.transaction(async |c| outbox::mark_published(c, chunk, wall_now(), owner).await)
            .await?;
    }
    Ok(())
}

/// The outbox's row updates and HOT updates (`pg_stat_user_tables`, the
/// backends having exited) and its pages.
async fn outbox_stats(url: &str) -> Result<(f64, f64, f64)> {
    #[derive(QueryableByName)]
    struct Row {
        #[diesel(sql_type = Double)]
        upd: f64,
        #[diesel(sql_type = Double)]
        hot: f64,
        #[diesel(sql_type = Double)]
        pages: f64,
    }
    let mut conn = AsyncPgConnection::establish(url).await?;
    let row: Row = diesel::sql_query(
        "SELECT n_tup_upd::float8 AS upd, n_tup_hot_upd::float8 AS hot,
                (pg_relation_size('booking_expiration_outbox') / 8192)::float8 AS pages
           FROM pg_stat_user_tables WHERE relname = 'booking_expiration_outbox'",
    )
    .get_result(&mut conn)
    .await?;
    Ok((row.upd, row.hot, row.pages))
}
