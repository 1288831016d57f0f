//! The drawing of a [`Neighbourhood`]: a small layered layout in SVG, laid out here (no
//! layout library, no script).
//!
//! Two layers, left to right. The left one holds the stopping operator's inputs, each with its
//! relations to the implementation. The right one holds, on top, the spec operator where
//! relations stop (highlighted, with an edge from each input) and, below it, the
//! implementation operators reading the inputs' tensors (a dashed edge from each input whose
//! relations name a tensor it reads). A third box, right of the operator, names the checked
//! output it leads to. Consumers are ordered by the mean position of the inputs they read, so
//! edges cross little. Boxes have a fixed character budget; the full text is each box's
//! tooltip, and the page's tables repeat it.

use crate::escape::{markup, shorten};
use crate::Neighbourhood;
use std::fmt::Write as _;

/// The fill of the box of the spec operator where relations stop.
pub(crate) const HIGHLIGHT: &str = "#ffd54f";

/// A rectangle in the drawing's coordinates (pixels from its top-left corner).
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Rect {
    pub x: f64,
    pub y: f64,
    pub width: f64,
    pub height: f64,
}

impl Rect {
    fn right(&self) -> f64 {
        self.x + self.width
    }
    fn bottom(&self) -> f64 {
        self.y + self.height
    }
    fn middle(&self) -> f64 {
        self.y + self.height / 2.0
    }
}

/// An SVG drawing and the box of the stopping operator in it.
pub(crate) struct Drawing {
    /// The `<svg>` element.
    pub svg: String,
    /// Where the stopping operator's box is (the tests read it; the page needs only the SVG).
    #[cfg_attr(not(test), allow(dead_code))]
    pub stop: Rect,
}

/// The width of a character of the drawing's 12 px monospace font, a little over DejaVu Sans
/// Mono's 7.22 px so that no text overflows its box.
const CHAR_WIDTH: f64 = 7.4;
const LINE: f64 = 16.0;
const PAD: f64 = 8.0;
/// Where the first row of boxes starts, below the layer headings.
const TOP: f64 = 28.0;
const MARGIN: f64 = 8.0;
/// The horizontal room between layers, where edges run.
const GAP: f64 = 120.0;
const ROW_GAP: f64 = 14.0;
/// Characters per line inside a box, and lines of relations shown per input.
const MAX_CHARS: usize = 52;
const MAX_RELATIONS: usize = 3;
/// Consumers drawn; the rest are counted in one more box.
const MAX_CONSUMERS: usize = 12;

/// One box: its lines (the first in bold), its full text for the tooltip, its class.
struct Node {
    lines: Vec<String>,
    tooltip: String,
    class: &'static str,
    rect: Rect,
}

impl Node {
    fn new(lines: Vec<String>, tooltip: String, class: &'static str) -> Node {
        let lines: Vec<String> = lines.iter().map(|l| shorten(l, MAX_CHARS)).collect();
        let chars = lines.iter().map(|l| l.chars().count()).max().unwrap_or(0);
        let rect = Rect {
            x: 0.0,
            y: 0.0,
            width: (chars as f64 * CHAR_WIDTH + 2.0 * PAD).max(120.0).ceil(),
            height: lines.len() as f64 * LINE + 2.0 * PAD - 2.0,
        };
        Node {
            lines,
            tooltip,
            class,
            rect,
        }
    }
}

