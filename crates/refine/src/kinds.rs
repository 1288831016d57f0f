//! Which elements of the implementation's tensors are exactly zero: an abstract interpretation
//! of the ranks' lowered terms over element kinds (zero, positive, non-negative, finite, -inf,
//! anything).
//!
//! Ring attention's backward multiplies whole blocks of recomputed probabilities, some of which
//! the causal mask hides: `exp(scores + mask - lse)` is zero wherever the mask is `-inf`, and so
//! is every product of such an element with a finite one. The e-graphs can only see that by
//! unfolding each block's definition down to the mask; this analysis follows every rank's
//! program once, from its inputs (finite reals) and constants (evaluated exactly), and hands the
//! e-graphs the regions of rank tensors that are zero for every input.
//!
//! The semantics are the engine's: inputs are finite reals and values are exact reals (no
//! float overflow or underflow). Infinities come from constants, a logarithm of zero or a
//! division by zero; only the operators with a rule here, and those of [`FINITE_OPS`] over
//! finite arguments, are known to keep values finite: every other operator's output may be
//! anything. Random draws are never constants.

use crate::eval::eval;
use crate::lower::{Tpl, ValueRef};
use crate::term::{Shapes, Term, GET, LIST};
use egg::{EGraph, Id, RecExpr, Symbol};
use shardproof_ir::DType;
use shardproof_ops::{Meta, Tensor};
use std::collections::HashMap;
use std::sync::Arc;

/// The most elements the analysis tracks one by one; larger tensors get one kind for all.
const MAX_ELEMS: usize = 1 << 16;

/// What an element is known to be, for every input of the program.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Kind {
    /// Exactly zero.
    Zero,
    /// Finite and positive.
    Pos,
    /// Finite and not negative.
    NonNeg,
    /// Finite.
    Finite,
    /// Exactly `-inf`.
    NegInf,
    /// Anything (also `+inf` or NaN).
    Any,
}

use Kind::*;

impl Kind {
    /// The kind of a known number.
    pub fn of(x: f64) -> Kind {
        if x == 0.0 {
            Zero
        } else if x == f64::NEG_INFINITY {
            NegInf
        } else if !x.is_finite() {
            Any
        } else if x > 0.0 {
            Pos
        } else {
            Finite
        }
    }

    fn finite(self) -> bool {
        matches!(self, Zero | Pos | NonNeg | Finite)
    }

    fn non_neg(self) -> bool {
        matches!(self, Zero | Pos | NonNeg)
    }

    /// The least kind that holds both.
    fn join(a: Kind, b: Kind) -> Kind {
        match (a, b) {
            _ if a == b => a,
            (Any, _) | (_, Any) | (NegInf, _) | (_, NegInf) => Any,
            _ if a.non_neg() && b.non_neg() => NonNeg,
            _ => Finite,
        }
    }

    fn neg(self) -> Kind {
        match self {
            Zero => Zero,
            Pos | NonNeg | Finite => Finite,
            NegInf | Any => Any,
        }
    }

    fn add(a: Kind, b: Kind) -> Kind {
        match (a, b) {
            (Any, _) | (_, Any) => Any,
            (Zero, x) | (x, Zero) => x,
            (NegInf, _) | (_, NegInf) => NegInf,
            (Pos, x) | (x, Pos) if x.non_neg() => Pos,
            (NonNeg, NonNeg) => NonNeg,
            _ => Finite,
        }
    }

    fn mul(a: Kind, b: Kind) -> Kind {
        match (a, b) {
            (Any, _) | (_, Any) => Any,
            (Zero, x) | (x, Zero) if x.finite() => Zero,
            (NegInf, Pos) | (Pos, NegInf) => NegInf,
            (NegInf, _) | (_, NegInf) => Any,
            (Pos, Pos) => Pos,
            _ if a.non_neg() && b.non_neg() => NonNeg,
            _ => Finite,
        }
    }

    fn maximum(a: Kind, b: Kind) -> Kind {
        match (a, b) {
            (Any, _) | (_, Any) => Any,
            (NegInf, x) | (x, NegInf) => x,
            (Pos, _) | (_, Pos) => Pos,
            _ if a == b => a,
            _ => NonNeg,
        }
    }

    fn minimum(a: Kind, b: Kind) -> Kind {
        match (a, b) {
            (Any, _) | (_, Any) => Any,
            (NegInf, _) | (_, NegInf) => NegInf,
            _ if a == b => a,
            (Zero, x) | (x, Zero) if x.non_neg() => Zero,
            _ if a.non_neg() && b.non_neg() => NonNeg,
            _ => Finite,
        }
    }

    /// `a / b`: only a positive divisor is known to be safe.
    fn div(a: Kind, b: Kind) -> Kind {
        match (a, b) {
            (x, Pos) => x,
            _ => Any,
        }
    }

