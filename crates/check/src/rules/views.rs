//! View and layout rules: view/reshape/flatten, transpose, permute, (un)squeeze, expand,
//! repeat (slicing and joining: `slicing.rs`).

use super::*;

/// Where a shard of input dim `d` lands in a view from `ins` to `outs` (local shapes):
/// `Some(od)` when the shard stays contiguous (it is the outermost non-trivial dim of its
/// group), `None` when the view interleaves it.
pub fn view_dim(ins: &[usize], outs: &[usize], d: usize) -> Option<usize> {
    if ins.get(d).copied().unwrap_or(0) <= 1 {
        // A size-1 shard: it lands on the output dim of the same position in an unchanged
        // prefix only.
        // Where the view changes the number of dims, size-1 dims next to it may merge into
        // (or split off) the sharded one: the local shapes leave the reading open.
        return (ins.len() == outs.len()
            && ins[..=d.min(ins.len().saturating_sub(1))] == outs[..(d + 1).min(outs.len())])
            .then_some(d);
    }
    let (mut i, mut o) = (0usize, 0usize);
    while i < ins.len() && o < outs.len() {
        // Skip size-1 dims that start a group.
        let (gi0, go0) = (i, o);
        let (mut pi, mut po) = (ins[i] as u128, outs[o] as u128);
        i += 1;
        o += 1;
        while pi != po {
            if pi < po {
                if i >= ins.len() {
                    return None;
                }
                pi *= ins[i] as u128;
                i += 1;
            } else {
                if o >= outs.len() {
                    return None;
                }
                po *= outs[o] as u128;
                o += 1;
            }
        }
        // Absorb trailing size-1 dims into neither group: they start their own.
        if (gi0..i).contains(&d) {
            let first_in = (gi0..i).find(|&k| ins[k] > 1)?;
            if first_in != d {
                return None;
            }
            // The outermost output dim of the group holds the shard (a local size of 1 there
            // is one of the mesh dim's pieces). Where size-1 output dims lead the group, the
            // local shapes leave the reading open (`[2, 8, 4] -> [1, 2, 8, 4]` is the shard
            // on dim 0 of `[n, 2, 8, 4]` or on dim 1 of `[1, 2n, 8, 4]`): no claim.
            if o - go0 > 1 && outs[go0] == 1 {
                return None;
            }
            return Some(go0);
        }
    }
    None
}

/// Where a shard of input dim `d` lands in a view from `ins` to `outs` (local shapes) whose
/// local shapes admit several readings (`[8, 4] -> [1, 8, 1, 4]` with dim 1 sharded is the
/// shard of the heads of `[1, 8, n, 4]` or of the head dim of `[1, 8, 1, 4n]`; a kv head of
/// local size 1 merged with its query-group copies, `[2, 1, 2, 8, 4] -> [2, 2, 8, 4]`): the
/// one output dim `j` after exactly the input's elements before `d`, and whose
/// local size times the mesh dim's `n` is the global size `global[j]`. Only where this mesh
/// dim alone shards the output (the global elements are the local ones times `n`): a dim
/// that another mesh dim shards could match the sizes by coincidence. `None` unless exactly
/// one reading fits.
pub fn view_dim_by_global(
    ins: &[usize],
    outs: &[usize],
    d: usize,
    global: &[i64],
    n: usize,
) -> Option<usize> {
    if global.len() != outs.len() || d >= ins.len() {
        return None;
    }
    let prod = |v: &[usize]| v.iter().map(|&x| x as u128).product::<u128>();
    let global_numel = global
        .iter()
        .try_fold(1u128, |a, &x| u128::try_from(x).ok().map(|x| a * x));
    if global_numel != Some(prod(outs) * n as u128) {
        return None;
    }
    // A contiguous shard of input dim d is the outermost split of the elements from d inward;
    // it stays one where the output dims before j hold exactly the elements before d: output
    // dim j is then the outermost of the dims holding d's elements, and its pieces are the
    // shards.
    let outer = prod(&ins[..d]);
    let fits = |j: usize| {
        outs[j] as u128 * n as u128 == global[j].max(0) as u128 && prod(&outs[..j]) == outer
    };
    let mut found = (0..outs.len()).filter(|&j| fits(j));
    let first = found.next()?;
    found.next().is_none().then_some(first)
}

/// Where a shard of input dim `d` in `k` blocks lands in a view from `ins` to `outs` (local
/// shapes on this mesh dim): `Some((od, k2))` when every coordinate's elements form, in the
/// output, its piece of each of `k2` blocks of output dim `od`; `None` when no placement
/// describes them.
///
/// Flattened row-major, the input is `[B, n, R]`: `B` = the elements of the dims outside `d`
/// times the `k` blocks, `n` the coordinates, `R` = a block's piece times the dims inside `d`.
/// Output dim `j` (outside it `O`, inside `I` elements, local size `s`) is `[O, n * s, I]`
/// globally; the two agree exactly when `O` divides `B`, `I` divides `R` and
/// `s = (B / O) * (R / I)`: then the output is `B / O` blocks of dim `j`. One block is a plain
/// shard (a shard merged with unsharded dims inside it); more blocks come of unsharded dims
/// merged outside it, and `B / O = 1` of splitting a blocked dim at its blocks.
pub fn view_blocks(ins: &[usize], outs: &[usize], d: usize, k: usize) -> Option<(usize, usize)> {
    let cands = view_block_readings(ins, outs, d, k)?;
    // Local shapes alone can leave several readings (`[1, 8, 2, 4] -> [8, 8]` with dim 2
    // sharded is Shard(1) of `[8, 16]` or dim 0 in 8 blocks of `[16, 8]`): the fewest blocks
    // (the dims the view keeps apart). Two readings with as few blocks are no claim: a
    // size-1 dim next to the sharded one (`[2, 3] -> [2, 1, 3]` is Shard(1) of `[2, n, 3]`
    // or Shard(2) of `[2, 1, 3n]`) leaves the layout open.
    let fewest = cands.iter().map(|&(_, k2)| k2).min()?;
    let mut best = cands.iter().filter(|&&(_, k2)| k2 == fewest);
    let first = best.next().copied();
    if best.next().is_some() {
        return None;
    }
    first
}

/// The one reading of [`view_blocks`] where the local shapes admit exactly one: every output
/// dim `j` whose global shape (the local one with dim `j` n times larger) holds each
/// coordinate's elements as its piece of some blocks is a candidate, and a second candidate
/// (of any block count) is no claim. A sharded dim of local size 1 takes this reading:
/// `[1, 8, 16] -> [8, 16]` (a local batch of one flattened with the sequence) has the one
/// reading `Shard(0)` of `[8n, 16]`, while `[1, 1, 1] -> [1, 1]` has two.
pub fn view_blocks_unique(
    ins: &[usize],
    outs: &[usize],
    d: usize,
    k: usize,
) -> Option<(usize, usize)> {
    match view_block_readings(ins, outs, d, k)?.as_slice() {
        [one] => Some(*one),
        _ => None,
    }
}

