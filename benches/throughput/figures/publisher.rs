//! Figure 4, the publisher: the pipeline draining an outbox of 10k rows to
//! Kafka against its DB-only limit: the same pipeline on the same
//! `PgStore` with a broker that acknowledges every request at once and
//! keeps nothing ([`InstantAck`]), so what is left is its claims, leases
//! and marks (the database rounds) and its own client work. Profile rows:
//! the same with `ScriptedTransport` (which also keeps a copy of every
//! record), the rounds without the pipeline (the claim and mark statements
//! back to back), the Kafka-only limit (the same records through
//! `KafkaTransport`, no database) with the serial model, and two publisher
//! instances in parallel.

use std::{
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
    time::Instant,
};

use anyhow::{Result, ensure};
use booking_expiration::{
    clock::SystemClock,
    config::{KafkaSettings, PublisherSettings},
    context::TaskContext,
    db::PgPool,
    events::Headers,
    handoff::LeaseOwner,
    outbox::{
        KafkaTransport, OutgoingRecord, PgStore, Publisher, Round, ScriptedTransport, SendError,
        Store, Timing, Transport,
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
    /// Outbox rows, every one timed.
    pub rows: u64,
    pub batch: u32,
    /// Was a first batch left out of the timing (the figure before #32);
    /// now the connections and the topic's metadata are made before the
    /// clock starts and every row is timed.
    pub warm_up_batch_excluded: bool,
    pub kafka_events_per_s: Stat,
    /// The pipeline with a broker that acknowledges at once and keeps
    /// nothing ([`InstantAck`]).
    pub db_only_rows_per_s: Stat,
    /// Publisher median over DB-only median.
    pub ratio: f64,
    /// Publisher over DB-only per repetition (both ran in it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ratio_per_rep: Option<Stat>,
    /// The pipeline with `ScriptedTransport` (acks at once, keeps a copy of
    /// every record).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scripted_rows_per_s: Option<Stat>,
    /// The rounds' statements back to back, without the pipeline: each
    /// transaction marks the rows the last one claimed and claims the
    /// next batch with a lease.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub raw_rounds_rows_per_s: Option<Stat>,
    /// Database rounds per run (Kafka side, DB-only side), first repetition.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rounds: Option<[u64; 2]>,
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

/// A broker that acknowledges every request at once and keeps nothing:
/// what is left of a publisher run is the database and the pipeline.
#[derive(Debug, Clone, Copy)]
pub struct InstantAck;

impl Transport for InstantAck {
    async fn partitions(&self, _topic: &str) -> Result<i32, SendError> {
        Ok(3)
    }

    async fn produce(
        &self,
        _topic: &str,
        _partition: i32,
        _partitions: i32,
        records: Vec<OutgoingRecord>,
    ) -> Result<(), SendError> {
        drop(records);
        Ok(())
    }
}

/// `PgStore` counting its rounds.
struct Counted {
    store: PgStore,
    rounds: Arc<AtomicU64>,
}

impl Store for Counted {
    fn owner(&self) -> LeaseOwner {
        self.store.owner()
    }

    async fn round(
        &self,
        round: Round,
    ) -> Result<booking_expiration::outbox::RoundResult, booking_expiration::db::DbError> {
        self.rounds.fetch_add(1, Ordering::Relaxed);
        self.store.round(round).await
    }
}

/// Who takes the outbox's rows in a timed run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Taker {
    /// The pipeline to the broker.
    Kafka,
    /// The pipeline with [`InstantAck`]: the DB-only limit.
    DbOnly,
    /// The pipeline with `ScriptedTransport`.
    Scripted,
    /// The rounds' statements without the pipeline.
    RawRounds,
}

impl Taker {
    fn label(self) -> &'static str {
        match self {
            Taker::Kafka => "Kafka",
            Taker::DbOnly => "DB-only",
            Taker::Scripted => "scripted",
            Taker::RawRounds => "raw rounds",
        }
    }
}

