//! Collective rules: all-reduce, all-gather, reduce-scatter, all-to-all and broadcast on
//! the group's mesh dims (point-to-point is placed by the engine).

use super::*;

pub(super) fn legality(message: String, hint: &str, recover: Place, n: usize) -> Outcome {
    bad(
        Kind::Legality,
        message,
        Hint::Text(hint.into()),
        vec![recover; n],
    )
}

pub(super) fn all_reduce(c: &Ctx) -> Outcome {
    let Some(x) = c.t("input") else {
        return c.all(Place::Unknown);
    };
    if !c.in_group {
        return c.all(x.p);
    }
    let op = c
        .str("reduce_op")
        .and_then(|s| Red::parse(&s))
        .unwrap_or(Red::Sum);
    match x.p {
        Place::Partial(r) if r == op => c.all(Place::Replicate),
        // A sum of pieces that average to the tensor is n times it, an average of pieces that
        // sum to it 1/n of it: right only where a scaling the checker does not follow made up
        // for it (the engine relabels a partial scaled by 1/n or n, `partial_scaling`). Not
        // proven either way (issue 44: was `Replicate()`, a false holds).
        Place::Partial(r) if r.is_linear() && op.is_linear() => c.all(Place::Unknown),
        Place::Partial(r) => legality(
            format!("all-reduces with `{}` a tensor that is Partial({})", op.name(), r.name()),
            &format!("reduce with `{}`", r.name()),
            Place::Replicate,
            c.n_out(),
        ),
        // A tensor of unknown layout may be a partial sum (the all-reduce completes it) or a
        // shard (the all-reduce adds different slices): no claim either way.
        // (The engine shows a recorded split to this rule as the partial it is.)
        Place::Varying
        | Place::Rolled(..)
        | Place::Accrued(_)
        | Place::Permuted(..)
        | Place::Rows(..)
        | Place::Selected(..)
        | Place::Stacked(_)
        | Place::Gathered(..)
        | Place::PartialSplit(..)
        | Place::PartialStacked(_) => c.all(Place::Unknown),
        Place::Replicate if matches!(op, Red::Max | Red::Min | Red::Avg) => c.all(Place::Replicate),
        Place::Replicate => {
            let mut v = legality(
                format!(
                    "all-reduces (`{}`) a tensor that is already Replicate() over this mesh dim: no \
                     sum is pending, so each element becomes {} times its value",
                    op.name(),
                    c.group_len
                ),
                "drop the all-reduce over this mesh dim, or all-reduce over the group where the tensor is partial",
                Place::Replicate,
                c.n_out(),
            );
            if let Err(e) = &mut v {
                e.exempt = Exempt::ReduceReplicate;
            }
            v
        }
        Place::Shard(_) | Place::Blocked(..) => legality(
            format!("all-reduces a tensor sharded as {}: it adds different slices together", x.p),
            "all-gather a shard; all-reduce only partial sums",
            Place::Replicate,
            c.n_out(),
        ),
        Place::Unmasked => bad(
            Kind::Spmd,
            "all-reduces rows looked up in a vocabulary shard that were never masked: every rank adds the rows of tokens outside its range",
            Hint::Text("zero the rows of tokens outside the rank's vocabulary range (masked_fill with 0) before the all-reduce".into()),
            vec![Place::Replicate; c.n_out()],
        ),
        Place::Unknown => c.all(Place::Unknown),
    }
}

