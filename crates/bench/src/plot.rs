//! PNG plots: a run's throughput and latency over time, and bars comparing targets.
//!
//! Text is drawn with a TrueType font found on the system (Debian's fonts-dejavu-core); without
//! one the plots are skipped with a warning and the JSON results still stand.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use anyhow::{anyhow, Context};
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

use crate::report::RunResult;

const FONT: &str = "sans-serif";
const COLORS: [RGBColor; 6] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
];

fn find_font() -> Option<PathBuf> {
    let preferred = Path::new("/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf");
    if preferred.is_file() {
        return Some(preferred.to_path_buf());
    }
    let mut dirs = vec![PathBuf::from("/usr/share/fonts")];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
            let path = entry.path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e.eq_ignore_ascii_case("ttf")) {
                return Some(path);
            }
        }
    }
    None
}

fn ensure_font() -> anyhow::Result<()> {
    static REGISTERED: OnceLock<Result<(), String>> = OnceLock::new();
    REGISTERED
        .get_or_init(|| {
            let path = find_font().ok_or("no TrueType font under /usr/share/fonts (install fonts-dejavu-core)")?;
            let bytes = std::fs::read(&path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
            // plotters keeps registered fonts for the life of the process.
            let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
            plotters::style::register_font(FONT, FontStyle::Normal, bytes)
                .map_err(|_| format!("{} is not a usable font", path.display()))
        })
        .clone()
        .map_err(|e| anyhow!(e))
}

fn draw_error<E: std::fmt::Debug>(e: E) -> anyhow::Error {
    anyhow!("drawing failed: {e:?}")
}

/// Throughput (top) and p50/p99 latency (bottom) per second of one run.
pub fn plot_run(result: &RunResult, path: &Path) -> anyhow::Result<()> {
    ensure_font()?;
    let root = BitMapBackend::new(path, (1000, 700)).into_drawing_area();
    root.fill(&WHITE).map_err(draw_error)?;
    let (top, bottom) = root.split_vertically(350);
    let seconds = result.timeline.len().max(1) as f64;
    let max_ops = result.timeline.iter().map(|p| p.ops).max().unwrap_or(1).max(1) as f64;
    let title = format!(
        "{} — {} clients, {:.0} ops/s, p99 {:.2} ms",
        result.name,
        result.config.clients,
        result.throughput_ops_per_sec,
        result.latency_ms.get("all").map_or(0.0, |l| l.p99)
    );
    let mut chart = ChartBuilder::on(&top)
        .caption(title, (FONT, 20))
        .margin(10)
        .x_label_area_size(30)
        .y_label_area_size(70)
        .build_cartesian_2d(0f64..seconds, 0f64..max_ops * 1.1)
        .map_err(draw_error)?;
    chart
        .configure_mesh()
        .x_desc("second")
        .y_desc("ops/s")
        .label_style((FONT, 12))
        .draw()
        .map_err(draw_error)?;
    chart
        .draw_series(LineSeries::new(
            result.timeline.iter().map(|p| (p.second as f64, p.ops as f64)),
            COLORS[0].stroke_width(2),
        ))
        .map_err(draw_error)?;

    let max_ms = result
        .timeline
        .iter()
        .map(|p| p.p99_ms)
        .fold(0.0f64, f64::max)
        .max(0.001);
    let mut chart = ChartBuilder::on(&bottom)
        .margin(10)
        .x_label_area_size(30)
        .y_label_area_size(70)
        .build_cartesian_2d(0f64..seconds, 0f64..max_ms * 1.1)
        .map_err(draw_error)?;
    chart
        .configure_mesh()
        .x_desc("second")
        .y_desc("latency ms")
        .label_style((FONT, 12))
        .draw()
        .map_err(draw_error)?;
    for (i, (label, pick)) in [("p50", 0usize), ("p99", 1)].into_iter().enumerate() {
        let color = COLORS[i + 1];
        chart
            .draw_series(LineSeries::new(
                result
                    .timeline
                    .iter()
                    .map(|p| (p.second as f64, if pick == 0 { p.p50_ms } else { p.p99_ms })),
                color.stroke_width(2),
            ))
            .map_err(draw_error)?
            .label(label)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2)));
    }
    chart
        .configure_series_labels()
        .label_font((FONT, 14))
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()
        .map_err(draw_error)?;
    root.present().map_err(draw_error)?;
    Ok(())
}

/// One group of bars: a scenario, and one value per target (None when the target did not run).
pub struct BarGroup {
    pub label: String,
    pub values: Vec<Option<f64>>,
}