/// Every (output dim, blocks) reading of a shard of input dim `d` in `k` blocks through a view
/// from `ins` to `outs` ([`view_blocks`] reads them).
fn view_block_readings(
    ins: &[usize],
    outs: &[usize],
    d: usize,
    k: usize,
) -> Option<Vec<(usize, usize)>> {
    let prod = |v: &[usize]| v.iter().try_fold(1u128, |a, &x| a.checked_mul(x as u128));
    let (&sd, k) = (ins.get(d)?, k as u128);
    if k == 0 || ins.contains(&0) || outs.contains(&0) || prod(ins)? != prod(outs)? {
        return None;
    }
    if !(sd as u128).is_multiple_of(k) {
        return None;
    }
    let b = prod(&ins[..d])? * k;
    let r = (sd as u128 / k) * prod(&ins[d + 1..])?;
    let fits = |j: usize| -> Option<usize> {
        let (o, i) = (prod(&outs[..j])?, prod(&outs[j + 1..])?);
        (b.is_multiple_of(o) && r.is_multiple_of(i) && outs[j] as u128 == (b / o) * (r / i))
            .then(|| usize::try_from(b / o).ok())
            .flatten()
    };
    Some(
        (0..outs.len())
            .filter_map(|j| fits(j).map(|k2| (j, k2)))
            .collect(),
    )
}

/// [`view_blocks`] where the spec's view of the same name gives the global output shape
/// `global` (its input the rank's with dim `d` whole, `n` coordinates): the output dim `j`
/// whose global size is `n` times the local one, every other dim the same, read as `[O, n *
/// s, I]` against the input's `[B, n, R]`. Exactly one dim differs, so the reading is unique;
/// `None` where the global shape is not the local one with one dim `n` times larger, or where
/// that dim holds no blocked piece.
pub fn view_blocks_by_global(
    ins: &[usize],
    outs: &[usize],
    d: usize,
    k: usize,
    global: &[i64],
    n: usize,
) -> Option<(usize, usize)> {
    let prod = |v: &[usize]| v.iter().try_fold(1u128, |a, &x| a.checked_mul(x as u128));
    if n < 2 || global.len() != outs.len() || k == 0 || d >= ins.len() {
        return None;
    }
    let mut differs = (0..outs.len()).filter(|&j| global[j] != outs[j] as i64);
    let j = differs.next()?;
    if differs.next().is_some() || global[j] != (outs[j] as i64).checked_mul(n as i64)? {
        return None;
    }
    let (sd, k128) = (ins[d] as u128, k as u128);
    if ins.contains(&0) || prod(ins)? != prod(outs)? || !sd.is_multiple_of(k128) {
        return None;
    }
    let b = prod(&ins[..d])? * k128;
    let r = (sd / k128) * prod(&ins[d + 1..])?;
    let (o, i) = (prod(&outs[..j])?, prod(&outs[j + 1..])?);
    (b.is_multiple_of(o) && r.is_multiple_of(i) && outs[j] as u128 == (b / o) * (r / i))
        .then(|| usize::try_from(b / o).ok().map(|k2| (j, k2)))
        .flatten()
}

/// [`view_blocks_by_global`] where other mesh dims shard the input dims `others_in` too:
/// the view must reshape a group of dims apart from the rest (the local and the spec's
/// global prefix products both meet at the group's two ends, in the input and the output),
/// the group holds dim `d` and none of `others_in`, its input dims are global but `d`
/// (`n` times), and exactly one of its output dims is `n` times larger globally. A row-major
/// view that splits at the group's ends reshapes every slab of the group alike, so the other
/// mesh dims' pieces (outside the group) leave this mesh dim's reading as it is alone.
#[allow(clippy::too_many_arguments)]
pub fn view_blocks_in_group(
    ins: &[usize],
    outs: &[usize],
    d: usize,
    k: usize,
    gin: &[i64],
    gout: &[i64],
    n: usize,
    others_in: &[usize],
    rows: bool,
) -> Option<(usize, usize)> {
    if n < 2 || gin.len() != ins.len() || gout.len() != outs.len() || d >= ins.len() {
        return None;
    }
    let gin: Vec<usize> = gin
        .iter()
        .map(|&x| usize::try_from(x).ok())
        .collect::<Option<_>>()?;
    let gout: Vec<usize> = gout
        .iter()
        .map(|&x| usize::try_from(x).ok())
        .collect::<Option<_>>()?;
    let prefix = |v: &[usize]| -> Option<Vec<u128>> {
        let mut p = vec![1u128];
        for &x in v {
            p.push(p.last()?.checked_mul(x as u128)?);
        }
        Some(p)
    };
    let (pi, po, gpi, gpo) = (prefix(ins)?, prefix(outs)?, prefix(&gin)?, prefix(&gout)?);
    // The group's input ends: the nearest boundaries around d where some output prefix
    // meets the input prefix, locally and globally at the same output positions.
    let ends_at = |i: usize| -> Vec<usize> {
        (0..=outs.len())
            .filter(|&o| po[o] == pi[i] && gpo[o] == gpi[i])
            .collect()
    };
    let i0 = (0..=d).rev().find(|&i| !ends_at(i).is_empty())?;
    let i1 = (d + 1..=ins.len()).find(|&i| !ends_at(i).is_empty())?;
    if others_in.iter().any(|e| (i0..i1).contains(e)) {
        return None;
    }
    // The spec's growth of dim d: n for a shard; for rows of a selection (a microbatch of a
    // batch shard), the spec's whole dim is a multiple of the n pieces the selection holds.
    let grow = match gin[d].checked_div(ins[d]) {
        Some(g) if gin[d] == ins[d] * g && (g == n || (rows && g % n == 0)) => g,
        _ => return None,
    };
    if (i0..i1).any(|i| i != d && gin[i] != ins[i]) {
        return None;
    }
    let mut found = None;
    for &o0 in &ends_at(i0) {
        for &o1 in ends_at(i1).iter().filter(|&&o1| o1 > o0) {
            let mut differs = (o0..o1).filter(|&j| gout[j] != outs[j]);
            let Some(j) = differs.next() else { continue };
            if differs.next().is_some() || gout[j] != outs[j].checked_mul(grow)? {
                continue;
            }
            let r = view_blocks_at(ins, outs, d, k, j)?;
            if found.is_some_and(|f| f != r) {
                return None;
            }
            found = Some(r);
        }
    }
    found
}

/// Whether a view from `ins` to `outs` reshapes input dims `d` and `e` in different groups:
/// both of local size above 1 (a size-1 dim may belong to either neighbour), and a cut
/// between them where the local input and output prefix products meet.
pub fn reshaped_apart(ins: &[usize], outs: &[usize], d: usize, e: usize) -> bool {
    let (lo, hi) = (d.min(e), d.max(e));
    if lo == hi || ins.get(hi).is_none_or(|&x| x <= 1) || ins[lo] <= 1 {
        return false;
    }
    let prod = |v: &[usize]| v.iter().map(|&x| x as u128).product::<u128>();
    let out_prefix: Vec<u128> = (0..=outs.len()).map(|q| prod(&outs[..q])).collect();
    (lo + 1..=hi).any(|p| out_prefix.contains(&prod(&ins[..p])))
}

