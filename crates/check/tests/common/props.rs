//! The harness of the `props_*` property tests: a small program (spec and rank graphs in fx
//! text) with random input placements on a 1-d or 2-d mesh is checked, its inferred
//! placements read, and spec and ranks run in the reference interpreter on random inputs laid
//! out per the placements. Every inferred placement of a checked value must hold of the
//! values: `Shard(d)` (and blocked shards) concatenate to the spec value, `Partial(r)` reduces
//! to it, `Replicate()` is it on every rank, `Stacked(d)` is its shard pieces stacked along
//! dim 0 on every rank. Where the value derives from local means the claim carries a factor
//! (`RankPlacements::piece_factor`): the pieces laid out make the spec value times it, and a
//! factor not known claims nothing. `Varying`, `Unknown`, `Unmasked` and the record placements claim
//! nothing; nor does a program the checker reports a violation of (other than the
//! postcondition, which these programs do not declare).
//!
//! Included by each `props_*.rs` as `#[path = "common/props.rs"] mod props;` beside
//! `mod common;` (it reads `common::values`).

#![allow(dead_code)]

use crate::common::values::concat;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use shardproof_check::{check_case, propagate, PieceFactor, Place, Red};
use shardproof_interp::{run_graph, run_program, RunConfig};
use shardproof_ir::{DType, Graph, ValueId};
use shardproof_ops::{Meta, Tensor};
use std::collections::BTreeMap;

/// An input's placement on one mesh dim.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum In {
    /// `Replicate()`.
    R,
    /// `Shard(d)`.
    S(usize),
    /// `Partial(r)`.
    P(Red),
}

/// The elements of an input.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Elem {
    /// float64, uniform in [-1, 1).
    F64,
    /// int64, uniform in [lo, hi).
    Int(i64, i64),
    /// bool, each true with probability 1/2.
    Bool,
}

/// One input of the program: its name, elements, local (per-rank) shape and placement per
/// mesh dim.
#[derive(Clone, Debug)]
pub struct Input {
    /// The graph input's name in spec and rank graphs.
    pub name: String,
    /// Its elements.
    pub elem: Elem,
    /// Its shape on every rank.
    pub local: Vec<usize>,
    /// Its placement per mesh dim.
    pub places: Vec<In>,
}

impl Input {
    /// A float input.
    pub fn f(name: &str, local: &[usize], places: &[In]) -> Input {
        Input {
            name: name.into(),
            elem: Elem::F64,
            local: local.to_vec(),
            places: places.to_vec(),
        }
    }

    /// The spec's (global) shape of the input on a mesh of `mesh` sizes.
    pub fn global(&self, mesh: &[usize]) -> Vec<usize> {
        let mut g = self.local.clone();
        for (m, p) in self.places.iter().enumerate() {
            if let In::S(d) = p {
                g[*d] *= mesh[m];
            }
        }
        g
    }
}

/// A program: the mesh (`[tp]` or `[dp, tp]`), its inputs, the spec's body lines and every
/// rank's (one entry: the same for every rank), and the values whose placements are checked,
/// as (rank graph name, spec graph name).
#[derive(Clone, Debug)]
pub struct Program {
    /// Mesh sizes: one (`tp`) or two (`dp`, `tp`).
    pub mesh: Vec<usize>,
    /// The inputs.
    pub inputs: Vec<Input>,
    /// The spec's lines (fx, unindented, annotations optional).
    pub spec: Vec<String>,
    /// Per rank, its lines; a single entry is every rank's.
    pub ranks: Vec<Vec<String>>,
    /// The checked values: (name in the rank graphs, name in the spec).
    pub checked: Vec<(String, String)>,
}

