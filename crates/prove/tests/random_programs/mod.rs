//! Small random tensor-parallel programs for checking shape reduction against full size: a
//! column-parallel `mm` followed by a random chain of elementwise operators, literals and
//! row reductions, some of them written as a plan would (a local reduction and an
//! `all_reduce`, a mean as a sum times a literal, an average as a sum times `1/tp`), some of
//! them wrong (the `all_reduce` left out, a literal off by the mesh size).

use shardproof_case::Case;
use shardproof_interp::{run_graph, run_program, RunConfig};
use shardproof_ir::DType;
use shardproof_ops::{Meta, Tensor};
use shardproof_prove::{prove_case, Proof, ProveConfig};
use std::collections::BTreeMap;
use std::fmt::Write;
use std::path::Path;

/// A splitmix64 stream: the programs are the same on every machine.
pub struct Rng(u64);

impl Rng {
    /// A stream from `seed`.
    pub fn new(seed: u64) -> Self {
        Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ 0x2545_f491_4f6c_dd1d)
    }

    /// The next 64 random bits.
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A number below `n`.
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    /// A uniform number in [-1, 1).
    pub fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64 * 2.0 - 1.0
    }
}

/// One generated program: the case's files.
pub struct Program {
    /// The spec graph's text.
    pub spec: String,
    /// The ranks' graph's text (both ranks run it).
    pub rank: String,
    /// The case file.
    pub case: String,
    /// The operators of the chain, in words.
    pub ops: Vec<String>,
}

/// A random program on a `tp: 2` mesh: `x [b, h] @ w [h, f]` with `w` column-sharded, then
/// `steps` random operators.
pub fn program(rng: &mut Rng, steps: usize) -> Program {
    let b = [2, 3, 4][rng.below(3) as usize];
    let h = [2, 4, 6][rng.below(3) as usize];
    let f = [4, 8, 12, 16][rng.below(4) as usize];
    let lf = f / 2;
    let mut spec = String::new();
    let mut rank = String::new();
    let head = |out: &mut String, f: usize| {
        let _ = writeln!(out, "class GraphModule(torch.nn.Module):");
        let _ = writeln!(
            out,
            "    def forward(self, x: \"f32[{b}, {h}]\", w: \"f32[{h}, {f}]\"):"
        );
        let _ = writeln!(
            out,
            "        v0: \"f32[{b}, {f}]\" = torch.ops.aten.mm.default(x, w)"
        );
    };
    head(&mut spec, f);
    head(&mut rank, lf);
    let mut ops = Vec::new();
    // The current width: `f` (sharded on the ranks) until a row reduction makes it 1.
    let mut wide = true;
    let (mut s, mut r) = (0usize, 0usize);
    let shape = |wide: bool, cols: usize| {
        if wide {
            format!("f32[{b}, {cols}]")
        } else {
            format!("f32[{b}, 1]")
        }
    };
    let literals = ["0.5", "0.25", "3.0", "0.125", "2.0"];
    for _ in 0..steps {
        let pick = rng.below(if wide { 9 } else { 5 });
        let ss = shape(wide, f);
        let rs = shape(wide, lf);
        match pick {
            0..=4 => {
                let (call, word) = match pick {
                    0 => (
                        "torch.ops.aten.relu.default(P)".to_string(),
                        "relu".to_string(),
                    ),
                    1 => (
                        "torch.ops.aten.tanh.default(P)".to_string(),
                        "tanh".to_string(),
                    ),
                    2 => {
                        let c = literals[rng.below(5) as usize];
                        (
                            format!("torch.ops.aten.mul.Tensor(P, {c})"),
                            format!("mul {c}"),
                        )
                    }
                    3 => {
                        let c = literals[rng.below(5) as usize];
                        (
                            format!("torch.ops.aten.add.Tensor(P, {c})"),
                            format!("add {c}"),
                        )
                    }
                    _ => (
                        "torch.ops.aten.mul.Tensor(P, P)".to_string(),
                        "square".to_string(),
                    ),
                };
                let _ = writeln!(
                    spec,
                    "        v{}: \"{ss}\" = {}",
                    s + 1,
                    call.replace('P', &format!("v{s}"))
                );
                let _ = writeln!(
                    rank,
                    "        v{}: \"{rs}\" = {}",
                    r + 1,
                    call.replace('P', &format!("v{r}"))
                );
                s += 1;
                r += 1;
                ops.push(word);
            }
            _ => {
                // A row reduction over the sharded dim, written four ways in the ranks.
                let variant = pick - 5;
                let bug = rng.below(4) == 0;
                let _ = writeln!(
                    spec,
                    "        v{}: \"f32[{b}, 1]\" = torch.ops.aten.mean.dim(v{s}, [1], True)",
                    s + 1
                );
                s += 1;
                let red = format!("f32[{b}, 1]");
                let mut line = |text: &str| {
                    let _ = writeln!(
                        rank,
                        "        v{}: \"{red}\" = {}",
                        r + 1,
                        text.replace('P', &format!("v{r}"))
                    );
                    r += 1;
                };
                match variant {
                    0 => {
                        // mean, then the average over tp (left out by the bug).
                        line("torch.ops.aten.mean.dim(P, [1], True)");
                        if !bug {
                            line("torch.ops._c10d_functional.all_reduce.default(P, 'avg', '0')");
                            line("torch.ops._c10d_functional.wait_tensor.default(P)");
                        }
                        ops.push(format!(
                            "mean+avg{}",
                            if bug { " (no all_reduce)" } else { "" }
                        ));
                    }
                    1 => {
                        // sum, all_reduce sum, times the literal 1/f (off by tp when buggy).
                        let c = if bug { 1.0 / lf as f64 } else { 1.0 / f as f64 };
                        line("torch.ops.aten.sum.dim_IntList(P, [1], True)");
                        line("torch.ops._c10d_functional.all_reduce.default(P, 'sum', '0')");
                        line("torch.ops._c10d_functional.wait_tensor.default(P)");
                        line(&format!("torch.ops.aten.mul.Tensor(P, {c:?})"));
                        ops.push(format!("sum+allreduce*{c:?}"));
                    }
                    2 => {
                        // local mean, all_reduce sum, times 1/tp (a literal naming the mesh).
                        let c = if bug { 0.25 } else { 0.5 };
                        line("torch.ops.aten.mean.dim(P, [1], True)");
                        line("torch.ops._c10d_functional.all_reduce.default(P, 'sum', '0')");
                        line("torch.ops._c10d_functional.wait_tensor.default(P)");
                        line(&format!("torch.ops.aten.mul.Tensor(P, {c:?})"));
                        ops.push(format!("mean+allreduce*{c:?}"));
                    }
                    _ => {
                        // local sum divided by the local width's literal, then the average.
                        let c = if bug { f as f64 } else { lf as f64 };
                        line("torch.ops.aten.sum.dim_IntList(P, [1], True)");
                        line(&format!("torch.ops.aten.div.Tensor(P, {c:?})"));
                        line("torch.ops._c10d_functional.all_reduce.default(P, 'avg', '0')");
                        line("torch.ops._c10d_functional.wait_tensor.default(P)");
                        ops.push(format!("sum/{c:?}+avg"));
                    }
                }
                wide = false;
            }
        }
    }
    let _ = writeln!(spec, "        return (v{s},)");
    let _ = writeln!(rank, "        return (v{r},)");
    let out = if wide { "Shard(1)" } else { "Replicate()" };
    let case = format!(
        "version: 1\nname: random\nspec:\n  graph: spec.py\nimpl:\n  mesh: {{ tp: 2 }}\n  graphs: [rank.py, rank.py]\ninputs:\n  x: Replicate()\n  w: Shard(1)\noutputs:\n  v{s}: {{ impl: v{r}, placement: {out} }}\n"
    );
    Program {
        spec,
        rank,
        case,
        ops,
    }
}