/// [`reshaped_apart`] where the local shapes leave it open (a size-1 dim beside the cut),
/// settled by the spec's view of the same node (global shapes `gin` -> `gout`): a cut between
/// input dims `lo` and `hi` where the local input and output prefix products meet and the
/// global ones meet at the same positions. A row-major view that cuts there both locally and
/// globally reshapes the dims on either side on their own, so the pieces of one side stay
/// where the other side's reading leaves them.
pub fn reshaped_apart_by_global(
    ins: &[usize],
    outs: &[usize],
    gin: &[i64],
    gout: &[i64],
    lo: usize,
    hi: usize,
) -> bool {
    if lo >= hi || hi >= ins.len() || gin.len() != ins.len() || gout.len() != outs.len() {
        return false;
    }
    let prefix = |v: &mut dyn Iterator<Item = Option<u128>>| -> Option<Vec<u128>> {
        let mut p = vec![1u128];
        for x in v {
            p.push(p.last()?.checked_mul(x?)?);
        }
        Some(p)
    };
    let (Some(pi), Some(po), Some(gpi), Some(gpo)) = (
        prefix(&mut ins.iter().map(|&x| Some(x as u128))),
        prefix(&mut outs.iter().map(|&x| Some(x as u128))),
        prefix(&mut gin.iter().map(|&x| u128::try_from(x).ok())),
        prefix(&mut gout.iter().map(|&x| u128::try_from(x).ok())),
    ) else {
        return false;
    };
    (lo + 1..=hi).any(|p| (0..=outs.len()).any(|o| po[o] == pi[p] && gpo[o] == gpi[p]))
}

/// The blocked reading of output dim `j` for a shard of input dim `d` in `k` blocks (the
/// local-shape condition of [`view_blocks`] at one dim), `None` where it does not hold.
fn view_blocks_at(
    ins: &[usize],
    outs: &[usize],
    d: usize,
    k: usize,
    j: usize,
) -> Option<(usize, usize)> {
    let prod = |v: &[usize]| v.iter().try_fold(1u128, |a, &x| a.checked_mul(x as u128));
    let (sd, k128) = (*ins.get(d)? as u128, k as u128);
    if k == 0 || ins.contains(&0) || outs.contains(&0) || prod(ins)? != prod(outs)? {
        return None;
    }
    if !sd.is_multiple_of(k128) {
        return None;
    }
    let b = prod(&ins[..d])? * k128;
    let r = (sd / k128) * prod(&ins[d + 1..])?;
    let (o, i) = (prod(&outs[..j])?, prod(&outs[j + 1..])?);
    (b.is_multiple_of(o) && r.is_multiple_of(i) && *outs.get(j)? as u128 == (b / o) * (r / i))
        .then(|| usize::try_from(b / o).ok().map(|k2| (j, k2)))
        .flatten()
}

/// The placements a view gives every mesh dim that shards its input, where several mesh dims
/// shard it (`shards[m]` = `Some((input dim, blocks, mesh dim size))` for mesh dim `m`, `None`
/// for one that shards nothing), read against the spec's global shapes `gin` -> `gout`.
///
/// A mesh dim's placement describes the set of global indices of the tensor dim its
/// coordinate holds; a rank holds the intersection of its mesh dims' sets, in index order. So
/// the global row-major index is a sequence of factors: a dim sharded in `k` blocks by a mesh
/// dim of size `n` is `[k, n, s / k]` (`s` its local size), the `n` being the mesh dim's
/// coordinate; an unsharded dim is one factor. A row-major view keeps that sequence and cuts
/// it into the output dims (a rank-held factor may be split at a cut, its major part before
/// it; a coordinate's factor may not). Where every output dim's rank-held factors multiply to
/// its local size, the local view is every rank's piece of the global one, and a mesh dim
/// whose factor lands in output dim `j` after factors of global size `a` there shards `j` in
/// `a` blocks, whatever the other mesh dims do: the mesh dims' order within the merged dim is
/// the factors' order (`[b, h, s, d] -> [b*h, s, d]` with `b` over dp and `h` over tp: dp is
/// `Shard(0)`, tp `Shard(0, blocks=b)`). Several mesh dims on one input dim nest by their block
/// counts (dp `Shard(0)` and tp `Shard(0, blocks=b)` of `[b*h]` are `[dp, tp, h / tp]`), which
/// is how the merge above splits back. `None` where their pieces cross, where the shapes are
/// not the local ones scaled by the shards, or where a cut splits a coordinate.
///
/// Several plain shards of one input dim (`Shard(0)` on dp and on ep, as a case declares the
/// batch over both) are nested in an order the placements do not record (a case's mesh
/// order; DTensor's semantics). Every order is read: where each gives these mesh dims plain
/// shards of one output dim, nested in that same order, and every other mesh dim the same
/// placement, the view keeps the nesting whatever it was (a batch of local size 1 merged
/// with the sequence: `[1, 8, 16] -> [8, 16]` of `[4, 8, 16] -> [32, 16]`), and that is the
/// reading; where the orders read differently (the nested dim split apart), `None`.
pub fn view_by_factors(
    ins: &[usize],
    outs: &[usize],
    gin: &[i64],
    gout: &[i64],
    shards: &[Option<(usize, usize, usize)>],
) -> Option<Vec<Option<(usize, usize)>>> {
    // The mesh dims holding plain shards of each input dim, where more than one does.
    let groups: Vec<Vec<usize>> = (0..ins.len())
        .map(|e| {
            (0..shards.len())
                .filter(|&m| matches!(shards[m], Some((d, 1, _)) if d == e))
                .collect::<Vec<usize>>()
        })
        .filter(|g| g.len() > 1)
        .collect();
    if groups.is_empty() {
        return placed_by_factors(ins, outs, gin, gout, shards);
    }
    // Every order of every group (few: a group is at most the mesh's dims).
    let mut orders: Vec<Vec<Vec<usize>>> = vec![Vec::new()];
    for g in &groups {
        let perms = permutations(g);
        if orders.len().saturating_mul(perms.len()) > 24 {
            return None;
        }
        orders = orders
            .into_iter()
            .flat_map(|o| {
                perms.iter().map(move |p| {
                    let mut o = o.clone();
                    o.push(p.clone());
                    o
                })
            })
            .collect();
    }
    let mut agreed: Option<Vec<Option<(usize, usize)>>> = None;
    for order in orders {
        // The order as blocks: each mesh dim's pieces sit in every piece of the ones before.
        let mut explicit = shards.to_vec();
        for perm in &order {
            let mut k = 1usize;
            for &m in perm {
                let (e, _, n) = shards[m]?;
                explicit[m] = Some((e, k, n));
                k = k.checked_mul(n)?;
            }
        }
        let placed = placed_by_factors(ins, outs, gin, gout, &explicit)?;
        // Back to plain shards nested in the same order: the first plain on one output dim,
        // each next one in the pieces of those before it there.
        let mut plain = placed.clone();
        for perm in &order {
            let od = placed[perm[0]]?.0;
            let mut k = 1usize;
            for &m in perm {
                if placed[m] != Some((od, k)) {
                    return None;
                }
                plain[m] = Some((od, 1));
                k = k.checked_mul(shards[m]?.2)?;
            }
        }
        match &agreed {
            None => agreed = Some(plain),
            Some(a) if *a == plain => {}
            Some(_) => return None,
        }
    }
    agreed
}

/// Every order of `items`.
fn permutations(items: &[usize]) -> Vec<Vec<usize>> {
    if items.len() <= 1 {
        return vec![items.to_vec()];
    }
    let mut out = Vec::new();
    for (i, &x) in items.iter().enumerate() {
        let mut rest = items.to_vec();
        rest.remove(i);
        for mut p in permutations(&rest) {
            p.insert(0, x);
            out.push(p);
        }
    }
    out
}

