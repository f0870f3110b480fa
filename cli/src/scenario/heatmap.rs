//! A heat map as a standalone SVG, as SDR's Figure 9 draws its grid: one panel per scheme,
//! message size down, drop rate across, each cell coloured by its slowdown on a log scale
//! (1× white to 20× and beyond dark red) with the figure written in it.

use std::fmt::Write;

const CELL_W: f64 = 64.0;
const CELL_H: f64 = 26.0;
const LEFT: f64 = 76.0;
const TOP: f64 = 58.0;
const GAP: f64 = 36.0;
/// Slowdown at which the colour saturates.
const TOP_SLOWDOWN: f64 = 20.0;

/// One panel: a title and `cells[row][column]` (rows: sizes, columns: drop rates).
pub(crate) struct Panel<'a> {
    pub(crate) title: &'a str,
    pub(crate) cells: Vec<Vec<Option<f64>>>,
}

fn colour(v: f64) -> String {
    // 0 at 1×, 1 at TOP_SLOWDOWN×, log-spaced.
    let t = (v.max(1.0).ln() / TOP_SLOWDOWN.ln()).clamp(0.0, 1.0);
    let (r, g, b) = (255.0 - 90.0 * t, 255.0 - 235.0 * t, 255.0 - 225.0 * t);
    format!("rgb({},{},{})", r as u8, g as u8, b as u8)
}

/// The SVG: `rows` label the sizes, `columns` the drop rates.
pub(crate) fn svg(
    title: &str,
    rows: &[String],
    columns: &[String],
    panels: &[Panel<'_>],
) -> String {
    let panel_w = columns.len() as f64 * CELL_W;
    let w = LEFT + panels.len() as f64 * (panel_w + GAP) + 20.0;
    let h = TOP + rows.len() as f64 * CELL_H + 50.0;
    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="11">"#
    );
    let _ = writeln!(
        s,
        r#"<text x="{}" y="18" font-size="14" text-anchor="middle">{title}</text>"#,
        w / 2.0
    );
    for (p, panel) in panels.iter().enumerate() {
        let x0 = LEFT + p as f64 * (panel_w + GAP);
        let _ = writeln!(
            s,
            r#"<text x="{}" y="{}" font-size="12" text-anchor="middle">{}</text>"#,
            x0 + panel_w / 2.0,
            TOP - 22.0,
            panel.title
        );
        for (c, label) in columns.iter().enumerate() {
            let _ = writeln!(
                s,
                r#"<text x="{}" y="{}" text-anchor="middle">{label}</text>"#,
                x0 + (c as f64 + 0.5) * CELL_W,
                TOP - 6.0
            );
        }
        for (r, row) in panel.cells.iter().enumerate() {
            let y = TOP + r as f64 * CELL_H;
            if p == 0 {
                let _ = writeln!(
                    s,
                    r#"<text x="{}" y="{}" text-anchor="end">{}</text>"#,
                    LEFT - 8.0,
                    y + CELL_H * 0.65,
                    rows.get(r).map_or("", String::as_str)
                );
            }
            for (c, v) in row.iter().enumerate() {
                let x = x0 + c as f64 * CELL_W;
                let (fill, text) = match v {
                    Some(v) => (colour(*v), format!("{v:.2}")),
                    None => ("#dddddd".to_string(), "–".to_string()),
                };
                let _ = writeln!(
                    s,
                    r#"<rect x="{x}" y="{y}" width="{CELL_W}" height="{CELL_H}" fill="{fill}" stroke="white"/><text x="{}" y="{}" text-anchor="middle">{text}</text>"#,
                    x + CELL_W / 2.0,
                    y + CELL_H * 0.65
                );
            }
        }
    }
    let _ = writeln!(
        s,
        r#"<text x="{LEFT}" y="{}">mean slowdown over the loss-free time; columns: packet drop probability; rows: Write size</text>"#,
        h - 16.0
    );
    s.push_str("</svg>\n");
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cells_carry_their_figures_and_missing_ones_a_dash() {
        let panel = Panel {
            title: "sr-rto",
            cells: vec![vec![Some(1.0), Some(25.0)], vec![None, Some(3.5)]],
        };
        let out = svg(
            "t",
            &["1MiB".into(), "8MiB".into()],
            &["1e-4".into(), "1e-3".into()],
            &[panel],
        );
        assert!(out.starts_with("<svg") && out.ends_with("</svg>\n"));
        for want in ["1.00", "25.00", "3.50", "–", "sr-rto", "8MiB", "1e-3"] {
            assert!(out.contains(want), "{want}");
        }
        assert!(out.contains("rgb(255,255,255)"), "1× is white");
        assert!(out.contains("rgb(165,20,30)"), "past the top it saturates");
    }
}
