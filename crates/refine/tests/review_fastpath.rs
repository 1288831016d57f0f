//! Adversarial review of verify's fast path (`engine/fastpath.rs`): hand-written distributed
//! programs, right and wrong, each run on concrete values by the reference interpreter and
//! verified three ways (the fast path on, off, and audited against the e-graph).
//!
//! Every attack asserts the same three things: a program the interpreter shows wrong is never
//! verified; the verdict, certificate and failure are the same with the fast path on and off;
//! and the audit finds no operator whose fast relation is written otherwise than the e-graph's.
//! Each also pins whether the fast path decided an operator, so that an attack meant to reach
//! it cannot silently stop reaching it (and one meant to be declined cannot start being taken).

use shardproof_case::{load_case, Case};
use shardproof_interp::{infer_graph, run_graph, run_program, Precision, RunConfig};
use shardproof_ir::ValueId;
use shardproof_ops::{Meta, Tensor};
use shardproof_refine::eval::{random_tensor, seeded_values, tensors_agree};
use shardproof_refine::{verify, Options, Outcome, Verdict};
use std::collections::BTreeMap;
use std::path::Path;

/// How a tensor is laid out on a 1-d mesh of `n` ranks, for the interpreter's inputs and its
/// comparison of outputs (the case file says the same in its own words).
#[derive(Clone, Copy, Debug)]
pub enum Place {
    /// Every rank holds the whole tensor.
    Replicate,
    /// Rank `r` holds chunk `r` of `n` equal chunks along the dim.
    Shard(usize),
    /// The tensor is the sum of the ranks' tensors (inputs: rank 0 holds it, the others zero
    /// plus noise that cancels; see [`split`]).
    Partial,
    /// Rank `r` holds chunk `n - 1 - r` along the dim (pieces in the other group order; the
    /// case file states it by an `expr`).
    ShardReversed(usize),
    /// Every chunk along the dim is rank 0's tensor; the other ranks hold tensors of their own
    /// (one rank's piece duplicated; the case file states it by an `expr`).
    FirstRepeated(usize),
}

impl Place {
    fn yaml(self) -> String {
        match self {
            Place::Replicate => "Replicate()".into(),
            Place::Shard(d) => format!("Shard({d})"),
            Place::Partial => "Partial()".into(),
            Place::ShardReversed(_) | Place::FirstRepeated(_) => {
                unreachable!("stated by an expr")
            }
        }
    }
}

/// One attack: a spec and the ranks' programs (FX text), the layouts of inputs and outputs,
/// anything else the case file says, and what the fast path is expected to do.
pub struct Attack<'a> {
    /// What the attack tries, for messages.
    pub name: &'a str,
    /// The spec program.
    pub spec: String,
    /// One program per rank (a 1-d mesh `tp` of this many ranks).
    pub ranks: Vec<String>,
    /// `inputs:` with the interpreter's layout; `expr` overrides the case file's entry.
    pub inputs: Vec<(&'a str, Place, Option<&'a str>)>,
    /// `outputs:` (checked outputs) with the interpreter's layout; `expr` overrides the case
    /// file's entry. Empty: every spec output must be rebuildable (the interpreter then wants
    /// every rank's output equal to the spec's).
    pub outputs: Vec<(&'a str, Place, Option<&'a str>)>,
    /// More case-file text (`assume:`, `constants:`), appended as is.
    pub extra: &'a str,
    /// Whether the interpreter rounds every tensor to its declared dtype after each operator
    /// (`Precision::Native`) rather than computing exactly (`F64`, which adds partial sums
    /// without rounding but does not tell an f16 cast from a bf16 one).
    pub native_precision: bool,
}

/// An FX graph module: `sig` the forward's parameters (`x: "f32[4, 6]"`), `body` its
/// assignment lines, `ret` the returned names.
pub fn fx(sig: &str, body: &[String], ret: &str) -> String {
    let mut g = format!("class GraphModule(torch.nn.Module):\n    def forward(self, {sig}):\n");
    for line in body {
        g.push_str("        ");
        g.push_str(line);
        g.push('\n');
    }
    g.push_str(&format!("        return ({ret},)\n"));
    g
}

/// A line `name: "TYPE" = torch.ops.CALL`.
pub fn op(name: &str, ty: &str, call: &str) -> String {
    format!("{name}: \"{ty}\" = torch.ops.{call}")
}

/// Writes the attack's case into `dir` and loads it.
pub fn case_of(dir: &Path, a: &Attack) -> Case {
    try_case_of(dir, a).unwrap_or_else(|e| panic!("{}: {e}", a.name))
}

/// Writes the attack's case into `dir` and loads it, or says why the loader rejects it.
pub fn try_case_of(dir: &Path, a: &Attack) -> Result<Case, String> {
    std::fs::write(dir.join("spec.py"), &a.spec).unwrap();
    let mut graphs = Vec::new();
    for (r, g) in a.ranks.iter().enumerate() {
        std::fs::write(dir.join(format!("r{r}.py")), g).unwrap();
        graphs.push(format!("r{r}.py"));
    }
    let mut yaml = format!(
        "version: 1\nname: {}\nspec:\n  graph: spec.py\nimpl:\n  mesh: {{ tp: {} }}\n  graphs: [{}]\ninputs:\n",
        a.name.replace([':', '#'], " "),
        a.ranks.len(),
        graphs.join(", ")
    );
    for (name, place, expr) in &a.inputs {
        match expr {
            Some(e) => yaml.push_str(&format!("  {name}: {{ expr: \"{e}\" }}\n")),
            None => yaml.push_str(&format!("  {name}: {}\n", place.yaml())),
        }
    }
    if !a.outputs.is_empty() {
        yaml.push_str("outputs:\n");
        for (name, place, expr) in &a.outputs {
            match expr {
                Some(e) => yaml.push_str(&format!("  {name}: {{ expr: \"{e}\" }}\n")),
                None => yaml.push_str(&format!("  {name}: {}\n", place.yaml())),
            }
        }
    }
    yaml.push_str(a.extra);
    std::fs::write(dir.join("case.yaml"), yaml).unwrap();
    load_case(&dir.join("case.yaml")).map_err(|e| e.to_string())
}

/// Chunk `r` of `n` along `dim` (row-major data).
fn chunk(t: &Tensor, dim: usize, n: usize, r: usize) -> Tensor {
    let shape = t.meta.shape.clone();
    let len = shape[dim] / n;
    let outer: usize = shape[..dim].iter().product();
    let inner: usize = shape[dim + 1..].iter().product();
    let mut data = Vec::with_capacity(outer * len * inner);
    for o in 0..outer {
        let start = (o * shape[dim] + r * len) * inner;
        data.extend_from_slice(&t.data[start..start + len * inner]);
    }
    let mut out = shape;
    out[dim] = len;
    Tensor::new(Meta::new(t.meta.dtype, out), data)
}

/// The concatenation of `ts` along `dim`.
fn concat(ts: &[Tensor], dim: usize) -> Tensor {
    let shape = ts[0].meta.shape.clone();
    let outer: usize = shape[..dim].iter().product();
    let inner: usize = shape[dim + 1..].iter().product();
    let mut data = Vec::new();
    for o in 0..outer {
        for t in ts {
            let len = t.meta.shape[dim] * inner;
            data.extend_from_slice(&t.data[o * len..(o + 1) * len]);
        }
    }
    let mut out = shape;
    out[dim] = ts.iter().map(|t| t.meta.shape[dim]).sum();
    Tensor::new(Meta::new(ts[0].meta.dtype, out), data)
}

