//! Faults of a real three-broker Kafka cluster (KRaft, `min.insync.replicas=2`,
//! acks = all) while the `run` binary expires and publishes bookings
//! falling due at about 1,200 a second. The scenarios run on two clusters
//! one after the other (issue #26): a `tuned` one
//! (`broker.session.timeout.ms=6000`, `broker.heartbeat.interval.ms=1000`,
//! `replica.lag.time.max.ms=5000`) and one with Kafka's `defaults` for
//! those three.
//!
//! - Every cluster: a leader killed with `kill -9`; a rolling restart with
//!   controlled shutdown (SIGTERM until the node exited, the node launched
//!   again 2 s later without waiting for it, the next node 4 s after that);
//!   two brokers down (NOT_ENOUGH_REPLICAS) for about 10 s and both
//!   launched again. Topics of replication factor 3, partition `p` led by
//!   node `p + 1` ([`rf3_layout`]).
//! - The first cluster of the run only: partitions added; the `run`
//!   process killed with `kill -9` while it publishes and a new one started
//!   (nothing lost; the broker timing plays no part in either).
//! - Defaults only, the two scenarios of one partition (#32), on a
//!   topic of replication factor 2 whose partition 0 alone depends on node
//!   2 ([`p0_alone_layout`]): **one partition unwritable**, node 2 stopped
//!   with SIGTERM for 60 s then started again (partition 0 refuses writes
//!   with NOT_ENOUGH_REPLICAS while 1 and 2 keep both in-sync replicas);
//!   **one partition slow**, node 2 frozen with SIGSTOP for 25 s then
//!   thawed. (Frozen, node 2 stops heartbeating too: the controller fences
//!   it after `broker.session.timeout.ms`, 9 s, and that takes it out of
//!   the ISR well before `replica.lag.time.max.ms`, 30 s, would. So
//!   partition 0's acks=all requests wait about 9 s, then the partition has
//!   too few in-sync replicas until the thaw; the watcher's timeline of
//!   partition 0 is printed.)
//!
//! Each scenario checks the same invariant — every booking on the topic,
//! duplicates only with the same `ce_id` and bytes, each record on the
//! partition Kafka's Java client would choose — and measures publishing
//! for the worker and, side by side, for a plain Java producer
//! (`scripts/kafka/PlainProducer.java`: acks=all, the client's defaults,
//! about 1,000 records a second to a topic of its own) running in the same
//! scenario. Both topics of a scenario get the same explicit replica
//! assignment, so partition `p` of each has the same leader and followers
//! and a fault hits both alike: the Java figure of partition `p` is the
//! yardstick of the worker's partition `p`.
//!
//! Acknowledgement times: for the worker, the broker's append time (its
//! topics have `message.timestamp.type=LogAppendTime`; with acks=all a
//! record on a writable partition is acknowledged a replication round trip
//! after its append), for the Java client its callback's clock. The
//! outbox's `published_at` comes later than the append, at the database
//! round after the acknowledgement, by as long as the round in flight
//! takes; the one-partition scenarios print its gaps beside the append's,
//! with those of `created_at` (what the expiry wrote: a publishing gap
//! without a writing gap under it is the publisher's) and of the claim
//! times (`claimed_until` less the lease).
//!
//! Per step and client: the longest gap between two acknowledgements on
//! the topic and on each partition (a gap that straddles the step's bounds
//! counts only its part inside), and per partition "resumed after
//! writable": the first acknowledgement after the partition became writable
//! again minus that moment. Writable is read from the cluster itself — the
//! Java program's watcher describes both topics every 100 ms (leader and
//! ISR) — combined with what the test knows about its own faults: a
//! leader that is alive, at least 2 replicas in the ISR and no dead node
//! among them (a dead follower still in the ISR blocks acks=all writes
//! until the ISR shrinks). A node counts as dead from its kill (`kill -9`),
//! from the moment its controlled shutdown finished (SIGTERM) or from its
//! freeze (SIGSTOP) until it is launched again or thawed. The watcher's
//! timestamps are when the describe that saw a change was sent: up to about
//! 100 ms after the cluster made it (the measure favours both clients
//! alike).
//!
//! Goals, asserted for the worker (every figure is printed first,
//! `FIGURES kafka-cluster[PROFILE]: …`, for both clients):
//! - while every partition stays writable during a step of a fault of the
//!   whole cluster (a rolling step), the longest gap on the topic (the
//!   issue's measure there) is < 1 s ([`GapGoal::Topic`]);
//! - in a fault of one partition, each partition that stayed writable (a
//!   healthy one) never stalls 1 s ([`GapGoal::Partitions`]);
//! - a partition that was not writable at some point publishes again < 1 s
//!   after each moment it became writable again (a moment after the worker
//!   published its last row does not count: nothing was left);
//! - one partition unwritable or slow: no event written more than twice;
//!   unwritable: the worker's resident memory flat (`VmRSS` of
//!   `/proc/PID/status` every 500 ms; the last sample of the minute at most
//!   5 MiB above the first one 10 s into it, when partition 0's queue holds
//!   its share of rows);
//! - `kill -9` of the worker: nothing lost.
//!
//! The excuse rule ([`Miss::excused`]): a worker miss is not counted only
//! when the Java producer, on the same partition (or the topic, for the
//! topic's gap) in the same step, missed the same goal too — its
//! writable-again moment within a second of the worker's — and the
//! worker's figure is at most [`EXCUSE`], 0.5 s, above the Java one. Such a
//! miss is the cluster's (a newly elected leader acknowledged its first
//! writes 1.26 s late for both clients in one run): both clients' requests
//! wait on the same broker, and what is left between their figures is how
//! each is taken (append time against callback) and the scheduling of two
//! processes on a busy 2-core machine. 0.5 s covers the worker-minus-Java
//! difference of the resume figures measured on this machine (−1.27 to
//! +0.41 s over 27 writable-again moments of four runs, December 2026,
//! load average about 19): a worker more than that above a Java figure
//! that already missed is slower than the cluster, and counted. The rule
//! does not apply to a healthy partition's gap ([`GapGoal::Partitions`]):
//! the cluster kept it writable, so no stall there is the cluster's (the
//! Java producer's own can be long: its one request per broker carries
//! every partition that broker leads, and partition 2, led by node 1 like
//! partition 0, waits with partition 0's).
//!
//! One cluster at a time (a third of a minute or more to start on 2
//! cores), stopped when its scenarios end, also on failure. Everything
//! runs in one test so that no other test shares the cluster's faults and
//! two clusters never run at once. `KAFKA_CLUSTER_SCENARIOS=kill,rolling,
//! down,partitions,worker-kill,unwritable,slow` limits what runs,
//! `KAFKA_CLUSTER_PROFILES=tuned,defaults` which clusters;
//! `KAFKA_CLUSTER_LOG_DIR=…` keeps the worker's, the brokers' and the
//! watcher's logs there, `KAFKA_CLUSTER_RUST_LOG` sets the worker's
//! `RUST_LOG`. The test is `#[ignore]`d in the parallel suite (its goals
//! are sub-second timings); `scripts/test.sh` runs it alone after the
//! suite. By hand: `bash scripts/test.sh --test it kafka_cluster --
//! --include-ignored --nocapture`.

use std::{
    collections::{BTreeMap, BTreeSet, HashMap},
    path::Path,
    time::{Duration, Instant},
};

use booking_expiration::{db, outbox::Timing};
use chrono::{DateTime, Utc};
use diesel::{
    QueryableByName,
    sql_types::{Text, Timestamptz},
};
use diesel_async::RunQueryDsl;
use testkit::kafka::{Cluster, ClusterProfile, Observed, PlainProducer};

use crate::support::*;

/// The goal: publishing stalls less than this, or resumes within
/// this of the partition being writable again.
const GOAL: Duration = Duration::from_secs(1);

/// Bookings falling due per second (the load).
const DUE_PER_SEC: u64 = 1_200;

/// Records per second of the plain Java producer.
const JAVA_RATE: u32 = 1_000;

/// The restart timing: a stopped node is launched again this long
/// after it exited, and the next step starts this long after that launch.
const RELAUNCH_AFTER: Duration = Duration::from_secs(2);
const NEXT_STEP_AFTER: Duration = Duration::from_secs(4);

/// Two brokers down for about this long.
const DOWN_FOR: Duration = Duration::from_secs(10);

/// The excuse rule's bound: a worker miss is not counted when the Java
/// producer missed the same goal on the same partition in the same step
/// and the worker's figure is at most this above the Java one (see the
/// module's docs for why this much).
const EXCUSE: Duration = Duration::from_millis(500);

/// The scenarios of one partition: unwritable this long (its
/// follower stopped), and slow this long (its follower frozen).
const UNWRITABLE_FOR: Duration = Duration::from_secs(60);
const FROZEN_FOR: Duration = Duration::from_secs(25);

/// Memory flat: the worker's resident memory at the end of the outage at
/// most this above its level once warmed up, [`RSS_WARM_UP`] into it
/// (partition 0's queue holds its share of rows by then).
const RSS_BOUND_KIB: i64 = 5 * 1024;
const RSS_WARM_UP: Duration = Duration::from_secs(10);

/// No event written more than twice (the goal for one partition's
/// faults).
const MOST_COPIES: usize = 2;

/// The replica assignment of the scenarios that fault the cluster:
/// replication factor 3, partition `p` led by node `p + 1`.
fn rf3_layout() -> Vec<Vec<i32>> {
    vec![vec![1, 2, 3], vec![2, 3, 1], vec![3, 1, 2]]
}

/// The node whose loss faults partition 0 alone in [`p0_alone_layout`].
const P0_FOLLOWER: i32 = 2;

