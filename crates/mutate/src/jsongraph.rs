//! The JSON graph format (docs/formats/graph-json.md): a reader into [`GraphView`] and a writer
//! of [`Edit`]s. JSON is read into an order-preserving tree of our own, because keyword
//! arguments' member order is their argument order and `serde_json::Value` would sort them.

use std::path::Path;

use crate::graph::{python_float, Arg, Edit, GraphView, Node, Slot, TensorType};
use crate::MutateError;

#[derive(Debug, Clone, PartialEq)]
enum J {
    Null,
    Bool(bool),
    /// A number, kept as written.
    Num(String),
    Str(String),
    Arr(Vec<J>),
    Obj(Vec<(String, J)>),
}

impl J {
    fn get(&self, key: &str) -> Option<&J> {
        match self {
            J::Obj(m) => m.iter().find(|(k, _)| k == key).map(|(_, v)| v),
            _ => None,
        }
    }
    fn get_mut(&mut self, key: &str) -> Option<&mut J> {
        match self {
            J::Obj(m) => m.iter_mut().find(|(k, _)| k == key).map(|(_, v)| v),
            _ => None,
        }
    }
    fn str(&self) -> Option<&str> {
        match self {
            J::Str(s) => Some(s),
            _ => None,
        }
    }
}

struct Parser<'a> {
    s: &'a [u8],
    text: &'a str,
    pos: usize,
}

impl Parser<'_> {
    fn line(&self) -> usize {
        self.text[..self.pos.min(self.text.len())]
            .matches('\n')
            .count()
            + 1
    }
    fn ws(&mut self) {
        while self.pos < self.s.len() && self.s[self.pos].is_ascii_whitespace() {
            self.pos += 1;
        }
    }
    fn value(&mut self) -> Result<J, String> {
        self.ws();
        let Some(&c) = self.s.get(self.pos) else {
            return Err("unexpected end of the file".into());
        };
        match c {
            b'{' => {
                self.pos += 1;
                let mut members = Vec::new();
                loop {
                    self.ws();
                    if self.s.get(self.pos) == Some(&b'}') {
                        self.pos += 1;
                        return Ok(J::Obj(members));
                    }
                    let J::Str(k) = self.value()? else {
                        return Err("an object key must be a string".into());
                    };
                    self.ws();
                    if self.s.get(self.pos) != Some(&b':') {
                        return Err(format!("expected `:` after key \"{k}\""));
                    }
                    self.pos += 1;
                    let v = self.value()?;
                    members.push((k, v));
                    self.ws();
                    match self.s.get(self.pos) {
                        Some(b',') => self.pos += 1,
                        Some(b'}') => {}
                        _ => return Err("expected `,` or `}` in an object".into()),
                    }
                }
            }
            b'[' => {
                self.pos += 1;
                let mut items = Vec::new();
                loop {
                    self.ws();
                    if self.s.get(self.pos) == Some(&b']') {
                        self.pos += 1;
                        return Ok(J::Arr(items));
                    }
                    items.push(self.value()?);
                    self.ws();
                    match self.s.get(self.pos) {
                        Some(b',') => self.pos += 1,
                        Some(b']') => {}
                        _ => return Err("expected `,` or `]` in an array".into()),
                    }
                }
            }
            b'"' => {
                let start = self.pos;
                self.pos += 1;
                while self.pos < self.s.len() && self.s[self.pos] != b'"' {
                    if self.s[self.pos] == b'\\' {
                        self.pos += 1;
                    }
                    self.pos += 1;
                }
                self.pos += 1;
                let raw = self
                    .text
                    .get(start..self.pos.min(self.text.len()))
                    .ok_or("unterminated string")?;
                serde_json::from_str::<String>(raw)
                    .map(J::Str)
                    .map_err(|e| format!("bad string: {e}"))
            }
            _ => {
                let start = self.pos;
                while self.pos < self.s.len()
                    && !matches!(self.s[self.pos], b',' | b']' | b'}')
                    && !self.s[self.pos].is_ascii_whitespace()
                {
                    self.pos += 1;
                }
                match &self.text[start..self.pos] {
                    "null" => Ok(J::Null),
                    "true" => Ok(J::Bool(true)),
                    "false" => Ok(J::Bool(false)),
                    n if n.parse::<f64>().is_ok() => Ok(J::Num(n.to_string())),
                    other => Err(format!("unexpected `{other}`")),
                }
            }
        }
    }
}

