//! Mutation sites: for each kind, where in one rank graph it applies and the edits it makes.
//! Enumeration is deterministic: nodes in file order, kinds in [`MutationKind::ALL`] order.

use crate::graph::{python_float, Arg, Edit, GraphView, Node, Slot, TensorType};
use crate::MutationKind;

/// What a site needs to know about the case beyond its graph.
pub(crate) struct SiteContext<'a> {
    /// Global ranks in the mesh (peers of send/recv range over them).
    pub world: usize,
    /// This graph's rank.
    pub rank: usize,
    /// Group names the case declares.
    pub declared_groups: &'a [String],
    /// The mesh: dim names and sizes.
    pub mesh: &'a [(String, usize)],
    /// Declared groups: name and the value text (`tp`, `[dp, tp]`, `all`, rank lists).
    pub groups: &'a [(String, String)],
}

impl SiteContext<'_> {
    /// The number of ranks in each member set of group `name` (a send's or recv's `group`:
    /// its peer is an index below that), by the case's rule: a declared group's mesh dims or
    /// rank lists; an undeclared one on a mesh of at most one dim is every rank. `None` where
    /// the text is not understood (no peer site is made then).
    fn group_size(&self, name: &str) -> Option<usize> {
        let Some((_, value)) = self.groups.iter().find(|(n, _)| n == name) else {
            return (self.mesh.len() <= 1).then_some(self.world);
        };
        let v = value.trim();
        if v == "all" {
            return Some(self.world);
        }
        if v.starts_with('[') && v[1..].trim_start().starts_with('[') {
            // Rank lists, `[[0, 1], [2, 3]]`: their common length (lists of unequal lengths
            // leave no site).
            let sizes: Vec<usize> = v
                .split('[')
                .filter_map(|l| l.split_once(']'))
                .map(|(l, _)| l.split(',').filter(|x| !x.trim().is_empty()).count())
                .collect();
            let n = *sizes.first()?;
            return sizes.iter().all(|&s| s == n).then_some(n);
        }
        v.trim_start_matches('[')
            .trim_end_matches(']')
            .split(',')
            .map(|d| {
                let d = d.trim().trim_matches(|c| c == '"' || c == '\'');
                self.mesh.iter().find(|(m, _)| m == d).map(|(_, n)| *n)
            })
            .product()
    }
}

/// One mutation of one graph, before it is rendered to text.
pub(crate) struct Site {
    pub kind: MutationKind,
    pub line: usize,
    pub description: String,
    pub edits: Vec<Edit>,
    /// Whether the same edit on every rank is a mutant worth its own run.
    pub plan_wide: bool,
}

const COLLECTIVES: &[&str] = &[
    "all_reduce",
    "all_gather_into_tensor",
    "reduce_scatter_tensor",
    "all_to_all_single",
];

pub(crate) fn is_collective(n: &Node) -> bool {
    n.namespace().starts_with("_c10d_functional") && COLLECTIVES.contains(&n.op_name())
}

fn is_wait(n: &Node) -> bool {
    n.namespace().starts_with("_c10d_functional") && n.op_name() == "wait_tensor"
}

fn is_p2p(n: &Node) -> bool {
    n.namespace() == "shardproof_p2p"
}

/// The slot naming a collective's group: `group_name=`, else the last string positional.
pub(crate) fn group_slot(n: &Node) -> Option<(Slot, String)> {
    if let Some((_, Arg::Str(g))) = n.kwargs.iter().find(|(k, _)| k == "group_name") {
        return Some((Slot::Kw("group_name".into()), g.clone()));
    }
    n.args
        .iter()
        .enumerate()
        .rev()
        .find_map(|(i, a)| a.as_str().map(|g| (Slot::Pos(i), g.to_string())))
}