    fn exp(self) -> Kind {
        match self {
            NegInf => Zero,
            Any => Any,
            _ => Pos,
        }
    }

    /// `1 / (1 + exp(-x))`: positive for every real `x`, zero at `-inf`.
    fn sigmoid(self) -> Kind {
        match self {
            NegInf => Zero,
            Any => Any,
            _ => Pos,
        }
    }

    fn log(self) -> Kind {
        match self {
            Pos => Finite,
            Zero => NegInf,
            _ => Any,
        }
    }

    /// `x * c` for a number `c`.
    fn scaled(self, c: f64) -> Kind {
        if !c.is_finite() {
            return Kind::mul(self, Kind::of(c));
        }
        if c == 0.0 {
            return if self.finite() { Zero } else { Any };
        }
        if c > 0.0 {
            self
        } else {
            self.neg()
        }
    }

    /// `x ** e` for a number `e`.
    fn pow(self, e: f64) -> Kind {
        if !e.is_finite() {
            return Any;
        }
        let int = e.fract() == 0.0;
        match self {
            Any | NegInf => Any,
            Pos => Pos,
            Zero if e > 0.0 => Zero,
            _ if e > 0.0 && int && (e as i64) % 2 == 0 => NonNeg,
            NonNeg if e > 0.0 => NonNeg,
            _ if e > 0.0 && int => Finite,
            _ => Any,
        }
    }

    /// Log-sum-exp of two: finite when either is finite.
    fn lse(a: Kind, b: Kind) -> Kind {
        match (a, b) {
            (Any, _) | (_, Any) => Any,
            (NegInf, NegInf) => NegInf,
            _ => Finite,
        }
    }
}

/// What the analysis knows of one tensor.
#[derive(Clone, Debug)]
pub enum Abs {
    /// Its exact value: computed from constants only.
    Exact(Tensor),
    /// One kind for every element.
    Uniform(Meta, Kind),
    /// A kind per element, in row-major order.
    Elems(Meta, Vec<Kind>),
}

impl Abs {
    /// The tensor's meta.
    pub fn meta(&self) -> &Meta {
        match self {
            Abs::Exact(t) => &t.meta,
            Abs::Uniform(m, _) | Abs::Elems(m, _) => m,
        }
    }

    /// The kind of every element (`None` past [`MAX_ELEMS`] unless uniform).
    fn kinds(&self) -> Option<Vec<Kind>> {
        let n = self.meta().numel();
        match self {
            Abs::Exact(t) if n <= MAX_ELEMS => Some(t.data.iter().map(|&x| Kind::of(x)).collect()),
            Abs::Uniform(_, k) if n <= MAX_ELEMS => Some(vec![*k; n]),
            Abs::Elems(_, ks) => Some(ks.clone()),
            _ => None,
        }
    }

    /// One kind that holds every element.
    fn joined(&self) -> Kind {
        match self {
            Abs::Uniform(_, k) => *k,
            Abs::Exact(t) if !t.meta.dtype.is_float() => Any,
            Abs::Exact(t) => fold(t.data.iter().map(|&x| Kind::of(x)), Kind::join).unwrap_or(Any),
            Abs::Elems(_, ks) => fold(ks.iter().copied(), Kind::join).unwrap_or(Any),
        }
    }

    /// Kinds, compacted to one kind when all are equal.
    fn from_kinds(meta: Meta, ks: Vec<Kind>) -> Abs {
        match ks.first() {
            Some(&k) if ks.iter().all(|&x| x == k) => Abs::Uniform(meta, k),
            _ => Abs::Elems(meta, ks),
        }
    }
}

fn fold(mut it: impl Iterator<Item = Kind>, f: fn(Kind, Kind) -> Kind) -> Option<Kind> {
    let first = it.next()?;
    Some(it.fold(first, f))
}

/// A child of a term while it is being interpreted.
#[derive(Clone)]
enum Val {
    Tensor(Arc<Abs>),
    /// The outputs of a multi-output call.
    Tuple(Vec<Arc<Abs>>),
    /// A literal argument, kept as its template.
    Lit(Tpl),
}

/// Interprets a lowered term over its input values' abstractions; `None` when an input is
/// unknown or the term is ill-formed.
pub fn interpret(t: &Tpl, value: &dyn Fn(ValueRef) -> Option<Arc<Abs>>) -> Option<Abs> {
    match val(t, value)? {
        Val::Tensor(a) => Some(Arc::unwrap_or_clone(a)),
        Val::Tuple(_) | Val::Lit(_) => None,
    }
}

