//! `BENCH_DRAIN_STATS=1`, a diagnosis of the drain figure (not part of the
//! committed run): what the server's counters say each drain did. Printed
//! per repetition:
//!
//! - the outbox's row updates (how many HOT), its heap and index pages
//!   found in `shared_buffers` or read in, and the cluster's buffers
//!   written by backends, the background writer and checkpoints, per
//!   1,000 events; autovacuums and autoanalyzes of the outbox meanwhile;
//! - each index of the outbox: scans, entries read, rows fetched;
//! - with `pg_stat_statements` loaded (`BENCH_PG_OPTIONS="-c
//!   shared_preload_libraries=pg_stat_statements"`), the statements that
//!   read or wrote the most blocks;
//! - each partition's first, middle and last mark (whether the partitions
//!   drained side by side).

use anyhow::Result;
use diesel::{
    QueryableByName,
    sql_types::{BigInt, Text},
};
use diesel_async::{AsyncPgConnection, RunQueryDsl, SimpleAsyncConnection};

use crate::progress;

/// Makes `pg_stat_statements`' view available in a template (where the
/// server loads the module; elsewhere the statements' lines are left out).
pub async fn prepare(conn: &mut AsyncPgConnection) {
    let _ = conn
        .batch_execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        .await;
}

/// The counters a drain moves.
#[derive(QueryableByName, Clone, Copy)]
pub struct Counters {
    #[diesel(sql_type = BigInt)]
    upd: i64,
    #[diesel(sql_type = BigInt)]
    hot_upd: i64,
    #[diesel(sql_type = BigInt)]
    autovacuums: i64,
    #[diesel(sql_type = BigInt)]
    autoanalyzes: i64,
    #[diesel(sql_type = BigInt)]
    heap_read: i64,
    #[diesel(sql_type = BigInt)]
    heap_hit: i64,
    #[diesel(sql_type = BigInt)]
    idx_read: i64,
    #[diesel(sql_type = BigInt)]
    idx_hit: i64,
    #[diesel(sql_type = BigInt)]
    by_backends: i64,
    #[diesel(sql_type = BigInt)]
    by_bgwriter: i64,
    #[diesel(sql_type = BigInt)]
    by_checkpoints: i64,
}

#[derive(QueryableByName)]
struct Line {
    #[diesel(sql_type = Text)]
    line: String,
}

impl Counters {
    pub async fn read(conn: &mut AsyncPgConnection) -> Result<Self> {
        Ok(diesel::sql_query(
            "SELECT t.n_tup_upd AS upd, t.n_tup_hot_upd AS hot_upd, \
                    t.autovacuum_count AS autovacuums, t.autoanalyze_count AS autoanalyzes, \
                    coalesce(io.heap_blks_read, 0) AS heap_read, \
                    coalesce(io.heap_blks_hit, 0) AS heap_hit, \
                    coalesce(io.idx_blks_read, 0) AS idx_read, \
                    coalesce(io.idx_blks_hit, 0) AS idx_hit, \
                    b.buffers_backend AS by_backends, b.buffers_clean AS by_bgwriter, \
                    b.buffers_checkpoint AS by_checkpoints \
               FROM pg_stat_user_tables t \
               JOIN pg_statio_user_tables io USING (relid) \
              CROSS JOIN pg_stat_bgwriter b \
              WHERE t.relname = 'booking_expiration_outbox'",
        )
        .get_result(conn)
        .await?)
    }

    /// Prints what moved since `before` over a drain of `rows` events
    /// (read once the publisher's backends exited: they flush their
    /// counters then), and the per-index, per-statement and per-partition
    /// lines.
    pub async fn report(before: &Self, conn: &mut AsyncPgConnection, rows: u64) -> Result<()> {
        tokio::time::sleep(std::time::Duration::from_millis(1500)).await;
        let after = Self::read(conn).await?;
        let per = |a: i64, b: i64| (a - b) as f64 * 1000.0 / rows as f64;
        progress!(
            "drain {rows}, per 1,000 events: {:.0} updates ({:.0} HOT); heap pages {:.0} hit, \
             {:.0} read; index pages {:.0} hit, {:.0} read; buffers written by backends {:.0}, \
             the background writer {:.0}, checkpoints {:.0}; autovacuums {}, autoanalyzes {}",
            per(after.upd, before.upd),
            per(after.hot_upd, before.hot_upd),
            per(after.heap_hit, before.heap_hit),
            per(after.heap_read, before.heap_read),
            per(after.idx_hit, before.idx_hit),
            per(after.idx_read, before.idx_read),
            per(after.by_backends, before.by_backends),
            per(after.by_bgwriter, before.by_bgwriter),
            per(after.by_checkpoints, before.by_checkpoints),
            after.autovacuums - before.autovacuums,
            after.autoanalyzes - before.autoanalyzes,
        );
        // The copy starts with no statistics of its own (a new database),
        // so these are the drain's (and the bench's few queries).
        lines(
            conn,
            "SELECT format('index %s: %s scans, %s entries read, %s rows fetched', \
                    indexrelname, idx_scan, idx_tup_read, idx_tup_fetch) AS line \
               FROM pg_stat_user_indexes WHERE relname = 'booking_expiration_outbox' \
              ORDER BY indexrelname",
        )
        .await?;
        if let Err(error) = lines(
            conn,
            "SELECT format('%s calls, %s blocks read, %s hit, %s dirtied, %s written, %s ms: %s', \
                    calls, shared_blks_read, shared_blks_hit, shared_blks_dirtied, \
                    shared_blks_written, round(total_exec_time), \
                    left(regexp_replace(query, '\\s+', ' ', 'g'), 100)) AS line \
               FROM pg_stat_statements s JOIN pg_database d ON d.oid = s.dbid \
              WHERE d.datname = current_database() \
              ORDER BY shared_blks_read + shared_blks_written DESC LIMIT 6",
        )
        .await
        {
            progress!("  no statements' lines (pg_stat_statements not loaded: {error})");
        }
        lines(
            conn,
            "SELECT format('partition %s: marks from %s, half by %s, the last at %s', \
                    kafka_partition, min(published_at)::time, \
                    percentile_disc(0.5) WITHIN GROUP (ORDER BY published_at)::time, \
                    max(published_at)::time) AS line \
               FROM booking_expiration_outbox GROUP BY kafka_partition ORDER BY kafka_partition",
        )
        .await
    }
}

/// Prints the `line` column of each row of `sql`.
async fn lines(conn: &mut AsyncPgConnection, sql: &str) -> Result<()> {
    let lines: Vec<Line> = diesel::sql_query(sql).load(conn).await?;
    for Line { line } in lines {
        progress!("  {line}");
    }
    Ok(())
}
