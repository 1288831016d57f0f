//! The format-independent view of one graph that mutation sites are found in, and the edits a
//! mutant applies. The torch.fx text and JSON backends both read into [`GraphView`] and apply
//! [`Edit`]s to their own text, so every mutation kind is written once.

use std::collections::HashMap;

/// A recorded tensor type: dtype short name and dims (`None` for a symbolic size).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct TensorType {
    pub dtype: String,
    pub dims: Vec<Option<i64>>,
}

impl TensorType {
    /// The torch.fx annotation text, `f32[8, 16]`; only built from fully known dims.
    pub fn annotation(&self) -> String {
        let dims: Vec<String> = self
            .dims
            .iter()
            .map(|d| d.map_or_else(|| "?".to_string(), |d| d.to_string()))
            .collect();
        format!("{}[{}]", self.dtype, dims.join(", "))
    }

    /// Parses `f32[8, 16]` (also `f32[]`); symbolic dims read as unknown.
    pub fn parse(text: &str) -> Option<TensorType> {
        let open = text.find('[')?;
        let close = text.rfind(']')?;
        if close < open {
            return None;
        }
        let dtype = text[..open].trim().to_string();
        if dtype.is_empty() {
            return None;
        }
        let inner = text[open + 1..close].trim();
        let dims = if inner.is_empty() {
            Vec::new()
        } else {
            inner
                .split(',')
                .map(|d| d.trim().parse::<i64>().ok())
                .collect()
        };
        Some(TensorType { dtype, dims })
    }

    /// The size of `dim` (negative dims count from the back) when known.
    pub fn size(&self, dim: i64) -> Option<i64> {
        let rank = self.dims.len() as i64;
        let d = if dim < 0 { dim + rank } else { dim };
        if d < 0 || d >= rank {
            return None;
        }
        self.dims[d as usize]
    }
}

/// An argument of a call, as far as mutation needs to understand it.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Arg {
    None,
    Bool(bool),
    Int(i64),
    /// A float with the text it was written as (so an unchanged float keeps its spelling).
    Float(f64),
    Str(String),
    /// A reference to a value of the graph.
    Value(String),
    List(Vec<Arg>),
    /// Anything else (dtypes, devices, ...), kept verbatim in the backend's own syntax.
    Other(String),
}

impl Arg {
    pub fn as_int(&self) -> Option<i64> {
        match self {
            Arg::Int(i) => Some(*i),
            _ => None,
        }
    }
    pub fn as_value(&self) -> Option<&str> {
        match self {
            Arg::Value(v) => Some(v),
            _ => None,
        }
    }
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Arg::Str(s) => Some(s),
            _ => None,
        }
    }
}

/// Which argument of a call: positional index or keyword name.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Slot {
    Pos(usize),
    Kw(String),
}

/// One node: a graph input or an operator call (or, in torch.fx text, any other assignment).
#[derive(Debug, Clone)]
pub(crate) struct Node {
    pub name: String,
    /// 1-based line in the file that defines the node (graph inputs: the signature line).
    pub line: usize,
    /// `aten.mm.default`; empty for graph inputs and for lines that are not `torch.ops` calls.
    pub op: String,
    pub args: Vec<Arg>,
    pub kwargs: Vec<(String, Arg)>,
    pub ty: Option<TensorType>,
    pub is_input: bool,
}

impl Node {
    /// The op without its namespace or overload: `mm` for `aten.mm.default`.
    pub fn op_name(&self) -> &str {
        let mut parts = self.op.split('.');
        let _ns = parts.next();
        parts.next().unwrap_or("")
    }
    pub fn namespace(&self) -> &str {
        self.op.split('.').next().unwrap_or("")
    }
}

/// A graph read for mutation.
#[derive(Debug, Clone)]
pub(crate) struct GraphView {
    pub nodes: Vec<Node>,
    index: HashMap<String, usize>,
}

impl GraphView {
    pub fn new(nodes: Vec<Node>) -> GraphView {
        let index = nodes
            .iter()
            .enumerate()
            .map(|(i, n)| (n.name.clone(), i))
            .collect();
        GraphView { nodes, index }
    }
    /// The recorded type of a value, looked up by name.
    pub fn type_of(&self, value: &str) -> Option<&TensorType> {
        self.index
            .get(value)
            .and_then(|&i| self.nodes[i].ty.as_ref())
    }
    pub fn node(&self, value: &str) -> Option<&Node> {
        self.index.get(value).map(|&i| &self.nodes[i])
    }
    /// A fresh value name starting with `base`.
    pub fn fresh_name(&self, base: &str) -> String {
        let mut k = 0;
        loop {
            let name = if k == 0 {
                base.to_string()
            } else {
                format!("{base}_{k}")
            };
            if !self.index.contains_key(&name) {
                return name;
            }
            k += 1;
        }
    }
}

/// One change to a graph; a mutant is a short list of them.
#[derive(Debug, Clone)]
pub(crate) enum Edit {
    /// Replace one argument of node `node`.
    SetArg { node: usize, slot: Slot, arg: Arg },
    /// Replace node `node`'s call (same name and recorded type), dropping its keyword arguments.
    Replace {
        node: usize,
        op: String,
        args: Vec<Arg>,
    },
    /// Delete node `node`; every later use of its value reads `rewire_to` instead.
    Remove { node: usize, rewire_to: String },
    /// Insert a new call right before node `node`.
    InsertBefore {
        node: usize,
        name: String,
        ty: TensorType,
        op: String,
        args: Vec<Arg>,
    },
}

/// Renders a float the way Python prints it (`0.1`, `2.0`, `1e-05`, `inf`).
pub(crate) fn python_float(f: f64) -> String {
    if f.is_nan() {
        return "nan".into();
    }
    if f.is_infinite() {
        return if f > 0.0 { "inf".into() } else { "-inf".into() };
    }
    let s = format!("{f:?}");
    if s.contains('.') || s.contains('e') || s.contains("inf") {
        s
    } else {
        format!("{s}.0")
    }
}
