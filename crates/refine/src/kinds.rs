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
mod tests {
    use super::*;
    use crate::eval::{random_tensor, seeded_values};
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;
    use shardproof_ir::ValueId;

    fn op(name: &str, kids: Vec<Tpl>) -> Tpl {
        Tpl::Op(name.to_string(), kids)
    }

    fn lit(sym: &str) -> Tpl {
        op(sym, Vec::new())
    }

    fn list(ns: &[i64]) -> Tpl {
        op(LIST, ns.iter().map(|&n| Tpl::Num(n)).collect())
    }

    fn input(i: usize) -> Tpl {
        Tpl::Value(ValueRef {
            rank: Some(0),
            value: ValueId::new(i, 0),
        })
    }

    fn f64s(shape: &[usize], data: Vec<f64>) -> Tensor {
        Tensor::new(Meta::new(DType::F64, shape.to_vec()), data)
    }

    /// `t` as a term whose input `i` is the leaf `%r0:x{i}`.
    fn expr_of(t: &Tpl) -> RecExpr<Term> {
        fn add(e: &mut RecExpr<Term>, t: &Tpl) -> Id {
            match t {
                Tpl::Num(n) => e.add(Term::Num(*n)),
                Tpl::Value(v) => {
                    let leaf = format!("%r0:x{}", v.value.node);
                    e.add(Term::Op(Symbol::from(leaf), Vec::new()))
                }
                Tpl::Op(s, kids) => {
                    let ids = kids.iter().map(|k| add(e, k)).collect();
                    e.add(Term::Op(Symbol::from(s.as_str()), ids))
                }
            }
        }
        let mut e = RecExpr::default();
        add(&mut e, t);
        e
    }

    /// The reference value of `t` when input `i` is `xs[i]`.
    fn evaluate(t: &Tpl, xs: &[Tensor]) -> Tensor {
        let leaves = xs
            .iter()
            .enumerate()
            .map(|(i, x)| (format!("r0:x{i}"), x.clone()))
            .collect();
        let mut out = eval(&expr_of(t), &leaves).unwrap_or_else(|e| panic!("{}: {e}", expr_of(t)));
        assert_eq!(out.len(), 1, "{}", expr_of(t));
        out.remove(0)
    }

    /// The analysis's claim for `t` when input `i` is abstracted by `abs[i]`.
    fn claim(t: &Tpl, abs: &[Arc<Abs>]) -> Abs {
        interpret(t, &|v: ValueRef| abs.get(v.value.node).cloned())
            .unwrap_or_else(|| panic!("no claim for {}", expr_of(t)))
    }

    /// Whether `x` is of kind `k`.
    fn holds(k: Kind, x: f64) -> bool {
        match k {
            Zero => x == 0.0,
            Pos => x.is_finite() && x > 0.0,
            NonNeg => x.is_finite() && x >= 0.0,
            Finite => x.is_finite(),
            NegInf => x == f64::NEG_INFINITY,
            Any => true,
        }
    }

    /// `Err` naming the first element of `got` that `claim` is wrong about.
    fn agrees(claim: &Abs, got: &Tensor) -> Result<(), String> {
        if claim.meta() != &got.meta {
            return Err(format!("claimed {:?}, got {:?}", claim.meta(), got.meta));
        }
        if let Abs::Exact(want) = claim {
            let differ = |(a, b): (&f64, &f64)| a != b && !(a.is_nan() && b.is_nan());
            return match want.data.iter().zip(got.data.iter()).position(differ) {
                Some(i) => Err(format!(
                    "element {i}: claimed exactly {}, got {}",
                    want.data[i], got.data[i]
                )),
                None => Ok(()),
            };
        }
        let ks = claim.kinds().ok_or("no kinds")?;
        match ks
            .iter()
            .zip(got.data.iter())
            .position(|(&k, &x)| !holds(k, x))
        {
            Some(i) => Err(format!(
                "element {i}: claimed {:?}, got {}",
                ks[i], got.data[i]
            )),
            None => Ok(()),
        }
    }

    /// The tensor-valued subterms of `t`, children first.
    fn subterms(t: &Tpl, out: &mut Vec<Tpl>) {
        if let Tpl::Op(s, kids) = t {
            if !kids.is_empty() && s != LIST {
                for k in kids {
                    subterms(k, out);
                }
                if !out.contains(t) {
                    out.push(t.clone());
                }
            }
        }
    }

