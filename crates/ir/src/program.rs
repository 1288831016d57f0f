//! Distributed programs: a device mesh, process groups and one graph per rank.

use crate::Graph;
use std::sync::Arc;

/// A named N-d device mesh; ranks are numbered row-major over the dims, as torch's DeviceMesh.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mesh {
    /// `(name, size)` per mesh dim, outermost first.
    pub dims: Vec<(String, usize)>,
}

impl Mesh {
    /// A mesh with the given dims.
    pub fn new(dims: Vec<(String, usize)>) -> Self {
        Mesh { dims }
    }

    /// Number of ranks (product of dim sizes; 1 for a mesh with no dims).
    pub fn size(&self) -> usize {
        self.dims.iter().map(|(_, s)| *s).product()
    }

    /// Position of a named dim.
    pub fn dim_index(&self, name: &str) -> Option<usize> {
        self.dims.iter().position(|(n, _)| n == name)
    }

    /// Mesh coordinates of `rank`.
    pub fn coords(&self, rank: usize) -> Vec<usize> {
        let mut rest = rank;
        let mut out = vec![0; self.dims.len()];
        for (i, (_, s)) in self.dims.iter().enumerate().rev() {
            out[i] = rest % s;
            rest /= s;
        }
        out
    }

    /// The rank at mesh coordinates `coords`.
    pub fn rank(&self, coords: &[usize]) -> usize {
        self.dims
            .iter()
            .zip(coords)
            .fold(0, |acc, ((_, s), c)| acc * s + c)
    }

    /// The groups that vary exactly the given mesh dims (by index) and fix all others: one group
    /// per combination of the other coordinates, each listing its ranks in increasing order.
    pub fn groups_along(&self, dims: &[usize]) -> Vec<Vec<usize>> {
        // The group of a rank is numbered by its other coordinates read row-major; ranks in
        // increasing order meet those numbers in increasing order (the first rank of each
        // has zeros on `dims`), so the groups come out as a scan by first member lists them.
        // Linear in the ranks: a search among the groups per rank was quadratic (issue 44:
        // 8192 ranks).
        let mut groups: Vec<Vec<usize>> = Vec::new();
        for rank in 0..self.size() {
            let (mut rest, mut key, mut scale) = (rank, 0usize, 1usize);
            for (d, (_, s)) in self.dims.iter().enumerate().rev() {
                if !dims.contains(&d) {
                    key += (rest % s) * scale;
                    scale *= s;
                }
                rest /= s;
            }
            if key == groups.len() {
                groups.push(Vec::new());
            }
            groups[key].push(rank);
        }
        groups
    }
}

/// A named process group: a partition of (some of) the ranks into communicating subsets.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProcessGroup {
    /// The name collectives use (`"12"`, `"tp"`, ...).
    pub name: String,
    /// Disjoint rank sets; a collective on rank r runs over the set containing r.
    pub members: Vec<Vec<usize>>,
}

impl ProcessGroup {
    /// The set of ranks that communicates with `rank` in this group.
    pub fn group_of(&self, rank: usize) -> Option<&[usize]> {
        self.members
            .iter()
            .find(|m| m.contains(&rank))
            .map(Vec::as_slice)
    }
}

/// A distributed program: the mesh, its process groups, and one graph per rank.
#[derive(Clone, Debug, PartialEq)]
pub struct Program {
    /// The device mesh.
    pub mesh: Mesh,
    /// Process groups by name.
    pub groups: Vec<ProcessGroup>,
    /// One graph per rank, in rank order. Ranks that run the same program (read from one
    /// file) share one graph: a preset's thousands of ranks hold a few graphs, not copies.
    pub ranks: Vec<Arc<Graph>>,
}

impl Program {
    /// A process group by name.
    pub fn group(&self, name: &str) -> Option<&ProcessGroup> {
        self.groups.iter().find(|g| g.name == name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn row_major_ranks_and_groups() {
        let m = Mesh::new(vec![("dp".into(), 2), ("tp".into(), 2)]);
        assert_eq!(m.size(), 4);
        assert_eq!(m.coords(3), vec![1, 1]);
        assert_eq!(m.rank(&[1, 0]), 2);
        assert_eq!(m.groups_along(&[1]), vec![vec![0, 1], vec![2, 3]]);
        assert_eq!(m.groups_along(&[0]), vec![vec![0, 2], vec![1, 3]]);
        assert_eq!(m.groups_along(&[0, 1]), vec![vec![0, 1, 2, 3]]);
    }

    /// The groups of a search by coordinates (the definition), for the linear scan to match.
    fn groups_by_search(m: &Mesh, dims: &[usize]) -> Vec<Vec<usize>> {
        let mut groups: Vec<(Vec<usize>, Vec<usize>)> = Vec::new();
        for rank in 0..m.size() {
            let c = m.coords(rank);
            let key: Vec<usize> = (0..c.len())
                .filter(|d| !dims.contains(d))
                .map(|d| c[d])
                .collect();
            match groups.iter_mut().find(|(k, _)| *k == key) {
                Some((_, members)) => members.push(rank),
                None => groups.push((key, vec![rank])),
            }
        }
        groups.into_iter().map(|(_, m)| m).collect()
    }

    #[test]
    fn groups_along_matches_the_search_by_coordinates() {
        let meshes = [
            vec![2, 3, 4],
            vec![1, 4, 1, 2],
            vec![3],
            vec![],
            vec![2, 0, 3],
        ];
        for sizes in meshes {
            let m = Mesh::new(sizes.iter().map(|&s| (format!("d{s}"), s)).collect());
            let n = sizes.len();
            for mask in 0u32..(1 << (n + 1)) {
                // Bit n names a dim past the mesh, which neither reading counts.
                let dims: Vec<usize> = (0..=n).filter(|d| mask & (1 << d) != 0).collect();
                assert_eq!(
                    m.groups_along(&dims),
                    groups_by_search(&m, &dims),
                    "{sizes:?} {dims:?}"
                );
            }
        }
    }
}
