//! Expressions of the Python subset torch.fx prints, and their parser.

use super::lex::{Tok, Token};
use shardproof_ir::Span;

/// A parsed expression with the position of its first token.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Expr {
    pub kind: ExprKind,
    pub span: Span,
}

/// What an expression is.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum ExprKind {
    Name(String),
    Int(String),
    Float(f64),
    Str(String),
    Attr(Box<Expr>, String),
    Call {
        func: Box<Expr>,
        args: Vec<Expr>,
        kwargs: Vec<(String, Span, Expr)>,
    },
    Index(Box<Expr>, Box<Expr>),
    List(Vec<Expr>),
    Tuple(Vec<Expr>),
    Dict(Vec<(Expr, Expr)>),
    Unary(&'static str, Box<Expr>),
    Binary(&'static str, Box<Expr>, Box<Expr>),
}

impl Expr {
    /// The dotted path of a `a.b.c` expression, if it is one.
    pub(crate) fn dotted(&self) -> Option<Vec<&str>> {
        match &self.kind {
            ExprKind::Name(n) => Some(vec![n.as_str()]),
            ExprKind::Attr(base, a) => {
                let mut p = base.dotted()?;
                p.push(a.as_str());
                Some(p)
            }
            _ => None,
        }
    }
}

/// Precedence of a binary operator, loosest first, as in Python.
fn binary_precedence(p: &str) -> Option<u8> {
    Some(match p {
        "==" | "!=" | "<=" | ">=" | "<" | ">" => 0,
        "|" => 1,
        "^" => 2,
        "&" => 3,
        "<<" | ">>" => 4,
        "+" | "-" => 5,
        "*" | "//" | "/" | "%" | "@" => 6,
        _ => return None,
    })
}

/// A parse error: position, what was expected, a hint.
#[derive(Clone, Debug)]
pub(crate) struct ParseError {
    pub span: Span,
    pub message: String,
    pub hint: Option<String>,
}

/// A cursor over the tokens of one statement.
pub(crate) struct Parser<'a> {
    toks: &'a [Token],
    pos: usize,
    /// Where the statement ends, for "found end of line" errors.
    end: Span,
    /// Nesting depth, bounded so that hostile input cannot overflow the stack.
    depth: usize,
}

const MAX_DEPTH: usize = 200;

type PResult<T> = Result<T, ParseError>;

impl<'a> Parser<'a> {
    pub(crate) fn new(toks: &'a [Token], end: Span) -> Self {
        Parser {
            toks,
            pos: 0,
            end,
            depth: 0,
        }
    }