fn val(t: &Tpl, value: &dyn Fn(ValueRef) -> Option<Arc<Abs>>) -> Option<Val> {
    match t {
        Tpl::Value(v) => value(*v).map(Val::Tensor),
        Tpl::Num(_) => Some(Val::Lit(t.clone())),
        Tpl::Op(s, kids) if kids.is_empty() || s == LIST => Some(Val::Lit(t.clone())),
        Tpl::Op(s, kids) if s == GET && kids.len() == 2 => {
            let Tpl::Num(k) = kids[0] else { return None };
            match val(&kids[1], value)? {
                Val::Tuple(outs) => outs.get(usize::try_from(k).ok()?).cloned().map(Val::Tensor),
                Val::Tensor(a) if k == 0 => Some(Val::Tensor(a)),
                _ => None,
            }
        }
        Tpl::Op(s, kids) => {
            let kids = kids
                .iter()
                .map(|k| val(k, value))
                .collect::<Option<Vec<_>>>()?;
            apply(s, &kids)
        }
    }
}

/// The call `op(kids)` as a term whose tensor children are leaves `%r0:k{i}`, with their metas.
fn call_expr(op: &str, kids: &[Val]) -> (RecExpr<Term>, Vec<(String, Meta)>) {
    fn lit(e: &mut RecExpr<Term>, t: &Tpl) -> Id {
        match t {
            Tpl::Num(n) => e.add(Term::Num(*n)),
            Tpl::Op(s, k) => {
                let ids = k.iter().map(|x| lit(e, x)).collect();
                e.add(Term::Op(Symbol::from(s.as_str()), ids))
            }
            Tpl::Value(_) => e.add(Term::Op(Symbol::from("none"), Vec::new())),
        }
    }
    let mut e = RecExpr::default();
    let mut leaves = Vec::new();
    let ids: Vec<Id> = kids
        .iter()
        .map(|k| match k {
            Val::Lit(t) => lit(&mut e, t),
            Val::Tuple(_) => e.add(Term::Op(Symbol::from("none"), Vec::new())),
            Val::Tensor(a) => {
                let name = format!("k{}", leaves.len());
                leaves.push((name.clone(), a.meta().clone()));
                e.add(Term::Op(Symbol::from(format!("%r0:{name}")), Vec::new()))
            }
        })
        .collect();
    e.add(Term::Op(Symbol::from(op), ids));
    (e, leaves)
}

/// The output meta of `op(kids)`, by the e-graph's shape analysis.
fn out_metas(expr: &RecExpr<Term>, leaves: &[(String, Meta)]) -> Option<Vec<Meta>> {
    let mut eg: EGraph<Term, Shapes> = EGraph::new(Shapes::default());
    for (name, m) in leaves {
        eg.analysis
            .leaves
            .insert(Symbol::from(format!("%r0:{name}")), m.clone());
    }
    let root = eg.add_expr(expr);
    match &eg[root].data {
        crate::term::Data::Tensors(ms) => Some(ms.clone()),
        _ => None,
    }
}

/// Evaluates `expr` with the reference kernels on `tensors` (one per leaf, in order).
fn run(expr: &RecExpr<Term>, leaves: &[(String, Meta)], tensors: Vec<Tensor>) -> Option<Tensor> {
    let map: HashMap<String, Tensor> = leaves
        .iter()
        .zip(tensors)
        .map(|((name, _), t)| (format!("r0:{name}"), t))
        .collect();
    let mut out = eval(expr, &map).ok()?;
    (out.len() == 1).then(|| out.remove(0))
}

/// Operators that move elements without computing: they run on tensors of kind codes.
const MOVES: &[&str] = &[
    "aten.view.default",
    "aten.transpose.int",
    "aten.permute.default",
    "aten.expand.default",
    "aten.clone.default",
    "aten.select.int",
    "aten.repeat.default",
    "aten.flip.default",
    "aten.roll.default",
    "slice",
    "cat",
];

fn float_of(v: &Val) -> Option<f64> {
    match v {
        Val::Lit(Tpl::Num(n)) => Some(*n as f64),
        Val::Lit(Tpl::Op(s, k)) if k.is_empty() => s.strip_prefix("f:")?.parse().ok(),
        _ => None,
    }
}

fn ints_of(v: &Val) -> Option<Vec<i64>> {
    match v {
        Val::Lit(Tpl::Num(n)) => Some(vec![*n]),
        Val::Lit(Tpl::Op(s, k)) if s == LIST => k
            .iter()
            .map(|x| match x {
                Tpl::Num(n) => Some(*n),
                _ => None,
            })
            .collect(),
        Val::Lit(Tpl::Op(s, k)) if s == "none" && k.is_empty() => Some(Vec::new()),
        _ => None,
    }
}

fn tensor(v: &Val) -> Option<&Arc<Abs>> {
    match v {
        Val::Tensor(a) => Some(a),
        Val::Tuple(_) | Val::Lit(_) => None,
    }
}

