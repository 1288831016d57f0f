//! Ring attention's accumulation form (`attention.rs`, issue 44) against the interpreter.
//!
//! Each of `n` cp ranks picks its Megatron chunks `i` and `2n-1-i` of replicated queries,
//! keys and values `[BH, S, D]` (`slice` + `cat`) and their global positions (`arange` +
//! `cat`), and runs the zoo's ring: at step `t` it holds the keys and values of rank `i - t`,
//! computes the visible part of that block (step 0 with the causal mask of the global
//! positions) and merges it into its running output by the log-sum-exp rule. The output is
//! `sum(out * out)` summed over cp by an all-reduce, declared `Replicate()`; the spec computes the causal attention of
//! the whole sequence in one block. The checker's claims (`Rows(1, Q)` for the ring's output,
//! holds for the case) must be the interpreter's values, and every planted bug (a wrong merge,
//! a step skipped or counted twice, a wrong peer or direction, a mask on local positions or
//! none, values of another block, another scale, the output rows out of order) is refused.
//! Each rank also names its final log-sum-exp (`lse_fin`) and runs the zoo's backward of the
//! queries over the same blocks for an output gradient `go` (`dq_fin`): both claims are
//! checked against values computed here from the leaves, and the gradient's planted bugs
//! (`GradBug`) are refused.

use proptest::prelude::*;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use shardproof_check::{check_case, propagate, Place, Verdict};
use shardproof_interp::{run_graph, run_program, RunConfig};
use shardproof_ir::ValueId;
use shardproof_ops::Tensor;
use std::collections::BTreeMap;

mod common;
use common::values::{close, random, ty};

const BH: usize = 2;
const D: usize = 2;
const SCALE: f64 = 0.5;

/// A planted bug (or none).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Bug {
    None,
    /// `out' = out + o`, `lse' = lse`: the log-sum-exp correction dropped.
    NoCorrection,
    /// `m = maximum(lse, lse)`: the wrong maximum (numerically harmless, structurally wrong).
    WrongMax,
    /// The last ring step is received and passed on but not merged.
    StepSkipped,
    /// The last step's block merged twice.
    ChunkTwice,
    /// The last rank receives its first block from rank 0 instead of its predecessor (rank 0
    /// sends to two ranks).
    WrongPeer,
    /// Blocks go from rank `i + 1` to rank `i` (the parts still computed for `i - t`).
    WrongDirection,
    /// Every step's mask is `triu(-inf, 1)` of the block's local indices (catalog
    /// `cp-causal-mask-local`; on step 0 it is the causal mask, the rank's positions rising).
    LocalTriu,
    /// Step 0's mask compares the keys' global positions with the queries' local ones
    /// (`arange(0, L)`).
    LocalPositions,
    /// Step 0 without a mask.
    NoMask,
    /// From step 1 on, the values are the rank's own, not the received ones.
    StaleValues,
    /// Step 1 scales its scores by another number.
    OtherScale,
    /// The final concatenation of a half-merged output in the wrong order.
    SwappedHalves,
    /// The output's two chunks swapped after the ring (`cat` of its slices, second first).
    RowsRotated,
    /// The merge shifts the new block's log-sum-exp by the running one, not by the maximum:
    /// `exp(lo - lse)` (both the weights and the log-sum-exp are wrong).
    OtherShift,
}

/// A planted bug of the queries' gradient (the ring backward's `dq`), or none.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum GradBug {
    None,
    /// The last step's block product is added twice.
    Twice,
    /// The last step's block product is not added.
    Skipped,
    /// A step that computes the second half of the queries adds its product to the first.
    WrongRows,
    /// Each block is normalized by the first step's log-sum-exp (the rank's diagonal block),
    /// not the ring's final one.
    BlockLse,
    /// `D = sum(dO * Q)` instead of `sum(dO * O)`.
    DeltaOfQueries,
    /// From step 1 on, `dO V^T` takes the rank's own values.
    StaleValues,
    /// `dS` without the `- D` term.
    NoDelta,
    /// The last step's `dS` scaled by another number.
    OtherScale,
    /// From step 1 on, `dS K` takes the rank's own keys.
    StaleKeys,
    /// The output gradient's chunks picked in the wrong order (the second chunk first).
    SwappedGradRows,
    /// A step of the second half of the queries normalized by the first half's rows of the
    /// log-sum-exp.
    WrongNormRows,
    /// `D = sum(O * O)`: the output where the output gradient belongs.
    DeltaOfOutput,
    /// The backward's scores recomputed with the keys as queries (the same rows).
    OtherQueries,
    /// The backward's scores and `dS` scaled by another number than the forward's, alike on
    /// every step.
    OtherForwardScale,
}

const GRAD_BUGS: [GradBug; 14] = [
    GradBug::WrongNormRows,
    GradBug::DeltaOfOutput,
    GradBug::OtherQueries,
    GradBug::OtherForwardScale,
    GradBug::StaleKeys,
    GradBug::SwappedGradRows,
    GradBug::Twice,
    GradBug::Skipped,
    GradBug::WrongRows,
    GradBug::BlockLse,
    GradBug::DeltaOfQueries,
    GradBug::StaleValues,
    GradBug::NoDelta,
    GradBug::OtherScale,
];

const BUGS: [Bug; 14] = [
    Bug::OtherShift,
    Bug::RowsRotated,
    Bug::NoCorrection,
    Bug::WrongMax,
    Bug::StepSkipped,
    Bug::ChunkTwice,
    Bug::WrongPeer,
    Bug::WrongDirection,
    Bug::LocalTriu,
    Bug::LocalPositions,
    Bug::NoMask,
    Bug::StaleValues,
    Bug::OtherScale,
    Bug::SwappedHalves,
];

