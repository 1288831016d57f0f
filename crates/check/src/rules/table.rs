//! The rule table itself: every operator's `namespace.name` registered with its family,
//! rule and literal policy.

use super::*;

pub(super) fn build() -> HashMap<&'static str, Rule> {
    let mut m: HashMap<&'static str, Rule> = HashMap::new();
    let mut add = |names: &[&'static str], family: &'static str, f: RuleFn, literals| {
        for n in names {
            m.insert(
                n,
                Rule {
                    family,
                    f,
                    literals,
                },
            );
        }
    };
    use Literals::{Own, Vary};
    add(
        &[
            "aten.clone",
            "aten.contiguous",
            "aten._to_copy",
            "aten.to",
            "aten.alias",
            "aten.alias_copy",
            "aten.detach",
            "aten.detach_copy",
            "aten.lift",
            "aten.lift_fresh",
            "aten.lift_fresh_copy",
            "_c10d_functional.wait_tensor",
        ],
        "linear-unary",
        linear_unary,
        Vary,
    );
    // Linear, but a negated maximum is a minimum (`neg`).
    add(&["aten.neg"], "linear-unary", neg, Vary);
    add(
        &["aten.native_dropout_backward"],
        "linear-unary",
        dropout_backward,
        Vary,
    );
    add(
        &["aten.dropout", "aten.native_dropout"],
        "dropout",
        dropout,
        Vary,
    );
    add(
        &[
            "aten.relu",
            "aten.gelu",
            "aten.silu",
            "aten.sigmoid",
            "aten.tanh",
            "aten.exp",
            "aten.exp2",
            "aten.expm1",
            "aten.log",
            "aten.log2",
            "aten.log10",
            "aten.log1p",
            "aten.sqrt",
            "aten.rsqrt",
            "aten.reciprocal",
            "aten.abs",
            "aten.sin",
            "aten.cos",
            "aten.tan",
            "aten.sinh",
            "aten.cosh",
            "aten.asin",
            "aten.acos",
            "aten.atan",
            "aten.asinh",
            "aten.acosh",
            "aten.atanh",
            "aten.erf",
            "aten.erfc",
            "aten.erfinv",
            "aten.round",
            "aten.floor",
            "aten.ceil",
            "aten.trunc",
            "aten.fix",
            "aten.frac",
            "aten.sign",
            "aten.sgn",
            "aten.clamp",
            "aten.clamp_min",
            "aten.clamp_max",
            "aten.isnan",
            "aten.isinf",
            "aten.isfinite",
            "aten.isposinf",
            "aten.isneginf",
            "aten.nan_to_num",
            "aten.bitwise_not",
            "aten.logical_not",
        ],
        "nonlinear-unary",
        nonlinear_unary,
        Vary,
    );
    add(&["aten.pow"], "pow", pow, Vary);
    add(
        &["aten.add", "aten.sub", "aten.rsub"],
        "elementwise-add",
        add_sub,
        Vary,
    );
    add(&["aten.mul"], "elementwise-mul", mul, Vary);
    add(&["aten.div"], "elementwise-div", div, Vary);
    // Extrema of partials of their own reduction stay partial (`extremum`); otherwise
    // non-linear binaries.
    add(&["aten.maximum"], "nonlinear-binary", maximum, Vary);
    add(&["aten.minimum"], "nonlinear-binary", minimum, Vary);
    add(
        &[
            "aten.fmax",
            "aten.fmin",
            "aten.atan2",
            "aten.remainder",
            "aten.fmod",
            "aten.floor_divide",
            "aten.eq",
            "aten.ne",
            "aten.lt",
            "aten.le",
            "aten.gt",
            "aten.ge",
            "aten.bitwise_and",
            "aten.bitwise_or",
            "aten.bitwise_xor",
            "aten.logical_and",
            "aten.logical_or",
            "aten.logical_xor",
            "aten.__and__",
            "aten.__or__",
            "aten.__xor__",
        ],
        "nonlinear-binary",
        nonlinear_binary,
        Vary,
    );
    add(&["aten.max", "aten.min"], "max-min", max_min, Vary);
    add(
        &[
            "aten.threshold_backward",
            "aten.gelu_backward",
            "aten.silu_backward",
            "aten.sigmoid_backward",
            "aten.tanh_backward",
        ],
        "activation-backward",
        activation_backward,
        Vary,
    );
    add(&["aten.where"], "where", where_, Vary);
    add(&["aten.masked_fill"], "masked-fill", masked_fill, Vary);
    add(&["aten.lerp"], "lerp", lerp, Vary);
    add(&["aten.addcmul", "aten.addcdiv"], "addcmul", addcmul, Vary);
    add(
        &["aten.mm", "aten.bmm", "aten.matmul", "aten.dot", "aten.mv"],
        "matmul",
        matmul,
        Vary,
    );
    add(&["aten.addmm", "aten.baddbmm"], "matmul-bias", addmm, Vary);
    add(&["aten.linear"], "linear", linear, Vary);
    add(
        &[
            "aten.view",
            "aten.view_copy",
            "aten.reshape",
            "aten._unsafe_view",
            "aten.flatten",
            "aten.unflatten",
        ],
        "view",
        view,
        Vary,
    );
    add(&["aten.t", "aten.t_copy"], "transpose", t, Vary);
    add(
        &["aten.transpose", "aten.transpose_copy"],
        "transpose",
        transpose,
        Vary,
    );
    add(
        &["aten.permute", "aten.permute_copy"],
        "permute",
        permute,
        Vary,
    );
    add(
        &["aten.unsqueeze", "aten.unsqueeze_copy"],
        "unsqueeze",
        unsqueeze,
        Vary,
    );
    add(
        &["aten.squeeze", "aten.squeeze_copy"],
        "squeeze",
        squeeze,
        Vary,
    );
    add(&["aten.expand", "aten.expand_copy"], "expand", expand, Vary);
    add(&["aten.repeat"], "repeat", repeat, Vary);
    add(
        &["aten.slice", "aten.slice_copy", "aten.narrow"],
        "slice",
        slice,
        Own,
    );
    add(&["aten.select", "aten.select_copy"], "select", select, Own);
    add(&["aten.cat"], "cat", cat, Vary);
    add(&["aten.stack"], "stack", stack, Vary);
    add(
        &[
            "aten.split",
            "aten.split_with_sizes",
            "aten.chunk",
            "aten.unbind",
        ],
        "split",
        split,
        Vary,
    );
    add(
        &["aten.slice_scatter", "aten.select_scatter"],
        "slice-scatter",
        slice_scatter,
        Own,
    );
    add(&["aten.constant_pad_nd", "aten.pad"], "pad", pad, Vary);
    add(&["aten.flip", "aten.roll"], "flip", flip, Vary);
    add(&["aten.triu", "aten.tril"], "triangle", triangle, Vary);
    add(
        &[
            "aten.sum",
            "aten.mean",
            "aten.amax",
            "aten.amin",
            "aten.logsumexp",
            "aten.prod",
            "aten.var",
            "aten.std",
            "aten.argmax",
            "aten.argmin",
            "aten.all",
            "aten.any",
            "aten.count_nonzero",
            "aten.norm",
            "aten.linalg_vector_norm",
        ],
        "reduction",
        reduction,
        Vary,
    );
    add(&["aten.cumsum", "aten.cumprod"], "scan", scan, Vary);
    add(
        &[
            "aten._softmax",
            "aten.softmax",
            "aten._log_softmax",
            "aten.log_softmax",
        ],
        "softmax",
        softmax,
        Vary,
    );
    add(
        &[
            "aten._softmax_backward_data",
            "aten._log_softmax_backward_data",
        ],
        "softmax-backward",
        softmax_backward,
        Vary,
    );
    add(
        &[
            "aten.native_layer_norm",
            "aten.layer_norm",
            "aten.rms_norm",
            "aten._fused_rms_norm",
        ],
        "norm",
        norm,
        Vary,
    );
    add(
        &[
            "aten.native_layer_norm_backward",
            "aten._fused_rms_norm_backward",
        ],
        "norm-backward",
        norm_backward,
        Vary,
    );
    add(
        &["apex.fused_layer_norm_affine_fwd"],
        "norm",
        apex_norm,
        Vary,
    );
    add(
        &["aten.topk", "aten.sort", "aten.argsort"],
        "sort",
        sort,
        Vary,
    );
    add(&["aten.embedding"], "embedding", embedding, Vary);
    add(
        &["aten.embedding_dense_backward"],
        "embedding-backward",
        embedding_backward,
        Vary,
    );
    add(&["aten.gather"], "gather", gather, Vary);
    add(&["aten.index_select"], "index-select", index_select, Vary);
    add(&["aten.index", "aten._unsafe_index"], "index", index, Vary);
    add(
        &["aten.index_put", "aten._unsafe_index_put"],
        "index-put",
        index_put,
        Vary,
    );
    add(
        &[
            "aten.scatter",
            "aten.scatter_add",
            "aten.scatter_reduce",
            "aten.index_add",
            "aten.index_copy",
            "aten.index_fill",
        ],
        "scatter",
        scatter,
        Vary,
    );
    add(&["aten.nll_loss_forward"], "nll-loss", nll_loss, Vary);
    add(
        &["aten.nll_loss_backward"],
        "nll-loss-backward",
        nll_loss_backward,
        Vary,
    );
    add(&["aten.mse_loss"], "mse-loss", mse_loss, Vary);
    add(
        &["aten.mse_loss_backward"],
        "mse-loss-backward",
        mse_loss_backward,
        Vary,
    );
    add(
        &[
            "aten.full",
            "aten.zeros",
            "aten.ones",
            "aten.empty",
            "aten.empty_strided",
            "aten.eye",
            "aten.linspace",
            "aten.scalar_tensor",
        ],
        "creation",
        creation,
        Vary,
    );
    add(&["aten.arange"], "arange", arange, Own);
    add(
        &[
            "aten.full_like",
            "aten.zeros_like",
            "aten.ones_like",
            "aten.empty_like",
            "aten.new_full",
            "aten.new_zeros",
            "aten.new_ones",
            "aten.new_empty",
            "aten.new_empty_strided",
            "aten.fill",
            "aten.zero",
        ],
        "like",
        like,
        Vary,
    );
    add(&["aten.copy"], "copy", copy, Vary);
    add(
        &["aten._assert_tensor_metadata"],
        "assert",
        assert_meta,
        Vary,
    );
    add(
        &["_c10d_functional.all_reduce"],
        "all-reduce",
        all_reduce,
        Own,
    );
    add(
        &["_c10d_functional.all_gather_into_tensor"],
        "all-gather",
        all_gather,
        Own,
    );
    add(
        &["_c10d_functional.reduce_scatter_tensor"],
        "reduce-scatter",
        reduce_scatter,
        Own,
    );
    add(
        &["_c10d_functional.all_to_all_single"],
        "all-to-all",
        all_to_all,
        Own,
    );
    add(&["_c10d_functional.broadcast"], "broadcast", broadcast, Own);
    add(&["shardproof_p2p.send"], "send", linear_unary_own, Own);
    m
}