/// Kind codes of a tensor as a float tensor, for the operators that only move elements.
fn codes(a: &Abs) -> Option<Tensor> {
    let ks = a.kinds()?;
    let data = ks.iter().map(|&k| k as u8 as f64).collect();
    Some(Tensor::new(
        Meta::new(DType::F64, a.meta().shape.clone()),
        data,
    ))
}

fn decode(x: f64) -> Kind {
    let kinds = [Zero, Pos, NonNeg, Finite, NegInf, Any];
    // Only the codes themselves: anything else (a NaN, a fraction) is no kind we wrote.
    if x.fract() != 0.0 || !(0.0..kinds.len() as f64).contains(&x) {
        return Any;
    }
    kinds[x as usize]
}

/// The kinds of `a` broadcast to `shape`.
fn broadcast(a: &Abs, shape: &[usize]) -> Option<Vec<Kind>> {
    let ks = a.kinds()?;
    let from = &a.meta().shape;
    if from.len() > shape.len() {
        return None;
    }
    let lead = shape.len() - from.len();
    let n: usize = shape.iter().product();
    let in_strides = shardproof_ops::strides(from);
    let mut out = Vec::with_capacity(n);
    let mut index = vec![0usize; shape.len()];
    for _ in 0..n {
        let mut flat = 0;
        for (d, &size) in from.iter().enumerate() {
            if size != 1 {
                if size != shape[lead + d] {
                    return None;
                }
                flat += index[lead + d] * in_strides[d];
            }
        }
        out.push(ks[flat]);
        for d in (0..shape.len()).rev() {
            index[d] += 1;
            if index[d] < shape[d] {
                break;
            }
            index[d] = 0;
        }
    }
    Some(out)
}

/// Elementwise `f` over tensors broadcast to `meta`'s shape.
fn elementwise(meta: Meta, args: &[&Abs], f: &dyn Fn(&[Kind]) -> Kind) -> Abs {
    if meta.numel() > MAX_ELEMS || args.iter().all(|a| matches!(a, Abs::Uniform(..))) {
        let joined: Vec<Kind> = args.iter().map(|a| a.joined()).collect();
        return Abs::Uniform(meta, f(&joined));
    }
    let Some(cols) = args
        .iter()
        .map(|a| broadcast(a, &meta.shape))
        .collect::<Option<Vec<_>>>()
    else {
        return Abs::Uniform(meta, Any);
    };
    let ks = (0..meta.numel())
        .map(|i| f(&cols.iter().map(|c| c[i]).collect::<Vec<_>>()))
        .collect();
    Abs::from_kinds(meta, ks)
}

/// Folds `f` over the elements of `a` along `dims` (all dims when empty), then maps `finish`.
fn reduce(
    meta: Meta,
    a: &Abs,
    dims: &[i64],
    f: fn(Kind, Kind) -> Kind,
    finish: fn(Kind) -> Kind,
) -> Abs {
    let shape = &a.meta().shape;
    let rank = shape.len();
    let dims: Vec<usize> = if dims.is_empty() {
        (0..rank).collect()
    } else {
        dims.iter()
            .map(|&d| {
                if d < 0 {
                    (d + rank as i64) as usize
                } else {
                    d as usize
                }
            })
            .collect()
    };
    if dims.iter().any(|&d| d >= rank || shape[d] == 0) {
        return Abs::Uniform(meta, Any);
    }
    let Some(ks) = a.kinds().filter(|_| !matches!(a, Abs::Uniform(..))) else {
        let k = a.joined();
        return Abs::Uniform(meta, finish(f(k, k)));
    };
    let kept: Vec<usize> = (0..rank).filter(|d| !dims.contains(d)).collect();
    let out_shape: Vec<usize> = kept.iter().map(|&d| shape[d]).collect();
    let out_n: usize = out_shape.iter().product();
    if out_n != meta.numel() {
        return Abs::Uniform(meta, Any);
    }
    let out_strides = shardproof_ops::strides(&out_shape);
    let mut acc: Vec<Option<Kind>> = vec![None; out_n];
    let mut index = vec![0usize; rank];
    for &k in &ks {
        let o: usize = kept
            .iter()
            .zip(&out_strides)
            .map(|(&d, &s)| index[d] * s)
            .sum();
        acc[o] = Some(acc[o].map_or(k, |x| f(x, k)));
        for d in (0..rank).rev() {
            index[d] += 1;
            if index[d] < shape[d] {
                break;
            }
            index[d] = 0;
        }
    }
    Abs::from_kinds(
        meta,
        acc.into_iter().map(|k| finish(k.unwrap_or(Any))).collect(),
    )
}

