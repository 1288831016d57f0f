//! Laying spec tensors out onto the ranks and rebuilding spec outputs from rank outputs, by
//! the case crate's [`rank_pieces`]; generic over the element (an expression or an f64), so
//! the proof and the interpreter's confirmation of a counterexample read the same elements.

use shardproof_case::{rank_pieces, Layout, RankPiece, Reduce};
use shardproof_ir::Mesh;

/// For every element of a rank's piece (row-major in the rank's tensor), the flat index of the
/// spec element it holds.
pub fn piece_indices(piece: &RankPiece, spec_shape: &[usize]) -> Vec<usize> {
    let spec_strides = crate::tensor::strides(spec_shape);
    let local: Vec<usize> = piece.local_shape().iter().map(|&d| d as usize).collect();
    let local_strides = crate::tensor::strides(&local);
    let mut out = vec![0usize; local.iter().product()];
    let mut offset = 0usize;
    for block in &piece.blocks {
        let bshape: Vec<usize> = block.iter().map(|r| (r.end - r.start) as usize).collect();
        let n: usize = bshape.iter().product();
        let mut idx = vec![0usize; bshape.len()];
        for _ in 0..n {
            let mut src = 0;
            let mut dst = 0;
            for d in 0..bshape.len() {
                src += (block[d].start as usize + idx[d]) * spec_strides[d];
                let l = if d == piece.dim {
                    idx[d] + offset
                } else {
                    idx[d]
                };
                dst += l * local_strides[d];
            }
            out[dst] = src;
            for d in (0..bshape.len()).rev() {
                idx[d] += 1;
                if idx[d] < bshape[d] {
                    break;
                }
                idx[d] = 0;
            }
        }
        if let Some(r) = block.get(piece.dim) {
            offset += (r.end - r.start) as usize;
        }
    }
    out
}

/// One element to compare: the spec element's flat index and the rebuilt value.
pub struct Rebuilt<T> {
    /// Flat index into the spec tensor.
    pub spec_index: usize,
    /// The value the ranks' outputs give it.
    pub value: T,
}

/// Why the ranks' outputs do not fit an expected placement.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Misfit(pub String);

/// Rebuilds spec elements from the ranks' outputs laid out by `layout`: every rank that holds
/// a piece contributes its elements (a partial piece once per group, its members combined).
/// `fetch(rank, local_index)` reads a rank's element (`None`: the rank has no such tensor);
/// `local_shape(rank)` its shape; `combine` reduces a group's shares.
#[allow(clippy::too_many_arguments)]
pub fn rebuild<T: Clone>(
    layout: &Layout,
    spec_shape: &[usize],
    mesh: &Mesh,
    holders: &[usize],
    local_shape: &dyn Fn(usize) -> Option<Vec<usize>>,
    fetch: &mut dyn FnMut(usize, usize) -> T,
    combine: &mut dyn FnMut(Reduce, Vec<T>) -> Result<T, String>,
) -> Result<Vec<Rebuilt<T>>, Misfit> {
    let shape_i64: Vec<i64> = spec_shape.iter().map(|&d| d as i64).collect();
    let mut out = Vec::new();
    for &r in holders {
        let piece = rank_pieces(layout, &shape_i64, mesh, r).map_err(|e| Misfit(e.message))?;
        let want: Vec<usize> = piece.local_shape().iter().map(|&d| d as usize).collect();
        let members: Vec<usize> = match &piece.partial {
            Some(share) if share.index != 0 => continue,
            Some(share) => share.group.clone(),
            None => vec![r],
        };
        for &m in &members {
            match local_shape(m) {
                Some(s) if s == want => {}
                Some(s) => {
                    return Err(Misfit(format!(
                        "rank {m} holds shape {s:?}, the placement {layout} expects {want:?}"
                    )))
                }
                None => return Err(Misfit(format!("rank {m} did not compute the tensor"))),
            }
        }
        let indices = piece_indices(&piece, spec_shape);
        for (local, &spec_index) in indices.iter().enumerate() {
            let value = match &piece.partial {
                Some(share) => {
                    let shares = members.iter().map(|&m| fetch(m, local)).collect();
                    combine(share.reduce, shares).map_err(Misfit)?
                }
                None => fetch(r, local),
            };
            out.push(Rebuilt { spec_index, value });
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use shardproof_case::{Blocks, PlacedLayout, Placement};

    #[test]
    fn shards_and_partials_rebuild_the_spec_tensor() {
        let mesh = Mesh::new(vec![("tp".into(), 2)]);
        let layout = |p| {
            Layout::Placed(PlacedLayout {
                placements: vec![p],
                blocks: Blocks::NONE,
                at: Vec::new(),
            })
        };
        // A [2, 4] tensor sharded on dim 1: rank 1 holds columns 2..4.
        let spec: Vec<i64> = (0..8).collect();
        let ranks = [vec![0i64, 1, 4, 5], vec![2, 3, 6, 7]];
        let got = rebuild(
            &layout(Placement::Shard(1)),
            &[2, 4],
            &mesh,
            &[0, 1],
            &|_| Some(vec![2, 2]),
            &mut |r, i| ranks[r][i],
            &mut |_, _| Err("no partials".into()),
        )
        .unwrap();
        for g in &got {
            assert_eq!(spec[g.spec_index], g.value);
        }
        assert_eq!(got.len(), 8);
        // Partial: the two ranks' shares sum to the value, rebuilt once.
        let shares = [vec![1i64, 2], vec![10, 20]];
        let got = rebuild(
            &layout(Placement::Partial(Reduce::Sum)),
            &[2],
            &mesh,
            &[0, 1],
            &|_| Some(vec![2]),
            &mut |r, i| shares[r][i],
            &mut |_, xs| Ok(xs.iter().sum()),
        )
        .unwrap();
        assert_eq!(got.len(), 2);
        assert_eq!((got[1].spec_index, got[1].value), (1, 22));
        // A wrong shape is a misfit, not a panic.
        let bad = rebuild(
            &layout(Placement::Shard(0)),
            &[4],
            &mesh,
            &[0, 1],
            &|_| Some(vec![4]),
            &mut |_, _| 0i64,
            &mut |_, _| Ok(0),
        );
        assert!(bad.is_err());
    }
}