    /// Guards ring attention's zeros: masked probabilities and their gradients are exactly zero.
    #[test]
    fn causal_block_is_zero_where_masked() {
        let arange = |a: i64, b: i64| {
            let rest = ["none", "none", "dev", "b:false"].map(lit);
            op(
                "aten.arange.start",
                [Tpl::Num(a), Tpl::Num(b)].into_iter().chain(rest).collect(),
            )
        };
        let unsqueeze =
            |x: &Tpl, d: i64| op("aten.unsqueeze.default", vec![x.clone(), Tpl::Num(d)]);
        let bmm = |a: Tpl, b: Tpl| op("aten.bmm.default", vec![a, b]);
        let add = |a: Tpl, b: Tpl| op("aten.add.Tensor", vec![a, b, Tpl::Num(1)]);
        let sub = |a: Tpl, b: Tpl| op("aten.sub.Tensor", vec![a, b, Tpl::Num(1)]);
        let pos = op("cat", vec![Tpl::Num(0), arange(0, 2), arange(6, 8)]);
        let later = op(
            "aten.gt.Tensor",
            vec![unsqueeze(&pos, 0), unsqueeze(&pos, 1)],
        );
        let zeros = op(
            "aten.full.default",
            [list(&[4, 4]), lit("f:0.0")]
                .into_iter()
                .chain(["dt:f64", "none", "dev", "b:false"].map(lit))
                .collect(),
        );
        let mask = op("aten.masked_fill.Scalar", vec![zeros, later, lit("f:-inf")]);
        let scores = op(
            "aten.mul.Scalar",
            vec![bmm(input(0), input(1)), lit("f:0.5")],
        );
        let masked = add(scores, mask.clone());
        let lse = op(
            "aten.logsumexp.default",
            vec![masked.clone(), list(&[2]), lit("b:true")],
        );
        let probs = op("aten.exp.default", vec![sub(masked, lse)]);
        let ds = op(
            "aten.mul.Tensor",
            vec![probs.clone(), sub(bmm(input(2), input(3)), input(4))],
        );
        let dq = bmm(ds.clone(), input(5));
        let shapes: [&[usize]; 6] = [
            &[2, 4, 3],
            &[2, 3, 4],
            &[2, 4, 3],
            &[2, 3, 4],
            &[2, 4, 1],
            &[2, 4, 3],
        ];
        let abs: Vec<Arc<Abs>> = shapes
            .iter()
            .map(|s| Arc::new(Abs::Uniform(Meta::new(DType::F64, s.to_vec()), Finite)))
            .collect();

        let Abs::Exact(m) = claim(&mask, &abs) else {
            panic!("the mask is not a constant")
        };
        let hidden: Vec<bool> = m.data.iter().map(|&x| x == f64::NEG_INFINITY).collect();
        assert_eq!(hidden.iter().filter(|&&h| h).count(), 6);
        let hidden = hidden.repeat(2);
        for (t, rest) in [(&probs, Pos), (&ds, Finite)] {
            let ks = claim(t, &abs).kinds().unwrap();
            let zero: Vec<bool> = ks.iter().map(|&k| k == Zero).collect();
            assert_eq!(zero, hidden, "{}: {ks:?}", expr_of(t));
            assert_eq!(zero.iter().filter(|&&z| z).count(), 12);
            assert!(ks.iter().all(|&k| k == Zero || k == rest), "{ks:?}");
        }
        assert_eq!(claim(&dq, &abs).joined(), Finite);

        let mut terms = Vec::new();
        subterms(&dq, &mut terms);
        for seed in [0.13, 0.29, 0.47, 0.71, 0.93] {
            let mut next = seeded_values(seed);
            let xs: Vec<Tensor> = shapes
                .iter()
                .map(|s| random_tensor(DType::F64, s.to_vec(), 0, &mut next))
                .collect();
            for t in &terms {
                if let Err(e) = agrees(&claim(t, &abs), &evaluate(t, &xs)) {
                    panic!("{}: {e}", expr_of(t));
                }
            }
        }
    }

    /// A call of a generated program: its term over the program's inputs, the analysis's
    /// claim, and its value in each draw of the inputs.
    struct Entry {
        full: Tpl,
        abs: Arc<Abs>,
        vals: Vec<Tensor>,
    }

    const DRAWS: usize = 4;

    fn pick<T: Clone>(rng: &mut ChaCha8Rng, xs: &[T]) -> T {
        xs[rng.random_range(0..xs.len())].clone()
    }

    fn broadcast_shape(a: &[usize], b: &[usize]) -> Option<Vec<usize>> {
        let n = a.len().max(b.len());
        let dim = |s: &[usize], i: usize| {
            if i + s.len() >= n {
                s[i + s.len() - n]
            } else {
                1
            }
        };
        (0..n)
            .map(|i| match (dim(a, i), dim(b, i)) {
                (x, y) if x == y || y == 1 => Some(x),
                (1, y) => Some(y),
                _ => None,
            })
            .collect()
    }

