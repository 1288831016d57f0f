//! The JSON graph format: a human-readable, lossless serialization of the IR.
//!
//! The format is documented in `docs/formats/graph-json.md`; its JSON Schema
//! (`docs/formats/graph.schema.json`) is generated from the DTO types below, so the types are
//! the single source of truth. DTOs refer to values by name, the way people and torch.fx do;
//! conversion to the IR resolves names to [`ValueId`]s and reports what it cannot resolve at the
//! node concerned.

mod tree;

use schemars::{json_schema, JsonSchema, Schema, SchemaGenerator};
use serde::de::{self, MapAccess, SeqAccess, Visitor};
use serde::ser::{SerializeMap, SerializeSeq};
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use shardproof_ir::{
    Arg, DType, Dim, Graph, Node, NodeKind, OpName, Output, SourceError, SourceLoc, Span,
    TensorType, ValueId,
};
use std::borrow::Cow;
use std::collections::HashMap;
use std::fmt;
use std::path::{Path, PathBuf};

/// The value of the `format` field.
const FORMAT: &str = "shardproof-graph";
/// The version this code writes and reads.
const VERSION: u32 = 1;

/// A shardproof computation graph (JSON graph format, version 1).
#[derive(Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(rename = "Graph", title = "shardproof graph")]
struct GraphDto {
    /// Always `"shardproof-graph"`: tells this format from other JSON files.
    #[schemars(extend("const" = "shardproof-graph"))]
    format: String,
    /// Format version; this schema describes version 1.
    #[schemars(extend("const" = 1))]
    version: u32,
    /// Display name of the graph (usually the stem of the file it was captured in).
    name: String,
    /// The file the graph was originally read from; `line` fields of nodes refer to it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    path: Option<String>,
    /// Graph inputs in signature order, by value name; each names the output of an `input`
    /// node.
    inputs: Vec<String>,
    /// Graph outputs in return order, by value name; `null` where the graph returns `None`.
    outputs: Vec<Option<String>>,
    /// Nodes in topological order: a node only reads values of nodes before it.
    nodes: Vec<NodeDto>,
}

/// What a node is.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Copy, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
#[schemars(rename = "NodeKind")]
enum KindDto {
    /// A graph input (placeholder).
    Input,
    /// A constant attribute of the module (`self._tensor_constant0`); requires `attr`.
    Constant,
    /// A call of an operator; requires `op`.
    Call,
}

/// One node of the graph.
#[derive(Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(rename = "Node")]
struct NodeDto {
    /// The node's name (for single-output nodes also the name of its value).
    name: String,
    /// What the node is.
    kind: KindDto,
    /// For `constant` nodes: the module attribute holding the value (`_tensor_constant0`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    attr: Option<String>,
    /// For `call` nodes: the operator, `"namespace.name.overload"` or `"namespace.name"`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    op: Option<OpDto>,
    /// For `call` nodes: positional arguments.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    args: Option<Vec<ArgDto>>,
    /// For `call` nodes: keyword arguments, in source order.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    kwargs: Option<KwargsDto>,
    /// The values the node produces, in output order; names are unique in the graph.
    outputs: Vec<OutputDto>,
    /// The Python source the node was captured from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    loc: Option<LocDto>,
    /// The 1-based line of the original graph file (`path`) that defines the node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    line: Option<usize>,
}

/// One value produced by a node.
#[derive(Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(rename = "Output")]
struct OutputDto {
    /// The value's name, referenced by `{"value": NAME}` arguments.
    name: String,
    /// The recorded type, when the source gave one.
    #[serde(default, rename = "type", skip_serializing_if = "Option::is_none")]
    ty: Option<TypeDto>,
}

/// A tensor type.
#[derive(Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(rename = "TensorType")]
struct TypeDto {
    /// Element type, by torch.fx short name.
    dtype: DTypeDto,
    /// Shape, outermost first; integers for known sizes, strings for symbolic ones (`"s0"`).
    shape: Vec<DimDto>,
}

/// One dimension: a size, or a symbolic size expression.
#[derive(Serialize, Deserialize, JsonSchema)]
#[serde(untagged)]
#[schemars(rename = "Dim")]
enum DimDto {
    /// A concrete size.
    Known(i64),
    /// A symbolic size such as `"s0"` or `"2*s1"`.
    Sym(String),
}

