//! Whole-program type checking: shape and dtype inference over a graph ([`infer_graph`]), with
//! every finding that makes the program ill-typed or impossible to hold reported as a located
//! [`TypeError`]: an operator that rejects its arguments, an empty tensor, a tensor whose
//! element count or byte size overflows, and a recorded type that contradicts its operator.
//!
//! Opaque operators (no known meaning) are not type errors: inference passes the recorded type
//! through them, and the engines report them as unsupported.

use crate::infer::{infer_graph, Inference, NodeInference};
use shardproof_ir::{DType, Dim, Graph, Node, NodeKind, OpMeaning, SourceError, Span, TensorType};
use shardproof_ops::Meta;
use std::collections::BTreeMap;
use std::fmt;

/// The largest element count, and the largest byte size, of a tensor that type-checks: torch
/// counts elements and bytes in `int64`.
pub const MAX_TENSOR_SIZE: u64 = i64::MAX as u64;

/// What kind of type error.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum TypeErrorKind {
    /// A known operator rejects its arguments (incompatible shapes, a dim out of range, a bad
    /// argument).
    Rejected,
    /// A tensor has a zero-size dim; shardproof refuses empty tensors.
    Empty,
    /// A tensor's element count or byte size overflows 64-bit arithmetic (or torch's `int64`).
    Overflow,
    /// A recorded shape has a negative dim.
    NegativeDim,
    /// The type the graph records for a value contradicts what its operator computes (another
    /// number of dims or of elements).
    Mismatch,
    /// The graph's structure is broken: a node reads a value not defined before it, or a value
    /// name is defined twice (reported once, for the whole graph).
    Malformed,
}

/// One type error: where (graph file, line, node), what is wrong, what was expected, and a hint.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TypeError {
    /// What kind of error.
    pub kind: TypeErrorKind,
    /// The graph file (its path, or the graph's name when it was not read from a file).
    pub file: String,
    /// The 1-based line of the graph file that defines the node, when known.
    pub line: Option<usize>,
    /// The node's name.
    pub node: String,
    /// The operator the node calls (`aten.add.Tensor`), for call nodes.
    pub op: Option<String>,
    /// What is wrong.
    pub message: String,
    /// What was expected instead.
    pub expected: String,
    /// How to fix it.
    pub hint: String,
}

impl TypeError {
    /// The error as a [`SourceError`] (column 1 of the node's line: nodes record no column).
    pub fn to_source_error(&self) -> SourceError {
        let op = self
            .op
            .as_ref()
            .map(|o| format!(" ({o})"))
            .unwrap_or_default();
        SourceError::new(
            &self.file,
            self.line.map(|l| Span::new(l, 1)),
            format!(
                "node `{}`{op}: {}; expected {}",
                self.node, self.message, self.expected
            ),
        )
        .with_hint(self.hint.clone())
    }
}

impl fmt::Display for TypeError {
    /// `FILE:LINE: node `NAME` (OP): MESSAGE; expected EXPECTED` and a `hint:` line.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.file)?;
        if let Some(l) = self.line {
            write!(f, ":{l}")?;
        }
        write!(f, ": node `{}`", self.node)?;
        if let Some(op) = &self.op {
            write!(f, " ({op})")?;
        }
        write!(
            f,
            ": {}; expected {}\n  hint: {}",
            self.message, self.expected, self.hint
        )
    }
}

impl std::error::Error for TypeError {}

