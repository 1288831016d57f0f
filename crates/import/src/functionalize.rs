//! Functionalization of in-place ATen operators: `aten.add_.Scalar(x, 1e-6)` becomes the
//! out-of-place `aten.add.Scalar(x, 1e-6)`, and every later read of `x` reads the new value, as
//! it does on a real device. Captures that are not functionalized by PyTorch itself (make_fx
//! over DTensor, RMSNorm's `add_`, the vocab-parallel embedding's `masked_fill_`) hold such
//! operators, and the engines, which compute on values, could not read them otherwise.
//!
//! Rewriting is sound only where no other name for the same storage is read after the
//! mutation: a view of `x`, or the base `x` is a view of, would see the update on a device but
//! not in the rewritten graph. Such calls — and calls whose tensor operands have other dtypes
//! than the mutated one (in place, the result keeps `x`'s dtype; out of place it might be
//! promoted), or unrecorded dtypes — are left as they are: the in-place operator is not in the
//! registry, so every engine reports it as unsupported (inconclusive), never guesses.
//!
//! Functionalized captures (torch.export's, AOTAutograd's) call the copying twins of the view
//! operators instead (`aten.split_copy.Tensor`, `aten.view_copy.default`): on values they are
//! the same functions with the same signatures, so they are renamed to the view operators,
//! which every engine knows.
//!
//! ```
//! use shardproof_import::{functionalize, parse_fx};
//! let text = "def forward(self, x: \"f32[4]\"):\n    \
//!     mean: \"f32[]\" = torch.ops.aten.mean.default(x)\n    \
//!     add_: \"f32[]\" = torch.ops.aten.add_.Scalar(mean, 1e-06)\n    \
//!     rsqrt: \"f32[]\" = torch.ops.aten.rsqrt.default(mean)\n    \
//!     return (rsqrt,)\n";
//! let mut graph = parse_fx(text, std::path::Path::new("g.py")).unwrap().graph;
//! let report = functionalize(&mut graph);
//! assert_eq!(report.rewritten, 1);
//! assert_eq!(graph.nodes[2].op().unwrap().to_string(), "aten.add.Scalar");
//! // `rsqrt` now reads the updated value, the output of node `add_`.
//! assert_eq!(graph.value_name(graph.nodes[3].inputs()[0]), "add_");
//! ```

use shardproof_ir::{Arg, DType, Graph, NodeKind, OpName, ValueId};
use std::collections::HashMap;

/// ATen operators whose outputs may share storage with their first tensor argument (views,
/// and operators that may return their input itself). An in-place update through one of them
/// changes the other, which is why such pairs are tracked.
const ALIASING: &[&str] = &[
    "view",
    "_unsafe_view",
    "_reshape_alias",
    "reshape",
    "alias",
    "as_strided",
    "detach",
    "expand",
    "expand_as",
    "narrow",
    "permute",
    "select",
    "slice",
    "split",
    "split_with_sizes",
    "tensor_split",
    "chunk",
    "unsafe_chunk",
    "unsafe_split",
    "squeeze",
    "unsqueeze",
    "t",
    "transpose",
    "swapaxes",
    "swapdims",
    "movedim",
    "moveaxis",
    "unbind",
    "unflatten",
    "flatten",
    "ravel",
    "view_as",
    "diagonal",
    "unfold",
    "contiguous",
    "to",
    "type_as",
    "lift_fresh",
    "numpy_T",
    "mT",
    "mH",
    "adjoint",
    "real",
    "imag",
    "view_as_real",
    "view_as_complex",
    "hsplit",
    "vsplit",
    "dsplit",
    "conj",
    "resolve_conj",
    "resolve_neg",
    "_conj",
    "_neg_view",
    "positive",
    "indices",
    "values",
];

/// What [`functionalize`] did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Functionalized {
    /// In-place calls rewritten to their out-of-place forms.
    pub rewritten: usize,
    /// In-place calls left as they are (another name of their storage is read after them, or
    /// their dtypes are not known to agree), by node name.
    pub kept: Vec<String>,
    /// Copying twins of view operators (`split_copy`) renamed to the view operators.
    pub view_copies: usize,
}

