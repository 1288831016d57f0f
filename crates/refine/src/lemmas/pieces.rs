//! Cutting a term into independent pieces along its leading dim.
//!
//! Rows `[a, b)` of an operator's leading dim are the same operator over rows of its operands
//! wherever the operator keeps that dim independent: elementwise arithmetic, batched products,
//! softmax and reductions over other dims, views that regroup it. The engine infers an
//! operator's relation piece by piece along such a cut when its e-graph outgrew the node limit
//! (data parallelism combined with context parallelism: each attention block exists once per
//! data-parallel group, and the lemmas combine the groups' blocks in every nesting of their
//! concatenations), so that each piece meets one group's ranks only.

use super::{cats, int, int_list, shape, ELEMENTWISE, SCALE};
use crate::term::{is_op, Term, CAT, LIST, SLICE, SUM};
use egg::{Id, Symbol};
use std::collections::HashMap;

type Graph = egg::EGraph<Term, crate::term::Shapes>;

/// How deep [`leading_bounds`] and [`cut`] descend (a guard against cycles through unions).
const MAX_DEPTH: usize = 48;

/// How an operand's leading rows make the node's: one for one, or regrouped by a view (`out`
/// and `in_` elements per leading row).
#[derive(Clone, Copy)]
enum Rows {
    Same,
    Regrouped { out: usize, in_: usize },
}

impl Rows {
    /// The operand's rows for the node's rows `[a, b)`, when they are whole rows.
    fn map(self, a: usize, b: usize) -> Option<(usize, usize)> {
        match self {
            Rows::Same => Some((a, b)),
            Rows::Regrouped { out, in_ } => {
                let (fa, fb) = (a.checked_mul(out)?, b.checked_mul(out)?);
                (fa % in_ == 0 && fb % in_ == 0).then_some((fa / in_, fb / in_))
            }
        }
    }

    /// The node's row for an operand's row bound, when it is a whole row.
    fn unmap(self, x: usize) -> Option<usize> {
        match self {
            Rows::Same => Some(x),
            Rows::Regrouped { out, in_ } => {
                let f = x.checked_mul(in_)?;
                (f % out == 0).then_some(f / out)
            }
        }
    }
}

fn dim_of(d: i64, rank: usize) -> Option<usize> {
    let d = if d < 0 { d + rank as i64 } else { d };
    usize::try_from(d).ok().filter(|&d| d < rank)
}

/// The operands (positions) whose leading rows make the node's leading rows, for a node that
/// keeps its leading dim independent; operands that broadcast along it stay whole. `None` for
/// any other node.
fn row_operands(g: &Graph, sym: Symbol, kids: &[Id], out: &[usize]) -> Option<Vec<(usize, Rows)>> {
    let rank = out.len();
    if rank == 0 {
        return None;
    }
    let same = |ps: &[usize]| Some(ps.iter().map(|&p| (p, Rows::Same)).collect());
    let name = sym.as_str();
    if is_op!(sym, SUM) {
        return same(&(0..kids.len()).collect::<Vec<_>>());
    }
    if let Some(e) = ELEMENTWISE.iter().find(|e| e.0 == name) {
        let mut ops = Vec::new();
        for &p in e.1 {
            let s = shape(g, *kids.get(p)?)?;
            if s.len() == rank && s[0] == out[0] {
                ops.push((p, Rows::Same));
            } else if s.len() == rank && s[0] != 1 {
                return None;
            }
            // Lower rank or a leading size of one: broadcast along the leading dim.
        }
        return Some(ops);
    }
    match name {
        "aten.bmm.default" if kids.len() == 2 => same(&[0, 1]),
        "aten.matmul.default" if kids.len() == 2 && rank >= 3 => {
            // Both operands batched along the leading dim (none broadcast along it).
            let (x, y) = (shape(g, kids[0])?, shape(g, kids[1])?);
            (x.len() == rank && y.len() == rank && x[0] == out[0] && y[0] == out[0])
                .then(|| vec![(0, Rows::Same), (1, Rows::Same)])
        }
        "aten.view.default" if kids.len() == 2 => {
            let input = shape(g, kids[0])?;
            let in_ = input.iter().skip(1).product::<usize>();
            let out_row = out.iter().skip(1).product::<usize>();
            (!input.is_empty() && in_ > 0 && out_row > 0)
                .then(|| vec![(0, Rows::Regrouped { out: out_row, in_ })])
        }
        "aten.transpose.int" if kids.len() == 3 => {
            let (i, j) = (
                dim_of(int(g, kids[1])?, rank)?,
                dim_of(int(g, kids[2])?, rank)?,
            );
            (i != 0 && j != 0).then(|| vec![(0, Rows::Same)])
        }
        "aten.permute.default" if kids.len() == 2 => {
            let p = int_list(g, kids[1])?;
            (dim_of(*p.first()?, rank)? == 0).then(|| vec![(0, Rows::Same)])
        }
        "aten._softmax.default" | "aten._log_softmax.default" if kids.len() == 3 => {
            (dim_of(int(g, kids[1])?, rank)? != 0).then(|| vec![(0, Rows::Same)])
        }
        "aten._softmax_backward_data.default" | "aten._log_softmax_backward_data.default"
            if kids.len() == 4 =>
        {
            (dim_of(int(g, kids[2])?, rank)? != 0).then(|| vec![(0, Rows::Same), (1, Rows::Same)])
        }
        "aten.sum.dim_IntList" if kids.len() == 4 => {
            let in_rank = shape(g, kids[0])?.len();
            let dims: Vec<usize> = int_list(g, kids[1])?
                .into_iter()
                .map(|d| dim_of(d, in_rank))
                .collect::<Option<_>>()?;
            let reduces_leading = dims.is_empty() || dims.contains(&0);
            (!reduces_leading).then(|| vec![(0, Rows::Same)])
        }
        _ => None,
    }
}

