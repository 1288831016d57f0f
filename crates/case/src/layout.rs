//! Resolved layouts of spec tensors across the mesh, and the piece of a tensor each rank holds.

use crate::expr::Expr;
use crate::placement::{Placement, Reduce};
use shardproof_ir::Mesh;
use std::fmt;
use std::ops::Range;

/// More fused blocks than any real layout has; the bound keeps `blocks: N` from allocating N.
const MAX_BLOCKS: usize = 1 << 16;

/// How one spec tensor relates to the ranks' tensors.
#[derive(Clone, Debug, PartialEq)]
pub enum Layout {
    /// One placement per mesh dim (DTensor semantics), possibly with fused blocks.
    Placed(PlacedLayout),
    /// The spec tensor is this clean expression over rank tensors.
    Expr(Expr),
}

/// Placements per mesh dim, in mesh order, plus how the sharded dim is divided into blocks.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PlacedLayout {
    /// One placement per mesh dim, in mesh order.
    pub placements: Vec<Placement>,
    /// The blocks of the sharded tensor dim (one block, not replicated, when the case says
    /// nothing about blocks or replicas).
    pub blocks: Blocks,
    /// Where the tensor lives (`at:`, an extension): the ranks at these coordinates of these
    /// mesh dims hold it, other ranks hold nothing. Empty: every rank holds a piece. The
    /// placement on such a dim is `Replicate()`: the holders along it hold the same piece.
    pub at: Vec<Held>,
}

/// The coordinates along one mesh dim whose ranks hold a tensor restricted by `at:`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Held {
    /// The mesh dim's index, in mesh order.
    pub dim: usize,
    /// The mesh dim's name.
    pub name: String,
    /// The coordinates along it that hold the tensor, as written.
    pub coords: Vec<usize>,
}

/// How the sharded dim of a tensor is made of fused blocks, each laid out on its own.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Blocks {
    /// `count` blocks of equal size (`blocks: 2`; one block when nothing is fused), each piece
    /// held by `replicas` consecutive shards.
    Equal {
        /// Number of blocks.
        count: usize,
        /// Shards holding the same piece (`replicas:`); 1 normally.
        replicas: usize,
    },
    /// Blocks of the given sizes, in order along the dim (`blocks: [1536, 256, 256]`).
    Sizes(Vec<Block>),
}

/// One fused block of explicit size.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Block {
    /// Its size along the sharded dim, in the spec tensor.
    pub size: i64,
    /// Shards holding the same piece of this block.
    pub replicas: usize,
}

impl Blocks {
    /// No fusion and no replication.
    pub const NONE: Blocks = Blocks::Equal {
        count: 1,
        replicas: 1,
    };

    /// True unless the layout fuses blocks or replicates pieces.
    pub fn is_trivial(&self) -> bool {
        *self == Blocks::NONE
    }

    /// Every replicas factor used.
    pub(crate) fn replicas(&self) -> Vec<usize> {
        match self {
            Blocks::Equal { replicas, .. } => vec![*replicas],
            Blocks::Sizes(b) => b.iter().map(|b| b.replicas).collect(),
        }
    }

    /// Concrete blocks for a dim of size `n`.
    fn concrete(&self, n: i64) -> Result<Vec<Block>, String> {
        match self {
            Blocks::Equal { count, replicas } => {
                let c = i64::try_from(*count).unwrap_or(i64::MAX).max(1);
                if n % c != 0 {
                    return Err(format!(
                        "dim size {n} is not divisible into {count} equal blocks"
                    ));
                }
                Ok(vec![
                    Block {
                        size: n / c,
                        replicas: *replicas,
                    };
                    *count
                ])
            }
            Blocks::Sizes(b) => {
                let total = b
                    .iter()
                    .try_fold(0i64, |acc, b| acc.checked_add(b.size))
                    .unwrap_or(i64::MAX);
                if total != n {
                    let sizes: Vec<String> = b.iter().map(|b| b.size.to_string()).collect();
                    return Err(format!(
                        "the blocks add up to {total} ({}), not to the dim size {n}",
                        sizes.join(" + ")
                    ));
                }
                Ok(b.clone())
            }
        }
    }
}

