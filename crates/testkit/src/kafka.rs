//! Apache Kafka: a throwaway broker (`scripts/kafka.sh`) that stops on drop,
//! one with an authorizer (`scripts/kafka-acl.sh`), a client, fresh topics,
//! reading a topic back, the partitions Kafka's Java client computes for
//! keys, a three-node cluster and a plain Java producer that watches its
//! leaders and in-sync replicas.

use std::{
    collections::BTreeMap,
    io::Write,
    path::{Path, PathBuf},
    process::{Child, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail, ensure};
use rskafka::client::{Client, ClientBuilder, partition::UnknownTopicHandling};

use crate::scripts::{run, run_script, script};

/// A single-node broker started by `scripts/kafka.sh` in `dir` on
/// `127.0.0.1:port` (controller on `port + 1`); stopped on drop.
#[derive(Debug)]
pub struct Kafka {
    dir: PathBuf,
    port: u16,
}

impl Kafka {
    pub fn start(dir: &Path, port: u16) -> Result<Self> {
        let kafka = Self {
            dir: dir.to_owned(),
            port,
        };
        kafka.start_again()?;
        Ok(kafka)
    }

    /// `127.0.0.1:port`.
    pub fn bootstrap(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// Stops the broker (a fault: producers see it go away).
    pub fn stop(&self) -> Result<()> {
        run_script("kafka.sh", &["stop", dir_str(&self.dir)?]).map(drop)
    }

    /// Starts the broker in the same folder on the same port.
    pub fn start_again(&self) -> Result<()> {
        run_script(
            "kafka.sh",
            &["start", dir_str(&self.dir)?, &self.port.to_string()],
        )
        .map(drop)
    }

    /// Creates `topic` with the broker's own admin tool.
    pub fn create_topic(&self, topic: &str, partitions: i32) -> Result<()> {
        run_script(
            "kafka.sh",
            &[
                "create-topic",
                &self.port.to_string(),
                topic,
                &partitions.to_string(),
            ],
        )
        .map(drop)
    }

    /// The broker's process id (`DIR/kafka.pid`), to signal it (SIGSTOP
    /// freezes it: it keeps its connections and answers nothing).
    pub fn pid(&self) -> Result<u32> {
        let file = self.dir.join("kafka.pid");
        let text = std::fs::read_to_string(&file).with_context(|| file.display().to_string())?;
        text.trim()
            .parse()
            .with_context(|| format!("a pid in {}", file.display()))
    }

    /// Stops the broker in `dir`, ignoring failures (cleanup paths).
    pub fn stop_dir(dir: &Path) {
        let _ = script("kafka.sh")
            .arg("stop")
            .arg(dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
}

impl Drop for Kafka {
    fn drop(&mut self) {
        Self::stop_dir(&self.dir);
    }
}

fn dir_str(path: &Path) -> Result<&str> {
    path.to_str()
        .with_context(|| format!("not UTF-8: {}", path.display()))
}

/// A single-node broker with an authorizer (`scripts/kafka-acl.sh`:
/// StandardAuthorizer, SASL/PLAIN users, nothing allowed without an ACL)
/// in `dir`; stopped on drop. Its `WORKER` listener is advertised on a
/// port of the caller's choosing, where the caller puts a proxy in front
/// of [`AclKafka::worker_listener`], so that every connection of a client
/// that bootstraps there goes through the proxy.
#[derive(Debug)]
pub struct AclKafka {
    dir: PathBuf,
    port: u16,
}

impl AclKafka {
    /// The user the worker logs in as (PLAIN) and its password.
    pub const USER: &'static str = "worker";
    pub const PASSWORD: &'static str = "worker-secret";

    /// Starts the broker on four consecutive free ports, its `WORKER`
    /// listener advertised as `127.0.0.1:advertised_port`.
    pub fn start(dir: &Path, advertised_port: u16) -> Result<Self> {
        let port = crate::scripts::free_port_block(4);
        let broker = Self {
            dir: dir.to_owned(),
            port,
        };
        let mut command = script("kafka-acl.sh");
        command
            .args([
                "start",
                dir_str(dir)?,
                &port.to_string(),
                &advertised_port.to_string(),
            ])
            .env("KAFKA_ACL_USER", Self::USER)
            .env("KAFKA_ACL_PASSWORD", Self::PASSWORD);
        run(command, "scripts/kafka-acl.sh start")?;
        Ok(broker)
    }

    /// The `PLAINTEXT` listener (a super user: the test reads back here).
    pub fn plaintext(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// Where the `WORKER` listener really listens (SASL_PLAINTEXT, PLAIN).
    pub fn worker_listener(&self) -> std::net::SocketAddr {
        std::net::SocketAddr::from(([127, 0, 0, 1], self.port + 2))
    }

    /// The principal of [`Self::USER`].
    pub fn principal() -> String {
        format!("User:{}", Self::USER)
    }

    /// Creates `topic` as the super user `admin`.
    pub fn create_topic(&self, topic: &str, partitions: i32) -> Result<()> {
        run_script(
            "kafka-acl.sh",
            &[
                "create-topic",
                dir_str(&self.dir)?,
                topic,
                &partitions.to_string(),
            ],
        )
        .map(drop)
    }

    /// Allows `principal` to do `operation` (`Describe`, `Write`, …) on
    /// `topic` (an ACL added by the super user `admin`).
    pub fn allow(&self, principal: &str, operation: &str, topic: &str) -> Result<()> {
        run_script(
            "kafka-acl.sh",
            &["allow", dir_str(&self.dir)?, principal, operation, topic],
        )
        .map(drop)
    }
}

impl Drop for AclKafka {
    fn drop(&mut self) {
        Kafka::stop_dir(&self.dir);
    }
}

/// A client of the cluster at `bootstrap`.
pub async fn client(bootstrap: Vec<String>) -> Result<Client> {
    ClientBuilder::new(bootstrap)
        .build()
        .await
        .context("connect to the Kafka broker")
}

/// Creates `name` with `partitions` partitions (replication factor 1).
pub async fn create_topic(bootstrap: Vec<String>, name: &str, partitions: i32) -> Result<()> {
    client(bootstrap)
        .await?
        .controller_client()?
        .create_topic(name, partitions, 1, 10_000)
        .await
        .with_context(|| format!("create topic {name}"))
}

/// One record read back from Kafka.
#[derive(Debug, Clone)]
pub struct ConsumedRecord {
    pub partition: i32,
    pub offset: i64,
    pub key: String,
    pub value: Vec<u8>,
    pub headers: BTreeMap<String, Vec<u8>>,
}

impl ConsumedRecord {
    /// A header as (lossy) UTF-8.
    pub fn header(&self, name: &str) -> Option<String> {
        self.headers
            .get(name)
            .map(|v| String::from_utf8_lossy(v).into_owned())
    }
}

/// Every record of every partition of `topic`, up to the high watermark.
pub async fn read_topic(
    bootstrap: Vec<String>,
    topic: &str,
    partitions: i32,
) -> Result<Vec<ConsumedRecord>> {
    let client = client(bootstrap).await?;
    let mut out = Vec::new();
    for partition in 0..partitions {
        let pc = client
            .partition_client(topic, partition, UnknownTopicHandling::Retry)
            .await?;
        let mut offset = 0;
        loop {
            let (records, high_watermark) = pc.fetch_records(offset, 1..5_000_000, 500).await?;
            for r in &records {
                out.push(ConsumedRecord {
                    partition,
                    offset: r.offset,
                    key: String::from_utf8(r.record.key.clone().unwrap_or_default())
                        .context("a UTF-8 key")?,
                    value: r.record.value.clone().unwrap_or_default(),
                    headers: r.record.headers.clone(),
                });
            }
            if let Some(last) = records.last() {
                offset = last.offset + 1;
            }
            if records.is_empty() || offset >= high_watermark {
                break;
            }
        }
    }
    Ok(out)
}

/// The partitions the Java client computes for `keys`, by running Kafka's
/// own `Utils.murmur2` from the broker's jars (`scripts/kafka.sh partition`).
pub fn java_partitions(keys: &[String], partitions: i32) -> Result<BTreeMap<String, i32>> {
    let mut child = script("kafka.sh")
        .args(["partition", "--partitions", &partitions.to_string()])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .context("run scripts/kafka.sh partition")?;
    // Keys go in on a thread of their own: with many keys the answers fill
    // the stdout pipe before all keys are written, and writing and reading
    // on one thread would wait on each other for ever.
    let mut stdin = child.stdin.take().context("stdin")?;
    let input: String = keys.iter().map(|key| format!("{key}\n")).collect();
    let writer = std::thread::spawn(move || stdin.write_all(input.as_bytes()));
    let output = child.wait_with_output()?;
    writer
        .join()
        .map_err(|_| anyhow::anyhow!("the thread writing keys panicked"))??;
    ensure!(output.status.success(), "scripts/kafka.sh partition failed");
    String::from_utf8(output.stdout)?
        .lines()
        .map(|line| {
            let (key, partition) = line.split_once('\t').context("KEY\\tPARTITION")?;
            Ok((key.to_owned(), partition.trim().parse()?))
        })
        .collect()
}

/// A three-broker KRaft cluster started by `scripts/kafka.sh start-cluster`
/// in `dir` (node N on `127.0.0.1:ports[N-1]`, controller on the port
/// after); every node is stopped on drop, also when the test panicked.
#[derive(Debug)]
pub struct Cluster {
    dir: PathBuf,
    ports: Vec<u16>,
    profile: ClusterProfile,
}

/// The brokers' timing settings (`KAFKA_CLUSTER_PROFILE` of
/// `scripts/kafka.sh start-cluster`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClusterProfile {
    /// `broker.session.timeout.ms=6000`, `broker.heartbeat.interval.ms=1000`,
    /// `replica.lag.time.max.ms=5000`.
    Tuned,
    /// Kafka's defaults for those three (9000, 2000, 30000).
    Defaults,
}

impl ClusterProfile {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Tuned => "tuned",
            Self::Defaults => "defaults",
        }
    }
}

/// One partition as the cluster describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartitionState {
    pub partition: i32,
    /// Node id of the leader; -1 when there is none.
    pub leader: i32,
    pub isr: Vec<i32>,
}

impl Cluster {
    /// Starts three nodes (the tuned profile) on three free port pairs;
    /// returns once all serve metadata.
    pub fn start(dir: &Path) -> Result<Self> {
        Self::start_with(dir, ClusterProfile::Tuned)
    }

    /// [`Cluster::start`] with the brokers' timing settings of `profile`
    /// (nodes started again later keep it).
    pub fn start_with(dir: &Path, profile: ClusterProfile) -> Result<Self> {
        let ports = crate::scripts::free_port_pairs(3);
        let cluster = Self {
            dir: dir.to_owned(),
            ports,
            profile,
        };
        let ports: Vec<String> = cluster.ports.iter().map(u16::to_string).collect();
        let mut command = script("kafka.sh");
        command
            .env("KAFKA_CLUSTER_PROFILE", profile.as_str())
            .args([
                "start-cluster",
                dir_str(&cluster.dir)?,
                &ports[0],
                &ports[1],
                &ports[2],
            ]);
        run(
            command,
            &format!("scripts/kafka.sh start-cluster ({})", profile.as_str()),
        )?;
        Ok(cluster)
    }

    /// The profile the cluster was started with.
    pub fn profile(&self) -> ClusterProfile {
        self.profile
    }

    /// All three addresses.
    pub fn bootstrap(&self) -> Vec<String> {
        self.ports
            .iter()
            .map(|p| format!("127.0.0.1:{p}"))
            .collect()
    }

    /// The PLAINTEXT port of node `node` (1–3).
    pub fn port(&self, node: i32) -> u16 {
        self.ports[(node - 1) as usize]
    }

    fn node_command(&self, command: &str, node: i32) -> Result<()> {
        run_script(
            "kafka.sh",
            &[command, dir_str(&self.dir)?, &node.to_string()],
        )
        .map(drop)
    }

    /// `kill -9` of node `node`: a crash, no controlled shutdown.
    pub fn kill(&self, node: i32) -> Result<()> {
        self.node_command("kill", node)
    }

    /// SIGTERM (controlled shutdown), waiting until the node exited.
    pub fn stop_node(&self, node: i32) -> Result<()> {
        self.node_command("stop-node", node)
    }

    /// Starts node `node` again and waits until it serves metadata.
    pub fn start_node(&self, node: i32) -> Result<()> {
        self.node_command("start-node", node)
    }

    /// Starts node `node` again and returns at once (it is not ready yet).
    pub fn launch_node(&self, node: i32) -> Result<()> {
        self.node_command("launch-node", node)
    }

    /// Creates `topic` with replication factor 3 and `min.insync.replicas=2`.
    pub fn create_topic(&self, topic: &str, partitions: i32) -> Result<()> {
        run_script(
            "kafka.sh",
            &[
                "create-topic",
                &self.ports[0].to_string(),
                topic,
                &partitions.to_string(),
                "--replication-factor",
                "3",
                "--config",
                "min.insync.replicas=2",
            ],
        )
        .map(drop)
    }

    /// Grows `topic` to `partitions` partitions (through node `via`).
    pub fn add_partitions(&self, via: i32, topic: &str, partitions: i32) -> Result<()> {
        run_script(
            "kafka.sh",
            &[
                "add-partitions",
                &self.port(via).to_string(),
                topic,
                &partitions.to_string(),
            ],
        )
        .map(drop)
    }

    /// Leader and ISR of every partition of `topic`, asked of the live nodes.
    pub fn describe(&self, topic: &str) -> Result<Vec<PartitionState>> {
        let out = run_script(
            "kafka.sh",
            &["describe-topic", &self.bootstrap().join(","), topic],
        )?;
        out.lines()
            .map(|line| {
                let mut fields = line.split('\t');
                let mut next = || fields.next().context("PARTITION\\tLEADER\\tISR");
                let partition = next()?.parse()?;
                let leader = next()?.parse()?;
                let isr = next()?
                    .split(',')
                    .filter(|s| !s.is_empty())
                    .map(str::parse)
                    .collect::<Result<_, _>>()?;
                Ok(PartitionState {
                    partition,
                    leader,
                    isr,
                })
            })
            .collect()
    }

    /// Stops every node still running, ignoring failures (cleanup paths).
    pub fn stop_all(&self) {
        let _ = script("kafka.sh")
            .arg("stop-cluster")
            .arg(&self.dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        self.stop_all();
    }
}

/// A leader/ISR observation of one partition by [`PlainProducer`]'s watcher.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Observed {
    /// Epoch milliseconds when the describe request that saw it was sent.
    pub at_ms: i64,
    /// Node id of the leader; -1 when there is none.
    pub leader: i32,
    pub isr: Vec<i32>,
}

/// `scripts/kafka.sh plain-producer`: a plain Java producer (the client's
/// defaults plus acks=all) publishing `rate` records a second to its own
/// topic, and a watcher of the leaders and ISRs of the watched topics
/// (`scripts/kafka/PlainProducer.java`). Stopped with SIGTERM on
/// [`PlainProducer::stop`] or drop.
#[derive(Debug)]
pub struct PlainProducer {
    child: Option<Child>,
    ack_file: PathBuf,
    watch_file: PathBuf,
    stderr_file: PathBuf,
}

impl PlainProducer {
    /// Starts it; its files go into `dir` (named after `topic`).
    pub fn start(
        bootstrap: &[String],
        topic: &str,
        rate: u32,
        dir: &Path,
        watch: &[&str],
    ) -> Result<Self> {
        let ack_file = dir.join(format!("{topic}.acks"));
        let watch_file = dir.join(format!("{topic}.watch"));
        let stderr_file = dir.join(format!("{topic}.stderr"));
        let stderr = std::fs::File::create(&stderr_file)
            .with_context(|| stderr_file.display().to_string())?;
        let child = script("kafka.sh")
            .arg("plain-producer")
            .arg(bootstrap.join(","))
            .arg(topic)
            .arg(rate.to_string())
            .arg(&ack_file)
            .arg(&watch_file)
            .args(watch)
            .stdout(Stdio::null())
            .stderr(stderr)
            .spawn()
            .context("run scripts/kafka.sh plain-producer")?;
        Ok(Self {
            child: Some(child),
            ack_file,
            watch_file,
            stderr_file,
        })
    }

    /// Waits until the first acknowledgement is in the ack file and the
    /// watcher has described the topics once.
    pub fn wait_producing(&mut self, timeout: Duration) -> Result<()> {
        let deadline = Instant::now() + timeout;
        loop {
            let size = |p: &Path| std::fs::metadata(p).map(|m| m.len()).unwrap_or(0);
            if size(&self.ack_file) > 0 && size(&self.watch_file) > 0 {
                return Ok(());
            }
            if let Some(child) = self.child.as_mut()
                && let Some(status) = child.try_wait()?
            {
                bail!("the plain producer exited ({status}):\n{}", self.stderr());
            }
            ensure!(
                Instant::now() < deadline,
                "the plain producer acknowledged nothing within {timeout:?}:\n{}",
                self.stderr()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// SIGTERM, then waits until it exited (its shutdown hook flushes the
    /// files); killed after 30 s.
    pub fn stop(&mut self) -> Result<()> {
        let Some(mut child) = self.child.take() else {
            return Ok(());
        };
        let _ = std::process::Command::new("kill")
            .args(["-TERM", &child.id().to_string()])
            .status();
        let deadline = Instant::now() + Duration::from_secs(30);
        while child.try_wait()?.is_none() {
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                bail!("the plain producer did not exit within 30 s of SIGTERM");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(())
    }

    /// What it wrote to stderr.
    pub fn stderr(&self) -> String {
        std::fs::read_to_string(&self.stderr_file).unwrap_or_default()
    }

    /// Per partition, the acknowledgement times (epoch milliseconds) in order.
    pub fn acks(&self) -> Result<BTreeMap<i32, Vec<i64>>> {
        let text = std::fs::read_to_string(&self.ack_file)
            .with_context(|| self.ack_file.display().to_string())?;
        let mut acks: BTreeMap<i32, Vec<i64>> = BTreeMap::new();
        // A line cut short by a kill is not an acknowledgement.
        for line in text.lines() {
            let Some((partition, at)) = line.split_once('\t') else {
                continue;
            };
            let (Ok(partition), Ok(at)) = (partition.parse(), at.parse()) else {
                continue;
            };
            acks.entry(partition).or_default().push(at);
        }
        for times in acks.values_mut() {
            times.sort_unstable();
        }
        Ok(acks)
    }

    /// Per (topic, partition), the watcher's observations in time order:
    /// the first one and every change of leader or ISR.
    pub fn timelines(&self) -> Result<BTreeMap<(String, i32), Vec<Observed>>> {
        let text = std::fs::read_to_string(&self.watch_file)
            .with_context(|| self.watch_file.display().to_string())?;
        let mut out: BTreeMap<(String, i32), Vec<Observed>> = BTreeMap::new();
        for line in text.lines() {
            let fields: Vec<&str> = line.split('\t').collect();
            let [at, topic, partition, leader, isr] = fields[..] else {
                continue;
            };
            let (Ok(at_ms), Ok(partition), Ok(leader)) =
                (at.parse(), partition.parse(), leader.parse())
            else {
                continue;
            };
            let isr = isr
                .split(',')
                .filter(|s| !s.is_empty())
                .map(str::parse)
                .collect::<Result<_, _>>()?;
            out.entry((topic.to_owned(), partition))
                .or_default()
                .push(Observed { at_ms, leader, isr });
        }
        for timeline in out.values_mut() {
            timeline.sort_by_key(|o| o.at_ms);
        }
        Ok(out)
    }
}

impl Drop for PlainProducer {
    fn drop(&mut self) {
        let _ = self.stop();
    }
}