/// The row bounds along dim 0 at which a class falls into independent pieces: the piece sizes
/// of the first concatenation along the leading dim found under operators that keep that dim
/// independent, in the class's own rows. `None` below two pieces.
pub(crate) fn leading_bounds(g: &Graph, id: Id) -> Option<Vec<usize>> {
    bounds_at(g, id, 0)
}

fn bounds_at(g: &Graph, id: Id, depth: usize) -> Option<Vec<usize>> {
    if depth > MAX_DEPTH {
        return None;
    }
    let out = shape(g, id)?;
    for (d, pieces) in cats(g, id) {
        if d == 0 {
            let mut bounds = vec![0];
            for p in &pieces {
                bounds.push(bounds.last()? + shape(g, *p)?.first()?);
            }
            return Some(bounds);
        }
        if let Some(b) = bounds_at(g, pieces[0], depth + 1) {
            return Some(b);
        }
    }
    for n in &g[id].nodes {
        let Term::Op(sym, kids) = n else { continue };
        let Some(ops) = row_operands(g, *sym, kids, &out) else {
            continue;
        };
        for (p, rows) in ops {
            let Some(inner) = bounds_at(g, kids[p], depth + 1) else {
                continue;
            };
            let mapped: Option<Vec<usize>> = inner.iter().map(|&x| rows.unmap(x)).collect();
            if let Some(mut m) = mapped {
                m.dedup();
                if m.len() >= 3 && m.last() == out.first() {
                    return Some(m);
                }
            }
        }
    }
    None
}

/// A class for rows `[a, b)` of `id` along its leading dim: the cut pushed through
/// concatenations, slices and the operators that keep the leading dim independent, down to
/// slices of what it cannot pass.
pub(crate) fn cut(g: &mut Graph, id: Id, a: usize, b: usize) -> Option<Id> {
    cut_at(g, id, a, b, &mut HashMap::new(), 0)
}

fn cut_at(
    g: &mut Graph,
    id: Id,
    a: usize,
    b: usize,
    memo: &mut HashMap<(Id, usize, usize), Id>,
    depth: usize,
) -> Option<Id> {
    let id = g.find(id);
    let out = shape(g, id)?;
    let rows = *out.first()?;
    if a >= b || b > rows {
        return None;
    }
    if a == 0 && b == rows {
        return Some(id);
    }
    if let Some(&c) = memo.get(&(id, a, b)) {
        return Some(c);
    }
    let found = if depth > MAX_DEPTH {
        None
    } else {
        cut_through(g, id, &out, a, b, memo, depth)
    };
    let c = match found {
        Some(c) => c,
        None => slice_rows(g, id, a, b),
    };
    memo.insert((id, a, b), c);
    Some(c)
}

