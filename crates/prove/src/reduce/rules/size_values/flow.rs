//! Sizes read as values through data (docs/prove/reduction.md, "Sizes read as values"): the
//! two ways a size enters a value that depends on the graph's inputs.
//!
//! - **Counts.** A `sum` over a dim adds, for every term (a monomial of the inputs) present in
//!   every summand, that term times the dim's size: `Σ_i (x_i + 1) = Σ x + n`, `Σ_i y = n·y`
//!   for `y` broadcast along `i`. The symbolic engine collects such terms, so data can cancel
//!   out and leave the count (`sum(x + 1) - sum(x) = n`), and `n·y` equals `y + y` at `n = 2`.
//!   Each value records, per dim, whether a term may *repeat* along it (a literal, a fill, a
//!   value broadcast along it, and what sums and products of such keep) and whether it may be
//!   *the same* along it (what an opaque function of it keeps); a sum, product or contraction
//!   over a dim along which a term may repeat keeps that dim's size. A `mean` divides the
//!   count out (`mean(x + 1) = mean(x) + 1`) and keeps nothing; but its `1/n` scales every
//!   other term, and dividing by it reads `n` (`sum(x) / mean(x) = n`), so a division by a
//!   value a mean scaled keeps the mean's dim.
//! - **Positions through data.** A polynomial in one position `p` that vanishes at every
//!   position `0..s` of a reduced `arange(s)` (`s >= 2`) but not at full size has degree 2 or
//!   more in `p`: one of degree 1 with two roots is zero. Each value records its degree in
//!   the positions of each `arange` length (products add degrees, sums take the largest, a
//!   division by positions is unbounded); where it reaches 2 the length keeps its size.
//!   Comparisons, selections' conditions and opaque functions of positions (RoPE's
//!   `cos(p·θ)`) are not polynomials and are not tracked (docs: Open).
//!
//! A value sent to another rank is plain data there, so the sender keeps every size the value
//! may carry in one of these ways.

use super::super::{norm_dim, ELEMENTWISE, VALUE_KEEPING};
use super::{Call, SIZE_VALUE_PIN};
use crate::reduce::sizes::{Mono, Sizes};
use shardproof_ir::ValueId;

/// The highest degree tracked: 2 means "2 or more, or not a polynomial".
const SATURATED: u8 = 2;

/// What one value carries of the sizes, per dim of the value.
#[derive(Clone, Debug, Default)]
pub(super) struct Flow {
    /// Per dim: a term may repeat along it, more often the larger the dim.
    rep: Vec<bool>,
    /// Per dim: the elements may be one and the same value along it (implies `rep`).
    same: Vec<bool>,
    /// Degree in the positions of each `arange` length (normalized), saturating at 2.
    degree: Vec<(Mono, u8)>,
    /// Dims a mean (or a softmax of a constant row) scaled the value's terms by `1/n` over.
    mean_of: Vec<Mono>,
}

impl Flow {
    /// A value of `rank` dims along which every element is the same (a literal, a fill).
    fn constant(rank: usize) -> Flow {
        Flow {
            rep: vec![true; rank],
            same: vec![true; rank],
            ..Flow::default()
        }
    }

    /// An input: one distinct symbol per element.
    pub(super) fn input(rank: usize) -> Flow {
        Flow {
            rep: vec![false; rank],
            same: vec![false; rank],
            ..Flow::default()
        }
    }

    /// A 0-d literal.
    pub(super) fn literal() -> Flow {
        Flow::default()
    }

    /// A value nothing is known of, of `rank` dims: anything may repeat.
    fn unknown(rank: usize) -> Flow {
        Flow::constant(rank)
    }

    /// Whether position `k` of an output of `out_rank` dims, broadcast from this value with
    /// dims `dims`, repeats / is the same: a dim the value lacks or holds once is broadcast.
    fn along(&self, dims: &[Mono], out_rank: usize, k: usize) -> (bool, bool) {
        let shift = out_rank as isize - dims.len() as isize;
        let j = k as isize - shift;
        if j < 0 || dims.get(j as usize).is_none_or(Mono::is_one) {
            return (true, true);
        }
        let j = j as usize;
        (
            self.rep.get(j).copied().unwrap_or(true),
            self.same.get(j).copied().unwrap_or(true),
        )
    }
}

fn add_class(into: &mut Vec<Mono>, m: Mono) {
    if !m.is_one() && !into.contains(&m) {
        into.push(m);
    }
}

#[cfg(test)]
fn degree_of(f: &Flow, m: &Mono) -> u8 {
    f.degree.iter().find(|(c, _)| c == m).map_or(0, |(_, d)| *d)
}

