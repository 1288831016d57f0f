//! torch.fx readable text: a line-level reader into [`GraphView`] and a writer of [`Edit`]s.
//!
//! The reader is deliberately shallow: a node is one line `NAME[: "TYPE"] = RHS`, a call is
//! `torch.ops.NS.OP[.OVERLOAD](ARGS)`. Lines it does not understand are kept verbatim, so a
//! mutant differs from its original only where the edit says.

use std::collections::HashMap;
use std::ops::Range;

use crate::graph::{python_float, Arg, Edit, GraphView, Node, Slot, TensorType};

/// Where a node's pieces lie in its line, so edits touch nothing else.
#[derive(Debug, Clone)]
struct Layout {
    /// 0-based line index.
    line: usize,
    /// Byte range of the text between the call's parentheses (a call), or of the whole
    /// right-hand side up to a `;` (any other assignment).
    args_span: Range<usize>,
    /// Raw text of each positional argument and each keyword argument (`k=v`), in order.
    raw_args: Vec<String>,
    /// How many of `raw_args` are positional.
    positional: usize,
    is_call: bool,
}

/// A torch.fx text graph read for mutation.
pub(crate) struct FxGraph {
    lines: Vec<String>,
    trailing_newline: bool,
    pub view: GraphView,
    /// Layout of each node of `view` (graph inputs have none).
    layouts: Vec<Option<Layout>>,
    /// 0-based index of the `return` line.
    return_line: Option<usize>,
}

impl FxGraph {
    pub fn parse(text: &str) -> FxGraph {
        let lines: Vec<String> = text.lines().map(str::to_string).collect();
        let mut nodes = Vec::new();
        let mut layouts = Vec::new();
        let mut return_line = None;
        for (i, line) in lines.iter().enumerate() {
            let trimmed = line.trim_start();
            if trimmed.starts_with("def forward(") {
                for (name, ty) in signature_params(trimmed) {
                    nodes.push(Node {
                        name,
                        line: i + 1,
                        op: String::new(),
                        args: Vec::new(),
                        kwargs: Vec::new(),
                        ty,
                        is_input: true,
                    });
                    layouts.push(None);
                }
                continue;
            }
            if trimmed.starts_with("return ") || trimmed == "return" {
                return_line = Some(i);
                continue;
            }
            if let Some((node, layout)) = parse_node_line(line, i) {
                nodes.push(node);
                layouts.push(Some(layout));
            }
        }
        FxGraph {
            trailing_newline: text.ends_with('\n'),
            lines,
            view: GraphView::new(nodes),
            layouts,
            return_line,
        }
    }

    /// The text with `edits` applied.
    pub fn apply(&self, edits: &[Edit]) -> String {
        let mut lines: Vec<Option<String>> = self.lines.iter().cloned().map(Some).collect();
        let mut inserted: HashMap<usize, Vec<String>> = HashMap::new();
        let mut rewires: Vec<(usize, String, String)> = Vec::new();
        // Argument edits first (they index the original raw arguments), then whole-line edits.
        let mut new_args: HashMap<usize, Vec<String>> = HashMap::new();
        for edit in edits {
            if let Edit::SetArg { node, slot, arg } = edit {
                let Some(layout) = &self.layouts[*node] else {
                    continue;
                };
                let raw = new_args
                    .entry(*node)
                    .or_insert_with(|| layout.raw_args.clone());
                let n = &self.view.nodes[*node];
                match slot {
                    Slot::Pos(p) if *p < layout.positional => raw[*p] = render(arg),
                    Slot::Kw(k) => {
                        if let Some(j) = n.kwargs.iter().position(|(name, _)| name == k) {
                            raw[layout.positional + j] = format!("{k}={}", render(arg));
                        }
                    }
                    Slot::Pos(_) => {}
                }
            }
        }
        for (node, raw) in &new_args {
            let layout = self.layouts[*node].as_ref().expect("set above");
            let line = lines[layout.line].as_mut().expect("not removed yet");
            line.replace_range(layout.args_span.clone(), &raw.join(", "));
        }
        for edit in edits {
            match edit {
                Edit::SetArg { .. } => {}
                Edit::Replace { node, op, args } => {
                    let Some(layout) = &self.layouts[*node] else {
                        continue;
                    };
                    let n = &self.view.nodes[*node];
                    let ty =
                        n.ty.as_ref()
                            .map(|t| format!(": \"{}\"", t.annotation()))
                            .unwrap_or_default();
                    let indent = indent_of(&self.lines[layout.line]);
                    let rendered: Vec<String> = args.iter().map(render).collect();
                    lines[layout.line] = Some(format!(
                        "{indent}{}{ty} = torch.ops.{op}({})",
                        n.name,
                        rendered.join(", ")
                    ));
                }
                Edit::Remove { node, rewire_to } => {
                    let Some(layout) = &self.layouts[*node] else {
                        continue;
                    };
                    lines[layout.line] = None;
                    rewires.push((
                        layout.line,
                        self.view.nodes[*node].name.clone(),
                        rewire_to.clone(),
                    ));
                }
                Edit::InsertBefore {
                    node,
                    name,
                    ty,
                    op,
                    args,
                } => {
                    let Some(layout) = &self.layouts[*node] else {
                        continue;
                    };
                    let indent = indent_of(&self.lines[layout.line]);
                    let rendered: Vec<String> = args.iter().map(render).collect();
                    inserted.entry(layout.line).or_default().push(format!(
                        "{indent}{name}: \"{}\" = torch.ops.{op}({})",
                        ty.annotation(),
                        rendered.join(", ")
                    ));
                }
            }
        }
        // Rewiring: every later use of a removed value reads its replacement. Chains (a wait
        // removed, then its collective) resolve because each rewire runs over the lines after it.
        rewires.sort();
        for (after, from, to) in &rewires {
            for (idx, layout) in self.layouts.iter().enumerate() {
                let Some(layout) = layout else { continue };
                if layout.line <= *after {
                    continue;
                }
                let _ = idx;
                if let Some(line) = lines[layout.line].as_mut() {
                    // The span may have moved if the arguments were re-rendered: re-find it.
                    let span = current_args_span(line, layout.is_call);
                    let replaced = replace_ident(&line[span.clone()], from, to);
                    line.replace_range(span, &replaced);
                }
            }
            if let Some(r) = self.return_line {
                if r > *after {
                    if let Some(line) = lines[r].as_mut() {
                        *line = replace_ident(line, from, to);
                    }
                }
            }
        }
        let mut out = String::new();
        for (i, line) in lines.iter().enumerate() {
            if let Some(ins) = inserted.get(&i) {
                for l in ins {
                    out.push_str(l);
                    out.push('\n');
                }
            }
            if let Some(line) = line {
                out.push_str(line);
                out.push('\n');
            }
        }
        if !self.trailing_newline {
            out.pop();
        }
        out
    }
}

