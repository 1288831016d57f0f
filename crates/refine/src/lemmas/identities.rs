//! Linear identities among the atoms of 0-d linear combinations.
//!
//! A class of 0-d values often holds several linear definitions: a loss summed over the tp
//! replicas of one rank and over those of another, once the two ranks' running sums were found
//! equal. Each definition gives the class a combination of atoms, and the two combinations
//! differ only in atoms that are equal in value but were never merged (the replicas' per-layer
//! balance losses). Their difference is a true identity `sum c_a a = 0`. The identities of all
//! such classes, kept in reduced row echelon form, reduce every combination to a canonical
//! one: two values are equal whenever their combinations differ by a combination of known
//! identities, which the reduced forms show as equality.
//!
//! Written by hand: the vectors are sparse over e-class ids, with exact rational coefficients
//! that must never round (a false merge is a false proof), which the numeric linear algebra
//! crates (floating point, dense) do not offer.

use super::{gcd128, Linear};
use egg::Id;
use std::collections::BTreeMap;

/// A rational number `(numerator, denominator)`, denominator positive, in lowest terms.
type Ratio = (i128, i128);

/// A sparse vector over atoms, no zero coefficient.
type Vector = BTreeMap<Id, Ratio>;

/// `a + b`, or `None` on overflow.
fn add(a: Ratio, b: Ratio) -> Option<Ratio> {
    let n = a.0.checked_mul(b.1)?.checked_add(b.0.checked_mul(a.1)?)?;
    normal(n, a.1.checked_mul(b.1)?)
}

/// `a * b`, or `None` on overflow.
fn mul(a: Ratio, b: Ratio) -> Option<Ratio> {
    normal(a.0.checked_mul(b.0)?, a.1.checked_mul(b.1)?)
}

/// `n / d` in lowest terms with a positive denominator; `None` for `d == 0`.
fn normal(n: i128, d: i128) -> Option<Ratio> {
    if d == 0 {
        return None;
    }
    let g = gcd128(n, d) * d.signum();
    Some((n / g, d / g))
}

/// `v + c * w`, or `None` on overflow.
fn add_scaled(v: &Vector, c: Ratio, w: &Vector) -> Option<Vector> {
    let mut out = v.clone();
    for (&atom, &x) in w {
        let term = mul(c, x)?;
        let sum = match out.get(&atom) {
            Some(&y) => add(y, term)?,
            None => term,
        };
        if sum.0 == 0 {
            out.remove(&atom);
        } else {
            out.insert(atom, sum);
        }
    }
    Some(out)
}

/// A combination as a vector.
fn vector(f: &Linear) -> Vector {
    f.iter().map(|&(a, n, d)| (a, (n, d))).collect()
}

/// A span of combinations in reduced row echelon form: each row has coefficient 1 at its
/// pivot (its largest atom) and no other row's pivot, and carries which inserted combinations
/// (by their tags) it is made of.
#[derive(Default)]
pub(super) struct Span {
    rows: BTreeMap<Id, (Vector, Vector)>,
}