pub(crate) fn enumerate(view: &GraphView, ctx: &SiteContext) -> Vec<Site> {
    let mut sites = Vec::new();
    for (i, n) in view.nodes.iter().enumerate() {
        if n.is_input || n.op.is_empty() {
            continue;
        }
        let mut here: Vec<Site> = Vec::new();
        delete_collective(view, i, n, &mut here);
        drop_wait(i, n, &mut here);
        rename_group(i, n, ctx, &mut here);
        wrong_reduce_op(i, n, &mut here);
        swap_peers(view, i, n, ctx, &mut here);
        change_literal(i, n, &mut here);
        swap_operands(i, n, &mut here);
        move_slice(view, i, n, &mut here);
        change_dim(view, i, n, &mut here);
        transpose_weight(view, i, n, &mut here);
        wrong_scale(i, n, &mut here);
        skip_unary(i, n, &mut here);
        sites.extend(here);
    }
    sites.sort_by_key(|s| (s.kind as usize, s.line));
    sites
}

fn site(kind: MutationKind, n: &Node, description: String, edits: Vec<Edit>) -> Site {
    // Per-rank peers and group renames to undeclared names have no plan-wide twin worth
    // running (an undeclared group on a 1-d mesh is the whole mesh, so renaming it everywhere
    // is no bug); transposing an input everywhere is no likelier a bug than on one rank.
    let plan_wide = matches!(
        kind,
        MutationKind::DeleteCollective
            | MutationKind::WrongReduceOp
            | MutationKind::WrongScale
            | MutationKind::DropWait
    ) || (kind == MutationKind::RenameGroup && !description.contains("undeclared"));
    Site {
        kind,
        line: n.line,
        description,
        edits,
        plan_wide,
    }
}

fn delete_collective(view: &GraphView, i: usize, n: &Node, out: &mut Vec<Site>) {
    if !is_collective(n) {
        return;
    }
    let Some(x) = n.args.first().and_then(Arg::as_value) else {
        return;
    };
    let group = group_slot(n).map(|(_, g)| g).unwrap_or_default();
    // A local operator of the collective's shape keeps the graph well-typed, so the mutant
    // tests what the engines say about the missing communication, not a type error.
    let (op, args, what) = match n.op_name() {
        "all_gather_into_tensor" => {
            let Some(k) = n
                .args
                .get(1)
                .and_then(Arg::as_int)
                .filter(|k| (1..=64).contains(k))
            else {
                return;
            };
            let parts = vec![Arg::Value(x.to_string()); k as usize];
            (
                "aten.cat.default",
                vec![Arg::List(parts), Arg::Int(0)],
                format!("cat of {k} copies of `{x}`"),
            )
        }
        "reduce_scatter_tensor" => {
            let Some(rows) = n.ty.as_ref().and_then(|t| t.size(0)) else {
                return;
            };
            (
                "aten.slice.Tensor",
                vec![
                    Arg::Value(x.to_string()),
                    Arg::Int(0),
                    Arg::Int(0),
                    Arg::Int(rows),
                ],
                format!("the first {rows} rows of `{x}`"),
            )
        }
        _ => (
            "aten.clone.default",
            vec![Arg::Value(x.to_string())],
            format!("`{x}`"),
        ),
    };
    let mut edits = vec![Edit::Replace {
        node: i,
        op: op.to_string(),
        args,
    }];
    for (j, w) in view.nodes.iter().enumerate().skip(i + 1) {
        if is_wait(w) && w.args.first().and_then(Arg::as_value) == Some(n.name.as_str()) {
            edits.push(Edit::Remove {
                node: j,
                rewire_to: n.name.clone(),
            });
        }
    }
    let desc = format!(
        "{} `{}` over '{group}' removed: its consumers read {what}",
        n.op_name(),
        n.name
    );
    out.push(site(MutationKind::DeleteCollective, n, desc, edits));
}

fn drop_wait(i: usize, n: &Node, out: &mut Vec<Site>) {
    if !is_wait(n) {
        return;
    }
    let Some(x) = n.args.first().and_then(Arg::as_value) else {
        return;
    };
    let desc = format!(
        "wait_tensor `{}` removed: its consumers read `{x}` unwaited",
        n.name
    );
    out.push(site(
        MutationKind::DropWait,
        n,
        desc,
        vec![Edit::Remove {
            node: i,
            rewire_to: x.to_string(),
        }],
    ));
}