/// Lines of one graph, named as fx names them (the operator, then `_1`, `_2`, ..): the
/// output comparison pairs a rank's replicated operands with its peers' by name.
#[derive(Default)]
struct Lines {
    body: Vec<String>,
    seen: BTreeMap<String, usize>,
}

impl Lines {
    fn push(&mut self, shape: &[usize], dtype: &str, call: String) -> String {
        let op = call.split('.').nth(1).unwrap_or("x").to_string();
        let k = self.seen.entry(op.clone()).or_insert(0);
        let name = if *k == 0 { op } else { format!("{op}_{k}") };
        *k += 1;
        self.body
            .push(format!("{name}: \"{dtype}{shape:?}\" = torch.ops.{call}"));
        name
    }
    fn f(&mut self, shape: &[usize], call: String) -> String {
        self.push(shape, "f64", call)
    }
}

/// Which part of the rank's two chunks a step computes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Part {
    All,
    Lo,
    Hi,
}

/// The queries and keys a ring step of rank `i` of `n` computes (the zoo's `CpPlan::parts`).
fn parts(n: usize, i: usize, t: usize) -> (Part, Part) {
    let source = (i + n - t % n) % n;
    if t == 0 {
        (Part::All, Part::All)
    } else if source < i {
        (Part::All, Part::Lo)
    } else {
        (Part::Hi, Part::All)
    }
}

fn part(l: &mut Lines, x: &str, shape: [usize; 3], dim: usize, p: Part) -> (String, [usize; 3]) {
    let c = shape[dim] / 2;
    let mut s = shape;
    let (a, b) = match p {
        Part::All => return (x.to_string(), shape),
        Part::Lo => (0, c),
        Part::Hi => (c, 2 * c),
    };
    s[dim] = c;
    (
        l.f(&s, format!("aten.slice.Tensor({x}, {dim}, {a}, {b})")),
        s,
    )
}

/// The log-sum-exp merge of `(o, lo)` into `(out, lse)` (shapes `[BH, r, D]`, `[BH, r, 1]`).
fn merge(
    l: &mut Lines,
    out: &str,
    lse: &str,
    o: &str,
    lo: &str,
    r: usize,
    bug: Bug,
) -> (String, String) {
    let so = [BH, r, D];
    let sl = [BH, r, 1];
    if bug == Bug::NoCorrection {
        let sum = l.f(&so, format!("aten.add.Tensor({out}, {o})"));
        return (sum, lse.to_string());
    }
    let m = if bug == Bug::WrongMax {
        l.f(&sl, format!("aten.maximum.default({lse}, {lse})"))
    } else {
        l.f(&sl, format!("aten.maximum.default({lse}, {lo})"))
    };
    let d_old = l.f(&sl, format!("aten.sub.Tensor({lse}, {m})"));
    let shift = if bug == Bug::OtherShift { lse } else { &m };
    let d_new = l.f(&sl, format!("aten.sub.Tensor({lo}, {shift})"));
    let e_old = l.f(&sl, format!("aten.exp.default({d_old})"));
    let e_new = l.f(&sl, format!("aten.exp.default({d_new})"));
    let total = l.f(&sl, format!("aten.add.Tensor({e_old}, {e_new})"));
    let log_total = l.f(&sl, format!("aten.log.default({total})"));
    let lse_new = l.f(&sl, format!("aten.add.Tensor({m}, {log_total})"));
    let w_old = l.f(&sl, format!("aten.div.Tensor({e_old}, {total})"));
    let w_new = l.f(&sl, format!("aten.div.Tensor({e_new}, {total})"));
    let a = l.f(&so, format!("aten.mul.Tensor({out}, {w_old})"));
    let b = l.f(&so, format!("aten.mul.Tensor({o}, {w_new})"));
    (l.f(&so, format!("aten.add.Tensor({a}, {b})")), lse_new)
}

/// The causal mask `[rows, cols]` of positions `pq` (queries) and `pk` (keys).
fn causal(l: &mut Lines, pk: &str, pq: &str, rows: usize, cols: usize) -> String {
    let keys = l.push(
        &[1, cols],
        "i64",
        format!("aten.unsqueeze.default({pk}, 0)"),
    );
    let queries = l.push(
        &[rows, 1],
        "i64",
        format!("aten.unsqueeze.default({pq}, 1)"),
    );
    let future = l.push(
        &[rows, cols],
        "b8",
        format!("aten.gt.Tensor({keys}, {queries})"),
    );
    let zeros = l.f(
        &[rows, cols],
        format!("aten.full.default([{rows}, {cols}], 0.0, dtype = torch.float64, device = device(type='cpu'), pin_memory = False)"),
    );
    l.f(
        &[rows, cols],
        format!("aten.masked_fill.Scalar({zeros}, {future}, -inf)"),
    )
}

fn arange(l: &mut Lines, a: usize, b: usize) -> String {
    l.push(
        &[b - a],
        "i64",
        format!("aten.arange.start({a}, {b}, device = device(type='cpu'), pin_memory = False)"),
    )
}

/// The tag of the message of kind `kind` (0 keys, 1 values) received at step `t`.
fn tag(t: usize, kind: usize) -> usize {
    t * 2 + kind
}

/// Whom rank `r` receives its step-`t` block from.
fn from(n: usize, r: usize, t: usize, bug: Bug) -> usize {
    match bug {
        Bug::WrongDirection => (r + 1) % n,
        Bug::WrongPeer if r == n - 1 && t == 1 => 0,
        _ => (r + n - 1) % n,
    }
}

