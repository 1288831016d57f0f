//! Mutation testing for shardproof's engines.
//!
//! A *mutant* is a case with one deliberate edit to one rank graph (torch.fx readable text or
//! the JSON graph format), or, for the group-alias family, to the case file's `groups:` and one
//! rank graph. [`mutants_of`] enumerates every mutant of a case deterministically; [`sample`]
//! picks a seeded, kind-balanced subset; [`run_mutants`] runs each through `shardproof run`
//! (the numeric oracle, seeds 0, 1, 2) and `shardproof verify`, and [`Report`] classifies the
//! outcomes into a verdict matrix. A `verify` that says *verified* where the oracle found a
//! difference (or where the mutant can never be equivalent) is a soundness bug.
//!
//! ```
//! use shardproof_mutate::{mutants_of, CaseInput, MutationKind};
//! let dir = tempfile::tempdir().unwrap();
//! std::fs::write(dir.path().join("case.yaml"), "version: 1\nspec:\n  graph: spec.py\nimpl:\n  mesh: { tp: 2 }\n  graphs: [r0.py, r1.py]\n  groups:\n    \"tp\": tp\ninputs:\n  x: Shard(0)\n").unwrap();
//! let rank = "class GraphModule(torch.nn.Module):\n    def forward(self, x: \"f32[4, 4]\"):\n        all_reduce: \"f32[4, 4]\" = torch.ops._c10d_functional.all_reduce.default(x, 'sum', 'tp')\n        wait_tensor: \"f32[4, 4]\" = torch.ops._c10d_functional.wait_tensor.default(all_reduce)\n        return (wait_tensor,)\n";
//! for f in ["spec.py", "r0.py", "r1.py"] {
//!     std::fs::write(dir.path().join(f), rank).unwrap();
//! }
//! let case = CaseInput::load(dir.path()).unwrap();
//! let mutants = mutants_of(&case).unwrap();
//! let wrong_op = mutants.iter().find(|m| m.kind == MutationKind::WrongReduceOp).unwrap();
//! assert_eq!(wrong_op.file, "r0.py");
//! assert!(wrong_op.new_text.contains("all_reduce.default(x, 'avg', 'tp')"));
//! assert!(mutants.iter().any(|m| m.kind == MutationKind::GroupAlias && m.new_case_file.is_some()));
//! ```

#![warn(missing_docs)]

mod case;
pub mod corpus;
mod driver;
mod fx;
mod graph;
mod jsongraph;
mod sites;

use std::collections::HashSet;
use std::fmt;
use std::path::{Path, PathBuf};

use rand::seq::SliceRandom;
use rand::SeedableRng;
use serde::Serialize;

pub use case::CaseInput;
pub use driver::{run_mutants, DriverOptions, MutantOutcome, OracleClass, Report, VerifyVerdict};

use graph::{Arg, Edit, GraphView};

/// The kinds of mutation, in enumeration order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum MutationKind {
    /// A collective replaced by a local operator of its shape (its waits' consumers read that).
    DeleteCollective,
    /// A `wait_tensor` removed (its consumers read the collective's handle).
    DropWait,
    /// One rank's collective pointed at another group name (undeclared, or another declared one).
    RenameGroup,
    /// The case declares a second name for an existing group and one rank's collectives use it.
    GroupAlias,
    /// An all-reduce or reduce-scatter reducing by another operation.
    WrongReduceOp,
    /// A send or recv addressed to another peer, or two of them trading peers.
    SwapPeers,
    /// An int, float or bool literal argument changed.
    ChangeLiteral,
    /// The two tensor operands of a non-commutative operator swapped (or two cat pieces).
    SwapOperands,
    /// A slice, select or narrow reading a shifted range.
    MoveSlice,
    /// A dim argument changed to another valid dim.
    ChangeDim,
    /// A square graph input read through a transpose by one consumer.
    TransposeWeight,
    /// A multiplication or division by a constant with the constant doubled or halved.
    WrongScale,
    /// A unary operator skipped (relu, exp, clone, ...): its consumers read its input.
    SkipUnary,
}

