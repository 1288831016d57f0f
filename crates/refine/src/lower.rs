//! Lowering graph nodes to terms: every call becomes a canonical term over its input values,
//! so that the specification and the ranks write the same computation the same way.
//!
//! Canonical forms: identity-like operators (clone, wait_tensor, copy of an equal-shaped
//! source, declared identities) are aliases; every reshape (view, reshape, _unsafe_view,
//! unsqueeze, squeeze, flatten) is `aten.view.default` with the concrete shape; `t` is
//! `transpose.int(0, 1)`; step-1 slices, narrow and split outputs are `slice`; `cat` is `cat`;
//! negative dims are made non-negative; collectives of the ranks are their meaning (a sum,
//! concatenation or slice over the group members' inputs).

use crate::lemmas::SCALE;
use crate::term::{literal_symbol, CAT, GET, LIST, MAX, MIN, SLICE, SUM};
use shardproof_interp::{schedule, ScheduleProblem};
use shardproof_ir::{Arg, DecompExpr, Graph, Node, NodeKind, OpMeaning, OpName, Program, ValueId};
use shardproof_ops::{normalize_args, Meta, OpClass, P2pEnd, Registry};
use std::collections::{BTreeMap, BTreeSet, HashMap};

/// A term template over the input values of a node.
#[derive(Clone, Debug, PartialEq)]
pub enum Tpl {
    /// An input value of the node's graph (or, for collectives, of another rank's graph).
    Value(ValueRef),
    /// An integer.
    Num(i64),
    /// An operator over children.
    Op(String, Vec<Tpl>),
}

/// A value of one of the programs: the spec (`rank: None`) or a rank's graph.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ValueRef {
    /// `None` for the specification, else the rank.
    pub rank: Option<usize>,
    /// The value in that graph.
    pub value: ValueId,
}

/// What a node's output is, as a term.
#[derive(Clone, Debug, PartialEq)]
pub enum Lowered {
    /// A graph input or constant: its meaning comes from the case (or it is opaque).
    Leaf,
    /// Equal to another value.
    Alias(ValueRef),
    /// This term.
    Term(Tpl),
    /// No meaning can be given; the reason names the operator.
    Unsupported(String),
}

/// Everything lowering needs to know about the programs.
pub struct LowerCtx<'a> {
    /// Declared meanings of custom operators.
    pub custom_ops: &'a BTreeMap<String, OpMeaning>,
    /// Whether dropout masks may be assumed laid out like their inputs.
    pub same_mask: bool,
    /// The implementation, for collectives.
    pub program: &'a Program,
    /// Per rank, per collective node: the matching input value on each group member, in
    /// member order (filled by [`pair_collectives`]).
    pub partners: &'a HashMap<(usize, usize), Vec<ValueRef>>,
    /// Per (rank, recv node): the tensor the matching send posted (filled by [`pair_messages`]).
    pub messages: &'a Messages,
    /// Values of module constants (`_tensor_constantN`) the case states.
    pub constants: &'a BTreeMap<String, f64>,
    /// Whether no loss target equals its `ignore_index` (`assume: { ignore-index: unused }`).
    pub ignore_index_unused: bool,
}

/// Metas of a graph's values, per node and output.
pub type Metas = [Vec<Option<Meta>>];

const IDENTITY_OPS: &[&str] = &[
    "aten.clone.default",
    "aten.alias.default",
    "aten.detach.default",
    "aten.lift_fresh_copy.default",
    "aten.contiguous.default",
    "_c10d_functional.wait_tensor.default",
];

const RESHAPE_OPS: &[&str] = &[
    "aten.view.default",
    "aten.reshape.default",
    "aten._unsafe_view.default",
    "aten.unsqueeze.default",
    "aten.squeeze.default",
    "aten.squeeze.dim",
    "aten.squeeze.dims",
    "aten.flatten.using_ints",
];

