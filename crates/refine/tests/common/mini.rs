//! The mini-program harness of verify's adversarial review tests: tiny hand-written cases
//! (a spec and tp/dp ranks as fx text), run by the reference interpreter on three seeds and
//! verified several ways (node limits, reuse on and off); [`run`] asserts that a wrong program
//! is never verified and returns what each way found.
#![allow(dead_code)]

use shardproof_case::{load_case, Case};
use shardproof_interp::{run_graph, run_program, Precision, RunConfig};
use shardproof_ops::{Meta, Tensor};
use shardproof_refine::eval::{random_tensor, seeded_values, tensors_agree};
use shardproof_refine::{verify, Options, Verdict};
use std::collections::BTreeMap;
use std::path::Path;

pub fn line(name: &str, ty: &str, call: &str) -> String {
    format!("        {name}: \"{ty}\" = torch.ops.{call}\n")
}

/// A graph module over `sig` (the forward's parameters after `self`) of `body`'s lines,
/// returning `out`.
pub fn module(sig: &str, body: &[String]) -> String {
    let mut g = format!("class GraphModule(torch.nn.Module):\n    def forward(self, {sig}):\n");
    for l in body {
        g.push_str(l);
    }
    g.push_str("        return (out,)\n");
    g
}

/// How an input is laid out over the ranks (a one-dimensional mesh).
#[derive(Clone, Copy, Debug)]
pub enum Place {
    Replicate,
    Shard(usize),
}

impl Place {
    pub fn yaml(self) -> String {
        match self {
            Place::Replicate => "Replicate()".into(),
            Place::Shard(d) => format!("Shard({d})"),
        }
    }
}

