//! Building the graph of one `forward` from its parsed statements: name bindings and their
//! release, calls in every namespace torch.fx prints, multi-output nodes and `# File:` locations.

use super::expr::{Expr, ExprKind, ParseError, Parser};
use super::lex::{Tok, Token};
use super::perr;
use super::types::{parse_annotation, Annotation};
use shardproof_ir::{
    Arg, DType, Graph, Node, NodeKind, OpName, Output, SourceLoc, Span, TensorType, ValueId,
};
use std::collections::HashMap;

/// How a name in the body is bound.
#[derive(Clone, Copy, Debug)]
enum Bound {
    /// A value of the graph.
    Value(ValueId),
    /// A multi-output node whose outputs are taken with `node[i]`.
    Tuple(usize),
    /// A pytree container parameter (`primals` in `forward(self, primals, tangents)`), only
    /// valid as an argument of `tree_flatten_spec`.
    Container,
}

#[derive(Clone, Copy, Debug)]
struct Binding {
    bound: Bound,
    line: usize,
    /// The line of the `name = None` that released it.
    released: Option<usize>,
}

#[derive(Clone, Copy, Debug, Default)]
struct NodeState {
    /// The assignment carried an annotation, so the value is not a tuple of outputs.
    annotated: bool,
    /// Output 0 was used as a whole value, so `node[i]` indexes into it rather than picking an
    /// output.
    used_whole: bool,
}

/// Builds the graph of one `forward`.
pub(super) struct Builder {
    pub(super) graph: Graph,
    names: HashMap<String, Binding>,
    state: Vec<NodeState>,
    loc: Option<SourceLoc>,
    /// Types declared by `name: "f32[..]";` lines before `tree_flatten_spec`.
    declared: HashMap<String, (Option<TensorType>, usize)>,
    pub(super) returned: bool,
    pub(super) def_line: usize,
    pub(super) body_indent: Option<usize>,
}

const BUILTIN_CALLS: [&str; 12] = [
    "getattr", "len", "int", "float", "bool", "abs", "min", "max", "round", "pow", "divmod", "str",
];

fn binary_name(op: &str) -> &'static str {
    match op {
        "+" => "add",
        "-" => "sub",
        "*" => "mul",
        "/" => "truediv",
        "//" => "floordiv",
        "%" => "mod",
        "**" => "pow",
        "@" => "matmul",
        "==" => "eq",
        "!=" => "ne",
        "<" => "lt",
        "<=" => "le",
        ">" => "gt",
        ">=" => "ge",
        "&" => "and_",
        "|" => "or_",
        "^" => "xor",
        "<<" => "lshift",
        ">>" => "rshift",
        "-u" => "neg",
        "+u" => "pos",
        _ => "invert",
    }
}

/// Whether a dotted path names a layout or a memory format (`torch.strided`, ...).
fn torch_constant(name: &str) -> Option<Arg> {
    match name {
        "strided" | "sparse_coo" | "sparse_csr" | "sparse_csc" | "sparse_bsr" | "sparse_bsc"
        | "_mkldnn" | "jagged" => Some(Arg::Layout(name.to_string())),
        "contiguous_format" | "preserve_format" | "channels_last" | "channels_last_3d" => {
            Some(Arg::MemoryFormat(name.to_string()))
        }
        _ => DType::from_torch_name(name).map(Arg::Dtype),
    }
}

/// Parses a `torch.ops.NS.NAME[.OVERLOAD]` path.
fn ops_path(path: &[&str]) -> Option<OpName> {
    match path {
        ["torch", "ops", ns, name] => Some(OpName::new(ns, name, "")),
        ["torch", "ops", ns, name, ov] => Some(OpName::new(ns, name, ov)),
        _ => None,
    }
}

fn parse_int(digits: &str, negative: bool, span: Span) -> Result<i64, ParseError> {
    let v = digits
        .parse::<i128>()
        .ok()
        .map(|v| if negative { -v } else { v });
    v.and_then(|v| i64::try_from(v).ok()).ok_or_else(|| {
        perr(
            span,
            format!(
                "integer `{}{digits}` is out of range",
                if negative { "-" } else { "" }
            ),
            "integer arguments must fit in 64 bits",
        )
    })
}

/// Parses `File: path:LINE in FUNC, code: CODE`, the text after `File: `.
fn parse_file_comment(rest: &str) -> Option<SourceLoc> {
    let (head, code) = match rest.find(", code: ") {
        Some(k) => (&rest[..k], &rest[k + ", code: ".len()..]),
        None => (rest, ""),
    };
    let k = head.rfind(" in ")?;
    let (path_line, function) = (&head[..k], head[k + 4..].trim());
    let c = path_line.rfind(':')?;
    let line = path_line[c + 1..].trim().parse::<u32>().ok()?;
    let file = &path_line[..c];
    if file.is_empty() || function.is_empty() {
        return None;
    }
    Some(SourceLoc {
        file: file.to_string(),
        line,
        function: function.to_string(),
        code: code.trim_end().to_string(),
    })
}

