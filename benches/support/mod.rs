//! The benchmark's plumbing: a throwaway PostgreSQL and Kafka broker started
//! with the project's own scripts, databases copied from seeded templates,
//! statistics over repetitions, progress lines and the machine's load.
//! Servers, databases and topics come from `testkit`, shared with the tests.

pub mod plot;

use std::{
    fs,
    os::unix::fs::PermissionsExt,
    path::PathBuf,
    sync::atomic::{AtomicU32, Ordering},
    time::{Duration, Instant},
};

use anyhow::{Context, Result};
use booking_expiration::{config::DatabaseSettings, libpq::DatabaseUrl};
use diesel::{QueryableByName, sql_types::Text};
use diesel_async::{AsyncConnection, AsyncPgConnection, RunQueryDsl};
use serde::{Deserialize, Serialize};
use std::sync::OnceLock;
use testkit::{
    kafka::Kafka,
    postgres::{Count, Postgres},
};
pub use testkit::{postgres::count, repo};

static START: OnceLock<Instant> = OnceLock::new();

/// Marks the start of the run for the progress clock.
/// The wall clock, through the product's one clock seam (clippy.toml).
pub fn wall_now() -> chrono::DateTime<chrono::Utc> {
    booking_expiration::clock::Clock::now(&booking_expiration::clock::SystemClock)
}

pub fn start_clock() {
    START.get_or_init(Instant::now);
}

/// One progress line on stderr, prefixed by the time since start.
#[macro_export]
macro_rules! progress {
    ($($arg:tt)*) => {
        eprintln!("[{:>7.1}s] {}", $crate::support::elapsed_s(), format!($($arg)*))
    };
}

pub fn elapsed_s() -> f64 {
    START.get_or_init(Instant::now).elapsed().as_secs_f64()
}

/// `/proc/loadavg`: the 1, 5 and 15 minute load averages.
pub fn loadavg() -> [f64; 3] {
    let text = fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let mut it = text
        .split_whitespace()
        .map(|v| v.parse().unwrap_or(f64::NAN));
    [
        it.next().unwrap_or(f64::NAN),
        it.next().unwrap_or(f64::NAN),
        it.next().unwrap_or(f64::NAN),
    ]
}

/// CPU time (user + system) this process used so far, in milliseconds
/// (`/proc/self/stat`, clock ticks of 10 ms).
pub fn process_cpu_ms() -> f64 {
    let stat = fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // Fields after the command name, which is in parentheses.
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    // utime and stime are fields 14 and 15 of the line: 11 and 12 after ')'.
    (ticks(11) + ticks(12)) * 10.0
}

/// Fields of `/proc/PID/stat` after the command name (which is in
/// parentheses and may hold spaces): index 0 is the state (field 3).
fn proc_stat_fields(pid: u32) -> Option<Vec<u64>> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = stat.rsplit_once(')')?.1;
    // The state is a letter; every other field used here is a number.
    Some(
        rest.split_whitespace()
            .map(|v| v.parse::<u64>().unwrap_or(0))
            .collect(),
    )
}

/// CPU time of one process (all its threads), user + system, in
/// milliseconds (`/proc/PID/stat`, clock ticks of 10 ms); `None` once it
/// is gone.
pub fn pid_cpu_ms(pid: u32) -> Option<f64> {
    let f = proc_stat_fields(pid)?;
    // utime and stime are fields 14 and 15: 11 and 12 after ')'.
    Some((f.get(11)? + f.get(12)?) as f64 * 10.0)
}

/// CPU time of a process tree's root and everything it started, in
/// milliseconds: the root's own time, the time of its children that
/// exited (`cutime + cstime`: counted once the root reaped them) and that
/// of its live children (each from `/proc/PID/schedstat`, exact). For the
/// postmaster that is the whole PostgreSQL cluster: backends, background
/// workers, the checkpointer and the WAL writer. A child that exits
/// between two readings moves from the live sum to the reaped one, which
/// `/proc` gives in 10 ms ticks: keep the processes of what is measured
/// alive until the second reading, and a difference is exact to a tick.
pub fn tree_cpu_ms(root: u32) -> f64 {
    let Some(f) = proc_stat_fields(root) else {
        return f64::NAN;
    };
    // cutime and cstime: fields 16 and 17, 13 and 14 after ')'.
    let reaped = (f.get(13).unwrap_or(&0) + f.get(14).unwrap_or(&0)) as f64 * 10.0;
    let mut live = run_time_ms(root);
    if let Ok(dir) = fs::read_dir("/proc") {
        for entry in dir.flatten() {
            let Some(pid) = entry
                .file_name()
                .to_str()
                .and_then(|n| n.parse::<u32>().ok())
            else {
                continue;
            };
            // The parent pid is field 4: 1 after ')'.
            if let Some(f) = proc_stat_fields(pid)
                && f.get(1) == Some(&u64::from(root))
            {
                live += run_time_ms(pid);
            }
        }
    }
    reaped + live
}

