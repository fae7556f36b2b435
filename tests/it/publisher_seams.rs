//! The publisher through its seams, on a real PostgreSQL: claim and mark,
//! lanes, shutdown and backoff against the in-memory sink (their subject is
//! not the broker); broker readiness; and the rskafka sink's one-deadline
//! bound against a silent broker and a slow link.

use std::{
    net::SocketAddr,
    sync::Arc,
    time::{Duration, Instant},
};

use crate::support::*;
use booking_expiration::context::TaskContext;
use booking_expiration::{
    clock::{Clock, SystemClock},
    config::{KafkaSettings, PublisherSettings},
    db::PgPool,
    outbox::{
        KafkaError, KafkaSink, LagStats, MemorySink, OutgoingRecord, PublishError, Publisher,
        RetentionSweep, Sink, SinkError,
    },
    telemetry::{Health, Metrics},
};
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::{TcpListener, TcpStream},
    sync::Notify,
};
use tokio_util::sync::CancellationToken;

fn settings(batch_size: u32, concurrency: u32) -> PublisherSettings {
    PublisherSettings {
        batch_size,
        poll_interval: Duration::from_secs(30),
        retention: Duration::from_secs(3600),
        concurrency,
    }
}

/// A publisher, its sink and its health, on `db`.
struct Rig<S: Sink> {
    publisher: Publisher<S>,
    health: Arc<Health>,
    metrics: Arc<Metrics>,
    context: TaskContext,
}

fn rig<S: Sink>(pool: PgPool, sink: S, settings: PublisherSettings) -> Rig<S> {
    rig_with_clock(pool, sink, settings, Arc::new(SystemClock))
}

fn rig_with_clock<S: Sink>(
    pool: PgPool,
    sink: S,
    settings: PublisherSettings,
    clock: Arc<dyn Clock>,
) -> Rig<S> {
    let context = TaskContext {
        health: Arc::new(Health::new(wall_now(), true, true)),
        ..TaskContext::new(pool, clock)
    };
    let publisher = Publisher::new(
        &context,
        sink,
        settings,
        "pin.crm.booking-expired.v1".to_owned(),
    );
    Rig {
        publisher,
        health: Arc::clone(&context.health),
        metrics: Arc::clone(&context.metrics),
        context,
    }
}

/// Expires `n` seeded due bookings into the outbox.
async fn expire_into_outbox(db: &TestDb, n: u64) {
    db.seed_due(n, t0()).await;
    let outcome = db
        .worker(&clock(), 500)
        .run_cycle(&CancellationToken::new())
        .await
        .unwrap();
    assert_eq!(outcome.report.expired(), n);
}

/// The outbox's message keys, oldest row first.
async fn outbox_keys(db: &TestDb) -> Vec<String> {
    #[derive(diesel::QueryableByName)]
    struct Key {
        #[diesel(sql_type = diesel::sql_types::Text)]
        message_key: String,
    }
    let mut conn = db.conn().await;
    let keys: Vec<Key> = diesel_async::RunQueryDsl::load(
        diesel::sql_query("SELECT message_key FROM booking_expiration_outbox ORDER BY id"),
        &mut conn,
    )
    .await
    .expect("outbox keys");
    keys.into_iter().map(|k| k.message_key).collect()
}

async fn unpublished(db: &TestDb) -> i64 {
    db.unpublished().await
}

async fn published(db: &TestDb) -> i64 {
    db.count("SELECT count(*) AS n FROM booking_expiration_outbox WHERE published_at IS NOT NULL")
        .await
}

async fn outbox_rows(db: &TestDb) -> i64 {
    db.count("SELECT count(*) AS n FROM booking_expiration_outbox")
        .await
}

fn distinct_ce_ids(sink: &MemorySink) -> usize {
    let mut ids: Vec<Vec<u8>> = sink
        .produced()
        .into_iter()
        .map(|p| p.record.headers["ce_id"].clone())
        .collect();
    ids.sort();
    ids.dedup();
    ids.len()
}

/// `run` in a task of its own, woken by `wake`, until the token is
/// cancelled.
fn spawn_run(
    rig: &Rig<MemorySink>,
    wake: Arc<Notify>,
) -> (CancellationToken, tokio::task::JoinHandle<()>) {
    let token = CancellationToken::new();
    let (publisher, stop) = (rig.publisher.clone(), token.clone());
    let run = tokio::spawn(async move { publisher.run(wake, stop).await });
    (token, run)
}