impl Builder {
    /// Reads `def forward(self, a: "f32[8]", b, *, c=None) -> T:` and creates the inputs.
    pub(super) fn from_def(toks: &[Token], end: Span) -> Result<Builder, ParseError> {
        let mut p = Parser::new(toks, end);
        let def = p.bump().unwrap();
        let (name, nspan) = p.expect_name("a function name after `def`")?;
        if name != "forward" {
            return Err(perr(
                nspan,
                format!("expected `forward`, found `{name}`"),
                "only the `forward` method of a graph module defines a graph",
            ));
        }
        let open = p.expect_punct("(", None)?.span();
        let mut b = Builder {
            graph: Graph::default(),
            names: HashMap::new(),
            state: Vec::new(),
            loc: None,
            declared: HashMap::new(),
            returned: false,
            def_line: def.line,
            body_indent: None,
        };
        let mut first = true;
        loop {
            if p.eat_punct(")") {
                break;
            }
            if p.eat_punct("/") || (p.eat_punct("*") && p.peek().is_some_and(|t| t.is_punct(","))) {
                // Markers of positional-only / keyword-only parameters.
            } else {
                p.eat_punct("*");
                p.eat_punct("**");
                let (pname, pspan) = p.expect_name("a parameter name")?;
                let mut ann = None;
                if p.eat_punct(":") {
                    let e = p.expr()?;
                    ann = Some(annotation_of(&e)?);
                }
                if p.eat_punct("=") {
                    // A default value: the parameter is still an input of the graph.
                    p.expr()?;
                }
                if !(first && pname == "self") {
                    if b.names.contains_key(&pname) {
                        return Err(perr(
                            pspan,
                            format!("parameter `{pname}` is declared twice"),
                            "parameter names must be unique",
                        ));
                    }
                    let ty = match ann {
                        Some(Annotation::Tensor(t)) => Some(t),
                        _ => None,
                    };
                    b.add_input(&pname, ty, pspan.line);
                }
            }
            first = false;
            if !p.eat_punct(",") {
                if !p.eat_punct(")") {
                    return Err(ParseError {
                        span: p.here(),
                        message: format!(
                            "expected `,` or `)` to close the `(` at {}:{}, found {}",
                            open.line,
                            open.col,
                            p.found()
                        ),
                        hint: Some("parameters look like `name: \"f32[8, 16]\"`".into()),
                    });
                }
                break;
            }
        }
        if p.eat_punct("->") {
            p.expr()?;
        }
        p.expect_punct(":", Some("a function header ends with `:`"))?;
        p.expect_end(None)?;
        Ok(b)
    }

    fn add_input(&mut self, name: &str, ty: Option<TensorType>, line: usize) {
        let idx = self.graph.push(Node {
            name: name.to_string(),
            kind: NodeKind::Input,
            outputs: vec![Output {
                name: name.to_string(),
                ty,
            }],
            loc: None,
            line: Some(line),
        });
        self.state.push(NodeState::default());
        self.graph.inputs.push(ValueId::new(idx, 0));
        self.names.insert(
            name.to_string(),
            Binding {
                bound: Bound::Value(ValueId::new(idx, 0)),
                line,
                released: None,
            },
        );
    }

    pub(super) fn comment(&mut self, text: &str, span: Span) -> Result<(), ParseError> {
        if text.contains("No stacktrace found for following nodes") {
            self.loc = None;
            return Ok(());
        }
        // The summary may carry prefixes (`# Backward of forward node: File: ...`,
        // `# Annotation: {...} File: ...`); the location follows the first `File: `.
        if let Some(k) = text.find("File: ") {
            let rest = &text[k + "File: ".len()..];
            match parse_file_comment(rest) {
                Some(loc) => self.loc = Some(loc),
                None => {
                    let col = span.col + text[..k].chars().count();
                    return Err(perr(
                        Span::new(span.line, col),
                        "expected a source location `File: PATH:LINE in FUNCTION, code: CODE` \
                         in this comment",
                        "location comments are printed by torch.fx; fix or delete the comment",
                    ));
                }
            }
        }
        Ok(())
    }

    pub(super) fn statement(&mut self, toks: &[Token], end: Span) -> Result<(), ParseError> {
        // `a = f(x);  x = None` : simple statements separated by `;` at bracket depth 0.
        let mut depth = 0i32;
        let mut start = 0;
        for (i, t) in toks.iter().enumerate() {
            match &t.tok {
                Tok::Punct("(" | "[" | "{") => depth += 1,
                Tok::Punct(")" | "]" | "}") => depth -= 1,
                Tok::Punct(";") if depth == 0 => {
                    let stmt_end = t.span();
                    if i > start {
                        self.simple(&toks[start..i], stmt_end)?;
                    }
                    start = i + 1;
                }
                _ => {}
            }
        }
        if start < toks.len() {
            self.simple(&toks[start..], end)?;
        }
        Ok(())
    }

