//! Cutting a term into independent pieces along one of its dims.
//!
//! Rows `[a, b)` of an operator's dim are the same operator over rows of its operands wherever
//! the operator keeps that dim independent: elementwise arithmetic, batched products (and the
//! free dims of products), softmax and reductions over other dims, transposes, views that
//! regroup it. The engine infers an operator's relation piece by piece along such a cut when
//! its e-graph outgrew the node limit (data or tensor parallelism combined with context
//! parallelism: each attention block exists once per data-parallel group or per
//! tensor-parallel head group, and the lemmas combine the groups' blocks in every nesting of
//! their concatenations), so that each piece meets one group's ranks only.
//!
//! A cut may be strided: the same rows of each of several equal blocks of a dim, the form a
//! head group takes in the flattened `batch x heads` dim of the attention's products.

use super::{cat, cats, int, int_list, is_true, list, op, shape, slice, ELEMENTWISE, SCALE};
use crate::term::{is_op, Term, SLICE, SUM};
use egg::{Id, Symbol};
use std::collections::HashMap;

type Graph = egg::EGraph<Term, crate::term::Shapes>;

const VIEW: &str = "aten.view.default";

/// How deep [`split`] and [`cut`] descend (a guard against cycles through unions).
const MAX_DEPTH: usize = 48;

/// Rows `[a, b)` of each of the `outer` equal blocks of `dim`: a plain range of rows for one
/// block, the same rows of every block for more (a head group in a flattened batch x heads).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub(crate) struct Cut {
    /// The dim cut.
    pub dim: usize,
    /// How many equal blocks the dim falls into.
    pub outer: usize,
    /// The first row taken in each block.
    pub a: usize,
    /// One past the last row taken in each block.
    pub b: usize,
}

impl Cut {
    /// The cut's size along its dim.
    pub fn len(self) -> usize {
        self.outer * (self.b - self.a)
    }

    /// The same rows along another dim, in `outer` blocks.
    fn moved(self, dim: usize, outer: usize, (a, b): (usize, usize)) -> Cut {
        Cut { dim, outer, a, b }
    }
}

/// Where a class falls into independent pieces: the dim, its blocks, and the row bounds of the
/// pieces within each block.
#[derive(Clone, PartialEq, Eq, Debug)]
pub(crate) struct Split {
    /// The dim split.
    pub dim: usize,
    /// How many equal blocks the dim falls into (the pieces take the same rows of each).
    pub outer: usize,
    /// The pieces' row bounds within a block, from 0 to the block's size.
    pub bounds: Vec<usize>,
}

impl Split {
    /// The cuts of the pieces, in order.
    pub fn cuts(&self) -> Vec<Cut> {
        self.bounds
            .windows(2)
            .map(|w| Cut {
                dim: self.dim,
                outer: self.outer,
                a: w[0],
                b: w[1],
            })
            .collect()
    }
}

fn dim_of(d: i64, rank: usize) -> Option<usize> {
    let d = if d < 0 { d + rank as i64 } else { d };
    usize::try_from(d).ok().filter(|&d| d < rank)
}

fn product(dims: &[usize]) -> usize {
    dims.iter().product()
}

