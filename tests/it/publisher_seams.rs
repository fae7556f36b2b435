//! The publisher through its seams, on a real PostgreSQL: the leases and
//! the marks, shutdown, backoff and a partition that stays unwritable
//! against the scripted broker (their subject is the database side, not
//! the broker); broker readiness; and the Kafka transport's one bound per
//! call against a silent broker and a slow link.

use std::{
    net::SocketAddr,
    sync::Arc,
    time::{Duration, Instant},
};

use crate::support::*;
use booking_expiration::{
    config::KafkaSettings,
    context::TaskContext,
    outbox::{
        ErrorClass, KafkaTransport, LagStats, OutgoingRecord, Refresh, RetentionSweep,
        ScriptedTransport, SendError, Transport, memory::Answer,
    },
    telemetry::BrokerState,
};
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::{TcpListener, TcpStream},
    sync::Notify,
};
use tokio_util::sync::CancellationToken;

const TOPIC: &str = "seams";

/// A publisher on `db` through a scripted broker of `partitions`
/// partitions, `batch` rows per request.
fn scripted(
    db: &TestDb,
    partitions: i32,
    batch: u32,
) -> (Rig<ScriptedTransport>, ScriptedTransport) {
    scripted_with(db, partitions, publisher_settings(batch))
}

fn scripted_with(
    db: &TestDb,
    partitions: i32,
    settings: booking_expiration::config::PublisherSettings,
) -> (Rig<ScriptedTransport>, ScriptedTransport) {
    let broker = ScriptedTransport::new(TOPIC, partitions);
    let timing = timing_for(&settings, Duration::from_secs(35));
    let rig = Rig::new(db.pool.clone(), broker.clone(), &settings, timing, TOPIC);
    (rig, broker)
}

/// How many distinct `ce_id`s the broker wrote, and how many records.
fn written(broker: &ScriptedTransport) -> (usize, usize) {
    let all = broker.written();
    let ids: std::collections::HashSet<_> = all
        .iter()
        .filter_map(|w| w.record.headers.get("ce_id").map(str::to_owned))
        .collect();
    (ids.len(), all.len())
}

fn retriable(code: &str) -> SendError {
    SendError::new(ErrorClass::Retriable, code, format!("{code} (scripted)"))
}

// ---- leases and marks ----