/// Time on a CPU of a single-threaded process (PostgreSQL's are), exact to
/// the nanosecond (`/proc/PID/schedstat`'s first field), in milliseconds;
/// its ticks from `/proc/PID/stat` where schedstat is missing; 0 once it
/// is gone.
pub fn run_time_ms(pid: u32) -> f64 {
    if let Some(ns) = fs::read_to_string(format!("/proc/{pid}/schedstat"))
        .ok()
        .and_then(|t| t.split_whitespace().next()?.parse::<f64>().ok())
    {
        return ns / 1e6;
    }
    pid_cpu_ms(pid).unwrap_or(0.0)
}

/// The machine's CPU time so far from `/proc/stat`, in milliseconds:
/// `(busy, all)` over every core (busy: all but idle and iowait).
pub fn machine_cpu_ms() -> (f64, f64) {
    let text = fs::read_to_string("/proc/stat").unwrap_or_default();
    let Some(line) = text.lines().find(|l| l.starts_with("cpu ")) else {
        return (f64::NAN, f64::NAN);
    };
    let v: Vec<f64> = line
        .split_whitespace()
        .skip(1)
        .map(|x| x.parse().unwrap_or(0.0))
        .collect();
    // user nice system idle iowait irq softirq steal (guest is in user).
    let all: f64 = v.iter().take(8).sum();
    let idle = v.get(3).unwrap_or(&0.0) + v.get(4).unwrap_or(&0.0);
    ((all - idle) * 10.0, all * 10.0)
}

/// min / median / max of repeated samples.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Stat {
    pub min: f64,
    pub median: f64,
    pub max: f64,
    pub samples: Vec<f64>,
}

impl Stat {
    pub fn of(samples: &[f64]) -> Self {
        assert!(!samples.is_empty(), "no samples");
        let mut sorted = samples.to_vec();
        sorted.sort_by(|a, b| a.total_cmp(b));
        let n = sorted.len();
        let median = if n % 2 == 1 {
            sorted[n / 2]
        } else {
            (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0
        };
        Self {
            min: sorted[0],
            median,
            max: sorted[n - 1],
            samples: samples.to_vec(),
        }
    }

    /// "min / median / max" with a unit formatter.
    pub fn show(&self, fmt: impl Fn(f64) -> String) -> String {
        format!(
            "{} / {} / {}",
            fmt(self.min),
            fmt(self.median),
            fmt(self.max)
        )
    }
}

/// The in-process worker logs as the binary does at its defaults (level
/// `info` unless `RUST_LOG` says otherwise, text unless `LOG_FORMAT=json`,
/// the same spans), into `path`: a file, as a container's stdout is. Every
/// in-process figure is measured with this logging on. Keep the guard for
/// the run.
pub fn log_like_the_binary(
    path: &std::path::Path,
) -> Result<booking_expiration::telemetry::trace::TraceGuard> {
    use booking_expiration::telemetry::{
        logging::{self, LogFormat},
        trace::{self, TraceEnv},
    };
    let file = fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)?;
    let env = TraceEnv {
        export: false,
        default_service_name: true,
    };
    let (provider, guard) = trace::provider(&env)?;
    logging::install(&provider, LogFormat::from_env(), Box::new(file), false);
    Ok(guard)
}

/// Thousands separators for rates and counts.
pub fn num(v: f64) -> String {
    if !v.is_finite() {
        return "n/a".into();
    }
    let rounded = v.round() as i64;
    let digits = rounded.abs().to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    if rounded < 0 { format!("-{out}") } else { out }
}

pub fn db_settings(url: &str, pool_size: u32) -> DatabaseSettings {
    DatabaseSettings {
        pool_size,
        connect_timeout: Duration::from_secs(10),
        statement_timeout: Duration::from_secs(600),
        ..DatabaseSettings::new(DatabaseUrl::parse(url).expect("the cluster's URL parses"))
    }
}

#[derive(QueryableByName)]
struct OneText {
    #[diesel(sql_type = Text)]
    v: String,
}