/// [`view_by_factors`] where the shards of each input dim nest by their block counts.
fn placed_by_factors(
    ins: &[usize],
    outs: &[usize],
    gin: &[i64],
    gout: &[i64],
    shards: &[Option<(usize, usize, usize)>],
) -> Option<Vec<Option<(usize, usize)>>> {
    if gin.len() != ins.len() || gout.len() != outs.len() {
        return None;
    }
    // The mesh dims sharding each input dim, as (blocks, mesh dim, size).
    let mut by_dim: Vec<Vec<(usize, usize, usize)>> = vec![Vec::new(); ins.len()];
    for (m, sh) in shards.iter().enumerate() {
        let Some((e, k, n)) = *sh else { continue };
        if e >= ins.len() || n < 2 || k == 0 {
            return None;
        }
        by_dim[e].push((k, m, n));
    }
    // Factors of the global row-major index: (size, the mesh dim whose coordinate it is).
    let mut factors: Vec<(u128, Option<usize>)> = Vec::new();
    for (e, &s) in ins.iter().enumerate() {
        let g = u128::try_from(gin[e]).ok()?;
        let mut on = std::mem::take(&mut by_dim[e]);
        on.sort_unstable();
        let coords = on
            .iter()
            .try_fold(1u128, |a, &(_, _, n)| a.checked_mul(n as u128))?;
        if s == 0 || g != (s as u128).checked_mul(coords)? {
            return None;
        }
        // Several mesh dims on one dim nest where each one's blocks are whole blocks of the
        // coarser ones' pieces (the next one's block count a multiple of the pieces so far):
        // `[k1, n1, k2 / (k1 n1), n2, ..., g / (k_last n_last)]`. Otherwise their pieces
        // cross, in no order this reading knows.
        let mut outer = 1u128;
        for &(k, m, n) in &on {
            let k = k as u128;
            if !k.is_multiple_of(outer) {
                return None;
            }
            factors.push((k / outer, None));
            factors.push((n as u128, Some(m)));
            outer = k.checked_mul(n as u128)?;
        }
        if !g.is_multiple_of(outer) {
            return None;
        }
        factors.push((g / outer, None));
    }
    factors.retain(|&(f, m)| f != 1 || m.is_some());
    let mut placed: Vec<Option<(usize, usize)>> = vec![None; shards.len()];
    let mut next = factors.into_iter().peekable();
    for (j, (&g, &l)) in gout.iter().zip(outs).enumerate() {
        let mut need = u128::try_from(g).ok()?;
        if need == 0 {
            return None;
        }
        let (mut before, mut local) = (1u128, 1u128);
        while need > 1 {
            let (f, m) = next.next()?;
            match m {
                Some(m) => {
                    if !need.is_multiple_of(f) {
                        return None;
                    }
                    placed[m] = Some((j, usize::try_from(before).ok()?));
                    need /= f;
                    before *= f;
                }
                None if need.is_multiple_of(f) => {
                    need /= f;
                    before *= f;
                    local *= f;
                }
                None if f.is_multiple_of(need) => {
                    // The factor's major part ends this output dim; its minor part begins
                    // the next one.
                    let rest = f / need;
                    before *= need;
                    local *= need;
                    need = 1;
                    let mut tail: Vec<(u128, Option<usize>)> = vec![(rest, None)];
                    tail.extend(next.by_ref());
                    next = tail.into_iter().peekable();
                }
                None => return None,
            }
        }
        if local != l as u128 {
            return None;
        }
    }
    if next.next().is_some() {
        return None;
    }
    // Every mesh dim that shards the input lands somewhere.
    shards
        .iter()
        .zip(&placed)
        .all(|(s, p)| s.is_none() || p.is_some())
        .then_some(placed)
}

/// The spec's view shapes `gin` -> `gout` in the frame of rows of a selection, for the
/// reading of mesh dim `me`. An input dim that a mesh dim in `rows_dims` (bit per mesh dim)
/// holds as rows (`Place::Rows`, in `shards` as a shard) has more rows in the spec than the
/// pieces (a microbatch of the batch shard), the rows being the dim's outermost factor (a
/// merge keeps them outermost, `RowKey::Merge`). For the rows' own mesh dim the frame is the
/// selection (its n pieces); for any other mesh dim it is the rank's own rows, which its
/// group's peers share (the rows' mesh dims then take no elements apart in the returned
/// shards): the frame in which a reading of the local shapes alone counts blocks, so that
/// readings by factors and by local shapes of one tensor agree. The spec's input dim shrinks
/// to the frame, and the output dim that starts at the same global position (its outermost
/// factor, the rows') alike. `None` where nothing shrinks or the numbers do not divide;
/// [`view_by_factors`] then checks the frame against every piece's local shapes.
#[allow(clippy::type_complexity)]
pub fn rows_frame(
    ins: &[usize],
    gin: &[i64],
    gout: &[i64],
    shards: &[Option<(usize, usize, usize)>],
    rows_dims: u64,
    me: usize,
) -> Option<(Vec<i64>, Vec<i64>, Vec<Option<(usize, usize, usize)>>)> {
    if gin.len() != ins.len() {
        return None;
    }
    let is_rows = |m: usize| m < 64 && rows_dims & (1 << m) != 0;
    let (mut fi, mut fo, mut fs) = (gin.to_vec(), gout.to_vec(), shards.to_vec());
    let mut shrunk = false;
    for e in 0..ins.len() {
        let on: Vec<(usize, usize)> = shards
            .iter()
            .enumerate()
            .filter_map(|(m, sh)| sh.filter(|s| s.0 == e).map(|s| (m, s.2)))
            .collect();
        if !on.iter().any(|&(m, _)| is_rows(m)) {
            continue;
        }
        // The rows' own mesh dim reads the selection; another reads the rank's rows.
        let own = on.iter().any(|&(m, _)| m == me && is_rows(m));
        if !own {
            for &(m, _) in on.iter().filter(|&&(m, _)| is_rows(m)) {
                fs[m] = None;
            }
        } else {
            // The other mesh dims' blocks on this dim are counted over the rank's rows (their
            // frame, above); in the selection's frame every rows piece, outermost, holds them
            // again: `n` times the blocks per rows mesh dim.
            let n_rows: usize = on
                .iter()
                .filter(|&&(m, _)| is_rows(m))
                .map(|&(_, n)| n)
                .product();
            for &(m, _) in on.iter().filter(|&&(m, _)| !is_rows(m)) {
                if let Some(sh) = fs[m].as_mut() {
                    sh.1 = sh.1.checked_mul(n_rows)?;
                }
            }
        }
        let pieces = on
            .iter()
            .filter(|&&(m, _)| own || !is_rows(m))
            .map(|&(_, n)| n as i64)
            .product::<i64>()
            * ins[e] as i64;
        if pieces == 0 || gin[e] % pieces != 0 || gin[e] == pieces {
            continue;
        }
        let rho = gin[e] / pieces;
        let before: i64 = gin[..e].iter().product();
        let mut at = 1i64;
        let j = (0..gout.len()).find(|&j| {
            let here = at == before;
            at = at.saturating_mul(gout[j]);
            here && gout[j] > 1
        })?;
        if fo[j] % rho != 0 {
            return None;
        }
        fi[e] /= rho;
        fo[j] /= rho;
        shrunk = true;
    }
    shrunk.then_some((fi, fo, fs))
}

pub(super) fn out_shape(c: &Ctx, i: usize) -> Option<Vec<usize>> {
    c.outs
        .get(i)
        .and_then(|m| m.as_ref())
        .map(|m| m.shape.clone())
}

