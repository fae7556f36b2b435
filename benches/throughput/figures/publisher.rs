//! Figure 4, the publisher: `Publisher::drain` against the DB-only limit
//! (claim + mark published, no Kafka) on an outbox of 10k rows, with two
//! profile rows: the Kafka-only limit (the same records through
//! `KafkaSink`, no database) with the serial model, and two publisher
//! instances in parallel.

use std::{sync::Arc, time::Duration, time::Instant};

use anyhow::{Result, ensure};
use booking_expiration::{
    clock::SystemClock,
    config::{KafkaSettings, PublisherSettings},
    context::TaskContext,
    db::{self, PgPool, outbox},
    outbox::{KafkaSink, Publisher, kafka::OutgoingRecord},
    telemetry::{Health, Metrics},
};
use diesel_async::{AsyncConnection, AsyncPgConnection, RunQueryDsl, SimpleAsyncConnection};
use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;

use super::{
    TOPIC,
    expiry::{self, Side},
    pools, reps,
};
use crate::{
    progress,
    support::{Services, Stat, count, loadavg, num},
    templates::DueSet,
};

/// Rows per batch, on every side (`OUTBOX_BATCH_SIZE`'s default).
pub const PUBLISH_BATCH: u32 = 500;

/// The database the figure copies: `tpl_10k` after one worker cycle.
const TEMPLATE: &str = "tpl_pub";

/// `OUTBOX_CONCURRENCY`'s default: batches in flight while draining.
fn publish_concurrency() -> u32 {
    booking_expiration::config::defaults::OUTBOX_CONCURRENCY
}

/// The publisher figure (`results.json`'s `publisher`).
#[derive(Debug, Serialize, Deserialize)]
pub struct PublisherFigure {
    /// Outbox rows, the warm-up batch included.
    pub rows: u64,
    pub batch: u32,
    /// The first batch of each run (connect, metadata) is not timed.
    pub warm_up_batch_excluded: bool,
    pub kafka_events_per_s: Stat,
    pub db_only_rows_per_s: Stat,
    /// Publisher median over DB-only median.
    pub ratio: f64,
    pub kafka_only_records_per_s: Stat,
    /// Time inside `produce` (summed over lanes) over the publisher's time.
    pub produce_share_of_publisher_time: Stat,
    /// One batch after the other: DB time and Kafka time add up,
    /// `1 / (1/DB-only + 1/Kafka-only)` of the medians.
    pub serial_model_events_per_s: f64,
    pub two_instances_events_per_s: Stat,
    pub loadavg_at_start: [f64; 3],
}

