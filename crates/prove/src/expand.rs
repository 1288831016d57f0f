//! Deciding a goal whose sides differ only in how `product` atoms group their factors.
//!
//! The normal form keeps a product past [`crate::expr::Budget::expand_limit`] as one
//! `product(p, q)` atom ([`crate::expr::Func::Product`]), which is canonical only for the
//! same two factors. Where one program computes `w·(E0 + E1)` and the other `w·E0 + w·E1`
//! (a tp rank's half of an expert's inner width, summed by an all-reduce), the two sides keep
//! different atoms although they are equal as polynomials. Expanding every product while
//! executing is too large (a full iteration's embedding gradient passes the term budget);
//! here only the *difference* of one goal's two sides is expanded, atom by atom, after the
//! terms both sides share have cancelled.
//!
//! Soundness: `product(p, q)` stands for the value `p·q` ([`crate::expr::Func::Product`]
//! evaluates as the product of its arguments), and the expansion is the ring multiplication
//! the arena itself applies to products within the limit. So a difference that expands to the
//! zero polynomial is zero at every point, and the goal is proved. Where an expansion would
//! meet a term that the arena does not multiply out as plain polynomials (a `zero_times`
//! atom: 0 or NaN, never cancelled; an infinity or NaN constant), it gives up: the goal stays
//! with the later layers. It never refutes: a non-zero expansion may still be zero through
//! the functions' identities.

use crate::expr::{
    add_term, mul_mono, primitive_scale, Arena, Atom, AtomId, Coeff, ExprId, Func, Mono,
};
use rustc_hash::FxHashMap;
use std::cell::RefCell;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

/// Whether `a - b` expands to the zero polynomial once every `product` atom in it (and in
/// the factors it brings in) is multiplied out. `Err`: why it was not decided (the expansion
/// would pass `max_terms` terms, reach the `deadline`, or meet a term it does not expand).
pub fn equal_after_expanding_products(
    arena: &Arena,
    a: ExprId,
    b: ExprId,
    max_terms: usize,
    deadline: Option<Instant>,
) -> Result<bool, String> {
    let mut diff: BTreeMap<Mono, Coeff> = BTreeMap::new();
    for (m, c) in &arena.poly(a).terms {
        add_term(&mut diff, m.clone(), c.clone());
    }
    for (m, c) in &arena.poly(b).terms {
        add_term(&mut diff, m.clone(), -c);
    }
    let limits = Limits {
        max_terms,
        deadline,
        nested: false,
        stuck: None,
        rewrite: None,
        decisions: Default::default(),
    };
    // The products may group a softmax's weights differently on the two sides (ring
    // attention's backward): rewritten with their weights outside the products, the sides
    // often meet at once, which costs far less than an expansion.
    let rewritten = match rewrite_sides(arena, a, b, &limits) {
        Ok((ra, rb)) if ra == rb => return Ok(true),
        Ok((ra, rb)) => {
            let mut diff = (*ra).clone();
            for (m, c) in rb.iter() {
                add_term(&mut diff, m.clone(), -c);
            }
            Some(diff)
        }
        Err(_) => None,
    };
    // The verdicts are kept with the arena across its goals: a stage's goals look up the same
    // gathered tables' entries again and again.
    let mut memo = arena.rewrite_memo();
    let verdicts = &mut memo.zero_verdicts;
    let plain = is_zero(arena, diff.clone(), &limits, 0, verdicts);
    // Where the rewriting moved something, its difference may expand where the original's
    // does not.
    let rewritten = rewritten.filter(|r| plain != Ok(true) && *r != diff);
    let again = rewritten
        .as_ref()
        .map(|r| is_zero(arena, r.clone(), &limits, 0, verdicts));
    if plain == Ok(true) || again == Some(Ok(true)) {
        return Ok(true);
    }
    // Where multiplying everything out passed the limit, products sharing a factor are
    // compared by their other factors first: the sides of a ring attention's backward
    // through a tp-split MoE block part only some ten products deep (the router's gathered
    // gradient, a table split over tp), and multiplying out every level on the way there
    // passes any budget.
    let nested = Limits {
        max_terms: max_terms.min(NESTED_MAX_TERMS),
        deadline,
        nested: true,
        stuck: Some(RefCell::default()),
        rewrite: Some((max_terms, RefCell::default())),
        decisions: Default::default(),
    };
    let undecided = |r: &Result<bool, String>| r.is_err();
    if undecided(&plain) && is_zero(arena, diff, &nested, 0, verdicts) == Ok(true) {
        return Ok(true);
    }
    if let Some(r) = rewritten.filter(|_| again.as_ref().is_some_and(undecided)) {
        if is_zero(arena, r, &nested, 0, verdicts) == Ok(true) {
            return Ok(true);
        }
    }
    // Where every attempt fails, the first one's reason stands.
    plain
}

/// Whether `a` and `b` are the same once each side's softmax weights are moved out of its
/// products ([`WeightsOutside`]): the first half of [`equal_after_expanding_products`], and
/// far cheaper than the rest (the rewriting is kept with the arena across goals). `Ok(false)`
/// says only that the rewritten sides differ, never that the goal is refuted.
pub fn equal_with_weights_outside(
    arena: &Arena,
    a: ExprId,
    b: ExprId,
    max_terms: usize,
    deadline: Option<Instant>,
) -> Result<bool, String> {
    let limits = Limits {
        max_terms,
        deadline,
        nested: false,
        stuck: None,
        rewrite: None,
        decisions: Default::default(),
    };
    rewrite_sides(arena, a, b, &limits).map(|(ra, rb)| ra == rb)
}

/// Both sides rewritten by [`WeightsOutside`] through the arena's memo.
fn rewrite_sides(
    arena: &Arena,
    a: ExprId,
    b: ExprId,
    limits: &Limits,
) -> Result<(Arc<Terms>, Arc<Terms>), String> {
    let mut memo = arena.rewrite_memo();
    let mut weights = WeightsOutside::new(arena, limits, &mut memo);
    let ra = weights.expr(a)?;
    let rb = weights.expr(b)?;
    Ok((ra, rb))
}

/// What [`WeightsOutside`] has rewritten in one arena, kept with the arena
/// ([`Arena::rewrite_memo`]) so that the goals decided in it share it: they hold the same
/// activations and gradients, which a memo per goal rewrote afresh every time (8 s a goal on
/// the zoo's llama cp=2 full iteration).
///
/// Every rewritten form depends on the arena's contents (an atom or polynomial is used only
/// where the arena stores it, an exponential merged only where its argument is known finite)
/// and on the term limit, and on nothing else: [`RewriteMemo::key`] holds the arena's sizes
/// (it only grows: stored polynomials, atoms and known classes) and the limit, and the memo
/// is emptied when the key changes. Ids are the arena's own, so the memo is never read
/// against another arena.
#[derive(Default)]
pub(crate) struct RewriteMemo {
    key: (usize, usize, usize, usize),
    /// Expressions rewritten; `None` where the rewriting passes the term limit.
    exprs: FxHashMap<ExprId, Option<Arc<Terms>>>,
    /// Atoms rewritten; `None` where the atom stays as it is.
    atoms: FxHashMap<AtomId, Option<Arc<Terms>>>,
    /// Per atom: 0 unknown, 1 a softmax weight's factor, 2 not ([`Arena::is_weight_atom`]).
    weight: Vec<u8>,
    /// [`is_zero`]'s decided polynomials, across goals. Unlike the rewritten forms these do not
    /// depend on the key: see [`ZeroVerdicts`].
    zero_verdicts: ZeroVerdicts,
}