/// `a @ b` for operands of equal rank >= 2 with equal batch dims.
fn product(meta: Meta, a: &Abs, b: &Abs) -> Abs {
    let (sa, sb) = (&a.meta().shape, &b.meta().shape);
    let r = sa.len();
    if r < 2 || sb.len() != r || sa[..r - 2] != sb[..r - 2] || sa[r - 1] != sb[r - 2] {
        return Abs::Uniform(meta, Any);
    }
    let (n, k, m) = (sa[r - 2], sa[r - 1], sb[r - 1]);
    let batch: usize = sa[..r - 2].iter().product();
    let uniform = matches!(a, Abs::Uniform(..)) && matches!(b, Abs::Uniform(..));
    let work = batch * n * k * m;
    let (Some(ka), Some(kb)) = (a.kinds(), b.kinds()) else {
        return Abs::Uniform(meta, sum_of_products(a.joined(), b.joined(), k));
    };
    if uniform || work > MAX_ELEMS * 16 || k == 0 {
        return Abs::Uniform(meta, sum_of_products(a.joined(), b.joined(), k));
    }
    let mut out = Vec::with_capacity(batch * n * m);
    for bi in 0..batch {
        for i in 0..n {
            for j in 0..m {
                let terms =
                    (0..k).map(|c| Kind::mul(ka[(bi * n + i) * k + c], kb[(bi * k + c) * m + j]));
                out.push(fold(terms, Kind::add).unwrap_or(Any));
            }
        }
    }
    Abs::from_kinds(meta, out)
}

fn sum_of_products(a: Kind, b: Kind, k: usize) -> Kind {
    if k == 0 {
        return Zero;
    }
    let p = Kind::mul(a, b);
    Kind::add(p, p)
}

/// Softmax along `dim`: a row with a finite entry gives positives where finite, zeros where
/// `-inf`.
fn softmax(meta: Meta, a: &Abs, dim: i64) -> Abs {
    let shape = a.meta().shape.clone();
    let rank = shape.len();
    let d = if dim < 0 { dim + rank as i64 } else { dim } as usize;
    if d >= rank {
        return Abs::Uniform(meta, Any);
    }
    let Some(ks) = a.kinds().filter(|_| !matches!(a, Abs::Uniform(..))) else {
        let k = a.joined();
        return Abs::Uniform(meta, if k.finite() { Pos } else { Any });
    };
    let inner: usize = shape[d + 1..].iter().product();
    let size = shape[d];
    let mut out = vec![Any; ks.len()];
    for outer in 0..ks.len() / (size * inner).max(1) {
        for i in 0..inner {
            let at = |j: usize| outer * size * inner + j * inner + i;
            let row: Vec<Kind> = (0..size).map(|j| ks[at(j)]).collect();
            let ok =
                row.iter().all(|k| k.finite() || *k == NegInf) && row.iter().any(|k| k.finite());
            for (j, k) in row.iter().enumerate() {
                out[at(j)] = match (ok, k) {
                    (false, _) => Any,
                    (true, NegInf) => Zero,
                    (true, _) => Pos,
                };
            }
        }
    }
    Abs::from_kinds(meta, out)
}

/// Interprets one call over abstract children.
fn apply(op: &str, kids: &[Val]) -> Option<Val> {
    let (expr, leaves) = call_expr(op, kids);
    let metas = out_metas(&expr, &leaves)?;
    if let [meta] = &metas[..] {
        let a = apply_one(op, kids, meta.clone(), &expr, &leaves)?;
        return Some(Val::Tensor(Arc::new(a)));
    }
    let finite = keeps_finite(op, kids);
    // The values a selection returns are elements of its input, so their kinds are bounded by
    // the input's: the top-k of sigmoid scores are positive, and a router's division by their
    // sum stays finite.
    let selected = SELECTIONS
        .contains(&op)
        .then(|| kids.first().and_then(tensor).map(|a| a.joined()))
        .flatten();
    Some(Val::Tuple(
        metas
            .into_iter()
            .enumerate()
            .map(|(i, m)| {
                let k = match selected {
                    Some(k) if i == 0 && m.dtype.is_float() => k,
                    _ if finite && m.dtype.is_float() => Finite,
                    _ => Any,
                };
                Arc::new(Abs::Uniform(m, k))
            })
            .collect(),
    ))
}

/// Operators whose first output holds elements of their first input (the values; the second
/// output holds their indices).
const SELECTIONS: &[&str] = &[
    "aten.topk.default",
    "aten.sort.default",
    "aten.max.dim",
    "aten.min.dim",
];

