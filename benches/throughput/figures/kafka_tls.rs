//! Figure 10: what TLS to Kafka costs. One broker of its own
//! (`scripts/kafka-tls.sh`) with a PLAINTEXT and a SASL_SSL (SCRAM-SHA-512)
//! listener; in the same run, alternating:
//!
//! - produce throughput of the publisher's Kafka leg (the project's
//!   `KafkaTransport`, batches of the publisher's size split by partition,
//!   no database in the loop)
//!   over SASL_SSL (TLS on the worker's own connections) against PLAINTEXT;
//! - connection set-up: a fresh transport's first metadata read (bootstrap
//!   connection, metadata) over PLAINTEXT, SSL and SASL_SSL.

use std::{path::PathBuf, time::Instant};

use anyhow::{Context, Result, ensure};
use booking_expiration::{
    config::{KafkaSettings, KafkaTls, SaslMechanism, SaslSettings},
    outbox::{KafkaTransport, OutgoingRecord, Transport},
};
use serde::{Deserialize, Serialize};

use super::reps;
use crate::{
    progress,
    support::{Services, Stat, loadavg, produce_keyed},
};

const USER: &str = "bench";
const PASSWORD: &str = "bench-secret";
/// Records per produce call (the publisher's default batch).
const BATCH: usize = 500;

#[derive(Debug, Serialize, Deserialize)]
pub struct KafkaTlsFigure {
    pub records: u64,
    pub batch: usize,
    /// Produce over SASL_SSL (SCRAM-SHA-512), records/s per run.
    pub sasl_ssl_records_per_s: Stat,
    /// The same over PLAINTEXT, alternating with it.
    pub plaintext_records_per_s: Stat,
    /// Median SASL_SSL / median PLAINTEXT.
    pub ratio: f64,
    /// A fresh sink's first call, ms.
    pub setup_plaintext_ms: Stat,
    pub setup_ssl_ms: Stat,
    pub setup_sasl_ssl_ms: Stat,
    pub loadavg_at_start: [f64; 3],
}

/// The broker, stopped when the bench exits (its owner-process watcher)
/// or on drop.
struct Broker {
    dir: PathBuf,
    port: u16,
}

impl Drop for Broker {
    fn drop(&mut self) {
        let _ = testkit::script("kafka-tls.sh")
            .arg("stop")
            .arg(&self.dir)
            .status();
    }
}

fn settings(listener: String, tls: Option<KafkaTls>, sasl: bool) -> KafkaSettings {
    KafkaSettings {
        client_id: "booking-expiration-bench".into(),
        request_timeout: std::time::Duration::from_secs(30),
        sasl: sasl.then(|| SaslSettings {
            mechanism: SaslMechanism::ScramSha512,
            username: USER.into(),
            password: PASSWORD.into(),
        }),
        tls,
        ..KafkaSettings::new(vec![listener])
    }
}

fn records(n: usize) -> Vec<OutgoingRecord> {
    (0..n)
        .map(|i| OutgoingRecord {
            key: uuid::Uuid::new_v4().to_string(),
            // About the size of a BookingExpiredEvent.
            value: vec![(i % 251) as u8; 180],
            headers: [("ce_type", "bench")].into_iter().collect(),
        })
        .collect()
}

/// Records/s of `batches` produce calls after one warm-up call.
async fn produce_rate(kafka: KafkaSettings, topic: &str, batches: usize) -> Result<f64> {
    let transport = KafkaTransport::new(kafka);
    produce_keyed(&transport, topic, 3, records(BATCH)).await?;
    let prepared: Vec<_> = (0..batches).map(|_| records(BATCH)).collect();
    let started = Instant::now();
    for batch in prepared {
        produce_keyed(&transport, topic, 3, batch).await?;
    }
    Ok((batches * BATCH) as f64 / started.elapsed().as_secs_f64())
}

