//! Figures 10 and 11, what the worker's own tables cost per expiry.
//!
//! Figure 10 (`lean`): the worker's cycle against two raw baselines in the
//! same run, on fresh copies of the same template: the raw statement on the
//! project's schema as migrated, and the same statement on a lean schema in
//! its own copy (an audit table with only a primary key, an outbox keyed by
//! the event's uuid with one partial index on unpublished rows, four-key
//! jsonb headers, no trigger).
//!
//! Figure 11 (`schema_cost`): an ablation. Each variant starts from the
//! schema as it was before the `lean_outbox` migration (its `down.sql` run
//! on the copy), changes one index, constraint, column type, trigger or the
//! headers, and times the raw statement; the last rows are the lean schema
//! and the migrated schema, and the worker on both the old and the migrated
//! schema. Variants take turns within each repetition (the starting one
//! rotates), so drift in the machine's load hits all of them.

use std::time::Duration;

use anyhow::{Context, Result};
use diesel::{
    QueryableByName,
    sql_types::{Double, Integer},
};
use diesel_async::{AsyncConnection, AsyncPgConnection, RunQueryDsl, SimpleAsyncConnection};
use serde::{Deserialize, Serialize};

use super::{
    expiry::{Side, expire_all, written_rows},
    reps,
};
use crate::{
    phase_sql::RawHeaders,
    progress,
    support::{Services, Stat, loadavg, num},
    templates::DueSet,
};

/// Batch size of both figures (the default `EXPIRATION_BATCH_SIZE`).
const BATCH: u32 = 200;

/// The schema before the `lean_outbox` migration: its `down.sql`.
pub const BEFORE_LEAN_MIGRATION: &str =
    include_str!("../../../migrations/2026-12-04-000004_lean_outbox/down.sql");
/// The `lean_outbox` migration.
pub const LEAN_MIGRATION: &str =
    include_str!("../../../migrations/2026-12-04-000004_lean_outbox/up.sql");

/// The lean schema, in place of the worker's tables (from either schema).
/// The raw statement writes the same columns into it.
pub const LEAN_SCHEMA: &str = "
DROP TABLE booking_expiration_audit, booking_expiration_outbox CASCADE;
DROP FUNCTION IF EXISTS booking_expiration_outbox_notify();
CREATE TABLE booking_expiration_audit (
    id             bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    booking_id     uuid        NOT NULL,
    tenant_id      uuid        NOT NULL,
    from_status    text        NOT NULL,
    to_status      text        NOT NULL,
    actor          text        NOT NULL,
    correlation_id uuid        NOT NULL,
    at             timestamptz NOT NULL
);
CREATE TABLE booking_expiration_outbox (
    event_id       uuid        PRIMARY KEY,
    topic          text        NOT NULL,
    message_key    text        NOT NULL,
    payload        bytea       NOT NULL,
    headers        jsonb       NOT NULL,
    correlation_id uuid        NOT NULL,
    tenant_id      uuid        NOT NULL,
    created_at     timestamptz NOT NULL,
    published_at   timestamptz NULL
);
CREATE INDEX lean_outbox_unpublished ON booking_expiration_outbox (created_at)
    WHERE published_at IS NULL;
";

/// One schema and side to time.
pub struct Variant {
    pub key: &'static str,
    /// What differs from the schema before the `lean_outbox` migration.
    pub change: &'static str,
    /// Run on the copy after [`BEFORE_LEAN_MIGRATION`].
    pub ddl: &'static str,
    pub side: Side,
}

/// The raw statement with the old schema's jsonb headers.
const fn raw(key: &'static str, change: &'static str, ddl: &'static str) -> Variant {
    Variant {
        key,
        change,
        ddl,
        side: Side::RawWith(RawHeaders::Jsonb),
    }
}