/// The operands whose rows along some dim are the node's rows along `dim`, one for one, for a
/// node other than a view that keeps `dim` independent: (position, the operand's dim).
/// Operands that broadcast along it stay whole. `None` for any other node.
fn dim_operands(
    g: &Graph,
    sym: Symbol,
    kids: &[Id],
    out: &[usize],
    dim: usize,
) -> Option<Vec<(usize, usize)>> {
    let rank = out.len();
    if dim >= rank {
        return None;
    }
    let name = sym.as_str();
    if is_op!(sym, SUM) {
        return Some((0..kids.len()).map(|p| (p, dim)).collect());
    }
    if let Some(e) = ELEMENTWISE.iter().find(|e| e.0 == name) {
        let mut ops = Vec::new();
        for &p in e.1 {
            let s = shape(g, *kids.get(p)?)?;
            // Fewer dims, or a size of one along the cut: broadcast, every piece takes it whole.
            let Some(at) = (dim + s.len()).checked_sub(rank) else {
                continue;
            };
            if s[at] == out[dim] {
                ops.push((p, at));
            } else if s[at] != 1 {
                return None;
            }
        }
        return Some(ops);
    }
    if is_op!(sym, SLICE) && kids.len() == 4 {
        // A slice along another dim keeps this one whole.
        return (dim_of(int(g, kids[0])?, rank)? != dim).then(|| vec![(3, dim)]);
    }
    match name {
        "aten.mm.default" if kids.len() == 2 && rank == 2 => {
            Some(vec![if dim == 0 { (0, 0) } else { (1, 1) }])
        }
        "aten.bmm.default" if kids.len() == 2 && rank == 3 => Some(match dim {
            0 => vec![(0, 0), (1, 0)],
            1 => vec![(0, 1)],
            _ => vec![(1, 2)],
        }),
        "aten.matmul.default" if kids.len() == 2 && rank >= 3 => {
            // Both operands batched alike (none broadcast along a batch dim).
            let (x, y) = (shape(g, kids[0])?, shape(g, kids[1])?);
            if x.len() != rank || y.len() != rank {
                return None;
            }
            if dim == rank - 2 {
                Some(vec![(0, dim)])
            } else if dim == rank - 1 {
                Some(vec![(1, dim)])
            } else {
                (x[dim] == out[dim] && y[dim] == out[dim]).then(|| vec![(0, dim), (1, dim)])
            }
        }
        "aten.transpose.int" if kids.len() == 3 => {
            let (i, j) = (
                dim_of(int(g, kids[1])?, rank)?,
                dim_of(int(g, kids[2])?, rank)?,
            );
            let at = if dim == i {
                j
            } else if dim == j {
                i
            } else {
                dim
            };
            Some(vec![(0, at)])
        }
        "aten.permute.default" if kids.len() == 2 => {
            let p = int_list(g, kids[1])?;
            Some(vec![(0, dim_of(*p.get(dim)?, rank)?)])
        }
        "aten._softmax.default" | "aten._log_softmax.default" if kids.len() == 3 => {
            (dim_of(int(g, kids[1])?, rank)? != dim).then(|| vec![(0, dim)])
        }
        "aten._softmax_backward_data.default" | "aten._log_softmax_backward_data.default"
            if kids.len() == 4 =>
        {
            (dim_of(int(g, kids[2])?, rank)? != dim).then(|| vec![(0, dim), (1, dim)])
        }
        "aten.sum.dim_IntList" if kids.len() == 4 => {
            let in_rank = shape(g, kids[0])?.len();
            let dims: Vec<usize> = int_list(g, kids[1])?
                .into_iter()
                .map(|d| dim_of(d, in_rank))
                .collect::<Option<_>>()?;
            if dims.is_empty() {
                return None;
            }
            let at = if is_true(g, kids[2]) {
                (!dims.contains(&dim)).then_some(dim)?
            } else {
                // The `dim`-th of the dims the sum keeps.
                (0..in_rank).filter(|d| !dims.contains(d)).nth(dim)?
            };
            Some(vec![(0, at)])
        }
        _ => None,
    }
}

/// How many equal blocks dim `k` of `shape` falls into so that, with every index of the dims
/// before it, they make `blocks` blocks in all: `None` where no whole number does.
fn blocks_of_dim(shape: &[usize], k: usize, blocks: usize) -> Option<usize> {
    let before = product(&shape[..k]);
    if before == 0 || !blocks.is_multiple_of(before) {
        return None;
    }
    let outer = blocks / before;
    (outer > 0 && shape[k].is_multiple_of(outer)).then_some(outer)
}

