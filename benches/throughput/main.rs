//! `cargo bench --bench throughput`: the worker and the publisher against
//! baselines measured in the same run, on a PostgreSQL cluster (default
//! settings: fsync and synchronous commit on) and a Kafka 4.4.0 broker that
//! this program starts itself. Writes `results.json` and `scaling.svg`
//! (default folder `docs/bench`, or `BENCH_OUT`) and prints the tables.
//! `BENCH_QUICK=1` runs fewer repetitions and writes to a temporary folder
//! unless `BENCH_OUT` is set. `BENCH_RENDER_ONLY=path/to/results.json`
//! measures nothing: it prints the tables of that file. See
//! docs/benchmarks.md.
//!
//! Layout: `main.rs` runs the figures in order and writes their one
//! [`results::Results`]; `figures/` holds one module per figure, each
//! returning its typed result; `render.rs` is the only code that formats
//! them; `scaling.rs` draws the plot; `templates.rs` seeds the data every
//! figure copies; `phase_sql.rs` is the one place the bench spells out the
//! phases in SQL. Bench-only plumbing (services, statistics, the SVG
//! backend) is in `benches/support/`; what the tests share lives in
//! `crates/testkit`.

#[path = "../support/mod.rs"]
mod support;

mod figures;
mod phase_sql;
mod render;
mod results;
mod scaling;
mod templates;

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
};

use anyhow::Result;
use figures::{end_to_end, expiry, idle, profile, publisher};
use results::{Machine, Results};
use support::{Services, create_topic, loadavg};
use templates::{Backlog, Templates};

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    support::start_clock();
    // `cargo bench` passes `--bench`; nothing else is accepted.
    if std::env::args().skip(1).any(|a| a != "--bench") {
        eprintln!(
            "usage: cargo bench --bench throughput   (BENCH_QUICK=1 for fewer repetitions, BENCH_OUT=DIR, \
             BENCH_RENDER_ONLY=results.json to print the tables of a run)"
        );
        std::process::exit(2);
    }
    let outcome = match std::env::var_os("BENCH_RENDER_ONLY") {
        Some(path) => render_only(Path::new(&path)),
        None => run().await,
    };
    if let Err(error) = outcome {
        eprintln!("benchmark failed: {error:#}");
        std::process::exit(1);
    }
}

/// Prints the tables of a recorded run, measuring nothing.
fn render_only(path: &Path) -> Result<()> {
    print!("{}", render::report(&Results::read(path)?));
    Ok(())
}

/// The PostgreSQL settings the results record.
async fn postgresql_settings(svc: &Services) -> Result<BTreeMap<String, String>> {
    let mut settings = BTreeMap::new();
    for name in [
        "server_version",
        "fsync",
        "synchronous_commit",
        "full_page_writes",
        "shared_buffers",
        "wal_level",
        "max_wal_size",
    ] {
        settings.insert(name.to_owned(), svc.show(name).await?);
    }
    progress!("PostgreSQL settings: {settings:?}");
    Ok(settings)
}

/// Measures every figure (in an order that keeps the profile pass, which
/// restarts PostgreSQL, last), writes `results.json` and `scaling.svg`,
/// and prints the tables.
async fn run() -> Result<()> {
    let quick = std::env::var("BENCH_QUICK").is_ok_and(|v| !v.is_empty() && v != "0");
    let mode = if quick { "quick" } else { "full" };
    let out_dir = match std::env::var_os("BENCH_OUT") {
        Some(dir) => PathBuf::from(dir),
        None if quick => std::env::temp_dir().join("booking-expiration-bench-quick"),
        None => support::repo().join("docs/bench"),
    };
    std::fs::create_dir_all(&out_dir)?;
    let load_start = loadavg();
    progress!(
        "mode {mode}, results to {}, load average {:.2} {:.2} {:.2}",
        out_dir.display(),
        load_start[0],
        load_start[1],
        load_start[2]
    );
    let svc = Services::start()?;
    let postgresql = postgresql_settings(&svc).await?;
    create_topic(&svc, figures::TOPIC, 3).await?;
    let templates = Templates::seed(&svc).await?;
    let ten_k = templates.backlog(Backlog::TenK);

    let mut comparisons = BTreeMap::new();
    progress!(
        "1. expiry throughput, 10k due among {} rows, batch 200",
        ten_k.template.rows
    );
    comparisons.insert(
        expiry::HEADLINE.key.to_owned(),
        expiry::measure(&svc, &templates, &expiry::HEADLINE, quick).await?,
    );

    progress!("3. idle cycle over {} bookings", templates.t1m.rows);
    let idle_cycle = idle::measure(&svc, &templates.t1m, figures::reps(quick, 30)).await?;

    let publisher = publisher::measure(&svc, &ten_k, quick).await?;

    let end_to_end = end_to_end::measure(&svc, &ten_k, quick).await?;
    let binary = end_to_end::Binary::measure()?;

    progress!("2. scaling: instances, batch sizes, due rows, table size");
    for config in &expiry::SCALING {
        comparisons.insert(
            config.key.to_owned(),
            expiry::measure(&svc, &templates, config, quick).await?,
        );
    }

    // pg_stat_statements is loaded from here on: no timed figure follows.
    let profile = profile::measure(&svc, &ten_k).await?;

    let results = Results {
        command: if quick {
            "BENCH_QUICK=1 cargo bench --bench throughput"
        } else {
            "cargo bench --bench throughput"
        }
        .into(),
        mode: mode.into(),
        finished_at: crate::support::wall_now().to_rfc3339(),
        duration_s: support::elapsed_s(),
        machine: Machine {
            cores: std::thread::available_parallelism().map_or(0, |n| n.get()),
            loadavg_at_start: load_start,
            loadavg_at_end: loadavg(),
        },
        postgresql,
        expiry: comparisons,
        idle_cycle,
        publisher,
        end_to_end,
        binary,
        profile_pg_stat_statements: profile,
    };
    let json_path = out_dir.join("results.json");
    results.write(&json_path)?;
    println!();
    print!("{}", render::report(&results));
    let svg_path = out_dir.join("scaling.svg");
    scaling::draw(&results, &svg_path)?;
    progress!("wrote {} and {}", json_path.display(), svg_path.display());
    drop(svc);
    Ok(())
}
