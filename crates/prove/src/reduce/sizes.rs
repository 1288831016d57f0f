//! Symbolic sizes: every tensor dimension a monomial `c * v1^e1 * v2^e2 ...` over size
//! variables, each variable with the size it has in the original program. Shape rules relate
//! dimensions by equations between monomials; the solver satisfies them by *substitution*
//! (a variable is replaced by a product of fresh ones, or by a multiple of one), so every
//! constraint seen holds for every assignment of the remaining free variables. The reduced
//! program then gives each free variable the smallest value its semantics allow.

use std::collections::BTreeMap;
use std::fmt;

/// A size variable's index.
pub type Var = usize;

/// A size: `coef * Π var^exp`.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Mono {
    /// The constant factor.
    pub coef: u64,
    /// Variables with their (positive) exponents.
    pub vars: BTreeMap<Var, u32>,
}

impl Mono {
    /// The constant `c`.
    pub fn constant(c: u64) -> Mono {
        Mono {
            coef: c,
            vars: BTreeMap::new(),
        }
    }

    /// The variable `v`.
    pub fn var(v: Var) -> Mono {
        Mono {
            coef: 1,
            vars: BTreeMap::from([(v, 1)]),
        }
    }

    /// The product of two sizes.
    pub fn mul(&self, other: &Mono) -> Option<Mono> {
        let mut out = self.clone();
        out.coef = out.coef.checked_mul(other.coef)?;
        for (&v, &e) in &other.vars {
            *out.vars.entry(v).or_default() += e;
        }
        Some(out)
    }

    /// `self * k`.
    pub fn scale(&self, k: u64) -> Option<Mono> {
        self.mul(&Mono::constant(k))
    }

    /// Whether the size is the constant 1.
    pub fn is_one(&self) -> bool {
        self.coef == 1 && self.vars.is_empty()
    }
}

/// Why the sizes cannot be related soundly.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Unexplained(pub String);

/// The size variables and what is known of them.
#[derive(Clone, Debug, Default)]
pub struct Sizes {
    /// Each variable's size in the original program.
    orig: Vec<u64>,
    /// A variable replaced by a monomial over newer variables.
    defs: Vec<Option<Mono>>,
    /// Where each variable first appeared, for the report.
    origin: Vec<String>,
    /// Variables whose value must stay the original one (a literal may depend on it).
    pinned: Vec<bool>,
    /// Why each pinned variable is pinned, for the report (the first reason met).
    pin_reason: Vec<Option<String>>,
    /// Sizes kept whole because no factor related the two sides of an equation
    /// ([`Sizes::unify`]): each variable's origin, size and the relation that kept it.
    kept_whole: Vec<(String, u64, String)>,
    /// Variables a split made the outer part of a dim (the heads of `heads x head_dim`):
    /// where a shard divides a dim, it divides the outer part ([`Sizes::divide`]).
    outer: Vec<bool>,
    /// The integers value literals may be products of sizes of ([`Sizes::pin_divisors_of`]):
    /// no reduced size may divide one of them.
    literal_products: Vec<u64>,
    /// Variables given a value by [`Sizes::fix`]; once one is, every other variable keeps
    /// its original size (the mesh-dim reduction changes the replica count only).
    fixed: BTreeMap<Var, u64>,
    /// The parts earlier reshapes split sizes into ([`Sizes::split`]), so a later reshape of
    /// the same size (the other program's, another layer's) groups its factors the same way.
    groups: Vec<Mono>,
    /// Smallest reduced values beyond the default 2 ([`Sizes::at_least`]).
    minimum: BTreeMap<Var, u64>,
}