    pub(crate) fn peek(&self) -> Option<&'a Token> {
        self.toks.get(self.pos)
    }

    pub(crate) fn peek_at(&self, k: usize) -> Option<&'a Token> {
        self.toks.get(self.pos + k)
    }

    pub(crate) fn at_end(&self) -> bool {
        self.pos >= self.toks.len()
    }

    pub(crate) fn bump(&mut self) -> Option<&'a Token> {
        let t = self.toks.get(self.pos);
        self.pos += 1;
        t
    }

    /// The position of the next token, or of the end of the statement.
    pub(crate) fn here(&self) -> Span {
        self.peek().map(Token::span).unwrap_or(self.end)
    }

    pub(crate) fn found(&self) -> String {
        self.peek()
            .map(|t| t.tok.describe())
            .unwrap_or_else(|| "the end of the line".into())
    }

    pub(crate) fn error(&self, expected: &str, hint: Option<&str>) -> ParseError {
        ParseError {
            span: self.here(),
            message: format!("expected {expected}, found {}", self.found()),
            hint: hint.map(str::to_string),
        }
    }

    pub(crate) fn eat_punct(&mut self, p: &str) -> bool {
        if self.peek().is_some_and(|t| t.is_punct(p)) {
            self.pos += 1;
            true
        } else {
            false
        }
    }

    pub(crate) fn expect_punct(&mut self, p: &str, hint: Option<&str>) -> PResult<&'a Token> {
        match self.peek() {
            Some(t) if t.is_punct(p) => {
                self.pos += 1;
                Ok(t)
            }
            _ => Err(self.error(&format!("`{p}`"), hint)),
        }
    }

    pub(crate) fn expect_name(&mut self, what: &str) -> PResult<(String, Span)> {
        match self.peek() {
            Some(Token {
                tok: Tok::Name(n), ..
            }) => {
                let s = self.here();
                self.pos += 1;
                Ok((n.clone(), s))
            }
            _ => Err(self.error(what, None)),
        }
    }

    pub(crate) fn expect_end(&self, hint: Option<&str>) -> PResult<()> {
        if self.at_end() {
            Ok(())
        } else {
            Err(self.error("the end of the statement", hint))
        }
    }

    fn too_deep(&self) -> ParseError {
        ParseError {
            span: self.here(),
            message: format!("expression nested deeper than {MAX_DEPTH} levels"),
            hint: Some(
                "torch.fx never nests arguments this deeply; the file may be corrupted".into(),
            ),
        }
    }

    /// Parses one expression.
    pub(crate) fn expr(&mut self) -> PResult<Expr> {
        if self.depth >= MAX_DEPTH {
            return Err(self.too_deep());
        }
        self.depth += 1;
        let e = self.binary(0);
        self.depth -= 1;
        e
    }

    /// Parses `a, b, c` (a bare tuple when there is a comma, as after `return`).
    pub(crate) fn expr_list(&mut self) -> PResult<Expr> {
        let first = self.expr()?;
        if !self.peek().is_some_and(|t| t.is_punct(",")) {
            return Ok(first);
        }
        let span = first.span;
        let mut items = vec![first];
        while self.eat_punct(",") {
            if self.at_end() || self.peek().is_some_and(|t| t.is_punct("=")) {
                break;
            }
            items.push(self.expr()?);
        }
        Ok(Expr {
            kind: ExprKind::Tuple(items),
            span,
        })
    }

    fn expr_nested(&mut self, f: fn(&mut Self) -> PResult<Expr>) -> PResult<Expr> {
        if self.depth >= MAX_DEPTH {
            return Err(self.too_deep());
        }
        self.depth += 1;
        let e = f(self);
        self.depth -= 1;
        e
    }

    /// Binary operators by precedence climbing (one loop instead of one function per level,
    /// which matters because nearly every operand has no operator after it).
    fn binary(&mut self, min_prec: u8) -> PResult<Expr> {
        let mut lhs = self.factor()?;
        loop {
            let Some(Token {
                tok: Tok::Punct(p), ..
            }) = self.peek()
            else {
                return Ok(lhs);
            };
            let Some(prec) = binary_precedence(p) else {
                return Ok(lhs);
            };
            if prec < min_prec {
                return Ok(lhs);
            }
            let op: &'static str = p;
            self.pos += 1;
            if self.depth >= MAX_DEPTH {
                return Err(self.too_deep());
            }
            self.depth += 1;
            let rhs = self.binary(prec + 1);
            self.depth -= 1;
            let span = lhs.span;
            lhs = Expr {
                kind: ExprKind::Binary(op, Box::new(lhs), Box::new(rhs?)),
                span,
            };
        }
    }

    fn factor(&mut self) -> PResult<Expr> {
        for op in ["-", "+", "~"] {
            if self.peek().is_some_and(|t| t.is_punct(op)) {
                let span = self.here();
                self.pos += 1;
                let inner = self.expr_nested(Self::factor)?;
                return Ok(Expr {
                    kind: ExprKind::Unary(op, Box::new(inner)),
                    span,
                });
            }
        }
        self.power()
    }

    fn power(&mut self) -> PResult<Expr> {
        let base = self.postfix()?;
        if self.eat_punct("**") {
            let exp = self.expr_nested(Self::factor)?;
            let span = base.span;
            return Ok(Expr {
                kind: ExprKind::Binary("**", Box::new(base), Box::new(exp)),
                span,
            });
        }
        Ok(base)
    }

    fn postfix(&mut self) -> PResult<Expr> {
        let mut e = self.atom()?;
        loop {
            if self.eat_punct(".") {
                let (name, _) = self.expect_name("an attribute name after `.`")?;
                let span = e.span;
                e = Expr {
                    kind: ExprKind::Attr(Box::new(e), name),
                    span,
                };
            } else if self.peek().is_some_and(|t| t.is_punct("(")) {
                let open = self.bump().unwrap().span();
                let (args, kwargs) = self.call_args(open)?;
                let span = e.span;
                e = Expr {
                    kind: ExprKind::Call {
                        func: Box::new(e),
                        args,
                        kwargs,
                    },
                    span,
                };
            } else if self.peek().is_some_and(|t| t.is_punct("[")) {
                let open = self.bump().unwrap().span();
                let idx = self.expr_list()?;
                self.close("]", open)?;
                let span = e.span;
                e = Expr {
                    kind: ExprKind::Index(Box::new(e), Box::new(idx)),
                    span,
                };
            } else {
                return Ok(e);
            }
        }
    }

    fn close(&mut self, close: &str, open: Span) -> PResult<()> {
        if self.eat_punct(close) {
            return Ok(());
        }
        let opener = match close {
            ")" => "(",
            "]" => "[",
            _ => "{",
        };
        Err(ParseError {
            span: self.here(),
            message: format!(
                "expected `,` or `{close}` to close the `{opener}` at {}:{}, found {}",
                open.line,
                open.col,
                self.found()
            ),
            hint: Some("check for a missing comma or an unbalanced bracket".into()),
        })
    }

    #[allow(clippy::type_complexity)]
    fn call_args(&mut self, open: Span) -> PResult<(Vec<Expr>, Vec<(String, Span, Expr)>)> {
        let mut args = Vec::new();
        let mut kwargs: Vec<(String, Span, Expr)> = Vec::new();
        loop {
            if self.eat_punct(")") {
                return Ok((args, kwargs));
            }
            let is_kw = matches!(self.peek().map(|t| &t.tok), Some(Tok::Name(_)))
                && self.peek_at(1).is_some_and(|t| t.is_punct("="));
            if is_kw {
                let (k, ks) = self.expect_name("a keyword")?;
                self.pos += 1;
                let v = self.expr()?;
                if kwargs.iter().any(|(k2, _, _)| *k2 == k) {
                    return Err(ParseError {
                        span: ks,
                        message: format!("keyword argument `{k}` given twice"),
                        hint: Some("each keyword may appear once per call".into()),
                    });
                }
                kwargs.push((k, ks, v));
            } else {
                if !kwargs.is_empty() {
                    return Err(ParseError {
                        span: self.here(),
                        message: "expected a keyword argument `name = value`: positional \
                                  arguments cannot follow keyword arguments"
                            .into(),
                        hint: None,
                    });
                }
                args.push(self.expr()?);
            }
            if !self.eat_punct(",") {
                self.close(")", open)?;
                return Ok((args, kwargs));
            }
        }
    }

    fn seq(&mut self, close: &str, open: Span) -> PResult<(Vec<Expr>, bool)> {
        let mut items = Vec::new();
        let mut trailing_comma = false;
        loop {
            if self.eat_punct(close) {
                return Ok((items, trailing_comma));
            }
            items.push(self.expr()?);
            trailing_comma = self.eat_punct(",");
            if !trailing_comma {
                self.close(close, open)?;
                return Ok((items, false));
            }
        }
    }

    fn atom(&mut self) -> PResult<Expr> {
        let Some(t) = self.peek() else {
            return Err(self.error("a value", None));
        };
        let span = t.span();
        let kind = match &t.tok {
            Tok::Name(n) => ExprKind::Name(n.clone()),
            Tok::Int(i) => ExprKind::Int(i.clone()),
            Tok::Float(f) => ExprKind::Float(*f),
            Tok::Str(s) => {
                // Adjacent literals concatenate, as in Python.
                let mut s = s.clone();
                self.pos += 1;
                while let Some(Token {
                    tok: Tok::Str(more),
                    ..
                }) = self.peek()
                {
                    s.push_str(more);
                    self.pos += 1;
                }
                return Ok(Expr {
                    kind: ExprKind::Str(s),
                    span,
                });
            }
            Tok::Punct("(") => {
                self.pos += 1;
                let (items, trailing) = self.seq(")", span)?;
                if items.len() == 1 && !trailing {
                    let mut inner = items.into_iter().next().unwrap();
                    inner.span = span;
                    return Ok(inner);
                }
                return Ok(Expr {
                    kind: ExprKind::Tuple(items),
                    span,
                });
            }
            Tok::Punct("[") => {
                self.pos += 1;
                let (items, _) = self.seq("]", span)?;
                return Ok(Expr {
                    kind: ExprKind::List(items),
                    span,
                });
            }
            Tok::Punct("{") => {
                self.pos += 1;
                let mut items = Vec::new();
                loop {
                    if self.eat_punct("}") {
                        break;
                    }
                    let k = self.expr()?;
                    self.expect_punct(":", Some("dict entries look like `key: value`"))?;
                    let v = self.expr()?;
                    items.push((k, v));
                    if !self.eat_punct(",") {
                        self.close("}", span)?;
                        break;
                    }
                }
                return Ok(Expr {
                    kind: ExprKind::Dict(items),
                    span,
                });
            }
            _ => return Err(self.error("a value", None)),
        };
        self.pos += 1;
        Ok(Expr { kind, span })
    }
}