/// A random spec tensor of meta `m` laid out by `place` over `n` ranks, and the ranks' tensors.
fn laid_out(
    m: &Meta,
    place: Place,
    n: usize,
    next: &mut dyn FnMut() -> f64,
) -> (Tensor, Vec<Tensor>) {
    let t = random_tensor(m.dtype, m.shape.clone(), 4, next);
    match place {
        Place::ShardReversed(d) => {
            let ranks = (0..n).map(|r| chunk(&t, d, n, n - 1 - r)).collect();
            (t, ranks)
        }
        Place::FirstRepeated(d) => {
            let first = chunk(&t, d, n, 0);
            let spec = concat(&vec![first.clone(); n], d);
            let ranks = std::iter::once(first)
                .chain((1..n).map(|_| {
                    let m = &chunk(&t, d, n, 0).meta;
                    random_tensor(m.dtype, m.shape.clone(), 4, next)
                }))
                .collect();
            (spec, ranks)
        }
        _ => {
            let ranks = split(&t, place, n, next);
            (t, ranks)
        }
    }
}

/// The ranks' tensors of spec tensor `t` laid out by `place` over `n` ranks (a partial sum:
/// rank 0 holds `t - (n-1) k`, the others `k`, for a random `k`).
fn split(t: &Tensor, place: Place, n: usize, next: &mut dyn FnMut() -> f64) -> Vec<Tensor> {
    match place {
        Place::Replicate => vec![t.clone(); n],
        Place::Shard(d) => (0..n).map(|r| chunk(t, d, n, r)).collect(),
        Place::Partial => {
            let k = random_tensor(t.meta.dtype, t.meta.shape.clone(), 4, next);
            let first: Vec<f64> = t
                .data
                .iter()
                .zip(k.data.iter())
                .map(|(x, y)| x - (n as f64 - 1.0) * y)
                .collect();
            std::iter::once(Tensor::new(t.meta.clone(), first))
                .chain((1..n).map(|_| k.clone()))
                .collect()
        }
        Place::ShardReversed(_) | Place::FirstRepeated(_) => unreachable!("see `laid_out`"),
    }
}

/// Runs the spec and the ranks on random inputs laid out as the attack says, three seeds, and
/// says whether every checked output (every spec output, replicated, when none is named)
/// agrees with the spec's. `Err` when a program does not run.
pub fn implementation_agrees(case: &Case, a: &Attack) -> Result<bool, String> {
    let n = case.program.ranks.len();
    let metas = infer_graph(&case.spec, &case.ops).metas;
    let meta_of = |v: ValueId| metas[v.node][v.output].clone().expect("spec meta");
    let cfg = RunConfig {
        precision: if a.native_precision {
            Precision::Native
        } else {
            Precision::F64
        },
        ..RunConfig::default()
    };
    for seed in [0.13, 0.37, 0.71] {
        let mut next = seeded_values(seed);
        let mut spec_inputs = BTreeMap::new();
        let mut rank_inputs = vec![BTreeMap::new(); n];
        for &(name, place, _) in &a.inputs {
            let v = case.spec.find(name).ok_or(format!("no spec `{name}`"))?;
            let (t, pieces) = laid_out(&meta_of(v), place, n, &mut next);
            for (r, piece) in pieces.into_iter().enumerate() {
                rank_inputs[r].insert(name.to_string(), piece);
            }
            spec_inputs.insert(name.to_string(), t);
        }
        let spec_env = run_graph(&case.spec, &spec_inputs, &cfg).map_err(|e| e.to_string())?;
        let envs = run_program(&case.program, &rank_inputs, &cfg).map_err(|e| e.to_string())?;
        let checked: Vec<(String, Place)> = if a.outputs.is_empty() {
            case.spec
                .outputs
                .iter()
                .flatten()
                .map(|&v| (case.spec.value_name(v).to_string(), Place::Replicate))
                .collect()
        } else {
            a.outputs
                .iter()
                .map(|&(s, p, _)| (s.to_string(), p))
                .collect()
        };
        for (name, place) in checked {
            let want = spec_env
                .get(case.spec.find(&name).unwrap())
                .unwrap()
                .clone();
            let got: Vec<Tensor> = (0..n)
                .map(|r| {
                    let g = &case.program.ranks[r];
                    envs[r].get(g.find(&name).unwrap()).unwrap().clone()
                })
                .collect();
            let ok = match place {
                Place::Replicate => got
                    .iter()
                    .all(|t| tensors_agree(std::slice::from_ref(t), std::slice::from_ref(&want))),
                Place::Shard(d) => tensors_agree(&[concat(&got, d)], &[want]),
                Place::ShardReversed(d) => {
                    let reversed: Vec<Tensor> = got.iter().rev().cloned().collect();
                    tensors_agree(&[concat(&reversed, d)], &[want])
                }
                Place::FirstRepeated(_) => unreachable!("inputs only"),
                Place::Partial => {
                    let mut sum = got[0].data.to_vec();
                    for t in &got[1..] {
                        for (s, x) in sum.iter_mut().zip(t.data.iter()) {
                            *s += x;
                        }
                    }
                    tensors_agree(&[Tensor::new(got[0].meta.clone(), sum)], &[want])
                }
            };
            if !ok {
                return Ok(false);
            }
        }
    }
    Ok(true)
}

/// What the attack's three verifications and the interpreter say.
#[derive(Debug)]
pub struct Findings {
    /// Whether the ranks' outputs equal the spec's on concrete values.
    pub agrees: bool,
    /// The verdict with the fast path on (the default).
    pub fast: Verdict,
    /// The verdict with the fast path off.
    pub slow: Verdict,
    /// Operators the fast path decided (fast path on).
    pub operators_fast: usize,
    /// Whether the report (all but timing and unserialized counters) is the same with the
    /// fast path on and off.
    pub same_report: bool,
    /// Operators where the audit found the fast path's relation written otherwise.
    pub differences: Vec<String>,
}

/// The outcome as reported: all but its timing and the counters the report does not carry.
fn report(o: &Outcome) -> String {
    let mut o = o.clone();
    o.seconds = 0.0;
    o.operators_reused = 0;
    o.pieces_reused = 0;
    o.operators_fast = 0;
    o.fast_path_differences.clear();
    o.operator_times.clear();
    format!("{o:?}")
}

/// Runs the attack and asserts soundness: a program the interpreter shows wrong is verified
/// neither with the fast path nor without it.
pub fn run_attack(a: &Attack) -> Findings {
    let dir = tempfile::tempdir().unwrap();
    let case = case_of(dir.path(), a);
    let agrees = implementation_agrees(&case, a).unwrap_or_else(|e| panic!("{}: {e}", a.name));
    let fast = verify(&case, &Options::default());
    let slow = verify(
        &case,
        &Options {
            fast_path: false,
            ..Options::default()
        },
    );
    let audit = verify(
        &case,
        &Options {
            audit_fast_path: true,
            ..Options::default()
        },
    );
    let f = Findings {
        agrees,
        fast: fast.verdict,
        slow: slow.verdict,
        operators_fast: fast.operators_fast,
        same_report: report(&fast) == report(&slow),
        differences: audit.fast_path_differences.clone(),
    };
    eprintln!("{}: {f:?}", a.name);
    for (o, how) in [(&fast, "with"), (&slow, "without")] {
        assert!(
            agrees || o.verdict != Verdict::Verified,
            "{}: a wrong program verified {how} the fast path: {o:#?}",
            a.name,
        );
    }
    f
}