impl RewriteMemo {
    /// Empties the memo unless it was built for `key`, keeping the zero verdicts (a function
    /// of the polynomial and of atoms and polynomials the arena never changes once stored).
    fn keep_for(&mut self, key: (usize, usize, usize, usize)) {
        if self.key != key {
            *self = RewriteMemo {
                key,
                zero_verdicts: std::mem::take(&mut self.zero_verdicts),
                ..Default::default()
            };
        }
    }
}

/// A polynomial being built outside the arena (the arena is shared read-only here).
type Terms = BTreeMap<Mono, Coeff>;

/// Rewrites expressions with every `product(p, q)` whose factor `p` holds softmax weights
/// (exponentials, reciprocals of exponential sums) as `Σ_w w·product(p_w, q)`, `p_w` the
/// part of `p` that holds exactly the weights `w` (`p = Σ_w w·p_w`; bilinearity, whatever
/// `q` holds). Ring attention's backward computes `Σ_h O_h·dO_h` with the merged output
/// `O_h = Σ_j P_j·V_jh` inside the product, where the spec's softmax backward holds
/// `P_j·Σ_h V_jh·dO_h` with the weight outside: rewritten so, both hold the same atoms.
/// `dO_h` may hold weights of its own: the cross-entropy gradient `softmax_k/N - [t ==
/// k]/N` (the one-hot's row sum folded to 1) is small enough that the products above it
/// are expanded, and its softmax weights reach the attention output's gradient. Where both
/// factors hold weights, the first factor's are moved out first, then the second's: the
/// order is fixed by the factors, so both sides rewrite one product the same way.
///
/// Nothing is interned: a rewritten atom is used only where the arena already holds it (the
/// other side built it), else the atom stays as it is. So the rewriting is a function of the
/// rewritten factors alone, and every step replaces a value by an equal one: a product by
/// the sum of its weight groups' products, a function's arguments by equal ones, and
/// `exp(a)^i·exp(b)^j` by `exp(i·a + j·b)` for a, b known finite. Factors holding a
/// `zero_times` or non-finite term are not rewritten (as in the expansion).
struct WeightsOutside<'a> {
    arena: &'a Arena,
    limits: &'a Limits,
    memo: &'a mut RewriteMemo,
}

impl<'a> WeightsOutside<'a> {
    fn new(arena: &'a Arena, limits: &'a Limits, memo: &'a mut RewriteMemo) -> Self {
        memo.keep_for((
            arena.len(),
            arena.atom_count(),
            arena.class_count(),
            limits.max_terms,
        ));
        WeightsOutside {
            arena,
            limits,
            memo,
        }
    }

    /// Whether some term of `t` holds a softmax weight's factor.
    fn weighted(&mut self, t: &Terms) -> bool {
        t.keys().any(|m| m.iter().any(|&(a, _)| self.is_weight(a)))
    }

    /// Whether atom `a` is a softmax weight's factor, memoized.
    fn is_weight(&mut self, a: AtomId) -> bool {
        let i = a.0 as usize;
        if self.memo.weight.len() <= i {
            self.memo
                .weight
                .resize(self.arena.atom_count().max(i + 1), 0);
        }
        if self.memo.weight[i] == 0 {
            self.memo.weight[i] = if self.arena.is_weight_atom(a) { 1 } else { 2 };
        }
        self.memo.weight[i] == 1
    }

    /// `e` rewritten.
    fn expr(&mut self, e: ExprId) -> Result<Arc<Terms>, String> {
        self.sub_expr(e).map_err(|stop| match stop {
            Stop::TooLarge => too_large(self.limits.max_terms),
            Stop::Other(why) => why,
        })
    }

    fn expr_uncached(&mut self, e: ExprId) -> Result<Arc<Terms>, Stop> {
        let arena = self.arena;
        let mut out = Terms::new();
        for (m, c) in &arena.poly(e).terms {
            let mut acc: Vec<(Mono, Coeff)> = vec![(Vec::new(), c.clone())];
            for &(x, k) in m {
                match self.atom(x)? {
                    None => {
                        for t in &mut acc {
                            t.0 = mul_mono(&t.0, &[(x, k)]);
                        }
                    }
                    Some(r) => {
                        for _ in 0..k {
                            if acc.len().saturating_mul(r.len()) > self.limits.max_terms {
                                return Err(Stop::TooLarge);
                            }
                            let mut next = Vec::with_capacity(acc.len() * r.len());
                            for (am, ac) in &acc {
                                for (rm, rc) in r.iter() {
                                    let mut k = ac.clone();
                                    k *= rc;
                                    next.push((mul_mono(am, rm), k));
                                }
                            }
                            acc = next;
                        }
                    }
                }
            }
            for (m, c) in acc {
                add_term(&mut out, m, c);
            }
            if out.len() > self.limits.max_terms {
                return Err(Stop::TooLarge);
            }
        }
        Ok(Arc::new(self.merge_exps(out)))
    }

    /// Atom `x` rewritten; `None` where it stays as it is.
    fn atom(&mut self, x: AtomId) -> Result<Option<Arc<Terms>>, Stop> {
        if let Some(r) = self.memo.atoms.get(&x) {
            return Ok(r.clone());
        }
        let arena = self.arena;
        let r = match arena.atom(x) {
            Atom::App(Func::Product, fs) if fs.len() == 2 && !arena.is_zero_times(x) => {
                let (p, q) = (self.sub_expr(fs[0])?, self.sub_expr(fs[1])?);
                let expandable = |t: &Terms| t.keys().all(|m| not_expandable(arena, m).is_none());
                if !expandable(&p) || !expandable(&q) {
                    None
                } else {
                    self.weights_out(&p, &q)
                        .or_else(|| self.weights_out(&q, &p))
                        .or_else(|| self.times(&p, &q))
                        .map(Arc::new)
                }
            }
            Atom::App(f, args) => {
                let mut new_args = Vec::with_capacity(args.len());
                let mut changed = false;
                for &a in args {
                    let t = self.sub_expr(a)?;
                    let same = *t == terms_of(arena, a);
                    changed |= !same;
                    new_args.push(if same { Some(a) } else { self.find(&t) });
                }
                match new_args.into_iter().collect::<Option<Vec<ExprId>>>() {
                    Some(new_args) if changed => arena
                        .find_atom(&Atom::App(f.clone(), new_args))
                        .map(|y| Arc::new(Terms::from([(vec![(y, 1)], Coeff::one())]))),
                    _ => None,
                }
            }
            _ => None,
        };
        self.memo.atoms.insert(x, r.clone());
        Ok(r)
    }

    /// [`Self::expr`] for a factor or argument: a factor past the limit stops its atom's
    /// rewriting the same way (and is remembered), the deadline stops everything.
    fn sub_expr(&mut self, e: ExprId) -> Result<Arc<Terms>, Stop> {
        if let Some(t) = self.memo.exprs.get(&e) {
            return t.clone().ok_or(Stop::TooLarge);
        }
        if self.limits.deadline.is_some_and(|d| Instant::now() > d) {
            return Err(Stop::Other(
                "the time limit ran out while moving weights out of products".into(),
            ));
        }
        match self.expr_uncached(e) {
            Ok(t) => {
                self.memo.exprs.insert(e, Some(t.clone()));
                Ok(t)
            }
            Err(Stop::TooLarge) => {
                self.memo.exprs.insert(e, None);
                Err(Stop::TooLarge)
            }
            Err(other) => Err(other),
        }
    }