/// For a view of `input` to `out`, the cut of `input` holding the elements of cut `c` of the
/// output. Both tensors fall into the same contiguous blocks (every index of the output's dims
/// before `c.dim`, times `c.outer`); the input's dim is one where whole rows of it make the
/// cut's rows of a block, as a whole number of blocks of its own.
fn view_cut(input: &[usize], out: &[usize], c: Cut) -> Option<Cut> {
    if !out[c.dim].is_multiple_of(c.outer) {
        return None;
    }
    let blocks = product(&out[..c.dim]) * c.outer;
    let out_row = product(&out[c.dim + 1..]);
    (0..input.len()).find_map(|k| {
        let outer = blocks_of_dim(input, k, blocks)?;
        let in_row = product(&input[k + 1..]);
        let (fa, fb) = (c.a * out_row, c.b * out_row);
        (in_row > 0 && fa % in_row == 0 && fb % in_row == 0)
            .then(|| c.moved(k, outer, (fa / in_row, fb / in_row)))
    })
}

/// For a view of `input` to `out` whose cut `c` [`view_cut`] cannot map to one dim of the
/// input, because its rows lie inside one row of an input dim (a head group of one batch row,
/// where the view flattens batch x heads and data and tensor parallelism split both): that
/// input row of dim `k`, then the rows of dim `k + 1` inside it, two cuts applied in turn.
fn view_cut_in_two(input: &[usize], out: &[usize], c: Cut) -> Option<(Cut, Cut)> {
    if c.outer != 1 || c.a >= c.b {
        return None;
    }
    let blocks = product(&out[..c.dim]);
    let out_row = product(&out[c.dim + 1..]);
    let (fa, fb) = (c.a * out_row, c.b * out_row);
    (0..input.len().saturating_sub(1)).find_map(|k| {
        if product(&input[..k]) != blocks {
            return None;
        }
        let in_row = product(&input[k + 2..]);
        let row = input[k + 1] * in_row;
        if row == 0 {
            return None;
        }
        let i = fa / row;
        if (fb - 1) / row != i {
            return None;
        }
        let (ra, rb) = (fa - i * row, fb - i * row);
        (ra % in_row == 0 && rb % in_row == 0).then_some((
            Cut {
                dim: k,
                outer: 1,
                a: i,
                b: i + 1,
            },
            Cut {
                dim: k + 1,
                outer: 1,
                a: ra / in_row,
                b: rb / in_row,
            },
        ))
    })
}

/// For a view of `input` to `out`, where the input splits along its dim `k` into `outer`
/// blocks with the given bounds: the output's split along `dim`, if the same elements are
/// whole rows there.
/// With `coarse`, bounds that fall inside output rows are dropped (adjacent pieces merged):
/// batch rows made of several head groups, where the pieces are the head groups.
fn view_split(
    input: &[usize],
    out: &[usize],
    dim: usize,
    inner: &Split,
    coarse: bool,
) -> Option<Split> {
    let blocks = product(&input[..inner.dim]) * inner.outer;
    let outer = blocks_of_dim(out, dim, blocks)?;
    let (in_row, out_row) = (product(&input[inner.dim + 1..]), product(&out[dim + 1..]));
    let rows = inner.bounds.iter().map(|&x| {
        let f = x * in_row;
        (out_row > 0 && f % out_row == 0).then_some(f / out_row)
    });
    let mut bounds: Vec<usize> = if coarse {
        rows.flatten().collect()
    } else {
        rows.collect::<Option<_>>()?
    };
    bounds.dedup();
    (bounds.len() >= 3 && bounds.last() == Some(&(out[dim] / outer))).then_some(Split {
        dim,
        outer,
        bounds,
    })
}

/// The first of [`splits`].
#[cfg(test)]
pub(crate) fn split(g: &Graph, id: Id) -> Option<Split> {
    splits(g, id).into_iter().next()
}

/// Where a class falls into independent pieces, in the order to try them: along each dim, the
/// leading one first, the first concatenation found under operators that keep that dim
/// independent, mapped to the class's own dims and rows; then the same with pieces merged
/// where a view's rows hold several (the batch rows of a flattened batch x heads split by both
/// data and tensor parallelism). Empty below two pieces along every dim.
pub(crate) fn splits(g: &Graph, id: Id) -> Vec<Split> {
    let Some(rank) = shape(g, id).map(|s| s.len()) else {
        return Vec::new();
    };
    let mut found: Vec<Split> = Vec::new();
    for coarse in [false, true] {
        let mut search = SplitSearch {
            g,
            memo: HashMap::new(),
            coarse,
        };
        for d in 0..rank {
            if let Some(s) = search.at(id, d, 0) {
                if !found.contains(&s) {
                    found.push(s);
                }
            }
        }
    }
    found
}