/// [`run_attack`], and the fast path changes nothing: the same report on and off, and the
/// audit finds every fast relation written as the e-graph writes it.
pub fn run_checked(a: &Attack) -> Findings {
    let f = run_attack(a);
    assert!(
        f.same_report,
        "{}: the fast path changes the report: {:?} with it, {:?} without",
        a.name, f.fast, f.slow
    );
    assert!(
        f.differences.is_empty(),
        "{}: the audit differs: {:#?}",
        a.name,
        f.differences
    );
    f
}

/// A program over parameters `sig` computing `lines` (`name`, type, call), returning the last.
fn prog(sig: &str, lines: &[(&str, &str, &str)]) -> String {
    let body: Vec<String> = lines.iter().map(|(n, t, c)| op(n, t, c)).collect();
    fx(sig, &body, lines.last().unwrap().0)
}

/// `n` copies of one rank program.
fn on_every_rank(n: usize, g: String) -> Vec<String> {
    vec![g; n]
}

/// The rank programs: rank 0 runs `first`, every other rank `rest`.
fn first_and_rest(n: usize, first: String, rest: String) -> Vec<String> {
    std::iter::once(first)
        .chain((1..n).map(|_| rest.clone()))
        .collect()
}

/// `pow` with a negative fractional exponent over shards of `|x|` (element-wise for every
/// exponent): the right program is decided by the fast path and verified; ranks that use
/// another exponent are declined by the literal check and not verified. (`pow` with a scalar base
/// is in [`MISSING_FROM_THE_E_GRAPH`].)
#[test]
fn pow_with_a_negative_fractional_exponent_over_shards() {
    let spec = prog(
        "x: \"f32[4, 6]\"",
        &[
            ("a", "f32[4, 6]", "aten.abs.default(x)"),
            ("z", "f32[4, 6]", "aten.pow.Tensor_Scalar(a, -1.5)"),
            ("out", "f32[4, 6]", "aten.tanh.default(z)"),
        ],
    );
    for (exponent, right) in [("-1.5", true), ("-0.5", false)] {
        let rank = prog(
            "x: \"f32[2, 6]\"",
            &[
                ("a", "f32[2, 6]", "aten.abs.default(x)"),
                (
                    "z",
                    "f32[2, 6]",
                    &format!("aten.pow.Tensor_Scalar(a, {exponent})"),
                ),
                ("out", "f32[2, 6]", "aten.tanh.default(z)"),
            ],
        );
        let f = run_checked(&Attack {
            name: "pow over shards",
            spec: spec.clone(),
            ranks: on_every_rank(2, rank),
            inputs: vec![("x", Place::Shard(0), None)],
            outputs: vec![("out", Place::Shard(0), None)],
            extra: "",
            native_precision: false,
        });
        assert_eq!(f.agrees, right);
        if right {
            assert_eq!(f.fast, Verdict::Verified);
            assert_eq!(f.operators_fast, 2, "abs and pow decided by rule");
        } else {
            assert_ne!(f.fast, Verdict::Verified);
            assert_eq!(f.operators_fast, 1, "only abs: the exponent differs");
        }
    }
}

/// Integer division over integer shards (`div`, which promotes to float): element-wise
/// whatever the dtype, decided by the fast path; a rank that divides the other way round is
/// declined and refuted. (`floor_divide` is in [`MISSING_FROM_THE_E_GRAPH`].)
#[test]
fn integer_division_over_integer_shards() {
    let spec = prog(
        "x: \"i64[4, 6]\", y: \"i64[4, 6]\"",
        &[
            ("y1", "i64[4, 6]", "aten.add.Scalar(y, 1)"),
            ("d", "f32[4, 6]", "aten.div.Tensor(x, y1)"),
            ("out", "f32[4, 6]", "aten.tanh.default(d)"),
        ],
    );
    for (d, right) in [
        ("aten.div.Tensor(x, y1)", true),
        ("aten.div.Tensor(y, x1)", false),
    ] {
        let rank = prog(
            "x: \"i64[2, 6]\", y: \"i64[2, 6]\"",
            &[
                ("y1", "i64[2, 6]", "aten.add.Scalar(y, 1)"),
                ("x1", "i64[2, 6]", "aten.add.Scalar(x, 1)"),
                ("d", "f32[2, 6]", d),
                ("out", "f32[2, 6]", "aten.tanh.default(d)"),
            ],
        );
        let f = run_checked(&Attack {
            name: "integer division over shards",
            spec: spec.clone(),
            ranks: on_every_rank(2, rank),
            inputs: vec![("x", Place::Shard(0), None), ("y", Place::Shard(0), None)],
            outputs: vec![("out", Place::Shard(0), None)],
            extra: "",
            native_precision: false,
        });
        assert_eq!(f.agrees, right);
        assert_eq!(f.fast == Verdict::Verified, right);
        assert_eq!(f.operators_fast, if right { 2 } else { 1 }, "{d}");
    }
}

/// `where` whose condition is split along another dim than its branches (the ranks'
/// pieces broadcast to a wrong shape): `where` is outside the rule table, so the e-graph
/// decides, and refutes.
#[test]
fn where_with_a_condition_split_otherwise() {
    let spec = prog(
        "c: \"b8[2, 2]\", x: \"f32[2, 2]\", y: \"f32[2, 2]\"",
        &[
            ("z", "f32[2, 2]", "aten.where.self(c, x, y)"),
            ("out", "f32[2, 2]", "aten.tanh.default(z)"),
        ],
    );
    let rank = prog(
        "c: \"b8[2, 1]\", x: \"f32[1, 2]\", y: \"f32[1, 2]\"",
        &[
            ("z", "f32[2, 2]", "aten.where.self(c, x, y)"),
            ("out", "f32[2, 2]", "aten.tanh.default(z)"),
        ],
    );
    let f = run_checked(&Attack {
        name: "where, condition split otherwise",
        spec,
        ranks: on_every_rank(2, rank),
        inputs: vec![
            ("c", Place::Shard(1), None),
            ("x", Place::Shard(0), None),
            ("y", Place::Shard(0), None),
        ],
        outputs: vec![("out", Place::Replicate, None)],
        extra: "",
        native_precision: false,
    });
    assert!(!f.agrees);
    assert_ne!(f.fast, Verdict::Verified);
}

/// A comparison feeding a mask (`x * (x > y)`): both element-wise, both decided by the fast
/// path in the right program; a rank comparing the other way round is declined at the
/// comparison and refuted.
#[test]
fn a_comparison_feeding_a_mask() {
    let body = |cmp: &str, s: &str| {
        prog(
            &format!("x: \"f32[{s}]\", y: \"f32[{s}]\""),
            &[
                ("m", &format!("b8[{s}]"), cmp),
                ("z", &format!("f32[{s}]"), "aten.mul.Tensor(x, m)"),
                ("out", &format!("f32[{s}]"), "aten.tanh.default(z)"),
            ],
        )
    };
    let spec = body("aten.gt.Tensor(x, y)", "4, 6");
    for (rank1, right) in [
        ("aten.gt.Tensor(x, y)", true),
        ("aten.gt.Tensor(y, x)", false),
    ] {
        let f = run_checked(&Attack {
            name: "comparison feeding a mask",
            spec: spec.clone(),
            ranks: first_and_rest(2, body("aten.gt.Tensor(x, y)", "2, 6"), body(rank1, "2, 6")),
            inputs: vec![("x", Place::Shard(0), None), ("y", Place::Shard(0), None)],
            outputs: vec![("out", Place::Shard(0), None)],
            extra: "",
            native_precision: false,
        });
        assert_eq!(f.agrees, right);
        assert_eq!(f.fast == Verdict::Verified, right);
        assert_eq!(f.operators_fast, if right { 2 } else { 0 });
    }
}

