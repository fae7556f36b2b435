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
    {
        let stdin = child.stdin.as_mut().context("stdin")?;
        for key in keys {
            writeln!(stdin, "{key}")?;
        }
    }
    let output = child.wait_with_output()?;
    ensure!(output.status.success(), "scripts/kafka.sh partition failed");
    String::from_utf8(output.stdout)?
        .lines()
        .map(|line| {
            let (key, partition) = line.split_once('\t').context("KEY\\tPARTITION")?;
            Ok((key.to_owned(), partition.trim().parse()?))
        })
        .collect()
}
