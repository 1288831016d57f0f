//! Function application in normal form: each function's folding and canonical arguments.

use super::{content, exact_sqrt, stable_order, Arena, Atom, Built, Coeff, ExprId, Func};

impl Arena {
    /// `func` applied to `args`, normalized: constants are folded where the result is exact,
    /// max/min arguments are flattened, sorted and deduplicated, comparison arguments get a
    /// canonical sign.
    pub fn app(&mut self, func: Func, mut args: Vec<ExprId>) -> Built {
        match func {
            Func::Max | Func::Min => {
                let mut flat = Vec::with_capacity(args.len());
                // max(a, -inf) = a and min(a, +inf) = a for every a; a NaN wins (torch's
                // maximum and amax propagate it).
                let neutral = if func == Func::Max { -1 } else { 1 };
                let n_args = args.len();
                let mut dropped = 0;
                for &a in &args {
                    match self.pure_nonfinite(a) {
                        Some(0) => return self.nonfinite(0),
                        Some(k) if k == neutral => dropped += 1,
                        _ => {}
                    }
                }
                if dropped == n_args {
                    return self.nonfinite(neutral);
                }
                if dropped > 0 {
                    args.retain(|&a| self.pure_nonfinite(a) != Some(neutral));
                }
                for a in args {
                    match self.single_app(a) {
                        Some((f, inner)) if *f == func => flat.extend(inner.iter().copied()),
                        _ => flat.push(a),
                    }
                }
                // Constants fold into one.
                let mut best: Option<Coeff> = None;
                let mut rest = Vec::new();
                for a in flat {
                    match self.as_const(a) {
                        Some(c) => {
                            best = Some(match best {
                                None => c,
                                Some(b) if func == Func::Max => b.max(c),
                                Some(b) => b.min(c),
                            })
                        }
                        None => rest.push(a),
                    }
                }
                if let Some(c) = best {
                    rest.push(self.constant(c)?);
                }
                rest.sort();
                rest.dedup();
                if rest.len() == 1 {
                    return Ok(rest[0]);
                }
                // max(g a, g b) = g max(a, b) for g > 0. g is the smallest magnitude of the
                // arguments' leading coefficients: independent of their order, and 1 once
                // factored out, so the normal form is canonical under positive scaling.
                let g = rest
                    .iter()
                    .filter_map(|&a| self.poly(a).terms.first().map(|t| t.1.abs()))
                    .min()
                    .unwrap_or_else(Coeff::one);
                if !g.is_one() {
                    let inv = g.recip();
                    let scaled = rest
                        .iter()
                        .map(|&a| self.scale(a, &inv))
                        .collect::<Result<Vec<_>, _>>()?;
                    let inner = self.app(func, scaled)?;
                    return self.scale(inner, &g);
                }
                args = rest;
            }
            Func::Positive | Func::NonNegative | Func::IsZero => {
                let d = args[0];
                if let Some(k) = self.pure_nonfinite(d) {
                    // NaN compares false; +inf is positive; no infinity is zero.
                    return self.int((k == 1 && func != Func::IsZero) as i64);
                }
                if let Some(c) = self.as_const(d) {
                    let v = match func {
                        Func::Positive => c.is_positive(),
                        Func::NonNegative => !c.is_negative(),
                        _ => c.is_zero(),
                    };
                    return self.int(v as i64);
                }
                // Positive scales keep the sign: the argument becomes its primitive part
                // (integer coefficients without a common factor), which also keeps its
                // evaluation exact in f64 where the coefficients were; d == 0 iff -d == 0,
                // so there the sign is normalized too.
                if let Some(r) = self.comparison_of_booleans(&func, d) {
                    return r;
                }
                if func == Func::IsZero && self.zero_out_of_range(d) {
                    return self.int(0);
                }
                if func == Func::IsZero {
                    if let Some(r) = self.is_zero_of_where(d) {
                        return r;
                    }
                }
                let mut c = content(self.poly(d));
                if func == Func::IsZero && self.poly(d).terms[0].1.is_negative() {
                    c = -c;
                }
                args[0] = self.scale(d, &c.recip())?;
            }
            Func::Where => {
                let (c, a, b) = (args[0], args[1], args[2]);
                if a == b {
                    return Ok(a);
                }
                if let Some(v) = self.as_const(c) {
                    return Ok(if v.is_zero() { b } else { a });
                }
                if self.pure_nonfinite(c).is_some() {
                    // ±inf and NaN are non-zero.
                    return Ok(a);
                }
                // Only whether c is zero matters: its primitive part, sign normalized.
                let mut lc = content(self.poly(c));
                if self.poly(c).terms[0].1.is_negative() {
                    lc = -lc;
                }
                if !lc.is_one() {
                    args[0] = self.scale(c, &lc.recip())?;
                }
                // where(c, k a, k b) = k where(c, a, b): the leading coefficient of the first
                // non-zero branch is factored out.
                let branch = if self.poly(a).terms.is_empty() { b } else { a };
                let k = self.poly(branch).terms[0].1.clone();
                if !k.is_one() {
                    let inv = k.recip();
                    let (sa, sb) = (self.scale(a, &inv)?, self.scale(b, &inv)?);
                    let inner = self.app(Func::Where, vec![args[0], sa, sb])?;
                    return self.scale(inner, &k);
                }
            }
            Func::Sqrt => {
                if let Some(c) = self.as_const(args[0]) {
                    if let Some(r) = exact_sqrt(&c) {
                        return self.constant(r);
                    }
                }
            }
            Func::Exp | Func::Tanh | Func::Erf | Func::Log => {
                if let Some(c) = self.as_const(args[0]) {
                    if c.is_zero() {
                        return match func {
                            Func::Exp => self.int(1),
                            Func::Log => self.float(f64::NEG_INFINITY),
                            _ => self.int(0),
                        };
                    }
                    if func == Func::Log && c.is_one() {
                        return self.int(0);
                    }
                }
                let rule = match func {
                    Func::Exp => self.exp_rule(args[0]),
                    Func::Log => self.log_rule(args[0]),
                    _ => None,
                };
                if let Some(r) = rule {
                    return r;
                }
            }
            Func::Recip => {
                if let Some(c) = self.as_const(args[0]) {
                    if !c.is_zero() {
                        return self.constant(c.recip());
                    }
                }
            }
            Func::Lookup => {
                if let Some(i) = self.as_const(args[0]) {
                    let n = args.len() - 1;
                    if let Some(i) = i.to_usize() {
                        if i < n {
                            return Ok(args[1 + i]);
                        }
                    }
                }
                if args[2..].iter().all(|&t| t == args[1]) {
                    // Every entry is the same: the index does not matter (within range).
                    return Ok(args[1]);
                }
                // lookup(i, k t_0, ..., k t_{n-1}) = k lookup(i, t_0, ..., t_{n-1}) for k != 0
                // (in range both are k t_i; out of range neither has a value): the leading
                // coefficient of the first non-zero entry is factored out, so tables that
                // differ by a constant factor (a gradient scaled before or after a gather)
                // share one atom.
                if let Some(&t) = args[1..].iter().find(|&&t| !self.poly(t).terms.is_empty()) {
                    let k = self.poly(t).terms[0].1.clone();
                    if !k.is_one() {
                        let inv = k.recip();
                        let mut scaled = Vec::with_capacity(args.len());
                        scaled.push(args[0]);
                        for &t in &args[1..] {
                            scaled.push(self.scale(t, &inv)?);
                        }
                        let inner = self.app(Func::Lookup, scaled)?;
                        return self.scale(inner, &k);
                    }
                }
            }
            Func::ArgMax | Func::ArgMin => {
                // One candidate, or every candidate the same expression: the first.
                if args.iter().all(|&a| a == args[0]) {
                    return self.int(0);
                }
                let consts: Option<Vec<Coeff>> = args.iter().map(|&a| self.as_const(a)).collect();
                if let Some(cs) = consts {
                    let mut best = 0;
                    for (i, c) in cs.iter().enumerate().skip(1) {
                        let better = if func == Func::ArgMax {
                            *c > cs[best]
                        } else {
                            *c < cs[best]
                        };
                        if better {
                            best = i;
                        }
                    }
                    return self.int(best as i64);
                }
            }
            // A rank past the arguments has no value (NaN in f64, none exactly): not folded.
            Func::SortedValue { rank, .. } if (rank as usize) < args.len() => {
                if args.iter().all(|&a| a == args[0]) {
                    return Ok(args[0]);
                }
                if let Some(cs) = args
                    .iter()
                    .map(|&a| self.as_const(a))
                    .collect::<Option<Vec<Coeff>>>()
                {
                    let largest = matches!(func, Func::SortedValue { largest: true, .. });
                    let order = stable_order(&cs, largest);
                    return Ok(args[order[rank as usize]]);
                }
                // The value does not depend on the arguments' order.
                args.sort_unstable();
            }
            Func::SortedIndex { rank, largest } if (rank as usize) < args.len() => {
                if args.iter().all(|&a| a == args[0]) {
                    // Every tie keeps its place: the rank-th position.
                    return self.int(i64::from(rank));
                }
                if let Some(cs) = args
                    .iter()
                    .map(|&a| self.as_const(a))
                    .collect::<Option<Vec<Coeff>>>()
                {
                    let order = stable_order(&cs, largest);
                    return self.int(order[rank as usize] as i64);
                }
            }
            Func::Named(ref n) => {
                // The named functions' exact values at 0 (RoPE's cos and sin at position 0):
                // folded so that a constant never hides behind an atom.
                if self.poly(args[0]).terms.is_empty() {
                    const ZERO_AT_0: &[&str] = &[
                        "sin", "tan", "sinh", "asin", "atan", "asinh", "atanh", "expm1", "log1p",
                        "floor", "ceil", "trunc", "round", "sign",
                    ];
                    const ONE_AT_0: &[&str] = &["cos", "cosh", "exp2", "erfc"];
                    if ZERO_AT_0.contains(&n.as_str()) {
                        return self.int(0);
                    }
                    if ONE_AT_0.contains(&n.as_str()) {
                        return self.int(1);
                    }
                }
            }
            Func::SortedValue { .. }
            | Func::SortedIndex { .. }
            | Func::PowConst(_)
            | Func::Product => {}
        }
        self.atom_expr(Atom::App(func, args))
    }
}