/// `_to_copy` to another reduced dtype on the ranks (bf16 for the spec's f16): the dtype is
/// a literal, so the call differs, the fast path declines, and the program is refuted; the
/// same dtype is decided by rule.
#[test]
fn to_copy_to_another_dtype() {
    let body = |dt: &str, short: &str, s: &str| {
        prog(
            &format!("x: \"f32[{s}]\""),
            &[
                (
                    "h",
                    &format!("{short}[{s}]"),
                    &format!("aten._to_copy.default(x, dtype = torch.{dt})"),
                ),
                (
                    "w",
                    &format!("f32[{s}]"),
                    "aten._to_copy.default(h, dtype = torch.float32)",
                ),
                ("out", &format!("f32[{s}]"), "aten.tanh.default(w)"),
            ],
        )
    };
    let spec = body("float16", "f16", "4, 6");
    for (dt, short, right) in [("float16", "f16", true), ("bfloat16", "bf16", false)] {
        let f = run_checked(&Attack {
            name: "_to_copy to another dtype",
            spec: spec.clone(),
            ranks: on_every_rank(2, body(dt, short, "2, 6")),
            inputs: vec![("x", Place::Shard(0), None)],
            outputs: vec![("out", Place::Shard(0), None)],
            extra: "",
            native_precision: true,
        });
        assert_eq!(f.agrees, right);
        assert_eq!(f.fast == Verdict::Verified, right);
        assert_eq!(f.operators_fast, if right { 2 } else { 0 });
    }
}

/// Broadcasting: a replica of a smaller shape (a row vector, or a column split along the
/// split dim of a matrix it broadcasts over) beside a shard. Right programs both; the pieces
/// differ in shape (or in form), so the fast path declines and the e-graph decides.
#[test]
fn broadcasting_against_a_shard() {
    for (b_spec, b_rank, b_place) in [
        ("1, 6", "1, 6", Place::Replicate),
        ("4, 1", "2, 1", Place::Shard(0)),
    ] {
        let body = |x: &str, b: &str| {
            prog(
                &format!("x: \"f32[{x}]\", b: \"f32[{b}]\""),
                &[
                    ("z", &format!("f32[{x}]"), "aten.add.Tensor(x, b)"),
                    ("out", &format!("f32[{x}]"), "aten.tanh.default(z)"),
                ],
            )
        };
        let f = run_checked(&Attack {
            name: "broadcast against a shard",
            spec: body("4, 6", b_spec),
            ranks: on_every_rank(2, body("2, 6", b_rank)),
            inputs: vec![("x", Place::Shard(0), None), ("b", b_place, None)],
            outputs: vec![("out", Place::Shard(0), None)],
            extra: "",
            native_precision: false,
        });
        assert!(f.agrees);
        assert_eq!(f.operators_fast, 0, "{b_spec}: not alike");
    }
}

/// A scalar captured as a 0-d tensor input: beside a shard it is a replica of another form, so
/// the fast path declines (right program); as a partial sum the ranks never reduce (wrong
/// program), relations stop.
#[test]
fn a_scalar_captured_as_a_tensor() {
    let body = |x: &str| {
        prog(
            &format!("x: \"f32[{x}]\", s: \"f32[]\""),
            &[
                ("z", &format!("f32[{x}]"), "aten.mul.Tensor(x, s)"),
                ("out", &format!("f32[{x}]"), "aten.tanh.default(z)"),
            ],
        )
    };
    for (s_place, right) in [(Place::Replicate, true), (Place::Partial, false)] {
        let f = run_checked(&Attack {
            name: "scalar captured as a tensor",
            spec: body("4, 6"),
            ranks: on_every_rank(2, body("2, 6")),
            inputs: vec![("x", Place::Shard(0), None), ("s", s_place, None)],
            outputs: vec![("out", Place::Shard(0), None)],
            extra: "",
            native_precision: false,
        });
        assert_eq!(f.agrees, right);
        assert_eq!(f.fast == Verdict::Verified, right);
        assert_eq!(f.operators_fast, 0);
    }
}

/// `clamp` with tensor bounds, all split alike: decided by the fast path; bounds swapped on
/// one rank are declined and not verified; a bound split along the other dim (each rank's
/// rows against a column, broadcast to a wrong shape) is declined. (The right program's
/// verdict differs with the fast path off: see [`MISSING_FROM_THE_E_GRAPH`].)
#[test]
fn clamp_with_tensor_bounds() {
    let body = |call: &str, s: &str, lo: &str, z: &str| {
        prog(
            &format!("x: \"f32[{s}]\", lo: \"f32[{lo}]\", hi: \"f32[{s}]\""),
            &[
                ("z", &format!("f32[{z}]"), call),
                ("out", &format!("f32[{z}]"), "aten.tanh.default(z)"),
            ],
        )
    };
    let right = "aten.clamp.Tensor(x, lo, hi)";
    let swapped = "aten.clamp.Tensor(x, hi, lo)";
    // The last: each rank's [1, 2] rows against a [2, 1] column broadcast to [2, 2] (laid out
    // as a replica, the only layout whose shapes fit).
    for (rank1, lo_place, lo_rank, z_rank, out_place, agrees, fast) in [
        (
            right,
            Place::Shard(0),
            "1, 2",
            "1, 2",
            Place::Shard(0),
            true,
            1,
        ),
        (
            swapped,
            Place::Shard(0),
            "1, 2",
            "1, 2",
            Place::Shard(0),
            false,
            0,
        ),
        (
            right,
            Place::Shard(1),
            "2, 1",
            "2, 2",
            Place::Replicate,
            false,
            0,
        ),
    ] {
        let x_rank = "1, 2";
        let f = run_attack(&Attack {
            name: "clamp with tensor bounds",
            spec: body(right, "2, 2", "2, 2", "2, 2"),
            ranks: first_and_rest(
                2,
                body(right, x_rank, lo_rank, z_rank),
                body(rank1, x_rank, lo_rank, z_rank),
            ),
            inputs: vec![
                ("x", Place::Shard(0), None),
                ("lo", lo_place, None),
                ("hi", Place::Shard(0), None),
            ],
            outputs: vec![("out", out_place, None)],
            extra: "",
            native_precision: false,
        });
        assert_eq!(f.agrees, agrees, "{rank1} {lo_place:?}");
        // Without fix-1 the fast path decides the right program (`clamp.Tensor` is in check's
        // table); with it, not (the e-graph's table lacks it).
        assert!(f.operators_fast <= fast, "{rank1} {lo_place:?}");
    }
}