/// The search of [`splits`]: each class and dim's split, once.
struct SplitSearch<'g> {
    g: &'g Graph,
    memo: HashMap<(Id, usize), Option<Split>>,
    /// Whether a view may merge pieces (see [`view_split`]).
    coarse: bool,
}

impl SplitSearch<'_> {
    fn at(&mut self, id: Id, dim: usize, depth: usize) -> Option<Split> {
        let id = self.g.find(id);
        if let Some(known) = self.memo.get(&(id, dim)) {
            return known.clone();
        }
        // A cycle through unions ends here.
        self.memo.insert((id, dim), None);
        let found = if depth > MAX_DEPTH {
            None
        } else {
            self.here(id, dim, depth)
        };
        self.memo.insert((id, dim), found.clone());
        found
    }

    fn here(&mut self, id: Id, dim: usize, depth: usize) -> Option<Split> {
        let g = self.g;
        let out = shape(g, id)?;
        for (d, pieces) in cats(g, id) {
            if d == dim {
                let mut bounds = vec![0];
                for p in &pieces {
                    bounds.push(bounds.last()? + shape(g, *p)?.get(dim)?);
                }
                return Some(Split {
                    dim,
                    outer: 1,
                    bounds,
                });
            }
            if let Some(s) = self.at(pieces[0], dim, depth + 1) {
                return Some(s);
            }
        }
        for n in &g[id].nodes {
            let Term::Op(sym, kids) = n else { continue };
            if sym.as_str() == VIEW && kids.len() == 2 {
                let Some(input) = shape(g, kids[0]) else {
                    continue;
                };
                for k in 0..input.len() {
                    let Some(inner) = self.at(kids[0], k, depth + 1) else {
                        continue;
                    };
                    if let Some(s) = view_split(&input, &out, dim, &inner, self.coarse) {
                        return Some(s);
                    }
                }
                continue;
            }
            let Some(ops) = dim_operands(g, *sym, kids, &out, dim) else {
                continue;
            };
            for (p, at) in ops {
                if let Some(inner) = self.at(kids[p], at, depth + 1) {
                    return Some(Split { dim, ..inner });
                }
            }
        }
        None
    }
}

/// A class for cut `c` of `id`: the cut pushed through concatenations, slices and the
/// operators that keep its dim independent, down to slices of what it cannot pass.
pub(crate) fn cut(g: &mut Graph, id: Id, c: Cut) -> Option<Id> {
    cut_at(g, id, c, &mut HashMap::new(), 0)
}

fn cut_at(
    g: &mut Graph,
    id: Id,
    c: Cut,
    memo: &mut HashMap<(Id, Cut), Id>,
    depth: usize,
) -> Option<Id> {
    let id = g.find(id);
    let out = shape(g, id)?;
    let rows = *out.get(c.dim)?;
    if c.outer == 0 || c.a >= c.b || rows % c.outer != 0 || c.b > rows / c.outer {
        return None;
    }
    if c.len() == rows {
        return Some(id);
    }
    if let Some(&found) = memo.get(&(id, c)) {
        return Some(found);
    }
    let found = if depth > MAX_DEPTH {
        None
    } else {
        cut_through(g, id, &out, c, memo, depth)
    };
    let piece = match found {
        Some(p) => p,
        None => slice_along(g, id, &out, c),
    };
    memo.insert((id, c), piece);
    Some(piece)
}

/// The list node of `out` with its size along `dim` set to `len`.
fn resized(g: &mut Graph, out: &[usize], dim: usize, len: usize) -> Id {
    let mut target = out.to_vec();
    target[dim] = len;
    list(g, &target)
}