impl MutationKind {
    /// Every kind, in enumeration order.
    pub const ALL: [MutationKind; 13] = [
        MutationKind::DeleteCollective,
        MutationKind::DropWait,
        MutationKind::RenameGroup,
        MutationKind::GroupAlias,
        MutationKind::WrongReduceOp,
        MutationKind::SwapPeers,
        MutationKind::ChangeLiteral,
        MutationKind::SwapOperands,
        MutationKind::MoveSlice,
        MutationKind::ChangeDim,
        MutationKind::TransposeWeight,
        MutationKind::WrongScale,
        MutationKind::SkipUnary,
    ];

    /// The kebab-case name used in reports (`delete-collective`).
    pub fn name(self) -> &'static str {
        match self {
            MutationKind::DeleteCollective => "delete-collective",
            MutationKind::DropWait => "drop-wait",
            MutationKind::RenameGroup => "rename-group",
            MutationKind::GroupAlias => "group-alias",
            MutationKind::WrongReduceOp => "wrong-reduce-op",
            MutationKind::SwapPeers => "swap-peers",
            MutationKind::ChangeLiteral => "change-literal",
            MutationKind::SwapOperands => "swap-operands",
            MutationKind::MoveSlice => "move-slice",
            MutationKind::ChangeDim => "change-dim",
            MutationKind::TransposeWeight => "transpose-weight",
            MutationKind::WrongScale => "wrong-scale",
            MutationKind::SkipUnary => "skip-unary",
        }
    }

    /// One-rank mutants of this kind are never equivalent to the spec, whatever a run shows:
    /// a rank that calls a collective on another process group (even one over the same ranks)
    /// never meets its peers on a real machine. So `verify` must never say *verified* on them.
    pub fn never_equivalent_on_one_rank(self) -> bool {
        matches!(self, MutationKind::RenameGroup | MutationKind::GroupAlias)
    }
}

impl fmt::Display for MutationKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// One mutant: a single edit to one rank graph (and, for group aliases, the case file).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Mutant {
    /// What kind of mutation this is.
    pub kind: MutationKind,
    /// The rank graph changed, as the case file names it.
    pub file: String,
    /// The rank whose graph changed.
    pub rank: usize,
    /// 1-based line (torch.fx text) of the node mutated; for JSON graphs the line of its `name`.
    pub line: usize,
    /// What changed, in words.
    pub description: String,
    /// The whole new text of `file`.
    #[serde(skip)]
    pub new_text: String,
    /// The whole new case file, when the mutant edits it too.
    #[serde(skip)]
    pub new_case_file: Option<String>,
    /// The same edit made on every rank: the other ranks' graphs and their new texts.
    #[serde(skip)]
    pub other_files: Vec<(String, String)>,
    /// Whether the edit is made on every rank (a plan-wide bug) rather than on `rank` alone.
    pub all_ranks: bool,
}

/// An error reading a case or a graph for mutation: where, what and what to do.
#[derive(Debug, Clone, PartialEq)]
pub struct MutateError {
    /// The file concerned.
    pub file: PathBuf,
    /// 1-based line, 0 when the error is about the whole file.
    pub line: usize,
    /// What went wrong.
    pub message: String,
    /// How to fix it.
    pub hint: String,
}

impl Mutant {
    /// Whether no program this mutant can be is equivalent to the spec (see
    /// [`MutationKind::never_equivalent_on_one_rank`]).
    pub fn never_equivalent(&self) -> bool {
        self.kind.never_equivalent_on_one_rank() && !self.all_ranks
    }
}

impl MutateError {
    pub(crate) fn new(file: &Path, line: usize, message: String, hint: &str) -> MutateError {
        MutateError {
            file: file.to_path_buf(),
            line,
            message,
            hint: hint.to_string(),
        }
    }
}