    fn simple(&mut self, toks: &[Token], end: Span) -> Result<(), ParseError> {
        let first = &toks[0];
        if self.returned {
            return Err(perr(
                first.span(),
                format!(
                    "expected the end of `forward` after `return`, found {}",
                    first.tok.describe()
                ),
                "nothing may follow the `return` of a graph body",
            ));
        }
        if first.is_name("return") {
            return self.return_stmt(&toks[1..], end);
        }
        if first.is_name("pass") && toks.len() == 1 {
            return Ok(());
        }
        let mut depth = 0i32;
        let mut eqs = Vec::new();
        for (i, t) in toks.iter().enumerate() {
            match &t.tok {
                Tok::Punct("(" | "[" | "{") => depth += 1,
                Tok::Punct(")" | "]" | "}") => depth -= 1,
                Tok::Punct("=") if depth == 0 => eqs.push(i),
                Tok::Punct(p)
                    if depth == 0
                        && p.len() >= 2
                        && p.ends_with('=')
                        && !matches!(*p, "==" | "!=" | "<=" | ">=") =>
                {
                    return Err(perr(
                        t.span(),
                        format!("expected `=`, found the augmented assignment `{p}`"),
                        "in-place Python operators are not graph nodes; capture an ATen graph \
                         (torch.export or AOTAutograd)",
                    ))
                }
                _ => {}
            }
        }
        match eqs.as_slice() {
            [] => self.declaration(toks, end),
            [eq] => self.assignment(&toks[..*eq], &toks[*eq], &toks[eq + 1..], end),
            [.., last] => {
                // `a = b = None`: releases.
                let rhs = &toks[last + 1..];
                if !(rhs.len() == 1 && rhs[0].is_name("None")) {
                    return Err(perr(
                        toks[eqs[1]].span(),
                        "expected a single `=`: chained assignments only release values \
                         (`a = b = None`)",
                        "write one assignment per node",
                    ));
                }
                let mut s = 0;
                for &e in &eqs {
                    self.release(&toks[s..e], &toks[e])?;
                    s = e + 1;
                }
                Ok(())
            }
        }
    }

    /// `name: "f32[8]"` without a value: a type declaration of a flattened input.
    fn declaration(&mut self, toks: &[Token], end: Span) -> Result<(), ParseError> {
        let mut p = Parser::new(toks, end);
        let is_decl = matches!(toks.first().map(|t| &t.tok), Some(Tok::Name(_)))
            && toks.get(1).is_some_and(|t| t.is_punct(":"));
        if !is_decl {
            return Err(perr(
                toks[0].span(),
                format!(
                    "expected an assignment `name = ...` or `return`, found {}",
                    toks[0].tok.describe()
                ),
                "graph bodies assign each node to a name: `mm: \"f32[8, 8]\" = \
                 torch.ops.aten.mm.default(a, b)`",
            ));
        }
        let (name, nspan) = p.expect_name("a name")?;
        p.bump();
        let ann = annotation_of(&p.expr()?)?;
        p.expect_end(None)?;
        let ty = match ann {
            Annotation::Tensor(t) => Some(t),
            Annotation::Opaque => None,
        };
        if let Some(b) = self.names.get(&name) {
            if let Bound::Value(v) = b.bound {
                if self.graph.nodes[v.node].kind == NodeKind::Input {
                    if self.graph.nodes[v.node].outputs[0].ty.is_none() {
                        self.graph.nodes[v.node].outputs[0].ty = ty.clone();
                    }
                } else {
                    return Err(perr(
                        nspan,
                        format!("expected a value for `{name}`, which is already a node"),
                        "type declarations without a value only precede `tree_flatten_spec`",
                    ));
                }
            }
        }
        if self
            .declared
            .insert(name.clone(), (ty, nspan.line))
            .is_some()
        {
            return Err(perr(
                nspan,
                format!("`{name}` is declared twice"),
                "each input is declared once",
            ));
        }
        Ok(())
    }

    fn release(&mut self, toks: &[Token], eq: &Token) -> Result<(), ParseError> {
        let [Token {
            tok: Tok::Name(name),
            ..
        }] = toks
        else {
            let at = toks.first().map_or(eq.span(), Token::span);
            return Err(perr(
                at,
                "expected a name before `=` in a release `a = b = None`",
                "releases list the names of values no longer needed",
            ));
        };
        let line = toks[0].line;
        match self.names.get_mut(name) {
            Some(b) => {
                b.released = Some(line);
                Ok(())
            }
            None => Err(perr(
                toks[0].span(),
                format!("unknown name `{name}` released: expected a name defined above"),
                "`name = None` releases a value defined earlier in the body; check for a typo",
            )),
        }
    }