fn rename_group(i: usize, n: &Node, ctx: &SiteContext, out: &mut Vec<Site>) {
    if !is_collective(n) {
        return;
    }
    let Some((slot, g)) = group_slot(n) else {
        return;
    };
    let undeclared = format!("{g}_renamed");
    let desc = format!(
        "rank {}: {} `{}` runs over undeclared group '{undeclared}' instead of '{g}'",
        ctx.rank,
        n.op_name(),
        n.name
    );
    out.push(site(
        MutationKind::RenameGroup,
        n,
        desc,
        vec![Edit::SetArg {
            node: i,
            slot: slot.clone(),
            arg: Arg::Str(undeclared),
        }],
    ));
    for other in ctx.declared_groups.iter().filter(|o| **o != g) {
        let desc = format!(
            "rank {}: {} `{}` runs over group '{other}' instead of '{g}'",
            ctx.rank,
            n.op_name(),
            n.name
        );
        out.push(site(
            MutationKind::RenameGroup,
            n,
            desc,
            vec![Edit::SetArg {
                node: i,
                slot: slot.clone(),
                arg: Arg::Str(other.clone()),
            }],
        ));
    }
}

fn wrong_reduce_op(i: usize, n: &Node, out: &mut Vec<Site>) {
    if !is_collective(n) || !matches!(n.op_name(), "all_reduce" | "reduce_scatter_tensor") {
        return;
    }
    let Some(op) = n.args.get(1).and_then(Arg::as_str) else {
        return;
    };
    let alternatives: &[&str] = match op {
        "sum" => &["avg", "max"],
        "avg" => &["sum"],
        "max" => &["sum", "min"],
        "min" => &["max"],
        _ => &["sum"],
    };
    for alt in alternatives {
        let desc = format!(
            "{} `{}` reduces by '{alt}' instead of '{op}'",
            n.op_name(),
            n.name
        );
        out.push(site(
            MutationKind::WrongReduceOp,
            n,
            desc,
            vec![Edit::SetArg {
                node: i,
                slot: Slot::Pos(1),
                arg: Arg::Str(alt.to_string()),
            }],
        ));
    }
}

fn peer_slot(n: &Node) -> Option<usize> {
    match n.op_name() {
        "send" => Some(1),
        "recv" => Some(2),
        _ => None,
    }
}

/// The process group a send's or recv's peer is an index into (`group`, after the peer at
/// `slot` and the tag), if it names one.
fn p2p_group(n: &Node, slot: usize) -> Option<&str> {
    n.args
        .get(slot + 2)
        .or_else(|| n.kwargs.iter().find(|(k, _)| k == "group").map(|(_, a)| a))
        .and_then(Arg::as_str)
}