/// Prepares the outbox (a worker cycle over `backlog`), warms the broker,
/// then measures (9 repetitions, 1 in quick mode: the sides spread by
/// ±8% from one repetition to the next on a 2-core machine).
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
    let (mut scripted_rates, mut raw_rates) = (vec![], vec![]);
    let mut rounds = [0u64; 2];
    let reps = reps(quick, 9);
    for rep in 0..reps {
        // The four sides in turn, the first rotating.
        let sides = [
            Taker::Kafka,
            Taker::DbOnly,
            Taker::Scripted,
            Taker::RawRounds,
        ];
        for k in 0..sides.len() {
            let side = sides[(rep + k) % sides.len()];
            let run = publish_all(svc, side, due).await?;
            let rate = run.rows as f64 / run.secs;
            let share = if side == Taker::Kafka {
                format!(
                    " ({:.0}% of it inside produce, summed over partitions)",
                    100.0 * run.produce_secs / run.secs
                )
            } else {
                String::new()
            };
            progress!(
                "publisher: rep {}/{reps} {:<10} {} rows in {:.3} s = {} events/s, {} rounds{share}",
                rep + 1,
                side.label(),
                run.rows,
                run.secs,
                num(rate),
                run.rounds
            );
            match side {
                Taker::Kafka => {
                    pub_rates.push(rate);
                    produce_share.push(run.produce_secs / run.secs);
                    if rep == 0 {
                        rounds[0] = run.rounds;
                    }
                }
                Taker::DbOnly => {
                    dbo_rates.push(rate);
                    if rep == 0 {
                        rounds[1] = run.rounds;
                    }
                }
                Taker::Scripted => scripted_rates.push(rate),
                Taker::RawRounds => raw_rates.push(rate),
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
    let ratio_per_rep = Stat::of(
        &pub_rates
            .iter()
            .zip(&dbo_rates)
            .map(|(k, d)| k / d)
            .collect::<Vec<_>>(),
    );
    Ok(PublisherFigure {
        rows: due,
        batch: PUBLISH_BATCH,
        warm_up_batch_excluded: false,
        ratio: kafka_events_per_s.median / db_only_rows_per_s.median,
        ratio_per_rep: Some(ratio_per_rep),
        scripted_rows_per_s: Some(Stat::of(&scripted_rates)),
        raw_rounds_rows_per_s: Some(Stat::of(&raw_rates)),
        rounds: Some(rounds),
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
pub(crate) fn publisher_context(pool: PgPool) -> TaskContext {
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

/// The publisher's timing table as `run` has it at its defaults.
fn timing() -> Timing {
    Timing {
        request_timeout: Duration::from_secs(35),
        ..Timing::default()
    }
}

/// A publisher on `pool` through `transport`, in `context`.
pub(crate) fn publisher<T: Transport>(
    context: &TaskContext,
    transport: T,
) -> Publisher<T, PgStore> {
    let settings = publisher_settings();
    Publisher::on_database(context, transport, timing(), &settings, TOPIC.into())
}

/// The project's Kafka transport, connected as a running service's is
/// (untimed): the topic's metadata read and each partition's client built
/// with its connection to the leader, by one warm-up record per partition
/// (a service builds them once, with its first records, and keeps them;
/// the database side's pooled connection is open before the clock starts
/// too).
pub(crate) async fn warm_transport(svc: &Services) -> Result<KafkaTransport> {
    let transport = KafkaTransport::new(kafka_settings(svc));
    let partitions = transport.partitions(TOPIC).await?;
    let warm_up = (0..partitions).map(|partition| {
        let record = OutgoingRecord {
            key: format!("warm-up-{partition}"),
            value: Vec::new(),
            headers: Headers::default(),
        };
        transport.produce(TOPIC, partition, partitions, vec![record])
    });
    for result in futures_util::future::join_all(warm_up).await {
        result?;
    }
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

/// One timed run.
struct TimedRun {
    rows: u64,
    secs: f64,
    /// Kafka side: time spent in produce requests (the publisher's own
    /// `outbox_produce_duration_seconds`, summed over partitions).
    produce_secs: f64,
    /// Database rounds (transactions).
    rounds: u64,
}

/// A publisher through `transport` on a `PgStore` that counts its rounds,
/// built as `Publisher::on_database` builds it.
fn counted_publisher<T: Transport>(
    context: &TaskContext,
    transport: T,
    rounds: &Arc<AtomicU64>,
) -> Publisher<T, Counted> {
    let settings = publisher_settings();
    let store = Counted {
        store: PgStore::new(
            context.pool.clone(),
            Arc::clone(&context.clock),
            settings.retention.is_zero(),
        ),
        rounds: Arc::clone(rounds),
    };
    Publisher::builder(transport, store, TOPIC)
        .timing(timing())
        .settings(&settings)
        .context(context)
        .build()
}

/// Drains a fresh copy of the outbox with `side`.
async fn publish_all(svc: &Services, side: Taker, total: u64) -> Result<TimedRun> {
    let db = svc.copy(TEMPLATE).await?;
    let url = svc.url_of(&db);
    let pool = pools(&url, 1).await?.remove(0);
    let produce_metric = "crm_booking_expiration_outbox_produce_duration_seconds";
    let context = publisher_context(pool.clone());
    let metrics = Arc::clone(&context.metrics);
    let rounds = Arc::new(AtomicU64::new(0));
    // The pooled connection open, as in a running service.
    drop(pool.get().await?);
    let (published, secs) = match side {
        Taker::Kafka => {
            let publisher = counted_publisher(&context, warm_transport(svc).await?, &rounds);
            let started = Instant::now();
            let published = publisher.publish_until_idle().await.published;
            (published, started.elapsed().as_secs_f64())
        }
        Taker::DbOnly => {
            let publisher = counted_publisher(&context, InstantAck, &rounds);
            let started = Instant::now();
            let published = publisher.publish_until_idle().await.published;
            (published, started.elapsed().as_secs_f64())
        }
        Taker::Scripted => {
            let publisher = counted_publisher(&context, ScriptedTransport::new(TOPIC, 3), &rounds);
            let started = Instant::now();
            let published = publisher.publish_until_idle().await.published;
            (published, started.elapsed().as_secs_f64())
        }
        Taker::RawRounds => {
            let started = Instant::now();
            let (published, n) = raw_rounds(&pool).await?;
            AtomicU64::store(&rounds, n, Ordering::Relaxed);
            (published, started.elapsed().as_secs_f64())
        }
    };
    ensure!(
        published == total,
        "{}: published {published} of {total}",
        side.label()
    );
    let produce_secs = if side == Taker::Kafka {
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
    drop(context);
    drop(pool);
    svc.drop_db(&db).await?;
    Ok(TimedRun {
        rows: published,
        secs,
        produce_secs,
        rounds: AtomicU64::load(&rounds, Ordering::Relaxed),
    })
}

/// The pipeline's database rounds without the pipeline: one transaction
/// each that marks the rows the previous one claimed and claims the next
/// batch with a lease (`db::outbox::mark_published` and `claim`, as
/// `PgStore` runs them), until a claim comes back empty. Rows published
/// and rounds.
async fn raw_rounds(pool: &PgPool) -> Result<(u64, u64)> {
    use booking_expiration::db::outbox::{self, Claim};
    let mut conn = pool.get().await?;
    let lease = timing().lease;
    let owner = LeaseOwner::new();
    let (mut claimed, mut published, mut rounds) = (Vec::<i64>::new(), 0u64, 0u64);
    loop {
        let marks = std::mem::take(&mut claimed);
        let claim = Claim {
            limit: PUBLISH_BATCH,
            lease,
            ..Claim::default()
        };
        let now = crate::support::wall_now();
        let rows = conn
            .transaction(async |c| {
                if !marks.is_empty() {
                    outbox::mark_published(c, &marks, now, owner).await?;
                }
                outbox::claim(c, &claim, owner).await
            })
            .await?;
        rounds += 1;
        published += marks.len() as u64;
        if rows.is_empty() {
            return Ok((published, rounds));
        }
        claimed = rows.iter().map(|r| r.id).collect();
    }
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
        chunk
            .iter()
            .map(|row| {
                Ok(OutgoingRecord {
                    key: row.message_key.clone(),
                    value: row.payload.clone(),
                    headers: Headers::from_json(row.headers.as_bytes())
                        .map_err(anyhow::Error::msg)?,
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