    /// A program's inputs: finite tensors (drawn anew for each draw), constants holding zeros,
    /// -infs, positives and negatives, and constant masks.
    fn program_inputs(rng: &mut ChaCha8Rng) -> Vec<Entry> {
        let mut pool: Vec<Entry> = Vec::new();
        let exact = |pool: &mut Vec<Entry>, t: Tensor| {
            let full = input(pool.len());
            let vals = vec![t.clone(); DRAWS];
            pool.push(Entry {
                full,
                abs: Arc::new(Abs::Exact(t)),
                vals,
            });
        };
        for shape in [[3, 4], [3, 4], [1, 4], [3, 1]] {
            let n = shape.iter().product();
            let vals = (0..DRAWS)
                .map(|_| {
                    let data = (0..n)
                        .map(|_| {
                            if rng.random_bool(0.25) {
                                pick(rng, &[0.0, -0.0, 1.0, -1.0, 0.5])
                            } else {
                                rng.random_range(-3.0..3.0)
                            }
                        })
                        .collect();
                    f64s(&shape, data)
                })
                .collect();
            pool.push(Entry {
                full: input(pool.len()),
                abs: Arc::new(Abs::Uniform(Meta::new(DType::F64, shape.to_vec()), Finite)),
                vals,
            });
        }
        for shape in [[3, 4], [3, 4], [1, 4]] {
            let n = shape.iter().product();
            let data = (0..n)
                .map(|_| pick(rng, &[0.0, f64::NEG_INFINITY, 0.5, 2.0, -1.5]))
                .collect();
            exact(&mut pool, f64s(&shape, data));
        }
        for shape in [[3, 4], [1, 4], [3, 1]] {
            let n = shape.iter().product();
            let data = (0..n).map(|_| f64::from(rng.random_bool(0.5))).collect();
            exact(
                &mut pool,
                Tensor::new(Meta::new(DType::Bool, shape.to_vec()), data),
            );
        }
        pool
    }

