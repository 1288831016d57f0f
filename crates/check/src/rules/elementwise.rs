//! Element-wise rules: unary and binary operators, broadcast merge with linearity, where,
//! masked_fill, lerp, addcmul, and creation (`full`, `*_like`, `copy`).

use super::*;

/// How an element-wise operator treats a pending reduction.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Lin {
    /// Every tensor argument enters linearly and additively (add, sub, cat, where).
    Add,
    /// Linear in each argument separately (mul): one partial times replicated tensors.
    Mul,
    /// Linear in the first argument only (div by a replicated divisor; activation backward
    /// in its gradient).
    First,
    /// Not linear: no partial argument.
    None,
}

/// Placement of `x`'s sharded dim in an output of rank `out_rank` (broadcast aligns dims
/// from the right).
pub(super) fn aligned(x: &T, out_rank: usize) -> Place {
    match x.p {
        Place::Shard(d) => Place::shard(d as usize + out_rank.saturating_sub(x.rank())),
        Place::Blocked(d, k) => {
            Place::blocked(d as usize + out_rank.saturating_sub(x.rank()), k as usize)
        }
        p => p,
    }
}

/// Merges the placements of element-wise arguments (broadcast), with `lin` deciding where a
/// partial may enter, and `scalar_nonzero` a non-zero scalar operand added to the result.
///
/// A shard survives only where every operand's shape shows how it pairs with the shard
/// ([`shard_pairing`]): an operand without a meta (a symbolic or opaque type) leaves the
/// pairing open, and the result is `Varying`.
pub(super) fn merge(
    ts: &[T],
    out_rank: usize,
    lin: Lin,
    scalar_add_nonzero: bool,
) -> Result<Place, Violation> {
    merge_with(ts, out_rank, lin, scalar_add_nonzero, true)
}

/// [`merge`] for operators that do not pair their operands element by element after a
/// broadcast (joins, scatters, gathers, a loss's target): the placements are merged in the
/// operands' own dim numbering, and the shard is returned unchecked. The caller must check
/// how its operands pair along the shard itself (each caller names its check) and claim no
/// shard otherwise: this function alone proves nothing about the pairing.
pub(super) fn merge_joined(
    ts: &[T],
    lin: Lin,
    scalar_add_nonzero: bool,
) -> Result<Place, Violation> {
    merge_with(ts, 0, lin, scalar_add_nonzero, false)
}

