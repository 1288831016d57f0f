//! Graphs: nodes, values, arguments and tensor types.

use crate::DType;
use std::collections::HashMap;
use std::fmt;
use std::path::PathBuf;

/// One dimension of a tensor shape: a known size, or a symbol (e.g. `s0` from a dynamic-shape
/// capture) whose value is not fixed by the graph.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Dim {
    /// A concrete size.
    Known(i64),
    /// A symbolic size, by name.
    Sym(String),
}

impl fmt::Display for Dim {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Dim::Known(n) => write!(f, "{n}"),
            Dim::Sym(s) => f.write_str(s),
        }
    }
}

/// The static type of a tensor value: element type and shape.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct TensorType {
    /// Element type.
    pub dtype: DType,
    /// Shape, outermost dimension first; empty for a scalar tensor.
    pub shape: Vec<Dim>,
}

impl TensorType {
    /// A tensor type with a concrete shape.
    pub fn new(dtype: DType, shape: &[i64]) -> Self {
        TensorType {
            dtype,
            shape: shape.iter().map(|&d| Dim::Known(d)).collect(),
        }
    }

    /// The shape as concrete sizes, or `None` when a dimension is symbolic.
    pub fn concrete_shape(&self) -> Option<Vec<i64>> {
        self.shape
            .iter()
            .map(|d| match d {
                Dim::Known(n) => Some(*n),
                Dim::Sym(_) => None,
            })
            .collect()
    }

    /// Number of elements, when the shape is concrete.
    pub fn numel(&self) -> Option<i64> {
        self.concrete_shape().map(|s| s.iter().product())
    }

    /// Size in bytes, when the shape is concrete.
    pub fn size_bytes(&self) -> Option<u64> {
        self.numel()
            .map(|n| n.max(0) as u64 * self.dtype.size_bytes() as u64)
    }
}

impl fmt::Display for TensorType {
    /// Prints the torch.fx annotation form, e.g. `f32[8, 16]`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}[", self.dtype)?;
        for (i, d) in self.shape.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            write!(f, "{d}")?;
        }
        f.write_str("]")
    }
}

/// A fully qualified operator name: `namespace.name.overload` (`aten.mm.default`).
///
/// `overload` is empty when the source omitted it (`_c10d_functional.wait_tensor`).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct OpName {
    /// Operator namespace (`aten`, `_c10d_functional`, `apex`, a custom library).
    pub namespace: String,
    /// Operator name within the namespace.
    pub name: String,
    /// Overload name (`default`, `Tensor`, `Scalar`, ...), or empty.
    pub overload: String,
}

impl OpName {
    /// Builds an operator name from its three parts.
    pub fn new(namespace: &str, name: &str, overload: &str) -> Self {
        OpName {
            namespace: namespace.to_string(),
            name: name.to_string(),
            overload: overload.to_string(),
        }
    }

    /// Parses `namespace.name.overload` or `namespace.name`.
    pub fn parse(s: &str) -> Option<Self> {
        let parts: Vec<&str> = s.split('.').collect();
        if parts.iter().any(|p| p.is_empty()) {
            return None;
        }
        match parts.as_slice() {
            [ns, name] => Some(OpName::new(ns, name, "")),
            [ns, name, ov] => Some(OpName::new(ns, name, ov)),
            _ => None,
        }
    }

    /// `namespace.name`, without the overload: the key most registries dispatch on.
    pub fn base(&self) -> String {
        format!("{}.{}", self.namespace, self.name)
    }
}

impl fmt::Display for OpName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.overload.is_empty() {
            write!(f, "{}.{}", self.namespace, self.name)
        } else {
            write!(f, "{}.{}.{}", self.namespace, self.name, self.overload)
        }
    }
}

/// A reference to one output of one node.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ValueId {
    /// Index of the producing node in [`Graph::nodes`].
    pub node: usize,
    /// Which output of that node (0 for single-output nodes).
    pub output: usize,
}

impl ValueId {
    /// Output `output` of node `node`.
    pub fn new(node: usize, output: usize) -> Self {
        ValueId { node, output }
    }
}

