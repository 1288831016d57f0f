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
            // The same label in different blocks: name the blocks, not two equal labels.
            (Some(x), Some(y)) if x == y => Err(consistency(format!(
                "multiplies operands sharded on the same dim ({x:?}) in different blocks ({} \
                 of the left, {} of the right): their pieces do not pair",
                blocks(a),
                blocks(b)
            ))),
            (x, y) => Err(consistency(format!(
                "multiplies operands sharded on incompatible dims ({x:?} of the left, {y:?} \
                 of the right)"
            ))),
        },
        // A replicated operand has the local size of the shard it meets (local shapes
        // type-check): it stands for its own tiling, and the product follows the shard. A
        // batch dim is the exception: a shard of local size 1 broadcasts against a larger
        // replicated batch, pairing its one piece with every batch (no shard of anything).
        (Place::Shard(_) | Place::Blocked(..), Place::Replicate) => match lab(a, la) {
            Some(l @ Label::Batch(_)) if broadcast_shard(a, la, b, lb, l) => Ok(Place::Varying),
            Some(l @ (Label::Row | Label::Col | Label::Batch(_))) => Ok(placed(l, blocks(a))),
            l => Err(consistency(format!(
                "the left operand is sharded on its {l:?} dim (contracted) but the right one is replicated"
            ))),
        },
        (Place::Replicate, Place::Shard(_) | Place::Blocked(..)) => match lab(b, lb) {
            Some(l @ Label::Batch(_)) if broadcast_shard(b, lb, a, la, l) => Ok(Place::Varying),
            Some(l @ (Label::Row | Label::Col | Label::Batch(_))) => Ok(placed(l, blocks(b))),
            l => Err(consistency(format!(
                "the right operand is sharded on its {l:?} dim (contracted) but the left one is replicated"
            ))),
        },
        _ => Ok(Place::Unknown),
    }
}

