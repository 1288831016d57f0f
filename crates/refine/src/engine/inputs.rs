//! The relations a case states: each `inputs:` entry, and each expected `outputs:` entry, as
//! clean expressions over the rank tensors (blocks that tile the spec tensor, partial sums,
//! `expr:` relations). They are the initial relation R_i of Listing 1.

use super::relation::{Impl, Rel, State};
use crate::lemmas::SCALE;
use crate::lower::ValueRef;
use crate::term::{leaf_symbol, Term, CAT, LIST, MAX, MIN, SLICE, SUM};
use egg::{Id, RecExpr, Symbol};
use shardproof_case::{rank_pieces, Case, Layout, Reduce};
use shardproof_ir::ValueId;
use std::collections::HashMap;

/// The relation of an `inputs:` entry: the spec tensor as a clean expression (or several, one
/// per set of replicas) over the rank tensors.
pub(super) fn input_state(case: &Case, i: usize, imp: &Impl) -> State {
    let r = &case.inputs[i];
    match relation_exprs(case, &r.layout, r.spec_value, &r.rank_values, imp) {
        Ok(exprs) => State::Related(Rel {
            exprs,
            clean: true,
            equal_leaves: Vec::new(),
            equal_slices: Vec::new(),
            explored: Vec::new(),
        }),
        Err(m) => State::Blocked(format!("input `{}`: {m}", r.spec_name)),
    }
}

pub(super) fn expected_exprs(
    case: &Case,
    i: usize,
    imp: &Impl,
) -> Result<Vec<RecExpr<Term>>, String> {
    let o = &case.outputs[i];
    relation_exprs(case, &o.layout, o.spec_value, &o.rank_values, imp)
}

/// Expressions of a laid-out spec tensor over the rank tensors: blocks tile the tensor; partial
/// shares sum (or max/min) within their group; replicas give alternative expressions.
fn relation_exprs(
    case: &Case,
    layout: &Layout,
    spec_value: ValueId,
    rank_values: &[(usize, ValueId)],
    imp: &Impl,
) -> Result<Vec<RecExpr<Term>>, String> {
    if let Layout::Expr(e) = layout {
        let mut rec = RecExpr::default();
        let (_, shape) = expr_rec(e, imp, &mut rec)?;
        let want = case
            .spec
            .recorded_type(spec_value)
            .and_then(|t| t.concrete_shape())
            .map(|s| s.iter().map(|&n| n as usize).collect::<Vec<_>>());
        if let Some(want) = want {
            if want != shape {
                return Err(format!(
                    "the expression has shape {shape:?}, the spec tensor {want:?}"
                ));
            }
        }
        return Ok(vec![rec]);
    }
    if rank_values.is_empty() {
        return Err("no implementation tensors".into());
    }
    let shape = case
        .spec
        .recorded_type(spec_value)
        .and_then(|t| t.concrete_shape())
        .ok_or("no concrete recorded shape")?;
    // Each block: its ranges and its expression.
    let mut blocks: Vec<(Vec<std::ops::Range<i64>>, E)> = Vec::new();
    let mut partial: HashMap<Vec<usize>, PartialBlocks> = HashMap::new();
    for &(rank, v) in rank_values {
        let piece = rank_pieces(layout, &shape, &case.program.mesh, rank).map_err(|e| e.message)?;
        let vr = imp.canon(ValueRef {
            rank: Some(rank),
            value: v,
        });
        let name = case.program.ranks[rank].value_name(vr.value).to_string();
        let leaf = E::Leaf(leaf_symbol(rank, &name));
        let mut off = 0;
        for b in &piece.blocks {
            let len = b.get(piece.dim).map_or(1, |r| r.end - r.start);
            let e = if piece.blocks.len() == 1 {
                leaf.clone()
            } else {
                E::Slice(piece.dim, off, off + len, Box::new(leaf.clone()))
            };
            off += len;
            match &piece.partial {
                None => blocks.push((b.clone(), e)),
                Some(p) => {
                    let entry =
                        partial
                            .entry(p.group.clone())
                            .or_insert((p.reduce, b.clone(), Vec::new()));
                    entry.2.push(e);
                }
            }
        }
    }
    let mut groups: Vec<_> = partial.into_iter().collect();
    groups.sort_by(|a, b| a.0.cmp(&b.0));
    for (_, (reduce, ranges, es)) in groups {
        let e = match reduce {
            Reduce::Sum => E::Op(SUM.into(), es),
            Reduce::Max => E::Op(MAX.into(), es),
            Reduce::Min => E::Op(MIN.into(), es),
            Reduce::Avg => {
                let n = es.len() as i64;
                E::Scale(1, n, Box::new(E::Op(SUM.into(), es)))
            }
        };
        blocks.push((ranges, e));
    }
    let full: Vec<std::ops::Range<i64>> = shape.iter().map(|&n| 0..n).collect();
    let alts = tile(&blocks, &full).ok_or("the rank tensors do not tile the spec tensor")?;
    Ok(alts.iter().map(E::to_rec).collect())
}