/// An argument of an operator call, as written in the source.
#[derive(Clone, Debug, PartialEq)]
pub enum Arg {
    /// `None`.
    None,
    /// `True` / `False`.
    Bool(bool),
    /// An integer literal.
    Int(i64),
    /// A float literal (may be `inf`, `-inf` or `nan`).
    Float(f64),
    /// A string literal.
    Str(String),
    /// A tensor (or other value) produced by a node of the same graph.
    Value(ValueId),
    /// A list or tuple, possibly nested, possibly of values.
    List(Vec<Arg>),
    /// A dtype such as `torch.float16`.
    Dtype(DType),
    /// A device such as `device(type='cuda', index=0)`, kept as its printed form.
    Device(String),
    /// A layout such as `torch.strided`, without the `torch.` prefix.
    Layout(String),
    /// A memory format such as `torch.contiguous_format`, without the `torch.` prefix.
    MemoryFormat(String),
    /// An operator passed as an argument (`auto_functionalized_v2(torch.ops.tg.op.default, ...)`).
    Op(OpName),
}

impl Arg {
    /// The integer, if this is one (bools count as 0/1, as in Python).
    pub fn as_int(&self) -> Option<i64> {
        match self {
            Arg::Int(i) => Some(*i),
            Arg::Bool(b) => Some(*b as i64),
            _ => None,
        }
    }

    /// The number, if this is an int, float or bool.
    pub fn as_f64(&self) -> Option<f64> {
        match self {
            Arg::Int(i) => Some(*i as f64),
            Arg::Float(f) => Some(*f),
            Arg::Bool(b) => Some(*b as i64 as f64),
            _ => None,
        }
    }

    /// The bool, if this is one.
    pub fn as_bool(&self) -> Option<bool> {
        match self {
            Arg::Bool(b) => Some(*b),
            _ => None,
        }
    }

    /// The value reference, if this is one.
    pub fn as_value(&self) -> Option<ValueId> {
        match self {
            Arg::Value(v) => Some(*v),
            _ => None,
        }
    }

    /// A list of integers (an int alone counts as a one-element list, as torch allows).
    pub fn as_int_list(&self) -> Option<Vec<i64>> {
        match self {
            Arg::List(items) => items.iter().map(Arg::as_int).collect(),
            Arg::Int(i) => Some(vec![*i]),
            _ => None,
        }
    }

    /// Every value this argument refers to, in order, including inside nested lists.
    pub fn values(&self, out: &mut Vec<ValueId>) {
        match self {
            Arg::Value(v) => out.push(*v),
            Arg::List(items) => items.iter().for_each(|a| a.values(out)),
            _ => {}
        }
    }
}

/// Where the Python code that produced a node lives (from `# File: path:LINE in FUNC, code: ...`).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct SourceLoc {
    /// Source file path, as captured.
    pub file: String,
    /// 1-based line in that file.
    pub line: u32,
    /// Enclosing function.
    pub function: String,
    /// The line of code, as captured.
    pub code: String,
}

impl SourceLoc {
    /// The literal of a subscript assignment `name[...] = LITERAL` on the captured line: the
    /// value that tracing lifted into a module constant (`x[mask] = 0.0` becomes
    /// `_tensor_constantN` holding 0.0).
    pub fn assigned_literal(&self) -> Option<f64> {
        let (lhs, rhs) = self.code.split_once('=')?;
        let lhs = lhs.trim();
        if !(lhs.ends_with(']') && lhs.contains('['))
            || rhs.starts_with('=')
            || lhs.ends_with(['!', '<', '>'])
        {
            return None;
        }
        match rhs.trim() {
            "True" => Some(1.0),
            "False" => Some(0.0),
            t => t.parse::<f64>().ok().filter(|f| f.is_finite()),
        }
    }
}

impl fmt::Display for SourceLoc {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{} in {}", self.file, self.line, self.function)
    }
}

/// What a node is.
#[derive(Clone, Debug, PartialEq)]
pub enum NodeKind {
    /// A graph input (an fx placeholder).
    Input,
    /// A constant tensor attribute of the module (`self._tensor_constant0`); its value is not in
    /// the graph text.
    Constant {
        /// The attribute name (`_tensor_constant0`).
        attr: String,
    },
    /// A call of an operator.
    Call {
        /// The operator called.
        op: OpName,
        /// Positional arguments.
        args: Vec<Arg>,
        /// Keyword arguments, in source order.
        kwargs: Vec<(String, Arg)>,
    },
}