fn merge_with(
    ts: &[T],
    out_rank: usize,
    lin: Lin,
    scalar_add_nonzero: bool,
    paired: bool,
) -> Result<Place, Violation> {
    let places: Vec<Place> = ts.iter().map(|t| aligned(t, out_rank)).collect();
    if places.contains(&Place::Unmasked) {
        return Err(Violation {
            kind: Kind::Spmd,
            message: "reads rows looked up in a vocabulary shard before the rows outside the \
                      rank's range are zeroed"
                .into(),
            hint: Hint::Text(
                "mask the lookup (masked_fill of the out-of-range rows with 0) before using it"
                    .into(),
            ),
            recover: vec![Place::Replicate],
            exempt: Exempt::No,
        });
    }
    let mut shard: Option<Place> = None;
    let mut varying = false;
    let mut partial: Option<Red> = None;
    let mut n_partial = 0;
    let mut n_plain_tensor = 0;
    for p in &places {
        match *p {
            Place::Shard(_) | Place::Blocked(..) => {
                let d = *p;
                if let Some(e) = shard {
                    if e != d {
                        return Err(Violation {
                            kind: Kind::Consistency,
                            message: format!(
                                "combines tensors sharded on different dims or blocks ({e} and \
                                 {d})"
                            ),
                            hint: Hint::Text(
                                "redistribute one operand (all-gather it, or all-to-all) so \
                                 both are sharded on the same dim"
                                    .into(),
                            ),
                            recover: vec![Place::Varying],
                            exempt: Exempt::No,
                        });
                    }
                }
                shard = Some(d);
                n_plain_tensor += 1;
            }
            Place::Varying
            | Place::Rolled(..)
            | Place::Accrued(_)
            | Place::Permuted(..)
            | Place::Rows(..)
            | Place::Selected(..)
            | Place::Stacked(_)
            | Place::Gathered(..)
            | Place::PartialSplit(..)
            | Place::PartialStacked(_) => {
                varying = true;
                n_plain_tensor += 1;
            }
            Place::Partial(r) => {
                if partial.is_some_and(|q| q != r) {
                    return Err(Violation {
                        kind: Kind::Spmd,
                        message: "combines partial tensors of different reductions".into(),
                        hint: Hint::ReducePartial,
                        recover: vec![Place::Replicate],
                        exempt: Exempt::No,
                    });
                }
                partial = Some(r);
                n_partial += 1;
            }
            Place::Replicate => n_plain_tensor += 1,
            Place::Unmasked | Place::Unknown => {}
        }
    }
    let plain = if varying {
        Place::Varying
    } else if let Some(d) = shard.filter(|_| !paired) {
        d
    } else if let Some(d) = shard {
        match shard_pairing(ts, &places, out_rank, d) {
            Pairing::Aligned => d,
            Pairing::Open => Place::Varying,
            Pairing::Misaligned { size, dim } => {
                return Err(Violation {
                    kind: Kind::Shape,
                    message: format!(
                        "pairs a tensor sharded on dim {dim} ({d}) with a replicated operand of \
                         size {size} along that dim: every rank pairs the whole operand with its \
                         own piece, where the single-device program would pair it with the whole \
                         dim (a table made or sliced locally, without the rank's offset)"
                    ),
                    hint: Hint::Text(
                        "slice the replicated operand at the rank's offset (or shard it like the \
                         other operand), or make it broadcast (size 1 along the sharded dim)"
                            .into(),
                    ),
                    recover: vec![Place::Varying],
                    exempt: Exempt::No,
                });
            }
        }
    } else {
        Place::Replicate
    };
    let Some(r) = partial else { return Ok(plain) };
    let spmd_ex = |message: &str, exempt: Exempt| {
        Err(Violation {
            kind: Kind::Spmd,
            message: message.into(),
            hint: Hint::ReducePartial,
            recover: vec![plain],
            exempt,
        })
    };
    let spmd = |message: &str| spmd_ex(message, Exempt::No);
    if !(r.is_linear() || (lin == Lin::Add && n_partial == ts.len() && ts.len() == 1)) {
        return spmd(&format!(
            "applies an operator to a Partial({}) tensor: only a reduction over the ranks \
             (all-reduce) may read it",
            r.name()
        ));
    }
    match lin {
        Lin::None => spmd("applies a nonlinear operator to a partial sum (the result is not the partial of anything)"),
        Lin::Add => {
            if n_plain_tensor > 0 && varying && shard.is_none() {
                // A partial plus a tensor that differs across ranks in no known layout (a
                // shard whose view the local shapes leave open, say): it may be a partial
                // too, or not. No finding and no placement: inconclusive, never a guess.
                Ok(Place::Unknown)
            } else if n_plain_tensor > 0 {
                spmd_ex(
                    "adds a partial sum and a non-partial tensor: the non-partial term is counted once per rank (partial + replicate)",
                    if varying || shard.is_some() { Exempt::No } else { Exempt::PartialPlusReplicate(r) },
                )
            } else if scalar_add_nonzero {
                spmd("adds a constant to a partial sum: the constant is counted once per rank")
            } else {
                Ok(Place::Partial(r))
            }
        }
        Lin::Mul => {
            if n_partial > 1 {
                spmd("multiplies two partial sums (partial x partial does not distribute over the pending sum)")
            } else if varying || shard.is_some() {
                spmd("multiplies a partial sum by a tensor that differs across ranks")
            } else {
                Ok(Place::Partial(r))
            }
        }
        Lin::First => {
            if ts.first().is_some_and(|t| aligned(t, out_rank).is_partial()) && n_partial == 1 {
                if varying || shard.is_some() {
                    spmd("scales a partial sum by a tensor that differs across ranks")
                } else {
                    Ok(Place::Partial(r))
                }
            } else {
                spmd("divides by (or feeds the nonlinear operand with) a partial sum")
            }
        }
    }
}

/// How the operands of an element-wise call pair with its shard along the sharded dim.
#[derive(Debug, PartialEq, Eq)]
enum Pairing {
    /// Every replicated operand broadcasts along the dim (absent or of size 1) or is a fill,
    /// and no shard is broadcast itself: the result is the shard of the global result.
    Aligned,
    /// The pairing cannot be read (a shape unknown, or the shard itself broadcast along the
    /// dim): no placement is claimed.
    Open,
    /// A replicated operand of `size` > 1 along output dim `dim`, not a fill.
    Misaligned {
        /// Its size along the dim.
        size: usize,
        /// The output dim.
        dim: usize,
    },
}