    /// A random call over `pool` (children as `input(j)` for entry `j`); `None` when the pick
    /// does not apply.
    fn random_call(rng: &mut ChaCha8Rng, pool: &[Entry]) -> Option<Tpl> {
        let shape = |j: usize| pool[j].abs.meta().shape.clone();
        let of = |f: &dyn Fn(usize) -> bool| (0..pool.len()).filter(|&j| f(j)).collect::<Vec<_>>();
        let floats = of(&|j| pool[j].abs.meta().dtype.is_float());
        let bools = of(&|j| pool[j].abs.meta().dtype == DType::Bool);
        // Half the calls extend the latest result, for long chains.
        let x = if rng.random_bool(0.5) {
            *floats.last()?
        } else {
            pick(rng, &floats)
        };
        let sx = shape(x);
        let rank = sx.len() as i64;
        let y = pick(
            rng,
            &of(&|j| floats.contains(&j) && broadcast_shape(&sx, &shape(j)).is_some()),
        );
        let masks =
            of(&|j| bools.contains(&j) && broadcast_shape(&shape(j), &sx) == Some(sx.clone()));
        let dim = |rng: &mut ChaCha8Rng| {
            let d = rng.random_range(0..rank);
            if rng.random_bool(0.5) {
                d - rank
            } else {
                d
            }
        };
        let keep =
            |rng: &mut ChaCha8Rng| lit(["b:false", "b:true"][usize::from(rng.random_bool(0.7))]);
        let unary = |name: &str| Some(op(name, vec![input(x)]));
        let n = Tpl::Num;
        match rng.random_range(0..30) {
            0 => unary("aten.exp.default"),
            28 => unary("aten.sigmoid.default"),
            1 => unary("aten.log.default"),
            2 => unary("aten.neg.default"),
            3 => unary("aten.rsqrt.default"),
            4 => unary("aten.sqrt.default"),
            5 => {
                let c = pick(
                    rng,
                    &["f:-2.0", "f:-0.5", "f:0.0", "f:0.5", "f:3.0", "f:-inf"],
                );
                Some(op("aten.mul.Scalar", vec![input(x), lit(c)]))
            }
            6 => Some(op(
                "aten.mul.Scalar",
                vec![input(x), n(pick(rng, &[-1, 0, 2]))],
            )),
            7 => {
                let c = pick(rng, &["f:1.5", "f:-2.0", "f:0.0", "f:-inf"]);
                let alpha = n(pick(rng, &[1, -1]));
                Some(op("aten.add.Scalar", vec![input(x), lit(c), alpha]))
            }
            8 => {
                let e = pick(rng, &[n(2), lit("f:0.5"), n(-1), n(3)]);
                Some(op("aten.pow.Tensor_Scalar", vec![input(x), e]))
            }
            9 => {
                let (p, q) = (pick(rng, &[-1, 0, 1, 3]), pick(rng, &[1, 2]));
                Some(op("scale", vec![n(p), n(q), input(x)]))
            }
            10 if rank > 0 => Some(op("aten.flip.default", vec![input(x), list(&[dim(rng)])])),
            11 if rank > 0 => {
                // A window of `cat(x, y)` as large as `x`.
                let y = pick(rng, &of(&|j| floats.contains(&j) && shape(j) == sx));
                let d = rng.random_range(0..rank);
                let size = sx[d as usize] as i64;
                let s = rng.random_range(0..=size);
                let both = op("cat", vec![n(d), input(x), input(y)]);
                Some(op("slice", vec![n(d), n(s), n(s + size), both]))
            }
            12 => {
                let dims = match rng.random_range(0..3) {
                    _ if rank == 0 => lit("none"),
                    0 => list(&[dim(rng)]),
                    1 => list(&(0..rank).collect::<Vec<_>>()),
                    _ => lit("none"),
                };
                let k = keep(rng);
                Some(op(
                    "aten.sum.dim_IntList",
                    vec![input(x), dims, k, lit("none")],
                ))
            }
            13 | 14 if rank > 0 => {
                let name = ["aten.amax.default", "aten.logsumexp.default"][rng.random_range(0..2)];
                let dims = list(&[dim(rng)]);
                Some(op(name, vec![input(x), dims, keep(rng)]))
            }
            15 | 16 if rank > 0 => Some(op(
                "aten._softmax.default",
                vec![input(x), n(dim(rng)), lit("b:false")],
            )),
            17 | 18 if !masks.is_empty() => {
                let v = pick(rng, &["f:-inf", "f:0.0", "f:2.5", "f:-1.0"]);
                Some(op(
                    "aten.masked_fill.Scalar",
                    vec![input(x), input(pick(rng, &masks)), lit(v)],
                ))
            }
            19 => Some(op("aten.gt.Tensor", vec![input(x), input(y)])),
            29 if rank > 0 => {
                // Pads the last one or two dims (or crops one from a side of three or more)
                // with a number of each kind, an integer literal among them.
                let k = rng.random_range(1..=rank.min(2)) as usize;
                let mut pads = Vec::new();
                for i in 0..k {
                    let lo = if sx[sx.len() - 1 - i] >= 3 { -1 } else { 0 };
                    pads.push(rng.random_range(lo..=2));
                    pads.push(rng.random_range(lo..=2));
                }
                let v = pick(
                    rng,
                    &[
                        lit("f:0.0"),
                        lit("f:-inf"),
                        lit("f:inf"),
                        lit("f:1.5"),
                        lit("f:-2.0"),
                        n(0),
                        n(3),
                    ],
                );
                Some(op(
                    "aten.constant_pad_nd.default",
                    vec![input(x), list(&pads), v],
                ))
            }
            20 => {
                let sxy = broadcast_shape(&sx, &shape(y))?;
                let conds =
                    of(&|j| bools.contains(&j) && broadcast_shape(&shape(j), &sxy).is_some());
                if conds.is_empty() {
                    return None;
                }
                let c = pick(rng, &conds);
                Some(op("aten.where.self", vec![input(c), input(x), input(y)]))
            }
            21..=27 => {
                let name = pick(
                    rng,
                    &[
                        "aten.add.Tensor",
                        "aten.sub.Tensor",
                        "aten.mul.Tensor",
                        "aten.div.Tensor",
                        "aten.maximum.default",
                        "aten.minimum.default",
                    ],
                );
                let mut kids = vec![input(x), input(y)];
                if name.starts_with("aten.add") || name.starts_with("aten.sub") {
                    kids.push(n(1));
                }
                Some(op(name, kids))
            }
            _ => None,
        }
    }

    /// `t` over the program's inputs, its children `input(j)` replaced by entry `j`'s term.
    fn substitute(t: &Tpl, pool: &[Entry]) -> Tpl {
        match t {
            Tpl::Value(v) => pool[v.value.node].full.clone(),
            Tpl::Num(_) => t.clone(),
            Tpl::Op(s, kids) => op(s, kids.iter().map(|k| substitute(k, pool)).collect()),
        }
    }

    fn size(t: &Tpl) -> usize {
        match t {
            Tpl::Op(_, kids) => 1 + kids.iter().map(size).sum::<usize>(),
            _ => 1,
        }
    }

    /// Where floating point may part from the reals: a value near overflow or underflow.
    fn wild(x: f64) -> bool {
        x.is_finite() && (x.abs() > 1e100 || (x != 0.0 && x.abs() < 1e-100))
    }

    /// A router's top-k of sigmoid scores is positive, so dividing by its sum stays finite (the
    /// ring attention after a MoE layer keeps its masked blocks zero).
    #[test]
    fn top_k_of_sigmoid_scores_is_positive() {
        let scores = op("aten.sigmoid.default", vec![input(0)]);
        let top = op("aten.topk.default", vec![scores.clone(), Tpl::Num(2)]);
        let values = op(GET, vec![Tpl::Num(0), top]);
        let sum = op(
            "aten.sum.dim_IntList",
            vec![values.clone(), list(&[1]), lit("b:true"), lit("none")],
        );
        let share = op("aten.div.Tensor", vec![values.clone(), sum]);
        let x = Arc::new(Abs::Uniform(Meta::new(DType::F64, vec![3, 4]), Finite));
        for (t, want) in [(&scores, Pos), (&values, Pos), (&share, Pos)] {
            let got = claim(t, std::slice::from_ref(&x));
            assert_eq!(got.joined(), want, "{}", expr_of(t));
        }
    }

