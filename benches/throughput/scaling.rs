//! The scaling plot (`scaling.svg`) of a run, drawn from its [`Results`]:
//! cycle time against due rows, cost per booking against table size,
//! throughput against batch size and against instances.

use std::path::Path;

use anyhow::{Context, Result};

use crate::{
    figures::expiry::Comparison,
    results::Results,
    support::{Stat, plot},
};

fn series(name: &str, color: plotters::style::RGBColor, points: Vec<(f64, f64)>) -> plot::Series {
    plot::Series {
        name: name.into(),
        color,
        points,
    }
}

/// Draws the four panels of `r` into `path`.
pub fn draw(r: &Results, path: &Path) -> Result<()> {
    let by_key = |k: &str| {
        r.expiry
            .get(k)
            .with_context(|| format!("{k} not in the results"))
    };
    let h = by_key("expiry_10k_b200_x1")?;
    let idle = r
        .idle_cycle
        .as_ref()
        .context("idle_cycle not in the results")?;
    let big = by_key("expiry_100k_b200_x1")?;
    let wide = by_key("expiry_1m_10k_b200_x1")?;
    let per_row_us = |c: &Comparison, s: &Stat| s.median * 1e6 / c.due as f64;
    let by_table_size = |pick: fn(&Comparison) -> &Stat| {
        let mut v: Vec<(f64, f64)> = [h, big, wide]
            .iter()
            .map(|c| (c.table_rows as f64, per_row_us(c, pick(c))))
            .collect();
        v.sort_by(|a, b| a.0.total_cmp(&b.0));
        v
    };
    let batches = [
        by_key("expiry_10k_b50_x1")?,
        h,
        by_key("expiry_10k_b1000_x1")?,
    ];
    let instances = [
        h,
        by_key("expiry_10k_b200_x2")?,
        by_key("expiry_10k_b200_x4")?,
    ];
    let worker_vs_raw = |cs: &[&Comparison], x: fn(&Comparison) -> f64| {
        vec![
            series(
                "worker",
                plot::PROJECT,
                cs.iter()
                    .map(|c| (x(c), c.worker_bookings_per_s.median))
                    .collect(),
            ),
            series(
                "raw SQL",
                plot::BASELINE,
                cs.iter()
                    .map(|c| (x(c), c.raw_sql_bookings_per_s.median))
                    .collect(),
            ),
        ]
    };
    let panels = vec![
        plot::Panel {
            title: "cycle time vs due rows (batch 200, 1 instance)".into(),
            x_desc: "due bookings".into(),
            y_desc: "seconds (median)".into(),
            series: vec![
                series(
                    "worker",
                    plot::PROJECT,
                    vec![
                        (0.0, idle.ms.median / 1e3),
                        (h.due as f64, h.worker_seconds.median),
                        (big.due as f64, big.worker_seconds.median),
                    ],
                ),
                series(
                    "raw SQL",
                    plot::BASELINE,
                    vec![
                        (h.due as f64, h.raw_sql_seconds.median),
                        (big.due as f64, big.raw_sql_seconds.median),
                    ],
                ),
            ],
        },
        plot::Panel {
            title: "cost per expired booking vs table size (batch 200)".into(),
            x_desc: "bookings in the table".into(),
            y_desc: "microseconds per booking (median)".into(),
            series: vec![
                series(
                    "worker",
                    plot::PROJECT,
                    by_table_size(|c| &c.worker_seconds),
                ),
                series(
                    "raw SQL",
                    plot::BASELINE,
                    by_table_size(|c| &c.raw_sql_seconds),
                ),
            ],
        },
        plot::Panel {
            title: "throughput vs batch size (10k due, 1 instance)".into(),
            x_desc: "batch size".into(),
            y_desc: "bookings/s (median)".into(),
            series: worker_vs_raw(&batches, |c| f64::from(c.batch)),
        },
        plot::Panel {
            title: "throughput vs parallel instances (10k due, batch 200)".into(),
            x_desc: "instances".into(),
            y_desc: "bookings/s (median)".into(),
            series: worker_vs_raw(&instances, |c| c.instances as f64),
        },
    ];
    let finished = chrono::DateTime::parse_from_rfc3339(&r.finished_at)
        .map(|t| t.format("%Y-%m-%d %H:%M UTC").to_string())
        .unwrap_or_else(|_| r.finished_at.clone());
    plot::draw(
        path,
        &format!(
            "booking-expiration scaling — {} run {finished}, {} cores, load {:.2} at start",
            r.mode, r.machine.cores, r.machine.loadavg_at_start[0]
        ),
        &panels,
    )
}
