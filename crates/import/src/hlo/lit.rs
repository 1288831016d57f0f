//! Literals known at import time: constants, and the integer arithmetic the SPMD partitioner
//! builds from `partition-id` (offset tables, `dynamic-slice` of them, multiplies and adds).

use super::lex::{Tok, Token};
use super::parse::{perr, PErr};

/// The most elements a folded literal may have.
pub(crate) const FOLD_LIMIT: usize = 4096;

/// The values of a literal, row-major.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum LitData {
    /// Every element has this value (a broadcast scalar).
    Uniform(f64),
    /// Every element.
    Dense(Vec<f64>),
}

/// A literal array: HLO element type name, dims and values.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Lit {
    pub elem: String,
    pub dims: Vec<i64>,
    pub data: LitData,
}

/// Row-major strides of `dims`.
pub(crate) fn strides(dims: &[i64]) -> Vec<i64> {
    let mut s = vec![1i64; dims.len()];
    for i in (0..dims.len().saturating_sub(1)).rev() {
        s[i] = s[i + 1] * dims[i + 1];
    }
    s
}

fn numel(dims: &[i64]) -> usize {
    dims.iter().product::<i64>().max(0) as usize
}

impl Lit {
    pub(crate) fn uniform(&self) -> Option<f64> {
        match &self.data {
            LitData::Uniform(v) => Some(*v),
            LitData::Dense(d) => {
                let first = *d.first()?;
                d.iter()
                    .all(|&x| x.to_bits() == first.to_bits())
                    .then_some(first)
            }
        }
    }

    pub(crate) fn numel(&self) -> usize {
        numel(&self.dims)
    }

    pub(crate) fn get(&self, i: usize) -> Option<f64> {
        match &self.data {
            LitData::Uniform(v) => (i < self.numel()).then_some(*v),
            LitData::Dense(d) => d.get(i).copied(),
        }
    }

    fn dense(&self) -> Option<Vec<f64>> {
        if self.numel() > FOLD_LIMIT {
            return None;
        }
        Some(match &self.data {
            LitData::Uniform(v) => vec![*v; self.numel()],
            LitData::Dense(d) => d.clone(),
        })
    }

    /// Elements at multi-index positions computed by `src` for each output index.
    fn gather(&self, out_dims: &[i64], src: impl Fn(&[i64]) -> Option<usize>) -> Option<Lit> {
        if let LitData::Uniform(v) = self.data {
            return Some(Lit {
                elem: self.elem.clone(),
                dims: out_dims.to_vec(),
                data: LitData::Uniform(v),
            });
        }
        let n = numel(out_dims);
        if n > FOLD_LIMIT {
            return None;
        }
        let st = strides(out_dims);
        let mut out = Vec::with_capacity(n);
        let mut idx = vec![0i64; out_dims.len()];
        for flat in 0..n as i64 {
            for (d, s) in st.iter().enumerate() {
                idx[d] = (flat / s) % out_dims[d].max(1);
            }
            out.push(self.get(src(&idx)?)?);
        }
        Some(Lit {
            elem: self.elem.clone(),
            dims: out_dims.to_vec(),
            data: LitData::Dense(out),
        })
    }

    pub(crate) fn reshape(&self, dims: &[i64]) -> Option<Lit> {
        (numel(dims) == self.numel()).then(|| Lit {
            elem: self.elem.clone(),
            dims: dims.to_vec(),
            data: self.data.clone(),
        })
    }

    /// HLO broadcast: operand dim i becomes output dim `bdims[i]`.
    pub(crate) fn broadcast(&self, out: &[i64], bdims: &[i64]) -> Option<Lit> {
        let st = strides(&self.dims);
        self.gather(out, |idx| {
            let mut f = 0;
            for (i, &b) in bdims.iter().enumerate() {
                f += idx.get(b as usize)? * st.get(i)?;
            }
            usize::try_from(f).ok()
        })
    }

    pub(crate) fn transpose(&self, perm: &[i64], out: &[i64]) -> Option<Lit> {
        let st = strides(&self.dims);
        self.gather(out, |idx| {
            let mut f = 0;
            for (o, &p) in perm.iter().enumerate() {
                f += idx.get(o)? * st.get(p as usize)?;
            }
            usize::try_from(f).ok()
        })
    }