/// Per class, the largest degree of `flows` (a sum of them).
fn max_degree<'a>(flows: impl Iterator<Item = &'a Flow>) -> Vec<(Mono, u8)> {
    let mut out: Vec<(Mono, u8)> = Vec::new();
    for f in flows {
        for (m, d) in &f.degree {
            match out.iter_mut().find(|(c, _)| c == m) {
                Some((_, e)) => *e = (*e).max(*d),
                None => out.push((m.clone(), *d)),
            }
        }
    }
    out
}

/// Per class, the sum of the degrees of `flows` (a product of them), saturating.
fn sum_degree<'a>(flows: impl Iterator<Item = &'a Flow>) -> Vec<(Mono, u8)> {
    let mut out: Vec<(Mono, u8)> = Vec::new();
    for f in flows {
        for (m, d) in &f.degree {
            match out.iter_mut().find(|(c, _)| c == m) {
                Some((_, e)) => *e = (*e + *d).min(SATURATED),
                None => out.push((m.clone(), (*d).min(SATURATED))),
            }
        }
    }
    out
}

fn union_mean(flows: &[&Flow]) -> Vec<Mono> {
    let mut out = Vec::new();
    for f in flows {
        for m in &f.mean_of {
            add_class(&mut out, m.clone());
        }
    }
    out
}

/// How an elementwise operator combines its operands' terms.
#[derive(Clone, Copy, PartialEq)]
enum Combine {
    /// Every operand's terms appear in the result (`add`, `sub`, `where`).
    Sum,
    /// The result's terms are products of one term of each operand (`mul`).
    Product,
    /// The result is a function of its operands no term passes through (`exp`, `eq`).
    Opaque,
}

/// The operand names of a call that are no operand of its arithmetic (a selection's mask).
fn is_condition(name: &str) -> bool {
    matches!(name, "condition" | "mask")
}

/// The analysis of one graph: a [`Flow`] per value.
pub(super) struct Flows {
    flows: Vec<Vec<Option<Flow>>>,
}

/// What a call gives its rule: operands with their names and dims, and where to pin.
struct Site<'c, 'a> {
    c: &'c Call<'a>,
    operands: Vec<(&'c str, ValueId, Flow, Vec<Mono>)>,
    literal: bool,
    pins: &'c mut Vec<(Mono, String)>,
    here: String,
}

impl Site<'_, '_> {
    fn pin(&mut self, m: &Mono, what: &str) {
        if !m.is_one() {
            self.pins
                .push((m.clone(), format!("{SIZE_VALUE_PIN}: {} {what}", self.here)));
        }
    }

    fn operand(&self, name: &str) -> Option<&(&str, ValueId, Flow, Vec<Mono>)> {
        self.operands.iter().find(|(n, _, _, _)| *n == name)
    }

    fn first(&self) -> Option<&(&str, ValueId, Flow, Vec<Mono>)> {
        self.operand("self")
            .or_else(|| self.operand("input"))
            .or_else(|| self.operands.first())
    }

    fn out_dims(&self, k: usize) -> Vec<Mono> {
        self.c.result.get(k).cloned().unwrap_or_default()
    }
}

impl Flows {
    /// No value known yet, for a graph of `nodes` nodes.
    pub(super) fn new(nodes: usize) -> Flows {
        Flows {
            flows: vec![Vec::new(); nodes],
        }
    }

    /// Sets node `i`'s only output.
    pub(super) fn set(&mut self, i: usize, f: Flow) {
        self.flows[i] = vec![Some(f)];
    }

    fn get(&self, v: ValueId, rank: usize) -> Flow {
        self.flows
            .get(v.node)
            .and_then(|o| o.get(v.output))
            .cloned()
            .flatten()
            .unwrap_or_else(|| Flow::unknown(rank))
    }

    fn norm(&self, sizes: &Sizes, m: &Mono) -> Mono {
        sizes.norm(m)
    }

