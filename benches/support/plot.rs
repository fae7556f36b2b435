//! The scaling plot (SVG, plotters without any font crate: text is written
//! as SVG `<text>` and laid out by the viewer).

use std::{ops::Range, path::Path};

use anyhow::{Result, anyhow};
use plotters::{coord::Shift, prelude::*};

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

/// Draws `panels` in a 2 x 2 grid under `title` into `path`.
pub fn draw(path: &Path, title: &str, panels: &[Panel]) -> Result<()> {
    let root = SVGBackend::new(path, (1200, 860)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| anyhow!("plot: {e:?}"))?;
    let root = root
        .titled(title, ("sans-serif", 18))
        .map_err(|e| anyhow!("plot: {e:?}"))?;
    let areas = root.split_evenly((2, 2));
    for (area, panel) in areas.iter().zip(panels) {
        draw_panel(area, panel)?;
    }
    root.present().map_err(|e| anyhow!("plot: {e:?}"))?;
    Ok(())
}