/// One output of a node.
#[derive(Clone, Debug, PartialEq)]
pub struct Output {
    /// The value's name in the source (`mm_3`, or `getitem_7` for an output taken by `getitem`).
    pub name: String,
    /// The type recorded in the source, if any (the interpreter and inference do not need it; the
    /// shape check compares against it).
    pub ty: Option<TensorType>,
}

/// A node of a graph.
#[derive(Clone, Debug, PartialEq)]
pub struct Node {
    /// The node's name (for single-output nodes, also its value's name).
    pub name: String,
    /// What the node is.
    pub kind: NodeKind,
    /// The values it produces.
    pub outputs: Vec<Output>,
    /// The Python source location it was captured from.
    pub loc: Option<SourceLoc>,
    /// The 1-based line of the graph file that defines it.
    pub line: Option<usize>,
}

impl Node {
    /// The operator, for call nodes.
    pub fn op(&self) -> Option<&OpName> {
        match &self.kind {
            NodeKind::Call { op, .. } => Some(op),
            _ => None,
        }
    }

    /// Positional arguments (empty for non-call nodes).
    pub fn args(&self) -> &[Arg] {
        match &self.kind {
            NodeKind::Call { args, .. } => args,
            _ => &[],
        }
    }

    /// A keyword argument by name.
    pub fn kwarg(&self, key: &str) -> Option<&Arg> {
        match &self.kind {
            NodeKind::Call { kwargs, .. } => kwargs.iter().find(|(k, _)| k == key).map(|(_, a)| a),
            _ => None,
        }
    }

    /// Every value this node reads, in argument order.
    pub fn inputs(&self) -> Vec<ValueId> {
        let mut out = Vec::new();
        if let NodeKind::Call { args, kwargs, .. } = &self.kind {
            args.iter().for_each(|a| a.values(&mut out));
            kwargs.iter().for_each(|(_, a)| a.values(&mut out));
        }
        out
    }
}

/// A computation graph in topological order.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Graph {
    /// A display name (usually the file stem).
    pub name: String,
    /// The file this graph was read from, if any.
    pub path: Option<PathBuf>,
    /// Nodes in topological order: a node only reads values of earlier nodes.
    pub nodes: Vec<Node>,
    /// Graph inputs, in signature order.
    pub inputs: Vec<ValueId>,
    /// Graph outputs, in return order; `None` where the source returns `None`.
    pub outputs: Vec<Option<ValueId>>,
}

impl Graph {
    /// An empty graph named `name`.
    pub fn new(name: impl Into<String>) -> Self {
        Graph {
            name: name.into(),
            ..Default::default()
        }
    }

    /// Appends a node and returns its index.
    pub fn push(&mut self, node: Node) -> usize {
        self.nodes.push(node);
        self.nodes.len() - 1
    }

    /// The node producing `v`.
    pub fn node(&self, v: ValueId) -> &Node {
        &self.nodes[v.node]
    }

    /// The source name of value `v`.
    pub fn value_name(&self, v: ValueId) -> &str {
        &self.nodes[v.node].outputs[v.output].name
    }

    /// The recorded type of value `v`, if the source gave one.
    pub fn recorded_type(&self, v: ValueId) -> Option<&TensorType> {
        self.nodes[v.node].outputs[v.output].ty.as_ref()
    }

    /// A map from value names to values.
    pub fn name_index(&self) -> HashMap<&str, ValueId> {
        let mut map = HashMap::new();
        for (i, n) in self.nodes.iter().enumerate() {
            for (o, out) in n.outputs.iter().enumerate() {
                map.insert(out.name.as_str(), ValueId::new(i, o));
            }
        }
        map
    }

    /// Looks a value up by name (linear; use [`Graph::name_index`] for many look-ups).
    pub fn find(&self, name: &str) -> Option<ValueId> {
        self.nodes.iter().enumerate().find_map(|(i, n)| {
            n.outputs
                .iter()
                .position(|o| o.name == name)
                .map(|o| ValueId::new(i, o))
        })
    }

