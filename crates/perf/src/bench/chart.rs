//! Line charts as hand-written SVG: no plotting library, files a browser shows as they are.

use std::fmt::Write as _;

/// Colours for series, in order (colour-blind-friendly palette).
const COLOURS: [&str; 8] = ["#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#F0E442", "#000000"];

const WIDTH: f64 = 760.0;
/// Height of the plot area and its title.
const PLOT_HEIGHT: f64 = 300.0;
const LEFT: f64 = 80.0;
const RIGHT: f64 = 40.0;
const TOP: f64 = 40.0;
/// Room under the plot for the axis label; the legend adds a row per series.
const BOTTOM: f64 = 56.0;
const LEGEND_ROW: f64 = 16.0;

/// How the x axis is laid out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum XAxis {
    /// Plain numbers (time in seconds).
    Linear,
    /// Percentiles, spread as 1/(1 - p) on a log scale so that the tail gets room, as
    /// HdrHistogram's plots do.
    Percentile,
}

/// One named line.
pub struct Series {
    /// Legend text.
    pub name: String,
    /// Points (x, y).
    pub points: Vec<(f64, f64)>,
}

fn x_position(axis: XAxis, x: f64) -> f64 {
    match axis {
        XAxis::Linear => x,
        XAxis::Percentile => {
            let remaining = (1.0 - x / 100.0).max(1e-6);
            (1.0 / remaining).log10()
        }
    }
}

fn nice_step(range: f64) -> f64 {
    if range <= 0.0 || !range.is_finite() {
        return 1.0;
    }
    let raw = range / 5.0;
    let magnitude = 10f64.powf(raw.log10().floor());
    let normalized = raw / magnitude;
    let nice = if normalized < 1.5 {
        1.0
    } else if normalized < 3.0 {
        2.0
    } else if normalized < 7.0 {
        5.0
    } else {
        10.0
    };
    nice * magnitude
}

fn label(value: f64) -> String {
    let magnitude = value.abs();
    if magnitude >= 1e6 {
        format!("{:.1}M", value / 1e6)
    } else if magnitude >= 1e4 {
        format!("{:.0}k", value / 1e3)
    } else if magnitude >= 100.0 || value == value.trunc() {
        format!("{value:.0}")
    } else if magnitude >= 1.0 {
        format!("{value:.1}")
    } else {
        format!("{value:.3}")
    }
}

fn escape(text: &str) -> String {
    text.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;")
}

