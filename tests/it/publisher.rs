//! The outbox publisher against a real PostgreSQL and a real Apache Kafka
//! broker: contract of the message, partitioning equal to the Java
//! client's, at-least-once under crashes and broker outages, the commit
//! wake-up, retention.

use std::{collections::BTreeMap, sync::Arc, time::Duration};

use crate::support::*;
use booking_expiration::{
    clock::ManualClock,
    config::KafkaSettings,
    context::TaskContext,
    db::outbox::{self, Claim},
    handoff::LeaseOwner,
    outbox::{KafkaTransport, LagStats, OutgoingRecord, RetentionSweep, Transport},
    telemetry::BrokerState,
};
use booking_expired_proto::{decode_record, partition_for_key, v1};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

/// A publisher of `topic` on `db` through Kafka with `kafka`.
fn kafka_rig(
    db: &TestDb,
    kafka: KafkaSettings,
    batch_size: u32,
    topic: &str,
) -> Rig<KafkaTransport> {
    let settings = publisher_settings(batch_size);
    let timing = timing_for(&settings, kafka.request_timeout);
    Rig::new(
        db.pool.clone(),
        KafkaTransport::new(kafka),
        &settings,
        timing,
        topic,
    )
}

/// A publisher of `topic` on `db` through the test broker.
fn rig(db: &TestDb, batch_size: u32, topic: &str) -> Rig<KafkaTransport> {
    kafka_rig(db, kafka_settings(kafka_bootstrap()), batch_size, topic)
}

const IDLE: Duration = Duration::from_secs(60);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keyed_round_trip_matches_the_java_partitioner_and_the_contract() {
    let db = TestDb::new().await;
    let topic = create_topic(3).await;
    expire_into_outbox(&db, 300, &topic).await;
    let published = rig(&db, 128, &topic).publish_until_idle(IDLE).await;
    assert_eq!(published.published, 300);
    assert_eq!(db.unpublished().await, 0);

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
    rig(&db, 500, &topic)
        .run_until("the outbox to drain", Duration::from_secs(60), || async {
            db.unpublished().await == 0
        })
        .await;
    let records = read_topic(&topic, 3).await;
    let keys: std::collections::HashSet<&str> = records.iter().map(|r| r.key.as_str()).collect();
    let ids: std::collections::HashSet<String> =
        records.iter().filter_map(|r| r.header("ce_id")).collect();
    assert_eq!(records.len(), 10_000);
    assert_eq!(keys.len(), 10_000, "one message per booking");
    assert_eq!(ids.len(), 10_000);
}

