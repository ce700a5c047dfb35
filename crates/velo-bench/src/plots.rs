//! SVG plots of a comparison: TTFT and per-request mean ITL CDFs, output tokens/s over time.

use std::path::Path;

use plotters::prelude::*;

use crate::frontend::BUCKET;

/// One arm's curves.
pub struct Curves<'a> {
    /// The arm.
    pub arm: &'a str,
    /// TTFT CDF (ms, fraction).
    pub ttft: &'a [(f64, f64)],
    /// Per-request mean ITL CDF (ms, fraction).
    pub itl: &'a [(f64, f64)],
    /// Output tokens per 100 ms bucket.
    pub tokens: &'a [u64],
}

/// Writes `ttft_cdf.svg`, `itl_cdf.svg` and `tokens_per_s.svg` into `dir`.
///
/// # Errors
///
/// A message naming the file that could not be written.
pub fn write(dir: &Path, curves: &[Curves<'_>]) -> Result<(), String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    cdf(
        &dir.join("ttft_cdf.svg"),
        "TTFT CDF",
        "TTFT (ms)",
        curves,
        |c| c.ttft,
    )?;
    cdf(
        &dir.join("itl_cdf.svg"),
        "Per-request mean ITL CDF",
        "mean inter-token latency (ms)",
        curves,
        |c| c.itl,
    )?;
    series(&dir.join("tokens_per_s.svg"), curves)
}

fn cdf<'a>(
    path: &Path,
    title: &str,
    x_label: &str,
    curves: &[Curves<'a>],
    pick: fn(&Curves<'a>) -> &'a [(f64, f64)],
) -> Result<(), String> {
    let err = |e: &dyn std::fmt::Display| format!("{}: {e}", path.display());
    let x_max = curves
        .iter()
        .flat_map(|c| pick(c).iter().map(|p| p.0))
        .fold(1.0_f64, f64::max)
        * 1.05;
    let root = SVGBackend::new(path, (900, 560)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| err(&e))?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 22))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(50)
        .build_cartesian_2d(0.0..x_max, 0.0..1.0)
        .map_err(|e| err(&e))?;
    chart
        .configure_mesh()
        .x_desc(x_label)
        .y_desc("fraction of requests")
        .draw()
        .map_err(|e| err(&e))?;
    for (i, c) in curves.iter().enumerate() {
        let color = Palette99::pick(i).to_rgba();
        chart
            .draw_series(LineSeries::new(
                pick(c).iter().copied(),
                color.stroke_width(2),
            ))
            .map_err(|e| err(&e))?
            .label(c.arm)
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
            });
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()
        .map_err(|e| err(&e))?;
    root.present().map_err(|e| err(&e))
}

fn series(path: &Path, curves: &[Curves<'_>]) -> Result<(), String> {
    let err = |e: &dyn std::fmt::Display| format!("{}: {e}", path.display());
    let per_s = 1.0 / BUCKET.as_secs_f64();
    let points: Vec<Vec<(f64, f64)>> = curves
        .iter()
        .map(|c| {
            c.tokens
                .iter()
                .enumerate()
                .map(|(i, n)| (i as f64 * BUCKET.as_secs_f64(), *n as f64 * per_s))
                .collect()
        })
        .collect();
    let x_max = points
        .iter()
        .flat_map(|p| p.iter().map(|q| q.0))
        .fold(1.0_f64, f64::max);
    let y_max = points
        .iter()
        .flat_map(|p| p.iter().map(|q| q.1))
        .fold(1.0_f64, f64::max)
        * 1.1;
    let root = SVGBackend::new(path, (900, 560)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| err(&e))?;
    let mut chart = ChartBuilder::on(&root)
        .caption("Output tokens/s over time", ("sans-serif", 22))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(70)
        .build_cartesian_2d(0.0..x_max, 0.0..y_max)
        .map_err(|e| err(&e))?;
    chart
        .configure_mesh()
        .x_desc("seconds since the load started")
        .y_desc("output tokens/s")
        .draw()
        .map_err(|e| err(&e))?;
    for (i, (c, p)) in curves.iter().zip(points).enumerate() {
        let color = Palette99::pick(i).to_rgba();
        chart
            .draw_series(LineSeries::new(p, color.stroke_width(2)))
            .map_err(|e| err(&e))?
            .label(c.arm)
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
            });
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()
        .map_err(|e| err(&e))?;
    root.present().map_err(|e| err(&e))
}
