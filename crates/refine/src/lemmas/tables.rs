//! The operator tables the lemmas are written over: elementwise operators (their tensor
//! operands and the positions they are linear in) and the other operators linear in some
//! operand, with the lookups lemmas and diagnosis use.

use super::{Graph, SCALE};
use crate::term::{Term, SLICE};
use egg::{Id, Symbol};

/// Elementwise operators: (name, positions of tensor operands, positions it is linear in,
/// whether those linear positions are jointly additive like `add`).
pub const ELEMENTWISE: &[(&str, &[usize], &[usize], bool)] = &[
    ("aten.add.Tensor", &[0, 1], &[0, 1], true),
    ("aten.sub.Tensor", &[0, 1], &[0, 1], true),
    ("aten.mul.Tensor", &[0, 1], &[0, 1], false),
    ("aten.div.Tensor", &[0, 1], &[0], false),
    ("aten.where.self", &[0, 1, 2], &[1, 2], true),
    // lerp(a, b, w) = (1 - w) a + w b: jointly linear in a and b (Adam's first moment).
    ("aten.lerp.Scalar", &[0, 1], &[0, 1], true),
    ("aten.addcmul.default", &[0, 1, 2], &[], false),
    ("aten.addcdiv.default", &[0, 1, 2], &[], false),
    ("aten.maximum.default", &[0, 1], &[], false),
    ("aten.minimum.default", &[0, 1], &[], false),
    ("aten.threshold_backward.default", &[0, 1], &[0], false),
    ("aten.gelu_backward.default", &[0, 1], &[0], false),
    ("aten.silu_backward.default", &[0, 1], &[0], false),
    ("aten.sigmoid_backward.default", &[0, 1], &[0], false),
    ("aten.tanh_backward.default", &[0, 1], &[0], false),
    ("aten.native_dropout_backward.default", &[0, 1], &[0], false),
    ("aten.masked_fill.Scalar", &[0, 1], &[], false),
    ("aten.eq.Tensor", &[0, 1], &[], false),
    ("aten.ne.Tensor", &[0, 1], &[], false),
    ("aten.lt.Tensor", &[0, 1], &[], false),
    ("aten.le.Tensor", &[0, 1], &[], false),
    ("aten.gt.Tensor", &[0, 1], &[], false),
    ("aten.ge.Tensor", &[0, 1], &[], false),
    ("aten.bitwise_or.Tensor", &[0, 1], &[], false),
    ("aten.bitwise_and.Tensor", &[0, 1], &[], false),
    ("aten.logical_and.default", &[0, 1], &[], false),
    ("aten.logical_or.default", &[0, 1], &[], false),
    ("aten.add.Scalar", &[0], &[], false),
    ("aten.sub.Scalar", &[0], &[], false),
    ("aten.rsub.Scalar", &[0], &[], false),
    ("aten.mul.Scalar", &[0], &[0], false),
    ("aten.div.Scalar", &[0], &[0], false),
    ("aten.pow.Tensor_Scalar", &[0], &[], false),
    ("aten.eq.Scalar", &[0], &[], false),
    ("aten.ne.Scalar", &[0], &[], false),
    ("aten.lt.Scalar", &[0], &[], false),
    ("aten.le.Scalar", &[0], &[], false),
    ("aten.gt.Scalar", &[0], &[], false),
    ("aten.ge.Scalar", &[0], &[], false),
    ("aten._to_copy.default", &[0], &[0], false),
    ("aten.neg.default", &[0], &[0], false),
    ("aten.abs.default", &[0], &[], false),
    ("aten.exp.default", &[0], &[], false),
    ("aten.log.default", &[0], &[], false),
    ("aten.sqrt.default", &[0], &[], false),
    ("aten.rsqrt.default", &[0], &[], false),
    ("aten.tanh.default", &[0], &[], false),
    ("aten.sigmoid.default", &[0], &[], false),
    ("aten.relu.default", &[0], &[], false),
    ("aten.gelu.default", &[0], &[], false),
    ("aten.silu.default", &[0], &[], false),
    ("aten.sin.default", &[0], &[], false),
    ("aten.cos.default", &[0], &[], false),
    ("aten.erf.default", &[0], &[], false),
    ("aten.reciprocal.default", &[0], &[], false),
    ("aten.logical_not.default", &[0], &[], false),
    ("aten.bitwise_not.default", &[0], &[], false),
    ("aten.clamp.default", &[0], &[], false),
    ("aten.sign.default", &[0], &[], false),
    ("aten.sgn.default", &[0], &[], false),
    ("aten.floor.default", &[0], &[], false),
    ("aten.ceil.default", &[0], &[], false),
    ("aten.round.default", &[0], &[], false),
    ("aten.trunc.default", &[0], &[], false),
    ("aten.fix.default", &[0], &[], false),
    ("aten.frac.default", &[0], &[], false),
    ("aten.exp2.default", &[0], &[], false),
    ("aten.expm1.default", &[0], &[], false),
    ("aten.log2.default", &[0], &[], false),
    ("aten.log10.default", &[0], &[], false),
    ("aten.log1p.default", &[0], &[], false),
    ("aten.tan.default", &[0], &[], false),
    ("aten.asin.default", &[0], &[], false),
    ("aten.acos.default", &[0], &[], false),
    ("aten.atan.default", &[0], &[], false),
    ("aten.sinh.default", &[0], &[], false),
    ("aten.cosh.default", &[0], &[], false),
    ("aten.asinh.default", &[0], &[], false),
    ("aten.acosh.default", &[0], &[], false),
    ("aten.atanh.default", &[0], &[], false),
    ("aten.erfc.default", &[0], &[], false),
    ("aten.erfinv.default", &[0], &[], false),
    ("aten.clamp_min.default", &[0], &[], false),
    ("aten.clamp_max.default", &[0], &[], false),
    // More overloads of check's element-wise families (the fast path's rule table), so the
    // e-graph moves them through concatenations as the fast path relates them.
    ("aten.pow.Scalar", &[1], &[], false),
    ("aten.pow.Tensor_Tensor", &[0, 1], &[], false),
    ("aten.clamp.Tensor", &[0, 1, 2], &[], false),
    ("aten.floor_divide.default", &[0, 1], &[], false),
    ("aten.remainder.Tensor", &[0, 1], &[], false),
    ("aten.fmod.Tensor", &[0, 1], &[], false),
    ("aten.atan2.default", &[0, 1], &[], false),
    ("aten.div.Tensor_mode", &[0, 1], &[], false),
    ("aten.fmax.default", &[0, 1], &[], false),
    ("aten.rsub.Tensor", &[0, 1], &[], false),
    ("aten.nan_to_num.default", &[0], &[], false),
    ("aten.round.decimals", &[0], &[], false),
    (SCALE, &[2], &[2], false),
];

