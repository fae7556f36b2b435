//! The deadline wake-up plot (`deadline-wake.svg`) of a run, drawn from its
//! [`Results`]: expiry lateness p50 / p99 / max, deadline-driven against
//! the fixed schedule (and deadline → record on Kafka), and statements per
//! minute against PostgreSQL for 1 and 4 instances in both modes, both on
//! logarithmic axes. `results.json` holds percentiles, not samples, so the
//! plot shows those.

use std::path::Path;

use anyhow::{Result, bail};

use crate::{
    figures::deadline_wake::Mode,
    results::Results,
    support::{num, plot},
};

/// The file name, next to `scaling.svg` and `results.json`.
pub const FILE: &str = "deadline-wake.svg";

/// The `BENCH_ONLY` figures this plot shows.
pub const FIGURES: [&str; 3] = ["lateness", "deadline_to_kafka", "statements"];

fn seconds(v: f64) -> String {
    if v < 10.0 {
        format!("{v:.2} s")
    } else {
        format!("{v:.0} s")
    }
}

fn per_minute(v: f64) -> String {
    format!("{}/min", num(v))
}

/// Draws the panels `r` has figures for into `path`; an error when it has
/// none of them.
pub fn draw(r: &Results, path: &Path) -> Result<()> {
    let mut panels = Vec::new();
    if r.lateness.is_some() || r.deadline_to_kafka.is_some() {
        let mut bars = Vec::new();
        let mut title = "lateness after the deadline".to_owned();
        if let Some(l) = &r.lateness {
            title = format!(
                "expired_at − deadline: {} deadlines over {:.0} s, interval {:.0} s",
                num(l.load.bookings as f64),
                l.load.spread_s,
                l.interval_s
            );
            for (side, color) in [
                (&l.deadline_driven, plot::PROJECT),
                (&l.fixed, plot::BASELINE),
            ] {
                bars.push(plot::Bars {
                    name: format!("{} schedule", side.mode.label()),
                    color,
                    values: vec![Some(side.p50_s), Some(side.p99_s), Some(side.max_s)],
                });
            }
        }
        if let Some(k) = &r.deadline_to_kafka {
            bars.push(plot::Bars {
                name: format!(
                    "deadline → record on Kafka (deadline-driven, {} over {:.0} s)",
                    num(k.load.bookings as f64),
                    k.load.spread_s
                ),
                color: plot::THIRD,
                values: vec![
                    Some(k.record_p50_s),
                    Some(k.record_p99_s),
                    Some(k.record_max_s),
                ],
            });
        }
        panels.push(plot::BarPanel {
            title,
            y_desc: "seconds after the deadline (log scale)".into(),
            categories: vec!["p50".into(), "p99".into(), "max".into()],
            bars,
            label: seconds,
        });
    }
    if let Some(s) = &r.statements {
        let mut counts: Vec<u32> = s.runs.iter().map(|run| run.instances).collect();
        counts.sort_unstable();
        counts.dedup();
        let of = |mode: Mode| {
            counts
                .iter()
                .map(|n| {
                    s.runs
                        .iter()
                        .find(|run| run.mode == mode && run.instances == *n)
                        .map(|run| run.per_minute)
                })
                .collect()
        };
        panels.push(plot::BarPanel {
            title: format!(
                "statements per minute against PostgreSQL: {} deadlines over {:.0} s",
                num(s.load.bookings as f64),
                s.load.spread_s
            ),
            y_desc: "statements per minute (log scale)".into(),
            categories: counts
                .iter()
                .map(|n| match n {
                    1 => "1 instance".to_owned(),
                    n => format!("{n} instances"),
                })
                .collect(),
            bars: vec![
                plot::Bars {
                    name: "deadline-driven schedule".into(),
                    color: plot::PROJECT,
                    values: of(Mode::DeadlineDriven),
                },
                plot::Bars {
                    name: "fixed schedule".into(),
                    color: plot::BASELINE,
                    values: of(Mode::Fixed),
                },
            ],
            label: per_minute,
        });
    }
    if panels.is_empty() {
        bail!("no deadline wake-up figure in the results");
    }
    // The run that measured them (a `BENCH_ONLY` run keeps older figures).
    let stamp = FIGURES
        .iter()
        .find_map(|f| r.measured.get(*f))
        .map_or((r.mode.as_str(), r.finished_at.as_str()), |s| {
            (s.mode.as_str(), s.finished_at.as_str())
        });
    let when = chrono::DateTime::parse_from_rfc3339(stamp.1)
        .map(|t| t.format("%Y-%m-%d %H:%M UTC").to_string())
        .unwrap_or_else(|_| stamp.1.to_owned());
    let load = r
        .lateness
        .as_ref()
        .map(|l| l.loadavg_at_start)
        .or(r.statements.as_ref().map(|s| s.loadavg_at_start))
        .or(r.deadline_to_kafka.as_ref().map(|k| k.loadavg_at_start))
        .unwrap_or(r.machine.loadavg_at_start);
    plot::draw_bars(
        path,
        &format!(
            "booking-expiration deadline wake-up (binary `run`, defaults) — {} run {when}, {} cores, load {:.2} at start",
            stamp.0, r.machine.cores, load[0]
        ),
        &panels,
    )
}