/// Rows are marked only once the broker acknowledged them; while their
/// request is on the way they are leased, not locked, and no transaction
/// is open.
async fn marked_only_after_the_ack(retention_zero: bool) {
    let db = TestDb::new().await;
    expire_into_outbox(&db, 30, TOPIC).await;
    let mut settings = publisher_settings(100);
    if retention_zero {
        settings.retention = Duration::ZERO;
    }
    let (rig, broker) = scripted_with(&db, 1, settings);
    broker.answer_next(TOPIC, 0, [Answer::AckAfter(Duration::from_secs(2))]);
    let shutdown = CancellationToken::new();
    let run = rig.spawn_run(Arc::new(Notify::new()), shutdown.clone());
    wait_until("the request to start", Duration::from_secs(5), || async {
        !broker.requests(TOPIC, 0).is_empty()
    })
    .await;
    assert_eq!(db.published().await, 0, "nothing marked before the ack");
    assert_eq!(db.outbox_rows().await, 30, "nothing deleted before the ack");
    assert_eq!(db.leased().await, 30);
    // Rounds (claims on the 200 ms poll, renewals) come and go in
    // milliseconds; none stays open while the request waits 2 s.
    for _ in 0..10 {
        let old = db
            .count(
                "SELECT count(*) AS n FROM pg_stat_activity \
                 WHERE datname = current_database() AND pid <> pg_backend_pid() \
                   AND now() - xact_start > interval '500 milliseconds'",
            )
            .await;
        assert_eq!(old, 0, "no transaction waits for the broker");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    wait_until("the ack to be marked", Duration::from_secs(10), || async {
        db.unpublished().await == 0
    })
    .await;
    if retention_zero {
        assert_eq!(db.outbox_rows().await, 0);
        assert_eq!(db.event_records().await, (0, 0));
    } else {
        assert_eq!(db.published().await, 30);
        assert_eq!(db.event_records().await, (30, 30));
    }
    shutdown.cancel();
    assert_eq!(run.await.unwrap().published, 30);
    assert_eq!(written(&broker), (30, 30));
    assert_eq!(rig.metrics().outbox_published.get(), 30);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rows_are_marked_published_only_after_the_broker_acknowledged() {
    marked_only_after_the_ack(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_retention_zero_rows_are_deleted_only_after_the_ack() {
    marked_only_after_the_ack(true).await;
}

/// Two instances on one outbox: the leases divide the rows, none is sent
/// by both.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_instances_never_send_one_row_both() {
    let db = TestDb::new().await;
    expire_into_outbox(&db, 2_000, TOPIC).await;
    let broker = ScriptedTransport::new(TOPIC, 3);
    for partition in 0..3 {
        broker.answer(TOPIC, partition, Answer::AckAfter(Duration::from_millis(5)));
    }
    let mut runs = Vec::new();
    for _ in 0..2 {
        let pool = booking_expiration::db::connect_pool(&db.settings)
            .await
            .unwrap();
        let settings = publisher_settings(50);
        let timing = timing_for(&settings, Duration::from_secs(35));
        let instance = Rig::new(pool, broker.clone(), &settings, timing, TOPIC);
        runs.push(tokio::spawn(async move {
            instance.publish_until_idle(Duration::from_secs(60)).await
        }));
    }
    let mut published = 0;
    for run in runs {
        published += run.await.unwrap().published;
    }
    assert_eq!(published, 2_000);
    assert_eq!(written(&broker), (2_000, 2_000), "no row sent twice");
}

/// A request that fails leaves its rows unpublished and leased (no other
/// instance takes them meanwhile); stopping releases them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_request_leaves_its_rows_leased_then_released_at_shutdown() {
    let db = TestDb::new().await;
    expire_into_outbox(&db, 30, TOPIC).await;
    let (rig, broker) = scripted(&db, 1, 100);
    broker.answer(TOPIC, 0, Answer::Fail(retriable("NOT_ENOUGH_REPLICAS")));
    let shutdown = CancellationToken::new();
    let run = rig.spawn_run(Arc::new(Notify::new()), shutdown.clone());
    wait_until("three tries", Duration::from_secs(5), || async {
        broker.requests(TOPIC, 0).len() >= 3
    })
    .await;
    assert_eq!(db.unpublished().await, 30);
    assert_eq!(db.leased().await, 30);
    assert!(!rig.health().broker_ready());
    shutdown.cancel();
    run.await.unwrap();
    assert_eq!(db.leased().await, 0, "released at shutdown");
    broker.answer(TOPIC, 0, Answer::Ack);
    assert_eq!(
        rig.publish_until_idle(Duration::from_secs(10))
            .await
            .published,
        30
    );
}

// ---- shutdown ----

/// A request on the way when shutdown comes: `run` waits for its answer
/// (up to `Timing::stop_wait`) and marks it; one that outlasts the wait is
/// dropped and its rows released.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_waits_for_the_answer_on_the_way_then_releases_the_rest() {
    let db = TestDb::new().await;
    expire_into_outbox(&db, 30, TOPIC).await;
    let (rig, broker) = scripted(&db, 1, 100);
    broker.answer_next(TOPIC, 0, [Answer::AckAfter(Duration::from_secs(1))]);
    let shutdown = CancellationToken::new();
    let run = rig.spawn_run(Arc::new(Notify::new()), shutdown.clone());
    wait_until("the request to start", Duration::from_secs(5), || async {
        !broker.requests(TOPIC, 0).is_empty()
    })
    .await;
    shutdown.cancel();
    let done = tokio::time::timeout(Duration::from_secs(5), run)
        .await
        .expect("run returns once the answer came")
        .unwrap();
    assert_eq!(done.published, 30);
    assert_eq!(db.published().await, 30);
    assert_eq!(
        broker.requests(TOPIC, 0).len(),
        1,
        "nothing sent after shutdown"
    );

    expire_into_outbox(&db, 10, TOPIC).await;
    broker.answer_next(TOPIC, 0, [Answer::Hang]);
    let shutdown = CancellationToken::new();
    let run = rig.spawn_run(Arc::new(Notify::new()), shutdown.clone());
    wait_until("the second request", Duration::from_secs(5), || async {
        broker.requests(TOPIC, 0).len() == 2
    })
    .await;
    let stopping = Instant::now();
    shutdown.cancel();
    run.await.unwrap();
    let waited = stopping.elapsed();
    let stop_wait = rig.publisher.timing().stop_wait;
    assert!(
        waited >= stop_wait && waited < stop_wait + Duration::from_secs(2),
        "waited {waited:?} for the unanswered request"
    );
    assert_eq!(db.unpublished().await, 10);
    assert_eq!(db.leased().await, 0, "released for another instance");
}

// ---- a partition on its own ----

/// After a failure the partition waits for its own backoff, not for the
/// next commit notification.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_failure_the_partition_waits_for_its_backoff_not_a_commit() {
    let db = TestDb::new().await;
    expire_into_outbox(&db, 10, TOPIC).await;
    let (rig, broker) = scripted(&db, 1, 100);
    broker.answer_next(
        TOPIC,
        0,
        [Answer::Fail(retriable("NOT_LEADER_OR_FOLLOWER"))],
    );
    let wake = Arc::new(Notify::new());
    let shutdown = CancellationToken::new();
    let run = rig.spawn_run(Arc::clone(&wake), shutdown.clone());
    wait_until("the first try", Duration::from_secs(5), || async {
        !broker.requests(TOPIC, 0).is_empty()
    })
    .await;
    wake.notify_one();
    wait_until("every row published", Duration::from_secs(5), || async {
        db.unpublished().await == 0
    })
    .await;
    shutdown.cancel();
    run.await.unwrap();
    let tries = broker.requests(TOPIC, 0);
    let gap = tries[1] - tries[0];
    // The first backoff step is 100 ms, drawn from half to all of it.
    assert!(
        gap >= Duration::from_millis(50) && gap < Duration::from_secs(1),
        "retry after {gap:?}"
    );
    assert_eq!(rig.produce_errors("NOT_LEADER_OR_FOLLOWER"), 1);
    assert!(rig.health().broker_ready(), "the retry was acknowledged");
}