/// A value as a bar label or axis tick: three significant digits, thousands as "k".
pub fn short_number(value: f64) -> String {
    let magnitude = value.abs();
    if magnitude == 0.0 {
        "0".into()
    } else if magnitude >= 10_000.0 {
        format!("{:.0}k", value / 1000.0)
    } else if magnitude >= 1000.0 {
        format!("{:.1}k", value / 1000.0)
    } else if magnitude >= 100.0 {
        format!("{value:.0}")
    } else if magnitude >= 10.0 {
        format!("{value:.1}")
    } else {
        format!("{value:.2}")
    }
}

/// Grouped bars on a linear scale from zero, so heights compare as ratios: one group per
/// scenario, one bar per target, each bar labelled with its value.
pub fn plot_bars(
    title: &str,
    y_desc: &str,
    targets: &[String],
    groups: &[BarGroup],
    path: &Path,
) -> anyhow::Result<()> {
    ensure_font()?;
    let width = (200 + groups.len() * targets.len() * 60).clamp(900, 2400) as u32;
    let root = BitMapBackend::new(path, (width, 600)).into_drawing_area();
    root.fill(&WHITE).map_err(draw_error)?;
    let max = groups
        .iter()
        .flat_map(|g| g.values.iter().flatten().copied())
        .fold(0.0f64, f64::max);
    // Headroom for the labels above the tallest bar and for the legend.
    let top = if max > 0.0 { max * 1.25 } else { 1.0 };
    let labels: Vec<String> = groups.iter().map(|g| g.label.clone()).collect();
    let mut chart = ChartBuilder::on(&root)
        .caption(title, (FONT, 22))
        .margin(15)
        .x_label_area_size(40)
        .y_label_area_size(80)
        .build_cartesian_2d(0f64..groups.len() as f64, 0f64..top)
        .map_err(draw_error)?;
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(groups.len() * 2 + 1)
        .x_label_formatter(&|x| {
            let centre = x - x.floor();
            if (centre - 0.5).abs() < 0.01 {
                labels.get(x.floor() as usize).cloned().unwrap_or_default()
            } else {
                String::new()
            }
        })
        .y_labels(10)
        .y_label_formatter(&|y| short_number(*y))
        .y_desc(y_desc)
        .label_style((FONT, 13))
        .draw()
        .map_err(draw_error)?;
    let bar_width = 0.8 / targets.len().max(1) as f64;
    let bars_of = |t: usize| {
        groups.iter().enumerate().filter_map(move |(g, group)| {
            let value = group.values.get(t).copied().flatten()?;
            let left = g as f64 + 0.1 + t as f64 * bar_width;
            Some((left, value))
        })
    };
    for (t, target) in targets.iter().enumerate() {
        let color = COLORS[t % COLORS.len()];
        chart
            .draw_series(
                bars_of(t).map(|(left, value)| {
                    Rectangle::new([(left, 0.0), (left + bar_width * 0.95, value)], color.filled())
                }),
            )
            .map_err(draw_error)?
            .label(target.as_str())
            .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 15, y + 5)], color.filled()));
        let label_style = TextStyle::from((FONT, 12).into_font())
            .color(&BLACK)
            .pos(Pos::new(HPos::Center, VPos::Bottom));
        chart
            .draw_series(bars_of(t).map(|(left, value)| {
                Text::new(
                    short_number(value),
                    (left + bar_width * 0.475, value),
                    label_style.clone(),
                )
            }))
            .map_err(draw_error)?;
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .label_font((FONT, 14))
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()
        .map_err(draw_error)?;
    root.present().map_err(draw_error)?;
    Ok(())
}

/// Writes a plot, turning a failure into a warning: plots are a convenience, results are JSON.
pub fn try_plot(what: &str, path: &Path, draw: impl FnOnce(&Path) -> anyhow::Result<()>) -> Option<PathBuf> {
    match draw(path).with_context(|| format!("cannot plot {what}")) {
        Ok(()) => Some(path.to_path_buf()),
        Err(e) => {
            eprintln!("warning: {e:#}");
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::short_number;

    #[test]
    fn bar_labels_keep_three_significant_digits() {
        assert_eq!(short_number(0.0), "0");
        assert_eq!(short_number(8.914), "8.91");
        assert_eq!(short_number(48.93), "48.9");
        assert_eq!(short_number(441.4), "441");
        assert_eq!(short_number(4045.0), "4.0k");
        assert_eq!(short_number(60982.0), "61k");
    }
}