/// Whether the shard `s` (labels `ls`) meets, along its sharded batch dim `l`, a replicated
/// `r` (labels `lr`) of another local size than 1 or the shard's: the shard broadcasts (local
/// size 1), so each rank pairs its one piece with every batch of `r`, which the single-device
/// product never does.
fn broadcast_shard(s: &T, ls: &[Label], r: &T, lr: &[Label], l: Label) -> bool {
    let size = |t: &T, labels: &[Label]| {
        let d = labels.iter().position(|x| *x == l)?;
        t.meta.as_ref()?.shape.get(d).copied()
    };
    match (size(s, ls), size(r, lr)) {
        (Some(n), Some(m)) => m != 1 && m != n,
        _ => false,
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

/// `t` with placement `p`.
fn placed_as(t: &T, p: Place) -> T {
    T { p, ..t.clone() }
}

/// The violation of operands (or a bias) whose product dim `dim` is sharded over different
/// sets of mesh dims, where this mesh dim is one of them.
fn mixed_violation(c: &Ctx, mix: Option<(usize, Vec<usize>)>, what: &str) -> Option<Violation> {
    let (dim, mesh_dims) = mix?;
    mesh_dims.contains(&c.mesh_dim).then(|| Violation {
        kind: Kind::Consistency,
        message: format!(
            "{what} dim {dim} of the product sharded over different mesh dims: each rank \
             multiplies pieces the single-device product never pairs"
        ),
        hint: Hint::Text(format!(
            "shard dim {dim} of every operand over the same mesh dims (all-gather the extra \
             shards, or slice the replicated operand to the same layout)"
        )),
        recover: vec![Place::Varying],
        exempt: Exempt::No,
    })
}

/// Whether the factors of a product shard a batch dim over different sets of mesh dims
/// (`(the product's dim, the mesh dims sharding it in some factor)`).
///
/// Each mesh dim's rule pairs a batch shard with a batch shard of the same dim, or with a
/// replicated factor standing for its own tiling. Across mesh dims that reading fails: a
/// batch dim sharded over `dp` in one factor and over `tp` in the other multiplies, on rank
/// `(i, j)`, batch piece `i` by batch piece `j`, which the single-device product never pairs,
/// while each mesh dim alone reads a batch shard. Only batch dims pair this way: a row or
/// column is one factor's, and a contracted dim sharded in one factor but not the other is
/// refused by each mesh dim's rule. A factor whose layout is not known on one of the mesh dims
/// (`Varying`, `Unknown`, a layout of no one dim) shows no mix there: the product is not a
/// known shard on that mesh dim anyway.
fn mixed_batch_shards(
    c: &Ctx,
    factors: &[(&T, &[Label])],
    out_of: &dyn Fn(Label) -> Option<usize>,
    out_rank: usize,
) -> Option<(usize, Vec<usize>)> {
    // Each factor's placements with its batch shards moved to the product's dims and every
    // other shard dropped (paired within each mesh dim by its rule).
    let batch_only: Vec<Vec<Place>> = factors
        .iter()
        .map(|(t, labels)| {
            c.on_every_mesh_dim(t)
                .into_iter()
                .map(|p| match (p, p.blocks()) {
                    (_, Some((d, k))) => match labels.get(d) {
                        Some(&l @ Label::Batch(_)) => {
                            out_of(l).map_or(Place::Varying, |j| Place::blocked(j, k))
                        }
                        _ => Place::Replicate,
                    },
                    (Place::Replicate | Place::Partial(_), None) => Place::Replicate,
                    _ => Place::Varying,
                })
                .collect()
        })
        .collect();
    let args: Vec<(&[Place], usize)> = batch_only
        .iter()
        .map(|p| (p.as_slice(), out_rank))
        .collect();
    mixed_mesh_shards(&args, out_rank)
}

/// Whether a bias and the product it is added to shard one dim of the result over different
/// sets of mesh dims: the product's placement on every mesh dim is `prod_on` of the factors'
/// placements there (`Varying` where its rule refuses), the bias broadcast from the right as
/// an element-wise sum pairs it ([`mixed_mesh_shards`]).
fn mixed_bias_shards(
    c: &Ctx,
    bias: &T,
    factors: &[&T],
    prod_on: &dyn Fn(&[T]) -> Result<Place, Violation>,
    out_rank: usize,
) -> Option<(usize, Vec<usize>)> {
    let per_factor: Vec<Vec<Place>> = factors.iter().map(|t| c.on_every_mesh_dim(t)).collect();
    let prod: Vec<Place> = (0..c.mesh_sizes.len())
        .map(|m| {
            let ts: Vec<T> = factors
                .iter()
                .zip(&per_factor)
                .map(|(t, ps)| placed_as(t, ps.get(m).copied().unwrap_or(Place::Unknown)))
                .collect();
            prod_on(&ts).unwrap_or(Place::Varying)
        })
        .collect();
    let bias_places = c.on_every_mesh_dim(bias);
    mixed_mesh_shards(&[(&prod, out_rank), (&bias_places, bias.rank())], out_rank)
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
    if let Some(v) = mixed_mm(c, &a, &b) {
        return one(Err(v), c.n_out());
    }
    one(mm_place(&a, &b), c.n_out())
}

/// [`mixed_batch_shards`] of `a @ b` (torch.matmul's labels), as this mesh dim's violation.
fn mixed_mm(c: &Ctx, a: &T, b: &T) -> Option<Violation> {
    let (la, lb, lo) = matmul_labels(a.rank(), b.rank());
    let out_of = |l: Label| lo.iter().position(|x| *x == l);
    let mix = mixed_batch_shards(c, &[(a, &la), (b, &lb)], &out_of, lo.len());
    mixed_violation(c, mix, "multiplies factors with batch")
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
    if let Some(v) = mixed_mm(c, &a, &b) {
        return one(Err(v), c.n_out());
    }
    let bias = c.t("self").filter(|_| !beta_zero);
    if let Some(v) = bias.as_ref().and_then(|bias| {
        let out_rank = matmul_labels(a.rank(), b.rank()).2.len();
        let mix = mixed_bias_shards(c, bias, &[&a, &b], &|ts| mm_place(&ts[0], &ts[1]), out_rank);
        mixed_violation(c, mix, "adds a bias with")
    }) {
        return one(Err(v), c.n_out());
    }
    with_bias(c, mm_place(&a, &b), c.t("self"), beta_zero)
}

pub(super) fn linear(c: &Ctx) -> Outcome {
    let (Some(x), Some(w)) = (c.t("input"), c.t("weight")) else {
        return c.all(Place::Unknown);
    };
    if let Some(v) = c.t("bias").and_then(|bias| {
        let out_rank = x.rank().max(1);
        let mix = mixed_bias_shards(
            c,
            &bias,
            &[&x, &w],
            &|ts| linear_place(&ts[0], &ts[1]),
            out_rank,
        );
        mixed_violation(c, mix, "adds a bias with")
    }) {
        return one(Err(v), c.n_out());
    }
    with_bias(c, linear_place(&x, &w), c.t("bias"), false)
}

/// The product `x @ w^T` of `linear`, without its bias.
fn linear_place(x: &T, w: &T) -> Result<Place, Violation> {
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
    if matches!(x.p, Place::Shard(d) if (d as usize) < batch) && w.p == Place::Replicate {
        Ok(x.p)
    } else {
        product(x, &lx, w, &lw, &|l| lo.iter().position(|y| *y == l))
    }
}
