//! The plumbing of the hand-written MoE dispatcher cases on a `dp × ep` (or wider) mesh:
//! the spec and rank graphs and the case YAML written to a temporary directory and loaded,
//! each rank's block of the leaves, and the spec and the ranks run through the interpreter.
#![allow(dead_code)]

use shardproof_case::Case;
use shardproof_interp::{run_graph, run_program, RunConfig};
use shardproof_ir::{DType, Graph, ValueId};
use shardproof_ops::{Meta, Tensor};
use std::collections::BTreeMap;

pub use super::values::ty;

/// What a written case declares besides its graphs: the mesh dims (outermost first), the
/// process groups (name and the mesh dims it spans), and the placements of the inputs and
/// outputs (name and YAML placement text).
pub struct Declared<'a> {
    /// The case's name.
    pub name: &'a str,
    /// Mesh dims and sizes, outermost first.
    pub mesh: &'a [(&'a str, usize)],
    /// Process groups: name and the mesh dims (by name) it spans.
    pub groups: &'a [(&'a str, Vec<&'a str>)],
    /// Inputs and their placements.
    pub inputs: &'a [(&'a str, String)],
    /// Outputs and their placements.
    pub outputs: &'a [(&'a str, String)],
}

/// Writes `spec` as the spec graph, `ranks[q]` as rank q's graph and the case YAML of
/// `declared` into a temporary directory, and loads the case; a case that does not load is a
/// broken test, so it panics naming the case.
pub fn load_written(spec: &str, ranks: &[String], declared: &Declared) -> Case {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("spec.py"), spec).unwrap();
    let names: Vec<String> = (0..ranks.len()).map(|q| format!("r{q}.py")).collect();
    for (name, text) in names.iter().zip(ranks) {
        std::fs::write(dir.path().join(name), text).unwrap();
    }
    let mesh: Vec<String> = declared
        .mesh
        .iter()
        .map(|(d, n)| format!("{d}: {n}"))
        .collect();
    let groups: String = declared
        .groups
        .iter()
        .map(|(g, dims)| {
            let dims = if dims.len() == 1 {
                dims[0].to_string()
            } else {
                format!("[{}]", dims.join(", "))
            };
            format!("    \"{g}\": {dims}\n")
        })
        .collect();
    let placed = |values: &[(&str, String)]| -> String {
        values
            .iter()
            .map(|(v, p)| format!("  {v}: {p}\n"))
            .collect()
    };
    let yaml = format!(
        "version: 1\nname: {}\nspec:\n  graph: spec.py\nimpl:\n  mesh: {{ {} }}\n  graphs: [{}]\n  groups:\n{groups}inputs:\n{}outputs:\n{}",
        declared.name,
        mesh.join(", "),
        names.join(", "),
        placed(declared.inputs),
        placed(declared.outputs),
    );
    // These programs' labels are drawn as classes (the interpreter bounds an integer input
    // by its index uses), never a loss's ignore_index: a mean loss over split rows counts as
    // many targets on every rank, which the case states.
    let reads_nll = std::iter::once(spec)
        .chain(ranks.iter().map(String::as_str))
        .any(|text| text.contains("nll_loss"));
    let yaml = if reads_nll {
        format!("{yaml}assume:\n  ignore-index: unused\n")
    } else {
        yaml
    };
    std::fs::write(dir.path().join("case.yaml"), yaml).unwrap();
    shardproof_case::load_case(&dir.path().join("case.yaml"))
        .unwrap_or_else(|e| panic!("{}: {e}", declared.name))
}

/// The groups `dp` and `ep`, each over the mesh dim of its name.
pub fn dp_and_ep_groups() -> Vec<(&'static str, Vec<&'static str>)> {
    vec![("dp", vec!["dp"]), ("ep", vec!["ep"])]
}

/// Block `b` of `t`'s data cut into blocks of `shape` (row-major, so a block of leading rows
/// or one expert's weight), as a tensor of `shape`.
pub fn block(t: &Tensor, shape: &[usize], b: usize) -> Tensor {
    let size: usize = shape.iter().product();
    Tensor::new(
        Meta::new(DType::F64, shape.to_vec()),
        t.data[b * size..(b + 1) * size].to_vec(),
    )
}

/// The value named `name` in `g`.
fn named(g: &Graph, name: &str) -> ValueId {
    ValueId::new(g.nodes.iter().position(|n| n.name == name).unwrap(), 0)
}

/// The spec's `out` on `leaves`, or `None` where the spec does not run.
pub fn spec_out(case: &Case, leaves: &BTreeMap<String, Tensor>) -> Option<Vec<f64>> {
    run_graph(&case.spec, leaves, &RunConfig::default())
        .ok()
        .and_then(|env| env.get(named(&case.spec, "out")).map(|t| t.data.to_vec()))
}

