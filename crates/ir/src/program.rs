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
        let mut groups: Vec<(Vec<usize>, Vec<usize>)> = Vec::new();
        for rank in 0..self.size() {
            let c = self.coords(rank);
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
}
