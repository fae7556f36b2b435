//! Figure 13 (`replay`): `republish` over a year of audit trail. The same
//! selections (one tenant's 10,000 records, a window of 10,000 records) are
//! replayed from a trail of 10,000,000 records (a year of a busy crm; quick:
//! 1,000,000) and from a trail of 100,000 that holds the same selections:
//! with the replay's indexes the two take the same time (ratio about 1),
//! so a selection costs what it selects, not what the trail holds. A window
//! ten times larger on the large trail takes about ten times as long. The
//! last rows replay the same selections on the large trail without the
//! replay's indexes (as before their migrations: every page a full scan and
//! a sort), once each.
//!
//! Each replay is `app::republish` with `--dry-run` (it reads and rebuilds
//! every event, writes nothing, so repetitions see the same data) in its
//! default batches of 500. Both trails are seeded once in SQL, the way the
//! worker writes them: a booking per record (status `ReserveExpired`, the
//! deadline a minute before), records one every 3.15 s (a year for
//! 10,000,000) with their audit id in time order, 200 tenants of which one
//! small tenant holds every `records / 10,000`-th record.

use std::time::Instant;

use anyhow::{Result, ensure};
use booking_expiration::{
    app::{self, RepublishRequest},
    config::EventSettings,
    db::replay::Selection,
};
use chrono::{DateTime, Duration as ChronoDuration, Utc};
use diesel_async::{AsyncConnection, AsyncPgConnection, SimpleAsyncConnection};
use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use super::reps;
use crate::{
    progress,
    support::{Services, Stat, db_settings, loadavg, num},
};

/// Records per selection.
const SELECTED: u64 = 10_000;
/// The small trail: the same selections, little else.
const SMALL_TRAIL: u64 = 100_000;
/// One record every this many microseconds (3.15 s): 10,000,000 a year.
const MICROS_PER_RECORD: i64 = 365 * 86_400 * 1_000_000 / 10_000_000;
/// `republish --batch-size` default.
const BATCH: u32 = 500;
/// The replay's indexes (migrations 2026-12-05-00000{1,2,3}), as built on
/// the seeded trail, and dropped for the "before" rows.
const REPLAY_INDEXES: [(&str, &str); 3] = [
    ("ix_booking_expiration_audit_id", "(id)"),
    (
        "ix_booking_expiration_audit_tenant_id_id",
        "(tenant_id, id)",
    ),
    ("ix_booking_expiration_audit_at_id", "(at, id)"),
];

/// Figure 13 (`results.json`'s `replay`).
#[derive(Debug, Serialize, Deserialize)]
pub struct ReplayFigure {
    /// Records in the large trail.
    pub records: u64,
    /// Records in the small trail.
    pub small_records: u64,
    pub batch: u32,
    /// Seeding the large trail (bookings, records, indexes, VACUUM ANALYZE).
    pub seed_s: f64,
    /// The replay's indexes built `CONCURRENTLY` on the large trail.
    pub index_builds: Vec<IndexBuild>,
    pub rows: Vec<ReplayRow>,
    pub loadavg_at_start: [f64; 3],
}

/// One index build on the large trail.
#[derive(Debug, Serialize, Deserialize)]
pub struct IndexBuild {
    pub index: String,
    pub s: f64,
}

/// One selection against its baseline.
#[derive(Debug, Serialize, Deserialize)]
pub struct ReplayRow {
    pub label: String,
    /// Records replayed (each run checks it).
    pub selected: u64,
    /// Milliseconds per replay.
    pub ms: Stat,
    pub baseline_label: String,
    pub baseline_ms: Stat,
    /// Median over median.
    pub ratio: f64,
    /// What the ratio should be if time follows the selection (none for
    /// the rows without the replay's indexes).
    pub expected_ratio: Option<f64>,
}

/// A selection, the same count of records on both trails.
struct Pick {
    name: &'static str,
    selection: Selection,
    selected: u64,
}

/// The selections on a trail of `records` seeded from `start`: the small
/// tenant, a window of [`SELECTED`] records in its middle, and (`times` x)
/// a window `times` as long.
fn picks(tenant: Uuid, records: u64, start: DateTime<Utc>, times: u64) -> [Pick; 2] {
    let window = |n: u64| {
        let first = records / 2;
        let at = |i: u64| start + ChronoDuration::microseconds(i as i64 * MICROS_PER_RECORD);
        // Half a record's time either side: the window holds records
        // first ..= first + n - 1 exactly.
        let half = ChronoDuration::microseconds(MICROS_PER_RECORD / 2);
        Selection {
            expired_from: Some(at(first) - half),
            expired_to: Some(at(first + n - 1) + half),
            ..Selection::default()
        }
    };
    [
        Pick {
            name: "tenant",
            selection: Selection {
                tenant_ids: vec![tenant],
                ..Selection::default()
            },
            selected: SELECTED,
        },
        Pick {
            name: "window",
            selection: window(SELECTED * times),
            selected: SELECTED * times,
        },
    ]
}