/// A Python source location (from `# File: PATH:LINE in FUNCTION, code: CODE`).
#[derive(Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(rename = "SourceLoc")]
struct LocDto {
    /// Source file path, as captured.
    file: String,
    /// 1-based line in that file.
    line: u32,
    /// Enclosing function.
    function: String,
    /// The line of code, as captured.
    code: String,
}

/// Element type by short name.
struct DTypeDto(DType);

impl Serialize for DTypeDto {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.0.short_name())
    }
}

impl<'de> Deserialize<'de> for DTypeDto {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        DType::from_short_name(&s).map(DTypeDto).ok_or_else(|| {
            de::Error::custom(format!(
                "unknown dtype `{s}`, expected one of {}",
                dtype_names().join(", ")
            ))
        })
    }
}

fn dtype_names() -> Vec<&'static str> {
    DType::ALL.iter().map(|d| d.short_name()).collect()
}

impl JsonSchema for DTypeDto {
    fn schema_name() -> Cow<'static, str> {
        "DType".into()
    }

    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        json_schema!({
            "description": "Element type, by torch.fx short name.",
            "type": "string",
            "enum": dtype_names(),
        })
    }
}

/// An operator name: a string `namespace.name[.overload]`, or the three parts when a part
/// contains a dot.
#[derive(Clone, Debug)]
enum OpDto {
    Str(String),
    Parts(OpName),
}

impl OpDto {
    fn from_op(op: &OpName) -> Self {
        let s = op.to_string();
        if OpName::parse(&s).as_ref() == Some(op) {
            OpDto::Str(s)
        } else {
            OpDto::Parts(op.clone())
        }
    }

    fn to_op(&self) -> Result<OpName, String> {
        match self {
            OpDto::Str(s) => OpName::parse(s).ok_or_else(|| {
                format!("malformed operator name `{s}`: expected `namespace.name.overload` or `namespace.name`")
            }),
            OpDto::Parts(op) => Ok(op.clone()),
        }
    }
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct OpPartsDto {
    namespace: String,
    name: String,
    #[serde(default)]
    overload: String,
}

impl Serialize for OpDto {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            OpDto::Str(x) => s.serialize_str(x),
            OpDto::Parts(op) => OpPartsDto {
                namespace: op.namespace.clone(),
                name: op.name.clone(),
                overload: op.overload.clone(),
            }
            .serialize(s),
        }
    }
}

impl<'de> Deserialize<'de> for OpDto {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = OpDto;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("an operator name string or {\"namespace\", \"name\", \"overload\"}")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<OpDto, E> {
                Ok(OpDto::Str(v.to_string()))
            }
            fn visit_map<A: MapAccess<'de>>(self, m: A) -> Result<OpDto, A::Error> {
                let p = OpPartsDto::deserialize(de::value::MapAccessDeserializer::new(m))?;
                Ok(OpDto::Parts(OpName {
                    namespace: p.namespace,
                    name: p.name,
                    overload: p.overload,
                }))
            }
        }
        d.deserialize_any(V)
    }
}

impl JsonSchema for OpDto {
    fn schema_name() -> Cow<'static, str> {
        "Op".into()
    }

    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        json_schema!({
            "description": "An operator: `\"namespace.name.overload\"` (`\"aten.mm.default\"`), `\"namespace.name\"` when the overload was omitted, or the three parts when a part contains a dot.",
            "oneOf": [
                {"type": "string", "pattern": "^[^.]+\\.[^.]+(\\.[^.]+)?$"},
                {
                    "type": "object",
                    "properties": {
                        "namespace": {"type": "string"},
                        "name": {"type": "string"},
                        "overload": {"type": "string", "default": ""}
                    },
                    "required": ["namespace", "name"],
                    "additionalProperties": false
                }
            ]
        })
    }
}

/// An argument; values are referenced by name.
#[derive(Debug, Clone)]
enum ArgDto {
    None,
    Bool(bool),
    Int(i64),
    Float(f64),
    Str(String),
    Value(String),
    List(Vec<ArgDto>),
    Dtype(DType),
    Device(String),
    Layout(String),
    MemoryFormat(String),
    Op(OpDto),
}

fn single<S: Serializer, T: Serialize + ?Sized>(
    s: S,
    key: &str,
    value: &T,
) -> Result<S::Ok, S::Error> {
    let mut m = s.serialize_map(Some(1))?;
    m.serialize_entry(key, value)?;
    m.end()
}