    fn assignment(
        &mut self,
        lhs: &[Token],
        eq: &Token,
        rhs: &[Token],
        end: Span,
    ) -> Result<(), ParseError> {
        if lhs.is_empty() {
            return Err(perr(
                eq.span(),
                "expected a name before `=`",
                "assignments look like `name = value`",
            ));
        }
        let mut rp = Parser::new(rhs, end);
        if rp.at_end() {
            return Err(rp.error("a value after `=`", None));
        }
        let value = rp.expr()?;
        rp.expect_end(Some(
            "one statement per line, or statements separated by `;`",
        ))?;
        let mut lp = Parser::new(lhs, eq.span());
        let target = lp.expr_list()?;
        match &target.kind {
            ExprKind::Tuple(items) => {
                lp.expect_end(None)?;
                self.flatten(items, &value)
            }
            ExprKind::Name(name) => {
                let mut ty = None;
                let mut annotated = false;
                if !lp.at_end() && !lp.peek().is_some_and(|t| t.is_punct(":")) {
                    return Err(lp.error(
                        &format!("`:` and a type annotation, or `=`, after `{name}`"),
                        Some("node lines look like `name: \"f32[8]\" = torch.ops.aten.op.overload(...)`"),
                    ));
                }
                if lp.eat_punct(":") {
                    let e = lp.expr()?;
                    annotated = true;
                    if let Annotation::Tensor(t) = annotation_of(&e)? {
                        ty = Some(t);
                    }
                }
                lp.expect_end(Some(
                    "the target of an assignment is `name` or `name: \"type\"`",
                ))?;
                if !annotated && matches!(value.kind, ExprKind::Name(ref n) if n == "None") {
                    return self.release(lhs, eq);
                }
                self.define(name, target.span, ty, annotated, &value)
            }
            _ => Err(perr(
                target.span,
                "expected a name to assign to",
                "assignments look like `name: \"f32[8]\" = torch.ops.aten.op.overload(...)`",
            )),
        }
    }

    fn check_new_name(&self, name: &str, span: Span) -> Result<(), ParseError> {
        if let Some(b) = self.names.get(name) {
            return Err(perr(
                span,
                format!("`{name}` is already defined on line {}", b.line),
                "every node of a graph has a unique name",
            ));
        }
        Ok(())
    }

    fn push_node(
        &mut self,
        name: &str,
        kind: NodeKind,
        ty: Option<TensorType>,
        line: usize,
        annotated: bool,
    ) {
        let idx = self.graph.push(Node {
            name: name.to_string(),
            kind,
            outputs: vec![Output {
                name: name.to_string(),
                ty,
            }],
            loc: self.loc.clone(),
            line: Some(line),
        });
        self.state.push(NodeState {
            annotated,
            used_whole: false,
        });
        self.names.insert(
            name.to_string(),
            Binding {
                bound: Bound::Value(ValueId::new(idx, 0)),
                line,
                released: None,
            },
        );
    }

