//! The outbox publisher against a real PostgreSQL and a real Apache Kafka
//! broker: contract of the message, partitioning equal to the Java
//! client's, at-least-once under crashes and broker outages.

use std::{collections::BTreeMap, sync::Arc, time::Duration};

use crate::support::*;
use booking_expiration::context::TaskContext;
use booking_expiration::{
    clock::{Clock, ManualClock, SystemClock},
    config::{KafkaSettings, PublisherSettings},
    db::outbox,
    outbox::{
        KafkaError, KafkaSink, LagStats, PublishError, Publisher, RetentionSweep, SinkError,
        kafka::OutgoingRecord,
    },
    telemetry::Health,
};
use booking_expired_proto::{decode_record, partition_for_key, v1};
use diesel_async::RunQueryDsl;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

fn publisher_settings(batch_size: u32) -> PublisherSettings {
    PublisherSettings {
        batch_size,
        poll_interval: Duration::from_millis(200),
        retention: Duration::from_secs(3600),
        concurrency: 2,
    }
}

fn publisher(db: &TestDb, kafka: KafkaSettings, batch_size: u32, topic: &str) -> Publisher {
    publisher_with(
        db.pool.clone(),
        kafka,
        publisher_settings(batch_size),
        Arc::new(SystemClock),
        topic,
    )
}

fn publisher_with(
    pool: booking_expiration::db::PgPool,
    kafka: KafkaSettings,
    settings: PublisherSettings,
    clock: Arc<dyn Clock>,
    topic: &str,
) -> Publisher {
    let context = TaskContext {
        health: Arc::new(Health::new(wall_now(), true, true)),
        ..TaskContext::new(pool, clock)
    };
    Publisher::new(&context, KafkaSink::new(kafka), settings, topic.to_owned())
}

/// Expires `n` seeded due bookings into the outbox of `topic`.
async fn expire_into_outbox(db: &TestDb, n: u64, topic: &str) {
    db.seed_due(n, t0()).await;
    let clock = clock();
    let outcome = db
        .worker_for(&clock, expiry_settings(200), events_on(topic))
        .run_cycle(&CancellationToken::new())
        .await
        .unwrap();
    assert_eq!(outcome.report.expired(), n);
}

/// Calls `publish_batch` until a claim comes back empty; returns the rows
/// published. (Not `Publisher::drain`, the shutdown drain with a budget.)
async fn publish_until_empty(publisher: &Publisher) -> usize {
    let mut total = 0;
    loop {
        let published = publisher.publish_batch().await.expect("publish");
        if published == 0 {
            return total;
        }
        total += published;
    }
}

async fn unpublished(db: &TestDb) -> i64 {
    db.unpublished().await
}