/// Operators whose outputs are finite reals when their float inputs and number arguments are
/// (no division, logarithm or root of an input; a layer norm's epsilon is positive). The
/// negative log-likelihood divides by the number of targets that count: a batch is assumed to
/// have one (otherwise the specification's loss itself is undefined).
const FINITE_OPS: &[&str] = &[
    "aten.nll_loss_forward.default",
    "aten.nll_loss_backward.default",
    "aten.cos.default",
    "aten.sin.default",
    "aten.tanh.default",
    "aten.sigmoid.default",
    "aten.silu.default",
    "aten.gelu.default",
    "aten.relu.default",
    "aten.abs.default",
    "aten.tanh_backward.default",
    "aten.sigmoid_backward.default",
    "aten.silu_backward.default",
    "aten.gelu_backward.default",
    "aten.threshold_backward.default",
    "aten.embedding.default",
    "aten.embedding_dense_backward.default",
    "aten.gather.default",
    "aten.index_select.default",
    "aten.index.Tensor",
    "aten.scatter.src",
    "aten.scatter.value",
    "aten.scatter_add.default",
    "aten._log_softmax.default",
    "aten._log_softmax_backward_data.default",
    "aten._softmax_backward_data.default",
    "aten.addmm.default",
    "aten.baddbmm.default",
    "aten.topk.default",
    "aten.native_layer_norm.default",
    "aten.native_layer_norm_backward.default",
];

/// Whether `op(kids)` is finite: a [`FINITE_OPS`] call over finite float tensors and finite
/// numbers (a positive epsilon for a layer norm).
fn keeps_finite(op: &str, kids: &[Val]) -> bool {
    let numbers: Vec<f64> = kids
        .iter()
        .filter(|k| matches!(k, Val::Lit(Tpl::Op(s, c)) if c.is_empty() && s.starts_with("f:")))
        .filter_map(float_of)
        .collect();
    FINITE_OPS.contains(&op)
        && numbers.iter().all(|x| x.is_finite())
        && (op != "aten.native_layer_norm.default" || numbers.last().is_some_and(|&e| e > 0.0))
        && kids
            .iter()
            .filter_map(tensor)
            .filter(|a| a.meta().dtype.is_float())
            .all(|a| a.joined().finite())
}

/// Whether a call's value is the same on every run: random draws and uninitialised memory are
/// not constants, whatever their arguments.
fn deterministic(op: &str) -> bool {
    let random = shardproof_ir::OpName::parse(op)
        .and_then(|n| shardproof_ops::Registry::builtin().get(&n).map(|d| d.class))
        .is_some_and(|c| c == shardproof_ops::OpClass::Random);
    !random && !op.contains("empty")
}

