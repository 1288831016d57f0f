//! Reports people read (issue 49): `--format sarif|junit` and `--html FILE` on `run`, `verify`
//! and `check`. SARIF validates against the official 2.1.0 schema and sits at the finding's
//! source line; JUnit parses and counts what the JSON report counts; the HTML page of a catalog
//! bug renders in headless Chromium with the stopping operator highlighted (skipped, with a
//! message, where /usr/bin/chromium is absent: scripts/test installs it). Exit codes and the
//! JSON report are what they were.

mod common;

use common::{Out, Scratch};
use serde_json::Value;
use std::path::Path;

/// The catalog bug whose refutation the reports show: the all-reduce after the row-parallel
/// fc2 is removed, so relations stop at the fc2 bias add.
const BUG: &str = "tp-missing-allreduce";
const COMMANDS: [&str; 3] = ["run", "verify", "check"];

/// A forward-only mlp on tp=2 with the planted bug (small: every engine takes milliseconds).
fn bug_case(s: &Scratch) -> String {
    s.emit_model("bug", "mlp", "tp=2", &["--forward-only", "--bug", BUG])
}

/// The row-parallel matmul returned without its all-reduce where the case expects a replicated
/// output, each graph captured with its Python source line (`# File:`): every engine refutes
/// it, at `model.py:88` (the ranks) and `/home/user/my model.py:88` (the spec).
fn sourced_case(s: &Scratch) -> &'static str {
    let graph = |shape_x: &str, shape_w: &str, file: &str| {
        format!(
            r#"class GraphModule(torch.nn.Module):
    def forward(self, x: "f32[{shape_x}]", w: "f32[{shape_w}]"):
        # File: {file}:88 in forward, code: y = x @ w
        mm: "f32[4, 6]" = torch.ops.aten.mm.default(x, w);  x = w = None
        return (mm,)
"#
        )
    };
    s.write("spec.py", &graph("4, 8", "8, 6", "/home/user/my model.py"));
    s.write("r0.py", &graph("4, 4", "4, 6", "model.py"));
    s.write("r1.py", &graph("4, 4", "4, 6", "model.py"));
    s.write(
        "case.yaml",
        &common::CASE_ROWPAR.replace("mm: Partial()", "mm: Replicate()"),
    );
    "case.yaml"
}

fn sarif_errors(doc: &Value) -> Vec<String> {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../report/tests/data/sarif-schema-2.1.0.json"
    );
    let schema: Value =
        serde_json::from_str(&std::fs::read_to_string(path).expect("the SARIF schema"))
            .expect("the schema is JSON");
    let validator = jsonschema::options()
        .should_validate_formats(true)
        .build(&schema)
        .expect("the schema compiles");
    validator
        .iter_errors(doc)
        .map(|e| format!("{e} at {}", e.instance_path()))
        .collect()
}

/// stdout as a SARIF document that the 2.1.0 schema accepts.
#[track_caller]
fn valid_sarif(out: &Out) -> Value {
    let doc = out.json();
    let errors = sarif_errors(&doc);
    assert!(errors.is_empty(), "{errors:#?}\n{}", out.stdout);
    assert_eq!(
        doc["runs"][0]["invocations"][0]["exitCode"],
        out.code.unwrap_or(-1),
        "the invocation carries the exit code"
    );
    doc
}

fn results(doc: &Value) -> &Vec<Value> {
    doc["runs"][0]["results"]
        .as_array()
        .expect("a results array")
}

/// A result's file URI and start line.
fn place(location: &Value) -> (String, Option<u64>) {
    let p = &location["physicalLocation"];
    (
        p["artifactLocation"]["uri"]
            .as_str()
            .unwrap_or_default()
            .to_string(),
        p["region"]["startLine"].as_u64(),
    )
}

/// `file:line` as (file, line).
fn split_location(at: &str) -> (String, Option<u64>) {
    match at.rsplit_once(':') {
        Some((file, line)) if line.parse::<u64>().is_ok() => (file.to_string(), line.parse().ok()),
        _ => (at.to_string(), None),
    }
}

