//! Ring placements agree with the interpreter. Random rings on `cp = n` pass the pieces of a
//! row-sharded `k` and `v` along the ring (each step to a random distance, sometimes not
//! every step), concatenate them in a random order (sometimes the same for both, sometimes a
//! piece of the wrong tensor), and run scaled dot-product attention of the rank's queries
//! over them (softmax over the keys, or a plain `exp`, or a softmax over the queries, and a
//! log-sum-exp over the keys). Every rank runs in the reference interpreter with the pieces
//! of random global tensors, and every placement the checker infers must hold of the values:
//! `Shard(d)` is the rank's piece of the single-device value, `Replicate()` is the value,
//! `Permuted(p, code, base)` is the value with dim `p`'s pieces in the order `code` gives for
//! the rank, then `base`. A program that holds computes the single-device attention.

use proptest::prelude::*;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use shardproof_check::{check_case, perm_offsets, plan::parse_plan, propagate, Place, Verdict};
use shardproof_interp::{run_program, RunConfig};
use shardproof_ir::ValueId;
use shardproof_ops::Tensor;
use std::collections::BTreeMap;
use std::path::Path;

mod common;
use common::values::{close, random};

/// A row-major matrix.
#[derive(Clone, Debug)]
struct Mat {
    rows: usize,
    cols: usize,
    data: Vec<f64>,
}

impl Mat {
    fn at(&self, i: usize, j: usize) -> f64 {
        self.data[i * self.cols + j]
    }
    fn t(&self) -> Mat {
        let mut data = Vec::with_capacity(self.data.len());
        for j in 0..self.cols {
            for i in 0..self.rows {
                data.push(self.at(i, j));
            }
        }
        Mat {
            rows: self.cols,
            cols: self.rows,
            data,
        }
    }
    fn mm(&self, o: &Mat) -> Mat {
        let mut data = vec![0.0; self.rows * o.cols];
        for i in 0..self.rows {
            for j in 0..o.cols {
                data[i * o.cols + j] = (0..self.cols).map(|k| self.at(i, k) * o.at(k, j)).sum();
            }
        }
        Mat {
            rows: self.rows,
            cols: o.cols,
            data,
        }
    }
    fn map(&self, f: impl Fn(f64) -> f64) -> Mat {
        Mat {
            rows: self.rows,
            cols: self.cols,
            data: self.data.iter().map(|&x| f(x)).collect(),
        }
    }
    /// Softmax along `dim` (0: down the columns, 1: along the rows).
    fn softmax(&self, dim: usize) -> Mat {
        let m = if dim == 1 { self.clone() } else { self.t() };
        let mut data = Vec::with_capacity(m.data.len());
        for i in 0..m.rows {
            let row = &m.data[i * m.cols..(i + 1) * m.cols];
            let mx = row.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let s: f64 = row.iter().map(|x| (x - mx).exp()).sum();
            data.extend(row.iter().map(|x| (x - mx).exp() / s));
        }
        let out = Mat { data, ..m };
        if dim == 1 {
            out
        } else {
            out.t()
        }
    }
    /// Log-sum-exp along dim 1, kept: `[rows, 1]`.
    fn logsumexp(&self) -> Mat {
        let data = (0..self.rows)
            .map(|i| {
                let row = &self.data[i * self.cols..(i + 1) * self.cols];
                let mx = row.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                mx + row.iter().map(|x| (x - mx).exp()).sum::<f64>().ln()
            })
            .collect();
        Mat {
            rows: self.rows,
            cols: 1,
            data,
        }
    }
    /// Rows `a..b`.
    fn rows(&self, a: usize, b: usize) -> Mat {
        Mat {
            rows: b - a,
            cols: self.cols,
            data: self.data[a * self.cols..b * self.cols].to_vec(),
        }
    }
    /// Columns `a..b`.
    fn cols(&self, a: usize, b: usize) -> Mat {
        self.t().rows(a, b).t()
    }
}

/// One random ring program, its plan text and which values it names.
struct Ring {
    text: String,
    /// The activation: 0 softmax over the keys, 1 exp, 2 softmax over the queries.
    act: usize,
}

/// A ring of `k` (or `v`) pieces: the names of the pieces collected, in the order the plan
/// concatenates them, and the plan lines that pass them.
fn ring_pieces(
    x: &str,
    rows: usize,
    cols: usize,
    (n, steps): (usize, usize),
    rng: &mut ChaCha8Rng,
    tag: &mut usize,
    lines: &mut Vec<String>,
) -> Vec<String> {
    let mut pieces = vec![x.to_string()];
    let mut prev = x.to_string();
    for s in 0..steps {
        // Usually one step along the ring, sometimes further.
        let dist = if n > 2 && rng.random_bool(0.2) { 2 } else { 1 };
        let name = format!("{x}_{s}");
        lines.push(format!("send({prev}, cp=+{dist}, tag={tag})"));
        lines.push(format!(
            "{name} = recv(f64[{rows}, {cols}], cp=-{dist}, tag={tag})"
        ));
        *tag += 1;
        prev = name.clone();
        pieces.push(name);
    }
    pieces
}

