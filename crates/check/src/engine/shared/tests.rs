//! Hash matches are confirmed on the structure: a 64-bit collision cannot be built in a test,
//! so these hand the comparisons colliding hash tables and check that the structure decides.

use super::*;
use crate::plan::parse_plan;
use std::path::Path;

/// The two stages' graphs of a `pp=2` plan whose stages run `first` and `second`.
fn stages(first: &str, second: &str) -> (Graph, Graph) {
    let text = format!(
        "mesh pp=2\ninput w: f32[4, 8]\non pp=0 {{\n{first}}}\non pp=1 {{\n{second}}}\noutput y pp=Replicate()\n"
    );
    let case = parse_plan(Path::new("hashes.plan"), &text).unwrap_or_else(|e| panic!("{e}"));
    let g = |r: usize| (*case.program.ranks[r]).clone();
    (g(0), g(1))
}

fn node(g: &Graph, name: &str) -> usize {
    g.nodes
        .iter()
        .position(|n| n.name == name)
        .unwrap_or_else(|| panic!("no node {name}"))
}

fn structure(g: &Graph) -> Vec<u64> {
    structure_hashes(g, &literal_hashes(g))
}

#[test]
fn colliding_structure_hashes_do_not_make_different_stage_values_alike() {
    // Different literals, then different operators deeper down: different tensors.
    for (a, b) in [
        ("y = mul(w, 2.0)\n", "y = mul(w, 3.0)\n"),
        (
            "t = relu(w)\ny = mul(t, 2.0)\n",
            "t = neg(w)\ny = mul(t, 2.0)\n",
        ),
    ] {
        let (g, h) = stages(a, b);
        let (sa, sb) = (structure(&g), structure(&h));
        let (i, j) = (node(&g, "y"), node(&h, "y"));
        assert_ne!(sa[i], sb[j]);
        // A collision: every node of the second stage hashes as its namesake in the first.
        let collided: Vec<u64> = h
            .nodes
            .iter()
            .map(|n| {
                g.nodes
                    .iter()
                    .position(|m| m.name == n.name)
                    .map_or(0, |k| sa[k])
            })
            .collect();
        assert_eq!(sa[i], collided[j]);
        let mut memo = Default::default();
        assert!(
            !same_expression(&g, &sa, i, &h, &collided, j, &mut memo),
            "{a} vs {b}"
        );
    }
}

#[test]
fn the_same_stage_expression_is_confirmed_under_other_names() {
    let (g, h) = stages(
        "t = relu(w)\ny = mul(t, 2.0)\n",
        "u = relu(w)\nv = neg(w)\ny = mul(u, 2.0)\n",
    );
    let (sa, sb) = (structure(&g), structure(&h));
    let (i, j) = (node(&g, "y"), node(&h, "y"));
    assert_eq!(sa[i], sb[j]);
    let mut memo = Default::default();
    assert!(same_expression(&g, &sa, i, &h, &sb, j, &mut memo));
}

#[test]
fn colliding_skeletons_do_not_select_another_view() {
    let (g, h) = stages(
        "t = relu(w)\ny = view(t, [32])\n",
        "t = neg(w)\ny = view(t, [32])\n",
    );
    let (mut sg, sh) = (Skeleton::new(&g), Skeleton::new(&h));
    let (i, j) = (node(&g, "y"), node(&h, "y"));
    for d in 0..SKELETON_DEPTH {
        let mut memo = Default::default();
        // One operator deep both are views of something: the same skeleton.
        assert_eq!(
            sg.same(&g, i, &sh, &h, j, d, &mut memo),
            d == 0,
            "depth {d}"
        );
        // Forced collisions at this depth, every node with its namesake: the structure
        // still tells relu from neg.
        for (k, n) in g.nodes.iter().enumerate() {
            if let Some(q) = h.nodes.iter().position(|m| m.name == n.name) {
                sg.levels[d][k] = sh.levels[d][q];
            }
        }
        let mut memo = Default::default();
        assert_eq!(
            sg.same(&g, i, &sh, &h, j, d, &mut memo),
            d == 0,
            "depth {d}"
        );
    }
}

#[test]
fn the_same_skeleton_is_confirmed_through_communication_and_names() {
    let (g, h) = stages(
        "t = relu(w)\ny = view(t, [32])\n",
        "a = relu(w)\nb = all_reduce(a, sum, pp)\ny = view(b, [32])\n",
    );
    let (sg, sh) = (Skeleton::new(&g), Skeleton::new(&h));
    let (i, j) = (node(&g, "y"), node(&h, "y"));
    for d in 0..SKELETON_DEPTH {
        assert_eq!(sg.levels[d][i], sh.levels[d][j], "depth {d}");
        let mut memo = Default::default();
        assert!(sg.same(&g, i, &sh, &h, j, d, &mut memo), "depth {d}");
    }
}

