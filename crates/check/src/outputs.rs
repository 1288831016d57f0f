//! The output comparison: whether two ranks compute their values of one declared output the
//! same way along a mesh dim (issue 44, soundness). The rules compare a node with its peer
//! node of the same name and operator, and take a peer with none as "not varying", so a
//! placement alone does not prove the ranks hold one tensor; `check_unfixed` asks this
//! comparison for every declared output and mesh dim where the placement matches.

use crate::engine::{self, graph_classes};
use crate::place::Place;
use crate::region;
use crate::Propagation;
use shardproof_ir::{Graph, NodeKind, Program, ValueId};
use std::collections::{BTreeSet, HashMap};

/// The state of the comparison over one case: per pair of ranks and mesh dim, the memos and
/// the collectives whose regions were found alike or otherwise, kept across outputs.
pub(crate) struct Comparison<'a> {
    program: &'a Program,
    prop: &'a Propagation,
    nd: usize,
    classes: Vec<usize>,
    // Per graph class, per node: the ordinal of the collective a `wait_tensor` waits on.
    ordinals: HashMap<usize, Vec<u32>>,
    // Per (rank, peer, mesh dim): the memo of the comparison (node and peer node literals
    // loose) and of the region operands' (literals strict).
    memos: HashMap<(usize, usize, usize), (engine::ExprMemo, engine::ExprMemo)>,
    // Per pair of graph classes: whether the graphs are equal node for node but for literal
    // arguments (names, operators, input names): every node is then its peer's peer node,
    // whose literals the rules compared.
    alike: HashMap<(usize, usize), bool>,
    // Per (rank, peer, mesh dim): the collectives whose regions were found alike and
    // otherwise.
    regions: HashMap<(usize, usize, usize), region::Regions>,
    // Per graph class: node name -> node index.
    name_maps: HashMap<usize, HashMap<String, usize>>,
}

impl<'a> Comparison<'a> {
    /// A comparison of the ranks of `program`, whose placements are `prop`.
    pub(crate) fn new(program: &'a Program, prop: &'a Propagation) -> Self {
        Comparison {
            program,
            prop,
            nd: program.mesh.dims.len(),
            classes: graph_classes(&program.ranks),
            ordinals: HashMap::new(),
            memos: HashMap::new(),
            alike: HashMap::new(),
            regions: HashMap::new(),
            name_maps: HashMap::new(),
        }
    }