fn gcd(a: u64, b: u64) -> u64 {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

impl Sizes {
    /// A fresh size equal to `orig` in the original program: the constant 1 for 1 (a size-1
    /// dimension broadcasts, so it is never reduced or enlarged), else a new variable.
    pub fn fresh(&mut self, orig: u64, origin: impl Into<String>) -> Mono {
        if orig <= 1 {
            return Mono::constant(orig);
        }
        self.orig.push(orig);
        self.defs.push(None);
        self.origin.push(origin.into());
        self.pinned.push(false);
        self.pin_reason.push(None);
        self.outer.push(false);
        Mono::var(self.orig.len() - 1)
    }

    /// Variables created so far.
    pub fn len(&self) -> usize {
        self.orig.len()
    }

    /// Whether no variable was created.
    pub fn is_empty(&self) -> bool {
        self.orig.is_empty()
    }

    /// The size with every substituted variable expanded.
    pub fn norm(&self, m: &Mono) -> Mono {
        let mut out = Mono::constant(m.coef);
        for (&v, &e) in &m.vars {
            let part = match &self.defs[v] {
                Some(d) => self.norm(d),
                None => Mono::var(v),
            };
            for _ in 0..e {
                out = out
                    .mul(&part)
                    .expect("sizes stay within u64: they equal original sizes");
            }
        }
        out
    }

    /// The size in the original program.
    pub fn original(&self, m: &Mono) -> u64 {
        let m = self.norm(m);
        m.vars
            .iter()
            .fold(m.coef, |acc, (&v, &e)| acc * self.orig[v].pow(e))
    }

    /// Replaces free variable `v` by `m` (whose original size must equal `v`'s).
    fn define(&mut self, v: Var, m: Mono) {
        debug_assert!(self.defs[v].is_none());
        debug_assert_eq!(self.original(&m), self.orig[v]);
        self.defs[v] = Some(m);
    }

    /// Makes `m` divisible by `k` for every value of the free variables, by writing one of its
    /// variables as a multiple; the size divided by `k`.
    pub fn divide(&mut self, m: &Mono, k: u64, why: &str) -> Result<Mono, Unexplained> {
        let n = self.norm(m);
        if k == 0 || !self.original(&n).is_multiple_of(k) {
            return Err(Unexplained(format!(
                "{why}: size {} is not divisible by {k}",
                self.original(&n)
            )));
        }
        let mut n = n;
        // Factor the rest out of variables sharing a factor with it, largest first; each
        // round moves a factor into the coefficient.
        loop {
            let need = k / gcd(n.coef, k);
            if need == 1 {
                break;
            }
            // A shard splits a dim's outermost part (llama3-405b's 128 heads of 128 split 8
            // ways over tp: the heads, not the head dim, which the ranks' own view then finds
            // whole).
            let pick = n
                .vars
                .keys()
                .copied()
                .filter(|&v| gcd(need, self.orig[v]) > 1)
                .max_by_key(|&v| (self.outer[v], self.orig[v], std::cmp::Reverse(v)));
            let Some(v) = pick else {
                return Err(Unexplained(format!(
                    "{why}: cannot keep size {} divisible by {k} at every reduced size",
                    self.original(&n)
                )));
            };
            let g = gcd(need, self.orig[v]);
            let rest = self.fresh(self.orig[v] / g, format!("{} / {g}", self.origin[v]));
            self.define(v, rest.scale(g).expect("small"));
            n = self.norm(&n);
        }
        Ok(self.exact_div(&n, k))
    }

    /// `m / k` where `k` divides the coefficient of `m`'s normal form.
    fn exact_div(&self, m: &Mono, k: u64) -> Mono {
        let mut n = self.norm(m);
        debug_assert_eq!(n.coef % k, 0);
        n.coef /= k;
        n
    }

    /// Makes `a` and `b` equal for every value of the free variables: common factors cancel,
    /// a lone variable is defined as the other side, and otherwise two variables (or a
    /// variable and a coefficient) sharing a factor are refined into the common factor and
    /// the rests, until one of the first two cases applies.
    pub fn unify(&mut self, a: &Mono, b: &Mono, why: &str) -> Result<(), Unexplained> {
        let (oa, ob) = (self.original(a), self.original(b));
        if oa != ob {
            return Err(Unexplained(format!("{why}: sizes {oa} and {ob} differ")));
        }
        // Each round either finishes or splits a variable into smaller ones.
        for _ in 0..256 {
            let (mut a, mut b) = (self.norm(a), self.norm(b));
            cancel(&mut a, &mut b);
            if a == b {
                return Ok(());
            }
            let single = |m: &Mono| -> Option<Var> {
                (m.vars.len() == 1 && m.vars.values().all(|&e| e == 1))
                    .then(|| *m.vars.keys().next().expect("one"))
            };
            // a.coef * v = b  =>  v = b / a.coef, when that is a monomial.
            for (x, y) in [(&a, &b), (&b, &a)] {
                if let Some(v) = single(x) {
                    if y.coef.is_multiple_of(x.coef) && !y.vars.contains_key(&v) {
                        let mut def = y.clone();
                        def.coef /= x.coef;
                        if def.vars.is_empty() && def.coef > 1 {
                            // Equal to a constant: the size is kept, for the report.
                            self.kept_whole.push((
                                self.origin[v].clone(),
                                self.orig[v],
                                format!("{why}: {} = {}", self.show(x), self.show(y)),
                            ));
                        }
                        self.define(v, def);
                        return Ok(());
                    }
                }
            }
            if !self.refine(&a, &b) && !self.refine(&b, &a) && !self.fix_one(&a, &b, why) {
                return Err(Unexplained(format!(
                    "{why}: cannot relate sizes {} and {} by products of size variables",
                    self.show(&a),
                    self.show(&b)
                )));
            }
        }
        Err(Unexplained(format!("{why}: sizes too entangled to relate")))
    }

    /// Fixes one variable of `a` or `b` (a power first) at its original size; whether there
    /// was one. Where no factor relates the two sides (`4 = v²`), keeping a size is always a
    /// solution: a fixed variable is not reduced, so the reduced program keeps that dim as
    /// written, and once every variable is fixed the sides are their (equal) original sizes.
    fn fix_one(&mut self, a: &Mono, b: &Mono, why: &str) -> bool {
        let vars = || a.vars.iter().chain(b.vars.iter());
        let pick = vars()
            .find(|(_, &e)| e != 1)
            .or_else(|| vars().next())
            .map(|(&v, _)| v);
        match pick {
            Some(v) => {
                tracing::debug!(size = self.orig[v], origin = %self.origin[v], "size kept: no factor relates it");
                self.kept_whole.push((
                    self.origin[v].clone(),
                    self.orig[v],
                    format!("{why}: {} = {}", self.show(a), self.show(b)),
                ));
                self.define(v, Mono::constant(self.orig[v]));
                true
            }
            None => false,
        }
    }

    /// Splits a variable of `y` by a factor it shares with a variable or the coefficient of
    /// `x`; whether it did.
    fn refine(&mut self, x: &Mono, y: &Mono) -> bool {
        for (&w, &ew) in &y.vars {
            if ew != 1 {
                continue;
            }
            let ow = self.orig[w];
            let g = gcd(x.coef, ow);
            if g > 1 {
                let rest = self.fresh(ow / g, format!("{} / {g}", self.origin[w]));
                self.define(w, rest.scale(g).expect("small"));
                return true;
            }
            for (&u, &eu) in &x.vars {
                if eu != 1 {
                    continue;
                }
                let ou = self.orig[u];
                let g = gcd(ou, ow);
                if g <= 1 {
                    continue;
                }
                if ou == g {
                    let rest = self.fresh(ow / g, format!("{} / {g}", self.origin[w]));
                    self.define(w, Mono::var(u).mul(&rest).expect("small"));
                } else if ow == g {
                    let rest = self.fresh(ou / g, format!("{} / {g}", self.origin[u]));
                    self.define(u, Mono::var(w).mul(&rest).expect("small"));
                } else {
                    let t = self.fresh(g, format!("{} (common factor {g})", self.origin[u]));
                    let ru = self.fresh(ou / g, format!("{} / {g}", self.origin[u]));
                    let rw = self.fresh(ow / g, format!("{} / {g}", self.origin[w]));
                    self.define(u, t.mul(&ru).expect("small"));
                    self.define(w, t.mul(&rw).expect("small"));
                }
                return true;
            }
        }
        false
    }

    /// Splits `m` into factors with the given original sizes, in order (a reshape that splits
    /// one dimension into several): exact matches first, else a variable is written as a
    /// product of a fresh factor and the rest.
    ///
    /// A part matched by splitting a variable it merely divides is marked as the outer part
    /// of that variable's dim (the parts are in row-major order, the first outermost), which a
    /// later shard of the whole dim divides ([`Sizes::divide`]).
    pub fn split(&mut self, m: &Mono, parts: &[u64], why: &str) -> Result<Vec<Mono>, Unexplained> {
        let total: u64 = parts.iter().product();
        if self.original(m) != total {
            return Err(Unexplained(format!(
                "{why}: {} is not the product of {parts:?}",
                self.original(m)
            )));
        }
        let mut rest = self.norm(m);
        let mut out: Vec<Mono> = Vec::with_capacity(parts.len());
        for (j, &p) in parts.iter().enumerate() {
            if j + 1 == parts.len() {
                out.push(rest.clone());
                break;
            }
            if p == 1 {
                out.push(Mono::constant(1));
                continue;
            }
            // A variable of exactly this size.
            let exact = rest
                .vars
                .iter()
                .find(|(&v, &e)| e >= 1 && self.orig[v] == p)
                .map(|(&v, _)| v);
            if let Some(v) = exact {
                out.push(Mono::var(v));
                rest = remove_var(&rest, v);
                continue;
            }
            if rest.coef.is_multiple_of(p) {
                out.push(Mono::constant(p));
                rest.coef /= p;
                continue;
            }
            // A product of whole factors (variables and part of the coefficient) of exactly
            // this size: the reshape's own grouping, when the size was built from it. Taking
            // it keeps a head count and a head dim apart; splitting a variable the size
            // merely divides (below) would tie the two (a rope half of 64 written as the 32
            // heads times 2), which is as sound but keeps both at their original sizes.
            if let Some(part) = self.exact_group(&rest, p) {
                rest = divide_mono(&rest, &part);
                out.push(part);
                continue;
            }
            // A variable this size divides: v = f * r.
            let divisible = rest
                .vars
                .iter()
                .filter(|(&v, &e)| e == 1 && self.orig[v].is_multiple_of(p))
                .map(|(&v, _)| v)
                .max_by_key(|&v| (self.orig[v], std::cmp::Reverse(v)));
            if let Some(v) = divisible {
                let f = self.fresh(p, format!("{} (factor {p})", self.origin[v]));
                let r = self.fresh(self.orig[v] / p, format!("{} / {p}", self.origin[v]));
                self.define(v, f.mul(&r).expect("small"));
                // Parts come outermost first: `f` is outer to the rest.
                self.outer[single_var(&f)] = true;
                // `rest` had v once; it now has f * r: take f away.
                rest = remove_var(&self.norm(&rest), single_var(&f));
                out.push(f);
                continue;
            }
            // Otherwise gather the part from several variables (and the coefficient), each
            // giving the factor it shares with what is still missing.
            let mut part = Mono::constant(1);
            let mut missing = p;
            while missing > 1 {
                let g = gcd(rest.coef, missing);
                if g > 1 {
                    rest.coef /= g;
                    part = part.scale(g).expect("small");
                    missing /= g;
                    continue;
                }
                let pick = rest
                    .vars
                    .keys()
                    .copied()
                    .filter(|&v| gcd(self.orig[v], missing) > 1)
                    .max_by_key(|&v| (gcd(self.orig[v], missing), std::cmp::Reverse(v)));
                let Some(v) = pick else {
                    return Err(Unexplained(format!(
                        "{why}: cannot split size {} into {parts:?} by size variables",
                        self.show(m)
                    )));
                };
                let g = gcd(self.orig[v], missing);
                let taken = if self.orig[v] == g {
                    Mono::var(v)
                } else {
                    let f = self.fresh(g, format!("{} (factor {g})", self.origin[v]));
                    let r = self.fresh(self.orig[v] / g, format!("{} / {g}", self.origin[v]));
                    self.define(v, f.mul(&r).expect("small"));
                    rest = self.norm(&rest);
                    f
                };
                rest = remove_var(&rest, single_var(&taken));
                part = part.mul(&taken).expect("small");
                missing /= g;
            }
            out.push(part);
        }
        for part in &out {
            let part = self.norm(part);
            if !part.vars.is_empty() && !self.groups.iter().any(|g| self.norm(g) == part) {
                self.groups.push(part);
            }
        }
        Ok(out)
    }

    /// The product of the fewest factors of `m` (variables, with multiplicity, times a
    /// divisor of its coefficient) whose original size is exactly `p`, if any.
    fn exact_group(&self, m: &Mono, p: u64) -> Option<Mono> {
        // A part an earlier reshape made, where it still divides `m`: several groupings
        // may have the size (2·rope half and the heads, both 4, in a tiny llama), and the
        // one the programs already use is the one that keeps the sizes apart.
        for g in &self.groups {
            let g = self.norm(g);
            if self.original(&g) == p
                && m.coef.is_multiple_of(g.coef)
                && g.vars
                    .iter()
                    .all(|(v, e)| m.vars.get(v).is_some_and(|me| me >= e))
            {
                return Some(g);
            }
        }
        let factors: Vec<Var> = m
            .vars
            .iter()
            .flat_map(|(&v, &e)| std::iter::repeat_n(v, e as usize))
            .collect();
        // Monomials have a handful of factors; a long one is left to the splits below.
        if factors.len() > 12 {
            return None;
        }
        let mut best: Option<(u32, u32)> = None;
        for mask in 1u32..(1 << factors.len()) {
            let mut prod = 1u64;
            for (i, &v) in factors.iter().enumerate() {
                if mask & (1 << i) != 0 {
                    prod = prod.saturating_mul(self.orig[v]);
                }
            }
            if !p.is_multiple_of(prod) || !m.coef.is_multiple_of(p / prod) {
                continue;
            }
            let key = (mask.count_ones(), mask);
            if best.is_none_or(|b| key < b) {
                best = Some(key);
            }
        }
        let (_, mask) = best?;
        let mut part = Mono::constant(p);
        for (i, &v) in factors.iter().enumerate() {
            if mask & (1 << i) != 0 {
                part.coef /= self.orig[v];
                *part.vars.entry(v).or_default() += 1;
            }
        }
        Some(part)
    }

    /// Gives free variable `v` the reduced value `value` and keeps every other variable at
    /// its original size (the mesh-dim reduction, [`super::mesh`]).
    pub fn fix(&mut self, v: Var, value: u64) {
        self.fixed.insert(v, value);
    }

    /// Where variable `v` first appeared.
    pub fn origin_of(&self, v: Var) -> &str {
        &self.origin[v]
    }

    /// Makes free variable `v` reduce to at least `min` (a vocabulary block, `reduce/vocab.rs`;
    /// the second-size check's floor, [`super::reduce_case_above`]); the largest of several
    /// minimums holds.
    pub fn at_least(&mut self, v: Var, min: u64) {
        let m = self.minimum.entry(v).or_insert(min);
        *m = (*m).max(min);
    }

    /// Keeps every free variable of `m` at its original size; `why` is reported.
    pub fn pin(&mut self, m: &Mono, why: &str) {
        let n = self.norm(m);
        for v in n.vars.keys() {
            self.pin_var(*v, || why.to_string());
        }
    }

    fn pin_var(&mut self, v: Var, why: impl FnOnce() -> String) {
        if !self.pinned[v] {
            self.pinned[v] = true;
            self.pin_reason[v] = Some(why());
        }
    }

    /// Pins every free variable whose original size divides `x`: a value literal equal to `x`
    /// (or its reciprocal, square or square root) may be a product of sizes, and the reduced
    /// program keeps the literal, so the sizes it may stand for keep their values.
    pub fn pin_divisors_of(&mut self, x: u64) {
        if !self.literal_products.contains(&x) {
            self.literal_products.push(x);
        }
        for v in 0..self.orig.len() {
            if self.defs[v].is_none() && x.is_multiple_of(self.orig[v]) {
                self.pin_var(v, || {
                    format!("a value literal may be a product of sizes equal to {x}")
                });
            }
        }
    }

    /// Keeps reduced sizes from coinciding with `x` without pinning the sizes dividing it: `x`
    /// is a product of mesh sizes, which the reduction keeps (see [`super::reduce_case`]).
    /// Returns whether pinning would have kept some size.
    pub fn avoid(&mut self, x: u64) -> bool {
        if !self.literal_products.contains(&x) {
            self.literal_products.push(x);
        }
        (0..self.orig.len()).any(|v| {
            self.defs[v].is_none()
                && !self.pinned[v]
                && self.orig[v] > 1
                && x.is_multiple_of(self.orig[v])
        })
    }

    /// The reduced value of every free variable: the original when pinned, else the smallest
    /// size of at least 2 (a reduction stays a reduction) that divides no integer a literal
    /// may be a product of sizes of; the original when no smaller one does.
    ///
    /// Pinning keeps a literal that *stands for* a size meaning the same; this keeps a literal
    /// from *coinciding* with a reduced size: a mean over 8 written wrongly as `sum * 0.5`
    /// must not be proved because the reduced mean is over 2. A product of sizes equal to
    /// `x` has each of its variables' values dividing `x`, so no product of these values
    /// (times the constant factors of divisibility) equals any `x`.
    pub fn reduced_value(&self, v: Var) -> u64 {
        if !self.fixed.is_empty() {
            return self.fixed.get(&v).copied().unwrap_or(self.orig[v]);
        }
        if self.pinned[v] {
            return self.orig[v];
        }
        (self.minimum.get(&v).copied().unwrap_or(2).max(2)..self.orig[v])
            .find(|k| !self.literal_products.iter().any(|x| x.is_multiple_of(*k)))
            .unwrap_or(self.orig[v])
    }

    /// The size in the reduced program.
    pub fn reduced(&self, m: &Mono) -> u64 {
        let n = self.norm(m);
        n.vars
            .iter()
            .fold(n.coef, |acc, (&v, &e)| acc * self.reduced_value(v).pow(e))
    }

    /// The free variables, with their original and reduced sizes, where they come from and
    /// why they are pinned (`None`: not pinned).
    pub fn free(&self) -> Vec<(Var, u64, u64, &str, Option<&str>)> {
        (0..self.orig.len())
            .filter(|&v| self.defs[v].is_none())
            .map(|v| {
                (
                    v,
                    self.orig[v],
                    self.reduced_value(v),
                    self.origin[v].as_str(),
                    self.pinned[v].then(|| self.pin_reason[v].as_deref().unwrap_or("pinned")),
                )
            })
            .collect()
    }

    /// The sizes kept whole because no factor related an equation's sides: each one's
    /// origin, size and the equation.
    pub fn kept_whole(&self) -> &[(String, u64, String)] {
        &self.kept_whole
    }

    /// The size in words: `2*s3*s7`.
    pub fn show(&self, m: &Mono) -> String {
        let n = self.norm(m);
        let mut parts = Vec::new();
        if n.coef != 1 || n.vars.is_empty() {
            parts.push(n.coef.to_string());
        }
        for (v, e) in &n.vars {
            parts.push(if *e == 1 {
                format!("s{v}")
            } else {
                format!("s{v}^{e}")
            });
        }
        parts.join("*")
    }
}

/// Divides out the variables and the coefficient `a` and `b` have in common.
fn cancel(a: &mut Mono, b: &mut Mono) {
    let common: Vec<Var> = a
        .vars
        .keys()
        .filter(|v| b.vars.contains_key(v))
        .copied()
        .collect();
    for v in common {
        let e = a.vars[&v].min(b.vars[&v]);
        for m in [&mut *a, &mut *b] {
            let x = m.vars.get_mut(&v).expect("common");
            *x -= e;
            if *x == 0 {
                m.vars.remove(&v);
            }
        }
    }
    let g = gcd(a.coef, b.coef);
    a.coef /= g;
    b.coef /= g;
}

fn remove_var(m: &Mono, v: Var) -> Mono {
    let mut out = m.clone();
    if let Some(e) = out.vars.get_mut(&v) {
        *e -= 1;
        if *e == 0 {
            out.vars.remove(&v);
        }
    }
    out
}

/// `m / d` where `d`'s coefficient divides `m`'s and its variables are among `m`'s.
fn divide_mono(m: &Mono, d: &Mono) -> Mono {
    let mut out = m.clone();
    out.coef /= d.coef;
    for (&v, &e) in &d.vars {
        for _ in 0..e {
            out = remove_var(&out, v);
        }
    }
    out
}

fn single_var(m: &Mono) -> Var {
    *m.vars.keys().next().unwrap_or(&usize::MAX)
}

impl fmt::Display for Mono {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.coef)?;
        for (v, e) in &self.vars {
            write!(f, "*s{v}^{e}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn division_writes_a_variable_as_a_multiple() {
        let mut s = Sizes::default();
        let h = s.fresh(16, "hidden");
        let local = s.divide(&h, 2, "tp").unwrap();
        assert_eq!(s.original(&local), 8);
        assert_eq!(s.reduced(&h), 4);
        assert_eq!(s.reduced(&local), 2);
        // 3 does not divide 16.
        assert!(s.divide(&h, 3, "tp").is_err());
    }

    #[test]
    fn unification_and_splits_keep_every_relation() {
        let mut s = Sizes::default();
        let a = s.fresh(12, "a");
        let b = s.fresh(12, "b");
        s.unify(&a, &b, "add").unwrap();
        assert_eq!(s.norm(&a), s.norm(&b));
        let parts = s.split(&a, &[3, 4], "view").unwrap();
        assert_eq!(parts.len(), 2);
        assert_eq!(s.original(&parts[0]), 3);
        assert_eq!(s.original(&parts[1]), 4);
        let prod = parts[0].mul(&parts[1]).unwrap();
        assert_eq!(s.norm(&prod), s.norm(&b));
        assert_eq!(s.reduced(&b), 4);
        // Different sizes never unify.
        let c = s.fresh(5, "c");
        assert!(s.unify(&c, &b, "add").is_err());
    }

    #[test]
    fn coprime_multiples_share_a_fresh_variable() {
        let mut s = Sizes::default();
        let u = s.fresh(6, "u");
        let w = s.fresh(4, "w");
        let (u2, w3) = (u.scale(2).unwrap(), w.scale(3).unwrap());
        s.unify(&u2, &w3, "cat").unwrap();
        assert_eq!(s.reduced(&u) * 2, s.reduced(&w) * 3);
        assert_eq!(s.reduced(&u), 6);
    }

    #[test]
    fn a_split_gathers_its_part_from_several_variables() {
        let mut s = Sizes::default();
        let (a, b) = (s.fresh(6, "a"), s.fresh(10, "b"));
        let ab = a.mul(&b).unwrap();
        // 60 = 4 * 15: 4 takes a factor 2 from each variable.
        let parts = s.split(&ab, &[4, 15], "view").unwrap();
        assert_eq!(s.original(&parts[0]), 4);
        assert_eq!(s.original(&parts[1]), 15);
        let prod = parts[0].mul(&parts[1]).unwrap();
        assert_eq!(s.norm(&prod), s.norm(&ab));
    }

    #[test]
    fn a_shard_of_a_split_dim_divides_its_outer_part() {
        // The spec views 16384 query rows as 128 heads of 128 before tp splits them 8 ways.
        let mut s = Sizes::default();
        let rows = s.fresh(16384, "wq rows");
        let spec = s.split(&rows, &[128, 128], "spec heads").unwrap();
        let local = s.divide(&rows, 8, "tp").unwrap();
        let rank = s.split(&local, &[16, 128], "rank heads").unwrap();
        // The shard took the heads: the ranks' head dim is the spec's.
        assert_eq!(s.norm(&spec[1]), s.norm(&rank[1]));
        assert_eq!(s.norm(&spec[0]), s.norm(&rank[0].scale(8).unwrap()));
    }

    #[test]
    fn pinned_variables_keep_their_size() {
        let mut s = Sizes::default();
        let d = s.fresh(8, "head_dim");
        let h = s.fresh(12, "hidden");
        s.pin_divisors_of(64);
        assert_eq!(s.reduced(&d), 8);
        // 2 divides 64: a product of reduced sizes of 2 could equal the literal.
        assert_eq!(s.reduced(&h), 3);
    }

    #[test]
    fn sizes_no_factor_relates_are_kept() {
        let mut s = Sizes::default();
        let v = s.fresh(2, "half");
        let w = s.fresh(6, "other");
        let square = v.mul(&v).unwrap();
        // 4 = v²: no factor of 4 splits a square; keeping v at 2 solves it.
        s.unify(&Mono::constant(4), &square, "test").unwrap();
        assert_eq!(s.reduced(&square), 4);
        // Sizes that differ are still refused.
        assert!(s.unify(&Mono::constant(5), &w, "test").is_err());
    }

    #[test]
    fn reduced_sizes_divide_no_literal_product() {
        let mut s = Sizes::default();
        let a = s.fresh(8, "a");
        let b = s.fresh(5, "b");
        let c = s.fresh(3, "c");
        // Products of sizes the literals 0.1 (10, 100) and 1/sqrt(12) (12) may stand for.
        for x in [10, 100, 12] {
            s.pin_divisors_of(x);
        }
        // 2, 3, 4, 5 and 6 each divide one of them.
        assert_eq!(s.reduced(&a), 7);
        // 5 divides 10: pinned; 3 divides 12: pinned.
        assert_eq!((s.reduced(&b), s.reduced(&c)), (5, 3));
    }
}