fn swap_peers(view: &GraphView, i: usize, n: &Node, ctx: &SiteContext, out: &mut Vec<Site>) {
    if !is_p2p(n) {
        return;
    }
    let Some(slot) = peer_slot(n) else { return };
    let Some(peer) = n.args.get(slot).and_then(Arg::as_int) else {
        return;
    };
    let group = p2p_group(n, slot);
    // The peers a literal can name: global ranks, or indices into the rank's member set of
    // `group` (another index stays a valid program whose message goes astray).
    let span = match group {
        None => ctx.world,
        Some(g) => match ctx.group_size(g) {
            Some(s) => s,
            None => return,
        },
    } as i64;
    // Every other peer on small meshes (groups); on large ones, for a global peer this rank
    // itself, and the neighbours.
    let mut candidates: Vec<i64> = if span <= 4 {
        (0..span).collect()
    } else if group.is_none() {
        vec![ctx.rank as i64, (peer + 1) % span, (peer + span - 1) % span]
    } else {
        vec![(peer + 1) % span, (peer + span - 1) % span]
    };
    candidates.retain(|&r| r != peer);
    candidates.dedup();
    let role = if n.op_name() == "send" {
        "sends to"
    } else {
        "receives from"
    };
    let named = |r: i64| match group {
        None => format!("rank {r}"),
        Some(g) => format!("index {r} of group '{g}'"),
    };
    for r in candidates {
        let desc = format!(
            "rank {}: {} `{}` {role} {} instead of {peer}",
            ctx.rank,
            n.op_name(),
            n.name,
            named(r)
        );
        out.push(site(
            MutationKind::SwapPeers,
            n,
            desc,
            vec![Edit::SetArg {
                node: i,
                slot: Slot::Pos(slot),
                arg: Arg::Int(r),
            }],
        ));
    }
    // Two operations of the same direction with different peers exchange them.
    if let Some((j, m, other)) = view
        .nodes
        .iter()
        .enumerate()
        .skip(i + 1)
        .find_map(|(j, m)| {
            // Peers of the same kind: both global, or indices into the same group.
            (is_p2p(m) && m.op_name() == n.op_name() && p2p_group(m, slot) == group)
                .then(|| m.args.get(slot).and_then(Arg::as_int).map(|o| (j, m, o)))
                .flatten()
        })
    {
        if other != peer {
            let desc = format!(
                "rank {}: {}s `{}` and `{}` exchange their peers ({peer} and {other})",
                ctx.rank,
                n.op_name(),
                n.name,
                m.name
            );
            out.push(site(
                MutationKind::SwapPeers,
                n,
                desc,
                vec![
                    Edit::SetArg {
                        node: i,
                        slot: Slot::Pos(slot),
                        arg: Arg::Int(other),
                    },
                    Edit::SetArg {
                        node: j,
                        slot: Slot::Pos(slot),
                        arg: Arg::Int(peer),
                    },
                ],
            ));
        }
    }
}

/// Argument slots other kinds own (dims, slice bounds, scale factors), which change-literal skips.
fn owned_slots(n: &Node) -> Vec<usize> {
    let mut owned: Vec<usize> = dim_slots(n).into_iter().map(|(s, _)| s).collect();
    match n.op_name() {
        "slice" => owned.extend([2, 3]),
        "select" | "narrow" => owned.push(2),
        _ => {}
    }
    if scale_slot(n).is_some() {
        owned.push(1);
    }
    owned
}

fn change_literal(i: usize, n: &Node, out: &mut Vec<Site>) {
    if is_wait(n) {
        return;
    }
    let owned = owned_slots(n);
    let mut slots: Vec<(Slot, &Arg)> = n
        .args
        .iter()
        .enumerate()
        .map(|(p, a)| (Slot::Pos(p), a))
        .collect();
    slots.extend(n.kwargs.iter().map(|(k, a)| (Slot::Kw(k.clone()), a)));
    for (slot, arg) in slots {
        if let Slot::Pos(p) = slot {
            // Collectives' literals are their reduce op, sizes and group, which have kinds of
            // their own; a p2p op's literals other than the peer (and its group) are its tag
            // (and recv's size).
            if owned.contains(&p)
                || (is_collective(n))
                || (is_p2p(n) && peer_slot(n).is_some_and(|s| p == s || p == s + 2))
            {
                continue;
            }
        }
        let mut push = |new: Arg, what: String| {
            let desc = format!("{} `{}`: {what}", n.op, n.name);
            out.push(site(
                MutationKind::ChangeLiteral,
                n,
                desc,
                vec![Edit::SetArg {
                    node: i,
                    slot: slot.clone(),
                    arg: new,
                }],
            ));
        };
        match arg {
            Arg::Int(k) => push(
                Arg::Int(k + 1),
                format!("{} {k} -> {}", slot_name(&slot), k + 1),
            ),
            Arg::Float(f) if f.is_finite() => {
                let g = if *f == 0.0 { 1.0 } else { f * 2.0 };
                push(
                    Arg::Float(g),
                    format!(
                        "{} {} -> {}",
                        slot_name(&slot),
                        python_float(*f),
                        python_float(g)
                    ),
                )
            }
            Arg::Bool(b) => push(
                Arg::Bool(!b),
                format!("{} {} -> {}", slot_name(&slot), py_bool(*b), py_bool(!b)),
            ),
            Arg::List(items) => {
                for (e, item) in items.iter().enumerate() {
                    if let Arg::Int(k) = item {
                        let mut new = items.clone();
                        new[e] = Arg::Int(k + 1);
                        push(
                            Arg::List(new),
                            format!("{} element {e}: {k} -> {}", slot_name(&slot), k + 1),
                        );
                    }
                }
            }
            _ => {}
        }
    }
}

