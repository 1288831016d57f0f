//! Shape operators: views, reshapes, permutations, slicing, concatenation and splitting, copies
//! and dtype conversions, scatters into slices, padding.
//!
//! Tensors are dense and row-major, so every view is materialized; views that keep the order of
//! the elements (`view`, `reshape`, `squeeze`...) share the data instead.
//!
//! One module per concern: [`strided`] holds the shared helpers, the others the inference and
//! kernels of their ops; [`register`] (here) registers them all, in a fixed order.

mod broadcast;
mod concat;
mod pad;
mod permute;
mod slicing;
mod strided;
mod view;

#[cfg(test)]
mod tests;

pub(crate) use strided::{for_each_strided, permute_data};

use crate::Registry;
use broadcast::{
    eval_broadcast_tensors, eval_expand, eval_repeat, infer_broadcast_tensors, infer_expand,
    infer_repeat,
};
use concat::{cat_meta, eval_cat, eval_split, eval_stack, infer_split, stack_meta};
use pad::{eval_pad, eval_tri, infer_pad, infer_tri};
use permute::{eval_flip, eval_permute, eval_roll, infer_flip, infer_permute, roll_args};
use slicing::{
    eval_as_strided, eval_as_strided_scatter, eval_diagonal, eval_narrow, eval_select,
    eval_select_scatter, eval_slice, eval_slice_scatter, eval_unfold, infer_as_strided,
    infer_as_strided_scatter, infer_diagonal, infer_narrow, infer_select, infer_select_scatter,
    infer_slice, infer_slice_scatter, infer_unfold,
};
use view::{
    eval_cast, eval_copy, eval_identity, eval_reshape, infer_assert_tensor_metadata, infer_copy,
    infer_flatten, infer_identity, infer_squeeze, infer_to_copy, infer_unflatten, infer_unsqueeze,
    infer_view,
};

