//! Lookups at an index proven within the table: the terms every entry shares are taken out.
//!
//! A vocab-parallel cross-entropy reads the target's logit from its rank's shifted logits
//! (`gather(x - max, label - start)`), the spec reads it from the log-softmax row
//! (`nll_loss(x - lse, label)`): two tables whose entries differ by a term common to the whole
//! row. Read at an index within the table, `lookup(i, c + r_0, ..., c + r_{n-1})` is `c + r_i`,
//! so both become `c + lookup(i, r_0, ..., r_{n-1})` over the same residual table (the logits),
//! and the case split (`decide/split.rs`) compares the two lookups' windows entry by entry, as
//! it does for the vocab-parallel embedding.

use super::{Arena, Atom, AtomId, Built, ExprId, Func, Poly};
use rustc_hash::FxHashMap;

impl Arena {
    /// `lookup(index, table...)` for an `index` the caller has proven within `[0,
    /// table.len())` for every valid input (a label whose range the table covers, a gather
    /// index bounded by `exec/range.rs`): the terms that every entry holds with the same
    /// coefficient, each of provably finite atoms, are added outside the lookup and taken off
    /// every entry. Sound only in range: there the lookup is one entry, `c + r_i`; outside it
    /// the two forms need not agree, so nothing else may build a lookup through this.
    pub fn lookup_in_range(&mut self, index: ExprId, table: &[ExprId]) -> Built {
        let shared = self.terms_every_entry_holds(table);
        let mut args = Vec::with_capacity(table.len() + 1);
        args.push(index);
        if shared.is_empty() {
            args.extend_from_slice(table);
            return self.app(Func::Lookup, args);
        }
        let common = self.intern(Poly { terms: shared })?;
        for &entry in table {
            args.push(self.sub(entry, common)?);
        }
        let rest = self.app(Func::Lookup, args)?;
        self.add(common, rest)
    }

    /// The terms of `table[0]` that every other entry holds with the same coefficient, each
    /// monomial of provably finite atoms (so that taking it off and adding it back is exact in
    /// the extended reals the interpreter computes in: a finite term commutes with anything).
    /// None for fewer than two entries.
    fn terms_every_entry_holds(&self, table: &[ExprId]) -> Vec<(super::Mono, super::Coeff)> {
        let [first, rest @ ..] = table else {
            return Vec::new();
        };
        if rest.is_empty() {
            return Vec::new();
        }
        let mut shared: FxHashMap<&super::Mono, &super::Coeff> = self
            .poly(*first)
            .terms
            .iter()
            .map(|(m, c)| (m, c))
            .collect();
        for &entry in rest {
            if shared.is_empty() {
                return Vec::new();
            }
            let held: FxHashMap<&super::Mono, &super::Coeff> =
                self.poly(entry).terms.iter().map(|(m, c)| (m, c)).collect();
            shared.retain(|m, c| held.get(m) == Some(c));
        }
        let mut memo = FxHashMap::default();
        let mut out: Vec<(super::Mono, super::Coeff)> = shared
            .into_iter()
            .filter(|(m, _)| {
                m.iter()
                    .all(|&(a, _)| self.finite_shared_atom(a, &mut memo))
            })
            .map(|(m, c)| (m.clone(), c.clone()))
            .collect();
        out.sort_unstable_by(|a, b| a.0.cmp(&b.0));
        out
    }

    /// Whether atom `a` is provably finite and not a `zero_times` atom.
    fn finite_shared_atom(&self, a: AtomId, memo: &mut FxHashMap<ExprId, super::Class>) -> bool {
        !self.is_zero_times(a)
            && !matches!(self.atom(a), Atom::NonFinite(_))
            && self.atom_class_in(a, memo).finite
    }
}