    fn define(
        &mut self,
        name: &str,
        span: Span,
        ty: Option<TensorType>,
        annotated: bool,
        value: &Expr,
    ) -> Result<(), ParseError> {
        // `x_1 = x`: fx renames a placeholder whose name differs from its node.
        if let ExprKind::Name(src) = &value.kind {
            if let Some(Binding {
                bound: Bound::Value(v),
                released: None,
                ..
            }) = self.names.get(src).copied()
            {
                let used = self.state[v.node].used_whole;
                if self.graph.nodes[v.node].kind == NodeKind::Input && !used {
                    self.check_new_name(name, span)?;
                    let node = &mut self.graph.nodes[v.node];
                    node.name = name.to_string();
                    node.outputs[0].name = name.to_string();
                    if ty.is_some() {
                        node.outputs[0].ty = ty;
                    }
                    self.names.insert(
                        name.to_string(),
                        Binding {
                            bound: Bound::Value(v),
                            line: span.line,
                            released: None,
                        },
                    );
                    return Ok(());
                }
            }
        }
        self.check_new_name(name, span)?;
        let line = span.line;
        match &value.kind {
            ExprKind::Call { func, args, kwargs } => {
                let path = func.dotted();
                let path = path.as_deref();
                if let Some(op) = path.and_then(ops_path) {
                    let kind = self.call(op, args, kwargs)?;
                    self.push_node(name, kind, ty, line, annotated);
                    return Ok(());
                }
                match path {
                    Some(["operator", "getitem"]) => {
                        if args.len() != 2 || !kwargs.is_empty() {
                            return Err(perr(
                                value.span,
                                "expected `operator.getitem(value, index)` with two arguments",
                                "getitem takes the value and an index",
                            ));
                        }
                        self.getitem(name, span, ty, annotated, &args[0], &args[1])
                    }
                    Some(["operator" | "math" | "torch", f]) => {
                        let ns = path.unwrap()[0];
                        let kind = self.call(OpName::new(ns, f, ""), args, kwargs)?;
                        self.push_node(name, kind, ty, line, annotated);
                        Ok(())
                    }
                    Some([f]) if BUILTIN_CALLS.contains(f) => {
                        let kind = self.call(OpName::new("builtins", f, ""), args, kwargs)?;
                        self.push_node(name, kind, ty, line, annotated);
                        Ok(())
                    }
                    // `self.sub(x)`: a call_module node, kept under the `module` namespace.
                    Some(["self", rest @ ..]) if !rest.is_empty() => {
                        let op = OpName::new("module", &rest.join("."), "");
                        let kind = self.call(op, args, kwargs)?;
                        self.push_node(name, kind, ty, line, annotated);
                        Ok(())
                    }
                    _ => {
                        // `x.view(4, 8)`: a call_method node, kept under the `method` namespace
                        // with the receiver as first argument.
                        if let ExprKind::Attr(recv, method) = &func.kind {
                            if let ExprKind::Name(r) = &recv.kind {
                                if self.names.contains_key(r) {
                                    let mut all = vec![(**recv).clone()];
                                    all.extend(args.iter().cloned());
                                    let kind =
                                        self.call(OpName::new("method", method, ""), &all, kwargs)?;
                                    self.push_node(name, kind, ty, line, annotated);
                                    return Ok(());
                                }
                            }
                        }
                        Err(unknown_callable(func))
                    }
                }
            }
            ExprKind::Attr(..) => {
                let path = value.dotted().ok_or_else(|| {
                    perr(
                        value.span,
                        "expected `self.ATTRIBUTE` or `value.attribute`",
                        "",
                    )
                })?;
                match path.as_slice() {
                    ["self", rest @ ..] => {
                        let attr = rest.join(".");
                        self.push_node(name, NodeKind::Constant { attr }, ty, line, annotated);
                        Ok(())
                    }
                    [base, attr] if self.names.contains_key(*base) => {
                        // `size = x.shape`: fx's rendering of `getattr(x, "shape")`.
                        let v = self.resolve(base, value.span)?;
                        let kind = NodeKind::Call {
                            op: OpName::new("builtins", "getattr", ""),
                            args: vec![Arg::Value(v), Arg::Str(attr.to_string())],
                            kwargs: vec![],
                        };
                        self.push_node(name, kind, ty, line, annotated);
                        Ok(())
                    }
                    _ => Err(perr(
                        value.span,
                        format!(
                            "expected `self.ATTRIBUTE` or an operator call, found `{}`",
                            path.join(".")
                        ),
                        "module attributes are read as `self.name`; operators are called as \
                         `torch.ops.NAMESPACE.NAME.OVERLOAD(...)`",
                    )),
                }
            }
            ExprKind::Index(base, idx) => self.getitem(name, span, ty, annotated, base, idx),
            ExprKind::Binary(op, a, b) => {
                let args = vec![self.arg(a)?, self.arg(b)?];
                let kind = NodeKind::Call {
                    op: OpName::new("operator", binary_name(op), ""),
                    args,
                    kwargs: vec![],
                };
                self.push_node(name, kind, ty, line, annotated);
                Ok(())
            }
            ExprKind::Unary(op, a) if !is_numeric_literal(a) => {
                let args = vec![self.arg(a)?];
                let which = format!("{op}u");
                let kind = NodeKind::Call {
                    op: OpName::new("operator", binary_name(&which), ""),
                    args,
                    kwargs: vec![],
                };
                self.push_node(name, kind, ty, line, annotated);
                Ok(())
            }
            _ => Err(perr(
                value.span,
                "expected an operator call such as `torch.ops.aten.mm.default(a, b)`, an \
                 attribute `self.NAME` or an output `node[i]`",
                "each line of a graph body defines one node",
            )),
        }
    }

    fn call(
        &mut self,
        op: OpName,
        args: &[Expr],
        kwargs: &[(String, Span, Expr)],
    ) -> Result<NodeKind, ParseError> {
        let args = args
            .iter()
            .map(|a| self.arg(a))
            .collect::<Result<Vec<_>, _>>()?;
        let kwargs = kwargs
            .iter()
            .map(|(k, _, v)| Ok((k.clone(), self.arg(v)?)))
            .collect::<Result<Vec<_>, ParseError>>()?;
        Ok(NodeKind::Call { op, args, kwargs })
    }

