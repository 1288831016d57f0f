//! Importer of torch.fx "readable" graph text (`GraphModule.print_readable()`, torch.export,
//! AOTAutograd dumps).
//!
//! The text is Python, but only the small subset torch.fx generates: a preamble of comments and
//! imports, a `class X(torch.nn.Module):` holding `def forward(...)`, and a body of assignments
//! `name: "f32[8, 16]" = torch.ops.aten.mm.default(a, b);  a = None` ending with `return`. The
//! parser is hand-written so that every error can name the exact line and column and say what
//! was expected; it never executes anything.
//!
//! What becomes what:
//! - signature parameters, or the names unpacked by `fx_pytree.tree_flatten_spec` in the joint
//!   form `forward(self, primals, tangents)`, become `Input` nodes typed by their annotation or by
//!   the `name: "f32[..]";` declarations that precede the unpacking;
//! - `name = torch.ops.NS.OP.OVERLOAD(...)` becomes a `Call` node, `name = self.ATTR` a
//!   `Constant` node;
//! - `name = node[i]` (or `operator.getitem(node, i)`) on an unannotated call becomes output `i`
//!   of that node, named `name`; outputs no getitem takes are named `node[i]`, which no Python
//!   name can clash with;
//! - Python operators on SymInts, `operator.*`, `torch.*`, `math.*` and builtin calls become calls
//!   in those namespaces; `self.sub(...)` becomes `module.sub`, `x.m(...)` becomes `method.m`;
//! - `# File: ...` comments set the `SourceLoc` of the nodes below them.
//!
//! Dropped, because the IR has no place for them: the `;  x = None` release tails (checked
//! though: a released name cannot be used again), default values of parameters, strides and
//! devices in annotations, and the types of `Sym(...)` and tensor-subclass annotations.

mod build;
mod expr;
mod lex;
mod types;

use build::Builder;

use expr::{ParseError, Parser};
use lex::{Tok, Token};
use shardproof_ir::{Graph, SourceError, Span};
use std::path::Path;

/// How much of a graph file the parser understood, for `shardproof inspect`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ParseStats {
    /// Physical lines in the file.
    pub lines_total: usize,
    /// Code lines understood and turned into the graph (signatures, nodes, `return`, ...).
    pub lines_parsed: usize,
    /// Lines with no graph content: blank lines, comments (including `# File:` location
    /// comments), imports, and `name: type` preamble declarations.
    pub lines_ignored: usize,
    /// Code lines not understood (1-based line number, text); only the lenient parser leaves
    /// entries here, the strict one fails instead.
    pub unparsed: Vec<(usize, String)>,
}

/// The result of parsing a torch.fx readable file.
#[derive(Clone, Debug, PartialEq)]
pub struct FxParse {
    /// The top-level graph (the outermost class's `forward`).
    pub graph: Graph,
    /// Graphs of nested submodule classes (torch.export prints `cond` branches this way), named
    /// after their class; the top-level graph refers to them through `self.NAME` constants.
    pub subgraphs: Vec<Graph>,
    /// Parse coverage.
    pub stats: ParseStats,
}

/// Parses torch.fx readable text; any line it does not understand is an error located at its
/// line and column.
pub fn parse_fx(text: &str, file: &Path) -> Result<FxParse, SourceError> {
    FileParser::new(text, file, false)
        .run()
        .map_err(crate::shorten_quotes)
}

/// Parses torch.fx readable text, recording statements it does not understand in
/// [`ParseStats::unparsed`] instead of failing; structural problems (no `forward`, no `return`)
/// are still errors.
pub fn parse_fx_lenient(text: &str, file: &Path) -> Result<FxParse, SourceError> {
    FileParser::new(text, file, true)
        .run()
        .map_err(crate::shorten_quotes)
}

fn perr(span: Span, message: impl Into<String>, hint: impl Into<String>) -> ParseError {
    ParseError {
        span,
        message: message.into(),
        hint: Some(hint.into()),
    }
}

/// Python's indentation width of a line (tabs advance to the next multiple of 8).
fn indent_of(line: &str) -> usize {
    let mut n = 0;
    for c in line.chars() {
        match c {
            ' ' => n += 1,
            '\t' => n = (n / 8 + 1) * 8,
            '\x0c' => {}
            _ => break,
        }
    }
    n
}

/// One logical statement: its tokens and the physical lines it spans.
struct Logical {
    toks: Vec<Token>,
    first: usize,
    /// Index (0-based) of the line after the statement.
    next: usize,
    end: Span,
    code_lines: Vec<usize>,
    blank_lines: usize,
}

enum Frame {
    Class {
        indent: usize,
        name: String,
    },
    Forward {
        indent: usize,
        builder: Box<Builder>,
    },
}