/// Lowers output `output` of node `node` of `graph` (`rank: None` for the spec).
pub fn lower(
    ctx: &LowerCtx,
    graph: &Graph,
    metas: &Metas,
    rank: Option<usize>,
    node_index: usize,
    output: usize,
) -> Lowered {
    let node = &graph.nodes[node_index];
    let (op, args, kwargs) = match &node.kind {
        NodeKind::Input | NodeKind::Constant { .. } => return Lowered::Leaf,
        NodeKind::Call { op, args, kwargs } => (op, args, kwargs),
    };
    let at = |v: ValueId| ValueRef { rank, value: v };
    let meta_of = |v: ValueId| {
        metas
            .get(v.node)
            .and_then(|m| m.get(v.output))
            .cloned()
            .flatten()
    };
    let out_meta = meta_of(ValueId::new(node_index, output));
    let full = op.to_string();
    let first_input = node.inputs().first().copied();

    if let Some(meaning) = custom_meaning(ctx.custom_ops, op) {
        return match meaning {
            OpMeaning::Identity => first_input.map_or_else(
                || {
                    Lowered::Unsupported(format!(
                        "`{op}` is declared `identity` but has no tensor argument"
                    ))
                },
                |v| Lowered::Alias(at(v)),
            ),
            OpMeaning::Decompose(DecompExpr::Signature(sig)) => {
                match (&sig.returns, sig.bind(args, kwargs)) {
                    (Some(ret), Ok(bound)) => decomp_tpl(ret, &bound, rank).map_or_else(
                        || {
                            Lowered::Unsupported(format!(
                                "the declared result of `{op}` does not fit its call"
                            ))
                        },
                        Lowered::Term,
                    ),
                    (None, _) => Lowered::Unsupported(format!(
                        "`{op}` returns nothing; its writes have values only in its functionalized form (`auto_functionalized`)"
                    )),
                    (_, Err(e)) => Lowered::Unsupported(format!("`{op}`: {e}")),
                }
            }
            OpMeaning::Decompose(e) => match decomp_tpl(e, args, rank) {
                Some(t) => Lowered::Term(t),
                None => Lowered::Unsupported(format!(
                    "the decomposition of `{op}` does not fit its call"
                )),
            },
        };
    }
    if op.namespace == "higher_order" && op.name == "auto_functionalized_v2" {
        return lower_auto_functionalized(ctx, args, kwargs, output, rank);
    }
    if op.namespace == "higher_order" && op.name == "auto_functionalized" {
        // Calls that fit their declaration were inlined when the case was loaded.
        return Lowered::Unsupported(unfit_functionalized(args));
    }
    match full.as_str() {
        // A send's result is its input (a handle to wait on); a recv is the tensor the matched
        // send posted, on the sending rank.
        P2P_SEND => {
            return first_input.map_or(
                Lowered::Unsupported(format!("`{op}` without a tensor")),
                |v| Lowered::Alias(at(v)),
            );
        }
        P2P_RECV => {
            return match rank {
                None => Lowered::Unsupported(
                    "a recv in the specification (a single-device program sends nothing)".into(),
                ),
                Some(r) => ctx.messages.get(&(r, node_index)).map_or_else(
                    || {
                        Lowered::Unsupported(format!(
                            "recv `{}` on rank {r} has no matching send",
                            node.outputs[0].name
                        ))
                    },
                    |&sent| Lowered::Alias(sent),
                ),
            };
        }
        _ => {}
    }
    if IDENTITY_OPS.contains(&full.as_str()) {
        return first_input.map_or(
            Lowered::Unsupported(format!("`{op}` without a tensor")),
            |v| Lowered::Alias(at(v)),
        );
    }
    let reg = Registry::builtin();
    let Some(def) = reg.get(op) else {
        return Lowered::Unsupported(format!(
            "operator `{op}` has no known meaning (declare it in the case's `ops:` section)"
        ));
    };
    let norm = match normalize_args(&def.schema, args, kwargs) {
        Ok(n) => n,
        Err(e) => return Lowered::Unsupported(format!("`{op}`: {}", e.0)),
    };
    let arg = |i: usize| norm.get(i).cloned().unwrap_or(Arg::None);
    let value = |i: usize| arg(i).as_value();
    let same_meta = |v: Option<ValueId>| v.and_then(meta_of) == out_meta && out_meta.is_some();

    match full.as_str() {
        // copy(self, src): the result is src broadcast into self's shape.
        "aten.copy.default" if same_meta(value(1)) => {
            return Lowered::Alias(at(value(1).expect("checked")));
        }
        "aten._to_copy.default" | "aten.expand.default" | "aten.to.dtype"
            if same_meta(value(0)) =>
        {
            return Lowered::Alias(at(value(0).expect("checked")));
        }
        "aten.native_dropout.default" => {
            let p = match dropout_mode(&node.outputs[0].name, &arg(1), &arg(2)) {
                Ok(DropoutMode::Identity) if output == 0 => {
                    return Lowered::Alias(at(value(0).expect("input")));
                }
                Ok(DropoutMode::Identity) => 0.0,
                Ok(DropoutMode::Random(p)) => p,
                Err(why) => return Lowered::Unsupported(why),
            };
            if !ctx.same_mask {
                return Lowered::Unsupported(format!(
                    "`{}` draws a random mask (p={p}); add `assume: {{ dropout: same-mask }}` to relate the masks of the two programs",
                    node.outputs[0].name
                ));
            }
        }
        // dropout(x, p, train) is native_dropout's first output: an identity only outside
        // training or at p = 0; otherwise a random mask, related only under `same-mask`.
        "aten.dropout.default" => {
            let p = match dropout_mode(&node.outputs[0].name, &arg(1), &arg(2)) {
                Ok(DropoutMode::Identity) => return Lowered::Alias(at(value(0).expect("input"))),
                Ok(DropoutMode::Random(p)) => p,
                Err(why) => return Lowered::Unsupported(why),
            };
            if !ctx.same_mask {
                return Lowered::Unsupported(format!(
                    "`{}` draws a random mask (p={p}); add `assume: {{ dropout: same-mask }}` to relate the masks of the two programs",
                    node.outputs[0].name
                ));
            }
            let call = Tpl::Op(
                "aten.native_dropout.default".into(),
                vec![
                    val_of(&norm, 0, rank),
                    arg_tpl(&Arg::Float(p), rank),
                    arg_tpl(&Arg::Bool(true), rank),
                ],
            );
            return Lowered::Term(Tpl::Op(GET.into(), vec![Tpl::Num(0), call]));
        }
        _ => {}
    }
    match full.as_str() {
        // baddbmm(input, b1, b2, beta=0, alpha): torch ignores input when beta is 0.
        "aten.baddbmm.default" if arg(3).as_f64() == Some(0.0) => {
            let prod = Tpl::Op(
                "aten.bmm.default".into(),
                vec![val_of(&norm, 1, rank), val_of(&norm, 2, rank)],
            );
            let alpha = arg(4).as_f64().unwrap_or(1.0);
            return Lowered::Term(match rational(alpha) {
                Some((1, 1)) => prod,
                Some((p, q)) => Tpl::Op(SCALE.into(), vec![Tpl::Num(p), Tpl::Num(q), prod]),
                None => Tpl::Op(
                    "aten.mul.Scalar".into(),
                    vec![prod, scalar_tpl(&Arg::Float(alpha))],
                ),
            });
        }
        // Without ignored targets, a mean NLL is the sum over the N targets scaled by 1/N, and
        // its backward the sum-mode backward of the gradient scaled by 1/N (total_weight = N
        // is then not read): a mean over a split batch becomes a sum of per-piece sums.
        "aten.nll_loss_forward.default" | "aten.nll_loss_backward.default"
            if ctx.ignore_index_unused =>
        {
            let fwd = full == "aten.nll_loss_forward.default";
            let (x_at, red_at) = if fwd { (0, 3) } else { (1, 4) };
            let n = value(x_at + 1).and_then(meta_of).map(|m| m.numel() as i64);
            if let (Some(1), Some(n), Arg::None) = (arg(red_at).as_int(), n, arg(x_at + 2)) {
                if n > 0 {
                    let mut kids: Vec<Tpl> =
                        (0..norm.len()).map(|i| val_of(&norm, i, rank)).collect();
                    kids[red_at] = Tpl::Num(2);
                    if fwd {
                        if output != 0 {
                            return Lowered::Unsupported(format!(
                                "`{}`: the total weight of a mean NLL under `ignore-index: unused` is not modelled",
                                node.outputs[output].name
                            ));
                        }
                        let call = Tpl::Op(full, kids);
                        let sum = Tpl::Op(GET.into(), vec![Tpl::Num(0), call]);
                        return Lowered::Term(Tpl::Op(
                            SCALE.into(),
                            vec![Tpl::Num(1), Tpl::Num(n), sum],
                        ));
                    }
                    let g = kids[0].clone();
                    kids[0] = Tpl::Op(SCALE.into(), vec![Tpl::Num(1), Tpl::Num(n), g]);
                    // The sum-mode backward never reads total_weight: one canonical scalar.
                    let none = || Tpl::Op("none".into(), vec![]);
                    kids[6] = Tpl::Op(
                        "aten.scalar_tensor.default".into(),
                        vec![Tpl::Num(1), none(), none(), none(), none()],
                    );
                    return Lowered::Term(Tpl::Op(full, kids));
                }
            }
        }
        // A float mean is the sum scaled by one over the count.
        "aten.mean.default" if out_meta.as_ref().is_some_and(|m| m.dtype.is_float()) => {
            if let Some(n) = value(0)
                .and_then(meta_of)
                .map(|m| m.numel() as i64)
                .filter(|&n| n > 0)
            {
                let none = Tpl::Op("none".into(), vec![]);
                let sum = Tpl::Op(
                    "aten.sum.default".into(),
                    vec![val_of(&norm, 0, rank), none],
                );
                return Lowered::Term(Tpl::Op(SCALE.into(), vec![Tpl::Num(1), Tpl::Num(n), sum]));
            }
        }
        // addmm(b, x, w) with unit beta and alpha is x @ w + b.
        "aten.addmm.default"
            if arg(3).as_f64().unwrap_or(1.0) == 1.0 && arg(4).as_f64().unwrap_or(1.0) == 1.0 =>
        {
            let prod = Tpl::Op(
                "aten.mm.default".into(),
                vec![val_of(&norm, 1, rank), val_of(&norm, 2, rank)],
            );
            return Lowered::Term(Tpl::Op(
                "aten.add.Tensor".into(),
                vec![prod, val_of(&norm, 0, rank), Tpl::Num(1)],
            ));
        }
        // as_strided over the whole input in row-major order, as functionalization writes an
        // in-place update of a view (autograd's copy of a slice): the IR's storage is the
        // input's row-major data, so the read is a view and the scatter replaces everything
        // by its source.
        "aten.as_strided.default" | "aten.as_strided_scatter.default" => {
            let scatter = full == "aten.as_strided_scatter.default";
            let (src, at_size) = if scatter { (1, 2) } else { (0, 1) };
            let offset_zero = matches!(arg(at_size + 2), Arg::None | Arg::Int(0));
            if let (Some(size), Some(stride), Some(base), Some(from)) = (
                arg(at_size).as_int_list(),
                arg(at_size + 1).as_int_list(),
                value(0).and_then(meta_of),
                value(src).and_then(meta_of),
            ) {
                if offset_zero
                    && from.numel() == base.numel()
                    && covers_row_major(&size, &stride, base.numel())
                {
                    let shape: Vec<usize> = if scatter {
                        base.shape.clone()
                    } else {
                        size.iter().map(|&n| n as usize).collect()
                    };
                    let from_at = value(src).expect("checked");
                    return if from.shape == shape {
                        Lowered::Alias(at(from_at))
                    } else {
                        Lowered::Term(view_tpl(val_of(&norm, src, rank), &shape))
                    };
                }
            }
        }
        // zeros(size, ..) is the zero fill full(size, 0, ..), the form the lemmas know.
        "aten.zeros.default" => {
            let kids: Vec<Tpl> = std::iter::once(val_of(&norm, 0, rank))
                .chain(std::iter::once(Tpl::Op("f:0.0".into(), vec![])))
                .chain((1..5).map(|i| val_of(&norm, i, rank)))
                .collect();
            return Lowered::Term(Tpl::Op("aten.full.default".into(), kids));
        }
        // A scatter of a whole-range slice replaces everything.
        "aten.slice_scatter.default" if same_meta(value(1)) => {
            return Lowered::Alias(at(value(1).expect("checked")));
        }
        // x + 0, x - 0.
        "aten.add.Tensor" | "aten.sub.Tensor" | "aten.add.Scalar" | "aten.sub.Scalar"
            if value(1).is_none() && arg(1).as_f64() == Some(0.0) && same_meta(value(0)) =>
        {
            return Lowered::Alias(at(value(0).expect("checked")));
        }
        // w[idx] with one integer index tensor is an embedding lookup.
        "aten.index.Tensor" => {
            if let Arg::List(items) = arg(1) {
                if let [Arg::Value(i)] = items.as_slice() {
                    if meta_of(*i).is_some_and(|m| {
                        !m.dtype.is_float() && m.dtype != shardproof_ir::DType::Bool
                    }) && value(0)
                        .and_then(meta_of)
                        .is_some_and(|m| m.shape.len() == 2)
                    {
                        return Lowered::Term(Tpl::Op(
                            "aten.embedding.default".into(),
                            vec![
                                val_of(&norm, 0, rank),
                                Tpl::Value(at(*i)),
                                Tpl::Num(-1),
                                Tpl::Op("b:false".into(), vec![]),
                                Tpl::Op("b:false".into(), vec![]),
                            ],
                        ));
                    }
                }
            }
        }
        // x[mask] = v with a boolean mask over x's leading dims and a 0-d v is a masked fill.
        "aten.index_put.default" if arg(3).as_bool() != Some(true) => {
            if let (Arg::List(items), Some(xm)) = (arg(1), value(0).and_then(meta_of)) {
                if let ([Arg::Value(m)], Some(v)) = (items.as_slice(), value(2)) {
                    let mm = meta_of(*m);
                    let vm = meta_of(v);
                    if let (Some(mm), Some(vm)) = (mm, vm) {
                        if mm.dtype == shardproof_ir::DType::Bool
                            && vm.shape.is_empty()
                            && xm.shape.starts_with(&mm.shape)
                        {
                            let mut shape = mm.shape.clone();
                            shape.resize(xm.shape.len(), 1);
                            let mask = if shape == mm.shape {
                                Tpl::Value(at(*m))
                            } else {
                                view_tpl(Tpl::Value(at(*m)), &shape)
                            };
                            let x = Tpl::Value(at(value(0).expect("checked")));
                            return Lowered::Term(
                                match scalar_constant(ctx, graph, v, !vm.dtype.is_float()) {
                                    Some(c) => Tpl::Op(
                                        "aten.masked_fill.Scalar".into(),
                                        vec![x, mask, scalar_tpl(&c)],
                                    ),
                                    None => Tpl::Op(
                                        "aten.masked_fill.Tensor".into(),
                                        vec![x, mask, Tpl::Value(at(v))],
                                    ),
                                },
                            );
                        }
                    }
                }
            }
        }
        _ => {}
    }
    if RESHAPE_OPS.contains(&full.as_str()) {
        let (Some(x), Some(m)) = (value(0), out_meta.as_ref()) else {
            return Lowered::Unsupported(format!("`{op}` with an unknown shape"));
        };
        if same_meta(Some(x)) {
            return Lowered::Alias(at(x));
        }
        return Lowered::Term(view_tpl(Tpl::Value(at(x)), &m.shape));
    }
    let in_rank = |i: usize| {
        value(i)
            .and_then(meta_of)
            .map_or(0, |m| m.shape.len() as i64)
    };
    let dim = |d: i64, r: i64| if d < 0 { d + r.max(1) } else { d };
    let val = |i: usize| Tpl::Value(at(value(i).expect("tensor argument")));
    match full.as_str() {
        "aten.t.default" => {
            if in_rank(0) < 2 {
                return Lowered::Alias(at(value(0).expect("input")));
            }
            return Lowered::Term(transpose_tpl(val(0), 0, 1));
        }
        "aten.transpose.int" => {
            let r = in_rank(0);
            let (a, b) = (
                dim(arg(1).as_int().unwrap_or(0), r),
                dim(arg(2).as_int().unwrap_or(0), r),
            );
            if a == b {
                return Lowered::Alias(at(value(0).expect("input")));
            }
            return Lowered::Term(transpose_tpl(val(0), a.min(b), a.max(b)));
        }
        "aten.slice.Tensor" | "aten.narrow.default" => {
            let r = in_rank(0);
            let Some(m) = value(0).and_then(meta_of) else {
                return Lowered::Unsupported(format!("`{op}` with an unknown shape"));
            };
            let d = dim(arg(1).as_int().unwrap_or(0), r);
            let n = m.shape.get(d as usize).copied().unwrap_or(0) as i64;
            let clamp = |x: i64| if x < 0 { (x + n).max(0) } else { x.min(n) };
            let (s, e, step) = if full == "aten.narrow.default" {
                let s = clamp(arg(2).as_int().unwrap_or(0));
                (s, s + arg(3).as_int().unwrap_or(0), 1)
            } else {
                let s = arg(2).as_int().map_or(0, clamp);
                let e = arg(3).as_int().map_or(n, clamp);
                (s, e.max(s), arg(4).as_int().unwrap_or(1))
            };
            if step == 1 {
                if s == 0 && e == n {
                    return Lowered::Alias(at(value(0).expect("input")));
                }
                return Lowered::Term(slice_tpl(d, s, e, val(0)));
            }
        }
        // select(x, d, i) is the one-wide slice at i with dim d dropped.
        "aten.select.int" => {
            let (Some(m), Some(om)) = (value(0).and_then(meta_of), out_meta.as_ref()) else {
                return Lowered::Unsupported(format!("`{op}` with an unknown shape"));
            };
            let d = dim(arg(1).as_int().unwrap_or(0), in_rank(0));
            let n = m.shape.get(d as usize).copied().unwrap_or(0) as i64;
            let i = arg(2).as_int().unwrap_or(0);
            let i = if i < 0 { i + n } else { i };
            if (0..n).contains(&i) {
                let piece = if n == 1 {
                    val(0)
                } else {
                    slice_tpl(d, i, i + 1, val(0))
                };
                return Lowered::Term(view_tpl(piece, &om.shape));
            }
        }
        "aten.split_with_sizes.default" | "aten.split.Tensor" | "aten.chunk.default" => {
            let Some(m) = value(0).and_then(meta_of) else {
                return Lowered::Unsupported(format!("`{op}` with an unknown shape"));
            };
            let d = dim(arg(2).as_int().unwrap_or(0), in_rank(0));
            let n = m.shape.get(d as usize).copied().unwrap_or(0) as i64;
            let sizes: Vec<i64> = match full.as_str() {
                "aten.split_with_sizes.default" => arg(1).as_int_list().unwrap_or_default(),
                "aten.split.Tensor" => {
                    let k = arg(1).as_int().unwrap_or(n).max(1);
                    (0..n).step_by(k as usize).map(|s| k.min(n - s)).collect()
                }
                _ => {
                    let c = arg(1).as_int().unwrap_or(1).max(1);
                    let k = (n + c - 1) / c;
                    (0..n)
                        .step_by(k.max(1) as usize)
                        .map(|s| k.min(n - s))
                        .collect()
                }
            };
            let start: i64 = sizes.iter().take(output).sum();
            let len = sizes.get(output).copied().unwrap_or(0);
            if start == 0 && len == n {
                return Lowered::Alias(at(value(0).expect("input")));
            }
            return Lowered::Term(slice_tpl(d, start, start + len, val(0)));
        }
        "aten.cat.default" => {
            let items: Vec<ValueId> = match arg(0) {
                Arg::List(items) => items.iter().filter_map(Arg::as_value).collect(),
                _ => Vec::new(),
            };
            // Empty pieces (torch accepts 1-d empty tensors in cat) contribute nothing.
            let items: Vec<ValueId> = items
                .into_iter()
                .filter(|v| meta_of(*v).is_none_or(|m| m.numel() > 0))
                .collect();
            let r = out_meta.as_ref().map_or(1, |m| m.shape.len() as i64);
            let d = dim(arg(1).as_int().unwrap_or(0), r);
            return match items.len() {
                0 => Lowered::Unsupported("cat of nothing".into()),
                1 => Lowered::Alias(at(items[0])),
                _ => Lowered::Term(Tpl::Op(
                    CAT.into(),
                    std::iter::once(Tpl::Num(d))
                        .chain(items.iter().map(|&v| Tpl::Value(at(v))))
                        .collect(),
                )),
            };
        }
        "aten.permute.default" => {
            let r = in_rank(0);
            let p: Vec<i64> = arg(1)
                .as_int_list()
                .unwrap_or_default()
                .iter()
                .map(|&d| dim(d, r))
                .collect();
            if p.iter().enumerate().all(|(i, &d)| i as i64 == d) {
                return Lowered::Alias(at(value(0).expect("input")));
            }
            return Lowered::Term(Tpl::Op(full, vec![val(0), int_list(&p)]));
        }
        _ => {}
    }
    // Multiplication by a rational constant is `(scale P Q x)`, so scale factors compose
    // exactly (a mean over 128 rows equals a mean over 64 then a halving).
    let is_float = |v: Option<ValueId>| v.and_then(meta_of).is_some_and(|m| m.dtype.is_float());
    let factor = match full.as_str() {
        "aten.mul.Scalar" | "aten.mul.Tensor" if is_float(value(0)) => {
            arg(1).as_f64().and_then(rational)
        }
        "aten.div.Scalar" | "aten.div.Tensor"
            if is_float(value(0)) && norm.get(2).is_none_or(|m| *m == Arg::None) =>
        {
            arg(1)
                .as_f64()
                .and_then(rational)
                .filter(|r| r.0 != 0)
                .map(|(p, q)| (q * p.signum(), p.abs()))
        }
        "aten.neg.default" if is_float(value(0)) => Some((-1, 1)),
        _ => None,
    };
    if let (Some((p, q)), Some(x)) = (factor, value(0)) {
        if arg(1).as_value().is_none() && same_meta(Some(x)) {
            if p == q {
                return Lowered::Alias(at(x));
            }
            return Lowered::Term(Tpl::Op(
                SCALE.into(),
                vec![Tpl::Num(p), Tpl::Num(q), val(0)],
            ));
        }
    }
    if def.class == OpClass::Collective {
        return lower_collective(ctx, graph, node, node_index, rank, &full, &norm, &at);
    }
    // A generic call: every schema argument as a child, dims made non-negative.
    let r0 = (0..norm.len())
        .find_map(|i| value(i).and_then(meta_of))
        .map_or(0, |m| m.shape.len() as i64);
    let kids: Vec<Tpl> = def
        .schema
        .args
        .iter()
        .zip(&norm)
        .map(|(sa, a)| {
            let is_dim = matches!(sa.name.as_str(), "dim" | "dim0" | "dim1" | "dims")
                && !matches!(full.as_str(), "aten.stack.default");
            match a {
                Arg::Int(d) if is_dim => Tpl::Num(dim(*d, r0)),
                Arg::List(ds) if is_dim => {
                    let mut v: Vec<i64> = ds
                        .iter()
                        .filter_map(Arg::as_int)
                        .map(|d| dim(d, r0))
                        .collect();
                    v.sort_unstable();
                    int_list(&v)
                }
                _ => arg_tpl(a, rank),
            }
        })
        .collect();
    let call = Tpl::Op(full, kids);
    // A multi-output operator whose later outputs nobody takes still returns a tuple.
    if node.outputs.len() > 1 || def.schema.returns.len() > 1 {
        Lowered::Term(Tpl::Op(GET.into(), vec![Tpl::Num(output as i64), call]))
    } else {
        Lowered::Term(call)
    }
}