    /// `p·q` with `p`'s softmax weights outside the products, where `p` holds some and
    /// every part's product is in the arena (`q` is kept whole, weights and all).
    fn weights_out(&mut self, p: &Terms, q: &Terms) -> Option<Terms> {
        if !self.weighted(p) {
            return None;
        }
        let mut groups: BTreeMap<Mono, Terms> = BTreeMap::new();
        for (m, c) in p {
            let (mut w, mut rest): (Mono, Mono) = (Vec::new(), Vec::new());
            for &(a, k) in m {
                if self.is_weight(a) {
                    w.push((a, k));
                } else {
                    rest.push((a, k));
                }
            }
            add_term(groups.entry(w).or_default(), rest, c.clone());
        }
        let mut out = Terms::new();
        for (w, part) in groups {
            // Only where each part's product is one stored atom: a part multiplied out would
            // grow every expression above it (products of 20 to 80 terms, then their
            // products), and the arena never forms a product whose parts it expanded.
            let product = self.times(&part, q)?;
            if product.len() != 1 {
                return None;
            }
            for (m, c) in product {
                add_term(&mut out, mul_mono(&w, &m), c);
            }
        }
        Some(self.merge_exps(out))
    }

    /// `p·q` as the arena forms it (expanded, or a `product` atom of the primitive parts
    /// past the expansion limit), where the arena holds what that needs.
    fn times(&self, p: &Terms, q: &Terms) -> Option<Terms> {
        let arena = self.arena;
        let constant = |t: &Terms| match t.len() {
            0 => Some(Coeff::zero()),
            1 => t.get(&Vec::new()).cloned(),
            _ => None,
        };
        let one_weight = |t: &Terms| t.len() == 1 && t.keys().all(|m| arena.softmax_weight(m));
        let kept = constant(p).is_none()
            && constant(q).is_none()
            && (p.len() > 1 || q.len() > 1)
            && p.len().saturating_mul(q.len()) > arena.budget().expand_limit
            && !one_weight(p)
            && !one_weight(q);
        if kept {
            let (pp, qp) = (poly_of(p), poly_of(q));
            let (cp, cq) = (primitive_scale(&pp), primitive_scale(&qp));
            let mut args = vec![
                self.find(&scaled(p, &cp.recip()))?,
                self.find(&scaled(q, &cq.recip()))?,
            ];
            args.sort();
            let atom = arena.find_atom(&Atom::App(Func::Product, args))?;
            let mut c = cp;
            c *= &cq;
            return Some(Terms::from([(vec![(atom, 1)], c)]));
        }
        if p.len().saturating_mul(q.len()) > self.limits.max_terms {
            return None;
        }
        let mut out = Terms::new();
        for (pm, pc) in p {
            for (qm, qc) in q {
                let mut k = pc.clone();
                k *= qc;
                add_term(&mut out, mul_mono(pm, qm), k);
            }
        }
        Some(self.merge_exps(out))
    }

    /// The stored expression whose normal form is `t`.
    fn find(&self, t: &Terms) -> Option<ExprId> {
        self.arena.find_poly(&poly_of(t))
    }

    /// Each monomial's exponentials of known finite arguments merged into one where the
    /// arena holds it (`exp(a)^i·exp(b)^j = exp(i·a + j·b)`), as the arena merges them.
    fn merge_exps(&self, t: Terms) -> Terms {
        let arena = self.arena;
        let finite_exp = |a: AtomId| match arena.atom(a) {
            Atom::App(Func::Exp, args) if arena.known_finite(args[0]) => Some(args[0]),
            _ => None,
        };
        let needs = |m: &Mono| {
            m.iter()
                .filter(|&&(a, _)| finite_exp(a).is_some())
                .map(|&(_, k)| k)
                .sum::<u32>()
                >= 2
        };
        if !t.keys().any(&needs) {
            return t;
        }
        let mut out = Terms::new();
        for (m, c) in t {
            if !needs(&m) {
                add_term(&mut out, m, c);
                continue;
            }
            let mut arg = Terms::new();
            let mut others: Mono = Vec::new();
            for &(a, k) in &m {
                match finite_exp(a) {
                    Some(b) => {
                        for (bm, bc) in &arena.poly(b).terms {
                            let mut x = bc.clone();
                            x *= &Coeff::from_integer(i64::from(k));
                            add_term(&mut arg, bm.clone(), x);
                        }
                    }
                    None => others.push((a, k)),
                }
            }
            let merged = self
                .find(&arg)
                .and_then(|s| arena.find_atom(&Atom::App(Func::Exp, vec![s])));
            match merged {
                Some(e) => add_term(&mut out, mul_mono(&others, &[(e, 1)]), c),
                None => add_term(&mut out, m, c),
            }
        }
        out
    }
}

fn poly_of(t: &Terms) -> crate::expr::Poly {
    crate::expr::Poly {
        terms: t.iter().map(|(m, c)| (m.clone(), c.clone())).collect(),
    }
}

fn terms_of(arena: &Arena, e: ExprId) -> Terms {
    arena.poly(e).terms.iter().cloned().collect()
}

fn scaled(t: &Terms, k: &Coeff) -> Terms {
    t.iter()
        .map(|(m, c)| {
            let mut c = c.clone();
            c *= k;
            (m.clone(), c)
        })
        .collect()
}

/// Why a rewriting stopped: past the term limit (remembered: it depends only on the memo's
/// key), or anything else (the deadline: not remembered).
enum Stop {
    TooLarge,
    Other(String),
}

/// How far an expansion may go.
struct Limits {
    max_terms: usize,
    deadline: Option<Instant>,
    /// Whether products sharing a factor are compared by their other factors first
    /// ([`combine_shared_factors`]'s nested decision): the second attempt, where multiplying
    /// everything out passed the limit.
    nested: bool,
    /// In nested mode, the polynomials this attempt did not decide, and why: a nested
    /// decision meets the same factors' differences again and again, and under the same
    /// limits would fail the same way (never kept past the attempt).
    stuck: Option<RefCell<FxHashMap<BTreeMap<Mono, Coeff>, String>>>,
    /// In nested mode, the weights-outside rewriting of the groups' other factors, with the
    /// term limit it runs under.
    rewrite: Option<(usize, RefCell<RewriteMemo>)>,
    /// In nested mode, the polynomials decided so far (the attempt stops past
    /// [`NESTED_MAX_DECISIONS`]: a goal that does not meet within it costs bounded time).
    decisions: std::cell::Cell<usize>,
}

impl Limits {
    /// How deep [`is_zero`] recurses: linear atoms' entries, and in nested mode also the
    /// other factors of products sharing one (each level a strictly smaller polynomial of
    /// older ids, so this only bounds the time spent).
    fn max_depth(&self) -> usize {
        if self.nested {
            MAX_NESTED_DEPTH
        } else {
            MAX_DEPTH
        }
    }
}

/// Linear atoms that combine: (function: 0 lookup, 1 where; first argument; argument count;
/// the rest of the monomial).
type GroupKey = (u8, ExprId, usize, Mono);

/// Nesting of linear atoms' entries followed before giving up.
const MAX_DEPTH: usize = 8;

/// Nesting followed in nested mode ([`Limits::nested`]): a ring attention's backward holds
/// the MoE router's gathered gradient some ten products deep in the embedding gradient.
const MAX_NESTED_DEPTH: usize = 32;

/// Terms one nested decision may multiply out ([`Limits::nested`]): it is tried on every
/// group of products sharing a factor, most of which do not cancel, so each try must stay
/// cheap.
const NESTED_MAX_TERMS: usize = 20_000;