pub(super) fn view(c: &Ctx) -> Outcome {
    let Some(x) = c.t("self") else {
        return c.all(Place::Unknown);
    };
    match x.p {
        Place::Partial(Red::Sum) | Place::PartialSplit(..) | Place::PartialStacked(_) => {
            let (Some(m), Some(out)) = (&x.meta, out_shape(c, 0)) else {
                return c.all(Place::Partial(Red::Sum));
            };
            let (ins, n) = (&m.shape, c.coord.n);
            c.all(match x.p {
                // One dim j split into [n, piece], nothing else changed: recorded.
                Place::Partial(_) => (0..ins.len())
                    .find(|&j| {
                        n > 1
                            && out.len() == ins.len() + 1
                            && out[..j] == ins[..j]
                            && out[j] == n
                            && out[j + 1] * n == ins[j]
                            && out[j + 2..] == ins[j + 1..]
                    })
                    .and_then(|j| u8::try_from(j).ok())
                    .map_or(Place::Partial(Red::Sum), |j| Place::PartialSplit(j, j)),
                // The split axis outermost, merged with the dim after it: the pieces of dim
                // j in dim 0.
                Place::PartialSplit(0, j)
                    if ins.len() >= 2
                        && out.len() + 1 == ins.len()
                        && out[0] == ins[0] * ins[1]
                        && out[1..] == ins[2..]
                        && ins[0] == n =>
                {
                    Place::PartialStacked(j)
                }
                _ => Place::Partial(Red::Sum),
            })
        }
        Place::Stacked(d) => {
            // Dim 0 split into [n, piece] (nothing else changed): the coordinate axis apart.
            let (Some(m), Some(out)) = (&x.meta, out_shape(c, 0)) else {
                return c.all(Place::Unknown);
            };
            let n = c.coord.n;
            let split = n > 0
                && m.shape.first().is_some_and(|&s0| s0 % n == 0)
                && out.len() == m.shape.len() + 1
                && out[0] == n
                && out[1] == m.shape[0] / n
                && out[2..] == m.shape[1..];
            c.all(match u8::try_from(d as usize + 1) {
                Ok(o) if split => Place::Gathered(0, o),
                _ => Place::Varying,
            })
        }
        Place::Gathered(a, o) => {
            // The coordinate axis merged just outside the piece's dim (nothing else
            // changed): the pieces in coordinate order along the tensor's dim.
            let (Some(m), Some(out)) = (&x.meta, out_shape(c, 0)) else {
                return c.all(Place::Unknown);
            };
            let (a, o) = (a as usize, o as usize);
            let merged = o == a + 1
                && o < m.shape.len()
                && out.len() + 1 == m.shape.len()
                && out[..a] == m.shape[..a]
                && out[a] == m.shape[a] * m.shape[o]
                && out[a + 1..] == m.shape[o + 1..];
            c.all(if merged {
                Place::Replicate
            } else {
                Place::Varying
            })
        }
        Place::Shard(_) | Place::Blocked(..) => {
            let (Some(m), Some(out)) = (&x.meta, out_shape(c, 0)) else {
                return c.all(Place::Unknown);
            };
            let Some((d, k)) = x.p.blocks() else {
                return c.all(Place::Unknown);
            };
            // A plain shard that stays contiguous keeps the rule it always had; otherwise the
            // blocked analysis says where (and in how many blocks) the pieces land.
            // (A local size of 1 on the sharded dim leaves the readings open: no guess.)
            // The blocked reading counts the local elements around the shard; where another
            // mesh dim shards the tensor too, its pieces sit among them in an order the
            // per-mesh-dim placements do not record: no claim.
            let others = c
                .input_places
                .iter()
                .filter(|p| p.blocks().is_some())
                .count()
                > 1;
            // The spec's node of the same name is this view where its input is this rank's
            // with dim d whole (the names could shift between the programs).
            let n = c.coord.n;
            let same_node = |gi: &[i64]| {
                gi.len() == m.shape.len()
                    && gi
                        .iter()
                        .zip(&m.shape)
                        .enumerate()
                        .all(|(k, (&g, &l))| g == (l * if k == d { n } else { 1 }) as i64)
            };
            let global = c.global_view.filter(|(gi, _)| same_node(gi));
            // The spec's output shape names the one output dim this mesh dim shards: the
            // blocked reading that has it is the layout, whatever the local shapes admit.
            if let Some((od, k2)) =
                global.and_then(|(_, go)| view_blocks_by_global(&m.shape, &out, d, k, go, n))
            {
                return c.all(Place::blocked(od, k2));
            }
            // Where other mesh dims shard the input too, the spec's shapes still settle a
            // view that reshapes this shard's dims apart from theirs.
            let mut others_in: Vec<usize> = c
                .input_places
                .iter()
                .filter_map(|p| p.blocks().map(|(e, _)| e))
                .collect();
            if let Some(pos) = others_in.iter().position(|&e| e == d) {
                others_in.remove(pos);
            }
            // So do they where the input is rows of a selection (a microbatch), whose spec dim
            // holds more rows than the pieces (`global` never matches it).
            if !others_in.is_empty() || c.rows_input {
                if let Some((od, k2)) = c.global_view.and_then(|(gi, go)| {
                    view_blocks_in_group(&m.shape, &out, d, k, gi, go, n, &others_in, c.rows_input)
                }) {
                    return c.all(Place::blocked(od, k2));
                }
            }
            // Several mesh dims shard the input: the spec's shapes settle every mesh dim's
            // piece of the merged dims (the mesh dims' order within a dim included).
            if !others_in.is_empty() {
                if let Some(p) = c.global_view.and_then(|(gi, go)| {
                    let beside_varying = in_varying_frame(&m.shape, gi, c);
                    let shards = c
                        .input_places
                        .iter()
                        .zip(c.mesh_sizes)
                        .enumerate()
                        .map(|(q, (p, &n))| match p {
                            Place::Shard(_) | Place::Blocked(..) => {
                                p.blocks().map(|(e, k)| Some((e, k, n)))
                            }
                            // Layouts that take no elements apart.
                            Place::Replicate | Place::Partial(_) => Some(None),
                            // A pipeline dim's stages hold different tensors, never pieces of
                            // one (`varying_may_shard` is false there): no elements apart.
                            Place::Varying if q < 64 && c.pipeline_dims & (1 << q) != 0 => {
                                Some(None)
                            }
                            // Spec shapes in the frame of one coordinate of the varying mesh
                            // dims (`in_varying_frame`): nothing of theirs is in them.
                            Place::Varying if beside_varying => Some(None),
                            _ => None,
                        })
                        .collect::<Option<Vec<_>>>()?;
                    let placed =
                        view_by_factors(&m.shape, &out, gi, go, &shards).or_else(|| {
                            // Rows of a selection: the spec's batch is not the pieces' batch;
                            // read the factors in the selection's frame.
                            let (fi, fo, fs) =
                                rows_frame(&m.shape, gi, go, &shards, c.rows_dims, c.mesh_dim)?;
                            view_by_factors(&m.shape, &out, &fi, &fo, &fs)
                        })?;
                    placed.get(c.mesh_dim).copied().flatten()
                }) {
                    c.by_factors.set(true);
                    return c.all(Place::blocked(p.0, p.1));
                }
            }
            // The local shapes read this mesh dim's shard alone; where another mesh dim shards
            // a dim the view merges outside it, this one's pieces sit inside that one's
            // (Megatron's `[b, h, s, d] -> [b*h, s, d]`, the batch over dp, the heads over tp,
            // is tp `Shard(0, blocks=b)`, not `Shard(0)`): no local reading then. A dim merged
            // inside this one's splits each of this one's pieces, which stay contiguous.
            let apart = others_in
                .iter()
                .all(|&e| e > d || reshaped_apart(&m.shape, &out, d, e));
            if k == 1 && apart {
                if let Some(od) = view_dim(&m.shape, &out, d) {
                    return c.all(Place::shard(od));
                }
                if let Some(od) =
                    global.and_then(|(_, go)| view_dim_by_global(&m.shape, &out, d, go, n))
                {
                    return c.all(Place::shard(od));
                }
                // A local size of 1 on the sharded dim: size-1 dims around it may merge
                // into it or split off it, so only a view the local shapes read one way
                // (and no other mesh dim shards the input) is placed.
                if m.shape.get(d).copied().unwrap_or(0) <= 1 {
                    // One block only: a blocked reading gathers to the tensor's elements in
                    // another order, which the all-gather rule does not record.
                    return c.all(match view_blocks_unique(&m.shape, &out, d, k) {
                        Some((od, 1)) if !others => Place::shard(od),
                        _ => Place::Varying,
                    });
                }
            }
            if others {
                if let Some(p) = nested_group_view(&m.shape, &out, d, c) {
                    c.by_factors.set(true);
                    return c.all(p);
                }
                return c.all(Place::Varying);
            }
            c.all(
                view_blocks(&m.shape, &out, d, k)
                    .map_or(Place::Varying, |(od, k2)| Place::blocked(od, k2)),
            )
        }
        p => c.all(p),
    }
}

