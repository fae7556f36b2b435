//! The pipeline's failure modes, pinned with tokio's paused time, a
//! scripted broker and an in-memory outbox: no sleeps on the wall clock,
//! the same result on every run. What they bound is the pipeline's own
//! behaviour; the real broker and database are the subject of
//! `tests/it/` (publisher, kafka_cluster).

use std::{sync::Arc, time::Duration};

use tokio::{sync::Notify, task::JoinHandle, time::Instant};
use tokio_util::sync::CancellationToken;

use super::{
    ErrorClass, MemoryStore, Published, Publisher, ScriptedTransport, SendError, Timing,
    memory::{Answer, Written},
};
use crate::telemetry::{BrokerState, Health, Metrics};

const TOPIC: &str = "t";

fn retriable(code: &str) -> SendError {
    SendError::new(ErrorClass::Retriable, code, format!("{code} (scripted)"))
}

fn fatal(code: &str) -> SendError {
    SendError::new(ErrorClass::Fatal, code, format!("{code} (scripted)"))
}

struct Rig {
    transport: ScriptedTransport,
    store: MemoryStore,
    health: Arc<Health>,
    metrics: Arc<Metrics>,
    wake: Arc<Notify>,
    shutdown: CancellationToken,
    task: JoinHandle<Published>,
    partitions: i32,
    keys: Keys,
    /// Where an expiry would hand over the rows it writes leased.
    handoff: Option<crate::handoff::Handoff>,
}

/// Keys by partition, generated in order and handed out once each.
#[derive(Default)]
struct Keys {
    next: usize,
    spare: std::collections::BTreeMap<(i32, i32), std::collections::VecDeque<String>>,
}

impl Keys {
    /// A fresh key of `partition` among `partitions`.
    fn of(&mut self, partition: i32, partitions: i32) -> String {
        loop {
            if let Some(key) = self
                .spare
                .get_mut(&(partitions, partition))
                .and_then(|k| k.pop_front())
            {
                return key;
            }
            let key = format!("booking-{}", self.next);
            self.next += 1;
            let p = booking_expired_proto::partition_for_key(key.as_bytes(), partitions);
            self.spare
                .entry((partitions, p))
                .or_default()
                .push_back(key);
        }
    }
}

impl Rig {
    /// A publisher running on a scripted broker with `partitions`
    /// partitions and an empty outbox, holding at most `max_held` rows.
    fn start(partitions: i32, max_held: usize, timing: Timing) -> Self {
        let transport = ScriptedTransport::new(TOPIC, partitions);
        let store = MemoryStore::new();
        let metrics = Arc::new(Metrics::new());
        let health = Arc::new(Health::new(chrono::DateTime::UNIX_EPOCH, false, true));
        let publisher = Publisher::builder(transport.clone(), store.clone(), TOPIC)
            .timing(timing)
            .max_held(max_held)
            .metrics(Arc::clone(&metrics))
            .health(Arc::clone(&health))
            .seed(7)
            .build();
        let (wake, shutdown) = (Arc::new(Notify::new()), CancellationToken::new());
        let handoff = Some(publisher.handoff());
        let task = tokio::spawn({
            let (wake, shutdown) = (Arc::clone(&wake), shutdown.clone());
            async move { publisher.run(wake, shutdown).await }
        });
        Self {
            transport,
            store,
            health,
            metrics,
            wake,
            shutdown,
            task,
            partitions,
            keys: Keys::default(),
            handoff,
        }
    }

    /// Writes `per_partition` rows a partition leased to the publisher
    /// and hands them over, as the expiry of `run` does after its commit.
    fn hand(&mut self, per_partition: usize, partitions: impl Iterator<Item = i32> + Clone) {
        let lease = Timing::default().lease;
        let mut rows = Vec::new();
        for _ in 0..per_partition {
            for partition in partitions.clone() {
                let key = self.keys.of(partition, self.partitions);
                rows.push(self.store.insert_leased(TOPIC, &key, lease));
            }
        }
        let handoff = self.handoff.as_ref().expect("the handoff is open");
        assert!(handoff.hand(rows, Instant::now()), "the intake takes them");
    }