fn py_bool(b: bool) -> &'static str {
    if b {
        "True"
    } else {
        "False"
    }
}

fn slot_name(slot: &Slot) -> String {
    match slot {
        Slot::Pos(p) => format!("argument {p}"),
        Slot::Kw(k) => format!("{k}="),
    }
}

fn swap_operands(i: usize, n: &Node, out: &mut Vec<Site>) {
    let pair = match (n.namespace(), n.op_name()) {
        (
            "aten",
            "sub" | "div" | "mm" | "bmm" | "matmul" | "rsub" | "pow" | "atan2" | "gt" | "lt" | "ge"
            | "le",
        ) => Some((0, 1)),
        ("aten", "addmm" | "baddbmm") => Some((1, 2)),
        _ => None,
    };
    if let Some((a, b)) = pair {
        if let (Some(Arg::Value(x)), Some(Arg::Value(y))) = (n.args.get(a), n.args.get(b)) {
            if x != y {
                let desc = format!(
                    "{} `{}` reads ({y}, {x}) instead of ({x}, {y})",
                    n.op, n.name
                );
                out.push(site(
                    MutationKind::SwapOperands,
                    n,
                    desc,
                    vec![
                        Edit::SetArg {
                            node: i,
                            slot: Slot::Pos(a),
                            arg: Arg::Value(y.clone()),
                        },
                        Edit::SetArg {
                            node: i,
                            slot: Slot::Pos(b),
                            arg: Arg::Value(x.clone()),
                        },
                    ],
                ));
            }
        }
    }
    // Concatenation is not commutative either: neighbours in its list trade places.
    if n.namespace() == "aten" && n.op_name() == "cat" {
        if let Some(Arg::List(items)) = n.args.first() {
            for e in 0..items.len().saturating_sub(1) {
                if items[e] == items[e + 1] {
                    continue;
                }
                let mut new = items.clone();
                new.swap(e, e + 1);
                let desc = format!("cat `{}`: pieces {e} and {} trade places", n.name, e + 1);
                out.push(site(
                    MutationKind::SwapOperands,
                    n,
                    desc,
                    vec![Edit::SetArg {
                        node: i,
                        slot: Slot::Pos(0),
                        arg: Arg::List(new),
                    }],
                ));
            }
        }
    }
}

fn input_type<'a>(view: &'a GraphView, n: &Node, pos: usize) -> Option<&'a TensorType> {
    match n.args.get(pos)? {
        Arg::Value(v) => view.type_of(v),
        Arg::List(items) => items
            .first()
            .and_then(Arg::as_value)
            .and_then(|v| view.type_of(v)),
        _ => None,
    }
}