/// The body of rank `i` of `n` with chunks of `c` tokens.
fn rank_body(n: usize, i: usize, c: usize, bug: Bug, gbug: GradBug) -> Vec<String> {
    let loc = 2 * c;
    let mut l = Lines::default();
    let [a, b] = [i, 2 * n - 1 - i];
    let pick = |l: &mut Lines, x: &str| {
        let lo = l.f(
            &[BH, c, D],
            format!("aten.slice.Tensor({x}, 1, {}, {})", a * c, (a + 1) * c),
        );
        let hi = l.f(
            &[BH, c, D],
            format!("aten.slice.Tensor({x}, 1, {}, {})", b * c, (b + 1) * c),
        );
        l.f(&[BH, loc, D], format!("aten.cat.default([{lo}, {hi}], 1)"))
    };
    let q3 = pick(&mut l, "q");
    let go3 = if gbug == GradBug::SwappedGradRows {
        let [a, b] = [b, a];
        let lo = l.f(
            &[BH, c, D],
            format!("aten.slice.Tensor(go, 1, {}, {})", a * c, (a + 1) * c),
        );
        let hi = l.f(
            &[BH, c, D],
            format!("aten.slice.Tensor(go, 1, {}, {})", b * c, (b + 1) * c),
        );
        l.f(&[BH, loc, D], format!("aten.cat.default([{lo}, {hi}], 1)"))
    } else {
        pick(&mut l, "go")
    };
    let mut steps: Vec<Step> = Vec::new();
    let k = pick(&mut l, "k");
    let v = pick(&mut l, "v");
    let p0 = arange(&mut l, a * c, (a + 1) * c);
    let p1 = arange(&mut l, b * c, (b + 1) * c);
    let pos = l.push(&[loc], "i64", format!("aten.cat.default([{p0}, {p1}], 0)"));
    let diag = match bug {
        Bug::LocalTriu => {
            let full = l.f(
                &[loc, loc],
                format!("aten.full.default([{loc}, {loc}], -inf, dtype = torch.float64, device = device(type='cpu'), pin_memory = False)"),
            );
            Some(l.f(&[loc, loc], format!("aten.triu.default({full}, 1)")))
        }
        Bug::LocalPositions => {
            let lp = arange(&mut l, 0, loc);
            Some(causal(&mut l, &pos, &lp, loc, loc))
        }
        Bug::NoMask => None,
        _ => Some(causal(&mut l, &pos, &pos, loc, loc)),
    };
    // What each rank sends at each step: to every rank that receives from it.
    let mut acc: Option<(String, String)> = None;
    let (mut kc, mut vc) = (k.clone(), v.clone());
    let kv = [BH, loc, D];
    for t in 0..n {
        if t > 0 {
            let p = from(n, i, t, bug);
            kc = l.f(
                &kv,
                format!(
                    "shardproof_p2p.recv.default({kv:?}, torch.float64, {p}, {}, 'cp')",
                    tag(t, 0)
                ),
            );
            vc = l.f(
                &kv,
                format!(
                    "shardproof_p2p.recv.default({kv:?}, torch.float64, {p}, {}, 'cp')",
                    tag(t, 1)
                ),
            );
        }
        if t + 1 < n {
            for r in (0..n).filter(|&r| r != i && from(n, r, t + 1, bug) == i) {
                l.f(
                    &kv,
                    format!(
                        "shardproof_p2p.send.default({kc}, {r}, {}, 'cp')",
                        tag(t + 1, 0)
                    ),
                );
                l.f(
                    &kv,
                    format!(
                        "shardproof_p2p.send.default({vc}, {r}, {}, 'cp')",
                        tag(t + 1, 1)
                    ),
                );
            }
        }
        if bug == Bug::StepSkipped && t == n - 1 {
            continue;
        }
        let (rows, keys) = parts(n, i, t);
        let (qb, sq) = part(&mut l, &q3, [BH, loc, D], 1, rows);
        let (kb, sk) = part(&mut l, &kc, kv, 1, keys);
        let vsrc = if bug == Bug::StaleValues {
            v.clone()
        } else {
            vc.clone()
        };
        let (vb, _) = part(&mut l, &vsrc, kv, 1, keys);
        let (nq, nk) = (sq[1], sk[1]);
        let kt = l.f(&[BH, D, nk], format!("aten.transpose.int({kb}, 1, 2)"));
        let raw = l.f(&[BH, nq, nk], format!("aten.bmm.default({qb}, {kt})"));
        let scale = if bug == Bug::OtherScale && t == 1 {
            0.25
        } else {
            SCALE
        };
        let scaled = l.f(&[BH, nq, nk], format!("aten.mul.Scalar({raw}, {scale:?})"));
        let scores = match (t, &diag) {
            (0, Some(m)) => l.f(&[BH, nq, nk], format!("aten.add.Tensor({scaled}, {m})")),
            // The local causal mask on every step (catalog `cp-causal-mask-local`).
            (_, _) if bug == Bug::LocalTriu => {
                let full = l.f(
                    &[nq, nk],
                    format!("aten.full.default([{nq}, {nk}], -inf, dtype = torch.float64, device = device(type='cpu'), pin_memory = False)"),
                );
                let m = l.f(&[nq, nk], format!("aten.triu.default({full}, 1)"));
                l.f(&[BH, nq, nk], format!("aten.add.Tensor({scaled}, {m})"))
            }
            _ => scaled,
        };
        let lse = l.f(
            &[BH, nq, 1],
            format!("aten.logsumexp.default({scores}, [-1], True)"),
        );
        let shifted = l.f(&[BH, nq, nk], format!("aten.sub.Tensor({scores}, {lse})"));
        let p = l.f(&[BH, nq, nk], format!("aten.exp.default({shifted})"));
        let o = l.f(&[BH, nq, D], format!("aten.bmm.default({p}, {vb})"));
        steps.push(Step {
            rows,
            keys,
            nk,
            mask: diag.clone().filter(|_| t == 0),
            scores: scores.clone(),
            kb: kb.clone(),
            vb: vb.clone(),
            lse: lse.clone(),
        });
        let times = if bug == Bug::ChunkTwice && t == n - 1 {
            2
        } else {
            1
        };
        for _ in 0..times {
            acc = Some(match acc.take() {
                None => (o.clone(), lse.clone()),
                Some((out, run)) if rows == Part::All => {
                    merge(&mut l, &out, &run, &o, &lse, loc, bug)
                }
                Some((out, run)) => {
                    let (out_lo, _) = part(&mut l, &out, [BH, loc, D], 1, Part::Lo);
                    let (out_hi, _) = part(&mut l, &out, [BH, loc, D], 1, Part::Hi);
                    let (run_lo, _) = part(&mut l, &run, [BH, loc, 1], 1, Part::Lo);
                    let (run_hi, _) = part(&mut l, &run, [BH, loc, 1], 1, Part::Hi);
                    let (o_hi, l_hi) = merge(&mut l, &out_hi, &run_hi, &o, &lse, c, bug);
                    let (x, y) = if bug == Bug::SwappedHalves {
                        (&o_hi, &out_lo)
                    } else {
                        (&out_lo, &o_hi)
                    };
                    let out2 = l.f(&[BH, loc, D], format!("aten.cat.default([{x}, {y}], 1)"));
                    let lse2 = l.f(
                        &[BH, loc, 1],
                        format!("aten.cat.default([{run_lo}, {l_hi}], 1)"),
                    );
                    (out2, lse2)
                }
            });
        }
    }
    let (mut out, lse) = acc.expect("a step");
    // The ring's final log-sum-exp, which the backward reads.
    l.body.push(format!(
        "lse_fin: {} = torch.ops.aten.clone.default({lse})",
        ty(&[BH, loc, 1])
    ));
    let dq = ring_dq(&mut l, &steps, [&q3, &go3, &out, &lse, &v, &k], loc, gbug);
    l.body.push(format!(
        "dq_fin: {} = torch.ops.aten.clone.default({dq})",
        ty(&[BH, loc, D])
    ));
    if bug == Bug::RowsRotated {
        let (lo, _) = part(&mut l, &out, [BH, loc, D], 1, Part::Lo);
        let (hi, _) = part(&mut l, &out, [BH, loc, D], 1, Part::Hi);
        out = l.f(&[BH, loc, D], format!("aten.cat.default([{hi}, {lo}], 1)"));
    }
    l.body.push(format!(
        "att: {} = torch.ops.aten.clone.default({out})",
        ty(&[BH, loc, D])
    ));
    l.body.extend(tail(loc, true));
    l.body
}