/// A case `expr:` relation as a clean term (dims normalized, reshapes resolved, `select` as a
/// one-wide slice viewed without its dim), with its shape.
fn expr_rec(
    e: &shardproof_case::Expr,
    imp: &Impl,
    r: &mut RecExpr<Term>,
) -> Result<(Id, Vec<usize>), String> {
    use shardproof_case::ExprKind as K;
    let norm = |d: i64, n: usize| -> Result<usize, String> {
        let d2 = if d < 0 { d + n as i64 } else { d };
        usize::try_from(d2)
            .ok()
            .filter(|&x| x < n)
            .ok_or_else(|| format!("dim {d} is out of range for a {n}-d tensor"))
    };
    let num = |r: &mut RecExpr<Term>, n: i64| r.add(Term::Num(n));
    let list = |r: &mut RecExpr<Term>, v: &[usize]| {
        let kids = v.iter().map(|&n| r.add(Term::Num(n as i64))).collect();
        r.add(Term::Op(Symbol::from(LIST), kids))
    };
    let view = |r: &mut RecExpr<Term>, x: Id, from: &[usize], to: &[usize]| {
        if from == to {
            return x;
        }
        let l = list(r, to);
        r.add(Term::Op(Symbol::from("aten.view.default"), vec![x, l]))
    };
    Ok(match &e.kind {
        K::Tensor { rank, name } => {
            let g = imp
                .case
                .program
                .ranks
                .get(*rank)
                .ok_or_else(|| format!("there is no rank {rank}"))?;
            let v = g
                .find(name)
                .ok_or_else(|| format!("rank {rank} has no tensor `{name}`"))?;
            let vr = imp.canon(ValueRef {
                rank: Some(*rank),
                value: v,
            });
            let shape = imp
                .meta(vr)
                .map(|m| m.shape)
                .ok_or_else(|| format!("the shape of r{rank}.{name} is unknown"))?;
            let leaf = leaf_symbol(*rank, imp.case.program.ranks[*rank].value_name(vr.value));
            (r.add(Term::Op(Symbol::from(leaf.as_str()), vec![])), shape)
        }
        K::Concat { parts, dim } => {
            let mut ids = Vec::new();
            let mut shape: Option<Vec<usize>> = None;
            let mut total = 0;
            let mut d = 0;
            for p in parts {
                let (id, s) = expr_rec(p, imp, r)?;
                d = norm(*dim, s.len())?;
                total += s[d];
                shape.get_or_insert(s);
                ids.push(id);
            }
            let mut shape = shape.ok_or("concat of nothing")?;
            shape[d] = total;
            if ids.len() == 1 {
                (ids[0], shape)
            } else {
                let dn = num(r, d as i64);
                let kids = std::iter::once(dn).chain(ids).collect();
                (r.add(Term::Op(Symbol::from(CAT), kids)), shape)
            }
        }
        K::Slice {
            input,
            dim,
            start,
            end,
        } => {
            let (x, mut shape) = expr_rec(input, imp, r)?;
            let d = norm(*dim, shape.len())?;
            let n = shape[d] as i64;
            let clamp = |i: i64| if i < 0 { (i + n).max(0) } else { i.min(n) };
            let (a, b) = (clamp(*start), clamp(*end).max(clamp(*start)));
            if a == 0 && b == n {
                return Ok((x, shape));
            }
            shape[d] = (b - a) as usize;
            let kids = vec![num(r, d as i64), num(r, a), num(r, b), x];
            (r.add(Term::Op(Symbol::from(SLICE), kids)), shape)
        }
        K::Sum(parts) => {
            let mut ids = Vec::new();
            let mut shape = Vec::new();
            for p in parts {
                let (id, s) = expr_rec(p, imp, r)?;
                shape = s;
                ids.push(id);
            }
            if ids.len() == 1 {
                (ids[0], shape)
            } else {
                (r.add(Term::Op(Symbol::from(SUM), ids)), shape)
            }
        }
        K::Transpose { input, dim0, dim1 } => {
            let (x, mut shape) = expr_rec(input, imp, r)?;
            let (a, b) = (norm(*dim0, shape.len())?, norm(*dim1, shape.len())?);
            if a == b {
                return Ok((x, shape));
            }
            shape.swap(a, b);
            let kids = vec![x, num(r, a.min(b) as i64), num(r, a.max(b) as i64)];
            (
                r.add(Term::Op(Symbol::from("aten.transpose.int"), kids)),
                shape,
            )
        }
        K::Permute { input, dims } => {
            let (x, shape) = expr_rec(input, imp, r)?;
            let p: Vec<usize> = dims
                .iter()
                .map(|&d| norm(d, shape.len()))
                .collect::<Result<_, _>>()?;
            if p.len() != shape.len() {
                return Err(format!(
                    "permute of a {}-d tensor with {} dims",
                    shape.len(),
                    p.len()
                ));
            }
            if p.iter().enumerate().all(|(i, &d)| i == d) {
                return Ok((x, shape));
            }
            let out: Vec<usize> = p.iter().map(|&d| shape[d]).collect();
            let l = list(r, &p);
            (
                r.add(Term::Op(Symbol::from("aten.permute.default"), vec![x, l])),
                out,
            )
        }
        K::Reshape { input, shape: to } => {
            let (x, shape) = expr_rec(input, imp, r)?;
            let total: usize = shape.iter().product();
            let known: i64 = to.iter().filter(|&&d| d != -1).product();
            let out: Vec<usize> = to
                .iter()
                .map(|&d| {
                    if d == -1 && known > 0 {
                        total / known as usize
                    } else {
                        d.max(0) as usize
                    }
                })
                .collect();
            if out.iter().product::<usize>() != total {
                return Err(format!("cannot reshape {shape:?} to {to:?}"));
            }
            (view(r, x, &shape, &out), out)
        }
        K::Select { input, dim, index } => {
            let (x, shape) = expr_rec(input, imp, r)?;
            let d = norm(*dim, shape.len())?;
            let n = shape[d] as i64;
            let i = if *index < 0 { index + n } else { *index };
            if !(0..n).contains(&i) {
                return Err(format!(
                    "index {index} is out of range for a dim of size {n}"
                ));
            }
            let mut one = shape.clone();
            one[d] = 1;
            let x = if n == 1 {
                x
            } else {
                let kids = vec![num(r, d as i64), num(r, i), num(r, i + 1), x];
                r.add(Term::Op(Symbol::from(SLICE), kids))
            };
            let mut out = shape.clone();
            out.remove(d);
            (view(r, x, &one, &out), out)
        }
        K::Unsqueeze { input, dim } => {
            let (x, shape) = expr_rec(input, imp, r)?;
            let d = norm(*dim, shape.len() + 1)?;
            let mut out = shape.clone();
            out.insert(d, 1);
            (view(r, x, &shape, &out), out)
        }
    })
}