impl fmt::Display for MutateError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.line > 0 {
            write!(
                f,
                "{}:{}: {}\n  hint: {}",
                self.file.display(),
                self.line,
                self.message,
                self.hint
            )
        } else {
            write!(
                f,
                "{}: {}\n  hint: {}",
                self.file.display(),
                self.message,
                self.hint
            )
        }
    }
}

impl std::error::Error for MutateError {}

/// A graph file read in whichever format its name says.
enum AnyGraph {
    Fx(fx::FxGraph),
    Json(jsongraph::JsonGraph),
}

impl AnyGraph {
    fn read(path: &Path, text: &str) -> Result<AnyGraph, MutateError> {
        if path.extension().is_some_and(|e| e == "json") {
            Ok(AnyGraph::Json(jsongraph::JsonGraph::parse(text, path)?))
        } else {
            Ok(AnyGraph::Fx(fx::FxGraph::parse(text)))
        }
    }
    fn view(&self) -> &GraphView {
        match self {
            AnyGraph::Fx(g) => &g.view,
            AnyGraph::Json(g) => &g.view,
        }
    }
    fn apply(&self, edits: &[Edit]) -> String {
        match self {
            AnyGraph::Fx(g) => g.apply(edits),
            AnyGraph::Json(g) => g.apply(edits),
        }
    }
}

/// Every mutant of a case's rank graphs, in a deterministic order (rank, kind, line); mutants
/// that leave a file unchanged, and duplicates, are dropped.
pub fn mutants_of(case: &CaseInput) -> Result<Vec<Mutant>, MutateError> {
    let dir = case.dir();
    let declared: Vec<String> = case.groups.iter().map(|(n, _)| n.clone()).collect();
    let mut texts = Vec::new();
    let mut graphs = Vec::new();
    for (rank, file) in case.rank_graphs.iter().enumerate() {
        let path = dir.join(file);
        let text = std::fs::read_to_string(&path).map_err(|e| {
            MutateError::new(
                &case.case_file,
                0,
                format!("cannot read rank {rank}'s graph `{}`: {e}", path.display()),
                "check the `impl: graphs:` paths; they are relative to the case file",
            )
        })?;
        graphs.push(AnyGraph::read(&path, &text)?);
        texts.push(text);
    }
    let mut out = Vec::new();
    let mut seen = HashSet::new();
    for (rank, file) in case.rank_graphs.iter().enumerate() {
        let (graph, text) = (&graphs[rank], &texts[rank]);
        let ctx = sites::SiteContext {
            world: case.world(),
            rank,
            declared_groups: &declared,
            mesh: &case.mesh,
            groups: &case.groups,
        };
        let mut push = |m: Mutant| {
            if m.new_text == *text && m.new_case_file.is_none() {
                return;
            }
            if seen.insert((
                m.file.clone(),
                m.new_text.clone(),
                m.new_case_file.clone(),
                m.other_files.clone(),
            )) {
                out.push(m);
            }
        };
        let mutant = |kind, line, description, new_text, new_case_file| Mutant {
            kind,
            file: file.clone(),
            rank,
            line,
            description,
            new_text,
            new_case_file,
            other_files: Vec::new(),
            all_ranks: false,
        };
        let mut sites = sites::enumerate(graph.view(), &ctx);
        sites.sort_by_key(|s| (s.kind, s.line));
        let emit_site = |s: &sites::Site, push: &mut dyn FnMut(Mutant)| {
            push(mutant(
                s.kind,
                s.line,
                s.description.clone(),
                graph.apply(&s.edits),
                None,
            ));
            // Rank 0's edits, made on every rank that has the same node: the plan-wide bug
            // (a reduction missing or wrong everywhere), which one-rank edits of collectives
            // cannot express (the members would disagree, an invalid program).
            if rank == 0 && graphs.len() > 1 && s.plan_wide {
                let others: Option<Vec<(String, String)>> = (1..graphs.len())
                    .map(|r| {
                        translate(&s.edits, graph.view(), graphs[r].view())
                            .map(|e| (case.rank_graphs[r].clone(), graphs[r].apply(&e)))
                    })
                    .collect();
                if let Some(others) = others {
                    let mut m = mutant(
                        s.kind,
                        s.line,
                        format!("{} (on every rank)", s.description),
                        graph.apply(&s.edits),
                        None,
                    );
                    m.other_files = others;
                    m.all_ranks = true;
                    push(m);
                }
            }
        };
        for s in sites.iter().filter(|s| s.kind < MutationKind::GroupAlias) {
            emit_site(s, &mut push);
        }
        for (line, description, edits, yaml) in group_aliases(case, graph.view(), rank) {
            push(mutant(
                MutationKind::GroupAlias,
                line,
                description,
                graph.apply(&edits),
                Some(yaml),
            ));
        }
        for s in sites.iter().filter(|s| s.kind > MutationKind::GroupAlias) {
            emit_site(s, &mut push);
        }
    }
    Ok(out)
}

