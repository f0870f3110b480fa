//! A line chart as a standalone SVG: one line per series, the x axis categorical (one tick
//! per loss rate, evenly spaced, as the paper's figures place them), the y axis logarithmic
//! because a timeout multiplies a completion time.

use std::fmt::Write;

const W: f64 = 760.0;
const H: f64 = 440.0;
const LEFT: f64 = 80.0;
const RIGHT: f64 = 200.0;
const TOP: f64 = 40.0;
const BOTTOM: f64 = 60.0;
const COLOURS: [&str; 6] = [
    "#1f77b4", "#d62728", "#7f7f7f", "#2ca02c", "#9467bd", "#ff7f0e",
];

/// One line: its name and its points; a `None` y (a run that failed) breaks the line.
pub(crate) type Series<'a> = (&'a str, Vec<(f64, Option<f64>)>);

/// Every series shares the same x values.
pub(crate) fn svg(title: &str, series: &[Series<'_>]) -> String {
    let xs: Vec<f64> = series
        .first()
        .map(|(_, p)| p.iter().map(|&(x, _)| x).collect())
        .unwrap_or_default();
    let ys: Vec<f64> = series
        .iter()
        .flat_map(|(_, p)| p.iter().filter_map(|&(_, y)| y))
        .filter(|y| *y > 0.0)
        .collect();
    let lo = ys.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = ys.iter().copied().fold(0.0, f64::max);
    let (lo, hi) = if ys.is_empty() {
        (1.0, 10.0)
    } else {
        (
            10f64.powf(lo.log10().floor()),
            10f64.powf(hi.log10().ceil().max(lo.log10().floor() + 1.0)),
        )
    };
    let (pw, ph) = (W - LEFT - RIGHT, H - TOP - BOTTOM);
    let x_at = |i: usize| LEFT + pw * (i as f64 + 0.5) / xs.len().max(1) as f64;
    let y_at = |y: f64| TOP + ph * (1.0 - (y.log10() - lo.log10()) / (hi.log10() - lo.log10()));

    let mut s = String::new();
    let _ = write!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif" font-size="12">"#
    );
    let _ = write!(s, r#"<rect width="{W}" height="{H}" fill="white"/>"#);
    let _ = write!(
        s,
        r#"<text x="{}" y="22" text-anchor="middle" font-size="14">{}</text>"#,
        LEFT + pw / 2.0,
        escape(title)
    );
    // Axes, decade grid lines and labels.
    let _ = write!(
        s,
        r#"<rect x="{LEFT}" y="{TOP}" width="{pw}" height="{ph}" fill="none" stroke="black"/>"#
    );
    let mut d = lo;
    while d <= hi * 1.0001 {
        let y = y_at(d);
        let _ = write!(
            s,
            r##"<line x1="{LEFT}" y1="{y:.1}" x2="{}" y2="{y:.1}" stroke="#ddd"/><text x="{}" y="{:.1}" text-anchor="end">{}</text>"##,
            LEFT + pw,
            LEFT - 6.0,
            y + 4.0,
            fmt_us(d)
        );
        d *= 10.0;
    }
    for (i, x) in xs.iter().enumerate() {
        let _ = write!(
            s,
            r#"<text x="{:.1}" y="{}" text-anchor="middle">{}</text>"#,
            x_at(i),
            TOP + ph + 18.0,
            if *x == 0.0 {
                "0".into()
            } else {
                format!("{x:e}")
            }
        );
    }
    let _ = write!(
        s,
        r#"<text x="{}" y="{}" text-anchor="middle">loss rate of one ToR-spine link</text>"#,
        LEFT + pw / 2.0,
        H - 14.0
    );
    let _ = write!(
        s,
        r#"<text x="18" y="{}" text-anchor="middle" transform="rotate(-90 18 {})">tail FCT</text>"#,
        TOP + ph / 2.0,
        TOP + ph / 2.0
    );
    // One polyline per series, broken where a point is missing, and a legend.
    for (k, (name, pts)) in series.iter().enumerate() {
        let colour = COLOURS[k % COLOURS.len()];
        let mut run: Vec<String> = Vec::new();
        let flush = |run: &mut Vec<String>, s: &mut String| {
            if run.len() > 1 {
                let _ = write!(
                    s,
                    r#"<polyline fill="none" stroke="{colour}" stroke-width="2" points="{}"/>"#,
                    run.join(" ")
                );
            }
            run.clear();
        };
        for (i, &(_, y)) in pts.iter().enumerate() {
            match y.filter(|y| *y > 0.0) {
                Some(y) => {
                    let (px, py) = (x_at(i), y_at(y));
                    run.push(format!("{px:.1},{py:.1}"));
                    let _ = write!(
                        s,
                        r#"<circle cx="{px:.1}" cy="{py:.1}" r="3.5" fill="{colour}"/>"#
                    );
                }
                None => flush(&mut run, &mut s),
            }
        }
        flush(&mut run, &mut s);
        let ly = TOP + 10.0 + 20.0 * k as f64;
        let lx = LEFT + pw + 16.0;
        let _ = write!(
            s,
            r#"<line x1="{lx}" y1="{ly}" x2="{}" y2="{ly}" stroke="{colour}" stroke-width="2"/><text x="{}" y="{}">{}</text>"#,
            lx + 24.0,
            lx + 30.0,
            ly + 4.0,
            escape(name)
        );
    }
    s.push_str("</svg>\n");
    s
}

fn fmt_us(us: f64) -> String {
    if us >= 1e6 {
        format!("{} s", us / 1e6)
    } else if us >= 1e3 {
        format!("{} ms", us / 1e3)
    } else {
        format!("{us} us")
    }
}

fn escape(t: &str) -> String {
    t.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_polyline_per_series_and_gaps_for_failures() {
        let s = svg(
            "t <x>",
            &[
                ("a", vec![(0.0, Some(100.0)), (1e-3, Some(2000.0))]),
                ("b", vec![(0.0, Some(150.0)), (1e-3, None)]),
            ],
        );
        assert!(s.starts_with("<svg") && s.ends_with("</svg>\n"));
        assert_eq!(s.matches("<polyline").count(), 1, "b has one point only");
        assert_eq!(s.matches("<circle").count(), 3);
        assert!(s.contains("t &lt;x&gt;"));
        assert!(s.contains(">1e-3<") && s.contains(">100 us<") && s.contains(">10 ms<"));
    }
}