    /// Classifies call `c` (its tensor operands by argument name, whether it writes a numeric
    /// literal) and pushes every size it reads through data to `pins`.
    pub(super) fn call(
        &mut self,
        c: &Call<'_>,
        operands: &[(&str, ValueId)],
        literal: bool,
        pins: &mut Vec<(Mono, String)>,
    ) {
        let dims_of = |v: ValueId| c.dims_of(v);
        let ops: Vec<(&str, ValueId, Flow, Vec<Mono>)> = operands
            .iter()
            .map(|&(n, v)| {
                let d = dims_of(v);
                (n, v, self.get(v, d.len()), d)
            })
            .collect();
        let mut site = Site {
            c,
            operands: ops,
            literal,
            pins,
            here: super::super::location(c.g, c.i),
        };
        let outs = c.result.len().max(1);
        let out = self.rule(&mut site);
        let mut out = out.unwrap_or_else(|| {
            (0..outs)
                .map(|k| Flow::unknown(site.out_dims(k).len()))
                .collect()
        });
        out.resize_with(outs, Flow::default);
        for (k, f) in out.iter_mut().enumerate() {
            // A dim of one element repeats nothing (broadcasting it is [`Flow::along`]'s).
            for (d, m) in site.out_dims(k).iter().enumerate() {
                if m.is_one() {
                    if let Some(r) = f.rep.get_mut(d) {
                        *r = false;
                    }
                    if let Some(r) = f.same.get_mut(d) {
                        *r = false;
                    }
                }
            }
            for m in f.mean_of.iter_mut() {
                *m = c.sizes.norm(m);
            }
            for (m, _) in f.degree.iter_mut() {
                *m = c.sizes.norm(m);
            }
            f.degree.retain(|(_, d)| *d > 0);
        }
        // Positions of degree 2 or more: a polynomial with a root at every reduced position.
        for f in &out {
            for (m, d) in &f.degree {
                if *d >= SATURATED {
                    site.pin(m, "computes a polynomial of degree 2 or more (or a quotient) in the positions of an `arange`: it may vanish at every position of a reduced one");
                }
            }
        }
        self.flows[c.i] = out.into_iter().map(Some).collect();
    }

    fn rule(&self, s: &mut Site<'_, '_>) -> Option<Vec<Flow>> {
        let base = s.c.base;
        let out0 = s.out_dims(0);
        let rank = out0.len();
        if super::CREATED.contains(&base) {
            return Some(vec![Flow::constant(rank)]);
        }
        if base == "aten.arange" {
            let mut f = Flow::constant(rank);
            f.same = vec![false; rank];
            if let Some(m) = out0.first() {
                f.degree.push((self.norm(s.c.sizes, m), 1));
            }
            return Some(vec![f]);
        }
        if s.operands.is_empty() {
            // Nothing in, not created: a received buffer, plain data (the sender keeps what
            // it may carry).
            return Some(vec![Flow::input(rank)]);
        }
        if super::REDUCING.contains(&base) {
            return self.reduction(s);
        }
        if matches!(base, "aten.mm" | "aten.bmm" | "aten.addmm") {
            return self.contraction(s);
        }
        if base == "shardproof_p2p.send" {
            if let Some((_, _, f, dims)) = s.first().cloned() {
                for (k, m) in dims.iter().enumerate() {
                    if f.rep.get(k).copied().unwrap_or(true) {
                        s.pin(m, "sends a tensor a term may repeat along (a count there)");
                    }
                }
                for (m, d) in &f.degree {
                    if *d > 0 {
                        s.pin(m, "sends a tensor holding positions of an `arange`");
                    }
                }
                for m in &f.mean_of {
                    s.pin(m, "sends a tensor a mean scaled by its count");
                }
            }
            return None;
        }
        if VALUE_KEEPING.contains(&base)
            || matches!(base, "aten.split" | "aten.split_with_sizes" | "aten.cat")
        {
            return self.movement(s);
        }
        if matches!(
            base,
            "aten._softmax"
                | "aten._log_softmax"
                | "aten._softmax_backward_data"
                | "aten._log_softmax_backward_data"
        ) {
            return self.row_function(s);
        }
        if ELEMENTWISE.contains(&base) {
            return Some(vec![self.elementwise(s)]);
        }
        self.other(s)
    }

    /// `sum`, `mean`, `prod`, `amax`, `amin`, `logsumexp` over the dims `dim` names.
    fn reduction(&self, s: &mut Site<'_, '_>) -> Option<Vec<Flow>> {
        let base = s.c.base;
        let (_, _, f, dims) = s.operand("self")?.clone();
        let picked: Vec<usize> = match s
            .c
            .arg("dim")
            .and_then(|a| a.as_int_list().or_else(|| a.as_int().map(|d| vec![d])))
        {
            Some(ds) if !ds.is_empty() => {
                ds.iter().filter_map(|&d| norm_dim(d, dims.len())).collect()
            }
            _ => (0..dims.len()).collect(),
        };
        let keepdim =
            s.c.arg("keepdim")
                .and_then(|a| a.as_bool())
                .unwrap_or(false);
        let mut out = Flow {
            degree: f.degree.clone(),
            mean_of: f.mean_of.clone(),
            ..Flow::default()
        };
        for (k, m) in dims.iter().enumerate() {
            let rep = f.rep.get(k).copied().unwrap_or(true);
            let same = f.same.get(k).copied().unwrap_or(true);
            if !picked.contains(&k) {
                out.rep.push(rep);
                out.same.push(same);
                continue;
            }
            // The largest (smallest) of positions along their own dim is a function of their
            // length (`max_i i = n - 1`), not a sum over positions of a polynomial in each,
            // whose degree 1 the rows' symbols keep apart.
            let along = self.norm(s.c.sizes, m);
            if matches!(base, "aten.amax" | "aten.amin")
                && f.degree.iter().any(|(l, d)| *d >= 1 && *l == along)
            {
                s.pin(
                    m,
                    "reduces positions along their own dim: the result reads their count",
                );
            }
            match base {
                "aten.sum" if rep => {
                    s.pin(m, "sums a tensor a term repeats along: the sum counts the elements");
                }
                "aten.prod" if rep => s.pin(
                    m,
                    "multiplies a tensor a factor repeats along: the product raises it to the count",
                ),
                "aten.logsumexp" if same => s.pin(
                    m,
                    "takes the logsumexp of a tensor constant along the dim: it adds the log of the count",
                ),
                "aten.mean" => add_class(&mut out.mean_of, self.norm(s.c.sizes, m)),
                _ => {}
            }
            if keepdim {
                out.rep.push(true);
                out.same.push(true);
            }
        }
        Some(vec![out])
    }

