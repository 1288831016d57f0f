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

/// One process group's member set per rank, looked up in constant time:
/// [`ProcessGroup::group_of`] searches the sets, which made a pass over thousands of ranks
/// quadratic (issue 45: 12.6% of the 405b plan phase). Answers exactly as `group_of` does.
#[derive(Clone, Debug)]
pub struct MemberIndex<'g> {
    group: &'g ProcessGroup,
    /// Per rank below the count indexed: the position of the first member set that holds it,
    /// `NOT_A_MEMBER` if none.
    set_of: Vec<usize>,
}

/// [`MemberIndex::set_of`]'s mark for a rank no member set holds.
const NOT_A_MEMBER: usize = usize::MAX;

impl ProcessGroup {
    /// This group's sets indexed by rank for ranks below `ranks` (others are searched):
    /// linear in the members and `ranks`.
    pub fn index(&self, ranks: usize) -> MemberIndex<'_> {
        let mut set_of = vec![NOT_A_MEMBER; ranks];
        for (i, set) in self.members.iter().enumerate() {
            for &r in set {
                // The first set holding a rank answers, as `find` does (a case may list a
                // rank twice).
                if let Some(slot) = set_of.get_mut(r).filter(|s| **s == NOT_A_MEMBER) {
                    *slot = i;
                }
            }
        }
        MemberIndex {
            group: self,
            set_of,
        }
    }
}

impl<'g> MemberIndex<'g> {
    /// The set of ranks that communicates with `rank` in the group, as
    /// [`ProcessGroup::group_of`].
    pub fn group_of(&self, rank: usize) -> Option<&'g [usize]> {
        match self.set_of.get(rank) {
            Some(&NOT_A_MEMBER) => None,
            Some(&i) => Some(self.group.members[i].as_slice()),
            // A rank past those indexed: search.
            None => self.group.group_of(rank),
        }
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
    fn the_index_answers_as_the_search() {
        use crate::Graph;
        let graph = Arc::new(Graph::default());
        let group = |name: &str, members: Vec<Vec<usize>>| ProcessGroup {
            name: name.into(),
            members,
        };
        let program = Program {
            mesh: Mesh::new(vec![("dp".into(), 2), ("tp".into(), 3)]),
            groups: vec![
                group("tp", vec![vec![0, 1, 2], vec![3, 4, 5]]),
                // A rank listed twice answers with its first set; rank 5 is in none; rank 9 is
                // past the program's ranks.
                group("odd", vec![vec![4, 0], vec![0, 1, 9], vec![2, 3]]),
                // A second group of one name is never read, as `Program::group` reads none.
                group("tp", vec![vec![0, 1, 2, 3, 4, 5]]),
                group("empty", vec![]),
            ],
            ranks: vec![graph; 6],
        };
        let indexes: Vec<MemberIndex> = program
            .groups
            .iter()
            .map(|g| g.index(program.ranks.len()))
            .collect();
        // The program's group of a name, as `Program::group` finds it, looked up in its index.
        let indexed = |name: &str, rank: usize| {
            let position = program.groups.iter().position(|g| g.name == name)?;
            Some(indexes[position].group_of(rank))
        };
        for name in ["tp", "odd", "empty", "undeclared"] {
            for rank in 0..12 {
                let searched = program.group(name).map(|g| g.group_of(rank));
                assert_eq!(indexed(name, rank), searched, "{name} {rank}");
            }
        }
        assert_eq!(indexed("odd", 0), Some(Some(&[4, 0][..])));
        assert_eq!(indexed("odd", 9), Some(Some(&[0, 1, 9][..])));
        assert_eq!(indexed("odd", 5), Some(None));
        assert_eq!(indexed("undeclared", 0), None);
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
