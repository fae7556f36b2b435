//! Figure 4, the publisher: the pipeline draining an outbox of 10k rows to
//! Kafka against its DB-only limit (the same pipeline with a broker that
//! acknowledges at once: its claims, leases and marks alone), with two
//! profile rows: the Kafka-only limit (the same records through
//! `KafkaTransport`, no database) with the serial model, and two publisher
//! instances in parallel.

use std::{sync::Arc, time::Duration, time::Instant};

use anyhow::{Result, ensure};
use booking_expiration::{
    clock::SystemClock,
    config::{KafkaSettings, PublisherSettings},
    context::TaskContext,
    db::PgPool,
    events::Headers,
    outbox::{
        KafkaTransport, OutgoingRecord, PgStore, Publisher, ScriptedTransport, Timing, Transport,
    },
    telemetry::{Health, Metrics},
};
use diesel_async::{AsyncConnection, AsyncPgConnection, RunQueryDsl, SimpleAsyncConnection};
use serde::{Deserialize, Serialize};

use super::{
    TOPIC,
    expiry::{self, Side},
    pools, reps,
};
use crate::{
    progress,
    support::{Services, Stat, count, loadavg, num, produce_keyed},
    templates::DueSet,
};

/// Rows per batch, on every side (`OUTBOX_BATCH_SIZE`'s default).
pub const PUBLISH_BATCH: u32 = 500;

/// The database the figure copies: `tpl_10k` after one worker cycle.
const TEMPLATE: &str = "tpl_pub";

/// The publisher figure (`results.json`'s `publisher`).
#[derive(Debug, Serialize, Deserialize)]
pub struct PublisherFigure {
    /// Outbox rows, the warm-up batch included.
    pub rows: u64,
    pub batch: u32,
    /// Each run's connection and metadata read are made before the clock
    /// starts.
    pub warm_up_batch_excluded: bool,
    pub kafka_events_per_s: Stat,
    pub db_only_rows_per_s: Stat,
    /// Publisher median over DB-only median.
    pub ratio: f64,
    pub kafka_only_records_per_s: Stat,
    /// Time inside produce requests (summed over the partitions, which run
    /// side by side) over the publisher's time.
    pub produce_share_of_publisher_time: Stat,
    /// Were DB time and Kafka time to add up (claim, produce, mark in
    /// series): `1 / (1/DB-only + 1/Kafka-only)` of the medians.
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

fn publisher_settings() -> PublisherSettings {
    PublisherSettings {
        batch_size: PUBLISH_BATCH,
        poll_interval: Duration::from_secs(1),
        retention: Duration::from_secs(86_400),
    }
}

/// A publisher on `pool` through `transport`, in `context`.
fn publisher<T: Transport>(context: &TaskContext, transport: T) -> Publisher<T, PgStore> {
    let settings = publisher_settings();
    let timing = Timing {
        request_timeout: Duration::from_secs(35),
        ..Timing::default()
    };
    Publisher::on_database(context, transport, timing, &settings, TOPIC.into())
}

/// The project's Kafka transport, connected and with the topic's
/// metadata read (untimed).
async fn warm_transport(svc: &Services) -> Result<KafkaTransport> {
    let transport = KafkaTransport::new(kafka_settings(svc));
    transport.partitions(TOPIC).await?;
    Ok(transport)
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

/// Rows published, the time they took, and (Kafka side) the time spent
/// in produce requests (the publisher's own
/// `outbox_produce_duration_seconds`, summed over partitions).
async fn publish_all(svc: &Services, kafka: bool, total: u64) -> Result<(u64, f64, f64)> {
    let db = svc.copy(TEMPLATE).await?;
    let url = svc.url_of(&db);
    let pool = pools(&url, 1).await?.remove(0);
    let produce_metric = "crm_booking_expiration_outbox_produce_duration_seconds";
    let context = publisher_context(pool.clone());
    let metrics = Arc::clone(&context.metrics);
    // The pooled connection open, as in a running service.
    drop(pool.get().await?);
    let (published, secs) = if kafka {
        let publisher = publisher(&context, warm_transport(svc).await?);
        let started = Instant::now();
        let published = publisher.publish_until_idle().await;
        (published, started.elapsed().as_secs_f64())
    } else {
        let publisher = publisher(&context, ScriptedTransport::new(TOPIC, 3));
        let started = Instant::now();
        let published = publisher.publish_until_idle().await;
        (published, started.elapsed().as_secs_f64())
    };
    ensure!(
        published.published == total,
        "published {} of {total}",
        published.published
    );
    let produce_secs = if kafka {
        histogram_sum(&metrics, produce_metric)
    } else {
        0.0
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
    Ok((published.published, secs, produce_secs))
}

/// `n` publisher instances (own pool, own Kafka connections each) draining
/// one outbox at once.
async fn publish_parallel(svc: &Services, n: usize, total: u64) -> Result<(u64, f64)> {
    let db = svc.copy(TEMPLATE).await?;
    let url = svc.url_of(&db);
    let mut publishers = Vec::new();
    for pool in pools(&url, n).await? {
        let context = publisher_context(pool);
        publishers.push(publisher(&context, warm_transport(svc).await?));
    }
    let started = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for publisher in publishers {
        tasks.spawn(async move { publisher.publish_until_idle().await.published });
    }
    let mut rows = 0;
    while let Some(r) = tasks.join_next().await {
        rows += r?;
    }
    let secs = started.elapsed().as_secs_f64();
    ensure!(rows == total, "published {rows} of {total}");
    svc.drop_db(&db).await?;
    Ok((rows, secs))
}

/// The Kafka-only limit: the same records (read from the outbox template
/// without locking), produced by the project's `KafkaTransport` in requests
/// of the same size per partition, the partitions side by side, one batch
/// at a time, no database in the loop.
async fn kafka_only(svc: &Services) -> Result<(u64, f64)> {
    #[derive(diesel::QueryableByName)]
    struct Row {
        #[diesel(sql_type = diesel::sql_types::Text)]
        message_key: String,
        #[diesel(sql_type = diesel::sql_types::Binary)]
        payload: Vec<u8>,
        #[diesel(sql_type = diesel::sql_types::Text)]
        headers: String,
    }
    let mut conn = AsyncPgConnection::establish(&svc.url_of(TEMPLATE)).await?;
    let rows: Vec<Row> = diesel::sql_query(
        "SELECT message_key, payload, headers::text AS headers \
         FROM booking_expiration_outbox ORDER BY id",
    )
    .load(&mut conn)
    .await?;
    drop(conn);
    svc.wait_idle(TEMPLATE).await?;
    let transport = warm_transport(svc).await?;
    let records = |chunk: &[Row]| -> Result<Vec<OutgoingRecord>> {
        let now = crate::support::wall_now();
        chunk
            .iter()
            .map(|row| {
                Ok(OutgoingRecord {
                    key: row.message_key.clone(),
                    value: row.payload.clone(),
                    headers: Headers::from_json(row.headers.as_bytes())
                        .map_err(anyhow::Error::msg)?,
                    timestamp: now,
                })
            })
            .collect()
    };
    let mut chunks = rows.chunks(PUBLISH_BATCH as usize);
    if let Some(first) = chunks.next() {
        produce_keyed(&transport, TOPIC, 3, records(first)?).await?;
    }
    let started = Instant::now();
    let mut n = 0;
    for chunk in chunks {
        produce_keyed(&transport, TOPIC, 3, records(chunk)?).await?;
        n += chunk.len() as u64;
    }
    Ok((n, started.elapsed().as_secs_f64()))
}