    /// Guards every table entry: each claim on random programs holds on random finite inputs.
    #[test]
    fn random_programs_claims_hold() {
        let mut rng = ChaCha8Rng::seed_from_u64(11);
        let (mut checked, mut skipped) = (0usize, 0usize);
        let mut claimed: HashMap<Kind, usize> = HashMap::new();
        for _ in 0..1000 {
            let mut pool = program_inputs(&mut rng);
            let inputs = pool.len();
            let input_abs: Vec<Arc<Abs>> = pool.iter().map(|e| e.abs.clone()).collect();
            // Draws no longer checked: floating point left the reals' range in them.
            let mut off = [false; DRAWS];
            for _ in 0..rng.random_range(1..=12) {
                let Some(call) = (0..20).find_map(|_| random_call(&mut rng, &pool)) else {
                    break;
                };
                let pool_abs: Vec<Arc<Abs>> = pool.iter().map(|e| e.abs.clone()).collect();
                let abs = Arc::new(claim(&call, &pool_abs));
                let full = substitute(&call, &pool);
                let Tpl::Op(name, kids) = &call else {
                    unreachable!()
                };
                let mut vals = Vec::with_capacity(DRAWS);
                for (d, off) in off.iter_mut().enumerate() {
                    let xs: Vec<Tensor> = pool.iter().map(|e| e.vals[d].clone()).collect();
                    let got = evaluate(&call, &xs);
                    // Past this, floats may round where the reals do not (an exponential of a
                    // large argument, a value near overflow or underflow): skip the draw.
                    let exps = matches!(
                        name.as_str(),
                        "aten.exp.default" | "aten._softmax.default" | "aten.sigmoid.default"
                    );
                    let large =
                        |t: &Tensor| t.data.iter().any(|x| x.is_finite() && x.abs() > 300.0);
                    let exp_arg =
                        exps && matches!(&kids[0], Tpl::Value(v) if large(&xs[v.value.node]));
                    *off |= exp_arg || got.data.iter().any(|&x| wild(x));
                    if *off {
                        skipped += 1;
                    } else if let Err(e) = agrees(&abs, &got) {
                        let ins: Vec<_> = pool[..inputs].iter().map(|e| &e.vals[d].data).collect();
                        panic!("{}: {e}\ninputs x0..: {ins:?}", expr_of(&full));
                    } else {
                        checked += 1;
                    }
                    vals.push(got);
                }
                if !matches!(*abs, Abs::Exact(_)) {
                    for k in abs.kinds().unwrap() {
                        *claimed.entry(k).or_default() += 1;
                    }
                }
                pool.push(Entry { full, abs, vals });
            }
            // The program as one term gets the claim its calls got one at a time.
            let last = pool.last().unwrap();
            if pool.len() > inputs && size(&last.full) <= 200 {
                let whole = claim(&last.full, &input_abs);
                assert_eq!(whole.kinds(), last.abs.kinds(), "{}", expr_of(&last.full));
            }
        }
        assert!(
            checked > 4 * skipped,
            "{checked} checked, {skipped} skipped"
        );
        for k in [Zero, Pos, NonNeg, Finite, NegInf, Any] {
            assert!(
                claimed.get(&k).is_some_and(|&n| n > 0),
                "{k:?}: {claimed:?}"
            );
        }
    }

    /// `claim` against `got` like [`agrees`], also for uniform claims past [`MAX_ELEMS`].
    fn agrees_any(claim: &Abs, got: &Tensor) -> Result<(), String> {
        match claim {
            Abs::Uniform(m, k) if claim.kinds().is_none() => {
                if m != &got.meta {
                    return Err(format!("claimed {m:?}, got {:?}", got.meta));
                }
                match got.data.iter().position(|&x| !holds(*k, x)) {
                    Some(i) => Err(format!("element {i}: claimed {k:?}, got {}", got.data[i])),
                    None => Ok(()),
                }
            }
            _ => agrees(claim, got),
        }
    }