fn move_slice(view: &GraphView, i: usize, n: &Node, out: &mut Vec<Site>) {
    if n.namespace() != "aten" {
        return;
    }
    match n.op_name() {
        "slice" => {
            let dim = n.args.get(1).and_then(Arg::as_int).unwrap_or(0);
            let (Some(s), Some(e)) = (
                n.args.get(2).and_then(Arg::as_int),
                n.args.get(3).and_then(Arg::as_int),
            ) else {
                return;
            };
            let size = input_type(view, n, 0).and_then(|t| t.size(dim));
            let e = match size {
                Some(len) if e > len => len,
                _ => e,
            };
            let len = e - s;
            let mut shifts = vec![1, -1];
            if len > 1 {
                shifts.extend([len, -len]);
            }
            for d in shifts {
                let (ns, ne) = (s + d, e + d);
                let fits = ns >= 0 && size.is_none_or(|l| ne <= l);
                if !fits {
                    continue;
                }
                let desc = format!(
                    "slice `{}` (dim {dim}) reads [{ns}, {ne}) instead of [{s}, {e})",
                    n.name
                );
                out.push(site(
                    MutationKind::MoveSlice,
                    n,
                    desc,
                    vec![
                        Edit::SetArg {
                            node: i,
                            slot: Slot::Pos(2),
                            arg: Arg::Int(ns),
                        },
                        Edit::SetArg {
                            node: i,
                            slot: Slot::Pos(3),
                            arg: Arg::Int(ne),
                        },
                    ],
                ));
            }
        }
        "select" | "narrow" => {
            let dim = n.args.get(1).and_then(Arg::as_int).unwrap_or(0);
            let Some(s) = n.args.get(2).and_then(Arg::as_int) else {
                return;
            };
            let size = input_type(view, n, 0).and_then(|t| t.size(dim));
            let width = if n.op_name() == "narrow" {
                n.args.get(3).and_then(Arg::as_int).unwrap_or(1)
            } else {
                1
            };
            for d in [1, -1] {
                let ns = s + d;
                if ns < 0 || size.is_some_and(|l| ns + width > l) {
                    continue;
                }
                let desc = format!(
                    "{} `{}` (dim {dim}) starts at {ns} instead of {s}",
                    n.op_name(),
                    n.name
                );
                out.push(site(
                    MutationKind::MoveSlice,
                    n,
                    desc,
                    vec![Edit::SetArg {
                        node: i,
                        slot: Slot::Pos(2),
                        arg: Arg::Int(ns),
                    }],
                ));
            }
        }
        _ => {}
    }
}

/// Dim arguments: (positional slot, rank of the tensor the dim indexes) — rank from `input`,
/// plus `extra` (unsqueeze indexes its output).
fn dim_slots(n: &Node) -> Vec<(usize, (usize, usize))> {
    if n.namespace() != "aten" {
        return Vec::new();
    }
    // (slot, input slot, extra rank)
    let table: &[(usize, usize, usize)] = match n.op_name() {
        "slice" | "select" | "narrow" | "cat" | "sum" | "mean" | "amax" | "amin" | "logsumexp"
        | "_softmax" | "_log_softmax" | "softmax" | "log_softmax" | "squeeze" | "gather"
        | "scatter" | "index_select" | "cumsum" | "var" | "std" | "argmax" | "argmin" | "max"
        | "min" | "prod" | "norm" => &[(1, 0, 0)],
        "transpose" => &[(1, 0, 0), (2, 0, 0)],
        "unsqueeze" => &[(1, 0, 1)],
        "_softmax_backward_data" | "_log_softmax_backward_data" => &[(2, 0, 0)],
        "topk" | "split" | "chunk" => &[(2, 0, 0)],
        _ => &[],
    };
    table
        .iter()
        .filter(|(slot, _, _)| matches!(n.args.get(*slot), Some(Arg::Int(_)) | Some(Arg::List(_))))
        .map(|&(slot, input, extra)| (slot, (input, extra)))
        .collect()
}

fn change_dim(view: &GraphView, i: usize, n: &Node, out: &mut Vec<Site>) {
    for (slot, (input, extra)) in dim_slots(n) {
        let rank = input_type(view, n, input).map(|t| t.dims.len() + extra);
        let arg = &n.args[slot];
        let (dims, is_list) = match arg {
            Arg::Int(d) => (vec![*d], false),
            Arg::List(items) if items.iter().all(|a| a.as_int().is_some()) => {
                (items.iter().filter_map(Arg::as_int).collect(), true)
            }
            _ => continue,
        };
        for (e, &d) in dims.iter().enumerate() {
            let alternatives: Vec<i64> = match rank {
                Some(r) if r >= 1 => {
                    let r = r as i64;
                    let norm = if d < 0 { d + r } else { d };
                    (0..r)
                        .filter(|&x| x != norm && !dims.contains(&x) && !dims.contains(&(x - r)))
                        .collect()
                }
                _ => vec![d + 1],
            };
            for alt in alternatives {
                let new = if is_list {
                    let mut items = dims.clone();
                    items[e] = alt;
                    Arg::List(items.into_iter().map(Arg::Int).collect())
                } else {
                    Arg::Int(alt)
                };
                let desc = format!("{} `{}`: dim {d} -> {alt}", n.op, n.name);
                out.push(site(
                    MutationKind::ChangeDim,
                    n,
                    desc,
                    vec![Edit::SetArg {
                        node: i,
                        slot: Slot::Pos(slot),
                        arg: new,
                    }],
                ));
            }
        }
    }
}