/// The placement a view gives this mesh dim where several mesh dims hold plain shards of one
/// input dim `d` and nothing else takes the input's elements apart (a batch declared over dp
/// and ep, or a microbatch's rows of it on both), read from the local shapes alone where the
/// spec's shapes settle nothing (a microbatch's view the spec does not make).
///
/// Whatever order the shards nest in, they are together one plain shard of `d` in `N`
/// pieces (`N` the product of their sizes), the rank's piece being its place in that order.
/// Where the local shapes read that shard one way only, on output dim `od`
/// ([`view_blocks_unique`]), the view that scales `od` by `N` is read by factors
/// ([`view_by_factors`], every order): where each order leaves every mesh dim of the group a
/// plain shard of `od`, nested as before, every rank's output is its piece of that view. A
/// reading of several blocks (the shard merged with a dim outside it) depends on the order
/// and is not taken; neither is one where the
/// rows of a selection sit beside a plain shard (`rows_dims` covers all of the group or
/// none), nor one beside a mesh dim of unknown layout.
fn nested_group_view(ins: &[usize], outs: &[usize], d: usize, c: &Ctx) -> Option<Place> {
    let mut shards: Vec<Option<(usize, usize, usize)>> = Vec::with_capacity(c.mesh_sizes.len());
    let mut group: u64 = 0;
    for (q, (p, &n)) in c.input_places.iter().zip(c.mesh_sizes).enumerate() {
        shards.push(match p {
            Place::Shard(e) if *e as usize == d && q < 64 => {
                group |= 1 << q;
                Some((d, 1, n))
            }
            Place::Replicate | Place::Partial(_) => None,
            Place::Varying if q < 64 && c.pipeline_dims & (1 << q) != 0 => None,
            _ => return None,
        });
    }
    if group.count_ones() < 2 || (c.rows_dims != 0 && c.rows_dims != group) {
        return None;
    }
    let (od, _) = view_blocks_unique(ins, outs, d, 1)?;
    let n: usize = shards.iter().flatten().map(|s| s.2).product();
    let scaled = |shape: &[usize], at: usize| -> Option<Vec<i64>> {
        shape
            .iter()
            .enumerate()
            .map(|(j, &l)| {
                let l = i64::try_from(l).ok()?;
                if j == at {
                    l.checked_mul(i64::try_from(n).ok()?)
                } else {
                    Some(l)
                }
            })
            .collect()
    };
    let (gin, gout) = (scaled(ins, d)?, scaled(outs, od)?);
    let placed = view_by_factors(ins, outs, &gin, &gout, &shards)?;
    match placed.get(c.mesh_dim).copied().flatten()? {
        (j, 1) if j == od => Some(Place::shard(od)),
        _ => None,
    }
}

/// Whether the global input shape `gi` of a view is its local input shape scaled by the
/// shards of the mesh dims that do not hold it `Varying` only, while some do: the frame of one
/// coordinate of those mesh dims, where the spec's shapes were read with their factors left
/// out (the engine's view beside a varying mesh dim). Within it a `Varying` mesh dim takes no
/// elements apart.
fn in_varying_frame(local: &[usize], gi: &[i64], c: &Ctx) -> bool {
    let mut frame: Vec<i64> = local.iter().map(|&l| l as i64).collect();
    let mut varying = false;
    for (p, &n) in c.input_places.iter().zip(c.mesh_sizes) {
        match p {
            Place::Varying => varying = true,
            // Rows of a selection show as shards here.
            Place::Shard(_) | Place::Blocked(..) => {
                let Some(g) = p.blocks().and_then(|(d, _)| frame.get_mut(d)) else {
                    return false;
                };
                *g *= n as i64;
            }
            Place::Replicate | Place::Partial(_) => {}
            _ => return false,
        }
    }
    varying && c.input_places.len() == c.mesh_sizes.len() && frame == gi
}

pub(super) fn moved(c: &Ctx, f: impl Fn(usize) -> Option<usize>) -> Outcome {
    let Some(x) = c.t("self") else {
        return c.all(Place::Unknown);
    };
    match x.p {
        Place::Gathered(a, o) => c.all(match (f(a as usize), f(o as usize)) {
            (Some(a2), Some(o2)) => match (u8::try_from(a2), u8::try_from(o2)) {
                (Ok(a2), Ok(o2)) => Place::Gathered(a2, o2),
                _ => Place::Varying,
            },
            _ => Place::Varying,
        }),
        Place::Stacked(_) => c.all(Place::Varying),
        // The split axis moves; the tensor's own dims must keep their order.
        Place::PartialSplit(a, j) => {
            let r = x.rank();
            let others: Vec<Option<usize>> = (0..r).filter(|&d| d != a as usize).map(&f).collect();
            let ordered =
                others.iter().all(Option::is_some) && others.windows(2).all(|w| w[0] < w[1]);
            c.all(match f(a as usize).map(u8::try_from) {
                Some(Ok(a2)) if ordered => Place::PartialSplit(a2, j),
                _ => Place::Partial(Red::Sum),
            })
        }
        Place::PartialStacked(_) => c.all(Place::Partial(Red::Sum)),
        Place::Shard(d) => c.all(f(d as usize).map_or(Place::Varying, Place::shard)),
        Place::Blocked(d, k) => {
            c.all(f(d as usize).map_or(Place::Varying, |e| Place::blocked(e, k as usize)))
        }
        p => c.all(p),
    }
}

pub(super) fn t(c: &Ctx) -> Outcome {
    let r = c.t("self").map_or(0, |x| x.rank());
    moved(c, |d| Some(if r == 2 { 1 - d } else { d }))
}