impl PlacedLayout {
    /// The tensor dims sharded by some mesh dim, in increasing order, without repeats.
    pub fn shard_dims(&self) -> Vec<usize> {
        let mut d: Vec<usize> = self
            .placements
            .iter()
            .filter_map(|p| match p {
                Placement::Shard(d) => Some(*d),
                _ => None,
            })
            .collect();
        d.sort_unstable();
        d.dedup();
        d
    }

    /// The reduction of the partial placements, if any (resolution ensures they agree).
    pub fn partial(&self) -> Option<Reduce> {
        self.placements.iter().find_map(|p| match p {
            Placement::Partial(r) => Some(*r),
            _ => None,
        })
    }

    /// The mesh dims (by index, in mesh order) that shard tensor dim `d`.
    pub fn mesh_dims_sharding(&self, d: usize) -> Vec<usize> {
        self.placements
            .iter()
            .enumerate()
            .filter(|(_, p)| **p == Placement::Shard(d))
            .map(|(i, _)| i)
            .collect()
    }

    /// Whether `rank` holds a piece of the tensor: every rank, unless `at` restricts the
    /// tensor to the ranks at some coordinates of some mesh dims.
    pub fn holds(&self, mesh: &Mesh, rank: usize) -> bool {
        if self.at.is_empty() {
            return true;
        }
        let coords = mesh.coords(rank);
        self.at
            .iter()
            .all(|h| coords.get(h.dim).is_some_and(|c| h.coords.contains(c)))
    }

    /// Checks what can be checked without shapes: one placement per mesh dim, partials that
    /// agree, `at` coordinates inside the mesh on dims placed `Replicate()`, and blocks /
    /// replicas only with a single sharded dim whose shard count they divide.
    pub(crate) fn check(&self, mesh: &Mesh) -> Result<(), String> {
        if self.placements.len() != mesh.dims.len() {
            return Err(format!(
                "{} placements for a {}-d mesh",
                self.placements.len(),
                mesh.dims.len()
            ));
        }
        for (i, held) in self.at.iter().enumerate() {
            let Some((name, size)) = mesh.dims.get(held.dim) else {
                return Err(format!(
                    "`at` names mesh dim {}, outside the mesh",
                    held.dim
                ));
            };
            if self.at[..i].iter().any(|h| h.dim == held.dim) {
                return Err(format!("`at` names mesh dim `{name}` twice"));
            }
            if let Some(c) = held.coords.iter().find(|&&c| c >= *size) {
                return Err(format!(
                    "`at` holds the tensor at {name} = {c}, but mesh dim `{name}` has size \
                     {size} (coordinates 0 to {})",
                    size - 1
                ));
            }
            if held.coords.is_empty() {
                return Err(format!("`at` gives no coordinate of mesh dim `{name}`"));
            }
            if self.placements[held.dim] != Placement::Replicate {
                return Err(format!(
                    "mesh dim `{name}` is named by `at`, so its placement must be Replicate() \
                     (the ranks `at` selects along it hold the same piece), not {}",
                    self.placements[held.dim]
                ));
            }
        }
        let reduces: Vec<Reduce> = self
            .placements
            .iter()
            .filter_map(|p| match p {
                Placement::Partial(r) => Some(*r),
                _ => None,
            })
            .collect();
        if reduces.windows(2).any(|w| w[0] != w[1]) {
            return Err(
                "partial placements on different mesh dims use different reductions; \
                        their combination has no single meaning"
                    .into(),
            );
        }
        if self.blocks.is_trivial() {
            return Ok(());
        }
        let dims = self.shard_dims();
        let [d] = dims.as_slice() else {
            return Err(if dims.is_empty() {
                "`blocks` and `replicas` describe how a sharded dim is split, but no placement \
                 is `Shard`"
                    .into()
            } else {
                "`blocks` and `replicas` need every `Shard` placement to shard the same tensor \
                 dim"
                .into()
            });
        };
        let shards = shard_count(self, mesh, *d);
        for r in self.blocks.replicas() {
            if r == 0 || !shards.is_multiple_of(r) {
                return Err(format!(
                    "replicas: {r} does not divide the {shards} shards of dim {d}"
                ));
            }
        }
        if let Blocks::Equal { count, .. } = self.blocks {
            if count == 0 || count > MAX_BLOCKS {
                return Err(format!("`blocks` must be between 1 and {MAX_BLOCKS}"));
            }
        }
        if let Blocks::Sizes(b) = &self.blocks {
            if b.is_empty() || b.iter().any(|b| b.size <= 0) {
                return Err("block sizes must be positive".into());
            }
        }
        Ok(())
    }
}