/// The JUnit document on stdout: (tests, failures, errors, skipped) of its one suite, checked
/// against the test cases it holds, and the test case names.
#[track_caller]
fn junit(out: &Out) -> ([usize; 4], Vec<String>) {
    let doc = roxmltree::Document::parse(&out.stdout)
        .unwrap_or_else(|e| panic!("JUnit does not parse: {e}\n{}", out.stdout));
    let suites: Vec<_> = doc
        .descendants()
        .filter(|n| n.has_tag_name("testsuite"))
        .collect();
    assert_eq!(suites.len(), 1, "{}", out.stdout);
    let suite = suites[0];
    let count = |a: &str| -> usize {
        suite
            .attribute(a)
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("testsuite lacks a numeric {a}"))
    };
    let counts = [
        count("tests"),
        count("failures"),
        count("errors"),
        count("skipped"),
    ];
    let cases: Vec<_> = suite
        .children()
        .filter(|n| n.has_tag_name("testcase"))
        .collect();
    let with = |tag: &str| {
        cases
            .iter()
            .filter(|c| c.children().any(|n| n.has_tag_name(tag)))
            .count()
    };
    // The attributes agree with the elements.
    assert_eq!(
        counts,
        [cases.len(), with("failure"), with("error"), with("skipped")],
        "{}",
        out.stdout
    );
    let names = cases
        .iter()
        .map(|c| c.attribute("name").unwrap_or_default().to_string())
        .collect();
    (counts, names)
}

#[test]
fn check_sarif_validates_with_a_result_at_each_finding() {
    let s = Scratch::new();
    let case = bug_case(&s);
    let json = s.run(&["check", &case, "--json"]).expect_code(1).json();
    let out = s.run(&["check", &case, "--format", "sarif"]);
    let doc = valid_sarif(out.expect_code(1));
    let findings = json["findings"].as_array().unwrap();
    let results = results(&doc);
    assert!(!findings.is_empty());
    assert_eq!(results.len(), findings.len());
    for (f, r) in findings.iter().zip(results) {
        assert_eq!(r["ruleId"], f["check"]);
        assert_eq!(r["level"], "error");
        assert_eq!(
            place(&r["locations"][0]),
            (f["file"].as_str().unwrap().to_string(), f["line"].as_u64())
        );
        assert_eq!(r["locations"][0]["logicalLocations"][0]["name"], f["node"]);
    }
    let rules = doc["runs"][0]["tool"]["driver"]["rules"]
        .as_array()
        .unwrap();
    assert!(rules.iter().any(|r| r["id"] == "spmd-type"));
    assert_eq!(
        doc["runs"][0]["tool"]["driver"]["version"],
        env!("CARGO_PKG_VERSION")
    );
}

#[test]
fn verify_sarif_of_a_catalog_bug_sits_where_relations_stop() {
    let s = Scratch::new();
    let case = bug_case(&s);
    let json = s.run(&["verify", &case, "--json"]).expect_code(1).json();
    let out = s.run(&["verify", &case, "--format", "sarif"]);
    let doc = valid_sarif(out.expect_code(1));
    let failure = &json["failure"];
    let results = results(&doc);
    assert_eq!(results.len(), 1, "one refutation, one result");
    let r = &results[0];
    assert_eq!(r["ruleId"], "relations-stop");
    assert_eq!(r["level"], "error");
    assert_eq!(
        place(&r["locations"][0]),
        split_location(failure["graph_location"].as_str().unwrap())
    );
    assert_eq!(
        r["locations"][0]["logicalLocations"][0]["name"],
        failure["operator"]
    );
    let text = r["message"]["text"].as_str().unwrap();
    assert!(text.contains(failure["hint"].as_str().unwrap()), "{text}");
}

