//! Clean expressions over rank tensors (`expr:` in a case file): how a spec tensor is rebuilt from
//! the ranks' tensors when no placement describes it.

use crate::lex::{lex, Cursor, SyntaxError, Tok};
use crate::suggest::did_you_mean_suffix;
use shardproof_ir::Span;
use std::fmt;

/// A clean expression with the position where it starts in the case file.
#[derive(Clone, Debug, PartialEq)]
pub struct Expr {
    /// What the expression computes.
    pub kind: ExprKind,
    /// Where it starts (the operator name or the tensor reference).
    pub span: Span,
}

/// The clean operators. Dims and indices may be negative (counted from the end), as in torch.
#[derive(Clone, Debug, PartialEq)]
pub enum ExprKind {
    /// `rK.name`: tensor `name` of rank `K`.
    Tensor {
        /// The rank.
        rank: usize,
        /// The value name in that rank's graph.
        name: String,
    },
    /// `concat([..], dim)`.
    Concat {
        /// The concatenated expressions, in order.
        parts: Vec<Expr>,
        /// The dim they are joined along.
        dim: i64,
    },
    /// `slice(e, dim, start, end)`: elements `start..end` of `dim`.
    Slice {
        /// The sliced expression.
        input: Box<Expr>,
        /// The sliced dim.
        dim: i64,
        /// First index (inclusive).
        start: i64,
        /// Last index (exclusive).
        end: i64,
    },
    /// `sum([..])`: element-wise sum of same-shaped expressions.
    Sum(Vec<Expr>),
    /// `transpose(e, d0, d1)`.
    Transpose {
        /// The transposed expression.
        input: Box<Expr>,
        /// First dim.
        dim0: i64,
        /// Second dim.
        dim1: i64,
    },
    /// `permute(e, [..])`.
    Permute {
        /// The permuted expression.
        input: Box<Expr>,
        /// The new order of the dims.
        dims: Vec<i64>,
    },
    /// `reshape(e, [..])` (one size may be `-1`).
    Reshape {
        /// The reshaped expression.
        input: Box<Expr>,
        /// The new shape.
        shape: Vec<i64>,
    },
    /// `select(e, dim, i)`: index `i` of `dim`, which is removed.
    Select {
        /// The expression indexed.
        input: Box<Expr>,
        /// The dim removed.
        dim: i64,
        /// The index kept.
        index: i64,
    },
    /// `unsqueeze(e, dim)`: a new size-1 dim at `dim`.
    Unsqueeze {
        /// The expression.
        input: Box<Expr>,
        /// Where the new dim goes.
        dim: i64,
    },
}

const OPERATORS: [&str; 8] = [
    "concat",
    "slice",
    "sum",
    "transpose",
    "permute",
    "reshape",
    "select",
    "unsqueeze",
];

const HINT: &str =
    "expressions use `rK.name` and `concat([..], dim)`, `slice(e, dim, start, end)`, \
                    `sum([..])`, `transpose(e, d0, d1)`, `permute(e, [..])`, `reshape(e, [..])`, \
                    `select(e, dim, i)`, `unsqueeze(e, dim)`";

fn list<T>(s: &[T], f: &mut fmt::Formatter<'_>) -> fmt::Result
where
    T: fmt::Display,
{
    f.write_str("[")?;
    for (i, x) in s.iter().enumerate() {
        if i > 0 {
            f.write_str(", ")?;
        }
        write!(f, "{x}")?;
    }
    f.write_str("]")
}

impl fmt::Display for Expr {
    /// Prints the expression in the syntax it is parsed from.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.kind {
            ExprKind::Tensor { rank, name } => write!(f, "r{rank}.{name}"),
            ExprKind::Concat { parts, dim } => {
                f.write_str("concat(")?;
                list(parts, f)?;
                write!(f, ", {dim})")
            }
            ExprKind::Slice {
                input,
                dim,
                start,
                end,
            } => write!(f, "slice({input}, {dim}, {start}, {end})"),
            ExprKind::Sum(parts) => {
                f.write_str("sum(")?;
                list(parts, f)?;
                f.write_str(")")
            }
            ExprKind::Transpose { input, dim0, dim1 } => {
                write!(f, "transpose({input}, {dim0}, {dim1})")
            }
            ExprKind::Permute { input, dims } => {
                write!(f, "permute({input}, ")?;
                list(dims, f)?;
                f.write_str(")")
            }
            ExprKind::Reshape { input, shape } => {
                write!(f, "reshape({input}, ")?;
                list(shape, f)?;
                f.write_str(")")
            }
            ExprKind::Select { input, dim, index } => write!(f, "select({input}, {dim}, {index})"),
            ExprKind::Unsqueeze { input, dim } => write!(f, "unsqueeze({input}, {dim})"),
        }
    }
}

