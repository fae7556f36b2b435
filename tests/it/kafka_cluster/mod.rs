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

// The shared harness: the traffic and its invariant, the figures and
// goals, the probes, and what the two scenarios of one partition share;
// then one file per scenario, named as in
// KAFKA_CLUSTER_SCENARIOS, each a function that runs one flow on the
// cluster it is given and adds its steps to the report.
mod figures;
mod flow;
mod one_partition;
mod probes;

mod down;
mod kill;
mod partitions;
mod rolling;
mod slow;
mod unwritable;
mod worker_kill;

use figures::*;
use flow::*;
use probes::*;

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
            kill::leader_killed(&cluster, &files, &mut report).await;
        }
        if wanted(&scenarios, "rolling") {
            rolling::rolling_restart(&cluster, &files, &mut report).await;
        }
        if wanted(&scenarios, "down") {
            down::two_brokers_down(&cluster, &files, &mut report).await;
        }
        if !once_done && wanted(&scenarios, "partitions") {
            partitions::partitions_added(&cluster, &files, &mut report).await;
        }
        if !once_done && wanted(&scenarios, "worker-kill") {
            worker_kill::worker_killed(&cluster, &files, &mut report).await;
        }
        once_done = true;
        if profile == ClusterProfile::Defaults && wanted(&scenarios, "unwritable") {
            unwritable::one_partition_unwritable(&cluster, &files, &mut report).await;
        }
        if profile == ClusterProfile::Defaults && wanted(&scenarios, "slow") {
            slow::one_partition_slow(&cluster, &files, &mut report).await;
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