    /// Every value in the graph, in node order.
    pub fn values(&self) -> impl Iterator<Item = ValueId> + '_ {
        self.nodes
            .iter()
            .enumerate()
            .flat_map(|(i, n)| (0..n.outputs.len()).map(move |o| ValueId::new(i, o)))
    }

    /// For every node, the nodes that read one of its values.
    pub fn consumers(&self) -> Vec<Vec<usize>> {
        let mut users = vec![Vec::new(); self.nodes.len()];
        for (i, n) in self.nodes.iter().enumerate() {
            for v in n.inputs() {
                if users[v.node].last() != Some(&i) {
                    users[v.node].push(i);
                }
            }
        }
        users
    }

    /// Checks structural invariants: every reference points to an earlier node and an existing
    /// output, inputs are `Input` nodes, and value names are unique. Returns the first violation.
    pub fn check_structure(&self) -> Result<(), String> {
        let mut seen = HashMap::new();
        for (i, n) in self.nodes.iter().enumerate() {
            for v in n.inputs() {
                if v.node >= i || v.output >= self.nodes[v.node].outputs.len() {
                    return Err(format!(
                        "node `{}` reads a value that is not defined before it",
                        n.name
                    ));
                }
            }
            for out in &n.outputs {
                if let Some(prev) = seen.insert(out.name.as_str(), i) {
                    return Err(format!(
                        "value name `{}` is defined twice (nodes {prev} and {i})",
                        out.name
                    ));
                }
            }
        }
        for v in &self.inputs {
            if v.node >= self.nodes.len() || self.nodes[v.node].kind != NodeKind::Input {
                return Err(format!("graph input {v:?} is not an input node"));
            }
        }
        for v in self.outputs.iter().flatten() {
            if v.node >= self.nodes.len() || v.output >= self.nodes[v.node].outputs.len() {
                return Err(format!("graph output {v:?} does not exist"));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn assigned_literals_come_from_subscript_assignments_only() {
        let at = |code: &str| SourceLoc {
            file: "f.py".into(),
            line: 1,
            function: "f".into(),
            code: code.into(),
        };
        assert_eq!(
            at("output_parallel[input_mask, :] = 0.0").assigned_literal(),
            Some(0.0)
        );
        assert_eq!(
            at("masked_input[input_mask] = 0").assigned_literal(),
            Some(0.0)
        );
        assert_eq!(at("x[m] = -1e4").assigned_literal(), Some(-1e4));
        assert_eq!(at("y = 0.0").assigned_literal(), None);
        assert_eq!(at("x[m] = y").assigned_literal(), None);
        assert_eq!(at("x[m] == 0").assigned_literal(), None);
        assert_eq!(at("return f(a, b=0)").assigned_literal(), None);
    }

    fn tiny() -> Graph {
        let mut g = Graph::new("t");
        let a = g.push(Node {
            name: "a".into(),
            kind: NodeKind::Input,
            outputs: vec![Output {
                name: "a".into(),
                ty: Some(TensorType::new(DType::F32, &[2, 3])),
            }],
            loc: None,
            line: None,
        });
        g.inputs.push(ValueId::new(a, 0));
        let b = g.push(Node {
            name: "neg".into(),
            kind: NodeKind::Call {
                op: OpName::new("aten", "neg", "default"),
                args: vec![Arg::Value(ValueId::new(a, 0))],
                kwargs: vec![],
            },
            outputs: vec![Output {
                name: "neg".into(),
                ty: None,
            }],
            loc: None,
            line: None,
        });
        g.outputs.push(Some(ValueId::new(b, 0)));
        g
    }

    #[test]
    fn structure_and_lookup() {
        let g = tiny();
        g.check_structure().unwrap();
        assert_eq!(g.find("neg"), Some(ValueId::new(1, 0)));
        assert_eq!(g.consumers()[0], vec![1]);
        assert_eq!(
            g.recorded_type(ValueId::new(0, 0)).unwrap().to_string(),
            "f32[2, 3]"
        );
    }

    #[test]
    fn op_names_parse() {
        let op = OpName::parse("aten.mm.default").unwrap();
        assert_eq!(op.to_string(), "aten.mm.default");
        assert_eq!(op.base(), "aten.mm");
        assert_eq!(
            OpName::parse("_c10d_functional.wait_tensor")
                .unwrap()
                .overload,
            ""
        );
        assert!(OpName::parse("a..b").is_none());
    }
}