impl Serialize for ArgDto {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            ArgDto::None => s.serialize_unit(),
            ArgDto::Bool(b) => s.serialize_bool(*b),
            ArgDto::Int(i) => s.serialize_i64(*i),
            ArgDto::Float(f) if f.is_finite() => s.serialize_f64(*f),
            ArgDto::Float(f) => {
                let name = if f.is_nan() {
                    "nan"
                } else if *f > 0.0 {
                    "inf"
                } else {
                    "-inf"
                };
                single(s, "float", &name)
            }
            ArgDto::Str(x) => s.serialize_str(x),
            ArgDto::Value(v) => single(s, "value", v),
            ArgDto::List(v) => {
                let mut seq = s.serialize_seq(Some(v.len()))?;
                for a in v {
                    seq.serialize_element(a)?;
                }
                seq.end()
            }
            ArgDto::Dtype(d) => single(s, "dtype", d.short_name()),
            ArgDto::Device(d) => single(s, "device", d),
            ArgDto::Layout(l) => single(s, "layout", l),
            ArgDto::MemoryFormat(m) => single(s, "memory_format", m),
            ArgDto::Op(o) => single(s, "op", o),
        }
    }
}

impl<'de> Deserialize<'de> for ArgDto {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = ArgDto;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str(
                    "an argument: null, a bool, a number, a string, a list, or an object with one \
                     of the keys value, float, dtype, device, layout, memory_format, op",
                )
            }
            fn visit_unit<E: de::Error>(self) -> Result<ArgDto, E> {
                Ok(ArgDto::None)
            }
            fn visit_none<E: de::Error>(self) -> Result<ArgDto, E> {
                Ok(ArgDto::None)
            }
            fn visit_bool<E: de::Error>(self, v: bool) -> Result<ArgDto, E> {
                Ok(ArgDto::Bool(v))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<ArgDto, E> {
                Ok(ArgDto::Int(v))
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<ArgDto, E> {
                i64::try_from(v).map(ArgDto::Int).map_err(|_| {
                    E::custom(format!(
                        "integer {v} is out of range, expected a 64-bit signed integer"
                    ))
                })
            }
            fn visit_f64<E: de::Error>(self, v: f64) -> Result<ArgDto, E> {
                Ok(ArgDto::Float(v))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<ArgDto, E> {
                Ok(ArgDto::Str(v.to_string()))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<ArgDto, A::Error> {
                let mut v = Vec::new();
                while let Some(a) = seq.next_element()? {
                    v.push(a);
                }
                Ok(ArgDto::List(v))
            }
            fn visit_map<A: MapAccess<'de>>(self, mut m: A) -> Result<ArgDto, A::Error> {
                let Some(key) = m.next_key::<String>()? else {
                    return Err(de::Error::custom(
                        "expected an object with one key (value, float, dtype, device, layout, memory_format or op), found an empty object",
                    ));
                };
                let arg = match key.as_str() {
                    "value" => ArgDto::Value(m.next_value()?),
                    "float" => {
                        let s: String = m.next_value()?;
                        ArgDto::Float(match s.as_str() {
                            "inf" => f64::INFINITY,
                            "-inf" => f64::NEG_INFINITY,
                            "nan" => f64::NAN,
                            _ => {
                                return Err(de::Error::custom(format!(
                                    "expected \"inf\", \"-inf\" or \"nan\" in a float object, found \"{s}\" (finite floats are plain numbers)"
                                )))
                            }
                        })
                    }
                    "dtype" => ArgDto::Dtype(m.next_value::<DTypeDto>()?.0),
                    "device" => ArgDto::Device(m.next_value()?),
                    "layout" => ArgDto::Layout(m.next_value()?),
                    "memory_format" => ArgDto::MemoryFormat(m.next_value()?),
                    "op" => ArgDto::Op(m.next_value()?),
                    other => {
                        return Err(de::Error::custom(format!(
                            "unknown argument key `{other}`, expected one of value, float, dtype, device, layout, memory_format, op"
                        )))
                    }
                };
                if let Some(extra) = m.next_key::<String>()? {
                    return Err(de::Error::custom(format!(
                        "unexpected key `{extra}`: an argument object has exactly one key"
                    )));
                }
                Ok(arg)
            }
        }
        d.deserialize_any(V)
    }
}

