//! Matrix-product rules: einsum-style labels for mm, bmm, matmul, dot, mv, and the
//! products with a bias (addmm, baddbmm, linear).

use super::*;

/// The einsum-style rule of a product: each operand's dims labelled batch, free or
/// contracted.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(super) enum Label {
    Batch(usize),
    Row,
    Col,
    Contract,
}

pub(super) fn product(
    a: &T,
    la: &[Label],
    b: &T,
    lb: &[Label],
    out_of: &dyn Fn(Label) -> Option<usize>,
) -> Result<Place, Violation> {
    let lab = |t: &T, l: &[Label]| t.p.blocks().and_then(|(d, _)| l.get(d).copied());
    let blocks = |t: &T| t.p.blocks().map_or(1, |(_, k)| k);
    let placed = |l: Label, k: usize| out_of(l).map_or(Place::Varying, |d| Place::blocked(d, k));
    let consistency = |message: String| Violation {
        kind: Kind::Consistency,
        message,
        hint: Hint::GatherShard,
        recover: vec![Place::Varying],
        exempt: Exempt::No,
    };
    match (a.p, b.p) {
        (Place::Unmasked, _) | (_, Place::Unmasked) => merge(&[a.clone(), b.clone()], 0, Lin::None, false),
        (Place::Partial(_), Place::Partial(_)) => Err(Violation {
            kind: Kind::Spmd,
            message: "multiplies two partial sums (partial x partial)".into(),
            hint: Hint::ReducePartial,
            recover: vec![Place::Replicate], exempt: Exempt::No,
        }),
        (Place::Partial(r), Place::Replicate) | (Place::Replicate, Place::Partial(r)) if r.is_linear() => Ok(Place::Partial(r)),
        (Place::Partial(_), _) | (_, Place::Partial(_)) => Err(Violation {
            kind: Kind::Spmd,
            message: "multiplies a partial sum by a tensor that is not replicated".into(),
            hint: Hint::ReducePartial,
            recover: vec![Place::Varying], exempt: Exempt::No,
        }),
        (Place::Replicate, Place::Replicate) => Ok(Place::Replicate),
        (Place::Varying, _) | (_, Place::Varying) => Ok(Place::Varying),
        (Place::Shard(_) | Place::Blocked(..), Place::Shard(_) | Place::Blocked(..)) => match (lab(a, la), lab(b, lb)) {
            // Both operands' pieces must pair up: the same blocks on both sides.
            (Some(Label::Contract), Some(Label::Contract)) if blocks(a) == blocks(b) => Ok(Place::Partial(Red::Sum)),
            (Some(Label::Batch(i)), Some(Label::Batch(j))) if i == j && blocks(a) == blocks(b) => {
                Ok(placed(Label::Batch(i), blocks(a)))
            }
            (x, y) => Err(consistency(format!(
                "multiplies operands sharded on incompatible dims ({x:?} of the left, {y:?} \
                 of the right)"
            ))),
        },
        // A replicated operand has the local size of the shard it meets (local shapes
        // type-check): it stands for its own tiling, and the product follows the shard.
        (Place::Shard(_) | Place::Blocked(..), Place::Replicate) => match lab(a, la) {
            Some(l @ (Label::Row | Label::Col | Label::Batch(_))) => Ok(placed(l, blocks(a))),
            l => Err(consistency(format!(
                "the left operand is sharded on its {l:?} dim (contracted) but the right one is replicated"
            ))),
        },
        (Place::Replicate, Place::Shard(_) | Place::Blocked(..)) => match lab(b, lb) {
            Some(l @ (Label::Row | Label::Col | Label::Batch(_))) => Ok(placed(l, blocks(b))),
            l => Err(consistency(format!(
                "the right operand is sharded on its {l:?} dim (contracted) but the left one is replicated"
            ))),
        },
        _ => Ok(Place::Unknown),
    }
}