// ---- claim and mark ----

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rows_are_marked_published_only_after_the_sink_acknowledged() {
    let db = TestDb::new().await;
    expire_into_outbox(&db, 30).await;
    let sink = MemorySink::new();
    let rig = rig(db.pool.clone(), sink.clone(), settings(100, 1));
    sink.hold();
    let batch = {
        let publisher = rig.publisher.clone();
        tokio::spawn(async move { publisher.publish_batch().await })
    };
    wait_until("the produce to start", Duration::from_secs(5), || async {
        sink.in_flight() == 1
    })
    .await;
    assert_eq!(published(&db).await, 0, "nothing marked before the ack");
    sink.release();
    assert_eq!(batch.await.unwrap().unwrap(), 30);
    assert_eq!(unpublished(&db).await, 0);
    assert_eq!(published(&db).await, 30);
    assert_eq!(sink.produced().len(), 30);
    assert_eq!(distinct_ce_ids(&sink), 30);
    assert_eq!(rig.metrics.outbox_published.get(), 30);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_retention_zero_rows_are_deleted_only_after_the_ack() {
    let db = TestDb::new().await;
    expire_into_outbox(&db, 30).await;
    let sink = MemorySink::new();
    let mut settings = settings(100, 1);
    settings.retention = Duration::ZERO;
    let rig = rig(db.pool.clone(), sink.clone(), settings);
    sink.hold();
    let batch = {
        let publisher = rig.publisher.clone();
        tokio::spawn(async move { publisher.publish_batch().await })
    };
    wait_until("the produce to start", Duration::from_secs(5), || async {
        sink.in_flight() == 1
    })
    .await;
    assert_eq!(outbox_rows(&db).await, 30, "nothing deleted before the ack");
    sink.release();
    assert_eq!(batch.await.unwrap().unwrap(), 30);
    assert_eq!(outbox_rows(&db).await, 0);
    assert_eq!(sink.produced().len(), 30);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_produce_leaves_every_row_unpublished() {
    let db = TestDb::new().await;
    expire_into_outbox(&db, 30).await;
    let sink = MemorySink::new();
    let mut with_delete = settings(100, 1);
    with_delete.retention = Duration::ZERO;
    for settings in [settings(100, 1), with_delete] {
        let rig = rig(db.pool.clone(), sink.clone(), settings);
        sink.fail_next(1);
        let error = rig.publisher.publish_batch().await.unwrap_err();
        assert!(
            matches!(error, PublishError::Sink(SinkError::Refused(_))),
            "{error}"
        );
        assert_eq!(outbox_rows(&db).await, 30, "nothing deleted");
        assert_eq!(unpublished(&db).await, 30, "nothing marked");
        assert!(sink.produced().is_empty());
        assert!(!rig.health.broker_ready());
    }
    let rig = rig(db.pool.clone(), sink.clone(), settings(100, 1));
    assert_eq!(rig.publisher.publish_batch().await.unwrap(), 30);
    assert_eq!(published(&db).await, 30);
}

// ---- lanes ----

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drain_with_two_batches_in_flight_publishes_each_row_once() {
    let db = TestDb::new().await;
    expire_into_outbox(&db, 1000).await;
    let sink = MemorySink::new();
    // A broker round trip, so two lanes' produce calls overlap in time.
    sink.set_latency(Duration::from_millis(30));
    let rig = rig(db.pool.clone(), sink.clone(), settings(50, 2));
    let shutdown = CancellationToken::new();

    // No budget: the first (full) batch only, and more is waiting.
    let first = rig
        .publisher
        .drain(&shutdown, Duration::ZERO)
        .await
        .unwrap();
    assert_eq!((first.published, first.more), (50, true));
    assert_eq!(sink.max_in_flight(), 1);

    let rest = rig
        .publisher
        .drain(&shutdown, Duration::from_secs(60))
        .await
        .unwrap();
    assert_eq!((rest.published, rest.more), (950, false));
    assert_eq!(unpublished(&db).await, 0);
    assert_eq!(
        sink.max_in_flight(),
        2,
        "OUTBOX_CONCURRENCY=2 puts two batches in flight at once"
    );
    assert_eq!(sink.produced().len(), 1000, "no row sent twice");
    assert_eq!(distinct_ce_ids(&sink), 1000);

    // Idle: one empty claim, nothing more.
    let calls = sink.produce_calls();
    let idle = rig
        .publisher
        .drain(&shutdown, Duration::from_secs(60))
        .await
        .unwrap();
    assert_eq!((idle.published, idle.more), (0, false));
    assert_eq!(sink.produce_calls(), calls);
}

// ---- shutdown ----

/// A produce is held when shutdown comes; `run` returns only after it
/// ended, and the rows are then published and committed (`fail` = false)
/// or all left unpublished (`fail` = true).
async fn shutdown_with_a_produce_in_flight(fail: bool) {
    let db = TestDb::new().await;
    expire_into_outbox(&db, 30).await;
    let sink = MemorySink::new();
    let rig = rig(db.pool.clone(), sink.clone(), settings(100, 2));
    sink.hold();
    let (token, mut run) = spawn_run(&rig, Arc::new(Notify::new()));
    wait_until("the produce to start", Duration::from_secs(5), || async {
        sink.in_flight() == 1
    })
    .await;
    token.cancel();
    // Deliberate fault timing: the held produce keeps `run` from returning.
    assert!(
        tokio::time::timeout(Duration::from_millis(300), &mut run)
            .await
            .is_err(),
        "run returned while a produce was in flight"
    );
    if fail {
        sink.fail_next(1);
    }
    sink.release();
    tokio::time::timeout(Duration::from_secs(5), run)
        .await
        .expect("run returns once the produce ended")
        .unwrap();
    assert_eq!(sink.produce_calls(), 1, "no batch started after shutdown");
    if fail {
        assert_eq!(unpublished(&db).await, 30);
        assert!(sink.produced().is_empty());
    } else {
        assert_eq!(published(&db).await, 30);
        assert_eq!(sink.produced().len(), 30);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_lets_the_produce_in_flight_finish_and_commits_it() {
    shutdown_with_a_produce_in_flight(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_with_a_failing_produce_in_flight_leaves_the_rows_unpublished() {
    shutdown_with_a_produce_in_flight(true).await;
}

// ---- backoff ----

/// Runs the publisher (woken by `wake`) until every row is published;
/// returns the time between its first two produce calls.
async fn run_until_published(
    db: &TestDb,
    rig: &Rig<MemorySink>,
    sink: &MemorySink,
    wake: Arc<Notify>,
) -> Duration {
    let (token, run) = spawn_run(rig, wake);
    wait_until("every row to publish", Duration::from_secs(5), || async {
        unpublished(db).await == 0
    })
    .await;
    token.cancel();
    run.await.unwrap();
    let started = sink.produce_started();
    assert!(started.len() >= 2, "{} produce calls", started.len());
    started[1] - started[0]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_failure_the_next_attempt_waits_for_the_backoff_not_a_commit() {
    let db = TestDb::new().await;
    expire_into_outbox(&db, 10).await;
    let sink = MemorySink::new();
    sink.fail_next(1);
    let rig = rig(db.pool.clone(), sink.clone(), settings(100, 1));
    // A commit notification is already waiting when the first attempt fails.
    let wake = Arc::new(Notify::new());
    wake.notify_one();
    let gap = run_until_published(&db, &rig, &sink, wake).await;
    // The first backoff step is 100 ms, jittered to between 50 and 100 ms;
    // the 30 s poll interval cannot be what ended the wait.
    assert!(
        gap >= Duration::from_millis(50) && gap < Duration::from_secs(5),
        "retry after {gap:?}"
    );
    assert_eq!(rig.metrics.outbox_publish_errors.get(), 1);
    assert!(rig.health.broker_ready(), "the retry was acknowledged");
}

/// One partition failing while the others are acknowledged (a leader
/// moving off one broker) is progress: the next batch goes at once, not
/// after the backoff, and the failure is still counted. The rows left
/// pending go after a short hold (see the next test).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_partly_acknowledged_batch_the_next_goes_at_once() {
    let db = TestDb::new().await;
    expire_into_outbox(&db, 20).await;
    let sink = MemorySink::new();
    sink.partial_next(6);
    let rig = rig(db.pool.clone(), sink.clone(), settings(10, 1));
    let gap = run_until_published(&db, &rig, &sink, Arc::new(Notify::new())).await;
    // A backoff would be at least 50 ms (see the test above).
    assert!(gap < Duration::from_millis(50), "next batch after {gap:?}");
    assert_eq!(
        sink.produced().len(),
        20,
        "acknowledged rows not sent again"
    );
    assert_eq!(rig.metrics.outbox_publish_errors.get(), 1);
}

/// A partition that stays unwritable while the others are fine does not
/// hold them back: without holds its backlog, the oldest rows, would fill
/// every batch after a few (here a third of the rows fail and a batch is
/// 30 rows, so from the fourth batch on). Its rows wait in the outbox and go
/// once it is writable again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partition_that_stays_unwritable_does_not_hold_back_the_others() {
    let db = TestDb::new().await;
    expire_into_outbox(&db, 300).await;
    let keys = outbox_keys(&db).await;
    let failing: Vec<String> = keys.iter().step_by(3).cloned().collect();
    let sink = MemorySink::new();
    sink.set_unwritable_keys(failing.clone());
    let rig = rig(db.pool.clone(), sink.clone(), settings(30, 1));
    let (token, run) = spawn_run(&rig, Arc::new(Notify::new()));
    wait_until(
        "every writable row published",
        Duration::from_secs(10),
        || async { published(&db).await == 200 },
    )
    .await;
    assert_eq!(unpublished(&db).await, 100, "the unwritable rows wait");
    sink.set_unwritable_keys(Vec::new());
    wait_until("the rest published", Duration::from_secs(10), || async {
        unpublished(&db).await == 0
    })
    .await;
    token.cancel();
    run.await.unwrap();
    assert_eq!(sink.produced().len(), 300, "each row acknowledged once");
    assert_eq!(distinct_ce_ids(&sink), 300);
}

// ---- stats, retention and the broker check on their own schedules ----

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stats_retention_and_broker_check_run_at_once_and_stop_on_shutdown() {
    let db = TestDb::new().await;
    expire_into_outbox(&db, 30).await;
    // The outbox rows were written at t0.
    let clock = clock();
    let sink = MemorySink::new();
    let rig = rig_with_clock(
        db.pool.clone(),
        sink.clone(),
        settings(20, 1),
        Arc::new(clock.clone()),
    );
    assert_eq!(rig.publisher.publish_batch().await.unwrap(), 20);
    clock.advance(chrono::Duration::hours(2));
    let token = CancellationToken::new();
    let tasks = [
        tokio::spawn(
            // The rig's context: the same manual clock and metrics.
            LagStats::new(&rig.context).run(token.clone()),
        ),
        tokio::spawn(
            RetentionSweep::new(&rig.context, Duration::from_secs(3600)).run(token.clone()),
        ),
        {
            let (publisher, token) = (rig.publisher.clone(), token.clone());
            tokio::spawn(async move { publisher.run_broker_check(token).await })
        },
    ];
    wait_until(
        "the first stats, sweep and check",
        Duration::from_secs(5),
        || async {
            rig.metrics.outbox_unpublished.get() == 10
                && rig.metrics.outbox_deleted.get() == 20
                && sink.checks() == 1
        },
    )
    .await;
    assert_eq!(
        outbox_rows(&db).await,
        10,
        "unpublished rows are never swept"
    );
    assert_eq!(
        rig.metrics.outbox_oldest_unpublished_age_seconds.get(),
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

// ---- broker readiness ----

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_empty_claim_does_not_make_the_broker_ready() {
    let db = TestDb::new().await;
    let sink = MemorySink::new();
    sink.set_check_failing(true);
    let rig = rig(db.pool.clone(), sink.clone(), settings(100, 2));
    assert_eq!(rig.publisher.publish_batch().await.unwrap(), 0);
    assert!(
        !rig.health.broker_ready(),
        "an empty claim never talked to the broker"
    );
    assert!(rig.publisher.check_broker().await.is_err());
    assert!(!rig.health.broker_ready());
    let drained = rig
        .publisher
        .drain(&CancellationToken::new(), Duration::from_secs(5))
        .await
        .unwrap();
    assert_eq!(drained.published, 0);
    assert!(!rig.health.broker_ready());
    assert_eq!(sink.produce_calls(), 0);

    // Real exchanges decide: a passing check, then an acknowledged produce.
    sink.set_check_failing(false);
    rig.publisher.check_broker().await.unwrap();
    assert!(rig.health.broker_ready());
    rig.health.set_broker_reachable(false);
    expire_into_outbox(&db, 5).await;
    assert_eq!(rig.publisher.publish_batch().await.unwrap(), 5);
    assert!(rig.health.broker_ready());
}

/// A port nothing listens on.
fn dead_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap().port()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_broker_never_makes_readyz_ready() {
    let db = TestDb::new().await;
    let mut dead = kafka_settings(vec![format!("127.0.0.1:{}", dead_port())]);
    dead.request_timeout = Duration::from_secs(1);
    let rig = rig(db.pool.clone(), KafkaSink::new(dead), settings(100, 2));
    // The outbox is empty: the publisher keeps claiming nothing.
    for _ in 0..3 {
        assert_eq!(rig.publisher.publish_batch().await.unwrap(), 0);
        assert!(!rig.health.broker_ready());
    }
    let error = rig.publisher.check_broker().await.unwrap_err();
    assert!(error.as_kafka().is_some(), "{error}");
    assert!(!rig.health.broker_ready());
    assert_eq!(rig.publisher.publish_batch().await.unwrap(), 0);
    assert!(!rig.health.broker_ready());
}

// ---- one deadline per Kafka call ----

fn one_record() -> Vec<OutgoingRecord> {
    vec![OutgoingRecord {
        key: "k".into(),
        value: b"v".to_vec(),
        headers: Default::default(),
        timestamp: wall_now(),
    }]
}

fn with_timeout(bootstrap: String, timeout: Duration) -> KafkaSettings {
    let mut settings = kafka_settings(vec![bootstrap]);
    settings.request_timeout = timeout;
    settings
}

/// Accepts connections, reads nothing, answers nothing.
async fn silent_broker() -> (SocketAddr, tokio::task::JoinHandle<()>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let task = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((stream, _)) = listener.accept().await {
            held.push(stream);
        }
    });
    (addr, task)
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
    let (addr, broker) = silent_broker().await;
    let timeout = Duration::from_millis(1500);
    let sink = KafkaSink::new(with_timeout(addr.to_string(), timeout));
    let started = Instant::now();
    let error = sink
        .produce("t", one_record())
        .await
        .into_result()
        .unwrap_err();
    let took = started.elapsed();
    assert!(
        matches!(error.as_kafka(), Some(KafkaError::Timeout { .. })),
        "{error}"
    );
    assert!(took < timeout + Duration::from_millis(500), "took {took:?}");
    let started = Instant::now();
    let error = sink.check_topic("t").await.unwrap_err();
    let took = started.elapsed();
    assert!(matches!(error, KafkaError::Timeout { .. }), "{error}");
    assert!(took < timeout + Duration::from_millis(500), "took {took:?}");
    broker.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fresh_connection_over_a_slow_link_fits_in_one_request_timeout() {
    let topic = create_topic(1).await;
    let delay = Duration::from_millis(1200);
    let (addr, link) = slow_link(kafka_bootstrap()[0].clone(), delay).await;

    // The link works: with room for every step, the produce is acknowledged.
    let roomy = KafkaSink::new(with_timeout(addr.to_string(), Duration::from_secs(20)));
    let started = Instant::now();
    roomy
        .produce(&topic, one_record())
        .await
        .into_result()
        .unwrap();
    let all_steps = started.elapsed();
    eprintln!("a fresh produce over the slow link takes {all_steps:?}");

    // Each step fits in 3 s, all of them do not: one deadline for the call.
    let timeout = Duration::from_secs(3);
    assert!(all_steps > timeout, "the steps together exceed the timeout");
    for call in ["produce", "check_topic"] {
        let sink = KafkaSink::new(with_timeout(addr.to_string(), timeout));
        let started = Instant::now();
        let result = match call {
            "produce" => sink.produce(&topic, one_record()).await.into_result(),
            _ => sink
                .check_topic(&topic)
                .await
                .map(|_| ())
                .map_err(Into::into),
        };
        let took = started.elapsed();
        assert!(
            matches!(
                result.as_ref().map_err(|e| e.as_kafka()),
                Err(Some(KafkaError::Timeout { .. }))
            ),
            "{call}: {result:?}"
        );
        assert!(
            took < timeout + Duration::from_millis(500),
            "{call} took {took:?}"
        );
    }
    link.abort();
}