/// A tensor argument of a normalized call, as a template.
/// What a dropout call computes, read from its literal `p` and `train`.
enum DropoutMode {
    /// `p = 0` or outside training: the input itself.
    Identity,
    /// A random mask kept with probability `1 - p`, scaled by `1 / (1 - p)`.
    Random(f64),
}

/// Reads dropout's `p` and `train` (an absent `train` is training, as in ATen). Only literals
/// decide: a `p` or `train` computed at run time could be anything, so it is refused rather than
/// read as a default (a non-literal `p` once became `0`, an identity).
fn dropout_mode(name: &str, p: &Arg, train: &Arg) -> Result<DropoutMode, String> {
    let train = match train {
        Arg::None => Some(true),
        other => other.as_bool(),
    };
    let p = match p {
        Arg::Int(_) | Arg::Float(_) => p.as_f64(),
        _ => None,
    };
    match (p, train) {
        (_, Some(false)) | (Some(0.0), _) => Ok(DropoutMode::Identity),
        (Some(p), Some(true)) => Ok(DropoutMode::Random(p)),
        _ => Err(format!(
            "`{name}`: dropout's probability and training flag must be literals to know whether a mask is drawn (write them as constants in the graph)"
        )),
    }
}

fn val_of(norm: &[Arg], i: usize, rank: Option<usize>) -> Tpl {
    arg_tpl(norm.get(i).unwrap_or(&Arg::None), rank)
}