    /// `name = base[i]`: output `i` of a multi-output node, or else an `operator.getitem` node.
    fn getitem(
        &mut self,
        name: &str,
        span: Span,
        ty: Option<TensorType>,
        annotated: bool,
        base: &Expr,
        idx: &Expr,
    ) -> Result<(), ParseError> {
        let index = match &idx.kind {
            ExprKind::Int(d) => Some(parse_int(d, false, idx.span)?),
            _ => None,
        };
        if let (ExprKind::Name(bname), Some(i)) = (&base.kind, index) {
            if i > 65_535 {
                return Err(perr(
                    idx.span,
                    format!("output index {i} is too large"),
                    "node outputs are indexed from 0",
                ));
            }
            let i = i as usize;
            let b = self.lookup(bname, base.span)?;
            let node = match b.bound {
                Bound::Tuple(n) => Some(n),
                Bound::Value(v) => {
                    let n = &self.graph.nodes[v.node];
                    let st = self.state[v.node];
                    let tuple_like = matches!(n.kind, NodeKind::Call { .. })
                        && n.outputs.len() == 1
                        && !st.annotated
                        && !st.used_whole;
                    tuple_like.then_some(v.node)
                }
                Bound::Container => None,
            };
            if let Some(n) = node {
                let node_name = self.graph.nodes[n].name.clone();
                let placeholder = |k: usize| format!("{node_name}[{k}]");
                let outs = &mut self.graph.nodes[n].outputs;
                if !matches!(b.bound, Bound::Tuple(_)) {
                    // First output taken: the node's own name now stands for the tuple.
                    outs[0].name = placeholder(0);
                    self.names.get_mut(bname).unwrap().bound = Bound::Tuple(n);
                }
                while outs.len() <= i {
                    outs.push(Output {
                        name: placeholder(outs.len()),
                        ty: None,
                    });
                }
                if outs[i].name == placeholder(i) {
                    outs[i] = Output {
                        name: name.to_string(),
                        ty,
                    };
                    self.names.insert(
                        name.to_string(),
                        Binding {
                            bound: Bound::Value(ValueId::new(n, i)),
                            line: span.line,
                            released: None,
                        },
                    );
                    return Ok(());
                }
                return Err(perr(
                    span,
                    format!(
                        "output {i} of `{node_name}` is already named `{}`; expected each output \
                         to be taken once",
                        self.graph.nodes[n].outputs[i].name
                    ),
                    "torch.fx takes each output of a multi-output node with one getitem",
                ));
            }
        }
        let args = vec![self.arg(base)?, self.arg(idx)?];
        let kind = NodeKind::Call {
            op: OpName::new("operator", "getitem", ""),
            args,
            kwargs: vec![],
        };
        self.push_node(name, kind, ty, span.line, annotated);
        Ok(())
    }

    /// `a, b, = fx_pytree.tree_flatten_spec([primals, tangents], self._in_spec)`: the flat
    /// inputs of a pytree signature.
    fn flatten(&mut self, targets: &[Expr], value: &Expr) -> Result<(), ParseError> {
        let ExprKind::Call { func, args, .. } = &value.kind else {
            return Err(perr(
                value.span,
                "expected `fx_pytree.tree_flatten_spec(...)` on the right of a tuple assignment",
                "tuple assignments only unpack the inputs of a pytree signature",
            ));
        };
        if !matches!(func.dotted().as_deref(), Some([_, "tree_flatten_spec"])) {
            return Err(perr(
                value.span,
                "expected `fx_pytree.tree_flatten_spec(...)` on the right of a tuple assignment",
                "tuple assignments only unpack the inputs of a pytree signature",
            ));
        }
        let mut stack: Vec<&Expr> = args.iter().collect();
        while let Some(e) = stack.pop() {
            match &e.kind {
                ExprKind::Name(n) if !self.names.contains_key(n) => {
                    return Err(perr(
                        e.span,
                        format!("unknown name `{n}`: expected a parameter of `forward`"),
                        "tree_flatten_spec flattens the parameters of the signature",
                    ))
                }
                ExprKind::List(v) | ExprKind::Tuple(v) => stack.extend(v),
                ExprKind::Dict(kv) => stack.extend(kv.iter().map(|(_, v)| v)),
                _ => {}
            }
        }
        if let Some(n) = self.graph.nodes.iter().find(|n| n.kind != NodeKind::Input) {
            return Err(perr(
                value.span,
                format!(
                    "expected `tree_flatten_spec` before any node, found it after `{}`",
                    n.name
                ),
                "the inputs are unpacked at the start of the body",
            ));
        }
        let line = value.span.line;
        self.graph.nodes.clear();
        self.graph.inputs.clear();
        self.state.clear();
        // Every name bound so far is a signature parameter (provisionally an input), and
        // tree_flatten_spec consumes them all: they become containers.
        for b in self.names.values_mut() {
            b.bound = Bound::Container;
        }
        let mut seen = std::collections::HashSet::new();
        for t in targets {
            let ExprKind::Name(n) = &t.kind else {
                return Err(perr(
                    t.span,
                    "expected a name in the unpacked inputs",
                    "inputs are unpacked into plain names",
                ));
            };
            if !seen.insert(n.clone()) {
                return Err(perr(
                    t.span,
                    format!("input `{n}` is unpacked twice"),
                    "input names are unique",
                ));
            }
            let (ty, dline) = self.declared.get(n).cloned().unwrap_or((None, line));
            self.add_input(n, ty, dline);
        }
        Ok(())
    }