/// Lays out and draws `n`.
pub(crate) fn draw(n: &Neighbourhood) -> Drawing {
    let mut inputs: Vec<Node> = n
        .inputs
        .iter()
        .map(|i| {
            let mut lines = vec![i.name.clone()];
            lines.extend(
                i.relations
                    .iter()
                    .take(MAX_RELATIONS)
                    .map(|r| format!("= {r}")),
            );
            if i.relations.len() > MAX_RELATIONS {
                lines.push(format!(
                    "… {} more relations",
                    i.relations.len() - MAX_RELATIONS
                ));
            }
            let tooltip = std::iter::once(i.name.clone())
                .chain(i.relations.iter().map(|r| format!("= {r}")))
                .collect::<Vec<_>>()
                .join("\n");
            Node::new(lines, tooltip, "input")
        })
        .collect();
    let mut stop_lines = vec![n.operator.clone(), n.op.clone()];
    if let Some(g) = &n.graph {
        stop_lines.push(g.to_string());
    }
    if let Some(s) = &n.source {
        stop_lines.push(format!("from {s}"));
    }
    let stop_tooltip = stop_lines.join("\n");
    let mut stop = Node::new(stop_lines, stop_tooltip, "stop");
    let output_line = format!("output {}", n.output);
    let mut output = Node::new(
        vec![output_line.clone(), "checked".into()],
        output_line,
        "output",
    );

    // Consumers by the mean row of the inputs they read (those that read none go last).
    let mut order: Vec<usize> = (0..n.consumers.len()).collect();
    let barycentre = |k: usize| {
        let reads = &n.consumers[k].reads;
        if reads.is_empty() {
            f64::INFINITY
        } else {
            reads.iter().sum::<usize>() as f64 / reads.len() as f64
        }
    };
    order.sort_by(|&a, &b| barycentre(a).total_cmp(&barycentre(b)));
    let shown = order.len().min(MAX_CONSUMERS);
    let mut consumers: Vec<(Node, Vec<usize>)> = order[..shown]
        .iter()
        .map(|&k| {
            let c = &n.consumers[k];
            let text = format!("{} = {}", c.name, c.op);
            (
                Node::new(vec![c.name.clone(), c.op.clone()], text, "consumer"),
                c.reads.clone(),
            )
        })
        .collect();
    if order.len() > shown {
        let more = format!("… {} more", order.len() - shown);
        consumers.push((Node::new(vec![more.clone()], more, "consumer"), Vec::new()));
    }

    // Left layer: the inputs, stacked.
    let left = inputs.iter().map(|b| b.rect.width).fold(160.0, f64::max);
    let mut y = TOP;
    for b in &mut inputs {
        b.rect.x = MARGIN;
        b.rect.y = y;
        b.rect.width = left;
        y += b.rect.height + ROW_GAP;
    }
    let left_bottom = y;
    // Right layer: the operator on top, then the consumers under their heading.
    let right_x = MARGIN + left + GAP;
    let right = consumers
        .iter()
        .map(|(b, _)| b.rect.width)
        .fold(stop.rect.width, f64::max);
    stop.rect.x = right_x;
    stop.rect.y = TOP;
    stop.rect.width = right;
    output.rect.x = right_x + right + GAP / 2.0;
    output.rect.y = TOP;
    let consumers_heading = stop.rect.bottom() + 30.0;
    let mut y = consumers_heading + 12.0;
    for (b, _) in &mut consumers {
        b.rect.x = right_x;
        b.rect.y = y;
        b.rect.width = right;
        y += b.rect.height + ROW_GAP;
    }
    let width = (output.rect.right() + MARGIN).ceil();
    let height = (left_bottom.max(y).max(stop.rect.bottom() + ROW_GAP) + MARGIN).ceil();

    let mut s = String::new();
    let _ = write!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" class="graph" width="{width}" height="{height}" viewBox="0 0 {width} {height}" role="img" aria-label="{}">"#,
        markup(&format!(
            "relations stop at spec operator {} ({})",
            n.operator, n.op
        ))
    );
    s.push_str(concat!(
        r##"<defs><marker id="arrow-spec" viewBox="0 0 10 10" refX="10" refY="5" markerWidth="7" markerHeight="7" orient="auto"><path d="M0,0 L10,5 L0,10 z" fill="#37474f"/></marker>"##,
        r##"<marker id="arrow-impl" viewBox="0 0 10 10" refX="10" refY="5" markerWidth="7" markerHeight="7" orient="auto"><path d="M0,0 L10,5 L0,10 z" fill="#3949ab"/></marker></defs>"##,
    ));
    heading(&mut s, MARGIN, 16.0, "spec inputs and their relations");
    heading(
        &mut s,
        right_x,
        16.0,
        "where relations stop (spec operator)",
    );
    if !consumers.is_empty() {
        heading(
            &mut s,
            right_x,
            consumers_heading,
            "implementation operators reading them",
        );
    }
    // Edges first, so boxes sit on top of them.
    for b in &inputs {
        edge(&mut s, &b.rect, &stop.rect, "edge-spec", "arrow-spec");
    }
    for (c, reads) in &consumers {
        for &i in reads {
            if let Some(b) = inputs.get(i) {
                edge(&mut s, &b.rect, &c.rect, "edge-impl", "arrow-impl");
            }
        }
    }
    edge(
        &mut s,
        &stop.rect,
        &output.rect,
        "edge-output",
        "arrow-spec",
    );
    for b in inputs.iter().chain([&stop, &output]) {
        node(&mut s, b);
    }
    for (b, _) in &consumers {
        node(&mut s, b);
    }
    s.push_str("</svg>");
    Drawing {
        svg: s,
        stop: stop.rect,
    }
}