fn indent_of(line: &str) -> &str {
    &line[..line.len() - line.trim_start().len()]
}

/// `def forward(self, x: "f32[8, 16]", y, ...)`: the parameter names and types, `self` dropped.
fn signature_params(line: &str) -> Vec<(String, Option<TensorType>)> {
    let open = line.find('(').map(|i| i + 1).unwrap_or(0);
    let close = matching_paren(line, open - 1).unwrap_or(line.len());
    split_top_level(&line[open..close])
        .into_iter()
        .filter_map(|(p, _)| {
            let p = p.trim();
            let (name, ty) = match p.split_once(':') {
                Some((n, t)) => (n.trim(), TensorType::parse(t.trim().trim_matches('"'))),
                None => (p, None),
            };
            let name = name.trim_start_matches('*');
            (!name.is_empty() && name != "self").then(|| (name.to_string(), ty))
        })
        .collect()
}

/// Reads `NAME[: "TYPE"] = RHS` into a node. Lines that are not assignments give `None`.
fn parse_node_line(line: &str, index: usize) -> Option<(Node, Layout)> {
    let trimmed = line.trim_start();
    if trimmed.starts_with('#') || trimmed.is_empty() {
        return None;
    }
    let offset = line.len() - trimmed.len();
    let eq = find_assign(trimmed)?;
    let lhs = trimmed[..eq].trim();
    let (name, ty) = match lhs.split_once(':') {
        Some((n, t)) => (n.trim(), TensorType::parse(t.trim().trim_matches('"'))),
        None => (lhs, None),
    };
    if !is_ident(name) {
        return None;
    }
    let rhs_start = offset + eq + 1;
    let rhs = &line[rhs_start..];
    let rhs_trim_start = rhs_start + (rhs.len() - rhs.trim_start().len());
    let rhs_text = &line[rhs_trim_start..];
    if let Some(rest) = rhs_text.strip_prefix("torch.ops.") {
        let open_rel = rest.find('(')?;
        let op = rest[..open_rel].to_string();
        let open = rhs_trim_start + "torch.ops.".len() + open_rel;
        let close = matching_paren(line, open)?;
        let inner = &line[open + 1..close];
        let mut args = Vec::new();
        let mut kwargs = Vec::new();
        let mut raw_args = Vec::new();
        let mut raw_kw = Vec::new();
        for (piece, _) in split_top_level(inner) {
            let piece = piece.trim().to_string();
            if piece.is_empty() {
                continue;
            }
            match keyword_of(&piece) {
                Some((k, v)) => {
                    kwargs.push((k.to_string(), parse_arg(v)));
                    raw_kw.push(piece.clone());
                }
                None => {
                    args.push(parse_arg(&piece));
                    raw_args.push(piece.clone());
                }
            }
        }
        let positional = raw_args.len();
        raw_args.extend(raw_kw);
        let node = Node {
            name: name.to_string(),
            line: index + 1,
            op,
            args,
            kwargs,
            ty,
            is_input: false,
        };
        let layout = Layout {
            line: index,
            args_span: open + 1..close,
            raw_args,
            positional,
            is_call: true,
        };
        return Some((node, layout));
    }
    let end = rhs_text
        .find(';')
        .map(|i| rhs_trim_start + i)
        .unwrap_or(line.len());
    let node = Node {
        name: name.to_string(),
        line: index + 1,
        op: String::new(),
        args: Vec::new(),
        kwargs: Vec::new(),
        ty,
        is_input: false,
    };
    let layout = Layout {
        line: index,
        args_span: rhs_trim_start..end,
        raw_args: Vec::new(),
        positional: 0,
        is_call: false,
    };
    Some((node, layout))
}

