//! Figure 16, what logging costs: the release binary's `once` over the
//! 10k-due backlog (a thousand tenants), its stderr in a file as a
//! container's stdout is, at the binary's default level (`info`, text and
//! `LOG_FORMAT=json`) against `RUST_LOG=warn` (no line per booking), on
//! fresh copies of the same template, the order rotating per repetition.

use anyhow::{Context, Result, ensure};
use serde::{Deserialize, Serialize};

use super::reps;
use crate::{
    progress,
    support::{Services, Stat, loadavg},
    templates::{DueSet, due_at},
};

/// The binary the bench was built with (bench profile = release profile).
const BINARY: &str = env!("CARGO_BIN_EXE_booking-expiration");

/// The goal: a cycle with the default logging at most this much longer
/// than the same cycle at `RUST_LOG=warn`.
pub const RATIO_GOAL: f64 = 1.2;
/// Budgets per expired booking and per line.
pub const BYTES_PER_BOOKING_GOAL: f64 = 1024.0;
pub const LONGEST_LINE_GOAL: u64 = 8 * 1024;

/// One logging set-up of the binary.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Setup {
    Text,
    Json,
    Warn,
}

impl Setup {
    const ALL: [Setup; 3] = [Setup::Text, Setup::Json, Setup::Warn];

    fn env(self) -> [(&'static str, Option<&'static str>); 2] {
        match self {
            Setup::Text => [("RUST_LOG", None), ("LOG_FORMAT", None)],
            Setup::Json => [("RUST_LOG", None), ("LOG_FORMAT", Some("json"))],
            Setup::Warn => [("RUST_LOG", Some("warn")), ("LOG_FORMAT", None)],
        }
    }
}

/// One set-up's runs.
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct SetupRuns {
    /// The cycle's own `duration_ms` (from `once`'s report).
    pub cycle_ms: Vec<f64>,
    /// Spawn to exit.
    pub process_ms: Vec<f64>,
    pub log_bytes: Vec<u64>,
    pub longest_line: u64,
}

/// The logging figure (`results.json`'s `logging`).
#[derive(Debug, Serialize, Deserialize)]
pub struct LoggingFigure {
    pub due: u64,
    pub tenants: u64,
    pub text: SetupRuns,
    pub json: SetupRuns,
    pub warn: SetupRuns,
    pub loadavg_at_start: [f64; 3],
}

impl LoggingFigure {
    pub fn cycle(runs: &SetupRuns) -> Stat {
        Stat::of(&runs.cycle_ms)
    }

    /// Median cycle with `runs`' logging over the median at `RUST_LOG=warn`.
    pub fn ratio(&self, runs: &SetupRuns) -> f64 {
        Self::cycle(runs).median / Self::cycle(&self.warn).median
    }

    pub fn bytes_per_booking(&self, runs: &SetupRuns) -> f64 {
        let max = runs.log_bytes.iter().copied().max().unwrap_or(0);
        max as f64 / self.due.max(1) as f64
    }

    pub fn met(&self, runs: &SetupRuns) -> bool {
        self.ratio(runs) <= RATIO_GOAL
            && self.bytes_per_booking(runs) <= BYTES_PER_BOOKING_GOAL
            && runs.longest_line <= LONGEST_LINE_GOAL
    }
}

