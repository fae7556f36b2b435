//! Figures 5 and 6, end to end with the release binary as a child process:
//! wall time from spawn until every due booking is on Kafka, outbox write →
//! broker ack latency, peak RSS, and the binary's size.

use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use diesel::{
    QueryableByName,
    sql_types::{BigInt, Double},
};
use diesel_async::{AsyncConnection, AsyncPgConnection, RunQueryDsl};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use super::reps;
use crate::{
    progress,
    support::{Services, Stat, create_topic, kafka_client, loadavg},
    templates::{DueSet, Template, due_at},
};

/// The binary the bench was built with (bench profile = release profile).
const BINARY: &str = env!("CARGO_BIN_EXE_booking-expiration");

/// The end-to-end figure (`results.json`'s `end_to_end`).
#[derive(Debug, Serialize, Deserialize)]
pub struct EndToEnd {
    /// Due bookings, all of which must reach Kafka.
    pub events: u64,
    pub wall_s: Stat,
    pub write_to_ack_p50_ms: Stat,
    pub write_to_ack_p99_ms: Stat,
    pub peak_rss_mib: Stat,
    pub loadavg_at_start: [f64; 3],
    pub runs: Vec<Run>,
}

/// One end-to-end run.
#[derive(Debug, Serialize, Deserialize)]
pub struct Run {
    pub wall_s: f64,
    /// First to last outbox write.
    pub expiry_span_s: f64,
    pub first_write_after_start_s: f64,
    pub last_ack_after_start_s: f64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub max_ms: f64,
    pub peak_rss_kib: u64,
    pub clean_exit: bool,
}

/// The release binary (`results.json`'s `binary`).
#[derive(Debug, Serialize, Deserialize)]
pub struct Binary {
    pub path: String,
    pub bytes: u64,
}

impl Binary {
    pub fn measure() -> Result<Self> {
        Ok(Self {
            path: BINARY.into(),
            bytes: std::fs::metadata(BINARY)?.len(),
        })
    }
}

/// 5 runs (1 in quick mode) on fresh copies of the backlog's template, each
/// with a fresh topic and the real clock.
pub async fn measure(svc: &Services, backlog: &DueSet<'_>, quick: bool) -> Result<EndToEnd> {
    progress!("5. end to end with {BINARY}");
    let load = loadavg();
    let mut runs = Vec::new();
    let reps = reps(quick, 5);
    for rep in 0..reps {
        let (expected, r) = run_once(svc, backlog.template, rep).await?;
        progress!(
            "end to end: rep {}/{reps} {expected} events on Kafka in {:.2} s (expiry {:.2} s), write->ack p50 {:.1} ms p99 {:.1} ms, peak RSS {:.1} MiB, clean exit {}",
            rep + 1,
            r.wall_s,
            r.expiry_span_s,
            r.p50_ms,
            r.p99_ms,
            r.peak_rss_kib as f64 / 1024.0,
            r.clean_exit
        );
        runs.push(r);
    }
    let stat = |f: fn(&Run) -> f64| Stat::of(&runs.iter().map(f).collect::<Vec<_>>());
    Ok(EndToEnd {
        events: backlog.due,
        wall_s: stat(|r| r.wall_s),
        write_to_ack_p50_ms: stat(|r| r.p50_ms),
        write_to_ack_p99_ms: stat(|r| r.p99_ms),
        peak_rss_mib: stat(|r| r.peak_rss_kib as f64 / 1024.0),
        loadavg_at_start: load,
        runs,
    })
}

#[derive(QueryableByName, Debug)]
struct Latency {
    #[diesel(sql_type = BigInt)]
    n: i64,
    #[diesel(sql_type = Double)]
    p50: f64,
    #[diesel(sql_type = Double)]
    p99: f64,
    #[diesel(sql_type = Double)]
    max: f64,
    #[diesel(sql_type = Double)]
    first_write: f64,
    #[diesel(sql_type = Double)]
    last_write: f64,
    #[diesel(sql_type = Double)]
    last_ack: f64,
}

fn proc_status_kib(pid: u32, field: &str) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find(|l| l.starts_with(field))?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