/// One attack: a spec and one graph per rank over the mesh axis `axis`, the inputs' layouts,
/// the output's, and fixed values for inputs that must not be random (masks, indices).
pub struct Mini {
    pub name: String,
    pub axis: &'static str,
    pub spec: String,
    pub ranks: Vec<String>,
    pub inputs: Vec<(&'static str, Place)>,
    pub output: Place,
    pub fixed: Vec<(&'static str, Vec<f64>)>,
}

impl Mini {
    pub fn case(&self, dir: &Path) -> Case {
        std::fs::write(dir.join("spec.py"), &self.spec).unwrap();
        let mut graphs = Vec::new();
        for (r, g) in self.ranks.iter().enumerate() {
            std::fs::write(dir.join(format!("r{r}.py")), g).unwrap();
            graphs.push(format!("r{r}.py"));
        }
        let mut yaml = format!(
            "version: 1\nname: {}\nspec:\n  graph: spec.py\nimpl:\n  mesh: {{ {}: {} }}\n  graphs: [{}]\ninputs:\n",
            self.name,
            self.axis,
            self.ranks.len(),
            graphs.join(", ")
        );
        for (n, p) in &self.inputs {
            yaml.push_str(&format!("  {n}: {}\n", p.yaml()));
        }
        yaml.push_str(&format!("outputs:\n  out: {}\n", self.output.yaml()));
        std::fs::write(dir.join("case.yaml"), yaml).unwrap();
        load_case(&dir.join("case.yaml")).unwrap()
    }
}

/// Chunk `r` of `n` along `dim` of a tensor of any rank.
pub fn chunk(t: &Tensor, dim: usize, n: usize, r: usize) -> Tensor {
    let shape = &t.meta.shape;
    let inner: usize = shape[dim + 1..].iter().product();
    let outer: usize = shape[..dim].iter().product();
    let part = shape[dim] / n;
    let mut data = Vec::new();
    for o in 0..outer {
        for k in r * part..(r + 1) * part {
            let at = (o * shape[dim] + k) * inner;
            data.extend_from_slice(&t.data[at..at + inner]);
        }
    }
    let mut s = shape.clone();
    s[dim] = part;
    Tensor::new(Meta::new(t.meta.dtype, s), data)
}

/// Whether every rank's output is the spec's (its chunk, for a sharded output) on random
/// inputs, three seeds.
pub fn interpreter_agrees(case: &Case, m: &Mini) -> bool {
    let cfg = RunConfig {
        precision: Precision::F64,
        ..RunConfig::default()
    };
    let metas = shardproof_interp::infer_graph(&case.spec, &case.ops).metas;
    let meta_of = |name: &str| {
        let v = case.spec.find(name).unwrap();
        metas[v.node][v.output].clone().unwrap()
    };
    let n = m.ranks.len();
    for seed in [0.13, 0.37, 0.71] {
        let mut next = seeded_values(seed);
        let mut spec_in = BTreeMap::new();
        let mut rank_in = vec![BTreeMap::new(); n];
        for &(name, place) in &m.inputs {
            let meta = meta_of(name);
            let t = match m.fixed.iter().find(|f| f.0 == name) {
                Some((_, v)) => Tensor::new(meta, v.clone()),
                None => random_tensor(meta.dtype, meta.shape.clone(), 4, &mut next),
            };
            for (r, ins) in rank_in.iter_mut().enumerate() {
                let piece = match place {
                    Place::Shard(d) => chunk(&t, d, n, r),
                    Place::Replicate => t.clone(),
                };
                ins.insert(name.to_string(), piece);
            }
            spec_in.insert(name.to_string(), t);
        }
        let spec_env = run_graph(&case.spec, &spec_in, &cfg).unwrap();
        let envs = run_program(&case.program, &rank_in, &cfg).unwrap();
        let want = spec_env.get(case.spec.find("out").unwrap()).unwrap();
        for (r, env) in envs.iter().enumerate() {
            let got = env.get(case.program.ranks[r].find("out").unwrap()).unwrap();
            let want = match m.output {
                Place::Shard(d) => chunk(want, d, n, r),
                Place::Replicate => want.clone(),
            };
            if !tensors_agree(std::slice::from_ref(got), std::slice::from_ref(&want)) {
                return false;
            }
        }
    }
    true
}

/// The ways each attack is verified: the default options and a node limit of 10 (stopped
/// runners, the wider attempt and pieces), each with reuse on and off, and a node limit of 25.
pub fn ways() -> Vec<(&'static str, Options)> {
    let small = |reuse| Options {
        node_limit: 10,
        jobs: Some(1),
        reuse,
        ..Options::default()
    };
    let default = |reuse| Options {
        jobs: Some(1),
        reuse,
        ..Options::default()
    };
    vec![
        ("default", default(true)),
        ("default-no-reuse", default(false)),
        ("limit-10", small(true)),
        ("limit-10-no-reuse", small(false)),
        (
            "limit-25",
            Options {
                node_limit: 25,
                ..small(true)
            },
        ),
    ]
}

/// What the interpreter and the verifications say about one attack.
#[derive(Debug)]
pub struct Findings {
    pub agrees: bool,
    pub verdicts: Vec<Verdict>,
    pub pieces_reused: usize,
    /// The ways (see [`ways`]) that refuted a right program.
    pub false_refutations: Vec<&'static str>,
    /// Per way, the failure's hint.
    pub hints: Vec<Option<String>>,
}

/// Runs an attack and asserts soundness: a wrong program is never verified. The ways that
/// refute a right program are returned (callers assert there are none).
pub fn run(m: &Mini) -> Findings {
    let dir = tempfile::tempdir().unwrap();
    let case = m.case(dir.path());
    let agrees = interpreter_agrees(&case, m);
    let mut verdicts = Vec::new();
    let mut pieces_reused = 0;
    let mut false_refutations = Vec::new();
    let mut hints = Vec::new();
    for (how, opts) in ways() {
        let o = verify(&case, &opts);
        eprintln!(
            "{} [{how}]: {:?} agrees={agrees} reused={} reason={:?} hint={:?}",
            m.name,
            o.verdict,
            o.pieces_reused,
            o.reason,
            o.failure.as_ref().and_then(|f| f.hint.as_ref())
        );
        assert!(
            agrees || o.verdict != Verdict::Verified,
            "{} [{how}]: a wrong program verified",
            m.name
        );
        if agrees && o.verdict == Verdict::Refuted {
            false_refutations.push(how);
        }
        pieces_reused += o.pieces_reused;
        verdicts.push(o.verdict);
        hints.push(o.failure.and_then(|f| f.hint));
    }
    Findings {
        agrees,
        verdicts,
        pieces_reused,
        false_refutations,
        hints,
    }
}

/// Tokens, hidden size, the spec's output width (the ranks hold half of it).
pub const N: usize = 4;
pub const H: usize = 4;
pub const W: usize = 8;

/// A column-parallel product (`w` split along its columns over tp=2) followed by elementwise
/// steps: `steps` are `(name, dtype, call)` over `[N, width]`, the last one named `out`. The
/// spec runs `spec`, rank `r` runs `ranks[r]`. `w` is replicated where `sliced`, each rank
/// slicing the columns `cols[r]` itself.
pub fn column_parallel(
    name: &str,
    spec: &[(&str, &str, &str)],
    ranks: [&[(&str, &str, &str)]; 2],
    sliced: Option<[usize; 2]>,
    extra: &[(&'static str, &str)],
) -> Mini {
    let prog = |steps: &[(&str, &str, &str)], width: usize, slice_at: Option<usize>| {
        let mut sig = format!(
            "x: \"f32[{N}, {H}]\", w: \"f32[{H}, {}]\"",
            if slice_at.is_some() { W } else { width }
        );
        for (n, ty) in extra {
            sig.push_str(&format!(", {n}: \"{ty}\""));
        }
        let mut body = Vec::new();
        let mut w_name = "w";
        if let Some(c) = slice_at {
            body.push(line(
                "ws",
                &format!("f32[{H}, {width}]"),
                &format!(
                    "aten.slice.Tensor(w, 1, {}, {})",
                    c * width,
                    (c + 1) * width
                ),
            ));
            w_name = "ws";
        }
        body.push(line(
            "y",
            &format!("f32[{N}, {width}]"),
            &format!("aten.mm.default(x, {w_name})"),
        ));
        for (n, dt, call) in steps {
            body.push(line(n, &format!("{dt}[{N}, {width}]"), call));
        }
        let params: String = sig;
        module(&params, &body)
    };
    let mut inputs = vec![
        ("x", Place::Replicate),
        (
            "w",
            if sliced.is_some() {
                Place::Replicate
            } else {
                Place::Shard(1)
            },
        ),
    ];
    for (n, _) in extra {
        inputs.push((n, Place::Replicate));
    }
    Mini {
        name: name.into(),
        axis: "tp",
        spec: prog(spec, W, None),
        ranks: (0..2)
            .map(|r| prog(ranks[r], W / 2, sliced.map(|c| c[r])))
            .collect(),
        inputs,
        output: Place::Shard(1),
        fixed: vec![],
    }
}

pub type Steps = &'static [(&'static str, &'static str, &'static str)];

/// A row-parallel product (`x` split along its columns, `w` along its rows over tp=2): each
/// rank's `p` is a partial sum. The ranks apply `steps` to it (the last named `q`) and
/// all-reduce `q`; the spec applies `steps` to the whole product (its last named `out`).
/// `m` is a boolean mask and `idx` indices, replicated inputs.
pub fn partial_sum_then(name: &str, steps: &[(&str, &str, &str)]) -> Mini {
    let sig = |cols: usize, rows: usize| {
        format!("x: \"f32[4, {cols}]\", w: \"f32[{rows}, 4]\", m: \"b8[4, 4]\", idx: \"i64[4]\"")
    };
    let body = |last: &str| -> Vec<String> {
        let mut b = vec![line("p", "f32[4, 4]", "aten.mm.default(x, w)")];
        for (i, (n, ty, call)) in steps.iter().enumerate() {
            let n = if i + 1 == steps.len() { last } else { n };
            b.push(line(n, ty, call));
        }
        b
    };
    let spec = module(&sig(4, 4), &body("out"));
    let out_ty = steps.last().unwrap().1;
    let mut rb = body("q");
    rb.push(line(
        "ar",
        out_ty,
        "_c10d_functional.all_reduce.default(q, 'sum', 'tp')",
    ));
    rb.push(line(
        "out",
        out_ty,
        "_c10d_functional.wait_tensor.default(ar)",
    ));
    let rank = module(&sig(2, 2), &rb);
    Mini {
        name: name.into(),
        axis: "tp",
        spec,
        ranks: vec![rank.clone(), rank],
        inputs: vec![
            ("x", Place::Shard(1)),
            ("w", Place::Shard(0)),
            ("m", Place::Replicate),
            ("idx", Place::Replicate),
        ],
        output: Place::Replicate,
        fixed: vec![
            (
                "m",
                vec![
                    1.0, 0.0, 0.0, 1.0, 0.0, 1.0, 1.0, 0.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.0, 1.0, 1.0,
                ],
            ),
            ("idx", vec![2.0, 0.0, 3.0, 1.0]),
        ],
    }
}