/// Non-elementwise operators linear in some tensor operands (each on its own): sums over
/// ranks and scale factors move through them.
pub const LINEAR: &[(&str, &[usize])] = &[
    ("aten.mm.default", &[0, 1]),
    ("aten.bmm.default", &[0, 1]),
    ("aten.view.default", &[0]),
    ("aten.transpose.int", &[0]),
    ("aten.permute.default", &[0]),
    ("aten.expand.default", &[0]),
    ("aten.sum.dim_IntList", &[0]),
    ("aten.sum.default", &[0]),
    ("aten.mean.dim", &[0]),
    ("aten.mean.default", &[0]),
    ("aten.select.int", &[0]),
    ("aten.embedding_dense_backward.default", &[0]),
    ("aten.nll_loss_backward.default", &[0]),
    ("aten._log_softmax_backward_data.default", &[0]),
    ("aten._softmax_backward_data.default", &[0]),
    ("aten.matmul.default", &[0, 1]),
    ("aten.gather.default", &[0]),
    (SLICE, &[3]),
    (crate::term::VOCAB_GRAD, &[0]),
];

pub(super) fn elementwise_roots() -> Vec<String> {
    ELEMENTWISE.iter().map(|e| e.0.to_string()).collect()
}

pub(super) fn ew(
    root: &str,
) -> Option<&'static (&'static str, &'static [usize], &'static [usize], bool)> {
    ELEMENTWISE.iter().find(|e| e.0 == root)
}