/// Polynomials one nested attempt decides at most: most groups do not cancel, and a goal
/// whose sides do not meet within this many costs bounded time (the first embedding-gradient
/// goal of deepseek tp=2 x cp=2 with one layer needs a few thousand; later goals reuse its
/// verdicts).
const NESTED_MAX_DECISIONS: usize = 50_000;

/// Whether the polynomial `diff` is zero once its products are expanded and its linear atoms
/// (`lookup` tables, `where` branches) are combined entry by entry.
fn is_zero(
    arena: &Arena,
    diff: BTreeMap<Mono, Coeff>,
    limits: &Limits,
    depth: usize,
    verdicts: &mut ZeroVerdicts,
) -> Result<bool, String> {
    if let Some(&known) = verdicts.get(&diff) {
        return Ok(known);
    }
    if let Some(stuck) = &limits.stuck {
        if let Some(why) = stuck.borrow().get(&diff) {
            return Err(why.clone());
        }
        let n = limits.decisions.get() + 1;
        if n > NESTED_MAX_DECISIONS {
            return Err(format!(
                "the nested comparison passed {NESTED_MAX_DECISIONS} polynomials"
            ));
        }
        limits.decisions.set(n);
    }
    let key = diff.clone();
    let verdict = is_zero_uncached(arena, diff, limits, depth, verdicts);
    // Only decided answers are kept: a stop (term limit, deadline, depth) says nothing about
    // the polynomial, and a later call may have more room.
    match &verdict {
        Ok(known) => {
            verdicts.insert(key, *known);
        }
        Err(why) => {
            if let Some(stuck) = &limits.stuck {
                stuck.borrow_mut().insert(key, why.clone());
            }
        }
    }
    verdict
}

/// The polynomials [`is_zero`] has decided in one arena, kept with it across its goals
/// ([`RewriteMemo::zero_verdicts`]). The linear-atom step decides each combined table entry by
/// a nested [`is_zero`], and nested tables (a gather of a gather) bring the same entries again
/// for every index and every goal: deepseek tp=2's `add_23` called it 3,809 times a goal on 42
/// distinct polynomials.
///
/// A verdict is a function of the polynomial (coefficients included) and of what its ids
/// stand for: the atoms and factor polynomials it reaches and their `zero_times` flags, all
/// fixed when the arena stores them (the arena only grows). It does not depend on the term
/// limit, the deadline or the depth: those only stop a decision (`Err`), which is never kept.
/// Ids are one arena's own, so the memo lives in that arena and is never read in another.
type ZeroVerdicts = FxHashMap<BTreeMap<Mono, Coeff>, bool>;

/// [`is_zero`] without its memo.
fn is_zero_uncached(
    arena: &Arena,
    mut diff: BTreeMap<Mono, Coeff>,
    limits: &Limits,
    depth: usize,
    verdicts: &mut ZeroVerdicts,
) -> Result<bool, String> {
    let (max_terms, deadline) = (limits.max_terms, limits.deadline);
    if deadline.is_some_and(|d| Instant::now() > d) {
        return Err("the time limit ran out while expanding products".into());
    }
    // A product's factors are interned before the product's atom, so they hold only atoms of
    // smaller ids: the terms are kept by the largest product atom they hold, and taking the
    // largest first expands each atom once, with every term that holds it (the terms of larger
    // ones have been expanded, and what they brought in has cancelled where it could).
    let mut buckets: BTreeMap<AtomId, BTreeMap<Mono, Coeff>> = BTreeMap::new();
    let mut plain: BTreeMap<Mono, Coeff> = BTreeMap::new();
    let mut total = 0usize;
    if depth >= limits.max_depth() {
        return Err("products nest too deep".into());
    }
    let nested = limits.nested.then_some((limits, depth, &mut *verdicts));
    let mut diff = combine_shared_factors(arena, std::mem::take(&mut diff), nested);
    for (m, c) in std::mem::take(&mut diff) {
        put(arena, &mut buckets, &mut plain, &mut total, m, c);
    }
    if total > max_terms {
        return Err(too_large(max_terms));
    }
    while let Some((p, terms)) = buckets.pop_last() {
        if deadline.is_some_and(|d| Instant::now() > d) {
            return Err("the time limit ran out while expanding products".into());
        }
        if arena.is_zero_times(p) {
            return Err("a product that is 0 or NaN (`zero_times`) is not expanded".into());
        }
        let Atom::App(Func::Product, factors) = arena.atom(p) else {
            unreachable!("only product atoms key the buckets")
        };
        for &f in factors {
            for (fm, _) in &arena.poly(f).terms {
                if let Some(why) = not_expandable(arena, fm) {
                    return Err(why);
                }
            }
        }
        for (m, c) in terms {
            // One atom can hold many terms, each a large expansion: the clock is read per term.
            if deadline.is_some_and(|d| Instant::now() > d) {
                return Err("the time limit ran out while expanding products".into());
            }
            let e = m.iter().find(|&&(x, _)| x == p).map_or(0, |&(_, e)| e);
            let rest: Mono = m.into_iter().filter(|&(x, _)| x != p).collect();
            // c · rest · (p · q)^e, term by term.
            let mut acc: Vec<(Mono, Coeff)> = vec![(rest, c)];
            for _ in 0..e {
                for &f in factors {
                    let terms = &arena.poly(f).terms;
                    if acc.len().saturating_mul(terms.len()) > max_terms {
                        return Err(too_large(max_terms));
                    }
                    let mut next = Vec::with_capacity(acc.len() * terms.len());
                    for (am, ac) in &acc {
                        for (fm, fc) in terms {
                            let mut k = ac.clone();
                            k *= fc;
                            next.push((mul_mono(am, fm), k));
                        }
                    }
                    acc = next;
                }
            }
            for (m, c) in acc {
                put(arena, &mut buckets, &mut plain, &mut total, m, c);
            }
            if total > max_terms {
                return Err(too_large(max_terms));
            }
        }
    }
    let diff = plain;
    if diff.is_empty() {
        return Ok(true);
    }
    if depth >= limits.max_depth() {
        return Err("linear atoms nest too deep".into());
    }
    // `lookup(i, t_0, ..)` is linear in its table for one index, and `where(c, a, b)` in its
    // branches for one condition: Σ c_j·m·f(x, T_j) = m·f(x, Σ c_j T_j) (in range, or for the
    // branch taken, both sides are the same sum). So the terms that hold such an atom, grouped
    // by the function, its first argument and the rest of the monomial, cancel when every
    // combined entry is zero. An all-reduce adds the ranks' `lookup`s of partial tables, which
    // the spec looks up in one summed table.
    let mut groups: BTreeMap<GroupKey, Vec<(AtomId, Coeff)>> = BTreeMap::new();
    for (m, c) in diff {
        if let Some(why) = not_expandable(arena, &m) {
            return Err(why);
        }
        let linear = m.iter().rev().find_map(|&(x, e)| match arena.atom(x) {
            Atom::App(f @ (Func::Lookup | Func::Where), args) if e == 1 => {
                Some((x, u8::from(*f == Func::Where), args[0], args.len()))
            }
            _ => None,
        });
        let Some((x, kind, first, len)) = linear else {
            return Ok(false);
        };
        let rest: Mono = m.into_iter().filter(|&(y, _)| y != x).collect();
        groups
            .entry((kind, first, len, rest))
            .or_default()
            .push((x, c));
    }
    for ((_, _, len, _), members) in groups {
        if deadline.is_some_and(|d| Instant::now() > d) {
            return Err("the time limit ran out while combining linear atoms".into());
        }
        for k in 1..len {
            let mut entry: BTreeMap<Mono, Coeff> = BTreeMap::new();
            for (x, c) in &members {
                let Atom::App(_, args) = arena.atom(*x) else {
                    unreachable!("grouped atoms are applications")
                };
                for (m, d) in &arena.poly(args[k]).terms {
                    // Entries that are 0 or NaN, or infinite, must not cancel.
                    if let Some(why) = not_expandable(arena, m) {
                        return Err(why);
                    }
                    let mut t = c.clone();
                    t *= d;
                    add_term(&mut entry, m.clone(), t);
                }
            }
            if !is_zero(arena, entry, limits, depth + 1, verdicts)? {
                return Ok(false);
            }
        }
    }
    Ok(true)
}