/// The topic for the faults of one partition: replication factor
/// 2, `min.insync.replicas=2`, partition 0 on nodes 1 and 2 (led by 1),
/// partitions 1 and 2 on nodes 3 and 1 (led by 3 and 1). Node 2 is
/// partition 0's only follower and in no other partition: stopped or
/// frozen, it leaves partition 0 with fewer than 2 in-sync replicas (or
/// waiting for it) while partitions 1 and 2 keep both of theirs.
fn p0_alone_layout() -> Vec<Vec<i32>> {
    vec![vec![1, P0_FOLLOWER], vec![3, 1], vec![1, 3]]
}

/// Acknowledgement times (epoch milliseconds) per partition, in order.
type Acks = BTreeMap<i32, Vec<i64>>;

/// The watcher's observations per (topic, partition).
type Timelines = BTreeMap<(String, i32), Vec<Observed>>;

#[derive(QueryableByName)]
struct Published {
    #[diesel(sql_type = Text)]
    message_key: String,
    #[diesel(sql_type = Timestamptz)]
    published_at: DateTime<Utc>,
    /// When the expiry wrote the row.
    #[diesel(sql_type = Timestamptz)]
    created_at: DateTime<Utc>,
    /// When its lease was last taken or renewed (`claimed_until` less the
    /// lease): for a row published within half a lease, when the publisher
    /// claimed it.
    #[diesel(sql_type = Timestamptz)]
    claimed_at: DateTime<Utc>,
}

fn now_ms() -> i64 {
    wall_now().timestamp_millis()
}

/// One scenario's traffic: a fresh database seeded with bookings falling
/// due at [`DUE_PER_SEC`] over the next `spread`, a fresh topic on the
/// cluster, the `run` binary expiring and publishing them, and the plain
/// Java producer on a topic of its own, watching both topics.
struct Flow {
    db: TestDb,
    topic: String,
    java_topic: String,
    java: PlainProducer,
    running: Running,
    metrics_addr: String,
    bootstrap: String,
    profile: ClusterProfile,
    due: i64,
}

/// What a finished flow leaves to measure.
struct Finished {
    db: TestDb,
    topic: String,
    java_topic: String,
    java_acks: Acks,
    timelines: Timelines,
    /// The (last) `run` process's stderr.
    log: String,
}

fn blocking<T>(f: impl FnOnce() -> anyhow::Result<T>) -> T {
    tokio::task::block_in_place(f).unwrap_or_else(|e| panic!("{e:#}"))
}

impl Flow {
    /// Both topics get the replica assignment `layout` (see
    /// [`RF3_LAYOUT`]): partition `p` of the worker's topic and of the Java
    /// producer's has the same leader and followers, so a fault hits both
    /// alike and the Java figure of partition `p` is the yardstick of the
    /// worker's.
    async fn start(cluster: &Cluster, dir: &Path, layout: &[Vec<i32>], spread: Duration) -> Self {
        let due = DUE_PER_SEC * spread.as_secs();
        let db = TestDb::new().await;
        let id = uuid::Uuid::new_v4().simple().to_string();
        let topic = format!("cluster-{id}");
        let java_topic = format!("plain-{id}");
        // The worker's records carry the broker's append time: its
        // acknowledgement times on the topic itself.
        let configs = [
            "min.insync.replicas=2",
            "message.timestamp.type=LogAppendTime",
        ];
        blocking(|| cluster.create_topic_assigned(&topic, layout, &configs));
        blocking(|| cluster.create_topic_assigned(&java_topic, layout, &configs));
        let mut java = blocking(|| {
            PlainProducer::start(
                &cluster.bootstrap(),
                &java_topic,
                JAVA_RATE,
                dir,
                &[&topic, &java_topic],
            )
        });
        blocking(|| java.wait_producing(Duration::from_secs(60)));
        progress(&format!(
            "topics {topic} and {java_topic} created, the Java producer runs; seeding {due} bookings due over {spread:?}"
        ));
        let mut conn = db.conn().await;
        db::seed::seed(
            &mut conn,
            &db::seed::SeedPlan {
                active: due,
                due_fraction: 0.0,
                inactive: 0,
                poison: 0,
                as_of: wall_now(),
                spread,
            },
        )
        .await
        .expect("seed");
        let metrics_addr = format!("127.0.0.1:{}", free_port());
        let bootstrap = cluster.bootstrap().join(",");
        let running = Running::spawn(run_command(
            &db.url,
            &bootstrap,
            &topic,
            &metrics_addr,
            cluster.profile(),
        ));
        progress("seeded; run started");
        Self {
            db,
            topic,
            java_topic,
            java,
            running,
            metrics_addr,
            bootstrap,
            profile: cluster.profile(),
            due: due as i64,
        }
    }

    /// `kill -9` of the `run` process; returns its stderr.
    async fn kill_worker(&mut self) -> String {
        let _ = self.running.child.kill();
        let _ = self.running.wait(Duration::from_secs(10)).await;
        self.running.stderr()
    }

    /// A new `run` process in place of one that was killed.
    fn start_worker(&mut self) {
        self.running = Running::spawn(run_command(
            &self.db.url,
            &self.bootstrap,
            &self.topic,
            &self.metrics_addr,
            self.profile,
        ));
    }

    async fn published_count(&self) -> i64 {
        self.db
            .count("SELECT count(*) AS n FROM booking_expiration_outbox WHERE published_at IS NOT NULL")
            .await
    }

    async fn expired_count(&self) -> i64 {
        self.db
            .count("SELECT count(*) AS n FROM bookings WHERE version = 2")
            .await
    }

    async fn wait_published(&self, at_least: i64, timeout: Duration) {
        wait_until(
            &format!("{at_least} rows published on {}", self.topic),
            timeout,
            || async { self.published_count().await >= at_least },
        )
        .await;
    }

    /// Waits until the watcher saw every partition of both topics in the
    /// state `ok` accepts (its latest observation); returns when it was seen.
    /// Waits until partition 0 has 2 in-sync replicas again (`when`, for
    /// the progress line), then 2 s for the first records after it (the
    /// goal is measured from the watcher's moment; a second covers it).
    /// Returns that moment and the end of the step.
    async fn partition_0_in_sync_again(&self, when: &str) -> (i64, i64) {
        let synced_at = self
            .wait_watched(
                &format!("partition 0 with 2 in-sync replicas {when}"),
                Duration::from_secs(120),
                |o| o.leader >= 0 && o.isr.len() >= 2,
            )
            .await;
        tokio::time::sleep(Duration::from_secs(2)).await;
        (synced_at, now_ms())
    }

