//! Renders a sample verify refutation in every format:
//!
//! ```text
//! cargo run -p shardproof-report --example render -- html > report.html
//! cargo run -p shardproof-report --example render -- sarif
//! cargo run -p shardproof-report --example render -- junit
//! ```

use shardproof_report::{
    html, junit, sarif, Checked, Command, Consumer, Finding, Level, Location, NeighbourInput,
    Neighbourhood, Report, Rule, Status, Verdict,
};

fn main() {
    let mut r = Report::new(
        Command::Verify,
        "mlp-tp2-missing-allreduce",
        Verdict::Violated,
        "output `loss` has no clean relation to the implementation",
    );
    r.case_file = Some("case.yaml".into());
    r.seconds = Some(0.08);
    r.rules = vec![Rule::new(
        "relations-stop",
        "An output has no clean relation: relations stop at a spec operator.",
    )];
    let hint =
        "input `mm_1` is an unreduced partial sum, sum(r0.mm_1, r1.mm_1): a missing all-reduce?";
    r.findings.push(Finding {
        graph: Location::parse("spec.py:9"),
        hint: Some(hint.into()),
        ..Finding::new(
            "relations-stop",
            Level::Error,
            "add_1",
            "output `loss` has no clean relation: relations stop at spec operator `add_1` (aten.add.Tensor)",
        )
    });
    r.checked.push(Checked {
        rule: Some("relations-stop".into()),
        message: Some("relations stop at spec operator `add_1`".into()),
        ..Checked::new("loss", Status::Failed)
    });
    r.neighbourhood = Some(Neighbourhood {
        output: "loss".into(),
        operator: "add_1".into(),
        op: "aten.add.Tensor".into(),
        graph: Location::parse("spec.py:9"),
        source: None,
        inputs: vec![
            NeighbourInput {
                name: "mm_1".into(),
                relations: vec!["sum(r0.mm_1, r1.mm_1)".into()],
            },
            NeighbourInput {
                name: "b2_0".into(),
                relations: vec!["r0.b2_0".into(), "r1.b2_0".into()],
            },
        ],
        computed: Some("add.Tensor(sum(r0.mm_1, r1.mm_1), r0.b2_0, 1)".into()),
        consumers: (0..2)
            .map(|rank| Consumer {
                name: format!("r{rank}.add_1"),
                op: "aten.add.Tensor".into(),
                reads: vec![0, 1],
            })
            .collect(),
        hint: Some(hint.into()),
        other_stops: vec![],
    });
    r.fact("decided by", "relations");
    let format = std::env::args().nth(1).unwrap_or_else(|| "html".into());
    let text = match format.as_str() {
        "sarif" => sarif::render(&r),
        "junit" => junit::render(&r),
        "html" => html::render(&r),
        other => {
            eprintln!("unknown format `{other}`: use html, sarif or junit");
            std::process::exit(2);
        }
    };
    println!("{text}");
}
