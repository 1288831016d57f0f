//! Sizes read as values (docs/prove/reduction.md, "Sizes read as values"). A program reads a
//! size as a *value* where a tensor computed without the graph's inputs (a created fill, an
//! `arange`'s positions, a mask built from them) is reduced over a dim, or where positions
//! meet literals or each other in arithmetic: `sum(ones([n]))` is `n`, `arange(n)` holds
//! `0..n`. The symbolic engine folds such values to numbers, so at a reduced size a
//! polynomial of them and literals may vanish (`n² - 5n + 6` at `n = 2`, `i·(i - 1)` at every
//! position of `arange(2)`) where it does not at full size, and the no-coincidence rule, which
//! keeps sizes off the literals themselves, does not keep them off such roots. The sizes such
//! a value reads keep their original values.
//!
//! Values that depend on an input are data and are not tracked. A mask sum
//! (`(labels != ignore).sum()`) stays symbolic, one indicator per label, and a `mean`'s own
//! `1/n` is the operator's semantics on both sides: one reading of the size as a data
//! coefficient, which the no-coincidence rule keeps off the literals. A count that data
//! cancels out of (`sum(x + 1) - sum(x)`, `sum(x) / mean(x)`) folds to `n` all the same: that
//! residual is open (docs/prove/reduction.md, "Sizes read as values").

mod flow;

use super::{location, norm_dim, STRUCTURAL, VALUE_KEEPING};
use crate::reduce::sizes::{Mono, Sizes};
use shardproof_ir::{Arg, Graph, ValueId};
use shardproof_ops::{Args, Schema};

/// The start of the reason every size read as a value is kept with.
pub const SIZE_VALUE_PIN: &str = "a size read as a value";

/// Operators creating a tensor of one literal value.
const CREATED: &[&str] = &[
    "aten.full",
    "aten.zeros",
    "aten.ones",
    "aten.empty",
    "aten.scalar_tensor",
];

/// Reductions over the dims named by `dim` (all when absent).
const REDUCING: &[&str] = &[
    "aten.sum",
    "aten.mean",
    "aten.amax",
    "aten.amin",
    "aten.prod",
    "aten.logsumexp",
];

/// Softmax and its backward: a reduction along `dim` inside an elementwise-shaped operator.
const ROW_REDUCING: &[&str] = &[
    "aten._softmax",
    "aten._log_softmax",
    "aten._softmax_backward_data",
    "aten._log_softmax_backward_data",
];

/// Comparisons: their result is a mask, not arithmetic on the compared values.
const COMPARING: &[&str] = &[
    "aten.eq", "aten.ne", "aten.lt", "aten.le", "aten.gt", "aten.ge",
];

/// Per value of one graph: `None` where it depends on the graph's inputs (data); else the
/// sizes its elements may read (an `arange`'s length, a reduced dim's count, the sides of a
/// `triu` mask), empty for a plain fill.
pub(super) struct SizeValues {
    free: Vec<Vec<Option<Vec<Mono>>>>,
    /// What every value, data or not, carries of the sizes through data ([`flow`]).
    flows: flow::Flows,
}

/// One call, as [`SizeValues::call`] sees it.
pub(super) struct Call<'a> {
    /// The graph.
    pub g: &'a Graph,
    /// The node.
    pub i: usize,
    /// The operator's base name (`aten.sum`).
    pub base: &'a str,
    /// The operator's schema.
    pub schema: &'a Schema,
    /// Its bound arguments (for `dim`).
    pub bound: &'a Args<'a>,
    /// The sizes of every value walked so far.
    pub dims: &'a [Vec<Option<Vec<Mono>>>],
    /// The sizes of the call's outputs.
    pub result: &'a [Vec<Mono>],
    /// The size variables, to compare sizes as every relation so far has made them.
    pub sizes: &'a Sizes,
}

impl Call<'_> {
    /// Argument `name` as bound, or `None` where the schema has no such argument.
    fn arg(&self, name: &str) -> Option<Arg> {
        self.schema
            .args
            .iter()
            .any(|a| a.name == name)
            .then(|| self.bound.get(name))
            .flatten()
    }

    /// The sizes of value `v` as walked so far (none where it has no known shape).
    fn dims_of(&self, v: ValueId) -> Vec<Mono> {
        self.dims
            .get(v.node)
            .and_then(|o| o.get(v.output))
            .cloned()
            .flatten()
            .unwrap_or_default()
    }
}