fn cut_through(
    g: &mut Graph,
    id: Id,
    out: &[usize],
    a: usize,
    b: usize,
    memo: &mut HashMap<(Id, usize, usize), Id>,
    depth: usize,
) -> Option<Id> {
    // The first concatenation: every one of a class holds the same rows.
    if let Some((d, pieces)) = cats(g, id).into_iter().next() {
        let mut kids = Vec::new();
        if d == 0 {
            let mut start = 0;
            for p in pieces {
                let len = *shape(g, p)?.first()?;
                let (lo, hi) = (a.max(start), b.min(start + len));
                if lo < hi {
                    kids.push(cut_at(g, p, lo - start, hi - start, memo, depth + 1)?);
                }
                start += len;
            }
        } else {
            for p in pieces {
                kids.push(cut_at(g, p, a, b, memo, depth + 1)?);
            }
        }
        return Some(if kids.len() == 1 {
            kids[0]
        } else {
            let dn = g.add(Term::Num(d as i64));
            g.add(Term::Op(
                Symbol::from(CAT),
                std::iter::once(dn).chain(kids).collect(),
            ))
        });
    }
    let nodes = g[id].nodes.clone();
    for n in &nodes {
        let Term::Op(sym, kids) = n else { continue };
        if is_op!(sym, SLICE) && kids.len() == 4 && int(g, kids[0]) == Some(0) {
            let s = usize::try_from(int(g, kids[1])?).ok()?;
            return cut_at(g, kids[3], s + a, s + b, memo, depth + 1);
        }
        if is_op!(sym, SCALE) && kids.len() == 3 {
            let inner = cut_at(g, kids[2], a, b, memo, depth + 1)?;
            return Some(g.add(Term::Op(*sym, vec![kids[0], kids[1], inner])));
        }
        if sym.as_str() == "aten.full.default" && !kids.is_empty() {
            // A fill cut is the fill of the cut shape (a zero block stays a zero fill).
            let mut target = out.to_vec();
            target[0] = b - a;
            let nums: Vec<Id> = target.iter().map(|&n| g.add(Term::Num(n as i64))).collect();
            let mut new = kids.clone();
            new[0] = g.add(Term::Op(Symbol::from(LIST), nums));
            return Some(g.add(Term::Op(*sym, new)));
        }
        let Some(ops) = row_operands(g, *sym, kids, out) else {
            continue;
        };
        let mut new = kids.clone();
        let mut ok = true;
        for (p, rows) in ops {
            match rows
                .map(a, b)
                .and_then(|(x, y)| cut_at(g, kids[p], x, y, memo, depth + 1))
            {
                Some(c) => new[p] = c,
                None => {
                    ok = false;
                    break;
                }
            }
        }
        if !ok {
            continue;
        }
        if sym.as_str() == "aten.view.default" {
            let mut target = out.to_vec();
            target[0] = b - a;
            let nums: Vec<Id> = target.iter().map(|&n| g.add(Term::Num(n as i64))).collect();
            new[1] = g.add(Term::Op(Symbol::from(LIST), nums));
        }
        return Some(g.add(Term::Op(*sym, new)));
    }
    None
}

/// `slice(0, a, b, id)`.
fn slice_rows(g: &mut Graph, id: Id, a: usize, b: usize) -> Id {
    let kids = vec![
        g.add(Term::Num(0)),
        g.add(Term::Num(a as i64)),
        g.add(Term::Num(b as i64)),
        id,
    ];
    g.add(Term::Op(Symbol::from(SLICE), kids))
}