/// Partial shares of one block: how they combine, the block, each rank's share.
type PartialBlocks = (Reduce, Vec<std::ops::Range<i64>>, Vec<E>);

/// A relation expression while building input relations.
#[derive(Clone, Debug)]
enum E {
    Leaf(String),
    Slice(usize, i64, i64, Box<E>),
    Scale(i64, i64, Box<E>),
    Op(String, Vec<E>),
    Cat(usize, Vec<E>),
}

impl E {
    fn to_rec(&self) -> RecExpr<Term> {
        fn go(e: &E, r: &mut RecExpr<Term>) -> Id {
            match e {
                E::Leaf(s) => r.add(Term::Op(Symbol::from(s.as_str()), vec![])),
                E::Slice(d, a, b, x) => {
                    let x = go(x, r);
                    let kids = vec![
                        r.add(Term::Num(*d as i64)),
                        r.add(Term::Num(*a)),
                        r.add(Term::Num(*b)),
                        x,
                    ];
                    r.add(Term::Op(Symbol::from(SLICE), kids))
                }
                E::Scale(p, q, x) => {
                    let x = go(x, r);
                    let kids = vec![r.add(Term::Num(*p)), r.add(Term::Num(*q)), x];
                    r.add(Term::Op(Symbol::from(SCALE), kids))
                }
                E::Op(s, xs) => {
                    if xs.len() == 1 {
                        return go(&xs[0], r);
                    }
                    let kids = xs.iter().map(|x| go(x, r)).collect();
                    r.add(Term::Op(Symbol::from(s.as_str()), kids))
                }
                E::Cat(d, xs) => {
                    if xs.len() == 1 {
                        return go(&xs[0], r);
                    }
                    let mut kids = vec![r.add(Term::Num(*d as i64))];
                    kids.extend(xs.iter().map(|x| go(x, r)));
                    r.add(Term::Op(Symbol::from(CAT), kids))
                }
            }
        }
        let mut r = RecExpr::default();
        go(self, &mut r);
        r
    }
}