    /// Commits `per_partition` rows for each partition (and wakes the
    /// publisher, as the commit notification does).
    fn commit(&mut self, per_partition: usize) {
        for _ in 0..per_partition {
            for partition in 0..self.partitions {
                let key = self.keys.of(partition, self.partitions);
                self.store.insert(TOPIC, &key);
            }
        }
        self.wake.notify_one();
    }

    /// Commits `per_partition` rows a partition every 100 ms for `span`.
    async fn commit_for(&mut self, span: Duration, per_partition: usize) {
        let end = Instant::now() + span;
        while Instant::now() < end {
            self.commit(per_partition);
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    async fn stop(mut self) -> Published {
        // The expiry stops first: its end of the handoff closes.
        self.handoff = None;
        self.shutdown.cancel();
        self.task.await.expect("the pipeline does not panic")
    }
}

/// Waits (in paused time) until `done`, at most `limit`.
async fn until(what: &str, limit: Duration, done: impl Fn() -> bool) {
    let end = Instant::now() + limit;
    while !done() {
        assert!(Instant::now() < end, "not within {limit:?}: {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// The longest time between two writes to `partition` within
/// `[from, to]`, the window's ends counted as writes.
fn longest_gap(written: &[Written], partition: i32, from: Instant, to: Instant) -> Duration {
    let mut times: Vec<Instant> = written
        .iter()
        .filter(|w| w.partition == partition && w.at >= from && w.at <= to)
        .map(|w| w.at)
        .collect();
    times.insert(0, from);
    times.push(to);
    times
        .windows(2)
        .map(|w| w[1] - w[0])
        .max()
        .unwrap_or_default()
}

/// How many times each record (by `ce_id`) was written, at most.
fn most_copies(written: &[Written]) -> usize {
    let mut copies = std::collections::HashMap::new();
    for w in written {
        *copies
            .entry(w.record.headers.get("ce_id").map(str::to_owned))
            .or_insert(0) += 1;
    }
    copies.values().copied().max().unwrap_or(0)
}

/// The first case, for two minutes: partition 0 refuses writes
/// (NOT_ENOUGH_REPLICAS) while 1 and 2 are fine, 120 rows falling due a
/// second. They never wait for it, memory holds at most partition 0's
/// share while its backlog (4,800 rows) waits in the outbox, and it
/// publishes within a second of being writable again.
#[tokio::test(start_paused = true)]
async fn a_partition_unwritable_for_minutes_holds_back_no_other() {
    let mut rig = Rig::start(3, 600, Timing::default());
    rig.transport
        .answer(TOPIC, 0, Answer::Fail(retriable("NOT_ENOUGH_REPLICAS")));
    let from = Instant::now();
    rig.commit_for(Duration::from_secs(120), 4).await;
    let to = Instant::now();
    let written = rig.transport.written();
    for partition in [1, 2] {
        let gap = longest_gap(&written, partition, from + Duration::from_secs(1), to);
        assert!(
            gap < Duration::from_secs(1),
            "partition {partition} waited {gap:?}"
        );
    }
    assert!(written.iter().all(|w| w.partition != 0));
    // Memory: partition 0 holds its share (600 / (4 × 3) = 50 rows), never
    // more (a claim asks each partition for its room below the share), and
    // no claim ever held more than max_held.
    assert!(
        rig.store.max_claimed() <= 600,
        "{}",
        rig.store.max_claimed()
    );
    let held = rig.metrics.outbox_held.get();
    assert_eq!(held, 50, "partition 0 holds its share");
    assert_eq!(
        rig.health.broker_state(),
        BrokerState::Failing {
            partitions: 1,
            refusing: 0
        }
    );
    // Writable again: publishing within a second, everything once.
    rig.transport.answer(TOPIC, 0, Answer::Ack);
    let writable = Instant::now();
    until("partition 0 publishes", Duration::from_secs(1), || {
        rig.transport.written().iter().any(|w| w.partition == 0)
    })
    .await;
    assert!(Instant::now() - writable < Duration::from_secs(1));
    until("the backlog drains", Duration::from_secs(5), || {
        rig.store.unpublished() == 0
    })
    .await;
    assert_eq!(most_copies(&rig.transport.written()), 1);
    assert_eq!(rig.transport.max_in_flight(), 1);
    assert!(rig.health.broker_ready());
    let store = rig.store.clone();
    let done = rig.stop().await;
    assert_eq!(done.published as usize, store.published());
}

/// After an outage, partition 0 drains its backlog (its oldest rows are the
/// oldest in the outbox) while rows keep falling due on every partition,
/// each database round takes 150 ms and partition 0 acknowledges a request
/// every 50 ms: partitions 1 and 2 still publish every round. (A claim of
/// the oldest rows first would take only partition 0's backlog each round
/// it had room, and it has room after every acknowledgement.)
#[tokio::test(start_paused = true)]
async fn a_partition_draining_a_backlog_holds_back_no_other() {
    let mut rig = Rig::start(3, 8000, Timing::default());
    rig.transport
        .answer(TOPIC, 0, Answer::Fail(retriable("NOT_ENOUGH_REPLICAS")));
    rig.commit_for(Duration::from_secs(30), 40).await;
    rig.store.set_round_time(Duration::from_millis(150));
    rig.transport
        .answer(TOPIC, 0, Answer::AckAfter(Duration::from_millis(50)));
    let from = Instant::now();
    rig.commit_for(Duration::from_secs(10), 40).await;
    let to = Instant::now();
    let written = rig.transport.written();
    assert!(
        written
            .iter()
            .filter(|w| w.partition == 0 && w.at >= from)
            .count()
            > 5_000,
        "partition 0 drains its backlog"
    );
    for partition in [1, 2] {
        let gap = longest_gap(&written, partition, from, to);
        assert!(
            gap < Duration::from_millis(500),
            "partition {partition} waited {gap:?} while partition 0 drained"
        );
    }
    until("the backlog drains", Duration::from_secs(30), || {
        rig.store.unpublished() == 0
    })
    .await;
    assert_eq!(most_copies(&rig.transport.written()), 1);
    rig.stop().await;
}

/// A row that becomes claimable behind a draining partition's scan (the
/// lease of a row written for an instance that died ends mid-drain, and
/// nobody announces it) is not lost and does not wait for the backlog:
/// while the backlog lasts each claim goes on past the last row the one
/// before it took, and once a lease has passed since the scan last started
/// from the partition's first row it starts there again. The row is sent
/// within one lease (and a claim) of its lease's end, long before the
/// backlog it was behind is through.
#[tokio::test(start_paused = true)]
async fn a_row_freed_behind_a_draining_scan_is_published_within_a_lease() {
    const BACKLOG: usize = 8_000;
    let lease = Timing::default().lease;
    let mut rig = Rig::start(1, 400, Timing::default());
    let key = rig.keys.of(0, 1);
    // The oldest row, leased to an instance that never sends it.
    let lease_ends = Instant::now() + lease;
    rig.store.insert_leased(TOPIC, &key, lease);
    rig.transport
        .answer(TOPIC, 0, Answer::AckAfter(Duration::from_millis(500)));
    rig.commit(BACKLOG);
    until("the backlog drains", Duration::from_secs(120), || {
        rig.store.unpublished() == 0
    })
    .await;
    let written = rig.transport.written();
    let freed = written
        .iter()
        .position(|w| w.record.key == key)
        .expect("the row freed behind the scan is published");
    let last_of_backlog = written.iter().rev().find(|w| w.record.key != key);
    assert!(
        last_of_backlog.is_some_and(|w| w.at > lease_ends + lease + Duration::from_secs(5)),
        "the backlog lasts more than a lease past the lease's end"
    );
    assert!(
        written[freed].at <= lease_ends + lease + Duration::from_secs(1),
        "sent within a lease (and a claim and a request, 1 s) of its lease's end, at {:?} after it",
        written[freed].at.saturating_duration_since(lease_ends)
    );
    assert!(
        freed < BACKLOG,
        "before the backlog it was behind is through"
    );
    assert_eq!(most_copies(&written), 1);
    rig.stop().await;
}

/// The second case: partition 0's requests take 25 s (its only
/// follower frozen, still in the ISR). The others go on; partition 0's
/// request is never sent again while it may still be written.
#[tokio::test(start_paused = true)]
async fn a_slow_partition_holds_back_no_other_and_is_not_duplicated() {
    let mut rig = Rig::start(3, 8000, Timing::default());
    rig.transport
        .answer_next(TOPIC, 0, [Answer::AckAfter(Duration::from_secs(25))]);
    let from = Instant::now();
    rig.commit_for(Duration::from_secs(30), 8).await;
    let to = Instant::now();
    let written = rig.transport.written();
    for partition in [1, 2] {
        let gap = longest_gap(&written, partition, from + Duration::from_secs(1), to);
        assert!(
            gap < Duration::from_secs(1),
            "partition {partition} waited {gap:?}"
        );
    }
    until("everything published", Duration::from_secs(5), || {
        rig.store.unpublished() == 0
    })
    .await;
    assert_eq!(most_copies(&rig.transport.written()), 1);
    assert_eq!(rig.transport.max_in_flight(), 1);
    rig.stop().await;
}

/// A leader moving: two NOT_LEADER_OR_FOLLOWER answers cost the partition
/// two short pauses (100 ms, then up to 200 ms), nothing else.
#[tokio::test(start_paused = true)]
async fn a_moving_leader_costs_the_partition_two_short_pauses() {
    let mut rig = Rig::start(3, 8000, Timing::default());
    let not_leader = Answer::Fail(retriable("NOT_LEADER_OR_FOLLOWER"));
    rig.transport
        .answer_next(TOPIC, 1, [not_leader.clone(), not_leader]);
    let start = Instant::now();
    rig.commit(10);
    until("everything published", Duration::from_secs(1), || {
        rig.store.unpublished() == 0
    })
    .await;
    let requests = rig.transport.requests(TOPIC, 1);
    assert_eq!(requests.len(), 3);
    assert!(
        requests[2] - start <= Duration::from_millis(300),
        "{:?}",
        requests[2] - start
    );
    assert_eq!(most_copies(&rig.transport.written()), 1);
    rig.stop().await;
}

/// Partitions added to the topic get records after the next metadata read
/// (`Timing::metadata_max_age`).
#[tokio::test(start_paused = true)]
async fn partitions_added_to_the_topic_get_records() {
    let mut rig = Rig::start(3, 8000, Timing::default());
    rig.commit(5);
    until("first rows", Duration::from_secs(1), || {
        rig.store.unpublished() == 0
    })
    .await;
    rig.transport.set_partitions(TOPIC, 4);
    tokio::time::sleep(Timing::default().metadata_max_age).await;
    rig.partitions = 4;
    rig.commit(5);
    until("rows on the new partition", Duration::from_secs(1), || {
        rig.transport.written().iter().any(|w| w.partition == 3)
    })
    .await;
    assert!(rig.transport.written().iter().all(|w| w.partition < 4));
    rig.stop().await;
}

/// An authorization failure: each partition is tried once per
/// `Timing::fatal_pause`, readiness fails, nothing is parked, and the rows
/// go once the grant is there.
#[tokio::test(start_paused = true)]
async fn an_authorization_failure_waits_for_the_operator_and_parks_nothing() {
    let mut rig = Rig::start(3, 8000, Timing::default());
    for partition in 0..3 {
        rig.transport.answer(
            TOPIC,
            partition,
            Answer::Fail(fatal("TOPIC_AUTHORIZATION_FAILED")),
        );
    }
    rig.commit(10);
    tokio::time::sleep(Duration::from_secs(60)).await;
    for partition in 0..3 {
        let tries = rig.transport.requests(TOPIC, partition).len();
        assert!(
            (12..=13).contains(&tries),
            "partition {partition}: {tries} tries in a minute"
        );
    }
    assert_eq!(
        rig.health.broker_state(),
        BrokerState::Failing {
            partitions: 3,
            refusing: 3
        }
    );
    assert!(rig.store.parked().is_empty());
    assert_eq!(rig.store.unpublished(), 30);
    for partition in 0..3 {
        rig.transport.answer(TOPIC, partition, Answer::Ack);
    }
    until(
        "published after the grant",
        Timing::default().fatal_pause + Duration::from_secs(1),
        || rig.store.unpublished() == 0,
    )
    .await;
    assert!(rig.health.broker_ready());
    rig.stop().await;
}

/// A record the broker refuses (too large) is parked; the requests it was
/// in are split until it is alone, and everything else is published.
#[tokio::test(start_paused = true)]
async fn a_refused_record_is_parked_and_the_rest_published() {
    let mut rig = Rig::start(1, 8000, Timing::default());
    let bad = "booking-7".to_owned();
    rig.transport.refuse_keys([bad.clone()]);
    rig.commit(20);
    until("all settled", Duration::from_secs(1), || {
        rig.store.unpublished() == 0
    })
    .await;
    let parked = rig.store.parked();
    assert_eq!(parked.len(), 1);
    assert_eq!(parked[0].0, bad);
    assert!(
        parked[0].1.starts_with("MESSAGE_TOO_LARGE"),
        "{}",
        parked[0].1
    );
    assert_eq!(rig.store.published(), 19);
    assert_eq!(most_copies(&rig.transport.written()), 1);
    rig.stop().await;
}

/// A connection reset mid-request: the broker wrote the records but the
/// answer was lost. They are sent again once (at least once), after the
/// first request ended.
#[tokio::test(start_paused = true)]
async fn a_lost_answer_sends_the_records_again_once() {
    let mut rig = Rig::start(1, 8000, Timing::default());
    rig.transport.answer_next(
        TOPIC,
        0,
        [Answer::WriteThenFail(retriable("CLIENT_REQUEST"))],
    );
    rig.commit(10);
    until("all published", Duration::from_secs(1), || {
        rig.store.unpublished() == 0
    })
    .await;
    assert_eq!(most_copies(&rig.transport.written()), 2);
    assert_eq!(rig.transport.written().len(), 20);
    assert_eq!(rig.transport.max_in_flight(), 1);
    rig.stop().await;
}

/// A broker that never answers: the request is given up after
/// `Timing::request_timeout` and only then sent again.
#[tokio::test(start_paused = true)]
async fn an_unanswered_request_is_not_sent_again_before_it_times_out() {
    let mut rig = Rig::start(1, 8000, Timing::default());
    rig.transport.answer_next(TOPIC, 0, [Answer::Hang]);
    rig.commit(3);
    until("all published", Duration::from_secs(40), || {
        rig.store.unpublished() == 0
    })
    .await;
    let requests = rig.transport.requests(TOPIC, 0);
    assert_eq!(requests.len(), 2);
    assert!(requests[1] - requests[0] >= Timing::default().request_timeout);
    assert_eq!(most_copies(&rig.transport.written()), 1);
    rig.stop().await;
}

/// A missing topic (a `republish --kafka-topic` typo): its rows wait,
/// unparked, and hold back no other topic.
#[tokio::test(start_paused = true)]
async fn a_missing_topic_holds_back_no_other_topic() {
    let mut rig = Rig::start(3, 600, Timing::default());
    for n in 0..500 {
        rig.store.insert("typo", &format!("k{n}"));
    }
    rig.commit_for(Duration::from_secs(10), 4).await;
    until("the real topic drained", Duration::from_secs(1), || {
        rig.store.unpublished() == 500
    })
    .await;
    assert!(rig.store.parked().is_empty());
    assert!(matches!(
        rig.health.broker_state(),
        BrokerState::Failing { refusing: 1, .. }
    ));
    let reads = rig.transport.metadata_reads();
    assert!(reads <= 2 + 10 / 5 + 1, "{reads} metadata reads in 10 s");
    rig.stop().await;
}

/// The database gone for a while: acknowledged rows are marked once it is
/// back, nothing is lost or sent twice.
#[tokio::test(start_paused = true)]
async fn a_database_outage_loses_nothing() {
    let mut rig = Rig::start(3, 8000, Timing::default());
    rig.commit(10);
    rig.store.fail_rounds(8);
    rig.commit_for(Duration::from_secs(5), 2).await;
    until("all published", Duration::from_secs(10), || {
        rig.store.unpublished() == 0
    })
    .await;
    assert_eq!(most_copies(&rig.transport.written()), 1);
    let store = rig.store.clone();
    let done = rig.stop().await;
    assert_eq!(done.published as usize, store.published());
}

/// Stopping: the rows a partition could not send are released at once
/// for another instance (no lease left to wait out).
#[tokio::test(start_paused = true)]
async fn stopping_releases_the_rows_held() {
    let mut rig = Rig::start(3, 8000, Timing::default());
    rig.transport
        .answer(TOPIC, 2, Answer::Fail(retriable("NOT_ENOUGH_REPLICAS")));
    rig.commit(10);
    until("the others published", Duration::from_secs(1), || {
        rig.store.unpublished() == 10
    })
    .await;
    assert_eq!(rig.store.leased(), 10);
    let store = rig.store.clone();
    rig.stop().await;
    assert_eq!(store.leased(), 0);
    assert_eq!(store.unpublished(), 10);
}

/// Rows held longer than half their lease are renewed, so no other
/// instance takes them while this one still tries.
#[tokio::test(start_paused = true)]
async fn leases_of_rows_held_long_are_renewed() {
    let timing = Timing::default();
    let mut rig = Rig::start(1, 8000, timing);
    rig.transport
        .answer(TOPIC, 0, Answer::Fail(retriable("NOT_ENOUGH_REPLICAS")));
    rig.commit(5);
    for _ in 0..6 {
        tokio::time::sleep(timing.lease / 2).await;
        assert_eq!(rig.store.leased(), 5, "leases kept");
    }
    rig.stop().await;
}

/// Rows the expiry wrote leased to this publisher and handed over are sent
/// without a claim (their lease keeps every claim off them) and marked.
#[tokio::test(start_paused = true)]
async fn rows_handed_over_are_sent_without_a_claim() {
    let mut rig = Rig::start(3, 8000, Timing::default());
    rig.hand(100, 0..3);
    until(
        "the handed rows are published",
        Duration::from_secs(1),
        || rig.store.published() == 300,
    )
    .await;
    assert_eq!(most_copies(&rig.transport.written()), 1);
    assert_eq!(rig.metrics.outbox_handoff_released.get(), 0);
    rig.stop().await;
}

/// A partition that cannot be written holds its share of handed rows and
/// releases the rest for any instance's claim; once it is writable again,
/// everything is published once.
#[tokio::test(start_paused = true)]
async fn rows_handed_over_without_room_are_released() {
    let mut rig = Rig::start(3, 600, Timing::default());
    rig.transport
        .answer(TOPIC, 0, Answer::Fail(retriable("NOT_ENOUGH_REPLICAS")));
    // Once the partition count is known (before it, the topic's unrouted
    // rows have a share of their own), partition 0's share: 600 / (4 × 3)
    // = 50 rows.
    tokio::time::sleep(Duration::from_millis(100)).await;
    rig.hand(200, 0..1);
    until(
        "the rows without room are released",
        Duration::from_secs(1),
        || rig.store.leased() == 50,
    )
    .await;
    assert_eq!(rig.metrics.outbox_handoff_released.get(), 150);
    assert_eq!(rig.metrics.outbox_held.get(), 50);
    rig.transport.answer(TOPIC, 0, Answer::Ack);
    rig.wake.notify_one();
    until("everything is published", Duration::from_secs(5), || {
        rig.store.published() == 200
    })
    .await;
    assert_eq!(most_copies(&rig.transport.written()), 1);
    rig.stop().await;
}

/// Rows handed over while the publisher stops (the expiry's last batch)
/// are released with the rest, not left for their lease to end.
#[tokio::test(start_paused = true)]
async fn rows_handed_over_while_stopping_are_released() {
    let mut rig = Rig::start(3, 8000, Timing::default());
    rig.transport
        .answer(TOPIC, 0, Answer::Fail(retriable("NOT_ENOUGH_REPLICAS")));
    rig.hand(10, 0..1);
    until("partition 0 holds them", Duration::from_secs(1), || {
        rig.metrics.outbox_held.get() == 10
    })
    .await;
    rig.shutdown.cancel();
    tokio::time::sleep(Duration::from_millis(10)).await;
    rig.hand(5, 0..1);
    rig.handoff = None;
    let store = rig.store.clone();
    rig.task.await.expect("the pipeline does not panic");
    assert_eq!(store.leased(), 0, "every row held or handed is released");
    assert_eq!(store.unpublished(), 15);
}

/// A publisher on `store` and `transport` sending `batch` records a
/// request, spawned; its shutdown token.
fn spawn_publisher(
    store: MemoryStore,
    transport: ScriptedTransport,
    batch: u32,
) -> (CancellationToken, JoinHandle<Published>) {
    let settings = crate::config::PublisherSettings {
        batch_size: batch,
        ..Default::default()
    };
    let publisher = Publisher::builder(transport, store, TOPIC)
        .settings(&settings)
        .seed(7)
        .build();
    let shutdown = CancellationToken::new();
    let task = tokio::spawn({
        let shutdown = shutdown.clone();
        async move { publisher.run(Arc::new(Notify::new()), shutdown).await }
    });
    (shutdown, task)
}

/// An instance paused past its lease (its database rounds frozen 30 s, a
/// produce on the way for 40 s as a silent broker's can be, a partition it
/// keeps retrying) comes back after another instance claimed its rows: it
/// sends none of them (a row whose lease ran out waits for the renewal,
/// which finds it gone, and it is dropped), its marks and releases leave
/// the other's rows alone, nothing is lost and no record is written more
/// than twice (the request it had on the way, once more by the other).
#[tokio::test(start_paused = true)]
async fn a_paused_instance_leaves_the_rows_another_claimed_since() {
    let timing = Timing::default();
    let store_a = MemoryStore::new();
    let mut keys = Keys::default();
    for _ in 0..6 {
        for partition in 0..3 {
            store_a.insert(TOPIC, &keys.of(partition, 3));
        }
    }
    let transport_a = ScriptedTransport::new(TOPIC, 3);
    // Partition 0's first request is answered only after 40 s; partition 1
    // cannot be written by A (its rows wait in A's queue, retried).
    transport_a.answer_next(TOPIC, 0, [Answer::AckAfter(Duration::from_secs(40))]);
    transport_a.answer(TOPIC, 1, Answer::Fail(retriable("NOT_ENOUGH_REPLICAS")));
    let start = Instant::now();
    let (stop_a, task_a) = spawn_publisher(store_a.clone(), transport_a.clone(), 2);
    until("A sends partition 0", Duration::from_secs(1), || {
        !transport_a.requests(TOPIC, 0).is_empty()
    })
    .await;
    // A freezes: no round (no mark, no renewal) for 30 s.
    let thaw = start + Duration::from_secs(30);
    store_a.freeze_until(thaw);
    // Its leases end; B starts and claims what A held.
    tokio::time::sleep_until(start + timing.lease + Duration::from_secs(1)).await;
    let store_b = store_a.another_instance();
    let transport_b = ScriptedTransport::new(TOPIC, 3);
    let (stop_b, task_b) = spawn_publisher(store_b.clone(), transport_b.clone(), 2);
    until("B publishes everything", Duration::from_secs(5), || {
        store_b.unpublished() == 0
    })
    .await;
    let b_wrote = transport_b.written().len();
    assert!(b_wrote > 0, "B took over A's rows");
    // A thaws, its old request is answered, and it runs a while.
    tokio::time::sleep_until(start + Duration::from_secs(60)).await;
    // Once its leases ran out unconfirmed, A sent nothing: not while
    // frozen (B held the rows from 16 s on), not after it thawed.
    let lease_over = start + timing.lease + Duration::from_secs(1);
    assert!(lease_over < thaw);
    let late: Vec<Instant> = (0..3)
        .flat_map(|p| transport_a.requests(TOPIC, p))
        .filter(|at| *at >= lease_over)
        .collect();
    assert!(late.is_empty(), "A sent rows past its lease: {late:?}");
    assert_eq!(store_a.unpublished(), 0, "nothing lost");
    assert!(store_a.parked().is_empty());
    let mut written = transport_a.written();
    written.extend(transport_b.written());
    assert!(most_copies(&written) <= 2, "at most twice");
    assert_eq!(store_a.leased(), 0, "no lease left behind");
    stop_a.cancel();
    stop_b.cancel();
    task_a.await.expect("A does not panic");
    task_b.await.expect("B does not panic");
}

/// The store's rules for a paused instance, at the seam: once another
/// instance holds a row, the first one's renewal reports it lost, and its
/// mark, park and release change nothing of it.
#[tokio::test(start_paused = true)]
async fn a_paused_instances_renew_release_and_mark_touch_only_its_rows() {
    use crate::{
        db::outbox::Claim,
        outbox::store::{Round, Store},
    };
    let lease = Duration::from_secs(15);
    let store_a = MemoryStore::new();
    let store_b = store_a.another_instance();
    let ids: Vec<i64> = (0..4)
        .map(|i| store_a.insert(TOPIC, &format!("k{i}")))
        .collect();
    let claim = || {
        Some(Claim {
            limit: 10,
            lease,
            ..Claim::default()
        })
    };
    let round = |claim| Round {
        lease,
        claim,
        ..Round::default()
    };
    let a = store_a.round(round(claim())).await.expect("in memory");
    assert_eq!(a.claimed.len(), 4);
    tokio::time::sleep(lease + Duration::from_secs(1)).await;
    let b = store_b.round(round(claim())).await.expect("in memory");
    assert_eq!(b.claimed.len(), 4, "A's leases ended: B claims");
    let late = store_a
        .round(Round {
            published: vec![ids[0]],
            parked: vec![(ids[1], "refused".into())],
            renew: vec![ids[2], ids[3]],
            release: vec![ids[3]],
            lease,
            claim: None,
            layouts: Vec::new(),
        })
        .await
        .expect("in memory");
    assert_eq!(late.lost, [ids[2], ids[3]], "renewal reports them lost");
    assert_eq!(store_a.published(), 0, "A's mark changed nothing");
    assert!(store_a.parked().is_empty(), "A's park changed nothing");
    assert_eq!(store_a.leased(), 4, "B's leases stand");
}

/// The topic created again with fewer partitions while requests are on
/// the way: each answer completes the request that carried it, matched by
/// its id (never by the partition's place in a list that changed), so
/// only rows the broker acknowledged are marked published, the rows of a
/// request that failed are routed again by the new count, and nothing is
/// lost.
#[tokio::test(start_paused = true)]
async fn a_topic_laid_out_anew_under_requests_marks_only_what_was_acknowledged() {
    let timing = Timing {
        metadata_max_age: Duration::from_millis(500),
        ..Timing::default()
    };
    let mut rig = Rig::start(3, 8000, timing);
    rig.transport.set_timeout(Duration::from_secs(3));
    // Partition 0's request is acknowledged after 2 s, partition 2's is
    // never answered (it times out after 3 s); partition 1 at once.
    rig.transport
        .answer_next(TOPIC, 0, [Answer::AckAfter(Duration::from_secs(2))]);
    rig.transport.answer_next(TOPIC, 2, [Answer::Hang]);
    rig.commit(5);
    until("requests on the way", Duration::from_secs(1), || {
        !rig.transport.requests(TOPIC, 0).is_empty() && !rig.transport.requests(TOPIC, 2).is_empty()
    })
    .await;
    // Deleted and created again with 2 partitions; the next metadata read
    // (within 500 ms) sees it while both requests are on the way.
    rig.transport.set_partitions(TOPIC, 2);
    until("everything published", Duration::from_secs(10), || {
        rig.store.unpublished() == 0
    })
    .await;
    let mut written: Vec<String> = rig
        .transport
        .written()
        .into_iter()
        .map(|w| w.record.key)
        .collect();
    written.sort();
    written.dedup();
    assert_eq!(
        rig.store.published_keys(),
        written,
        "marked published exactly the rows the broker acknowledged"
    );
    assert_eq!(written.len(), 15, "nothing lost");
    assert!(most_copies(&rig.transport.written()) <= 2);
    // Each record went where its key maps in the layout its request was
    // routed for: the old one (3) or the new one (2), never a mix.
    for w in rig.transport.written() {
        let under = |n| booking_expired_proto::partition_for_key(w.record.key.as_bytes(), n);
        assert!(
            w.partition == under(3) || w.partition == under(2),
            "{} written to partition {}",
            w.record.key,
            w.partition
        );
    }
    rig.stop().await;
}
