//! A run's outputs: `timeseries.csv`, `summary.md` and three SVG plots per
//! scenario. Every number is formatted with a fixed precision from sums and
//! maxima computed in a fixed order, so the files are byte-identical per seed.

use std::fmt::Write as _;
use std::io;
use std::path::Path;

use plotters::prelude::*;

use super::{Run, Strategy, StrategyRun};

/// Plots of one run, written beside the CSV.
pub const PLOTS: [(&str, &str); 3] = [
    (
        "allocation.svg",
        "key c0's allocation per region (meridian solid, proportional dashed)",
    ),
    (
        "demand.svg",
        "key c0: demand vs admitted vs limit, per strategy",
    ),
    (
        "overshoot.svg",
        "most one key admitted per window, % of L, per strategy",
    ),
];

/// Writes the run's CSV, `summary.md` and [`PLOTS`] into `dir`, creating it.
pub fn write(run: &Run, dir: &Path) -> io::Result<()> {
    std::fs::create_dir_all(dir)?;
    std::fs::write(dir.join("timeseries.csv"), csv(run))?;
    std::fs::write(dir.join("summary.md"), markdown(run, ""))?;
    std::fs::write(dir.join("allocation.svg"), plot_allocation(run))?;
    std::fs::write(dir.join("demand.svg"), plot_demand(run))?;
    std::fs::write(dir.join("overshoot.svg"), plot_overshoot(run))?;
    Ok(())
}

/// The run as `timeseries.csv`: one line per window and strategy, with the
/// admitted hits per region and key 0's allocation per region.
pub fn csv(run: &Run) -> String {
    let s = &run.scenario;
    let mut out = String::from(
        "window_start_s,strategy,asked,admitted,ideal_admitted,false_rejected,\
         max_key_pct_of_limit,bound_excess,key0_asked,key0_admitted",
    );
    for r in &s.regions {
        let _ = write!(out, ",key0_alloc_{}", r.name);
    }
    for r in &s.regions {
        let _ = write!(out, ",admitted_{}", r.name);
    }
    out.push('\n');
    let rows = run.runs[0].windows.len();
    for i in 0..rows {
        for sr in &run.runs {
            let w = &sr.windows[i];
            let _ = write!(
                out,
                "{},{},{},{},{},{},{:.2},{},{},{}",
                w.start_ms / 1000,
                sr.name(),
                w.asked,
                w.admitted,
                w.ideal,
                w.false_rejected,
                w.max_key_admitted as f64 * 100.0 / s.rule.limit as f64,
                w.bound_excess.max(0),
                w.key0_asked,
                w.key0_admitted,
            );
            for a in &w.key0_alloc {
                let _ = write!(out, ",{a}");
            }
            for a in &w.region_admitted {
                let _ = write!(out, ",{a}");
            }
            out.push('\n');
        }
    }
    out
}

fn pct(v: Option<f64>) -> String {
    v.map_or("—".into(), |v| format!("{v:.1} %"))
}

fn catch_up(sr: &StrategyRun, shifts: &[i64]) -> String {
    if shifts.is_empty() {
        return "—".into();
    }
    let all = sr.catch_up_ms(shifts);
    if all.iter().any(Option::is_none) {
        return "never".into();
    }
    let worst = all.iter().flatten().max().copied().unwrap_or(0);
    format!("{} s", worst / 1000)
}

/// The results table of a run; `images` prefixes plot links (empty: none).
pub fn markdown(run: &Run, images: &str) -> String {
    let s = &run.scenario;
    let limit = s.rule.limit;
    let shifts = s.shift_times();
    let mut out = String::new();
    let _ = writeln!(out, "### {}\n", s.name);
    if !s.description.is_empty() {
        let _ = writeln!(out, "{}\n", s.description.trim());
    }
    let regions: Vec<String> = s
        .regions
        .iter()
        .map(|r| format!("{} ({} pods, {} ms)", r.name, r.pods, r.latency_ms))
        .collect();
    let _ = writeln!(
        out,
        "{} h, seed {}; rule {} L = {}/{} s{}, partition {}; {} customers; regions {}.\n",
        fmt_hours(s.duration_ms),
        run.seed,
        s.rule.algorithm,
        limit,
        s.rule.period_ms / 1000,
        s.rule
            .burst
            .map_or(String::new(), |b| format!(", burst {b}")),
        s.rule.partition.name(),
        s.traffic.customers,
        regions.join(", "),
    );
    out.push_str(
        "| strategy | max overshoot | mean overshoot | windows above L | false rejections \
         | capacity used | catch-up | stated bound | latency per check |\n\
         |---|---:|---:|---:|---:|---:|---:|---|---:|\n",
    );
    for sr in &run.runs {
        let m = &sr.summary;
        let bound = if m.max_bound_excess <= 0 {
            "held".to_string()
        } else {
            format!("exceeded by {}", m.max_bound_excess)
        };
        let latency = match sr.strategy {
            Strategy::Ideal => format!("+{:.0} ms RTT", m.latency_ms()),
            _ => "local".into(),
        };
        let _ = writeln!(
            out,
            "| {} | {:.1} % | {} | {} | {} | {} | {} | {} | {} |",
            sr.name(),
            m.max_overshoot_pct(limit),
            pct(m.mean_overshoot_pct(limit)),
            pct(m.windows_over_pct()),
            pct(m.false_rejections_pct()),
            pct(m.capacity_used_pct(limit)),
            catch_up(sr, &shifts),
            bound,
            latency,
        );
    }
    if !images.is_empty() {
        out.push('\n');
        for (file, what) in PLOTS {
            let _ = writeln!(out, "![{} — {what}]({images}{file})", s.name);
        }
    }
    out
}