fn cut_through(
    g: &mut Graph,
    id: Id,
    out: &[usize],
    c: Cut,
    memo: &mut HashMap<(Id, Cut), Id>,
    depth: usize,
) -> Option<Id> {
    // The first concatenation: every one of a class holds the same rows.
    if let Some((d, pieces)) = cats(g, id).into_iter().next() {
        let mut kids = Vec::new();
        if d == c.dim {
            // A strided cut takes rows of several pieces in turn: sliced instead.
            if c.outer != 1 {
                return None;
            }
            let mut start = 0;
            for p in pieces {
                let len = *shape(g, p)?.get(d)?;
                let (lo, hi) = (c.a.max(start), c.b.min(start + len));
                if lo < hi {
                    let inner = c.moved(d, 1, (lo - start, hi - start));
                    kids.push(cut_at(g, p, inner, memo, depth + 1)?);
                }
                start += len;
            }
        } else {
            for p in pieces {
                kids.push(cut_at(g, p, c, memo, depth + 1)?);
            }
        }
        return Some(cat(g, d, kids));
    }
    let nodes = g[id].nodes.clone();
    for n in &nodes {
        let Term::Op(sym, kids) = n else { continue };
        if is_op!(sym, SLICE) && kids.len() == 4 && c.outer == 1 {
            let along = int(g, kids[0]).and_then(|d| dim_of(d, out.len()));
            if along == Some(c.dim) {
                let s = usize::try_from(int(g, kids[1])?).ok()?;
                let shifted = c.moved(c.dim, 1, (s + c.a, s + c.b));
                return cut_at(g, kids[3], shifted, memo, depth + 1);
            }
        }
        if is_op!(sym, SCALE) && kids.len() == 3 {
            let inner = cut_at(g, kids[2], c, memo, depth + 1)?;
            return Some(g.add(Term::Op(*sym, vec![kids[0], kids[1], inner])));
        }
        if sym.as_str() == "aten.full.default" && !kids.is_empty() {
            // A fill cut is the fill of the cut shape (a zero block stays a zero fill).
            let mut new = kids.clone();
            new[0] = resized(g, out, c.dim, c.len());
            return Some(g.add(Term::Op(*sym, new)));
        }
        let Some(ops) = operand_cuts(g, *sym, kids, out, c) else {
            // A view whose cut is no rows of one dim of its input may be two cuts in turn.
            if sym.as_str() == VIEW && kids.len() == 2 {
                let input = shape(g, kids[0])?;
                if let Some((row, rows)) = view_cut_in_two(&input, out, c) {
                    let once = cut_at(g, kids[0], row, memo, depth + 1)?;
                    let twice = cut_at(g, once, rows, memo, depth + 1)?;
                    let target = resized(g, out, c.dim, c.len());
                    return Some(g.add(Term::Op(*sym, vec![twice, target])));
                }
            }
            continue;
        };
        let mut new = kids.clone();
        let mut ok = true;
        for (p, inner) in ops {
            match cut_at(g, kids[p], inner, memo, depth + 1) {
                Some(piece) => new[p] = piece,
                None => {
                    ok = false;
                    break;
                }
            }
        }
        if !ok {
            continue;
        }
        if sym.as_str() == VIEW {
            new[1] = resized(g, out, c.dim, c.len());
        }
        return Some(g.add(Term::Op(*sym, new)));
    }
    None
}

/// Cut `c` of `id` as a slice: `slice(dim, a, b, id)`, or for a strided cut the slice of the
/// dim viewed as its blocks, viewed back.
fn slice_along(g: &mut Graph, id: Id, out: &[usize], c: Cut) -> Id {
    if c.outer == 1 {
        return slice(g, c.dim, c.a, c.b, id);
    }
    let mut blocks = out[..c.dim].to_vec();
    blocks.extend([c.outer, out[c.dim] / c.outer]);
    blocks.extend_from_slice(&out[c.dim + 1..]);
    let shape = list(g, &blocks);
    let split = op(g, VIEW, vec![id, shape]);
    let sliced = slice(g, c.dim + 1, c.a, c.b, split);
    let target = resized(g, out, c.dim, c.len());
    op(g, VIEW, vec![sliced, target])
}