impl JsonSchema for ArgDto {
    fn schema_name() -> Cow<'static, str> {
        "Arg".into()
    }

    fn json_schema(g: &mut SchemaGenerator) -> Schema {
        let one = |key: &str, value: serde_json::Value, desc: &str| {
            serde_json::json!({
                "description": desc,
                "type": "object",
                "properties": {key: value},
                "required": [key],
                "additionalProperties": false
            })
        };
        let arg = g.subschema_for::<ArgDto>();
        let dtype = g.subschema_for::<DTypeDto>();
        let op = g.subschema_for::<OpDto>();
        json_schema!({
            "description": "An operator argument. Plain JSON scalars are literals (null is Python None, integers and floats are told apart by the decimal point or exponent, strings are string literals); arrays are lists or tuples; one-key objects carry the other kinds.",
            "anyOf": [
                {"type": "null"},
                {"type": "boolean"},
                {"type": "integer", "minimum": i64::MIN, "maximum": i64::MAX},
                {"type": "number", "description": "A finite float; written with a decimal point or an exponent."},
                {"type": "string"},
                {"type": "array", "items": arg},
                one("value", serde_json::json!({"type": "string"}), "A value of the graph, by output name."),
                one("float", serde_json::json!({"enum": ["inf", "-inf", "nan"]}), "A non-finite float."),
                one("dtype", serde_json::to_value(dtype).unwrap(), "A dtype such as torch.float16."),
                one("device", serde_json::json!({"type": "string"}), "A device such as \"cuda:0\" or \"cpu\"."),
                one("layout", serde_json::json!({"type": "string"}), "A layout such as \"strided\"."),
                one("memory_format", serde_json::json!({"type": "string"}), "A memory format such as \"contiguous_format\"."),
                one("op", serde_json::to_value(op).unwrap(), "An operator passed as an argument.")
            ]
        })
    }
}

/// Keyword arguments: a JSON object whose member order is the argument order.
struct KwargsDto(Vec<(String, ArgDto)>);

impl Serialize for KwargsDto {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut m = s.serialize_map(Some(self.0.len()))?;
        for (k, v) in &self.0 {
            m.serialize_entry(k, v)?;
        }
        m.end()
    }
}

impl<'de> Deserialize<'de> for KwargsDto {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = KwargsDto;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("an object of keyword arguments")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut m: A) -> Result<KwargsDto, A::Error> {
                let mut v: Vec<(String, ArgDto)> = Vec::new();
                while let Some(k) = m.next_key::<String>()? {
                    if v.iter().any(|(k2, _)| *k2 == k) {
                        return Err(de::Error::custom(format!(
                            "keyword argument `{k}` is given twice"
                        )));
                    }
                    let a = m.next_value()?;
                    v.push((k, a));
                }
                Ok(KwargsDto(v))
            }
        }
        d.deserialize_map(V)
    }
}

impl JsonSchema for KwargsDto {
    fn schema_name() -> Cow<'static, str> {
        "Kwargs".into()
    }

    fn json_schema(g: &mut SchemaGenerator) -> Schema {
        let arg = g.subschema_for::<ArgDto>();
        json_schema!({
            "description": "Keyword arguments by name; member order is argument order.",
            "type": "object",
            "additionalProperties": arg
        })
    }
}

fn type_dto(t: &TensorType) -> TypeDto {
    TypeDto {
        dtype: DTypeDto(t.dtype),
        shape: t
            .shape
            .iter()
            .map(|d| match d {
                Dim::Known(n) => DimDto::Known(*n),
                Dim::Sym(s) => DimDto::Sym(s.clone()),
            })
            .collect(),
    }
}

fn arg_dto(g: &Graph, a: &Arg) -> ArgDto {
    match a {
        Arg::None => ArgDto::None,
        Arg::Bool(b) => ArgDto::Bool(*b),
        Arg::Int(i) => ArgDto::Int(*i),
        Arg::Float(f) => ArgDto::Float(*f),
        Arg::Str(s) => ArgDto::Str(s.clone()),
        Arg::Value(v) => ArgDto::Value(value_name(g, *v)),
        Arg::List(v) => ArgDto::List(v.iter().map(|a| arg_dto(g, a)).collect()),
        Arg::Dtype(d) => ArgDto::Dtype(*d),
        Arg::Device(d) => ArgDto::Device(d.clone()),
        Arg::Layout(l) => ArgDto::Layout(l.clone()),
        Arg::MemoryFormat(m) => ArgDto::MemoryFormat(m.clone()),
        Arg::Op(o) => ArgDto::Op(OpDto::from_op(o)),
    }
}

