//! Hand-written SVG line plots (paper Fig. 12 style: normalized latency
//! against request rate, one line per configuration). O(points).

use serde::{Deserialize, Serialize};
use std::fmt::Write;

/// One line of a plot.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Series {
    pub label: String,
    /// (x, y) points, drawn in order.
    pub points: Vec<(f64, f64)>,
}

const COLORS: &[&str] = &[
    "#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b",
];

fn nice_max(v: f64) -> f64 {
    if !(v.is_finite() && v > 0.0) {
        return 1.0;
    }
    let mag = 10f64.powf(v.log10().floor());
    [1.0, 2.0, 2.5, 5.0, 10.0]
        .iter()
        .map(|m| m * mag)
        .find(|&c| c >= v)
        .unwrap_or(10.0 * mag)
}

/// Renders an SVG with axes, ticks, a legend and one polyline per series.
pub fn line_plot(title: &str, x_label: &str, y_label: &str, series: &[Series]) -> String {
    let (w, h, l, r, t, b) = (640.0, 420.0, 70.0, 20.0, 40.0, 50.0);
    let pts = series.iter().flat_map(|s| s.points.iter());
    let finite = |v: &f64| v.is_finite();
    let x_max = nice_max(pts.clone().map(|p| p.0).filter(finite).fold(0.0, f64::max));
    let y_max = nice_max(pts.map(|p| p.1).filter(finite).fold(0.0, f64::max));
    let sx = |x: f64| l + x / x_max * (w - l - r);
    let sy = |y: f64| h - b - y / y_max * (h - t - b);
    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(s, r#"<rect width="100%" height="100%" fill="white"/>"#);
    let _ = writeln!(
        s,
        r#"<text x="{}" y="22" text-anchor="middle" font-size="15">{}</text>"#,
        w / 2.0,
        esc(title)
    );
    let _ = writeln!(
        s,
        r#"<line x1="{l}" y1="{}" x2="{}" y2="{}" stroke="black"/>"#,
        h - b,
        w - r,
        h - b
    );
    let _ = writeln!(
        s,
        r#"<line x1="{l}" y1="{t}" x2="{l}" y2="{}" stroke="black"/>"#,
        h - b
    );
    for i in 0..=5 {
        let f = i as f64 / 5.0;
        let (x, y) = (sx(f * x_max), sy(f * y_max));
        let _ = writeln!(
            s,
            r#"<text x="{x}" y="{}" text-anchor="middle">{}</text>"#,
            h - b + 16.0,
            fmt_num(f * x_max)
        );
        let _ = writeln!(
            s,
            r#"<text x="{}" y="{}" text-anchor="end">{}</text>"#,
            l - 6.0,
            y + 4.0,
            fmt_num(f * y_max)
        );
        let _ = writeln!(
            s,
            r##"<line x1="{l}" y1="{y}" x2="{}" y2="{y}" stroke="#ddd"/>"##,
            w - r
        );
    }
    let _ = writeln!(
        s,
        r#"<text x="{}" y="{}" text-anchor="middle">{}</text>"#,
        (l + w - r) / 2.0,
        h - 12.0,
        esc(x_label)
    );
    let _ = writeln!(
        s,
        r#"<text transform="translate(18,{}) rotate(-90)" text-anchor="middle">{}</text>"#,
        (t + h - b) / 2.0,
        esc(y_label)
    );
    for (i, se) in series.iter().enumerate() {
        let c = COLORS[i % COLORS.len()];
        let path: Vec<String> = se
            .points
            .iter()
            .filter(|p| p.0.is_finite() && p.1.is_finite())
            .map(|&(x, y)| format!("{:.1},{:.1}", sx(x), sy(y)))
            .collect();
        let _ = writeln!(
            s,
            r#"<polyline fill="none" stroke="{c}" stroke-width="2" points="{}"/>"#,
            path.join(" ")
        );
        for p in &path {
            if let Some((x, y)) = p.split_once(',') {
                let _ = writeln!(s, r#"<circle cx="{x}" cy="{y}" r="3" fill="{c}"/>"#);
            }
        }
        let ly = t + 10.0 + 18.0 * i as f64;
        let _ = writeln!(
            s,
            r#"<rect x="{}" y="{}" width="12" height="12" fill="{c}"/>"#,
            l + 12.0,
            ly - 10.0
        );
        let _ = writeln!(
            s,
            r#"<text x="{}" y="{ly}">{}</text>"#,
            l + 30.0,
            esc(&se.label)
        );
    }
    s.push_str("</svg>\n");
    s
}

fn fmt_num(v: f64) -> String {
    if v == 0.0 || v.abs() >= 10.0 {
        format!("{v:.0}")
    } else if v.abs() >= 1.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    }
}

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn svg_has_one_polyline_per_series_and_escapes() {
        let svg = line_plot(
            "t<1>",
            "rate",
            "s/token",
            &[
                Series {
                    label: "a&b".into(),
                    points: vec![(1.0, 0.1), (2.0, 0.3)],
                },
                Series {
                    label: "c".into(),
                    points: vec![(1.0, 0.2)],
                },
            ],
        );
        assert_eq!(svg.matches("<polyline").count(), 2);
        assert_eq!(svg.matches("<circle").count(), 3);
        assert!(svg.contains("a&amp;b") && svg.contains("t&lt;1&gt;"));
        assert!(svg.trim_end().ends_with("</svg>"));
    }

    #[test]
    fn axis_maxima_are_nice() {
        assert_eq!(nice_max(0.37), 0.5);
        assert_eq!(nice_max(3.0), 5.0);
        assert_eq!(nice_max(11.0), 20.0);
        assert_eq!(nice_max(0.0), 1.0);
    }
}