    /// Checks the analysis's claim on `t` and on each of its subterms against the reference
    /// value in every draw of the inputs (`draws[d][i]` is input `i`); returns the claim on `t`.
    /// A subterm the reference interpreter cannot evaluate may only get no claim or `Any`.
    fn check_claims(
        t: &Tpl,
        abs: &[Arc<Abs>],
        draws: &[Vec<Tensor>],
        unevaluated: &mut Vec<String>,
    ) -> Option<Abs> {
        let mut terms = Vec::new();
        subterms(t, &mut terms);
        let mut last = None;
        for s in &terms {
            let c = interpret(s, &|v: ValueRef| abs.get(v.value.node).cloned());
            for (d, xs) in draws.iter().enumerate() {
                let leaves = xs
                    .iter()
                    .enumerate()
                    .map(|(i, x)| (format!("r0:x{i}"), x.clone()))
                    .collect();
                match eval(&expr_of(s), &leaves) {
                    Ok(outs) if outs.len() == 1 => {
                        if let Some(c) = &c {
                            if let Err(e) = agrees_any(c, &outs[0]) {
                                panic!("{}: {e} (draw {d})", expr_of(s));
                            }
                        }
                    }
                    // A tuple: the analysis has no tensor claim on it.
                    Ok(_) => assert!(c.is_none(), "{}: a claim on a tuple", expr_of(s)),
                    Err(e) => {
                        let k = c.as_ref().map(|c| c.joined());
                        assert!(
                            k.is_none() || k == Some(Any),
                            "{}: claimed {k:?} but the interpreter fails: {e}",
                            expr_of(s)
                        );
                        let e = format!("{}: {e}", expr_of(s));
                        if !unevaluated.contains(&e) {
                            unevaluated.push(e);
                        }
                    }
                }
            }
            last = c;
        }
        last
    }