/// What one run saw.
#[derive(Clone, Debug, Default)]
pub struct Seen {
    /// Claims checked against the values (they held).
    pub claims: usize,
    /// Checked values whose placement claimed nothing (`Varying`, `Unknown`, ...).
    pub declined: usize,
    /// The checker reported a violation: nothing is claimed.
    pub finding: bool,
    /// Why the instance was not checked at all (spec or ranks invalid or not runnable).
    pub skipped: Option<String>,
    /// Per checked value, the placements rank 0 inferred (empty where not reached).
    pub places: Vec<Vec<Place>>,
    /// Per checked value, what its placements claim of its values (the spec's value, or
    /// the spec's times a factor: local means), as rank 0 inferred.
    pub factors: Vec<PieceFactor>,
}

/// Mesh dim names: a 1-d mesh is `tp`, a 2-d mesh `dp, tp`.
pub fn mesh_names(mesh: &[usize]) -> &'static [&'static str] {
    if mesh.len() == 1 {
        &["tp"]
    } else {
        &["dp", "tp"]
    }
}

/// The mesh coordinates of rank `r` (row-major, the first mesh dim outermost).
pub fn coords(mesh: &[usize], r: usize) -> Vec<usize> {
    let mut c = vec![0; mesh.len()];
    let mut x = r;
    for m in (0..mesh.len()).rev() {
        c[m] = x % mesh[m];
        x /= mesh[m];
    }
    c
}

fn dtype_name(e: Elem) -> &'static str {
    match e {
        Elem::F64 => "f64",
        Elem::Int(..) => "i64",
        Elem::Bool => "b8",
    }
}

fn graph_text(inputs: &[(String, Elem, Vec<usize>)], body: &[String], outs: &[String]) -> String {
    let params: Vec<String> = inputs
        .iter()
        .map(|(n, e, s)| format!("{n}: \"{}{s:?}\"", dtype_name(*e)))
        .collect();
    let lines: String = body.iter().map(|l| format!("        {l}\n")).collect();
    format!(
        "class GraphModule(torch.nn.Module):\n    def forward(self, {}):\n{lines}        return ({},)\n",
        params.join(", "),
        outs.join(", ")
    )
}

fn placement_text(p: In) -> String {
    match p {
        In::R => "Replicate()".into(),
        In::S(d) => format!("Shard({d})"),
        In::P(Red::Sum) => "Partial()".into(),
        In::P(r) => format!("Partial({})", r.name()),
    }
}

fn random_tensor(elem: Elem, shape: &[usize], rng: &mut ChaCha8Rng) -> Tensor {
    let n: usize = shape.iter().product();
    let (dtype, data): (DType, Vec<f64>) = match elem {
        Elem::F64 => (
            DType::F64,
            (0..n).map(|_| rng.random_range(-1.0..1.0)).collect(),
        ),
        Elem::Int(lo, hi) => (
            DType::I64,
            (0..n).map(|_| rng.random_range(lo..hi) as f64).collect(),
        ),
        Elem::Bool => (
            DType::Bool,
            (0..n)
                .map(|_| if rng.random_bool(0.5) { 1.0 } else { 0.0 })
                .collect(),
        ),
    };
    Tensor::new(Meta::new(dtype, shape.to_vec()), data)
}

/// How the pieces along one mesh dim make up the value.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Make {
    /// Every coordinate holds the same piece.
    Same,
    /// Dim d in k blocks, each the concatenation of the coordinates' pieces.
    Cat(usize, usize),
    /// The pieces reduce to the value.
    Reduce(Red),
    /// Every coordinate holds the same tensor: the pieces of a shard of dim d stacked along
    /// dim 0.
    Unstack(usize),
}