fn program(n: usize, l: usize, d: usize, e: usize, rng: &mut ChaCha8Rng) -> Ring {
    let mut lines = vec![
        "mesh cp=".to_string() + &n.to_string(),
        format!("input q: f64[{}, {d}] cp=Shard(0)", n * l),
        format!("input k: f64[{}, {d}] cp=Shard(0)", n * l),
        format!("input v: f64[{}, {e}] cp=Shard(0)", n * l),
    ];
    let mut tag = 0;
    // Usually every step, sometimes one short.
    let steps = if rng.random_bool(0.8) { n - 1 } else { n - 2 };
    let mut kp = ring_pieces("k", l, d, (n, steps), rng, &mut tag, &mut lines);
    let mut vp = ring_pieces("v", l, e, (n, steps), rng, &mut tag, &mut lines);
    // The keys' order, and the values' (usually the same order).
    let mut order: Vec<usize> = (0..kp.len()).collect();
    order.shuffle(rng);
    kp = order.iter().map(|&i| kp[i].clone()).collect();
    if vp.len() == order.len() && rng.random_bool(0.7) {
        vp = order.iter().map(|&i| vp[i].clone()).collect();
    } else {
        vp.shuffle(rng);
    }
    // Sometimes a piece of the keys where a value belongs.
    if d == e && rng.random_bool(0.1) {
        let i = rng.random_range(0..vp.len());
        vp[i] = kp[rng.random_range(0..kp.len())].clone();
    }
    lines.push(format!("keys = cat([{}], 0)", kp.join(", ")));
    lines.push(format!("values = cat([{}], 0)", vp.join(", ")));
    lines.push("kt = t(keys)".into());
    lines.push("s = mm(q, kt)".into());
    lines.push("s2 = mul(s, 0.5)".into());
    let act = rng.random_range(0..3);
    lines.push(match act {
        0 => "p = softmax(s2, -1)".into(),
        1 => "p = exp(s2)".into(),
        _ => "p = softmax(s2, 0)".into(),
    });
    lines.push("lse = logsumexp(s2, [1], True)".into());
    lines.push("o = mm(p, values)".into());
    lines.push("output o cp=Shard(0)".into());
    lines.push("output lse cp=Shard(0)".into());
    Ring {
        text: lines.join("\n") + "\n",
        act,
    }
}

/// The rows of `m` whose pieces along `dim` (of `n` pieces) are in the order `offsets` gives
/// for coordinate `r`, put back in piece order.
fn unpermute(m: &Mat, dim: usize, offsets: &[usize], r: usize) -> Mat {
    let n = offsets.len();
    let m = if dim == 0 { m.clone() } else { m.t() };
    let piece = m.rows / n;
    let mut blocks: Vec<Option<Mat>> = vec![None; n];
    for (t, &k) in offsets.iter().enumerate() {
        blocks[(r + k) % n] = Some(m.rows(t * piece, (t + 1) * piece));
    }
    let data: Vec<f64> = blocks.into_iter().flat_map(|b| b.unwrap().data).collect();
    let out = Mat { data, ..m };
    if dim == 0 {
        out
    } else {
        out.t()
    }
}

/// Whether `local` on coordinate `r` of `n` is what `place` says of the single-device
/// `global`: `None` where the placement claims nothing checkable here.
fn holds(place: Place, local: &Mat, global: &Mat, r: usize, n: usize) -> Option<bool> {
    let piece = |d: usize, g: &Mat| -> Mat {
        if d == 0 {
            let p = g.rows / n;
            g.rows(r * p, (r + 1) * p)
        } else {
            let p = g.cols / n;
            g.cols(r * p, (r + 1) * p)
        }
    };
    let same = |a: &Mat, b: &Mat| a.rows == b.rows && a.cols == b.cols && close(&a.data, &b.data);
    match place {
        Place::Replicate => Some(same(local, global)),
        Place::Shard(d) => Some(same(local, &piece(d as usize, global))),
        Place::Permuted(p, code, base) => {
            let offsets = perm_offsets(code, n).expect("a permutation of the mesh dim");
            let dims = [local.rows, local.cols];
            if !dims[p as usize].is_multiple_of(n) {
                return Some(false);
            }
            let back = unpermute(local, p as usize, &offsets, r);
            Some(match base {
                u8::MAX => same(&back, global),
                b => same(&back, &piece(b as usize, global)),
            })
        }
        _ => None,
    }
}

fn to_mat(t: &Tensor) -> Mat {
    let (rows, cols) = match t.meta.shape.as_slice() {
        [r, c] => (*r, *c),
        [r] => (*r, 1),
        _ => (1, 1),
    };
    Mat {
        rows,
        cols,
        data: t.data.to_vec(),
    }
}