/// The name [`functionalize`] may give a call of `op`: the out-of-place form of an in-place
/// ATen operator, or the view operator of a copying twin; `None` for every other operator.
///
/// ```
/// use shardproof_import::functional_form;
/// use shardproof_ir::OpName;
/// let f = |s: &str| functional_form(&OpName::parse(s).unwrap()).map(|o| o.to_string());
/// assert_eq!(f("aten.add_.Scalar").as_deref(), Some("aten.add.Scalar"));
/// assert_eq!(f("aten.split_copy.Tensor").as_deref(), Some("aten.split.Tensor"));
/// assert_eq!(f("aten._to_copy.default"), None);
/// ```
pub fn functional_form(op: &OpName) -> Option<OpName> {
    let name = in_place_name(&op.namespace, &op.name)
        .or_else(|| view_of_copy(&op.namespace, &op.name).map(String::from))?;
    Some(OpName::new(&op.namespace, &name, &op.overload))
}

/// The view operator whose copying twin `name` is (`split_copy` -> `split`), for ATen.
fn view_of_copy(namespace: &str, name: &str) -> Option<&'static str> {
    let base = name.strip_suffix("_copy")?;
    // `lift_fresh_copy` is how every capture lifts a constant; the engines know it by that
    // name (the lifted-constant analysis keys on it), so it keeps it.
    if namespace != "aten" || base == "lift_fresh" {
        return None;
    }
    ALIASING.iter().copied().find(|v| *v == base)
}

/// Whether `op` names an in-place ATen operator (`add_`, `masked_fill_`, `copy_`), whose
/// out-of-place form is the same name without the trailing underscore.
fn in_place_name(namespace: &str, name: &str) -> Option<String> {
    let base = name.strip_suffix('_')?;
    (namespace == "aten" && !base.is_empty() && !name.starts_with('_') && !base.ends_with('_'))
        .then(|| base.to_string())
}

/// Whether an operand of dtype `operand` leaves an in-place update of a `target` tensor with
/// the dtype the out-of-place form computes: the same dtype, or a lower category (bool below
/// integers below floats), which type promotion never picks.
fn promotes_to_itself(target: DType, operand: DType) -> bool {
    operand == target || operand == DType::Bool || (target.is_float() && operand.is_int())
}

/// Whether node `i` calls an in-place ATen operator.
fn in_place_at(graph: &Graph, i: usize) -> bool {
    graph.nodes[i]
        .op()
        .is_some_and(|op| in_place_name(&op.namespace, &op.name).is_some())
}

/// Union-find over values: the classes of values that may share storage.
struct Aliases {
    parent: HashMap<ValueId, ValueId>,
}

impl Aliases {
    fn root(&mut self, v: ValueId) -> ValueId {
        let mut r = v;
        while let Some(&p) = self.parent.get(&r) {
            if p == r {
                break;
            }
            r = p;
        }
        // Path compression keeps later lookups short.
        let mut c = v;
        while c != r {
            let next = self.parent.get(&c).copied().unwrap_or(r);
            self.parent.insert(c, r);
            c = next;
        }
        r
    }

    fn union(&mut self, a: ValueId, b: ValueId) {
        // Every value in a class has an entry (a root points at itself), so that the classes'
        // members can be listed from the map's keys.
        self.parent.entry(a).or_insert(a);
        self.parent.entry(b).or_insert(b);
        let (ra, rb) = (self.root(a), self.root(b));
        if ra != rb {
            self.parent.insert(ra, rb);
        }
    }
}

/// The values an argument list reads, in order.
fn values_of(args: &[Arg], kwargs: &[(String, Arg)]) -> Vec<ValueId> {
    let mut out = Vec::new();
    for a in args.iter().chain(kwargs.iter().map(|(_, a)| a)) {
        a.values(&mut out);
    }
    out
}

/// Rewrites every value an argument reads through `current`.
fn remap_arg(arg: &mut Arg, current: &dyn Fn(ValueId) -> ValueId) {
    match arg {
        Arg::Value(v) => *v = current(*v),
        Arg::List(items) => items.iter_mut().for_each(|a| remap_arg(a, current)),
        _ => {}
    }
}