fn write(j: &J, indent: usize, out: &mut String) {
    match j {
        J::Null => out.push_str("null"),
        J::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        J::Num(n) => out.push_str(n),
        J::Str(s) => out.push_str(&serde_json::to_string(s).unwrap_or_else(|_| "\"\"".into())),
        J::Arr(items) if items.is_empty() => out.push_str("[]"),
        J::Obj(m) if m.is_empty() => out.push_str("{}"),
        J::Arr(items) => {
            // Scalars and small values on one line; nodes (objects) spread out.
            let flat = items.iter().all(|i| !matches!(i, J::Obj(m) if m.len() > 3));
            if flat {
                out.push('[');
                for (k, i) in items.iter().enumerate() {
                    if k > 0 {
                        out.push_str(", ");
                    }
                    write(i, indent, out);
                }
                out.push(']');
            } else {
                out.push_str("[\n");
                for (k, i) in items.iter().enumerate() {
                    out.push_str(&"  ".repeat(indent + 1));
                    write(i, indent + 1, out);
                    out.push_str(if k + 1 < items.len() { ",\n" } else { "\n" });
                }
                out.push_str(&"  ".repeat(indent));
                out.push(']');
            }
        }
        J::Obj(m) => {
            if m.len() <= 3 && m.iter().all(|(_, v)| !matches!(v, J::Arr(_) | J::Obj(_))) {
                out.push('{');
                for (k, (key, v)) in m.iter().enumerate() {
                    if k > 0 {
                        out.push_str(", ");
                    }
                    write(&J::Str(key.clone()), indent, out);
                    out.push_str(": ");
                    write(v, indent, out);
                }
                out.push('}');
                return;
            }
            out.push_str("{\n");
            for (k, (key, v)) in m.iter().enumerate() {
                out.push_str(&"  ".repeat(indent + 1));
                write(&J::Str(key.clone()), indent, out);
                out.push_str(": ");
                write(v, indent + 1, out);
                out.push_str(if k + 1 < m.len() { ",\n" } else { "\n" });
            }
            out.push_str(&"  ".repeat(indent));
            out.push('}');
        }
    }
}

fn to_arg(j: &J) -> Arg {
    match j {
        J::Null => Arg::None,
        J::Bool(b) => Arg::Bool(*b),
        J::Num(n) if !n.contains(['.', 'e', 'E']) => n
            .parse()
            .map(Arg::Int)
            .unwrap_or_else(|_| Arg::Other(n.clone())),
        J::Num(n) => n
            .parse()
            .map(Arg::Float)
            .unwrap_or_else(|_| Arg::Other(n.clone())),
        J::Str(s) => Arg::Str(s.clone()),
        J::Arr(items) => Arg::List(items.iter().map(to_arg).collect()),
        J::Obj(_) => {
            if let Some(v) = j.get("value").and_then(J::str) {
                return Arg::Value(v.to_string());
            }
            if let Some(f) = j.get("float").and_then(J::str) {
                return match f {
                    "inf" => Arg::Float(f64::INFINITY),
                    "-inf" => Arg::Float(f64::NEG_INFINITY),
                    _ => Arg::Float(f64::NAN),
                };
            }
            let mut s = String::new();
            write(j, 0, &mut s);
            Arg::Other(s)
        }
    }
}

fn from_arg(a: &Arg) -> J {
    match a {
        Arg::None => J::Null,
        Arg::Bool(b) => J::Bool(*b),
        Arg::Int(i) => J::Num(i.to_string()),
        Arg::Float(f) if f.is_finite() => J::Num(python_float(*f)),
        Arg::Float(f) => J::Obj(vec![("float".into(), J::Str(python_float(*f)))]),
        Arg::Str(s) => J::Str(s.clone()),
        Arg::Value(v) => J::Obj(vec![("value".into(), J::Str(v.clone()))]),
        Arg::List(items) => J::Arr(items.iter().map(from_arg).collect()),
        Arg::Other(o) => {
            let mut p = Parser {
                s: o.as_bytes(),
                text: o,
                pos: 0,
            };
            p.value().unwrap_or(J::Null)
        }
    }
}