/// Assembles the ranks' values (row-major mesh) into one tensor, mesh dims applied innermost
/// first (the first mesh dim outermost: DTensor's order); `Err` when the pieces contradict
/// the makes (a `Same` dim's pieces differ, a dim does not split into the blocks).
pub fn assemble(
    values: &[Vec<f64>],
    shape: &[usize],
    mesh: &[usize],
    makes: &[Make],
) -> Result<(Vec<f64>, Vec<usize>), String> {
    let mut cur: Vec<(Vec<f64>, Vec<usize>)> =
        values.iter().map(|v| (v.clone(), shape.to_vec())).collect();
    for m in (0..mesh.len()).rev() {
        let n = mesh[m];
        let mut next = Vec::new();
        for group in cur.chunks(n) {
            let (first, sh) = &group[0];
            let same = || -> Result<(), String> {
                if group.iter().any(|(v, _)| !close(v, first)) {
                    return Err(format!("the pieces along mesh dim {m} differ"));
                }
                Ok(())
            };
            next.push(match makes[m] {
                Make::Same => {
                    same()?;
                    (first.clone(), sh.clone())
                }
                Make::Reduce(r) => {
                    let data = (0..first.len())
                        .map(|k| {
                            let xs = group.iter().map(|(v, _)| v[k]);
                            match r {
                                Red::Sum => xs.sum(),
                                Red::Avg => xs.sum::<f64>() / n as f64,
                                Red::Max => xs.fold(f64::NEG_INFINITY, f64::max),
                                Red::Min => xs.fold(f64::INFINITY, f64::min),
                            }
                        })
                        .collect();
                    (data, sh.clone())
                }
                Make::Cat(d, k) => {
                    if d >= sh.len() || sh[d] % k != 0 {
                        return Err(format!("dim {d} of {sh:?} is not {k} blocks"));
                    }
                    let mut split = sh.clone();
                    split[d] /= k;
                    split.insert(d, k);
                    let parts: Vec<Vec<f64>> = group.iter().map(|(v, _)| v.clone()).collect();
                    let mut out = sh.clone();
                    out[d] *= n;
                    (concat(&parts, &split, d + 1), out)
                }
                Make::Unstack(d) => {
                    same()?;
                    if d == 0 || d >= sh.len() || sh[0] % n != 0 {
                        return Err(format!("{sh:?} is no stack of {n} pieces of dim {d}"));
                    }
                    let mut piece = sh.clone();
                    piece[0] /= n;
                    let len: usize = piece.iter().product();
                    let parts: Vec<Vec<f64>> =
                        first.chunks(len.max(1)).map(<[f64]>::to_vec).collect();
                    let mut out = piece.clone();
                    out[d] *= n;
                    (concat(&parts, &piece, d), out)
                }
            });
        }
        cur = next;
    }
    Ok(cur.swap_remove(0))
}

/// The make of an inferred placement on a mesh dim, or `None` where it claims nothing.
pub fn make_of(p: Place) -> Option<Make> {
    match p {
        Place::Replicate => Some(Make::Same),
        Place::Partial(r) => Some(Make::Reduce(r)),
        Place::Shard(_) | Place::Blocked(..) => p.blocks().map(|(d, k)| Make::Cat(d, k)),
        Place::Stacked(d) => Some(Make::Unstack(d as usize)),
        _ => None,
    }
}

fn make_of_input(p: In) -> Make {
    match p {
        In::R => Make::Same,
        In::S(d) => Make::Cat(d, 1),
        In::P(r) => Make::Reduce(r),
    }
}

fn node_of(g: &Graph, name: &str) -> Option<ValueId> {
    g.find(name)
}

/// Equal lengths and every pair within 1e-9 relative to the expected value, NaN matching
/// NaN and an infinity itself (a variance of one element is NaN in spec and ranks alike).
pub fn close(a: &[f64], b: &[f64]) -> bool {
    a.len() == b.len()
        && a.iter().zip(b).all(|(x, y)| {
            (x.is_nan() && y.is_nan()) || x == y || (x - y).abs() <= 1e-9 * (1.0 + y.abs())
        })
}

fn skip(why: impl Into<String>) -> Result<Seen, String> {
    Ok(Seen {
        skipped: Some(why.into()),
        ..Seen::default()
    })
}