/// 5 repetitions (1 in quick mode) of each set-up.
pub async fn measure(svc: &Services, backlog: &DueSet<'_>, quick: bool) -> Result<LoggingFigure> {
    progress!("16. logging: default (text, json) against RUST_LOG=warn, `once` over 10k due");
    let load = loadavg();
    let mut runs = [
        SetupRuns::default(),
        SetupRuns::default(),
        SetupRuns::default(),
    ];
    let mut tenants = 0;
    let mut due = 0;
    let reps = reps(quick, 5);
    for rep in 0..reps {
        for k in 0..Setup::ALL.len() {
            let i = (rep + k) % Setup::ALL.len();
            let setup = Setup::ALL[i];
            let db = svc.copy(&backlog.template.name).await?;
            let url = svc.url_of(&db);
            let expected = due_at(svc, &db, crate::support::wall_now()).await?;
            tenants = count_tenants(svc, &db).await?;
            let run = run_once(svc, &url, setup, rep).await?;
            ensure!(
                run.expired == expected,
                "{setup:?}: {} expired, {expected} due",
                run.expired
            );
            due = expected;
            progress!(
                "logging: rep {}/{reps} {setup:?}: cycle {:.0} ms, process {:.0} ms, {} log bytes ({:.0} per booking), longest line {}",
                rep + 1,
                run.cycle_ms,
                run.process_ms,
                run.log_bytes,
                run.log_bytes as f64 / expected.max(1) as f64,
                run.longest_line
            );
            let r = &mut runs[i];
            r.cycle_ms.push(run.cycle_ms);
            r.process_ms.push(run.process_ms);
            r.log_bytes.push(run.log_bytes);
            r.longest_line = r.longest_line.max(run.longest_line);
            svc.drop_db(&db).await?;
        }
    }
    let [text, json, warn] = runs;
    Ok(LoggingFigure {
        due,
        tenants,
        text,
        json,
        warn,
        loadavg_at_start: load,
    })
}

async fn count_tenants(svc: &Services, db: &str) -> Result<u64> {
    use diesel_async::{AsyncConnection, AsyncPgConnection, RunQueryDsl};
    #[derive(diesel::QueryableByName)]
    struct N {
        #[diesel(sql_type = diesel::sql_types::BigInt)]
        n: i64,
    }
    let mut conn = AsyncPgConnection::establish(&svc.url_of(db)).await?;
    let n: N = diesel::sql_query("SELECT count(DISTINCT tenant_id) AS n FROM bookings")
        .get_result(&mut conn)
        .await?;
    Ok(n.n as u64)
}

struct Run {
    expired: u64,
    cycle_ms: f64,
    process_ms: f64,
    log_bytes: u64,
    longest_line: u64,
}

async fn run_once(svc: &Services, url: &str, setup: Setup, rep: usize) -> Result<Run> {
    let log_path = svc.work.join(format!("logging-{setup:?}-{rep}.log"));
    let log = std::fs::File::create(&log_path)?;
    let mut command = tokio::process::Command::new(BINARY);
    for name in ["EXPIRATION_BATCH_SIZE", "OTEL_EXPORTER_OTLP_ENDPOINT"] {
        command.env_remove(name);
    }
    for (name, value) in setup.env() {
        match value {
            Some(value) => command.env(name, value),
            None => command.env_remove(name),
        };
    }
    command
        .arg("once")
        .env("DATABASE_URL", url)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(log)
        .kill_on_drop(true);
    let started = std::time::Instant::now();
    // Not `output()`: it would pipe stderr too, and the log must go to the file.
    let output = command
        .spawn()
        .context("start once")?
        .wait_with_output()
        .await
        .context("run once")?;
    let process_ms = started.elapsed().as_secs_f64() * 1e3;
    let text = std::fs::read_to_string(&log_path)?;
    ensure!(
        output.status.success(),
        "once failed ({}); log {}",
        output.status,
        log_path.display()
    );
    let report: serde_json::Value =
        serde_json::from_slice(&output.stdout).context("once's JSON report")?;
    let count = |key: &str| report[key].as_u64().unwrap_or(0);
    let run = Run {
        expired: count("reserve_expired_count") + count("booking_expired_count"),
        cycle_ms: count("duration_ms") as f64,
        process_ms,
        log_bytes: text.len() as u64,
        longest_line: text.lines().map(str::len).max().unwrap_or(0) as u64,
    };
    std::fs::remove_file(&log_path)?;
    Ok(run)
}