/// Seeds a trail of `records` in a fresh database `name`: bookings and
/// audit records as the worker leaves them, then the indexes, then
/// `VACUUM ANALYZE`.
async fn seed_trail(svc: &Services, name: &str, records: u64) -> Result<Trail> {
    svc.drop_db(name).await?;
    svc.admin_exec(&format!("CREATE DATABASE {name}")).await?;
    let url = svc.url_of(name);
    booking_expiration::db::migrate::run_migrations(&db_settings(&url, 1)).await?;
    let tenant = Uuid::new_v4();
    let start = crate::support::wall_now() - ChronoDuration::days(400);
    let every = records / SELECTED;
    let mut conn = AsyncPgConnection::establish(&url).await?;
    // Indexes are built after the load (as a year of inserts would have
    // left them, but in minutes).
    let mut drop = String::from(
        "ALTER TABLE bookings DROP CONSTRAINT bookings_pkey;
         DROP INDEX ix_booking_expiration_audit_booking_id;",
    );
    for (index, _) in REPLAY_INDEXES {
        drop.push_str(&format!("DROP INDEX {index};"));
    }
    conn.batch_execute(&drop).await?;
    let tenant_of = format!(
        "CASE WHEN i % {every} = 0 THEN '{tenant}'::uuid \
              ELSE md5('tenant' || (i % 199))::uuid END"
    );
    let at = format!(
        "'{}'::timestamptz + i * interval '{MICROS_PER_RECORD} microseconds'",
        start.to_rfc3339()
    );
    // In chunks of a million, for progress and bounded transactions.
    let chunk = 1_000_000u64;
    let mut from = 0u64;
    while from < records {
        let to = (from + chunk).min(records) - 1;
        conn.batch_execute(&format!(
            "SET synchronous_commit = off;
             INSERT INTO bookings (id, tenant_id, deal_id, property_object_id, status,
                                   reserve_expires_at, expired_at, created_at, updated_at, version)
             SELECT md5('b' || i)::uuid, {tenant_of}, md5('d' || i)::uuid, md5('p' || i)::uuid,
                    'ReserveExpired', {at} - interval '1 minute', {at}, {at}, {at}, 2
               FROM generate_series({from}, {to}) AS i;
             INSERT INTO booking_expiration_audit
                    (booking_id, tenant_id, from_status, to_status, actor, correlation_id, at,
                     version, deal_id, property_object_id, ce_source)
             SELECT md5('b' || i)::uuid, {tenant_of}, 'Reserved', 'ReserveExpired', 'system',
                    md5('run' || (i / 50))::uuid, {at}, 2, md5('d' || i)::uuid,
                    md5('p' || i)::uuid, '/pin/crm/booking-expiration'
               FROM generate_series({from}, {to}) AS i ORDER BY i;"
        ))
        .await?;
        from = to + 1;
        progress!(
            "replay: {name}: {} of {} records",
            num(from as f64),
            num(records as f64)
        );
    }
    conn.batch_execute(
        "SET maintenance_work_mem = '512MB';
         ALTER TABLE bookings ADD CONSTRAINT bookings_pkey PRIMARY KEY (id);
         CREATE INDEX ix_booking_expiration_audit_booking_id ON booking_expiration_audit (booking_id);
         RESET maintenance_work_mem;",
    )
    .await?;
    // The replay's indexes as their migrations build them (CONCURRENTLY,
    // one statement outside a transaction, default settings), timed: what
    // `migrate` takes on a trail this long.
    let mut builds = Vec::new();
    for (index, columns) in REPLAY_INDEXES {
        let started = Instant::now();
        conn.batch_execute(&format!(
            "CREATE INDEX CONCURRENTLY {index} ON booking_expiration_audit {columns}"
        ))
        .await?;
        let s = started.elapsed().as_secs_f64();
        progress!("replay: {name}: {index} built CONCURRENTLY in {s:.1} s");
        builds.push(IndexBuild {
            index: index.into(),
            s,
        });
    }
    conn.batch_execute("VACUUM ANALYZE bookings, booking_expiration_audit")
        .await?;
    Ok(Trail {
        tenant,
        start,
        builds,
    })
}

/// A seeded trail: its small tenant, its first record's time, and how long
/// the replay's indexes took to build on it.
struct Trail {
    tenant: Uuid,
    start: DateTime<Utc>,
    builds: Vec<IndexBuild>,
}

/// One dry-run replay of `pick` on `db`; its wall time in ms.
async fn replay_ms(svc: &Services, db: &str, pick: &Pick) -> Result<f64> {
    let request = RepublishRequest {
        selection: pick.selection.clone(),
        dry_run: true,
        batch_size: BATCH,
        after: 0,
        replay_id: None,
    };
    let settings = db_settings(&svc.url_of(db), 1);
    let started = Instant::now();
    let report = app::republish(
        &settings,
        &EventSettings::default(),
        &request,
        &booking_expiration::clock::SystemClock,
        CancellationToken::new(),
        |_| {},
        |_| {},
    )
    .await?;
    let ms = started.elapsed().as_secs_f64() * 1e3;
    ensure!(
        report.complete && report.selected == pick.selected && report.enqueued == pick.selected,
        "replay {} on {db}: {report:?}, expected {} records",
        pick.name,
        pick.selected
    );
    Ok(ms)
}