fn shard_count(l: &PlacedLayout, mesh: &Mesh, d: usize) -> usize {
    l.mesh_dims_sharding(d)
        .iter()
        .map(|&i| mesh.dims[i].1)
        .product()
}

/// The row-major index of `coords` restricted to the mesh dims `dims`.
fn sub_index(mesh: &Mesh, coords: &[usize], dims: &[usize]) -> usize {
    dims.iter()
        .fold(0, |acc, &i| acc * mesh.dims[i].1 + coords[i])
}

impl fmt::Display for PlacedLayout {
    /// `Shard(0)` on a 1-d mesh, `[Shard(0), Replicate()]` on an N-d one, plus blocks.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let [p] = self.placements.as_slice() {
            write!(f, "{p}")?;
        } else {
            let ps: Vec<String> = self.placements.iter().map(Placement::to_string).collect();
            write!(f, "[{}]", ps.join(", "))?;
        }
        match &self.blocks {
            Blocks::Equal {
                count: 1,
                replicas: 1,
            } => Ok(()),
            Blocks::Equal { count: 1, replicas } => write!(f, " with replicas {replicas}"),
            Blocks::Equal { count, replicas: 1 } => write!(f, " with {count} blocks"),
            Blocks::Equal { count, replicas } => {
                write!(f, " with {count} blocks, replicas {replicas}")
            }
            Blocks::Sizes(b) => {
                let s: Vec<String> = b
                    .iter()
                    .map(|b| match b.replicas {
                        1 => b.size.to_string(),
                        r => format!("{}x{r}", b.size),
                    })
                    .collect();
                write!(f, " with blocks [{}]", s.join(", "))
            }
        }?;
        if !self.at.is_empty() {
            let dims: Vec<String> = self.at.iter().map(Held::to_string).collect();
            write!(f, " at {}", dims.join(", "))?;
        }
        Ok(())
    }
}

impl fmt::Display for Held {
    /// `pp = 0`, or `pp in [0, 1]`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.coords.as_slice() {
            [one] => write!(f, "{} = {one}", self.name),
            many => write!(f, "{} in {many:?}", self.name),
        }
    }
}

impl fmt::Display for Layout {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Layout::Placed(p) => write!(f, "{p}"),
            Layout::Expr(e) => write!(f, "expr {e}"),
        }
    }
}

/// The share a rank holds of a partial tensor.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PartialShare {
    /// How the shares combine.
    pub reduce: Reduce,
    /// This rank's position among the contributors (an index into `group`).
    pub index: usize,
    /// The ranks whose shares combine into the value, `group[index]` being this rank.
    pub group: Vec<usize>,
}

/// What a rank holds of a spec tensor: blocks of the spec tensor (each a range per spec dim),
/// concatenated along `dim` in the rank's tensor; possibly only a partial share of them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RankPiece {
    /// Per block, the range of the spec tensor it covers in every dim, in the order the rank's
    /// tensor holds them.
    pub blocks: Vec<Vec<Range<i64>>>,
    /// The dim the blocks are concatenated along (meaningful only with several blocks).
    pub dim: usize,
    /// `Some` when the rank holds a share of the values, not the values themselves.
    pub partial: Option<PartialShare>,
}

impl RankPiece {
    /// The shape of the rank's tensor.
    pub fn local_shape(&self) -> Vec<i64> {
        let Some(first) = self.blocks.first() else {
            return Vec::new();
        };
        let mut shape: Vec<i64> = first.iter().map(|r| r.end - r.start).collect();
        if let Some(s) = shape.get_mut(self.dim) {
            *s = self
                .blocks
                .iter()
                .map(|b| b.get(self.dim).map_or(0, |r| r.end - r.start))
                .sum();
        }
        shape
    }