fn ty_of(j: &J) -> Option<TensorType> {
    let dtype = j.get("dtype")?.str()?.to_string();
    let J::Arr(shape) = j.get("shape")? else {
        return None;
    };
    let dims = shape
        .iter()
        .map(|d| {
            if let J::Num(n) = d {
                n.parse().ok()
            } else {
                None
            }
        })
        .collect();
    Some(TensorType { dtype, dims })
}

fn ty_to_j(t: &TensorType) -> J {
    let dims = t
        .dims
        .iter()
        .map(|d| d.map_or(J::Str("?".into()), |d| J::Num(d.to_string())))
        .collect();
    J::Obj(vec![
        ("dtype".into(), J::Str(t.dtype.clone())),
        ("shape".into(), J::Arr(dims)),
    ])
}

fn op_text(j: &J) -> String {
    match j {
        J::Str(s) => s.clone(),
        _ => ["namespace", "name", "overload"]
            .iter()
            .filter_map(|k| j.get(k).and_then(J::str))
            .collect::<Vec<_>>()
            .join("."),
    }
}

/// A JSON graph read for mutation.
pub(crate) struct JsonGraph {
    root: J,
    pub view: GraphView,
}

impl JsonGraph {
    pub fn parse(text: &str, path: &Path) -> Result<JsonGraph, MutateError> {
        let mut p = Parser {
            s: text.as_bytes(),
            text,
            pos: 0,
        };
        let root = p.value().map_err(|m| {
            MutateError::new(
                path,
                p.line(),
                m,
                "the mutator reads JSON graphs as docs/formats/graph-json.md describes them",
            )
        })?;
        let Some(J::Arr(nodes)) = root.get("nodes") else {
            return Err(MutateError::new(
                path,
                1,
                "no `nodes` array".into(),
                "a JSON graph has `format`, `version`, `inputs`, `outputs` and `nodes`",
            ));
        };
        let mut view_nodes = Vec::new();
        let mut search_from = 0;
        for n in nodes {
            let name = n.get("name").and_then(J::str).unwrap_or("").to_string();
            // The node's line: where its name first appears after the previous node's.
            let needle = format!(
                "\"name\": {}",
                serde_json::to_string(&name).unwrap_or_default()
            );
            let line = match text[search_from..].find(&needle) {
                Some(off) => {
                    search_from += off + needle.len();
                    text[..search_from].matches('\n').count() + 1
                }
                None => 0,
            };
            let ty = match n.get("outputs") {
                Some(J::Arr(outs)) => outs.first().and_then(|o| o.get("type")).and_then(ty_of),
                _ => None,
            };
            let kind = n.get("kind").and_then(J::str).unwrap_or("");
            let args = match n.get("args") {
                Some(J::Arr(a)) => a.iter().map(to_arg).collect(),
                _ => Vec::new(),
            };
            let kwargs = match n.get("kwargs") {
                Some(J::Obj(m)) => m.iter().map(|(k, v)| (k.clone(), to_arg(v))).collect(),
                _ => Vec::new(),
            };
            view_nodes.push(Node {
                name,
                line,
                op: if kind == "call" {
                    n.get("op").map(op_text).unwrap_or_default()
                } else {
                    String::new()
                },
                args,
                kwargs,
                ty,
                is_input: kind == "input",
            });
        }
        Ok(JsonGraph {
            root,
            view: GraphView::new(view_nodes),
        })
    }