/// A unary chain `z = OP(x)`, `out = tanh(z)` over `x` of shape `s`, with extra lines first.
fn chain(s: &str, before: &[(&str, &str, &str)], z_call: &str) -> String {
    let ty = format!("f32[{s}]");
    let mut lines: Vec<(&str, &str, &str)> = before.to_vec();
    lines.push(("z", &ty, z_call));
    lines.push(("out", &ty, "aten.tanh.default(z)"));
    prog(&format!("x: \"{ty}\", y: \"{ty}\""), &lines)
}

/// Dropout in training on the ranks only (`aten.dropout.default`, p = 0.5): the interpreter
/// draws a mask, so the program is wrong. Verify lowers `aten.dropout.default` as an identity
/// whatever `p` and `train` say (both paths: the fast path then relates `relu` over it).
#[test]
fn training_dropout_on_the_ranks_only() {
    let spec = chain("4, 6", &[], "aten.relu.default(x)");
    let rank = chain(
        "2, 6",
        &[("d", "f32[2, 6]", "aten.dropout.default(x, 0.5, True)")],
        "aten.relu.default(d)",
    );
    let f = run_checked(&Attack {
        name: "training dropout on the ranks",
        spec,
        ranks: on_every_rank(2, rank),
        inputs: vec![("x", Place::Shard(0), None), ("y", Place::Shard(0), None)],
        outputs: vec![("out", Place::Shard(0), None)],
        extra: "",
        native_precision: false,
    });
    assert!(!f.agrees);
}

/// Verify's verdict on dropout in training (`aten.dropout.default`) in the spec with
/// probability `spec_p` and on the ranks with `rank_p`, under `assume`. (Random masks differ
/// between the programs, so the interpreter is no oracle here: the case format's rule is.)
fn dropout_verdict(spec_p: &str, rank_p: &str, assume: &str) -> Verdict {
    let body = |s: &str, p: &str| {
        chain(
            s,
            &[(
                "d",
                &format!("f32[{s}]"),
                &format!("aten.dropout.default(x, {p}, True)"),
            )],
            "aten.relu.default(d)",
        )
    };
    let dir = tempfile::tempdir().unwrap();
    let case = case_of(
        dir.path(),
        &Attack {
            name: "training dropout on both sides",
            spec: body("4, 6", spec_p),
            ranks: on_every_rank(2, body("2, 6", rank_p)),
            inputs: vec![("x", Place::Shard(0), None), ("y", Place::Shard(0), None)],
            outputs: vec![("out", Place::Shard(0), None)],
            extra: assume,
            native_precision: false,
        },
    );
    verify(&case, &Options::default()).verdict
}

/// Training dropout on both sides, the same probability, under `assume: { dropout:
/// same-mask }`: the masks are laid out like the inputs, so the program is verified.
#[test]
fn training_dropout_on_both_sides_under_same_mask() {
    let same_mask = "assume:\n  dropout: same-mask\n";
    assert_eq!(dropout_verdict("0.5", "0.5", same_mask), Verdict::Verified);
}

/// Training dropout on both sides without `same-mask` (the case format: a verdict that
/// depends on random operators is inconclusive without the assumption), and with other
/// probabilities on the ranks even under it: neither may be verified. Both are, since
/// `aten.dropout.default` is lowered as an identity.
#[test]
fn training_dropout_is_related_only_under_same_mask_and_equal_probabilities() {
    let same_mask = "assume:\n  dropout: same-mask\n";
    assert_eq!(dropout_verdict("0.5", "0.5", ""), Verdict::Inconclusive);
    assert_ne!(dropout_verdict("0.1", "0.5", same_mask), Verdict::Verified);
}

/// Dropout in training on both sides, `aten.native_dropout` (its own family, outside the rule
/// table): without `assume: { dropout: same-mask }` the verdict is inconclusive both ways.
#[test]
fn native_dropout_is_outside_the_rule_table() {
    let drop = |s: &str| {
        let body = vec![
            "native_dropout = torch.ops.aten.native_dropout.default(x, 0.5, True)".to_string(),
            format!("d: \"f32[{s}]\" = native_dropout[0]"),
            op("z", &format!("f32[{s}]"), "aten.relu.default(d)"),
            op("out", &format!("f32[{s}]"), "aten.tanh.default(z)"),
        ];
        fx(&format!("x: \"f32[{s}]\", y: \"f32[{s}]\""), &body, "out")
    };
    let f = run_checked(&Attack {
        name: "native dropout",
        spec: drop("4, 6"),
        ranks: on_every_rank(2, drop("2, 6")),
        inputs: vec![("x", Place::Shard(0), None), ("y", Place::Shard(0), None)],
        outputs: vec![("out", Place::Shard(0), None)],
        extra: "",
        native_precision: false,
    });
    assert_eq!(f.fast, Verdict::Inconclusive);
}

/// Dropout whose probability is computed at run time (read from a 0-d input) on both sides:
/// whether a mask is drawn is unknown, so nothing may be verified. The type check refuses a
/// non-literal `p` first; lowering refuses it too (`lower::tests`), where it once read it as
/// `0`, an identity.
#[test]
fn dropout_with_a_probability_computed_at_run_time_is_not_verified() {
    for native in [false, true] {
        let drop = |s: &str| {
            let ty = format!("f32[{s}]");
            let mut body = vec![op("p", "f32[]", "aten._local_scalar_dense.default(s)")];
            if native {
                body.push(
                    "native_dropout = torch.ops.aten.native_dropout.default(x, p, True)".into(),
                );
                body.push(format!("d: \"{ty}\" = native_dropout[0]"));
            } else {
                body.push(op("d", &ty, "aten.dropout.default(x, p, True)"));
            }
            body.push(op("z", &ty, "aten.relu.default(d)"));
            fx(&format!("x: \"{ty}\", s: \"f32[]\""), &body, "z")
        };
        let dir = tempfile::tempdir().unwrap();
        let case = case_of(
            dir.path(),
            &Attack {
                name: "dropout with a computed probability",
                spec: drop("4, 6"),
                ranks: on_every_rank(2, drop("2, 6")),
                inputs: vec![("x", Place::Shard(0), None), ("s", Place::Replicate, None)],
                outputs: vec![("z", Place::Shard(0), None)],
                extra: "assume:\n  dropout: same-mask\n",
                native_precision: false,
            },
        );
        let report = verify(&case, &Options::default());
        assert_ne!(report.verdict, Verdict::Verified, "native: {native}");
    }
}

/// One rank computes the operator with other literals (`alpha = 2` on rank 1): over replicas
/// the fast path relates only rank 0's result (rank 1's is no counterpart) and the replicated
/// output is not verified; over shards piece 1 has no counterpart, so the fast path declines.
#[test]
fn a_rank_with_other_literals() {
    for (place, s) in [(Place::Replicate, "4, 6"), (Place::Shard(0), "2, 6")] {
        let f = run_checked(&Attack {
            name: "a rank with other literals",
            spec: chain("4, 6", &[], "aten.add.Tensor(x, y)"),
            ranks: first_and_rest(
                2,
                chain(s, &[], "aten.add.Tensor(x, y)"),
                chain(s, &[], "aten.add.Tensor(x, y, alpha = 2)"),
            ),
            inputs: vec![("x", place, None), ("y", place, None)],
            outputs: vec![("out", place, None)],
            extra: "",
            native_precision: false,
        });
        assert!(!f.agrees);
        assert_ne!(f.fast, Verdict::Verified, "{place:?}");
        let decided = usize::from(matches!(place, Place::Replicate));
        assert_eq!(f.operators_fast, decided, "{place:?}");
    }
}