    fn return_stmt(&mut self, toks: &[Token], end: Span) -> Result<(), ParseError> {
        // Set first: in lenient mode a `return` that fails to parse still ends the body.
        self.returned = true;
        let mut p = Parser::new(toks, end);
        if p.at_end() {
            return Ok(());
        }
        let e = p.expr_list()?;
        p.expect_end(None)?;
        let items: Vec<&Expr> = match &e.kind {
            ExprKind::List(v) | ExprKind::Tuple(v) => v.iter().collect(),
            ExprKind::Call { func, args, .. }
                if matches!(func.dotted().as_deref(), Some([_, "tree_unflatten"])) =>
            {
                match args.first().map(|a| &a.kind) {
                    Some(ExprKind::List(v) | ExprKind::Tuple(v)) => v.iter().collect(),
                    _ => return Err(perr(
                        args.first().map_or(e.span, |a| a.span),
                        "expected a list of outputs as the first argument of `tree_unflatten`",
                        "returns look like `return pytree.tree_unflatten([a, b], self._out_spec)`",
                    )),
                }
            }
            _ => vec![&e],
        };
        let mut outs = Vec::new();
        for it in items {
            match &it.kind {
                ExprKind::Name(n) if n == "None" => outs.push(None),
                ExprKind::Name(n) => outs.push(Some(self.resolve(n, it.span)?)),
                _ => {
                    return Err(perr(
                        it.span,
                        "expected the name of a value or `None` in the returned outputs",
                        "graph outputs are values of the graph; constants cannot be returned",
                    ))
                }
            }
        }
        self.graph.outputs = outs;
        Ok(())
    }

    fn lookup(&self, name: &str, span: Span) -> Result<Binding, ParseError> {
        match self.names.get(name) {
            Some(b) => {
                if let Some(r) = b.released {
                    return Err(perr(
                        span,
                        format!("`{name}` was released by `{name} = None` on line {r}; expected a live value"),
                        "a value cannot be used after it is released; lines may be out of order",
                    ));
                }
                Ok(*b)
            }
            None => Err(perr(
                span,
                format!("unknown name `{name}`: expected the name of an input or of a value defined above"),
                "every argument must be defined on an earlier line; check for a typo or a \
                 missing line",
            )),
        }
    }

    /// The value a name stands for, marking it as used whole.
    fn resolve(&mut self, name: &str, span: Span) -> Result<ValueId, ParseError> {
        match self.lookup(name, span)?.bound {
            Bound::Value(v) => {
                if v.output == 0 && self.graph.nodes[v.node].outputs.len() == 1 {
                    self.state[v.node].used_whole = true;
                }
                Ok(v)
            }
            Bound::Tuple(n) => Err(perr(
                span,
                format!(
                    "`{name}` has several outputs; expected one of them, taken with `{name}[i]`",
                ),
                format!(
                    "node `{}` was split into outputs by getitem lines above",
                    self.graph.nodes[n].name
                ),
            )),
            Bound::Container => Err(perr(
                span,
                format!("`{name}` is a pytree container; expected a value"),
                "containers are unpacked by `fx_pytree.tree_flatten_spec`; use the unpacked names",
            )),
        }
    }