/// A partition that stays unwritable while the others are fine holds them
/// back in nothing: the claim leaves its rows in the outbox once it holds
/// its share (`key_hash % partitions` in the claim's SQL), the others are
/// published, and its rows go once it is writable again, each once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partition_that_stays_unwritable_holds_back_no_other() {
    let db = TestDb::new().await;
    expire_into_outbox(&db, 600, TOPIC).await;
    let keys = db.outbox_keys().await;
    let on_0 = keys
        .iter()
        .filter(|k| booking_expired_proto::partition_for_key(k.as_bytes(), 3) == 0)
        .count() as i64;
    // 10 rows a request: at most 160 held, a partition's share is 13.
    let (rig, broker) = scripted(&db, 3, 10);
    broker.answer(TOPIC, 0, Answer::Fail(retriable("NOT_ENOUGH_REPLICAS")));
    let shutdown = CancellationToken::new();
    let run = rig.spawn_run(Arc::new(Notify::new()), shutdown.clone());
    wait_until(
        "every writable row published",
        Duration::from_secs(30),
        || async { db.published().await == 600 - on_0 },
    )
    .await;
    let held = rig.metrics().outbox_held.get();
    assert!(
        held < 2 * 13,
        "partition 0 holds {held} rows, less than two shares"
    );
    assert_eq!(
        db.leased().await,
        held,
        "the rest of its rows wait unleased"
    );
    broker.answer(TOPIC, 0, Answer::Ack);
    wait_until("the rest published", Duration::from_secs(30), || async {
        db.unpublished().await == 0
    })
    .await;
    shutdown.cancel();
    run.await.unwrap();
    assert_eq!(written(&broker), (600, 600), "each row acknowledged once");
}