/// Writes the program's files into `dir` and loads its case.
pub fn load(p: &Program, dir: &Path) -> Case {
    std::fs::write(dir.join("spec.py"), &p.spec).unwrap();
    std::fs::write(dir.join("rank.py"), &p.rank).unwrap();
    std::fs::write(dir.join("case.yaml"), &p.case).unwrap();
    shardproof_case::load_case(&dir.join("case.yaml")).unwrap()
}

/// Whether the interpreter, at the case's sizes and on random inputs, finds the rebuilt
/// output different from the spec's.
pub fn differs_at_full_size(case: &Case, rng: &mut Rng) -> bool {
    let cfg = RunConfig::default();
    let x = case.spec.find("x").unwrap();
    let w = case.spec.find("w").unwrap();
    let shape = |v| {
        case.spec
            .recorded_type(v)
            .and_then(|t| t.concrete_shape())
            .unwrap()
            .iter()
            .map(|&d| d as usize)
            .collect::<Vec<_>>()
    };
    let random = |shape: Vec<usize>, rng: &mut Rng| {
        let n = shape.iter().product();
        Tensor::new(
            Meta::new(DType::F32, shape),
            (0..n).map(|_| rng.unit()).collect(),
        )
    };
    let xt = random(shape(x), rng);
    let wt = random(shape(w), rng);
    let (hh, ff) = (wt.shape()[0], wt.shape()[1]);
    let spec_leaves =
        BTreeMap::from([("x".to_string(), xt.clone()), ("w".to_string(), wt.clone())]);
    let spec = run_graph(&case.spec, &spec_leaves, &cfg).unwrap();
    let exp = &case.outputs[0];
    let want = spec.get(exp.spec_value).unwrap();
    let half = ff / 2;
    let leaves: Vec<BTreeMap<String, Tensor>> = (0..2)
        .map(|k| {
            let piece: Vec<f64> = (0..hh)
                .flat_map(|i| (0..half).map(move |j| (i, j)))
                .map(|(i, j)| wt.data[i * ff + k * half + j])
                .collect();
            BTreeMap::from([
                ("x".to_string(), xt.clone()),
                (
                    "w".to_string(),
                    Tensor::new(Meta::new(DType::F32, vec![hh, half]), piece),
                ),
            ])
        })
        .collect();
    let envs = run_program(&case.program, &leaves, &cfg).unwrap();
    let outs: Vec<&Tensor> = exp
        .rank_values
        .iter()
        .map(|&(rk, v)| envs[rk].get(v).unwrap())
        .collect();
    let rebuilt: Vec<f64> = if outs[0].shape() == want.shape() {
        outs[0].data.to_vec()
    } else {
        let (rows, cols) = (want.shape()[0], outs[0].shape()[1]);
        (0..rows)
            .flat_map(|i| (0..2).flat_map(move |k| (0..cols).map(move |j| (i, k, j))))
            .map(|(i, k, j)| outs[k].data[i * cols + j])
            .collect()
    };
    want.data
        .iter()
        .zip(&rebuilt)
        .any(|(a, b)| (a - b).abs() > 1e-6 * (1.0 + a.abs().max(b.abs())))
}

/// The proofs of the shape-reduced and the full-size case, and whether the interpreter finds
/// a difference at full size on random inputs.
pub fn verdicts(case: &Case, rng: &mut Rng) -> (Proof, Proof, bool) {
    let reduced = prove_case(case, &ProveConfig::default());
    let full = prove_case(
        case,
        &ProveConfig {
            reduce: false,
            ..ProveConfig::default()
        },
    );
    (reduced, full, differs_at_full_size(case, rng))
}