    /// `mm`, `bmm`, `addmm`: a sum over the contracted dim of products.
    fn contraction(&self, s: &mut Site<'_, '_>) -> Option<Vec<Flow>> {
        let (a, b) = if s.c.base == "aten.addmm" {
            ("mat1", "mat2")
        } else {
            ("self", "mat2")
        };
        let (_, _, fa, da) = s.operand(a)?.clone();
        let (_, _, fb, db) = s.operand(b)?.clone();
        let ra = da.len();
        let rb = db.len();
        if ra < 2 || rb < 2 {
            return None;
        }
        let rep = |f: &Flow, k: usize| f.rep.get(k).copied().unwrap_or(true);
        let same = |f: &Flow, k: usize| f.same.get(k).copied().unwrap_or(true);
        if rep(&fa, ra - 1) && rep(&fb, rb - 2) {
            s.pin(
                &da[ra - 1],
                "contracts two tensors a term repeats along: the sum counts the elements",
            );
        }
        let mut out = Flow::default();
        // Batch dims (bmm): a product's term repeats where both factors' do.
        for k in 0..ra - 2 {
            out.rep.push(rep(&fa, k) && rep(&fb, k));
            out.same.push(same(&fa, k) && same(&fb, k));
        }
        out.rep.push(rep(&fa, ra - 2));
        out.same.push(same(&fa, ra - 2));
        out.rep.push(rep(&fb, rb - 1));
        out.same.push(same(&fb, rb - 1));
        out.degree = sum_degree([&fa, &fb].into_iter());
        out.mean_of = union_mean(&[&fa, &fb]);
        if s.c.base == "aten.addmm" {
            if let Some((_, _, fc, dc)) = s.operand("self").cloned() {
                let n = out.rep.len();
                for k in 0..n {
                    let (r, sm) = fc.along(&dc, n, k);
                    out.rep[k] |= r;
                    out.same[k] &= sm;
                }
                out.degree = max_degree([&out.clone(), &fc].into_iter());
                add_all(&mut out.mean_of, &fc.mean_of);
            }
        }
        Some(vec![out])
    }

    /// Movements: each output dim from the input dims it is made of.
    fn movement(&self, s: &mut Site<'_, '_>) -> Option<Vec<Flow>> {
        let base = s.c.base;
        if base == "aten.cat" {
            let n = s.out_dims(0).len();
            let mut out = Flow {
                rep: vec![false; n],
                same: vec![true; n],
                ..Flow::default()
            };
            let fs: Vec<&Flow> = s.operands.iter().map(|(_, _, f, _)| f).collect();
            for (_, _, f, d) in &s.operands {
                for k in 0..n {
                    let (r, sm) = if d.len() == n {
                        (
                            f.rep.get(k).copied().unwrap_or(true),
                            f.same.get(k).copied().unwrap_or(true),
                        )
                    } else {
                        (true, true)
                    };
                    out.rep[k] |= r;
                    out.same[k] &= sm;
                }
            }
            out.degree = max_degree(fs.iter().copied());
            out.mean_of = union_mean(&fs);
            return Some(vec![out]);
        }
        let (_, _, f, din) = s.first()?.clone();
        let outs = s.c.result.len().max(1);
        let mut res = Vec::new();
        for k in 0..outs {
            let dout = s.out_dims(k);
            let (rep, same) = self.moved(s, base, &f, &din, &dout);
            res.push(Flow {
                rep,
                same,
                degree: f.degree.clone(),
                mean_of: f.mean_of.clone(),
            });
        }
        Some(res)
    }