fn transpose_weight(view: &GraphView, i: usize, n: &Node, out: &mut Vec<Site>) {
    if is_collective(n) || is_wait(n) || is_p2p(n) {
        return;
    }
    for (p, arg) in n.args.iter().enumerate() {
        let Some(w) = arg.as_value() else { continue };
        let Some(input) = view.node(w).filter(|m| m.is_input) else {
            continue;
        };
        let Some(ty) = &input.ty else { continue };
        let square = |a: Option<i64>, b: Option<i64>| a.is_some() && a == b && a != Some(1);
        let (op, args) = match ty.dims.len() {
            2 if square(ty.dims[0], ty.dims[1]) => {
                ("aten.t.default", vec![Arg::Value(w.to_string())])
            }
            3 if square(ty.dims[1], ty.dims[2]) => (
                "aten.transpose.int",
                vec![Arg::Value(w.to_string()), Arg::Int(1), Arg::Int(2)],
            ),
            _ => continue,
        };
        let name = view.fresh_name(&format!("{w}_transposed"));
        let desc = format!(
            "{} `{}` reads input `{w}` {} transposed",
            n.op,
            n.name,
            ty.annotation()
        );
        out.push(site(
            MutationKind::TransposeWeight,
            n,
            desc,
            vec![
                Edit::InsertBefore {
                    node: i,
                    name: name.clone(),
                    ty: ty.clone(),
                    op: op.to_string(),
                    args,
                },
                Edit::SetArg {
                    node: i,
                    slot: Slot::Pos(p),
                    arg: Arg::Value(name),
                },
            ],
        ));
    }
}

/// The scalar factor of a multiplication or division by a constant, when there is one.
fn scale_slot(n: &Node) -> Option<&Arg> {
    if n.namespace() != "aten" || !matches!(n.op_name(), "mul" | "div") {
        return None;
    }
    n.args
        .get(1)
        .filter(|a| matches!(a, Arg::Int(_) | Arg::Float(_)))
}

fn wrong_scale(i: usize, n: &Node, out: &mut Vec<Site>) {
    let Some(factor) = scale_slot(n) else { return };
    let variants: Vec<(Arg, &str)> = match factor {
        Arg::Int(k) => {
            let mut v = vec![(Arg::Int(k * 2), "doubled")];
            v.push(if k % 2 == 0 {
                (Arg::Int(k / 2), "halved")
            } else {
                (Arg::Float(*k as f64 / 2.0), "halved")
            });
            v
        }
        Arg::Float(f) if f.is_finite() && *f != 0.0 => vec![
            (Arg::Float(f * 2.0), "doubled"),
            (Arg::Float(f / 2.0), "halved"),
        ],
        _ => Vec::new(),
    };
    for (new, what) in variants {
        let old = match factor {
            Arg::Int(k) => k.to_string(),
            Arg::Float(f) => python_float(*f),
            _ => String::new(),
        };
        let shown = match &new {
            Arg::Int(k) => k.to_string(),
            Arg::Float(f) => python_float(*f),
            _ => String::new(),
        };
        let desc = format!("{} `{}`: scale {old} {what} to {shown}", n.op, n.name);
        out.push(site(
            MutationKind::WrongScale,
            n,
            desc,
            vec![Edit::SetArg {
                node: i,
                slot: Slot::Pos(1),
                arg: new,
            }],
        ));
    }
}