pub(super) fn all_gather(c: &Ctx) -> Outcome {
    let Some(x) = c.t("input") else {
        return c.all(Place::Unknown);
    };
    if !c.in_group {
        // Gathering along dim 0 over other mesh dims: where the group's pieces are not the
        // shards of dim 0 they undo, each rank's dim 0 becomes the group's pieces in rank
        // order, each holding this mesh dim's piece: this dim's shard of dim 0 in `group_len`
        // times as many blocks.
        // Only a group of mesh dims inside this one (DTensor's order: the first mesh dim
        // outermost) gathers the pieces of this dim's piece; over an outer mesh dim the
        // rank's rows are one piece of each of the group's, a blocked shard.
        let undoes = !c.group_dims.is_empty()
            && c.group_dims.iter().all(|&g| {
                g > c.mesh_dim
                    && c.input_places
                        .get(g)
                        .and_then(|p| p.blocks())
                        .is_some_and(|(d, _)| d == 0)
            });
        return c.all(match x.p.blocks() {
            Some((0, k)) if !undoes => Place::blocked(0, k.saturating_mul(c.group_len.max(1))),
            _ => x.p,
        });
    }
    match x.p {
        // The pieces concatenated along dim 0 in rank order are the tensor.
        Place::Shard(0) => c.all(Place::Replicate),
        // The same data on every rank, the pieces of dim d stacked along dim 0: the tensor
        // once a view splits the coordinate off and a permute puts it outside dim d (ZeRO's
        // gather of a column chunk), which the view rules follow.
        Place::Shard(d) if c.group_dims.len() == 1 => c.all(Place::Stacked(d)),
        // A blocked shard gathered: its elements in another order that no placement follows.
        Place::Shard(_) | Place::Blocked(..) => c.all(Place::Unknown),
        // A tensor of unknown layout gathers to the same data on every rank, but in an order
        // not known: a shard's rows in rank order only where the layout is a proven shard.
        // (The engine shows a recorded split to this rule as the partial it is.)
        Place::Varying
        | Place::Rolled(..)
        | Place::Accrued(_)
        | Place::Permuted(..)
        | Place::Rows(..)
        | Place::Selected(..)
        | Place::Stacked(_)
        | Place::Gathered(..)
        | Place::PartialSplit(..)
        | Place::PartialStacked(_) => c.all(Place::Unknown),
        Place::Replicate => legality(
            "all-gathers a tensor that is Replicate() over this mesh dim: the result holds one copy per rank".into(),
            "drop the all-gather, or gather a shard",
            Place::Replicate,
            c.n_out(),
        ),
        Place::Partial(_) | Place::Unmasked => bad(
            Kind::Legality,
            "all-gathers a partial sum: the result stacks unreduced pieces",
            Hint::ReducePartial,
            vec![Place::Replicate; c.n_out()],
        ),
        Place::Unknown => c.all(Place::Unknown),
    }
}