    /// `starts`, `strides_` per dim, output dims `out`.
    pub(crate) fn slice(&self, starts: &[i64], steps: &[i64], out: &[i64]) -> Option<Lit> {
        let st = strides(&self.dims);
        self.gather(out, |idx| {
            let mut f = 0;
            for (d, &i) in idx.iter().enumerate() {
                f += (starts.get(d)? + i * steps.get(d)?) * st.get(d)?;
            }
            usize::try_from(f).ok()
        })
    }

    pub(crate) fn concat(parts: &[&Lit], dim: usize, out: &[i64]) -> Option<Lit> {
        let first = parts.first()?;
        let mut data = Vec::new();
        let outer: i64 = out.get(..dim)?.iter().product();
        let datas: Vec<Vec<f64>> = parts.iter().map(|p| p.dense()).collect::<Option<_>>()?;
        for o in 0..outer {
            for (p, d) in parts.iter().zip(&datas) {
                let inner: i64 = p.dims.get(dim..)?.iter().product();
                let s = (o * inner) as usize;
                data.extend_from_slice(d.get(s..s + inner as usize)?);
            }
        }
        (data.len() == numel(out) && data.len() <= FOLD_LIMIT).then(|| Lit {
            elem: first.elem.clone(),
            dims: out.to_vec(),
            data: LitData::Dense(data),
        })
    }

    /// Elementwise map over same-shaped literals, into element type `elem`.
    pub(crate) fn map(parts: &[&Lit], elem: &str, f: impl Fn(&[f64]) -> f64) -> Option<Lit> {
        let first = parts.first()?;
        if parts.iter().any(|p| p.dims != first.dims) {
            return None;
        }
        let data = if let Some(vals) = parts
            .iter()
            .map(|p| match p.data {
                LitData::Uniform(v) => Some(v),
                _ => None,
            })
            .collect::<Option<Vec<f64>>>()
        {
            LitData::Uniform(f(&vals))
        } else {
            let datas: Vec<Vec<f64>> = parts.iter().map(|p| p.dense()).collect::<Option<_>>()?;
            let n = first.numel();
            LitData::Dense(
                (0..n)
                    .map(|i| f(&datas.iter().map(|d| d[i]).collect::<Vec<_>>()))
                    .collect(),
            )
        };
        Some(Lit {
            elem: elem.to_string(),
            dims: first.dims.clone(),
            data,
        })
    }

    pub(crate) fn iota(elem: &str, dims: &[i64], dim: usize) -> Option<Lit> {
        let n = numel(dims);
        if n > FOLD_LIMIT || dim >= dims.len() {
            return None;
        }
        let st = strides(dims);
        Some(Lit {
            elem: elem.to_string(),
            dims: dims.to_vec(),
            data: LitData::Dense(
                (0..n as i64)
                    .map(|f| ((f / st[dim]) % dims[dim]) as f64)
                    .collect(),
            ),
        })
    }
}

/// Wraps an integer result to the range of an HLO integer element type.
pub(crate) fn wrap_int(elem: &str, v: f64) -> f64 {
    let bits = match elem {
        "s8" | "u8" => 8,
        "s16" | "u16" => 16,
        "s32" | "u32" => 32,
        _ => return v,
    };
    let m = 1i128 << bits;
    let mut x = (v as i128).rem_euclid(m);
    if elem.starts_with('s') && x >= m / 2 {
        x -= m;
    }
    x as f64
}

fn number(tok: &Token, line: usize, elem: &str) -> Result<f64, PErr> {
    let bad = || {
        perr(
            line,
            tok.col,
            format!("expected a literal element, found {}", tok.describe()),
            "a constant holds numbers (`1`, `-2.5`, `1e-05`, `inf`, `-inf`, `nan`) or `true`/`false`",
        )
    };
    let w = tok.word().ok_or_else(bad)?;
    let v = match w {
        "true" => 1.0,
        "false" => 0.0,
        "inf" => f64::INFINITY,
        "-inf" => f64::NEG_INFINITY,
        "nan" | "-nan" => f64::NAN,
        _ => w.parse::<f64>().map_err(|_| bad())?,
    };
    if is_int(elem) && v.fract() != 0.0 {
        return Err(bad());
    }
    Ok(v)
}

fn is_int(elem: &str) -> bool {
    elem.starts_with('s') || elem.starts_with('u')
}