/// The pid of the PostgreSQL backend serving `conn` (its CPU is the
/// bench's own, left out of what a figure measures: [`run_time_ms`]).
pub async fn backend_pid(conn: &mut AsyncPgConnection) -> Result<u32> {
    #[derive(QueryableByName)]
    struct Pid {
        #[diesel(sql_type = diesel::sql_types::Integer)]
        pid: i32,
    }
    let row: Pid = diesel::sql_query("SELECT pg_backend_pid() AS pid")
        .get_result(conn)
        .await?;
    Ok(u32::try_from(row.pid)?)
}

/// Whether the switch in the environment variable `name` is on: set, not
/// empty and not `0`.
pub fn env_flag(name: &str) -> bool {
    std::env::var(name).is_ok_and(|v| !v.is_empty() && v != "0")
}

/// The comma-separated list in the environment variable `name` (`what` its
/// items, for the error), or `None` when it is unset or empty: a figure's
/// own values overridden for trying (committed runs use the defaults).
pub fn env_list<T>(name: &str, what: &str) -> Result<Option<Vec<T>>>
where
    T: std::str::FromStr,
    T::Err: std::error::Error + Send + Sync + 'static,
{
    match std::env::var(name) {
        Ok(list) if !list.trim().is_empty() => list
            .split(',')
            .map(|item| item.trim().parse::<T>())
            .collect::<Result<Vec<_>, _>>()
            .map(Some)
            .with_context(|| format!("{name}: {what}, comma-separated")),
        _ => Ok(None),
    }
}

/// The PostgreSQL cluster and the Kafka broker of this run; both are
/// stopped (and their folder removed) on drop and on Ctrl-C.
pub struct Services {
    pub work: PathBuf,
    pub admin_url: String,
    pub kafka_bootstrap: String,
    // Dropped before `Services::drop` removes the folder: fields drop after
    // it, so `drop` stops them explicitly (Kafka first, as before).
    kafka: Option<Kafka>,
    postgres: Option<Postgres>,
    copies: AtomicU32,
}

impl Services {
    pub fn start() -> Result<Self> {
        let work =
            std::env::temp_dir().join(format!("booking-expiration-bench-{}", std::process::id()));
        fs::create_dir_all(&work)?;
        // The postgres OS user owns the cluster inside.
        fs::set_permissions(&work, fs::Permissions::from_mode(0o755))?;
        let ports = testkit::free_port_pairs(2);
        let (pg_port, kafka_port) = (ports[0], ports[1]);
        // `BENCH_PG_OPTIONS` (e.g. `-c max_wal_size=64GB`): server options
        // for trying what a setting changes; the committed runs use none.
        let options = std::env::var("BENCH_PG_OPTIONS").unwrap_or_default();
        let options: Vec<&str> = options.split_whitespace().collect();
        if options.is_empty() {
            progress!(
                "starting PostgreSQL on 127.0.0.1:{pg_port} (default settings: fsync and synchronous_commit on)"
            );
        } else {
            progress!(
                "starting PostgreSQL on 127.0.0.1:{pg_port} with BENCH_PG_OPTIONS {options:?} (NOT the defaults)"
            );
        }
        let postgres = Postgres::start(&work.join("pg"), pg_port, &options)?;
        {
            let work = work.clone();
            tokio::spawn(async move {
                if tokio::signal::ctrl_c().await.is_ok() {
                    eprintln!("interrupted: stopping Kafka and PostgreSQL");
                    Kafka::stop_dir(&work.join("kafka"));
                    Postgres::stop_dir(&work.join("pg"));
                    let _ = fs::remove_dir_all(&work);
                    std::process::exit(130);
                }
            });
        }
        let mut services = Services {
            work: work.clone(),
            admin_url: postgres.admin_url.clone(),
            kafka_bootstrap: format!("127.0.0.1:{kafka_port}"),
            kafka: None,
            postgres: Some(postgres),
            copies: AtomicU32::new(0),
        };
        progress!("starting Kafka on {}", services.kafka_bootstrap);
        services.kafka = Some(Kafka::start(&work.join("kafka"), kafka_port)?);
        Ok(services)
    }

    /// The postmaster's pid (`postmaster.pid`'s first line): the root of
    /// every PostgreSQL process ([`tree_cpu_ms`]).
    pub fn postmaster_pid(&self) -> Result<u32> {
        let text = fs::read_to_string(self.work.join("pg/data/postmaster.pid"))?;
        text.lines()
            .next()
            .and_then(|l| l.trim().parse().ok())
            .ok_or_else(|| anyhow::anyhow!("no pid in postmaster.pid"))
    }

    /// The Kafka broker's pid (`kafka.pid` of `scripts/kafka.sh`).
    pub fn kafka_pid(&self) -> Result<u32> {
        let text = fs::read_to_string(self.work.join("kafka/kafka.pid"))?;
        text.trim()
            .parse()
            .map_err(|_| anyhow::anyhow!("no pid in kafka.pid"))
    }