const NOT_NULL_DROPPED: &str = "
ALTER TABLE booking_expiration_audit
    ALTER COLUMN booking_id DROP NOT NULL, ALTER COLUMN tenant_id DROP NOT NULL,
    ALTER COLUMN from_status DROP NOT NULL, ALTER COLUMN to_status DROP NOT NULL,
    ALTER COLUMN actor DROP NOT NULL, ALTER COLUMN correlation_id DROP NOT NULL,
    ALTER COLUMN at DROP NOT NULL;
ALTER TABLE booking_expiration_outbox
    ALTER COLUMN event_id DROP NOT NULL, ALTER COLUMN topic DROP NOT NULL,
    ALTER COLUMN message_key DROP NOT NULL, ALTER COLUMN payload DROP NOT NULL,
    ALTER COLUMN headers DROP NOT NULL, ALTER COLUMN correlation_id DROP NOT NULL,
    ALTER COLUMN tenant_id DROP NOT NULL, ALTER COLUMN created_at DROP NOT NULL;
";

/// The `lean_outbox` migration, then `ddl`: one literal, for a `Variant`.
macro_rules! lean_then {
    ($($ddl:expr),+) => {
        concat!(include_str!("../../../migrations/2026-12-04-000004_lean_outbox/up.sql"), $("\n", $ddl),+)
    };
}
/// The replay's audit indexes, as their migrations build them (without
/// CONCURRENTLY, which cannot run in the variant's one batch).
macro_rules! audit_id_index {
    () => {
        "CREATE INDEX ix_booking_expiration_audit_id ON booking_expiration_audit (id);"
    };
}
macro_rules! audit_tenant_index {
    () => {
        "CREATE INDEX ix_booking_expiration_audit_tenant_id_id ON booking_expiration_audit (tenant_id, id);"
    };
}
macro_rules! audit_at_index {
    () => {
        "CREATE INDEX ix_booking_expiration_audit_at_id ON booking_expiration_audit (at, id);"
    };
}

