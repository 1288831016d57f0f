//! Type annotations: `"f32[8, 16]"`, `"i64[]"`, `"f32[s0, 8][8, 1]cuda:0"`, `"Sym(s0)"`.

use super::expr::ParseError;
use shardproof_ir::{DType, Dim, Span, TensorType};

/// What an annotation says.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Annotation {
    /// A plain tensor of this type.
    Tensor(TensorType),
    /// Something the IR does not type (a SymInt, a tensor subclass, a Python type name): the
    /// value exists, its type is not recorded.
    Opaque,
}

const DTYPE_HINT: &str =
    "supported element types: f64, f32, bf16, f16, f8e4m3fn, f8e5m2, i64, i32, \
                          i16, i8, u8, b8";

/// Parses the text of a string annotation; `span` is the position of its opening quote.
pub(crate) fn parse_annotation(s: &str, span: Span) -> Result<Annotation, ParseError> {
    let chars: Vec<char> = s.chars().collect();
    // Columns inside the string: the quote is at span.col, the first character one after.
    let at = |i: usize| Span::new(span.line, span.col + 1 + i);
    let err = |i: usize, message: String, hint: &str| ParseError {
        span: at(i),
        message,
        hint: Some(hint.to_string()),
    };
    // `Sym(s0)`, `DTensor(f32[8], S(0))`, `FunctionalTensor(...)`: wrappers of values whose type
    // the IR cannot hold.
    let ident_len = chars
        .iter()
        .take_while(|c| c.is_alphanumeric() || **c == '_' || **c == '.')
        .count();
    if ident_len > 0
        && chars[0].is_ascii_uppercase()
        && chars.get(ident_len) == Some(&'(')
        && chars.last() == Some(&')')
    {
        return Ok(Annotation::Opaque);
    }
    let dt_len = chars
        .iter()
        .take_while(|c| c.is_ascii_alphanumeric())
        .count();
    if chars.get(dt_len) != Some(&'[') {
        return Err(err(
            dt_len,
            format!("expected a tensor type such as \"f32[8, 16]\", found \"{s}\""),
            "tensor annotations are an element type followed by the shape in brackets",
        ));
    }
    let dname: String = chars[..dt_len].iter().collect();
    let dtype = DType::from_short_name(&dname).ok_or_else(|| {
        err(
            0,
            format!("unknown element type `{dname}` in the type annotation \"{s}\""),
            DTYPE_HINT,
        )
    })?;
    let close = matching_bracket(&chars, dt_len).ok_or_else(|| {
        err(
            dt_len,
            format!("expected `]` to close the shape in the type annotation \"{s}\""),
            "shapes look like `[8, 16]`, `[]` or `[s0, 8]`",
        )
    })?;
    let mut shape = Vec::new();
    let inner: String = chars[dt_len + 1..close].iter().collect();
    if !inner.trim().is_empty() {
        let mut start = dt_len + 1;
        for piece in split_top_level(&inner) {
            let t = piece.trim();
            let lead = piece.len() - piece.trim_start().len();
            if t.is_empty() {
                return Err(err(
                    start,
                    format!("expected a dimension in the type annotation \"{s}\""),
                    "shapes look like `[8, 16]`, `[]` or `[s0, 8]`",
                ));
            }
            if t.chars().all(|c| c.is_ascii_digit()) {
                let n = t.parse::<i64>().map_err(|_| {
                    err(
                        start + lead,
                        format!("dimension `{t}` is out of range"),
                        "dimensions are 64-bit integers",
                    )
                })?;
                shape.push(Dim::Known(n));
            } else if t
                .chars()
                .all(|c| c.is_alphanumeric() || " _+-*/%(),.".contains(c))
            {
                shape.push(Dim::Sym(t.to_string()));
            } else {
                return Err(err(
                    start + lead,
                    format!("expected a size or a symbolic size expression, found `{t}`"),
                    "dimensions are integers or symbols such as `s0` or `2*s1`",
                ));
            }
            start += piece.chars().count() + 1;
        }
    }
    // Optional strides (`[16, 1]`) and device (`cpu`, `cuda:0`) that print_readable adds with
    // include_stride / include_device: the IR does not keep layouts, only checks they are
    // well-formed.
    let mut i = close + 1;
    if chars.get(i) == Some(&'[') {
        let c = matching_bracket(&chars, i).ok_or_else(|| {
            err(
                i,
                format!("expected `]` to close the strides in \"{s}\""),
                "strides look like `[16, 1]`",
            )
        })?;
        let strides: String = chars[i + 1..c].iter().collect();
        if !strides
            .chars()
            .all(|ch| ch.is_alphanumeric() || " _+-*/%(),".contains(ch))
        {
            return Err(err(
                i,
                format!("malformed strides `[{strides}]`"),
                "strides look like `[16, 1]`",
            ));
        }
        i = c + 1;
    }
    if !chars[i..]
        .iter()
        .all(|c| c.is_ascii_alphanumeric() || *c == ':' || *c == '_')
    {
        return Err(err(
            i,
            format!("unexpected text after the shape in the type annotation \"{s}\""),
            "annotations look like \"f32[8, 16]\", optionally followed by strides and a device",
        ));
    }
    Ok(Annotation::Tensor(TensorType { dtype, shape }))
}

fn matching_bracket(chars: &[char], open: usize) -> Option<usize> {
    let mut depth = 0usize;
    for (i, c) in chars.iter().enumerate().skip(open) {
        match c {
            '[' | '(' => depth += 1,
            ']' | ')' => {
                depth = depth.checked_sub(1)?;
                if depth == 0 {
                    return (*c == ']').then_some(i);
                }
            }
            _ => {}
        }
    }
    None
}

/// Splits at commas outside parentheses (`Max(1, s0)` is one dimension).
fn split_top_level(s: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut depth = 0i32;
    let mut start = 0;
    for (i, c) in s.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' if depth == 0 => {
                out.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    out.push(&s[start..]);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(s: &str) -> Annotation {
        parse_annotation(s, Span::new(1, 1)).unwrap()
    }

    #[test]
    fn parses_tensor_annotations() {
        assert_eq!(
            t("f32[8, 16]"),
            Annotation::Tensor(TensorType::new(DType::F32, &[8, 16]))
        );
        assert_eq!(
            t("i64[]"),
            Annotation::Tensor(TensorType::new(DType::I64, &[]))
        );
        assert_eq!(
            t("b8[4, 8][8, 1]cuda:0"),
            Annotation::Tensor(TensorType::new(DType::Bool, &[4, 8]))
        );
        assert_eq!(
            t("f32[(s77//2), Max(1, s0)]"),
            Annotation::Tensor(TensorType {
                dtype: DType::F32,
                shape: vec![Dim::Sym("(s77//2)".into()), Dim::Sym("Max(1, s0)".into())]
            })
        );
        assert_eq!(t("Sym(2*s77)"), Annotation::Opaque);
    }

    #[test]
    fn rejects_unknown_dtypes_with_column() {
        let e = parse_annotation("c64[2]", Span::new(3, 10)).unwrap_err();
        assert_eq!(e.span, Span::new(3, 11));
        assert!(e.message.contains("c64"));
    }
}