async fn setup_ms(kafka: KafkaSettings, topic: &str) -> Result<f64> {
    let transport = KafkaTransport::new(kafka);
    let started = Instant::now();
    let partitions = transport.partitions(topic).await?;
    ensure!(partitions == 3, "{partitions} partitions");
    Ok(started.elapsed().as_secs_f64() * 1000.0)
}

pub async fn measure(svc: &Services, quick: bool) -> Result<KafkaTlsFigure> {
    progress!("10. Kafka over SASL_SSL vs PLAINTEXT: produce rate and connection set-up");
    let dir = svc.work.join("kafka-tls");
    let port = loop {
        let first = testkit::free_port();
        if first < 65000
            && (1..7).all(|i| std::net::TcpListener::bind(("127.0.0.1", first + i)).is_ok())
        {
            break first;
        }
    };
    let status = testkit::script("kafka-tls.sh")
        .arg("start")
        .arg(&dir)
        .arg(port.to_string())
        .env("KAFKA_TLS_OWNER_PID", std::process::id().to_string())
        .env("KAFKA_TLS_USER", USER)
        .env("KAFKA_TLS_PASSWORD", PASSWORD)
        .status()
        .context("run scripts/kafka-tls.sh")?;
    ensure!(status.success(), "the TLS broker did not start");
    let broker = Broker { dir, port };
    let plaintext = format!("127.0.0.1:{}", broker.port);
    let topic = "bench-kafka-tls";
    testkit::kafka::create_topic(vec![plaintext.clone()], topic, 3).await?;
    let tls = KafkaTls {
        ca: Some(broker.dir.join("tls/ca.crt")),
        client: None,
    };
    let plain = || settings(plaintext.clone(), None, false);
    let ssl = || {
        settings(
            format!("localhost:{}", broker.port + 2),
            Some(tls.clone()),
            false,
        )
    };
    let sasl_ssl = || {
        settings(
            format!("localhost:{}", broker.port + 4),
            Some(tls.clone()),
            true,
        )
    };

    let load = loadavg();
    let runs = reps(quick, 9);
    let batches = if quick { 20 } else { 40 };
    let (mut over_tls, mut over_plain) = (Vec::new(), Vec::new());
    for run in 0..runs {
        over_plain.push(produce_rate(plain(), topic, batches).await?);
        over_tls.push(produce_rate(sasl_ssl(), topic, batches).await?);
        progress!(
            "kafka tls: run {}/{runs}: PLAINTEXT {:.0} records/s, SASL_SSL {:.0} records/s",
            run + 1,
            over_plain[run],
            over_tls[run]
        );
    }
    let setups = reps(quick, 30);
    let (mut set_plain, mut set_ssl, mut set_sasl) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..setups {
        set_plain.push(setup_ms(plain(), topic).await?);
        set_ssl.push(setup_ms(ssl(), topic).await?);
        set_sasl.push(setup_ms(sasl_ssl(), topic).await?);
    }
    let sasl_ssl_records_per_s = Stat::of(&over_tls);
    let plaintext_records_per_s = Stat::of(&over_plain);
    let figure = KafkaTlsFigure {
        records: (batches * BATCH) as u64,
        batch: BATCH,
        ratio: sasl_ssl_records_per_s.median / plaintext_records_per_s.median,
        sasl_ssl_records_per_s,
        plaintext_records_per_s,
        setup_plaintext_ms: Stat::of(&set_plain),
        setup_ssl_ms: Stat::of(&set_ssl),
        setup_sasl_ssl_ms: Stat::of(&set_sasl),
        loadavg_at_start: load,
    };
    progress!(
        "kafka tls: SASL_SSL/PLAINTEXT {:.2}x; set-up median PLAINTEXT {:.1} ms, SSL {:.1} ms, SASL_SSL {:.1} ms",
        figure.ratio,
        figure.setup_plaintext_ms.median,
        figure.setup_ssl_ms.median,
        figure.setup_sasl_ssl_ms.median
    );
    drop(broker);
    Ok(figure)
}