fn heading(s: &mut String, x: f64, y: f64, text: &str) {
    let _ = write!(
        s,
        r#"<text class="heading" x="{x}" y="{y}">{}</text>"#,
        markup(text)
    );
}

/// A curve from the right middle of `from` to the left middle of `to`.
fn edge(s: &mut String, from: &Rect, to: &Rect, class: &str, marker: &str) {
    let (x1, y1, x2, y2) = (from.right(), from.middle(), to.x - 2.0, to.middle());
    let bend = (x2 - x1) / 2.0;
    let _ = write!(
        s,
        r#"<path class="{class}" d="M{x1},{y1} C{},{y1} {},{y2} {x2},{y2}" marker-end="url(#{marker})"/>"#,
        x1 + bend,
        x2 - bend
    );
}

fn node(s: &mut String, b: &Node) {
    let r = &b.rect;
    let _ = write!(
        s,
        r#"<g class="node {}"><title>{}</title><rect class="{}-box" x="{}" y="{}" width="{}" height="{}" rx="4"/>"#,
        b.class,
        markup(&b.tooltip),
        b.class,
        r.x,
        r.y,
        r.width,
        r.height
    );
    for (k, line) in b.lines.iter().enumerate() {
        let class = if k == 0 { "name" } else { "detail" };
        let _ = write!(
            s,
            r#"<text class="{class}" x="{}" y="{}">{}</text>"#,
            r.x + PAD,
            r.y + PAD + 11.0 + k as f64 * LINE,
            markup(line)
        );
    }
    s.push_str("</g>");
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Consumer, NeighbourInput};

    fn neighbourhood(consumers: usize) -> Neighbourhood {
        Neighbourhood {
            output: "loss".into(),
            operator: "add_1".into(),
            op: "aten.add.Tensor".into(),
            graph: crate::Location::parse("spec.py:9"),
            source: None,
            inputs: vec![
                NeighbourInput {
                    name: "mm_1".into(),
                    relations: vec!["sum(r0.mm_1, r1.mm_1)".into()],
                },
                NeighbourInput {
                    name: "b2_0".into(),
                    relations: (0..5).map(|r| format!("r{r}.b2_0")).collect(),
                },
            ],
            computed: None,
            consumers: (0..consumers)
                .map(|r| Consumer {
                    name: format!("r{r}.add_1"),
                    op: "aten.add.Tensor".into(),
                    reads: if r % 2 == 0 { vec![1] } else { vec![0, 1] },
                })
                .collect(),
            hint: None,
            other_stops: Vec::new(),
        }
    }

    #[test]
    fn the_operator_sits_at_the_top_of_the_right_layer() {
        let d = draw(&neighbourhood(2));
        assert_eq!((d.stop.y, d.stop.x > 160.0), (TOP, true));
        assert!(d.svg.contains(r#"<rect class="stop-box""#));
        assert!(d.svg.contains(">add_1</text>"));
        // One edge per input into the operator, one per read into the consumers, one out.
        assert_eq!(d.svg.matches(r#"class="edge-spec""#).count(), 2);
        assert_eq!(d.svg.matches(r#"class="edge-impl""#).count(), 3);
        assert_eq!(d.svg.matches(r#"class="edge-output""#).count(), 1);
        assert!(d.svg.contains("… 2 more relations"));
    }

    #[test]
    fn consumers_are_ordered_by_the_inputs_they_read_and_capped() {
        let d = draw(&neighbourhood(20));
        // r1 reads inputs 0 and 1 (mean 0.5), r0 only input 1: r1 comes first.
        assert!(d.svg.find(">r1.add_1<").unwrap() < d.svg.find(">r0.add_1<").unwrap());
        assert!(d.svg.contains("… 8 more"));
        assert_eq!(d.svg.matches(r#"class="consumer-box""#).count(), 13);
    }

    #[test]
    fn names_are_escaped() {
        let mut n = neighbourhood(1);
        n.operator = "<script>alert('x')</script>&".into();
        let d = draw(&n);
        assert!(!d.svg.contains("<script>"));
        assert!(d
            .svg
            .contains("&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt;&amp;"));
    }
}