/// The span a rewire may touch in a (possibly already edited) node line.
fn current_args_span(line: &str, is_call: bool) -> Range<usize> {
    let Some(eq) = find_assign(line) else {
        return 0..0;
    };
    if is_call {
        if let Some(open) = line[eq..].find('(').map(|i| i + eq) {
            if let Some(close) = matching_paren(line, open) {
                return open + 1..close;
            }
        }
        return 0..0;
    }
    let end = line[eq..].find(';').map(|i| i + eq).unwrap_or(line.len());
    eq + 1..end
}

/// The byte index of the assignment `=` (not `==`, not inside quotes or brackets).
fn find_assign(s: &str) -> Option<usize> {
    let b = s.as_bytes();
    let mut depth = 0i32;
    let mut quote: Option<u8> = None;
    for i in 0..b.len() {
        let c = b[i];
        if let Some(q) = quote {
            if c == q {
                quote = None;
            }
            continue;
        }
        match c {
            b'"' | b'\'' => quote = Some(c),
            b'(' | b'[' | b'{' => depth += 1,
            b')' | b']' | b'}' => depth -= 1,
            b'=' if depth == 0 => {
                let prev = if i > 0 { b[i - 1] } else { b' ' };
                let next = b.get(i + 1).copied().unwrap_or(b' ');
                if next != b'=' && !matches!(prev, b'=' | b'!' | b'<' | b'>') {
                    return Some(i);
                }
            }
            _ => {}
        }
    }
    None
}

fn matching_paren(s: &str, open: usize) -> Option<usize> {
    let b = s.as_bytes();
    let mut depth = 0i32;
    let mut quote: Option<u8> = None;
    for (i, &c) in b.iter().enumerate().skip(open) {
        if let Some(q) = quote {
            if c == q {
                quote = None;
            }
            continue;
        }
        match c {
            b'"' | b'\'' => quote = Some(c),
            b'(' | b'[' | b'{' => depth += 1,
            b')' | b']' | b'}' => {
                depth -= 1;
                if depth == 0 {
                    return Some(i);
                }
            }
            _ => {}
        }
    }
    None
}

/// Splits at top-level commas; returns each piece with its byte offset.
fn split_top_level(s: &str) -> Vec<(&str, usize)> {
    let b = s.as_bytes();
    let mut out = Vec::new();
    let mut depth = 0i32;
    let mut quote: Option<u8> = None;
    let mut start = 0;
    for (i, &c) in b.iter().enumerate() {
        if let Some(q) = quote {
            if c == q {
                quote = None;
            }
            continue;
        }
        match c {
            b'"' | b'\'' => quote = Some(c),
            b'(' | b'[' | b'{' => depth += 1,
            b')' | b']' | b'}' => depth -= 1,
            b',' if depth == 0 => {
                out.push((&s[start..i], start));
                start = i + 1;
            }
            _ => {}
        }
    }
    if !s[start..].trim().is_empty() {
        out.push((&s[start..], start));
    }
    out
}

fn keyword_of(piece: &str) -> Option<(&str, &str)> {
    let eq = find_assign(piece)?;
    let k = piece[..eq].trim();
    is_ident(k).then(|| (k, piece[eq + 1..].trim()))
}