/// The literal of `constant(...)`: its tokens (inside the parentheses), element type and dims.
/// `Ok(None)` where XLA elided the values (`{...}`).
pub(crate) fn parse_literal(
    toks: &[Token],
    elem: &str,
    dims: &[i64],
    line: usize,
    col: usize,
) -> Result<Option<Lit>, PErr> {
    let mut toks = toks;
    // An old form prints the shape first: `constant(f32[2] {1, 2})`.
    if toks.len() > 1 && toks[1].is_punct("[") {
        match toks.iter().position(|t| t.is_punct("]")) {
            Some(p) => {
                toks = &toks[p + 1..];
                if toks.first().is_some_and(|t| t.is_punct("{"))
                    && toks.len() > 2
                    && !toks[1].is_punct("{")
                    && toks.iter().filter(|t| t.is_punct("{")).count() > 1
                {
                    // layout braces then the value
                    if let Some(q) = toks.iter().position(|t| t.is_punct("}")) {
                        toks = &toks[q + 1..];
                    }
                }
            }
            None => {
                return Err(perr(
                    line,
                    col,
                    "a constant's shape is not closed",
                    "expected `]`",
                ))
            }
        }
    }
    if toks.iter().any(|t| t.word() == Some("...")) {
        return Ok(None);
    }
    let mut vals = Vec::new();
    for t in toks {
        match &t.tok {
            Tok::Punct("{") | Tok::Punct("}") | Tok::Punct(",") => {}
            Tok::Word(_) => vals.push(number(t, line, elem)?),
            _ => {
                return Err(perr(
                    line,
                    t.col,
                    format!("expected a literal element, found {}", t.describe()),
                    "a constant reads `constant(1.5)` or `constant({1, 2})`",
                ))
            }
        }
    }
    let n = numel(dims);
    if vals.len() != n {
        return Err(perr(
            line,
            toks.first().map_or(col, |t| t.col),
            format!(
                "the constant has {} elements but its shape has {n}",
                vals.len()
            ),
            "a constant's literal holds one value per element of its shape",
        ));
    }
    Ok(Some(Lit {
        elem: elem.to_string(),
        dims: dims.to_vec(),
        data: LitData::Dense(vals),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hlo::lex::lex_line;

    fn lit(text: &str, elem: &str, dims: &[i64]) -> Lit {
        parse_literal(&lex_line(text).unwrap(), elem, dims, 1, 1)
            .unwrap()
            .unwrap()
    }

    #[test]
    fn literals_parse() {
        assert_eq!(lit("-inf", "f32", &[]).get(0), Some(f64::NEG_INFINITY));
        assert_eq!(
            lit("{ { 1, 2 }, { 3, 4 } }", "s32", &[2, 2]).data,
            LitData::Dense(vec![1.0, 2.0, 3.0, 4.0])
        );
        assert_eq!(lit("true", "pred", &[]).get(0), Some(1.0));
        assert_eq!(lit("f32[2] {1, 2}", "f32", &[2]).get(1), Some(2.0));
        assert!(
            parse_literal(&lex_line("{...}").unwrap(), "f32", &[100], 1, 1)
                .unwrap()
                .is_none()
        );
        let e = parse_literal(&lex_line("{1, 2}").unwrap(), "f32", &[3], 1, 1).unwrap_err();
        assert!(e.message.contains("2 elements"), "{}", e.message);
        assert!(parse_literal(&lex_line("1.5").unwrap(), "s32", &[], 1, 1).is_err());
    }

    #[test]
    fn literal_folds() {
        let t = lit("{0, 8, 16, 24}", "s32", &[4]);
        let s = t.slice(&[2], &[1], &[1]).unwrap();
        assert_eq!(s.get(0), Some(16.0));
        let b = lit("{1, 2}", "s32", &[2]).broadcast(&[2, 2], &[1]).unwrap();
        assert_eq!(b.data, LitData::Dense(vec![1.0, 2.0, 1.0, 2.0]));
        let tr = lit("{{1, 2}, {3, 4}}", "s32", &[2, 2])
            .transpose(&[1, 0], &[2, 2])
            .unwrap();
        assert_eq!(tr.data, LitData::Dense(vec![1.0, 3.0, 2.0, 4.0]));
        let i = Lit::iota("s32", &[2, 3], 1).unwrap();
        assert_eq!(i.data, LitData::Dense(vec![0.0, 1.0, 2.0, 0.0, 1.0, 2.0]));
        let a = lit("{1, 2}", "s32", &[2]);
        let c = Lit::concat(&[&a, &a], 0, &[4]).unwrap();
        assert_eq!(c.data, LitData::Dense(vec![1.0, 2.0, 1.0, 2.0]));
        assert_eq!(wrap_int("s32", 2147483648.0), -2147483648.0);
        assert_eq!(wrap_int("u32", -1.0), 4294967295.0);
    }
}