    /// True when the rank holds the whole spec tensor itself (a replica).
    pub fn is_full(&self, spec_shape: &[i64]) -> bool {
        self.partial.is_none()
            && self.blocks.len() == 1
            && self.blocks[0]
                .iter()
                .zip(spec_shape)
                .all(|(r, &n)| r.start == 0 && r.end == n)
    }
}

/// Why a layout cannot be applied to a shape and mesh.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LayoutError {
    /// What does not fit.
    pub message: String,
}

impl fmt::Display for LayoutError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for LayoutError {}

fn lerr(m: impl Into<String>) -> LayoutError {
    LayoutError { message: m.into() }
}

/// What `rank` holds of a spec tensor of shape `spec_shape` laid out by `layout` on `mesh`.
///
/// Semantics (DTensor's, extended by blocks and replicas): placements apply in mesh order; a
/// tensor dim sharded by several mesh dims is split into the product of their sizes, the earlier
/// mesh dim major. With blocks, each block of the sharded dim is split on its own and the rank
/// holds its piece of every block, in block order. With `replicas: k`, a block is split into
/// `shards / k` pieces and shard `s` holds piece `s / k`. Partial placements make the rank hold a
/// share: the shares of the ranks that differ only in the partial mesh dims combine into the
/// value.
pub fn rank_pieces(
    layout: &Layout,
    spec_shape: &[i64],
    mesh: &Mesh,
    rank: usize,
) -> Result<RankPiece, LayoutError> {
    let l = match layout {
        Layout::Placed(l) => l,
        Layout::Expr(_) => {
            return Err(lerr(
                "an `expr:` layout names rank tensors itself; it has no per-rank piece",
            ))
        }
    };
    l.check(mesh).map_err(lerr)?;
    if rank >= mesh.size() {
        return Err(lerr(format!(
            "rank {rank} is outside the mesh of {} ranks",
            mesh.size()
        )));
    }
    if !l.holds(mesh, rank) {
        return Err(lerr(format!(
            "rank {rank} holds no piece of a tensor laid out {l}"
        )));
    }
    let ndim = spec_shape.len();
    for &d in &l.shard_dims() {
        if d >= ndim {
            return Err(lerr(format!(
                "Shard({d}) is out of range for a tensor with {ndim} dims"
            )));
        }
    }
    let coords = mesh.coords(rank);
    let blocked = (!l.blocks.is_trivial()).then(|| l.shard_dims()[0]);
    let mut per_dim: Vec<Vec<Range<i64>>> = Vec::with_capacity(ndim);
    for (d, &n) in spec_shape.iter().enumerate() {
        let sharding = l.mesh_dims_sharding(d);
        let shards = sharding.iter().map(|&i| mesh.dims[i].1).product::<usize>();
        let s = sub_index(mesh, &coords, &sharding);
        let blocks = if blocked == Some(d) {
            l.blocks.concrete(n).map_err(lerr)?
        } else {
            vec![Block {
                size: n,
                replicas: 1,
            }]
        };
        let mut ranges = Vec::with_capacity(blocks.len());
        let mut offset = 0i64;
        for b in &blocks {
            let pieces = shards / b.replicas.max(1);
            let p = i64::try_from(pieces).map_err(|_| lerr("too many shards"))?;
            if p == 0 || b.size % p != 0 {
                return Err(lerr(if blocks.len() == 1 {
                    format!(
                        "dim {d} of size {} is not divisible into {pieces} pieces",
                        b.size
                    )
                } else {
                    format!(
                        "a block of size {} of dim {d} is not divisible into {pieces} pieces",
                        b.size
                    )
                }));
            }
            let local = b.size / p;
            let piece = i64::try_from(s / b.replicas.max(1)).unwrap_or(0);
            let start = offset + piece * local;
            ranges.push(start..start + local);
            offset += b.size;
        }
        per_dim.push(ranges);
    }
    let dim = blocked.unwrap_or(0);
    let count = per_dim.get(dim).map_or(1, Vec::len);
    let blocks = (0..count)
        .map(|b| {
            per_dim
                .iter()
                .enumerate()
                .map(|(d, r)| if d == dim { r[b].clone() } else { r[0].clone() })
                .collect()
        })
        .collect();
    let partial = l.partial().map(|reduce| {
        let dims: Vec<usize> = l
            .placements
            .iter()
            .enumerate()
            .filter(|(_, p)| matches!(p, Placement::Partial(_)))
            .map(|(i, _)| i)
            .collect();
        // Enumerated directly (not via `groups_along`, which scans every rank per group): this
        // runs once per rank and tensor in the interpreter.
        let count: usize = dims.iter().map(|&i| mesh.dims[i].1).product();
        let group = (0..count)
            .map(|mut k| {
                let mut c = coords.clone();
                for &i in dims.iter().rev() {
                    c[i] = k % mesh.dims[i].1;
                    k /= mesh.dims[i].1;
                }
                mesh.rank(&c)
            })
            .collect();
        PartialShare {
            reduce,
            index: sub_index(mesh, &coords, &dims),
            group,
        }
    });
    Ok(RankPiece {
        blocks,
        dim,
        partial,
    })
}