/// A computed forward step, as the backward reads it: its parts, key count, scores, keys,
/// values and own log-sum-exp.
struct Step {
    rows: Part,
    keys: Part,
    nk: usize,
    mask: Option<String>,
    scores: String,
    kb: String,
    vb: String,
    lse: String,
}

/// The zoo's ring backward of the queries over the forward's `steps` (flash attention's, under
/// the final normalization `lse`): the gradient `dq` of `q3` for the output gradient `go3`.
fn ring_dq(
    l: &mut Lines,
    steps: &[Step],
    [q3, go3, out, lse, v, k]: [&str; 6],
    loc: usize,
    gbug: GradBug,
) -> String {
    let (x, y) = match gbug {
        GradBug::DeltaOfQueries => (go3, q3),
        GradBug::DeltaOfOutput => (out, out),
        _ => (go3, out),
    };
    let prod = l.f(&[BH, loc, D], format!("aten.mul.Tensor({x}, {y})"));
    let delta = l.f(
        &[BH, loc, 1],
        format!("aten.sum.dim_IntList({prod}, [2], True)"),
    );
    let mut dq: Option<String> = None;
    let last = steps.len() - 1;
    for (t, st) in steps.iter().enumerate() {
        let (rows, nk, scores, kb) = (st.rows, st.nk, &st.scores, &st.kb);
        let norm = match gbug {
            GradBug::BlockLse => part(l, &steps[0].lse, [BH, loc, 1], 1, rows).0,
            GradBug::WrongNormRows if rows == Part::Hi => part(l, lse, [BH, loc, 1], 1, Part::Lo).0,
            _ => part(l, lse, [BH, loc, 1], 1, rows).0,
        };
        // The scores again, of queries `qsrc` scaled by `scale` (the forward's mask).
        let mut rescore = |qsrc: &str, scale: f64| -> String {
            let (qb, sq) = part(l, qsrc, [BH, loc, D], 1, rows);
            let kt = l.f(&[BH, D, nk], format!("aten.transpose.int({kb}, 1, 2)"));
            let raw = l.f(&[BH, sq[1], nk], format!("aten.bmm.default({qb}, {kt})"));
            let scaled = l.f(
                &[BH, sq[1], nk],
                format!("aten.mul.Scalar({raw}, {scale:?})"),
            );
            match &st.mask {
                Some(m) => l.f(&[BH, sq[1], nk], format!("aten.add.Tensor({scaled}, {m})")),
                None => scaled,
            }
        };
        let scores = match gbug {
            GradBug::OtherQueries => rescore(k, SCALE),
            GradBug::OtherForwardScale => rescore(q3, 0.25),
            _ => scores.clone(),
        };
        let (gob, sq) = part(l, go3, [BH, loc, D], 1, rows);
        let (db, _) = part(l, &delta, [BH, loc, 1], 1, rows);
        let nq = sq[1];
        let vsrc = if gbug == GradBug::StaleValues && t > 0 {
            part(l, v, [BH, loc, D], 1, st.keys).0
        } else {
            st.vb.clone()
        };
        let shifted = l.f(&[BH, nq, nk], format!("aten.sub.Tensor({scores}, {norm})"));
        let p = l.f(&[BH, nq, nk], format!("aten.exp.default({shifted})"));
        let vt = l.f(&[BH, D, nk], format!("aten.transpose.int({vsrc}, 1, 2)"));
        let dp = l.f(&[BH, nq, nk], format!("aten.bmm.default({gob}, {vt})"));
        let centered = if gbug == GradBug::NoDelta {
            dp
        } else {
            l.f(&[BH, nq, nk], format!("aten.sub.Tensor({dp}, {db})"))
        };
        let ds = l.f(&[BH, nq, nk], format!("aten.mul.Tensor({p}, {centered})"));
        let scale = match gbug {
            GradBug::OtherScale if t == last => 0.25,
            GradBug::OtherForwardScale => 0.25,
            _ => SCALE,
        };
        let dss = l.f(&[BH, nq, nk], format!("aten.mul.Scalar({ds}, {scale:?})"));
        let ksrc = if gbug == GradBug::StaleKeys && t > 0 {
            part(l, k, [BH, loc, D], 1, st.keys).0
        } else {
            kb.clone()
        };
        let dqb = l.f(&[BH, nq, D], format!("aten.bmm.default({dss}, {ksrc})"));
        let times = match gbug {
            GradBug::Twice if t == last => 2,
            // (A forward that skipped its last step may leave one step: it stays.)
            GradBug::Skipped if t == last && last > 0 => 0,
            _ => 1,
        };
        for _ in 0..times {
            dq = Some(match dq.take() {
                None => dqb.clone(),
                Some(acc) if rows == Part::All => {
                    l.f(&[BH, loc, D], format!("aten.add.Tensor({acc}, {dqb})"))
                }
                Some(acc) => {
                    let (lo, _) = part(l, &acc, [BH, loc, D], 1, Part::Lo);
                    let (hi, _) = part(l, &acc, [BH, loc, D], 1, Part::Hi);
                    if gbug == GradBug::WrongRows {
                        let sum = l.f(&[BH, nq, D], format!("aten.add.Tensor({lo}, {dqb})"));
                        l.f(&[BH, loc, D], format!("aten.cat.default([{sum}, {hi}], 1)"))
                    } else {
                        let sum = l.f(&[BH, nq, D], format!("aten.add.Tensor({hi}, {dqb})"));
                        l.f(&[BH, loc, D], format!("aten.cat.default([{lo}, {sum}], 1)"))
                    }
                }
            });
        }
    }
    dq.expect("a step")
}