/// `run`'s path: the expiry writes its outbox rows leased to its own
/// publisher and hands them over after the commit. They are published
/// once each, another instance's claims never take them, and each costs
/// one outbox row update (the mark), no claim.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn rows_handed_over_by_the_expiry_cost_one_update_and_stay_with_their_instance() {
    let db = TestDb::new().await;
    let topic = create_topic(3).await;
    let mine = rig(&db, 500, &topic);
    let other = rig(&db, 500, &topic);
    let handoff = mine.publisher.handoff();
    let shutdown = CancellationToken::new();
    let tasks = [
        mine.spawn_run(Arc::new(Notify::new()), shutdown.clone()),
        other.spawn_run(Arc::new(Notify::new()), shutdown.clone()),
    ];
    db.seed_due(2_000, t0()).await;
    let outcome = db
        .worker_for(&clock(), expiry_settings(200), events_on(&topic))
        .hand_off(handoff)
        .run_cycle(&CancellationToken::new())
        .await
        .expect("an expiry cycle");
    assert_eq!(outcome.report.expired(), 2_000);
    wait_until(
        "every row is published",
        Duration::from_secs(30),
        || async { db.unpublished().await == 0 },
    )
    .await;
    shutdown.cancel();
    let [mine_done, other_done] = tasks;
    let (mine_done, other_done) = (mine_done.await.unwrap(), other_done.await.unwrap());
    assert_eq!(
        (mine_done.published, other_done.published),
        (2_000, 0),
        "the writer's publisher sends its rows; the other instance's claims skip them"
    );
    let records = read_topic(&topic, 3).await;
    let ids: std::collections::HashSet<String> =
        records.iter().filter_map(|r| r.header("ce_id")).collect();
    assert_eq!((records.len(), ids.len()), (2_000, 2_000));
    // Backends write their statistics when they exit: end every other
    // session of the test database, then read the outbox's updates.
    db.exec_sql(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
          WHERE datname = current_database() AND pid <> pg_backend_pid()",
    )
    .await;
    wait_until(
        "the outbox's statistics",
        Duration::from_secs(10),
        || async {
            db.count(
                "SELECT n_tup_upd AS n FROM pg_stat_user_tables \
              WHERE relname = 'booking_expiration_outbox'",
            )
            .await
                >= 2_000
        },
    )
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        db.count(
            "SELECT n_tup_upd AS n FROM pg_stat_user_tables \
              WHERE relname = 'booking_expiration_outbox'"
        )
        .await,
        2_000,
        "one update per event: the mark"
    );
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
        let settings = publisher_settings(100);
        let timing = timing_for(&settings, Duration::from_secs(35));
        let instance = Rig::new(
            pool,
            KafkaTransport::new(kafka_settings(kafka_bootstrap())),
            &settings,
            timing,
            &topic,
        );
        tasks.push(tokio::spawn(async move {
            instance.publish_until_idle(IDLE).await
        }));
    }
    let mut total = 0;
    for task in tasks {
        total += task.await.unwrap().published;
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

    // A publisher that claimed the rows, produced them and was killed
    // before it marked them: its lease (3 s here) ends, and another
    // instance sends them again.
    let mut conn = db.conn().await;
    let claim = Claim {
        limit: 1000,
        lease: Duration::from_secs(3),
        ..Claim::default()
    };
    let rows = outbox::claim(&mut conn, &claim, LeaseOwner::new())
        .await
        .unwrap();
    assert_eq!(rows.len(), 100);
    let transport = KafkaTransport::new(kafka_settings(kafka_bootstrap()));
    let mut by_partition: BTreeMap<i32, Vec<OutgoingRecord>> = BTreeMap::new();
    for row in rows {
        by_partition
            .entry(partition_for_key(row.message_key.as_bytes(), 3))
            .or_default()
            .push(OutgoingRecord {
                key: row.message_key,
                value: row.payload,
                headers: row.headers.unwrap(),
            });
    }
    for (partition, records) in by_partition {
        transport
            .produce(&topic, partition, 3, records)
            .await
            .unwrap();
    }
    drop(conn);
    assert_eq!(
        db.leased().await,
        100,
        "the dead instance's lease holds them"
    );
    wait_until("the lease to end", Duration::from_secs(10), || async {
        db.leased().await == 0
    })
    .await;
    let published = rig(&db, 500, &topic)
        .publish_until_idle(Duration::from_secs(30))
        .await;
    assert_eq!(published.published, 100, "sent again once the lease ended");
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
async fn unreachable_broker_is_unready_and_rows_wait() {
    let db = TestDb::new().await;
    let topic = create_topic(3).await;
    expire_into_outbox(&db, 50, &topic).await;
    let mut dead = kafka_settings(vec![format!("127.0.0.1:{}", dead_port())]);
    dead.request_timeout = Duration::from_secs(2);
    let down = kafka_rig(&db, dead, 500, &topic);
    let shutdown = CancellationToken::new();
    let task = down.spawn_run(Arc::new(Notify::new()), shutdown.clone());
    wait_until(
        "connect errors counted",
        Duration::from_secs(10),
        || async { down.produce_errors("CLIENT_CONNECT") >= 2 },
    )
    .await;
    assert_eq!(down.health().broker_state(), BrokerState::Unreachable);
    let stopping = std::time::Instant::now();
    shutdown.cancel();
    assert_eq!(task.await.unwrap().published, 0);
    assert!(
        stopping.elapsed() < Duration::from_secs(5),
        "stops at once: {:?}",
        stopping.elapsed()
    );
    assert_eq!(db.unpublished().await, 50, "rows wait in the outbox");
    assert_eq!(db.leased().await, 0, "released for the next instance");

    // The broker is back (here: the real one): everything arrives.
    assert_eq!(
        rig(&db, 500, &topic)
            .publish_until_idle(IDLE)
            .await
            .published,
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
    let silent_broker = SilentBroker::start().await;
    let mut silent = kafka_settings(vec![silent_broker.addr.to_string()]);
    silent.request_timeout = Duration::from_secs(2);
    let stuck = kafka_rig(&db, silent, 500, &topic);
    let started = std::time::Instant::now();
    stuck
        .run_until("a timeout counted", Duration::from_secs(10), || async {
            stuck.produce_errors("CLIENT_TIMEOUT") >= 1
        })
        .await;
    assert!(
        started.elapsed() < Duration::from_secs(6),
        "bounded: {:?}",
        started.elapsed()
    );
    assert_eq!(db.unpublished().await, 20);
    assert_eq!(db.leased().await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn missing_topic_waits_for_the_operator_unless_creation_is_enabled() {
    let db = TestDb::new().await;
    let topic = format!("missing-{}", Uuid::new_v4().simple());
    expire_into_outbox(&db, 10, &topic).await;
    let missing = rig(&db, 500, &topic);
    missing
        .run_until(
            "the missing topic reported",
            Duration::from_secs(10),
            || async { missing.produce_errors("UNKNOWN_TOPIC_OR_PARTITION") >= 1 },
        )
        .await;
    assert!(
        matches!(
            missing.health().broker_state(),
            BrokerState::Failing { refusing: 1, .. }
        ),
        "{}",
        missing.health().broker_state()
    );
    assert_eq!(db.unpublished().await, 10);
    assert_eq!(
        db.parked().await,
        0,
        "nothing parked: the topic is missing, not the records"
    );

    let mut creating = kafka_settings(kafka_bootstrap());
    creating.create_topic = true;
    creating.topic_partitions = 2;
    assert_eq!(
        kafka_rig(&db, creating, 500, &topic)
            .publish_until_idle(IDLE)
            .await
            .published,
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
    let waking = Rig::new(
        db.pool.clone(),
        KafkaTransport::new(kafka_settings(kafka_bootstrap())),
        &settings,
        timing_for(&settings, Duration::from_secs(35)),
        &topic,
    );
    let wake = Arc::new(Notify::new());
    let token = CancellationToken::new();
    let listener = tokio::spawn(booking_expiration::outbox::listen_for_commits(
        db.settings.clone(),
        Arc::clone(&wake),
        token.clone(),
    ));
    let task = waking.spawn_run(Arc::clone(&wake), token.clone());
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
            || async { db_ref.unpublished().await == 0 },
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
    expire_into_outbox(&db, 20, &topic).await;
    let clock = ManualClock::new(wall_now());
    let settings = publisher_settings(20);
    let published = Rig::with_clock(
        db.pool.clone(),
        KafkaTransport::new(kafka_settings(kafka_bootstrap())),
        &settings,
        timing_for(&settings, Duration::from_secs(35)),
        &topic,
        Arc::new(clock.clone()),
    )
    .publish_until_idle(IDLE)
    .await;
    assert_eq!(published.published, 20);
    // Ten more, not published.
    expire_into_outbox(&db, 10, &topic).await;
    assert_eq!(db.event_records().await, (30, 30), "one record per row");
    let context = TaskContext::new(db.pool.clone(), Arc::new(clock.clone()));
    let retention = RetentionSweep::new(&context, settings.retention);
    assert_eq!(retention.run_once().await.unwrap(), 0, "within retention");
    clock.advance(chrono::Duration::hours(2));
    assert_eq!(retention.run_once().await.unwrap(), 20, "past retention");
    assert_eq!(
        db.unpublished().await,
        10,
        "unpublished rows are never swept"
    );
    assert_eq!(
        db.event_records().await,
        (10, 10),
        "the records of swept rows go with them"
    );
    let stats = LagStats::new(&context).run_once().await.unwrap();
    assert_eq!(stats.unpublished, 10);
}