pub(super) fn transpose(c: &Ctx) -> Outcome {
    let r = c.t("self").map_or(0, |x| x.rank());
    let (Some(a), Some(b)) = (
        c.int("dim0").and_then(|d| norm_dim(d, r)),
        c.int("dim1").and_then(|d| norm_dim(d, r)),
    ) else {
        return c.all(Place::Unknown);
    };
    moved(c, |d| {
        Some(if d == a {
            b
        } else if d == b {
            a
        } else {
            d
        })
    })
}

pub(super) fn permute(c: &Ctx) -> Outcome {
    let r = c.t("self").map_or(0, |x| x.rank());
    let Some(dims) = c.ints("dims") else {
        return c.all(Place::Unknown);
    };
    let dims: Option<Vec<usize>> = dims.iter().map(|&d| norm_dim(d, r)).collect();
    let Some(dims) = dims else {
        return c.all(Place::Unknown);
    };
    moved(c, |d| dims.iter().position(|&x| x == d))
}

pub(super) fn unsqueeze(c: &Ctx) -> Outcome {
    let r = c.out_rank(0);
    let Some(u) = c.int("dim").and_then(|d| norm_dim(d, r)) else {
        return c.all(Place::Unknown);
    };
    moved(c, |d| Some(if d >= u { d + 1 } else { d }))
}

pub(super) fn squeeze(c: &Ctx) -> Outcome {
    let Some(x) = c.t("self") else {
        return c.all(Place::Unknown);
    };
    let (Some(m), Some(out)) = (x.meta.clone(), out_shape(c, 0)) else {
        return c.all(Place::Unknown);
    };
    // A sharded dim of local size 1 is of size n in the spec, whose squeeze keeps it; and
    // the dims removed are read from the shapes, which cannot tell it from another size-1
    // dim: no claim.
    if x.p
        .blocks()
        .is_some_and(|(d, _)| m.shape.get(d) == Some(&1))
    {
        return c.all(Place::Varying);
    }
    let removed: Vec<usize> = {
        // Dims of size 1 that disappear, matched greedily.
        let mut v = Vec::new();
        let mut o = 0;
        for (i, &s) in m.shape.iter().enumerate() {
            if o < out.len() && out[o] == s && (s != 1 || out.len() - o >= m.shape.len() - i) {
                o += 1;
            } else {
                v.push(i);
            }
        }
        v
    };
    moved(c, |d| {
        (!removed.contains(&d)).then(|| d - removed.iter().filter(|&&r| r < d).count())
    })
}

pub(super) fn expand(c: &Ctx) -> Outcome {
    let Some(x) = c.t("self") else {
        return c.all(Place::Unknown);
    };
    let off = c.out_rank(0).saturating_sub(x.rank());
    // A sharded dim broadcast from a local size of 1 repeats the rank's piece: no shard.
    if let Some((d, _)) = x.p.blocks() {
        let local = x.meta.as_ref().and_then(|m| m.shape.get(d).copied());
        if local.is_none() || local != out_shape(c, 0).and_then(|s| s.get(d + off).copied()) {
            return c.all(Place::Varying);
        }
    }
    moved(c, |d| Some(d + off))
}

pub(super) fn repeat(c: &Ctx) -> Outcome {
    let Some(x) = c.t("self") else {
        return c.all(Place::Unknown);
    };
    let reps = c.ints("repeats").unwrap_or_default();
    let off = reps.len().saturating_sub(x.rank());
    match x.p {
        Place::Shard(d) if reps.get(d as usize + off).copied().unwrap_or(1) != 1 => {
            c.all(Place::Varying)
        }
        Place::Partial(_) => one(merge(&[x], c.out_rank(0), Lin::Add, false), 1),
        _ => moved(c, |d| Some(d + off)),
    }
}

#[cfg(test)]
mod group_tests {
    use super::*;

    /// `[b, h, s, d] -> [b*h, s, d]` with the batch over dp and the heads over tp: dp's
    /// coordinate is the major factor of the merged dim (`Shard(0)`), tp's piece sits in each
    /// of the `b` batch rows' blocks.
    #[test]
    fn merged_batch_and_heads_put_dp_major_and_tp_in_batch_blocks() {
        let got = view_by_factors(
            &[1, 2, 3, 4],
            &[2, 3, 4],
            &[2, 4, 3, 4],
            &[8, 3, 4],
            &[Some((0, 1, 2)), Some((1, 1, 2))],
        );
        assert_eq!(got, Some(vec![Some((0, 1)), Some((0, 2))]));
    }

    /// The same merge with the heads outside the batch: the order follows the factors, so tp
    /// is now major and dp's piece sits in each of the `h` head blocks.
    #[test]
    fn merged_heads_and_batch_put_tp_major() {
        let got = view_by_factors(
            &[2, 1, 3],
            &[2, 3],
            &[4, 2, 3],
            &[8, 3],
            &[Some((1, 1, 2)), Some((0, 1, 2))],
        );
        assert_eq!(got, Some(vec![Some((0, 4)), Some((0, 1))]));
    }

    /// `[4, 6] -> [8, 3]` with dim 0 over dp and dim 1 over tp: output row `2r + c / 3`, so dp
    /// holds a contiguous half and tp one row of each pair; a rank-held factor split at a
    /// cut (`[4, 6] -> [2, 2, 6]`, dim 0's local 2 split into the batch pair) keeps dp whole.
    #[test]
    fn merges_and_splits_keep_both_mesh_dims_readings() {
        let two = [Some((0, 1, 2)), Some((1, 1, 2))];
        let got = view_by_factors(&[2, 3], &[2, 3], &[4, 6], &[8, 3], &two);
        assert_eq!(got, Some(vec![Some((0, 1)), Some((0, 4))]));
        let got = view_by_factors(&[2, 3], &[1, 6], &[4, 6], &[2, 12], &two);
        assert_eq!(got, Some(vec![Some((0, 1)), Some((1, 2))]));
        // [8, 6] -> [4, 2, 6] with dim 0 (local 4) over dp: the local 4 splits into 2 x 2.
        let got = view_by_factors(&[4, 3], &[2, 2, 3], &[8, 6], &[4, 2, 6], &two);
        assert_eq!(got, Some(vec![Some((0, 1)), Some((2, 1))]));
    }

    /// Megatron's attention output `[b*h, s, d] -> [b, h, s, d]` split back, with dp major on
    /// the merged dim and tp in its `b` blocks: each mesh dim regains its own dim.
    #[test]
    fn two_mesh_dims_nested_on_one_dim_split_back() {
        let got = view_by_factors(
            &[2, 8, 8],
            &[1, 2, 8, 8],
            &[8, 8, 8],
            &[2, 4, 8, 8],
            &[Some((0, 1, 2)), Some((0, 2, 2))],
        );
        assert_eq!(got, Some(vec![Some((0, 1)), Some((1, 1))]));
        // Pieces that cross (tp's halves against dp's three blocks) have no order to read.
        let crossing = [Some((0, 3, 2)), Some((0, 1, 2))];
        assert_eq!(
            view_by_factors(&[3, 2], &[6], &[12, 2], &[24], &crossing),
            None
        );
    }