/// Runs `prog` with inputs drawn from `seed`: `Err` with the program and placements when an
/// inferred placement does not hold of the values (a soundness bug), else what was seen.
pub fn run(prog: &Program, seed: u64) -> Result<Seen, String> {
    let mesh = &prog.mesh;
    let names = mesh_names(mesh);
    let nranks: usize = mesh.iter().product();
    if prog
        .inputs
        .iter()
        .any(|i| i.elem != Elem::F64 && i.places.iter().any(|p| matches!(p, In::P(_))))
    {
        return skip("a partial integer input");
    }
    let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    let spec_inputs: Vec<(String, Elem, Vec<usize>)> = prog
        .inputs
        .iter()
        .map(|i| (i.name.clone(), i.elem, i.global(mesh)))
        .collect();
    let rank_inputs: Vec<(String, Elem, Vec<usize>)> = prog
        .inputs
        .iter()
        .map(|i| (i.name.clone(), i.elem, i.local.clone()))
        .collect();
    let spec_outs: Vec<String> = prog.checked.iter().map(|c| c.1.clone()).collect();
    let rank_outs: Vec<String> = prog.checked.iter().map(|c| c.0.clone()).collect();
    let write = |name: &str, text: String| std::fs::write(dir.path().join(name), text);
    write("spec.py", graph_text(&spec_inputs, &prog.spec, &spec_outs))
        .map_err(|e| e.to_string())?;
    let mut graphs = Vec::new();
    for r in 0..nranks {
        let body = &prog.ranks[if prog.ranks.len() == 1 { 0 } else { r }];
        write(
            &format!("r{r}.py"),
            graph_text(&rank_inputs, body, &rank_outs),
        )
        .map_err(|e| e.to_string())?;
        graphs.push(format!("r{r}.py"));
    }
    let inputs: Vec<String> = prog
        .inputs
        .iter()
        .map(|i| {
            let per: Vec<String> = i
                .places
                .iter()
                .enumerate()
                .map(|(m, p)| format!("{}: {}", names[m], placement_text(*p)))
                .collect();
            format!("  {}: {{ {} }}", i.name, per.join(", "))
        })
        .collect();
    let mesh_yaml: Vec<String> = mesh
        .iter()
        .enumerate()
        .map(|(m, n)| format!("{}: {n}", names[m]))
        .collect();
    let groups: Vec<String> = names.iter().map(|n| format!("\"{n}\": {n}")).collect();
    let yaml = format!(
        "version: 1\nname: prop\nspec:\n  graph: spec.py\nimpl:\n  mesh: {{ {} }}\n  graphs: [{}]\n  groups: {{ {} }}\ninputs:\n{}\noutputs: {{}}\n",
        mesh_yaml.join(", "),
        graphs.join(", "),
        groups.join(", "),
        inputs.join("\n")
    );
    // Every loss in these programs ignores a negative target (`ignore_index` -100 or -1):
    // where no integer input can be negative, no target is ignored, and the case says so.
    let no_negative_ints = prog
        .inputs
        .iter()
        .all(|i| !matches!(i.elem, Elem::Int(lo, _) if lo < 0));
    let yaml = if no_negative_ints {
        format!("{yaml}assume:\n  ignore-index: unused\n")
    } else {
        yaml
    };
    write("case.yaml", yaml).map_err(|e| e.to_string())?;
    let case = match shardproof_case::load_case(&dir.path().join("case.yaml")) {
        Ok(c) => c,
        Err(e) => return skip(format!("case: {e}")),
    };
    let report = match check_case(&case) {
        Ok(r) => r,
        Err(e) => return skip(format!("check: {e}")),
    };
    let prop = match propagate(&case) {
        Ok(p) => p,
        Err(e) => return skip(format!("propagate: {e}")),
    };
    let mut seen = Seen {
        finding: report
            .findings
            .iter()
            .any(|f| f.check.name() != "postcondition"),
        ..Seen::default()
    };
    // Rank inputs per placement (equal where replicated), and the spec inputs they lay out.
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut rank_leaves = vec![BTreeMap::new(); nranks];
    let mut spec_leaves = BTreeMap::new();
    for i in &prog.inputs {
        let mut drawn: BTreeMap<Vec<usize>, Tensor> = BTreeMap::new();
        let mut data = Vec::new();
        for (r, leaves) in rank_leaves.iter_mut().enumerate() {
            let key: Vec<usize> = coords(mesh, r)
                .iter()
                .zip(&i.places)
                .map(|(&c, p)| if *p == In::R { 0 } else { c })
                .collect();
            let t = drawn
                .entry(key)
                .or_insert_with(|| random_tensor(i.elem, &i.local, &mut rng))
                .clone();
            data.push(t.data.to_vec());
            leaves.insert(i.name.clone(), t);
        }
        let makes: Vec<Make> = i.places.iter().map(|p| make_of_input(*p)).collect();
        let (spec, shape) = assemble(&data, &i.local, mesh, &makes)?;
        let dtype = match i.elem {
            Elem::F64 => DType::F64,
            Elem::Int(..) => DType::I64,
            Elem::Bool => DType::Bool,
        };
        spec_leaves.insert(i.name.clone(), Tensor::new(Meta::new(dtype, shape), spec));
    }
    let cfg = RunConfig::default();
    let spec_env = match run_graph(&case.spec, &spec_leaves, &cfg) {
        Ok(e) => e,
        Err(e) => return skip(format!("spec run: {e}")),
    };
    let envs = match run_program(&case.program, &rank_leaves, &cfg) {
        Ok(e) => e,
        Err(e) => return skip(format!("rank run: {e}")),
    };
    let what = |places: &[Place], rank_name: &str| {
        format!(
            "{rank_name} on mesh {mesh:?}, inputs {:?} -> {places:?}\nspec:\n{}\nrank 0:\n{}",
            prog.inputs
                .iter()
                .map(|i| (&i.name, &i.local, &i.places))
                .collect::<Vec<_>>(),
            prog.spec.join("\n"),
            prog.ranks[0].join("\n")
        )
    };
    for (rank_name, spec_name) in &prog.checked {
        let g0 = &case.program.ranks[0];
        let (Some(v), Some(sv)) = (node_of(g0, rank_name), node_of(&case.spec, spec_name)) else {
            return Err(format!("{rank_name} / {spec_name}: no such node"));
        };
        let places: Vec<Place> = prop.ranks[0].of(v, mesh.len()).to_vec();
        let factor = prop.ranks[0].piece_factor(v, mesh);
        seen.places.push(places.clone());
        seen.factors.push(factor);
        for r in 1..nranks {
            let g = &case.program.ranks[r];
            let vr = node_of(g, rank_name).ok_or("no node")?;
            if prop.ranks[r].of(vr, mesh.len()) != &places[..]
                || prop.ranks[r].piece_factor(vr, mesh) != factor
            {
                return Err(format!(
                    "ranks disagree: rank {r} {:?} {:?}; {}",
                    prop.ranks[r].of(vr, mesh.len()),
                    prop.ranks[r].piece_factor(vr, mesh),
                    what(&places, rank_name)
                ));
            }
        }
        if seen.finding {
            continue;
        }
        // A `Replicate()` mesh dim claims the ranks along it hold equal values, whatever the
        // factor and the other mesh dims' placements: checked even where those decline the
        // claim of the whole value (a placement the factor walk disclaims is still claimed).
        replicas_agree(&case.program, &envs, mesh, rank_name, &places)
            .map_err(|e| format!("{e}: {}", what(&places, rank_name)))?;
        // The spec's value times the claimed factor (local means); no claim where the factor
        // is not known.
        let scale = match factor {
            PieceFactor::Spec => 1.0,
            PieceFactor::Times(f) => f as f64,
            PieceFactor::NotKnown => {
                seen.declined += 1;
                continue;
            }
        };
        let makes: Option<Vec<Make>> = places.iter().map(|p| make_of(*p)).collect();
        let Some(makes) = makes else {
            seen.declined += 1;
            continue;
        };
        // A stack is read alone: beside another mesh dim's layout its order is not stated.
        if makes.iter().any(|m| matches!(m, Make::Unstack(_)))
            && makes
                .iter()
                .any(|m| !matches!(m, Make::Unstack(_) | Make::Same))
        {
            seen.declined += 1;
            continue;
        }
        let Some(want) = spec_env.get(sv) else {
            return skip(format!("spec value {spec_name} not computed"));
        };
        let mut got = Vec::new();
        let mut local = None;
        for (r, env) in envs.iter().enumerate() {
            let g = &case.program.ranks[r];
            let t = node_of(g, rank_name)
                .and_then(|v| env.get(v))
                .ok_or_else(|| format!("rank {r}: {rank_name} not computed"))?;
            local.get_or_insert_with(|| t.meta.shape.clone());
            got.push(t.data.to_vec());
        }
        let local = local.unwrap_or_default();
        let (value, shape) = assemble(&got, &local, mesh, &makes)
            .map_err(|e| format!("{e}: {}", what(&places, rank_name)))?;
        if shape != want.meta.shape {
            return Err(format!(
                "assembled shape {shape:?}, spec {:?}: {}",
                want.meta.shape,
                what(&places, rank_name)
            ));
        }
        let want: Vec<f64> = want.data.iter().map(|x| x * scale).collect();
        if !close(&value, &want) {
            return Err(format!(
                "the ranks' values do not make up the spec value (times {factor:?}): {}",
                what(&places, rank_name)
            ));
        }
        seen.claims += 1;
    }
    Ok(seen)
}

