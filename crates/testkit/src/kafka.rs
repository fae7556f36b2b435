//! Apache Kafka: a throwaway broker (`scripts/kafka.sh`) that stops on drop,
//! a client, fresh topics, reading a topic back, and the partitions Kafka's
//! Java client computes for keys.

use std::{
    collections::BTreeMap,
    io::Write,
    path::{Path, PathBuf},
    process::Stdio,
};

use anyhow::{Context, Result, ensure};
use rskafka::client::{Client, ClientBuilder, partition::UnknownTopicHandling};

use crate::scripts::{run_script, script};

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
    /// Starts three nodes on three free port pairs; returns once all serve metadata.
    pub fn start(dir: &Path) -> Result<Self> {
        let ports = crate::scripts::free_port_pairs(3);
        let cluster = Self {
            dir: dir.to_owned(),
            ports,
        };
        let ports: Vec<String> = cluster.ports.iter().map(u16::to_string).collect();
        run_script(
            "kafka.sh",
            &[
                "start-cluster",
                dir_str(&cluster.dir)?,
                &ports[0],
                &ports[1],
                &ports[2],
            ],
        )?;
        Ok(cluster)
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