/// Draws the chart and returns the SVG document.
pub fn line_chart(title: &str, x_label: &str, y_label: &str, axis: XAxis, series: &[Series]) -> String {
    let points = series.iter().flat_map(|line| line.points.iter()).filter(|(x, y)| x.is_finite() && y.is_finite());
    let (mut x_min, mut x_max, mut y_max) = (f64::MAX, f64::MIN, 0.0f64);
    for &(x, y) in points {
        let x = x_position(axis, x);
        x_min = x_min.min(x);
        x_max = x_max.max(x);
        y_max = y_max.max(y);
    }
    if x_min > x_max {
        (x_min, x_max) = (0.0, 1.0);
    }
    if axis == XAxis::Percentile {
        x_min = 0.0;
    }
    if x_max <= x_min {
        x_max = x_min + 1.0;
    }
    let y_step = nice_step(y_max.max(1e-9));
    let y_top = (y_max / y_step).ceil().max(1.0) * y_step;
    let plot_width = WIDTH - LEFT - RIGHT;
    let plot_height = PLOT_HEIGHT;
    let height = TOP + PLOT_HEIGHT + BOTTOM + LEGEND_ROW * series.len() as f64;
    let sx = |x: f64| LEFT + (x_position(axis, x) - x_min) / (x_max - x_min) * plot_width;
    let sy = |y: f64| TOP + plot_height - (y / y_top) * plot_height;

    let mut svg = String::new();
    let _ = writeln!(
        svg,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" viewBox="0 0 {WIDTH} {height}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(svg, r#"<rect width="100%" height="100%" fill="white"/>"#);
    let _ = writeln!(
        svg,
        r#"<text x="{}" y="22" text-anchor="middle" font-size="15" font-weight="bold">{}</text>"#,
        WIDTH / 2.0,
        escape(title)
    );
    // Horizontal grid and y labels.
    let mut y = 0.0;
    while y <= y_top + y_step * 0.01 {
        let py = sy(y);
        let _ = writeln!(svg, r##"<line x1="{LEFT}" y1="{py:.1}" x2="{:.1}" y2="{py:.1}" stroke="#e0e0e0"/>"##, LEFT + plot_width);
        let _ = writeln!(svg, r#"<text x="{:.1}" y="{:.1}" text-anchor="end">{}</text>"#, LEFT - 6.0, py + 4.0, label(y));
        y += y_step;
    }
    // Vertical ticks.
    match axis {
        XAxis::Linear => {
            let step = nice_step(x_max - x_min);
            let mut x = (x_min / step).ceil() * step;
            while x <= x_max + step * 0.01 {
                let px = sx(x);
                let _ = writeln!(svg, r##"<line x1="{px:.1}" y1="{TOP}" x2="{px:.1}" y2="{:.1}" stroke="#f0f0f0"/>"##, TOP + plot_height);
                let _ = writeln!(svg, r#"<text x="{px:.1}" y="{:.1}" text-anchor="middle">{}</text>"#, TOP + plot_height + 16.0, label(x));
                x += step;
            }
        }
        XAxis::Percentile => {
            for (percentile, text) in [(0.0, "0%"), (90.0, "90%"), (99.0, "99%"), (99.9, "99.9%"), (99.99, "99.99%"), (99.999, "99.999%")] {
                if x_position(axis, percentile) > x_max + 1e-9 {
                    break;
                }
                let px = sx(percentile);
                let _ = writeln!(svg, r##"<line x1="{px:.1}" y1="{TOP}" x2="{px:.1}" y2="{:.1}" stroke="#f0f0f0"/>"##, TOP + plot_height);
                let _ = writeln!(svg, r#"<text x="{px:.1}" y="{:.1}" text-anchor="middle">{text}</text>"#, TOP + plot_height + 16.0);
            }
        }
    }
    let _ = writeln!(svg, r#"<rect x="{LEFT}" y="{TOP}" width="{plot_width}" height="{plot_height}" fill="none" stroke="black"/>"#);
    let _ = writeln!(
        svg,
        r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">{}</text>"#,
        LEFT + plot_width / 2.0,
        TOP + plot_height + 36.0,
        escape(x_label)
    );
    let _ = writeln!(
        svg,
        r#"<text transform="translate(18 {:.1}) rotate(-90)" text-anchor="middle">{}</text>"#,
        TOP + plot_height / 2.0,
        escape(y_label)
    );
    for (index, line) in series.iter().enumerate() {
        let colour = COLOURS[index % COLOURS.len()];
        let path: Vec<String> = line
            .points
            .iter()
            .filter(|(x, y)| x.is_finite() && y.is_finite())
            .map(|&(x, y)| format!("{:.1},{:.1}", sx(x), sy(y)))
            .collect();
        if !path.is_empty() {
            let _ = writeln!(svg, r#"<polyline fill="none" stroke="{colour}" stroke-width="2" points="{}"/>"#, path.join(" "));
        }
        let legend_x = LEFT;
        let legend_y = TOP + plot_height + BOTTOM + LEGEND_ROW * index as f64;
        let _ = writeln!(svg, r#"<rect x="{legend_x}" y="{:.1}" width="14" height="4" fill="{colour}"/>"#, legend_y - 4.0);
        let _ = writeln!(svg, r#"<text x="{:.1}" y="{legend_y:.1}">{}</text>"#, legend_x + 20.0, escape(&line.name));
    }
    svg.push_str("</svg>\n");
    svg
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn draws_series_and_legend() {
        let svg = line_chart(
            "Publish rate",
            "time (s)",
            "msg/s",
            XAxis::Linear,
            &[
                Series { name: "Lepus <1>".to_string(), points: vec![(10.0, 1000.0), (20.0, 1500.0)] },
                Series { name: "RabbitMQ".to_string(), points: vec![(10.0, 800.0), (20.0, 900.0)] },
            ],
        );
        assert!(svg.starts_with("<svg"));
        assert_eq!(svg.matches("<polyline").count(), 2);
        assert!(svg.contains("Lepus &lt;1&gt;"));
        let svg =
            line_chart("q", "percentile", "ms", XAxis::Percentile, &[Series { name: "a".into(), points: vec![(50.0, 1.0), (99.99, 9.0)] }]);
        assert!(svg.contains("99.9%"));
    }
}