// ---- stats and retention on their own schedules ----

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stats_and_retention_run_at_once_and_stop_on_shutdown() {
    let db = TestDb::new().await;
    expire_into_outbox(&db, 20, TOPIC).await;
    // The outbox rows were written at t0.
    let clock = clock();
    let settings = publisher_settings(20);
    let rig = Rig::with_clock(
        db.pool.clone(),
        ScriptedTransport::new(TOPIC, 1),
        &settings,
        timing_for(&settings, Duration::from_secs(35)),
        TOPIC,
        Arc::new(clock.clone()),
    );
    assert_eq!(
        rig.publish_until_idle(Duration::from_secs(10))
            .await
            .published,
        20
    );
    expire_into_outbox(&db, 10, TOPIC).await;
    clock.advance(chrono::Duration::hours(2));
    let token = CancellationToken::new();
    let tasks = [
        // The rig's context: the same manual clock and metrics.
        tokio::spawn(LagStats::new(&rig.context).run(token.clone())),
        tokio::spawn(
            RetentionSweep::new(&rig.context, Duration::from_secs(3600)).run(token.clone()),
        ),
    ];
    wait_until(
        "the first stats and sweep",
        Duration::from_secs(5),
        || async {
            rig.metrics().outbox_unpublished.get() == 10 && rig.metrics().outbox_deleted.get() == 20
        },
    )
    .await;
    assert_eq!(
        db.outbox_rows().await,
        10,
        "unpublished rows are never swept"
    );
    assert_eq!(
        rig.metrics().outbox_oldest_unpublished_age_seconds.get(),
        7200
    );
    token.cancel();
    for task in tasks {
        tokio::time::timeout(Duration::from_secs(5), task)
            .await
            .expect("stops on shutdown")
            .unwrap();
    }
}

/// Two instances' lag gauges on one database: the first to look counts
/// and records the count with the time of the next; the other reads it and
/// does not count before that time (rows written meanwhile show in the
/// next count, whoever makes it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn instances_share_one_count_of_the_lag() {
    let db = TestDb::new().await;
    expire_into_outbox(&db, 10, TOPIC).await;
    let (a_context, b_context) = (lag_context(&db), lag_context(&db));
    let (a, b) = (LagStats::new(&a_context), LagStats::new(&b_context));

    let refresh = a.refresh().await.unwrap();
    let Refresh::Counted { stats, pause } = refresh else {
        panic!("the first look counts: {refresh:?}")
    };
    assert_eq!(stats.unpublished, 10);
    assert_eq!(
        pause,
        Duration::from_secs(5),
        "a quick count: the shortest pause"
    );

    expire_into_outbox(&db, 5, TOPIC).await;
    let refresh = b.refresh().await.unwrap();
    let Refresh::Read { stats, next_in } = refresh else {
        panic!("before the next count is due, B reads A's: {refresh:?}")
    };
    assert_eq!(stats.unpublished, 10, "A's count, not B's own");
    assert!(
        next_in > Duration::from_secs(3) && next_in <= pause,
        "{next_in:?}"
    );
    assert_eq!(b_context.metrics.outbox_unpublished.get(), 10);
    assert_eq!(refresh.wait(), next_in);

    // The next count is due: whoever looks first counts, the other reads.
    db.exec_sql("UPDATE booking_expiration_outbox_lag SET next_at = now()")
        .await;
    let refresh = b.refresh().await.unwrap();
    assert!(
        matches!(refresh, Refresh::Counted { stats, .. } if stats.unpublished == 15),
        "{refresh:?}"
    );
    let refresh = a.refresh().await.unwrap();
    assert!(
        matches!(refresh, Refresh::Read { stats, .. } if stats.unpublished == 15),
        "{refresh:?}"
    );
    assert_eq!(a_context.metrics.outbox_unpublished.get(), 15);
}