/// Whether the shard `shard` (the merged placement of `places`, aligned to `out_rank` dims)
/// survives the broadcast of the operands `ts`.
///
/// The single-device program pairs element `i` of the global dim with element `i` of every
/// operand that spans the dim; rank `r` pairs its piece, elements `r*L .. (r+1)*L`, with
/// elements `0 .. L` of a replicated operand. The two agree for every `r` only where the
/// operand is constant along the dim: absent or of size 1 (broadcast), or a fill of one literal
/// value (a piece of the fill of any size at any offset). A replicated operand of size `L > 1`
/// that is not a fill is a table made or sliced without the rank's offset: the global program
/// does not even type-check (`A[n*L] + b[L]`). A shard of local size 1 broadcast against a
/// larger operand holds its one element against every element: no shard of anything.
///
/// An operand without a meta (a symbolic or opaque type: a graph captured with dynamic
/// shapes) leaves the pairing open, even where no operand has one (issue 44: that case was
/// `Aligned`, so `x: f32[s0, 3]` sharded plus a replicated `b: f32[s1, 3]` was a shard).
/// Operators that do not broadcast call [`merge_joined`] and check their pairing themselves.
fn shard_pairing(ts: &[T], places: &[Place], out_rank: usize, shard: Place) -> Pairing {
    let Some((dim, _)) = shard.blocks() else {
        return Pairing::Aligned;
    };
    if ts.len() < 2 {
        return Pairing::Aligned;
    }
    // An operand with more dims than the output: the output's shape is not known (broadcast
    // gives the output every operand's dims), so the operands' alignment cannot be read.
    if ts
        .iter()
        .any(|t| t.meta.as_ref().is_some_and(|m| m.shape.len() > out_rank))
    {
        return Pairing::Open;
    }
    // The operand's size along output dim `dim`: None where it has no such dim.
    let size_of = |t: &T| -> Option<Option<usize>> {
        let m = t.meta.as_ref()?;
        // As [`aligned`] places the operand's dims.
        let shift = out_rank.saturating_sub(m.shape.len());
        Some(if dim < shift {
            None
        } else {
            m.shape.get(dim - shift).copied()
        })
    };
    let mut sizes = Vec::with_capacity(ts.len());
    for t in ts {
        match size_of(t) {
            Some(s) => sizes.push(s),
            None => return Pairing::Open,
        }
    }
    let widest = sizes.iter().flatten().copied().max().unwrap_or(1);
    let mut misaligned = None;
    for ((t, p), s) in ts.iter().zip(places).zip(&sizes) {
        match p {
            Place::Shard(_) | Place::Blocked(..) if *s != Some(widest) => return Pairing::Open,
            Place::Replicate => match *s {
                Some(n)
                    if n != 1 && !t.constant_along(dim - (out_rank.saturating_sub(t.rank()))) =>
                {
                    // Beside a shard of k blocks (1: a plain shard), an operand known to be R
                    // equal runs along the dim, each constant, R dividing k (a [k, ..] table
                    // expanded and merged: the MoE weights under sequence parallelism), is the
                    // blocked piece of the same construction at the global size: each run
                    // holds k/R whole blocks, locally and in the single-device program, so
                    // every rank pairs block b with run b*R/k as the spec does. More runs than
                    // blocks split a block between runs, which each rank's piece does not.
                    let local = dim - out_rank.saturating_sub(t.rank());
                    match (shard.blocks(), t.runs) {
                        (Some((_, k)), super::Runs::Along { dim: d, count })
                            if d == local && k.is_multiple_of(count) =>
                        {
                            continue;
                        }
                        // Some other construction of k runs: whether the spec repeats it at
                        // the global size is not known (no record), so the pairing is open.
                        // A graph input is the same tensor in the spec, where it meets the
                        // whole dim: a finding.
                        (Some((_, k)), runs)
                            if k > 1 && n.is_multiple_of(k) && runs != super::Runs::Input =>
                        {
                            return Pairing::Open;
                        }
                        _ => {}
                    }
                    misaligned.get_or_insert(Pairing::Misaligned { size: n, dim });
                }
                _ => {}
            },
            _ => {}
        }
    }
    misaligned.unwrap_or(Pairing::Aligned)
}

/// The finding of an operator that pairs operands of one shape without broadcasting (`cat`
/// along another dim, `stack`, `slice_scatter`): a replicated operand beside operands merged
/// to the shard `merged`. Its size along the sharded dim equals the piece's (the local program
/// type-checks), so the single-device program would meet a tensor of the piece's size where
/// it needs the whole dim's; only a fill is a piece of the whole at every offset.
pub(super) fn unbroadcast_pairing(merged: Place, ts: &[T]) -> Option<Violation> {
    let (dim, _) = merged.blocks()?;
    ts.iter()
        .any(|t| t.p == Place::Replicate && !t.constant_along(dim))
        .then(|| Violation {
            kind: Kind::Shape,
            message: format!(
                "joins a tensor sharded on dim {dim} ({merged}) with a replicated operand of \
                 the piece's size along that dim: the single-device program needs the whole \
                 dim there (a tensor made or sliced locally, without the rank's offset)"
            ),
            hint: Hint::Text(
                "shard the replicated operand like the other (slice it at the rank's offset)"
                    .into(),
            ),
            recover: vec![Place::Varying],
            exempt: Exempt::No,
        })
}