/// Checks that along every mesh dim `places` claims `Replicate()`, the ranks that differ only
/// in that coordinate hold equal values of `name` (NaN matching NaN, as [`close`] reads them).
fn replicas_agree(
    program: &shardproof_ir::Program,
    envs: &[shardproof_interp::Env],
    mesh: &[usize],
    name: &str,
    places: &[Place],
) -> Result<(), String> {
    let value = |r: usize| -> Result<Vec<f64>, String> {
        node_of(&program.ranks[r], name)
            .and_then(|v| envs[r].get(v))
            .map(|t| t.data.to_vec())
            .ok_or_else(|| format!("rank {r}: {name} not computed"))
    };
    let nranks: usize = mesh.iter().product();
    for (m, p) in places.iter().enumerate() {
        if *p != Place::Replicate {
            continue;
        }
        for r in 0..nranks {
            let c = coords(mesh, r);
            if c[m] == 0 {
                continue;
            }
            // The rank at coordinate 0 of mesh dim `m`, every other coordinate the same.
            let stride: usize = mesh[m + 1..].iter().product();
            let first = r - c[m] * stride;
            if !close(&value(r)?, &value(first)?) {
                return Err(format!(
                    "claimed Replicate() on mesh dim {m}, but ranks {first} and {r} differ"
                ));
            }
        }
    }
    Ok(())
}