/// The name of a value, or a marker naming the dangling reference (never produced by a
/// structurally valid graph; kept printable so that `to_json` never panics).
fn value_name(g: &Graph, v: ValueId) -> String {
    g.nodes
        .get(v.node)
        .and_then(|n| n.outputs.get(v.output))
        .map(|o| o.name.clone())
        .unwrap_or_else(|| format!("<missing value {}:{}>", v.node, v.output))
}

/// Writes a graph as pretty, deterministic JSON (the same graph always gives the same bytes).
pub fn to_json(g: &Graph) -> String {
    let dto = GraphDto {
        format: FORMAT.to_string(),
        version: VERSION,
        name: g.name.clone(),
        path: g.path.as_ref().map(|p| p.to_string_lossy().into_owned()),
        inputs: g.inputs.iter().map(|v| value_name(g, *v)).collect(),
        outputs: g
            .outputs
            .iter()
            .map(|o| o.map(|v| value_name(g, v)))
            .collect(),
        nodes: g
            .nodes
            .iter()
            .map(|n| {
                let mut d = NodeDto {
                    name: n.name.clone(),
                    kind: KindDto::Input,
                    attr: None,
                    op: None,
                    args: None,
                    kwargs: None,
                    outputs: n
                        .outputs
                        .iter()
                        .map(|o| OutputDto {
                            name: o.name.clone(),
                            ty: o.ty.as_ref().map(type_dto),
                        })
                        .collect(),
                    loc: n.loc.as_ref().map(|l| LocDto {
                        file: l.file.clone(),
                        line: l.line,
                        function: l.function.clone(),
                        code: l.code.clone(),
                    }),
                    line: n.line,
                };
                match &n.kind {
                    NodeKind::Input => {}
                    NodeKind::Constant { attr } => {
                        d.kind = KindDto::Constant;
                        d.attr = Some(attr.clone());
                    }
                    NodeKind::Call { op, args, kwargs } => {
                        d.kind = KindDto::Call;
                        d.op = Some(OpDto::from_op(op));
                        d.args = Some(args.iter().map(|a| arg_dto(g, a)).collect());
                        if !kwargs.is_empty() {
                            d.kwargs = Some(KwargsDto(
                                kwargs
                                    .iter()
                                    .map(|(k, a)| (k.clone(), arg_dto(g, a)))
                                    .collect(),
                            ));
                        }
                    }
                }
                d
            })
            .collect(),
    };
    // Serializing these DTOs cannot fail: every map key is a string.
    let compact = serde_json::to_string(&dto).expect("graph DTOs serialize");
    match tree::parse(&compact) {
        Some(t) => tree::pretty(&t),
        None => compact + "\n",
    }
}

/// Resolves names while reading a graph, reporting errors at the node they concern.
struct Reader<'a> {
    text: &'a str,
    file: &'a Path,
}

impl Reader<'_> {
    /// An error located at `nodes[i]` (at its member `key` when given), or at the top-level
    /// member `key` when `node` is `None`.
    fn error(
        &self,
        node: Option<usize>,
        key: Option<&str>,
        message: String,
        hint: &str,
    ) -> SourceError {
        // Positions are only needed for errors, so the text is re-scanned only then.
        let root = tree::parse(self.text);
        let off = root.as_ref().and_then(|r| {
            let base = match node {
                Some(i) => r.get("nodes")?.at(i)?,
                None => r,
            };
            Some(match key.and_then(|k| base.get_entry(k)) {
                Some((koff, _)) => koff,
                None => base.start,
            })
        });
        let span = off
            .map(|o| tree::span_at(self.text, o))
            .unwrap_or(Span::new(1, 1));
        SourceError::new(self.file, Some(span), message).with_hint(hint)
    }
}

/// Reads a JSON graph. Syntax and shape errors carry serde_json's line and column; semantic
/// errors (an unknown value name, a node kind without its operator, ...) point at the node.
pub fn from_json(text: &str, file: &Path) -> Result<Graph, SourceError> {
    read_json(text, file).map_err(crate::shorten_quotes)
}