impl Expr {
    /// Every `rK.name` the expression reads, in order of appearance, with its position.
    pub fn tensors(&self) -> Vec<(usize, &str, Span)> {
        let mut out = Vec::new();
        self.walk(&mut |e| {
            if let ExprKind::Tensor { rank, name } = &e.kind {
                out.push((*rank, name.as_str(), e.span));
            }
        });
        out
    }

    fn walk<'a>(&'a self, f: &mut dyn FnMut(&'a Expr)) {
        f(self);
        match &self.kind {
            ExprKind::Tensor { .. } => {}
            ExprKind::Concat { parts, .. } | ExprKind::Sum(parts) => {
                parts.iter().for_each(|p| p.walk(f))
            }
            ExprKind::Slice { input, .. }
            | ExprKind::Transpose { input, .. }
            | ExprKind::Permute { input, .. }
            | ExprKind::Reshape { input, .. }
            | ExprKind::Select { input, .. }
            | ExprKind::Unsqueeze { input, .. } => input.walk(f),
        }
    }

    /// The shape the expression evaluates to, given the shape of each rank tensor it reads
    /// (`None` from `shape_of`: the tensor is unknown or its shape is not concrete, and then the
    /// result is `Ok(None)`). Errors carry the position of the offending sub-expression.
    pub fn infer_shape(
        &self,
        shape_of: &dyn Fn(usize, &str) -> Option<Vec<i64>>,
    ) -> Result<Option<Vec<i64>>, (Span, String)> {
        let err = |m: String| Err((self.span, m));
        let one = |e: &Expr| e.infer_shape(shape_of);
        Ok(Some(match &self.kind {
            ExprKind::Tensor { rank, name } => match shape_of(*rank, name) {
                Some(s) => s,
                None => return Ok(None),
            },
            ExprKind::Concat { parts, dim } => {
                let mut out: Option<Vec<i64>> = None;
                let mut d = 0;
                for p in parts {
                    let Some(s) = one(p)? else { return Ok(None) };
                    match &mut out {
                        None => {
                            d = match norm_dim(*dim, s.len()) {
                                Some(d) => d,
                                None => return err(out_of_range(*dim, s.len())),
                            };
                            out = Some(s);
                        }
                        Some(acc) => {
                            let compatible = acc.len() == s.len()
                                && acc
                                    .iter()
                                    .zip(&s)
                                    .enumerate()
                                    .all(|(i, (a, b))| i == d || a == b);
                            if !compatible {
                                return Err((
                                    p.span,
                                    format!(
                                        "concat: shape {} does not match {} outside dim {dim}",
                                        fmt_shape(&s),
                                        fmt_shape(acc)
                                    ),
                                ));
                            }
                            acc[d] = acc[d].saturating_add(s[d]);
                        }
                    }
                }
                match out {
                    Some(s) => s,
                    None => return err("concat of an empty list".into()),
                }
            }
            ExprKind::Sum(parts) => {
                let mut out: Option<Vec<i64>> = None;
                for p in parts {
                    let Some(s) = one(p)? else { return Ok(None) };
                    if let Some(acc) = &out {
                        if *acc != s {
                            return Err((
                                p.span,
                                format!(
                                    "sum: shape {} differs from {}",
                                    fmt_shape(&s),
                                    fmt_shape(acc)
                                ),
                            ));
                        }
                    }
                    out = Some(s);
                }
                match out {
                    Some(s) => s,
                    None => return err("sum of an empty list".into()),
                }
            }
            ExprKind::Slice {
                input,
                dim,
                start,
                end,
            } => {
                let Some(mut s) = one(input)? else {
                    return Ok(None);
                };
                let Some(d) = norm_dim(*dim, s.len()) else {
                    return err(out_of_range(*dim, s.len()));
                };
                if !(0 <= *start && start <= end && *end <= s[d]) {
                    return err(format!(
                        "slice {start}..{end} is outside dim {dim} of size {} (shape {})",
                        s[d],
                        fmt_shape(&s)
                    ));
                }
                s[d] = end - start;
                s
            }
            ExprKind::Transpose { input, dim0, dim1 } => {
                let Some(mut s) = one(input)? else {
                    return Ok(None);
                };
                let (Some(a), Some(b)) = (norm_dim(*dim0, s.len()), norm_dim(*dim1, s.len()))
                else {
                    return err(format!(
                        "transpose dims {dim0}, {dim1} are out of range for shape {}",
                        fmt_shape(&s)
                    ));
                };
                s.swap(a, b);
                s
            }
            ExprKind::Permute { input, dims } => {
                let Some(s) = one(input)? else {
                    return Ok(None);
                };
                let idx: Option<Vec<usize>> = dims.iter().map(|d| norm_dim(*d, s.len())).collect();
                let ok = idx.as_ref().is_some_and(|idx| {
                    let mut sorted = idx.clone();
                    sorted.sort_unstable();
                    sorted == (0..s.len()).collect::<Vec<_>>()
                });
                match idx {
                    Some(idx) if ok => idx.iter().map(|&i| s[i]).collect(),
                    _ => {
                        return err(format!(
                            "permute dims {dims:?} are not a permutation of the {} dims of {}",
                            s.len(),
                            fmt_shape(&s)
                        ))
                    }
                }
            }
            ExprKind::Reshape { input, shape } => {
                let Some(s) = one(input)? else {
                    return Ok(None);
                };
                let prod = |xs: &[i64]| {
                    xs.iter()
                        .filter(|&&x| x != -1)
                        .try_fold(1i128, |acc, &x| acc.checked_mul(i128::from(x)))
                };
                let numel = prod(&s).unwrap_or(-1);
                let known = prod(shape).unwrap_or(-2);
                let wild = shape.iter().filter(|&&x| x == -1).count();
                let bad = shape.iter().any(|&x| x < -1);
                let out: Option<Vec<i64>> = match wild {
                    _ if bad => None,
                    0 if known == numel => Some(shape.clone()),
                    1 if known > 0 && numel % known == 0 => {
                        let w = i64::try_from(numel / known).ok();
                        w.map(|w| shape.iter().map(|&x| if x == -1 { w } else { x }).collect())
                    }
                    _ => None,
                };
                match out {
                    Some(o) => o,
                    None => return err(format!("cannot reshape {} into {shape:?}", fmt_shape(&s))),
                }
            }
            ExprKind::Select { input, dim, index } => {
                let Some(mut s) = one(input)? else {
                    return Ok(None);
                };
                let Some(d) = norm_dim(*dim, s.len()) else {
                    return err(out_of_range(*dim, s.len()));
                };
                let i = if *index < 0 { index + s[d] } else { *index };
                if !(0..s[d]).contains(&i) {
                    return err(format!(
                        "select index {index} is outside dim {dim} of size {}",
                        s[d]
                    ));
                }
                s.remove(d);
                s
            }
            ExprKind::Unsqueeze { input, dim } => {
                let Some(mut s) = one(input)? else {
                    return Ok(None);
                };
                let Some(d) = norm_dim(*dim, s.len() + 1) else {
                    return err(out_of_range(*dim, s.len() + 1));
                };
                s.insert(d, 1);
                s
            }
        }))
    }
}