/// Runs one random ring; returns (claims checked, whether it held with a `Permuted` claim).
fn instance(
    n: usize,
    l: usize,
    d: usize,
    e: usize,
    seed: u64,
) -> Result<(usize, bool), TestCaseError> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let ring = program(n, l, d, e, &mut rng);
    let case = parse_plan(Path::new("ring.plan"), &ring.text)
        .map_err(|err| TestCaseError::fail(format!("{err}\n{}", ring.text)))?;
    let prop = propagate(&case).map_err(|err| TestCaseError::fail(format!("{err}")))?;
    let report = check_case(&case).map_err(|err| TestCaseError::fail(format!("{err}")))?;
    let (q, k, v) = (
        random(&[n * l, d], &mut rng),
        random(&[n * l, d], &mut rng),
        random(&[n * l, e], &mut rng),
    );
    let leaves: Vec<BTreeMap<String, Tensor>> = (0..n)
        .map(|r| {
            let piece = |t: &Tensor, c: usize| {
                let m = to_mat(t).rows(r * l, (r + 1) * l);
                Tensor::new(shardproof_ops::Meta::new(t.meta.dtype, vec![l, c]), m.data)
            };
            BTreeMap::from([
                ("q".to_string(), piece(&q, d)),
                ("k".to_string(), piece(&k, d)),
                ("v".to_string(), piece(&v, e)),
            ])
        })
        .collect();
    let envs = run_program(&case.program, &leaves, &RunConfig::default())
        .map_err(|err| TestCaseError::fail(format!("{err}\n{}", ring.text)))?;
    // The single-device values.
    let (qm, km, vm) = (to_mat(&q), to_mat(&k), to_mat(&v));
    let s2 = qm.mm(&km.t()).map(|x| x * 0.5);
    let p = match ring.act {
        0 => s2.softmax(1),
        1 => s2.map(f64::exp),
        _ => s2.softmax(0),
    };
    let spec: BTreeMap<&str, Mat> = BTreeMap::from([
        ("keys", km.clone()),
        ("values", vm.clone()),
        ("kt", km.t()),
        ("s2", s2.clone()),
        ("p", p.clone()),
        ("lse", s2.logsumexp()),
        ("o", p.mm(&vm)),
    ]);
    let mut checked = 0;
    let mut permuted = false;
    for (r, env) in envs.iter().enumerate() {
        let g = &case.program.ranks[r];
        for (name, global) in &spec {
            // A softmax over the sharded queries is a finding: what follows claims nothing.
            if ring.act == 2 && matches!(*name, "p" | "o") {
                continue;
            }
            let Some(i) = g.nodes.iter().position(|nd| nd.name == *name) else {
                continue;
            };
            let v = ValueId::new(i, 0);
            let place = prop.ranks[r].of(v, 1)[0];
            permuted |= matches!(place, Place::Permuted(..));
            let Some(local) = env.get(v).map(to_mat) else {
                continue;
            };
            if let Some(ok) = holds(place, &local, global, r, n) {
                checked += 1;
                prop_assert!(
                    ok,
                    "rank {r}: `{name}` inferred {place}, which its values are not\n{}",
                    ring.text
                );
            }
        }
    }
    // A program that holds computes the single-device attention (checked above for `o`
    // and `lse`, whose declared `Shard(0)` it proved).
    if report.verdict == Verdict::Holds {
        for r in 0..n {
            let g = &case.program.ranks[r];
            for name in ["o", "lse"] {
                let i = g.nodes.iter().position(|nd| nd.name == name).unwrap();
                let place = prop.ranks[r].of(ValueId::new(i, 0), 1)[0];
                prop_assert_eq!(place, Place::Shard(0), "{}", ring.text);
            }
        }
    }
    Ok((checked, report.verdict == Verdict::Holds && permuted))
}

#[test]
fn ring_placements_agree_with_the_interpreter() {
    let mut rng = ChaCha8Rng::seed_from_u64(44);
    let (mut checked, mut held) = (0, 0);
    let cases = 150;
    for _ in 0..cases {
        let n = rng.random_range(2..=4);
        let (l, d, e) = (
            rng.random_range(1..=3),
            rng.random_range(2..=3),
            rng.random_range(2..=3),
        );
        let seed = rng.random();
        match instance(n, l, d, e, seed) {
            Ok((c, h)) => {
                checked += c;
                held += usize::from(h);
            }
            Err(err) => panic!("n={n} l={l} d={d} e={e} seed={seed}: {err}"),
        }
    }
    // Not vacuous: most rings are correct, and those hold through their permuted keys.
    // About a quarter are correct rings (every step, one order, attention over the keys).
    assert!(held >= cases / 6, "only {held} of {cases} rings held");
    assert!(checked > cases * 10, "only {checked} claims checked");
}