/// Rank `from`'s edits as edits of another rank's graph: each node found by name, with the
/// same operator and arguments. `None` when some node has no such twin.
fn translate(edits: &[Edit], from: &GraphView, to: &GraphView) -> Option<Vec<Edit>> {
    let twin = |i: usize| -> Option<usize> {
        let n = &from.nodes[i];
        let j = to.nodes.iter().position(|m| m.name == n.name)?;
        let m = &to.nodes[j];
        (m.op == n.op && m.args == n.args && m.kwargs == n.kwargs).then_some(j)
    };
    edits
        .iter()
        .map(|e| {
            Some(match e {
                Edit::SetArg { node, slot, arg } => Edit::SetArg {
                    node: twin(*node)?,
                    slot: slot.clone(),
                    arg: arg.clone(),
                },
                Edit::Replace { node, op, args } => Edit::Replace {
                    node: twin(*node)?,
                    op: op.clone(),
                    args: args.clone(),
                },
                Edit::Remove { node, rewire_to } => Edit::Remove {
                    node: twin(*node)?,
                    rewire_to: rewire_to.clone(),
                },
                Edit::InsertBefore {
                    node,
                    name,
                    ty,
                    op,
                    args,
                } => Edit::InsertBefore {
                    node: twin(*node)?,
                    name: name.clone(),
                    ty: ty.clone(),
                    op: op.clone(),
                    args: args.clone(),
                },
            })
        })
        .collect()
}