/// The meta of the broadcast of `a` and `b` (dims aligned from the right), `a`'s dtype.
fn broadcast_meta(a: &Option<Meta>, b: &Option<Meta>) -> Option<Meta> {
    let (a, b) = (a.as_ref()?, b.as_ref()?);
    let n = a.shape.len().max(b.shape.len());
    let at = |m: &Meta, i: usize| {
        let shift = n - m.shape.len();
        if i < shift {
            1
        } else {
            m.shape[i - shift]
        }
    };
    let shape = (0..n)
        .map(|i| {
            let (x, y) = (at(a, i), at(b, i));
            if x == 1 {
                y
            } else {
                x
            }
        })
        .collect();
    Some(Meta::new(a.dtype, shape))
}

pub(super) fn one(p: Result<Place, Violation>, n: usize) -> Outcome {
    match p {
        Ok(p) => Ok(vec![p; n]),
        Err(mut v) => {
            let r = v.recover.first().copied().unwrap_or(Place::Replicate);
            v.recover = vec![r; n];
            Err(v)
        }
    }
}

pub(super) fn tensors(c: &Ctx, names: &[&str]) -> Vec<T> {
    names.iter().filter_map(|n| c.t(n)).collect()
}

pub(super) fn linear_unary(c: &Ctx) -> Outcome {
    let x = c
        .t("self")
        .or_else(|| c.t("input"))
        .or_else(|| c.t("tensor"))
        .or_else(|| c.t("grad_output"));
    match x {
        Some(x) if x.p == Place::Unmasked => c.all(Place::Unmasked),
        // Element by element, in place: the same arrangement.
        Some(x)
            if matches!(
                x.p,
                Place::Stacked(_)
                    | Place::Gathered(..)
                    | Place::PartialSplit(..)
                    | Place::PartialStacked(_)
            ) =>
        {
            c.all(x.p)
        }
        Some(x) => one(merge(&[x], c.out_rank(0), Lin::Add, false), c.n_out()),
        None => c.all(Place::Replicate),
    }
}

/// `neg`: linear, but it turns a maximum into a minimum: a single `Partial(max)` operand is
/// `Partial(min)` of the negated values and the reverse.
pub(super) fn neg(c: &Ctx) -> Outcome {
    match c.t("self").map(|x| x.p) {
        Some(Place::Partial(Red::Max)) => c.all(Place::Partial(Red::Min)),
        Some(Place::Partial(Red::Min)) => c.all(Place::Partial(Red::Max)),
        _ => linear_unary(c),
    }
}

/// `native_dropout_backward(grad, mask, scale)`: the gradient times the mask, element by
/// element (as `mul`: a partial gradient times a replicated mask stays partial). Both operands
/// must shard a dim over the same mesh dims ([`mixed_mesh_shards`]): a mask sharded over
/// another mesh dim than the gradient is applied on rank (i, j) as piece j to gradient piece i.
pub(super) fn dropout_backward(c: &Ctx) -> Outcome {
    let (Some(grad), Some(mask)) = (c.t("grad_output"), c.t("mask")) else {
        return c.all(Place::Unknown);
    };
    let out_rank = c.out_rank(0);
    let (g, m) = (c.on_every_mesh_dim(&grad), c.on_every_mesh_dim(&mask));
    if let Some((dim, mesh_dims)) =
        mixed_mesh_shards(&[(&g, grad.rank()), (&m, mask.rank())], out_rank)
    {
        if mesh_dims.contains(&c.mesh_dim) {
            return bad(
                Kind::Consistency,
                format!(
                    "applies a dropout mask whose dim {dim} is sharded over other mesh dims than \
                     the gradient's: each rank masks its piece with another piece's mask"
                ),
                Hint::Text(format!(
                    "shard dim {dim} of the mask over the mesh dims of the gradient's"
                )),
                vec![Place::Varying; c.n_out()],
            );
        }
    }
    match grad.p {
        Place::Unmasked => c.all(Place::Unmasked),
        _ => one(merge(&[grad, mask], out_rank, Lin::Mul, false), c.n_out()),
    }
}

pub(super) fn linear_unary_own(c: &Ctx) -> Outcome {
    linear_unary(c)
}