/// `sum(att * att)`, summed over the ranks (`reduce`) as `out`.
fn tail(rows: usize, reduce: bool) -> Vec<String> {
    let total = if reduce { "total" } else { "out" };
    let mut body = vec![
        format!(
            "sq: {} = torch.ops.aten.mul.Tensor(att, att)",
            ty(&[BH, rows, D])
        ),
        format!("{total}: {} = torch.ops.aten.sum.default(sq)", ty(&[])),
    ];
    if reduce {
        body.push(format!(
            "all_reduce: {} = torch.ops._c10d_functional.all_reduce.default(total, 'sum', 'cp')",
            ty(&[])
        ));
        body.push(format!(
            "out: {} = torch.ops._c10d_functional.wait_tensor.default(all_reduce)",
            ty(&[])
        ));
    }
    body
}

/// The spec: causal attention of the whole sequence in one block.
fn spec_body(s: usize) -> Vec<String> {
    let mut l = Lines::default();
    let pos = arange(&mut l, 0, s);
    let mask = causal(&mut l, &pos, &pos, s, s);
    let kt = l.f(&[BH, D, s], "aten.transpose.int(k, 1, 2)".into());
    let raw = l.f(&[BH, s, s], format!("aten.bmm.default(q, {kt})"));
    let scaled = l.f(&[BH, s, s], format!("aten.mul.Scalar({raw}, {SCALE:?})"));
    let scores = l.f(&[BH, s, s], format!("aten.add.Tensor({scaled}, {mask})"));
    let sm = l.f(
        &[BH, s, s],
        format!("aten._softmax.default({scores}, -1, False)"),
    );
    let o = l.f(&[BH, s, D], format!("aten.bmm.default({sm}, v)"));
    l.body.push(format!(
        "att: {} = torch.ops.aten.clone.default({o})",
        ty(&[BH, s, D])
    ));
    l.body.extend(tail(s, false));
    l.body
}

fn params(s: usize) -> Vec<String> {
    ["q", "k", "v", "go"]
        .iter()
        .map(|x| format!("{x}: {}", ty(&[BH, s, D])))
        .collect()
}

/// One instance, checked and run.
struct Ran {
    verdict: Verdict,
    render: String,
    /// Per rank: whether the checker placed `att` as rows on dim 1.
    rows_claimed: Vec<bool>,
    /// Per rank, whether its `att` rows are the spec's at its positions.
    rows_right: Vec<bool>,
    /// Whether the ranks' `out` sum to the spec's.
    sum_right: bool,
    /// Per rank: whether the checker placed the ring's final log-sum-exp `lse_fin` as rows on
    /// dim 1, and whether it is the causal log-sum-exp of the scores at the rank's positions.
    lse_claimed: Vec<bool>,
    lse_right: Vec<bool>,
    /// Per rank: whether the checker placed the queries' gradient `dq_fin` as rows on dim 1,
    /// and whether it is flash attention's gradient of the queries at the rank's positions.
    dq_claimed: Vec<bool>,
    dq_right: Vec<bool>,
}

fn instance(n: usize, c: usize, bug: Bug, seed: u64) -> Ran {
    instance_with(n, c, bug, GradBug::None, seed)
}

