//! The plan format's tokens and statements (see docs/formats/plan.md). Every error names the
//! file, line and column, what was expected and a hint; nothing here panics on user input.

use shardproof_case::{Placement, Reduce};
use shardproof_ir::{SourceError, Span};
use std::path::Path;

/// A token with its position.
#[derive(Clone, Debug, PartialEq)]
pub(super) struct Tok {
    pub kind: TokKind,
    pub span: Span,
}

#[derive(Clone, Debug, PartialEq)]
pub(super) enum TokKind {
    Ident(String),
    Int(i64),
    Float(f64),
    Str(String),
    Punct(char),
}

impl TokKind {
    fn describe(&self) -> String {
        match self {
            TokKind::Ident(s) => format!("`{s}`"),
            TokKind::Int(i) => format!("`{i}`"),
            TokKind::Float(f) => format!("`{f}`"),
            TokKind::Str(s) => format!("the string {s:?}"),
            TokKind::Punct(c) => format!("`{c}`"),
        }
    }
}

/// An argument expression.
#[derive(Clone, Debug, PartialEq)]
pub(super) enum ExprKind {
    /// A name: a tensor, a group, a reduction (`sum`), `True` / `False` / `None`.
    Name(String),
    /// An integer; `signed` when written with an explicit `+` or `-` (a relative peer).
    Int {
        value: i64,
        signed: bool,
    },
    Float(f64),
    Str(String),
    List(Vec<Expr>),
    /// `f32[8, 16]`: a dtype and a shape.
    Type {
        dtype: String,
        shape: Vec<i64>,
    },
}

/// An expression with where it starts.
#[derive(Clone, Debug, PartialEq)]
pub(super) struct Expr {
    pub kind: ExprKind,
    pub span: Span,
}

/// A name with where it is written.
#[derive(Clone, Debug, PartialEq)]
pub(super) struct Name {
    pub text: String,
    pub span: Span,
}

/// `OP(ARGS, KEY=VALUE)`.
#[derive(Clone, Debug, PartialEq)]
pub(super) struct Call {
    pub op: Name,
    pub args: Vec<Expr>,
    pub kwargs: Vec<(Name, Expr)>,
}

/// `DIM=PLACEMENT` in an `input` or `output` line.
#[derive(Clone, Debug, PartialEq)]
pub(super) struct PlacedOn {
    pub dim: Name,
    pub placement: Placement,
}

/// `DIM=COORD[,COORD...]` in an `on` header.
#[derive(Clone, Debug, PartialEq)]
pub(super) struct Restriction {
    pub dim: Name,
    pub coords: Vec<usize>,
}

/// One statement.
#[derive(Clone, Debug, PartialEq)]
pub(super) enum StmtKind {
    Input {
        name: Name,
        dtype: Name,
        shape: Vec<i64>,
        placements: Vec<PlacedOn>,
    },
    Output {
        name: Name,
        placements: Vec<PlacedOn>,
    },
    /// `a, b = op(...)` (targets empty for a bare call).
    Call { targets: Vec<Name>, call: Call },
}

/// A statement, the `on` block it is in (empty: every rank) and where it starts.
#[derive(Clone, Debug, PartialEq)]
pub(super) struct Stmt {
    pub kind: StmtKind,
    pub on: Vec<Restriction>,
    pub span: Span,
}

/// A parsed plan.
#[derive(Clone, Debug, PartialEq)]
pub(super) struct PlanAst {
    pub name: Option<Name>,
    pub mesh: Vec<(Name, usize)>,
    pub mesh_span: Option<Span>,
    pub groups: Vec<(Name, Vec<Name>)>,
    /// Every `on` header, empty blocks included (their coordinates are checked too).
    pub blocks: Vec<Vec<Restriction>>,
    pub stmts: Vec<Stmt>,
}

const PLACEMENTS: &str =
    "write `DIM=Shard(d)`, `DIM=Replicate()` or `DIM=Partial()` (also `Partial(avg|max|min)`, or `S(d)`, `R`, `P`)";

struct Lexer<'a> {
    file: &'a Path,
}