/// `dropout` and `native_dropout` (output and mask): the input's layout, the masks laid out
/// alike (the case's dropout assumption). A partial input stays partial only where every
/// rank applies the same mask to its term: that mask is replicated, never partial (the
/// ranks' masks do not sum to the spec's).
pub(super) fn dropout(c: &Ctx) -> Outcome {
    let x = c.t("input").or_else(|| c.t("self"));
    match x {
        Some(x) if x.p.is_partial() => {
            let mut out = one(merge(&[x], c.out_rank(0), Lin::Mul, false), c.n_out())?;
            for mask in out.iter_mut().skip(1) {
                *mask = Place::Replicate;
            }
            Ok(out)
        }
        Some(x) => c.all(x.p),
        None => c.all(Place::Replicate),
    }
}

pub(super) fn nonlinear_unary(c: &Ctx) -> Outcome {
    let ts = tensors(c, &["self", "min", "max"]);
    one(merge(&ts, c.out_rank(0), Lin::None, false), c.n_out())
}

pub(super) fn pow(c: &Ctx) -> Outcome {
    let ts = tensors(c, &["self", "exponent"]);
    let linear = c.num("exponent") == Some(1.0);
    one(
        merge(
            &ts,
            c.out_rank(0),
            if linear { Lin::Add } else { Lin::None },
            false,
        ),
        c.n_out(),
    )
}

pub(super) fn add_sub(c: &Ctx) -> Outcome {
    let ts = tensors(c, &["self", "other"]);
    let scalar = c
        .arg("other")
        .and_then(|a| a.as_f64())
        .or_else(|| c.arg("self").and_then(|a| a.as_f64()));
    one(
        merge(
            &ts,
            c.out_rank(0),
            Lin::Add,
            scalar.is_some_and(|s| s != 0.0),
        ),
        c.n_out(),
    )
}

pub(super) fn mul(c: &Ctx) -> Outcome {
    let ts = tensors(c, &["self", "other"]);
    one(merge(&ts, c.out_rank(0), Lin::Mul, false), c.n_out())
}

pub(super) fn div(c: &Ctx) -> Outcome {
    let ts = tensors(c, &["self", "other"]);
    if c.str("rounding_mode").is_some() {
        return one(merge(&ts, c.out_rank(0), Lin::None, false), c.n_out());
    }
    one(merge(&ts, c.out_rank(0), Lin::First, false), c.n_out())
}

pub(super) fn nonlinear_binary(c: &Ctx) -> Outcome {
    let ts = tensors(c, &["self", "other"]);
    one(merge(&ts, c.out_rank(0), Lin::None, false), c.n_out())
}

/// `maximum` (see [`extremum`]).
pub(super) fn maximum(c: &Ctx) -> Outcome {
    extremum(c, Red::Max)
}

/// `minimum` (see [`extremum`]).
pub(super) fn minimum(c: &Ctx) -> Outcome {
    extremum(c, Red::Min)
}

/// An element-wise extremum that commutes with the reduction `keeps` (`maximum` with max,
/// `minimum` with min): over ranks, the maximum of the element-wise maxima of the pieces is
/// the element-wise maximum of the pieces' maxima, so partials of that reduction stay one
/// partial, and a replicated operand (the same on every rank, taken once however many ranks
/// hold it) joins it. Any other mix (the other extremum, a sum, a shard, a varying operand)
/// is the non-linear operator it is.
fn extremum(c: &Ctx, keeps: Red) -> Outcome {
    let ts = tensors(c, &["self", "other"]);
    let partial = ts.iter().any(|t| t.p.is_partial());
    // A share (a replicated value the ranks divided by n: each copy the spec's over n) is
    // not the spec's value on every rank.
    let joins =
        |t: &T| t.p == Place::Partial(keeps) || (t.p == Place::Replicate && !(c.scaled)(t.v));
    if partial && ts.len() == 2 && ts.iter().all(joins) {
        return c.all(Place::Partial(keeps));
    }
    nonlinear_binary(c)
}

pub(super) fn max_min(c: &Ctx) -> Outcome {
    if c.has("other") {
        return nonlinear_binary(c);
    }
    reduction(c)
}

pub(super) fn activation_backward(c: &Ctx) -> Outcome {
    let ts = tensors(c, &["grad_output", "self", "output"]);
    one(merge(&ts, c.out_rank(0), Lin::First, false), c.n_out())
}