    /// Whether ranks `r` and `p` compute their values `v` and `pv` of one declared output the
    /// same way along mesh dim `m`: the same graph and node, or the same expression of the
    /// same leaves (`same_expression_upto`, literals included but where a node meets its peer
    /// node, whose literals the rules read), where the result of the k-th collective of both
    /// graphs counts as a leaf, the same on both, when it is replicated over `m` on rank `r`
    /// (the collectives are matched across the ranks by order; graphs that add a replicated
    /// term on some ranks only differ below the all-reduce that sums it).
    pub(crate) fn same(&mut self, r: usize, v: ValueId, p: usize, pv: ValueId, m: usize) -> bool {
        let Comparison {
            program,
            prop,
            nd,
            classes,
            ordinals,
            memos,
            alike,
            regions,
            name_maps,
        } = self;
        let (program, prop, nd) = (*program, *prop, *nd);
        if classes[r] == classes[p] {
            return v == pv;
        }
        if v.output != pv.output {
            return false;
        }
        let (gr, gp) = (&program.ranks[r], &program.ranks[p]);
        let equal_but_literals = *alike.entry((classes[r], classes[p])).or_insert_with(|| {
            gr.nodes.len() == gp.nodes.len()
                && gr.nodes.iter().zip(&gp.nodes).all(|(a, b)| {
                    a.name == b.name
                        && match (&a.kind, &b.kind) {
                            (NodeKind::Call { op: o1, .. }, NodeKind::Call { op: o2, .. }) => {
                                o1 == o2
                            }
                            (NodeKind::Call { .. }, _) | (_, NodeKind::Call { .. }) => false,
                            (k1, k2) => k1 == k2,
                        }
                        && a.inputs() == b.inputs()
                })
        });
        if equal_but_literals {
            return v == pv;
        }
        // Per graph, per node: the ordinal of the collective a `wait_tensor` waits on.
        let group = engine::peers(&program.mesh, r, m);
        for &q in group.iter().chain([r, p].iter()) {
            ordinals.entry(classes[q]).or_insert_with(|| {
                let g = &program.ranks[q];
                let mut k = 0u32;
                let mut issued = vec![u32::MAX; g.nodes.len()];
                for (i, n) in g.nodes.iter().enumerate() {
                    if let NodeKind::Call { op, .. } = &n.kind {
                        if op.namespace == "_c10d_functional" && op.name != "wait_tensor" {
                            issued[i] = k;
                            k += 1;
                        }
                    }
                }
                g.nodes
                    .iter()
                    .map(|n| match &n.kind {
                        NodeKind::Call { op, .. } if op.name == "wait_tensor" => {
                            n.inputs().first().map_or(u32::MAX, |u| issued[u.node])
                        }
                        _ => u32::MAX,
                    })
                    .collect()
            });
        }
        let (or, op) = (&ordinals[&classes[r]], &ordinals[&classes[p]]);
        let rp = &prop.ranks[r];
        // A collective whose input is itself replicated on the rank (an all-reduce of a
        // share divided by n, legal as `scaled`) sums pieces that are the ranks' shares only
        // where every peer computes the same share: it is no leaf, and the comparison goes on
        // into its input (round 3; was: a shared leaf, so `all_reduce(h / 2)` with `h = x * 2`
        // on rank 0 and `x + 2` on rank 1 held; `run` finds `y` wrong).
        let replicated_input = |x: usize| {
            gr.nodes[x]
                .inputs()
                .first()
                .and_then(|c| gr.nodes[c.node].inputs().first().copied())
                .is_some_and(|t| rp.of(t, nd)[m] == Place::Replicate)
        };
        let collective_leaf = |x: usize, y: usize| {
            or[x] != u32::MAX
                && or[x] == op[y]
                // n times the tensor (an all-reduce sum of averages) is as alike on every
                // member as the tensor itself.
                && (rp.of(ValueId::new(x, 0), nd)[m] == Place::Replicate
                    || rp.times_n[rp.offsets[x] as usize * nd + m])
                && !replicated_input(x)
                && gr.nodes[x]
                    .inputs()
                    .first()
                    .map(|u| &gr.nodes[u.node].kind)
                    .and_then(|k| match k {
                        NodeKind::Call { op, .. } => Some(op),
                        _ => None,
                    })
                    == gp.nodes[y]
                        .inputs()
                        .first()
                        .map(|u| &gp.nodes[u.node].kind)
                        .and_then(|k| match k {
                            NodeKind::Call { op, .. } => Some(op),
                            _ => None,
                        })
        };
        // A node and its peer node (the same name, operator and input names): the rules
        // compared their literals (`varies`, the slice starts), so these may differ.
        fn names(g: &Graph, i: usize) -> Vec<&str> {
            g.nodes[i]
                .inputs()
                .iter()
                .map(|u| g.nodes[u.node].name.as_str())
                .collect()
        }
        let loose = |x: usize, y: usize| {
            gr.nodes[x].name == gp.nodes[y].name && names(gr, x) == names(gp, y)
        };
        // Per peer, not per peer class: the region checks read the peer's placements.
        let key = (r, p, m);
        let (memo, strict) = memos.entry(key).or_default();
        let region = regions.entry(key).or_default();
        let pp = &prop.ranks[p];
        let names_p = name_maps.entry(classes[p]).or_insert_with(|| {
            gp.nodes
                .iter()
                .enumerate()
                .map(|(j, n)| (n.name.clone(), j))
                .collect()
        });
        // A collective's result is a shared leaf only where the replicated operands of the
        // region its input ends (`region::operands`) are alike on both ranks: each pair met is
        // queued and checked after the comparison that met it (its checks meet more). A pair
        // found otherwise is recorded and the comparison starts again without the memo, whose
        // entries may rest on it; pairs are recorded as alike only after a whole round passed.
        loop {
            let pending = std::cell::RefCell::new(Vec::new());
            let leaf = |x: usize, y: usize| {
                if !collective_leaf(x, y) {
                    return None;
                }
                if region.bad.contains(&(x, y)) {
                    return Some(false);
                }
                if !region.ok.contains(&(x, y)) {
                    pending.borrow_mut().push((x, y));
                }
                Some(true)
            };
            let mut same = engine::same_expression_upto(
                gr, None, v.node, gp, None, pv.node, memo, &leaf, &loose,
            );
            let mut checked = BTreeSet::new();
            let mut failed = None;
            while same {
                let Some((x, y)) = pending.borrow_mut().pop() else {
                    break;
                };
                if !checked.insert((x, y)) {
                    continue;
                }
                // The collective's tensor input on each rank (`wait_tensor(collective(t))`).
                let input = |g: &Graph, w: usize| {
                    g.nodes[w]
                        .inputs()
                        .first()
                        .and_then(|c| g.nodes[c.node].inputs().first().copied())
                };
                let (Some(tx), Some(ty)) = (input(gr, x), input(gp, y)) else {
                    failed = Some((x, y));
                    break;
                };
                let ox = region::operands(gr, rp, nd, m, tx);
                let oy = region::operands(gp, pp, nd, m, ty);
                let (fx, ax, ay) = (&ox.factors, &ox.terms, &oy.terms);
                // Terms: a replicated term is counted once in the sum where one rank adds it
                // alone (Megatron's norm term), or where every member adds its share `b / n`
                // (`scaled`). Else the sum counts it another number of times (two of four
                // ranks adding `h` where the spec adds it once held before). A term of an
                // average is counted once where every member adds it. Which members add terms
                // to the pieces of this collective (matched by order):
                let adds = |q: usize, every_member: bool| {
                    let gq = &program.ranks[q];
                    let k = or[x];
                    let oq = &ordinals[&classes[q]];
                    // Not found: "adds", the answer that never makes a sum's lone term
                    // pass, and "does not add" for an average's.
                    let Some(w) = oq.iter().position(|&o| o == k) else {
                        return !every_member;
                    };
                    input(gq, w).map_or(!every_member, |t| {
                        let o = region::operands(gq, &prop.ranks[q], nd, m, t);
                        !if every_member {
                            o.every_member
                        } else {
                            o.terms
                        }
                        .is_empty()
                    })
                };
                let sum_terms_once = ax.is_empty()
                    || if ax.iter().all(|&u| {
                        (0..gr.nodes[u].outputs.len().max(1))
                            .all(|o| rp.scaled[(rp.offsets[u] as usize + o) * nd + m])
                    }) {
                        group.iter().all(|&q| q == r || adds(q, false))
                    } else {
                        group.iter().all(|&q| q == r || !adds(q, false))
                    };
                let avg_terms_once =
                    ox.every_member.is_empty() || group.iter().all(|&q| q == r || adds(q, true));
                let counted_once = sum_terms_once && avg_terms_once;
                // Two ranks adding terms must add the same one.
                let compared = fx
                    .iter()
                    .chain(if ay.is_empty() { [].iter() } else { ax.iter() })
                    .chain(ox.every_member.iter());
                let mut alike = counted_once;
                for &u in compared.filter(|_| counted_once) {
                    let Some(&j) = names_p.get(&gr.nodes[u].name) else {
                        alike = false;
                        break;
                    };
                    // Literals strict: an operand the rules call replicated is the same
                    // tensor on both ranks only with the same literals (a literal the rules'
                    // hash comparison judged alike is compared here in full).
                    if !engine::same_expression_upto(
                        gr,
                        None,
                        u,
                        gp,
                        None,
                        j,
                        strict,
                        &leaf,
                        &|_, _| false,
                    ) {
                        alike = false;
                        break;
                    }
                }
                if !alike {
                    failed = Some((x, y));
                }
                same = alike;
            }
            match failed {
                Some(pair) => {
                    region.bad.insert(pair);
                    memo.clear();
                    strict.clear();
                }
                None => {
                    if same {
                        region.ok.extend(checked);
                    }
                    return same;
                }
            }
        }
    }
}