fn apply_one(
    op: &str,
    kids: &[Val],
    meta: Meta,
    expr: &RecExpr<Term>,
    leaves: &[(String, Meta)],
) -> Option<Abs> {
    let tensors: Vec<&Arc<Abs>> = kids.iter().filter_map(tensor).collect();
    // Constants: evaluate exactly.
    if meta.numel() <= MAX_ELEMS
        && deterministic(op)
        && tensors.iter().all(|a| matches!(***a, Abs::Exact(_)))
    {
        let ts = tensors
            .iter()
            .map(|a| match &***a {
                Abs::Exact(t) => t.clone(),
                _ => unreachable!(),
            })
            .collect();
        if let Some(t) = run(expr, leaves, ts) {
            if t.meta == meta {
                return Some(Abs::Exact(t));
            }
        }
    }
    if !meta.dtype.is_float() {
        return Some(Abs::Uniform(meta, Any));
    }
    let arg = |i: usize| kids.get(i);
    let t = |i: usize| arg(i).and_then(tensor);
    let num = |i: usize| arg(i).and_then(float_of);
    let each = |f: fn(Kind) -> Kind| t(0).map(|a| unary(meta.clone(), a, f));
    let binary = |f: fn(Kind, Kind) -> Kind| {
        let (a, b) = (t(0)?, t(1)?);
        Some(elementwise(meta.clone(), &[a, b], &|k| f(k[0], k[1])))
    };
    let name = op;
    let out = match name {
        _ if MOVES.contains(&name) => {
            if meta.numel() > MAX_ELEMS || tensors.iter().all(|a| matches!(***a, Abs::Uniform(..)))
            {
                let k = fold(tensors.iter().map(|a| a.joined()), Kind::join).unwrap_or(Any);
                Some(Abs::Uniform(meta.clone(), k))
            } else {
                on_codes(&meta, expr, leaves, &tensors)
            }
        }
        "aten._to_copy.default" => each(|k| if k == Pos { NonNeg } else { k }),
        "aten.neg.default" => each(Kind::neg),
        "aten.exp.default" => each(Kind::exp),
        "aten.sigmoid.default" => each(Kind::sigmoid),
        "aten.log.default" => each(Kind::log),
        "aten.rsqrt.default" | "aten.reciprocal.default" => {
            each(|k| if k == Pos { Pos } else { Any })
        }
        "aten.sqrt.default" => each(|k| if k.non_neg() { k } else { Any }),
        "aten.add.Tensor" | "aten.sub.Tensor" => {
            let (a, b, alpha) = (t(0)?, t(1)?, num(2).unwrap_or(1.0));
            let sign = if name == "aten.sub.Tensor" { -1.0 } else { 1.0 };
            Some(elementwise(meta.clone(), &[a, b], &|k| {
                Kind::add(k[0], k[1].scaled(sign * alpha))
            }))
        }
        "aten.mul.Tensor" => binary(Kind::mul),
        "aten.div.Tensor" => binary(Kind::div),
        "aten.maximum.default" => binary(Kind::maximum),
        "aten.minimum.default" => binary(Kind::minimum),
        "sum" => {
            let all: Vec<&Abs> = tensors.iter().map(|a| &***a).collect();
            Some(elementwise(meta.clone(), &all, &|k| {
                fold(k.iter().copied(), Kind::add).unwrap_or(Any)
            }))
        }
        "aten.mul.Scalar" => {
            let c = num(1)?;
            Some(unary(meta.clone(), t(0)?, move |k| k.scaled(c)))
        }
        "aten.div.Scalar" => {
            let c = num(1)?;
            let a = t(0)?;
            (c != 0.0).then(|| unary(meta.clone(), a, move |k| k.scaled(1.0 / c)))
        }
        "scale" => {
            let (p, q) = (num(0)?, num(1)?);
            let a = t(2)?;
            (q != 0.0).then(|| unary(meta.clone(), a, move |k| k.scaled(p / q)))
        }
        "aten.add.Scalar" | "aten.sub.Scalar" => {
            let c = num(1)?
                * num(2).unwrap_or(1.0)
                * if name == "aten.sub.Scalar" { -1.0 } else { 1.0 };
            Some(unary(meta.clone(), t(0)?, move |k| {
                Kind::add(k, Kind::of(c))
            }))
        }
        "aten.pow.Tensor_Scalar" => {
            let e = num(1)?;
            Some(unary(meta.clone(), t(0)?, move |k| k.pow(e)))
        }
        "aten.sum.dim_IntList" | "aten.mean.dim" => Some(reduce(
            meta.clone(),
            t(0)?,
            &ints_of(arg(1)?)?,
            Kind::add,
            |k| k,
        )),
        "aten.sum.default" | "aten.mean.default" => {
            Some(reduce(meta.clone(), t(0)?, &[], Kind::add, |k| k))
        }
        "aten.amax.default" => Some(reduce(
            meta.clone(),
            t(0)?,
            &ints_of(arg(1)?)?,
            Kind::maximum,
            |k| k,
        )),
        "aten.logsumexp.default" => Some(reduce(
            meta.clone(),
            t(0)?,
            &ints_of(arg(1)?)?,
            Kind::lse,
            |k| {
                if k.finite() {
                    Finite
                } else {
                    k
                }
            },
        )),
        "aten.bmm.default" | "aten.mm.default" | "aten.matmul.default" => {
            Some(product(meta.clone(), t(0)?, t(1)?))
        }
        "aten.constant_pad_nd.default" => pad(op, meta.clone(), kids),
        "aten._softmax.default" => Some(softmax(
            meta.clone(),
            t(0)?,
            ints_of(arg(1)?)?.first().copied()?,
        )),
        "aten.masked_fill.Scalar" | "aten.masked_fill.Tensor" | "aten.where.self" => {
            let (cond, yes, no) = if name == "aten.where.self" {
                (t(0)?, kind_arg(arg(1)?, &meta)?, kind_arg(arg(2)?, &meta)?)
            } else {
                (t(1)?, kind_arg(arg(2)?, &meta)?, t(0)?.clone())
            };
            Some(select(meta.clone(), cond, &yes, &no))
        }
        "max" | "min" => {
            let f = if name == "max" {
                Kind::maximum
            } else {
                Kind::minimum
            };
            let all: Vec<&Abs> = tensors.iter().map(|a| &***a).collect();
            Some(elementwise(meta.clone(), &all, &|k| {
                fold(k.iter().copied(), f).unwrap_or(Any)
            }))
        }
        _ => {
            let k = if keeps_finite(name, kids) {
                Finite
            } else {
                Any
            };
            Some(Abs::Uniform(meta.clone(), k))
        }
    };
    Some(out.unwrap_or(Abs::Uniform(meta, Any)))
}

/// `constant_pad_nd(x, pads, value)`: the kinds of `x` moved into place, the border the kind of
/// `value` (zero when absent). The padding runs on kind codes, the border filled with the code
/// of the value's kind, so the reference kernel places every element.
fn pad(op: &str, meta: Meta, kids: &[Val]) -> Option<Abs> {
    let x = tensor(kids.first()?)?;
    let fill = match kids.get(2) {
        Some(v) => Kind::of(float_of(v)?),
        None => Zero,
    };
    if meta.numel() > MAX_ELEMS {
        return Some(Abs::Uniform(meta, Kind::join(x.joined(), fill)));
    }
    let mut coded = kids.get(..2)?.to_vec();
    coded.push(Val::Lit(Tpl::Op(
        format!("f:{:?}", f64::from(fill as u8)),
        Vec::new(),
    )));
    let (expr, leaves) = call_expr(op, &coded);
    on_codes(&meta, &expr, &leaves, &[x])
}