    /// Guards the claims a review found unsound (constants past [`MAX_ELEMS`], fills and pads
    /// with infinities, divisions hidden in composite operators, random draws taken for
    /// constants, multi-output calls): every claim holds on inputs that reach each hazard and on
    /// random draws, while finite operators of finite inputs stay finite.
    #[test]
    fn former_unsound_claims_are_gone() {
        let n = Tpl::Num;
        let lits = |xs: &[&str]| xs.iter().map(|s| lit(s)).collect::<Vec<_>>();
        let call = |name: &str, kids: Vec<Tpl>, rest: &[&str]| {
            op(name, kids.into_iter().chain(lits(rest)).collect())
        };
        let factory = ["dt:f64", "none", "dev", "b:false"];
        let full =
            |shape: &[i64], v: &str| call("aten.full.default", vec![list(shape), lit(v)], &factory);
        let get = |k: i64, t: &Tpl| op(GET, vec![n(k), t.clone()]);
        let (x0, x1, x2, idx, m, w, b) = (
            input(0),
            input(1),
            input(2),
            input(3),
            input(4),
            input(5),
            input(6),
        );
        let f64m = |s: &[usize]| Meta::new(DType::F64, s.to_vec());
        let idx_t = Tensor::new(Meta::new(DType::I64, vec![1]), vec![1.0]);
        let m_t = Tensor::new(
            Meta::new(DType::Bool, vec![3, 4]),
            (0..12).map(|i| f64::from(u8::from(i % 4 == 3))).collect(),
        );
        let finite = |s: &[usize]| Arc::new(Abs::Uniform(f64m(s), Finite));
        let abs = vec![
            finite(&[3, 3]),
            finite(&[3, 3]),
            finite(&[3, 4]),
            Arc::new(Abs::Exact(idx_t.clone())),
            Arc::new(Abs::Exact(m_t.clone())),
            finite(&[3]),
            finite(&[3]),
        ];
        // Inputs that reach every hazard (a constant row, zero divisors), then random draws.
        let mut draws = vec![vec![
            f64s(&[3, 3], vec![0.5, 0.0, -1.0, 2.0, 2.0, 2.0, 0.3, 0.1, 0.7]),
            f64s(&[3, 3], vec![1.0, 0.0, 2.0, 0.5, 0.0, 0.0, 1.0, 1.0, 1.0]),
            f64s(
                &[3, 4],
                vec![0.5, -1.0, 0.0, 2.0, 1.0, 1.0, 1.0, 1.0, -0.3, 0.2, 0.0, 4.0],
            ),
            idx_t.clone(),
            m_t.clone(),
            f64s(&[3], vec![1.5, -0.5, 0.0]),
            f64s(&[3], vec![0.0, 2.0, -1.0]),
        ]];
        for seed in [0.13, 0.47, 0.71, 0.93] {
            let mut next = seeded_values(seed);
            let mut r = |s: &[usize]| random_tensor(DType::F64, s.to_vec(), 0, &mut next);
            let (a, c, d, e, f) = (r(&[3, 3]), r(&[3, 3]), r(&[3, 4]), r(&[3]), r(&[3]));
            draws.push(vec![a, c, d, idx_t.clone(), m_t.clone(), e, f]);
        }
        let fixed = draws[0].clone();

        let gt = op("aten.gt.Tensor", vec![x0.clone(), x1.clone()]);
        let pad = op(
            "aten.constant_pad_nd.default",
            vec![x0.clone(), list(&[0, 1]), lit("f:-inf")],
        );
        let lnorm0 = op(
            "aten.native_layer_norm.default",
            vec![
                x0.clone(),
                list(&[3]),
                lit("none"),
                lit("none"),
                lit("f:0.0"),
            ],
        );
        let masked_exp = op(
            "aten.exp.default",
            vec![op(
                "aten.masked_fill.Scalar",
                vec![x2.clone(), m.clone(), lit("f:-inf")],
            )],
        );
        let bern = op(
            "aten.bernoulli.p",
            vec![full(&[3, 4], "f:0.5"), lit("f:0.5"), lit("none")],
        );
        let bern_mask = call("aten._to_copy.default", vec![bern.clone()], &["dt:b8"]);
        let bern_exp = op(
            "aten.exp.default",
            vec![op(
                "aten.masked_fill.Scalar",
                vec![x2.clone(), bern_mask, lit("f:-inf")],
            )],
        );
        let empty_const = call(
            "aten.empty_like.default",
            vec![full(&[3, 3], "f:0.0")],
            &["none", "none", "dev", "b:false", "none"],
        );
        // Each term, and whether the fixed inputs make it infinite or NaN somewhere.
        let hazards: Vec<(Tpl, bool)> = vec![
            (full(&[300, 300], "f:-inf"), true),
            (
                call(
                    "aten.new_full.default",
                    vec![x0.clone(), list(&[2, 2]), lit("f:-inf")],
                    &factory,
                ),
                true,
            ),
            (
                call(
                    "aten.full_like.default",
                    vec![x0.clone(), lit("f:-inf")],
                    &["dt:f64", "none", "dev", "b:false", "none"],
                ),
                true,
            ),
            (
                op("aten.fill.Scalar", vec![x0.clone(), lit("f:-inf")]),
                true,
            ),
            (pad.clone(), true),
            (
                op(
                    "aten.where.ScalarOther",
                    vec![gt.clone(), x0.clone(), lit("f:-inf")],
                ),
                true,
            ),
            (
                op(
                    "aten.where.Scalar",
                    vec![gt.clone(), lit("f:-inf"), lit("f:0.0")],
                ),
                true,
            ),
            (
                op(
                    "aten.scatter.value",
                    vec![
                        x0.clone(),
                        n(1),
                        op("aten.view.default", vec![idx.clone(), list(&[1, 1])]),
                        lit("f:-inf"),
                    ],
                ),
                true,
            ),
            (
                op(
                    "aten.index_fill.int_Scalar",
                    vec![x0.clone(), n(0), idx.clone(), lit("f:-inf")],
                ),
                true,
            ),
            (
                op(
                    "aten.clamp.default",
                    vec![x0.clone(), lit("f:inf"), lit("none")],
                ),
                true,
            ),
            (
                op("aten.rsub.Scalar", vec![x0.clone(), lit("f:inf"), n(1)]),
                true,
            ),
            (
                op(
                    "aten.addcdiv.default",
                    vec![x0.clone(), x0.clone(), x1.clone(), n(1)],
                ),
                true,
            ),
            (
                op(
                    "aten.var.correction",
                    vec![x0.clone(), list(&[1]), n(3), lit("b:false")],
                ),
                true,
            ),
            (
                op(
                    "aten.layer_norm.default",
                    vec![
                        x0.clone(),
                        list(&[3]),
                        lit("none"),
                        lit("none"),
                        lit("f:0.0"),
                        lit("b:false"),
                    ],
                ),
                true,
            ),
            (get(0, &lnorm0), true),
            (get(1, &lnorm0), false),
            (get(2, &lnorm0), true),
            (
                call(
                    "aten.empty_like.default",
                    vec![x0.clone()],
                    &["none", "none", "dev", "b:false", "none"],
                ),
                true,
            ),
            (empty_const.clone(), true),
            (
                op("aten.mul.Tensor", vec![masked_exp.clone(), pad.clone()]),
                true,
            ),
            (bern.clone(), false),
            (bern_exp.clone(), false),
        ];
        let mut unevaluated = Vec::new();
        for (t, hazard) in &hazards {
            let c = check_claims(t, &abs, &draws, &mut unevaluated);
            match eval(
                &expr_of(t),
                &fixed
                    .iter()
                    .enumerate()
                    .map(|(i, x)| (format!("r0:x{i}"), x.clone()))
                    .collect(),
            ) {
                Ok(v) => {
                    // Evaluated terms must get a claim, or the check above is vacuous.
                    assert!(c.is_some(), "no claim for {}", expr_of(t));
                    let bad = v[0].data.iter().any(|x| !x.is_finite());
                    assert_eq!(bad, *hazard, "{}: {:?}", expr_of(t), v[0].data);
                }
                Err(_) => assert!(c.is_none_or(|c| c.joined() == Any)),
            }
        }

        // Column 3 of the masked exponential is zero, but times `-inf` padding it is NaN.
        let prod = op("aten.mul.Tensor", vec![masked_exp.clone(), pad]);
        let ks = claim(&prod, &abs).kinds().unwrap();
        assert!(
            ks.iter().skip(3).step_by(4).all(|&k| k != Zero),
            "{}: {ks:?}",
            expr_of(&prod)
        );
        assert_eq!(claim(&masked_exp, &abs).kinds().unwrap()[3], Zero);
        // Random draws and uninitialised memory are no constants.
        for t in [&bern, &empty_const] {
            let c = claim(t, &abs);
            assert!(!matches!(c, Abs::Exact(_)), "{}: {c:?}", expr_of(t));
        }
        let ks = claim(&bern_exp, &abs).kinds().unwrap();
        assert!(!ks.contains(&Zero), "{}: {ks:?}", expr_of(&bern_exp));

        // Precision kept: finite operators of finite inputs are finite.
        let lnorm = op(
            "aten.native_layer_norm.default",
            vec![x0.clone(), list(&[3]), w.clone(), b.clone(), lit("f:1e-5")],
        );
        let finites = [
            get(0, &lnorm),
            get(1, &lnorm),
            get(2, &lnorm),
            op("aten.silu.default", vec![x0.clone()]),
            op("aten.gelu.default", vec![x0.clone()]),
            op("aten.cos.default", vec![x0.clone()]),
            op(
                "aten.addmm.default",
                vec![w.clone(), x0.clone(), x1.clone()],
            ),
        ];
        for t in &finites {
            let c = check_claims(t, &abs, &draws, &mut unevaluated);
            let k = c.map(|c| c.joined());
            assert_eq!(k, Some(Finite), "{}", expr_of(t));
        }
        assert!(unevaluated.is_empty(), "{unevaluated:#?}");
    }

