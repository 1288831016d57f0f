"""Per-operator oracle cases: one tiny program per ATen operator (or overload), with inputs.

Every case names the ATen operator(s) it targets; capture checks that the printed graph really
calls them (torch.export may decompose composites; the manifest records what it emitted).
Float cases are built in float64 so that PyTorch computes the f64 reference; a few run in f32,
int64 or bool to cover promotion and exact integer semantics.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import torch
import torch.nn.functional as F

from .common import F32, F64, I64, Gen

aten = torch.ops.aten


@dataclass
class OpCase:
    """One per-operator program."""

    name: str
    targets: list[str]
    fn: Callable[..., Any]
    make_inputs: Callable[[Gen], dict[str, torch.Tensor]]
    # "export": torch.export.export (then run_decompositions({}) if a target is missing);
    # "make_fx": make_fx with real tensors (concrete shapes for data-dependent outputs).
    tracer: str = "export"
    # "f64": compare against an f64 interpreter run; "native": round every tensor to its
    # declared dtype (for casts to f16/bf16, whose rounding is the point of the case).
    precision: str = "f64"
    # Non-strict cases are reported but do not fail the Rust test (graphs with symbolic shapes).
    strict: bool = True
    note: str = ""
    extra: dict[str, Any] = field(default_factory=dict)


CASES: list[OpCase] = []


def case(name, targets, fn, make_inputs, **kw) -> None:
    if isinstance(targets, str):
        targets = [targets]
    targets = [t if t.startswith(("aten.", "_c10d")) else "aten." + t for t in targets]
    targets = [t if t.count(".") == 2 else t + ".default" for t in targets]
    assert all(c.name != name for c in CASES), name
    CASES.append(OpCase(name, targets, fn, make_inputs, **kw))


# ---------------------------------------------------------------------------------------------
# Linear algebra
case("mm", "mm", lambda a, b: aten.mm.default(a, b), lambda g: dict(a=g.randn(4, 8), b=g.randn(8, 6)))
case("mm_f32", "mm", lambda a, b: aten.mm.default(a, b),
     lambda g: dict(a=g.randn(4, 8, dtype=F32), b=g.randn(8, 6, dtype=F32)))
case("bmm", "bmm", lambda a, b: aten.bmm.default(a, b),
     lambda g: dict(a=g.randn(2, 3, 4), b=g.randn(2, 4, 5)))
case("baddbmm", "baddbmm", lambda c, a, b: aten.baddbmm.default(c, a, b, beta=0.5, alpha=2.0),
     lambda g: dict(c=g.randn(2, 3, 5), a=g.randn(2, 3, 4), b=g.randn(2, 4, 5)))
case("addmm", "addmm", lambda bias, a, b: aten.addmm.default(bias, a, b),
     lambda g: dict(bias=g.randn(6), a=g.randn(4, 8), b=g.randn(8, 6)))
case("addmm_beta_alpha", "addmm", lambda c, a, b: aten.addmm.default(c, a, b, beta=-1.5, alpha=0.25),
     lambda g: dict(c=g.randn(4, 6), a=g.randn(4, 8), b=g.randn(8, 6)))
case("matmul_batched", "matmul", lambda a, b: torch.matmul(a, b),
     lambda g: dict(a=g.randn(2, 3, 4), b=g.randn(4, 5)))
case("matmul_broadcast", "matmul", lambda a, b: torch.matmul(a, b),
     lambda g: dict(a=g.randn(2, 1, 3, 4), b=g.randn(3, 4, 2)))
case("matmul_vec", "matmul", lambda a, b: torch.matmul(a, b),
     lambda g: dict(a=g.randn(3, 4), b=g.randn(4)))
case("linear", "linear", lambda x, w, b: F.linear(x, w, b),
     lambda g: dict(x=g.randn(2, 4, 8), w=g.randn(6, 8), b=g.randn(6)))
case("linear_nobias", "linear", lambda x, w: F.linear(x, w),
     lambda g: dict(x=g.randn(4, 8), w=g.randn(6, 8)))

# ---------------------------------------------------------------------------------------------
# Elementwise arithmetic
case("add_tensor_broadcast", "add.Tensor", lambda x, y: x + y,
     lambda g: dict(x=g.randn(4, 8), y=g.randn(8)))
case("add_tensor_alpha", "add.Tensor", lambda x, y: torch.add(x, y, alpha=2.5),
     lambda g: dict(x=g.randn(4, 1, 8), y=g.randn(3, 1)))
case("add_scalar", "add.Scalar", lambda x: aten.add.Scalar(x, 2.5), lambda g: dict(x=g.randn(4, 8)))
case("add_int_float_promotion", "add.Tensor", lambda i, x: i + x,
     lambda g: dict(i=g.ints(-5, 5, 4, 8), x=g.randn(4, 8)))
case("add_int_int", "add.Tensor", lambda i, j: i + j,
     lambda g: dict(i=g.ints(-50, 50, 4, 8), j=g.ints(-50, 50, 8)))
case("add_int_pyfloat", "add.Tensor", lambda i: i + 1.5,
     lambda g: dict(i=g.ints(-5, 5, 4, 8)),
     note="int64 tensor + python float promotes to the default dtype, float32")
case("add_int32_int64", "add.Tensor", lambda i, j: i + j,
     lambda g: dict(i=g.ints(-50, 50, 4, 8, dtype=torch.int32), j=g.ints(-50, 50, 4, 8)))
case("add_f32_f64_scalar_tensor", "add.Tensor", lambda x, s: x + s,
     lambda g: dict(x=g.randn(4, 8, dtype=F32), s=g.randn()),
     note="a 0-d f64 tensor does not promote an f32 tensor")
case("sub_tensor", "sub.Tensor", lambda x, y: x - y, lambda g: dict(x=g.randn(4, 8), y=g.randn(4, 1)))
case("sub_tensor_alpha", "sub.Tensor", lambda x, y: torch.sub(x, y, alpha=3),
     lambda g: dict(x=g.randn(4, 8), y=g.randn(4, 8)))
case("sub_scalar", "sub.Scalar", lambda x: aten.sub.Scalar(x, 0.75), lambda g: dict(x=g.randn(4, 8)))
case("mul_tensor", "mul.Tensor", lambda x, y: x * y, lambda g: dict(x=g.randn(2, 4, 8), y=g.randn(4, 1)))
case("mul_scalar", "mul.Scalar", lambda x: aten.mul.Scalar(x, -1.25), lambda g: dict(x=g.randn(4, 8)))
case("mul_bool_float", "mul.Tensor", lambda m, x: m * x,
     lambda g: dict(m=g.bools(4, 8), x=g.randn(4, 8)))
case("div_tensor", "div.Tensor", lambda x, y: x / y,
     lambda g: dict(x=g.randn(4, 8), y=g.uniform(0.5, 2.0, 8)))
case("div_scalar", "div.Scalar", lambda x: aten.div.Scalar(x, 3.0), lambda g: dict(x=g.randn(4, 8)))
case("div_int_true", "div.Tensor", lambda i, j: i / j,
     lambda g: dict(i=g.ints(-20, 20, 4, 8), j=g.ints(1, 6, 4, 8)),
     note="true division of int64 tensors gives float32")
case("div_floor", "div.Tensor_mode", lambda x, y: torch.div(x, y, rounding_mode="floor"),
     lambda g: dict(x=g.ints(-20, 20, 4, 8), y=g.ints(1, 6, 4, 8)))
case("div_trunc_float", "div.Tensor_mode", lambda x, y: torch.div(x, y, rounding_mode="trunc"),
     lambda g: dict(x=g.randn(4, 8) * 5, y=g.uniform(0.5, 2.0, 4, 8)))
case("rsub_tensor", "rsub.Tensor", lambda x, y: torch.rsub(x, y, alpha=2),
     lambda g: dict(x=g.randn(4, 8), y=g.randn(8)))
case("rsub_scalar", "rsub.Scalar", lambda x: 1 - x, lambda g: dict(x=g.randn(4, 8)))
case("pow_tensor_scalar", "pow.Tensor_Scalar", lambda x: x**3, lambda g: dict(x=g.randn(4, 8)))
case("pow_tensor_scalar_frac", "pow.Tensor_Scalar", lambda x: x**0.5,
     lambda g: dict(x=g.uniform(0.1, 3.0, 4, 8)))
case("pow_tensor_tensor", "pow.Tensor_Tensor", lambda x, y: torch.pow(x, y),
     lambda g: dict(x=g.uniform(0.5, 2.0, 4, 8), y=g.randn(4, 8)))
case("pow_scalar", "pow.Scalar", lambda x: aten.pow.Scalar(2.0, x), lambda g: dict(x=g.randn(4, 8)))
case("pow_int", "pow.Tensor_Scalar", lambda i: i**2, lambda g: dict(i=g.ints(-9, 9, 4, 8)))

# Unary
case("neg", "neg", lambda x: -x, lambda g: dict(x=g.randn(4, 8)))
case("neg_int", "neg", lambda i: -i, lambda g: dict(i=g.ints(-9, 9, 4, 8)))
case("abs", "abs", lambda x: torch.abs(x), lambda g: dict(x=g.randn(4, 8)))
case("exp", "exp", lambda x: torch.exp(x), lambda g: dict(x=g.randn(4, 8)))
case("log", "log", lambda x: torch.log(x), lambda g: dict(x=g.uniform(0.1, 5.0, 4, 8)))
case("sqrt", "sqrt", lambda x: torch.sqrt(x), lambda g: dict(x=g.uniform(0.1, 5.0, 4, 8)))
case("rsqrt", "rsqrt", lambda x: torch.rsqrt(x), lambda g: dict(x=g.uniform(0.1, 5.0, 4, 8)))
case("tanh", "tanh", lambda x: torch.tanh(x), lambda g: dict(x=g.randn(4, 8)))
case("sigmoid", "sigmoid", lambda x: torch.sigmoid(x), lambda g: dict(x=g.randn(4, 8)))
case("erf", "erf", lambda x: torch.erf(x), lambda g: dict(x=g.randn(4, 8)))
case("reciprocal", "reciprocal", lambda x: torch.reciprocal(x),
     lambda g: dict(x=g.uniform(0.5, 2.0, 4, 8)))
case("exp_f32", "exp", lambda x: torch.exp(x), lambda g: dict(x=g.randn(4, 8, dtype=F32)))
case("sin", "sin", lambda x: torch.sin(x), lambda g: dict(x=g.randn(4, 8)))
case("cos", "cos", lambda x: torch.cos(x), lambda g: dict(x=g.randn(4, 8)))
case("tanh_backward", "tanh_backward", lambda go, y: aten.tanh_backward.default(go, y),
     lambda g: dict(go=g.randn(4, 8), y=torch.tanh(g.randn(4, 8))))
case("sigmoid_backward", "sigmoid_backward", lambda go, y: aten.sigmoid_backward.default(go, y),
     lambda g: dict(go=g.randn(4, 8), y=torch.sigmoid(g.randn(4, 8))))

# Comparisons and selection (rounded inputs, so equality holds somewhere)
case("eq_tensor", "eq.Tensor", lambda x, y: x == y, lambda g: dict(x=g.rounded(4, 8), y=g.rounded(4, 8)))
case("eq_scalar", "eq.Scalar", lambda x: x == 1.0, lambda g: dict(x=g.rounded(4, 8)))
case("ne_tensor", "ne.Tensor", lambda x, y: x != y, lambda g: dict(x=g.rounded(4, 8), y=g.rounded(8)))
case("ne_scalar_int", "ne.Scalar", lambda i: i != 0, lambda g: dict(i=g.ints(-2, 3, 4, 8)))
case("lt_tensor", "lt.Tensor", lambda x, y: x < y, lambda g: dict(x=g.rounded(4, 8), y=g.rounded(4, 8)))
case("lt_scalar", "lt.Scalar", lambda x: x < 0.5, lambda g: dict(x=g.randn(4, 8)))
case("le_scalar", "le.Scalar", lambda x: x <= 1.0, lambda g: dict(x=g.rounded(4, 8)))
case("le_tensor", "le.Tensor", lambda x, y: x <= y, lambda g: dict(x=g.rounded(4, 8), y=g.rounded(4, 8)))
case("gt_scalar", "gt.Scalar", lambda x: x > 0, lambda g: dict(x=g.randn(4, 8)))
case("gt_tensor_int_float", "gt.Tensor", lambda i, x: i > x,
     lambda g: dict(i=g.ints(-2, 3, 4, 8), x=g.randn(4, 8)))
case("ge_tensor", "ge.Tensor", lambda x, y: x >= y, lambda g: dict(x=g.rounded(4, 8), y=g.rounded(1, 8)))
case("ge_scalar", "ge.Scalar", lambda x: x >= -1.0, lambda g: dict(x=g.rounded(4, 8)))
case("where_self", "where.self", lambda c, x, y: torch.where(c, x, y),
     lambda g: dict(c=g.bools(4, 8), x=g.randn(4, 8), y=g.randn(8)))
case("where_scalar_other", "where.ScalarOther", lambda c, x: torch.where(c, x, 0.0),
     lambda g: dict(c=g.bools(4, 8), x=g.randn(4, 8)))
case("where_promote", "where.self", lambda c, x, i: torch.where(c, x, i),
     lambda g: dict(c=g.bools(4, 8), x=g.randn(4, 8, dtype=F32), i=g.ints(-5, 5, 4, 8)))
case("masked_fill_scalar", "masked_fill.Scalar", lambda x, m: x.masked_fill(m, -1e4),
     lambda g: dict(x=g.randn(4, 8), m=g.bools(4, 8)))
case("masked_fill_tensor", "masked_fill.Tensor", lambda x, m, v: x.masked_fill(m, v),
     lambda g: dict(x=g.randn(2, 4, 8), m=g.bools(4, 8), v=g.randn()))
case("bitwise_or_bool", "bitwise_or.Tensor", lambda a, b: torch.bitwise_or(a, b),
     lambda g: dict(a=g.bools(4, 8), b=g.bools(4, 8)))
case("or_operator_bool", "__or__.Tensor", lambda a, b: a | b, lambda g: dict(a=g.bools(4, 8), b=g.bools(8)))
case("bitwise_and_int", "bitwise_and.Tensor", lambda a, b: torch.bitwise_and(a, b),
     lambda g: dict(a=g.ints(0, 64, 4, 8), b=g.ints(0, 64, 4, 8)))
case("and_operator_bool", "__and__.Tensor", lambda a, b: a & b, lambda g: dict(a=g.bools(4, 8), b=g.bools(4, 8)))
case("bitwise_not_bool", "bitwise_not", lambda a: ~a, lambda g: dict(a=g.bools(4, 8)))
case("bitwise_not_int", "bitwise_not", lambda a: ~a, lambda g: dict(a=g.ints(-64, 64, 4, 8)))
case("bitwise_xor_int", "bitwise_xor.Tensor", lambda a, b: torch.bitwise_xor(a, b),
     lambda g: dict(a=g.ints(-64, 64, 4, 8), b=g.ints(0, 64, 4, 8)))
case("xor_operator_int", "__xor__.Tensor", lambda a, b: a ^ b,
     lambda g: dict(a=g.ints(-64, 64, 4, 8), b=g.ints(0, 64, 8)))
case("or_operator_scalar_int", "__or__.Scalar", lambda a: a | 5, lambda g: dict(a=g.ints(-64, 64, 4, 8)))
case("and_operator_scalar_int", "__and__.Scalar", lambda a: a & 6, lambda g: dict(a=g.ints(-64, 64, 4, 8)))
case("xor_operator_scalar_bool", "__xor__.Scalar", lambda m: m ^ True, lambda g: dict(m=g.bools(4, 8)))
case("logical_and", "logical_and", lambda a, b: torch.logical_and(a, b),
     lambda g: dict(a=g.bools(4, 8), b=g.rounded(4, 8)))
case("logical_or", "logical_or", lambda a, b: torch.logical_or(a, b),
     lambda g: dict(a=g.bools(4, 8), b=g.bools(4, 8)))
case("logical_not", "logical_not", lambda a: torch.logical_not(a), lambda g: dict(a=g.rounded(4, 8)))
case("logical_xor", "logical_xor", lambda a, b: torch.logical_xor(a, b),
     lambda g: dict(a=g.bools(4, 8), b=g.bools(4, 8)))
case("clamp", "clamp", lambda x: torch.clamp(x, -0.5, 0.75), lambda g: dict(x=g.randn(4, 8)))
case("clamp_min_only", "clamp", lambda x: torch.clamp(x, min=0.1), lambda g: dict(x=g.randn(4, 8)))
case("clamp_int", "clamp", lambda i: torch.clamp(i, -3, 3), lambda g: dict(i=g.ints(-9, 9, 4, 8)))
case("clamp_tensor", "clamp.Tensor", lambda x, lo, hi: torch.clamp(x, lo, hi),
     lambda g: dict(x=g.randn(4, 8), lo=g.uniform(-1.0, -0.1, 8), hi=g.uniform(0.1, 1.0, 4, 1)))
case("clamp_min", "clamp_min", lambda x: aten.clamp_min.default(x, 0.2), lambda g: dict(x=g.randn(4, 8)))
case("clamp_max", "clamp_max", lambda x: aten.clamp_max.default(x, 0.2), lambda g: dict(x=g.randn(4, 8)))
case("maximum", "maximum", lambda x, y: torch.maximum(x, y), lambda g: dict(x=g.randn(4, 8), y=g.randn(8)))
case("minimum", "minimum", lambda x, y: torch.minimum(x, y), lambda g: dict(x=g.randn(4, 8), y=g.randn(4, 1)))

# ---------------------------------------------------------------------------------------------
# Reductions
case("sum_all", "sum", lambda x: torch.sum(x), lambda g: dict(x=g.randn(4, 8)))
case("sum_dim", "sum.dim_IntList", lambda x: torch.sum(x, 1), lambda g: dict(x=g.randn(2, 4, 8)))
case("sum_dims_keepdim", "sum.dim_IntList", lambda x: torch.sum(x, [0, 2], keepdim=True),
     lambda g: dict(x=g.randn(2, 4, 8)))
case("sum_neg_dim", "sum.dim_IntList", lambda x: x.sum(-1), lambda g: dict(x=g.randn(2, 4, 8)))
case("sum_int", "sum", lambda i: torch.sum(i), lambda g: dict(i=g.ints(-9, 9, 4, 8)))
case("sum_bool_dim", "sum.dim_IntList", lambda m: m.sum(1), lambda g: dict(m=g.bools(4, 8)))
case("sum_f32", "sum.dim_IntList", lambda x: x.sum(0), lambda g: dict(x=g.randn(8, 16, dtype=F32)))
case("sum_dtype", "sum.dim_IntList", lambda x: torch.sum(x, 1, dtype=F64),
     lambda g: dict(x=g.randn(4, 8, dtype=F32)))
case("mean_all", "mean", lambda x: torch.mean(x), lambda g: dict(x=g.randn(4, 8)))
case("mean_dim", "mean.dim", lambda x: torch.mean(x, -1, keepdim=True), lambda g: dict(x=g.randn(2, 4, 8)))
case("amax", "amax", lambda x: torch.amax(x, 1), lambda g: dict(x=g.randn(4, 8)))
case("amax_keepdim", "amax", lambda x: torch.amax(x, [0, 2], keepdim=True), lambda g: dict(x=g.randn(2, 4, 8)))
case("amin", "amin", lambda x: torch.amin(x, -1), lambda g: dict(x=g.randn(4, 8)))
case("max_dim", "max.dim", lambda x: torch.max(x, 1), lambda g: dict(x=g.randn(4, 8)))
case("max_dim_keepdim", "max.dim", lambda x: torch.max(x, 0, keepdim=True), lambda g: dict(x=g.randn(4, 8)))
case("max_all", "max", lambda x: torch.max(x), lambda g: dict(x=g.randn(4, 8)))
case("min_dim", "min.dim", lambda x: torch.min(x, -1), lambda g: dict(x=g.randn(4, 8)))
case("argmax", "argmax", lambda x: torch.argmax(x, 1), lambda g: dict(x=g.randn(4, 8)))
case("argmax_keepdim", "argmax", lambda x: torch.argmax(x, 0, keepdim=True), lambda g: dict(x=g.randn(4, 8)))
case("argmin", "argmin", lambda x: torch.argmin(x, -1), lambda g: dict(x=g.randn(4, 8)))
case("cumsum", "cumsum", lambda x: torch.cumsum(x, 1), lambda g: dict(x=g.randn(4, 8)))
case("cumsum_int", "cumsum", lambda i: torch.cumsum(i, 0), lambda g: dict(i=g.ints(-9, 9, 4, 8)))
case("topk", "topk", lambda x: torch.topk(x, 3), lambda g: dict(x=g.randn(4, 8)))
case("topk_smallest_dim0", "topk", lambda x: torch.topk(x, 2, dim=0, largest=False), lambda g: dict(x=g.randn(4, 8)))
case("sort", "sort", lambda x: torch.sort(x, 1), lambda g: dict(x=g.randn(4, 8)))
case("sort_descending", "sort", lambda x: torch.sort(x, 0, descending=True), lambda g: dict(x=g.randn(4, 8)))
case("sort_stable_ties", "sort.stable", lambda x: torch.sort(x, dim=-1, stable=True),
     lambda g: dict(x=g.rounded(4, 8)))
case("var_dim", "var.dim", lambda x: torch.var(x, 1), lambda g: dict(x=g.randn(4, 8)))
case("var_correction0_keepdim", "var.correction", lambda x: torch.var(x, [0, 1], correction=0, keepdim=True),
     lambda g: dict(x=g.randn(2, 4, 8)))
case("var_all", "var.correction", lambda x: torch.var(x), lambda g: dict(x=g.randn(4, 8)))
case("std", "std.dim", lambda x: torch.std(x, -1), lambda g: dict(x=g.randn(4, 8)))
case("std_correction", "std.correction", lambda x: torch.std(x, 0, correction=0), lambda g: dict(x=g.randn(4, 8)))
case("prod", "prod.dim_int", lambda x: torch.prod(x, 1), lambda g: dict(x=g.uniform(0.5, 1.5, 4, 8)))
case("logsumexp", "logsumexp", lambda x: torch.logsumexp(x, -1), lambda g: dict(x=g.randn(4, 8)))
case("any_dim", "any.dim", lambda m: torch.any(m, 1), lambda g: dict(m=g.bools(4, 8, p=0.1)))
case("all_dim", "all.dim", lambda m: torch.all(m, 1), lambda g: dict(m=g.bools(4, 8, p=0.9)))

# ---------------------------------------------------------------------------------------------
# Activations, normalization, losses
case("softmax", "softmax.int", lambda x: F.softmax(x, -1), lambda g: dict(x=g.randn(2, 4, 8)))
case("softmax_f32", "softmax.int", lambda x: F.softmax(x, 1), lambda g: dict(x=g.randn(4, 8, dtype=F32)))
case("_softmax", "_softmax", lambda x: aten._softmax.default(x, 0, False), lambda g: dict(x=g.randn(4, 8)))
case("log_softmax", "log_softmax.int", lambda x: F.log_softmax(x, -1), lambda g: dict(x=g.randn(4, 8)))
case("_log_softmax", "_log_softmax", lambda x: aten._log_softmax.default(x, 1, False), lambda g: dict(x=g.randn(4, 8)))
case("_softmax_backward_data", "_softmax_backward_data",
     lambda go, y: aten._softmax_backward_data.default(go, y, -1, F64),
     lambda g: dict(go=g.randn(4, 8), y=torch.softmax(g.randn(4, 8), -1)))
case("_log_softmax_backward_data", "_log_softmax_backward_data",
     lambda go, y: aten._log_softmax_backward_data.default(go, y, 1, F64),
     lambda g: dict(go=g.randn(4, 8), y=torch.log_softmax(g.randn(4, 8), 1)))
case("layer_norm", "layer_norm", lambda x, w, b: F.layer_norm(x, [8], w, b, 1e-5),
     lambda g: dict(x=g.randn(2, 4, 8), w=g.randn(8), b=g.randn(8)))
case("layer_norm_noaffine_2d", "layer_norm", lambda x: F.layer_norm(x, [4, 8]),
     lambda g: dict(x=g.randn(2, 4, 8)))
case("layer_norm_f32", "layer_norm", lambda x, w, b: F.layer_norm(x, [16], w, b),
     lambda g: dict(x=g.randn(8, 16, dtype=F32), w=g.randn(16, dtype=F32), b=g.randn(16, dtype=F32)))
case("native_layer_norm", "native_layer_norm",
     lambda x, w, b: aten.native_layer_norm.default(x, [8], w, b, 1e-5),
     lambda g: dict(x=g.randn(2, 4, 8), w=g.randn(8), b=g.randn(8)))
case("native_layer_norm_backward", "native_layer_norm_backward",
     lambda go, x, mean, rstd, w, b: aten.native_layer_norm_backward.default(
         go, x, [8], mean, rstd, w, b, [True, True, True]),
     lambda g: _ln_backward_inputs(g))
case("rms_norm", "rms_norm", lambda x, w: F.rms_norm(x, [8], w, 1e-6),
     lambda g: dict(x=g.randn(2, 4, 8), w=g.randn(8)))
case("rms_norm_noeps", "rms_norm", lambda x: F.rms_norm(x, [8]), lambda g: dict(x=g.randn(4, 8)))
case("gelu", "gelu", lambda x: F.gelu(x), lambda g: dict(x=g.randn(4, 8)))
case("gelu_tanh", "gelu", lambda x: F.gelu(x, approximate="tanh"), lambda g: dict(x=g.randn(4, 8)))
case("gelu_backward", "gelu_backward", lambda go, x: aten.gelu_backward.default(go, x),
     lambda g: dict(go=g.randn(4, 8), x=g.randn(4, 8)))
case("gelu_backward_tanh", "gelu_backward", lambda go, x: aten.gelu_backward.default(go, x, approximate="tanh"),
     lambda g: dict(go=g.randn(4, 8), x=g.randn(4, 8)))
case("silu", "silu", lambda x: F.silu(x), lambda g: dict(x=g.randn(4, 8)))
case("silu_backward", "silu_backward", lambda go, x: aten.silu_backward.default(go, x),
     lambda g: dict(go=g.randn(4, 8), x=g.randn(4, 8)))
case("relu", "relu", lambda x: torch.relu(x), lambda g: dict(x=g.randn(4, 8)))
case("threshold_backward", "threshold_backward", lambda go, y: aten.threshold_backward.default(go, y, 0),
     lambda g: dict(go=g.randn(4, 8), y=torch.relu(g.rounded(4, 8))))
case("embedding", "embedding", lambda w, idx: F.embedding(idx, w),
     lambda g: dict(w=g.randn(10, 8), idx=g.ints(0, 10, 2, 5)))
case("embedding_dense_backward", "embedding_dense_backward",
     lambda go, idx: aten.embedding_dense_backward.default(go, idx, 10, -1, False),
     lambda g: dict(go=g.randn(2, 5, 8), idx=g.ints(0, 10, 2, 5)))
case("embedding_dense_backward_padding", "embedding_dense_backward",
     lambda go, idx: aten.embedding_dense_backward.default(go, idx, 6, 2, False),
     lambda g: dict(go=g.randn(3, 4, 8), idx=g.ints(0, 6, 3, 4)))
case("nll_loss_forward_mean", "nll_loss_forward",
     lambda lp, t: aten.nll_loss_forward.default(lp, t, None, 1, -100),
     lambda g: dict(lp=torch.log_softmax(g.randn(6, 5), -1), t=g.ints(0, 5, 6)))
case("nll_loss_forward_ignore", "nll_loss_forward",
     lambda lp, t: aten.nll_loss_forward.default(lp, t, None, 1, -100),
     lambda g: dict(lp=torch.log_softmax(g.randn(6, 5), -1), t=torch.tensor([1, -100, 4, 0, -100, 2])))
case("nll_loss_forward_sum_weight", "nll_loss_forward",
     lambda lp, t, w: aten.nll_loss_forward.default(lp, t, w, 2, -100),
     lambda g: dict(lp=torch.log_softmax(g.randn(6, 5), -1), t=g.ints(0, 5, 6), w=g.uniform(0.5, 2.0, 5)))
case("nll_loss_backward", "nll_loss_backward",
     lambda go, lp, t, tw: aten.nll_loss_backward.default(go, lp, t, None, 1, -100, tw),
     lambda g: dict(go=g.randn(), lp=torch.log_softmax(g.randn(6, 5), -1),
                    t=torch.tensor([1, -100, 4, 0, 3, 2]), tw=torch.tensor(5.0, dtype=F64)))
case("mse_loss", "mse_loss", lambda x, y: F.mse_loss(x, y), lambda g: dict(x=g.randn(4, 8), y=g.randn(4, 8)))
case("mse_loss_sum", "mse_loss", lambda x, y: F.mse_loss(x, y, reduction="sum"),
     lambda g: dict(x=g.randn(4, 8), y=g.randn(4, 8)))
case("mse_loss_none", "mse_loss", lambda x, y: aten.mse_loss.default(x, y, 0),
     lambda g: dict(x=g.randn(4, 8), y=g.randn(4, 8)))
case("native_dropout_p0_train", "native_dropout", lambda x: aten.native_dropout.default(x, 0.0, True),
     lambda g: dict(x=g.randn(4, 8)))
case("native_dropout_eval", "native_dropout", lambda x: aten.native_dropout.default(x, 0.5, False),
     lambda g: dict(x=g.randn(4, 8)))
case("dropout_eval", "dropout", lambda x: F.dropout(x, 0.5, training=False), lambda g: dict(x=g.randn(4, 8)))


def _ln_backward_inputs(g: Gen) -> dict[str, torch.Tensor]:
    x = g.randn(2, 4, 8)
    w, b = g.randn(8), g.randn(8)
    _, mean, rstd = aten.native_layer_norm.default(x, [8], w, b, 1e-5)
    return dict(go=g.randn(2, 4, 8), x=x, mean=mean, rstd=rstd, w=w, b=b)


# ---------------------------------------------------------------------------------------------
# Indexing
case("index_int", "index.Tensor", lambda x, idx: x[idx],
     lambda g: dict(x=g.randn(6, 8), idx=g.ints(0, 6, 2, 3)))
case("index_none_int", "index.Tensor", lambda x, idx: aten.index.Tensor(x, [None, idx]),
     lambda g: dict(x=g.randn(4, 8, 3), idx=g.ints(-8, 8, 5)))
case("index_two_broadcast", "index.Tensor", lambda x, i, j: aten.index.Tensor(x, [i, None, j]),
     lambda g: dict(x=g.randn(4, 3, 5), i=g.ints(0, 4, 2, 1), j=g.ints(0, 5, 6)))
case("index_bool_mask", "index.Tensor", lambda x, m: (aten.index.Tensor(x, [m]),),
     lambda g: dict(x=g.randn(4, 8), m=g.bools(4, 8)), tracer="make_fx",
     note="data-dependent shape: traced with make_fx on real tensors (concrete sizes)")
case("index_bool_rows", "index.Tensor", lambda x, m: (aten.index.Tensor(x, [m]),),
     lambda g: dict(x=g.randn(6, 8), m=torch.tensor([True, False, True, True, False, True])), tracer="make_fx",
     note="data-dependent shape: traced with make_fx on real tensors (concrete sizes)")
case("index_bool_mask_export", "index.Tensor", lambda x, m: x[m] * 2,
     lambda g: dict(x=g.randn(4, 8), m=g.bools(4, 8)), strict=False,
     note="torch.export of a boolean mask: unbacked size u0, sym_size/_assert_scalar nodes")
case("index_put", "index_put", lambda x, idx, v: aten.index_put.default(x, [idx], v),
     lambda g: dict(x=g.randn(6, 8), idx=g.perm(6)[:3], v=g.randn(3, 8)))
case("index_put_accumulate", "index_put", lambda x, idx, v: aten.index_put.default(x, [idx], v, True),
     lambda g: dict(x=g.randn(6, 8), idx=torch.tensor([0, 2, 2, 5, 0]), v=g.randn(5, 8)))
case("index_put_2d_broadcast", "index_put", lambda x, i, j, v: aten.index_put.default(x, [i, j], v, True),
     lambda g: dict(x=g.randn(4, 8), i=torch.tensor([0, 1, 1, 3]), j=torch.tensor([7, 0, 0, 2]), v=g.randn()))
case("index_put_bool", "index_put", lambda x, m, v: aten.index_put.default(x, [m], v),
     lambda g: dict(x=g.randn(4, 8), m=g.bools(4, 8), v=g.randn()))
case("scatter_src", "scatter.src", lambda x, idx, src: torch.scatter(x, 1, idx, src),
     lambda g: dict(x=g.randn(4, 8), idx=torch.stack([g.perm(8)[:3] for _ in range(4)]), src=g.randn(4, 3)))
case("scatter_value", "scatter.value", lambda x, idx: torch.scatter(x, 0, idx, 2.5),
     lambda g: dict(x=g.randn(4, 8), idx=torch.stack([g.perm(4)[:2] for _ in range(8)], 1)))
case("scatter_add", "scatter_add", lambda x, idx, src: torch.scatter_add(x, 1, idx, src),
     lambda g: dict(x=g.randn(4, 8), idx=g.ints(0, 8, 4, 5), src=g.randn(4, 5)))
case("gather", "gather", lambda x, idx: torch.gather(x, 1, idx),
     lambda g: dict(x=g.randn(4, 8), idx=g.ints(0, 8, 4, 5)))
case("gather_dim0", "gather", lambda x, idx: torch.gather(x, 0, idx),
     lambda g: dict(x=g.randn(4, 8), idx=g.ints(0, 4, 2, 8)))
case("index_select", "index_select", lambda x, idx: torch.index_select(x, 1, idx),
     lambda g: dict(x=g.randn(4, 8), idx=g.ints(0, 8, 5)))

# ---------------------------------------------------------------------------------------------
# Shape and layout
case("view", "view", lambda x: x.view(2, 16), lambda g: dict(x=g.randn(4, 8)))
case("view_infer", "view", lambda x: x.view(-1, 4), lambda g: dict(x=g.randn(2, 4, 8)))
case("reshape", "reshape", lambda x: x.reshape(8, 4), lambda g: dict(x=g.randn(4, 8)))
case("reshape_noncontig", "reshape", lambda x: x.t().reshape(-1), lambda g: dict(x=g.randn(4, 8)))
case("_unsafe_view", "_unsafe_view", lambda x: aten._unsafe_view.default(x, [8, 4]), lambda g: dict(x=g.randn(4, 8)))
case("permute", "permute", lambda x: x.permute(2, 0, 1), lambda g: dict(x=g.randn(2, 4, 8)))
case("transpose", "transpose.int", lambda x: x.transpose(0, 2), lambda g: dict(x=g.randn(2, 4, 8)))
case("t", "t", lambda x: x.t(), lambda g: dict(x=g.randn(4, 8)))
case("expand", "expand", lambda x: x.expand(3, 4, 8), lambda g: dict(x=g.randn(4, 1)))
case("expand_keep", "expand", lambda x: x.expand(2, -1, 8), lambda g: dict(x=g.randn(1, 4, 1)))
case("slice", "slice.Tensor", lambda x: x[:, 2:7:2], lambda g: dict(x=g.randn(4, 8)))
case("slice_neg_end", "slice.Tensor", lambda x: aten.slice.Tensor(x, 0, 1, -1), lambda g: dict(x=g.randn(4, 8)))
case("slice_big_end", "slice.Tensor", lambda x: aten.slice.Tensor(x, 1, 3, 9223372036854775807),
     lambda g: dict(x=g.randn(4, 8)))
case("cat", "cat", lambda a, b: torch.cat([a, b], 1), lambda g: dict(a=g.randn(4, 3), b=g.randn(4, 5)))
case("cat_dim0_three", "cat", lambda a, b, c: torch.cat([a, b, c]),
     lambda g: dict(a=g.randn(1, 8), b=g.randn(2, 8), c=g.randn(3, 8)))
case("split", "split.Tensor", lambda x: torch.split(x, 3, 1), lambda g: dict(x=g.randn(4, 8)))
case("split_with_sizes", "split_with_sizes", lambda x: torch.split(x, [1, 3], 0), lambda g: dict(x=g.randn(4, 8)))
case("chunk", "chunk", lambda x: torch.chunk(x, 2, -1), lambda g: dict(x=g.randn(4, 8)))
case("unbind", "unbind.int", lambda x: torch.unbind(x, 1), lambda g: dict(x=g.randn(2, 3, 4)))
case("select", "select.int", lambda x: x[:, 3], lambda g: dict(x=g.randn(4, 8)))
case("select_neg", "select.int", lambda x: aten.select.int(x, 0, -1), lambda g: dict(x=g.randn(4, 8)))
case("squeeze_dim", "squeeze.dim", lambda x: x.squeeze(1), lambda g: dict(x=g.randn(4, 1, 8)))
case("squeeze_all", "squeeze", lambda x: x.squeeze(), lambda g: dict(x=g.randn(1, 4, 1, 8)))
case("squeeze_dims", "squeeze.dims", lambda x: aten.squeeze.dims(x, [0, 2]), lambda g: dict(x=g.randn(1, 4, 1, 8)))
case("unsqueeze", "unsqueeze", lambda x: x.unsqueeze(-1), lambda g: dict(x=g.randn(4, 8)))
case("stack", "stack", lambda a, b: torch.stack([a, b], 1), lambda g: dict(a=g.randn(4, 8), b=g.randn(4, 8)))
case("flatten", "flatten.using_ints", lambda x: torch.flatten(x, 1), lambda g: dict(x=g.randn(2, 3, 4)))
case("unflatten", "unflatten.int", lambda x: x.unflatten(1, (2, 4)), lambda g: dict(x=g.randn(3, 8)))
case("narrow", "narrow", lambda x: x.narrow(1, 2, 4), lambda g: dict(x=g.randn(4, 8)))
case("repeat", "repeat", lambda x: x.repeat(2, 1, 3), lambda g: dict(x=g.randn(4, 2)))
case("flip", "flip", lambda x: torch.flip(x, [0, 1]), lambda g: dict(x=g.randn(4, 8)))
case("roll", "roll", lambda x: torch.roll(x, 3, 1), lambda g: dict(x=g.randn(4, 8)))
case("clone", "clone", lambda x: x.clone(), lambda g: dict(x=g.randn(4, 8)))
case("contiguous_t", ["t", "contiguous"], lambda x: x.t().contiguous(), lambda g: dict(x=g.randn(4, 8)))
case("tril", "tril", lambda x: torch.tril(x), lambda g: dict(x=g.randn(5, 8)))
case("tril_diag", "tril", lambda x: torch.tril(x, -1), lambda g: dict(x=g.randn(2, 4, 4)))
case("triu", "triu", lambda x: torch.triu(x, 2), lambda g: dict(x=g.randn(5, 8)))
case("slice_scatter", "slice_scatter", lambda x, s: aten.slice_scatter.default(x, s, 1, 2, 8, 2),
     lambda g: dict(x=g.randn(4, 8), s=g.randn(4, 3)))
case("select_scatter", "select_scatter", lambda x, s: aten.select_scatter.default(x, s, 0, 2),
     lambda g: dict(x=g.randn(4, 8), s=g.randn(8)))
case("constant_pad_nd", "constant_pad_nd", lambda x: aten.constant_pad_nd.default(x, [1, 2, 0, 1], 0.5),
     lambda g: dict(x=g.randn(4, 8)))
case("pad", "pad", lambda x: F.pad(x, (2, 0), value=-1.0), lambda g: dict(x=g.randn(4, 8)))
case("pad_constant_default", "pad", lambda x: aten.pad.default(x, [1, 1, 2, 0]), lambda g: dict(x=g.randn(4, 8)))
case("pad_constant_int", "pad", lambda i: aten.pad.default(i, [1, -2], "constant", 2.5),
     lambda g: dict(i=g.ints(-9, 9, 4, 8)), note="value cast to the integer dtype; negative pad crops")
case("pad_reflect", "pad", lambda x: F.pad(x, (3, 2), mode="reflect"), lambda g: dict(x=g.randn(2, 3, 8)))
case("pad_reflect_2d_crop", "pad", lambda x: aten.pad.default(x, [-1, 3, 2, 1], "reflect"),
     lambda g: dict(x=g.randn(2, 4, 5)))
case("pad_replicate_2d", "pad", lambda x: F.pad(x, (1, 2, 2, 0), mode="replicate"),
     lambda g: dict(x=g.randn(1, 2, 3, 4)))
case("pad_replicate_3d", "pad", lambda x: F.pad(x, (1, 0, 0, 2, 1, 1), mode="replicate"),
     lambda g: dict(x=g.randn(2, 3, 2, 4)))
case("pad_circular", "pad", lambda x: F.pad(x, (3, 8), mode="circular"), lambda g: dict(x=g.randn(2, 3, 8)))
case("pad_circular_crop", "pad", lambda x: aten.pad.default(x, [-2, 3, 1, -1], "circular"),
     lambda g: dict(x=g.randn(1, 3, 4, 6)), note="circular padding wraps the input left after cropping")

# ---------------------------------------------------------------------------------------------
# Creation (operators inside the graph, combined with an input)
case("arange", "arange", lambda x: x + torch.arange(8, dtype=F64), lambda g: dict(x=g.randn(4, 8)))
case("arange_start_step", "arange.start_step", lambda x: x * torch.arange(1, 17, 2, dtype=F64),
     lambda g: dict(x=g.randn(4, 8)))
case("arange_int", "arange.start", lambda i: i + torch.arange(-3, 5), lambda g: dict(i=g.ints(0, 9, 2, 8)))
case("zeros", "zeros", lambda x: (x + torch.zeros(4, 8, dtype=F64), torch.zeros(3, dtype=I64)),
     lambda g: dict(x=g.randn(4, 8)))
case("ones", "ones", lambda x: x * torch.ones(8, dtype=F64) * 2, lambda g: dict(x=g.randn(4, 8)))
case("full", "full", lambda x: x + torch.full((4, 8), -0.5, dtype=F64), lambda g: dict(x=g.randn(4, 8)))
case("full_bool", "full", lambda m: m | torch.full((8,), True), lambda g: dict(m=g.bools(4, 8)))
case("zeros_like", "zeros_like", lambda x: torch.zeros_like(x) + x, lambda g: dict(x=g.randn(4, 8)))
case("ones_like", "ones_like", lambda x: torch.ones_like(x, dtype=I64), lambda g: dict(x=g.randn(4, 8)))
case("full_like", "full_like", lambda x: torch.full_like(x, 7.0) - x, lambda g: dict(x=g.randn(4, 8)))
case("new_zeros", "new_zeros", lambda x: x.new_zeros((2, 3)), lambda g: dict(x=g.randn(4, 8)))
case("new_ones", "new_ones", lambda x: x.new_ones((3,)) + 1, lambda g: dict(x=g.randn(4, 8)))

# Casts
case("_to_copy_f32", "_to_copy", lambda x: aten._to_copy.default(x, dtype=F32), lambda g: dict(x=g.randn(4, 8)))
case("_to_copy_f16", "_to_copy", lambda x: aten._to_copy.default(x, dtype=torch.float16),
     lambda g: dict(x=g.randn(4, 8)), precision="native")
case("_to_copy_bf16", "_to_copy", lambda x: aten._to_copy.default(x, dtype=torch.bfloat16),
     lambda g: dict(x=g.randn(4, 8)), precision="native")
case("_to_copy_bf16_roundtrip", "_to_copy",
     lambda x: aten._to_copy.default(aten._to_copy.default(x, dtype=torch.bfloat16), dtype=F64),
     lambda g: dict(x=g.randn(4, 8)), precision="native",
     note="bf16 rounding made visible in an f64 output")
case("_to_copy_int64", "_to_copy", lambda x: aten._to_copy.default(x, dtype=I64),
     lambda g: dict(x=g.randn(4, 8) * 10))
case("_to_copy_int32", "_to_copy", lambda x: aten._to_copy.default(x, dtype=torch.int32),
     lambda g: dict(x=g.randn(4, 8) * 100))
case("_to_copy_bool", "_to_copy", lambda x: aten._to_copy.default(x, dtype=torch.bool),
     lambda g: dict(x=g.rounded(4, 8)))
case("_to_copy_bool_to_f32", "_to_copy", lambda m: aten._to_copy.default(m, dtype=F32),
     lambda g: dict(m=g.bools(4, 8)))
case("_to_copy_int_to_f64", "_to_copy", lambda i: aten._to_copy.default(i, dtype=F64),
     lambda g: dict(i=g.ints(-100, 100, 4, 8)))
case("to_dtype", "to.dtype", lambda x: x.to(F32), lambda g: dict(x=g.randn(4, 8)))
case("type_as_int", "to.dtype", lambda i, x: x.to(I64) + i, lambda g: dict(i=g.ints(0, 9, 4, 8), x=g.randn(4, 8) * 4))

# ---------------------------------------------------------------------------------------------
# Small compositions seen in transformer graphs
case("attention_scores", ["matmul", "masked_fill.Scalar", "softmax.int"],
     lambda q, k, m: F.softmax(torch.matmul(q, k.transpose(-1, -2)).mul(0.5).masked_fill(m, float("-inf")), -1),
     lambda g: dict(q=g.randn(2, 4, 8), k=g.randn(2, 4, 8), m=~torch.tril(torch.ones(4, 4, dtype=torch.bool))),
     note="causal mask with -inf before a softmax")
case("scaled_dot_product_attention", "scaled_dot_product_attention",
     lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True),
     lambda g: dict(q=g.randn(1, 2, 4, 8), k=g.randn(1, 2, 4, 8), v=g.randn(1, 2, 4, 8)))


def _mask_with_empty_row(g: Gen) -> torch.Tensor:
    m = g.bools(4, 6, p=0.6)
    m[1] = False  # a query that may attend to nothing: torch gives zeros, not NaN
    m[:, 0] |= torch.arange(4) != 1
    return m


case("sdpa_bool_mask", "scaled_dot_product_attention",
     lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, attn_mask=m),
     lambda g: dict(q=g.randn(2, 2, 4, 8), k=g.randn(2, 2, 6, 8), v=g.randn(2, 2, 6, 5), m=_mask_with_empty_row(g)))
case("sdpa_float_mask_scale", "scaled_dot_product_attention",
     lambda q, k, v, b: F.scaled_dot_product_attention(q, k, v, attn_mask=b, scale=0.3),
     lambda g: dict(q=g.randn(2, 3, 4, 8), k=g.randn(2, 3, 5, 8), v=g.randn(2, 3, 5, 8), b=g.randn(2, 1, 4, 5)))
case("sdpa_causal_rect", "scaled_dot_product_attention",
     lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True),
     lambda g: dict(q=g.randn(1, 2, 6, 4), k=g.randn(1, 2, 3, 4), v=g.randn(1, 2, 3, 4)),
     note="more queries than keys: the causal mask is aligned to the top left")
case("sdpa_gqa", "scaled_dot_product_attention",
     lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True),
     lambda g: dict(q=g.randn(1, 4, 3, 8), k=g.randn(1, 2, 3, 8), v=g.randn(1, 2, 3, 8)))
case("sdpa_3d", "scaled_dot_product_attention",
     lambda q, k, v: F.scaled_dot_product_attention(q, k, v),
     lambda g: dict(q=g.randn(3, 4, 8), k=g.randn(3, 5, 8), v=g.randn(3, 5, 2)))
case("broadcast_tensors", "broadcast_tensors", lambda x, y, i: torch.broadcast_tensors(x, y, i),
     lambda g: dict(x=g.randn(4, 1), y=g.randn(3, 1, 8), i=g.ints(0, 9, 8)))

# ---------------------------------------------------------------------------------------------
# More operators that real captures (Megatron, HF, AOTAutograd joint graphs) contain
case("addcmul", "addcmul", lambda x, a, b: torch.addcmul(x, a, b, value=0.5),
     lambda g: dict(x=g.randn(4, 8), a=g.randn(4, 8), b=g.randn(8)))
case("addcdiv", "addcdiv", lambda x, a, b: torch.addcdiv(x, a, b, value=-2.0),
     lambda g: dict(x=g.randn(4, 8), a=g.randn(4, 8), b=g.uniform(0.5, 2.0, 4, 8)))
case("lerp_scalar", "lerp.Scalar", lambda a, b: torch.lerp(a, b, 0.3), lambda g: dict(a=g.randn(4, 8), b=g.randn(4, 8)))
case("lerp_tensor", "lerp.Tensor", lambda a, b, w: torch.lerp(a, b, w),
     lambda g: dict(a=g.randn(4, 8), b=g.randn(4, 8), w=g.uniform(0.0, 1.0, 8)))
case("remainder_tensor", "remainder.Tensor", lambda x, y: torch.remainder(x, y),
     lambda g: dict(x=g.randn(4, 8) * 5, y=g.uniform(0.5, 2.0, 4, 8) * torch.tensor([1.0, -1.0]).repeat(4, 4)))
case("remainder_int_scalar", "remainder.Scalar", lambda i: torch.remainder(i, 3), lambda g: dict(i=g.ints(-20, 20, 4, 8)))
case("fmod_scalar", "fmod.Scalar", lambda x: torch.fmod(x, 1.5), lambda g: dict(x=g.randn(4, 8) * 4))
case("floor_divide_int", "floor_divide", lambda i, j: torch.floor_divide(i, j),
     lambda g: dict(i=g.ints(-20, 20, 4, 8), j=g.ints(1, 6, 4, 8) * torch.tensor([1, -1]).repeat(4, 4)))
case("atan2", "atan2", lambda y, x: torch.atan2(y, x), lambda g: dict(y=g.randn(4, 8), x=g.randn(4, 8)))
case("round", "round", lambda x: torch.round(x), lambda g: dict(x=g.randn(4, 8) * 3))
case("round_half_even", "round", lambda x: torch.round(x), lambda g: dict(x=torch.arange(-4, 4, 0.5, dtype=F64).reshape(2, 8)),
     note="ties round to even, as torch does")
case("round_decimals", "round.decimals", lambda x: torch.round(x, decimals=2), lambda g: dict(x=g.randn(4, 8)))
case("isnan_isinf", ["isnan", "isinf"], lambda x: (torch.isnan(x), torch.isinf(x)),
     lambda g: dict(x=torch.tensor([[0.0, float("nan"), float("inf"), -float("inf"), 1.0, -2.0]], dtype=F64)))
case("nan_to_num", "nan_to_num", lambda x: torch.nan_to_num(x, nan=0.0, posinf=100.0, neginf=-100.0),
     lambda g: dict(x=torch.tensor([[0.5, float("nan"), float("inf"), -float("inf"), 1.0, -2.0]], dtype=F64)))
case("max_other", "max.other", lambda x, y: torch.max(x, y), lambda g: dict(x=g.randn(4, 8), y=g.randn(8)))
case("min_other", "min.other", lambda x, y: torch.min(x, y), lambda g: dict(x=g.randn(4, 8), y=g.randn(4, 1)))
case("fmax", "fmax", lambda x, y: torch.fmax(x, y), lambda g: dict(x=g.randn(4, 8), y=g.randn(4, 8)))
case("where_scalar_self", "where.ScalarSelf", lambda c, x: aten.where.ScalarSelf(c, 1.5, x),
     lambda g: dict(c=g.bools(4, 8), x=g.randn(4, 8)))
case("dot", "dot", lambda a, b: torch.dot(a, b), lambda g: dict(a=g.randn(8), b=g.randn(8)))
case("mv", "mv", lambda a, b: torch.mv(a, b), lambda g: dict(a=g.randn(4, 8), b=g.randn(8)))
case("addbmm", "addbmm", lambda c, a, b: torch.addbmm(c, a, b, beta=0.5),
     lambda g: dict(c=g.randn(3, 5), a=g.randn(2, 3, 4), b=g.randn(2, 4, 5)))
case("diagonal", "diagonal", lambda x: torch.diagonal(x, 1), lambda g: dict(x=g.randn(4, 8)))
case("as_strided", "as_strided", lambda x: torch.as_strided(x, (3, 4), (8, 2), 1), lambda g: dict(x=g.randn(4, 8)))
case("unfold", "unfold", lambda x: x.unfold(1, 3, 2), lambda g: dict(x=g.randn(4, 8)))
case("alias", "alias", lambda x: aten.alias.default(x) * 2, lambda g: dict(x=g.randn(4, 8)))
case("detach", "detach", lambda x: aten.detach.default(x) + 1, lambda g: dict(x=g.randn(4, 8)))
case("fill_scalar", "fill.Scalar", lambda x: aten.fill.Scalar(x, 3.5), lambda g: dict(x=g.randn(4, 8)))
case("copy", "copy", lambda x, y: aten.copy.default(x, y), lambda g: dict(x=g.randn(4, 8), y=g.randn(8)))
case("expand_copy", "expand_copy", lambda x: aten.expand_copy.default(x, [3, 4, 8]), lambda g: dict(x=g.randn(4, 1)))
case("view_copy", "view_copy", lambda x: aten.view_copy.default(x, [8, 4]), lambda g: dict(x=g.randn(4, 8)))
case("mean_dtype", "mean.dim", lambda x: torch.mean(x, 0, dtype=F64), lambda g: dict(x=g.randn(8, 16, dtype=F32)))
case("cumsum_dtype", "cumsum", lambda m: torch.cumsum(m, 1, dtype=I64), lambda g: dict(m=g.bools(4, 8)))
case("mse_loss_backward", "mse_loss_backward", lambda go, x, y: aten.mse_loss_backward.default(go, x, y, 1),
     lambda g: dict(go=g.randn(), x=g.randn(4, 8), y=g.randn(4, 8)))
case("native_dropout_backward", "native_dropout_backward",
     lambda go, m: aten.native_dropout_backward.default(go, m, 2.0),
     lambda g: dict(go=g.randn(4, 8), m=g.bools(4, 8)))
case("native_layer_norm_f32", "native_layer_norm",
     lambda x, w, b: aten.native_layer_norm.default(x, [16], w, b, 1e-5),
     lambda g: dict(x=g.randn(8, 16, dtype=F32), w=g.randn(16, dtype=F32), b=g.randn(16, dtype=F32)))
case("silu_f32", "silu", lambda x: F.silu(x), lambda g: dict(x=g.randn(8, 16, dtype=F32)))
case("gelu_f32", "gelu", lambda x: F.gelu(x), lambda g: dict(x=g.randn(8, 16, dtype=F32)))
case("clone_contiguous_format", "clone", lambda x: aten.clone.default(x.t(), memory_format=torch.contiguous_format),
     lambda g: dict(x=g.randn(4, 8)))
case("lift_fresh_copy_constant", "lift_fresh_copy", lambda x: x * torch.tensor(2.5, dtype=F64),
     lambda g: dict(x=g.randn(4, 8)), note="a tensor constant, lifted as an input `c_lifted_tensor_0`")


# ---------------------------------------------------------------------------------------------
# In-place operators, as make_fx records them outside torch.export's functionalization (DTensor
# captures, RMSNorm's add_, the vocab-parallel embedding's masked_fill_): the importer rewrites
# them to their out-of-place forms where no other name of the storage is read afterwards.
def _rmsnorm_add_(x):
    t = aten.mean.dim(aten.pow.Tensor_Scalar(x, 2), [-1], True)
    aten.add_.Scalar(t, 1e-6)
    return (aten.mul.Tensor(x, aten.rsqrt.default(t)),)


def _masked_fill_(x, m):
    y = aten.clone.default(x)
    aten.masked_fill_.Scalar(y, m, 0.0)
    return (aten.mul.Scalar(y, 2.0),)


def _copy_cast_(x, y):
    z = aten.clone.default(x)
    aten.copy_.default(z, y)
    return (aten.add.Scalar(z, 1.0),)


def _chain_(x, y):
    z = aten.mul.Tensor(x, y)
    aten.mul_.Tensor(z, y)
    aten.add_.Scalar(z, 1.0)
    return (z, aten.neg.default(z))


case("inplace_rmsnorm_add_", "add_.Scalar", _rmsnorm_add_, lambda g: dict(x=g.randn(4, 8)),
     tracer="make_fx", note="in place, functionalized by the importer")
case("inplace_masked_fill_", "masked_fill_.Scalar", _masked_fill_,
     lambda g: dict(x=g.randn(4, 8), m=g.bools(4, 8)), tracer="make_fx",
     note="in place, functionalized by the importer")
case("inplace_copy_cast_", "copy_", _copy_cast_,
     lambda g: dict(x=g.randn(4, 8), y=g.randn(4, 8, dtype=F32)), tracer="make_fx",
     note="in place, functionalized by the importer; copy_ casts to the target's dtype")
case("inplace_chain_", ["mul_.Tensor", "add_.Scalar"], _chain_,
     lambda g: dict(x=g.randn(4, 8), y=g.randn(4, 8)), tracer="make_fx",
     note="in place, functionalized by the importer; later reads see both updates")


# ---------------------------------------------------------------------------------------------
# The fused attention kernel PyTorch's CPU captures call, with its log-sum-exp output, and its
# backward from them.
_FLASH = aten._scaled_dot_product_flash_attention_for_cpu.default
_FLASH_BW = aten._scaled_dot_product_flash_attention_for_cpu_backward.default


def _qkv(g, extra=None):
    d = dict(q=g.randn(2, 2, 4, 8), k=g.randn(2, 2, 6, 8), v=g.randn(2, 2, 6, 8))
    d.update(extra or {})
    return d


case("flash_cpu", "_scaled_dot_product_flash_attention_for_cpu",
     lambda q, k, v: tuple(_FLASH(q, k, v)), _qkv, tracer="make_fx")
case("flash_cpu_causal_scaled", "_scaled_dot_product_flash_attention_for_cpu",
     lambda q, k, v: tuple(_FLASH(q, k, v, 0.0, True, scale=0.5)), _qkv, tracer="make_fx")
case("flash_cpu_additive_mask", "_scaled_dot_product_flash_attention_for_cpu",
     lambda q, k, v, m: tuple(_FLASH(q, k, v, attn_mask=m)),
     lambda g: _qkv(g, dict(m=g.randn(4, 6))), tracer="make_fx")


def _flash_backward(q, k, v, grad):
    out, lse = _FLASH(q, k, v, 0.0, True)
    return tuple(_FLASH_BW(grad, q, k, v, out, lse, 0.0, True))


case("flash_cpu_backward", ["_scaled_dot_product_flash_attention_for_cpu",
                            "_scaled_dot_product_flash_attention_for_cpu_backward"],
     _flash_backward, lambda g: _qkv(g, dict(grad=g.randn(2, 2, 4, 8))), tracer="make_fx")