/// `group_dims` as it was defined: the first mask, smallest first, whose groups are the
/// members (every mask tried), for the reading by varying dims to match.
fn group_dims_by_masks(mesh: &Mesh, members: &[Vec<usize>]) -> Option<Vec<usize>> {
    let n = mesh.dims.len();
    let mut sorted: Vec<Vec<usize>> = members
        .iter()
        .map(|m| {
            let mut m = m.clone();
            m.sort_unstable();
            m
        })
        .collect();
    sorted.sort();
    (0u32..(1 << n)).find_map(|mask| {
        let dims: Vec<usize> = (0..n).filter(|d| mask & (1 << d) != 0).collect();
        let mut g = mesh.groups_along(&dims);
        g.sort();
        (g == sorted).then_some(dims)
    })
}

#[test]
fn group_dims_matches_the_search_over_every_mask() {
    for sizes in [vec![2, 3, 2], vec![1, 4, 1, 2], vec![3], vec![], vec![2, 0]] {
        let mesh = Mesh::new(sizes.iter().map(|&s| (format!("d{s}"), s)).collect());
        let n = sizes.len();
        let mut cases: Vec<Vec<Vec<usize>>> = (0u32..(1 << n))
            .map(|mask| {
                let dims: Vec<usize> = (0..n).filter(|d| mask & (1 << d) != 0).collect();
                let mut groups = mesh.groups_along(&dims);
                // Listed in another order, members reversed: the same partition.
                groups.reverse();
                groups.iter_mut().for_each(|g| g.reverse());
                groups
            })
            .collect();
        // Lists that are no mesh partition: a rank moved to another group, a group left
        // out, a rank past the mesh, an empty group, no groups.
        let size = mesh.size();
        if size >= 4 {
            cases.push(vec![vec![0, 3], vec![1, 2], (4..size).collect()]);
            cases.push(vec![(1..size).collect()]);
        }
        cases.push(vec![(0..=size).collect()]);
        cases.push(vec![(0..size).collect(), vec![]]);
        cases.push(vec![]);
        for members in &cases {
            assert_eq!(
                group_dims(&mesh, members),
                group_dims_by_masks(&mesh, members),
                "{sizes:?} {members:?}"
            );
        }
    }
}

/// A spec graph of `x` `[8, 2, 4]` and the views `lines` (fx text, unindented).
fn spec_of_views(lines: &[&str]) -> Graph {
    let text = format!(
        "class GraphModule(torch.nn.Module):\n    def forward(self, x: \"f32[8, 2, 4]\"):\n{}\n        return (x,)\n",
        lines
            .iter()
            .map(|l| format!("        {l}"))
            .collect::<Vec<_>>()
            .join("\n")
    );
    shardproof_import::parse_fx(&text, Path::new("spec.py"))
        .unwrap_or_else(|e| panic!("{e}"))
        .graph
}

#[test]
fn a_view_is_found_by_its_global_input_only_where_every_fitting_one_agrees() {
    let y = "y: \"f32[2, 4, 2, 4]\" = torch.ops.aten.view.default(x, [2, 4, 2, 4])";
    let spec = spec_of_views(&[y]);
    let sv = SpecViews::new(&spec);
    let found = sv.by_global_input("view", &[8, 2, 4], &[1, 2, 2, 4]);
    assert_eq!(found, Some((&[8i64, 2, 4][..], &[2i64, 4, 2, 4][..])));
    // Another global input: no match (the placements imply the spec's input exactly).
    assert_eq!(sv.by_global_input("view", &[4, 2, 4], &[1, 2, 2, 4]), None);
    // An output that cannot hold the rank's (3 does not divide 4): no match.
    assert_eq!(sv.by_global_input("view", &[8, 2, 4], &[1, 3, 2, 4]), None);
    // Two fitting views of that input with different outputs: the reading is open.
    let z = "z: \"f32[4, 2, 2, 4]\" = torch.ops.aten.view.default(x, [4, 2, 2, 4])";
    let spec = spec_of_views(&[y, z]);
    let sv = SpecViews::new(&spec);
    assert_eq!(sv.by_global_input("view", &[8, 2, 4], &[1, 2, 2, 4]), None);
    // One of them cannot hold the rank's output: the other is the match.
    assert_eq!(
        sv.by_global_input("view", &[8, 2, 4], &[1, 4, 2, 4]),
        Some((&[8i64, 2, 4][..], &[2i64, 4, 2, 4][..]))
    );
    // Two views of the same shapes agree.
    let y2 = "y2: \"f32[2, 4, 2, 4]\" = torch.ops.aten.view.default(x, [2, 4, 2, 4])";
    let spec = spec_of_views(&[y, y2]);
    let sv = SpecViews::new(&spec);
    assert!(sv
        .by_global_input("view", &[8, 2, 4], &[1, 2, 2, 4])
        .is_some());
    // Another operator's views are not this one's.
    assert_eq!(
        sv.by_global_input("reshape", &[8, 2, 4], &[1, 2, 2, 4]),
        None
    );
}