impl Frame {
    fn indent(&self) -> usize {
        match self {
            Frame::Class { indent, .. } | Frame::Forward { indent, .. } => *indent,
        }
    }
}

struct FileParser<'a> {
    file: &'a Path,
    lenient: bool,
    lines: Vec<&'a str>,
    stats: ParseStats,
    frames: Vec<Frame>,
    top: Option<Graph>,
    subgraphs: Vec<Graph>,
}

impl<'a> FileParser<'a> {
    fn new(text: &'a str, file: &'a Path, lenient: bool) -> Self {
        let text = text.strip_prefix('\u{feff}').unwrap_or(text);
        let lines: Vec<&str> = text.lines().collect();
        FileParser {
            file,
            lenient,
            stats: ParseStats {
                lines_total: lines.len(),
                ..Default::default()
            },
            lines,
            frames: Vec::new(),
            top: None,
            subgraphs: Vec::new(),
        }
    }

    fn to_source(&self, e: ParseError) -> SourceError {
        let mut s = SourceError::new(self.file, Some(e.span), e.message);
        s.hint = e.hint;
        s
    }

    fn run(mut self) -> Result<FxParse, SourceError> {
        let mut i = 0;
        while i < self.lines.len() {
            let raw = self.lines[i];
            let trimmed = raw.trim_start();
            if trimmed.is_empty() {
                self.stats.lines_ignored += 1;
                i += 1;
                continue;
            }
            if trimmed.starts_with('#') {
                let col = raw.chars().count() - trimmed.chars().count() + 1;
                let res = match self.frames.last_mut() {
                    Some(Frame::Forward { builder, .. }) => {
                        builder.comment(trimmed, Span::new(i + 1, col))
                    }
                    _ => Ok(()),
                };
                match res {
                    Ok(()) => self.stats.lines_ignored += 1,
                    Err(e) => self.fail_lines(e, &[i + 1])?,
                }
                i += 1;
                continue;
            }
            let logical = match self.gather(i) {
                Ok(l) => l,
                Err(e) => {
                    self.fail_lines(e, &[i + 1])?;
                    i += 1;
                    continue;
                }
            };
            i = logical.next;
            self.stats.lines_ignored += logical.blank_lines;
            if logical.toks.is_empty() {
                self.stats.lines_ignored += logical.code_lines.len();
                continue;
            }
            let indent = indent_of(self.lines[logical.first]);
            self.close_frames(indent, logical.first + 1)?;
            match self.statement(&logical, indent) {
                Ok(ignored) if ignored => self.stats.lines_ignored += logical.code_lines.len(),
                Ok(_) => self.stats.lines_parsed += logical.code_lines.len(),
                Err(e) => self.fail_lines(e, &logical.code_lines)?,
            }
        }
        let last = self.lines.len().max(1);
        let end_col = self.lines.last().map_or(1, |l| l.chars().count() + 1);
        while let Some(f) = self.frames.pop() {
            self.finish_frame(f, Span::new(last, end_col), true)?;
        }
        let Some(graph) = self.top else {
            return Err(SourceError::new(
                self.file,
                Some(Span::new(last, end_col)),
                "expected a `def forward(self, ...):` defining a graph, found the end of the file",
            )
            .with_hint(
                "torch.fx readable text starts with `class GraphModule(torch.nn.Module):` (or \
                 a bare `def forward`) followed by the body; the file may be empty or truncated",
            ));
        };
        Ok(FxParse {
            graph,
            subgraphs: self.subgraphs,
            stats: self.stats,
        })
    }

    /// In lenient mode, records the lines as unparsed; otherwise fails.
    fn fail_lines(&mut self, e: ParseError, lines: &[usize]) -> Result<(), SourceError> {
        if !self.lenient {
            return Err(self.to_source(e));
        }
        for &l in lines {
            self.stats.unparsed.push((l, self.lines[l - 1].to_string()));
        }
        Ok(())
    }