/// Combines the terms `c_i·r·product(f, g_i)` that share the rest `r` of their monomial and a
/// factor `f` before anything is expanded: their sum is `r·f·S` with `S = Σ c_i·g_i`
/// (a product atom is the product of its factors, and the ring is commutative). Where `S` is
/// the zero polynomial the group is gone; where `r·f·S` multiplied out has fewer terms than
/// the members' own expansions would bring, it replaces them. An all-reduce over tp sums the
/// ranks' `w·E_k`, which the spec holds as one `w·ΣE_k`: grouped, that cancels without
/// multiplying out `w` with every part (the expansion repeats that for every goal and every
/// term that holds such a product). Only factors the expansion itself would multiply out take
/// part (no `zero_times` or non-finite term), so what is proved is the same identity of
/// polynomials the expansion proves.
///
/// `nested` (the second attempt, [`Limits::nested`]): a group whose `S` [`is_zero`] decides
/// zero is gone too, without anything multiplied out. Full expansion would multiply `r·f` into
/// the expanded `S`, which cancels term by term, so this proves nothing the expansion would not.
fn combine_shared_factors(
    arena: &Arena,
    diff: BTreeMap<Mono, Coeff>,
    mut nested: Option<(&Limits, usize, &mut ZeroVerdicts)>,
) -> BTreeMap<Mono, Coeff> {
    let terms: Vec<(Mono, Coeff)> = diff.into_iter().collect();
    // Per term: its largest product atom with exponent 1 whose factors expand, the rest of
    // its monomial, and the atom's two factors.
    let mut expandable: std::collections::HashMap<AtomId, bool> = Default::default();
    let mut split: Vec<Option<(Mono, ExprId, ExprId)>> = Vec::with_capacity(terms.len());
    let mut groups: BTreeMap<(Mono, ExprId), Vec<usize>> = BTreeMap::new();
    for (i, (m, _)) in terms.iter().enumerate() {
        let entry = m
            .iter()
            .rev()
            .find(|&&(x, _)| is_product(arena, x))
            .and_then(|&(p, e)| {
                let Atom::App(Func::Product, fs) = arena.atom(p) else {
                    return None;
                };
                let ok = *expandable.entry(p).or_insert_with(|| {
                    !arena.is_zero_times(p)
                        && fs.len() == 2
                        && fs.iter().all(|&f| {
                            arena
                                .poly(f)
                                .terms
                                .iter()
                                .all(|(fm, _)| not_expandable(arena, fm).is_none())
                        })
                });
                let rest: Mono = m.iter().copied().filter(|&(x, _)| x != p).collect();
                (e == 1 && ok && not_expandable(arena, &rest).is_none())
                    .then(|| (rest, fs[0], fs[1]))
            });
        if let Some((rest, f, g)) = &entry {
            groups.entry((rest.clone(), *f)).or_default().push(i);
            if g != f {
                groups.entry((rest.clone(), *g)).or_default().push(i);
            }
        }
        split.push(entry);
    }
    // Larger groups first (then in key order: the result does not depend on hashing).
    let mut order: Vec<(&(Mono, ExprId), &Vec<usize>)> =
        groups.iter().filter(|(_, v)| v.len() > 1).collect();
    order.sort_by_key(|(_, v)| std::cmp::Reverse(v.len()));
    let mut used = vec![false; terms.len()];
    let mut out: BTreeMap<Mono, Coeff> = BTreeMap::new();
    for ((rest, f), members) in order {
        let live: Vec<usize> = members.iter().copied().filter(|&i| !used[i]).collect();
        if live.len() < 2 {
            continue;
        }
        // `S` over the first member's coefficient: the members' coefficients carry every
        // enclosing scale (a loss gradient's `2^-129`), their ratios are mostly ±1, and the
        // nested decisions keep to the i128 fast path (and meet scaled copies as one).
        let scale = terms[live[0]].1.clone();
        let mut sum: BTreeMap<Mono, Coeff> = BTreeMap::new();
        let mut before = 0usize;
        let f_len = arena.poly(*f).terms.len();
        for &i in &live {
            let (_, a, b) = split[i].as_ref().expect("grouped terms are split");
            let other = if a == f { *b } else { *a };
            let poly = &arena.poly(other).terms;
            before = before.saturating_add(f_len.saturating_mul(poly.len()));
            let ratio = if i == live[0] {
                Coeff::one()
            } else {
                let mut r = scale.recip();
                r *= &terms[i].1;
                r
            };
            for (gm, gc) in poly {
                let mut k = ratio.clone();
                k *= gc;
                add_term(&mut sum, gm.clone(), k);
            }
        }
        let zero = sum.is_empty()
            || nested.as_mut().is_some_and(|(limits, depth, verdicts)| {
                let mut r = is_zero(arena, sum.clone(), limits, *depth + 1, verdicts);
                if r != Ok(true) {
                    if let Some(rw) = rewritten_sum(arena, limits, &live, &split, &terms, f) {
                        if rw != sum {
                            r = is_zero(arena, rw, limits, *depth + 1, verdicts);
                        }
                    }
                }
                r == Ok(true)
            });
        if zero {
            for &i in &live {
                used[i] = true;
            }
            continue;
        }
        if f_len.saturating_mul(sum.len()) >= before {
            continue;
        }
        for &i in &live {
            used[i] = true;
        }
        for (fm, fc) in &arena.poly(*f).terms {
            let rf = mul_mono(rest, fm);
            let mut fc = fc.clone();
            fc *= &scale;
            for (sm, sc) in &sum {
                let mut k = sc.clone();
                k *= &fc;
                add_term(&mut out, mul_mono(&rf, sm), k);
            }
        }
    }
    for (i, (m, c)) in terms.into_iter().enumerate() {
        if !used[i] {
            add_term(&mut out, m, c);
        }
    }
    out
}

/// The group's `S` with each member's other factor rewritten with its softmax weights
/// outside its products ([`WeightsOutside`]), over the first member's coefficient; `None`
/// where a rewriting stops.
fn rewritten_sum(
    arena: &Arena,
    limits: &Limits,
    live: &[usize],
    split: &[Option<(Mono, ExprId, ExprId)>],
    terms: &[(Mono, Coeff)],
    f: &ExprId,
) -> Option<BTreeMap<Mono, Coeff>> {
    let (rewrite_terms, memo) = limits.rewrite.as_ref()?;
    let rewrite_limits = Limits {
        max_terms: *rewrite_terms,
        deadline: limits.deadline,
        nested: false,
        stuck: None,
        rewrite: None,
        decisions: Default::default(),
    };
    let mut memo = memo.borrow_mut();
    let mut weights = WeightsOutside::new(arena, &rewrite_limits, &mut memo);
    let scale = terms[live[0]].1.clone();
    let mut sum: BTreeMap<Mono, Coeff> = BTreeMap::new();
    for &i in live {
        let (_, a, b) = split[i].as_ref()?;
        let other = if a == f { *b } else { *a };
        let mut ratio = scale.recip();
        ratio *= &terms[i].1;
        let t = weights.expr(other).ok()?;
        for (m, c) in t.iter() {
            let mut k = ratio.clone();
            k *= c;
            add_term(&mut sum, m.clone(), k);
        }
    }
    Some(sum)
}

