//! Decompositions of custom operators (`ops:` values such as `"gelu(add($0, $1))"`).

use crate::lex::{lex, Cursor, SyntaxError, Tok};
use shardproof_ir::{DecompExpr, OpName, Span};

const HINT: &str =
    "a decomposition is a call of known operators over `$0`, `$1`, ... and literals, \
                    e.g. `gelu(add($0, $1))`; short names mean `aten.<name>.default`, full names \
                    are `namespace.name.overload`";

/// Parses a decomposition. Besides the expression it returns every operator called with its
/// position, so that a registry check can point at the call.
pub(crate) fn parse_decomposition(
    text: &str,
    at: &dyn Fn(usize) -> Span,
) -> Result<(DecompExpr, Vec<(OpName, Span)>), SyntaxError> {
    let mut c = Cursor::new(lex(text)?);
    let mut calls = Vec::new();
    let e = item(&mut c, at, &mut calls)?;
    let t = c.peek();
    if t.tok != Tok::End {
        return Err(SyntaxError::new(
            t.offset,
            format!(
                "unexpected {} after the end of the decomposition",
                t.tok.describe()
            ),
            HINT,
        ));
    }
    if !matches!(e, DecompExpr::Call { .. }) {
        return Err(SyntaxError::new(
            0,
            "a decomposition must be an operator call",
            "write `identity` when the operator returns its first argument; otherwise a call \
             such as `gelu($0)`",
        ));
    }
    Ok((e, calls))
}

/// Resolves an operator as written: dotted names are full names, bare names are ATen defaults.
pub(crate) fn resolve_op_name(name: &str) -> Option<OpName> {
    if name.contains('.') {
        OpName::parse(name)
    } else {
        Some(OpName::new("aten", name, "default"))
    }
}

fn item(
    c: &mut Cursor,
    at: &dyn Fn(usize) -> Span,
    calls: &mut Vec<(OpName, Span)>,
) -> Result<DecompExpr, SyntaxError> {
    c.enter(HINT)?;
    let r = item_inner(c, at, calls);
    c.leave();
    r
}

fn item_inner(
    c: &mut Cursor,
    at: &dyn Fn(usize) -> Span,
    calls: &mut Vec<(OpName, Span)>,
) -> Result<DecompExpr, SyntaxError> {
    let t = c.next();
    match t.tok {
        Tok::Arg(i) => Ok(DecompExpr::Arg(i)),
        Tok::Int(i) => Ok(DecompExpr::Int(i)),
        Tok::Float(f) => Ok(DecompExpr::Float(f)),
        Tok::Str(s) => Ok(DecompExpr::Str(s)),
        Tok::LBrack => {
            let mut items = Vec::new();
            if c.peek().tok == Tok::RBrack {
                c.next();
                return Ok(DecompExpr::List(items));
            }
            loop {
                items.push(item(c, at, calls)?);
                let t = c.next();
                match t.tok {
                    Tok::Comma => continue,
                    Tok::RBrack => return Ok(DecompExpr::List(items)),
                    other => {
                        return Err(SyntaxError::new(
                            t.offset,
                            format!("expected `,` or `]`, found {}", other.describe()),
                            HINT,
                        ))
                    }
                }
            }
        }
        Tok::Ident(name) if c.peek().tok != Tok::LParen => match name.as_str() {
            "true" | "True" => Ok(DecompExpr::Bool(true)),
            "false" | "False" => Ok(DecompExpr::Bool(false)),
            "inf" => Ok(DecompExpr::Float(f64::INFINITY)),
            "nan" => Ok(DecompExpr::Float(f64::NAN)),
            _ => Err(SyntaxError::new(
                t.offset,
                format!("`{name}` is neither a call nor a literal"),
                format!("arguments are `$0`, `$1`, ...; to call `{name}`, write `{name}(...)`"),
            )),
        },
        Tok::Ident(name) => {
            let op = resolve_op_name(&name).ok_or_else(|| {
                SyntaxError::new(
                    t.offset,
                    format!("`{name}` is not an operator name"),
                    "full names have two or three dotted parts: `namespace.name.overload`",
                )
            })?;
            calls.push((op.clone(), at(t.offset)));
            c.next();
            let mut args = Vec::new();
            if c.peek().tok == Tok::RParen {
                c.next();
                return Ok(DecompExpr::Call { op, args });
            }
            loop {
                args.push(item(c, at, calls)?);
                let t = c.next();
                match t.tok {
                    Tok::Comma => continue,
                    Tok::RParen => return Ok(DecompExpr::Call { op, args }),
                    other => {
                        return Err(SyntaxError::new(
                            t.offset,
                            format!("expected `,` or `)`, found {}", other.describe()),
                            HINT,
                        ))
                    }
                }
            }
        }
        other => Err(SyntaxError::new(
            t.offset,
            format!(
                "expected an argument `$i`, a literal or a call, found {}",
                other.describe()
            ),
            HINT,
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(o: usize) -> Span {
        Span::new(1, o + 1)
    }

    #[test]
    fn parses_nested_calls_and_literals() {
        let (e, calls) = parse_decomposition("gelu(add($0, $1))", &at).unwrap();
        assert_eq!(
            e,
            DecompExpr::Call {
                op: OpName::new("aten", "gelu", "default"),
                args: vec![DecompExpr::Call {
                    op: OpName::new("aten", "add", "default"),
                    args: vec![DecompExpr::Arg(0), DecompExpr::Arg(1)],
                }],
            }
        );
        assert_eq!(calls[1].1, Span::new(1, 6));
        let (e, _) =
            parse_decomposition("aten.sum.dim_IntList($0, [0, -1], True, 1.5)", &at).unwrap();
        let DecompExpr::Call { op, args } = e else {
            panic!()
        };
        assert_eq!(op.to_string(), "aten.sum.dim_IntList");
        assert_eq!(
            args[1],
            DecompExpr::List(vec![DecompExpr::Int(0), DecompExpr::Int(-1)])
        );
        assert_eq!(args[2], DecompExpr::Bool(true));
        assert_eq!(args[3], DecompExpr::Float(1.5));
    }

    #[test]
    fn rejects_bad_text() {
        assert!(parse_decomposition("$0", &at).is_err());
        assert!(parse_decomposition("gelu($0", &at).is_err());
        assert!(parse_decomposition("a.b.c.d($0)", &at).is_err());
        assert_eq!(parse_decomposition("gelu(x)", &at).unwrap_err().offset, 5);
    }
}