    pub fn apply(&self, edits: &[Edit]) -> String {
        let mut root = self.root.clone();
        let Some(J::Arr(nodes)) = root.get_mut("nodes") else {
            return String::new();
        };
        let mut slots: Vec<Option<J>> = nodes.drain(..).map(Some).collect();
        let mut before: Vec<Vec<J>> = vec![Vec::new(); slots.len()];
        let mut rewires: Vec<(usize, String, String)> = Vec::new();
        for edit in edits {
            match edit {
                Edit::SetArg { node, slot, arg } => {
                    let Some(Some(n)) = slots.get_mut(*node) else {
                        continue;
                    };
                    let target = match slot {
                        Slot::Pos(p) => match n.get_mut("args") {
                            Some(J::Arr(a)) => a.get_mut(*p),
                            _ => None,
                        },
                        Slot::Kw(k) => n.get_mut("kwargs").and_then(|m| m.get_mut(k)),
                    };
                    if let Some(t) = target {
                        *t = from_arg(arg);
                    }
                }
                Edit::Replace { node, op, args } => {
                    let Some(Some(J::Obj(m))) = slots.get_mut(*node) else {
                        continue;
                    };
                    m.retain(|(k, _)| k != "kwargs");
                    for (k, v) in m.iter_mut() {
                        match k.as_str() {
                            "op" => *v = J::Str(op.clone()),
                            "args" => *v = J::Arr(args.iter().map(from_arg).collect()),
                            _ => {}
                        }
                    }
                }
                Edit::Remove { node, rewire_to } => {
                    if let Some(s) = slots.get_mut(*node) {
                        *s = None;
                        rewires.push((
                            *node,
                            self.view.nodes[*node].name.clone(),
                            rewire_to.clone(),
                        ));
                    }
                }
                Edit::InsertBefore {
                    node,
                    name,
                    ty,
                    op,
                    args,
                } => {
                    if let Some(b) = before.get_mut(*node) {
                        b.push(J::Obj(vec![
                            ("name".into(), J::Str(name.clone())),
                            ("kind".into(), J::Str("call".into())),
                            ("op".into(), J::Str(op.clone())),
                            ("args".into(), J::Arr(args.iter().map(from_arg).collect())),
                            (
                                "outputs".into(),
                                J::Arr(vec![J::Obj(vec![
                                    ("name".into(), J::Str(name.clone())),
                                    ("type".into(), ty_to_j(ty)),
                                ])]),
                            ),
                        ]));
                    }
                }
            }
        }
        rewires.sort();
        for (after, from, to) in &rewires {
            for n in slots.iter_mut().skip(after + 1).flatten() {
                for key in ["args", "kwargs"] {
                    if let Some(v) = n.get_mut(key) {
                        rewire(v, from, to);
                    }
                }
            }
        }
        let mut new_nodes = Vec::new();
        for (s, b) in slots.into_iter().zip(before) {
            new_nodes.extend(b);
            new_nodes.extend(s);
        }
        if let Some(J::Arr(nodes)) = root.get_mut("nodes") {
            *nodes = new_nodes;
        }
        for (_, from, to) in &rewires {
            if let Some(J::Arr(outs)) = root.get_mut("outputs") {
                for o in outs.iter_mut() {
                    if o.str() == Some(from.as_str()) {
                        *o = J::Str(to.clone());
                    }
                }
            }
        }
        let mut out = String::new();
        write(&root, 0, &mut out);
        out.push('\n');
        out
    }
}

fn rewire(j: &mut J, from: &str, to: &str) {
    match j {
        // A reference `{"value": NAME}`; any other object is searched for references.
        J::Obj(m) if m.len() == 1 && m[0].0 == "value" && m[0].1.str() == Some(from) => {
            m[0].1 = J::Str(to.to_string());
        }
        J::Obj(m) => m.iter_mut().for_each(|(_, v)| rewire(v, from, to)),
        J::Arr(a) => a.iter_mut().for_each(|v| rewire(v, from, to)),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_and_rewrites_a_json_graph() {
        let text = r#"{
  "format": "shardproof-graph",
  "version": 1,
  "name": "g",
  "inputs": ["x"],
  "outputs": ["w"],
  "nodes": [
    {"name": "x", "kind": "input", "outputs": [{"name": "x", "type": {"dtype": "f32", "shape": [4, 4]}}]},
    {"name": "a", "kind": "call", "op": "_c10d_functional.all_reduce.default", "args": [{"value": "x"}, "sum", "tp"], "outputs": [{"name": "a", "type": {"dtype": "f32", "shape": [4, 4]}}]},
    {"name": "w", "kind": "call", "op": "_c10d_functional.wait_tensor.default", "args": [{"value": "a"}], "outputs": [{"name": "w", "type": {"dtype": "f32", "shape": [4, 4]}}]}
  ]
}"#;
        let g = JsonGraph::parse(text, Path::new("g.json")).unwrap();
        assert_eq!(g.view.nodes[1].args[1], Arg::Str("sum".into()));
        assert_eq!(g.view.nodes[2].line, 10);
        let out = g.apply(&[Edit::Remove {
            node: 2,
            rewire_to: "a".into(),
        }]);
        assert!(out.contains("\"outputs\": [\"a\"]"), "{out}");
        assert!(!out.contains("wait_tensor"));
        let out = g.apply(&[Edit::SetArg {
            node: 1,
            slot: Slot::Pos(1),
            arg: Arg::Str("max".into()),
        }]);
        assert!(out.contains("\"max\""));
    }
}