    fn moved(
        &self,
        s: &Site<'_, '_>,
        base: &str,
        f: &Flow,
        din: &[Mono],
        dout: &[Mono],
    ) -> (Vec<bool>, Vec<bool>) {
        let at = |k: usize| {
            (
                f.rep.get(k).copied().unwrap_or(true),
                f.same.get(k).copied().unwrap_or(true),
            )
        };
        let n = dout.len();
        let same_rank = din.len() == n;
        match base {
            "aten.permute" if same_rank => {
                if let Some(p) = s.c.arg("dims").and_then(|a| a.as_int_list()) {
                    let ks: Vec<Option<usize>> = p.iter().map(|&d| norm_dim(d, n)).collect();
                    if ks.iter().all(Option::is_some) && ks.len() == n {
                        return ks.iter().map(|k| at(k.unwrap_or(0))).unzip();
                    }
                }
            }
            "aten.transpose" | "aten.t" if same_rank => {
                let d0 = s.c.arg("dim0").and_then(|a| a.as_int()).unwrap_or(0);
                let d1 = s.c.arg("dim1").and_then(|a| a.as_int()).unwrap_or(1);
                if let (Some(a), Some(b)) = (norm_dim(d0, n), norm_dim(d1, n)) {
                    return (0..n)
                        .map(|k| {
                            at(if k == a {
                                b
                            } else if k == b {
                                a
                            } else {
                                k
                            })
                        })
                        .unzip();
                }
            }
            "aten.expand" => {
                return (0..n).map(|k| f.along(din, n, k)).unzip();
            }
            "aten.slice"
            | "aten.split"
            | "aten.split_with_sizes"
            | "aten.clone"
            | "aten.contiguous"
            | "aten.detach"
            | "aten.alias"
                if same_rank =>
            {
                return (0..n).map(at).unzip();
            }
            _ => {}
        }
        // A view: the dims other than 1 grouped into blocks of equal element counts (in
        // order, as a row-major reshape does). A dim of its own block keeps its flags; a
        // merge repeats what any part repeats and is the same where every part is; a split
        // part repeats and is the same where the whole dim is; anything else, where any of
        // the block does.
        let size = |m: &Mono| s.c.sizes.original(m);
        let ins: Vec<usize> = (0..din.len()).filter(|&k| size(&din[k]) > 1).collect();
        let outs: Vec<usize> = (0..n).filter(|&k| size(&dout[k]) > 1).collect();
        let mut rep = vec![true; n];
        let mut same = vec![true; n];
        let (mut i, mut j) = (0, 0);
        while i < ins.len() && j < outs.len() {
            let (mut bi, mut bj) = (vec![ins[i]], vec![outs[j]]);
            let (mut pi, mut pj) = (size(&din[ins[i]]), size(&dout[outs[j]]));
            i += 1;
            j += 1;
            while pi != pj {
                if pi < pj && i < ins.len() {
                    pi = pi.saturating_mul(size(&din[ins[i]]));
                    bi.push(ins[i]);
                    i += 1;
                } else if pj < pi && j < outs.len() {
                    pj = pj.saturating_mul(size(&dout[outs[j]]));
                    bj.push(outs[j]);
                    j += 1;
                } else {
                    break;
                }
            }
            let any_rep = bi.iter().any(|&k| at(k).0);
            let all_same = bi.iter().all(|&k| at(k).1);
            for &ko in &bj {
                if pi != pj || (bi.len() > 1 && bj.len() > 1) {
                    rep[ko] = any_rep;
                    same[ko] = any_rep;
                } else {
                    rep[ko] = any_rep;
                    same[ko] = all_same;
                }
            }
        }
        (rep, same)
    }