/// `expr` (an operator that only moves elements, or fills with a kind's code) run by the
/// reference kernels on its tensors' kind codes, decoded.
fn on_codes(
    meta: &Meta,
    expr: &RecExpr<Term>,
    leaves: &[(String, Meta)],
    tensors: &[&Arc<Abs>],
) -> Option<Abs> {
    let cs = tensors
        .iter()
        .map(|a| codes(a))
        .collect::<Option<Vec<_>>>()?;
    let moved = run(expr, leaves, cs)?;
    (moved.meta.shape == meta.shape).then(|| {
        Abs::from_kinds(
            meta.clone(),
            moved.data.iter().map(|&c| decode(c)).collect(),
        )
    })
}

/// `f` of every element.
fn unary(meta: Meta, a: &Abs, f: impl Fn(Kind) -> Kind) -> Abs {
    elementwise(meta, &[a], &|k| f(k[0]))
}

/// A tensor argument, or a number as a one-element tensor of its kind.
fn kind_arg(v: &Val, meta: &Meta) -> Option<Arc<Abs>> {
    match v {
        Val::Tensor(a) => Some(a.clone()),
        Val::Lit(_) => Some(Arc::new(Abs::Uniform(
            Meta::new(meta.dtype, Vec::new()),
            Kind::of(float_of(v)?),
        ))),
        Val::Tuple(_) => None,
    }
}

/// `where(cond, yes, no)`: exact conditions pick per element, others join both.
fn select(meta: Meta, cond: &Abs, yes: &Abs, no: &Abs) -> Abs {
    let Abs::Exact(c) = cond else {
        return elementwise(meta, &[yes, no], &|k| Kind::join(k[0], k[1]));
    };
    if meta.numel() > MAX_ELEMS {
        return Abs::Uniform(meta, Kind::join(yes.joined(), no.joined()));
    }
    let picks = Abs::Elems(
        c.meta.clone(),
        c.data
            .iter()
            .map(|&x| if x != 0.0 { Pos } else { Zero })
            .collect(),
    );
    elementwise(meta, &[&picks, yes, no], &|k| {
        if k[0] == Pos {
            k[1]
        } else {
            k[2]
        }
    })
}

/// The regions of implementation tensors known to be zero, by leaf symbol (`%r0:mul_46`): the
/// per-element zero flags of every rank tensor with at least one zero element.
#[derive(Default, Debug)]
pub struct ZeroBlocks {
    masks: HashMap<Symbol, (Vec<usize>, Vec<bool>)>,
}

impl ZeroBlocks {
    /// Keeps, per leaf symbol, the elements the analysis proved zero.
    pub fn new(values: impl IntoIterator<Item = (Symbol, Arc<Abs>)>) -> ZeroBlocks {
        let mut masks = HashMap::new();
        for (sym, a) in values {
            if !a.meta().dtype.is_float() {
                continue;
            }
            let Some(ks) = a.kinds() else { continue };
            if ks.contains(&Zero) {
                masks.insert(
                    sym,
                    (
                        a.meta().shape.clone(),
                        ks.iter().map(|&k| k == Zero).collect(),
                    ),
                );
            }
        }
        ZeroBlocks { masks }
    }

    /// Whether no tensor has a zero element.
    pub fn is_empty(&self) -> bool {
        self.masks.is_empty()
    }

    /// Whether leaf `sym` has a zero element.
    pub fn has(&self, sym: Symbol) -> bool {
        self.masks.contains_key(&sym)
    }

    /// Whether the block `ranges` (one half-open range per dim) of leaf `sym` is all zeros.
    pub fn is_zero(&self, sym: Symbol, ranges: &[(usize, usize)]) -> bool {
        let Some((shape, zero)) = self.masks.get(&sym) else {
            return false;
        };
        if ranges.len() != shape.len()
            || ranges
                .iter()
                .zip(shape)
                .any(|(r, &n)| r.0 >= r.1 || r.1 > n)
        {
            return false;
        }
        let strides = shardproof_ops::strides(shape);
        let mut index: Vec<usize> = ranges.iter().map(|r| r.0).collect();
        loop {
            let flat: usize = index.iter().zip(&strides).map(|(i, s)| i * s).sum();
            if !zero[flat] {
                return false;
            }
            let mut d = ranges.len();
            loop {
                if d == 0 {
                    return true;
                }
                d -= 1;
                index[d] += 1;
                if index[d] < ranges[d].1 {
                    break;
                }
                index[d] = ranges[d].0;
            }
        }
    }
}

#[cfg(test)]
mod tests;
