//! The bench's plots (SVG, plotters without any font crate: text is written
//! as SVG `<text>` and laid out by the viewer): line panels in a 2 x 2 grid
//! (`scaling.svg`) and grouped bars on a logarithmic axis in one row
//! (`deadline-wake.svg`).

use std::{ops::Range, path::Path};

use anyhow::{Result, anyhow};
use plotters::{
    coord::Shift,
    prelude::*,
    style::text_anchor::{HPos, Pos, VPos},
};

/// One line of a panel: name, colour, points.
pub struct Series {
    pub name: String,
    pub color: RGBColor,
    pub points: Vec<(f64, f64)>,
}

/// One panel of the figure.
pub struct Panel {
    pub title: String,
    pub x_desc: String,
    pub y_desc: String,
    pub series: Vec<Series>,
}

pub const PROJECT: RGBColor = RGBColor(0x1f, 0x77, 0xb4);
pub const BASELINE: RGBColor = RGBColor(0xd6, 0x27, 0x28);

fn range(values: impl Iterator<Item = f64>) -> Range<f64> {
    let max = values.fold(0.0_f64, f64::max);
    0.0..if max > 0.0 { max * 1.15 } else { 1.0 }
}

fn draw_panel(area: &DrawingArea<SVGBackend<'_>, Shift>, panel: &Panel) -> Result<()> {
    let err = |e: &dyn std::fmt::Debug| anyhow!("plot: {e:?}");
    let xs = range(
        panel
            .series
            .iter()
            .flat_map(|s| s.points.iter().map(|p| p.0)),
    );
    let ys = range(
        panel
            .series
            .iter()
            .flat_map(|s| s.points.iter().map(|p| p.1)),
    );
    let mut chart = ChartBuilder::on(area)
        .caption(&panel.title, ("sans-serif", 16))
        .margin(14)
        .x_label_area_size(42)
        .y_label_area_size(64)
        .build_cartesian_2d(xs, ys)
        .map_err(|e| err(&e))?;
    chart
        .configure_mesh()
        .x_desc(panel.x_desc.as_str())
        .y_desc(panel.y_desc.as_str())
        .x_labels(6)
        .y_labels(6)
        .draw()
        .map_err(|e| err(&e))?;
    for series in &panel.series {
        let color = series.color;
        chart
            .draw_series(LineSeries::new(
                series.points.iter().copied(),
                color.stroke_width(2),
            ))
            .map_err(|e| err(&e))?
            .label(series.name.as_str())
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 18, y)], color.stroke_width(2))
            });
        chart
            .draw_series(
                series
                    .points
                    .iter()
                    .map(|&p| Circle::new(p, 4, color.filled())),
            )
            .map_err(|e| err(&e))?;
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()
        .map_err(|e| err(&e))?;
    Ok(())
}

/// A line panel with both axes logarithmic; points at or below zero are
/// left out.
fn draw_log_panel(area: &DrawingArea<SVGBackend<'_>, Shift>, panel: &Panel) -> Result<()> {
    let err = |e: &dyn std::fmt::Debug| anyhow!("plot: {e:?}");
    let positive = |v: &f64| *v > 0.0 && v.is_finite();
    let xs = log_range_tight(
        panel
            .series
            .iter()
            .flat_map(|s| s.points.iter().map(|p| p.0))
            .filter(positive),
        1.5,
    );
    // A decade above the values for the legend.
    let ys = log_range_tight(
        panel
            .series
            .iter()
            .flat_map(|s| s.points.iter().map(|p| p.1))
            .filter(positive),
        12.0,
    );
    let mut chart = ChartBuilder::on(area)
        .caption(&panel.title, ("sans-serif", 15))
        .margin(14)
        .x_label_area_size(42)
        .y_label_area_size(64)
        .build_cartesian_2d(xs.log_scale(), ys.log_scale())
        .map_err(|e| err(&e))?;
    let x_tick = |x: &f64| tick(*x);
    let y_tick = |y: &f64| tick(*y);
    chart
        .configure_mesh()
        .x_desc(panel.x_desc.as_str())
        .y_desc(panel.y_desc.as_str())
        .x_label_formatter(&x_tick)
        .y_label_formatter(&y_tick)
        .draw()
        .map_err(|e| err(&e))?;
    for series in &panel.series {
        let color = series.color;
        let points: Vec<(f64, f64)> = series
            .points
            .iter()
            .copied()
            .filter(|(x, y)| positive(x) && positive(y))
            .collect();
        let dashed = series.name.contains("p50") || series.name.contains("due");
        let style = if dashed {
            color.mix(0.6).stroke_width(2)
        } else {
            color.stroke_width(2)
        };
        chart
            .draw_series(LineSeries::new(points.iter().copied(), style))
            .map_err(|e| err(&e))?
            .label(series.name.as_str())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], style));
        chart
            .draw_series(points.iter().map(|&p| Circle::new(p, 3, color.filled())))
            .map_err(|e| err(&e))?;
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .label_font(("sans-serif", 11))
        .draw()
        .map_err(|e| err(&e))?;
    Ok(())
}

/// The values' span on a log axis, a little wider below and `above` times
/// the largest value on top.
fn log_range_tight(values: impl Iterator<Item = f64>, above: f64) -> Range<f64> {
    let (lo, hi) = values.fold((f64::INFINITY, 0.0_f64), |(lo, hi), v| {
        (lo.min(v), hi.max(v))
    });
    if hi <= 0.0 || !lo.is_finite() {
        return 0.1..10.0;
    }
    lo / 1.5..hi * above
}

/// Draws `panels` (both axes logarithmic) in a 2 x 2 grid under `title`.
pub fn draw_log(path: &Path, title: &str, panels: &[Panel]) -> Result<()> {
    draw_grid(path, (1200, 900), title, (2, 2), panels, draw_log_panel)
}