    pub fn url_of(&self, db: &str) -> String {
        testkit::postgres::url_of(&self.admin_url, db).expect("admin URL")
    }

    pub async fn admin(&self) -> Result<AsyncPgConnection> {
        Ok(AsyncPgConnection::establish(&self.admin_url).await?)
    }

    pub async fn admin_exec(&self, sql: &str) -> Result<()> {
        testkit::postgres::exec(&self.admin_url, sql).await
    }

    /// `SHOW name` on the cluster.
    pub async fn show(&self, name: &str) -> Result<String> {
        let mut conn = self.admin().await?;
        let row: OneText = diesel::sql_query(format!("SELECT current_setting('{name}') AS v"))
            .get_result(&mut conn)
            .await?;
        Ok(row.v)
    }

    /// Waits until nobody is connected to `db` (a template must be idle).
    pub async fn wait_idle(&self, db: &str) -> Result<()> {
        let mut conn = self.admin().await?;
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let row: Count = diesel::sql_query(
                "SELECT count(*)::bigint AS n FROM pg_stat_activity WHERE datname = $1",
            )
            .bind::<Text, _>(db)
            .get_result(&mut conn)
            .await?;
            if row.n == 0 {
                return Ok(());
            }
            if Instant::now() > deadline {
                diesel::sql_query(
                    "SELECT count(pg_terminate_backend(pid))::bigint AS n FROM pg_stat_activity WHERE datname = $1",
                )
                .bind::<Text, _>(db)
                .get_result::<Count>(&mut conn)
                .await?;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// A fresh copy of `template` (a file copy: fast, and the copy starts
    /// with the template's statistics and visibility map).
    pub async fn copy(&self, template: &str) -> Result<String> {
        let n = self.copies.fetch_add(1, Ordering::Relaxed);
        let name = format!("run_{n}");
        self.wait_idle(template).await?;
        self.admin_exec(&format!(
            "CREATE DATABASE {name} TEMPLATE {template} STRATEGY FILE_COPY"
        ))
        .await?;
        Ok(name)
    }

    pub async fn drop_db(&self, db: &str) -> Result<()> {
        testkit::postgres::drop_database(&self.admin_url, db).await
    }
}

impl Drop for Services {
    fn drop(&mut self) {
        progress!("stopping Kafka and PostgreSQL");
        drop(self.kafka.take());
        drop(self.postgres.take());
        if std::env::var_os("BENCH_KEEP").is_none() {
            let _ = fs::remove_dir_all(&self.work);
        }
    }
}

/// A client of the run's broker.
pub async fn kafka_client(svc: &Services) -> Result<rskafka::client::Client> {
    testkit::kafka::client(vec![svc.kafka_bootstrap.clone()]).await
}

/// Records on `topic`: the sum of the high watermarks of its `partitions`.
pub async fn records_on(
    client: &rskafka::client::Client,
    topic: &str,
    partitions: i32,
) -> Result<u64> {
    let mut total = 0;
    for p in 0..partitions {
        let pc = client
            .partition_client(
                topic,
                p,
                rskafka::client::partition::UnknownTopicHandling::Retry,
            )
            .await?;
        total += pc
            .get_offset(rskafka::client::partition::OffsetAt::Latest)
            .await?;
    }
    Ok(total as u64)
}

/// Creates `name` with `partitions` partitions on the run's broker.
pub async fn create_topic(svc: &Services, name: &str, partitions: i32) -> Result<()> {
    testkit::kafka::create_topic(vec![svc.kafka_bootstrap.clone()], name, partitions).await
}

/// Produces `records` to `topic` through the project's Kafka transport as
/// the publisher does: grouped by the Java partitioner's partition, one
/// request per partition, the partitions side by side.
pub async fn produce_keyed(
    transport: &booking_expiration::outbox::KafkaTransport,
    topic: &str,
    partitions: i32,
    records: Vec<booking_expiration::outbox::OutgoingRecord>,
) -> Result<()> {
    use booking_expiration::outbox::Transport;
    let mut by_partition: std::collections::BTreeMap<i32, Vec<_>> = Default::default();
    for record in records {
        let partition = booking_expired_proto::partition_for_key(record.key.as_bytes(), partitions);
        by_partition.entry(partition).or_default().push(record);
    }
    let sends = by_partition
        .into_iter()
        .map(|(partition, records)| transport.produce(topic, partition, partitions, records));
    for result in futures_util::future::join_all(sends).await {
        result?;
    }
    Ok(())
}
