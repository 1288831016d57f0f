//! Operators the registry knows and no placement rule covers make their outputs `Unknown`
//! on every mesh dim (never a guess, whatever the inputs' placements), are listed as the
//! source of unknown placements, make the verdict inconclusive, and do not stop the
//! propagation: the operators after them are still placed (and their claims hold of the
//! values: harness `common/props.rs`).

use shardproof_check::{check_case, rules, Place, Verdict};

mod common;
#[path = "common/props.rs"]
mod props;
use props::{run, In, Input, Program};

/// Registered operators without a rule: (name, the call on `x` of `[4, 4]` defining `u`).
const UNRULED: [(&str, &str); 4] = [
    ("aten.cummax", "cm = torch.ops.aten.cummax.default(x, 0)\nu = cm[0]"),
    ("aten.diagonal", "u = torch.ops.aten.diagonal.default(x)"),
    ("aten.var_mean", "vm = torch.ops.aten.var_mean.correction(x, [1])\nu = vm[0]"),
    (
        "aten.addbmm",
        "xt = torch.ops.aten.t.default(x)\nm = torch.ops.aten.mm.default(x, xt)\nx3 = torch.ops.aten.unsqueeze.default(x, 0)\ny3 = torch.ops.aten.unsqueeze.default(xt, 0)\nu = torch.ops.aten.addbmm.default(m, x3, y3)",
    ),
];

fn program(call: &str, mesh: &[usize], p: In) -> Program {
    let mut body: Vec<String> = call.lines().map(String::from).collect();
    body.push("after = torch.ops.aten.neg.default(u)".into());
    body.push("beside = torch.ops.aten.relu.default(x)".into());
    Program {
        mesh: mesh.to_vec(),
        inputs: vec![Input::f("x", &[4, 4], &vec![p; mesh.len()])],
        spec: body.clone(),
        ranks: vec![body],
        checked: ["u", "after", "beside"]
            .iter()
            .map(|n| (n.to_string(), n.to_string()))
            .collect(),
    }
}

#[test]
fn the_chosen_operators_are_registered_without_a_rule() {
    let registry = shardproof_ops::Registry::builtin();
    for (name, _) in UNRULED {
        assert!(rules::rule(name).is_none(), "{name} has a rule");
        assert!(
            registry
                .iter()
                .any(|d| format!("{}.{}", d.name.namespace, d.name.name) == name),
            "{name} is not registered"
        );
    }
}

#[test]
fn an_operator_without_a_rule_is_unknown_and_never_guessed() {
    for (name, call) in UNRULED {
        for mesh in [vec![2], vec![2, 2]] {
            // Replicated inputs too: the result would be replicated, but no rule says so.
            for p in [In::R, In::S(0), In::S(1)] {
                let prog = program(call, &mesh, p);
                let seen = run(&prog, 3).unwrap_or_else(|e| panic!("{name}: {e}"));
                if let Some(why) = &seen.skipped {
                    panic!("{name} {p:?}: skipped: {why}");
                }
                let unknown = vec![Place::Unknown; mesh.len()];
                assert_eq!(seen.places[0], unknown, "{name} {p:?}: {seen:?}");
                assert_eq!(seen.places[1], unknown, "{name} {p:?}: after it: {seen:?}");
                // Propagation went on past it: the operator beside it is placed (its claim
                // was checked against the values by `run`).
                assert!(
                    !seen.places[2].contains(&Place::Unknown),
                    "{name} {p:?}: {seen:?}"
                );
                // (A finding elsewhere in the program, as addbmm's `x @ x.T` of a row shard,
                // claims nothing; the replicated input never has one.)
                assert!(
                    seen.claims == 1 || (seen.finding && p != In::R),
                    "{name} {p:?}: {seen:?}"
                );
            }
        }
    }
}

#[test]
fn an_operator_without_a_rule_is_reported_and_the_verdict_inconclusive() {
    for (name, call) in UNRULED {
        let dir = tempfile::tempdir().unwrap();
        let body: String = call
            .lines()
            .chain(["out = torch.ops.aten.neg.default(u)"])
            .map(|l| format!("        {l}\n"))
            .collect();
        let graph = format!(
            "class G(torch.nn.Module):\n    def forward(self, x: \"f64[4, 4]\"):\n{body}        return (out,)\n"
        );
        for f in ["spec.py", "r0.py", "r1.py"] {
            std::fs::write(dir.path().join(f), &graph).unwrap();
        }
        std::fs::write(
            dir.path().join("case.yaml"),
            "version: 1\nname: unknown\nspec:\n  graph: spec.py\nimpl:\n  mesh: { tp: 2 }\n  graphs: [r0.py, r1.py]\ninputs:\n  x: Replicate()\n",
        )
        .unwrap();
        let case = shardproof_case::load_case(&dir.path().join("case.yaml")).unwrap();
        let report = check_case(&case).unwrap();
        assert_eq!(
            report.verdict,
            Verdict::Inconclusive,
            "{name}: {}",
            report.render()
        );
        let base = name.trim_start_matches("aten.");
        assert!(
            report
                .unknown
                .iter()
                .any(|u| u.reason.contains("no placement rule") && u.reason.contains(base)),
            "{name}: {:?}",
            report.unknown
        );
    }
}