/// The same literal written as an integer on the ranks and a float in the spec (`alpha = 2`
/// and `alpha = 2.0`): the same call, but the templates differ, so the fast path declines;
/// the e-graph's verdict stands (the report is the same either way).
#[test]
fn a_literal_written_otherwise() {
    let f = run_checked(&Attack {
        name: "a literal written otherwise",
        spec: chain("4, 6", &[], "aten.add.Tensor(x, y, alpha = 2.0)"),
        ranks: on_every_rank(2, chain("2, 6", &[], "aten.add.Tensor(x, y, alpha = 2)")),
        inputs: vec![("x", Place::Shard(0), None), ("y", Place::Shard(0), None)],
        outputs: vec![("out", Place::Shard(0), None)],
        extra: "",
        native_precision: false,
    });
    assert!(f.agrees);
    assert_eq!(f.operators_fast, 0);
}

/// A partial-sum input through a nonlinear operator (`relu(a + b) != relu(a) + relu(b)`), then
/// all-reduced: wrong, and refuted; through a linear one (`neg`) right, and verified. A
/// partial sum is no plain form: the fast path declines both.
#[test]
fn a_partial_sum_through_linear_and_nonlinear_operators() {
    for (call, right) in [
        ("aten.relu.default(x)", false),
        ("aten.neg.default(x)", true),
    ] {
        let rank = prog(
            "x: \"f32[4, 6]\", y: \"f32[4, 6]\"",
            &[
                ("p", "f32[4, 6]", call),
                (
                    "ar",
                    "f32[4, 6]",
                    "_c10d_functional.all_reduce.default(p, 'sum', '0')",
                ),
                ("z", "f32[4, 6]", "_c10d_functional.wait_tensor.default(ar)"),
                ("out", "f32[4, 6]", "aten.tanh.default(z)"),
            ],
        );
        let f = run_checked(&Attack {
            name: "partial sum through an operator",
            spec: chain("4, 6", &[], call),
            ranks: on_every_rank(2, rank),
            inputs: vec![("x", Place::Partial, None), ("y", Place::Replicate, None)],
            outputs: vec![("out", Place::Replicate, None)],
            extra: "",
            native_precision: false,
        });
        assert_eq!(f.agrees, right, "{call}");
        assert_eq!(f.fast == Verdict::Verified, right, "{call}");
        assert_eq!(f.operators_fast, 0, "{call}");
    }
}

/// One rank's piece stated as both pieces of `y` (`y = cat(r0.y, r0.y)`): rank 1 adds its own
/// `y`, which the relation does not name, so piece 1 has no counterpart; the fast path
/// declines and the e-graph refutes.
#[test]
fn a_duplicated_piece() {
    let f = run_checked(&Attack {
        name: "a duplicated piece",
        spec: chain("4, 6", &[], "aten.add.Tensor(x, y)"),
        ranks: on_every_rank(2, chain("2, 6", &[], "aten.add.Tensor(x, y)")),
        inputs: vec![
            ("x", Place::Shard(0), None),
            (
                "y",
                Place::FirstRepeated(0),
                Some("concat([r0.y, r0.y], 0)"),
            ),
        ],
        outputs: vec![("out", Place::Shard(0), None)],
        extra: "",
        native_precision: false,
    });
    assert!(!f.agrees);
    assert_eq!(f.fast, Verdict::Refuted);
    assert_eq!(f.operators_fast, 0);
}

/// Pieces in the other group order for one input (`y = cat(r1.y, r0.y)`): each rank pairs
/// piece `r` of `x` with piece `1 - r` of `y`. No rank computes a counterpart; declined, and
/// refuted.
#[test]
fn pieces_in_another_group_order() {
    let f = run_checked(&Attack {
        name: "pieces in another group order",
        spec: chain("4, 6", &[], "aten.mul.Tensor(x, y)"),
        ranks: on_every_rank(2, chain("2, 6", &[], "aten.mul.Tensor(x, y)")),
        inputs: vec![
            ("x", Place::Shard(0), None),
            (
                "y",
                Place::ShardReversed(0),
                Some("concat([r1.y, r0.y], 0)"),
            ),
        ],
        outputs: vec![("out", Place::Shard(0), None)],
        extra: "",
        native_precision: false,
    });
    assert!(!f.agrees);
    assert_eq!(f.fast, Verdict::Refuted);
    assert_eq!(f.operators_fast, 0);
}

/// Both inputs in the other group order alike (`cat(r1.., r0..)` for both): each rank computes
/// a right piece, so the fast path decides the sum as `cat(r1.z, r0.z)`, and the output laid
/// out the same way is verified.
#[test]
fn both_inputs_in_another_group_order() {
    let f = run_checked(&Attack {
        name: "both inputs in another group order",
        spec: chain("4, 6", &[], "aten.mul.Tensor(x, y)"),
        ranks: on_every_rank(2, chain("2, 6", &[], "aten.mul.Tensor(x, y)")),
        inputs: vec![
            (
                "x",
                Place::ShardReversed(0),
                Some("concat([r1.x, r0.x], 0)"),
            ),
            (
                "y",
                Place::ShardReversed(0),
                Some("concat([r1.y, r0.y], 0)"),
            ),
        ],
        outputs: vec![(
            "out",
            Place::ShardReversed(0),
            Some("concat([r1.out, r0.out], 0)"),
        )],
        extra: "",
        native_precision: false,
    });
    assert!(f.agrees);
    assert_eq!(f.fast, Verdict::Verified);
    assert_eq!(f.operators_fast, 1);
}

/// A replicated `z = relu(x)` that a collective reads, then the output reads the collective's
/// result (right programs).
fn replicated_collective_attack(collective: &[(&str, &str, &str)]) -> Attack<'static> {
    let mut lines = vec![("z", "f32[4, 6]", "aten.relu.default(x)")];
    lines.extend_from_slice(collective);
    lines.push(("out", "f32[4, 6]", "aten.tanh.default(w)"));
    let rank = prog("x: \"f32[4, 6]\", y: \"f32[4, 6]\"", &lines);
    Attack {
        name: "replicated result a collective reads",
        spec: chain("4, 6", &[], "aten.relu.default(x)"),
        ranks: on_every_rank(2, rank),
        inputs: vec![("x", Place::Replicate, None), ("y", Place::Replicate, None)],
        outputs: vec![("out", Place::Replicate, None)],
        extra: "",
        native_precision: false,
    }
}

/// A replicated result that a collective reads (the replicated branch has no check on its
/// consumers, the sharded one does): all-reduced with `avg` (a replica again; inconclusive
/// both ways, the e-graph does not see it) or broadcast from rank 0 (verified both ways): the
/// same reports, and the audit agrees.
#[test]
fn a_replicated_result_a_collective_reads() {
    let collectives: [&[(&str, &str, &str)]; 2] = [
        &[
            (
                "c",
                "f32[4, 6]",
                "_c10d_functional.all_reduce.default(z, 'avg', '0')",
            ),
            ("w", "f32[4, 6]", "_c10d_functional.wait_tensor.default(c)"),
        ],
        &[
            (
                "c",
                "f32[4, 6]",
                "_c10d_functional.broadcast.default(z, 0, '0')",
            ),
            ("w", "f32[4, 6]", "_c10d_functional.wait_tensor.default(c)"),
        ],
    ];
    for (collective, verdict) in collectives
        .into_iter()
        .zip([Verdict::Inconclusive, Verdict::Verified])
    {
        let f = run_checked(&replicated_collective_attack(collective));
        assert!(f.agrees, "{}", collective[0].2);
        assert_eq!(f.fast, verdict, "{}", collective[0].2);
        // The fast path decides `z` today; with fix-2 (a collective reads it) it declines, and
        // the reports stay the same either way.
    }
}