/// [`instance`] with a bug planted in the backward of the queries too.
fn instance_with(n: usize, c: usize, bug: Bug, gbug: GradBug, seed: u64) -> Ran {
    let s = 2 * n * c;
    let dir = tempfile::tempdir().unwrap();
    let spec = common::hand::graph_module(&params(s), &spec_body(s));
    std::fs::write(dir.path().join("spec.py"), spec).unwrap();
    let mut graphs = Vec::new();
    for r in 0..n {
        let text = common::hand::graph_module(&params(s), &rank_body(n, r, c, bug, gbug));
        std::fs::write(dir.path().join(format!("r{r}.py")), text).unwrap();
        graphs.push(format!("r{r}.py"));
    }
    let yaml = format!(
        "version: 1\nname: ring-accumulation\nspec:\n  graph: spec.py\nimpl:\n  mesh: {{ cp: {n} }}\n  graphs: [{}]\ninputs:\n  q: {{ cp: Replicate() }}\n  k: {{ cp: Replicate() }}\n  v: {{ cp: Replicate() }}\n  go: {{ cp: Replicate() }}\noutputs:\n  out: {{ cp: Replicate() }}\n",
        graphs.join(", ")
    );
    std::fs::write(dir.path().join("case.yaml"), yaml).unwrap();
    let case =
        shardproof_case::load_case(&dir.path().join("case.yaml")).unwrap_or_else(|e| panic!("{e}"));
    let report = check_case(&case).unwrap_or_else(|e| panic!("{e}"));
    let prop = propagate(&case).unwrap_or_else(|e| panic!("{e}"));
    let at = |g: &shardproof_ir::Graph, name: &str| {
        ValueId::new(g.nodes.iter().position(|x| x.name == name).unwrap(), 0)
    };
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let leaves: BTreeMap<String, Tensor> = ["q", "k", "v", "go"]
        .iter()
        .map(|x| (x.to_string(), random(&[BH, s, D], &mut rng)))
        .collect();
    let spec_env = run_graph(&case.spec, &leaves, &RunConfig::default()).expect("spec runs");
    let spec_att = spec_env.get(at(&case.spec, "att")).unwrap().data.to_vec();
    let spec_out = spec_env.get(at(&case.spec, "out")).unwrap().data.to_vec();
    let envs = run_program(
        &case.program,
        &vec![leaves.clone(); n],
        &RunConfig::default(),
    )
    .expect("runs");
    let mut total = 0.0;
    let _ = &mut total;
    let (mut rows_claimed, mut rows_right) = (Vec::new(), Vec::new());
    let (mut lse_claimed, mut lse_right) = (Vec::new(), Vec::new());
    let (q, k) = (&leaves["q"].data, &leaves["k"].data);
    let (v, go) = (&leaves["v"].data, &leaves["go"].data);
    let (mut dq_claimed, mut dq_right) = (Vec::new(), Vec::new());
    for (r, env) in envs.iter().enumerate() {
        let g = &case.program.ranks[r];
        total = env.get(at(g, "out")).unwrap().data[0];
        rows_claimed.push(matches!(
            prop.ranks[r].of(at(g, "att"), 1)[0],
            Place::Rows(1, _)
        ));
        let got = env.get(at(g, "att")).unwrap().data.to_vec();
        let positions: Vec<usize> = [r, 2 * n - 1 - r]
            .iter()
            .flat_map(|&k| k * c..(k + 1) * c)
            .collect();
        let want: Vec<f64> = (0..BH)
            .flat_map(|h| {
                positions
                    .iter()
                    .flat_map(move |&p| (0..D).map(move |d| (h * s + p) * D + d))
            })
            .map(|k| spec_att[k])
            .collect();
        rows_right.push(close(&got, &want));
        lse_claimed.push(matches!(
            prop.ranks[r].of(at(g, "lse_fin"), 1)[0],
            Place::Rows(1, _)
        ));
        let got = env.get(at(g, "lse_fin")).unwrap().data.to_vec();
        let want: Vec<f64> = (0..BH)
            .flat_map(|h| positions.iter().map(move |&p| (h, p)))
            .map(|(h, p)| {
                let score = |kp: usize| {
                    SCALE
                        * (0..D)
                            .map(|d| q[(h * s + p) * D + d] * k[(h * s + kp) * D + d])
                            .sum::<f64>()
                };
                (0..=p).map(|kp| score(kp).exp()).sum::<f64>().ln()
            })
            .collect();
        lse_right.push(close(&got, &want));
        dq_claimed.push(matches!(
            prop.ranks[r].of(at(g, "dq_fin"), 1)[0],
            Place::Rows(1, _)
        ));
        let got = env.get(at(g, "dq_fin")).unwrap().data.to_vec();
        // Flash attention's backward of the queries at each of the rank's positions.
        let at3 = |x: &[f64], h: usize, p: usize, d: usize| x[(h * s + p) * D + d];
        let dot = |x: &[f64], y: &[f64], h: usize, a: usize, b: usize| {
            (0..D)
                .map(|d| at3(x, h, a, d) * at3(y, h, b, d))
                .sum::<f64>()
        };
        let mut want = Vec::new();
        for h in 0..BH {
            for &p in &positions {
                let w: Vec<f64> = (0..=p)
                    .map(|kp| (SCALE * dot(q, k, h, p, kp)).exp())
                    .collect();
                let total: f64 = w.iter().sum();
                let o: Vec<f64> = (0..D)
                    .map(|d| (0..=p).map(|kp| w[kp] / total * at3(v, h, kp, d)).sum())
                    .collect();
                let delta: f64 = (0..D).map(|d| at3(go, h, p, d) * o[d]).sum();
                for d in 0..D {
                    want.push(
                        (0..=p)
                            .map(|kp| {
                                let ds = w[kp] / total * (dot(go, v, h, p, kp) - delta);
                                SCALE * ds * at3(k, h, kp, d)
                            })
                            .sum(),
                    );
                }
            }
        }
        dq_right.push(close(&got, &want));
    }
    Ran {
        verdict: report.verdict,
        render: report.render(),
        rows_claimed,
        rows_right,
        sum_right: close(&[total], &spec_out),
        lse_claimed,
        lse_right,
        dq_claimed,
        dq_right,
    }
}

