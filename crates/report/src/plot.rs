//! A [`Plot`](crate::Plot) drawn in SVG for the HTML page: categories along the x axis, one
//! polyline of points per series, a logarithmic or linear y axis with labelled ticks, a legend,
//! and the marked category as a red band. Every text is escaped; the drawing is deterministic.

use crate::escape::markup;
use crate::Plot;
use std::fmt::Write as _;

const HEIGHT: f64 = 300.0;
const LEFT: f64 = 70.0;
const TOP: f64 = 28.0;
const BOTTOM: f64 = 110.0;
const STEP: f64 = 28.0;
const COLOURS: [&str; 6] = [
    "#1565c0", "#ef6c00", "#2e7d32", "#6a1b9a", "#00838f", "#5d4037",
];

/// The value axis: maps a value to a y coordinate.
struct Axis {
    lo: f64,
    hi: f64,
    log: bool,
}

impl Axis {
    fn of(plot: &Plot) -> Option<Axis> {
        let values = plot
            .series
            .iter()
            .flat_map(|s| s.values.iter().flatten())
            .copied()
            .filter(|v| v.is_finite() && (!plot.log_scale || *v > 0.0));
        let (mut lo, mut hi) = (f64::INFINITY, f64::NEG_INFINITY);
        for v in values {
            let v = if plot.log_scale { v.log10() } else { v };
            lo = lo.min(v);
            hi = hi.max(v);
        }
        if !lo.is_finite() {
            return None;
        }
        if plot.log_scale {
            (lo, hi) = (lo.floor(), hi.ceil());
        }
        if hi - lo < 1e-12 {
            hi = lo + 1.0;
        }
        Some(Axis {
            lo,
            hi,
            log: plot.log_scale,
        })
    }

    /// The y coordinate of `v`, or `None` for a value the axis cannot show.
    fn y(&self, v: f64) -> Option<f64> {
        let v = if self.log {
            (v > 0.0).then(|| v.log10())?
        } else {
            v
        };
        v.is_finite()
            .then(|| TOP + (self.hi - v) / (self.hi - self.lo) * (HEIGHT - TOP - BOTTOM))
    }
}