fn norm_dim(d: i64, rank: usize) -> Option<usize> {
    let r = i64::try_from(rank).ok()?;
    let d = if d < 0 { d + r } else { d };
    (0..r).contains(&d).then_some(d as usize)
}

fn out_of_range(d: i64, rank: usize) -> String {
    format!("dim {d} is out of range for a tensor of rank {rank}")
}

/// `[2, 3]`.
pub(crate) fn fmt_shape(s: &[i64]) -> String {
    let parts: Vec<String> = s.iter().map(i64::to_string).collect();
    format!("[{}]", parts.join(", "))
}

/// Parses a clean expression; `at` maps a char offset in `text` to its position in the file.
pub(crate) fn parse_expr(text: &str, at: &dyn Fn(usize) -> Span) -> Result<Expr, SyntaxError> {
    let mut c = Cursor::new(lex(text)?);
    let e = expr(&mut c, at)?;
    let t = c.peek();
    if t.tok != Tok::End {
        return Err(SyntaxError::new(
            t.offset,
            format!(
                "unexpected {} after the end of the expression",
                t.tok.describe()
            ),
            HINT,
        ));
    }
    Ok(e)
}

fn int(c: &mut Cursor, what: &str) -> Result<i64, SyntaxError> {
    let t = c.next();
    match t.tok {
        Tok::Int(i) => Ok(i),
        other => Err(SyntaxError::new(
            t.offset,
            format!("expected {what} (an integer), found {}", other.describe()),
            HINT,
        )),
    }
}