impl Span {
    /// Whether the span is empty.
    pub(super) fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }

    /// Adds `v`, tagged `tag` (the combination of tags it stands for). A vector whose
    /// arithmetic overflows is dropped (a smaller span: fewer merges, never a wrong one).
    fn insert(&mut self, v: &Vector, tag: Vector) {
        let Some((row, made_of)) = self.reduce_tagged(v, tag) else {
            return;
        };
        let Some((&pivot, &lead)) = row.iter().next_back() else {
            return; // Already in the span.
        };
        let Some(inv) = normal(lead.1, lead.0) else {
            return;
        };
        let (Some(row), Some(made_of)) = (
            add_scaled(&Vector::new(), inv, &row),
            add_scaled(&Vector::new(), inv, &made_of),
        ) else {
            return;
        };
        // The other rows lose the new pivot, all or none of them.
        let mut updated = Vec::new();
        for (&p, (other, other_of)) in &self.rows {
            if let Some(&c) = other.get(&pivot) {
                let neg = (-c.0, c.1);
                let (Some(r), Some(o)) = (
                    add_scaled(other, neg, &row),
                    add_scaled(other_of, neg, &made_of),
                ) else {
                    return;
                };
                updated.push((p, (r, o)));
            }
        }
        self.rows.extend(updated);
        self.rows.insert(pivot, (row, made_of));
    }

    /// `v` without the pivots (`v - sum v[p] * row_p`) and the tags `tag - sum v[p] *
    /// tags_p`, or `None` on overflow.
    fn reduce_tagged(&self, v: &Vector, tag: Vector) -> Option<(Vector, Vector)> {
        let (mut out, mut of) = (v.clone(), tag);
        for (atom, c) in v {
            if let Some((row, row_of)) = self.rows.get(atom) {
                let neg = (-c.0, c.1);
                out = add_scaled(&out, neg, row)?;
                of = add_scaled(&of, neg, row_of)?;
            }
        }
        Some((out, of))
    }

    /// The canonical form of a combination modulo the span (equal for two combinations
    /// exactly when they differ by a member of the span), or `None` on overflow.
    pub(super) fn reduce(&self, f: &Linear) -> Option<Linear> {
        let (v, _) = self.reduce_tagged(&vector(f), Vector::new())?;
        Some(linear(v))
    }

    /// Records that two combinations of one value are equal: their difference, untagged.
    pub(super) fn insert_identity(&mut self, a: &Linear, b: &Linear) {
        if let Some(diff) = add_scaled(&vector(a), (-1, 1), &vector(b)) {
            self.insert(&diff, Vector::new());
        }
    }

    /// Adds a combination tagged with the class it is the value of.
    pub(super) fn insert_tagged(&mut self, f: &Linear, class: Id) {
        self.insert(&vector(f), Vector::from([(class, (1, 1))]));
    }

    /// `f` as a combination of the tagged classes' values, when it lies in their span.
    pub(super) fn solve(&self, f: &Linear) -> Option<Linear> {
        let (rest, of) = self.reduce_tagged(&vector(f), Vector::new())?;
        // f - sum c_p row_p = rest, and each row is its tags' combination: f = rest + that.
        rest.is_empty()
            .then(|| linear(of.into_iter().map(|(a, (n, d))| (a, (-n, d))).collect()))
    }
}

/// A vector as a combination.
fn linear(v: Vector) -> Linear {
    v.into_iter().map(|(a, (n, d))| (a, n, d)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(i: usize) -> Id {
        Id::from(i)
    }

    /// `x + y` and `x' + y'`, with the identities `x = x'` known from one class and `x + y =
    /// x' + y'` from another, reduce to one form; `x + 2y` stays apart.
    #[test]
    fn combinations_equal_modulo_identities_reduce_alike() {
        let (x, y, x2, y2) = (id(1), id(2), id(3), id(4));
        let mut ids = Span::default();
        ids.insert_identity(&vec![(x, 1, 1)], &vec![(x2, 1, 1)]);
        ids.insert_identity(&vec![(x, 1, 1), (y, 1, 1)], &vec![(x2, 1, 1), (y2, 1, 1)]);
        let a = ids.reduce(&vec![(x, 1, 2), (y, 1, 2)]);
        let b = ids.reduce(&vec![(x2, 1, 2), (y2, 1, 2)]);
        assert_eq!(a, b);
        assert_ne!(ids.reduce(&vec![(x, 1, 1), (y, 2, 1)]), a);
    }

    /// A combination in the span of tagged ones is solved for; one outside is not.
    #[test]
    fn a_combination_in_the_span_is_solved_for() {
        let (x, y, z) = (id(1), id(2), id(3));
        let (a, b) = (id(10), id(11));
        let mut span = Span::default();
        span.insert_tagged(&vec![(x, 1, 1), (y, 1, 1)], a);
        span.insert_tagged(&vec![(y, 2, 1)], b);
        // x + 3y = a + b
        assert_eq!(
            span.solve(&vec![(x, 1, 1), (y, 3, 1)]),
            Some(vec![(a, 1, 1), (b, 1, 1)])
        );
        assert_eq!(span.solve(&vec![(z, 1, 1)]), None);
    }

    /// An identity implied by the known ones adds no row; a scaled one is normalized.
    #[test]
    fn implied_identities_add_nothing() {
        let (x, y, z) = (id(1), id(2), id(3));
        let mut ids = Span::default();
        ids.insert_identity(&vec![(x, 2, 1)], &vec![(y, 1, 3)]);
        ids.insert_identity(&vec![(y, 1, 1)], &vec![(z, 1, 1)]);
        ids.insert_identity(&vec![(x, 6, 1)], &vec![(z, 1, 1)]);
        assert_eq!(ids.rows.len(), 2);
        assert_eq!(ids.reduce(&vec![(z, 1, 1)]), ids.reduce(&vec![(x, 6, 1)]));
    }
}