/// Registers the shape family.
pub(crate) fn register(r: &mut Registry) {
    for (name, schema) in [
        (
            "aten.view.default",
            "view(Tensor self, SymInt[] size) -> Tensor",
        ),
        (
            "aten.view_copy.default",
            "view_copy(Tensor self, SymInt[] size) -> Tensor",
        ),
        (
            "aten._unsafe_view.default",
            "_unsafe_view(Tensor self, SymInt[] size) -> Tensor",
        ),
        (
            "aten.reshape.default",
            "reshape(Tensor self, SymInt[] shape) -> Tensor",
        ),
    ] {
        r.pure(name, schema, infer_view, |a, m, _| eval_reshape(a, m));
    }
    for (name, schema) in [
        (
            "aten.permute.default",
            "permute(Tensor self, int[] dims) -> Tensor",
        ),
        (
            "aten.permute_copy.default",
            "permute_copy(Tensor self, int[] dims) -> Tensor",
        ),
        (
            "aten.transpose.int",
            "transpose.int(Tensor self, int dim0, int dim1) -> Tensor",
        ),
        (
            "aten.transpose_copy.int",
            "transpose_copy.int(Tensor self, int dim0, int dim1) -> Tensor",
        ),
        ("aten.t.default", "t(Tensor self) -> Tensor"),
        ("aten.t_copy.default", "t_copy(Tensor self) -> Tensor"),
    ] {
        r.pure(name, schema, infer_permute, |a, m, _| eval_permute(a, m));
    }
    for (name, schema) in [
        (
            "aten.expand.default",
            "expand(Tensor self, SymInt[] size, *, bool implicit=False) -> Tensor",
        ),
        (
            "aten.expand_copy.default",
            "expand_copy(Tensor self, SymInt[] size, *, bool implicit=False) -> Tensor",
        ),
    ] {
        r.pure(name, schema, infer_expand, |a, m, _| eval_expand(a, m));
    }
    for (name, schema) in [
        (
            "aten.slice.Tensor",
            "slice.Tensor(Tensor self, int dim=0, SymInt? start=None, SymInt? end=None, SymInt step=1) -> Tensor",
        ),
        (
            "aten.slice_copy.Tensor",
            "slice_copy.Tensor(Tensor self, int dim=0, SymInt? start=None, SymInt? end=None, SymInt step=1) -> Tensor",
        ),
    ] {
        r.pure(name, schema, infer_slice, |a, m, _| eval_slice(a, m));
    }
    for (name, schema) in [
        (
            "aten.select.int",
            "select.int(Tensor self, int dim, SymInt index) -> Tensor",
        ),
        (
            "aten.select_copy.int",
            "select_copy.int(Tensor self, int dim, SymInt index) -> Tensor",
        ),
    ] {
        r.pure(name, schema, infer_select, |a, m, _| eval_select(a, m));
    }
    for (name, schema) in [
        ("aten.squeeze.default", "squeeze(Tensor self) -> Tensor"),
        (
            "aten.squeeze.dim",
            "squeeze.dim(Tensor self, int dim) -> Tensor",
        ),
        (
            "aten.squeeze.dims",
            "squeeze.dims(Tensor self, int[] dim) -> Tensor",
        ),
        (
            "aten.squeeze_copy.default",
            "squeeze_copy(Tensor self) -> Tensor",
        ),
        (
            "aten.squeeze_copy.dim",
            "squeeze_copy.dim(Tensor self, int dim) -> Tensor",
        ),
        (
            "aten.squeeze_copy.dims",
            "squeeze_copy.dims(Tensor self, int[] dim) -> Tensor",
        ),
    ] {
        r.pure(name, schema, infer_squeeze, |a, m, _| eval_reshape(a, m));
    }
    for (name, schema) in [
        (
            "aten.unsqueeze.default",
            "unsqueeze(Tensor self, int dim) -> Tensor",
        ),
        (
            "aten.unsqueeze_copy.default",
            "unsqueeze_copy(Tensor self, int dim) -> Tensor",
        ),
    ] {
        r.pure(name, schema, infer_unsqueeze, |a, m, _| eval_reshape(a, m));
    }
    r.pure(
        "aten.flatten.using_ints",
        "flatten.using_ints(Tensor self, int start_dim=0, int end_dim=-1) -> Tensor",
        infer_flatten,
        |a, m, _| eval_reshape(a, m),
    );
    r.pure(
        "aten.unflatten.int",
        "unflatten.int(Tensor self, int dim, SymInt[] sizes) -> Tensor",
        infer_unflatten,
        |a, m, _| eval_reshape(a, m),
    );
    r.pure(
        "aten.cat.default",
        "cat(Tensor[] tensors, int dim=0) -> Tensor",
        |a| Ok(vec![cat_meta(a)?.1]),
        |a, m, _| eval_cat(a, m),
    );
    r.pure(
        "aten.stack.default",
        "stack(Tensor[] tensors, int dim=0) -> Tensor",
        |a| Ok(vec![stack_meta(a)?.1]),
        |a, m, _| eval_stack(a, m),
    );
    for (name, schema) in [
        (
            "aten.split.Tensor",
            "split.Tensor(Tensor self, SymInt split_size, int dim=0) -> Tensor[]",
        ),
        (
            "aten.split_with_sizes.default",
            "split_with_sizes(Tensor self, SymInt[] split_sizes, int dim=0) -> Tensor[]",
        ),
        (
            "aten.chunk.default",
            "chunk(Tensor self, int chunks, int dim=0) -> Tensor[]",
        ),
        (
            "aten.unbind.int",
            "unbind.int(Tensor self, int dim=0) -> Tensor[]",
        ),
    ] {
        r.pure(name, schema, infer_split, |a, m, _| eval_split(a, m));
    }
    r.pure(
        "aten.narrow.default",
        "narrow(Tensor self, int dim, SymInt start, SymInt length) -> Tensor",
        infer_narrow,
        |a, m, _| eval_narrow(a, m),
    );
    for (name, schema) in [
        (
            "aten.clone.default",
            "clone(Tensor self, *, MemoryFormat? memory_format=None) -> Tensor",
        ),
        ("aten.detach.default", "detach(Tensor self) -> Tensor"),
        (
            "aten.detach_copy.default",
            "detach_copy(Tensor self) -> Tensor",
        ),
        ("aten.alias.default", "alias(Tensor self) -> Tensor"),
        (
            "aten.alias_copy.default",
            "alias_copy(Tensor self) -> Tensor",
        ),
        (
            "aten.lift_fresh_copy.default",
            "lift_fresh_copy(Tensor self) -> Tensor",
        ),
        (
            "aten.lift_fresh.default",
            "lift_fresh(Tensor self) -> Tensor",
        ),
        ("aten.lift.default", "lift(Tensor self) -> Tensor"),
        (
            "aten.contiguous.default",
            "contiguous(Tensor self, *, MemoryFormat memory_format=contiguous_format) -> Tensor",
        ),
        // In place, but on a functional value detaching changes nothing.
        (
            "aten.detach_.default",
            "detach_(Tensor(a!) self) -> Tensor(a!)",
        ),
    ] {
        r.pure(name, schema, infer_identity, |a, m, _| eval_identity(a, m));
    }
    for (name, schema) in [
        (
            "aten._to_copy.default",
            "_to_copy(Tensor self, *, ScalarType? dtype=None, Layout? layout=None, Device? device=None, bool? pin_memory=None, bool non_blocking=False, MemoryFormat? memory_format=None) -> Tensor",
        ),
        (
            "aten.to.dtype",
            "to.dtype(Tensor self, ScalarType dtype, bool non_blocking=False, bool copy=False, MemoryFormat? memory_format=None) -> Tensor",
        ),
        (
            "aten.to.dtype_layout",
            "to.dtype_layout(Tensor self, *, ScalarType? dtype=None, Layout? layout=None, Device? device=None, bool? pin_memory=None, bool non_blocking=False, bool copy=False, MemoryFormat? memory_format=None) -> Tensor",
        ),
        (
            "aten.to.device",
            "to.device(Tensor self, Device device, ScalarType dtype, bool non_blocking=False, bool copy=False, MemoryFormat? memory_format=None) -> Tensor",
        ),
    ] {
        r.pure(name, schema, infer_to_copy, |a, m, _| eval_cast(a, m));
    }
    r.pure(
        "aten.copy.default",
        "copy(Tensor self, Tensor src, bool non_blocking=False) -> Tensor",
        infer_copy,
        |a, m, _| eval_copy(a, m),
    );
    r.pure(
        "aten.slice_scatter.default",
        "slice_scatter(Tensor self, Tensor src, int dim=0, SymInt? start=None, SymInt? end=None, SymInt step=1) -> Tensor",
        infer_slice_scatter,
        |a, m, _| eval_slice_scatter(a, m),
    );
    r.pure(
        "aten.select_scatter.default",
        "select_scatter(Tensor self, Tensor src, int dim, SymInt index) -> Tensor",
        infer_select_scatter,
        |a, m, _| eval_select_scatter(a, m),
    );
    r.pure(
        "aten.as_strided.default",
        "as_strided(Tensor self, SymInt[] size, SymInt[] stride, SymInt? storage_offset=None) -> Tensor",
        infer_as_strided,
        |a, m, _| eval_as_strided(a, m),
    );
    r.pure(
        "aten.as_strided_scatter.default",
        "as_strided_scatter(Tensor self, Tensor src, SymInt[] size, SymInt[] stride, SymInt? storage_offset=None) -> Tensor",
        infer_as_strided_scatter,
        |a, m, _| eval_as_strided_scatter(a, m),
    );
    r.pure(
        "aten.diagonal.default",
        "diagonal(Tensor self, int offset=0, int dim1=0, int dim2=1) -> Tensor",
        infer_diagonal,
        |a, m, _| eval_diagonal(a, m),
    );
    r.pure(
        "aten.unfold.default",
        "unfold(Tensor self, int dimension, int size, int step) -> Tensor",
        infer_unfold,
        |a, m, _| eval_unfold(a, m),
    );
    r.pure(
        "aten.repeat.default",
        "repeat(Tensor self, SymInt[] repeats) -> Tensor",
        infer_repeat,
        |a, m, _| eval_repeat(a, m),
    );
    r.pure(
        "aten.roll.default",
        "roll(Tensor self, SymInt[1] shifts, int[1] dims=[]) -> Tensor",
        |a| {
            let m = a.meta("self")?;
            roll_args(a, &m)?;
            Ok(vec![m])
        },
        |a, m, _| eval_roll(a, m),
    );
    r.pure(
        "aten.flip.default",
        "flip(Tensor self, int[] dims) -> Tensor",
        infer_flip,
        |a, m, _| eval_flip(a, m),
    );
    r.pure(
        "aten.tril.default",
        "tril(Tensor self, int diagonal=0) -> Tensor",
        infer_tri,
        |a, m, _| eval_tri(a, m, |d, k| d <= k),
    );
    r.pure(
        "aten.triu.default",
        "triu(Tensor self, int diagonal=0) -> Tensor",
        infer_tri,
        |a, m, _| eval_tri(a, m, |d, k| d >= k),
    );
    r.pure(
        "aten.constant_pad_nd.default",
        "constant_pad_nd(Tensor self, SymInt[] pad, Scalar value=0) -> Tensor",
        infer_pad,
        |a, m, _| eval_pad(a, m),
    );
    r.pure(
        "aten.pad.default",
        r#"pad(Tensor self, SymInt[] pad, str mode="constant", float? value=None) -> Tensor"#,
        infer_pad,
        |a, m, _| eval_pad(a, m),
    );
    r.pure(
        "aten.broadcast_tensors.default",
        "broadcast_tensors(Tensor[] tensors) -> Tensor[]",
        infer_broadcast_tensors,
        |a, m, _| eval_broadcast_tensors(a, m),
    );
    r.pure(
        "aten._assert_tensor_metadata.default",
        "_assert_tensor_metadata(Tensor a, SymInt[]? size=None, SymInt[]? stride=None, ScalarType? dtype=None, *, Device? device=None, Layout? layout=None) -> ()",
        infer_assert_tensor_metadata,
        |_, _, _| Ok(vec![]),
    );
}