/// Relation written otherwise: a replicated result all-gathered and sliced back. The e-graph's
/// relation of `z` also names the slices of the gathered tensor (`r0.w`, `r1.w`, a slice of
/// `r0.c`); the fast path's names `r0.z`, `r1.z` only, so the audit counts a difference (the
/// verdict is the same here). The sharded branch declines where a collective reads its
/// results; the replicated branch does not check.
#[test]
fn a_replicated_result_gathered_and_sliced_back() {
    let f = run_checked(&replicated_collective_attack(&[
        (
            "c",
            "f32[8, 6]",
            "_c10d_functional.all_gather_into_tensor.default(z, 2, '0')",
        ),
        ("g", "f32[8, 6]", "_c10d_functional.wait_tensor.default(c)"),
        ("w", "f32[4, 6]", "aten.slice.Tensor(g, 0, 4, 8)"),
    ]));
    assert!(f.agrees);
    assert_eq!(f.fast, Verdict::Verified);
}

/// A replicated result that a concatenation reads (`cat([z, z])`, the spec's too): right; the
/// audit must agree.
#[test]
fn a_replicated_result_a_concatenation_reads() {
    let body = || {
        prog(
            "x: \"f32[4, 6]\", y: \"f32[4, 6]\"",
            &[
                ("z", "f32[4, 6]", "aten.relu.default(x)"),
                ("c", "f32[8, 6]", "aten.cat.default([z, z])"),
                ("out", "f32[8, 6]", "aten.tanh.default(c)"),
            ],
        )
    };
    let f = run_checked(&Attack {
        name: "replicated result a cat reads",
        spec: body(),
        ranks: on_every_rank(2, body()),
        inputs: vec![("x", Place::Replicate, None), ("y", Place::Replicate, None)],
        outputs: vec![("out", Place::Replicate, None)],
        extra: "",
        native_precision: false,
    });
    assert!(f.agrees);
    assert_eq!(f.fast, Verdict::Verified);
}

/// Repeated layers (twins), the fast path's relation kept for reuse: the second layer's ranks
/// multiply by the first layer's weight. The first layer is decided by rule; the second is
/// declined (its weight is no counterpart), its twin's renamed relation fails its check, and
/// the output is refuted.
#[test]
fn a_twin_layer_with_the_wrong_weight() {
    let body = |s: &str, w2: &str| {
        let ty = format!("f32[{s}]");
        prog(
            &format!("x: \"{ty}\", w1: \"{ty}\", w2: \"{ty}\""),
            &[
                ("a1", &ty, "aten.mul.Tensor(x, w1)"),
                ("b1", &ty, "aten.relu.default(a1)"),
                ("a2", &ty, &format!("aten.mul.Tensor(b1, {w2})")),
                ("b2", &ty, "aten.relu.default(a2)"),
                ("out", &ty, "aten.tanh.default(b2)"),
            ],
        )
    };
    for (w2, right) in [("w2", true), ("w1", false)] {
        let f = run_checked(&Attack {
            name: "twin layer with the wrong weight",
            spec: body("4, 6", "w2"),
            ranks: on_every_rank(2, body("2, 6", w2)),
            inputs: vec![
                ("x", Place::Shard(0), None),
                ("w1", Place::Shard(0), None),
                ("w2", Place::Shard(0), None),
            ],
            outputs: vec![("out", Place::Shard(0), None)],
            extra: "",
            native_precision: false,
        });
        assert_eq!(f.agrees, right);
        assert_eq!(f.fast == Verdict::Verified, right);
        assert_eq!(f.operators_fast, if right { 4 } else { 2 });
    }
}

/// Element-wise operators of check's rule table (so the fast path takes them over shards)
/// that the e-graph's element-wise table (`lemmas::ELEMENTWISE`) lacks: over concatenations
/// the e-graph has no lemma for them, so without the fast path relations stop there. Each
/// as `z = CALL` over `x`, `y` (`a = |x|`), shape `[4, 6]` split by rows on 2 ranks.
const MISSING_FROM_THE_E_GRAPH: &[&str] = &[
    "aten.pow.Scalar(2.0, x)",
    "aten.pow.Tensor_Tensor(a, y)",
    "aten.clamp.Tensor(x, y)",
    "aten.floor_divide.default(x, y)",
    "aten.remainder.Tensor(x, y)",
    "aten.fmod.Tensor(x, y)",
    "aten.atan2.default(x, y)",
    "aten.div.Tensor_mode(x, y, rounding_mode = 'floor')",
    "aten.fmax.default(x, y)",
    "aten.rsub.Tensor(x, y)",
    "aten.nan_to_num.default(x)",
    "aten.round.decimals(x, decimals = 1)",
];

/// The attack over one call of [`MISSING_FROM_THE_E_GRAPH`]; rank 1 runs `rank1` instead.
fn missing_attack(call: &str, rank1: &str) -> (String, Vec<String>) {
    let before = [("a", "f32[4, 6]", "aten.abs.default(x)")];
    let before_rank = [("a", "f32[2, 6]", "aten.abs.default(x)")];
    (
        chain("4, 6", &before, call),
        first_and_rest(
            2,
            chain("2, 6", &before_rank, call),
            chain("2, 6", &before_rank, rank1),
        ),
    )
}

/// Soundness over [`MISSING_FROM_THE_E_GRAPH`]: each right program agrees with the spec on
/// concrete values (the fast path decides it; without it, or with fix-1, the e-graph leaves
/// it inconclusive); each where rank 1 reads `y` for the spec's `x` is wrong and not verified,
/// with the fast path or without.
#[test]
fn element_wise_operators_the_e_graph_lacks_are_decided_soundly() {
    for call in MISSING_FROM_THE_E_GRAPH {
        // Rank 1 reads `y` where the spec reads `x` (or `a`).
        let wrong = call
            .replace("(x", "(y")
            .replace("(a,", "(y,")
            .replace(", x)", ", y)");
        for (rank1, right) in [(call.to_string(), true), (wrong, false)] {
            let (spec, ranks) = missing_attack(call, &rank1);
            let f = run_attack(&Attack {
                name: call,
                spec,
                ranks,
                inputs: vec![("x", Place::Shard(0), None), ("y", Place::Shard(0), None)],
                outputs: vec![("out", Place::Shard(0), None)],
                extra: "",
                native_precision: false,
            });
            assert_eq!(f.agrees, right, "{call} / {rank1}");
            // Without fix-1 the fast path decides the right program's call (and `abs` where
            // the call reads it); with it, only `abs`.
            let decided = if call.contains("(a") { 2 } else { 1 };
            assert!(f.operators_fast <= decided, "{call}");
        }
    }
}