/// One run: the rows due now in a fresh copy, and what the run measured.
async fn run_once(svc: &Services, template: &Template, rep: usize) -> Result<(u64, Run)> {
    let db = svc.copy(&template.name).await?;
    let url = svc.url_of(&db);
    let expected = due_at(svc, &db, crate::support::wall_now()).await?;
    let topic = format!("bench-e2e-{}", Uuid::new_v4().simple());
    create_topic(svc, &topic, 3).await?;
    let client = kafka_client(svc).await?;
    let mut partitions = Vec::new();
    for p in 0..3 {
        partitions.push(
            client
                .partition_client(
                    topic.as_str(),
                    p,
                    rskafka::client::partition::UnknownTopicHandling::Retry,
                )
                .await?,
        );
    }
    let metrics_port = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    let log_path = svc.work.join(format!("e2e-{rep}.log"));
    let log = std::fs::File::create(&log_path)?;
    let mut command = tokio::process::Command::new(BINARY);
    for name in [
        "EXPIRATION_BATCH_SIZE",
        "OUTBOX_BATCH_SIZE",
        "OUTBOX_RETENTION",
        "NO_WORKER",
        "NO_PUBLISHER",
    ] {
        command.env_remove(name);
    }
    command
        .arg("run")
        .env("DATABASE_URL", &url)
        .env("KAFKA_BOOTSTRAP_SERVERS", &svc.kafka_bootstrap)
        .env("KAFKA_TOPIC", &topic)
        .env("EXPIRATION_INTERVAL", "5s")
        // A long poll: the publisher is driven by the commit notification.
        .env("OUTBOX_POLL_INTERVAL", "10s")
        .env("METRICS_ADDR", format!("127.0.0.1:{metrics_port}"))
        .env_remove("RUST_LOG")
        .stdin(std::process::Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log)
        .kill_on_drop(true);
    let start_epoch = crate::support::wall_now().timestamp_micros() as f64 / 1e6;
    let started = Instant::now();
    let mut child = command
        .spawn()
        .context("start the booking-expiration binary")?;
    let pid = child.id().context("child pid")?;
    let mut peak_rss_kib = 0;
    let deadline = started + Duration::from_secs(180);
    let mut last_report = Instant::now();
    loop {
        let mut on_kafka = 0i64;
        for pc in &partitions {
            on_kafka += pc
                .get_offset(rskafka::client::partition::OffsetAt::Latest)
                .await?;
        }
        if let Some(hwm) = proc_status_kib(pid, "VmHWM:") {
            peak_rss_kib = peak_rss_kib.max(hwm);
        }
        if on_kafka as u64 >= expected {
            break;
        }
        if let Ok(Some(status)) = child.try_wait() {
            bail!(
                "the binary exited early ({status}); log: {}",
                log_path.display()
            );
        }
        if Instant::now() > deadline {
            bail!(
                "only {on_kafka} of {expected} events on Kafka after 180 s; log: {}",
                log_path.display()
            );
        }
        if last_report.elapsed() > Duration::from_secs(5) {
            progress!("end to end: {on_kafka} of {expected} on Kafka");
            last_report = Instant::now();
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let wall_s = started.elapsed().as_secs_f64();
    // Peak RSS of the whole run, read while the process still lives.
    if let Some(hwm) = proc_status_kib(pid, "VmHWM:") {
        peak_rss_kib = peak_rss_kib.max(hwm);
    }
    // Graceful stop of the child we started, by its pid.
    let _ = std::process::Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status();
    let clean_exit = match tokio::time::timeout(Duration::from_secs(30), child.wait()).await {
        Ok(Ok(status)) => status.success(),
        _ => {
            let _ = child.kill().await;
            false
        }
    };
    let mut conn = AsyncPgConnection::establish(&url).await?;
    let latency: Latency = diesel::sql_query(
        "SELECT count(*)::bigint AS n,
                percentile_cont(0.5) WITHIN GROUP (ORDER BY extract(epoch FROM published_at - created_at))::float8 AS p50,
                percentile_cont(0.99) WITHIN GROUP (ORDER BY extract(epoch FROM published_at - created_at))::float8 AS p99,
                max(extract(epoch FROM published_at - created_at))::float8 AS max,
                extract(epoch FROM min(created_at))::float8 AS first_write,
                extract(epoch FROM max(created_at))::float8 AS last_write,
                extract(epoch FROM max(published_at))::float8 AS last_ack
           FROM booking_expiration_outbox WHERE published_at IS NOT NULL",
    )
    .get_result(&mut conn)
    .await?;
    drop(conn);
    ensure!(
        latency.n as u64 == expected,
        "{} rows published, {expected} expected",
        latency.n
    );
    svc.drop_db(&db).await?;
    Ok((
        expected,
        Run {
            wall_s,
            expiry_span_s: latency.last_write - latency.first_write,
            first_write_after_start_s: latency.first_write - start_epoch,
            last_ack_after_start_s: latency.last_ack - start_epoch,
            p50_ms: latency.p50 * 1e3,
            p99_ms: latency.p99 * 1e3,
            max_ms: latency.max * 1e3,
            peak_rss_kib,
            clean_exit,
        },
    ))
}