/// Every claim the checker made is the interpreter's values.
fn claims_hold(ran: &Ran) -> Result<(), String> {
    for (r, (&claimed, &right)) in ran.rows_claimed.iter().zip(&ran.rows_right).enumerate() {
        if claimed && !right {
            return Err(format!(
                "rank {r}: att claimed rows, but they are not the spec's"
            ));
        }
    }
    for (r, (&claimed, &right)) in ran.lse_claimed.iter().zip(&ran.lse_right).enumerate() {
        if claimed && !right {
            return Err(format!(
                "rank {r}: lse_fin claimed rows, but it is not the causal log-sum-exp"
            ));
        }
    }
    for (r, (&claimed, &right)) in ran.dq_claimed.iter().zip(&ran.dq_right).enumerate() {
        if claimed && !right {
            return Err(format!(
                "rank {r}: dq_fin claimed rows, but it is not the queries' gradient"
            ));
        }
    }
    if ran.verdict == Verdict::Holds && !ran.sum_right {
        return Err(format!(
            "holds, but the ranks' outputs do not sum to the spec's\n{}",
            ran.render
        ));
    }
    Ok(())
}

#[test]
fn the_zoo_ring_holds_and_agrees_with_the_interpreter() {
    for (n, c) in [(2, 1), (2, 2), (3, 1), (4, 1)] {
        let ran = instance(n, c, Bug::None, (n * 10 + c) as u64);
        assert_eq!(claims_hold(&ran), Ok(()), "n {n} c {c}");
        assert!(
            ran.sum_right && ran.rows_right.iter().all(|&x| x),
            "n {n} c {c}: not right when run"
        );
        assert!(
            ran.rows_claimed.iter().all(|&x| x),
            "n {n} c {c}: rows not claimed\n{}",
            ran.render
        );
        assert!(
            ran.lse_right.iter().all(|&x| x) && ran.lse_claimed.iter().all(|&x| x),
            "n {n} c {c}: log-sum-exp not right or not claimed"
        );
        assert!(
            ran.dq_right.iter().all(|&x| x),
            "n {n} c {c}: the queries' gradient is not right"
        );
        assert!(
            ran.dq_claimed.iter().all(|&x| x),
            "n {n} c {c}: the queries' gradient not claimed\n{}",
            ran.render
        );
        assert_eq!(ran.verdict, Verdict::Holds, "n {n} c {c}\n{}", ran.render);
    }
}

#[test]
fn planted_ring_bugs_never_hold() {
    for bug in BUGS {
        // Wrong peer and direction only differ from the right ring with three ranks or more.
        for (n, c) in [(2, 1), (3, 1), (3, 2)] {
            if n == 2 && matches!(bug, Bug::WrongPeer | Bug::WrongDirection) {
                continue;
            }
            let ran = instance(n, c, bug, 7);
            assert_eq!(claims_hold(&ran), Ok(()), "{bug:?} n {n} c {c}");
            // Every bug but the harmless maximum is wrong when run (where it changes anything).
            if bug != Bug::WrongMax && n == 3 {
                assert!(
                    !ran.sum_right || !ran.rows_right.iter().all(|&x| x),
                    "{bug:?}: not wrong when run"
                );
            }
            assert_ne!(
                ran.verdict,
                Verdict::Holds,
                "{bug:?} n {n} c {c}\n{}",
                ran.render
            );
            assert!(
                !ran.rows_claimed.iter().all(|&x| x),
                "{bug:?} n {n} c {c}: every rank's output claimed rows"
            );
            // The backward reads the forward's output and log-sum-exp: a bug in the ring
            // (all but the rotation after it) leaves the queries' gradient unclaimed too.
            if bug != Bug::RowsRotated {
                assert!(
                    !ran.dq_claimed.iter().all(|&x| x),
                    "{bug:?} n {n} c {c}: every rank's gradient claimed rows"
                );
            }
        }
    }
}

/// The final log-sum-exp is refused wherever a bug changes it (and where the maximum of its
/// merge is not the maximum of its two operands, which happens to be harmless): no rank's
/// claim of it survives every one of these on every rank.
#[test]
fn planted_bugs_of_the_log_sum_exp_never_claim_it() {
    let changes_lse = [
        Bug::OtherShift,
        Bug::NoCorrection,
        Bug::WrongMax,
        Bug::StepSkipped,
        Bug::ChunkTwice,
        Bug::WrongPeer,
        Bug::WrongDirection,
        Bug::LocalTriu,
        Bug::LocalPositions,
        Bug::NoMask,
        Bug::OtherScale,
    ];
    for bug in changes_lse {
        for (n, c) in [(2, 1), (3, 1), (3, 2)] {
            if n == 2 && matches!(bug, Bug::WrongPeer | Bug::WrongDirection) {
                continue;
            }
            let ran = instance(n, c, bug, 11);
            assert_eq!(claims_hold(&ran), Ok(()), "{bug:?} n {n} c {c}");
            if bug != Bug::WrongMax && n == 3 {
                assert!(
                    !ran.lse_right.iter().all(|&x| x),
                    "{bug:?}: the log-sum-exp is not wrong when run"
                );
            }
            assert!(
                !ran.lse_claimed.iter().all(|&x| x),
                "{bug:?} n {n} c {c}: every rank's log-sum-exp claimed rows"
            );
        }
    }
}