/// serde's "unknown field `NAME`, expected ..." with `NAME` (the input's text, which may itself
/// hold backticks) cut to a short excerpt without backticks.
fn shorten_serde_name(msg: &str) -> String {
    let Some(open) = msg.find('`') else {
        return msg.to_string();
    };
    let rest = &msg[open + 1..];
    let close = rest.find("`, expected").or_else(|| rest.rfind('`'));
    match close {
        Some(close) => format!(
            "{}`{}`{}",
            &msg[..open],
            crate::excerpt(&rest[..close].replace('`', "'")),
            &rest[close + 1..]
        ),
        None => msg.to_string(),
    }
}

fn read_json(text: &str, file: &Path) -> Result<Graph, SourceError> {
    let dto: GraphDto = serde_json::from_str(text).map_err(|e| {
        let span = (e.line() > 0).then(|| Span::new(e.line(), e.column().max(1)));
        let msg = e.to_string();
        // serde_json appends " at line L column C"; the span already says it.
        let msg = msg.split(" at line ").next().unwrap_or(&msg).to_string();
        let msg = shorten_serde_name(&msg);
        SourceError::new(file, span, format!("invalid JSON graph: {msg}")).with_hint(
            "the JSON graph format is described in docs/formats/graph-json.md (schema: \
             docs/formats/graph.schema.json)",
        )
    })?;
    let r = Reader { text, file };
    if dto.format != FORMAT {
        return Err(r.error(
            None,
            Some("format"),
            format!(
                "expected \"format\": \"{FORMAT}\", found \"{}\"",
                crate::excerpt(&dto.format)
            ),
            "this file is not a shardproof graph",
        ));
    }
    if dto.version != VERSION {
        return Err(r.error(
            None,
            Some("version"),
            format!("unsupported format version {}: expected {VERSION}", dto.version),
            "this build of shardproof reads version 1 graphs; upgrade shardproof or re-export the graph",
        ));
    }
    let mut g = Graph {
        name: dto.name,
        path: dto.path.map(PathBuf::from),
        ..Default::default()
    };
    let mut names: HashMap<String, ValueId> = HashMap::new();
    for (i, n) in dto.nodes.into_iter().enumerate() {
        let kind = match n.kind {
            KindDto::Input | KindDto::Constant => {
                for (key, present) in [
                    ("op", n.op.is_some()),
                    ("args", n.args.is_some()),
                    ("kwargs", n.kwargs.is_some()),
                ] {
                    if present {
                        return Err(r.error(
                            Some(i),
                            Some(key),
                            format!("node `{}` is not a call, expected no `{key}`", n.name),
                            "only nodes of kind \"call\" have an operator and arguments",
                        ));
                    }
                }
                if n.kind == KindDto::Input {
                    if n.attr.is_some() {
                        return Err(r.error(
                            Some(i),
                            Some("attr"),
                            format!("input node `{}` expected no `attr`", n.name),
                            "`attr` belongs to nodes of kind \"constant\"",
                        ));
                    }
                    NodeKind::Input
                } else {
                    let Some(attr) = n.attr else {
                        return Err(r.error(
                            Some(i),
                            None,
                            format!("constant node `{}` expected an `attr`", n.name),
                            "constant nodes name the module attribute holding the value: \"attr\": \"_tensor_constant0\"",
                        ));
                    };
                    NodeKind::Constant { attr }
                }
            }
            KindDto::Call => {
                if n.attr.is_some() {
                    return Err(r.error(
                        Some(i),
                        Some("attr"),
                        format!("call node `{}` expected no `attr`", n.name),
                        "`attr` belongs to nodes of kind \"constant\"",
                    ));
                }
                let Some(op) = n.op else {
                    return Err(r.error(
                        Some(i),
                        None,
                        format!("call node `{}` expected an `op`", n.name),
                        "call nodes name their operator: \"op\": \"aten.mm.default\"",
                    ));
                };
                let op = op.to_op().map_err(|m| {
                    r.error(
                        Some(i),
                        Some("op"),
                        m,
                        "operators look like \"aten.mm.default\"",
                    )
                })?;
                let resolve_all = |args: &[ArgDto]| -> Result<Vec<Arg>, SourceError> {
                    args.iter()
                        .map(|a| {
                            resolve(a, &names).map_err(|m| r.error(Some(i), Some("args"), m, ""))
                        })
                        .collect()
                };
                let args = resolve_all(n.args.as_deref().unwrap_or_default())
                    .map_err(|e| unknown_hint(e, &n.name))?;
                let mut kwargs = Vec::new();
                for (k, a) in n.kwargs.map(|k| k.0).unwrap_or_default() {
                    let a = resolve(&a, &names).map_err(|m| {
                        unknown_hint(r.error(Some(i), Some("kwargs"), m, ""), &n.name)
                    })?;
                    kwargs.push((k, a));
                }
                NodeKind::Call { op, args, kwargs }
            }
        };
        let mut outputs = Vec::new();
        for (o, out) in n.outputs.into_iter().enumerate() {
            if names.insert(out.name.clone(), ValueId::new(i, o)).is_some() {
                return Err(r.error(
                    Some(i),
                    Some("outputs"),
                    format!("value name `{}` is defined twice", out.name),
                    "value names are unique in a graph",
                ));
            }
            let ty = out.ty.map(|t| TensorType {
                dtype: t.dtype.0,
                shape: t
                    .shape
                    .into_iter()
                    .map(|d| match d {
                        DimDto::Known(k) => Dim::Known(k),
                        DimDto::Sym(s) => Dim::Sym(s),
                    })
                    .collect(),
            });
            outputs.push(Output { name: out.name, ty });
        }
        let loc = n.loc.map(|l| SourceLoc {
            file: l.file,
            line: l.line,
            function: l.function,
            code: l.code,
        });
        g.nodes.push(Node {
            name: n.name,
            kind,
            outputs,
            loc,
            line: n.line,
        });
    }
    for name in &dto.inputs {
        let v = lookup_top(&r, &names, name, "inputs")?;
        if g.nodes[v.node].kind != NodeKind::Input {
            return Err(r.error(
                None,
                Some("inputs"),
                format!("graph input `{name}` is not the output of an input node"),
                "list in `inputs` only values of nodes of kind \"input\"",
            ));
        }
        g.inputs.push(v);
    }
    for name in &dto.outputs {
        g.outputs.push(match name {
            Some(n) => Some(lookup_top(&r, &names, n, "outputs")?),
            None => None,
        });
    }
    Ok(g)
}