/// Adds `c·m` to the bucket of its largest product atom (or to `plain`), keeping `total`.
fn put(
    arena: &Arena,
    buckets: &mut BTreeMap<AtomId, BTreeMap<Mono, Coeff>>,
    plain: &mut BTreeMap<Mono, Coeff>,
    total: &mut usize,
    m: Mono,
    c: Coeff,
) {
    let top = m
        .iter()
        .rev()
        .map(|&(x, _)| x)
        .find(|&x| is_product(arena, x));
    let map = match top {
        Some(p) => buckets.entry(p).or_default(),
        None => plain,
    };
    let before = map.len();
    add_term(map, m, c);
    *total = *total + map.len() - before;
}

fn is_product(arena: &Arena, x: AtomId) -> bool {
    matches!(arena.atom(x), Atom::App(Func::Product, _))
}

/// Why a factor's monomial is not multiplied out as a plain polynomial here, if it is not.
fn not_expandable(arena: &Arena, m: &Mono) -> Option<String> {
    m.iter().find_map(|&(x, _)| {
        if arena.is_zero_times(x) {
            Some("a factor holds a `zero_times` term (0 or NaN, never cancelled)".into())
        } else if let Atom::NonFinite(_) = arena.atom(x) {
            Some("a factor holds an infinity or NaN".into())
        } else {
            None
        }
    })
}