/// The ablation, in the order of its table. The first row is the base.
pub const VARIANTS: [Variant; 24] = [
    raw("old", "schema before the lean_outbox migration (base)", ""),
    raw(
        "audit_no_booking_index",
        "audit: - index on booking_id",
        "DROP INDEX ix_booking_expiration_audit_booking_id;",
    ),
    raw(
        "audit_no_pk",
        "audit: - primary key on id (identity kept)",
        "ALTER TABLE booking_expiration_audit DROP CONSTRAINT booking_expiration_audit_pkey;",
    ),
    raw(
        "audit_no_identity",
        "audit: - primary key and identity on id (id left NULL)",
        "ALTER TABLE booking_expiration_audit DROP CONSTRAINT booking_expiration_audit_pkey;
         ALTER TABLE booking_expiration_audit ALTER COLUMN id DROP IDENTITY, ALTER COLUMN id DROP NOT NULL;",
    ),
    raw(
        "audit_pk_booking_id",
        "audit: primary key (booking_id, id) instead of id + index on booking_id",
        "DROP INDEX ix_booking_expiration_audit_booking_id;
         ALTER TABLE booking_expiration_audit DROP CONSTRAINT booking_expiration_audit_pkey,
             ADD PRIMARY KEY (booking_id, id);",
    ),
    raw(
        "outbox_no_event_id_unique",
        "outbox: - unique index on (event_id, replay_id)",
        "DROP INDEX ux_booking_expiration_outbox_event_id_replay_id;",
    ),
    raw(
        "outbox_no_pk",
        "outbox: - primary key on id (identity kept)",
        "ALTER TABLE booking_expiration_outbox DROP CONSTRAINT booking_expiration_outbox_pkey;",
    ),
    raw(
        "outbox_no_identity",
        "outbox: - primary key and identity on id (id left NULL)",
        "ALTER TABLE booking_expiration_outbox DROP CONSTRAINT booking_expiration_outbox_pkey;
         ALTER TABLE booking_expiration_outbox ALTER COLUMN id DROP IDENTITY, ALTER COLUMN id DROP NOT NULL;",
    ),
    raw(
        "outbox_no_unpublished_index",
        "outbox: - partial index on unpublished rows (the claim's, by partition)",
        "DROP INDEX ix_booking_expiration_outbox_claim;",
    ),
    raw(
        "outbox_no_published_index",
        "outbox: - partial index on published_at (retention's)",
        "DROP INDEX ix_booking_expiration_outbox_published_at;",
    ),
    raw(
        "outbox_no_parked_index",
        "outbox: - partial index on parked rows",
        "DROP INDEX ix_booking_expiration_outbox_parked;",
    ),
    raw(
        "outbox_no_trigger",
        "outbox: - NOTIFY trigger (per row no publisher holds)",
        "DROP TRIGGER booking_expiration_outbox_notify ON booking_expiration_outbox;",
    ),
    raw(
        "no_not_null",
        "both: - NOT NULL on every column but id",
        NOT_NULL_DROPPED,
    ),
    Variant {
        key: "headers_four_keys",
        change: "outbox: headers jsonb with 4 keys instead of 8",
        ddl: "",
        side: Side::RawWith(RawHeaders::JsonbFourKeys),
    },
    Variant {
        key: "headers_json",
        change: "outbox: headers json (8 keys, text as written) instead of jsonb",
        ddl: "ALTER TABLE booking_expiration_outbox ALTER COLUMN headers TYPE json USING headers::json;",
        side: Side::RawWith(RawHeaders::Json),
    },
    Variant {
        key: "lean",
        change: "lean schema (4-key headers)",
        ddl: LEAN_SCHEMA,
        side: Side::RawWith(RawHeaders::JsonbFourKeys),
    },
    Variant {
        key: "migrated",
        change: "schema after the lean_outbox migration (json headers)",
        ddl: LEAN_MIGRATION,
        side: Side::Raw,
    },
    Variant {
        key: "worker_old",
        change: "worker cycle, schema before the lean_outbox migration",
        ddl: "",
        side: Side::Worker,
    },
    Variant {
        key: "worker_migrated",
        change: "worker cycle, schema after the lean_outbox migration",
        ddl: LEAN_MIGRATION,
        side: Side::Worker,
    },
    // What the replay's audit indexes (2026-12-05-000001..3) add to an
    // expiry, against the `migrated` row: each alone, then all three.
    Variant {
        key: "replay_id_index",
        change: "after lean_outbox: + replay index on audit (id)",
        ddl: lean_then!(audit_id_index!()),
        side: Side::Raw,
    },
    Variant {
        key: "replay_tenant_index",
        change: "after lean_outbox: + replay index on audit (tenant_id, id)",
        ddl: lean_then!(audit_tenant_index!()),
        side: Side::Raw,
    },
    Variant {
        key: "replay_at_index",
        change: "after lean_outbox: + replay index on audit (at, id)",
        ddl: lean_then!(audit_at_index!()),
        side: Side::Raw,
    },
    Variant {
        key: "replay_indexes",
        change: "schema after the replay index migrations (all three)",
        ddl: lean_then!(audit_id_index!(), audit_tenant_index!(), audit_at_index!()),
        side: Side::Raw,
    },
    Variant {
        key: "worker_replay_indexes",
        change: "worker cycle, schema after the replay index migrations",
        ddl: lean_then!(audit_id_index!(), audit_tenant_index!(), audit_at_index!()),
        side: Side::Worker,
    },
];

/// The replay's audit indexes, which the templates have (they are migrated
/// to the end): dropped first on every variant's copy, so every variant
/// starts from the schema before `lean_outbox`, as the figure always did.
const REPLAY_INDEXES_DROPPED: &str = "DROP INDEX ix_booking_expiration_audit_id,
    ix_booking_expiration_audit_tenant_id_id, ix_booking_expiration_audit_at_id;";