impl Lexer<'_> {
    fn err(&self, span: Span, message: impl Into<String>, hint: &str) -> SourceError {
        SourceError::new(self.file, Some(span), message).with_hint(hint)
    }

    /// The tokens of one line (a `#` starts a comment).
    fn line(&self, line_no: usize, text: &str) -> Result<Vec<Tok>, SourceError> {
        let chars: Vec<char> = text.chars().collect();
        let mut out = Vec::new();
        let mut i = 0;
        while i < chars.len() {
            let c = chars[i];
            let span = Span::new(line_no, i + 1);
            if c.is_whitespace() {
                i += 1;
            } else if c == '#' {
                break;
            } else if c.is_ascii_alphabetic() || c == '_' {
                let start = i;
                while i < chars.len()
                    && (chars[i].is_ascii_alphanumeric() || chars[i] == '_' || chars[i] == '.')
                {
                    i += 1;
                }
                let word: String = chars[start..i].iter().collect();
                out.push(Tok {
                    kind: TokKind::Ident(word),
                    span,
                });
            } else if c.is_ascii_digit() {
                let start = i;
                let mut float = false;
                while i < chars.len() {
                    let d = chars[i];
                    if d.is_ascii_digit() {
                        i += 1;
                    } else if d == '.' || d == 'e' || d == 'E' {
                        float = true;
                        i += 1;
                        if (d == 'e' || d == 'E')
                            && i < chars.len()
                            && (chars[i] == '-' || chars[i] == '+')
                        {
                            i += 1;
                        }
                    } else {
                        break;
                    }
                }
                let word: String = chars[start..i].iter().collect();
                let kind = if float {
                    word.parse::<f64>().map(TokKind::Float).ok()
                } else {
                    word.parse::<i64>().map(TokKind::Int).ok()
                };
                match kind {
                    Some(k) => out.push(Tok { kind: k, span }),
                    None => {
                        return Err(self.err(
                            span,
                            format!("`{word}` is not a number"),
                            "write an integer (`16`) or a decimal number (`1e-5`, `0.5`)",
                        ))
                    }
                }
            } else if c == '"' || c == '\'' {
                let start = i;
                i += 1;
                while i < chars.len() && chars[i] != c {
                    i += 1;
                }
                if i == chars.len() {
                    return Err(self.err(
                        span,
                        "a string that is not closed on its line",
                        &format!("end the string with {c}"),
                    ));
                }
                let s: String = chars[start + 1..i].iter().collect();
                i += 1;
                out.push(Tok {
                    kind: TokKind::Str(s),
                    span,
                });
            } else if "()[]{},=:+-".contains(c) {
                out.push(Tok {
                    kind: TokKind::Punct(c),
                    span,
                });
                i += 1;
            } else {
                return Err(self.err(
                    span,
                    format!("unexpected character `{c}`"),
                    "a plan line is a declaration (`mesh`, `group`, `input`, `output`, `on`), \
                     a call `name = op(args)` or `}`; `#` starts a comment",
                ));
            }
        }
        Ok(out)
    }
}

/// A cursor over one line's tokens.
struct Cursor<'a> {
    file: &'a Path,
    toks: &'a [Tok],
    pos: usize,
    /// Where the line ends (for "expected X at end of line").
    end: Span,
}