fn fmt_hours(ms: i64) -> String {
    let h = ms as f64 / 3_600_000.0;
    if h.fract() == 0.0 {
        format!("{h:.0}")
    } else {
        format!("{h:.2}")
    }
}

const COLORS: [RGBColor; 6] = [
    RGBColor(31, 119, 180),
    RGBColor(214, 39, 40),
    RGBColor(44, 160, 44),
    RGBColor(255, 127, 14),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
];

fn strategy_color(index: usize) -> RGBColor {
    COLORS[index % COLORS.len()]
}

struct Line {
    label: String,
    color: RGBColor,
    dashed: bool,
    points: Vec<(f64, f64)>,
}

/// Draws lines over hours; a plotting error leaves an SVG saying so.
fn chart(title: &str, y_desc: &str, lines: &[Line]) -> String {
    let mut svg = String::new();
    let result = draw(&mut svg, title, y_desc, lines);
    if let Err(e) = result {
        return format!(
            "<svg xmlns=\"http://www.w3.org/2000/svg\"><text y=\"20\">plot failed: {e}</text></svg>\n"
        );
    }
    svg
}

fn draw(
    svg: &mut String,
    title: &str,
    y_desc: &str,
    lines: &[Line],
) -> Result<(), Box<dyn std::error::Error>> {
    let x_max = lines
        .iter()
        .flat_map(|l| l.points.iter().map(|p| p.0))
        .fold(0.0f64, f64::max)
        .max(1e-3);
    let y_max = lines
        .iter()
        .flat_map(|l| l.points.iter().map(|p| p.1))
        .fold(0.0f64, f64::max)
        .max(1.0)
        * 1.1;
    let root = SVGBackend::with_string(svg, (960, 420)).into_drawing_area();
    root.fill(&WHITE)?;
    let mut c = ChartBuilder::on(&root)
        .margin(12)
        .caption(title, ("sans-serif", 18))
        .x_label_area_size(36)
        .y_label_area_size(64)
        .build_cartesian_2d(0f64..x_max, 0f64..y_max)?;
    c.configure_mesh()
        .x_desc("hours")
        .y_desc(y_desc)
        .light_line_style(WHITE.mix(0.0))
        .draw()?;
    for line in lines {
        let color = line.color;
        let style = color.stroke_width(if line.dashed { 1 } else { 2 });
        let points = line.points.clone();
        let series = if line.dashed {
            // Dashes as every other segment: plotters' dashed series needs a feature.
            let segments: Vec<Vec<(f64, f64)>> = points
                .chunks(2)
                .filter(|c| c.len() == 2)
                .map(|c| c.to_vec())
                .collect();
            c.draw_series(
                segments
                    .into_iter()
                    .map(move |seg| PathElement::new(seg, style)),
            )?
        } else {
            c.draw_series(LineSeries::new(points, style))?
        };
        series.label(line.label.clone()).legend(move |(x, y)| {
            PathElement::new(vec![(x, y), (x + 18, y)], color.stroke_width(2))
        });
    }
    c.configure_series_labels()
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .position(SeriesLabelPosition::UpperRight)
        .draw()?;
    root.present()?;
    Ok(())
}

fn hours(ms: i64) -> f64 {
    ms as f64 / 3_600_000.0
}

fn find(run: &Run, s: Strategy) -> Option<&StrategyRun> {
    run.runs.iter().find(|r| r.strategy == s)
}

fn plot_allocation(run: &Run) -> String {
    let mut lines = Vec::new();
    for (strategy, dashed) in [(Strategy::Meridian, false), (Strategy::Proportional, true)] {
        let Some(sr) = find(run, strategy) else {
            continue;
        };
        for (r, region) in run.scenario.regions.iter().enumerate() {
            lines.push(Line {
                label: format!("{} {}", strategy.name(), region.name),
                color: COLORS[r % COLORS.len()],
                dashed,
                points: sr
                    .windows
                    .iter()
                    .map(|w| (hours(w.start_ms), w.key0_alloc[r] as f64))
                    .collect(),
            });
        }
    }
    chart(
        &format!("{}: allocation of key c0 per region", run.scenario.name),
        "hits per period",
        &lines,
    )
}

fn plot_demand(run: &Run) -> String {
    let limit = run.scenario.rule.limit as f64;
    let first = &run.runs[0];
    let mut lines = vec![
        Line {
            label: "demand".into(),
            color: RGBColor(120, 120, 120),
            dashed: true,
            points: first
                .windows
                .iter()
                .map(|w| (hours(w.start_ms), w.key0_asked as f64))
                .collect(),
        },
        Line {
            label: "limit L".into(),
            color: BLACK,
            dashed: false,
            points: first
                .windows
                .iter()
                .map(|w| (hours(w.start_ms), limit))
                .collect(),
        },
    ];
    for sr in &run.runs {
        lines.push(Line {
            label: format!("admitted, {}", sr.name()),
            color: strategy_color(sr.color_index()),
            dashed: false,
            points: sr
                .windows
                .iter()
                .map(|w| (hours(w.start_ms), w.key0_admitted as f64))
                .collect(),
        });
    }
    chart(
        &format!("{}: key c0 per window", run.scenario.name),
        "hits per window",
        &lines,
    )
}

fn plot_overshoot(run: &Run) -> String {
    let limit = run.scenario.rule.limit as f64;
    let mut lines = Vec::new();
    for sr in &run.runs {
        lines.push(Line {
            label: sr.name().into(),
            color: strategy_color(sr.color_index()),
            dashed: false,
            points: sr
                .windows
                .iter()
                .map(|w| (hours(w.start_ms), w.max_key_admitted as f64 * 100.0 / limit))
                .collect(),
        });
    }
    chart(
        &format!("{}: most admitted by one key per window", run.scenario.name),
        "% of L",
        &lines,
    )
}