    /// Collects the physical lines of one statement: brackets may continue it onto later lines
    /// (torch prints long signatures and returns that way, one item per line).
    fn gather(&self, start: usize) -> Result<Logical, ParseError> {
        let base = indent_of(self.lines[start]);
        let mut toks = Vec::new();
        let mut stack: Vec<(&'static str, Span)> = Vec::new();
        let mut code_lines = Vec::new();
        let mut blank_lines = 0;
        let mut i = start;
        loop {
            let before = toks.len();
            lex::lex_line(self.lines[i], i + 1, &mut toks).map_err(|e| ParseError {
                span: e.span,
                message: e.message,
                hint: e.hint,
            })?;
            if toks.len() > before || i == start {
                code_lines.push(i + 1);
            } else {
                blank_lines += 1;
            }
            for t in &toks[before..] {
                if let Tok::Punct(p) = t.tok {
                    match p {
                        "(" | "[" | "{" => stack.push((p, t.span())),
                        ")" | "]" | "}" => {
                            let want = match p {
                                ")" => "(",
                                "]" => "[",
                                _ => "{",
                            };
                            match stack.pop() {
                                Some((o, _)) if o == want => {}
                                Some((o, os)) => {
                                    return Err(perr(
                                        t.span(),
                                        format!(
                                            "expected the `{o}` opened at {}:{} to be closed \
                                             first, found `{p}`",
                                            os.line, os.col
                                        ),
                                        "brackets must be closed in the reverse order they \
                                         were opened",
                                    ))
                                }
                                None => {
                                    return Err(perr(
                                        t.span(),
                                        format!("unmatched `{p}`: no bracket is open here"),
                                        "remove the extra closing bracket",
                                    ))
                                }
                            }
                        }
                        _ => {}
                    }
                }
            }
            i += 1;
            let Some(&(open, open_span)) = stack.last() else {
                break;
            };
            // The statement continues only onto lines indented deeper than it, or onto a line
            // that closes a bracket; anything else means the bracket was never closed.
            let unterminated = || {
                let close = match open {
                    "(" => ")",
                    "[" => "]",
                    _ => "}",
                };
                perr(
                    open_span,
                    format!("unterminated `{open}`: expected a matching `{close}`"),
                    "the statement ends before its bracket is closed; the line may be truncated",
                )
            };
            let mut j = i;
            loop {
                let Some(l) = self.lines.get(j) else {
                    return Err(unterminated());
                };
                let t = l.trim_start();
                if t.is_empty() || t.starts_with('#') {
                    j += 1;
                    continue;
                }
                if indent_of(l) <= base && !t.starts_with([')', ']', '}']) {
                    return Err(unterminated());
                }
                break;
            }
            blank_lines += j - i;
            i = j;
        }
        let last = i - 1;
        let end = Span::new(last + 1, self.lines[last].chars().count() + 1);
        Ok(Logical {
            toks,
            first: start,
            next: i,
            end,
            code_lines,
            blank_lines,
        })
    }

    /// Closes the classes and functions a line at `indent` is outside of.
    fn close_frames(&mut self, indent: usize, line: usize) -> Result<(), SourceError> {
        while self.frames.last().is_some_and(|f| indent <= f.indent()) {
            let f = self.frames.pop().unwrap();
            self.finish_frame(f, Span::new(line, indent + 1), false)?;
        }
        Ok(())
    }

    fn finish_frame(&mut self, f: Frame, at: Span, eof: bool) -> Result<(), SourceError> {
        let Frame::Forward { builder, .. } = f else {
            return Ok(());
        };
        if !builder.returned {
            let (message, hint) = if eof {
                (
                    format!(
                        "expected a `return` statement ending `forward` (line {}), found the \
                         end of the file",
                        builder.def_line
                    ),
                    "the file looks truncated; capture or copy it again",
                )
            } else {
                (
                    format!(
                        "expected a `return` statement ending `forward` (line {}) before this \
                         line",
                        builder.def_line
                    ),
                    "every graph body ends with `return ...`; lines may be missing above",
                )
            };
            return Err(SourceError::new(self.file, Some(at), message).with_hint(hint));
        }
        let nested = self
            .frames
            .iter()
            .filter(|f| matches!(f, Frame::Class { .. }))
            .count();
        let class_name = self.frames.iter().rev().find_map(|f| match f {
            Frame::Class { name, .. } => Some(name.clone()),
            _ => None,
        });
        let mut graph = builder.graph;
        graph.path = Some(self.file.to_path_buf());
        if nested <= 1 {
            if self.top.is_some() {
                return Err(SourceError::new(
                    self.file,
                    Some(Span::new(builder.def_line, 1)),
                    "expected one top-level graph per file, found a second `forward`",
                )
                .with_hint("split the file so that each graph is in its own file"));
            }
            graph.name = self
                .file
                .file_stem()
                .map(|s| s.to_string_lossy().into_owned())
                .unwrap_or_default();
            self.top = Some(graph);
        } else {
            graph.name = class_name.unwrap_or_default();
            self.subgraphs.push(graph);
        }
        Ok(())
    }

    /// Handles one statement; returns true when it carries no graph content (imports and
    /// `name: type` declarations of the preamble).
    fn statement(&mut self, l: &Logical, indent: usize) -> Result<bool, ParseError> {
        let first = &l.toks[0];
        let in_forward = matches!(self.frames.last(), Some(Frame::Forward { .. }));
        if in_forward {
            let Some(Frame::Forward { builder, .. }) = self.frames.last_mut() else {
                unreachable!()
            };
            match builder.body_indent {
                None => builder.body_indent = Some(indent),
                Some(b) if b != indent => {
                    return Err(perr(
                        Span::new(first.line, 1),
                        format!(
                            "expected the body of `forward` to be indented by {b} columns like \
                             the lines above, found {indent}"
                        ),
                        "statements of one body must line up",
                    ))
                }
                _ => {}
            }
            builder.statement(&l.toks, l.end)?;
            return Ok(false);
        }
        if first.is_name("class") {
            let mut p = Parser::new(&l.toks, l.end);
            p.bump();
            // `class <lambda>(torch.nn.Module):` is what AOTAutograd debug dumps print.
            let mut name = String::new();
            while let Some(t) = p.peek() {
                if t.is_punct("(") || t.is_punct(":") {
                    break;
                }
                name.push_str(&match &t.tok {
                    Tok::Name(n) | Tok::Int(n) => n.clone(),
                    Tok::Punct(q) => q.to_string(),
                    _ => return Err(p.error("a class name", None)),
                });
                p.bump();
            }
            if name.is_empty() {
                return Err(p.error("a class name", None));
            }
            if p.eat_punct("(") {
                let mut depth = 1;
                while depth > 0 {
                    match p.bump() {
                        Some(t) if t.is_punct("(") => depth += 1,
                        Some(t) if t.is_punct(")") => depth -= 1,
                        Some(_) => {}
                        None => return Err(p.error("`)`", None)),
                    }
                }
            }
            p.expect_punct(":", Some("a class header ends with `:`"))?;
            p.expect_end(None)?;
            self.frames.push(Frame::Class { indent, name });
            return Ok(false);
        }
        if first.is_name("def") {
            let builder = Builder::from_def(&l.toks, l.end)?;
            self.frames.push(Frame::Forward {
                indent,
                builder: Box::new(builder),
            });
            return Ok(false);
        }
        if self.frames.is_empty() {
            if first.is_name("import") || first.is_name("from") {
                return import_statement(&l.toks, l.end).map(|_| true);
            }
            // `b8: type`, `fx_pytree: type`: declarations printed by some dumpers.
            if let [Token {
                tok: Tok::Name(_), ..
            }, colon, rest @ ..] = l.toks.as_slice()
            {
                if colon.is_punct(":") && !rest.iter().any(|t| t.is_punct("=")) {
                    let mut p = Parser::new(rest, l.end);
                    p.expr()?;
                    p.expect_end(None)?;
                    return Ok(true);
                }
            }
            return Err(perr(
                first.span(),
                format!(
                    "expected `class ...:`, `def forward(...):` or an import at the top level, \
                     found {}",
                    first.tok.describe()
                ),
                "a torch.fx readable file holds one `class X(torch.nn.Module):` with a \
                 `forward` method",
            ));
        }
        Err(perr(
            first.span(),
            format!(
                "expected `def forward(...):` or a nested `class` inside a class, found {}",
                first.tok.describe()
            ),
            "only the forward method of a graph module is read",
        ))
    }
}

fn import_statement(toks: &[Token], end: Span) -> Result<(), ParseError> {
    let mut p = Parser::new(toks, end);
    let kw = p.bump().unwrap();
    let dotted = |p: &mut Parser| -> Result<(), ParseError> {
        while p.eat_punct(".") {}
        p.expect_name("a module name")?;
        while p.eat_punct(".") {
            p.expect_name("a module name")?;
        }
        Ok(())
    };
    let names = |p: &mut Parser| -> Result<(), ParseError> {
        loop {
            if p.eat_punct("*") {
                return Ok(());
            }
            p.expect_name("a name to import")?;
            if p.peek().is_some_and(|t| t.is_name("as")) {
                p.bump();
                p.expect_name("a name after `as`")?;
            }
            if !p.eat_punct(",") {
                return Ok(());
            }
        }
    };
    if kw.is_name("from") {
        dotted(&mut p)?;
        if !p.peek().is_some_and(|t| t.is_name("import")) {
            return Err(p.error("`import`", None));
        }
        p.bump();
        let paren = p.eat_punct("(");
        names(&mut p)?;
        if paren {
            p.expect_punct(")", None)?;
        }
    } else {
        loop {
            dotted(&mut p)?;
            if p.peek().is_some_and(|t| t.is_name("as")) {
                p.bump();
                p.expect_name("a name after `as`")?;
            }
            if !p.eat_punct(",") {
                break;
            }
        }
    }
    p.expect_end(None)
}