/// While one instance counts (it holds the shared row), another that looks
/// does not wait for it and does not count too: it keeps the last count
/// and looks again after the stats interval. A count that dies with its
/// instance leaves the row due and unlocked: the next look counts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_count_under_way_is_not_repeated_and_one_that_dies_is_taken_over() {
    let db = TestDb::new().await;
    expire_into_outbox(&db, 7, TOPIC).await;
    let context = lag_context(&db);
    let stats = LagStats::new(&context);

    // Another instance's count: its transaction holds the due row.
    let counting = db
        .holding("SELECT 1 FROM booking_expiration_outbox_lag WHERE id = 1 FOR UPDATE")
        .await;
    let refresh = tokio::time::timeout(Duration::from_secs(2), stats.refresh())
        .await
        .expect("a look does not wait for a count under way")
        .unwrap();
    assert!(
        matches!(refresh, Refresh::Busy { last: None }),
        "nothing counted yet: {refresh:?}"
    );
    assert_eq!(refresh.wait(), Duration::from_secs(5));
    assert_eq!(
        context.metrics.outbox_unpublished.get(),
        0,
        "no count shown"
    );

    // That instance dies mid-count.
    drop(counting);
    let refresh = stats.refresh().await.unwrap();
    assert!(
        matches!(refresh, Refresh::Counted { stats, .. } if stats.unpublished == 7),
        "{refresh:?}"
    );
    assert_eq!(context.metrics.outbox_unpublished.get(), 7);
}

/// An instance's lag gauges: its own metrics, the same clock.
fn lag_context(db: &TestDb) -> TaskContext {
    TaskContext::new(db.pool.clone(), Arc::new(clock()))
}

// ---- broker readiness ----

/// Readiness comes from real exchanges with the broker: the metadata
/// read, which the publisher makes with an empty outbox too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readiness_follows_the_metadata_read_with_an_empty_outbox() {
    let db = TestDb::new().await;
    let (rig, broker) = scripted(&db, 3, 100);
    broker.fail_metadata(Some(retriable("CLIENT_CONNECT")));
    let shutdown = CancellationToken::new();
    let run = rig.spawn_run(Arc::new(Notify::new()), shutdown.clone());
    wait_until("a failed read", Duration::from_secs(5), || async {
        broker.metadata_reads() >= 1
    })
    .await;
    assert_eq!(rig.health().broker_state(), BrokerState::Unreachable);
    broker.fail_metadata(None);
    wait_until("ready", Duration::from_secs(5), || async {
        rig.health().broker_ready()
    })
    .await;
    shutdown.cancel();
    run.await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_broker_never_makes_readyz_ready() {
    let db = TestDb::new().await;
    let mut dead = kafka_settings(vec![format!("127.0.0.1:{}", dead_port())]);
    dead.request_timeout = Duration::from_secs(1);
    let settings = publisher_settings(100);
    let rig = Rig::new(
        db.pool.clone(),
        KafkaTransport::new(dead),
        &settings,
        timing_for(&settings, Duration::from_secs(1)),
        TOPIC,
    );
    rig.run_until("three failed reads", Duration::from_secs(10), || async {
        assert!(!rig.health().broker_ready());
        rig.produce_errors("CLIENT_CONNECT") >= 3
    })
    .await;
    assert_eq!(rig.health().broker_state(), BrokerState::Unreachable);
}

// ---- one bound per Kafka call ----

fn one_record() -> Vec<OutgoingRecord> {
    vec![OutgoingRecord {
        key: "k".into(),
        value: b"v".to_vec(),
        headers: Default::default(),
    }]
}

fn with_timeout(bootstrap: String, timeout: Duration) -> KafkaSettings {
    let mut settings = kafka_settings(vec![bootstrap]);
    settings.request_timeout = timeout;
    settings
}

