//! A self-contained HTML page of a report: inline CSS and SVG, no script, no network, so it
//! reads the same offline, attached to a CI run, or mailed.
//!
//! The page shows, top to bottom: the verdict (a coloured badge), the command and the case; for
//! verify's failure the neighbourhood drawn as a graph (the spec operator where relations stop,
//! highlighted, its inputs with their relations and the implementation operators reading them,
//! in a small layered layout drawn here in SVG), then the summary and the hint; the findings with their
//! locations, placements and hints; the certificate; the checked outputs or checks with their
//! outcome (run: relative errors); and the facts. Every text from a user's file is escaped.
//!
//! The drawing sits at a fixed place, [`GRAPH_LEFT`] and [`GRAPH_TOP`] pixels from the page's
//! corner (the header has a fixed height), so that it is in view when the page opens and a
//! screenshot test can find its boxes.

use crate::escape::{markup, prose};
use crate::{graph, Report, Status, Verdict};
use std::fmt::Write as _;

/// The drawing's left edge in the page, in CSS pixels.
pub const GRAPH_LEFT: u32 = 24;
/// The drawing's top edge in the page, in CSS pixels: the header's fixed 64 px and the
/// section's 16 px margin.
pub const GRAPH_TOP: u32 = 80;
/// The fill of the stopping operator's box, `#rrggbb`.
pub const HIGHLIGHT: &str = graph::HIGHLIGHT;

