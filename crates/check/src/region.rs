//! The replicated operands of a partial or sharded region: what the output comparison reads
//! through a collective whose input is not replicated (issue 44, soundness).
//!
//! A collective over mesh dim `m` whose input is a partial (or a shard) gives every member the
//! same result, so the comparison of two ranks' outputs took it as one shared leaf. But the
//! result is the spec's tensor only where the pieces are pieces of one tensor: every value the
//! rules call replicated that enters the region (a factor `h` of `h * p`, a row `h` of
//! `s * h`) must be the same tensor on every member. The rules take a value as replicated
//! where a peer's node of the same name, operator and input names agrees, and a peer with no
//! such node as "not varying", so a value a peer computes otherwise (another operator, another
//! name) is `Replicate()` for them. The comparison goes on into those operands, never into the
//! pieces themselves: pieces legitimately differ (a Megatron rank adds a replicated norm term
//! to its partial alone).

use crate::engine::RankPlacements;
use crate::place::{Place, Red};
use shardproof_ir::{Graph, NodeKind, ValueId};

/// The replicated operands entering a region (see [`operands`]), by how the region's pieces
/// count them.
#[derive(Default)]
pub struct Operands {
    /// Replicated operands every member must hold alike (a factor `h` of `h * p`).
    pub factors: Vec<usize>,
    /// Replicated terms added to a `Partial(sum)`: counted once in the sum where one member
    /// adds the term alone, or where every member adds its share `b / n` (`scaled`).
    pub terms: Vec<usize>,
    /// Replicated terms added to a `Partial(avg)` (`mean(x_r) + a`): the average counts a term
    /// once only where every member adds the same one.
    pub every_member: Vec<usize>,
}

/// The replicated operands entering the region that ends at value `start` of `g` (a value that
/// is not `Replicate()` on mesh dim `m`): the nodes whose outputs the region reads and the
/// rules call replicated on `m`. A term is the replicated operand of an `add`/`sub` whose
/// output and other operand are partial on `m` (the rule judged that sum,
/// `Exempt::PartialPlusReplicate`): a term of a `Partial(sum)` the ranks may add alone, one of
/// any other partial every member must add. Every other replicated operand is a factor, which
/// every member must hold alike. The region is every value reached backwards from `start`
/// through values not replicated on `m`; graph inputs end it.
pub fn operands(g: &Graph, rp: &RankPlacements, nd: usize, m: usize, start: ValueId) -> Operands {
    let mut found = Operands::default();
    let mut seen = vec![false; g.nodes.len()];
    let mut stack = vec![start.node];
    seen[start.node] = true;
    while let Some(i) = stack.pop() {
        let node = &g.nodes[i];
        let NodeKind::Call { op, .. } = &node.kind else {
            continue;
        };
        let inputs = node.inputs();
        let out = rp.of(ValueId::new(i, 0), nd)[m];
        let additive =
            matches!(op.name.as_str(), "add" | "sub" | "add_" | "sub_") && out.is_partial();
        for (k, &u) in inputs.iter().enumerate() {
            if rp.of(u, nd)[m] != Place::Replicate {
                if !seen[u.node] {
                    seen[u.node] = true;
                    stack.push(u.node);
                }
                continue;
            }
            let term = additive
                && inputs
                    .iter()
                    .enumerate()
                    .any(|(o, &w)| o != k && rp.of(w, nd)[m].is_partial());
            let list = match (term, out) {
                (false, _) => &mut found.factors,
                (true, Place::Partial(red)) if red != Red::Sum => &mut found.every_member,
                (true, _) => &mut found.terms,
            };
            if !list.contains(&u.node) {
                list.push(u.node);
            }
        }
    }
    found
}

/// Per rank, peer and mesh dim: the pairs of collectives (rank node, peer node) whose
/// regions' replicated operands were found alike, and those found otherwise.
#[derive(Default)]
pub struct Regions {
    /// Found alike (after a whole comparison passed).
    pub ok: std::collections::BTreeSet<(usize, usize)>,
    /// Found otherwise.
    pub bad: std::collections::BTreeSet<(usize, usize)>,
}
