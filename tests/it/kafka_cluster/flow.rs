//! One scenario's traffic and its invariant: a fresh database and topic,
//! the `run` binary expiring and publishing bookings as they fall due,
//! the plain Java producer beside it ([`Flow`]); then every booking on the
//! topic, duplicates identical, each record on the partition the Java
//! client would choose ([`check_topic`]).

use super::*;

/// Acknowledgement times (epoch milliseconds) per partition, in order.
pub(super) type Acks = BTreeMap<i32, Vec<i64>>;

/// The watcher's observations per (topic, partition).
pub(super) type Timelines = BTreeMap<(String, i32), Vec<Observed>>;

#[derive(QueryableByName)]
pub(super) struct Published {
    #[diesel(sql_type = Text)]
    pub(super) message_key: String,
    #[diesel(sql_type = Timestamptz)]
    pub(super) published_at: DateTime<Utc>,
    /// When the expiry wrote the row.
    #[diesel(sql_type = Timestamptz)]
    pub(super) created_at: DateTime<Utc>,
    /// When its lease was last taken or renewed (`claimed_until` less the
    /// lease): for a row published within half a lease, when the publisher
    /// claimed it.
    #[diesel(sql_type = Timestamptz)]
    pub(super) claimed_at: DateTime<Utc>,
}

pub(super) fn now_ms() -> i64 {
    wall_now().timestamp_millis()
}

/// One scenario's traffic: a fresh database seeded with bookings falling
/// due at [`DUE_PER_SEC`] over the next `spread`, a fresh topic on the
/// cluster, the `run` binary expiring and publishing them, and the plain
/// Java producer on a topic of its own, watching both topics.
pub(super) struct Flow {
    pub(super) db: TestDb,
    pub(super) topic: String,
    pub(super) java_topic: String,
    pub(super) java: PlainProducer,
    pub(super) running: Running,
    pub(super) metrics_addr: String,
    pub(super) bootstrap: String,
    pub(super) profile: ClusterProfile,
    pub(super) due: i64,
}

/// What a finished flow leaves to measure.
pub(super) struct Finished {
    pub(super) db: TestDb,
    pub(super) topic: String,
    pub(super) java_topic: String,
    pub(super) java_acks: Acks,
    pub(super) timelines: Timelines,
    /// The (last) `run` process's stderr.
    pub(super) log: String,
}

pub(super) fn blocking<T>(f: impl FnOnce() -> anyhow::Result<T>) -> T {
    tokio::task::block_in_place(f).unwrap_or_else(|e| panic!("{e:#}"))
}

impl Flow {
    /// Both topics get the replica assignment `layout` (see
    /// [`RF3_LAYOUT`]): partition `p` of the worker's topic and of the Java
    /// producer's has the same leader and followers, so a fault hits both
    /// alike and the Java figure of partition `p` is the yardstick of the
    /// worker's.
    pub(super) async fn start(
        cluster: &Cluster,
        dir: &Path,
        layout: &[Vec<i32>],
        spread: Duration,
    ) -> Self {
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
    pub(super) async fn kill_worker(&mut self) -> String {
        let _ = self.running.child.kill();
        let _ = self.running.wait(Duration::from_secs(10)).await;
        self.running.stderr()
    }

    /// A new `run` process in place of one that was killed.
    pub(super) fn start_worker(&mut self) {
        self.running = Running::spawn(run_command(
            &self.db.url,
            &self.bootstrap,
            &self.topic,
            &self.metrics_addr,
            self.profile,
        ));
    }

    pub(super) async fn published_count(&self) -> i64 {
        self.db.published().await
    }

    pub(super) async fn expired_count(&self) -> i64 {
        self.db
            .count("SELECT count(*) AS n FROM bookings WHERE version = 2")
            .await
    }

    pub(super) async fn wait_published(&self, at_least: i64, timeout: Duration) {
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
    pub(super) async fn partition_0_in_sync_again(&self, when: &str) -> (i64, i64) {
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

    pub(super) async fn wait_watched(
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
    pub(super) async fn finish(mut self) -> Finished {
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

    /// The published rows of `db`'s outbox, in the order they were published.
    pub(super) async fn published_of(db: &TestDb) -> Vec<Published> {
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

/// The `run` command of a flow.
pub(super) fn run_command(
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
pub(super) struct Dumped {
    pub(super) partition: i32,
    /// The broker's append time (epoch ms; the topics have
    /// `message.timestamp.type=LogAppendTime`).
    pub(super) timestamp: i64,
    pub(super) key: String,
    /// Base64, as dumped: equal text, equal bytes.
    pub(super) value: String,
    pub(super) ce_id: Option<String>,
}

/// Every record of `topic`, read by the Java client (an independent
/// reader) from the first node that answers.
pub(super) fn dump_topic(cluster: &Cluster, topic: &str) -> Vec<Dumped> {
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
pub(super) struct Checked {
    pub(super) records: usize,
    /// Records beyond the first of their key.
    pub(super) duplicates: usize,
    /// The most records of one key (1: no duplicate).
    pub(super) most_copies: usize,
    /// Each key's partition.
    pub(super) partition_of: HashMap<String, i32>,
    /// Per partition, the append times of every record (duplicates too),
    /// in order: the worker's acknowledgement times on the topic.
    pub(super) appended: Acks,
}

impl Checked {
    pub(super) fn summary(&self) -> String {
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
pub(super) fn check_topic(
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
pub(super) fn acks_by_partition(
    published: &[Published],
    partition_of: &HashMap<String, i32>,
) -> Acks {
    by_partition(published, partition_of, |p| p.published_at)
}

/// Per partition, when the expiry wrote the rows (`created_at`, epoch
/// milliseconds) in order: a gap here is a gap in what there was to
/// publish, not the publisher's.
pub(super) fn written_by_partition(
    published: &[Published],
    partition_of: &HashMap<String, i32>,
) -> Acks {
    by_partition(published, partition_of, |p| p.created_at)
}

pub(super) fn by_partition(
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