    /// Elementwise operators, by how they combine their operands' terms.
    fn elementwise(&self, s: &mut Site<'_, '_>) -> Flow {
        let base = s.c.base;
        let n = s.out_dims(0).len();
        let combine = match base {
            "aten.add" | "aten.sub" | "aten.rsub" | "aten.where" | "aten.masked_fill"
            | "aten.neg" | "aten.clone" | "aten.contiguous" | "aten.detach" | "aten.alias"
            | "aten._to_copy" | "aten.triu" | "aten.tril" => Combine::Sum,
            "_c10d_functional.all_reduce" | "_c10d_functional.wait_tensor" => Combine::Sum,
            "aten.mul" => Combine::Product,
            _ => Combine::Opaque,
        };
        let arith: Vec<(&str, Flow, Vec<Mono>)> = s
            .operands
            .iter()
            .map(|(nm, _, f, d)| (*nm, f.clone(), d.clone()))
            .collect();
        let mut out = Flow {
            rep: vec![false; n],
            same: vec![true; n],
            ..Flow::default()
        };
        // A written numeric literal is an operand broadcast along every dim.
        let lit = s.literal && !matches!(base, "aten.triu" | "aten.tril");
        for k in 0..n {
            let mut reps = Vec::new();
            let mut sames = Vec::new();
            for (nm, f, d) in &arith {
                let (r, sm) = f.along(d, n, k);
                sames.push(sm);
                if !is_condition(nm) || combine == Combine::Opaque {
                    reps.push(r);
                }
            }
            if lit {
                reps.push(true);
                sames.push(true);
            }
            let all_same = sames.iter().all(|x| *x);
            out.same[k] = all_same;
            out.rep[k] = match combine {
                Combine::Sum => reps.iter().any(|x| *x) || all_same,
                Combine::Product => reps.iter().all(|x| *x),
                Combine::Opaque => all_same,
            };
        }
        if matches!(base, "aten.triu" | "aten.tril") {
            for k in n.saturating_sub(2)..n {
                out.same[k] = false;
            }
        }
        let value_flows: Vec<&Flow> = arith
            .iter()
            .filter(|(nm, _, _)| !is_condition(nm))
            .map(|(_, f, _)| f)
            .collect();
        match base {
            "aten.mul" => {
                out.degree = sum_degree(value_flows.iter().copied());
                out.mean_of = union_mean(&value_flows);
            }
            "aten.div" => {
                let num = s.operand("self").map(|o| o.2.clone()).unwrap_or_default();
                let den = s.operand("other").map(|o| o.2.clone());
                out.degree = num.degree.clone();
                out.mean_of = num.mean_of.clone();
                if let Some(den) = den {
                    for (m, d) in &den.degree {
                        if *d > 0 {
                            out.degree.retain(|(c, _)| c != m);
                            out.degree.push((m.clone(), SATURATED));
                        }
                    }
                    for m in &den.mean_of {
                        s.pin(m, "divides by a tensor a mean scaled by `1/n`: the quotient reads the count `n`");
                    }
                }
                // A quotient's terms are the numerator's times an opaque reciprocal (a
                // literal divisor's is a number).
                if let Some((_, _, fa, da)) = s.operand("self").cloned() {
                    let den = s.operand("other").cloned();
                    for k in 0..n {
                        let den_same = den
                            .as_ref()
                            .is_none_or(|(_, _, fb, db)| fb.along(db, n, k).1);
                        out.rep[k] = fa.along(&da, n, k).0 && den_same;
                    }
                }
            }
            "aten.pow" => {
                let exp =
                    s.c.arg("exponent")
                        .and_then(|a| a.as_f64())
                        .filter(|e| e.fract() == 0.0);
                let fa = s.operand("self").map(|o| o.2.clone()).unwrap_or_default();
                match exp {
                    Some(e) if e >= 1.0 => {
                        let k = e.min(f64::from(SATURATED)) as u8;
                        out.degree = fa
                            .degree
                            .iter()
                            .map(|(m, d)| (m.clone(), d.saturating_mul(k).min(SATURATED)))
                            .collect();
                        out.mean_of = fa.mean_of.clone();
                        if let Some((_, _, f, d)) = s.operand("self").cloned() {
                            for kk in 0..n {
                                out.rep[kk] = f.along(&d, n, kk).0;
                            }
                        }
                    }
                    Some(e) if e < 0.0 => {
                        for m in &fa.mean_of {
                            s.pin(m, "raises a tensor a mean scaled by `1/n` to a negative power: the result reads the count `n`");
                        }
                    }
                    _ => {}
                }
            }
            "aten.reciprocal" => {
                let fa = s.first().map(|o| o.2.clone()).unwrap_or_default();
                for m in &fa.mean_of {
                    s.pin(m, "takes the reciprocal of a tensor a mean scaled by `1/n`: the result reads the count `n`");
                }
            }
            "aten.where" | "aten.masked_fill" => {
                // `where(c, a, b) = b + c·a - c·b`: `b`'s terms, and `a`'s times the
                // condition's (a mask of positions varies along them: its terms do not repeat).
                let (cond, a, b) = if base == "aten.where" {
                    ("condition", "self", "other")
                } else {
                    ("mask", "value", "self")
                };
                let part = |nm: &str, k: usize| {
                    s.operand(nm)
                        .map_or((true, true), |(_, _, f, d)| f.along(d, n, k))
                };
                for k in 0..n {
                    let (rc, _) = part(cond, k);
                    let (ra, _) = part(a, k);
                    let (rb, _) = part(b, k);
                    out.rep[k] = rb || (rc && ra);
                }
                out.degree = max_degree(value_flows.iter().copied());
                out.mean_of = union_mean(&value_flows);
            }
            _ if combine == Combine::Sum => {
                out.degree = max_degree(value_flows.iter().copied());
                out.mean_of = union_mean(&value_flows);
            }
            _ => {
                // Comparisons, boolean and opaque functions: not polynomials in positions
                // (not tracked); a position compared with a literal is kept.
                let compared = super::COMPARING.contains(&base);
                if compared && s.literal {
                    let deg = max_degree(value_flows.iter().copied());
                    for (m, d) in &deg {
                        if *d > 0 {
                            s.pin(m, "compares positions of an `arange` with a literal");
                        }
                    }
                }
                if base.ends_with("_backward") {
                    // `grad · f'(x)` as the executor writes it: `tanh_backward` is `g - g·y²`
                    // and `gelu_backward` holds `g/2`, so they repeat what the gradient does;
                    // `sigmoid_backward` is `g·y - g·y²`; `threshold_backward` and
                    // `silu_backward` are the gradient times opaque atoms of `x`.
                    if let Some((_, _, fg, dg)) = s.operand("grad_output").cloned() {
                        let other = s
                            .operands
                            .iter()
                            .find(|(nm, _, _, _)| *nm != "grad_output")
                            .cloned();
                        for k in 0..n {
                            let rg = fg.along(&dg, n, k).0;
                            let (ro, so) = other
                                .as_ref()
                                .map_or((true, true), |(_, _, fo, d)| fo.along(d, n, k));
                            out.rep[k] = match base {
                                "aten.tanh_backward" | "aten.gelu_backward" => rg,
                                "aten.sigmoid_backward" => rg && ro,
                                _ => rg && so,
                            };
                        }
                        // A polynomial in `x` of degree 2 at most (`g·y²`).
                        let fo = s
                            .operands
                            .iter()
                            .find(|(nm, _, _, _)| *nm != "grad_output")
                            .map(|o| o.2.clone())
                            .unwrap_or_default();
                        out.degree = sum_degree([&fg, &fo, &fo].into_iter());
                        out.mean_of = fg.mean_of.clone();
                    }
                }
            }
        }
        for k in 0..n {
            out.rep[k] |= out.same[k];
        }
        out
    }