/// Tallies of many runs, for a property's closing assertion that it checked claims at all.
#[derive(Debug, Default)]
pub struct Tally {
    /// Runs.
    pub runs: usize,
    /// Claims checked.
    pub claims: usize,
    /// Runs with a finding.
    pub findings: usize,
    /// Runs skipped.
    pub skipped: usize,
    /// Instances of a known bug, not run.
    pub known: usize,
    /// The first reason a run was skipped.
    pub first_skip: Option<String>,
}

impl Tally {
    /// Adds one run's result.
    pub fn add(&mut self, s: &Seen) {
        self.runs += 1;
        self.claims += s.claims;
        self.findings += usize::from(s.finding);
        self.skipped += usize::from(s.skipped.is_some());
        if self.first_skip.is_none() {
            self.first_skip.clone_from(&s.skipped);
        }
    }
}

/// A placement strategy for a float input of `rank` dims: replicated, sharded along a dim,
/// or a partial sum.
pub fn placement(rank: usize) -> impl proptest::strategy::Strategy<Value = In> {
    use proptest::prelude::*;
    prop_oneof![
        Just(In::R),
        (0..rank.max(1)).prop_map(In::S),
        Just(In::P(Red::Sum))
    ]
}

/// A mesh: `tp=2`, `tp=3` or `dp=2, tp=2`.
pub fn mesh() -> impl proptest::strategy::Strategy<Value = Vec<usize>> {
    use proptest::prelude::*;
    prop_oneof![
        Just(vec![2usize]),
        Just(vec![3usize]),
        Just(vec![2usize, 2])
    ]
}