/// The outbox's own unique index on `(event_id, replay_id)`, as it was
/// before the event records migration (`2026-12-08-000001`) moved it to
/// `booking_expiration_outbox_event`. That table stays in every variant:
/// the worker and the raw statement write an event record per outbox row.
const EVENT_INDEX_ON_OUTBOX: &str =
    "CREATE UNIQUE INDEX ux_booking_expiration_outbox_event_id_replay_id
    ON booking_expiration_outbox (event_id, replay_id) NULLS NOT DISTINCT;";

/// What the server did so far: the CPU time of its exited processes (the
/// postmaster's `cutime + cstime`: a backend's time counts once it has
/// exited) and the WAL position. CPU time barely depends on how busy the
/// machine is, unlike wall time; WAL bytes not at all.
#[derive(Clone, Copy)]
struct ServerUsage {
    cpu_ms: f64,
    wal_bytes: f64,
}

async fn server_usage(svc: &Services) -> Result<ServerUsage> {
    #[derive(QueryableByName)]
    struct Row {
        #[diesel(sql_type = Integer)]
        pid: i32,
        #[diesel(sql_type = Double)]
        lsn: f64,
    }
    let mut conn = svc.admin().await?;
    let row: Row = diesel::sql_query(
        "SELECT (SELECT pid FROM pg_stat_activity WHERE backend_type = 'checkpointer') AS pid,
                pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')::float8 AS lsn",
    )
    .get_result(&mut conn)
    .await?;
    // The checkpointer's parent is the postmaster.
    let status = std::fs::read_to_string(format!("/proc/{}/status", row.pid))?;
    let postmaster = status
        .lines()
        .find_map(|l| l.strip_prefix("PPid:"))
        .map(str::trim)
        .context("PPid of the checkpointer")?;
    let stat = std::fs::read_to_string(format!("/proc/{postmaster}/stat"))?;
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    // cutime and cstime are fields 16 and 17 of the line: 13 and 14 after ')'.
    Ok(ServerUsage {
        cpu_ms: (ticks(13) + ticks(14)) * 10.0,
        wal_bytes: row.lsn,
    })
}

/// One expiry run on a fresh copy of `set`'s template after `ddl` (run on
/// the copy, before the clock starts): its wall time, the server's CPU
/// time and the WAL it wrote.
async fn timed_run(svc: &Services, set: &DueSet<'_>, ddl: &str, side: Side) -> Result<RunOf> {
    let db = svc.copy(&set.template.name).await?;
    let url = svc.url_of(&db);
    if !ddl.trim().is_empty() {
        let mut conn = AsyncPgConnection::establish(&url).await?;
        conn.batch_execute(ddl).await?;
        drop(conn);
    }
    svc.wait_idle(&db).await?;
    let before = server_usage(svc).await?;
    let run = expire_all(&url, side, set.as_of, BATCH, 1, set.due).await?;
    svc.wait_idle(&db).await?;
    // The postmaster reaps an exited backend at once; a moment's margin.
    tokio::time::sleep(Duration::from_millis(100)).await;
    let after = server_usage(svc).await?;
    let rows = written_rows(&url, side, run.expired).await?;
    svc.drop_db(&db).await?;
    let n = run.expired as f64;
    Ok(RunOf {
        secs: run.secs,
        expired: run.expired,
        server_cpu_ms_per_10k: (after.cpu_ms - before.cpu_ms) * 10_000.0 / n,
        wal_bytes_per_booking: (after.wal_bytes - before.wal_bytes) / n,
        headers_bytes: rows.headers_bytes,
    })
}

struct RunOf {
    secs: f64,
    expired: u64,
    server_cpu_ms_per_10k: f64,
    wal_bytes_per_booking: f64,
    headers_bytes: Option<f64>,
}

// ---------------------------------------------------------------------------
// Figure 10: the worker against both raw baselines.
// ---------------------------------------------------------------------------