fn is_ident(s: &str) -> bool {
    let mut chars = s.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

fn parse_arg(s: &str) -> Arg {
    let s = s.trim();
    match s {
        "None" => return Arg::None,
        "True" => return Arg::Bool(true),
        "False" => return Arg::Bool(false),
        "inf" => return Arg::Float(f64::INFINITY),
        "-inf" => return Arg::Float(f64::NEG_INFINITY),
        "nan" => return Arg::Float(f64::NAN),
        _ => {}
    }
    if let Ok(i) = s.parse::<i64>() {
        return Arg::Int(i);
    }
    if s.chars()
        .next()
        .is_some_and(|c| c.is_ascii_digit() || c == '-' || c == '.')
    {
        if let Ok(f) = s.parse::<f64>() {
            return Arg::Float(f);
        }
    }
    if s.len() >= 2
        && ((s.starts_with('\'') && s.ends_with('\'')) || (s.starts_with('"') && s.ends_with('"')))
    {
        return Arg::Str(s[1..s.len() - 1].to_string());
    }
    if (s.starts_with('[') && s.ends_with(']')) || (s.starts_with('(') && s.ends_with(')')) {
        let inner = &s[1..s.len() - 1];
        return Arg::List(
            split_top_level(inner)
                .into_iter()
                .map(|(p, _)| parse_arg(p))
                .collect(),
        );
    }
    if is_ident(s) {
        return Arg::Value(s.to_string());
    }
    Arg::Other(s.to_string())
}

/// torch.fx text of an argument.
fn render(arg: &Arg) -> String {
    match arg {
        Arg::None => "None".into(),
        Arg::Bool(b) => if *b { "True" } else { "False" }.into(),
        Arg::Int(i) => i.to_string(),
        Arg::Float(f) => python_float(*f),
        Arg::Str(s) => format!("'{s}'"),
        Arg::Value(v) => v.clone(),
        Arg::List(items) => {
            let parts: Vec<String> = items.iter().map(render).collect();
            format!("[{}]", parts.join(", "))
        }
        Arg::Other(o) => o.clone(),
    }
}

/// Replaces the identifier `from` by `to` outside string literals and attribute accesses.
fn replace_ident(s: &str, from: &str, to: &str) -> String {
    let b = s.as_bytes();
    let mut out = String::with_capacity(s.len());
    let mut i = 0;
    let mut quote: Option<u8> = None;
    while i < b.len() {
        let c = b[i];
        if let Some(q) = quote {
            out.push(c as char);
            if c == q {
                quote = None;
            }
            i += 1;
            continue;
        }
        if c == b'"' || c == b'\'' {
            quote = Some(c);
            out.push(c as char);
            i += 1;
            continue;
        }
        if c.is_ascii_alphabetic() || c == b'_' {
            let start = i;
            while i < b.len() && (b[i].is_ascii_alphanumeric() || b[i] == b'_') {
                i += 1;
            }
            let word = &s[start..i];
            let after_dot = start > 0 && b[start - 1] == b'.';
            if word == from && !after_dot {
                out.push_str(to);
            } else {
                out.push_str(word);
            }
            continue;
        }
        // Keep multi-byte characters intact.
        let ch = s[i..].chars().next().unwrap_or(' ');
        out.push(ch);
        i += ch.len_utf8();
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const G: &str = "class GraphModule(torch.nn.Module):\n    def forward(self, x: \"f32[4, 4]\", w: \"f32[4, 4]\"):\n        mm: \"f32[4, 4]\" = torch.ops.aten.mm.default(x, w)\n        all_reduce: \"f32[4, 4]\" = torch.ops._c10d_functional.all_reduce.default(mm, 'sum', 'tp');  mm = None\n        wait_tensor: \"f32[4, 4]\" = torch.ops._c10d_functional.wait_tensor.default(all_reduce)\n        sub: \"f32[4, 4]\" = torch.ops.aten.sub.Tensor(wait_tensor, x, alpha=2)\n        return (sub,)\n";

    #[test]
    fn parses_nodes_and_inputs() {
        let g = FxGraph::parse(G);
        let names: Vec<&str> = g.view.nodes.iter().map(|n| n.name.as_str()).collect();
        assert_eq!(names, ["x", "w", "mm", "all_reduce", "wait_tensor", "sub"]);
        let ar = g.view.node("all_reduce").unwrap();
        assert_eq!(ar.op, "_c10d_functional.all_reduce.default");
        assert_eq!(ar.args[1], Arg::Str("sum".into()));
        assert_eq!(
            g.view.node("sub").unwrap().kwargs[0],
            ("alpha".into(), Arg::Int(2))
        );
        assert_eq!(g.apply(&[]), G);
    }

    #[test]
    fn removal_rewires_later_uses_only() {
        let g = FxGraph::parse(G);
        let out = g.apply(&[Edit::Remove {
            node: 4,
            rewire_to: "all_reduce".into(),
        }]);
        assert!(out.contains("torch.ops.aten.sub.Tensor(all_reduce, x, alpha=2)"));
        assert!(!out.contains("wait_tensor"));
        let out = g.apply(&[Edit::SetArg {
            node: 5,
            slot: Slot::Kw("alpha".into()),
            arg: Arg::Int(3),
        }]);
        assert!(out.contains("sub.Tensor(wait_tensor, x, alpha=3)"));
    }
}