/// Prepares the outbox (a worker cycle over `backlog`), warms the broker,
/// then measures (5 repetitions, 1 in quick mode).
pub async fn measure(svc: &Services, backlog: &DueSet<'_>, quick: bool) -> Result<PublisherFigure> {
    let due = backlog.due;
    progress!("4. publisher: {due} outbox rows, batch {PUBLISH_BATCH}");
    svc.admin_exec(&format!(
        "CREATE DATABASE {TEMPLATE} TEMPLATE {} STRATEGY FILE_COPY",
        backlog.template.name
    ))
    .await?;
    expiry::expire_all(
        &svc.url_of(TEMPLATE),
        Side::Worker,
        backlog.as_of,
        200,
        1,
        due,
    )
    .await?;
    svc.wait_idle(TEMPLATE).await?;
    {
        let mut conn = AsyncPgConnection::establish(&svc.url_of(TEMPLATE)).await?;
        conn.batch_execute("VACUUM ANALYZE").await?;
    }
    // The broker is a fresh JVM: warm its JIT (untimed) so the first timed
    // publisher run does not pay for it.
    for round in 1..=3 {
        let (rows, secs) = kafka_only(svc).await?;
        progress!("publisher: broker warm-up {round}/3, {rows} records in {secs:.3} s (not timed)");
    }
    let load = loadavg();
    let (mut pub_rates, mut dbo_rates, mut ko_rates, mut produce_share, mut par_rates) =
        (vec![], vec![], vec![], vec![], vec![]);
    let reps = reps(quick, 5);
    for rep in 0..reps {
        let order = if rep % 2 == 0 {
            [true, false]
        } else {
            [false, true]
        };
        for kafka in order {
            let (rows, secs, produce_secs) = publish_all(svc, kafka, due).await?;
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
                "publisher: rep {}/{reps} {:<8} {rows} rows in {secs:.3} s = {} events/s{share}",
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
        let (rows, secs) = kafka_only(svc).await?;
        progress!(
            "publisher: rep {}/{reps} Kafka-only {rows} records in {secs:.3} s = {} records/s",
            rep + 1,
            num(rows as f64 / secs)
        );
        ko_rates.push(rows as f64 / secs);
        let (rows, secs) = publish_parallel(svc, 2, due).await?;
        progress!(
            "publisher: rep {}/{reps} 2 instances {rows} rows in {secs:.3} s = {} events/s",
            rep + 1,
            num(rows as f64 / secs)
        );
        par_rates.push(rows as f64 / secs);
    }
    let kafka_events_per_s = Stat::of(&pub_rates);
    let db_only_rows_per_s = Stat::of(&dbo_rates);
    let kafka_only_records_per_s = Stat::of(&ko_rates);
    Ok(PublisherFigure {
        rows: due,
        batch: PUBLISH_BATCH,
        warm_up_batch_excluded: true,
        ratio: kafka_events_per_s.median / db_only_rows_per_s.median,
        serial_model_events_per_s: 1.0
            / (1.0 / db_only_rows_per_s.median + 1.0 / kafka_only_records_per_s.median),
        kafka_events_per_s,
        db_only_rows_per_s,
        kafka_only_records_per_s,
        produce_share_of_publisher_time: Stat::of(&produce_share),
        two_instances_events_per_s: Stat::of(&par_rates),
        loadavg_at_start: load,
    })
}

/// A publisher-only instance's context on `pool`, on the wall clock.
fn publisher_context(pool: PgPool) -> TaskContext {
    TaskContext {
        health: Arc::new(Health::new(crate::support::wall_now(), false, true)),
        ..TaskContext::new(pool, Arc::new(SystemClock))
    }
}

fn kafka_settings(svc: &Services) -> KafkaSettings {
    KafkaSettings {
        client_id: "booking-expiration-bench".into(),
        request_timeout: Duration::from_secs(30),
        ..KafkaSettings::new(vec![svc.kafka_bootstrap.clone()])
    }
}

fn publisher_settings(concurrency: u32) -> PublisherSettings {
    PublisherSettings {
        batch_size: PUBLISH_BATCH,
        poll_interval: Duration::from_secs(1),
        retention: Duration::from_secs(86_400),
        concurrency,
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
async fn publish_all(svc: &Services, kafka: bool, total: u64) -> Result<(u64, f64, f64)> {
    let db = svc.copy(TEMPLATE).await?;
    let url = svc.url_of(&db);
    let pool = pools(&url, 1).await?.remove(0);
    let produce_metric = "crm_booking_expiration_outbox_produce_duration_seconds";
    let (rows, secs, produce_secs) = if kafka {
        let context = publisher_context(pool.clone());
        let metrics = Arc::clone(&context.metrics);
        let publisher = Publisher::new(
            &context,
            KafkaSink::new(kafka_settings(svc)),
            publisher_settings(publish_concurrency()),
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
                    outbox::mark_published(c, &ids, crate::support::wall_now()).await?;
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
async fn publish_parallel(svc: &Services, n: usize, total: u64) -> Result<(u64, f64)> {
    let db = svc.copy(TEMPLATE).await?;
    let url = svc.url_of(&db);
    let mut publishers = Vec::new();
    let mut warm = 0;
    for pool in pools(&url, n).await? {
        let publisher = Arc::new(Publisher::new(
            &publisher_context(pool),
            KafkaSink::new(kafka_settings(svc)),
            publisher_settings(1),
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
async fn kafka_only(svc: &Services) -> Result<(u64, f64)> {
    let mut conn = AsyncPgConnection::establish(&svc.url_of(TEMPLATE)).await?;
    let rows: Vec<outbox::OutboxRow> = diesel::sql_query(
        "SELECT id, event_id, topic, message_key, payload, headers, created_at \
         FROM booking_expiration_outbox ORDER BY id",
    )
    .load(&mut conn)
    .await?;
    drop(conn);
    svc.wait_idle(TEMPLATE).await?;
    let sink = KafkaSink::new(kafka_settings(svc));
    sink.check_topic(TOPIC).await?;
    let records = |chunk: &[outbox::OutboxRow]| -> Vec<OutgoingRecord> {
        let now = crate::support::wall_now();
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
        sink.produce(TOPIC, records(first)).await.into_result()?;
    }
    let started = Instant::now();
    let mut n = 0;
    for chunk in chunks {
        sink.produce(TOPIC, records(chunk)).await.into_result()?;
        n += chunk.len() as u64;
    }
    Ok((n, started.elapsed().as_secs_f64()))
}