/// How the expected size of dim `d` comes about, e.g. `1152 = 2304 / 2` or
/// `640 = 1536 / 4 + 256 / 2 + 256 / 2`; `None` when `d` is not split.
pub(crate) fn explain_dim(
    l: &PlacedLayout,
    spec_shape: &[i64],
    mesh: &Mesh,
    d: usize,
) -> Option<String> {
    let n = *spec_shape.get(d)?;
    let shards = shard_count(l, mesh, d);
    let sharded = !l.mesh_dims_sharding(d).is_empty();
    if !sharded {
        return None;
    }
    let blocked = !l.blocks.is_trivial() && l.shard_dims().first() == Some(&d);
    let blocks = if blocked {
        l.blocks.concrete(n).ok()?
    } else {
        vec![Block {
            size: n,
            replicas: 1,
        }]
    };
    let mut total = 0i64;
    let mut terms = Vec::new();
    for b in &blocks {
        let pieces = shards / b.replicas.max(1);
        let p = i64::try_from(pieces).ok()?.max(1);
        total += b.size / p;
        terms.push(if pieces == 1 {
            b.size.to_string()
        } else {
            format!("{} / {pieces}", b.size)
        });
    }
    Some(format!("{total} = {}", terms.join(" + ")))
}

/// Every simple layout of a tensor of `rank` dims on a mesh of `mesh_dims` dims — each mesh
/// dim `Replicate()`, `Shard(d)` or `Partial()`, the all-Replicate layout first — at most
/// `limit` of them: the layouts an output the case sets no expectation on is tried in.
///
/// ```
/// use shardproof_case::simple_layouts;
/// let layouts = simple_layouts(1, 2, 100);
/// let shown: Vec<String> = layouts.iter().map(|l| l.to_string()).collect();
/// assert_eq!(shown, ["Replicate()", "Shard(0)", "Shard(1)", "Partial()"]);
/// ```
pub fn simple_layouts(mesh_dims: usize, rank: usize, limit: usize) -> Vec<Layout> {
    let mut options = vec![Placement::Replicate];
    options.extend((0..rank).map(Placement::Shard));
    options.push(Placement::Partial(Reduce::Sum));
    let mut out: Vec<Vec<Placement>> = vec![Vec::new()];
    for _ in 0..mesh_dims {
        out = out
            .into_iter()
            .flat_map(|prefix| {
                options.iter().map(move |p| {
                    let mut v = prefix.clone();
                    v.push(*p);
                    v
                })
            })
            .take(limit)
            .collect();
    }
    out.into_iter()
        .map(|placements| {
            Layout::Placed(PlacedLayout {
                placements,
                blocks: Blocks::NONE,
                at: Vec::new(),
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mesh1(n: usize) -> Mesh {
        Mesh::new(vec![("tp".into(), n)])
    }

    fn placed(p: Vec<Placement>, blocks: Blocks) -> Layout {
        Layout::Placed(PlacedLayout {
            placements: p,
            blocks,
            at: Vec::new(),
        })
    }

    #[test]
    fn shard_and_replicate_on_a_1d_mesh() {
        let l = placed(vec![Placement::Shard(0)], Blocks::NONE);
        let p = rank_pieces(&l, &[2304, 768], &mesh1(2), 1).unwrap();
        assert_eq!(p.blocks, vec![vec![1152..2304, 0..768]]);
        assert_eq!(p.local_shape(), vec![1152, 768]);
        assert!(!p.is_full(&[2304, 768]));
        let r = placed(vec![Placement::Replicate], Blocks::NONE);
        assert!(rank_pieces(&r, &[4], &mesh1(2), 0).unwrap().is_full(&[4]));
        let bad = rank_pieces(&l, &[7, 2], &mesh1(2), 0).unwrap_err();
        assert!(bad.message.contains("not divisible"), "{bad}");
        assert!(rank_pieces(&l, &[], &mesh1(2), 0).is_err());
    }

    #[test]
    fn two_mesh_dims_sharding_one_tensor_dim_are_dp_major() {
        let m = Mesh::new(vec![("dp".into(), 2), ("tp".into(), 2)]);
        let l = placed(vec![Placement::Shard(0), Placement::Shard(0)], Blocks::NONE);
        let starts: Vec<i64> = (0..4)
            .map(|r| rank_pieces(&l, &[8], &m, r).unwrap().blocks[0][0].start)
            .collect();
        assert_eq!(starts, vec![0, 2, 4, 6]);
        let l = placed(vec![Placement::Shard(1), Placement::Shard(0)], Blocks::NONE);
        let p = rank_pieces(&l, &[4, 6], &m, 2).unwrap();
        assert_eq!(p.blocks, vec![vec![0..2, 3..6]]);
    }

    #[test]
    fn fused_blocks_with_replicas() {
        let l = placed(
            vec![Placement::Shard(0)],
            Blocks::Sizes(vec![
                Block {
                    size: 1536,
                    replicas: 1,
                },
                Block {
                    size: 256,
                    replicas: 2,
                },
                Block {
                    size: 256,
                    replicas: 2,
                },
            ]),
        );
        let p = rank_pieces(&l, &[2048, 8], &mesh1(4), 3).unwrap();
        assert_eq!(
            p.blocks,
            vec![
                vec![1152..1536, 0..8],
                vec![1664..1792, 0..8],
                vec![1920..2048, 0..8]
            ]
        );
        assert_eq!(p.local_shape(), vec![640, 8]);
        let Layout::Placed(pl) = &l else { panic!() };
        assert_eq!(
            explain_dim(pl, &[2048, 8], &mesh1(4), 0).unwrap(),
            "640 = 1536 / 4 + 256 / 2 + 256 / 2"
        );
        let eq = placed(
            vec![Placement::Shard(0)],
            Blocks::Equal {
                count: 2,
                replicas: 1,
            },
        );
        let p = rank_pieces(&eq, &[8], &mesh1(2), 1).unwrap();
        assert_eq!(p.blocks, vec![vec![2..4], vec![6..8]]);
    }

    #[test]
    fn partial_shares_name_their_group() {
        let m = Mesh::new(vec![("dp".into(), 2), ("tp".into(), 2)]);
        let l = placed(
            vec![Placement::Partial(Reduce::Sum), Placement::Shard(0)],
            Blocks::NONE,
        );
        let p = rank_pieces(&l, &[4], &m, 3).unwrap();
        assert_eq!(p.blocks, vec![vec![2..4]]);
        let share = p.partial.unwrap();
        assert_eq!((share.index, share.group), (1, vec![1, 3]));
    }

    #[test]
    fn static_checks() {
        let m = mesh1(4);
        let bad = PlacedLayout {
            placements: vec![Placement::Replicate],
            blocks: Blocks::Equal {
                count: 2,
                replicas: 1,
            },
            at: Vec::new(),
        };
        assert!(bad.check(&m).is_err());
        let bad = PlacedLayout {
            placements: vec![Placement::Shard(0)],
            blocks: Blocks::Equal {
                count: 1,
                replicas: 3,
            },
            at: Vec::new(),
        };
        assert!(bad.check(&m).unwrap_err().contains("replicas: 3"));
    }
}