/// A scalar argument: integers as `Num`, everything else as its literal symbol.
fn scalar_tpl(a: &Arg) -> Tpl {
    match a {
        Arg::Int(i) => Tpl::Num(*i),
        Arg::Float(f) if f.fract() == 0.0 && f.abs() < 1e15 && *f != 0.0 => {
            Tpl::Op(format!("f:{f:?}"), vec![])
        }
        Arg::Float(f) if *f == 0.0 => Tpl::Op("f:0.0".into(), vec![]),
        other => Tpl::Op(
            literal_symbol(other).unwrap_or_else(|| "none".into()),
            vec![],
        ),
    }
}

/// The value of a 0-d module constant that `v` copies, when the case states it or the captured
/// source line assigns it as a literal (`x[mask] = 0.0` lifts `0.0` into `_tensor_constantN`).
pub fn scalar_constant(ctx: &LowerCtx, graph: &Graph, v: ValueId, is_int: bool) -> Option<Arg> {
    let mut v = v;
    for _ in 0..8 {
        let node = &graph.nodes[v.node];
        match &node.kind {
            NodeKind::Constant { attr } => {
                let value = ctx
                    .constants
                    .get(attr)
                    .copied()
                    .or_else(|| node.loc.as_ref().and_then(|l| l.assigned_literal()))?;
                return Some(if is_int && value.fract() == 0.0 {
                    Arg::Int(value as i64)
                } else {
                    Arg::Float(value)
                });
            }
            NodeKind::Call { op, .. } if IDENTITY_OPS.contains(&op.to_string().as_str()) => {
                v = *node.inputs().first()?;
            }
            _ => return None,
        }
    }
    None
}