/// For the node `sym(kids)` of shape `out`, the operands to cut for its rows `[a, b)` along
/// the leading dim: (position, rows of the operand). `None` where the node does not keep the
/// leading dim independent, or the rows do not fall on whole rows of an operand. A view's
/// target shape changes too: its leading size becomes `b - a`.
pub(crate) fn operand_rows(
    g: &Graph,
    sym: &str,
    kids: &[Id],
    out: &[usize],
    a: usize,
    b: usize,
) -> Option<Vec<(usize, usize, usize)>> {
    let ops = row_operands(g, Symbol::from(sym), kids, out)?;
    ops.into_iter()
        .map(|(p, rows)| rows.map(a, b).map(|(x, y)| (p, x, y)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::eval::{eval, random_tensor, seeded_values, tensors_agree};
    use crate::term::{parse_leaf, Shapes};
    use egg::RecExpr;
    use shardproof_ir::DType;
    use shardproof_ops::Meta;

    /// The e-graph of `term` over f64 leaves of the given shapes, with random leaf values.
    fn setup(
        term: &str,
        shapes: &[(&str, &[usize])],
    ) -> (Graph, Id, HashMap<String, shardproof_ops::Tensor>) {
        let expr: RecExpr<Term> = term.parse().unwrap();
        let mut g = Graph::new(Shapes::default());
        let mut values = HashMap::new();
        let mut next = seeded_values(0.37);
        for node in expr.as_ref() {
            if let Term::Op(s, k) = node {
                if let (true, Some((r, name))) = (k.is_empty(), parse_leaf(s.as_str())) {
                    let shape = shapes.iter().find(|(n, _)| *n == name).unwrap().1.to_vec();
                    g.analysis
                        .leaves
                        .insert(*s, Meta::new(DType::F64, shape.clone()));
                    values
                        .entry(format!("r{r}:{name}"))
                        .or_insert_with(|| random_tensor(DType::F64, shape, 8, &mut next));
                }
            }
        }
        let root = g.add_expr(&expr);
        g.rebuild();
        (g, root, values)
    }

    /// Every cut along `bounds` evaluates to those rows of the term.
    fn assert_cuts_are_rows(term: &str, shapes: &[(&str, &[usize])], bounds: &[usize]) {
        let (mut g, root, values) = setup(term, shapes);
        assert_eq!(leading_bounds(&g, root).as_deref(), Some(bounds), "{term}");
        for w in bounds.windows(2) {
            let piece = cut(&mut g, root, w[0], w[1]).unwrap();
            g.rebuild();
            let got = egg::Extractor::new(&g, egg::AstSize).find_best(piece).1;
            let want: RecExpr<Term> = format!("(slice 0 {} {} {term})", w[0], w[1])
                .parse()
                .unwrap();
            let (a, b) = (eval(&got, &values).unwrap(), eval(&want, &values).unwrap());
            assert!(tensors_agree(&a, &b), "{term} rows {w:?}: {got}");
            assert!(
                !got.to_string().contains("(slice 0"),
                "the cut stopped early: {got}"
            );
        }
    }

    #[test]
    fn a_softmax_backward_over_a_viewed_product_cuts_into_its_batch_pieces() {
        assert_cuts_are_rows(
            "(aten._softmax_backward_data.default (aten.view.default (aten.bmm.default (cat 0 %r0:a %r1:a) (cat 0 %r0:b %r1:b)) (list 2 2 3 4)) (aten._softmax.default (cat 0 %r0:c %r1:c) 3 b:false) 3 dt:f64)",
            &[("a", &[2, 3, 5]), ("b", &[2, 5, 4]), ("c", &[1, 2, 3, 4])],
            &[0, 1, 2],
        );
    }

    #[test]
    fn broadcast_operands_and_fills_are_cut_or_kept_whole() {
        assert_cuts_are_rows(
            "(aten.add.Tensor (aten.mul.Tensor (cat 0 %r0:x %r1:x) %r0:w) (aten.full.default (list 4 3) f:1.0 dt:f64 none dev b:false) 1)",
            &[("x", &[2, 3]), ("w", &[3])],
            &[0, 2, 4],
        );
    }

    #[test]
    fn reductions_transposes_and_rank_sums_keep_the_leading_dim() {
        assert_cuts_are_rows(
            "(scale 1 2 (sum (aten.sum.dim_IntList (aten.transpose.int (cat 0 %r0:x %r1:x) 1 2) (list 2) b:true none) (aten.sum.dim_IntList (aten.transpose.int (cat 0 (cat 1 %r0:y %r1:y) (cat 1 %r2:y %r3:y)) 1 2) (list 2) b:true none)))",
            &[("x", &[1, 4, 3]), ("y", &[1, 2, 3])],
            &[0, 1, 2],
        );
    }

    #[test]
    fn operators_mixing_leading_rows_are_never_cut_through() {
        for term in [
            "(aten.transpose.int (cat 0 %r0:x %r1:x) 0 1)",
            "(aten._softmax.default (cat 0 %r0:x %r1:x) 0 b:false)",
            "(aten.sum.dim_IntList (cat 0 %r0:x %r1:x) (list 0) b:true none)",
        ] {
            let (g, root, _) = setup(term, &[("x", &[2, 3])]);
            assert_eq!(leading_bounds(&g, root), None, "{term}");
        }
    }
}
