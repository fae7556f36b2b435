//! What the scenarios read beside the traffic: the cluster in sync, the
//! worker's readiness and produce errors, what a claim costs, the
//! database's statements and CPU, the worker's memory and log, and the
//! lines that print them; progress on stderr.

use super::*;

/// Waits until every partition of `topic` has a leader and all three
/// replicas in sync (a restarted broker caught up).
pub(super) async fn wait_in_sync(cluster: &Cluster, topic: &str, timeout: Duration) {
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

pub(super) fn in_sync(o: &Observed) -> bool {
    o.leader >= 0 && o.isr.len() == 3
}

pub(super) async fn readyz(addr: &str) -> Option<u16> {
    http_get(addr, "/readyz").await.map(|r| r.0)
}

/// Progress on the process's stderr at once (the scenarios take minutes).
pub(super) fn progress(what: &str) {
    use std::io::Write;
    let _ = writeln!(
        std::io::stderr(),
        "kafka_cluster {}: {what}",
        wall_now().format("%H:%M:%S%.3f")
    );
}

pub(super) fn secs(d: Duration) -> String {
    format!("{:.1} s", d.as_secs_f64())
}

pub(super) async fn sleep_until_ms(t: i64) {
    let left = t - now_ms();
    if left > 0 {
        tokio::time::sleep(ms(left)).await;
    }
}

/// What one claim of the worker costs now, as the pipeline asks it while
/// partition 0 of `topic` (3 partitions) holds its share: the claim
/// statement itself under `EXPLAIN (ANALYZE, BUFFERS)`, rolled back (the
/// rows it leases for that moment are skipped by the worker's own claim).
pub(super) async fn claim_cost(db: &TestDb, topic: &str) -> String {
    let room = |partition| db::outbox::PartitionRoom {
        topic: topic.to_owned(),
        count: 3,
        partition,
        room: 500,
        after: 0,
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
pub(super) struct Activity {
    pub(super) stop: tokio_util::sync::CancellationToken,
    pub(super) task: tokio::task::JoinHandle<Vec<SeenStatement>>,
}

/// One statement seen running: backend, start (epoch ms), last seen
/// running (epoch ms), its first characters.
#[derive(Debug, Clone, QueryableByName)]
pub(super) struct SeenStatement {
    #[diesel(sql_type = diesel::sql_types::Integer)]
    pub(super) pid: i32,
    #[diesel(sql_type = diesel::sql_types::BigInt)]
    pub(super) started: i64,
    #[diesel(sql_type = diesel::sql_types::BigInt)]
    pub(super) at: i64,
    #[diesel(sql_type = Text)]
    pub(super) query: String,
}

impl Activity {
    pub(super) async fn start(db: &TestDb) -> Self {
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
    pub(super) async fn stop(self, from: i64, n: usize) -> String {
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
pub(super) async fn pg_cpu_ticks(db: &TestDb) -> u64 {
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
pub(super) fn cpu_ticks(pid: u32) -> u64 {
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
pub(super) fn cpu_pct(ticks: u64, ms: i64) -> String {
    format!("{:.0}%", ticks as f64 * 1000.0 / ms.max(1) as f64)
}

/// The worker's log lines at WARN or ERROR (JSON or text format).
pub(super) fn warn_error_lines(log: &str) -> usize {
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
pub(super) struct RssSampler {
    pub(super) stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    pub(super) thread: Option<std::thread::JoinHandle<Vec<(i64, i64)>>>,
}

impl RssSampler {
    pub(super) fn start(pid: u32) -> Self {
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
    pub(super) fn stop(mut self) -> Vec<(i64, i64)> {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        self.thread
            .take()
            .and_then(|t| t.join().ok())
            .unwrap_or_default()
    }
}

/// `VmRSS` of `/proc/PID/status`, in KiB.
pub(super) fn rss_kib(pid: u32) -> Option<i64> {
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

pub(super) fn mib(kib: i64) -> String {
    format!("{:.1} MiB", kib as f64 / 1024.0)
}

/// With `KAFKA_CLUSTER_LOG_DIR=…`: the brokers' logs and the watcher's
/// files of the cluster in `dir` are copied there (`PROFILE-nodeN.log`,
/// `PROFILE-TOPIC.watch`) before the folder is removed.
pub(super) fn keep_logs(dir: &Path, profile: ClusterProfile) {
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

/// The `crm_booking_expiration_outbox_produce_errors_total` lines.
pub(super) async fn produce_error_codes(addr: &str) -> Vec<String> {
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
