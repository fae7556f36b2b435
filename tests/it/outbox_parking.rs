//! One record the broker will never accept does not stall the outbox: what
//! the broker acknowledged is committed even when another partition failed
//! (and never produced again), a request refused as too large is split, a
//! record refused on its own is parked (kept, listed, counted) and put back
//! by `outbox retry`. Against the in-memory sink for the commit logic and
//! against the real broker with a topic whose `max.message.bytes` is small.

use std::{collections::BTreeMap, sync::Arc, time::Duration};

use crate::support::*;
use booking_expiration::context::TaskContext;
use booking_expiration::{
    app,
    clock::SystemClock,
    config::PublisherSettings,
    db::outbox::{self, Unpark},
    outbox::{
        HOLD, KafkaSink, LagStats, MemorySink, PublishError, Publisher, RetentionSweep, Sink,
        SinkError,
    },
};
use tokio_util::sync::CancellationToken;

fn settings(batch_size: u32, retention: Duration) -> PublisherSettings {
    PublisherSettings {
        batch_size,
        poll_interval: Duration::from_secs(30),
        retention,
        concurrency: 1,
    }
}

struct Rig<S: Sink> {
    publisher: Publisher<S>,
    context: TaskContext,
}

fn rig<S: Sink>(db: &TestDb, sink: S, settings: PublisherSettings, topic: &str) -> Rig<S> {
    let context = TaskContext::new(db.pool.clone(), Arc::new(SystemClock));
    let publisher = Publisher::new(&context, sink, settings, topic.to_owned());
    Rig { publisher, context }
}

/// Expires `n` seeded due bookings into the outbox of `topic`.
async fn expire_into_outbox(db: &TestDb, n: u64, topic: &str) {
    db.seed_due(n, t0()).await;
    let outcome = db
        .worker_for(&clock(), expiry_settings(500), events_on(topic))
        .run_cycle(&CancellationToken::new())
        .await
        .unwrap();
    assert_eq!(outcome.report.expired(), n);
}

async fn published(db: &TestDb) -> i64 {
    db.count("SELECT count(*) AS n FROM booking_expiration_outbox WHERE published_at IS NOT NULL")
        .await
}

/// Rows the publisher would still claim.
async fn claimable(db: &TestDb) -> i64 {
    db.count(
        "SELECT count(*) AS n FROM booking_expiration_outbox \
         WHERE published_at IS NULL AND parked_at IS NULL",
    )
    .await
}

async fn parked(db: &TestDb) -> i64 {
    db.count("SELECT count(*) AS n FROM booking_expiration_outbox WHERE parked_at IS NOT NULL")
        .await
}

async fn outbox_rows(db: &TestDb) -> i64 {
    db.count("SELECT count(*) AS n FROM booking_expiration_outbox")
        .await
}

fn ce_ids(sink: &MemorySink) -> Vec<Vec<u8>> {
    sink.produced()
        .into_iter()
        .map(|p| p.record.headers["ce_id"].clone())
        .collect()
}

/// How many times each key is on `records`.
fn key_counts(records: &[ConsumedRecord]) -> BTreeMap<String, usize> {
    let mut counts = BTreeMap::new();
    for record in records {
        *counts.entry(record.key.clone()).or_default() += 1;
    }
    counts
}