/// Draws `panels` in a 2 x 2 grid under `title` into `path`.
pub fn draw(path: &Path, title: &str, panels: &[Panel]) -> Result<()> {
    draw_grid(path, (1200, 860), title, (2, 2), panels, draw_panel)
}

/// One SVG of `size` with `title` over a `grid` (rows, columns) of
/// `panels`, each drawn by `draw_one`.
fn draw_grid<P>(
    path: &Path,
    size: (u32, u32),
    title: &str,
    grid: (usize, usize),
    panels: &[P],
    draw_one: impl Fn(&DrawingArea<SVGBackend<'_>, Shift>, &P) -> Result<()>,
) -> Result<()> {
    let root = SVGBackend::new(path, size).into_drawing_area();
    root.fill(&WHITE).map_err(|e| anyhow!("plot: {e:?}"))?;
    let root = root
        .titled(title, ("sans-serif", 18))
        .map_err(|e| anyhow!("plot: {e:?}"))?;
    for (area, panel) in root.split_evenly(grid).iter().zip(panels) {
        draw_one(area, panel)?;
    }
    root.present().map_err(|e| anyhow!("plot: {e:?}"))?;
    Ok(())
}

/// One series of a bar panel: one bar per category (`None`: no bar).
pub struct Bars {
    pub name: String,
    pub color: RGBColor,
    pub values: Vec<Option<f64>>,
}

/// A panel of grouped bars on a logarithmic value axis; each bar is
/// labelled with `label(value)`.
pub struct BarPanel {
    pub title: String,
    pub y_desc: String,
    pub categories: Vec<String>,
    pub bars: Vec<Bars>,
    pub label: fn(f64) -> String,
}

pub const THIRD: RGBColor = RGBColor(0x2c, 0xa0, 0x2c);

/// A number for a log axis: no float noise, no trailing zeros.
fn tick(v: f64) -> String {
    if v >= 1.0 {
        format!("{v:.0}")
    } else {
        let s = format!("{v:.4}");
        s.trim_end_matches('0').trim_end_matches('.').to_owned()
    }
}

/// Whole powers of ten around the positive values, with a decade above
/// for the labels and the legend.
fn log_range(values: impl Iterator<Item = f64>) -> Range<f64> {
    let (lo, hi) = values
        .filter(|v| *v > 0.0 && v.is_finite())
        .fold((f64::INFINITY, 0.0_f64), |(lo, hi), v| {
            (lo.min(v), hi.max(v))
        });
    if hi <= 0.0 {
        return 0.1..10.0;
    }
    // A little below the lowest decade, so that its label is drawn.
    10f64.powf(lo.log10().floor()) * 0.8..10f64.powf(hi.log10().ceil() + 1.0)
}

fn draw_bar_panel(area: &DrawingArea<SVGBackend<'_>, Shift>, panel: &BarPanel) -> Result<()> {
    let err = |e: &dyn std::fmt::Debug| anyhow!("plot: {e:?}");
    let ys = log_range(
        panel
            .bars
            .iter()
            .flat_map(|b| b.values.iter().flatten().copied()),
    );
    let floor = ys.start;
    let n = panel.categories.len();
    // Category i is centred on x = i; its bars share 0.7 of the unit.
    let mut chart = ChartBuilder::on(area)
        .caption(&panel.title, ("sans-serif", 15))
        .margin(14)
        .x_label_area_size(42)
        .y_label_area_size(64)
        .build_cartesian_2d(-0.5..n as f64 - 0.5, ys.log_scale())
        .map_err(|e| err(&e))?;
    let category = |x: &f64| {
        let i = x.round();
        if (x - i).abs() < 1e-9 && i >= 0.0 {
            panel
                .categories
                .get(i as usize)
                .cloned()
                .unwrap_or_default()
        } else {
            String::new()
        }
    };
    let y_tick = |y: &f64| tick(*y);
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(n)
        .x_label_formatter(&category)
        .y_label_formatter(&y_tick)
        .y_desc(panel.y_desc.as_str())
        .draw()
        .map_err(|e| err(&e))?;
    let width = 0.7 / panel.bars.len().max(1) as f64;
    for (j, bars) in panel.bars.iter().enumerate() {
        let color = bars.color;
        let spans: Vec<(f64, f64, f64)> = bars
            .values
            .iter()
            .enumerate()
            .filter_map(|(i, v)| {
                let x0 = i as f64 - 0.35 + j as f64 * width;
                v.filter(|v| *v > 0.0).map(|v| (x0, x0 + width * 0.9, v))
            })
            .collect();
        chart
            .draw_series(
                spans
                    .iter()
                    .map(|&(x0, x1, v)| Rectangle::new([(x0, floor), (x1, v)], color.filled())),
            )
            .map_err(|e| err(&e))?
            .label(bars.name.as_str())
            .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 14, y + 5)], color.filled()));
        let style = ("sans-serif", 12)
            .into_font()
            .color(&BLACK)
            .pos(Pos::new(HPos::Center, VPos::Bottom));
        chart
            .draw_series(spans.iter().map(|&(x0, x1, v)| {
                Text::new((panel.label)(v), ((x0 + x1) / 2.0, v * 1.12), style.clone())
            }))
            .map_err(|e| err(&e))?;
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()
        .map_err(|e| err(&e))?;
    Ok(())
}

/// Draws `panels` side by side under `title` into `path`.
pub fn draw_bars(path: &Path, title: &str, panels: &[BarPanel]) -> Result<()> {
    let columns = panels.len().max(1);
    draw_grid(
        path,
        (1200, 520),
        title,
        (1, columns),
        panels,
        draw_bar_panel,
    )
}