#[test]
fn run_sarif_has_a_result_per_mismatching_output() {
    let s = Scratch::new();
    let case = bug_case(&s);
    let json = s.run(&["run", &case, "--json"]).expect_code(1).json();
    let out = s.run(&["run", &case, "--format", "sarif"]);
    let doc = valid_sarif(out.expect_code(1));
    let mismatching: Vec<&Value> = json["outputs"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|o| o["matched"] == false)
        .collect();
    let results = results(&doc);
    assert!(!mismatching.is_empty());
    assert_eq!(results.len(), mismatching.len());
    let spec = s.read("bug/spec.py");
    for (o, r) in mismatching.iter().zip(results) {
        assert_eq!(r["ruleId"], "output-mismatch");
        assert_eq!(r["locations"][0]["logicalLocations"][0]["name"], o["name"]);
        let (file, line) = place(&r["locations"][0]);
        assert_eq!(file, "bug/spec.py");
        // The line is where the spec defines the output.
        let text = spec
            .lines()
            .nth(line.expect("a line") as usize - 1)
            .unwrap();
        let defines = format!("{}:", o["name"].as_str().unwrap());
        assert!(text.trim_start().starts_with(&defines), "{text}");
    }
}

#[test]
fn sarif_results_sit_at_the_captured_python_source() {
    let s = Scratch::new();
    let case = sourced_case(&s);
    let spec_source = ("file:///home/user/my%20model.py".to_string(), Some(88));
    for (command, expected, graph) in [
        ("check", ("model.py".to_string(), Some(88)), "r0.py"),
        ("verify", spec_source.clone(), "spec.py"),
        ("run", spec_source.clone(), "spec.py"),
    ] {
        let out = s.run(&[command, case, "--format", "sarif"]);
        let doc = valid_sarif(out.expect_code(1));
        let r = &results(&doc)[0];
        assert_eq!(place(&r["locations"][0]), expected, "{command}");
        // The graph line is kept as a related location.
        assert_eq!(
            place(&r["relatedLocations"][0]),
            (graph.to_string(), Some(4)),
            "{command}"
        );
    }
}

#[test]
fn invalid_input_is_a_well_formed_document_exiting_2() {
    let s = Scratch::new();
    for command in COMMANDS {
        let out = s.run(&[command, "missing.yaml", "--format", "sarif"]);
        let doc = valid_sarif(out.expect_code(2));
        let invocation = &doc["runs"][0]["invocations"][0];
        assert_eq!(invocation["executionSuccessful"], false, "{command}");
        let note = invocation["toolExecutionNotifications"][0]["message"]["text"]
            .as_str()
            .unwrap();
        assert!(note.contains("missing.yaml"), "{note}");
        assert!(results(&doc).is_empty());
        out.stderr_has(&["missing.yaml"]);

        let out = s.run(&[command, "missing.yaml", "--format", "junit"]);
        let (counts, _) = junit(out.expect_code(2));
        assert_eq!(counts, [1, 0, 1, 0], "{command}");

        // A command line clap refuses still gets its document.
        let out = s.run(&[command, "--no-such-flag", "--format", "sarif"]);
        let doc = valid_sarif(out.expect_code(2));
        assert_eq!(
            doc["runs"][0]["invocations"][0]["executionSuccessful"],
            false
        );
        let out = s.run(&[command, "--no-such-flag", "--format=junit"]);
        assert_eq!(junit(out.expect_code(2)).0, [1, 0, 1, 0]);
    }
}