/// Figure 13.
pub async fn measure(svc: &Services, quick: bool) -> Result<ReplayFigure> {
    let records: u64 = if quick { 1_000_000 } else { 10_000_000 };
    let reps = reps(quick, 5);
    progress!(
        "13. replay: {} selected from a trail of {} records and of {} records",
        num(SELECTED as f64),
        num(records as f64),
        num(SMALL_TRAIL as f64)
    );
    let loadavg_at_start = loadavg();
    let seed_started = Instant::now();
    let large_trail = seed_trail(svc, "rp_large", records).await?;
    let seed_s = seed_started.elapsed().as_secs_f64();
    progress!("replay: large trail seeded in {seed_s:.0} s");
    let small_trail = seed_trail(svc, "rp_small", SMALL_TRAIL).await?;
    let large = picks(large_trail.tenant, records, large_trail.start, 1);
    let small = picks(small_trail.tenant, SMALL_TRAIL, small_trail.start, 1);
    let [_, large_window_x10] = picks(large_trail.tenant, records, large_trail.start, 10);
    // Warm both: the first replay of each reads its pages from disk.
    for (db, pick) in [("rp_large", &large[0]), ("rp_small", &small[0])] {
        replay_ms(svc, db, pick).await?;
    }
    let mut ms: [Vec<f64>; 5] = Default::default();
    for rep in 0..reps {
        // (database, selection, slot), the side that goes first alternating.
        let mut runs = vec![
            ("rp_large", &large[0], 0),
            ("rp_small", &small[0], 1),
            ("rp_large", &large[1], 2),
            ("rp_small", &small[1], 3),
            ("rp_large", &large_window_x10, 4),
        ];
        if rep % 2 == 1 {
            runs.reverse();
        }
        for (db, pick, slot) in runs {
            let run = replay_ms(svc, db, pick).await?;
            progress!(
                "replay: rep {}/{reps} {db} {:<6} {} records in {run:.0} ms",
                rep + 1,
                pick.name,
                num(pick.selected as f64)
            );
            ms[slot].push(run);
        }
    }
    let [
        large_tenant_ms,
        small_tenant_ms,
        large_window_ms,
        small_window_ms,
        large_x10_ms,
    ] = ms.map(|m| Stat::of(&m));
    let trail = |n: u64| format!("a trail of {} records", num(n as f64));
    let row =
        |label: String, selected, ms: Stat, baseline_label: String, baseline: Stat, expected| {
            ReplayRow {
                label,
                selected,
                ratio: ms.median / baseline.median,
                ms,
                baseline_label,
                baseline_ms: baseline,
                expected_ratio: expected,
            }
        };
    let mut rows = vec![
        row(
            format!(
                "one tenant's {} records from {}",
                num(SELECTED as f64),
                trail(records)
            ),
            SELECTED,
            large_tenant_ms,
            format!("the same from {}", trail(SMALL_TRAIL)),
            small_tenant_ms,
            Some(1.0),
        ),
        row(
            format!(
                "a window of {} records from {}",
                num(SELECTED as f64),
                trail(records)
            ),
            SELECTED,
            large_window_ms.clone(),
            format!("the same from {}", trail(SMALL_TRAIL)),
            small_window_ms,
            Some(1.0),
        ),
        row(
            format!(
                "a window of {} records from {}",
                num((SELECTED * 10) as f64),
                trail(records)
            ),
            SELECTED * 10,
            large_x10_ms,
            format!("a window of {} from the same trail", num(SELECTED as f64)),
            large_window_ms.clone(),
            Some(10.0),
        ),
    ];
    // Before the replay's indexes: the same selections, once each.
    let mut conn = AsyncPgConnection::establish(&svc.url_of("rp_large")).await?;
    for (index, _) in REPLAY_INDEXES {
        conn.batch_execute(&format!("DROP INDEX {index}")).await?;
    }
    drop(conn);
    let indexed = [rows[0].ms.clone(), rows[1].ms.clone()];
    for (pick, indexed) in large.iter().zip(indexed) {
        let before = replay_ms(svc, "rp_large", pick).await?;
        progress!(
            "replay: without the replay indexes, {} in {before:.0} ms",
            pick.name
        );
        let label = format!(
            "  {}: the same without the replay indexes (before their migrations), 1 run",
            pick.name
        );
        rows.push(row(
            label,
            pick.selected,
            Stat::of(&[before]),
            "with them".into(),
            indexed,
            None,
        ));
    }
    for db in ["rp_large", "rp_small"] {
        svc.drop_db(db).await?;
    }
    Ok(ReplayFigure {
        records,
        small_records: SMALL_TRAIL,
        batch: BATCH,
        seed_s,
        index_builds: large_trail.builds,
        rows,
        loadavg_at_start,
    })
}