pub(super) fn reduce_scatter(c: &Ctx) -> Outcome {
    let Some(x) = c.t("input") else {
        return c.all(Place::Unknown);
    };
    if !c.in_group {
        // Scattering dim 0 over other mesh dims: each rank keeps one of `g` equal chunks of
        // its local dim 0. This mesh dim's piece of dim 0 in `k` blocks stays a piece of the
        // chunk where chunks hold whole blocks (`k / g` each) or fall inside one block.
        let g = c.group_len.max(1);
        if x.p.is_partial() && x.p != Place::Unmasked {
            // Chunks of dim 0 of a pending sum are pending sums; a split recorded in dim 0
            // is cut by them.
            return c.all(match x.p {
                Place::Partial(r) => Place::Partial(r),
                _ => Place::Partial(Red::Sum),
            });
        }
        // Rank (i, j) keeps chunk i (the group's coordinate) of its piece j of `k` blocks.
        // Layouts nest the first mesh dim outermost, so the chunks are this mesh dim's shard
        // only where that order holds: over a group outside this mesh dim, each chunk one
        // block (`k = g`) or whole blocks (a blocked shard); inside it, a plain piece
        // (`k = 1`) cut in `g` chunks. Anything else interleaves the coordinates.
        // Rows of a selection read as a shard (`rows_input`) are numbered by their key, which
        // the engine keeps per coordinate, not by that nesting: chunks of whole blocks, or
        // inside one block, as before.
        let outer = c.group_dims.iter().any(|&m| m < c.mesh_dim);
        return c.all(match x.p.blocks() {
            Some((0, k)) if c.rows_input && g.is_multiple_of(k) => Place::Shard(0),
            Some((0, k)) if c.rows_input && k.is_multiple_of(g) => Place::blocked(0, k / g),
            Some((0, k)) if (outer && k == g) || (!outer && k == 1) => Place::Shard(0),
            Some((0, k)) if outer && k.is_multiple_of(g) => Place::blocked(0, k / g),
            Some((0, _)) => Place::Varying,
            _ => x.p,
        });
    }
    let op = c
        .str("reduce_op")
        .and_then(|s| Red::parse(&s))
        .unwrap_or(Red::Sum);
    // Where a view regrouped dims into dim 0, or another mesh dim holds dim 0 in blocks, dim 0
    // is a flattening of several dims (ZeRO scatters the column blocks of a tp-sharded gradient
    // moved to dim 0): the chunks the group's ranks keep are no shard of a dim the program
    // names, so they are `Varying` here (no layout claimed). A regrouped dim 0 that no other
    // mesh dim shards (Megatron's sequence-parallel `[s*b, h] -> [s, b, h]` before the
    // reduce-scatter on tp alone) is the tensor itself: its chunks are `Shard(0)`.
    let others_shard = c.input_places.iter().enumerate().any(|(m, p)| {
        m != c.mesh_dim && !matches!(p, Place::Replicate | Place::Partial(_) | Place::Unmasked)
    });
    let composite = (c.regrouped && others_shard)
        || c.input_places
            .iter()
            .any(|p| matches!(p, Place::Blocked(0, _)));
    let scattered = if composite {
        Place::Varying
    } else {
        Place::Shard(0)
    };
    match x.p {
        // Coordinate r keeps slab r of dim 0, piece r of dim j: the sum's shard of dim j.
        Place::PartialStacked(j)
            if op == Red::Sum && c.group_dims.len() == 1 && c.group_len == c.coord.n =>
        {
            c.all(Place::Shard(j))
        }
        Place::PartialSplit(..) | Place::PartialStacked(_) if op == Red::Sum => c.all(scattered),
        // Pieces that sum, averaged: 1/n of the tensor (as for a plain partial, below).
        Place::PartialSplit(..) | Place::PartialStacked(_) if op == Red::Avg => {
            c.all(Place::Unknown)
        }
        Place::PartialSplit(..) | Place::PartialStacked(_) => legality(
            format!("reduce-scatters with `{}` a tensor that is Partial(sum)", op.name()),
            "reduce with `sum`",
            Place::Shard(0),
            c.n_out(),
        ),
        Place::Partial(r) if r == op => c.all(scattered),
        // A sum with an average: not proven (as for the all-reduce).
        Place::Partial(r) if r.is_linear() && op.is_linear() => c.all(Place::Unknown),
        // As for an all-reduce: a partial or a shard in unknown layout, not known which.
        Place::Varying
        | Place::Rolled(..)
        | Place::Accrued(_)
        | Place::Permuted(..)
        | Place::Rows(..)
        | Place::Selected(..)
        | Place::Stacked(_)
        | Place::Gathered(..) => {
            c.all(Place::Unknown)
        }
        Place::Partial(r) => legality(
            format!("reduce-scatters with `{}` a tensor that is Partial({})", op.name(), r.name()),
            &format!("reduce with `{}`", r.name()),
            Place::Shard(0),
            c.n_out(),
        ),
        Place::Replicate if !op.is_linear() || op == Red::Avg => c.all(Place::Shard(0)),
        Place::Replicate => legality(
            "reduce-scatters (sum) a tensor that is already Replicate() over this mesh dim: each element becomes group-size times its value".into(),
            "slice the rank's chunk instead, or reduce-scatter a partial sum",
            Place::Shard(0),
            c.n_out(),
        ),
        Place::Shard(_) | Place::Blocked(..) => legality(
            format!("reduce-scatters a tensor sharded as {}: it adds different slices together", x.p),
            "reduce-scatter a partial sum",
            Place::Varying,
            c.n_out(),
        ),
        Place::Unmasked => bad(Kind::Spmd, "reduce-scatters an unmasked vocabulary-shard lookup", Hint::Text("mask it first".into()), vec![Place::Shard(0); c.n_out()]),
        Place::Unknown => c.all(Place::Unknown),
    }
}

pub(super) fn all_to_all(c: &Ctx) -> Outcome {
    let Some(x) = c.t("input") else {
        return c.all(Place::Unknown);
    };
    if !c.in_group {
        return c.all(match x.p {
            Place::Shard(0) => Place::Varying,
            p => p,
        });
    }
    match x.p {
        Place::Partial(_) | Place::Unmasked => bad(
            Kind::Legality,
            "all-to-all of a partial sum: the pieces move to other ranks unreduced",
            Hint::ReducePartial,
            vec![Place::Varying; c.n_out()],
        ),
        _ => c.all(Place::Varying),
    }
}

pub(super) fn broadcast(c: &Ctx) -> Outcome {
    let Some(x) = c.t("input") else {
        return c.all(Place::Unknown);
    };
    if !c.in_group {
        return c.all(x.p);
    }
    match x.p {
        Place::Partial(_) | Place::Unmasked => bad(
            Kind::Legality,
            "broadcasts a partial sum: one rank's piece replaces the sum",
            Hint::ReducePartial,
            vec![Place::Replicate; c.n_out()],
        ),
        // The source rank's tensor on every rank: the spec's only where it was replicated (a
        // shard broadcast is one piece everywhere, the same but no replica).
        Place::Replicate => c.all(Place::Replicate),
        Place::Unknown => c.all(Place::Unknown),
        _ => c.all(Place::Varying),
    }
}