/// Type-checks `graph`: infers every value's shape and dtype (with the meanings of the custom
/// operators a case declares) and returns the inference, or every [`TypeError`] found, in node
/// order.
///
/// An error is reported where it originates: a node whose inputs are already empty or
/// overflowing is not reported again, and a node whose input types are unknown (downstream of
/// an opaque operator without a recorded type) is not checked.
///
/// ```
/// use shardproof_interp::{typecheck, TypeErrorKind};
/// use std::collections::BTreeMap;
/// use std::path::Path;
///
/// let text = r#"
/// class GraphModule(torch.nn.Module):
///     def forward(self, x: "f32[8, 16]", y: "f32[8, 16]"):
///         s: "f32[8, 8]" = torch.ops.aten.slice.Tensor(x, 1, 0, 8)
///         add: "f32[8, 8]" = torch.ops.aten.add.Tensor(s, y)
///         return (add,)
/// "#;
/// let graph = shardproof_import::parse_fx(text, Path::new("g.py")).unwrap().graph;
/// let errors = typecheck(&graph, &BTreeMap::new()).unwrap_err();
/// assert_eq!(errors[0].kind, TypeErrorKind::Rejected);
/// assert_eq!(errors[0].node, "add");
/// assert!(errors[0].to_string().starts_with("g.py:5: node `add` (aten.add.Tensor)"));
///
/// let ok = text.replace("slice.Tensor(x, 1, 0, 8)", "slice.Tensor(x, 1, 0, 16)")
///     .replace("f32[8, 8]", "f32[8, 16]");
/// let graph = shardproof_import::parse_fx(&ok, Path::new("g.py")).unwrap().graph;
/// assert!(typecheck(&graph, &BTreeMap::new()).is_ok());
/// ```
pub fn typecheck(
    graph: &Graph,
    custom_ops: &BTreeMap<String, OpMeaning>,
) -> Result<Inference, Vec<TypeError>> {
    if let Err(e) = graph.check_structure() {
        return Err(vec![TypeError {
            kind: TypeErrorKind::Malformed,
            file: file_of(graph),
            line: None,
            node: graph.name.clone(),
            op: None,
            message: format!("the graph is malformed: {e}"),
            expected: "every node to read only values defined before it, and unique value names"
                .into(),
            hint: "the graph file is corrupt or was edited by hand: re-export it".into(),
        }]);
    }
    let inference = infer_graph(graph, custom_ops);
    let errors = type_errors(graph, &inference);
    if errors.is_empty() {
        Ok(inference)
    } else {
        Err(errors)
    }
}

/// The type errors of `graph` given its inference (see [`typecheck`]).
pub fn type_errors(graph: &Graph, inference: &Inference) -> Vec<TypeError> {
    let file = file_of(graph);
    // Per node, per output: whether the value is refused (empty or overflowing), so that
    // downstream nodes are not reported again.
    let mut refused: Vec<Vec<bool>> = Vec::with_capacity(graph.nodes.len());
    let mut errors = Vec::new();
    for (i, node) in graph.nodes.iter().enumerate() {
        let metas = inference.metas.get(i).map_or(&[][..], |m| &m[..]);
        let inputs = node.inputs();
        let upstream_refused = inputs.iter().any(|v| {
            refused
                .get(v.node)
                .and_then(|r| r.get(v.output))
                .copied()
                .unwrap_or(false)
        });
        let inputs_known = inputs.iter().all(|v| {
            inference
                .metas
                .get(v.node)
                .and_then(|m| m.get(v.output))
                .is_some_and(Option::is_some)
        });
        let err = |kind, message: String, expected: String, hint: &str| TypeError {
            kind,
            file: file.clone(),
            line: node.line,
            node: node.name.clone(),
            op: node.op().map(|o| o.to_string()),
            message,
            expected,
            hint: hint.to_string(),
        };
        let mut node_refused = vec![false; node.outputs.len()];
        match inference.nodes.get(i) {
            Some(NodeInference::Error(e)) if inputs_known && !upstream_refused => {
                errors.push(err(
                    TypeErrorKind::Rejected,
                    format!("the operator rejects its arguments: {e}"),
                    format!(
                        "arguments the operator accepts (its inputs: {})",
                        describe_inputs(graph, node, inference)
                    ),
                    "check the shapes of this node's inputs and its arguments (dims, sizes); a slice, view, transpose or split along the wrong dim earlier in the graph is a common cause",
                ));
            }
            Some(NodeInference::Inferred(ms)) if !upstream_refused => {
                for (o, out) in node.outputs.iter().enumerate() {
                    let (Some(rec), Some(inf)) = (&out.ty, ms.get(o)) else {
                        continue;
                    };
                    if let Some(why) = contradiction(rec, inf) {
                        errors.push(err(
                            TypeErrorKind::Mismatch,
                            format!(
                                "value `{}` is recorded as {rec} but the operator computes {} ({why})",
                                out.name,
                                show_meta(inf)
                            ),
                            format!("the recorded type {}", show_meta(inf)),
                            "the graph text contradicts itself: re-capture the program, or correct the annotation or the node's arguments",
                        ));
                    }
                }
            }
            _ => {}
        }
        if !upstream_refused {
            for (o, out) in node.outputs.iter().enumerate() {
                let inferred = matches!(inference.nodes.get(i), Some(NodeInference::Inferred(_)));
                let meta = metas.get(o).and_then(Option::as_ref);
                let found = match meta {
                    Some(m) => {
                        let dims: Vec<u64> = m.shape.iter().map(|&d| d as u64).collect();
                        size_problem(m.dtype, &dims, inferred)
                    }
                    None => out.ty.as_ref().and_then(recorded_problem),
                };
                if let Some((kind, message, expected, hint)) = found {
                    node_refused[o] = true;
                    errors.push(err(
                        kind,
                        format!("value `{}` {message}", out.name),
                        expected,
                        hint,
                    ));
                }
            }
        } else {
            node_refused.iter_mut().for_each(|r| *r = true);
        }
        refused.push(node_refused);
    }
    errors
}