    /// DeepSeek's batch over dp and ep (two plain shards of dim 0, local size 1) merged with
    /// the sequence, and tp's kv projection of one local head: whichever order dp and ep nest
    /// in, the merge keeps it (both plain `Shard(0)` of the output), and tp shards the heads.
    #[test]
    fn plain_shards_of_one_dim_keep_their_nesting_through_a_merge() {
        let dp_ep = [Some((0, 1, 2)), None, Some((0, 1, 2))];
        assert_eq!(
            view_by_factors(&[1, 8, 16], &[8, 16], &[4, 8, 16], &[32, 16], &dp_ep),
            Some(vec![Some((0, 1)), None, Some((0, 1))])
        );
        assert_eq!(
            view_by_factors(&[1, 8], &[8], &[4, 8], &[32], &dp_ep),
            Some(vec![Some((0, 1)), None, Some((0, 1))])
        );
        let with_tp = [Some((0, 1, 2)), Some((1, 1, 2)), Some((0, 1, 2))];
        assert_eq!(
            view_by_factors(&[8, 4], &[1, 8, 1, 4], &[32, 8], &[4, 8, 2, 4], &with_tp),
            Some(vec![Some((0, 1)), Some((2, 1)), Some((0, 1))])
        );
        // A tp shard of the head dim instead (the spec's one kv head of 8): dim 3.
        assert_eq!(
            view_by_factors(&[8, 4], &[1, 8, 1, 4], &[32, 8], &[4, 8, 1, 8], &with_tp),
            Some(vec![Some((0, 1)), Some((3, 1)), Some((0, 1))])
        );
    }

    /// No reading where a cut splits a coordinate, where two plain shards of one input dim
    /// split apart (their order unknown), where the global shapes are not the local ones
    /// scaled by the shards, or where the local view cuts elsewhere than the global one.
    #[test]
    fn no_reading_where_the_factors_do_not_fit() {
        let two = [Some((0, 1, 2)), Some((1, 1, 2))];
        // A cut through dp's coordinate: [12, 2] -> [3, 8] with dp on dim 0.
        assert_eq!(
            view_by_factors(&[6, 1], &[3, 2], &[12, 2], &[3, 8], &two),
            None
        );
        // Two plain shards of dim 0 split apart: the order they nest in decides which output
        // dim each shards (`[4, 3] -> [2, 2, 3]`), and it is not recorded.
        let both_on_0 = [Some((0, 1, 2)), Some((0, 1, 2))];
        assert_eq!(
            view_by_factors(&[1, 3], &[1, 1, 3], &[4, 3], &[2, 2, 3], &both_on_0),
            None
        );
        // The global input is not the local one scaled (dim 1 not sharded globally).
        assert_eq!(
            view_by_factors(&[1, 2, 3], &[2, 3], &[2, 2, 3], &[8, 3], &two),
            None
        );
        // The local view cuts elsewhere: [1, 2, 3] -> [3, 2] against [2, 4, 3] -> [8, 3].
        assert_eq!(
            view_by_factors(&[1, 2, 3], &[3, 2], &[2, 4, 3], &[8, 3], &two),
            None
        );
    }

    /// Megatron's kv projection `[b*s, h*d] -> [b, s, h, d]` with the batch sharded over dp
    /// and the heads over tp (one local head): each mesh dim's shard lands on its own output
    /// dim, which the spec's shapes name.
    #[test]
    fn a_view_of_a_tensor_sharded_over_two_mesh_dims_is_settled_group_by_group() {
        let (ins, outs) = ([8, 4], [1, 8, 1, 4]);
        let (gin, gout) = ([16, 8], [2, 8, 2, 4]);
        assert_eq!(
            view_blocks_in_group(&ins, &outs, 1, 1, &gin, &gout, 2, &[0], false),
            Some((2, 1))
        );
        assert_eq!(
            view_blocks_in_group(&ins, &outs, 0, 1, &gin, &gout, 2, &[1], false),
            Some((0, 1))
        );
        // A view merging the two sharded dims into one group: no claim.
        assert_eq!(
            view_blocks_in_group(&[2, 4], &[8], 1, 1, &[4, 8], &[32], 2, &[0], false),
            None
        );
        // A microbatch's rows (llama3-70b-tiny's `[b*s, h] -> [b, s, heads, d]`, one sequence
        // per rank, two microbatches of the dp shard): the spec's batch is 4 = 2 x 2 pieces.
        // Rows of a selection take the spec's dim as a multiple of the pieces; a plain
        // shard does not (the spec's node would not be this view of it).
        let (ins, outs, gin, gout) = ([8, 32], [1, 8, 8, 4], [32, 64], [4, 8, 16, 4]);
        assert_eq!(
            view_blocks_in_group(&ins, &outs, 0, 1, &gin, &gout, 2, &[1], true),
            Some((0, 1))
        );
        assert_eq!(
            view_blocks_in_group(&ins, &outs, 0, 1, &gin, &gout, 2, &[1], false),
            None
        );
        // The attention's `[b, h, s, d] -> [b*h, s, d]` merge of a microbatch (llama3-70b-tiny:
        // one row per rank, dp holds rows, tp the heads; the spec's batch is 4): tp reads the
        // rank's own rows (`Shard(0)`, as the local shapes alone read it), dp the selection
        // (its two pieces outermost, tp's heads in two blocks).
        let (ins, outs) = ([1, 8, 8, 4], [8, 8, 4]);
        let (gin, gout) = ([4, 16, 8, 4], [64, 8, 4]);
        let shards = [None, Some((0, 1, 2)), Some((1, 1, 2))];
        let (fi, fo, fs) = rows_frame(&ins, &gin, &gout, &shards, 0b010, 2).unwrap();
        assert_eq!(
            (fi.as_slice(), fo.as_slice()),
            ([1, 16, 8, 4].as_slice(), [16, 8, 4].as_slice())
        );
        assert_eq!(
            view_by_factors(&ins, &outs, &fi, &fo, &fs).unwrap()[2],
            Some((0, 1))
        );
        let (fi, fo, fs) = rows_frame(&ins, &gin, &gout, &shards, 0b010, 1).unwrap();
        let placed = view_by_factors(&ins, &outs, &fi, &fo, &fs).unwrap();
        assert_eq!((placed[1], placed[2]), (Some((0, 1)), Some((0, 2))));
        // The split back, tp's heads `Shard(0)` over the rank's row: dp reads it in its frame,
        // tp's blocks counted over dp's pieces.
        let (ins, outs) = ([8, 8, 8], [1, 8, 8, 8]);
        let (gin, gout) = ([64, 8, 8], [4, 16, 8, 8]);
        let shards = [None, Some((0, 1, 2)), Some((0, 1, 2))];
        let (fi, fo, fs) = rows_frame(&ins, &gin, &gout, &shards, 0b010, 1).unwrap();
        assert_eq!(
            view_by_factors(&ins, &outs, &fi, &fo, &fs).unwrap()[1],
            Some((0, 1))
        );
        let (fi, fo, fs) = rows_frame(&ins, &gin, &gout, &shards, 0b010, 2).unwrap();
        assert_eq!(
            view_by_factors(&ins, &outs, &fi, &fo, &fs).unwrap()[2],
            Some((1, 1))
        );
        // No rows: no frame.
        assert!(rows_frame(&ins, &gin, &gout, &shards, 0, 2).is_none());
        // The output dim must grow as the input's did.
        assert_eq!(
            view_blocks_in_group(&ins, &outs, 0, 1, &gin, &[2, 16, 16, 4], 2, &[1], true),
            None
        );
    }
}