pub(super) fn where_(c: &Ctx) -> Outcome {
    let cond = tensors(c, &["condition"]);
    let vals = tensors(c, &["self", "other"]);
    let nonzero = ["self", "other"]
        .iter()
        .any(|n| c.arg(n).and_then(|a| a.as_f64()).is_some_and(|s| s != 0.0));
    let out = c.out_rank(0);
    let cp = match merge(&cond, out, Lin::None, false) {
        Ok(p) => p,
        Err(v) => return one(Err(v), c.n_out()),
    };
    let mut all = vals.clone();
    all.extend(cond.iter().map(|t| T {
        p: if t.p == Place::Replicate {
            Place::Replicate
        } else {
            t.p
        },
        ..t.clone()
    }));
    if vals.iter().any(|t| t.p.is_partial()) {
        // where(c, p, 0) is linear in p with a non-partial mask.
        let mut r = merge(&vals, out, Lin::Add, nonzero);
        if let Ok(Place::Partial(red)) = r {
            if cp != Place::Replicate {
                r = Err(Violation {
                    kind: Kind::Spmd,
                    message: format!(
                        "selects from a Partial({}) tensor with a mask that differs across ranks",
                        red.name()
                    ),
                    hint: Hint::ReducePartial,
                    recover: vec![Place::Varying],
                    exempt: Exempt::No,
                });
            }
        }
        return one(r, c.n_out());
    }
    one(merge(&all, out, Lin::None, false), c.n_out())
}

pub(super) fn masked_fill(c: &Ctx) -> Outcome {
    let (Some(x), Some(mask)) = (c.t("self"), c.t("mask")) else {
        return nonlinear_unary(c);
    };
    let zero = c.num("value") == Some(0.0);
    if x.p == Place::Unmasked {
        if zero && mask.p == Place::Varying {
            return c.all(Place::Partial(Red::Sum));
        }
        return bad(
            Kind::Spmd,
            "masks a vocabulary-shard lookup with a mask that does not depend on the rank's \
             vocabulary range (or fills with a non-zero value)",
            Hint::Text("zero the rows whose index falls outside the rank's range".into()),
            vec![Place::Varying; c.n_out()],
        );
    }
    if x.p.is_partial() {
        let r = merge(&[x], c.out_rank(0), Lin::Add, !zero);
        if mask.p != Place::Replicate && r.is_ok() {
            return bad(
                Kind::Spmd,
                "masks a partial sum with a mask that differs across ranks",
                Hint::ReducePartial,
                vec![Place::Varying; c.n_out()],
            );
        }
        return one(r, c.n_out());
    }
    let mut ts = vec![x];
    ts.extend(c.t("value"));
    ts.push(mask);
    one(merge(&ts, c.out_rank(0), Lin::None, false), c.n_out())
}

pub(super) fn lerp(c: &Ctx) -> Outcome {
    let mut ts = tensors(c, &["self", "end"]);
    if let Some(w) = c.t("weight") {
        if w.p.is_partial() {
            ts.push(w);
            return one(merge(&ts, c.out_rank(0), Lin::None, false), c.n_out());
        }
        if ts.iter().any(|t| t.p.is_partial()) && w.p != Place::Replicate {
            return one(
                merge(&[ts, vec![w]].concat(), c.out_rank(0), Lin::Mul, false),
                c.n_out(),
            );
        }
        ts.push(T {
            p: if ts.iter().any(|t| t.p.is_partial()) {
                ts[0].p
            } else {
                w.p
            },
            ..w
        });
    }
    one(merge(&ts, c.out_rank(0), Lin::Add, false), c.n_out())
}

pub(super) fn addcmul(c: &Ctx) -> Outcome {
    let out = c.out_rank(0);
    let (Some(s), Some(t1), Some(t2)) = (c.t("self"), c.t("tensor1"), c.t("tensor2")) else {
        return nonlinear_unary(c);
    };
    let divide = c.args.schema().name.starts_with("addcdiv");
    let prod = match merge(
        &[t1.clone(), t2.clone()],
        out,
        if divide { Lin::First } else { Lin::Mul },
        false,
    ) {
        Ok(p) => p,
        Err(v) => return one(Err(v), c.n_out()),
    };
    let pt = T {
        p: prod,
        meta: broadcast_meta(&t1.meta, &t2.meta),
        v: t1.v,
        constant: 0,
        runs: super::Runs::Unknown,
    };
    one(merge(&[s, pt], out, Lin::Add, false), c.n_out())
}

/// Creations: replicated (every rank makes the same tensor from the same literals), except an
/// `eye` or `linspace` with a dim of size 1: that size may be a local size of 1 whose spec is
/// the global one, and a replicated operand of size 1 pairs with a shard as a broadcast, while
/// the spec's identity or range differs along the dim (`Varying`: no claim). The fills are the
/// same at any size.
pub(super) fn creation(c: &Ctx) -> Outcome {
    let name = &c.args.schema().name;
    let sized = name.starts_with("eye") || name.starts_with("linspace");
    if sized && out_shape(c, 0).is_none_or(|s| s.contains(&1)) {
        return c.all(Place::Varying);
    }
    c.all(Place::Replicate)
}