    /// Softmax and log-softmax and their backward along `dim`.
    fn row_function(&self, s: &mut Site<'_, '_>) -> Option<Vec<Flow>> {
        let base = s.c.base;
        let n = s.out_dims(0).len();
        let d = s.c.arg("dim").and_then(|a| a.as_int()).unwrap_or(-1);
        let dim = norm_dim(d, n)?;
        let dm = s.out_dims(0).get(dim).cloned()?;
        let mut out = Flow::default();
        match base {
            "aten._softmax" | "aten._log_softmax" => {
                let (_, _, f, dd) = s.first()?.clone();
                for k in 0..n {
                    let (r, sm) = f.along(&dd, n, k);
                    out.same.push(sm);
                    // log-softmax subtracts the row's logsumexp from every element.
                    out.rep
                        .push(sm || (base == "aten._log_softmax" && (k == dim || r)));
                }
                if f.along(&dd, n, dim).1 {
                    // A constant row: each element is `1/n` (a mean's single reading).
                    add_class(&mut out.mean_of, self.norm(s.c.sizes, &dm));
                }
            }
            _ => {
                // `g·y - y·Σ(g·y)` / `g - exp(y)·Σ g`: a row sum of the gradient's terms.
                let (_, _, fg, dg) = s.operand("grad_output")?.clone();
                let (_, _, fy, dy) = s.operand("output")?.clone();
                let summed = if base == "aten._softmax_backward_data" {
                    fg.along(&dg, n, dim).0 && fy.along(&dy, n, dim).0
                } else {
                    fg.along(&dg, n, dim).0
                };
                if summed {
                    s.pin(&dm, "sums a gradient a term repeats along inside a softmax's backward: the sum counts the elements");
                }
                for k in 0..n {
                    let (rg, sg) = fg.along(&dg, n, k);
                    let (ry, sy) = fy.along(&dy, n, k);
                    out.rep.push(rg || ry || k == dim);
                    out.same.push(sg && sy);
                }
                out.degree = max_degree([&fg, &fy].into_iter());
                out.mean_of = union_mean(&[&fg, &fy]);
            }
        }
        Some(vec![out])
    }

