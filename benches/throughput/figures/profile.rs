//! The profile pass (after every timed figure, not a figure of the table):
//! PostgreSQL restarted with `pg_stat_statements`, one run per side at
//! batch 50, 200 and 1000, statements and server time per batch.

use anyhow::{Result, ensure};
use diesel::{
    QueryableByName,
    sql_types::{BigInt, Double, Text},
};
use diesel_async::RunQueryDsl;
use serde::{Deserialize, Serialize};

use super::expiry::{Side, expire_all};
use crate::{
    progress,
    support::{self, Services},
    templates::DueSet,
};

/// One profiled run (an entry of `results.json`'s
/// `profile_pg_stat_statements`).
#[derive(Debug, Serialize, Deserialize)]
pub struct ProfileRun {
    /// `Worker` or `Raw`.
    pub side: String,
    pub batch: u32,
    pub rows: u64,
    pub transactions: u32,
    pub wall_ms: f64,
    /// Execution and planning time of every statement, server side.
    pub server_ms: f64,
    pub client_and_network_ms: f64,
    pub client_cpu_ms: f64,
    pub statements_per_transaction: f64,
    pub wal_records_per_booking: f64,
    pub statements: Vec<Statement>,
}

/// One normalised statement of a profiled run.
#[derive(Debug, Serialize, Deserialize, QueryableByName)]
pub struct Statement {
    #[diesel(sql_type = Text)]
    pub query: String,
    #[diesel(sql_type = BigInt)]
    pub calls: i64,
    #[diesel(sql_type = BigInt)]
    pub rows: i64,
    #[diesel(sql_type = Double)]
    pub exec_ms: f64,
    #[diesel(sql_type = Double)]
    pub plan_ms: f64,
    #[diesel(sql_type = BigInt)]
    pub plans: i64,
    #[diesel(sql_type = BigInt)]
    pub wal_records: i64,
}

/// Restarts PostgreSQL with `pg_stat_statements` (no timed figure may
/// follow), then profiles both sides on `backlog`.
pub async fn measure(svc: &Services, backlog: &DueSet<'_>) -> Result<Vec<ProfileRun>> {
    progress!("profile pass: restarting PostgreSQL with pg_stat_statements");
    enable_pg_stat_statements(svc).await?;
    let mut runs = Vec::new();
    for batch in [50, 200, 1000] {
        for side in [Side::Worker, Side::Raw] {
            runs.push(profile_run(svc, backlog, side, batch).await?);
        }
    }
    Ok(runs)
}

/// Loads `pg_stat_statements` (restarts PostgreSQL: no timed figure may
/// follow) unless it is loaded already.
pub async fn enable_pg_stat_statements(svc: &Services) -> Result<()> {
    if svc
        .show("shared_preload_libraries")
        .await?
        .contains("pg_stat_statements")
    {
        return Ok(());
    }
    // ALTER SYSTEM cannot share a (simple-query) transaction: one at a time.
    svc.admin_exec("ALTER SYSTEM SET shared_preload_libraries = 'pg_stat_statements'")
        .await?;
    let pg_dir = svc.work.join("pg");
    let status = std::process::Command::new("bash")
        .current_dir(support::repo())
        .args([
            "scripts/postgres.sh",
            "restart",
            pg_dir.to_str().unwrap_or_default(),
        ])
        .stdout(std::process::Stdio::null())
        .status()?;
    ensure!(status.success(), "scripts/postgres.sh restart failed");
    // Its own parameters exist only once the library is loaded.
    svc.admin_exec("ALTER SYSTEM SET pg_stat_statements.track_planning = on")
        .await?;
    svc.admin_exec("SELECT pg_reload_conf()").await?;
    svc.admin_exec("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        .await
}

/// Whitespace collapsed to single spaces.
fn one_line(query: &str) -> String {
    query.split_whitespace().collect::<Vec<_>>().join(" ")
}

async fn profile_run(
    svc: &Services,
    backlog: &DueSet<'_>,
    side: Side,
    batch: u32,
) -> Result<ProfileRun> {
    let db = svc.copy(&backlog.template.name).await?;
    let url = svc.url_of(&db);
    svc.admin_exec("SELECT pg_stat_statements_reset()").await?;
    let cpu_before = support::process_cpu_ms();
    let run = expire_all(&url, side, backlog.as_of, batch, 1, backlog.due).await?;
    let client_cpu_ms = support::process_cpu_ms() - cpu_before;
    svc.wait_idle(&db).await?;
    let mut conn = svc.admin().await?;
    let stats: Vec<Statement> = diesel::sql_query(
        "SELECT s.query, s.calls, s.rows, s.total_exec_time AS exec_ms,
                s.total_plan_time AS plan_ms, s.plans, s.wal_records
           FROM pg_stat_statements s JOIN pg_database d ON d.oid = s.dbid
          WHERE d.datname = $1 AND s.toplevel
          ORDER BY s.total_exec_time DESC",
    )
    .bind::<Text, _>(&db)
    .load(&mut conn)
    .await?;
    drop(conn);
    svc.drop_db(&db).await?;
    let tx = f64::from(run.batches);
    let wall_ms = run.secs * 1e3;
    let server_ms: f64 = stats.iter().map(|s| s.exec_ms + s.plan_ms).sum();
    // The measured work only: the pools' session SETs run once per connection.
    let per_batch: Vec<Statement> = stats
        .into_iter()
        .filter(|s| {
            !s.query
                .trim_start()
                .to_ascii_uppercase()
                .starts_with("SET ")
        })
        .map(|s| Statement {
            query: one_line(&s.query),
            ..s
        })
        .collect();
    let statements: i64 = per_batch.iter().map(|s| s.calls).sum();
    let wal: i64 = per_batch.iter().map(|s| s.wal_records).sum();
    progress!(
        "profile {side:?} batch {batch}: {} rows, {} transactions, {:.2} statements/transaction, \
         server {:.0} ms of {:.0} ms wall ({:.0}%), client CPU {:.0} ms, {:.1} WAL records/booking",
        run.expired,
        run.batches,
        statements as f64 / tx,
        server_ms,
        wall_ms,
        100.0 * server_ms / wall_ms,
        client_cpu_ms,
        wal as f64 / run.expired as f64
    );
    for s in &per_batch {
        let short: String = s.query.chars().take(110).collect();
        progress!(
            "    {:>6} calls {:>7} rows {:>8.1} ms exec {:>6.1} ms plan ({} plans) {:>7} WAL | {short}",
            s.calls,
            s.rows,
            s.exec_ms,
            s.plan_ms,
            s.plans,
            s.wal_records
        );
    }
    Ok(ProfileRun {
        side: format!("{side:?}"),
        batch,
        rows: run.expired,
        transactions: run.batches,
        wall_ms,
        server_ms,
        client_and_network_ms: wall_ms - server_ms,
        client_cpu_ms,
        statements_per_transaction: statements as f64 / tx,
        wal_records_per_booking: wal as f64 / run.expired as f64,
        statements: per_batch,
    })
}