/// The SVG of `plot` (an empty string when it has no value to draw).
pub(crate) fn draw(plot: &Plot) -> String {
    let Some(axis) = Axis::of(plot) else {
        return String::new();
    };
    let n = plot.categories.len();
    let width = LEFT + STEP * n.max(1) as f64 + 160.0;
    let x = |k: usize| LEFT + STEP * (k as f64 + 0.5);
    let mut s = String::new();
    let _ = writeln!(
        s,
        "<svg class=\"plot\" xmlns=\"http://www.w3.org/2000/svg\" width=\"{width:.0}\" height=\"{HEIGHT:.0}\" viewBox=\"0 0 {width:.0} {HEIGHT:.0}\" role=\"img\" aria-label=\"{}\">",
        markup(&plot.title)
    );
    if let Some(m) = plot.marked.filter(|m| *m < n) {
        let _ = writeln!(
            s,
            "<rect class=\"marked\" x=\"{:.1}\" y=\"{TOP}\" width=\"{STEP}\" height=\"{:.1}\" fill=\"#ffcdd2\"/>",
            x(m) - STEP / 2.0,
            HEIGHT - TOP - BOTTOM
        );
    }
    // Ticks: each power of ten on a log axis, five steps on a linear one.
    let ticks: Vec<f64> = if axis.log {
        (axis.lo as i32..=axis.hi as i32).map(f64::from).collect()
    } else {
        (0..=4)
            .map(|k| axis.lo + (axis.hi - axis.lo) * f64::from(k) / 4.0)
            .collect()
    };
    for t in ticks {
        let (value, label) = if axis.log {
            (10f64.powf(t), format!("1e{t}"))
        } else {
            (t, format!("{t:.3}"))
        };
        if let Some(y) = axis.y(value) {
            let _ = writeln!(
                s,
                "<line x1=\"{LEFT}\" y1=\"{y:.1}\" x2=\"{:.1}\" y2=\"{y:.1}\" stroke=\"#eeeeee\"/><text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"end\" font-size=\"11\">{label}</text>",
                LEFT + STEP * n as f64,
                LEFT - 6.0,
                y + 4.0
            );
        }
    }
    let axis_bottom = HEIGHT - BOTTOM;
    let _ = writeln!(
        s,
        "<line x1=\"{LEFT}\" y1=\"{TOP}\" x2=\"{LEFT}\" y2=\"{axis_bottom}\" stroke=\"#616161\"/><line x1=\"{LEFT}\" y1=\"{axis_bottom}\" x2=\"{:.1}\" y2=\"{axis_bottom}\" stroke=\"#616161\"/>",
        LEFT + STEP * n as f64
    );
    let _ = writeln!(
        s,
        "<text x=\"14\" y=\"{:.1}\" transform=\"rotate(-90 14 {:.1})\" text-anchor=\"middle\" font-size=\"12\">{}</text>",
        (TOP + axis_bottom) / 2.0,
        (TOP + axis_bottom) / 2.0,
        markup(&plot.y_label)
    );
    for (k, c) in plot.categories.iter().enumerate() {
        let _ = writeln!(
            s,
            "<text x=\"{:.1}\" y=\"{:.1}\" transform=\"rotate(60 {:.1} {:.1})\" font-size=\"11\"{}>{}</text>",
            x(k),
            axis_bottom + 12.0,
            x(k),
            axis_bottom + 12.0,
            if plot.marked == Some(k) { " fill=\"#c62828\" font-weight=\"700\"" } else { "" },
            markup(c)
        );
    }
    for (i, series) in plot.series.iter().enumerate() {
        let colour = COLOURS[i % COLOURS.len()];
        let points: Vec<(f64, f64)> = series
            .values
            .iter()
            .enumerate()
            .filter_map(|(k, v)| Some((x(k), axis.y((*v)?)?)))
            .collect();
        let path: Vec<String> = points
            .iter()
            .map(|(px, py)| format!("{px:.1},{py:.1}"))
            .collect();
        let _ = writeln!(
            s,
            "<polyline fill=\"none\" stroke=\"{colour}\" stroke-width=\"1.5\" points=\"{}\"/>",
            path.join(" ")
        );
        for (px, py) in &points {
            let _ = writeln!(
                s,
                "<circle cx=\"{px:.1}\" cy=\"{py:.1}\" r=\"3\" fill=\"{colour}\"/>"
            );
        }
        let ly = TOP + 16.0 * i as f64;
        let lx = LEFT + STEP * n as f64 + 16.0;
        let _ = writeln!(
            s,
            "<line x1=\"{lx:.1}\" y1=\"{ly:.1}\" x2=\"{:.1}\" y2=\"{ly:.1}\" stroke=\"{colour}\" stroke-width=\"2\"/><text x=\"{:.1}\" y=\"{:.1}\" font-size=\"12\">{}</text>",
            lx + 18.0,
            lx + 24.0,
            ly + 4.0,
            markup(&series.name)
        );
    }
    let _ = writeln!(
        s,
        "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\" font-size=\"12\">{}</text>",
        LEFT + STEP * n as f64 / 2.0,
        HEIGHT - 4.0,
        markup(&plot.x_label)
    );
    s.push_str("</svg>");
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Series;

    fn plot(values: Vec<Option<f64>>) -> Plot {
        Plot {
            title: "t".into(),
            x_label: "module".into(),
            y_label: "relative error".into(),
            categories: vec!["a".into(), "b<".into(), "c".into()],
            series: vec![Series {
                name: "error".into(),
                values,
            }],
            marked: Some(1),
            log_scale: true,
        }
    }

    #[test]
    fn draws_points_ticks_and_the_marked_category() {
        let svg = draw(&plot(vec![Some(1e-3), Some(0.5), None]));
        assert_eq!(svg.matches("<circle").count(), 2);
        assert!(svg.contains("1e-3") && svg.contains("1e0"));
        assert!(svg.contains("class=\"marked\""));
        assert!(svg.contains("b&lt;"));
    }

    #[test]
    fn nothing_to_draw_is_no_drawing() {
        assert_eq!(draw(&plot(vec![None, Some(0.0), None])), "");
    }
}