/// Labels of a matmul: `a` of rank ra, `b` of rank rb (torch.matmul's broadcasting).
pub(super) fn matmul_labels(ra: usize, rb: usize) -> (Vec<Label>, Vec<Label>, Vec<Label>) {
    let batch = ra.max(rb).saturating_sub(2);
    let la: Vec<Label> = match ra {
        1 => vec![Label::Contract],
        _ => (0..ra - 2)
            .map(|i| Label::Batch(batch - (ra - 2) + i))
            .chain([Label::Row, Label::Contract])
            .collect(),
    };
    let lb: Vec<Label> = match rb {
        1 => vec![Label::Contract],
        _ => (0..rb - 2)
            .map(|i| Label::Batch(batch - (rb - 2) + i))
            .chain([Label::Contract, Label::Col])
            .collect(),
    };
    let mut lo: Vec<Label> = (0..batch).map(Label::Batch).collect();
    if ra > 1 {
        lo.push(Label::Row);
    }
    if rb > 1 {
        lo.push(Label::Col);
    }
    (la, lb, lo)
}

pub(super) fn mm_place(a: &T, b: &T) -> Result<Place, Violation> {
    let (la, lb, lo) = matmul_labels(a.rank(), b.rank());
    product(a, &la, b, &lb, &|l| lo.iter().position(|x| *x == l))
}

pub(super) fn matmul(c: &Ctx) -> Outcome {
    let a = c.t("self");
    let b = c
        .t("mat2")
        .or_else(|| c.t("other"))
        .or_else(|| c.t("tensor"))
        .or_else(|| c.t("vec"));
    let (Some(a), Some(b)) = (a, b) else {
        return c.all(Place::Unknown);
    };
    one(mm_place(&a, &b), c.n_out())
}

pub(super) fn with_bias(
    c: &Ctx,
    prod: Result<Place, Violation>,
    bias: Option<T>,
    scaled_out: bool,
) -> Outcome {
    let p = match prod {
        Ok(p) => p,
        Err(v) => return one(Err(v), c.n_out()),
    };
    let Some(bias) = bias else { return c.all(p) };
    if scaled_out {
        return c.all(p);
    }
    // A replicated bias divided by the mesh dim's size is one rank's share of a sum (what
    // DTensor's RowwiseParallel adds before its all-reduce): the result stays partial.
    if p == Place::Partial(Red::Sum) && bias.p == Place::Replicate && (c.scaled)(bias.v) {
        return c.all(p);
    }
    let pt = T {
        v: bias.v,
        p,
        meta: c.outs.first().cloned().flatten(),
        constant: 0,
        runs: super::Runs::Unknown,
    };
    match merge(&[pt, bias], c.out_rank(0), Lin::Add, false) {
        Err(mut v) if p.is_partial() => {
            v.message = "adds a replicated bias to a partial matrix product: the bias is counted once per rank (add it after the reduction)".into();
            one(Err(v), c.n_out())
        }
        r => one(r, c.n_out()),
    }
}

pub(super) fn addmm(c: &Ctx) -> Outcome {
    let (Some(a), Some(b)) = (
        c.t("mat1").or_else(|| c.t("batch1")),
        c.t("mat2").or_else(|| c.t("batch2")),
    ) else {
        return c.all(Place::Unknown);
    };
    let beta_zero = c.num("beta") == Some(0.0);
    with_bias(c, mm_place(&a, &b), c.t("self"), beta_zero)
}

pub(super) fn linear(c: &Ctx) -> Outcome {
    let (Some(x), Some(w)) = (c.t("input"), c.t("weight")) else {
        return c.all(Place::Unknown);
    };
    // x [..., k] @ w[m, k]^T
    let rx = x.rank();
    let batch = rx.saturating_sub(1);
    let lx: Vec<Label> = (0..batch)
        .map(Label::Batch)
        .chain([Label::Contract])
        .collect();
    let lw = vec![Label::Col, Label::Contract];
    let mut lo: Vec<Label> = (0..batch).map(Label::Batch).collect();
    lo.push(Label::Col);
    // A batch-sharded input against a replicated weight: its batch dims are free.
    let prod = if matches!(x.p, Place::Shard(d) if (d as usize) < batch) && w.p == Place::Replicate
    {
        Ok(x.p)
    } else {
        product(&x, &lx, &w, &lw, &|l| lo.iter().position(|y| *y == l))
    };
    with_bias(c, prod, c.t("bias"), false)
}