fn custom_meaning<'a>(ops: &'a BTreeMap<String, OpMeaning>, op: &OpName) -> Option<&'a OpMeaning> {
    ops.get(&op.to_string()).or_else(|| ops.get(&op.base()))
}

/// A list of integers.
pub fn int_list(v: &[i64]) -> Tpl {
    Tpl::Op(LIST.into(), v.iter().map(|&d| Tpl::Num(d)).collect())
}

/// `x` reshaped to `shape`.
pub fn view_tpl(x: Tpl, shape: &[usize]) -> Tpl {
    let s: Vec<i64> = shape.iter().map(|&d| d as i64).collect();
    Tpl::Op("aten.view.default".into(), vec![x, int_list(&s)])
}

/// Whether `size` and `stride` read `numel` elements from offset 0 in row-major order: every
/// element once, in order.
fn covers_row_major(size: &[i64], stride: &[i64], numel: usize) -> bool {
    if size.len() != stride.len() || size.iter().any(|&n| n < 0) {
        return false;
    }
    let mut step = 1i64;
    for (&n, &st) in size.iter().zip(stride).rev() {
        // A dim of one element is never stepped along: its stride reads nothing.
        if n != 1 && st != step {
            return false;
        }
        step = step.saturating_mul(n);
    }
    usize::try_from(step).is_ok_and(|s| s == numel)
}