/// Figure 10 (`results.json`'s `lean`).
#[derive(Debug, Serialize, Deserialize)]
pub struct LeanFigure {
    pub label: String,
    pub due: u64,
    pub table_rows: u64,
    pub batch: u32,
    pub worker_bookings_per_s: Stat,
    /// The raw statement on the project's schema as migrated.
    pub raw_own_bookings_per_s: Stat,
    /// The raw statement on the lean schema.
    pub raw_lean_bookings_per_s: Stat,
    /// Medians over medians.
    pub worker_vs_raw_own: f64,
    pub worker_vs_raw_lean: f64,
    pub raw_own_vs_raw_lean: f64,
    /// PostgreSQL's CPU time per 10,000 bookings (worker, raw own, raw
    /// lean): what the machine's load barely moves.
    pub server_cpu_ms_per_10k: [Stat; 3],
    /// WAL bytes per booking (worker, raw own, raw lean).
    pub wal_bytes_per_booking: [Stat; 3],
    /// jsonb headers as stored (`pg_column_size`), first repetition.
    pub own_headers_bytes: Option<f64>,
    pub lean_headers_bytes: Option<f64>,
    pub loadavg_at_start: [f64; 3],
}

/// Figure 10: worker, raw on the own schema, raw on the lean schema, each
/// on its own fresh copy; the three take turns, the first rotating.
pub async fn lean(svc: &Services, set: &DueSet<'_>, quick: bool) -> Result<LeanFigure> {
    let reps = reps(quick, 7);
    let load = loadavg();
    let sides: [(&str, &str, Side); 3] = [
        ("worker", "", Side::Worker),
        ("raw own", "", Side::Raw),
        (
            "raw lean",
            LEAN_SCHEMA,
            Side::RawWith(RawHeaders::JsonbFourKeys),
        ),
    ];
    let mut rates: [Vec<f64>; 3] = Default::default();
    let mut cpu: [Vec<f64>; 3] = Default::default();
    let mut wal: [Vec<f64>; 3] = Default::default();
    let mut headers = [None; 3];
    for rep in 0..reps {
        for k in 0..sides.len() {
            let i = (rep + k) % sides.len();
            let (name, ddl, side) = sides[i];
            let run = timed_run(svc, set, ddl, side).await?;
            let rate = run.expired as f64 / run.secs;
            progress!(
                "lean: rep {}/{reps} {name:<8} {} rows in {:.3} s = {} bookings/s, server CPU {:.0} ms, WAL {:.0} B per booking",
                rep + 1,
                run.expired,
                run.secs,
                num(rate),
                run.server_cpu_ms_per_10k,
                run.wal_bytes_per_booking
            );
            rates[i].push(rate);
            cpu[i].push(run.server_cpu_ms_per_10k);
            wal[i].push(run.wal_bytes_per_booking);
            if rep == 0 {
                headers[i] = run.headers_bytes;
            }
        }
    }
    let [worker, own, lean] = rates.map(|r| Stat::of(&r));
    Ok(LeanFigure {
        label: format!(
            "expiry {} due / {} rows, batch {BATCH}, 1 instance",
            num(set.due as f64),
            num(set.template.rows as f64)
        ),
        due: set.due,
        table_rows: set.template.rows,
        batch: BATCH,
        worker_vs_raw_own: worker.median / own.median,
        worker_vs_raw_lean: worker.median / lean.median,
        raw_own_vs_raw_lean: own.median / lean.median,
        worker_bookings_per_s: worker,
        raw_own_bookings_per_s: own,
        raw_lean_bookings_per_s: lean,
        server_cpu_ms_per_10k: cpu.map(|v| Stat::of(&v)),
        wal_bytes_per_booking: wal.map(|v| Stat::of(&v)),
        own_headers_bytes: headers[1],
        lean_headers_bytes: headers[2],
        loadavg_at_start: load,
    })
}

// ---------------------------------------------------------------------------
// Figure 11: the ablation.
// ---------------------------------------------------------------------------