/// `arange(start, end[, step])`: replicated where every rank along the mesh dim makes the same
/// range; at rank-dependent bounds (step 1, every rank's bounds read), the positions of the
/// rows a tensor picked at the same bounds holds (`Rows` of a [`RowKey::Spread`] with no
/// base), else `Varying`.
///
/// A range of one element at bounds alike on every rank claims nothing (`Varying`): its bounds
/// may be a local size of 1 whose spec is the global one, and as a replicated operand of size
/// 1 it would pair with a shard as a broadcast (rank k adding 0 where the spec adds k).
pub(super) fn arange(c: &Ctx) -> Outcome {
    let len = out_shape(c, 0).and_then(|s| (s.len() == 1).then(|| s[0]));
    if !c.varies {
        return c.all(if len == Some(1) {
            Place::Varying
        } else {
            Place::Replicate
        });
    }
    let schema = c.args.schema();
    let starts = (c.peer_ints)("start");
    let ends = (c.peer_ints)("end");
    // A schema without a step (`arange.start`) steps by 1; with one, every rank's must be 1.
    let steps_one =
        schema.index_of("step").is_none() || (c.peer_ints)("step").iter().all(|s| *s == Some(1));
    let segs: Option<Vec<Vec<(usize, usize)>>> = starts
        .iter()
        .zip(&ends)
        .map(|(s, e)| {
            let (s, e) = (usize::try_from((*s)?).ok()?, usize::try_from((*e)?).ok()?);
            Some(vec![(s, e)])
        })
        .collect();
    let own = (c.int("start"), c.int("end"));
    let place = match (segs, len, own) {
        (Some(segs), Some(len), (Some(s), Some(e)))
            if steps_one && segs.len() == c.coord.n && e - s == len as i64 =>
        {
            crate::rows::spread(None, segs, None)
                .and_then(|k| (c.rows)(k))
                .map_or(Place::Varying, |id| Place::Rows(0, id))
        }
        _ => Place::Varying,
    };
    c.all(place)
}

pub(super) fn like(c: &Ctx) -> Outcome {
    let Some(x) = c.t("self") else {
        return c.all(Place::Replicate);
    };
    if c.t("fill_value")
        .or_else(|| c.t("value"))
        .is_some_and(|v| v.p != Place::Replicate)
    {
        return c.all(Place::Varying);
    }
    let new = c.args.schema().name.starts_with("new_");
    c.all(match x.p {
        _ if new => Place::Replicate,
        Place::Shard(d) => Place::Shard(d),
        Place::Varying => Place::Varying,
        _ => Place::Replicate,
    })
}

pub(super) fn copy(c: &Ctx) -> Outcome {
    let (Some(x), Some(src)) = (c.t("self"), c.t("src")) else {
        return c.all(Place::Unknown);
    };
    let out_rank = c.out_rank(0);
    let off = out_rank.saturating_sub(src.rank());
    // `src`'s placement in the result's dims (a shard's dim moves by the dims broadcast adds).
    let p = aligned(&src, out_rank);
    // The result has `self`'s shape, `src` broadcast to it: `src`'s layout is the result's
    // only where the broadcast does not repeat the rank's piece along its dim (as many rows
    // as `self` there), and, for a layout of no one dim, where nothing is broadcast at all.
    let rows = |t: &T, d: Option<usize>| {
        d.and_then(|d| t.meta.as_ref().and_then(|m| m.shape.get(d).copied()))
    };
    let unbroadcast =
        |d: usize| rows(&src, d.checked_sub(off)).is_some_and(|r| Some(r) == rows(&x, Some(d)));
    let same_shape = src
        .meta
        .as_ref()
        .zip(x.meta.as_ref())
        .is_some_and(|(a, b)| a.shape == b.shape);
    let laid_out = !matches!(
        p,
        Place::Replicate | Place::Partial(_) | Place::Unknown | Place::Varying | Place::Unmasked
    );
    let along = match p {
        Place::Rows(d, _) if off == 0 => Some(d as usize),
        q => q.blocks().map(|(d, _)| d),
    };
    let fits = !laid_out || along.map_or(same_shape, unbroadcast);
    c.all(match x.p {
        Place::Unknown => Place::Unknown,
        _ if !fits => Place::Varying,
        // `self` of the spec's shape on every rank: the result is `src`, as placed.
        Place::Replicate | Place::Partial(_) | Place::Unmasked => p,
        // `self` split (a shard, rows, a layout not known): `src` must be split alike, or
        // the rank's piece of `self` holds `src` broadcast, no piece of the spec's result.
        q if q == p => p,
        _ => Place::Varying,
    })
}

