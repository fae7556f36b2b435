//! Figure 3, the idle cycle: cycles with nothing due over 1M bookings, then
//! `EXPLAIN (ANALYZE, BUFFERS)` of the worker's own statements, checking
//! that each plan names its partial index.

use std::time::Instant;

use anyhow::{Result, ensure};
use booking_expiration::{
    domain::{Phase, RunId},
    expiry::CycleStart,
};
use chrono::{DateTime, Utc};
use diesel::{
    QueryableByName,
    sql_types::{Array, BigInt, Nullable, Text, Timestamptz, Uuid as SqlUuid},
};
use diesel_async::{AsyncConnection, AsyncPgConnection, RunQueryDsl};
use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use super::{expiry, pools};
use crate::{
    phase_sql::phase_sql,
    progress,
    support::{Services, Stat, loadavg},
    templates::Template,
};

/// The idle figure (`results.json`'s `idle_cycle`).
#[derive(Debug, Serialize, Deserialize)]
pub struct IdleCycle {
    /// Bookings in the table.
    pub table_rows: u64,
    /// Cycle time in milliseconds.
    pub ms: Stat,
    pub loadavg_at_start: [f64; 3],
    /// Every plan named its phase's partial index.
    pub partial_indexes_used: bool,
    pub plans: Vec<Plan>,
}

/// One `EXPLAIN (ANALYZE, BUFFERS)`.
#[derive(Debug, Serialize, Deserialize)]
pub struct Plan {
    pub name: String,
    pub sql: String,
    pub plan: String,
}

/// `reps` timed cycles at the template's `as_of` (nothing due), after one
/// untimed cycle that prepares the statements; then the plans.
pub async fn measure(svc: &Services, template: &Template, reps: usize) -> Result<IdleCycle> {
    let db = svc.copy(&template.name).await?;
    let url = svc.url_of(&db);
    let load = loadavg();
    let pool = pools(&url, 1).await?.remove(0);
    let worker = expiry::worker(pool.clone(), template.as_of, 200);
    let token = CancellationToken::new();
    // One untimed cycle prepares the statements, as in a running worker.
    worker
        .run_cycle(CycleStart::new(&token).at(template.as_of, RunId::generate()))
        .await?;
    let mut ms = Vec::new();
    for _ in 0..reps {
        let started = Instant::now();
        let outcome = worker
            .run_cycle(CycleStart::new(&token).at(template.as_of, RunId::generate()))
            .await?;
        ms.push(started.elapsed().as_secs_f64() * 1e3);
        ensure!(outcome.report.expired() == 0, "idle cycle expired rows");
    }
    let ms = Stat::of(&ms);
    progress!(
        "idle cycle over {} bookings: {} ms (min/median/max of {reps})",
        template.rows,
        ms.show(|v| format!("{v:.2}"))
    );
    let mut conn = AsyncPgConnection::establish(&url).await?;
    let mut plans = Vec::new();
    let mut indexes_used = true;
    for phase in Phase::ALL {
        let sql = phase_sql(phase);
        let lock_plan = explain(&mut conn, &sql.lock_due, template.as_of, Some(200)).await?;
        let count_plan = explain(&mut conn, &sql.count_due_excluding, template.as_of, None).await?;
        indexes_used &=
            lock_plan.contains(sql.partial_index) && count_plan.contains(sql.partial_index);
        plans.push(Plan {
            name: format!("{phase} lock_due"),
            sql: sql.lock_due,
            plan: lock_plan,
        });
        plans.push(Plan {
            name: format!("{phase} count_due_excluding"),
            sql: sql.count_due_excluding,
            plan: count_plan,
        });
    }
    drop(conn);
    drop(worker);
    drop(pool);
    svc.drop_db(&db).await?;
    Ok(IdleCycle {
        table_rows: template.rows,
        ms,
        loadavg_at_start: load,
        partial_indexes_used: indexes_used,
        plans,
    })
}

#[derive(QueryableByName)]
struct PlanLine {
    #[diesel(sql_type = Text, column_name = "QUERY PLAN")]
    line: String,
}

async fn explain(
    conn: &mut AsyncPgConnection,
    sql: &str,
    as_of: DateTime<Utc>,
    limit: Option<i64>,
) -> Result<String> {
    // `$2`, `$3`: the sweep's position, NULL for a sweep from the start.
    let query = diesel::sql_query(format!("EXPLAIN (ANALYZE, BUFFERS) {sql}"))
        .bind::<Timestamptz, _>(as_of)
        .bind::<Nullable<Timestamptz>, _>(None::<DateTime<Utc>>)
        .bind::<Nullable<SqlUuid>, _>(None::<Uuid>);
    let lines: Vec<PlanLine> = match limit {
        Some(limit) => query.bind::<BigInt, _>(limit).load(conn).await?,
        None => {
            query
                .bind::<Array<SqlUuid>, _>(Vec::<Uuid>::new())
                .load(conn)
                .await?
        }
    };
    Ok(lines
        .into_iter()
        .map(|l| l.line)
        .collect::<Vec<_>>()
        .join("\n"))
}
