//! `cargo bench --bench throughput`: the worker and the publisher against
//! baselines measured in the same run, on a PostgreSQL cluster (default
//! settings: fsync and synchronous commit on) and a Kafka 4.4.0 broker that
//! this program starts itself. Writes `results.json`, `scaling.svg` and
//! `deadline-wake.svg` (default folder `docs/bench`, or `BENCH_OUT`) and
//! prints the tables.
//! `BENCH_QUICK=1` runs fewer repetitions and writes to a temporary folder
//! unless `BENCH_OUT` is set. `BENCH_ONLY=lateness,statements` measures only
//! those figures and keeps the others of the `results.json` it replaces.
//! `BENCH_RENDER_ONLY=path/to/results.json`
//! measures nothing: it prints the tables of that file and redraws
//! `deadline-wake.svg` beside it. See docs/benchmarks.md.
//!
//! Layout: `main.rs` runs the figures in order and writes their one
//! [`results::Results`]; `figures/` holds one module per figure, each
//! returning its typed result; `render.rs` is the only code that formats
//! them; `scaling.rs` and `wake_plot.rs` draw the plots; `templates.rs` seeds the data every
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
mod sustained_plot;
mod templates;
mod wake_plot;

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
};

use anyhow::{Context, Result};
use figures::{
    deadline_wake, drain, end_to_end, expiry, idle, kafka_tls, logging, migrations, outbox_cost,
    profile, publisher, replay, schema_cost, sustained,
};
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
             BENCH_ONLY=figure,... to measure only those, BENCH_RENDER_ONLY=results.json to print the tables of a run)"
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

/// Prints the tables of a recorded run and redraws its deadline wake-up
/// plot beside it, measuring nothing.
fn render_only(path: &Path) -> Result<()> {
    let results = Results::read(path)?;
    print!("{}", render::report(&results));
    let dir = path.parent().unwrap_or(Path::new("."));
    draw_wake_plot(&results, dir);
    if results.sustained.is_some() {
        draw_sustained_plot(&results, dir);
    }
    Ok(())
}

/// `sustained.svg` into `dir`; a missing figure is reported, not fatal.
fn draw_sustained_plot(results: &Results, dir: &Path) {
    let svg_path = dir.join(sustained_plot::FILE);
    match sustained_plot::draw(results, &svg_path) {
        Ok(()) => progress!("wrote {}", svg_path.display()),
        Err(error) => progress!("{} not drawn: {error:#}", sustained_plot::FILE),
    }
}

/// `deadline-wake.svg` into `dir`; a missing figure is reported, not fatal.
fn draw_wake_plot(results: &Results, dir: &Path) {
    let svg_path = dir.join(wake_plot::FILE);
    match wake_plot::draw(results, &svg_path) {
        Ok(()) => progress!("wrote {}", svg_path.display()),
        Err(error) => progress!("{} not drawn: {error:#}", wake_plot::FILE),
    }
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

/// The figures `BENCH_ONLY` selects (all when unset or empty).
fn selected_figures() -> Result<Vec<&'static str>> {
    let Some(list) = std::env::var("BENCH_ONLY")
        .ok()
        .filter(|v| !v.trim().is_empty())
    else {
        return Ok(results::FIGURES.to_vec());
    };
    let mut out = Vec::new();
    for name in list.split(',').map(str::trim).filter(|n| !n.is_empty()) {
        let figure = results::FIGURES
            .into_iter()
            .find(|f| *f == name)
            .with_context(|| {
                format!(
                    "BENCH_ONLY: unknown figure {name:?}; figures: {}",
                    results::FIGURES.join(",")
                )
            })?;
        out.push(figure);
    }
    Ok(out)
}