/// The proptest configuration of these properties: `cases` cases on a fixed seed, no
/// persistence (deterministic: the same cases on every run). For a longer search by hand,
/// `PROPS_SCALE=k` runs k times the cases and `PROPS_SEED=s` shifts every seed by s.
pub fn config(cases: u32, seed: u64) -> proptest::test_runner::Config {
    let env = |name: &str| std::env::var(name).ok().and_then(|v| v.parse::<u64>().ok());
    let scale = env("PROPS_SCALE").unwrap_or(1).max(1);
    proptest::test_runner::Config {
        cases: cases.saturating_mul(u32::try_from(scale).unwrap_or(u32::MAX)),
        failure_persistence: None,
        rng_seed: proptest::test_runner::RngSeed::Fixed(
            seed.wrapping_add(env("PROPS_SEED").unwrap_or(0)),
        ),
        ..proptest::test_runner::Config::default()
    }
}

/// Whether two inputs of `p` shard the same tensor dim over different sets of mesh dims
/// (dims counted from the right, as broadcasting aligns them): `x {dp: Shard(d)}` beside
/// `y {tp: Shard(d)}` pairs piece i of one with piece j of the other on rank (i, j).
pub fn mixed_mesh_shards(p: &Program) -> bool {
    let sharding = |i: &Input, from_right: usize| -> Vec<usize> {
        let Some(d) = i.local.len().checked_sub(from_right + 1) else {
            return Vec::new();
        };
        (0..p.mesh.len())
            .filter(|&m| i.places[m] == In::S(d))
            .collect()
    };
    let rank = p.inputs.iter().map(|i| i.local.len()).max().unwrap_or(0);
    (0..rank).any(|k| {
        let sets: Vec<Vec<usize>> = p
            .inputs
            .iter()
            .map(|i| sharding(i, k))
            .filter(|s| !s.is_empty())
            .collect();
        sets.windows(2).any(|w| w[0] != w[1])
    })
}

/// The inputs of a one-operator program from drawn sizes: (name, elements, local shape).
pub type Inputs = fn(&[usize]) -> Vec<(&'static str, Elem, Vec<usize>)>;

/// The body lines of a one-operator program given its inputs' shapes (the ranks' local
/// shapes, or the spec's global ones) and the drawn sizes (for literals other than sizes,
/// the same in spec and ranks); `None` when the shapes do not fit the operator.
pub type Body = fn(&[Vec<usize>], &[usize]) -> Option<Vec<String>>;

/// A one-operator program family: its inputs, its body, and the values checked (the same
/// names in spec and ranks).
pub struct Op {
    /// Shown in failures.
    pub name: &'static str,
    /// The inputs.
    pub inputs: Inputs,
    /// The body.
    pub body: Body,
    /// The checked values.
    pub checked: &'static [&'static str],
    /// Instances of a known bug (each pinned by an ignored regression test), given the
    /// program and the drawn sizes: not run by [`property`].
    pub known_bug: Option<fn(&Program, &[usize]) -> bool>,
}