/// Rewrites in-place ATen calls of `graph` to their out-of-place forms where that is sound
/// (see the module docs), redirecting later reads of the mutated value to the call's result.
pub fn functionalize(graph: &mut Graph) -> Functionalized {
    let mut report = Functionalized::default();
    for node in &mut graph.nodes {
        if let NodeKind::Call { op, .. } = &mut node.kind {
            if let Some(view) = view_of_copy(&op.namespace, &op.name) {
                // Renamed first: a copy taken for a view is then assumed to alias, which only
                // keeps more in-place calls as they are.
                op.name = view.to_string();
                report.view_copies += 1;
            }
        }
    }
    let any_in_place = graph.nodes.iter().any(|n| {
        n.op()
            .is_some_and(|op| in_place_name(&op.namespace, &op.name).is_some())
    });
    if !any_in_place {
        return report;
    }
    // Storage classes and, per value, the last node (or the graph's outputs) reading it.
    let mut aliases = Aliases {
        parent: HashMap::new(),
    };
    let mut last_read: HashMap<ValueId, usize> = HashMap::new();
    let end = graph.nodes.len();
    for (i, node) in graph.nodes.iter().enumerate() {
        let NodeKind::Call { op, args, kwargs } = &node.kind else {
            continue;
        };
        let read = values_of(args, kwargs);
        for &v in &read {
            last_read.insert(v, i);
        }
        let aten_alias = op.namespace == "aten"
            && (ALIASING.contains(&op.name.as_str())
                || in_place_name(&op.namespace, &op.name).is_some());
        let waits = op.namespace == "_c10d_functional" && op.name == "wait_tensor";
        // Operators outside ATen may return views of any input: assume they do.
        // (prims included: several of them are views.)
        let foreign = op.namespace != "aten" && op.namespace != "_c10d_functional";
        let sources: Vec<ValueId> = if aten_alias || waits {
            read.first().copied().into_iter().collect()
        } else if foreign {
            read.clone()
        } else {
            Vec::new()
        };
        for s in sources {
            for o in 0..node.outputs.len() {
                aliases.union(ValueId::new(i, o), s);
            }
        }
    }
    for v in graph.outputs.iter().flatten() {
        last_read.insert(*v, end);
    }
    let mut members: HashMap<ValueId, Vec<ValueId>> = HashMap::new();
    let known: Vec<ValueId> = aliases.parent.keys().copied().collect();
    for v in known {
        let r = aliases.root(v);
        members.entry(r).or_default().push(v);
    }

    // The latest version of each mutated value: reads after a rewritten call follow it.
    let mut version: HashMap<ValueId, ValueId> = HashMap::new();
    let current = |version: &HashMap<ValueId, ValueId>, mut v: ValueId| {
        while let Some(&n) = version.get(&v) {
            v = n;
        }
        v
    };
    // The values each rewritten chain has held (the original and every rewritten result):
    // reads of them are redirected, so they do not count as other names of the storage.
    let mut chain_of: HashMap<ValueId, Vec<ValueId>> = HashMap::new();
    for i in 0..graph.nodes.len() {
        let dtype_of = |g: &Graph, v: ValueId| g.recorded_type(v).map(|t| t.dtype);
        if let NodeKind::Call { args, kwargs, .. } = &mut graph.nodes[i].kind {
            let f = |v: ValueId| current(&version, v);
            args.iter_mut().for_each(|a| remap_arg(a, &f));
            kwargs.iter_mut().for_each(|(_, a)| remap_arg(a, &f));
        }
        let node = &graph.nodes[i];
        let Some(op) = node.op() else { continue };
        let Some(out_of_place) = in_place_name(&op.namespace, &op.name) else {
            continue;
        };
        let Some(target) = node.args().first().and_then(Arg::as_value) else {
            report.kept.push(node.name.clone());
            continue;
        };
        // `target` is already the latest version; the storage's other names are the members
        // of its class outside the chain of versions.
        let mut chain = chain_of
            .get(&target)
            .cloned()
            .unwrap_or_else(|| vec![target]);
        chain.push(ValueId::new(i, 0));
        let root = aliases.root(target);
        // Later in-place results are not other names: their targets' reads count on their
        // own, and a later call left in place leaves the graph unsupported anyway.
        let other_read_later = members.get(&root).is_some_and(|ms| {
            ms.iter().any(|m| {
                !chain.contains(m)
                    && m.node != i
                    && !(m.node > i && in_place_at(graph, m.node))
                    && last_read.get(m).is_some_and(|&last| last > i)
            })
        });
        let operand_dtypes: Vec<Option<DType>> = node
            .inputs()
            .into_iter()
            .map(|v| dtype_of(graph, v))
            .collect();
        let target_dtype = dtype_of(graph, target);
        // `copy_` casts its source to the target's dtype, as its out-of-place form does.
        let dtypes_agree = target_dtype.is_some_and(|t| {
            out_of_place == "copy"
                || operand_dtypes
                    .iter()
                    .all(|d| d.is_some_and(|d| promotes_to_itself(t, d)))
        });
        let float_literal_on_integer = target_dtype.is_some_and(|d| !d.is_float())
            && node.args().iter().any(|a| matches!(a, Arg::Float(_)));
        if other_read_later || !dtypes_agree || float_literal_on_integer || node.outputs.len() != 1
        {
            report.kept.push(node.name.clone());
            continue;
        }
        let out = ValueId::new(i, 0);
        version.insert(target, out);
        for v in &chain {
            chain_of.insert(*v, chain.clone());
        }
        if let NodeKind::Call { op, .. } = &mut graph.nodes[i].kind {
            op.name = out_of_place;
        }
        report.rewritten += 1;
    }
    for o in graph.outputs.iter_mut().flatten() {
        *o = current(&version, *o);
    }
    report
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::parse_fx;
    use std::path::Path;

    fn graph(body: &str) -> Graph {
        let text = format!(
            "def forward(self, x: \"f32[4, 2]\", y: \"f32[4, 2]\", i: \"i64[4, 2]\"):\n{body}"
        );
        parse_fx(&text, Path::new("g.py")).unwrap().graph
    }

    fn ops(g: &Graph) -> Vec<String> {
        g.nodes
            .iter()
            .filter_map(|n| n.op().map(|o| format!("{}.{}", o.name, o.overload)))
            .collect()
    }

    #[test]
    fn a_fresh_value_updated_in_place_is_read_as_the_new_value() {
        let mut g = graph(
            "    mul: \"f32[4, 2]\" = torch.ops.aten.mul.Tensor(x, y)\n    \
             mul_: \"f32[4, 2]\" = torch.ops.aten.mul_.Tensor(mul, y)\n    \
             add_: \"f32[4, 2]\" = torch.ops.aten.add_.Scalar(mul, 1.0)\n    \
             neg: \"f32[4, 2]\" = torch.ops.aten.neg.default(mul)\n    \
             return (neg, mul)\n",
        );
        let r = functionalize(&mut g);
        assert_eq!(r.rewritten, 2, "{r:?}");
        assert_eq!(
            ops(&g),
            ["mul.Tensor", "mul.Tensor", "add.Scalar", "neg.default"]
        );
        // add_ reads mul_'s result; neg and the second output read add_'s.
        assert_eq!(g.value_name(g.nodes[5].inputs()[0]), "mul_");
        assert_eq!(g.value_name(g.nodes[6].inputs()[0]), "add_");
        assert_eq!(g.value_name(g.outputs[1].unwrap()), "add_");
    }

    #[test]
    fn an_update_through_a_view_whose_base_is_read_later_is_kept() {
        let mut g = graph(
            "    clone: \"f32[4, 2]\" = torch.ops.aten.clone.default(x)\n    \
             view: \"f32[8]\" = torch.ops.aten.view.default(clone, [8])\n    \
             add_: \"f32[8]\" = torch.ops.aten.add_.Scalar(view, 1.0)\n    \
             neg: \"f32[4, 2]\" = torch.ops.aten.neg.default(clone)\n    \
             return (neg,)\n",
        );
        let r = functionalize(&mut g);
        assert_eq!(r.rewritten, 0);
        assert_eq!(r.kept, ["add_"]);
        assert_eq!(ops(&g)[2], "add_.Scalar");
    }

    #[test]
    fn an_update_of_a_base_whose_view_is_read_later_is_kept() {
        let mut g = graph(
            "    clone: \"f32[4, 2]\" = torch.ops.aten.clone.default(x)\n    \
             t: \"f32[2, 4]\" = torch.ops.aten.t.default(clone)\n    \
             fill_: \"f32[4, 2]\" = torch.ops.aten.fill_.Scalar(clone, 0.0)\n    \
             neg: \"f32[2, 4]\" = torch.ops.aten.neg.default(t)\n    \
             return (neg,)\n",
        );
        assert_eq!(functionalize(&mut g).kept, ["fill_"]);
    }

    #[test]
    fn a_view_no_one_reads_afterwards_does_not_block_the_rewrite() {
        let mut g = graph(
            "    clone: \"f32[4, 2]\" = torch.ops.aten.clone.default(x)\n    \
             t: \"f32[2, 4]\" = torch.ops.aten.t.default(clone)\n    \
             neg: \"f32[2, 4]\" = torch.ops.aten.neg.default(t)\n    \
             fill_: \"f32[4, 2]\" = torch.ops.aten.fill_.Scalar(clone, 0.0)\n    \
             return (neg, clone)\n",
        );
        assert_eq!(functionalize(&mut g).rewritten, 1);
        assert_eq!(g.value_name(g.outputs[1].unwrap()), "fill_");
    }

    #[test]
    fn mixed_or_unknown_dtypes_are_kept() {
        let mut g = graph(
            "    clone: \"i64[4, 2]\" = torch.ops.aten.clone.default(i)\n    \
             mul_: \"i64[4, 2]\" = torch.ops.aten.mul_.Tensor(clone, x)\n    \
             return (mul_,)\n",
        );
        assert_eq!(functionalize(&mut g).kept, ["mul_"]);
        let mut g = graph(
            "    clone: \"f32[4, 2]\" = torch.ops.aten.clone.default(x)\n    \
             conv: \"bf16[4, 2]\" = torch.ops.prims.convert_element_type.default(y, torch.bfloat16)\n    \
             mul_: \"f32[4, 2]\" = torch.ops.aten.mul_.Tensor(clone, conv)\n    \
             add_: \"f32[4, 2]\" = torch.ops.aten.add_.Tensor(mul_, i)\n    \
             return (add_,)\n",
        );
        // A bf16 operand on an f32 target: kept. The next update's i64 operand is promoted
        // away, so it is rewritten; `mul_` stays, and with it the graph is unsupported.
        let r = functionalize(&mut g);
        assert_eq!(r.kept, ["mul_"]);
        assert_eq!(r.rewritten, 1);
        let mut g = graph(
            "    clone: \"i64[4, 2]\" = torch.ops.aten.clone.default(i)\n    \
             mul_: \"i64[4, 2]\" = torch.ops.aten.mul_.Scalar(clone, 0.5)\n    \
             return (mul_,)\n",
        );
        assert_eq!(functionalize(&mut g).kept, ["mul_"]);
    }

    #[test]
    fn copy_casts_and_is_rewritten() {
        let mut g = graph(
            "    clone: \"f32[4, 2]\" = torch.ops.aten.clone.default(x)\n    \
             copy_: \"f32[4, 2]\" = torch.ops.aten.copy_.default(clone, i)\n    \
             return (clone,)\n",
        );
        assert_eq!(functionalize(&mut g).rewritten, 1);
        assert_eq!(ops(&g)[1], "copy.default");
        assert_eq!(g.value_name(g.outputs[0].unwrap()), "copy_");
    }

    #[test]
    fn copying_twins_of_views_become_the_views() {
        let mut g = graph(
            "    split_copy = torch.ops.aten.split_copy.Tensor(x, 2)\n    \
             getitem: \"f32[2, 2]\" = split_copy[0]\n    \
             view_copy: \"f32[4]\" = torch.ops.aten.view_copy.default(getitem, [4])\n    \
             _to_copy: \"f64[4]\" = torch.ops.aten._to_copy.default(view_copy, dtype = torch.float64)\n    \
             return (_to_copy,)\n",
        );
        assert_eq!(functionalize(&mut g).view_copies, 2);
        assert_eq!(
            ops(&g),
            ["split.Tensor", "view.default", "_to_copy.default"]
        );
        assert_eq!(view_of_copy("aten", "index_copy"), None);
    }

    #[test]
    fn names_that_only_end_in_an_underscore_are_not_in_place() {
        assert_eq!(in_place_name("aten", "add_").as_deref(), Some("add"));
        assert_eq!(in_place_name("aten", "__and__"), None);
        assert_eq!(in_place_name("aten", "_foreach_add_"), None);
        assert_eq!(in_place_name("mylib", "op_"), None);
    }
}
