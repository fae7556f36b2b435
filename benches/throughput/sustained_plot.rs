//! The sustained-rate plot (`sustained.svg`) of a run, drawn from its
//! [`Results`]: against the rate of deadlines (log axes), the expiring
//! commit's lateness p50 / p99 and deadline → acknowledged on Kafka p99;
//! the most due and unpublished rows; CPU per 1,000 events of the
//! instances and PostgreSQL; the cores they and the whole machine used.
//! One line per instance count; the knee of each is in the report.

use std::path::Path;

use anyhow::{Result, bail};
use plotters::style::RGBColor;

use crate::{
    figures::sustained::SustainedConfig,
    results::Results,
    support::plot::{self, Panel, Series},
};

/// The file name, next to `results.json`.
pub const FILE: &str = "sustained.svg";

/// Colours per instance count (1, 4) and measure.
const ONE: [RGBColor; 3] = [
    plot::PROJECT,
    RGBColor(0x17, 0xbe, 0xcf),
    RGBColor(0x94, 0x67, 0xbd),
];
const FOUR: [RGBColor; 3] = [
    plot::BASELINE,
    RGBColor(0xff, 0x7f, 0x0e),
    RGBColor(0x8c, 0x56, 0x4b),
];

fn colors(c: &SustainedConfig) -> [RGBColor; 3] {
    if c.instances == 1 { ONE } else { FOUR }
}

fn series(
    c: &SustainedConfig,
    name: &str,
    color: RGBColor,
    y: fn(&crate::figures::sustained::Step) -> f64,
) -> Series {
    Series {
        name: format!("x{}: {name}", c.instances),
        color,
        points: c.steps.iter().map(|s| (s.rate, y(s))).collect(),
    }
}

pub fn draw(r: &Results, path: &Path) -> Result<()> {
    let Some(f) = &r.sustained else {
        bail!("no sustained-rate figure in the results");
    };
    let configs = &f.configs;
    let rate = "bookings falling due per second (log)".to_owned();
    let mut lateness = Vec::new();
    let mut backlog = Vec::new();
    let mut cpu = Vec::new();
    let mut cores = Vec::new();
    for c in configs {
        let [a, b, d] = colors(c);
        lateness.push(series(c, "commit − deadline p99", a, |s| s.commit_p99_s));
        lateness.push(series(c, "commit − deadline p50", b, |s| s.commit_p50_s));
        lateness.push(series(c, "acked on Kafka − deadline p99", d, |s| {
            s.acked_p99_s
        }));
        backlog.push(series(c, "most unpublished rows", a, |s| {
            s.max_unpublished.max(1) as f64
        }));
        backlog.push(series(c, "most due rows", b, |s| s.max_due.max(1) as f64));
        cpu.push(series(c, "PostgreSQL", a, |s| s.pg_cpu_ms_per_1000));
        cpu.push(series(c, "instances", b, |s| s.worker_cpu_ms_per_1000));
        cpu.push(series(c, "Kafka broker", d, |s| s.kafka_cpu_ms_per_1000));
        cores.push(series(c, "whole machine", a, |s| s.machine_busy_cores));
        cores.push(series(c, "PostgreSQL", b, |s| s.pg_cores));
        cores.push(series(c, "instances", d, |s| s.worker_cores));
        cores.push(series(
            c,
            "other users' work",
            RGBColor(0x7f, 0x7f, 0x7f),
            |s| s.others_cores,
        ));
    }
    let panels = [
        Panel {
            title: "lateness after the deadline".into(),
            x_desc: rate.clone(),
            y_desc: "seconds (log)".into(),
            series: lateness,
        },
        Panel {
            title: "backlog: the most rows seen (sampled every 0.5 s)".into(),
            x_desc: rate.clone(),
            y_desc: "rows (log, at least 1)".into(),
            series: backlog,
        },
        Panel {
            title: "CPU per 1,000 events".into(),
            x_desc: rate.clone(),
            y_desc: "CPU ms (log)".into(),
            series: cpu,
        },
        Panel {
            title: format!("cores busy ({} on the machine)", r.machine.cores),
            x_desc: rate,
            y_desc: "cores, average over the step (log)".into(),
            series: cores,
        },
    ];
    let stamp = r
        .measured
        .get("sustained")
        .map_or((r.mode.as_str(), r.finished_at.as_str()), |s| {
            (s.mode.as_str(), s.finished_at.as_str())
        });
    let when = chrono::DateTime::parse_from_rfc3339(stamp.1)
        .map(|t| t.format("%Y-%m-%d %H:%M UTC").to_string())
        .unwrap_or_else(|_| stamp.1.to_owned());
    plot::draw_log(
        path,
        &format!(
            "booking-expiration at a sustained rate: binary `run` at its defaults, 1 and 4 instances, {:.0} s per step — {} run {when}, load {:.2} at start",
            f.step_s, stamp.0, f.loadavg_at_start[0]
        ),
        &panels,
    )
}