/// Over replicas the same calls are related alike by the fast path and the e-graph (by
/// congruence, no lemma needed): the same reports, the audit agrees.
#[test]
fn element_wise_operators_the_e_graph_lacks_agree_over_replicas() {
    for call in MISSING_FROM_THE_E_GRAPH {
        let before = [("a", "f32[4, 6]", "aten.abs.default(x)")];
        let f = run_checked(&Attack {
            name: call,
            spec: chain("4, 6", &before, call),
            ranks: on_every_rank(2, chain("4, 6", &before, call)),
            inputs: vec![("x", Place::Replicate, None), ("y", Place::Replicate, None)],
            outputs: vec![("out", Place::Replicate, None)],
            extra: "",
            native_precision: false,
        });
        assert!(f.agrees, "{call}");
        assert_eq!(f.fast, Verdict::Verified, "{call}");
        assert!(f.operators_fast >= 1, "{call}");
    }
}

/// Verdict differs: over shards, the fast path relates every operator of
/// [`MISSING_FROM_THE_E_GRAPH`] and the right program is verified; with the fast path off the
/// e-graph has no lemma for them and the verdict is inconclusive (and the audit counts a
/// difference). Sound, but the fast path is meant to change no report.
#[test]
fn element_wise_operators_the_e_graph_lacks_give_the_same_report() {
    let mut differ = Vec::new();
    for call in MISSING_FROM_THE_E_GRAPH {
        let (spec, ranks) = missing_attack(call, call);
        let f = run_attack(&Attack {
            name: call,
            spec,
            ranks,
            inputs: vec![("x", Place::Shard(0), None), ("y", Place::Shard(0), None)],
            outputs: vec![("out", Place::Shard(0), None)],
            extra: "",
            native_precision: false,
        });
        assert!(f.agrees, "{call}");
        if !f.same_report || !f.differences.is_empty() {
            differ.push(format!(
                "{call}: {:?} with the fast path, {:?} without",
                f.fast, f.slow
            ));
        }
    }
    assert!(differ.is_empty(), "{differ:#?}");
}

/// Concatenation along a dim of size one, and pieces that only broadcasting makes fit: `x`
/// `[2, 1]` split by rows (pieces `[1, 1]`) added to `y` `[2, 4]` split by columns (pieces
/// `[2, 2]`). Each rank's sum broadcasts to `[2, 2]`, the shape of the spec's column pieces,
/// so the output laid out by columns fits, but each rank adds one row of `x` to both rows:
/// wrong. The inputs are split along other dims, so the fast path declines; not verified.
/// Split alike (`x` `[2, 1]` and `y` `[2, 1]` by rows, pieces `[1, 1]`) the sum is right and
/// decided by the fast path.
#[test]
fn concatenation_along_a_dim_of_size_one() {
    let body = |x: &str, y: &str, z: &str| {
        prog(
            &format!("x: \"f32[{x}]\", y: \"f32[{y}]\""),
            &[
                ("z", &format!("f32[{z}]"), "aten.add.Tensor(x, y)"),
                ("out", &format!("f32[{z}]"), "aten.tanh.default(z)"),
            ],
        )
    };
    let wrong = run_checked(&Attack {
        name: "size-one dim, pieces fit by broadcasting",
        spec: body("2, 1", "2, 4", "2, 4"),
        ranks: on_every_rank(2, body("1, 1", "2, 2", "2, 2")),
        inputs: vec![("x", Place::Shard(0), None), ("y", Place::Shard(1), None)],
        outputs: vec![("out", Place::Shard(1), None)],
        extra: "",
        native_precision: false,
    });
    assert!(!wrong.agrees);
    assert_eq!(wrong.operators_fast, 0);
    let right = run_checked(&Attack {
        name: "size-one dim, split alike",
        spec: body("2, 1", "2, 1", "2, 1"),
        ranks: on_every_rank(2, body("1, 1", "1, 1", "1, 1")),
        inputs: vec![("x", Place::Shard(0), None), ("y", Place::Shard(0), None)],
        outputs: vec![("out", Place::Shard(0), None)],
        extra: "",
        native_precision: false,
    });
    assert!(right.agrees);
    assert_eq!(right.fast, Verdict::Verified);
    assert_eq!(right.operators_fast, 1);
}

/// In-place and `out=` variants on the ranks (`add_`, `add.out`) for the spec's `add`, the
/// output reading `x` after the update. The loader functionalizes `add_` (later reads of `x`
/// read the sum), and the fast path then decides the out-of-place `add`: verified, and the
/// interpreter agrees. `add.out` is rejected when loaded or not verified. Never a verdict
/// the interpreter contradicts.
#[test]
fn in_place_and_out_variants() {
    let spec = chain("4, 6", &[], "aten.add.Tensor(x, y)");
    for (call, fast_decides) in [
        ("aten.add_.Tensor(x, y)", true),
        ("aten.add.out(x, y, out = x)", false),
    ] {
        let rank = prog(
            "x: \"f32[2, 6]\", y: \"f32[2, 6]\"",
            &[
                ("z", "f32[2, 6]", call),
                ("out", "f32[2, 6]", "aten.tanh.default(x)"),
            ],
        );
        let a = Attack {
            name: call,
            spec: spec.clone(),
            ranks: on_every_rank(2, rank),
            inputs: vec![("x", Place::Shard(0), None), ("y", Place::Shard(0), None)],
            outputs: vec![("out", Place::Shard(0), None)],
            extra: "",
            native_precision: false,
        };
        let dir = tempfile::tempdir().unwrap();
        let case = match try_case_of(dir.path(), &a) {
            Err(e) => {
                eprintln!("{call}: rejected when loaded: {e}");
                assert!(!fast_decides, "{call}");
                continue;
            }
            Ok(case) => case,
        };
        let fast = verify(&case, &Options::default());
        let agrees = implementation_agrees(&case, &a);
        eprintln!(
            "{call}: {:?}, {} fast, interpreter {agrees:?}",
            fast.verdict, fast.operators_fast
        );
        if fast.verdict == Verdict::Verified {
            assert_eq!(agrees, Ok(true), "{call}");
        }
        assert_eq!(fast.operators_fast > 0, fast_decides, "{call}");
        if fast_decides {
            assert_eq!(fast.verdict, Verdict::Verified, "{call}");
        }
    }
}

/// Pieces of other shapes along the same dim: a vector `b` `[2]` split in two beside a matrix
/// `x` `[2, 2]` split by rows. The spec broadcasts `b` along the rows; each rank adds its one
/// element of `b` to its row, and the output laid out by rows fits: wrong. The shape
/// precondition declines it (deleting it makes this verified).
#[test]
fn a_split_vector_beside_a_matrix_split_by_rows() {
    let body = |x: &str, b: &str| {
        prog(
            &format!("x: \"f32[{x}]\", b: \"f32[{b}]\""),
            &[
                ("z", &format!("f32[{x}]"), "aten.add.Tensor(x, b)"),
                ("out", &format!("f32[{x}]"), "aten.tanh.default(z)"),
            ],
        )
    };
    let f = run_checked(&Attack {
        name: "split vector beside a matrix split by rows",
        spec: body("2, 2", "2"),
        ranks: on_every_rank(2, body("1, 2", "1")),
        inputs: vec![("x", Place::Shard(0), None), ("b", Place::Shard(0), None)],
        outputs: vec![("out", Place::Shard(0), None)],
        extra: "",
        native_precision: false,
    });
    assert!(!f.agrees);
    assert_eq!(f.operators_fast, 0);
}