/// Group-alias mutants of one rank graph: the case declares `ALIAS` over the same ranks as a
/// group the rank uses, and the rank's collectives on that group (all of them, or the first)
/// name the alias.
fn group_aliases(
    case: &CaseInput,
    view: &GraphView,
    rank: usize,
) -> Vec<(usize, String, Vec<Edit>, String)> {
    let mut out = Vec::new();
    let declared: Vec<&str> = case.groups.iter().map(|(n, _)| n.as_str()).collect();
    let fresh = |base: &str| {
        let mut name = base.to_string();
        while declared.contains(&name.as_str()) {
            name.push_str("_again");
        }
        name
    };
    let mut used: Vec<String> = Vec::new();
    for n in &view.nodes {
        if sites::is_collective(n) {
            if let Some((_, g)) = sites::group_slot(n) {
                if !used.contains(&g) {
                    used.push(g);
                }
            }
        }
    }
    for g in used {
        let value = case
            .groups
            .iter()
            .find(|(n, _)| *n == g)
            .map(|(_, v)| v.clone());
        let mut aliases: Vec<(String, String)> = Vec::new();
        match &value {
            Some(v) => aliases.push((fresh(&format!("{g}_again")), v.clone())),
            // An undeclared group on a 1-d mesh spans every rank.
            None if case.mesh.len() == 1 => {
                aliases.push((fresh(&format!("{g}_again")), "all".into()))
            }
            None => {}
        }
        // On a 1-d mesh a mesh-dim group is the whole world: `world: all` names the same ranks.
        if case.mesh.len() == 1
            && value
                .as_deref()
                .is_some_and(|v| v == case.mesh[0].0 || v == "all")
        {
            aliases.push((fresh("world"), "all".into()));
        }
        let on_g: Vec<(usize, graph::Slot)> = view
            .nodes
            .iter()
            .enumerate()
            .filter(|(_, n)| sites::is_collective(n))
            .filter_map(|(i, n)| {
                sites::group_slot(n)
                    .filter(|(_, name)| *name == g)
                    .map(|(s, _)| (i, s))
            })
            .collect();
        let Some(&(first, _)) = on_g.first() else {
            continue;
        };
        for (alias, alias_value) in aliases {
            let Some(yaml) = case.with_group(&alias, &alias_value) else {
                continue;
            };
            let line = view.nodes[first].line;
            let all: Vec<Edit> = on_g
                .iter()
                .map(|(i, s)| Edit::SetArg {
                    node: *i,
                    slot: s.clone(),
                    arg: Arg::Str(alias.clone()),
                })
                .collect();
            out.push((
                line,
                format!("case declares \"{alias}\": {alias_value} beside '{g}'; rank {rank}'s {} collective(s) on '{g}' use '{alias}'", on_g.len()),
                all,
                yaml.clone(),
            ));
            if on_g.len() > 1 {
                out.push((
                    line,
                    format!("case declares \"{alias}\": {alias_value} beside '{g}'; rank {rank}'s first collective on '{g}' (`{}`) uses '{alias}'", view.nodes[first].name),
                    vec![Edit::SetArg { node: first, slot: on_g[0].1.clone(), arg: Arg::Str(alias.clone()) }],
                    yaml,
                ));
            }
        }
    }
    out
}

/// One mutant picked for a run, with the index of its case.
#[derive(Debug, Clone)]
pub struct Selected {
    /// Index into the case list the mutants came from.
    pub case: usize,
    /// The mutant.
    pub mutant: Mutant,
}

/// Picks up to `n` mutants, seeded, spread evenly over kinds and, within a kind, over cases:
/// kinds take turns, and each kind takes its cases in turn. The result is ordered by case,
/// then enumeration order, so reports read the same for the same seed.
pub fn sample(per_case: &[Vec<Mutant>], n: usize, seed: u64) -> Vec<Selected> {
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    // pools[kind][case] = shuffled indices of that case's mutants of that kind.
    let mut pools: Vec<Vec<Vec<usize>>> = MutationKind::ALL
        .iter()
        .map(|&k| {
            per_case
                .iter()
                .map(|ms| {
                    let mut idx: Vec<usize> = ms
                        .iter()
                        .enumerate()
                        .filter(|(_, m)| m.kind == k)
                        .map(|(i, _)| i)
                        .collect();
                    idx.shuffle(&mut rng);
                    idx
                })
                .collect()
        })
        .collect();
    let mut next_case = vec![0usize; pools.len()];
    let mut picked: Vec<(usize, usize)> = Vec::new();
    loop {
        let mut progressed = false;
        for (k, pool) in pools.iter_mut().enumerate() {
            if picked.len() >= n {
                break;
            }
            let cases = pool.len();
            for step in 0..cases {
                let c = (next_case[k] + step) % cases;
                if let Some(m) = pool[c].pop() {
                    picked.push((c, m));
                    next_case[k] = c + 1;
                    progressed = true;
                    break;
                }
            }
        }
        if !progressed || picked.len() >= n {
            break;
        }
    }
    picked.sort();
    picked
        .into_iter()
        .map(|(c, m)| Selected {
            case: c,
            mutant: per_case[c][m].clone(),
        })
        .collect()
}