const STYLE: &str = r#"
*{box-sizing:border-box}
body{margin:0;font:15px/1.45 "DejaVu Sans",system-ui,sans-serif;color:#212121;background:#fff}
header{height:64px;padding:0 24px;display:flex;align-items:center;gap:14px;border-bottom:4px solid var(--verdict);background:#fafafa;overflow:hidden;white-space:nowrap}
header h1{font-size:20px;font-weight:600;margin:0;overflow:hidden;text-overflow:ellipsis}
.badge{display:inline-block;padding:3px 12px;border-radius:14px;background:var(--verdict);color:#fff;font-weight:700;text-transform:uppercase;letter-spacing:.04em;font-size:14px}
.v-holds{--verdict:#2e7d32}.v-violated{--verdict:#c62828}.v-inconclusive{--verdict:#e65100}.v-invalid{--verdict:#616161}
main{padding:0 24px 24px}
section{margin-top:16px}
section.neighbourhood,section.plot{overflow-x:auto}
svg.graph{display:block;font:12px "DejaVu Sans Mono",monospace}
svg .heading{font:italic 12px "DejaVu Sans",sans-serif;fill:#616161}
svg .name{font-weight:700}
svg rect{stroke-width:1.5}
svg .input-box{fill:#eceff1;stroke:#78909c}
svg .stop-box{fill:#ffd54f;stroke:#c62828;stroke-width:2.5}
svg .output-box{fill:#fff;stroke:#78909c;stroke-dasharray:4 3}
svg .consumer-box{fill:#e8eaf6;stroke:#3949ab}
svg .edge-spec,svg .edge-output{fill:none;stroke:#37474f;stroke-width:1.5}
svg .edge-output{stroke-dasharray:2 3}
svg .edge-impl{fill:none;stroke:#3949ab;stroke-width:1.2;stroke-dasharray:6 4}
h2{font-size:17px;margin:22px 0 8px;border-bottom:1px solid #e0e0e0;padding-bottom:4px}
p.summary{font-size:16px;margin:12px 0}
.hint{border-left:4px solid #ffb300;background:#fff8e1;padding:8px 12px;margin:10px 0}
code,td.mono{font-family:"DejaVu Sans Mono",monospace;font-size:13px}
td.lines{white-space:pre-wrap;word-break:break-word}
table{border-collapse:collapse;margin:6px 0}
th,td{border:1px solid #e0e0e0;padding:4px 10px;text-align:left;vertical-align:top}
th{background:#f5f5f5}
td:first-child{white-space:nowrap}
.s-passed{color:#2e7d32;font-weight:700}.s-failed{color:#c62828;font-weight:700}.s-skipped{color:#e65100;font-weight:700}.s-error{color:#616161;font-weight:700}
ol.findings>li{margin-bottom:14px}
.rule{font-weight:700;color:#c62828}
.rule.warning{color:#e65100}
dl{display:grid;grid-template-columns:max-content auto;gap:4px 16px;margin:6px 0}
dt{color:#616161}dd{margin:0}
footer{color:#9e9e9e;font-size:12px;padding:12px 24px;border-top:1px solid #eeeeee}
"#;

/// The report as a self-contained HTML page.
///
/// ```
/// use shardproof_report::{html, Command, Neighbourhood, Report, Verdict};
/// let mut r = Report::new(Command::Verify, "mlp", Verdict::Violated, "output `loss` has no clean relation");
/// r.neighbourhood = Some(Neighbourhood {
///     output: "loss".into(),
///     operator: "add_1".into(),
///     op: "aten.add.Tensor".into(),
///     graph: None,
///     source: None,
///     inputs: vec![],
///     computed: None,
///     consumers: vec![],
///     hint: Some("a missing all-reduce?".into()),
///     other_stops: vec![],
/// });
/// let page = html::render(&r);
/// assert!(page.contains("<svg"));
/// assert!(page.contains(">add_1</text>"));
/// assert!(!page.contains("<script"));
/// ```
pub fn render(report: &Report) -> String {
    let verdict_class = match report.verdict {
        Verdict::Holds => "v-holds",
        Verdict::Violated => "v-violated",
        Verdict::Inconclusive => "v-inconclusive",
        Verdict::Invalid => "v-invalid",
    };
    let title = format!(
        "shardproof {} {}: {}",
        report.command.name(),
        report.case,
        report.verdict_word()
    );
    let mut h = String::new();
    h.push_str("<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n");
    h.push_str("<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n");
    let _ = writeln!(
        h,
        "<meta name=\"generator\" content=\"shardproof {}\">",
        markup(&report.tool_version)
    );
    let _ = writeln!(h, "<title>{}</title>", markup(&title));
    let _ = writeln!(h, "<style>{STYLE}</style>\n</head>");
    let _ = writeln!(h, "<body class=\"{verdict_class}\">");
    let _ = writeln!(
        h,
        "<header><span class=\"badge\">{}</span><h1>shardproof {} <code>{}</code></h1></header>",
        markup(report.verdict_word()),
        markup(report.command.name()),
        markup(&report.case)
    );
    h.push_str("<main>\n");
    if let Some(n) = &report.neighbourhood {
        neighbourhood(&mut h, report, n);
    } else {
        let _ = writeln!(
            h,
            "<section><p class=\"summary\">{}</p></section>",
            prose(&report.summary)
        );
    }
    // verify's one finding is the neighbourhood's: drawn and told above.
    if report.neighbourhood.is_none() {
        findings(&mut h, report);
    }
    plots(&mut h, report);
    certificate(&mut h, report);
    checked(&mut h, report);
    facts(&mut h, report);
    h.push_str("</main>\n");
    let _ = writeln!(
        h,
        "<footer>shardproof {} · a self-contained page: no scripts, nothing loaded from the network</footer>",
        markup(&report.tool_version)
    );
    h.push_str("</body>\n</html>\n");
    h
}

fn neighbourhood(h: &mut String, report: &Report, n: &crate::Neighbourhood) {
    let drawing = graph::draw(n);
    h.push_str("<section class=\"neighbourhood\">\n");
    h.push_str(&drawing.svg);
    h.push_str("\n</section>\n<section>\n");
    let _ = writeln!(h, "<p class=\"summary\">{}</p>", prose(&report.summary));
    let mut at = format!(
        "Relations stop at spec operator <code>{}</code> (<code>{}</code>)",
        markup(&n.operator),
        markup(&n.op)
    );
    if let Some(g) = &n.graph {
        let _ = write!(at, ", defined at <code>{}</code>", markup(&g.to_string()));
    }
    if let Some(s) = &n.source {
        let _ = write!(
            at,
            ", captured from <code>{}</code>",
            markup(&s.to_string())
        );
    }
    let _ = writeln!(
        h,
        "<p>{at}, on the way to output <code>{}</code>.</p>",
        markup(&n.output)
    );
    if let Some(hint) = &n.hint {
        let _ = writeln!(
            h,
            "<div class=\"hint\"><strong>hint:</strong> {}</div>",
            prose(hint)
        );
    }
    if let Some(c) = &n.computed {
        let _ = writeln!(
            h,
            "<p>Its output can only be computed, not rebuilt: <code>{} = {}</code></p>",
            markup(&n.operator),
            markup(c)
        );
    }
    if !n.other_stops.is_empty() {
        let stops: Vec<String> = n
            .other_stops
            .iter()
            .map(|s| format!("<code>{}</code>", markup(s)))
            .collect();
        let _ = writeln!(
            h,
            "<p>Relations also stop on other paths, at {}.</p>",
            stops.join(", ")
        );
    }
    if !n.inputs.is_empty() {
        h.push_str("<h2>Its inputs and their relations</h2>\n<table><tr><th>spec input</th><th>relations to the implementation</th></tr>\n");
        for i in &n.inputs {
            let rels: Vec<String> = i.relations.iter().map(|r| markup(r)).collect();
            let _ = writeln!(
                h,
                "<tr><td class=\"mono\">{}</td><td class=\"mono\">{}</td></tr>",
                markup(&i.name),
                rels.join("<br>")
            );
        }
        h.push_str("</table>\n");
    }
    if !n.consumers.is_empty() {
        h.push_str("<h2>Implementation operators reading them</h2>\n<table><tr><th>operator</th><th>op</th><th>reads</th></tr>\n");
        for c in &n.consumers {
            let reads: Vec<String> = c
                .reads
                .iter()
                .filter_map(|&i| n.inputs.get(i))
                .map(|i| markup(&i.name))
                .collect();
            let _ = writeln!(
                h,
                "<tr><td class=\"mono\">{}</td><td class=\"mono\">{}</td><td class=\"mono\">{}</td></tr>",
                markup(&c.name),
                markup(&c.op),
                reads.join(", ")
            );
        }
        h.push_str("</table>\n");
    }
    h.push_str("</section>\n");
}

fn findings(h: &mut String, report: &Report) {
    if report.findings.is_empty() {
        return;
    }
    let _ = writeln!(
        h,
        "<section><h2>Findings ({})</h2>\n<ol class=\"findings\">",
        report.findings.len()
    );
    for f in &report.findings {
        let level = if f.level == crate::Level::Error {
            ""
        } else {
            " warning"
        };
        let _ = write!(
            h,
            "<li><span class=\"rule{level}\">{}</span>",
            markup(&f.rule)
        );
        if !f.subject.is_empty() {
            let _ = write!(h, " at <code>{}</code>", markup(&f.subject));
        }
        if !f.ranks.is_empty() {
            let ranks: Vec<String> = f.ranks.iter().map(usize::to_string).collect();
            let word = if f.ranks.len() == 1 { "rank" } else { "ranks" };
            let _ = write!(h, " on {word} {}", ranks.join(", "));
        }
        let places: Vec<String> = f
            .source
            .iter()
            .chain(&f.graph)
            .map(|l| format!("<code>{}</code>", markup(&l.to_string())))
            .collect();
        if !places.is_empty() {
            let _ = write!(h, " — {}", places.join(", "));
        }
        let _ = write!(h, "<p>{}</p>", prose(&f.message));
        if !f.placements.is_empty() {
            h.push_str("<ul>");
            for p in &f.placements {
                let _ = write!(h, "<li><code>{}</code></li>", markup(p));
            }
            h.push_str("</ul>");
        }
        if let Some(hint) = &f.hint {
            let _ = write!(
                h,
                "<div class=\"hint\"><strong>hint:</strong> {}</div>",
                prose(hint)
            );
        }
        h.push_str("</li>\n");
    }
    h.push_str("</ol></section>\n");
}

fn plots(h: &mut String, report: &Report) {
    for p in &report.plots {
        let svg = crate::plot::draw(p);
        if svg.is_empty() {
            continue;
        }
        let _ = writeln!(
            h,
            "<section class=\"plot\"><h2>{}</h2>\n{svg}\n</section>",
            markup(&p.title)
        );
    }
}

fn certificate(h: &mut String, report: &Report) {
    if report.certificate.is_empty() {
        return;
    }
    h.push_str("<section><h2>Certificate</h2>\n<table><tr><th>checked output</th><th>= its relation to the implementation</th></tr>\n");
    for c in &report.certificate {
        let rels: Vec<String> = c.relations.iter().map(|r| markup(r)).collect();
        let _ = writeln!(
            h,
            "<tr><td class=\"mono\">{}</td><td class=\"mono\">{}</td></tr>",
            markup(&c.tensor),
            rels.join("<br>")
        );
    }
    h.push_str("</table></section>\n");
}

fn checked(h: &mut String, report: &Report) {
    if report.checked.is_empty() {
        return;
    }
    let what = match report.command {
        crate::Command::Check => "Checks",
        crate::Command::Trace => "Modules",
        _ => "Checked outputs",
    };
    let _ = writeln!(
        h,
        "<section><h2>{what}</h2>\n<table><tr><th>name</th><th>outcome</th><th>detail</th></tr>"
    );
    for c in &report.checked {
        let (class, word) = match c.status {
            Status::Passed => ("s-passed", "passed"),
            Status::Failed => ("s-failed", "failed"),
            Status::Skipped => ("s-skipped", "not decided"),
            Status::Error => ("s-error", "error"),
        };
        let text: Vec<String> = c
            .message
            .iter()
            .chain(&c.detail)
            .map(|t| prose(t))
            .collect();
        let _ = writeln!(
            h,
            "<tr><td class=\"mono\">{}</td><td class=\"{class}\">{word}</td><td class=\"lines\">{}</td></tr>",
            markup(&c.name),
            text.join("\n")
        );
    }
    h.push_str("</table></section>\n");
}

fn facts(h: &mut String, report: &Report) {
    h.push_str("<section><h2>Details</h2>\n<dl>");
    let _ = write!(h, "<dt>exit code</dt><dd>{}</dd>", report.exit_code());
    for f in &report.facts {
        let _ = write!(
            h,
            "<dt>{}</dt><dd>{}</dd>",
            markup(&f.label),
            prose(&f.value)
        );
    }
    if let Some(s) = report.seconds.filter(|s| s.is_finite()) {
        let _ = write!(h, "<dt>time</dt><dd>{s:.3} s</dd>");
    }
    h.push_str("</dl></section>\n");
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Checked, Command, Finding, Level, Location};

    #[test]
    fn user_text_is_escaped_everywhere() {
        let evil = "<img src=x onerror='a'>&\"";
        let mut r = Report::new(Command::Check, evil, Verdict::Violated, evil);
        r.findings.push(Finding {
            graph: Location::parse(&format!("{evil}.py:3")),
            placements: vec![evil.into()],
            hint: Some(evil.into()),
            ..Finding::new(evil, Level::Error, evil, evil)
        });
        r.checked.push(Checked::new(evil, Status::Failed));
        r.fact(evil, evil);
        let page = render(&r);
        assert!(!page.contains("<img"), "{page}");
        assert!(page.contains("&lt;img src=x onerror=&#39;a&#39;&gt;&amp;&quot;"));
    }

    #[test]
    fn a_page_without_a_failure_has_no_drawing_and_no_script() {
        let r = Report::new(Command::Run, "c", Verdict::Holds, "every output matches");
        let page = render(&r);
        assert!(!page.contains("<svg"));
        assert!(!page.contains("<script"));
        // Nothing to fetch: no stylesheet, image or frame from anywhere.
        for fetching in ["<link", "src=", "<iframe", "@import", "url(http"] {
            assert!(!page.contains(fetching), "{fetching}");
        }
        assert!(page.contains("every output matches"));
        assert!(page.contains("class=\"v-holds\""));
    }

    #[test]
    fn the_stylesheet_fills_the_stopping_box_with_the_highlight() {
        assert!(STYLE.contains(&format!(".stop-box{{fill:{HIGHLIGHT};")));
    }
}