/// A TCP proxy to `upstream` that holds every chunk of the answers for
/// `delay`: each request then takes about `delay`, so a fresh connection's
/// steps (connect, metadata, ...) each fit in a request timeout that their
/// sum exceeds. rskafka reaches partition leaders at their advertised
/// address, so only the bootstrap broker's steps go through the proxy.
async fn slow_link(upstream: String, delay: Duration) -> (SocketAddr, tokio::task::JoinHandle<()>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let task = tokio::spawn(async move {
        while let Ok((client, _)) = listener.accept().await {
            let upstream = upstream.clone();
            tokio::spawn(async move {
                let Ok(server) = TcpStream::connect(&upstream).await else {
                    return;
                };
                let (mut client_read, mut client_write) = client.into_split();
                let (mut server_read, mut server_write) = server.into_split();
                let requests = tokio::io::copy(&mut client_read, &mut server_write);
                let answers = async {
                    let mut buf = vec![0; 64 * 1024];
                    loop {
                        let n = server_read.read(&mut buf).await?;
                        if n == 0 {
                            return Ok::<_, std::io::Error>(());
                        }
                        tokio::time::sleep(delay).await;
                        client_write.write_all(&buf[..n]).await?;
                    }
                };
                let _ = tokio::join!(requests, answers);
            });
        }
    });
    (addr, task)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_to_a_silent_broker_returns_within_one_request_timeout() {
    let broker = SilentBroker::start().await;
    let timeout = Duration::from_millis(1500);
    let transport = KafkaTransport::new(with_timeout(broker.addr.to_string(), timeout));
    for call in ["produce", "partitions"] {
        let started = Instant::now();
        let error = match call {
            "produce" => transport
                .produce("t", 0, 1, one_record())
                .await
                .unwrap_err(),
            _ => transport.partitions("t").await.unwrap_err(),
        };
        let took = started.elapsed();
        assert_eq!(error.class, ErrorClass::Retriable, "{call}: {error}");
        assert_eq!(error.code, "CLIENT_TIMEOUT", "{call}: {error}");
        assert!(
            took < timeout + Duration::from_millis(500),
            "{call} took {took:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fresh_connection_over_a_slow_link_fits_in_one_request_timeout() {
    let topic = create_topic(1).await;
    let delay = Duration::from_millis(1200);
    let (addr, link) = slow_link(kafka_bootstrap()[0].clone(), delay).await;

    // The link works: with room for every step, the produce is acknowledged.
    let roomy = KafkaTransport::new(with_timeout(addr.to_string(), Duration::from_secs(20)));
    let started = Instant::now();
    roomy.produce(&topic, 0, 1, one_record()).await.unwrap();
    let all_steps = started.elapsed();
    eprintln!("a fresh produce over the slow link takes {all_steps:?}");

    // Each step fits in 2 s, all of them do not: one bound for the call.
    let timeout = Duration::from_secs(2);
    assert!(all_steps > timeout, "the steps together exceed the timeout");
    let transport = KafkaTransport::new(with_timeout(addr.to_string(), timeout));
    let started = Instant::now();
    let error = transport
        .produce(&topic, 0, 1, one_record())
        .await
        .unwrap_err();
    let took = started.elapsed();
    assert_eq!(error.code, "CLIENT_TIMEOUT", "{error}");
    assert!(
        took < timeout + Duration::from_millis(500),
        "produce took {took:?}"
    );
    link.abort();
}

/// Requests are not held back by Nagle's algorithm. rskafka's client
/// wrote a request's length and then its body, two writes on a socket it
/// left with Nagle's algorithm on: the last part of a body waited until
/// the broker acknowledged what went before, and the broker, with nothing
/// to answer yet, may delay that by 40 ms. Requests of 10 to 200 records
/// of 1 KB to three partitions at once (around a loopback segment of
/// 64 KB) showed it: 29 of 60 rounds took 35 ms or more (median 9.0 ms);
/// with `TCP_NODELAY` set on the worker's own sockets, none did (median
/// 4.8 ms).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_are_not_held_back_by_nagles_algorithm() {
    let topic = create_topic(3).await;
    let transport = KafkaTransport::new(kafka_settings(kafka_bootstrap()));
    // Connected, the leaders known (a new topic's may take a moment).
    let deadline = Instant::now() + Duration::from_secs(20);
    for partition in 0..3 {
        while let Err(error) = transport.produce(&topic, partition, 3, one_record()).await {
            assert!(Instant::now() < deadline, "partition {partition}: {error}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    let rounds = 60;
    let mut took = Vec::new();
    for round in 0..rounds {
        let started = Instant::now();
        let sends = (0..3).map(|partition| {
            // 1 KB records, 10 to 200 of them: around a loopback segment
            // (64 KB) and a few.
            let count = 10 + (round * 7 + partition as usize * 13) % 191;
            let records = (0..count)
                .map(|i| OutgoingRecord {
                    key: format!("k{i}"),
                    value: vec![b'v'; 1000],
                    headers: Default::default(),
                })
                .collect();
            transport.produce(&topic, partition, 3, records)
        });
        for result in futures_util::future::join_all(sends).await {
            result.unwrap();
        }
        took.push(started.elapsed());
    }
    took.sort();
    let held = took
        .iter()
        .filter(|t| **t >= Duration::from_millis(35))
        .count();
    eprintln!(
        "{rounds} rounds of 3 requests at once: median {:?}, max {:?}, {held} of them 35 ms or more",
        took[rounds / 2],
        took[rounds - 1]
    );
    // A busy 2-core machine may stall a round or two on its own.
    assert!(
        held <= 3,
        "{held} of {rounds} rounds took 35 ms or more: {took:?}"
    );
}

/// Every lease has an owner, in SQL: an instance paused past its lease
/// comes back after another claimed its rows; its renewal reports them
/// lost, and its mark, park and release leave the other's rows as they
/// are (claimed by the other, unpublished, unparked, leased).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_instance_changes_nothing_of_the_rows_another_claimed() {
    use booking_expiration::{
        clock::SystemClock,
        db::outbox::Claim,
        outbox::{PgStore, Round, Store},
    };
    let db = TestDb::new().await;
    expire_into_outbox(&db, 4, TOPIC).await;
    let store = || PgStore::new(db.pool.clone(), Arc::new(SystemClock), false);
    let (a, b) = (store(), store());
    let short = Duration::from_millis(500);
    let claim = |lease| Round {
        lease,
        claim: Some(Claim {
            limit: 10,
            lease,
            ..Claim::default()
        }),
        ..Round::default()
    };
    let held_by_a = a.round(claim(short)).await.unwrap().claimed;
    assert_eq!(held_by_a.len(), 4);
    let ids: Vec<i64> = held_by_a.iter().map(|row| row.id).collect();
    tokio::time::sleep(short + Duration::from_millis(200)).await;
    let held_by_b = b
        .round(claim(Duration::from_secs(60)))
        .await
        .unwrap()
        .claimed;
    assert_eq!(held_by_b.len(), 4, "A's leases ended: B claims the rows");
    let late = a
        .round(Round {
            published: vec![ids[0]],
            parked: vec![(ids[1], "refused (test)".into())],
            renew: vec![ids[2], ids[3]],
            release: vec![ids[3]],
            lease: Duration::from_secs(60),
            claim: None,
            layouts: Vec::new(),
        })
        .await
        .unwrap();
    assert_eq!(late.lost, [ids[2], ids[3]], "the renewal reports them lost");
    assert_eq!(db.published().await, 0, "A's mark changed nothing");
    assert_eq!(db.parked().await, 0, "A's park changed nothing");
    assert_eq!(db.leased().await, 4, "B's leases stand");
    assert_eq!(
        db.count(&format!(
            "SELECT count(*) AS n FROM booking_expiration_outbox WHERE claimed_by = '{}'",
            b.owner().0
        ))
        .await,
        4,
        "every row is B's"
    );
}