/// A port nothing listens on.
fn dead_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap().port()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keyed_round_trip_matches_the_java_partitioner_and_the_contract() {
    let db = TestDb::new().await;
    let topic = create_topic(3).await;
    expire_into_outbox(&db, 300, &topic).await;
    let published = publish_until_empty(&publisher(
        &db,
        kafka_settings(kafka_bootstrap()),
        128,
        &topic,
    ))
    .await;
    assert_eq!(published, 300);
    assert_eq!(unpublished(&db).await, 0);

    let records = read_topic(&topic, 3).await;
    assert_eq!(records.len(), 300);
    let keys: Vec<String> = records.iter().map(|r| r.key.clone()).collect();
    let java = java_partitions(&keys, 3);
    let bookings = db.bookings_by_id().await;
    let mut partitions_used = std::collections::BTreeSet::new();
    for record in &records {
        assert_eq!(
            record.partition, java[&record.key],
            "Java partitioner for {}",
            record.key
        );
        assert_eq!(
            record.partition,
            partition_for_key(record.key.as_bytes(), 3)
        );
        partitions_used.insert(record.partition);
        assert_eq!(record.header("ce_specversion").as_deref(), Some("1.0"));
        assert_eq!(
            record.header("ce_type").as_deref(),
            Some("pin.crm.booking-expired.v1")
        );
        assert_eq!(
            record.header("content-type").as_deref(),
            Some("application/protobuf")
        );
        assert_eq!(
            record.header("ce_source").as_deref(),
            Some("/pin/crm/booking-expiration")
        );
        assert!(record.header("ce_time").is_some());
        let event = decode_record(
            &record.value,
            record
                .headers
                .iter()
                .map(|(k, v)| (k.as_str(), v.as_slice())),
        )
        .expect("value decodes with the proto in proto/");
        assert_eq!(event.booking_id.to_string(), record.key, "key = BookingId");
        assert_eq!(
            record.header("tenant_id"),
            Some(event.tenant_id.to_string())
        );
        assert_eq!(record.header("ce_id"), Some(event.event_id.to_string()));
        let stored = &bookings[&event.booking_id];
        assert_eq!(event.tenant_id, stored.tenant_id);
        assert_eq!(Some(event.deal_id), stored.deal_id);
        assert_eq!(Some(event.property_object_id), stored.property_object_id);
        assert_eq!(
            event.expired_at.seconds,
            stored.expired_at.unwrap().timestamp()
        );
        let expected_phase = if stored.status == "ReserveExpired" {
            v1::Phase::Reserve
        } else {
            v1::Phase::Booking
        };
        assert_eq!(event.phase, expected_phase);
    }
    assert_eq!(partitions_used.len(), 3, "keys spread over all partitions");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_expiries_arrive_once_each() {
    let db = TestDb::new().await;
    let topic = create_topic(3).await;
    expire_into_outbox(&db, 10_000, &topic).await;
    let publisher = Arc::new(publisher(
        &db,
        kafka_settings(kafka_bootstrap()),
        500,
        &topic,
    ));
    let token = CancellationToken::new();
    let task = {
        let publisher = Arc::clone(&publisher);
        let token = token.clone();
        tokio::spawn(async move { publisher.run(Arc::new(Notify::new()), token).await })
    };
    wait_until("the outbox to drain", Duration::from_secs(60), || async {
        unpublished(&db).await == 0
    })
    .await;
    token.cancel();
    task.await.unwrap();
    let records = read_topic(&topic, 3).await;
    let keys: std::collections::HashSet<&str> = records.iter().map(|r| r.key.as_str()).collect();
    let ids: std::collections::HashSet<String> =
        records.iter().filter_map(|r| r.header("ce_id")).collect();
    assert_eq!(records.len(), 10_000);
    assert_eq!(keys.len(), 10_000, "one message per booking");
    assert_eq!(ids.len(), 10_000);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_publishers_never_publish_one_row_twice() {
    let db = TestDb::new().await;
    let topic = create_topic(3).await;
    expire_into_outbox(&db, 4_000, &topic).await;
    let mut tasks = Vec::new();
    for _ in 0..2 {
        let pool = booking_expiration::db::connect_pool(&db.settings)
            .await
            .unwrap();
        let p = publisher_with(
            pool,
            kafka_settings(kafka_bootstrap()),
            publisher_settings(100),
            Arc::new(SystemClock),
            &topic,
        );
        tasks.push(tokio::spawn(async move { publish_until_empty(&p).await }));
    }
    let mut total = 0;
    for task in tasks {
        total += task.await.unwrap();
    }
    assert_eq!(total, 4_000);
    let records = read_topic(&topic, 3).await;
    assert_eq!(
        records.len(),
        4_000,
        "no row was produced by both publishers"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crash_between_produce_and_commit_republishes_with_the_same_ce_id() {
    let db = TestDb::new().await;
    let topic = create_topic(3).await;
    expire_into_outbox(&db, 100, &topic).await;

    // A publisher that produced and then died before its commit.
    let mut conn = db.conn().await;
    diesel::sql_query("BEGIN").execute(&mut conn).await.unwrap();
    let rows = outbox::claim_unpublished(&mut conn, 1000).await.unwrap();
    let sink = KafkaSink::new(kafka_settings(kafka_bootstrap()));
    sink.produce(
        &topic,
        rows.iter()
            .map(|r| OutgoingRecord {
                key: r.message_key.clone(),
                value: r.payload.clone(),
                headers: r.header_pairs().into_iter().collect(),
                timestamp: wall_now(),
            })
            .collect(),
    )
    .await
    .into_result()
    .unwrap();
    drop(conn); // connection gone mid-transaction: the server rolls back
    wait_until(
        "the claim to be released",
        Duration::from_secs(10),
        || async { unpublished(&db).await == 100 },
    )
    .await;

    assert_eq!(
        publish_until_empty(&publisher(
            &db,
            kafka_settings(kafka_bootstrap()),
            500,
            &topic
        ))
        .await,
        100
    );
    let records = read_topic(&topic, 3).await;
    assert_eq!(records.len(), 200, "republished, nothing lost");
    let mut per_id: BTreeMap<String, Vec<&ConsumedRecord>> = BTreeMap::new();
    for r in &records {
        per_id
            .entry(r.header("ce_id").unwrap())
            .or_default()
            .push(r);
    }
    assert_eq!(per_id.len(), 100);
    for copies in per_id.values() {
        assert_eq!(copies.len(), 2);
        assert_eq!(copies[0].value, copies[1].value, "identical bytes");
        assert_eq!(copies[0].key, copies[1].key);
        assert_eq!(copies[0].partition, copies[1].partition);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreachable_broker_is_a_bounded_error_and_rows_wait() {
    let db = TestDb::new().await;
    let topic = create_topic(3).await;
    expire_into_outbox(&db, 50, &topic).await;
    let mut dead = kafka_settings(vec![format!("127.0.0.1:{}", dead_port())]);
    dead.request_timeout = Duration::from_secs(2);
    let down = publisher(&db, dead, 500, &topic);
    let started = std::time::Instant::now();
    let error = down.publish_batch().await.unwrap_err();
    assert!(
        started.elapsed() < Duration::from_secs(6),
        "bounded: {:?}",
        started.elapsed()
    );
    assert!(
        matches!(error, PublishError::Sink(SinkError::Kafka(_))),
        "{error}"
    );
    assert_eq!(unpublished(&db).await, 50, "rows wait in the outbox");

    // The broker is back (here: the real one): everything arrives.
    assert_eq!(
        publish_until_empty(&publisher(
            &db,
            kafka_settings(kafka_bootstrap()),
            500,
            &topic
        ))
        .await,
        50
    );
    assert_eq!(read_topic(&topic, 3).await.len(), 50);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn broker_that_never_answers_times_out_instead_of_hanging() {
    let db = TestDb::new().await;
    let topic = create_topic(3).await;
    expire_into_outbox(&db, 20, &topic).await;
    // Accepts connections, reads nothing, answers nothing.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let black_hole = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((stream, _)) = listener.accept().await {
            held.push(stream);
        }
    });
    let mut silent = kafka_settings(vec![addr.to_string()]);
    silent.request_timeout = Duration::from_secs(2);
    let started = std::time::Instant::now();
    let error = publisher(&db, silent, 500, &topic)
        .publish_batch()
        .await
        .unwrap_err();
    assert!(
        started.elapsed() < Duration::from_secs(6),
        "bounded: {:?}",
        started.elapsed()
    );
    assert!(
        matches!(
            error,
            PublishError::Sink(SinkError::Kafka(KafkaError::Timeout { .. }))
        ),
        "{error}"
    );
    assert_eq!(unpublished(&db).await, 20);
    black_hole.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn missing_topic_is_a_clear_error_unless_creation_is_enabled() {
    let db = TestDb::new().await;
    let topic = format!("missing-{}", Uuid::new_v4().simple());
    expire_into_outbox(&db, 10, &topic).await;
    let error = publisher(&db, kafka_settings(kafka_bootstrap()), 500, &topic)
        .publish_batch()
        .await
        .unwrap_err();
    assert!(
        matches!(
            error,
            PublishError::Sink(SinkError::Kafka(KafkaError::TopicMissing(_)))
        ),
        "{error}"
    );
    assert!(error.to_string().contains("does not exist"), "{error}");
    assert_eq!(unpublished(&db).await, 10);

    let mut creating = kafka_settings(kafka_bootstrap());
    creating.create_topic = true;
    creating.topic_partitions = 2;
    assert_eq!(
        publish_until_empty(&publisher(&db, creating, 500, &topic)).await,
        10
    );
    assert_eq!(read_topic(&topic, 2).await.len(), 10);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn commit_notification_wakes_the_publisher_within_a_second() {
    let db = TestDb::new().await;
    let topic = create_topic(3).await;
    // Polling every 30 s: only the commit notification can be fast.
    let mut settings = publisher_settings(500);
    settings.poll_interval = Duration::from_secs(30);
    let publisher = Arc::new(publisher_with(
        db.pool.clone(),
        kafka_settings(kafka_bootstrap()),
        settings,
        Arc::new(SystemClock),
        &topic,
    ));
    let wake = Arc::new(Notify::new());
    let token = CancellationToken::new();
    let listener = tokio::spawn(booking_expiration::outbox::listen_for_commits(
        db.settings.clone(),
        Arc::clone(&wake),
        token.clone(),
    ));
    let task = {
        let (publisher, wake, token) = (Arc::clone(&publisher), Arc::clone(&wake), token.clone());
        tokio::spawn(async move { publisher.run(wake, token).await })
    };
    // The first commit must find the listener LISTENing (notifications sent
    // before are not queued for it); the publisher then waits on its 30 s poll.
    wait_until(
        "the listener to LISTEN",
        Duration::from_secs(10),
        || async {
            db.count(
                "SELECT count(*) AS n FROM pg_stat_activity \
                 WHERE datname = current_database() AND query LIKE 'LISTEN %'",
            )
            .await
                == 1
        },
    )
    .await;
    let mut latencies = Vec::new();
    for round in 0..5 {
        let db_ref = &db;
        db_ref.seed_due(20, t0()).await;
        let clock = ManualClock::new(t0());
        db.worker_for(&clock, expiry_settings(200), events_on(&topic))
            .run_cycle(&CancellationToken::new())
            .await
            .unwrap();
        let committed = std::time::Instant::now();
        wait_until(
            "the publisher to wake on commit",
            Duration::from_secs(5),
            || async { unpublished(db_ref).await == 0 },
        )
        .await;
        latencies.push(committed.elapsed());
        eprintln!(
            "round {round}: commit -> published in {:?}",
            committed.elapsed()
        );
    }
    token.cancel();
    task.await.unwrap();
    listener.await.unwrap();
    latencies.sort();
    // Each figure includes the test's own polling (a new connection per
    // check), so a loaded machine adds to it: the median must be under a
    // second and no round near the 30 s poll.
    assert!(
        latencies[latencies.len() / 2] < Duration::from_secs(1),
        "commit -> broker ack within a second (median; the poll interval is 30 s): {latencies:?}"
    );
    assert!(
        latencies[latencies.len() - 1] < Duration::from_secs(3),
        "no round waited for the poll: {latencies:?}"
    );
    assert_eq!(read_topic(&topic, 3).await.len(), 100);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retention_removes_only_old_published_rows() {
    let db = TestDb::new().await;
    let topic = create_topic(3).await;
    expire_into_outbox(&db, 30, &topic).await;
    let clock = ManualClock::new(wall_now());
    let p = publisher_with(
        db.pool.clone(),
        kafka_settings(kafka_bootstrap()),
        publisher_settings(20),
        Arc::new(clock.clone()),
        &topic,
    );
    let context = TaskContext::new(db.pool.clone(), Arc::new(clock.clone()));
    let retention = RetentionSweep::new(&context, publisher_settings(20).retention);
    assert_eq!(p.publish_batch().await.unwrap(), 20);
    assert_eq!(retention.run_once().await.unwrap(), 0, "within retention");
    clock.advance(chrono::Duration::hours(2));
    assert_eq!(retention.run_once().await.unwrap(), 20, "past retention");
    assert_eq!(
        unpublished(&db).await,
        10,
        "unpublished rows are never swept"
    );
    let stats = LagStats::new(&context).run_once().await.unwrap();
    assert_eq!(stats.unpublished, 10);
}