fn skip_unary(i: usize, n: &Node, out: &mut Vec<Site>) {
    const UNARY: &[&str] = &[
        "relu", "silu", "gelu", "neg", "exp", "sigmoid", "tanh", "rsqrt", "sqrt", "log", "abs",
        "clone",
    ];
    if n.namespace() != "aten" || !UNARY.contains(&n.op_name()) {
        return;
    }
    let Some(x) = n.args.first().and_then(Arg::as_value) else {
        return;
    };
    let desc = format!(
        "{} `{}` skipped: its consumers read `{x}`",
        n.op_name(),
        n.name
    );
    out.push(site(
        MutationKind::SkipUnary,
        n,
        desc,
        vec![Edit::Remove {
            node: i,
            rewire_to: x.to_string(),
        }],
    ));
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call(name: &str, op: &str, args: Vec<Arg>) -> Node {
        Node {
            name: name.into(),
            line: 1,
            op: op.into(),
            args,
            kwargs: Vec::new(),
            ty: None,
            is_input: false,
        }
    }

    /// The peers the swap-peers sites of `view` set, per site.
    fn swapped(view: &GraphView, ctx: &SiteContext) -> Vec<Vec<i64>> {
        enumerate(view, ctx)
            .iter()
            .filter(|s| s.kind == MutationKind::SwapPeers)
            .map(|s| {
                s.edits
                    .iter()
                    .filter_map(|e| match e {
                        Edit::SetArg { arg, .. } => arg.as_int(),
                        _ => None,
                    })
                    .collect()
            })
            .collect()
    }

    /// A group-relative peer is swapped for other indices of its group, never for a global
    /// rank outside it; a global peer for other global ranks; and two sends exchange their
    /// peers only when both name the same group.
    #[test]
    fn peers_are_swapped_within_their_group() {
        let mesh = vec![("dp".to_string(), 4), ("pp".to_string(), 2)];
        let groups = vec![
            ("dp".to_string(), "dp".to_string()),
            ("pp".to_string(), "pp".to_string()),
        ];
        let ctx = SiteContext {
            world: 8,
            rank: 0,
            declared_groups: &[],
            mesh: &mesh,
            groups: &groups,
        };
        let x = Node {
            is_input: true,
            ..call("x", "", Vec::new())
        };
        let send = |name: &str, peer: i64, group: Option<&str>| {
            let mut args = vec![Arg::Value("x".into()), Arg::Int(peer), Arg::Int(0)];
            args.extend(group.map(|g| Arg::Str(g.into())));
            call(name, "shardproof_p2p.send.default", args)
        };
        let view = GraphView::new(vec![x.clone(), send("s", 1, Some("pp"))]);
        assert_eq!(swapped(&view, &ctx), vec![vec![0]]);
        let view = GraphView::new(vec![x.clone(), send("s", 1, Some("dp"))]);
        assert_eq!(swapped(&view, &ctx), vec![vec![0], vec![2], vec![3]]);
        // Global: rank 0 itself and the neighbours of rank 1 on the 8-rank mesh.
        let view = GraphView::new(vec![x.clone(), send("s", 1, None)]);
        let global = swapped(&view, &ctx);
        assert!(global.contains(&vec![2]) && global.iter().all(|p| p == &[0] || p == &[2]));
        // An unknown group (on a 2-d mesh) makes no site.
        let view = GraphView::new(vec![x.clone(), send("s", 1, Some("cp"))]);
        assert!(swapped(&view, &ctx).is_empty());
        // A global send and a group one do not exchange peers; two of one group do.
        let view = GraphView::new(vec![
            x.clone(),
            send("s", 1, Some("dp")),
            send("t", 3, None),
        ]);
        assert!(!swapped(&view, &ctx).iter().any(|p| p.len() == 2));
        let view = GraphView::new(vec![x, send("s", 1, Some("dp")), send("t", 3, Some("dp"))]);
        assert!(swapped(&view, &ctx).contains(&vec![3, 1]));
    }
}