#[test]
fn junit_counts_what_the_json_report_counts() {
    let s = Scratch::new();
    let case = bug_case(&s);
    // verify: one test case per checked output; the refuted one fails.
    let json = s.run(&["verify", &case, "--json"]).json();
    let (counts, names) = junit(
        s.run(&["verify", &case, "--format", "junit"])
            .expect_code(1),
    );
    assert_eq!(counts, [1, 1, 0, 0]);
    assert_eq!(names, [json["failure"]["output"].as_str().unwrap()]);
    // run: one per compared output.
    let json = s.run(&["run", &case, "--json"]).json();
    let outputs = json["outputs"].as_array().unwrap();
    let failed = outputs.iter().filter(|o| o["matched"] == false).count();
    let (counts, names) = junit(s.run(&["run", &case, "--format", "junit"]).expect_code(1));
    assert_eq!(counts, [outputs.len(), failed, 0, 0]);
    let output_names: Vec<&str> = outputs
        .iter()
        .map(|o| o["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, output_names);
    // check: one per check kind; a kind with findings fails.
    let json = s.run(&["check", &case, "--json"]).json();
    let mut kinds: Vec<&str> = json["findings"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["check"].as_str().unwrap())
        .collect();
    kinds.dedup();
    let (counts, names) = junit(s.run(&["check", &case, "--format", "junit"]).expect_code(1));
    assert_eq!(counts, [13, kinds.len(), 0, 0]);
    assert!(names.contains(&"spmd-type".to_string()), "{names:?}");

    // A correct plan: every checked output of verify passes, as its certificate says.
    let good = s.emit_model("good", "mlp", "tp=2", &["--forward-only"]);
    let json = s.run(&["verify", &good, "--json"]).expect_code(0).json();
    let certified = json["certificate"].as_array().unwrap().len();
    let (counts, _) = junit(
        s.run(&["verify", &good, "--format", "junit"])
            .expect_code(0),
    );
    assert_eq!(counts, [certified, 0, 0, 0]);
    let (counts, _) = junit(s.run(&["check", &good, "--format", "junit"]).expect_code(0));
    assert_eq!(counts, [13, 0, 0, 0]);
}

#[test]
fn an_inconclusive_run_is_a_warning_and_a_skipped_case_exiting_3() {
    let s = common::rowpar();
    let args = ["run", "case.yaml", "--max-memory", "1"];
    let plain = s.run(&args);
    plain.expect_code(3);
    let out = s.run(&[&args[..], &["--format", "sarif"]].concat());
    let doc = valid_sarif(out.expect_code(3));
    let r = &results(&doc)[0];
    assert_eq!(
        (r["ruleId"].as_str(), r["level"].as_str()),
        (Some("inconclusive"), Some("warning"))
    );
    assert!(r["message"]["text"]
        .as_str()
        .unwrap()
        .contains("memory budget"));
    let out = s.run(&[&args[..], &["--format", "junit"]].concat());
    assert_eq!(junit(out.expect_code(3)).0, [1, 0, 0, 1]);
}

#[test]
fn markup_in_user_names_stays_escaped() {
    let s = common::rowpar();
    let name = r#"row<par> & "quoted" 'x'"#;
    s.write(
        "case.yaml",
        &common::CASE_ROWPAR.replace(
            "name: rowpar",
            &format!("name: '{}'", name.replace('\'', "''")),
        ),
    );
    let out = s.run(&[
        "check",
        "case.yaml",
        "--format",
        "junit",
        "--html",
        "page.html",
    ]);
    out.expect_code(0);
    let doc = roxmltree::Document::parse(&out.stdout).expect("JUnit parses");
    let suite = doc
        .descendants()
        .find(|n| n.has_tag_name("testsuite"))
        .unwrap();
    assert_eq!(
        suite.attribute("name"),
        Some(format!("check {name}").as_str())
    );
    let page = s.read("page.html");
    assert!(!page.contains("<par>"), "{page}");
    assert!(page.contains("row&lt;par&gt; &amp; &quot;quoted&quot; &#39;x&#39;"));
}

#[test]
fn json_output_is_the_same_under_format_json() {
    let s = Scratch::new();
    let case = bug_case(&s);
    let without_time = |text: &str| -> String {
        text.lines()
            .filter(|l| !l.trim_start().starts_with("\"seconds\""))
            .collect::<Vec<_>>()
            .join("\n")
    };
    for command in COMMANDS {
        let json = s.run(&[command, &case, "--json"]);
        let format = s.run(&[command, &case, "--format", "json"]);
        let with_page = s.run(&[command, &case, "--json", "--html", "page.html"]);
        assert_eq!(json.code, Some(1));
        assert_eq!((format.code, with_page.code), (json.code, json.code));
        assert_eq!(
            without_time(&format.stdout),
            without_time(&json.stdout),
            "{command}"
        );
        assert_eq!(
            without_time(&with_page.stdout),
            without_time(&json.stdout),
            "{command}"
        );
        // `--json` with another format is a usage error.
        s.run(&[command, &case, "--json", "--format", "sarif"])
            .expect_code(2)
            .stderr_has(&["`--json` means `--format json`"]);
    }
}

#[test]
fn html_pages_show_each_command_s_result() {
    let s = Scratch::new();
    let case = bug_case(&s);
    for command in COMMANDS {
        let plain = s.run(&[command, &case]);
        let page = format!("{command}.html");
        let out = s.run(&[command, &case, "--html", &page]);
        out.expect_code(1);
        // The page is written besides the text report, which stays as it was (verify's has
        // its time in it).
        if command != "verify" {
            assert_eq!(out.stdout, plain.stdout, "{command}");
        }
        let html = s.read(&page);
        assert!(html.starts_with("<!DOCTYPE html>"), "{command}");
        for fetching in ["<script", "<link", "src=", "@import"] {
            assert!(!html.contains(fetching), "{command}: {fetching}");
        }
        let verdict = if command == "verify" {
            "refuted"
        } else {
            "violated"
        };
        assert!(html.contains(&format!("<span class=\"badge\">{verdict}</span>")));
    }
    let verify = s.run(&["verify", &case, "--json"]).json();
    let html = s.read("verify.html");
    let operator = verify["failure"]["operator"].as_str().unwrap();
    assert!(
        html.contains(&format!(">{operator}</text>")),
        "the SVG names the operator"
    );
    assert!(html.contains("unreduced partial sum"), "the hint");
    let check = s.run(&["check", &case, "--json"]).json();
    let html = s.read("check.html");
    let finding = &check["findings"][0];
    let placement = finding["placements"][0].as_str().unwrap();
    let escaped = placement
        .replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
        .replace('\'', "&#39;");
    assert!(html.contains(&escaped), "the placement {escaped}");
    assert!(html.contains("insert all_reduce"), "the check's hint");
    let run = s.run(&["run", &case, "--json"]).json();
    let html = s.read("run.html");
    let error = run["outputs"][0]["rel_error"].as_f64().unwrap();
    assert!(html.contains(&format!("{error:.3e}")), "the relative error");
}

#[test]
fn an_unwritable_html_path_is_refused_with_exit_2() {
    let s = Scratch::new();
    let case = bug_case(&s);
    for command in COMMANDS {
        let out = s.run(&[command, &case, "--html", "no/such/dir/page.html"]);
        out.expect_code(2).stderr_has(&[
            "cannot write the HTML report to `no/such/dir/page.html`",
            "hint:",
        ]);
        assert!(out.stdout.is_empty(), "{command}: {}", out.stdout);
        let out = s.run(&[
            command,
            &case,
            "--html",
            "no/page.html",
            "--format",
            "sarif",
        ]);
        let doc = valid_sarif(out.expect_code(2));
        assert_eq!(
            doc["runs"][0]["invocations"][0]["executionSuccessful"],
            false
        );
        let out = s.run(&[command, &case, "--html", "no/page.html", "--json"]);
        assert_eq!(out.expect_code(2).json()["verdict"], "invalid");
    }
}

/// The highlight of the stopping operator's box: `#ffd54f`.
const HIGHLIGHT: [u8; 3] = [0xff, 0xd5, 0x4f];

/// Runs Chromium headless on this closed network (no first run, no background or component
/// network, a fresh profile); panics when it does not end within a minute.
fn chromium(profile: &Path, args: &[String]) -> std::process::Output {
    let mut child = std::process::Command::new("/usr/bin/chromium")
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--hide-scrollbars",
            "--force-device-scale-factor=1",
        ])
        .arg(format!("--user-data-dir={}", profile.display()))
        .args(args)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("chromium starts");
    let started = std::time::Instant::now();
    while child
        .try_wait()
        .expect("chromium can be waited on")
        .is_none()
    {
        if started.elapsed() > std::time::Duration::from_secs(60) {
            let _ = child.kill();
            panic!("chromium did not finish within 60 s");
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    child.wait_with_output().expect("chromium's output")
}

/// The `x`, `y`, `width` and `height` of the first `<rect class="CLASS" ...>` of `html`.
fn rect(html: &str, class: &str) -> [f64; 4] {
    let start = html
        .find(&format!("<rect class=\"{class}\""))
        .unwrap_or_else(|| panic!("no {class} rect"));
    let tag = &html[start..start + html[start..].find('>').unwrap()];
    ["x", "y", "width", "height"].map(|a| {
        let from = tag.find(&format!(" {a}=\"")).expect("the attribute") + a.len() + 3;
        tag[from..from + tag[from..].find('"').unwrap()]
            .parse()
            .expect("a number")
    })
}

#[test]
fn the_html_of_a_catalog_bug_renders_in_headless_chromium() {
    if !Path::new("/usr/bin/chromium").exists() {
        eprintln!(
            "SKIPPED the_html_of_a_catalog_bug_renders_in_headless_chromium: /usr/bin/chromium is not installed (scripts/chromium installs it; scripts/test runs that)"
        );
        return;
    }
    let s = Scratch::new();
    let case = bug_case(&s);
    let verify = s.run(&["verify", &case, "--json"]).json();
    let operator = verify["failure"]["operator"].as_str().unwrap().to_string();
    s.run(&["verify", &case, "--quiet", "--html", "page.html"])
        .expect_code(1);
    let html = s.read("page.html");
    let page = s.path().join("page.html");
    let url = format!("file://{}", page.display());

    // The page parses: the DOM Chromium built has the drawing and the operator's name in it.
    let dom = chromium(
        &s.path().join("profile-dom"),
        &["--dump-dom".into(), url.clone()],
    );
    let dom = String::from_utf8_lossy(&dom.stdout);
    let svg = &dom[dom.find("<svg").expect("an <svg> in the DOM")..];
    let svg = &svg[..svg.find("</svg>").expect("the <svg> closes")];
    assert!(
        svg.contains(&format!(">{operator}</text>")),
        "the SVG names `{operator}`"
    );

    let png = s.path().join("page.png");
    let shot = chromium(
        &s.path().join("profile-shot"),
        &[
            "--window-size=1200,900".into(),
            format!("--screenshot={}", png.display()),
            url,
        ],
    );
    assert!(
        png.exists(),
        "no screenshot: {}",
        String::from_utf8_lossy(&shot.stderr)
    );
    let decoder = png::Decoder::new(std::io::BufReader::new(std::fs::File::open(&png).unwrap()));
    let mut reader = decoder.read_info().expect("a PNG");
    let mut pixels = vec![0; reader.output_buffer_size().expect("a buffer size")];
    let frame = reader.next_frame(&mut pixels).expect("a frame");
    let channels = frame.color_type.samples();
    assert_eq!(frame.bit_depth, png::BitDepth::Eight);
    let pixel = |x: f64, y: f64| -> [u8; 3] {
        let (x, y) = (x.round() as usize, y.round() as usize);
        assert!(
            x < frame.width as usize && y < frame.height as usize,
            "({x}, {y}) off the screenshot"
        );
        let at = y * frame.line_size + x * channels;
        [pixels[at], pixels[at + 1], pixels[at + 2]]
    };
    let near = |p: [u8; 3], q: [u8; 3]| p.iter().zip(q).all(|(a, b)| a.abs_diff(b) <= 6);

    // The stopping operator's box, in page pixels: the drawing sits at a fixed place.
    let [x, y, w, h] = rect(&html, "stop-box");
    let (x, y) = (
        x + f64::from(shardproof_report::html::GRAPH_LEFT),
        y + f64::from(shardproof_report::html::GRAPH_TOP),
    );
    // Inside the border, clear of the text (which starts 8 px in): the highlight.
    let inside = [
        (x + 4.0, y + 4.0),
        (x + w - 5.0, y + 4.0),
        (x + 4.0, y + h - 5.0),
        (x + w - 5.0, y + h - 5.0),
        (x + 4.0, y + h / 2.0),
        (x + w - 5.0, y + h / 2.0),
    ];
    for (px, py) in inside {
        let p = pixel(px, py);
        assert!(
            near(p, HIGHLIGHT),
            "pixel ({px}, {py}) is {p:?}, not the highlight {HIGHLIGHT:?}"
        );
    }
    // And only there: just right of the box, the page is not highlighted.
    let beside = pixel(x + w + 8.0, y + 4.0);
    assert!(
        !near(beside, HIGHLIGHT),
        "the highlight spills out of the box: {beside:?}"
    );
}