impl<'a> Cursor<'a> {
    fn peek(&self) -> Option<&'a Tok> {
        self.toks.get(self.pos)
    }

    fn here(&self) -> Span {
        self.peek().map_or(self.end, |t| t.span)
    }

    fn err(&self, message: impl Into<String>, hint: &str) -> SourceError {
        SourceError::new(self.file, Some(self.here()), message).with_hint(hint)
    }

    fn found(&self) -> String {
        self.peek()
            .map_or("the end of the line".into(), |t| t.kind.describe())
    }

    fn is_punct(&self, c: char) -> bool {
        matches!(self.peek(), Some(Tok { kind: TokKind::Punct(p), .. }) if *p == c)
    }

    fn eat_punct(&mut self, c: char) -> bool {
        if self.is_punct(c) {
            self.pos += 1;
            true
        } else {
            false
        }
    }

    fn expect_punct(&mut self, c: char, what: &str, hint: &str) -> Result<Span, SourceError> {
        let span = self.here();
        if self.eat_punct(c) {
            Ok(span)
        } else {
            Err(self.err(
                format!("expected `{c}` {what}, found {}", self.found()),
                hint,
            ))
        }
    }

    fn ident(&mut self, what: &str, hint: &str) -> Result<Name, SourceError> {
        match self.peek() {
            Some(Tok {
                kind: TokKind::Ident(s),
                span,
            }) => {
                self.pos += 1;
                Ok(Name {
                    text: s.clone(),
                    span: *span,
                })
            }
            _ => Err(self.err(format!("expected {what}, found {}", self.found()), hint)),
        }
    }

    fn int(&mut self, what: &str, hint: &str) -> Result<(i64, Span), SourceError> {
        let span = self.here();
        let neg = self.eat_punct('-');
        match self.peek() {
            Some(Tok {
                kind: TokKind::Int(i),
                ..
            }) => {
                self.pos += 1;
                Ok((if neg { -i } else { *i }, span))
            }
            _ => Err(self.err(format!("expected {what}, found {}", self.found()), hint)),
        }
    }

    fn done(&self, hint: &str) -> Result<(), SourceError> {
        match self.peek() {
            None => Ok(()),
            Some(t) => Err(SourceError::new(
                self.file,
                Some(t.span),
                format!("expected the end of the line, found {}", t.kind.describe()),
            )
            .with_hint(hint)),
        }
    }

    /// `[8, 16]` (the `[` not yet read).
    fn shape(&mut self) -> Result<Vec<i64>, SourceError> {
        let hint = "a shape is a list of sizes: `f32[8, 16]` (`f32[]` for a scalar)";
        self.expect_punct('[', "to open the shape", hint)?;
        let mut dims = Vec::new();
        if self.eat_punct(']') {
            return Ok(dims);
        }
        loop {
            let (d, span) = self.int("a size", hint)?;
            if d < 0 {
                return Err(SourceError::new(
                    self.file,
                    Some(span),
                    format!("size {d} is negative"),
                )
                .with_hint(hint));
            }
            dims.push(d);
            if self.eat_punct(']') {
                return Ok(dims);
            }
            self.expect_punct(',', "between sizes", hint)?;
        }
    }

    /// An argument expression.
    fn expr(&mut self) -> Result<Expr, SourceError> {
        let span = self.here();
        let hint = "an argument is a tensor or other name, a number, a string, a list `[...]` \
                    or a type `f32[8, 16]`";
        let Some(tok) = self.peek() else {
            return Err(self.err("expected an argument, found the end of the line", hint));
        };
        let kind = match &tok.kind {
            TokKind::Punct(c @ ('+' | '-')) => {
                let negative = *c == '-';
                self.pos += 1;
                match self.peek().map(|t| &t.kind) {
                    Some(TokKind::Int(i)) => {
                        let i = *i;
                        self.pos += 1;
                        ExprKind::Int {
                            value: if negative { -i } else { i },
                            signed: true,
                        }
                    }
                    Some(TokKind::Float(f)) => {
                        let f = *f;
                        self.pos += 1;
                        ExprKind::Float(if negative { -f } else { f })
                    }
                    _ => {
                        return Err(self.err(
                            format!("expected a number after `{c}`, found {}", self.found()),
                            hint,
                        ))
                    }
                }
            }
            TokKind::Int(i) => {
                self.pos += 1;
                ExprKind::Int {
                    value: *i,
                    signed: false,
                }
            }
            TokKind::Float(f) => {
                self.pos += 1;
                ExprKind::Float(*f)
            }
            TokKind::Str(s) => {
                self.pos += 1;
                ExprKind::Str(s.clone())
            }
            TokKind::Punct('[') => {
                self.pos += 1;
                let mut items = Vec::new();
                if !self.eat_punct(']') {
                    loop {
                        items.push(self.expr()?);
                        if self.eat_punct(']') {
                            break;
                        }
                        self.expect_punct(',', "between list items", hint)?;
                    }
                }
                ExprKind::List(items)
            }
            TokKind::Ident(s) => {
                let s = s.clone();
                self.pos += 1;
                if self.is_punct('[') {
                    let shape = self.shape()?;
                    ExprKind::Type { dtype: s, shape }
                } else {
                    ExprKind::Name(s)
                }
            }
            TokKind::Punct(_) => {
                return Err(self.err(
                    format!("expected an argument, found {}", self.found()),
                    hint,
                ))
            }
        };
        Ok(Expr { kind, span })
    }

    /// `op(args, key=value)`, the op name already read.
    fn call(&mut self, op: Name) -> Result<Call, SourceError> {
        let hint = "a call is `op(arg, ..., key=value)`";
        self.expect_punct('(', &format!("after the operator `{}`", op.text), hint)?;
        let mut args = Vec::new();
        let mut kwargs = Vec::new();
        if !self.eat_punct(')') {
            loop {
                let keyword = matches!(
                    (self.peek(), self.toks.get(self.pos + 1)),
                    (
                        Some(Tok {
                            kind: TokKind::Ident(_),
                            ..
                        }),
                        Some(Tok {
                            kind: TokKind::Punct('='),
                            ..
                        })
                    )
                );
                if keyword {
                    let key = self.ident("a keyword", hint)?;
                    self.pos += 1;
                    kwargs.push((key, self.expr()?));
                } else {
                    if let Some((key, _)) = kwargs.first() {
                        return Err(self.err(
                            format!(
                                "a positional argument after the keyword argument `{}`",
                                key.text
                            ),
                            "write positional arguments first",
                        ));
                    }
                    args.push(self.expr()?);
                }
                if self.eat_punct(')') {
                    break;
                }
                self.expect_punct(',', "between arguments", hint)?;
            }
        }
        Ok(Call { op, args, kwargs })
    }

    /// `Shard(d)`, `Replicate()`, `Partial(op)` and their short forms.
    fn placement(&mut self) -> Result<Placement, SourceError> {
        let head = self.ident("a placement", PLACEMENTS)?;
        let mut arg: Option<Tok> = None;
        if self.eat_punct('(') {
            if !self.is_punct(')') {
                // `dim=0` and `reduce_op=sum` as DTensor prints them.
                if matches!(
                    self.toks.get(self.pos + 1),
                    Some(Tok {
                        kind: TokKind::Punct('='),
                        ..
                    })
                ) {
                    self.pos += 2;
                }
                arg = self.peek().cloned();
                self.pos += 1;
            }
            self.expect_punct(')', "to close the placement", PLACEMENTS)?;
        }
        let bad = |m: String| SourceError::new(self.file, Some(head.span), m).with_hint(PLACEMENTS);
        match (head.text.as_str(), arg.map(|t| t.kind)) {
            ("Shard" | "S", Some(TokKind::Int(d))) if d >= 0 => Ok(Placement::Shard(d as usize)),
            ("Shard" | "S", other) => Err(bad(format!(
                "`{}` needs a non-negative tensor dim, found {}",
                head.text,
                other.map_or("nothing".into(), |k| k.describe())
            ))),
            ("Replicate" | "R", None) => Ok(Placement::Replicate),
            ("Partial" | "P", None) => Ok(Placement::Partial(Reduce::Sum)),
            ("Partial" | "P", Some(TokKind::Ident(r) | TokKind::Str(r))) => {
                match r.to_ascii_lowercase().as_str() {
                    "sum" => Ok(Placement::Partial(Reduce::Sum)),
                    "avg" | "mean" => Ok(Placement::Partial(Reduce::Avg)),
                    "max" => Ok(Placement::Partial(Reduce::Max)),
                    "min" => Ok(Placement::Partial(Reduce::Min)),
                    _ => Err(bad(format!(
                        "`{r}` is not a reduction: expected `sum`, `avg`, `max` or `min`"
                    ))),
                }
            }
            (h, _) => Err(bad(format!("`{h}` is not a placement"))),
        }
    }

    /// `DIM=PLACEMENT ...` to the end of the line.
    fn placements(&mut self) -> Result<Vec<PlacedOn>, SourceError> {
        let mut out = Vec::new();
        while self.peek().is_some() {
            let dim = self.ident("a mesh dim", PLACEMENTS)?;
            self.expect_punct(
                '=',
                &format!("after the mesh dim `{}`", dim.text),
                PLACEMENTS,
            )?;
            let placement = self.placement()?;
            out.push(PlacedOn { dim, placement });
        }
        Ok(out)
    }
}