    /// Guards the block query: zero only for in-range blocks whose every element is proved zero.
    #[test]
    fn zero_blocks_cover_only_zero_regions() {
        let m = |shape: &[usize]| Meta::new(DType::F64, shape.to_vec());
        let [a, b, c, z, e] = ["%r0:a", "%r0:b", "%r0:c", "%r0:z", "%r0:e"].map(Symbol::from);
        let blocks = ZeroBlocks::new([
            (
                a,
                Arc::new(Abs::Elems(
                    m(&[2, 3]),
                    vec![Zero, Zero, Pos, Zero, Finite, Zero],
                )),
            ),
            (b, Arc::new(Abs::Uniform(m(&[2, 2]), Finite))),
            (
                c,
                Arc::new(Abs::Exact(Tensor::new(
                    Meta::new(DType::Bool, vec![2]),
                    vec![0.0, 0.0],
                ))),
            ),
            (z, Arc::new(Abs::Uniform(m(&[2, 2]), Zero))),
            (e, Arc::new(Abs::Exact(f64s(&[2], vec![0.0, 3.0])))),
        ]);
        assert!(!blocks.is_empty());
        assert!(blocks.has(a) && blocks.has(z) && blocks.has(e));
        assert!(!blocks.has(b) && !blocks.has(c));
        // Fully zero regions.
        assert!(blocks.is_zero(a, &[(0, 1), (0, 2)]));
        assert!(blocks.is_zero(a, &[(0, 2), (0, 1)]));
        assert!(blocks.is_zero(a, &[(1, 2), (2, 3)]));
        assert!(blocks.is_zero(a, &[(0, 1), (1, 2)]));
        assert!(blocks.is_zero(z, &[(0, 2), (0, 2)]));
        assert!(blocks.is_zero(e, &[(0, 1)]));
        // Partly zero regions.
        assert!(!blocks.is_zero(a, &[(0, 2), (0, 2)]));
        assert!(!blocks.is_zero(a, &[(0, 1), (0, 3)]));
        assert!(!blocks.is_zero(a, &[(0, 2), (0, 3)]));
        assert!(!blocks.is_zero(a, &[(1, 2), (1, 3)]));
        assert!(!blocks.is_zero(e, &[(0, 2)]));
        // Out of range, empty, of the wrong rank, or of a tensor without zeros.
        assert!(!blocks.is_zero(a, &[(0, 3), (0, 1)]));
        assert!(!blocks.is_zero(a, &[(1, 2), (2, 4)]));
        assert!(!blocks.is_zero(z, &[(0, 2), (0, 3)]));
        assert!(!blocks.is_zero(a, &[(0, 0), (0, 1)]));
        assert!(!blocks.is_zero(a, &[(1, 1), (0, 1)]));
        assert!(!blocks.is_zero(a, &[(0, 1)]));
        assert!(!blocks.is_zero(a, &[(0, 1), (0, 1), (0, 1)]));
        assert!(!blocks.is_zero(b, &[(0, 1), (0, 1)]));
        assert!(!blocks.is_zero(c, &[(0, 1)]));
        assert!(ZeroBlocks::new(Vec::<(Symbol, Arc<Abs>)>::new()).is_empty());
    }
}