    async fn wait_watched(
        &self,
        what: &str,
        timeout: Duration,
        ok: impl Fn(&Observed) -> bool,
    ) -> i64 {
        let deadline = Instant::now() + timeout;
        loop {
            let timelines = self.java.timelines().unwrap_or_default();
            let latest: Vec<&Observed> = timelines
                .iter()
                .filter(|((t, _), _)| *t == self.topic || *t == self.java_topic)
                .filter_map(|(_, v)| v.last())
                .collect();
            if latest.len() >= 2 && latest.iter().all(|o| ok(o)) {
                return latest.iter().map(|o| o.at_ms).max().unwrap_or_default();
            }
            assert!(
                Instant::now() < deadline,
                "{what}: not seen within {timeout:?}: {latest:?}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Stops the Java producer, then the binary (exit 0 expected) once
    /// everything is published.
    async fn finish(mut self) -> Finished {
        blocking(|| self.java.stop());
        let java_acks = blocking(|| self.java.acks());
        let timelines = blocking(|| self.java.timelines());
        let java_stderr = self.java.stderr();
        if let Some(line) = java_stderr
            .lines()
            .rev()
            .find(|l| l.starts_with("PlainProducer: ") && l.contains("acknowledged"))
        {
            progress(line);
        }
        progress("waiting until everything is published");
        self.wait_published(self.due, Duration::from_secs(180))
            .await;
        progress("all published");
        self.running.terminate();
        let status = self.running.wait(Duration::from_secs(30)).await;
        // To look at what the publisher did during a fault:
        // KAFKA_CLUSTER_LOG_DIR=… (with KAFKA_CLUSTER_RUST_LOG=…).
        if let Ok(dir) = std::env::var("KAFKA_CLUSTER_LOG_DIR") {
            let path = std::path::Path::new(&dir).join(format!("{}.log", self.topic));
            let _ = std::fs::write(path, self.running.stderr());
            let path = std::path::Path::new(&dir).join(format!("{}.log", self.java_topic));
            let _ = std::fs::write(path, java_stderr);
        }
        let log = self.running.stderr();
        if status.code() != Some(0) {
            panic!("run exited with {status:?}:\n{log}");
        }
        Finished {
            db: self.db,
            topic: self.topic,
            java_topic: self.java_topic,
            java_acks,
            timelines,
            log,
        }
    }
}

/// The `run` command of a flow.
fn run_command(
    database_url: &str,
    bootstrap: &str,
    topic: &str,
    metrics_addr: &str,
    profile: ClusterProfile,
) -> std::process::Command {
    let mut command = binary();
    command
        .arg("run")
        .env("DATABASE_URL", database_url)
        .env("KAFKA_BOOTSTRAP_SERVERS", bootstrap)
        .env("KAFKA_TOPIC", topic)
        .env("METRICS_ADDR", metrics_addr)
        .env(
            "RUST_LOG",
            std::env::var("KAFKA_CLUSTER_RUST_LOG")
                .unwrap_or_else(|_| "warn,booking_expiration::outbox=info".into()),
        );
    // The settings on the defaults cluster: otherwise the
    // binary's defaults.
    command.env(
        "EXPIRATION_INTERVAL",
        match profile {
            ClusterProfile::Tuned => "200ms",
            ClusterProfile::Defaults => "1s",
        },
    );
    command
}

/// A record as Kafka's Java consumer read it (`scripts/kafka.sh consume`).
struct Dumped {
    partition: i32,
    /// The broker's append time (epoch ms; the topics have
    /// `message.timestamp.type=LogAppendTime`).
    timestamp: i64,
    key: String,
    /// Base64, as dumped: equal text, equal bytes.
    value: String,
    ce_id: Option<String>,
}

/// Every record of `topic`, read by the Java client (an independent
/// reader) from the first node that answers.
fn dump_topic(cluster: &Cluster, topic: &str) -> Vec<Dumped> {
    progress(&format!("reading {topic} with the Java consumer"));
    let out = std::env::temp_dir().join(format!("{topic}.jsonl"));
    let path = out.to_str().expect("UTF-8 temp path").to_owned();
    let mut last_error = None;
    for node in 1..=3 {
        let port = cluster.port(node).to_string();
        let result = tokio::task::block_in_place(|| {
            testkit::run_script("kafka.sh", &["consume", &port, topic, &path, "0", "2000"])
        });
        match result {
            Ok(_) => {
                last_error = None;
                break;
            }
            Err(error) => last_error = Some(error),
        }
    }
    if let Some(error) = last_error {
        panic!("reading {topic}: {error:#}");
    }
    let text = std::fs::read_to_string(&out).expect("dumped records");
    let _ = std::fs::remove_file(&out);
    text.lines()
        .map(|line| {
            let v: serde_json::Value = serde_json::from_str(line).expect("a JSON line");
            Dumped {
                partition: v["partition"].as_i64().expect("partition") as i32,
                timestamp: v["timestamp"].as_i64().expect("timestamp"),
                key: v["key"].as_str().expect("a UTF-8 key").to_owned(),
                value: v["value"].as_str().unwrap_or_default().to_owned(),
                ce_id: v["headers"]["ce_id"].as_str().map(str::to_owned),
            }
        })
        .collect()
}

/// What [`check_topic`] found.
struct Checked {
    records: usize,
    /// Records beyond the first of their key.
    duplicates: usize,
    /// The most records of one key (1: no duplicate).
    most_copies: usize,
    /// Each key's partition.
    partition_of: HashMap<String, i32>,
    /// Per partition, the append times of every record (duplicates too),
    /// in order: the worker's acknowledgement times on the topic.
    appended: Acks,
}

impl Checked {
    fn summary(&self) -> String {
        format!(
            "{} records, {} duplicates (same ce_id and bytes), at most {} cop{} of one event",
            self.records,
            self.duplicates,
            self.most_copies,
            if self.most_copies == 1 { "y" } else { "ies" }
        )
    }
}

/// The invariant on the topic: every key once or more, duplicates with the
/// same `ce_id` and bytes, each record on the partition the Java client
/// computes for one of the partition counts `allowed(key)` returns.
fn check_topic(
    cluster: &Cluster,
    topic: &str,
    partitions: i32,
    due: i64,
    allowed: impl Fn(&str) -> Vec<i32>,
) -> Checked {
    let records = dump_topic(cluster, topic);
    let mut by_key: HashMap<String, Vec<&Dumped>> = HashMap::new();
    for r in &records {
        by_key.entry(r.key.clone()).or_default().push(r);
    }
    assert_eq!(by_key.len() as i64, due, "every booking on {topic}");
    let keys: Vec<String> = by_key.keys().cloned().collect();
    let counts: BTreeSet<i32> = keys.iter().flat_map(|k| allowed(k)).collect();
    let java: BTreeMap<i32, BTreeMap<String, i32>> = counts
        .iter()
        .map(|&n| (n, java_partitions(&keys, n)))
        .collect();
    let mut partition_of = HashMap::new();
    for (key, copies) in &by_key {
        for c in copies {
            assert!(c.ce_id.is_some(), "{key} has a ce_id header");
            assert_eq!(c.ce_id, copies[0].ce_id, "duplicates share ce_id");
            assert_eq!(c.value, copies[0].value, "duplicates share bytes");
            assert!(
                c.partition < partitions,
                "{key} on partition {}",
                c.partition
            );
            let choices: Vec<i32> = allowed(key).iter().map(|n| java[n][key]).collect();
            assert!(
                choices.contains(&c.partition),
                "{key} on partition {}, the Java client says {choices:?}",
                c.partition
            );
        }
        partition_of.insert(key.clone(), copies[0].partition);
    }
    let mut appended: Acks = BTreeMap::new();
    for r in &records {
        appended.entry(r.partition).or_default().push(r.timestamp);
    }
    for times in appended.values_mut() {
        times.sort_unstable();
    }
    Checked {
        records: records.len(),
        duplicates: records.len() - due as usize,
        most_copies: by_key.values().map(Vec::len).max().unwrap_or(0),
        partition_of,
        appended,
    }
}

/// Per partition, the worker's acknowledgement times (`published_at`,
/// epoch milliseconds) in order.
fn acks_by_partition(published: &[Published], partition_of: &HashMap<String, i32>) -> Acks {
    by_partition(published, partition_of, |p| p.published_at)
}

/// Per partition, when the expiry wrote the rows (`created_at`, epoch
/// milliseconds) in order: a gap here is a gap in what there was to
/// publish, not the publisher's.
fn written_by_partition(published: &[Published], partition_of: &HashMap<String, i32>) -> Acks {
    by_partition(published, partition_of, |p| p.created_at)
}

fn by_partition(
    published: &[Published],
    partition_of: &HashMap<String, i32>,
    at: impl Fn(&Published) -> DateTime<Utc>,
) -> Acks {
    let mut acks: Acks = BTreeMap::new();
    for p in published {
        acks.entry(partition_of[&p.message_key])
            .or_default()
            .push(at(p).timestamp_millis());
    }
    for times in acks.values_mut() {
        times.sort_unstable();
    }
    acks
}

/// The nodes the test took down: (node, down from, up from) in epoch ms.
#[derive(Default)]
struct Faults {
    down: Vec<(i32, i64, Option<i64>)>,
}

impl Faults {
    fn down(&mut self, node: i32, at: i64) {
        self.down.push((node, at, None));
    }

    fn up(&mut self, node: i32, at: i64) {
        if let Some(d) = self
            .down
            .iter_mut()
            .rev()
            .find(|d| d.0 == node && d.2.is_none())
        {
            d.2 = Some(at);
        }
    }

    fn alive(&self, node: i32, t: i64) -> bool {
        !self
            .down
            .iter()
            .any(|&(n, from, to)| n == node && t >= from && to.is_none_or(|to| t < to))
    }

    /// Writable per the issue: a live leader, at least 2 in-sync replicas,
    /// none of them dead (acks=all waits for every ISR member).
    fn writable(&self, state: &Observed, t: i64) -> bool {
        state.leader >= 0
            && self.alive(state.leader, t)
            && state.isr.len() >= 2
            && state.isr.iter().all(|&n| self.alive(n, t))
    }
}

/// One client's figures for one step.
struct Figures {
    /// The longest gap between two acknowledgements on the topic that
    /// overlaps the step.
    topic_gap: Duration,
    /// The same per partition.
    gaps: BTreeMap<i32, Duration>,
    /// When each partition's longest gap began, from the step's start.
    gap_at: BTreeMap<i32, Duration>,
    /// Per partition that was not writable at some moment of the step:
    /// each moment in the step it became writable again.
    resumes: BTreeMap<i32, Vec<Resume>>,
}

/// A partition writable again.
#[derive(Debug, Clone, Copy)]
struct Resume {
    /// When it was writable again (epoch ms).
    at: i64,
    /// From then to the first acknowledgement after it (None: none came).
    after: Option<Duration>,
}

fn ms(d: i64) -> Duration {
    Duration::from_millis(d.max(0) as u64)
}

/// The longest gap between consecutive times within `[from, to]`: a gap
/// that straddles a bound counts only its part inside, so a stall that
/// begins with the next step's fault is that step's, not this one's.
fn longest_gap(times: &[i64], from: i64, to: i64) -> Duration {
    longest_gap_at(times, from, to).0
}

/// [`longest_gap`] and when it began (epoch ms; `from` when none).
fn longest_gap_at(times: &[i64], from: i64, to: i64) -> (Duration, i64) {
    times
        .windows(2)
        .filter(|pair| pair[1] >= from && pair[0] <= to)
        .map(|pair| {
            let start = pair[0].max(from);
            (ms(pair[1].min(to) - start), start)
        })
        .max()
        .unwrap_or((Duration::ZERO, from))
}

/// One client's figures for the step `[from, to]` on `topic`; writable-again
/// moments after the client's last acknowledgement (it had published
/// everything) do not count.
fn measure(
    acks: &Acks,
    timelines: &Timelines,
    topic: &str,
    faults: &Faults,
    (from, to): (i64, i64),
) -> Figures {
    let mut all: Vec<i64> = acks.values().flatten().copied().collect();
    all.sort_unstable();
    let idle_after = all.last().copied().unwrap_or(i64::MIN);
    let partitions: BTreeSet<i32> = timelines
        .keys()
        .filter(|(t, _)| t == topic)
        .map(|(_, p)| *p)
        .chain(acks.keys().copied())
        .collect();
    let empty = Vec::new();
    let mut gaps = BTreeMap::new();
    let mut gap_at = BTreeMap::new();
    let mut resumes = BTreeMap::new();
    for p in partitions {
        let times = acks.get(&p).unwrap_or(&empty);
        let (gap, at) = longest_gap_at(times, from, to);
        gaps.insert(p, gap);
        gap_at.insert(p, ms(at - from));
        let timeline = timelines
            .get(&(topic.to_owned(), p))
            .map(Vec::as_slice)
            .unwrap_or_default();
        let writable_at = |t: i64| {
            timeline
                .iter()
                .take_while(|o| o.at_ms <= t)
                .last()
                .is_none_or(|o| faults.writable(o, t))
        };
        let mut moments: Vec<i64> = timeline
            .iter()
            .map(|o| o.at_ms)
            .chain(
                faults
                    .down
                    .iter()
                    .flat_map(|&(_, a, b)| std::iter::once(a).chain(b)),
            )
            .filter(|&t| t > from && t <= to)
            .collect();
        moments.sort_unstable();
        moments.dedup();
        let mut was = writable_at(from);
        let mut unwritable = !was;
        let mut again = Vec::new();
        for t in moments {
            let now = writable_at(t);
            if now && !was && t <= idle_after {
                let first = times.iter().find(|&&a| a >= t);
                again.push(Resume {
                    at: t,
                    after: first.map(|a| ms(a - t)),
                });
            }
            unwritable |= !now;
            was = now;
        }
        if unwritable {
            resumes.insert(p, again);
        }
    }
    Figures {
        topic_gap: longest_gap(&all, from, to),
        gaps,
        gap_at,
        resumes,
    }
}

fn secs2(d: Duration) -> String {
    format!("{:.2} s", d.as_secs_f64())
}

/// Each partition's longest gap, and when it began (from the step's
/// start) when it was half the goal or more.
fn render_gaps(f: &Figures) -> String {
    f.gaps
        .iter()
        .map(|(p, g)| match f.gap_at.get(p) {
            Some(at) if *g >= GOAL / 2 => format!("p{p} {} at +{}", secs2(*g), secs(*at)),
            _ => format!("p{p} {}", secs2(*g)),
        })
        .collect::<Vec<_>>()
        .join(", ")
}

fn render_resumes(f: &Figures) -> String {
    if f.resumes.is_empty() {
        return "always writable".into();
    }
    f.resumes
        .iter()
        .map(|(p, rs)| {
            if rs.is_empty() {
                format!("p{p} not writable again in this step")
            } else {
                let list: Vec<String> = rs
                    .iter()
                    .map(|r| r.after.map_or_else(|| "never".into(), secs2))
                    .collect();
                format!("p{p} {}", list.join("/"))
            }
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// Which gaps a step's goal is on, for the partitions that stayed writable
/// the whole step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum GapGoal {
    /// The measure for a fault of the whole cluster (a rolling
    /// step): the longest gap between records on the topic. Per-partition
    /// gaps are printed, not asserted: a partition whose new leader waits
    /// for a follower that just restarted acknowledges late for any client.
    Topic,
    /// A fault of one partition: each partition that stayed writable (a
    /// healthy one) on its own, without the excuse rule: the cluster kept
    /// it writable the whole step (its watcher says so), so nothing of the
    /// cluster's excuses a stall there. The Java producer's figure is
    /// printed beside it, and it can be long for a reason of its own: one
    /// request per broker carries every partition that broker leads, so
    /// its partition 2 (led by node 1 like partition 0) waits with
    /// partition 0's acks=all request.
    Partitions,
}

/// A goal the worker missed, with the Java producer's figure for the same
/// partition (or topic) at the same moment, when it has one.
struct Miss {
    what: String,
    worker: Duration,
    java: Option<Duration>,
    /// Whether the excuse rule applies at all (see [`GapGoal::Partitions`]).
    excusable: bool,
}

impl Miss {
    /// The excuse rule: the Java producer missed the same goal on the same
    /// partition in the same step (the cluster's doing), and the worker
    /// stayed within [`EXCUSE`] of it.
    fn excused(&self) -> bool {
        self.excusable
            && self
                .java
                .is_some_and(|j| j >= GOAL && self.worker <= j.saturating_add(EXCUSE))
    }

    fn java(&self) -> String {
        match self.java {
            Some(Duration::MAX) => "java never".into(),
            Some(j) => format!("java {}", secs2(j)),
            None => "java: no figure to compare".into(),
        }
    }
}

/// The Java producer's resume on `partition` nearest to the worker's
/// writable-again moment `at` (both topics have the same assignment, so
/// their moments differ by the watcher's poll at most; a second apart at
/// most counts as the same). `Duration::MAX`: it never resumed.
fn java_resume(java: &Figures, partition: i32, at: i64) -> Option<Duration> {
    java.resumes
        .get(&partition)?
        .iter()
        .filter(|r| (r.at - at).abs() <= 1_000)
        .min_by_key(|r| (r.at - at).abs())
        .map(|r| r.after.unwrap_or(Duration::MAX))
}

/// The figures of every step and the goals the worker missed.
#[derive(Default)]
struct Report {
    profile: &'static str,
    lines: Vec<String>,
    missed: Vec<String>,
}

impl Report {
    fn line(&mut self, line: String) {
        eprintln!("FIGURES kafka-cluster[{}]: {line}", self.profile);
        self.lines.push(format!("[{}] {line}", self.profile));
    }

    /// A goal of the worker alone (no Java figure to compare): printed,
    /// and counted when missed.
    fn goal(&mut self, name: &str, met: bool, what: String) {
        let verdict = if met { "met" } else { "MISSED" };
        self.line(format!("{name}: goal {verdict}: {what}"));
        if !met {
            self.missed
                .push(format!("[{}] {name}: {what}", self.profile));
        }
    }

    /// Prints the step's figures for both clients and checks the worker's
    /// against the goals: while writable, gaps (per `gap_goal`) < [`GOAL`];
    /// each time a partition is writable again, its next record < [`GOAL`]
    /// after. A miss is excused only by the rule of [`Miss::excused`].
    fn step(&mut self, name: &str, worker: &Figures, java: &Figures, gap_goal: GapGoal) {
        self.line(format!(
            "{name}: topic gap worker {}, java {}; partition gaps worker {}, java {}; \
             resumed after writable again worker {}, java {}",
            secs2(worker.topic_gap),
            secs2(java.topic_gap),
            render_gaps(worker),
            render_gaps(java),
            render_resumes(worker),
            render_resumes(java),
        ));
        let mut misses = Vec::new();
        match gap_goal {
            GapGoal::Topic => {
                if worker.resumes.is_empty() && worker.topic_gap >= GOAL {
                    misses.push(Miss {
                        what: format!(
                            "the topic stayed writable but publishing stalled {} (goal < {})",
                            secs2(worker.topic_gap),
                            secs2(GOAL)
                        ),
                        worker: worker.topic_gap,
                        java: java.resumes.is_empty().then_some(java.topic_gap),
                        excusable: true,
                    });
                }
            }
            GapGoal::Partitions => {
                for (p, gap) in &worker.gaps {
                    if worker.resumes.contains_key(p) || *gap < GOAL {
                        continue;
                    }
                    misses.push(Miss {
                        what: format!(
                            "partition {p} stayed writable but stalled {} (goal < {})",
                            secs2(*gap),
                            secs2(GOAL)
                        ),
                        worker: *gap,
                        java: (!java.resumes.contains_key(p))
                            .then(|| java.gaps.get(p).copied())
                            .flatten(),
                        excusable: false,
                    });
                }
            }
        }
        for (p, resumes) in &worker.resumes {
            for r in resumes {
                let what = match r.after {
                    Some(d) if d < GOAL => continue,
                    Some(d) => format!(
                        "partition {p} resumed {} after it was writable again (goal < {})",
                        secs2(d),
                        secs2(GOAL)
                    ),
                    None => format!("partition {p} did not resume after it was writable again"),
                };
                misses.push(Miss {
                    what,
                    worker: r.after.unwrap_or(Duration::MAX),
                    java: java_resume(java, *p, r.at),
                    excusable: true,
                });
            }
        }
        for miss in misses {
            if miss.excused() {
                self.line(format!(
                    "{name}: {}; {}, within {} of it: bound by the cluster, not counted",
                    miss.what,
                    miss.java(),
                    secs2(EXCUSE)
                ));
            } else {
                self.missed.push(format!(
                    "[{}] {name}: {} ({})",
                    self.profile,
                    miss.what,
                    miss.java()
                ));
            }
        }
    }
}

/// Both clients' figures of `window` on the finished flow.
fn both(
    fin: &Finished,
    worker_acks: &Acks,
    faults: &Faults,
    window: (i64, i64),
) -> (Figures, Figures) {
    (
        measure(worker_acks, &fin.timelines, &fin.topic, faults, window),
        measure(
            &fin.java_acks,
            &fin.timelines,
            &fin.java_topic,
            faults,
            window,
        ),
    )
}

/// Waits until every partition of `topic` has a leader and all three
/// replicas in sync (a restarted broker caught up).
async fn wait_in_sync(cluster: &Cluster, topic: &str, timeout: Duration) {
    let deadline = Instant::now() + timeout;
    loop {
        let state = tokio::task::block_in_place(|| cluster.describe(topic));
        if let Ok(state) = &state
            && !state.is_empty()
            && state.iter().all(|p| p.leader >= 0 && p.isr.len() == 3)
        {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{topic} not in sync after {timeout:?}: {state:?}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

fn in_sync(o: &Observed) -> bool {
    o.leader >= 0 && o.isr.len() == 3
}

async fn readyz(addr: &str) -> Option<u16> {
    http_get(addr, "/readyz").await.map(|r| r.0)
}

/// Progress on the process's stderr at once (the scenarios take minutes).
fn progress(what: &str) {
    use std::io::Write;
    let _ = writeln!(
        std::io::stderr(),
        "kafka_cluster {}: {what}",
        wall_now().format("%H:%M:%S%.3f")
    );
}

fn secs(d: Duration) -> String {
    format!("{:.1} s", d.as_secs_f64())
}

async fn sleep_until_ms(t: i64) {
    let left = t - now_ms();
    if left > 0 {
        tokio::time::sleep(ms(left)).await;
    }
}

/// The scenarios on the tuned cluster, then on the defaults one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "sub-second goals: scripts/test.sh runs it alone after the suite"]
async fn three_brokers_under_faults() {
    let started = Instant::now();
    // KAFKA_CLUSTER_SCENARIOS=rolling,… / KAFKA_CLUSTER_PROFILES=defaults
    // run only those (to iterate on one).
    let pick = |var: &str| std::env::var(var).ok();
    let (scenarios, profiles) = (
        pick("KAFKA_CLUSTER_SCENARIOS"),
        pick("KAFKA_CLUSTER_PROFILES"),
    );
    // Scenarios whose goals do not depend on the broker's timing run on the
    // first cluster of the run only.
    let mut once_done = false;
    let wanted = |list: &Option<String>, name: &str| {
        list.as_deref()
            .is_none_or(|o| o.split(',').any(|s| s == name))
    };
    let mut lines = Vec::new();
    let mut missed = Vec::new();
    for profile in [ClusterProfile::Tuned, ClusterProfile::Defaults] {
        if !wanted(&profiles, profile.as_str()) {
            continue;
        }
        let dir = tempdir(&format!("kafka-cluster-{}", profile.as_str()));
        let cluster_started = Instant::now();
        let cluster = blocking(|| Cluster::start_with(&dir, profile));
        progress(&format!(
            "{} cluster started in {}",
            profile.as_str(),
            secs(cluster_started.elapsed())
        ));
        let files = dir.join("plain");
        std::fs::create_dir_all(&files).expect("a folder for the Java producer's files");
        let mut report = Report {
            profile: profile.as_str(),
            ..Report::default()
        };
        if wanted(&scenarios, "kill") {
            leader_killed(&cluster, &files, &mut report).await;
        }
        if wanted(&scenarios, "rolling") {
            rolling_restart(&cluster, &files, &mut report).await;
        }
        if wanted(&scenarios, "down") {
            two_brokers_down(&cluster, &files, &mut report).await;
        }
        if !once_done && wanted(&scenarios, "partitions") {
            partitions_added(&cluster, &files, &mut report).await;
        }
        if !once_done && wanted(&scenarios, "worker-kill") {
            worker_killed(&cluster, &files, &mut report).await;
        }
        once_done = true;
        if profile == ClusterProfile::Defaults && wanted(&scenarios, "unwritable") {
            one_partition_unwritable(&cluster, &files, &mut report).await;
        }
        if profile == ClusterProfile::Defaults && wanted(&scenarios, "slow") {
            one_partition_slow(&cluster, &files, &mut report).await;
        }
        report.line(format!(
            "cluster and its scenarios took {}",
            secs(cluster_started.elapsed())
        ));
        drop(cluster);
        keep_logs(&dir, profile);
        let _ = std::fs::remove_dir_all(&dir);
        lines.append(&mut report.lines);
        missed.append(&mut report.missed);
    }
    for line in &lines {
        eprintln!("FIGURES kafka-cluster: {line}");
    }
    eprintln!(
        "FIGURES kafka-cluster: module total {}",
        secs(started.elapsed())
    );
    assert!(
        missed.is_empty(),
        "the worker missed {} goal(s):\n{}",
        missed.len(),
        missed.join("\n")
    );
}

/// What one claim of the worker costs now, as the pipeline asks it while
/// partition 0 of `topic` (3 partitions) holds its share: the claim
/// statement itself under `EXPLAIN (ANALYZE, BUFFERS)`, rolled back (the
/// rows it leases for that moment are skipped by the worker's own claim).
async fn claim_cost(db: &TestDb, topic: &str) -> String {
    let room = |partition| db::outbox::PartitionRoom {
        topic: topic.to_owned(),
        count: 3,
        partition,
        room: 500,
    };
    let claim = db::outbox::Claim {
        limit: 500,
        lease: Timing::default().lease,
        routed_topics: vec![db::outbox::RoutedTopic {
            topic: topic.to_owned(),
            count: 3,
        }],
        partitions: vec![room(1), room(2)],
        ..Default::default()
    };
    let mut conn = db.conn().await;
    let _ = diesel::sql_query("BEGIN").execute(&mut conn).await;
    let plan = db::outbox::explain_claim(&mut conn, &claim, "(ANALYZE, BUFFERS)").await;
    let _ = diesel::sql_query("ROLLBACK").execute(&mut conn).await;
    let plan: Vec<String> = match plan {
        Ok(lines) => lines,
        Err(error) => return format!("EXPLAIN failed: {error}"),
    };
    let field = |prefix: &str| -> Vec<String> {
        plan.iter()
            .filter_map(|line| {
                let at = line.find(prefix)?;
                Some(line[at + prefix.len()..].trim().to_owned())
            })
            .collect()
    };
    let removed: u64 = field("Rows Removed by Filter:")
        .iter()
        .filter_map(|n| n.parse::<u64>().ok())
        .max()
        .unwrap_or(0);
    // "Update on … (actual time=… rows=N loops=1)": the rows claimed.
    let claimed = <[_]>::first(&plan)
        .and_then(|line| line.split("actual").nth(1))
        .and_then(|a| a.split("rows=").nth(1))
        .and_then(|r| r.split_whitespace().next())
        .unwrap_or("?")
        .to_owned();
    format!(
        "{claimed} rows claimed, {removed} passed over, {}, buffers {}",
        <[_]>::first(&field("Execution Time:"))
            .cloned()
            .unwrap_or_default(),
        field("Buffers:").into_iter().next().unwrap_or_default(),
    )
}

/// The statements running in the database of `db`, sampled from
/// `pg_stat_activity` every 100 ms by a task of its own until
/// [`Activity::stop`]: what the worker's database rounds and expiry
/// cycles were doing around a fault.
struct Activity {
    stop: tokio_util::sync::CancellationToken,
    task: tokio::task::JoinHandle<Vec<SeenStatement>>,
}

/// One statement seen running: backend, start (epoch ms), last seen
/// running (epoch ms), its first characters.
#[derive(Debug, Clone, QueryableByName)]
struct SeenStatement {
    #[diesel(sql_type = diesel::sql_types::Integer)]
    pid: i32,
    #[diesel(sql_type = diesel::sql_types::BigInt)]
    started: i64,
    #[diesel(sql_type = diesel::sql_types::BigInt)]
    at: i64,
    #[diesel(sql_type = Text)]
    query: String,
}

impl Activity {
    async fn start(db: &TestDb) -> Self {
        let mut conn = db.conn().await;
        let stop = tokio_util::sync::CancellationToken::new();
        let token = stop.clone();
        let task = tokio::spawn(async move {
            let mut seen: Vec<SeenStatement> = Vec::new();
            while !token.is_cancelled() {
                let rows: Vec<SeenStatement> = diesel::sql_query(
                    "SELECT pid, (extract(epoch FROM query_start) * 1000)::bigint AS started, \
                            (extract(epoch FROM clock_timestamp()) * 1000)::bigint AS at, \
                            left(regexp_replace(query, '\\s+', ' ', 'g'), 70) AS query \
                       FROM pg_stat_activity \
                      WHERE datname = current_database() AND pid <> pg_backend_pid() \
                        AND state = 'active' AND query_start IS NOT NULL",
                )
                .load(&mut conn)
                .await
                .unwrap_or_default();
                for row in rows {
                    match seen
                        .iter_mut()
                        .find(|s| s.pid == row.pid && s.started == row.started)
                    {
                        Some(s) => s.at = row.at,
                        None => seen.push(row),
                    }
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            seen
        });
        Self { stop, task }
    }

    /// The `n` longest statements seen, as "+OFFSET LASTED QUERY" with the
    /// offset from `from`.
    async fn stop(self, from: i64, n: usize) -> String {
        self.stop.cancel();
        let mut seen = self.task.await.unwrap_or_default();
        seen.sort_by_key(|s| std::cmp::Reverse(s.at - s.started));
        seen.iter()
            .take(n)
            .map(|s| {
                format!(
                    "+{} {} {}",
                    secs(ms(s.started - from)),
                    secs2(ms(s.at - s.started)),
                    s.query
                )
            })
            .collect::<Vec<_>>()
            .join(" | ")
    }
}

/// CPU time (clock ticks, 1/100 s) of the PostgreSQL server of `db` so
/// far: its postmaster and the children alive now (the worker's pooled
/// connections live as long as it does).
async fn pg_cpu_ticks(db: &TestDb) -> u64 {
    let dir = db
        .names("SELECT current_setting('data_directory') AS name")
        .await;
    let Some(pid) = <[_]>::first(&dir).and_then(|d| {
        std::fs::read_to_string(format!("{d}/postmaster.pid"))
            .ok()?
            .lines()
            .next()?
            .trim()
            .parse::<u32>()
            .ok()
    }) else {
        return 0;
    };
    let mut ticks = 0;
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
            continue;
        };
        // pid (comm) state ppid … utime stime: fields after the comm's ')'.
        let Some(rest) = stat.rsplit_once(") ").map(|(_, r)| r) else {
            continue;
        };
        let fields: Vec<&str> = rest.split_whitespace().collect();
        let this: u32 = entry.file_name().to_string_lossy().parse().unwrap_or(0);
        let ppid: u32 = fields.get(1).and_then(|f| f.parse().ok()).unwrap_or(0);
        if this == pid || ppid == pid {
            let cpu = |i: usize| {
                fields
                    .get(i)
                    .and_then(|f| f.parse::<u64>().ok())
                    .unwrap_or(0)
            };
            ticks += cpu(11) + cpu(12);
        }
    }
    ticks
}

/// CPU time (clock ticks) of process `pid` so far.
fn cpu_ticks(pid: u32) -> u64 {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return 0;
    };
    let Some((_, rest)) = stat.rsplit_once(") ") else {
        return 0;
    };
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let cpu = |i: usize| {
        fields
            .get(i)
            .and_then(|f| f.parse::<u64>().ok())
            .unwrap_or(0)
    };
    cpu(11) + cpu(12)
}

/// CPU use in percent of one core from `ticks` over `ms` milliseconds.
fn cpu_pct(ticks: u64, ms: i64) -> String {
    format!("{:.0}%", ticks as f64 * 1000.0 / ms.max(1) as f64)
}

/// The worker's log lines at WARN or ERROR (JSON or text format).
fn warn_error_lines(log: &str) -> usize {
    log.lines()
        .filter(|l| {
            [
                "\"level\":\"WARN\"",
                "\"level\":\"ERROR\"",
                " WARN ",
                " ERROR ",
            ]
            .iter()
            .any(|m| l.contains(m))
        })
        .count()
}

/// The resident memory of a process, sampled from `/proc/PID/status`
/// every 500 ms on a thread of its own until [`RssSampler::stop`].
struct RssSampler {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<Vec<(i64, i64)>>>,
}

impl RssSampler {
    fn start(pid: u32) -> Self {
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flag = std::sync::Arc::clone(&stop);
        let thread = std::thread::spawn(move || {
            let mut samples = Vec::new();
            while !std::sync::atomic::AtomicBool::load(&flag, std::sync::atomic::Ordering::Relaxed)
            {
                if let Some(kib) = rss_kib(pid) {
                    samples.push((now_ms(), kib));
                }
                std::thread::sleep(Duration::from_millis(500));
            }
            samples
        });
        Self {
            stop,
            thread: Some(thread),
        }
    }

    /// Stops sampling; returns (epoch ms, KiB) in order.
    fn stop(mut self) -> Vec<(i64, i64)> {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        self.thread
            .take()
            .and_then(|t| t.join().ok())
            .unwrap_or_default()
    }
}

/// `VmRSS` of `/proc/PID/status`, in KiB.
fn rss_kib(pid: u32) -> Option<i64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()
}

fn mib(kib: i64) -> String {
    format!("{:.1} MiB", kib as f64 / 1024.0)
}

/// With `KAFKA_CLUSTER_LOG_DIR=…`: the brokers' logs and the watcher's
/// files of the cluster in `dir` are copied there (`PROFILE-nodeN.log`,
/// `PROFILE-TOPIC.watch`) before the folder is removed.
fn keep_logs(dir: &Path, profile: ClusterProfile) {
    let Ok(to) = std::env::var("KAFKA_CLUSTER_LOG_DIR") else {
        return;
    };
    let to = Path::new(&to);
    let profile = profile.as_str();
    for node in 1..=3 {
        let _ = std::fs::copy(
            dir.join(format!("node{node}/kafka.log")),
            to.join(format!("{profile}-node{node}.log")),
        );
    }
    for entry in std::fs::read_dir(dir.join("plain"))
        .into_iter()
        .flatten()
        .flatten()
    {
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.ends_with(".watch") {
            let _ = std::fs::copy(entry.path(), to.join(format!("{profile}-{name}")));
        }
    }
}

/// Invariant: the leader of partition 0 killed with `kill -9` mid-publish:
/// nothing lost. Goal: every partition publishes again < 1 s after it is
/// writable again (the new leader elected, or the ISR shrunk without the
/// dead follower). The node is launched again once the cluster fenced it.
async fn leader_killed(cluster: &Cluster, files: &Path, report: &mut Report) {
    let flow = Flow::start(cluster, files, &rf3_layout(), Duration::from_secs(30)).await;
    let due = flow.due;
    flow.wait_published(3_000, Duration::from_secs(60)).await;
    let leader = blocking(|| cluster.describe(&flow.topic))[0].leader;
    let mut faults = Faults::default();
    // Dead from before the command (conservative for "writable"); figures
    // "after the kill" count from its return (`kill -9`, then waiting
    // until the process is gone; starting the script takes a second or two).
    let killed_at = now_ms();
    blocking(|| cluster.kill(leader));
    faults.down(leader, killed_at);
    let kill_returned = now_ms();
    progress(&format!("node {leader} (leader of partition 0) killed"));
    let left = due - flow.published_count().await;
    let clear_at = flow
        .wait_watched(
            &format!("node {leader} out of every leadership and ISR"),
            Duration::from_secs(90),
            |o| o.leader >= 0 && o.leader != leader && !o.isr.contains(&leader),
        )
        .await;
    progress(&format!(
        "node {leader} out of every leadership and ISR {} after the kill",
        secs(ms(clear_at - kill_returned))
    ));
    tokio::time::sleep(Duration::from_secs(2)).await;
    let to = now_ms();
    blocking(|| cluster.launch_node(leader));
    faults.up(leader, now_ms());
    let fin = flow.finish().await;
    wait_in_sync(cluster, &fin.topic, Duration::from_secs(120)).await;
    let checked = check_topic(cluster, &fin.topic, 3, due, |_| vec![3]);
    let worker_acks = &checked.appended;
    let (w, j) = both(&fin, worker_acks, &faults, (killed_at, to));
    report.step(
        &format!(
            "kill -9 of leader node {leader} ({left} of {due} rows to publish; out of every \
             leadership and ISR {} after the kill)",
            secs(ms(clear_at - kill_returned))
        ),
        &w,
        &j,
        GapGoal::Topic,
    );
    report.line(format!("kill: {}", checked.summary()));
    assert!(
        left > 1_000,
        "the kill came too late to measure ({left} rows left)"
    );
}

impl Flow {
    async fn published_of(db: &TestDb) -> Vec<Published> {
        let mut conn = db.conn().await;
        diesel::sql_query(
            "SELECT message_key, published_at, created_at, \
                    coalesce(claimed_until - $1 * interval '1 millisecond', published_at) AS claimed_at \
               FROM booking_expiration_outbox \
              WHERE published_at IS NOT NULL ORDER BY published_at",
        )
        .bind::<diesel::sql_types::BigInt, _>(Timing::default().lease.as_millis() as i64)
        .load(&mut conn)
        .await
        .expect("published rows")
    }
}

/// Invariant: each broker in turn stopped with SIGTERM (controlled
/// shutdown, until it exited), launched again 2 s later without waiting
/// for it, the next one 4 s after that, while publishing: nothing lost.
/// Goal per step: a topic that stayed writable stalls < 1 s; a partition left
/// with fewer than 2 in-sync replicas (the next node stopped before the
/// restarted one rejoined) publishes again < 1 s after it is writable again.
async fn rolling_restart(cluster: &Cluster, files: &Path, report: &mut Report) {
    let flow = Flow::start(cluster, files, &rf3_layout(), Duration::from_secs(60)).await;
    let due = flow.due;
    flow.wait_published(2_000, Duration::from_secs(60)).await;
    let quiet_from = now_ms();
    // Deliberate fault timing: some publishing without a fault, to compare.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let mut faults = Faults::default();
    let mut steps = Vec::new();
    for node in 1..=3 {
        let from = now_ms();
        let t = Instant::now();
        blocking(|| cluster.stop_node(node));
        let stop_took = t.elapsed();
        let exited = now_ms();
        faults.down(node, exited);
        progress(&format!("node {node} stopped in {}", secs(stop_took)));
        sleep_until_ms(exited + RELAUNCH_AFTER.as_millis() as i64).await;
        let launched = now_ms();
        blocking(|| cluster.launch_node(node));
        faults.up(node, launched);
        let left = due - flow.published_count().await;
        steps.push((node, from, stop_took, left));
        sleep_until_ms(launched + NEXT_STEP_AFTER.as_millis() as i64).await;
    }
    let synced_at = flow
        .wait_watched(
            "all replicas in sync after the rolling restart",
            Duration::from_secs(120),
            in_sync,
        )
        .await;
    progress(&format!(
        "all replicas in sync {} after the last step began",
        secs(ms(synced_at - steps[2].1))
    ));
    let end = synced_at.max(now_ms());
    let fin = flow.finish().await;
    let checked = check_topic(cluster, &fin.topic, 3, due, |_| vec![3]);
    let worker_acks = &checked.appended;
    for (i, (node, from, stop_took, left)) in steps.iter().enumerate() {
        let to = steps.get(i + 1).map_or(end, |s| s.1);
        let (w, j) = both(&fin, worker_acks, &faults, (*from, to));
        report.step(
            &format!(
                "rolling node {node} (shutdown took {}, {left} rows left at its relaunch, step {})",
                secs(*stop_took),
                secs(ms(to - from))
            ),
            &w,
            &j,
            GapGoal::Topic,
        );
    }
    let (w, j) = both(
        &fin,
        worker_acks,
        &Faults::default(),
        (quiet_from, steps[0].1),
    );
    report.line(format!(
        "rolling: in the 5 s before, without a fault: topic gap worker {}, java {}; partition gaps worker {}, java {}; \
         {}",
        secs2(w.topic_gap),
        secs2(j.topic_gap),
        render_gaps(&w),
        render_gaps(&j),
        checked.summary(),
    ));
    assert!(
        steps[0].3 > 0,
        "the flow ended before the first restart step finished"
    );
}

/// Invariant: two of three brokers down (produces fail with
/// NOT_ENOUGH_REPLICAS): rows wait in the outbox, `/readyz` is 503, the
/// worker keeps expiring; both started again after about 10 s, publishing
/// resumes by itself and nothing is lost. Goal: each partition publishes
/// again < 1 s after it has enough in-sync replicas again.
async fn two_brokers_down(cluster: &Cluster, files: &Path, report: &mut Report) {
    let flow = Flow::start(cluster, files, &rf3_layout(), Duration::from_secs(45)).await;
    let due = flow.due;
    flow.wait_published(2_000, Duration::from_secs(60)).await;
    wait_http_status(&flow.metrics_addr, "/readyz", 200, Duration::from_secs(30)).await;
    let mut faults = Faults::default();
    let from = now_ms();
    for node in [2, 3] {
        blocking(|| cluster.stop_node(node));
        faults.down(node, now_ms());
    }
    progress("nodes 2 and 3 stopped");
    let down_at = Instant::now();
    wait_http_status(&flow.metrics_addr, "/readyz", 503, Duration::from_secs(30)).await;
    let not_ready_after = down_at.elapsed();
    // Whatever was in flight settles, then nothing more gets published.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let (published_before, expired_before) =
        (flow.published_count().await, flow.expired_count().await);
    // Deliberate fault timing: the outage lasts about DOWN_FOR.
    let rest = DOWN_FOR.saturating_sub(down_at.elapsed());
    tokio::time::sleep(rest.max(Duration::from_secs(2))).await;
    let (published_after, expired_after) =
        (flow.published_count().await, flow.expired_count().await);
    assert_eq!(
        readyz(&flow.metrics_addr).await,
        Some(503),
        "/readyz during the outage"
    );
    assert_eq!(
        published_after, published_before,
        "nothing is acknowledged without min.insync.replicas"
    );
    assert!(
        expired_after > expired_before,
        "the worker keeps expiring ({expired_before} -> {expired_after})"
    );
    let errors = produce_error_codes(&flow.metrics_addr).await;
    let outage = down_at.elapsed();
    for node in [2, 3] {
        blocking(|| cluster.launch_node(node));
        faults.up(node, now_ms());
    }
    progress("nodes 2 and 3 launched");
    let back_at = Instant::now();
    wait_until("publishing resumes", Duration::from_secs(120), || async {
        flow.published_count().await > published_after
    })
    .await;
    let resumed_after = back_at.elapsed();
    let synced_at = flow
        .wait_watched(
            "all replicas in sync after two brokers were down",
            Duration::from_secs(120),
            in_sync,
        )
        .await;
    wait_http_status(&flow.metrics_addr, "/readyz", 200, Duration::from_secs(60)).await;
    let ready_after = back_at.elapsed();
    let end = synced_at.max(now_ms());
    let fin = flow.finish().await;
    let checked = check_topic(cluster, &fin.topic, 3, due, |_| vec![3]);
    let worker_acks = &checked.appended;
    let (w, j) = both(&fin, worker_acks, &faults, (from, end));
    report.step(
        &format!(
            "two brokers down (outage {}, {} rows waiting, both launched again)",
            secs(outage),
            due - published_after
        ),
        &w,
        &j,
        GapGoal::Topic,
    );
    report.line(format!(
        "two brokers down: /readyz 503 after {}, worker expired {} meanwhile, produce errors {errors:?}; \
         publishing resumed {} and /readyz 200 {} after the launches; {}",
        secs(not_ready_after),
        expired_after - expired_before,
        secs(resumed_after),
        secs(ready_after),
        checked.summary(),
    ));
}

/// The `crm_booking_expiration_outbox_produce_errors_total` lines.
async fn produce_error_codes(addr: &str) -> Vec<String> {
    let Some((_, body)) = http_get(addr, "/metrics").await else {
        return Vec::new();
    };
    body.lines()
        .filter(|l| l.starts_with("crm_booking_expiration_outbox_produce_errors_total{"))
        .map(|l| {
            l.trim_start_matches("crm_booking_expiration_outbox_produce_errors_total")
                .to_owned()
        })
        .collect()
}

/// Invariant: partitions added to the topic while publishing: records use
/// the new count at most `METADATA_MAX_AGE` (plus one call) after the
/// change, the old one before it; nothing lost.
async fn partitions_added(cluster: &Cluster, files: &Path, report: &mut Report) {
    let flow = Flow::start(cluster, files, &rf3_layout(), Duration::from_secs(20)).await;
    let due = flow.due;
    flow.wait_published(2_000, Duration::from_secs(60)).await;
    let before = wall_now();
    blocking(|| cluster.add_partitions(1, &flow.topic, 6));
    progress("partitions added");
    let after = wall_now();
    let left = due - flow.published_count().await;
    let fin = flow.finish().await;
    let published = Flow::published_of(&fin.db).await;
    let at: HashMap<String, DateTime<Utc>> = published
        .iter()
        .map(|p| (p.message_key.clone(), p.published_at))
        .collect();
    // Either count is right for a record acknowledged within one metadata
    // refresh (plus the call in flight, 3 s) of the change.
    let bound =
        chrono::Duration::from_std(Timing::default().metadata_max_age + Duration::from_secs(3))
            .expect("bound");
    let checked = check_topic(cluster, &fin.topic, 6, due, |key| {
        let t = at[key];
        if t < before {
            vec![3]
        } else if t > after + bound {
            vec![6]
        } else {
            vec![3, 6]
        }
    });
    let first_new = published
        .iter()
        .filter(|p| checked.partition_of[&p.message_key] >= 3)
        .map(|p| p.published_at)
        .min()
        .expect("records on the new partitions");
    let picked_up = (first_new - after).to_std().unwrap_or_default();
    report.line(format!(
        "partitions 3 -> 6 with {left} rows to publish: first record on a new partition {} after the change \
         (bound {} + one call); {}",
        secs(picked_up),
        secs(Timing::default().metadata_max_age),
        checked.summary(),
    ));
    assert!(
        left > 5_000,
        "the change came too late to measure ({left} rows left)"
    );
}

/// The watcher's view of `partition` of `topic` within `[from, to]`, for
/// the figures: "+12.3 s leader 1 isr 1,2; …" relative to `from`.
fn render_timeline(
    timelines: &Timelines,
    topic: &str,
    partition: i32,
    from: i64,
    to: i64,
) -> String {
    let Some(timeline) = timelines.get(&(topic.to_owned(), partition)) else {
        return "not watched".into();
    };
    let mut shown: Vec<String> = Vec::new();
    for o in timeline {
        if o.at_ms > to {
            break;
        }
        let isr: Vec<String> = o.isr.iter().map(i32::to_string).collect();
        let state = format!("leader {} isr {}", o.leader, isr.join(","));
        if o.at_ms <= from {
            shown = vec![format!("before: {state}")];
        } else {
            shown.push(format!("+{} {state}", secs(ms(o.at_ms - from))));
        }
    }
    shown.join("; ")
}

/// Prints, for the step `window`, the longest gaps per partition in what
/// the expiry wrote (`created_at`: a publishing gap with no writing gap
/// under it is the publisher's) and in what the outbox marked published
/// (`published_at`: the database round after the acknowledgement, so
/// later than the broker's append by as long as the round in flight took).
fn written_line(
    report: &mut Report,
    name: &str,
    fin: &Finished,
    published: &[Published],
    checked: &Checked,
    window: (i64, i64),
) {
    let no_faults = Faults::default();
    let written = written_by_partition(published, &checked.partition_of);
    let written = measure(&written, &fin.timelines, &fin.topic, &no_faults, window);
    let marked = acks_by_partition(published, &checked.partition_of);
    let marked = measure(&marked, &fin.timelines, &fin.topic, &no_faults, window);
    let claimed = by_partition(published, &checked.partition_of, |p| p.claimed_at);
    let claimed = measure(&claimed, &fin.timelines, &fin.topic, &no_faults, window);
    report.line(format!(
        "{name}: longest gaps per partition in the rows the expiry wrote: {}; \
         in the rows claimed (last lease taken): {}; in the rows marked published: {}",
        render_gaps(&written),
        render_gaps(&claimed),
        render_gaps(&marked)
    ));
}

/// The first scenario, on the defaults cluster: on a topic with
/// replication factor 2 and `min.insync.replicas=2` ([`p0_alone_layout`]),
/// partition 0's only follower stopped with SIGTERM for
/// [`UNWRITABLE_FOR`], then started again: partition 0 refuses writes
/// (NOT_ENOUGH_REPLICAS) while partitions 1 and 2 stay writable.
/// Invariant: every booking on the topic, duplicates with the same `ce_id`
/// and bytes. Goals: partitions 1 and 2 never stall 1 s; no event written
/// more than twice; the worker's resident memory flat (the last sample of
/// the outage at most [`RSS_BOUND_KIB`] above the first after
/// [`RSS_WARM_UP`]); partition 0 publishes again < 1 s after it is
/// writable.
async fn one_partition_unwritable(cluster: &Cluster, files: &Path, report: &mut Report) {
    const NAME: &str = "one partition unwritable";
    // Bookings keep falling due until after node 2 rejoined.
    let flow = Flow::start(
        cluster,
        files,
        &p0_alone_layout(),
        UNWRITABLE_FOR + Duration::from_secs(40),
    )
    .await;
    let due = flow.due;
    flow.wait_published(2_000, Duration::from_secs(60)).await;
    let pid = flow.running.child.id();
    let quiet_from = now_ms();
    let (pg_quiet, worker_quiet) = (pg_cpu_ticks(&flow.db).await, cpu_ticks(pid));
    // Deliberate fault timing: some publishing without a fault, to compare.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let mut faults = Faults::default();
    let from = now_ms();
    let (pg_from, worker_from) = (pg_cpu_ticks(&flow.db).await, cpu_ticks(pid));
    let claim_before = claim_cost(&flow.db, &flow.topic).await;
    let rss_before = rss_kib(pid).unwrap_or_default();
    let t = Instant::now();
    blocking(|| cluster.stop_node(P0_FOLLOWER));
    let stop_took = t.elapsed();
    let stopped = now_ms();
    faults.down(P0_FOLLOWER, stopped);
    progress(&format!(
        "node {P0_FOLLOWER} (partition 0's only follower) stopped in {}",
        secs(stop_took)
    ));
    let rss = RssSampler::start(pid);
    let published_at_stop = flow.published_count().await;
    let (pg_stopped, worker_stopped) = (pg_cpu_ticks(&flow.db).await, cpu_ticks(pid));
    // The scenario's definition: unwritable this long.
    sleep_until_ms(stopped + UNWRITABLE_FOR.as_millis() as i64 - 2_000).await;
    let claim_late = claim_cost(&flow.db, &flow.topic).await;
    sleep_until_ms(stopped + UNWRITABLE_FOR.as_millis() as i64).await;
    let (pg_late, worker_late) = (pg_cpu_ticks(&flow.db).await, cpu_ticks(pid));
    let late = now_ms();
    let samples = rss.stop();
    let published_in_outage = flow.published_count().await - published_at_stop;
    let waiting = due - flow.published_count().await;
    let errors = produce_error_codes(&flow.metrics_addr).await;
    let activity = Activity::start(&flow.db).await;
    let launched = now_ms();
    blocking(|| cluster.launch_node(P0_FOLLOWER));
    faults.up(P0_FOLLOWER, launched);
    progress(&format!("node {P0_FOLLOWER} launched again"));
    let (synced_at, end) = flow.partition_0_in_sync_again("again").await;
    let statements = activity.stop(from, 8).await;
    let fin = flow.finish().await;
    let checked = check_topic(cluster, &fin.topic, 3, due, |_| vec![3]);
    let published = Flow::published_of(&fin.db).await;
    let worker_acks = &checked.appended;
    let (w, j) = both(&fin, worker_acks, &faults, (from, end));
    written_line(report, NAME, &fin, &published, &checked, (from, end));
    report.step(
        &format!(
            "{NAME} (node {P0_FOLLOWER} stopped in {}, down {}, in sync again {} after its launch)",
            secs(stop_took),
            secs(ms(launched - stopped)),
            secs(ms(synced_at - launched))
        ),
        &w,
        &j,
        GapGoal::Partitions,
    );
    let (qw, qj) = both(&fin, worker_acks, &Faults::default(), (quiet_from, from));
    report.line(format!(
        "{NAME}: in the 3 s before, without a fault: partition gaps worker {}, java {}",
        render_gaps(&qw),
        render_gaps(&qj)
    ));
    report.line(format!(
        "{NAME}: partition 0 as the watcher saw it: {}",
        render_timeline(&fin.timelines, &fin.topic, 0, from, end)
    ));
    report.line(format!(
        "{NAME}: the longest statements from the launch on: {statements}"
    ));
    report.line(format!(
        "{NAME}: CPU of PostgreSQL / of the worker: {} / {} in the 3 s before, {} / {} during the outage; \
         one claim (partition 0 left out) before the stop: {claim_before}; 2 s before the end: {claim_late}",
        cpu_pct(pg_from.saturating_sub(pg_quiet), from - quiet_from),
        cpu_pct(worker_from.saturating_sub(worker_quiet), from - quiet_from),
        cpu_pct(pg_late.saturating_sub(pg_stopped), late - stopped),
        cpu_pct(worker_late.saturating_sub(worker_stopped), late - stopped),
    ));
    report.line(format!(
        "{NAME}: during the outage the worker published {published_in_outage} rows \
         (partitions 1 and 2) while {waiting} waited at its end; produce errors {errors:?}; \
         {} WARN/ERROR log lines in the whole flow",
        warn_error_lines(&fin.log)
    ));
    report.goal(
        NAME,
        checked.most_copies <= MOST_COPIES,
        format!(
            "no event written more than {MOST_COPIES} times: {}",
            checked.summary()
        ),
    );
    let warm = samples
        .iter()
        .find(|(at, _)| *at >= stopped + RSS_WARM_UP.as_millis() as i64)
        .copied();
    let last = samples.last().copied();
    let (Some((_, warm)), Some((_, last))) = (warm, last) else {
        report.goal(NAME, false, format!("worker RSS sampled: {samples:?}"));
        return;
    };
    let (low, high) = samples.iter().fold((i64::MAX, i64::MIN), |(l, h), (_, k)| {
        (l.min(*k), h.max(*k))
    });
    report.goal(
        NAME,
        last - warm < RSS_BOUND_KIB,
        format!(
            "memory flat: worker RSS {} before the stop, {} {} into the outage, {} at its end \
             ({:+.1} MiB, bound < +{}; range {}–{} over {} samples)",
            mib(rss_before),
            mib(warm),
            secs(RSS_WARM_UP),
            mib(last),
            (last - warm) as f64 / 1024.0,
            mib(RSS_BOUND_KIB),
            mib(low),
            mib(high),
            samples.len()
        ),
    );
}

/// The second scenario, on the defaults cluster: on the same
/// layout, partition 0's only follower frozen with SIGSTOP for
/// [`FROZEN_FOR`], then thawed with SIGCONT. It stays in the ISR as long as
/// the cluster keeps it there (`replica.lag.time.max.ms` is 30 s; the
/// watcher's timeline of partition 0 is printed), so partition 0's acks=all
/// requests wait while partitions 1 and 2 answer at once. Invariant: every
/// booking on the topic, duplicates with the same `ce_id` and bytes.
/// Goals: partitions 1 and 2 never stall 1 s; no event written more than
/// twice. How partition 0 resumed is printed.
async fn one_partition_slow(cluster: &Cluster, files: &Path, report: &mut Report) {
    const NAME: &str = "one partition slow";
    let flow = Flow::start(
        cluster,
        files,
        &p0_alone_layout(),
        FROZEN_FOR + Duration::from_secs(20),
    )
    .await;
    let due = flow.due;
    flow.wait_published(2_000, Duration::from_secs(60)).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let mut faults = Faults::default();
    let from = now_ms();
    blocking(|| cluster.freeze(P0_FOLLOWER));
    let frozen = now_ms();
    // Writes to partition 0 wait for it: not writable while frozen.
    faults.down(P0_FOLLOWER, frozen);
    progress(&format!(
        "node {P0_FOLLOWER} (partition 0's only follower) frozen"
    ));
    let published_at_freeze = flow.published_count().await;
    // The scenario's definition: frozen this long.
    sleep_until_ms(frozen + FROZEN_FOR.as_millis() as i64).await;
    let published_frozen = flow.published_count().await - published_at_freeze;
    let activity = Activity::start(&flow.db).await;
    blocking(|| cluster.thaw(P0_FOLLOWER));
    let thawed = now_ms();
    faults.up(P0_FOLLOWER, thawed);
    progress(&format!("node {P0_FOLLOWER} thawed"));
    let (synced_at, end) = flow.partition_0_in_sync_again("after the thaw").await;
    let statements = activity.stop(from, 8).await;
    let errors = produce_error_codes(&flow.metrics_addr).await;
    let fin = flow.finish().await;
    let checked = check_topic(cluster, &fin.topic, 3, due, |_| vec![3]);
    let published = Flow::published_of(&fin.db).await;
    let worker_acks = &checked.appended;
    let (w, j) = both(&fin, worker_acks, &faults, (from, end));
    written_line(report, NAME, &fin, &published, &checked, (from, end));
    report.step(
        &format!(
            "{NAME} (node {P0_FOLLOWER} frozen {}, 2 in sync {} after the thaw)",
            secs(ms(thawed - frozen)),
            secs(ms(synced_at.max(thawed) - thawed))
        ),
        &w,
        &j,
        GapGoal::Partitions,
    );
    report.line(format!(
        "{NAME}: partition 0 as the watcher saw it: {}",
        render_timeline(&fin.timelines, &fin.topic, 0, from, end)
    ));
    report.line(format!(
        "{NAME}: the longest statements from the thaw on: {statements}"
    ));
    report.line(format!(
        "{NAME}: while frozen the worker published {published_frozen} rows; produce errors {errors:?}; \
         {} WARN/ERROR log lines in the whole flow",
        warn_error_lines(&fin.log)
    ));
    report.goal(
        NAME,
        checked.most_copies <= MOST_COPIES,
        format!(
            "no event written more than {MOST_COPIES} times: {}",
            checked.summary()
        ),
    );
}

/// Invariant: the `run` process killed with `kill -9` while it publishes
/// (requests on the way, rows leased), a new one started at once: every
/// booking on the topic, duplicates only with the same `ce_id` and bytes.
/// The killed instance's leases end on their own (`Timing::lease`); its
/// rows are published by the new one then.
async fn worker_killed(cluster: &Cluster, files: &Path, report: &mut Report) {
    let mut flow = Flow::start(cluster, files, &rf3_layout(), Duration::from_secs(20)).await;
    let due = flow.due;
    flow.wait_published(3_000, Duration::from_secs(60)).await;
    let published = flow.published_count().await;
    flow.kill_worker().await;
    let killed = Instant::now();
    let leased = flow
        .db
        .count(
            "SELECT count(*) AS n FROM booking_expiration_outbox \
             WHERE published_at IS NULL AND claimed_until > now()",
        )
        .await;
    progress(&format!(
        "run killed with {published} of {due} rows published, {leased} leased by it"
    ));
    flow.start_worker();
    let fin = flow.finish().await;
    let all_after = killed.elapsed();
    let checked = check_topic(cluster, &fin.topic, 3, due, |_| vec![3]);
    report.line(format!(
        "kill -9 of the worker: {published} of {due} rows published at the kill, {leased} leased \
         by the killed instance (lease {}); a new one published everything {} after; {}",
        secs(Timing::default().lease),
        secs(all_after),
        checked.summary()
    ));
    assert!(
        published < due - 5_000,
        "the kill came too late to measure ({published} of {due} published)"
    );
}