/// Alternative expressions of the region `full` from blocks that tile it (replicated blocks
/// give alternatives).
fn tile(
    blocks: &[(Vec<std::ops::Range<i64>>, E)],
    full: &[std::ops::Range<i64>],
) -> Option<Vec<E>> {
    let exact: Vec<E> = blocks
        .iter()
        .filter(|b| b.0 == full)
        .map(|b| b.1.clone())
        .collect();
    if !exact.is_empty() {
        return Some(exact);
    }
    let inside: Vec<&(Vec<std::ops::Range<i64>>, E)> = blocks
        .iter()
        .filter(|b| {
            b.0.iter()
                .zip(full)
                .all(|(x, f)| x.start >= f.start && x.end <= f.end)
        })
        .collect();
    for d in 0..full.len() {
        let mut cuts: Vec<i64> = inside
            .iter()
            .flat_map(|b| [b.0[d].start, b.0[d].end])
            .collect();
        cuts.sort_unstable();
        cuts.dedup();
        if cuts.len() < 3 || cuts[0] != full[d].start || *cuts.last()? != full[d].end {
            continue;
        }
        let mut parts = Vec::new();
        for w in cuts.windows(2) {
            let mut sub = full.to_vec();
            sub[d] = w[0]..w[1];
            let sub_blocks: Vec<_> = inside
                .iter()
                .filter(|b| b.0[d] == sub[d])
                .map(|b| (**b).clone())
                .collect();
            parts.push(tile(&sub_blocks, &sub)?);
        }
        let n = parts.iter().map(Vec::len).max().unwrap_or(1);
        return Some(
            (0..n)
                .map(|i| E::Cat(d, parts.iter().map(|p| p[i % p.len()].clone()).collect()))
                .collect(),
        );
    }
    None
}