/// Figure 11 (`results.json`'s `schema_cost`).
#[derive(Debug, Serialize, Deserialize)]
pub struct SchemaCost {
    pub due: u64,
    pub table_rows: u64,
    pub batch: u32,
    pub loadavg_at_start: [f64; 3],
    pub rows: Vec<CostRow>,
}

/// One variant of the ablation.
#[derive(Debug, Serialize, Deserialize)]
pub struct CostRow {
    pub key: String,
    pub change: String,
    /// `raw` or `worker`.
    pub side: String,
    /// Wall milliseconds per 10,000 expired bookings.
    pub ms_per_10k: Stat,
    /// Median over the base's median (below 1: cheaper than the base).
    pub vs_base: f64,
    /// PostgreSQL's CPU milliseconds per 10,000 expired bookings.
    pub server_cpu_ms_per_10k: Stat,
    /// Median over the base's median.
    pub cpu_vs_base: f64,
    /// WAL bytes per booking.
    pub wal_bytes_per_booking: Stat,
    /// jsonb headers as stored, first repetition.
    pub headers_bytes: Option<f64>,
}

/// Figure 11: every [`VARIANTS`] row, `reps` times, variants taking turns.
pub async fn schema_cost(svc: &Services, set: &DueSet<'_>, quick: bool) -> Result<SchemaCost> {
    let reps = reps(quick, 5);
    let load = loadavg();
    let n = VARIANTS.len();
    let mut ms: Vec<Vec<f64>> = vec![Vec::new(); n];
    let mut cpu: Vec<Vec<f64>> = vec![Vec::new(); n];
    let mut wal: Vec<Vec<f64>> = vec![Vec::new(); n];
    let mut headers = vec![None; n];
    for rep in 0..reps {
        for k in 0..n {
            let i = (rep * 7 + k) % n;
            let v = &VARIANTS[i];
            let ddl = format!(
                "{REPLAY_INDEXES_DROPPED}\n{EVENT_INDEX_ON_OUTBOX}\n{BEFORE_LEAN_MIGRATION}\n{}",
                v.ddl
            );
            let run = timed_run(svc, set, &ddl, v.side).await?;
            let per_10k = run.secs * 1e3 * 10_000.0 / run.expired as f64;
            progress!(
                "schema cost: rep {}/{reps} {:<28} {per_10k:.0} ms, server CPU {:.0} ms per 10k rows, WAL {:.0} B per booking",
                rep + 1,
                v.key,
                run.server_cpu_ms_per_10k,
                run.wal_bytes_per_booking
            );
            ms[i].push(per_10k);
            cpu[i].push(run.server_cpu_ms_per_10k);
            wal[i].push(run.wal_bytes_per_booking);
            if rep == 0 {
                headers[i] = run.headers_bytes;
            }
        }
    }
    let stats: Vec<Stat> = ms.iter().map(|m| Stat::of(m)).collect();
    let cpu: Vec<Stat> = cpu.iter().map(|m| Stat::of(m)).collect();
    let wal: Vec<Stat> = wal.iter().map(|m| Stat::of(m)).collect();
    let base = stats[0].median;
    let cpu_base = cpu[0].median;
    let rows = VARIANTS
        .iter()
        .zip(stats)
        .zip(headers)
        .zip(cpu.into_iter().zip(wal))
        .map(|(((v, s), headers_bytes), (cpu, wal))| CostRow {
            key: v.key.into(),
            change: v.change.into(),
            side: match v.side {
                Side::Worker => "worker".into(),
                _ => "raw".into(),
            },
            vs_base: s.median / base,
            ms_per_10k: s,
            cpu_vs_base: cpu.median / cpu_base,
            server_cpu_ms_per_10k: cpu,
            wal_bytes_per_booking: wal,
            headers_bytes,
        })
        .collect();
    Ok(SchemaCost {
        due: set.due,
        table_rows: set.template.rows,
        batch: BATCH,
        loadavg_at_start: load,
        rows,
    })
}