/// Parses a plan's text (`file` names it in errors).
pub(super) fn parse(file: &Path, text: &str) -> Result<PlanAst, SourceError> {
    let lexer = Lexer { file };
    let mut ast = PlanAst {
        name: None,
        mesh: Vec::new(),
        mesh_span: None,
        groups: Vec::new(),
        blocks: Vec::new(),
        stmts: Vec::new(),
    };
    // The open `on` block: its restriction and where it opened.
    let mut block: Option<(Vec<Restriction>, Span)> = None;
    let mut seen_statement = false;
    for (i, line) in text.lines().enumerate() {
        let line_no = i + 1;
        let toks = lexer.line(line_no, line)?;
        if toks.is_empty() {
            continue;
        }
        let end = Span::new(line_no, line.chars().count() + 1);
        let mut c = Cursor {
            file,
            toks: &toks,
            pos: 0,
            end,
        };
        let start = toks[0].span;
        if c.eat_punct('}') {
            if block.take().is_none() {
                return Err(
                    SourceError::new(file, Some(start), "`}` closes no `on` block")
                        .with_hint("open a block with `on DIM=COORD {`"),
                );
            }
            c.done("write `}` alone on its line")?;
            continue;
        }
        let head = c.ident(
            "a statement",
            "a plan line is `plan`, `mesh`, `group`, `input`, `output`, `on`, a call \
             `name = op(args)` or `}`",
        )?;
        let next_is_eq = c.is_punct('=') || c.is_punct(',');
        match head.text.as_str() {
            "plan" if !next_is_eq => {
                if seen_statement || ast.name.is_some() || ast.mesh_span.is_some() {
                    return Err(SourceError::new(
                        file,
                        Some(start),
                        "`plan` must be the first line",
                    )
                    .with_hint("name the plan once, before `mesh`"));
                }
                ast.name = Some(c.ident("the plan's name", "write `plan NAME`")?);
                c.done("write `plan NAME`")?;
            }
            "mesh" if !next_is_eq => {
                let hint = "write `mesh tp=2` or `mesh dp=2 tp=2` (outermost dim first)";
                if ast.mesh_span.is_some() {
                    return Err(SourceError::new(file, Some(start), "a second `mesh` line")
                        .with_hint("a plan has one mesh"));
                }
                if seen_statement {
                    return Err(SourceError::new(
                        file,
                        Some(start),
                        "`mesh` must come before the statements",
                    )
                    .with_hint(hint));
                }
                ast.mesh_span = Some(start);
                while c.peek().is_some() {
                    let dim = c.ident("a mesh dim name", hint)?;
                    c.expect_punct('=', &format!("after the mesh dim `{}`", dim.text), hint)?;
                    let (size, span) = c.int("the mesh dim's size", hint)?;
                    if size < 1 {
                        return Err(SourceError::new(
                            file,
                            Some(span),
                            format!("mesh dim `{}` has size {size}", dim.text),
                        )
                        .with_hint("a mesh dim has at least one coordinate"));
                    }
                    if ast.mesh.iter().any(|(d, _)| d.text == dim.text) {
                        return Err(SourceError::new(
                            file,
                            Some(dim.span),
                            format!("mesh dim `{}` is named twice", dim.text),
                        )
                        .with_hint(hint));
                    }
                    ast.mesh.push((dim, size as usize));
                }
                if ast.mesh.is_empty() {
                    return Err(c.err("expected at least one mesh dim", hint));
                }
            }
            "group" if !next_is_eq => {
                let hint = "write `group NAME = DIM DIM ...`: a group over several mesh dims \
                            (each mesh dim is already a group of its own name)";
                let name = c.ident("the group's name", hint)?;
                c.expect_punct('=', "after the group's name", hint)?;
                let mut dims = Vec::new();
                while c.peek().is_some() {
                    dims.push(c.ident("a mesh dim", hint)?);
                }
                if dims.is_empty() {
                    return Err(c.err("expected the group's mesh dims", hint));
                }
                ast.groups.push((name, dims));
            }
            "on" if !next_is_eq => {
                let hint = "write `on DIM=COORD {` (or `on pp=0,1 dp=0 {`) and close it with `}`";
                if let Some((_, opened)) = &block {
                    return Err(SourceError::new(
                        file,
                        Some(start),
                        format!(
                            "an `on` block inside the one opened at line {}",
                            opened.line
                        ),
                    )
                    .with_hint("close the open block with `}` first; blocks do not nest"));
                }
                let mut rs = Vec::new();
                while !c.is_punct('{') {
                    let dim = c.ident("a mesh dim", hint)?;
                    c.expect_punct('=', &format!("after the mesh dim `{}`", dim.text), hint)?;
                    let mut coords = Vec::new();
                    loop {
                        let (k, span) = c.int("a coordinate", hint)?;
                        if k < 0 {
                            return Err(SourceError::new(
                                file,
                                Some(span),
                                format!("coordinate {k} is negative"),
                            )
                            .with_hint(hint));
                        }
                        coords.push(k as usize);
                        if !c.eat_punct(',') {
                            break;
                        }
                    }
                    rs.push(Restriction { dim, coords });
                }
                c.expect_punct('{', "to open the block", hint)?;
                c.done("statements of the block go on the following lines")?;
                if rs.is_empty() {
                    return Err(SourceError::new(
                        file,
                        Some(start),
                        "an `on` block names no ranks",
                    )
                    .with_hint(hint));
                }
                ast.blocks.push(rs.clone());
                block = Some((rs, start));
            }
            "input" if !next_is_eq => {
                seen_statement = true;
                let hint =
                    "write `input NAME: DTYPE[SHAPE] DIM=PLACEMENT ...` with the global shape";
                let name = c.ident("the input's name", hint)?;
                c.expect_punct(':', "after the input's name", hint)?;
                let dtype = c.ident("a dtype (`f32`, `bf16`, `i64`, ...)", hint)?;
                let shape = c.shape()?;
                let placements = c.placements()?;
                ast.stmts.push(Stmt {
                    kind: StmtKind::Input {
                        name,
                        dtype,
                        shape,
                        placements,
                    },
                    on: block.as_ref().map(|b| b.0.clone()).unwrap_or_default(),
                    span: start,
                });
            }
            "output" if !next_is_eq => {
                seen_statement = true;
                let name = c.ident("the output's name", "write `output NAME DIM=PLACEMENT ...`")?;
                let placements = c.placements()?;
                ast.stmts.push(Stmt {
                    kind: StmtKind::Output { name, placements },
                    on: block.as_ref().map(|b| b.0.clone()).unwrap_or_default(),
                    span: start,
                });
            }
            _ => {
                seen_statement = true;
                let hint = "write `name = op(args)`, `a, b = op(args)` or `op(args)`";
                let mut targets = Vec::new();
                let call = if c.is_punct('(') {
                    c.call(head)?
                } else {
                    targets.push(head);
                    while c.eat_punct(',') {
                        targets.push(c.ident("a result name", hint)?);
                    }
                    c.expect_punct('=', "after the result names", hint)?;
                    let op = c.ident("an operator", hint)?;
                    c.call(op)?
                };
                c.done("one statement per line")?;
                ast.stmts.push(Stmt {
                    kind: StmtKind::Call { targets, call },
                    on: block.as_ref().map(|b| b.0.clone()).unwrap_or_default(),
                    span: start,
                });
            }
        }
    }
    if let Some((_, opened)) = block {
        return Err(
            SourceError::new(file, Some(opened), "this `on` block is never closed")
                .with_hint("close it with `}` on a line of its own"),
        );
    }
    if ast.mesh_span.is_none() {
        return Err(
            SourceError::new(file, Some(Span::new(1, 1)), "the plan has no `mesh` line")
                .with_hint("start the plan with `mesh tp=2` (one `DIM=SIZE` per mesh dim)"),
        );
    }
    Ok(ast)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_err(text: &str) -> String {
        parse(Path::new("p.plan"), text).unwrap_err().to_string()
    }

    #[test]
    fn parses_statements_and_blocks() {
        let ast = parse(
            Path::new("p.plan"),
            "plan demo\nmesh pp=2 tp=2\ninput x: f32[8, 16] tp=S(1)\non pp=1 {\n  \
             y, z = op(x, [1, -2], k=+1, t=f32[2])\n}\noutput y tp=Partial(max)\n",
        )
        .unwrap();
        assert_eq!(ast.name.unwrap().text, "demo");
        assert_eq!(ast.mesh.len(), 2);
        assert_eq!(ast.stmts.len(), 3);
        let StmtKind::Call { targets, call } = &ast.stmts[1].kind else {
            panic!()
        };
        assert_eq!(targets.len(), 2);
        assert_eq!(ast.stmts[1].on[0].coords, vec![1]);
        assert_eq!(
            call.kwargs[0].1.kind,
            ExprKind::Int {
                value: 1,
                signed: true
            }
        );
        assert!(ast.stmts[2].on.is_empty());
    }

    #[test]
    fn errors_name_line_column_and_hint() {
        let e = parse_err("mesh tp=2\ninput x: f32[8, 16] tp=Shard(a)\n");
        assert!(e.starts_with("p.plan:2:24: `Shard` needs"), "{e}");
        assert!(e.contains("hint:"), "{e}");
        let e = parse_err("mesh tp=2\ny = mm(x, w\n");
        assert!(
            e.starts_with("p.plan:2:12: expected `,` between arguments, found the end"),
            "{e}"
        );
        let e = parse_err("mesh tp=2\non tp=0 {\ny = relu(x)\n");
        assert!(
            e.starts_with("p.plan:2:1: this `on` block is never closed"),
            "{e}"
        );
        let e = parse_err("input x: f32[2]\n");
        assert!(e.contains("no `mesh` line") || e.contains("before"), "{e}");
        let e = parse_err("mesh tp=2\ny = relu(x) $\n");
        assert!(e.starts_with("p.plan:2:13: unexpected character"), "{e}");
    }
}