// ---- the commit logic, against the in-memory sink ----

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partial_acknowledgement_commits_the_acknowledged_rows_and_never_reproduces_them() {
    for retention in [Duration::from_secs(3600), Duration::ZERO] {
        let db = TestDb::new().await;
        expire_into_outbox(&db, 30, "t").await;
        let sink = MemorySink::new();
        let rig = rig(&db, sink.clone(), settings(100, retention), "t");
        // One partition acknowledged 12 records, another failed.
        sink.partial_next(12);
        let error = rig.publisher.publish_batch().await.unwrap_err();
        assert!(
            matches!(error, PublishError::Sink(SinkError::Refused(_))),
            "{error}"
        );
        assert_eq!(sink.produced().len(), 12);
        assert_eq!(claimable(&db).await, 18, "only the failed rows wait");
        if retention.is_zero() {
            assert_eq!(outbox_rows(&db).await, 18, "acknowledged rows deleted");
        } else {
            assert_eq!(published(&db).await, 12, "acknowledged rows committed");
        }
        // The rows left pending are held back from the next batches for
        // HOLD (so a failing partition does not crowd out the others);
        // deliberate timing: the retry comes after the hold.
        assert_eq!(rig.publisher.publish_batch().await.unwrap(), 0, "held");
        tokio::time::sleep(HOLD).await;
        // The retry sends the 18 others, not the 12 again.
        assert_eq!(rig.publisher.publish_batch().await.unwrap(), 18);
        let mut ids = ce_ids(&sink);
        assert_eq!(ids.len(), 30, "30 records produced for 30 events");
        ids.sort();
        ids.dedup();
        assert_eq!(ids.len(), 30, "no event produced twice");
        assert_eq!(claimable(&db).await, 0);
        let errors = rig.context.metrics.encode();
        assert!(
            errors.contains(
                "crm_booking_expiration_outbox_produce_errors_total{code=\"CLIENT_REFUSED\"} 1"
            ),
            "{errors}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_row_is_parked_kept_listed_and_put_back() {
    let db = TestDb::new().await;
    expire_into_outbox(&db, 30, "t").await;
    let mut conn = db.conn().await;
    let rows = outbox::claim_unpublished(&mut conn, 100).await.unwrap();
    let bad = rows[7].clone();
    let sink = MemorySink::new();
    sink.refuse_keys(vec![bad.message_key.clone()]);
    let rig = rig(&db, sink.clone(), settings(100, Duration::ZERO), "t");

    // The rest of the batch is published; the refused row is parked and
    // claimed no more.
    assert_eq!(rig.publisher.publish_batch().await.unwrap(), 29);
    assert_eq!((claimable(&db).await, parked(&db).await), (0, 1));
    assert_eq!(rig.publisher.publish_batch().await.unwrap(), 0);
    assert_eq!(sink.produced().len(), 29);
    assert_eq!(sink.produce_calls(), 1, "an empty claim sends nothing");

    // Kept by retention, counted apart from the lag, listed by status.
    let sweep = RetentionSweep::new(&rig.context, Duration::ZERO);
    sweep.run_once().await.unwrap();
    assert_eq!(outbox_rows(&db).await, 1, "the parked row is kept");
    let stats = LagStats::new(&rig.context).run_once().await.unwrap();
    assert_eq!((stats.unpublished, stats.parked), (0, 1));
    assert_eq!(rig.context.metrics.outbox_parked.get(), 1);
    assert_eq!(rig.context.metrics.outbox_unpublished.get(), 0);
    let status = app::status(&db.settings, &SystemClock).await.unwrap();
    assert_eq!(status.outbox_parked, 1);
    assert_eq!(status.parked.len(), 1);
    assert_eq!(status.parked[0].event_id, bad.event_id);
    assert_eq!(status.parked[0].message_key, bad.message_key);
    assert!(
        status.parked[0].reason.starts_with("MESSAGE_TOO_LARGE"),
        "{}",
        status.parked[0].reason
    );
    assert!(status.to_string().contains("parked outbox rows: 1"));

    // Put back: an unknown id changes nothing, the row's id puts it back.
    let other = uuid::Uuid::new_v4();
    assert_eq!(
        outbox::unpark(&mut conn, &Unpark::Events(vec![other]))
            .await
            .unwrap(),
        0
    );
    assert_eq!(
        outbox::unpark(&mut conn, &Unpark::Events(vec![bad.event_id]))
            .await
            .unwrap(),
        1
    );
    assert_eq!((claimable(&db).await, parked(&db).await), (1, 0));
    sink.refuse_keys(Vec::new());
    assert_eq!(rig.publisher.publish_batch().await.unwrap(), 1);
    assert_eq!(outbox_rows(&db).await, 0);
    assert_eq!(sink.produced().len(), 30);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_row_that_cannot_become_a_record_is_parked_not_sent() {
    let db = TestDb::new().await;
    expire_into_outbox(&db, 10, "t").await;
    db.exec_sql(
        "UPDATE booking_expiration_outbox SET headers = '[1, 2]' \
         WHERE id = (SELECT min(id) + 3 FROM booking_expiration_outbox)",
    )
    .await;
    let sink = MemorySink::new();
    let rig = rig(
        &db,
        sink.clone(),
        settings(100, Duration::from_secs(3600)),
        "t",
    );
    assert_eq!(rig.publisher.publish_batch().await.unwrap(), 9);
    assert_eq!(sink.produced().len(), 9, "the corrupt row is not sent");
    assert_eq!((claimable(&db).await, parked(&db).await), (0, 1));
    let status = app::status(&db.settings, &SystemClock).await.unwrap();
    assert!(
        status.parked[0]
            .reason
            .starts_with("CORRUPT_ROW: the row's headers are not a JSON object"),
        "{}",
        status.parked[0].reason
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_claim_skips_parked_rows_through_its_partial_index() {
    use diesel::{QueryableByName, sql_types::Text};
    use diesel_async::RunQueryDsl;
    let db = TestDb::new().await;
    // 20,000 published rows, 2,000 parked, 50 waiting: the claim must read
    // the 50 through the partial index, not walk past the others.
    db.exec_sql(
        "INSERT INTO booking_expiration_outbox \
           (event_id, topic, message_key, payload, headers, correlation_id, tenant_id, \
            created_at, published_at, parked_at, park_reason) \
         SELECT gen_random_uuid(), 't', g::text, '\\x00', '{}', gen_random_uuid(), \
                gen_random_uuid(), now(), \
                CASE WHEN g <= 20000 THEN now() END, \
                CASE WHEN g > 20000 AND g <= 22000 THEN now() END, \
                CASE WHEN g > 20000 AND g <= 22000 THEN 'MESSAGE_TOO_LARGE: test' END \
         FROM generate_series(1, 22050) AS g",
    )
    .await;
    db.exec_sql("ANALYZE booking_expiration_outbox").await;
    #[derive(QueryableByName)]
    struct Plan {
        #[diesel(sql_type = Text, column_name = "QUERY PLAN")]
        line: String,
    }
    let mut conn = db.conn().await;
    let plan: Vec<Plan> = diesel::sql_query(format!("EXPLAIN {}", outbox::claim_sql()))
        .bind::<diesel::sql_types::BigInt, _>(100_i64)
        .load(&mut conn)
        .await
        .unwrap();
    let text: Vec<String> = plan.into_iter().map(|p| p.line).collect();
    assert!(
        text.iter()
            .any(|l| l.contains("ix_booking_expiration_outbox_unpublished")),
        "{}",
        text.join("\n")
    );
    assert!(
        !text.iter().any(|l| l.contains("Seq Scan")),
        "{}",
        text.join("\n")
    );
    let claimed = outbox::claim_unpublished(&mut conn, 100).await.unwrap();
    assert_eq!(
        claimed.len(),
        50,
        "parked and published rows are not claimed"
    );
    let stats = outbox::stats(&mut conn).await.unwrap();
    assert_eq!((stats.unpublished, stats.parked), (50, 2000));
}

// ---- against the real broker ----

/// Creates a topic with `partitions` partitions and topic configs
/// (`max.message.bytes=…`) with the broker's own admin tool.
fn create_topic_with(partitions: i32, config: &str) -> String {
    let topic = format!("test-parking-{}", uuid::Uuid::new_v4().simple());
    testkit::run_script(
        "kafka.sh",
        &[
            "create-topic",
            &kafka_port(),
            &topic,
            &partitions.to_string(),
            "--config",
            config,
        ],
    )
    .unwrap_or_else(|e| panic!("{e:#}"));
    topic
}

fn kafka_port() -> String {
    let bootstrap = kafka_bootstrap()[0].clone();
    let (_, port) = bootstrap.rsplit_once(':').expect("host:port");
    port.to_owned()
}

/// Publishes batch after batch until no row is left to claim (parked rows
/// stay); returns how many batches it took.
async fn publish_until_nothing_claimable(db: &TestDb, publisher: &Publisher) -> usize {
    let mut batches = 0;
    while claimable(db).await > 0 {
        publisher.publish_batch().await.expect("publish");
        batches += 1;
        assert!(batches < 50, "the outbox does not drain");
    }
    batches
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oversized_row_is_parked_the_others_published_once_then_retried() {
    let db = TestDb::new().await;
    let topic = create_topic_with(3, "max.message.bytes=100000");
    expire_into_outbox(&db, 300, &topic).await;
    // One row in the middle grows to 200 KB of incompressible bytes.
    db.exec_sql(
        "UPDATE booking_expiration_outbox SET payload = (\
             SELECT decode(string_agg(md5(random()::text || g::text), ''), 'hex') \
             FROM generate_series(1, 12500) AS g) \
         WHERE id = (SELECT min(id) + 150 FROM booking_expiration_outbox)",
    )
    .await;
    let mut conn = db.conn().await;
    let rows = outbox::claim_unpublished(&mut conn, 1000).await.unwrap();
    drop(conn);
    let big = rows
        .iter()
        .find(|r| r.payload.len() == 200_000)
        .expect("the grown row")
        .clone();

    let rig = rig(
        &db,
        KafkaSink::new(kafka_settings(kafka_bootstrap())),
        settings(100, Duration::from_secs(3600)),
        &topic,
    );
    let batches = publish_until_nothing_claimable(&db, &rig.publisher).await;
    assert_eq!((published(&db).await, parked(&db).await), (299, 1));

    let records = read_topic(&topic, 3).await;
    let counts = key_counts(&records);
    eprintln!(
        "{} records on the topic for {} keys after {batches} batches",
        records.len(),
        counts.len()
    );
    assert_eq!(records.len(), 299, "every normal row once, no duplicate");
    assert_eq!(counts.len(), 299);
    assert!(counts.values().all(|&n| n == 1));
    assert!(
        !counts.contains_key(&big.message_key),
        "the big row is not on the topic"
    );

    let status = app::status(&db.settings, &SystemClock).await.unwrap();
    assert_eq!(status.parked.len(), 1);
    let parked_row = &status.parked[0];
    assert_eq!(parked_row.event_id, big.event_id);
    assert!(
        parked_row.reason.contains("MESSAGE_TOO_LARGE"),
        "{}",
        parked_row.reason
    );
    eprintln!("parked: {}", parked_row.reason);
    let metrics = rig.context.metrics.encode();
    assert!(
        metrics.contains(
            "crm_booking_expiration_outbox_produce_errors_total{code=\"MESSAGE_TOO_LARGE\"}"
        ),
        "{metrics}"
    );
    // The table view and the JSON of the command list it too.
    let json: serde_json::Value =
        serde_json::from_str(&run_ok(&db.url, &["status", "--json"])).unwrap();
    assert_eq!(json["outbox_parked"], 1);
    assert_eq!(json["parked"][0]["event_id"], big.event_id.to_string());
    assert_eq!(json["outbox_unpublished"], 0, "a parked row is not lag");

    // Bad arguments: exit 2, nothing put back.
    for args in [
        &["outbox", "retry"][..],
        &["outbox", "retry", "--event-id", "not-a-uuid"],
        &[
            "outbox",
            "retry",
            "--all-parked",
            "--event-id",
            &big.event_id.to_string(),
        ],
    ] {
        let output = binary()
            .args(args)
            .env("DATABASE_URL", &db.url)
            .output()
            .unwrap();
        assert_eq!(output.status.code(), Some(2), "{args:?}");
    }
    assert_eq!(parked(&db).await, 1);

    // The limit raised, the row put back: it is published, once.
    testkit::run_script(
        "kafka.sh",
        &[
            "alter-topic-config",
            &kafka_port(),
            &topic,
            "max.message.bytes=1000000",
        ],
    )
    .unwrap_or_else(|e| panic!("{e:#}"));
    assert_eq!(
        run_ok(&db.url, &["outbox", "retry", "--all-parked"]).trim(),
        "{\"put_back\":1}"
    );
    assert_eq!((claimable(&db).await, parked(&db).await), (1, 0));
    publish_until_nothing_claimable(&db, &rig.publisher).await;
    assert_eq!((published(&db).await, parked(&db).await), (300, 0));
    let records = read_topic(&topic, 3).await;
    let counts = key_counts(&records);
    assert_eq!(records.len(), 300);
    assert_eq!(counts.get(&big.message_key), Some(&1));
    let value = records
        .iter()
        .find(|r| r.key == big.message_key)
        .map(|r| r.value.clone());
    assert_eq!(value, Some(big.payload));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_too_large_for_the_topic_is_split_until_each_record_fits() {
    let db = TestDb::new().await;
    // Smaller than one partition's share of a batch of 100, larger than
    // any one record.
    let topic = create_topic_with(3, "max.message.bytes=3000");
    expire_into_outbox(&db, 300, &topic).await;
    let rig = rig(
        &db,
        KafkaSink::new(kafka_settings(kafka_bootstrap())),
        settings(100, Duration::from_secs(3600)),
        &topic,
    );
    publish_until_nothing_claimable(&db, &rig.publisher).await;
    assert_eq!((published(&db).await, parked(&db).await), (300, 0));
    let records = read_topic(&topic, 3).await;
    let counts = key_counts(&records);
    assert_eq!(records.len(), 300, "each record once");
    assert_eq!(counts.len(), 300);
    let metrics = rig.context.metrics.encode();
    eprintln!(
        "{}",
        metrics
            .lines()
            .filter(|l| l.starts_with("crm_booking_expiration_outbox_produce_errors_total"))
            .collect::<Vec<_>>()
            .join("\n")
    );
    assert!(
        metrics.contains(
            "crm_booking_expiration_outbox_produce_errors_total{code=\"MESSAGE_TOO_LARGE\"}"
        ),
        "the broker refused the whole requests: {metrics}"
    );
}