pub(super) fn assert_meta(_c: &Ctx) -> Outcome {
    Ok(Vec::new())
}

/// Whether `family` pairs its tensor arguments element by element after broadcasting (dims
/// aligned from the right): the families whose shards must agree across mesh dims, see
/// [`mixed_mesh_shards`].
pub fn pairs_elements(family: &str) -> bool {
    matches!(
        family,
        "pow"
            | "elementwise-add"
            | "elementwise-mul"
            | "elementwise-div"
            | "nonlinear-binary"
            | "max-min"
            | "activation-backward"
            | "where"
            | "masked-fill"
            | "lerp"
            | "addcmul"
            | "cat"
            // The losses and the softmax and norm backwards pair their operands element by
            // element too.
            | "mse-loss"
            | "mse-loss-backward"
            | "softmax-backward"
            | "norm-backward"
    )
}

/// Operands an element-wise operator pairs that are sharded on the same tensor dim by
/// different sets of mesh dims: the tensor dim (aligned to the output) and every mesh dim
/// sharding it in some operand. `args` holds, per tensor argument, its placement on every mesh
/// dim and its number of dims.
///
/// Rules see one mesh dim at a time, where a replicated operand beside a shard stands for its
/// own tiling. Across mesh dims that reading fails: `x {dp: R, tp: Shard(1)}` plus
/// `y {dp: Shard(1), tp: R}` adds, on rank (i, j), x's piece j to y's piece i, which the
/// spec's sum never pairs; each mesh dim alone would call the sum `Shard(1)`.
///
/// ```
/// use shardproof_check::Place;
/// use shardproof_check::rules::mixed_mesh_shards;
/// let x = [Place::Replicate, Place::Shard(1)];
/// let y = [Place::Shard(1), Place::Replicate];
/// assert_eq!(mixed_mesh_shards(&[(&x, 2), (&y, 2)], 2), Some((1, vec![0, 1])));
/// let z = [Place::Replicate, Place::Shard(1)];
/// assert_eq!(mixed_mesh_shards(&[(&x, 2), (&z, 2)], 2), None);
/// // A fully replicated operand broadcasts (or tiles) against any shard.
/// let r = [Place::Replicate, Place::Replicate];
/// assert_eq!(mixed_mesh_shards(&[(&x, 2), (&r, 1)], 2), None);
/// // An operand of unknown layout on a mesh dim the patterns differ in may hold the same
/// // shard there: no claim.
/// let v = [Place::Shard(1), Place::Varying];
/// let w = [Place::Shard(1), Place::Shard(1)];
/// assert_eq!(mixed_mesh_shards(&[(&v, 2), (&w, 2)], 2), None);
/// ```
pub fn mixed_mesh_shards(
    args: &[(&[Place], usize)],
    out_rank: usize,
) -> Option<(usize, Vec<usize>)> {
    // Per output dim, the distinct non-empty sharding patterns: (mesh dim, blocks) in mesh order.
    let mut patterns: Vec<(usize, Vec<(usize, usize)>)> = Vec::new();
    for &(places, rank) in args {
        let mut by_dim: Vec<(usize, Vec<(usize, usize)>)> = Vec::new();
        for (m, p) in places.iter().enumerate() {
            // Rows of a selection shard their dim too, in a pattern of their own.
            let Some((d, k)) = p.blocks().or(match p {
                Place::Rows(d, id) => Some((*d as usize, usize::MAX - *id as usize)),
                _ => None,
            }) else {
                continue;
            };
            let j = d + out_rank.saturating_sub(rank);
            match by_dim.iter_mut().find(|(jj, _)| *jj == j) {
                Some((_, v)) => v.push((m, k)),
                None => by_dim.push((j, vec![(m, k)])),
            }
        }
        for (j, pattern) in by_dim {
            match patterns.iter().find(|(jj, _)| *jj == j) {
                Some((_, seen)) if *seen != pattern => {
                    let mut dims: Vec<usize> =
                        seen.iter().chain(&pattern).map(|&(m, _)| m).collect();
                    dims.sort_unstable();
                    dims.dedup();
                    // A mesh dim where some operand's layout is not known (`Varying` may be
                    // a shard of this dim, in the other operands' pattern): not a mix shown.
                    let unknown_there = args.iter().any(|&(ps, _)| {
                        dims.iter()
                            .any(|&m| matches!(ps.get(m), Some(Place::Varying | Place::Unknown)))
                    });
                    if !unknown_there {
                        return Some((j, dims));
                    }
                }
                Some(_) => {}
                None => patterns.push((j, pattern)),
            }
        }
    }
    None
}
