//! Throughput over time as a standalone SVG, SHIFT's Figure 7 in shape: one panel per fault,
//! stacked, one line per scheme, x in milliseconds and y in Gbit/s (both linear), the fault
//! and its repair marked.

use std::fmt::Write;

const W: f64 = 760.0;
const PANEL_H: f64 = 150.0;
const LEFT: f64 = 70.0;
const RIGHT: f64 = 120.0;
const TOP: f64 = 40.0;
const GAP: f64 = 40.0;
const COLOURS: [&str; 4] = ["#1f77b4", "#d62728", "#2ca02c", "#7f7f7f"];

/// One panel: its title and its lines (scheme name, one value per bin).
pub(crate) type Panel<'a> = (&'a str, Vec<(&'a str, Vec<f64>)>);

/// `bin_ms` wide bins; `marks` are times (ms) drawn as dashed verticals (fault, repair);
/// `y_max` is the axis top (the line rate).
pub(crate) fn svg(
    title: &str,
    panels: &[Panel<'_>],
    bin_ms: f64,
    marks: &[f64],
    y_max: f64,
) -> String {
    let n_bins = panels
        .iter()
        .flat_map(|(_, lines)| lines.iter().map(|(_, v)| v.len()))
        .max()
        .unwrap_or(1)
        .max(1);
    let x_max = n_bins as f64 * bin_ms;
    let h = TOP + panels.len() as f64 * (PANEL_H + GAP) + 20.0;
    let pw = W - LEFT - RIGHT;
    let mut s = String::new();
    let _ = write!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{h}" font-family="sans-serif" font-size="11">"#
    );
    let _ = write!(
        s,
        r#"<rect width="100%" height="100%" fill="white"/><text x="{}" y="22" font-size="14" text-anchor="middle">{title}</text>"#,
        W / 2.0
    );
    for (k, (name, lines)) in panels.iter().enumerate() {
        let top = TOP + k as f64 * (PANEL_H + GAP);
        let x = |t: f64| LEFT + t / x_max * pw;
        let y = |v: f64| top + PANEL_H - (v / y_max).clamp(0.0, 1.05) * PANEL_H;
        let _ = write!(
            s,
            r##"<rect x="{LEFT}" y="{top}" width="{pw}" height="{PANEL_H}" fill="none" stroke="#444"/><text x="{}" y="{}" font-weight="bold">{name}</text>"##,
            LEFT + 6.0,
            top + 14.0
        );
        for frac in [0.0, 0.5, 1.0] {
            let v = y_max * frac;
            let _ = write!(
                s,
                r##"<text x="{}" y="{}" text-anchor="end">{v:.0}</text>"##,
                LEFT - 6.0,
                y(v) + 4.0
            );
        }
        for t in (0..=(x_max as u64)).step_by(5) {
            let _ = write!(
                s,
                r##"<text x="{}" y="{}" text-anchor="middle">{t}</text>"##,
                x(t as f64),
                top + PANEL_H + 14.0
            );
        }
        for &m in marks {
            let _ = write!(
                s,
                r##"<line x1="{0}" x2="{0}" y1="{top}" y2="{1}" stroke="#999" stroke-dasharray="4 3"/>"##,
                x(m),
                top + PANEL_H
            );
        }
        for (i, (scheme, values)) in lines.iter().enumerate() {
            let colour = COLOURS[i % COLOURS.len()];
            let pts: Vec<String> = values
                .iter()
                .enumerate()
                .map(|(b, &v)| format!("{:.1},{:.1}", x((b as f64 + 0.5) * bin_ms), y(v)))
                .collect();
            let _ = write!(
                s,
                r##"<polyline fill="none" stroke="{colour}" stroke-width="1.5" points="{}"/>"##,
                pts.join(" ")
            );
            // As many legend rows as the panel holds; the rest are named in the last one.
            let rows = ((PANEL_H - 20.0) / 16.0) as usize;
            if i + 1 > rows {
                continue;
            }
            let ly = top + 20.0 + i as f64 * 16.0;
            let more = lines.len() - i;
            let scheme = if i + 1 == rows && more > 1 {
                format!("… and {} more", more)
            } else {
                (*scheme).to_string()
            };
            let _ = write!(
                s,
                r##"<line x1="{0}" x2="{1}" y1="{ly}" y2="{ly}" stroke="{colour}" stroke-width="2"/><text x="{2}" y="{3}">{scheme}</text>"##,
                W - RIGHT + 10.0,
                W - RIGHT + 30.0,
                W - RIGHT + 36.0,
                ly + 4.0
            );
        }
    }
    let _ = write!(
        s,
        r##"<text x="{}" y="{}" text-anchor="middle">time (ms); Gbit/s per {:.1} ms bin</text>"##,
        LEFT + pw / 2.0,
        h - 6.0,
        bin_ms
    );
    s.push_str("</svg>\n");
    s
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_panel_per_fault_and_a_line_per_scheme() {
        let panels = vec![
            (
                "local-nic",
                vec![
                    ("native", vec![90.0, 0.0, 90.0]),
                    ("none", vec![90.0, 0.0, 0.0]),
                ],
            ),
            ("tor", vec![("native", vec![90.0, 80.0, 90.0])]),
        ];
        let out = super::svg("t", &panels, 0.1, &[0.1, 0.2], 100.0);
        assert!(out.starts_with("<svg") && out.ends_with("</svg>\n"));
        assert_eq!(out.matches("<polyline").count(), 3);
        assert_eq!(out.matches("stroke-dasharray").count(), 4);
        assert!(out.contains(">local-nic<") && out.contains(">tor<"));
    }
}