fn comma(c: &mut Cursor) -> Result<(), SyntaxError> {
    c.expect(&Tok::Comma, "`,`", HINT).map(|_| ())
}

fn int_list(c: &mut Cursor, what: &str) -> Result<Vec<i64>, SyntaxError> {
    c.expect(&Tok::LBrack, &format!("`[` starting {what}"), HINT)?;
    let mut out = Vec::new();
    if c.peek().tok == Tok::RBrack {
        c.next();
        return Ok(out);
    }
    loop {
        out.push(int(c, what)?);
        let t = c.next();
        match t.tok {
            Tok::Comma => continue,
            Tok::RBrack => return Ok(out),
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

fn expr_list(c: &mut Cursor, at: &dyn Fn(usize) -> Span) -> Result<Vec<Expr>, SyntaxError> {
    c.expect(&Tok::LBrack, "`[` starting a list of expressions", HINT)?;
    let mut out = Vec::new();
    if c.peek().tok == Tok::RBrack {
        let t = c.next();
        return Err(SyntaxError::new(t.offset, "the list is empty", HINT));
    }
    loop {
        out.push(expr(c, at)?);
        let t = c.next();
        match t.tok {
            Tok::Comma => continue,
            Tok::RBrack => return Ok(out),
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

fn expr(c: &mut Cursor, at: &dyn Fn(usize) -> Span) -> Result<Expr, SyntaxError> {
    c.enter(HINT)?;
    let r = expr_inner(c, at);
    c.leave();
    r
}

fn expr_inner(c: &mut Cursor, at: &dyn Fn(usize) -> Span) -> Result<Expr, SyntaxError> {
    let t = c.next();
    let span = at(t.offset);
    let Tok::Ident(name) = t.tok else {
        return Err(SyntaxError::new(
            t.offset,
            format!(
                "expected a tensor `rK.name` or an operator, found {}",
                t.tok.describe()
            ),
            HINT,
        ));
    };
    if c.peek().tok != Tok::LParen {
        return tensor_ref(&name, t.offset, span);
    }
    if !OPERATORS.contains(&name.as_str()) {
        return Err(SyntaxError::new(
            t.offset,
            format!(
                "`{name}` is not a clean operator{}",
                did_you_mean_suffix(&name, OPERATORS)
            ),
            HINT,
        ));
    }
    c.next();
    let kind = match name.as_str() {
        "concat" => {
            let parts = expr_list(c, at)?;
            comma(c)?;
            let dim = int(c, "the concat dim")?;
            ExprKind::Concat { parts, dim }
        }
        "sum" => ExprKind::Sum(expr_list(c, at)?),
        "slice" => {
            let input = Box::new(expr(c, at)?);
            comma(c)?;
            let dim = int(c, "the slice dim")?;
            comma(c)?;
            let start = int(c, "the slice start")?;
            comma(c)?;
            let end = int(c, "the slice end")?;
            ExprKind::Slice {
                input,
                dim,
                start,
                end,
            }
        }
        "transpose" => {
            let input = Box::new(expr(c, at)?);
            comma(c)?;
            let dim0 = int(c, "the first transposed dim")?;
            comma(c)?;
            let dim1 = int(c, "the second transposed dim")?;
            ExprKind::Transpose { input, dim0, dim1 }
        }
        "permute" => {
            let input = Box::new(expr(c, at)?);
            comma(c)?;
            let dims = int_list(c, "the permutation")?;
            ExprKind::Permute { input, dims }
        }
        "reshape" => {
            let input = Box::new(expr(c, at)?);
            comma(c)?;
            let shape = int_list(c, "the new shape")?;
            ExprKind::Reshape { input, shape }
        }
        "select" => {
            let input = Box::new(expr(c, at)?);
            comma(c)?;
            let dim = int(c, "the selected dim")?;
            comma(c)?;
            let index = int(c, "the selected index")?;
            ExprKind::Select { input, dim, index }
        }
        _ => {
            let input = Box::new(expr(c, at)?);
            comma(c)?;
            let dim = int(c, "the new dim")?;
            ExprKind::Unsqueeze { input, dim }
        }
    };
    c.expect(
        &Tok::RParen,
        &format!("`)` closing `{name}(`"),
        &format!("check the number of arguments of `{name}`; {HINT}"),
    )?;
    Ok(Expr { kind, span })
}

fn tensor_ref(name: &str, offset: usize, span: Span) -> Result<Expr, SyntaxError> {
    let bad = || {
        SyntaxError::new(
            offset,
            format!("`{name}` is not a rank tensor reference"),
            "write `rK.name` for tensor `name` of rank K, e.g. `r0.mm_3`",
        )
    };
    let (r, tensor) = name.split_once('.').ok_or_else(bad)?;
    let digits = r.strip_prefix('r').ok_or_else(bad)?;
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) || tensor.is_empty() {
        return Err(bad());
    }
    let rank = digits.parse::<usize>().map_err(|_| bad())?;
    Ok(Expr {
        kind: ExprKind::Tensor {
            rank,
            name: tensor.to_string(),
        },
        span,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(o: usize) -> Span {
        Span::new(1, o + 1)
    }

    #[test]
    fn parses_and_prints_the_contract_example() {
        let text = "concat([slice(r0.odd, 0, 0, 64), slice(r1.odd, 0, 0, 64), \
                    slice(r0.odd, 0, 64, 128), slice(r1.odd, 0, 64, 128)], 0)";
        let e = parse_expr(text, &at).unwrap();
        assert_eq!(e.to_string(), text);
        assert_eq!(e.tensors().len(), 4);
        assert_eq!(e.tensors()[1].2, Span::new(1, 40));
        let shape = e.infer_shape(&|_, _| Some(vec![128, 4])).unwrap().unwrap();
        assert_eq!(shape, vec![256, 4]);
    }

    #[test]
    fn every_operator_parses() {
        for t in [
            "sum([r0.a, r1.a])",
            "transpose(r0.a, 0, 1)",
            "permute(r0.a, [1, 0])",
            "reshape(r0.a, [-1])",
            "select(r0.a, 0, -1)",
            "unsqueeze(r0.a, 0)",
        ] {
            let e = parse_expr(t, &at).unwrap();
            assert_eq!(e.to_string(), t);
            e.infer_shape(&|_, _| Some(vec![2, 3])).unwrap().unwrap();
        }
    }

    #[test]
    fn syntax_errors_point_at_the_token() {
        let e = parse_expr("concat([r0.a, r1.a] 0)", &at).unwrap_err();
        assert_eq!(e.offset, 20);
        let e = parse_expr("concatt([r0.a], 0)", &at).unwrap_err();
        assert!(e.message.contains("did you mean `concat`"), "{}", e.message);
        let e = parse_expr("slice(x.a, 0, 0, 1)", &at).unwrap_err();
        assert_eq!(e.offset, 6);
        assert!(parse_expr("", &at).is_err());
        assert!(parse_expr("sum([])", &at).is_err());
        let deep = format!("{}r0.a{}", "sum([".repeat(500), "])".repeat(500));
        assert!(parse_expr(&deep, &at).is_err());
    }

    #[test]
    fn shape_errors() {
        let e = parse_expr("slice(r0.a, 0, 0, 9)", &at).unwrap();
        assert!(e.infer_shape(&|_, _| Some(vec![4])).is_err());
        let e = parse_expr("concat([r0.a, r1.b], 0)", &at).unwrap();
        let err = e
            .infer_shape(&|_, n| Some(if n == "a" { vec![2, 3] } else { vec![2, 4] }))
            .unwrap_err();
        assert_eq!(err.0, Span::new(1, 15));
    }
}