fn union(into: &mut Vec<Mono>, from: &[Mono]) {
    for m in from {
        if !m.is_one() && !into.contains(m) {
            into.push(m.clone());
        }
    }
}

impl SizeValues {
    /// No value known yet, for a graph of `nodes` nodes.
    pub(super) fn new(nodes: usize) -> SizeValues {
        SizeValues {
            free: vec![Vec::new(); nodes],
            flows: flow::Flows::new(nodes),
        }
    }

    /// An input of the graph of `rank` dims: data.
    pub(super) fn input(&mut self, i: usize, rank: usize) {
        self.free[i] = vec![None];
        self.flows.set(i, flow::Flow::input(rank));
    }

    /// A 0-d constant: a literal, reading no size.
    pub(super) fn constant(&mut self, i: usize) {
        self.free[i] = vec![Some(Vec::new())];
        self.flows.set(i, flow::Flow::literal());
    }

    fn reads(&self, v: ValueId) -> Option<Vec<Mono>> {
        self.free.get(v.node)?.get(v.output)?.clone()
    }

    /// Classifies call `c`'s outputs and pushes to `pins` every size it reads as a value in
    /// arithmetic, with the reason.
    pub(super) fn call(
        &mut self,
        c: &Call<'_>,
        args: &[Arg],
        kwargs: &[(String, Arg)],
        pins: &mut Vec<(Mono, String)>,
    ) {
        // The tensor operands by argument name, and whether a numeric literal is written
        // (defaults are not: `alpha = 1` is no literal of the program).
        let mut operands: Vec<(&str, ValueId)> = Vec::new();
        let mut literal = false;
        let named = args
            .iter()
            .enumerate()
            .filter_map(|(k, a)| Some((c.schema.args.get(k)?.name.as_str(), a)))
            .chain(kwargs.iter().map(|(n, a)| (n.as_str(), a)));
        for (name, a) in named {
            match a {
                Arg::Value(v) => operands.push((name, *v)),
                Arg::List(items) => {
                    for item in items {
                        if let Arg::Value(v) = item {
                            operands.push((name, *v));
                        }
                    }
                }
                Arg::Int(_) | Arg::Float(_) => {
                    let structural = STRUCTURAL.contains(&name)
                        || (name == "diagonal" && matches!(c.base, "aten.triu" | "aten.tril"));
                    literal |= !structural;
                }
                _ => {}
            }
        }
        self.flows.call(c, &operands, literal, pins);
        let reads: Vec<(&str, ValueId, Option<Vec<Mono>>)> = operands
            .iter()
            .map(|&(n, v)| (n, v, self.reads(v)))
            .collect();
        let all_free = reads.iter().all(|(_, _, r)| r.is_some());
        let mut union_all = Vec::new();
        for (_, _, r) in &reads {
            if let Some(r) = r {
                union(&mut union_all, r);
            }
        }
        let dims_of = |v: ValueId| c.dims_of(v);
        let here = location(c.g, c.i);
        let mut pin = |ms: &[Mono], what: &str| {
            for m in ms {
                if !m.is_one() {
                    pins.push((m.clone(), format!("{SIZE_VALUE_PIN}: {here} {what}")));
                }
            }
        };
        let base = c.base;
        let outs = c.result.len().max(1);
        let out: Option<Vec<Mono>> = if CREATED.contains(&base) {
            Some(Vec::new())
        } else if base == "aten.arange" {
            Some(c.result.first().cloned().unwrap_or_default())
        } else if reads.is_empty() {
            // Nothing in, not created: a received buffer, data.
            None
        } else if REDUCING.contains(&base) {
            match reads.iter().find(|(n, _, _)| *n == "self") {
                Some((_, v, Some(r))) => {
                    let x = dims_of(*v);
                    let picked: Vec<usize> = match c
                        .arg("dim")
                        .and_then(|a| a.as_int_list().or_else(|| a.as_int().map(|d| vec![d])))
                    {
                        Some(ds) if !ds.is_empty() => {
                            ds.iter().filter_map(|&d| norm_dim(d, x.len())).collect()
                        }
                        _ => (0..x.len()).collect(),
                    };
                    // The mean or extremum of one repeated value is that value.
                    if r.is_empty() && matches!(base, "aten.mean" | "aten.amax" | "aten.amin") {
                        Some(Vec::new())
                    } else {
                        let mut read = r.clone();
                        for d in picked {
                            if let Some(m) = x.get(d) {
                                union(&mut read, std::slice::from_ref(m));
                            }
                        }
                        pin(&read, "reduces a tensor computed without inputs: its result counts elements or sums positions");
                        Some(read)
                    }
                }
                _ => None,
            }
        } else if ROW_REDUCING.contains(&base) {
            // A softmax of one such value reads the dim's size once (`1/n` of a fill): a
            // single reading, like a mean's, that coincides with no literal; arithmetic on
            // its result pins what it reads.
            let d = c.arg("dim").and_then(|a| a.as_int()).unwrap_or(-1);
            all_free.then(|| {
                let mut read = union_all.clone();
                for (_, v, _) in &reads {
                    let x = dims_of(*v);
                    if let Some(m) = norm_dim(d, x.len()).and_then(|k| x.get(k)) {
                        union(&mut read, std::slice::from_ref(m));
                    }
                }
                read
            })
        } else if matches!(base, "aten.mm" | "aten.bmm" | "aten.addmm") {
            let (a, b) = if base == "aten.addmm" {
                ("mat1", "mat2")
            } else {
                ("self", "mat2")
            };
            let find = |n: &str| reads.iter().find(|(m, _, _)| *m == n);
            if let (Some((_, va, Some(ra))), Some((_, _, Some(rb)))) = (find(a), find(b)) {
                let mut read = ra.clone();
                union(&mut read, rb);
                if let Some(k) = dims_of(*va).last() {
                    union(&mut read, std::slice::from_ref(k));
                }
                pin(&read, "contracts two tensors computed without inputs: its result counts elements or sums products of positions");
            }
            all_free.then_some(union_all)
        } else if matches!(base, "aten.triu" | "aten.tril") {
            all_free.then(|| {
                let mut read = union_all.clone();
                if let Some((_, v, _)) = reads.first() {
                    let x = dims_of(*v);
                    union(&mut read, &x[x.len().saturating_sub(2)..]);
                }
                read
            })
        } else if matches!(base, "aten.cat" | "aten.constant_pad_nd" | "aten.pad") {
            // The values of a concatenation or padding of fills change at a position.
            all_free.then(|| {
                let mut read = union_all.clone();
                for (_, v, _) in &reads {
                    union(&mut read, &dims_of(*v));
                }
                read
            })
        } else if VALUE_KEEPING.contains(&base)
            || matches!(
                base,
                "aten.split" | "aten.split_with_sizes" | "aten._to_copy"
            )
        {
            all_free.then_some(union_all)
        } else if COMPARING.contains(&base) {
            if literal {
                pin(
                    &union_all,
                    "compares a tensor computed without inputs with a literal",
                );
            }
            all_free.then_some(union_all)
        } else if super::ELEMENTWISE.contains(&base) {
            // A selection's condition is no operand of its arithmetic.
            let arith: Vec<&Vec<Mono>> = reads
                .iter()
                .filter(|(n, _, _)| !matches!(*n, "condition" | "mask"))
                .filter_map(|(_, _, r)| r.as_ref())
                .collect();
            if arith.len() >= 2 || (literal && !arith.is_empty()) {
                let mut read = Vec::new();
                for r in arith {
                    union(&mut read, r);
                }
                pin(&read, "computes with a tensor computed without inputs and a literal or another such tensor");
            }
            all_free.then_some(union_all)
        } else if base == "shardproof_p2p.send" {
            pin(
                &union_all,
                "sends a tensor computed without inputs to another rank",
            );
            None
        } else {
            // Selections, losses, norms, collectives: the sizes a value such an operator reads
            // may meet data or be counted there, where no later rule sees them. An
            // embedding's positions are bounded by the table rule instead (rows >= positions).
            let mut read = Vec::new();
            for (n, _, r) in &reads {
                if let Some(r) = r {
                    if !(base == "aten.embedding" && *n == "indices") {
                        union(&mut read, r);
                    }
                }
            }
            pin(&read, "reads a tensor computed without inputs in an operator that may select, count or normalize it");
            all_free.then_some(union_all)
        };
        self.free[c.i] = vec![out; outs];
    }
}