    fn arg(&mut self, e: &Expr) -> Result<Arg, ParseError> {
        Ok(match &e.kind {
            ExprKind::Name(n) => match n.as_str() {
                "None" => Arg::None,
                "True" => Arg::Bool(true),
                "False" => Arg::Bool(false),
                "inf" => Arg::Float(f64::INFINITY),
                "nan" => Arg::Float(f64::NAN),
                _ => Arg::Value(self.resolve(n, e.span)?),
            },
            ExprKind::Int(d) => Arg::Int(parse_int(d, false, e.span)?),
            ExprKind::Float(f) => Arg::Float(*f),
            ExprKind::Str(s) => Arg::Str(s.clone()),
            ExprKind::Unary(op @ ("-" | "+"), inner) if is_numeric_literal(inner) => {
                let neg = *op == "-";
                match &inner.kind {
                    ExprKind::Int(d) => Arg::Int(parse_int(d, neg, e.span)?),
                    _ => match self.arg(inner)? {
                        Arg::Float(f) if neg => Arg::Float(-f),
                        Arg::Float(f) => Arg::Float(f),
                        _ => unreachable!("numeric literal"),
                    },
                }
            }
            ExprKind::List(v) | ExprKind::Tuple(v) => {
                Arg::List(v.iter().map(|a| self.arg(a)).collect::<Result<_, _>>()?)
            }
            ExprKind::Attr(..) => {
                let path = e.dotted().unwrap_or_default();
                if let Some(op) = ops_path(&path) {
                    return Ok(Arg::Op(op));
                }
                match path.as_slice() {
                    ["torch", c] => torch_constant(c).ok_or_else(|| {
                        perr(
                            e.span,
                            format!("unknown torch constant `torch.{c}`: expected a dtype, a layout or a memory format"),
                            "supported: dtypes such as `torch.float16`, `torch.strided`, \
                             `torch.contiguous_format`, `torch.preserve_format`, `torch.channels_last`",
                        )
                    })?,
                    _ => {
                        return Err(perr(
                            e.span,
                            format!("expected an argument value, found the attribute `{}`", path.join(".")),
                            "arguments are literals, names of values, dtypes, devices or operators",
                        ))
                    }
                }
            }
            ExprKind::Call { func, args, kwargs }
                if matches!(
                    func.dotted().as_deref(),
                    Some(["device"] | ["torch", "device"])
                ) =>
            {
                device_arg(e, args, kwargs)?
            }
            _ => {
                return Err(perr(
                    e.span,
                    "expected an argument: a number, a string, `True`/`False`/`None`, a list, a \
                     dtype, a device or the name of a value",
                    "torch.fx computes every nested expression in its own node, so arguments \
                     are never expressions",
                ))
            }
        })
    }
}

fn is_numeric_literal(e: &Expr) -> bool {
    match &e.kind {
        ExprKind::Int(_) | ExprKind::Float(_) => true,
        ExprKind::Name(n) => n == "inf" || n == "nan",
        _ => false,
    }
}

fn unknown_callable(func: &Expr) -> ParseError {
    let shown = func
        .dotted()
        .map(|p| p.join("."))
        .unwrap_or_else(|| "this expression".into());
    perr(
        func.span,
        format!(
            "unknown callable `{shown}`: expected an operator `torch.ops.NAMESPACE.NAME.OVERLOAD`"
        ),
        "ATen graphs call operators through `torch.ops`; `operator.*`, `torch.*`, `math.*` \
         and Python builtins are accepted too",
    )
}

/// `device(type='cuda', index=0)` → `cuda:0`.
fn device_arg(e: &Expr, args: &[Expr], kwargs: &[(String, Span, Expr)]) -> Result<Arg, ParseError> {
    let bad = || {
        perr(
            e.span,
            "expected a device such as `device(type='cuda', index=0)` or `device(type='cpu')`",
            "devices have a string type and an optional integer index",
        )
    };
    let mut ty: Option<String> = None;
    let mut index: Option<i64> = None;
    let mut set = |k: &str, v: &Expr| -> Result<(), ParseError> {
        match (k, &v.kind) {
            ("type", ExprKind::Str(s)) if ty.is_none() => ty = Some(s.clone()),
            ("index", ExprKind::Int(d)) if index.is_none() => {
                index = Some(parse_int(d, false, v.span)?)
            }
            ("index", ExprKind::Name(n)) if n == "None" => {}
            _ => return Err(bad()),
        }
        Ok(())
    };
    for (i, a) in args.iter().enumerate() {
        set(if i == 0 { "type" } else { "index" }, a)?;
    }
    for (k, _, v) in kwargs {
        set(k, v)?;
    }
    let ty = ty.ok_or_else(bad)?;
    Ok(Arg::Device(match index {
        Some(i) => format!("{ty}:{i}"),
        None => ty,
    }))
}

fn annotation_of(e: &Expr) -> Result<Annotation, ParseError> {
    match &e.kind {
        ExprKind::Str(s) => parse_annotation(s, e.span),
        // `x: torch.Tensor`, `n: int`, `b8: type`: Python types, no tensor type to record.
        ExprKind::Name(_) | ExprKind::Attr(..) if e.dotted().is_some() => Ok(Annotation::Opaque),
        // `x: List[int]`.
        ExprKind::Index(..) => Ok(Annotation::Opaque),
        _ => Err(perr(
            e.span,
            "expected a type annotation such as \"f32[8, 16]\"",
            "torch.fx quotes tensor types: `name: \"f32[8, 16]\"`",
        )),
    }
}