/// `x` with dims `a < b` swapped.
pub fn transpose_tpl(x: Tpl, a: i64, b: i64) -> Tpl {
    Tpl::Op(
        "aten.transpose.int".into(),
        vec![x, Tpl::Num(a), Tpl::Num(b)],
    )
}

/// `x[start:end]` along `d`.
pub fn slice_tpl(d: i64, start: i64, end: i64, x: Tpl) -> Tpl {
    Tpl::Op(
        SLICE.into(),
        vec![Tpl::Num(d), Tpl::Num(start), Tpl::Num(end), x],
    )
}

fn arg_tpl(a: &Arg, rank: Option<usize>) -> Tpl {
    match a {
        Arg::Value(v) => Tpl::Value(ValueRef { rank, value: *v }),
        Arg::Int(i) => Tpl::Num(*i),
        Arg::List(items) => Tpl::Op(
            LIST.into(),
            items.iter().map(|x| arg_tpl(x, rank)).collect(),
        ),
        other => Tpl::Op(
            literal_symbol(other).unwrap_or_else(|| "none".into()),
            Vec::new(),
        ),
    }
}

fn decomp_tpl(e: &DecompExpr, args: &[Arg], rank: Option<usize>) -> Option<Tpl> {
    Some(match e {
        DecompExpr::Arg(i) => arg_tpl(args.get(*i)?, rank),
        DecompExpr::Int(i) => Tpl::Num(*i),
        DecompExpr::Float(f) => Tpl::Op(format!("f:{f:?}"), Vec::new()),
        DecompExpr::Bool(b) => Tpl::Op(format!("b:{b}"), Vec::new()),
        DecompExpr::Str(t) => Tpl::Op(literal_symbol(&Arg::Str(t.clone()))?, Vec::new()),
        DecompExpr::Signature(_) => return None,
        DecompExpr::List(items) => Tpl::Op(
            LIST.into(),
            items
                .iter()
                .map(|x| decomp_tpl(x, args, rank))
                .collect::<Option<_>>()?,
        ),
        DecompExpr::Call { op, args: cargs } => {
            let def = Registry::builtin().get(op)?;
            // Decomposition calls are positional; fill the schema defaults like any call.
            let mut kids: Vec<Tpl> = cargs
                .iter()
                .map(|x| decomp_tpl(x, args, rank))
                .collect::<Option<_>>()?;
            for sa in def.schema.args.iter().skip(kids.len()) {
                let d = sa.default.as_deref().unwrap_or("None");
                let lit = match d {
                    "None" => Tpl::Op("none".into(), vec![]),
                    "True" | "False" => Tpl::Op(format!("b:{}", d == "True"), vec![]),
                    _ => match d.parse::<i64>() {
                        Ok(i) if sa.ty != shardproof_ops::ArgType::Float => Tpl::Num(i),
                        _ => Tpl::Op(format!("f:{:?}", d.parse::<f64>().ok()?), vec![]),
                    },
                };
                kids.push(lit);
            }
            Tpl::Op(def.name.to_string(), kids)
        }
    })
}

/// Why an `auto_functionalized` call that the case loader could not inline has no meaning.
pub fn unfit_functionalized(args: &[Arg]) -> String {
    match args.first() {
        Some(Arg::Op(inner)) => format!(
            "in-place operator `{inner}` (in `auto_functionalized`) has no declaration its call fits; declare it in the case's `ops:` as `{{ args: [...], writes: {{ ... }} }}` naming every keyword it is called with"
        ),
        _ => "auto_functionalized without an operator".into(),
    }
}

fn lower_auto_functionalized(
    ctx: &LowerCtx,
    args: &[Arg],
    kwargs: &[(String, Arg)],
    output: usize,
    rank: Option<usize>,
) -> Lowered {
    let Some(Arg::Op(inner)) = args.first() else {
        return Lowered::Unsupported("auto_functionalized_v2 without an operator".into());
    };
    let bases: Vec<ValueId> = match kwargs.iter().find(|(k, _)| k == "_all_bases") {
        Some((_, Arg::List(items))) => items.iter().filter_map(Arg::as_value).collect(),
        _ => Vec::new(),
    };
    match custom_meaning(ctx.custom_ops, inner) {
        Some(OpMeaning::Identity) => {
            let k = output.saturating_sub(1);
            bases.get(k).map_or_else(
                || Lowered::Unsupported("auto_functionalized_v2 output without a base".into()),
                |&v| Lowered::Alias(ValueRef { rank, value: v }),
            )
        }
        _ => Lowered::Unsupported(format!(
            "in-place operator `{inner}` has no declared meaning (declare it `identity` in the case's `ops:` section if it only records its tensor)"
        )),
    }
}