/// The hint for an argument that failed to resolve: a value name, or an operator argument.
fn unknown_hint(mut e: SourceError, node: &str) -> SourceError {
    e.hint = Some(if e.message.starts_with("unknown value") {
        format!(
            "arguments of `{node}` may only name values of nodes listed before it (the graph is \
             in topological order); check for a typo"
        )
    } else {
        "operators look like \"aten.mm.default\"".to_string()
    });
    e
}

fn lookup_top(
    r: &Reader<'_>,
    names: &HashMap<String, ValueId>,
    name: &str,
    key: &str,
) -> Result<ValueId, SourceError> {
    names.get(name).copied().ok_or_else(|| {
        r.error(
            None,
            Some(key),
            format!("unknown value `{name}` in `{key}`: expected the name of a node output"),
            "graph inputs and outputs name values defined in `nodes`",
        )
    })
}

fn resolve(a: &ArgDto, names: &HashMap<String, ValueId>) -> Result<Arg, String> {
    Ok(match a {
        ArgDto::None => Arg::None,
        ArgDto::Bool(b) => Arg::Bool(*b),
        ArgDto::Int(i) => Arg::Int(*i),
        ArgDto::Float(f) => Arg::Float(*f),
        ArgDto::Str(s) => Arg::Str(s.clone()),
        ArgDto::Value(v) => Arg::Value(*names.get(v).ok_or_else(|| {
            format!("unknown value `{v}`: expected the name of an output of an earlier node")
        })?),
        ArgDto::List(v) => Arg::List(
            v.iter()
                .map(|a| resolve(a, names))
                .collect::<Result<_, _>>()?,
        ),
        ArgDto::Dtype(d) => Arg::Dtype(*d),
        ArgDto::Device(d) => Arg::Device(d.clone()),
        ArgDto::Layout(l) => Arg::Layout(l.clone()),
        ArgDto::MemoryFormat(m) => Arg::MemoryFormat(m.clone()),
        ArgDto::Op(o) => Arg::Op(o.to_op()?),
    })
}

/// The JSON Schema of the format (draft 2020-12), as committed in
/// `docs/formats/graph.schema.json`.
pub fn json_schema() -> String {
    let schema = schemars::generate::SchemaSettings::draft2020_12()
        .into_generator()
        .into_root_schema_for::<GraphDto>();
    let mut s = serde_json::to_string_pretty(&schema).expect("schemas serialize");
    s.push('\n');
    s
}