fn too_large(max_terms: usize) -> String {
    format!("the expanded difference passes {max_terms} terms")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::expr::SymbolKind;

    /// `n` fresh real symbols named `{name}{i}`, summed.
    fn sum_of(ar: &mut Arena, name: &str, n: usize) -> ExprId {
        let xs: Vec<ExprId> = (0..n)
            .map(|i| ar.symbol(&format!("{name}{i}"), SymbolKind::Real).unwrap())
            .collect();
        ar.sum(&xs).unwrap()
    }

    /// The spec's `h·(f·(y·lookup(i, T0 + T1) + Z))` against the ranks'
    /// `h·(f·(y·(lookup(i, T0) + lookup(i, T1)) + Z))`, each product past the expansion
    /// limit: multiplied out it passes the term limit, compared by the other factors of the
    /// products sharing `h`, then `f`, it meets at the split table. With `wrong_table` the
    /// spec's table is `T0 + 2·T1` (a rank's part counted twice).
    fn nested_pair(ar: &mut Arena, wrong_table: bool) -> (ExprId, ExprId) {
        let i = ar.symbol("i", SymbolKind::Index(3)).unwrap();
        let mut table = |name: &str| -> Vec<ExprId> {
            (0..3)
                .map(|j| ar.symbol(&format!("{name}{j}"), SymbolKind::Real).unwrap())
                .collect()
        };
        let (t0, t1) = (table("t0_"), table("t1_"));
        let two = ar.int(2).unwrap();
        let mut whole = vec![i];
        for j in 0..3 {
            let b = if wrong_table {
                ar.mul(t1[j], two).unwrap()
            } else {
                t1[j]
            };
            whole.push(ar.add(t0[j], b).unwrap());
        }
        let whole = ar.app(Func::Lookup, whole).unwrap();
        let l0 = ar.app(Func::Lookup, [vec![i], t0].concat()).unwrap();
        let l1 = ar.app(Func::Lookup, [vec![i], t1].concat()).unwrap();
        let parts = ar.add(l0, l1).unwrap();
        let y = ar.symbol("y", SymbolKind::Real).unwrap();
        let z = sum_of(ar, "z", 20);
        let f = sum_of(ar, "f", 20);
        let h = sum_of(ar, "h", 20);
        let mut side = |gathered: ExprId| {
            let g = ar.mul(y, gathered).unwrap();
            let g = ar.add(g, z).unwrap();
            let fg = ar.mul(f, g).unwrap();
            ar.mul(h, fg).unwrap()
        };
        (side(whole), side(parts))
    }

    #[test]
    fn products_sharing_a_factor_are_compared_by_their_other_factors() {
        let mut ar = Arena::default();
        let (spec, ranks) = nested_pair(&mut ar, false);
        assert_ne!(spec, ranks);
        let mut bad = Arena::default();
        let (bad_spec, bad_ranks) = nested_pair(&mut bad, true);
        // Multiplied out, h·f·(y·lookup + Z) has 20·20·21 terms: past a 1,000-term limit.
        let limits = Limits {
            max_terms: 1_000,
            deadline: None,
            nested: false,
            stuck: None,
            rewrite: None,
            decisions: Default::default(),
        };
        let mut diff = BTreeMap::new();
        for (m, c) in &ar.poly(spec).terms {
            add_term(&mut diff, m.clone(), c.clone());
        }
        for (m, c) in &ar.poly(ranks).terms {
            add_term(&mut diff, m.clone(), -c);
        }
        assert!(
            is_zero(&ar, diff, &limits, 0, &mut ZeroVerdicts::default()).is_err(),
            "multiplying everything out passes the limit"
        );
        assert_eq!(
            equal_after_expanding_products(&ar, spec, ranks, 1_000, None),
            Ok(true)
        );
        assert_ne!(
            equal_after_expanding_products(&bad, bad_spec, bad_ranks, 1_000, None),
            Ok(true),
            "a wrong table deep inside is never proved"
        );
        let cfg = crate::decide::DecideConfig {
            expand_max_terms: 1_000,
            z3_timeout: None,
            ..Default::default()
        };
        assert_eq!(
            crate::decide::decide(&ar, spec, ranks, &cfg),
            crate::decide::Outcome::Proved(crate::decide::Layer::ProductExpansion)
        );
        match crate::decide::decide(&bad, bad_spec, bad_ranks, &cfg) {
            crate::decide::Outcome::Refuted { point, .. } => {
                // The witness is a real difference: evaluated exactly, the sides differ.
                let mut values = vec![Coeff::zero(); bad.symbols().len()];
                for (s, v) in &point.values {
                    values[*s as usize] = Coeff::from_big(v.clone());
                }
                let mut ev = crate::eval::ExactEval::new(&bad, values);
                let (a, b) = (ev.value(bad_spec), ev.value(bad_ranks));
                assert!(a.is_some() && a != b, "{a:?} {b:?}");
            }
            other => panic!("the wrong table is refuted, not {other:?}"),
        }
    }

    #[test]
    fn products_grouped_otherwise_are_equal_once_expanded() {
        let mut ar = Arena::default();
        // w (two terms) times two 10-term parts: every product is past the expansion limit.
        let w = sum_of(&mut ar, "w", 2);
        let e0 = sum_of(&mut ar, "a", 10);
        let e1 = sum_of(&mut ar, "b", 10);
        let e = ar.add(e0, e1).unwrap();
        let whole = ar.mul(w, e).unwrap();
        let p0 = ar.mul(w, e0).unwrap();
        let p1 = ar.mul(w, e1).unwrap();
        let split = ar.add(p0, p1).unwrap();
        assert_ne!(
            whole, split,
            "the normal form keeps the two groupings apart"
        );
        assert_eq!(
            equal_after_expanding_products(&ar, whole, split, 10_000, None),
            Ok(true)
        );
        // Nested: (w·E)·v against w·E0·v + w·E1·v, through products of products.
        let v = sum_of(&mut ar, "v", 3);
        let lhs = ar.mul(whole, v).unwrap();
        let q0 = ar.mul(p0, v).unwrap();
        let q1 = ar.mul(p1, v).unwrap();
        let rhs = ar.add(q0, q1).unwrap();
        assert_eq!(
            equal_after_expanding_products(&ar, lhs, rhs, 10_000, None),
            Ok(true)
        );
        // A real difference is never zero: w·E against w·E0 + 2·w·E1.
        let two = ar.int(2).unwrap();
        let p1x2 = ar.mul(p1, two).unwrap();
        let wrong = ar.add(p0, p1x2).unwrap();
        assert_eq!(
            equal_after_expanding_products(&ar, whole, wrong, 10_000, None),
            Ok(false)
        );
        // The budget stops it, undecided: (A + B)(C + D) against its four products, which
        // share factors only pairwise (combined, no fewer terms), multiplied out past 10 terms.
        let (a, b, c, d) = (
            sum_of(&mut ar, "p", 10),
            sum_of(&mut ar, "q", 10),
            sum_of(&mut ar, "r", 10),
            sum_of(&mut ar, "s", 10),
        );
        let (ab, cd) = (ar.add(a, b).unwrap(), ar.add(c, d).unwrap());
        let lhs = ar.mul(ab, cd).unwrap();
        let parts: Vec<ExprId> = [(a, c), (a, d), (b, c), (b, d)]
            .iter()
            .map(|&(x, y)| ar.mul(x, y).unwrap())
            .collect();
        let rhs = ar.sum(&parts).unwrap();
        // Asked first: once decided, the arena keeps the verdict, which holds at any budget.
        assert!(equal_after_expanding_products(&ar, lhs, rhs, 10, None).is_err());
        assert_eq!(
            equal_after_expanding_products(&ar, lhs, rhs, 10_000, None),
            Ok(true)
        );
    }

    #[test]
    fn products_sharing_a_factor_cancel_without_being_multiplied_out() {
        let mut ar = Arena::default();
        let w = sum_of(&mut ar, "w", 4);
        let e0 = sum_of(&mut ar, "a", 10);
        let e1 = sum_of(&mut ar, "b", 10);
        let e = ar.add(e0, e1).unwrap();
        // 3·w·E against 3·w·E0 + 3·w·E1 (the ranks' all-reduced halves, scaled).
        let three = ar.int(3).unwrap();
        let we = ar.mul(w, e).unwrap();
        let whole = ar.mul(we, three).unwrap();
        let p0 = ar.mul(w, e0).unwrap();
        let p1 = ar.mul(w, e1).unwrap();
        let split = ar.add(p0, p1).unwrap();
        let split = ar.mul(split, three).unwrap();
        assert_ne!(whole, split);
        // Multiplied out the difference has 160 terms: within 20 it is decided only by
        // combining the shared factor first.
        assert_eq!(
            equal_after_expanding_products(&ar, whole, split, 20, None),
            Ok(true)
        );
        // The same under a common monomial, with the factor on either side of the products.
        let v = ar.symbol("v", SymbolKind::Real).unwrap();
        let (lhs, rhs) = (ar.mul(whole, v).unwrap(), ar.mul(split, v).unwrap());
        assert_eq!(
            equal_after_expanding_products(&ar, lhs, rhs, 20, None),
            Ok(true)
        );
        // A wrong share is never zero: w·E against w·E0 + 2·w·E1 (grouped, S = -E1).
        let two = ar.int(2).unwrap();
        let p1x2 = ar.mul(p1, two).unwrap();
        let wrong = ar.add(p0, p1x2).unwrap();
        assert_eq!(
            equal_after_expanding_products(&ar, we, wrong, 10_000, None),
            Ok(false)
        );
        // Another factor is not shared: w·E against w·E0 + u·E1.
        let u = sum_of(&mut ar, "u", 4);
        let q1 = ar.mul(u, e1).unwrap();
        let other = ar.add(p0, q1).unwrap();
        assert_eq!(
            equal_after_expanding_products(&ar, we, other, 10_000, None),
            Ok(false)
        );
        // A factor holding a `zero_times` term takes no part: 0·(1/y) may be NaN.
        let y = ar.symbol("y", SymbolKind::Real).unwrap();
        let ry = ar.recip(y).unwrap();
        let z = ar.scale(ry, &Coeff::zero()).unwrap();
        let wz = ar.add(w, z).unwrap();
        let (zw, z0, z1) = (
            ar.mul(wz, e).unwrap(),
            ar.mul(wz, e0).unwrap(),
            ar.mul(wz, e1).unwrap(),
        );
        let zs = ar.add(z0, z1).unwrap();
        assert_ne!(zw, zs);
        let diff: BTreeMap<Mono, Coeff> = ar
            .poly(zw)
            .terms
            .iter()
            .cloned()
            .chain(ar.poly(zs).terms.iter().map(|(m, c)| (m.clone(), -c)))
            .collect();
        assert_eq!(combine_shared_factors(&ar, diff.clone(), None), diff);
        assert!(equal_after_expanding_products(&ar, zw, zs, 10_000, None).is_err());
    }

    #[test]
    fn lookups_and_wheres_of_summed_tables_are_the_sums_of_their_lookups() {
        let mut ar = Arena::default();
        let i = ar.symbol("i", SymbolKind::Index(2)).unwrap();
        let a: Vec<ExprId> = (0..2)
            .map(|k| sum_of(&mut ar, &format!("a{k}_"), 10))
            .collect();
        let b: Vec<ExprId> = (0..2)
            .map(|k| sum_of(&mut ar, &format!("b{k}_"), 10))
            .collect();
        let w = sum_of(&mut ar, "w", 2);
        // w·lookup(i, a + b) against w·lookup(i, a) + w·lookup(i, b): products of lookups
        // (an all-reduce of the ranks' gathered partial gradients, scaled by a weight).
        let la = ar.app(Func::Lookup, vec![i, a[0], a[1]]).unwrap();
        let lb = ar.app(Func::Lookup, vec![i, b[0], b[1]]).unwrap();
        let s0 = ar.add(a[0], b[0]).unwrap();
        let s1 = ar.add(a[1], b[1]).unwrap();
        let ls = ar.app(Func::Lookup, vec![i, s0, s1]).unwrap();
        let lhs = ar.mul(w, ls).unwrap();
        let (wa, wb) = (ar.mul(w, la).unwrap(), ar.mul(w, lb).unwrap());
        let rhs = ar.add(wa, wb).unwrap();
        assert_ne!(lhs, rhs);
        assert_eq!(
            equal_after_expanding_products(&ar, lhs, rhs, 10_000, None),
            Ok(true)
        );
        // One entry summed wrongly: not equal.
        let bad = ar.app(Func::Lookup, vec![i, s0, a[1]]).unwrap();
        assert_eq!(
            equal_after_expanding_products(&ar, bad, rhs, 10_000, None),
            Ok(false)
        );
        let sum_ab = ar.add(la, lb).unwrap();
        assert_eq!(
            equal_after_expanding_products(&ar, bad, sum_ab, 10_000, None),
            Ok(false)
        );
        // where(c, a0, b0) + where(c, a1, b1) against where(c, a0 + a1, b0 + b1).
        let c = ar.symbol("c", SymbolKind::Bool).unwrap();
        let w0 = ar.select(c, a[0], b[0]).unwrap();
        let w1 = ar.select(c, a[1], b[1]).unwrap();
        let (x, y) = (ar.add(a[0], a[1]).unwrap(), ar.add(b[0], b[1]).unwrap());
        let whole = ar.select(c, x, y).unwrap();
        let parts = ar.add(w0, w1).unwrap();
        assert_ne!(whole, parts);
        assert_eq!(
            equal_after_expanding_products(&ar, whole, parts, 10_000, None),
            Ok(true)
        );
        // A lookup is not a where: the same entries under the other function do not cancel.
        let lw = ar.app(Func::Lookup, vec![c, x, y]).unwrap();
        assert_eq!(
            equal_after_expanding_products(&ar, lw, parts, 10_000, None),
            Ok(false)
        );
    }

    /// `is_zero`'s memo ([`ZeroVerdicts`]) answers for the whole polynomial, coefficients
    /// included: a polynomial one coefficient away from a decided zero is decided afresh,
    /// never read off the memo.
    #[test]
    fn zero_verdicts_are_kept_for_the_whole_polynomial() {
        let mut ar = Arena::default();
        let w = sum_of(&mut ar, "w", 2);
        let e0 = sum_of(&mut ar, "a", 10);
        let e1 = sum_of(&mut ar, "b", 10);
        let e = ar.add(e0, e1).unwrap();
        let (whole, p0, p1) = (
            ar.mul(w, e).unwrap(),
            ar.mul(w, e0).unwrap(),
            ar.mul(w, e1).unwrap(),
        );
        let difference = |ar: &Arena, scale_p1: i64| {
            let mut d: BTreeMap<Mono, Coeff> = BTreeMap::new();
            for (m, c) in &ar.poly(whole).terms {
                add_term(&mut d, m.clone(), c.clone());
            }
            for (m, c) in &ar.poly(p0).terms {
                add_term(&mut d, m.clone(), -c);
            }
            for (m, c) in &ar.poly(p1).terms {
                add_term(&mut d, m.clone(), -(c * &Coeff::from_integer(scale_p1)));
            }
            d
        };
        let limits = Limits {
            max_terms: 10_000,
            deadline: None,
            nested: false,
            stuck: None,
            rewrite: None,
            decisions: Default::default(),
        };
        let mut verdicts = ZeroVerdicts::default();
        let (good, bad) = (difference(&ar, 1), difference(&ar, 2));
        assert_eq!(
            good.keys().collect::<Vec<_>>(),
            bad.keys().collect::<Vec<_>>()
        );
        assert_eq!(
            is_zero(&ar, good.clone(), &limits, 0, &mut verdicts),
            Ok(true)
        );
        // The same monomials, one coefficient apart: not zero, memo or not.
        assert_eq!(
            is_zero(&ar, bad.clone(), &limits, 0, &mut verdicts),
            Ok(false)
        );
        // Read back: each answer is its own polynomial's.
        assert_eq!(
            is_zero(&ar, good.clone(), &limits, 0, &mut verdicts),
            Ok(true)
        );
        assert_eq!(
            is_zero(&ar, bad.clone(), &limits, 0, &mut verdicts),
            Ok(false)
        );
        // A stop is not remembered: past a limit of 10 terms the same polynomial is undecided,
        // and decided again with room.
        let mut fresh = ZeroVerdicts::default();
        let tight = Limits {
            max_terms: 10,
            deadline: None,
            nested: false,
            stuck: None,
            rewrite: None,
            decisions: Default::default(),
        };
        assert!(is_zero(&ar, bad.clone(), &tight, 0, &mut fresh).is_err());
        assert!(fresh.is_empty());
        assert_eq!(is_zero(&ar, bad, &limits, 0, &mut fresh), Ok(false));
    }

    /// The verdicts kept across goals ([`RewriteMemo::zero_verdicts`]) are one arena's: the
    /// same polynomial by ids, decided zero in one arena, is decided afresh in another where
    /// its ids stand for other products; in its own arena the verdict outlives the arena's
    /// growth.
    #[test]
    fn zero_verdicts_kept_across_goals_are_never_read_in_another_arena() {
        // Both arenas hold w·(E0 + E1), w·E0, w·E1 and w·F (F = E1 + b9), interned in the same
        // order but for the last two: the product atom `split` names is w·E1 in the first and
        // w·F in the second.
        let build = |swap: bool| {
            let mut ar = Arena::default();
            let w = sum_of(&mut ar, "w", 2);
            let e0 = sum_of(&mut ar, "a", 10);
            let e1 = sum_of(&mut ar, "b", 10);
            let b9 = ar.symbol("b9", SymbolKind::Real).unwrap();
            let f = ar.add(e1, b9).unwrap();
            let e = ar.add(e0, e1).unwrap();
            let whole = ar.mul(w, e).unwrap();
            let p0 = ar.mul(w, e0).unwrap();
            let (first, second) = if swap { (f, e1) } else { (e1, f) };
            let p1 = ar.mul(w, first).unwrap();
            ar.mul(w, second).unwrap();
            let split = ar.add(p0, p1).unwrap();
            (ar, whole, split)
        };
        let (right, whole, split) = build(false);
        let (wrong, wrong_whole, wrong_split) = build(true);
        let difference = |ar: &Arena, a: ExprId, b: ExprId| {
            let mut d: BTreeMap<Mono, Coeff> = terms_of(ar, a);
            for (m, c) in &ar.poly(b).terms {
                add_term(&mut d, m.clone(), -c);
            }
            d
        };
        let diff = difference(&right, whole, split);
        assert_eq!(
            diff,
            difference(&wrong, wrong_whole, wrong_split),
            "the same polynomial by ids in both arenas"
        );
        assert!(diff
            .keys()
            .all(|m| m.len() == 1 && is_product(&right, m[0].0)));
        assert_eq!(
            equal_after_expanding_products(&right, whole, split, 10_000, None),
            Ok(true)
        );
        assert_eq!(
            right.rewrite_memo().zero_verdicts.get(&diff),
            Some(&true),
            "kept with the arena for later goals"
        );
        // w·(E0 + E1) - w·E0 - w·F = -w·b9: not zero, although the first arena's memo says so.
        assert_eq!(
            equal_after_expanding_products(&wrong, wrong_whole, wrong_split, 10_000, None),
            Ok(false)
        );
        // The first arena grows (another goal's terms): its verdict stays, and is right.
        let mut right = right;
        let more = sum_of(&mut right, "z", 3);
        right.mul(more, whole).unwrap();
        assert_eq!(
            equal_after_expanding_products(&right, whole, split, 10_000, None),
            Ok(true)
        );
        assert_eq!(right.rewrite_memo().zero_verdicts.get(&diff), Some(&true));
    }

    #[test]
    fn zero_times_products_are_not_expanded() {
        let mut ar = Arena::default();
        let w = sum_of(&mut ar, "w", 2);
        let e0 = sum_of(&mut ar, "a", 10);
        let e1 = sum_of(&mut ar, "b", 10);
        // 0·(1/y): 0 or NaN, its multiples never cancel in the arena, so not here either.
        let y = ar.symbol("y", SymbolKind::Real).unwrap();
        let ry = ar.recip(y).unwrap();
        let z = ar.scale(ry, &Coeff::zero()).unwrap();
        assert!(ar
            .poly(z)
            .terms
            .iter()
            .any(|(m, _)| m.iter().any(|&(x, _)| ar.is_zero_times(x))));
        let wz = ar.add(w, z).unwrap();
        let e = ar.add(e0, e1).unwrap();
        let whole = ar.mul(wz, e).unwrap();
        let p0 = ar.mul(wz, e0).unwrap();
        let p1 = ar.mul(wz, e1).unwrap();
        let split = ar.add(p0, p1).unwrap();
        assert_ne!(whole, split);
        assert!(equal_after_expanding_products(&ar, whole, split, 10_000, None).is_err());
    }
}