#[allow(clippy::too_many_arguments)]
fn lower_collective(
    ctx: &LowerCtx,
    graph: &Graph,
    node: &Node,
    node_index: usize,
    rank: Option<usize>,
    full: &str,
    norm: &[Arg],
    at: &dyn Fn(ValueId) -> ValueRef,
) -> Lowered {
    let input = norm.first().and_then(Arg::as_value);
    let Some(x) = input else {
        return Lowered::Unsupported(format!("`{full}` without an input tensor"));
    };
    let Some(r) = rank else {
        // The specification runs on one device: every group has one member.
        return Lowered::Alias(at(x));
    };
    let Some(members) = ctx.partners.get(&(r, node_index)) else {
        return Lowered::Unsupported(format!(
            "collective `{}` on rank {r} has no matching call on the other members of its group",
            node.outputs[0].name
        ));
    };
    let xs: Vec<Tpl> = members.iter().map(|&v| Tpl::Value(v)).collect();
    let me = members.iter().position(|v| v.rank == Some(r)).unwrap_or(0);
    let n = members.len() as i64;
    let name = full.split('.').nth(1).unwrap_or("");
    let reduce = |op: &str, xs: Vec<Tpl>| -> Option<Tpl> {
        if xs.len() == 1 {
            return xs.into_iter().next();
        }
        Some(match op {
            "sum" => Tpl::Op(SUM.into(), xs),
            "max" => Tpl::Op(MAX.into(), xs),
            "min" => Tpl::Op(MIN.into(), xs),
            "avg" => Tpl::Op(
                "aten.div.Tensor".into(),
                vec![
                    Tpl::Op(SUM.into(), xs),
                    Tpl::Op(format!("f:{:?}", n as f64), vec![]),
                ],
            ),
            _ => return None,
        })
    };
    let str_arg = |i: usize| match norm.get(i) {
        Some(Arg::Str(s)) => s.clone(),
        _ => String::new(),
    };
    let t = match name {
        "all_reduce" => reduce(&str_arg(1), xs),
        "all_gather_into_tensor" => Some(if n == 1 {
            xs[0].clone()
        } else {
            Tpl::Op(CAT.into(), std::iter::once(Tpl::Num(0)).chain(xs).collect())
        }),
        "reduce_scatter_tensor" => {
            let rows = graph_rows(graph, x);
            reduce(&str_arg(1), xs).map(|s| {
                if n == 1 {
                    s
                } else {
                    let m = rows / n;
                    slice_tpl(0, me as i64 * m, (me as i64 + 1) * m, s)
                }
            })
        }
        // Member j's chunk `me` of its input, in member order; only equal splits (empty split
        // lists, or lists of one repeated size on every member: the interpreter checks that
        // the members agree), whose chunk offsets need no other member's arguments.
        "all_to_all_single" => {
            let equal = |i: usize| match norm.get(i) {
                Some(Arg::List(xs)) => xs.windows(2).all(|w| w[0] == w[1]),
                Some(Arg::None) | None => true,
                _ => false,
            };
            let rows = graph_rows(graph, x);
            if !equal(1) || !equal(2) || rows % n != 0 {
                None
            } else if n == 1 {
                Some(xs[0].clone())
            } else {
                let m = rows / n;
                let chunks = xs
                    .into_iter()
                    .map(|xj| slice_tpl(0, me as i64 * m, (me as i64 + 1) * m, xj));
                Some(Tpl::Op(
                    CAT.into(),
                    std::iter::once(Tpl::Num(0)).chain(chunks).collect(),
                ))
            }
        }
        "broadcast" => {
            let src = norm.get(1).and_then(Arg::as_int).unwrap_or(0) as usize;
            // `src` is a global rank; find it among the members.
            members
                .iter()
                .position(|v| v.rank == Some(src))
                .map(|i| xs[i].clone())
        }
        _ => None,
    };
    t.map_or_else(
        || {
            Lowered::Unsupported(format!(
                "collective `{full}` is not supported by the refinement engine (all_to_all_single: only equal splits)"
            ))
        },
        |t| {
            if let Tpl::Value(v) = t {
                Lowered::Alias(v)
            } else {
                Lowered::Term(t)
            }
        },
    )
}

fn graph_rows(graph: &Graph, v: ValueId) -> i64 {
    graph
        .recorded_type(v)
        .and_then(|t| t.concrete_shape())
        .and_then(|s| s.first().copied())
        .unwrap_or(0)
}

/// Per (rank, collective node): the input value of each group member, in member order.
pub type Partners = HashMap<(usize, usize), Vec<ValueRef>>;

/// Pairs the collectives of the ranks as the interpreter runs them
/// ([`shardproof_interp::schedule`]): a call meets only the calls of the same collective on the
/// same group name on every member, in a consistent order. Returns, per (rank, node), the input
/// value of each member in member order, and why the schedule cannot complete (a hang or a call
/// without meaning), if it cannot: collectives past that point stay unpaired. `leaves`, per
/// rank, names the values the rank is given (a case's `rank_leaves`): collectives that do not
/// depend on them never run.
pub fn pair_collectives(
    program: &Program,
    custom_ops: &BTreeMap<String, OpMeaning>,
    leaves: &[BTreeSet<String>],
) -> (Partners, Option<ScheduleProblem>) {
    let plan = schedule(program, custom_ops, Some(leaves));
    let mut out = HashMap::new();
    for meeting in &plan.meetings {
        let ins: Option<Vec<ValueRef>> = meeting
            .calls
            .iter()
            .map(|&(m, node)| {
                program.ranks[m].nodes[node]
                    .inputs()
                    .first()
                    .map(|&x| ValueRef {
                        rank: Some(m),
                        value: x,
                    })
            })
            .collect();
        let Some(ins) = ins else { continue };
        for &(r, node) in &meeting.calls {
            out.insert((r, node), ins.clone());
        }
    }
    (out, plan.problem)
}

const P2P_SEND: &str = "shardproof_p2p.send.default";
const P2P_RECV: &str = "shardproof_p2p.recv.default";

/// Per (rank, recv node): the tensor the matching send posted, on its rank.
pub type Messages = HashMap<(usize, usize), ValueRef>;