/// Which operator a matched class node is: the lemma framework hands the children only, so
/// the applier re-finds the node with these children: the first node of the class, in its
/// order, whose children are `kids` and whose operator is one of `roots` (which may be another
/// root than the matched pattern's). The children are compared first. The roots are interned
/// symbols, compared as integers: `Symbol::as_str` takes the symbol table's lock, and this runs
/// on every match of every root (a million times a minute on 16-rank DeepSeek).
pub(super) fn node_sym(g: &Graph, eclass: Id, kids: &[Id], roots: &[Symbol]) -> Option<Symbol> {
    g[eclass].nodes.iter().find_map(|n| match n {
        Term::Op(s, k)
            if k.len() == kids.len()
                && k.iter().zip(kids).all(|(a, b)| g.find(*a) == g.find(*b))
                && roots.contains(s) =>
        {
            Some(*s)
        }
        _ => None,
    })
}

/// Root names interned once, for [`node_sym`] (built where a lemma is made, not per match).
pub(super) fn symbols(names: &[impl AsRef<str>]) -> Vec<Symbol> {
    names.iter().map(|n| Symbol::from(n.as_ref())).collect()
}

/// Whether an operator may be linear in its argument `pos` (over-approximated: used only to
/// withhold bug evidence, never to build terms).
pub fn may_be_linear_in(sym: &str, pos: usize) -> bool {
    let (positions, _) = linear_positions(sym);
    if positions.contains(&pos) {
        return true;
    }
    matches!(
        (sym, pos),
        (
            "aten.scatter.src" | "aten.scatter_add.default" | "aten.index_add.default",
            0 | 3
        ) | (
            "aten.index_put.default" | "aten._unsafe_index_put.default",
            0 | 2
        ) | ("aten.masked_fill.Scalar" | "aten.masked_fill.Tensor", 0)
            // `other - alpha x`: linear in `x` where `other` is zero.
            | ("aten.rsub.Scalar", 0)
            | ("aten.cat.default" | "aten.stack.default", 0)
            | (
                "aten.clone.default"
                    | "aten.contiguous.default"
                    | "aten.alias.default"
                    | "aten.reshape.default"
                    | "aten._unsafe_view.default"
                    | "aten.unsqueeze.default"
                    | "aten.squeeze.dim"
                    | "aten.expand.default"
                    | "aten.t.default"
                    | "aten.slice.Tensor"
                    | "aten.select.int"
                    | "aten.index_select.default"
                    | "aten.flip.default"
                    | "aten.roll.default"
                    | "aten.cumsum.default"
                    | "aten.tril.default"
                    | "aten.triu.default"
                    | "aten.constant_pad_nd.default"
                    | "aten.repeat.default"
                    | "aten.diagonal.default"
                    | "aten.permute.default"
                    | "aten.transpose.int"
                    | "aten.narrow.default"
                    | "aten.addmm.default"
                    | "aten.baddbmm.default",
                _
            )
    )
}

/// Whether multiplying argument `pos` of an operator by a constant multiplies its result by
/// the same constant whatever its other arguments hold (under-approximated: diagnosis follows
/// a scale factor through these to name the rank whose factors differ). Not an operand linear
/// only jointly with another (`add`, `where`), placed beside other values (`cat`, a pad) or
/// rounded by a cast.
pub fn scales_with(sym: &str, pos: usize) -> bool {
    let (positions, joint) = linear_positions(sym);
    if positions.contains(&pos) {
        return !joint && sym != "aten._to_copy.default";
    }
    pos == 0
        && matches!(
            sym,
            "aten.clone.default"
                | "aten.contiguous.default"
                | "aten.alias.default"
                | "aten.reshape.default"
                | "aten._unsafe_view.default"
                | "aten.unsqueeze.default"
                | "aten.squeeze.dim"
                | "aten.t.default"
                | "aten.slice.Tensor"
                | "aten.index_select.default"
                | "aten.flip.default"
                | "aten.roll.default"
                | "aten.cumsum.default"
                | "aten.tril.default"
                | "aten.triu.default"
                | "aten.repeat.default"
                | "aten.diagonal.default"
                | "aten.narrow.default"
        )
}

pub(super) fn linear_positions(sym: &str) -> (Vec<usize>, bool) {
    if let Some(e) = ew(sym) {
        return (e.2.to_vec(), e.3);
    }
    LINEAR
        .iter()
        .find(|e| e.0 == sym)
        .map_or((Vec::new(), false), |e| (e.1.to_vec(), false))
}