/// Every planted bug of the queries' gradient is wrong when run and never claimed on every
/// rank; with the forward's bugs the gradient's claims are checked by the proptest.
#[test]
fn planted_bugs_of_the_queries_gradient_never_claim_it() {
    for gbug in GRAD_BUGS {
        for (n, c) in [(2, 1), (3, 1), (3, 2)] {
            let ran = instance_with(n, c, Bug::None, gbug, 13);
            assert_eq!(claims_hold(&ran), Ok(()), "{gbug:?} n {n} c {c}");
            assert!(
                !ran.dq_right.iter().all(|&x| x),
                "{gbug:?} n {n} c {c}: not wrong when run"
            );
            assert!(
                !ran.dq_claimed.iter().all(|&x| x),
                "{gbug:?} n {n} c {c}: every rank's gradient claimed rows"
            );
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]
    /// Random ring sizes, chunk sizes, bugs of the forward and of the queries' gradient and
    /// values: every rows claim (output, log-sum-exp, gradient) and every holds is the
    /// interpreter's values.
    #[test]
    fn claims_agree_with_the_interpreter(
        n in 2usize..=4,
        c in 1usize..=2,
        which in 0usize..=BUGS.len(),
        which_grad in 0usize..=GRAD_BUGS.len(),
        seed in 0u64..1000,
    ) {
        let bug = if which == BUGS.len() { Bug::None } else { BUGS[which] };
        let gbug = GRAD_BUGS.get(which_grad).copied().unwrap_or(GradBug::None);
        let ran = instance_with(n, c, bug, gbug, seed);
        prop_assert_eq!(claims_hold(&ran), Ok(()));
        // A gradient bug may pair rows of two selections (a finding) even though the gradient
        // is no output, so only the correct program must hold.
        if bug == Bug::None && gbug == GradBug::None {
            prop_assert_eq!(ran.verdict, Verdict::Holds);
        }
    }
}

/// A sum over received rows is no partial sum of the selection: under a wrong peer (ranks 1
/// and 2 both receive rank 0's keys) the ranks' sums count rank 0's chunks twice and rank 2's
/// never, and each rank alone cannot tell. The received rows name their sender
/// (`RowKey::Received`) and a sum over them is `Varying`, never `Partial(sum)`.
#[test]
fn a_sum_over_received_rows_never_holds() {
    let (n, c) = (3, 1);
    let s = 2 * n * c;
    for wrong in [false, true] {
        let bug = if wrong { Bug::WrongPeer } else { Bug::None };
        let dir = tempfile::tempdir().unwrap();
        let mut spec = Lines::default();
        spec.f(&[BH, s, D], "aten.mul.Tensor(k, k)".into());
        spec.body.push(format!(
            "out: {} = torch.ops.aten.sum.default(mul)",
            ty(&[])
        ));
        let text = common::hand::graph_module(&params(s), &spec.body);
        std::fs::write(dir.path().join("spec.py"), text).unwrap();
        let mut graphs = Vec::new();
        for i in 0..n {
            let mut l = Lines::default();
            let [a, b] = [i, 2 * n - 1 - i];
            let lo = l.f(
                &[BH, c, D],
                format!("aten.slice.Tensor(k, 1, {}, {})", a * c, (a + 1) * c),
            );
            let hi = l.f(
                &[BH, c, D],
                format!("aten.slice.Tensor(k, 1, {}, {})", b * c, (b + 1) * c),
            );
            let kv = [BH, 2 * c, D];
            let mine = l.f(&kv, format!("aten.cat.default([{lo}, {hi}], 1)"));
            for r in (0..n).filter(|&r| r != i && from(n, r, 1, bug) == i) {
                l.f(
                    &kv,
                    format!("shardproof_p2p.send.default({mine}, {r}, 2, 'cp')"),
                );
            }
            let got = l.f(
                &kv,
                format!(
                    "shardproof_p2p.recv.default({kv:?}, torch.float64, {}, 2, 'cp')",
                    from(n, i, 1, bug)
                ),
            );
            let sq = l.f(&kv, format!("aten.mul.Tensor({got}, {got})"));
            l.body.push(format!(
                "total: {} = torch.ops.aten.sum.default({sq})",
                ty(&[])
            ));
            l.body.push(format!(
                "all_reduce: {} = torch.ops._c10d_functional.all_reduce.default(total, 'sum', 'cp')",
                ty(&[])
            ));
            l.body.push(format!(
                "out: {} = torch.ops._c10d_functional.wait_tensor.default(all_reduce)",
                ty(&[])
            ));
            let text = common::hand::graph_module(&params(s), &l.body);
            std::fs::write(dir.path().join(format!("r{i}.py")), text).unwrap();
            graphs.push(format!("r{i}.py"));
        }
        let yaml = format!(
            "version: 1\nname: ring-received-sum\nspec:\n  graph: spec.py\nimpl:\n  mesh: {{ cp: {n} }}\n  graphs: [{}]\ninputs:\n  q: {{ cp: Replicate() }}\n  k: {{ cp: Replicate() }}\n  v: {{ cp: Replicate() }}\n  go: {{ cp: Replicate() }}\noutputs:\n  out: {{ cp: Replicate() }}\n",
            graphs.join(", ")
        );
        std::fs::write(dir.path().join("case.yaml"), yaml).unwrap();
        let case = shardproof_case::load_case(&dir.path().join("case.yaml")).unwrap();
        let report = check_case(&case).unwrap();
        assert_ne!(
            report.verdict,
            Verdict::Holds,
            "wrong peer {wrong}\n{}",
            report.render()
        );
    }
}