/// Measures the selected figures (in an order that keeps the passes with
/// `pg_stat_statements`, which restart PostgreSQL, last), writes
/// `results.json` (over the previous one's other figures when `BENCH_ONLY`
/// limits the run), `scaling.svg` and `deadline-wake.svg` (each when the
/// run measured a figure it shows), and prints the tables.
async fn run() -> Result<()> {
    let quick = support::env_flag("BENCH_QUICK");
    let mode = if quick { "quick" } else { "full" };
    let only = selected_figures()?;
    let partial = only.len() < results::FIGURES.len();
    let wants = |figure: &str| only.contains(&figure);
    let out_dir = match std::env::var_os("BENCH_OUT") {
        Some(dir) => PathBuf::from(dir),
        None if quick => std::env::temp_dir().join("booking-expiration-bench-quick"),
        None => support::repo().join("docs/bench"),
    };
    std::fs::create_dir_all(&out_dir)?;
    let load_start = loadavg();
    progress!(
        "mode {mode}, figures {}, results to {}, load average {:.2} {:.2} {:.2}",
        only.join(","),
        out_dir.display(),
        load_start[0],
        load_start[1],
        load_start[2]
    );
    let svc = Services::start()?;
    let worker_log = svc.work.join("worker.log");
    let _log = support::log_like_the_binary(&worker_log)?;
    progress!(
        "the in-process worker logs as the binary does at its defaults, to {}",
        worker_log.display()
    );
    let postgresql = postgresql_settings(&svc).await?;
    create_topic(&svc, figures::TOPIC, 3).await?;
    let seeded = [
        "expiry",
        "logging",
        "lean",
        "schema_cost",
        "idle",
        "publisher",
        "outbox_cost",
        "end_to_end",
        "scaling",
        "profile",
    ];
    let templates = if seeded.iter().any(|f| wants(f)) {
        Some(Templates::seed(&svc, wants("idle") || wants("scaling")).await?)
    } else {
        None
    };
    let templates = || templates.as_ref().context("templates seeded");

    let mut comparisons = BTreeMap::new();
    if wants("expiry") {
        let ten_k = templates()?.backlog(Backlog::TenK)?;
        progress!(
            "1. expiry throughput, 10k due among {} rows, batch 200",
            ten_k.template.rows
        );
        comparisons.insert(
            expiry::HEADLINE.key.to_owned(),
            expiry::measure(&svc, templates()?, &expiry::HEADLINE, quick).await?,
        );
    }

    let logging = match wants("logging") {
        true => {
            let ten_k = templates()?.backlog(Backlog::TenK)?;
            Some(logging::measure(&svc, &ten_k, quick).await?)
        }
        false => None,
    };

    let lean = match wants("lean") {
        true => {
            let ten_k = templates()?.backlog(Backlog::TenK)?;
            progress!("10. expiry against raw SQL on the own and on a lean schema");
            Some(schema_cost::lean(&svc, &ten_k, quick).await?)
        }
        false => None,
    };
    let schema_cost = match wants("schema_cost") {
        true => {
            let ten_k = templates()?.backlog(Backlog::TenK)?;
            progress!("11. schema cost: one change at a time, raw statement timed");
            Some(schema_cost::schema_cost(&svc, &ten_k, quick).await?)
        }
        false => None,
    };

    let mut idle_cycle = None;
    if wants("idle") {
        let t1m = templates()?.t1m()?;
        progress!("3. idle cycle over {} bookings", t1m.rows);
        idle_cycle = Some(idle::measure(&svc, t1m, figures::reps(quick, 30)).await?);
    }

    let mut publisher = None;
    if wants("publisher") {
        let ten_k = templates()?.backlog(Backlog::TenK)?;
        publisher = Some(publisher::measure(&svc, &ten_k, quick).await?);
    }

    let outbox_cost = match wants("outbox_cost") {
        true => {
            let ten_k = templates()?.backlog(Backlog::TenK)?;
            Some(outbox_cost::measure(&svc, &ten_k, quick).await?)
        }
        false => None,
    };

    let mut end_to_end = None;
    if wants("end_to_end") {
        let ten_k = templates()?.backlog(Backlog::TenK)?;
        end_to_end = Some(end_to_end::measure(&svc, &ten_k, quick).await?);
    }
    let binary = end_to_end::Binary::measure()?;

    if wants("scaling") {
        progress!("2. scaling: instances, batch sizes, due rows, table size");
        for config in &expiry::SCALING {
            comparisons.insert(
                config.key.to_owned(),
                expiry::measure(&svc, templates()?, config, quick).await?,
            );
        }
    }

    let replay = match wants("replay") {
        true => Some(replay::measure(&svc, quick).await?),
        false => None,
    };
    let migrations = match wants("migrations") {
        true => Some(migrations::measure(&svc, quick).await?),
        false => None,
    };

    // Deadline wake-up: the timed ones before pg_stat_statements is loaded.
    let lateness = match wants("lateness") {
        true => Some(deadline_wake::lateness(&svc, quick).await?),
        false => None,
    };
    let deadline_to_kafka = match wants("deadline_to_kafka") {
        true => Some(deadline_wake::deadline_to_kafka(&svc, quick).await?),
        false => None,
    };
    let sustained = match wants("sustained") {
        true => Some(sustained::measure(&svc, quick).await?),
        false => None,
    };
    let drain = match wants("drain") {
        true => Some(drain::measure(&svc, quick).await?),
        false => None,
    };
    // pg_stat_statements is loaded from here on: no timed figure follows.
    let statements = match wants("statements") {
        true => Some(deadline_wake::statements(&svc, quick).await?),
        false => None,
    };
    // Statements are counted there too; its lateness runs with
    // pg_stat_statements loaded (a few percent of server CPU).
    let late_arrivals = match wants("late_arrivals") {
        true => Some(deadline_wake::late_arrivals(&svc, quick).await?),
        false => None,
    };
    let kafka_tls = match wants("kafka_tls") {
        true => Some(kafka_tls::measure(&svc, quick).await?),
        false => None,
    };
    let profile = match wants("profile") {
        true => {
            let ten_k = templates()?.backlog(Backlog::TenK)?;
            Some(profile::measure(&svc, &ten_k).await?)
        }
        false => None,
    };

    let finished_at = crate::support::wall_now().to_rfc3339();
    let stamp = results::Stamp {
        finished_at: finished_at.clone(),
        mode: mode.into(),
    };
    let mut command = String::new();
    if quick {
        command.push_str("BENCH_QUICK=1 ");
    }
    if partial {
        command.push_str(&format!("BENCH_ONLY={} ", only.join(",")));
    }
    command.push_str("cargo bench --bench throughput");
    let mut results = Results {
        command,
        mode: mode.into(),
        finished_at,
        duration_s: support::elapsed_s(),
        machine: Machine {
            cores: std::thread::available_parallelism().map_or(0, |n| n.get()),
            loadavg_at_start: load_start,
            loadavg_at_end: loadavg(),
        },
        postgresql,
        measured: only
            .iter()
            .map(|f| ((*f).to_owned(), stamp.clone()))
            .collect(),
        expiry: comparisons,
        lean,
        schema_cost,
        idle_cycle,
        publisher,
        outbox_cost,
        end_to_end,
        binary,
        lateness,
        deadline_to_kafka,
        sustained,
        statements,
        kafka_tls,
        drain,
        replay,
        migrations,
        late_arrivals,
        logging,
        profile_pg_stat_statements: profile,
    };
    let json_path = out_dir.join("results.json");
    if partial && json_path.exists() {
        progress!(
            "BENCH_ONLY: keeping the other figures of {}",
            json_path.display()
        );
        results = results.merged_over(Results::read(&json_path)?);
    }
    results.write(&json_path)?;
    println!();
    print!("{}", render::report(&results));
    if wants("expiry") || wants("idle") || wants("scaling") {
        let svg_path = out_dir.join("scaling.svg");
        match scaling::draw(&results, &svg_path) {
            Ok(()) => progress!("wrote {}", svg_path.display()),
            Err(error) => progress!("scaling.svg not drawn: {error:#}"),
        }
    }
    if wake_plot::FIGURES.iter().any(|f| wants(f)) {
        draw_wake_plot(&results, &out_dir);
    }
    if wants("sustained") {
        draw_sustained_plot(&results, &out_dir);
    }
    progress!("wrote {}", json_path.display());
    drop(svc);
    Ok(())
}