/// For the node `sym(kids)` of shape `out`, the operands to cut for its cut `c`, with their
/// own cuts. `None` where the node does not keep the cut's dim independent, or the cut does
/// not fall on whole rows of an operand. A view's target shape changes too: its size along
/// the dim becomes the cut's.
pub(crate) fn operand_cuts(
    g: &Graph,
    sym: Symbol,
    kids: &[Id],
    out: &[usize],
    c: Cut,
) -> Option<Vec<(usize, Cut)>> {
    if sym.as_str() == VIEW && kids.len() == 2 {
        let input = shape(g, kids[0])?;
        return Some(vec![(0, view_cut(&input, out, c)?)]);
    }
    let ops = dim_operands(g, sym, kids, out, c.dim)?;
    Some(
        ops.into_iter()
            .map(|(p, at)| (p, c.moved(at, c.outer, (c.a, c.b))))
            .collect(),
    )
}

/// For an equation over a tensor of shape `s`, seeded where a piece of a tensor of shape `out`
/// is inferred: the cut of `s` taking the same blocks, and rows at the same fraction of each
/// (a flattened batch x heads for a cut of the heads, a batch x heads for a cut of the batch).
pub(crate) fn matching_cut(s: &[usize], out: &[usize], c: Cut) -> Option<Cut> {
    if c.outer == 0 {
        return None;
    }
    let blocks = product(&out[..c.dim]) * c.outer;
    let inner = out[c.dim] / c.outer;
    (0..s.len()).find_map(|k| {
        let outer = blocks_of_dim(s, k, blocks)?;
        if inner == 0 || !(s[k] / outer).is_multiple_of(inner) {
            return None;
        }
        let f = s[k] / outer / inner;
        Some(c.moved(k, outer, (c.a * f, c.b * f)))
    })
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

    /// The term's split is `dim`, `outer`, `bounds`, and every cut of it evaluates to those
    /// rows of the term.
    fn assert_cuts_are_rows(
        term: &str,
        shapes: &[(&str, &[usize])],
        dim: usize,
        outer: usize,
        bounds: &[usize],
    ) {
        let (mut g, root, values) = setup(term, shapes);
        let found = split(&g, root).unwrap_or_else(|| panic!("no split: {term}"));
        assert_eq!(
            (found.dim, found.outer, &found.bounds[..]),
            (dim, outer, bounds),
            "{term}"
        );
        let out = shape(&g, root).unwrap();
        for c in found.cuts() {
            let piece = cut(&mut g, root, c).unwrap();
            g.rebuild();
            let got = egg::Extractor::new(&g, egg::AstSize).find_best(piece).1;
            let (a, b) = (c.a, c.b);
            let want = if outer == 1 {
                format!("(slice {dim} {a} {b} {term})")
            } else {
                let mut blocks = out[..dim].to_vec();
                blocks.extend([outer, out[dim] / outer]);
                blocks.extend_from_slice(&out[dim + 1..]);
                let mut target = out.clone();
                target[dim] = c.len();
                let list = |v: &[usize]| {
                    let items: Vec<String> = v.iter().map(|n| n.to_string()).collect();
                    format!("(list {})", items.join(" "))
                };
                format!(
                    "(aten.view.default (slice {} {a} {b} (aten.view.default {term} {})) {})",
                    dim + 1,
                    list(&blocks),
                    list(&target)
                )
            };
            let want: RecExpr<Term> = want.parse().unwrap();
            let (x, y) = (eval(&got, &values).unwrap(), eval(&want, &values).unwrap());
            assert!(tensors_agree(&x, &y), "{term} cut {c:?}: {got}");
            assert!(
                !got.to_string()
                    .contains(&format!("(slice {}", dim + usize::from(outer > 1))),
                "the cut stopped early: {got}"
            );
        }
    }

    #[test]
    fn a_softmax_backward_over_a_viewed_product_cuts_into_its_batch_pieces() {
        assert_cuts_are_rows(
            "(aten._softmax_backward_data.default (aten.view.default (aten.bmm.default (cat 0 %r0:a %r1:a) (cat 0 %r0:b %r1:b)) (list 2 2 3 4)) (aten._softmax.default (cat 0 %r0:c %r1:c) 3 b:false) 3 dt:f64)",
            &[("a", &[2, 3, 5]), ("b", &[2, 5, 4]), ("c", &[1, 2, 3, 4])],
            0,
            1,
            &[0, 1, 2],
        );
    }

    #[test]
    fn broadcast_operands_and_fills_are_cut_or_kept_whole() {
        assert_cuts_are_rows(
            "(aten.add.Tensor (aten.mul.Tensor (cat 0 %r0:x %r1:x) %r0:w) (aten.full.default (list 4 3) f:1.0 dt:f64 none dev b:false) 1)",
            &[("x", &[2, 3]), ("w", &[3])],
            0,
            1,
            &[0, 2, 4],
        );
    }

    #[test]
    fn reductions_transposes_and_rank_sums_keep_the_leading_dim() {
        assert_cuts_are_rows(
            "(scale 1 2 (sum (aten.sum.dim_IntList (aten.transpose.int (cat 0 %r0:x %r1:x) 1 2) (list 2) b:true none) (aten.sum.dim_IntList (aten.transpose.int (cat 0 (cat 1 %r0:y %r1:y) (cat 1 %r2:y %r3:y)) 1 2) (list 2) b:true none)))",
            &[("x", &[1, 4, 3]), ("y", &[1, 2, 3])],
            0,
            1,
            &[0, 1, 2],
        );
    }

    #[test]
    fn heads_split_by_tensor_parallelism_cut_along_the_heads_dim() {
        // Tensor parallelism splits the heads (dim 1): the pieces are the head groups, each
        // one rank's share of the attention.
        assert_cuts_are_rows(
            "(aten._softmax_backward_data.default (aten.matmul.default (cat 1 %r0:q %r1:q) (aten.transpose.int (cat 1 %r0:k %r1:k) 2 3)) (cat 1 %r0:p %r1:p) 3 dt:f64)",
            &[("q", &[2, 1, 3, 5]), ("k", &[2, 1, 3, 5]), ("p", &[2, 1, 3, 3])],
            1,
            1,
            &[0, 1, 2],
        );
    }

    #[test]
    fn head_groups_inside_a_flattened_batch_are_strided_cuts() {
        // The attention's products run over batch x heads flattened: a head group is the same
        // rows of every batch's block.
        assert_cuts_are_rows(
            "(aten.mul.Scalar (aten.bmm.default (aten.view.default (cat 1 %r0:q %r1:q) (list 4 3 5)) (aten.view.default (cat 1 %r0:k %r1:k) (list 4 5 3))) f:0.5)",
            &[("q", &[2, 1, 3, 5]), ("k", &[2, 1, 5, 3])],
            0,
            2,
            &[0, 1, 2],
        );
        // And back: the heads of the unflattened product.
        assert_cuts_are_rows(
            "(aten.view.default (aten.bmm.default (aten.view.default (cat 1 %r0:q %r1:u) (list 6 3 5)) (aten.view.default (cat 1 %r0:k %r1:w) (list 6 5 4))) (list 2 3 3 4))",
            &[
                ("q", &[2, 1, 3, 5]),
                ("u", &[2, 2, 3, 5]),
                ("k", &[2, 1, 5, 4]),
                ("w", &[2, 2, 5, 4]),
            ],
            1,
            1,
            &[0, 1, 3],
        );
    }

    #[test]
    fn a_head_group_of_one_batch_row_is_cut_through_the_flattening_view() {
        // Data parallelism splits the batch and tensor parallelism the heads: the flattened
        // batch x heads dim of the product falls into one piece per (batch row, head group),
        // each of which lies inside one batch row of the view's input.
        assert_cuts_are_rows(
            "(aten.bmm.default (aten.view.default (aten._softmax_backward_data.default (aten.view.default (aten.bmm.default (cat 0 %r0:a %r1:a %r2:a %r3:a) (cat 0 %r0:b %r1:b %r2:b %r3:b)) (list 2 4 3 3)) (aten._softmax.default (aten.view.default (aten.bmm.default (cat 0 %r0:a %r1:a %r2:a %r3:a) (cat 0 %r0:c %r1:c %r2:c %r3:c)) (list 2 4 3 3)) 3 b:false) 3 dt:f64) (list 8 3 3)) (cat 0 %r0:v %r1:v %r2:v %r3:v))",
            &[("a", &[2, 3, 5]), ("b", &[2, 5, 3]), ("c", &[2, 5, 3]), ("v", &[2, 3, 2])],
            0,
            1,
            &[0, 2, 4, 6, 8],
        );
        // Rows across two batch rows have no such cut: the view is sliced.
        let across = Cut {
            dim: 0,
            outer: 1,
            a: 3,
            b: 5,
        };
        assert_eq!(view_cut_in_two(&[2, 4, 3], &[8, 3], across), None);
        assert_eq!(view_cut(&[2, 4, 3], &[8, 3], across), None);
    }

    #[test]
    fn batch_rows_of_several_head_groups_merge_their_pieces() {
        // Four (batch row, head group) pieces of a flattened product, viewed back to batch x
        // heads: no dim of the view holds them one for one, so the pieces of each batch row
        // merge (the data-parallel groups, each cut again into its head groups).
        let term = "(aten.view.default (aten.bmm.default (cat 0 %r0:a %r1:a %r2:a %r3:a) (cat 0 %r0:b %r1:b %r2:b %r3:b)) (list 2 4 3 3))";
        let shapes: &[(&str, &[usize])] = &[("a", &[2, 3, 5]), ("b", &[2, 5, 3])];
        let (g, root, _) = setup(term, shapes);
        assert_eq!(
            splits(&g, root),
            vec![Split {
                dim: 0,
                outer: 1,
                bounds: vec![0, 1, 2]
            }]
        );
        assert_cuts_are_rows(term, shapes, 0, 1, &[0, 1, 2]);
    }

    #[test]
    fn products_reductions_and_permutes_keep_their_free_dims() {
        // Rows of a product's left operand, columns of its right one; a sum without keepdim
        // renumbers the dims after the reduced one; a permute moves the cut dim.
        assert_cuts_are_rows(
            "(aten.mm.default (aten.sum.dim_IntList (cat 1 %r0:x %r1:x) (list 0) b:false none) %r0:w)",
            &[("x", &[3, 2, 4]), ("w", &[4, 5])],
            0,
            1,
            &[0, 2, 4],
        );
        assert_cuts_are_rows(
            "(aten.permute.default (aten.matmul.default %r0:a (cat 2 %r0:b %r1:b)) (list 0 2 1))",
            &[("a", &[2, 3, 4]), ("b", &[2, 4, 3])],
            1,
            1,
            &[0, 3, 6],
        );
        assert_cuts_are_rows(
            "(slice 0 1 3 (aten.transpose.int (cat 0 %r0:x %r1:x) 0 1))",
            &[("x", &[2, 4])],
            1,
            1,
            &[0, 2, 4],
        );
    }

    #[test]
    fn operators_mixing_rows_of_every_dim_are_never_cut_through() {
        for term in [
            "(aten._softmax.default (cat 0 %r0:x %r1:x) 0 b:false)",
            "(aten.sum.dim_IntList (cat 0 %r0:x %r1:x) (list 0) b:true none)",
            "(aten.mm.default %r0:w (cat 0 %r0:x %r1:x))",
            "(aten.view.default (cat 0 %r0:x %r1:x) (list 3 4))",
        ] {
            let (g, root, _) = setup(term, &[("x", &[2, 3]), ("w", &[3, 4])]);
            assert_eq!(split(&g, root), None, "{term}");
        }
    }
}