    /// Norms, losses, lookups, collectives: the rows they sum keep their size where a term
    /// repeats along them; their results may repeat anything they are not known not to.
    fn other(&self, s: &mut Site<'_, '_>) -> Option<Vec<Flow>> {
        let base = s.c.base;
        let outs = s.c.result.len().max(1);
        let out_flows = |s: &Site<'_, '_>| -> Vec<Flow> {
            (0..outs)
                .map(|k| Flow::unknown(s.out_dims(k).len()))
                .collect()
        };
        match base {
            "aten.native_layer_norm" => {
                // `(x - μ)·rstd·w + b`: along the rows, x's terms (and b's, broadcast);
                // along the normalized dims μ·rstd repeats.
                let (_, _, fx, dx) = s.operand("input")?.clone();
                let bias = s.operand("bias").is_some();
                let norm_rank =
                    s.c.arg("normalized_shape")
                        .and_then(|a| a.as_int_list())
                        .map_or(1, |l| l.len());
                let mut res = out_flows(s);
                let rows = dx.len().saturating_sub(norm_rank);
                for (k, f) in res.iter_mut().enumerate() {
                    let n = s.out_dims(k).len();
                    for kk in 0..n.min(rows) {
                        f.rep[kk] = fx.rep.get(kk).copied().unwrap_or(true) || (k == 0 && bias);
                        f.same[kk] = fx.same.get(kk).copied().unwrap_or(true);
                    }
                }
                Some(res)
            }
            "aten.native_layer_norm_backward" | "aten.embedding_dense_backward" => {
                // The bias's (a table's) gradient sums the output gradient over the rows.
                let (_, _, fg, dg) = s.operand("grad_output")?.clone();
                let inner = if base == "aten.embedding_dense_backward" {
                    1
                } else {
                    s.c.arg("normalized_shape")
                        .and_then(|a| a.as_int_list())
                        .map_or(1, |l| l.len())
                };
                for (k, m) in dg.iter().enumerate().take(dg.len().saturating_sub(inner)) {
                    if fg.rep.get(k).copied().unwrap_or(true) {
                        s.pin(m, "sums a gradient a term repeats along over the rows: the sum counts them");
                    }
                }
                Some(out_flows(s))
            }
            "aten.nll_loss_forward" => {
                let (_, _, fx, dx) = s.operand("self")?.clone();
                if let Some(m) = dx.first().filter(|_| dx.len() >= 2) {
                    if fx.rep.first().copied().unwrap_or(true) {
                        s.pin(
                            m,
                            "sums a loss over rows a term repeats along: the sum counts them",
                        );
                    }
                }
                Some(out_flows(s))
            }
            "aten.nll_loss_backward" | "aten.embedding" => {
                // One label's (token's) indicator or row per element: nothing repeats along
                // the rows but what the table or the gradient repeats.
                let mut res = out_flows(s);
                if let Some(f) = res.first_mut() {
                    f.rep.iter_mut().for_each(|r| *r = false);
                    f.same.iter_mut().for_each(|r| *r = false);
                    if base == "aten.embedding" {
                        if let (Some((_, _, fw, _)), Some(last)) =
                            (s.operand("weight").cloned(), f.rep.len().checked_sub(1))
                        {
                            f.rep[last] = fw.rep.last().copied().unwrap_or(true);
                            f.same[last] = fw.same.last().copied().unwrap_or(true);
                        }
                    }
                }
                Some(res)
            }
            _ if base.starts_with("_c10d_functional.") => {
                // Collectives sum, gather or scatter across ranks: the mesh is never reduced.
                let (_, _, f, d) = s.first()?.clone();
                let mut res = out_flows(s);
                for (k, r) in res.iter_mut().enumerate() {
                    if s.out_dims(k).len() == d.len() {
                        r.rep = f.rep.clone();
                        r.same = f.same.clone();
                    }
                    r.degree = f.degree.clone();
                    r.mean_of = f.mean_of.clone();
                }
                Some(res)
            }
            _ => {
                // Anything else may repeat any term, and passes on what its operands carry.
                let fs: Vec<&Flow> = s.operands.iter().map(|(_, _, f, _)| f).collect();
                let degree = max_degree(fs.iter().copied());
                let mean_of = union_mean(&fs);
                let mut res = out_flows(s);
                for r in &mut res {
                    r.degree = degree.clone();
                    r.mean_of = mean_of.clone();
                }
                Some(res)
            }
        }
    }
}

fn add_all(into: &mut Vec<Mono>, from: &[Mono]) {
    for m in from {
        add_class(into, m.clone());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_broadcast_dim_repeats() {
        let f = Flow::input(1);
        let dims = vec![Mono::var(0)];
        assert_eq!(f.along(&dims, 2, 0), (true, true));
        assert_eq!(f.along(&dims, 2, 1), (false, false));
        assert_eq!(f.along(&[Mono::constant(1)], 1, 0), (true, true));
    }

    #[test]
    fn degrees_add_in_products_and_take_the_largest_in_sums() {
        let m = Mono::var(0);
        let a = Flow {
            degree: vec![(m.clone(), 1)],
            ..Flow::default()
        };
        assert_eq!(
            degree_of(
                &Flow {
                    degree: sum_degree([&a, &a].into_iter()),
                    ..Flow::default()
                },
                &m
            ),
            2
        );
        assert_eq!(
            degree_of(
                &Flow {
                    degree: max_degree([&a, &a].into_iter()),
                    ..Flow::default()
                },
                &m
            ),
            1
        );
    }
}