/// Pairs point-to-point messages as the interpreter delivers them (docs/formats/
/// point-to-point.md): the k-th recv on rank `d` from `src` with tag `t` takes the k-th send of
/// rank `src` to `d` with tag `t`, in program order. Unmatched recvs stay out of the map (their
/// lowering is unsupported: a verdict through them is inconclusive).
pub fn pair_messages(program: &Program) -> Messages {
    // (src, dst, tag) -> the posted tensors, in the sender's program order.
    let mut sent: BTreeMap<(usize, usize, i64), Vec<ValueRef>> = BTreeMap::new();
    // (src, dst, tag) -> the recv nodes, in the receiver's program order.
    let mut waiting: BTreeMap<(usize, usize, i64), Vec<(usize, usize)>> = BTreeMap::new();
    for (r, g) in program.ranks.iter().enumerate() {
        let members = shardproof_ops::program_members(program, r);
        for (i, node) in g.nodes.iter().enumerate() {
            let NodeKind::Call { op, args, kwargs } = &node.kind else {
                continue;
            };
            // The global peer, a group-relative one resolved: a call whose route does not
            // resolve is paired with nothing (unsupported, so inconclusive).
            let Some(Ok(call)) = shardproof_ops::p2p_node_call(op, args, kwargs, &members) else {
                continue;
            };
            match call.end {
                P2pEnd::Send => {
                    let Some(x) = node.inputs().first().copied() else {
                        continue;
                    };
                    sent.entry((r, call.peer, call.tag))
                        .or_default()
                        .push(ValueRef {
                            rank: Some(r),
                            value: x,
                        });
                }
                P2pEnd::Recv => {
                    waiting
                        .entry((call.peer, r, call.tag))
                        .or_default()
                        .push((r, i));
                }
            }
        }
    }
    let mut out = HashMap::new();
    for (key, recvs) in waiting {
        let posted = sent.get(&key).map_or(&[][..], Vec::as_slice);
        for (recv, &x) in recvs.into_iter().zip(posted) {
            // A message of another type is a broken schedule (`run` reports it): no meaning.
            let sent_type = program.ranks[x.rank.unwrap_or(0)].recorded_type(x.value);
            let recv_type = program.ranks[recv.0].recorded_type(ValueId::new(recv.1, 0));
            if sent_type.is_some() && sent_type == recv_type {
                out.insert(recv, x);
            }
        }
    }
    out
}

/// A float as an exact fraction: an integer, one over an integer, or the binary fraction every
/// other float is (`1/sqrt(128)`, a softmax scale, is `m / 2^54`), when it fits.
pub fn rational(c: f64) -> Option<(i64, i64)> {
    const LIMIT: f64 = (1u64 << 40) as f64;
    if !c.is_finite() {
        return None;
    }
    if c.fract() == 0.0 && c.abs() < LIMIT {
        return Some((c as i64, 1));
    }
    let inv = 1.0 / c;
    if inv.is_finite() && inv.fract() == 0.0 && inv.abs() < LIMIT && 1.0 / inv == c {
        return Some((inv.signum() as i64, inv.abs() as i64));
    }
    dyadic(c)
}

/// A finite float as the exact fraction `m / 2^k` it is (`m` odd), when `k` is at most 62.
/// (An infinity's or NaN's exponent is out of that range; zero has no odd `m`.)
fn dyadic(c: f64) -> Option<(i64, i64)> {
    if c == 0.0 {
        return None;
    }
    let bits = c.to_bits();
    let biased = ((bits >> 52) & 0x7ff) as i64;
    let fraction = bits & ((1u64 << 52) - 1);
    let (mut m, mut e) = if biased == 0 {
        (fraction, -1074)
    } else {
        (fraction | (1u64 << 52), biased - 1075)
    };
    let zeros = m.trailing_zeros();
    m >>= zeros;
    e += i64::from(zeros);
    if !(-62..0).contains(&e) {
        return None;
    }
    let sign = if c < 0.0 { -1 } else { 1 };
    Some((sign * m as i64, 1i64 << -e))
}

#[cfg(test)]
mod tests {
    use super::{covers_row_major, dropout_mode, rational, DropoutMode};
    use shardproof_ir::{Arg, ValueId};

    /// Dropout is an identity only at a literal `p = 0` or a literal `train = False`; a
    /// training call with a literal `p` draws a mask; a `p` or `train` computed at run time is
    /// refused (once read as `p = 0`, an identity).
    #[test]
    fn dropout_is_read_from_literals_only() {
        let computed = Arg::Value(ValueId { node: 2, output: 0 });
        let mode = |p: &Arg, t: &Arg| dropout_mode("d", p, t);
        assert!(matches!(
            mode(&Arg::Float(0.0), &Arg::Bool(true)),
            Ok(DropoutMode::Identity)
        ));
        assert!(matches!(
            mode(&computed, &Arg::Bool(false)),
            Ok(DropoutMode::Identity)
        ));
        assert!(
            matches!(mode(&Arg::Float(0.5), &Arg::None), Ok(DropoutMode::Random(p)) if p == 0.5)
        );
        assert!(matches!(
            mode(&Arg::Float(0.5), &Arg::Bool(true)),
            Ok(DropoutMode::Random(_))
        ));
        assert!(mode(&computed, &Arg::Bool(true)).is_err());
        assert!(mode(&computed, &Arg::None).is_err());
        assert!(mode(&Arg::Float(0.5), &computed).is_err());
        assert!(mode(&Arg::None, &Arg::Bool(true)).is_err());
    }

    /// Only a read of every element once, in row-major order from offset 0, is a view: a
    /// transposed, overlapping, partial or overrunning stride is not.
    #[test]
    fn whole_row_major_strides_are_views() {
        assert!(covers_row_major(&[2, 4, 4, 4], &[64, 16, 4, 1], 128));
        assert!(covers_row_major(&[8, 1, 4], &[4, 99, 1], 32));
        assert!(covers_row_major(&[], &[], 1));
        assert!(!covers_row_major(&[4, 4], &[1, 4], 16));
        assert!(!covers_row_major(&[4, 4], &[4, 1], 32));
        assert!(!covers_row_major(&[4, 4], &[2, 1], 16));
        assert!(!covers_row_major(&[4, 4], &[4], 16));
        assert!(!covers_row_major(&[-4, -4], &[-4, 1], 16));
    }

    /// Integers and their inverses stay small fractions; every other float of moderate size is
    /// the exact binary fraction it is (`p / q` evaluates back to the very float); floats too
    /// small for a 62-bit denominator, and infinities, have none.
    #[test]
    fn floats_are_exact_fractions() {
        assert_eq!(rational(3.0), Some((3, 1)));
        assert_eq!(rational(0.25), Some((1, 4)));
        assert_eq!(rational(-0.5), Some((-1, 2)));
        for c in [
            0.35355339059327373, // 1/sqrt(8), a softmax scale
            0.7071067811865475,
            0.1,
            -0.9,
            0.044715,
            1e-3,
        ] {
            let (p, q) = rational(c).unwrap_or_else(|| panic!("{c}"));
            assert!(
                q > 0 && (q == 1 || p % 2 != 0),
                "{c}: {p}/{q} is not in lowest terms"
            );
            assert_eq!(p as f64 / q as f64, c);
        }
        assert_eq!(rational(1e-30), None);
        assert_eq!(rational(f64::INFINITY), None);
        assert_eq!(rational(f64::NAN), None);
    }
}