/// `op`'s program on `mesh` with the drawn `sizes` and per-input placements `places`
/// (a shard of a dim the input lacks is of dim `d mod rank`, a 0-d input's is replicated, an
/// integer input is never partial); `None` where spec or ranks do not fit the shapes.
pub fn op_program(op: &Op, mesh: &[usize], sizes: &[usize], places: &[Vec<In>]) -> Option<Program> {
    let inputs: Vec<Input> = (op.inputs)(sizes)
        .into_iter()
        .enumerate()
        .map(|(i, (name, elem, local))| {
            let rank = local.len();
            let ps = (0..mesh.len())
                .map(|m| {
                    match places
                        .get(i)
                        .and_then(|p| p.get(m))
                        .copied()
                        .unwrap_or(In::R)
                    {
                        In::S(_) if rank == 0 => In::R,
                        In::S(d) => In::S(d % rank),
                        In::P(_) if elem != Elem::F64 => In::R,
                        p => p,
                    }
                })
                .collect();
            Input {
                name: name.into(),
                elem,
                local,
                places: ps,
            }
        })
        .collect();
    let local: Vec<Vec<usize>> = inputs.iter().map(|i| i.local.clone()).collect();
    let global: Vec<Vec<usize>> = inputs.iter().map(|i| i.global(mesh)).collect();
    let rank_body = (op.body)(&local, sizes)?;
    let spec = (op.body)(&global, sizes)?;
    Some(Program {
        mesh: mesh.to_vec(),
        inputs,
        spec,
        ranks: vec![rank_body],
        checked: op
            .checked
            .iter()
            .map(|c| (c.to_string(), c.to_string()))
            .collect(),
    })
}

/// Runs `cases` random instances of `op` (fixed seed `seed`): meshes `tp=2`, `tp=3`,
/// `dp=2,tp=2`, sizes 1..=3, every input's placement per mesh dim drawn; panics on a claim the
/// values contradict. Returns the tally.
pub fn property(op: &Op, cases: u32, seed: u64) -> Tally {
    use proptest::prelude::*;
    use proptest::test_runner::TestRunner;
    let strategy = (
        mesh(),
        proptest::collection::vec(1usize..=3, 6),
        proptest::collection::vec(proptest::collection::vec(placement(3), 2), 8),
        proptest::collection::vec(any::<bool>(), 8),
        any::<u64>(),
    );
    let mut runner = TestRunner::new(config(cases, seed));
    let tally = std::cell::RefCell::new(Tally::default());
    let result = runner.run(&strategy, |(mesh, sizes, mut places, tied, seed)| {
        // Half the inputs take the first input's placement: operands placed alike, which
        // independent draws rarely give to an operator of many inputs.
        for i in 1..places.len() {
            if tied[i] {
                places[i] = places[0].clone();
            }
        }
        let Some(prog) = op_program(op, &mesh, &sizes, &places) else {
            tally.borrow_mut().runs += 1;
            return Ok(());
        };
        if std::env::var_os("PROPS_RUN_KNOWN").is_none()
            && op.known_bug.is_some_and(|known| known(&prog, &sizes))
        {
            tally.borrow_mut().known += 1;
            return Ok(());
        }
        let seen =
            run(&prog, seed).map_err(|e| TestCaseError::fail(format!("{}: {e}", op.name)))?;
        tally.borrow_mut().add(&seen);
        Ok(())
    });
    if let Err(e) = result {
        panic!("{e}");
    }
    let t = tally.into_inner();
    eprintln!("{}: {t:?}", op.name);
    t
}

/// Runs `op` once with the given placements and sizes; panics on a contradicted claim.
pub fn once(op: &Op, mesh: &[usize], sizes: &[usize], places: &[Vec<In>], seed: u64) -> Seen {
    let prog = op_program(op, mesh, sizes, places).expect("the shapes fit the operator");
    run(&prog, seed).unwrap_or_else(|e| panic!("{}: {e}", op.name))
}