/// The graph's file, or its name when it was not read from one.
fn file_of(graph: &Graph) -> String {
    graph
        .path
        .as_ref()
        .map_or_else(|| graph.name.clone(), |p| p.display().to_string())
}

/// How a recorded type clearly contradicts the inferred one: another number of dims, or
/// another number of elements. Dtype differences and reshuffled dims are left to `inspect`'s
/// shape check (captures legitimately differ from our inference there, e.g. symbolic dims).
fn contradiction(rec: &TensorType, inf: &Meta) -> Option<String> {
    let shape = rec.concrete_shape()?;
    if shape.len() != inf.rank() {
        return Some(format!(
            "{} dims recorded, {} computed",
            shape.len(),
            inf.rank()
        ));
    }
    let rec_numel = shape.iter().try_fold(1u64, |a, &d| {
        u64::try_from(d).ok().and_then(|d| a.checked_mul(d))
    })?;
    let inf_numel = inf.checked_numel()? as u64;
    (rec_numel != inf_numel).then(|| format!("{rec_numel} elements recorded, {inf_numel} computed"))
}

type Problem = (TypeErrorKind, String, String, &'static str);

/// Whether a tensor of type `t` (recorded) is empty, has a negative dim or overflows; `None`
/// also when a dim is symbolic.
fn recorded_problem(t: &TensorType) -> Option<Problem> {
    let mut dims = Vec::with_capacity(t.shape.len());
    for d in &t.shape {
        match d {
            Dim::Sym(_) => return None,
            Dim::Known(n) if *n < 0 => {
                return Some((
                    TypeErrorKind::NegativeDim,
                    format!("has type {t}, with a negative dim"),
                    "every dim of a shape to be at least 1".into(),
                    "correct the shape annotation",
                ))
            }
            Dim::Known(n) => dims.push(*n as u64),
        }
    }
    size_problem(t.dtype, &dims, false)
}

/// Whether a tensor of `dtype` and `dims` is empty or overflows; `inferred` when inference
/// computed the shape (rather than the graph recording it).
fn size_problem(dtype: DType, dims: &[u64], inferred: bool) -> Option<Problem> {
    let what = if inferred {
        "is computed as"
    } else {
        "has type"
    };
    let t = show(dtype, dims);
    if dims.contains(&0) {
        return Some((
            TypeErrorKind::Empty,
            format!("{what} {t}, with a zero-size dim: an empty tensor"),
            "every dim of a shape to be at least 1 (shardproof refuses empty tensors)".into(),
            if inferred {
                "an empty result usually comes from a slice, split or narrow past the end of a dim: check this node's arguments"
            } else {
                "capture the program with non-empty inputs (every dim at least 1)"
            },
        ));
    }
    let numel = dims.iter().try_fold(1u64, |a, &d| a.checked_mul(d));
    let elem = dtype.size_bytes() as u64;
    let bytes = numel.and_then(|n| n.checked_mul(elem));
    let hint = "the shape is corrupt or far too large for any machine: check the annotation and the sizes the program was captured at";
    match (numel, bytes) {
        (Some(n), Some(b)) if n <= MAX_TENSOR_SIZE && b <= MAX_TENSOR_SIZE => None,
        (Some(n), _) if n <= MAX_TENSOR_SIZE => Some((
            TypeErrorKind::Overflow,
            format!("{what} {t}: {n} elements of {elem} bytes overflow a 64-bit byte count"),
            format!("a tensor of at most {MAX_TENSOR_SIZE} bytes"),
            hint,
        )),
        _ => Some((
            TypeErrorKind::Overflow,
            format!("{what} {t}: its element count overflows 64-bit arithmetic"),
            format!("a tensor of at most {MAX_TENSOR_SIZE} elements"),
            hint,
        )),
    }
}

/// The torch.fx annotation form of a type, e.g. `f32[8, 16]`.
fn show(dtype: DType, dims: &[u64]) -> String {
    let dims: Vec<String> = dims.iter().map(u64::to_string).collect();
    format!("{dtype}[{}]", dims.join(", "))
}

/// The annotation form of a meta.
fn show_meta(m: &Meta) -> String {
    let dims: Vec<u64> = m.shape.iter().map(|&d| d as u64).collect();
    show(m.dtype, &dims)
}

/// `name: type` of every tensor a node reads, for error messages.
fn describe_inputs(graph: &Graph, node: &Node, inference: &Inference) -> String {
    let NodeKind::Call { .. } = node.kind else {
        return String::new();
    };
    let items: Vec<String> = node
        .inputs()
        .iter()
        .map(|v| {
            let ty = inference
                .metas
                .get(v.node)
                .and_then(|m| m.get(v.output))
                .and_then(Option::as_ref)
                .map_or_else(|| "?".to_string(), show_meta);
            format!("{}: {ty}", graph.value_name(*v))
        })
        .collect();
    if items.is_empty() {
        "no tensors".into()
    } else {
        items.join(", ")
    }
}

/// Bytes the interpreter needs to hold the values of a graph (8 bytes per element, whatever
/// the dtype), summed with checked arithmetic: `None` when the sum or a tensor's size
/// overflows `u64`. `metas` is [`Inference::metas`]; with `live` (see
/// [`live_values`](crate::live_values)) only the values marked live count. Values of unknown
/// type count nothing.
///
/// Callers compare the result with their memory budget before allocating anything:
///
/// ```
/// use shardproof_interp::storage_bytes;
/// use shardproof_ir::DType;
/// use shardproof_ops::Meta;
///
/// let small = vec![vec![Some(Meta::new(DType::F32, vec![8, 16]))]];
/// assert_eq!(storage_bytes(&small, None), Some(8 * 16 * 8));
/// let huge = vec![vec![Some(Meta::new(DType::F32, vec![1 << 62, 16]))]];
/// assert_eq!(storage_bytes(&huge, None), None);
/// ```
pub fn storage_bytes(metas: &[Vec<Option<Meta>>], live: Option<&[Vec<bool>]>) -> Option<u64> {
    let mut total: u64 = 0;
    for (i, outs) in metas.iter().enumerate() {
        for (o, m) in outs.iter().enumerate() {
            let counted =
                live.is_none_or(|l| l.get(i).and_then(|l| l.get(o)).copied().unwrap_or(false));
            if let (true, Some(m)) = (counted, m) {
                total = total.checked_add(m.storage_bytes()?)?;
            }
        }
    }
    Some(total)
}