/// Every rank's `out` (`None` where a rank does not define it) with rank q given
/// `per_rank[q]`, or `None` where the program does not run.
pub fn rank_outs(
    case: &Case,
    per_rank: &[BTreeMap<String, Tensor>],
) -> Option<Vec<Option<Tensor>>> {
    let envs = run_program(&case.program, per_rank, &RunConfig::default()).ok()?;
    Some(
        envs.iter()
            .zip(&case.program.ranks)
            .map(|(env, g)| env.get(named(g, "out")).cloned())
            .collect(),
    )
}

/// The leaves `x` and `w` by name.
pub fn x_and_w(x: Tensor, w: Tensor) -> BTreeMap<String, Tensor> {
    BTreeMap::from([("x".to_string(), x), ("w".to_string(), w)])
}

/// The spec lines applying each of `experts` experts `w [experts, h, h]` to all `batch`
/// tokens `x [batch, h]`: the tokens expanded per expert `ex` and the products `p`.
pub fn experts_on_every_token(batch: usize, experts: usize, h: usize) -> Vec<String> {
    vec![
        format!(
            "u: {} = torch.ops.aten.unsqueeze.default(x, 0)",
            ty(&[1, batch, h])
        ),
        format!(
            "ex: {} = torch.ops.aten.expand.default(u, [{experts}, {batch}, {h}])",
            ty(&[experts, batch, h])
        ),
        format!(
            "p: {} = torch.ops.aten.bmm.default(ex, w)",
            ty(&[experts, batch, h])
        ),
    ]
}

/// The spec of the dispatcher on `batch` tokens and `experts` experts: every expert on every
/// token, each token's sum weighted by the token, summed into `out [h]`.
pub fn weighted_sum_spec(batch: usize, experts: usize, h: usize) -> String {
    let params = vec![
        format!("x: {}", ty(&[batch, h])),
        format!("w: {}", ty(&[experts, h, h])),
    ];
    let mut body = experts_on_every_token(batch, experts, h);
    body.extend([
        format!(
            "s: {} = torch.ops.aten.sum.dim_IntList(p, [0])",
            ty(&[batch, h])
        ),
        format!("m: {} = torch.ops.aten.mul.Tensor(s, x)", ty(&[batch, h])),
        format!("out: {} = torch.ops.aten.sum.dim_IntList(m, [0])", ty(&[h])),
    ]);
    super::hand::graph_module(&params, &body)
}

/// A rank's lines for microbatch `k` of its tokens `x [k_all * l, h]`: the `l` rows `x{k}`,
/// all-gathered over `group` of `n` into `{gathered} [n * l, h]` (through `ag{k}`).
pub fn gathered_rows(
    k: usize,
    (l, h): (usize, usize),
    (group, n): (&str, usize),
    gathered: &str,
) -> Vec<String> {
    vec![
        format!(
            "x{k}: {} = torch.ops.aten.slice.Tensor(x, 0, {}, {})",
            ty(&[l, h]),
            k * l,
            (k + 1) * l
        ),
        format!(
            "ag{k}: {} = torch.ops._c10d_functional.all_gather_into_tensor.default(x{k}, {n}, '{group}')",
            ty(&[n * l, h])
        ),
        format!(
            "{gathered}: {} = torch.ops._c10d_functional.wait_tensor.default(ag{k})",
            ty(&[n * l, h])
        ),
    ]
}

/// What the checker and the interpreter say of one program.
pub struct Ran {
    /// The checker's verdict.
    pub verdict: shardproof_check::Verdict,
    /// Whether the ranks' outputs, assembled as declared, are the spec's.
    pub right: bool,
    /// The checker's rendered report (printed, so that a failing test shows it).
    pub report: String,
}

impl Ran {
    /// The verdict and report headed by `what` (the program's name).
    fn shown(&self, what: &str) -> String {
        format!("{what}: {:?}\n{}", self.verdict, self.report)
    }

    /// Asserts the program named `what` is right when run and holds.
    pub fn assert_holds(&self, what: &str) {
        let shown = self.shown(what);
        eprintln!("{shown}");
        assert!(self.right, "the correct program is wrong: {shown}");
        assert_eq!(self.verdict, shardproof_check::Verdict::Holds, "{shown}");
    }

    /// Asserts the program named `what` is wrong when run and does not hold.
    pub fn assert_never_holds(&self, what: &str) {
        let shown = self.shown(what);
        eprintln!("{shown}");
        assert!(!self.right, "not wrong when run: {shown}");
        assert_ne!(self.verdict, shardproof_check::Verdict::Holds, "{shown}");
    }
}
