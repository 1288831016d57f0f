//! The static checker of shardproof: is a distributed program well-placed and race-free on its
//! own? No single-device spec, no values, no e-graph.
//!
//! From a case's input placements (per mesh dim `Shard(d)`, `Replicate()`, `Partial(op)`),
//! [`check_case`] infers the placement of every tensor of every rank graph on every mesh dim
//! through a table of operator rules ([`rules`]), and runs the spatial checks (postcondition,
//! communication legality, placement consistency, shape divisibility through collectives, the
//! SPMD type rules) and the temporal ones (missing wait, orphaned handle, data race, buffer
//! aliasing, and the cross-rank matching of collectives and messages through the
//! interpreter's simulated schedule). An operator without a rule makes its outputs `Unknown`:
//! counted and listed in the [`Report`], never guessed, and a report with unknown placements
//! and no finding is inconclusive.
//!
//! ```
//! use shardproof_check::{check_case, Verdict};
//! # let dir = tempfile::tempdir().unwrap();
//! # let w = |name: &str, text: &str| std::fs::write(dir.path().join(name), text).unwrap();
//! // A row-parallel matmul whose partial sum is returned without its all-reduce.
//! w("spec.py", "def forward(self, x: \"f32[4, 8]\", w: \"f32[8, 6]\"):\n    \
//!     y: \"f32[4, 6]\" = torch.ops.aten.mm.default(x, w)\n    return (y,)\n");
//! for r in 0..2 {
//!     w(&format!("r{r}.py"), "def forward(self, x: \"f32[4, 4]\", w: \"f32[4, 6]\"):\n    \
//!         y: \"f32[4, 6]\" = torch.ops.aten.mm.default(x, w)\n    return (y,)\n");
//! }
//! w("case.yaml", "version: 1\nspec:\n  graph: spec.py\nimpl:\n  mesh: { tp: 2 }\n  \
//!     graphs: [r0.py, r1.py]\ninputs:\n  x: Shard(1)\n  w: Shard(0)\noutputs:\n  y: Replicate()\n");
//! let case = shardproof_case::load_case(&dir.path().join("case.yaml")).unwrap();
//! let report = check_case(&case).unwrap();
//! assert_eq!(report.verdict, Verdict::Violated);
//! let f = &report.findings[0];
//! assert_eq!(f.check.name(), "postcondition");
//! assert_eq!(f.node, "y");
//! assert!(f.hint.contains("insert all_reduce(sum) over tp after `y`"));
//! ```

#![warn(missing_docs)]

mod attention;
mod chunks;
mod cross_rank;
mod duality;
mod engine;
mod outputs;
pub mod pipeline;
mod place;
pub mod plan;
mod region;
mod report;
mod ring;
mod rows;
mod sharing;

use cross_rank::{
    group_name_for, located, merge_findings, p2p_routes, pipeline_findings, schedule_findings,
    DualityKey,
};
use sharing::{Again, Twins};
pub mod rules;
pub mod synth;
mod temporal;
mod vocab;

pub use engine::{group_dims, LocalMeanDims, PieceFactor, RankMetas, RankPlacements};
pub use place::{perm_code, perm_offsets, Place, Red, RowKey, RowTable, SpmdType};
pub use report::{ranks_text, Check, Finding, RawFinding, Report, UnknownSource, Verdict};

use engine::{
    graph_classes, literal_hashes, per_graph, propagate_rank, propagate_rank_again,
    relative_classes, spec_scaling_positions, spec_scalings, structure_hashes, Shared, SpecScaling,
    SpecViews,
};
use shardproof_case::{Blocks, Case, Layout};
use shardproof_interp::{live_values, schedule, typecheck, ScheduleProblem};
use shardproof_ir::{Graph, NodeKind, Progress, ValueId};
use shardproof_ops::{OpClass, Registry};
use std::collections::{BTreeMap, BTreeSet, HashMap};

/// Why a case cannot be checked: the input is invalid.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Invalid {
    /// What is wrong, with the file, line and node, and a hint.
    pub message: String,
}

impl std::fmt::Display for Invalid {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for Invalid {}

/// How many times ranks that receive messages are propagated again, at most, for their
/// senders' placements to arrive (a ring of k ranks needs about k passes).
const MAX_PASSES: usize = 32;

/// The placements [`propagate`] infers, with what the passes saw.
pub struct Propagation {
    /// Per rank, its placements.
    /// Shared by twin ranks (one allocation per distinct run, issue 44: memory).
    pub ranks: Vec<std::sync::Arc<RankPlacements>>,
    /// The simulated schedule.
    pub schedule: shardproof_interp::Schedule,
    /// Per rank: local metas (shared by ranks that run one graph).
    pub metas: Vec<std::sync::Arc<RankMetas>>,
    /// Group name -> mesh dims it spans.
    pub groups: HashMap<String, Option<Vec<usize>>>,
    /// Ranks whose placements were taken from an earlier rank whose run read the same (see
    /// `Twins`), not propagated on their own.
    pub twin_ranks: usize,
    /// Runs of ranks propagated again (receivers of ranks whose placements changed after
    /// they read them), those taken from a twin included.
    pub again_runs: usize,
    /// Of [`Propagation::again_runs`], those whose placements were taken from an earlier
    /// rank's latest run that read the same (see `Again`), not propagated.
    pub again_twin_runs: usize,
}

/// Infers the placement of every value of every rank graph of `case` (type inference and the
/// simulated schedule first: a program that does not type-check, or whose calls have no
/// meaning, is invalid).
pub fn propagate(case: &Case) -> Result<Propagation, Invalid> {
    propagate_counted(case, &Progress::default())
}

/// [`propagate`], counting its work in `progress`: every rank graph's type inference, then
/// every rank's propagation (`rank 3 of 8`); the passes that re-propagate receiving ranks name
/// the rank without counting it.
pub fn propagate_counted(case: &Case, progress: &Progress) -> Result<Propagation, Invalid> {
    let program = &case.program;
    let n = program.ranks.len();
    // Type inference once per distinct graph (ranks reading one file share it).
    let distinct = program
        .ranks
        .iter()
        .map(std::sync::Arc::as_ptr)
        .collect::<BTreeSet<_>>()
        .len();
    progress.start(distinct + n);
    let mut k = 0;
    let metas = per_graph(&program.ranks, |g| {
        k += 1;
        progress.enter(&format!("type inference of graph {k} of {distinct}"));
        let typed = typecheck(g, &case.ops);
        progress.leave();
        match typed {
            Ok(inf) => Ok(std::sync::Arc::new(inf.metas)),
            Err(errors) => {
                let lines: Vec<String> = errors
                    .iter()
                    .take(5)
                    .map(|e| format!("error: {e}"))
                    .collect();
                Err(format!(
                    "the program does not type-check:\n{}",
                    lines.join("\n")
                ))
            }
        }
    })
    .map_err(|message| Invalid { message })?;
    let leaves: Vec<BTreeSet<String>> = (0..program.ranks.len())
        .map(|r| case.rank_leaves(r))
        .collect();
    let sched = schedule(program, &case.ops, Some(&leaves));
    if let Some(ScheduleProblem::Invalid(m)) = &sched.problem {
        return Err(Invalid {
            message: format!("error: {m}"),
        });
    }
    let nd = program.mesh.dims.len();
    let mut ins: Vec<HashMap<ValueId, Vec<Place>>> = vec![HashMap::new(); program.ranks.len()];
    for rel in &case.inputs {
        let places: Vec<Place> = match &rel.layout {
            Layout::Placed(pl) => pl
                .placements
                .iter()
                .enumerate()
                .map(|(m, &p)| {
                    let q = Place::from_case(p);
                    if !pl.blocks.is_trivial() && matches!(q, Place::Shard(_)) {
                        Place::Varying
                    } else if stage_own(&program.mesh, pl, m) {
                        // Held by some pipeline stages only: the stage's own tensor, which the
                        // other stages' programs do not hold (not a piece of one tensor, and
                        // not the same on every stage: `Varying`, which on a pipeline dim is
                        // never read as a shard). Only values every stage holds alike (a tied
                        // weight) are `Replicate()` there.
                        Place::Varying
                    } else {
                        q
                    }
                })
                .collect(),
            Layout::Expr(_) => vec![Place::Unknown; nd],
        };
        for &(r, v) in &rel.rank_values {
            if let Some(m) = ins.get_mut(r) {
                m.insert(v, places.clone());
            }
        }
    }
    let groups: HashMap<String, Option<Vec<usize>>> = program
        .groups
        .iter()
        .map(|g| (g.name.clone(), group_dims(&program.mesh, &g.members)))
        .collect();
    // Per distinct graph, as the metas: names, literal and structure hashes.
    let names = per_graph(&program.ranks, |g| {
        Ok(std::sync::Arc::new(
            g.nodes
                .iter()
                .enumerate()
                .map(|(i, n)| (n.name.as_str(), i as u32))
                .collect::<HashMap<&str, u32>>(),
        ))
    })
    .map_err(|message| Invalid { message })?;
    let literals = per_graph(&program.ranks, |g| {
        Ok(std::sync::Arc::new(literal_hashes(g)))
    })
    .map_err(|message| Invalid { message })?;
    let structure = per_graph(&program.ranks, |g| {
        let l = literal_hashes(g);
        Ok(std::sync::Arc::new(structure_hashes(g, &l)))
    })
    .map_err(|message| Invalid { message })?;
    let graph_class = graph_classes(&program.ranks);
    let rel_class = relative_classes(program);
    // Nodes by structure hash, per distinct structure table, where some mesh dim is a
    // pipeline's (`Shared::stage_alike`).
    let by_structure: Vec<std::sync::Arc<HashMap<u64, u32>>> = if (0..program.mesh.dims.len())
        .any(|m| is_pipeline_dim(&program.mesh, m) && program.mesh.dims[m].1 > 1)
    {
        let mut seen: HashMap<*const Vec<u64>, std::sync::Arc<HashMap<u64, u32>>> = HashMap::new();
        structure
            .iter()
            .map(|s| {
                seen.entry(std::sync::Arc::as_ptr(s))
                    .or_insert_with(|| {
                        let mut m = HashMap::with_capacity(s.len());
                        for (j, &h) in s.iter().enumerate() {
                            m.entry(h).or_insert(j as u32);
                        }
                        std::sync::Arc::new(m)
                    })
                    .clone()
            })
            .collect()
    } else {
        Vec::new()
    };
    let spec_views = SpecViews::new(&case.spec);
    // Ranks with equal graphs and local metas share their view matches; ranks with equal
    // graphs, their scalings' spec positions (one skeleton per graph read for both).
    let mut view_matches: Vec<std::sync::Arc<Vec<Option<u32>>>> = Vec::with_capacity(n);
    let mut spec_scaling_at: Vec<std::sync::Arc<HashMap<u32, SpecScaling>>> = Vec::with_capacity(n);
    for (r, g) in program.ranks.iter().enumerate() {
        let q = graph_class[r];
        let same_metas =
            q < r && (std::sync::Arc::ptr_eq(&metas[q], &metas[r]) || metas[q] == metas[r]);
        // A plan (no spec) matches nothing.
        let sk = (!same_metas && !case.spec.nodes.is_empty())
            .then(|| spec_views.skeleton().map(|_| engine::Skeleton::new(g)))
            .flatten();
        let m = match (&sk, same_metas) {
            (_, true) => view_matches[q].clone(),
            (Some(sk), false) => {
                std::sync::Arc::new(spec_views.matches(&case.spec, g, sk, &metas[r]))
            }
            (None, false) => std::sync::Arc::new(vec![None; g.nodes.len()]),
        };
        view_matches.push(m);
        let at = match (&sk, spec_views.skeleton()) {
            _ if q < r => spec_scaling_at[q].clone(),
            (Some(sk), Some(spec_sk)) => {
                std::sync::Arc::new(spec_scaling_positions(&case.spec, spec_sk, g, sk))
            }
            _ => std::sync::Arc::new(HashMap::new()),
        };
        spec_scaling_at.push(at);
    }
    let sh = Shared {
        program,
        constants: &case.constants,
        custom: &case.ops,
        inputs: ins,
        metas,
        names,
        literals,
        structure,
        by_structure,
        same_exprs: Default::default(),
        groups,
        messages: &sched.messages,
        spec_scalings: spec_scalings(&case.spec),
        spec_scaling_at,
        has_spec: !case.spec.nodes.is_empty(),
        ignore_index_unused: case.assume.ignore_index_unused.is_some(),
        spec_views,
        view_matches,
        graph_class,
        rel_class,
        rows: Default::default(),
        ring_roots: Default::default(),
        peer_maps: Default::default(),
        stage_shares: rules::stage_shares(&case.spec, program),
        aligned: Default::default(),
    };
    // Who receives from whom: a rank's placements depend only on its own graph and on the
    // placements its senders had when it read them.
    let mut receivers: Vec<BTreeSet<usize>> = vec![BTreeSet::new(); n];
    for (&(q, _), &(s, _)) in sched.messages.iter() {
        if s != q && s < n {
            receivers[s].insert(q);
        }
    }
    let mut done: Vec<Option<std::sync::Arc<RankPlacements>>> = vec![None; n];
    // Ranks to propagate again: a receiver of a rank whose placements changed after the
    // receiver last read them (in the first pass, the receivers that came before it).
    let mut again: BTreeSet<usize> = BTreeSet::new();
    let mut twins = Twins::new(&sh);
    let mut shared_runs = 0usize;
    for r in 0..n {
        progress.enter(&format!("placements of rank {r} of {n}"));
        done[r] = Some(match twins.of(&sh, r, &done) {
            Some(q) => {
                shared_runs += 1;
                done[q].clone().unwrap_or_default()
            }
            None => {
                let calls = sh.ring_roots.borrow().calls;
                let rp = propagate_rank(&sh, r, &done).0;
                let roots_read = sh.ring_roots.borrow().calls != calls;
                twins.note(&sh, r, roots_read);
                std::sync::Arc::new(rp)
            }
        });
        progress.leave();
        again.extend(receivers[r].iter().filter(|&&q| q < r));
    }
    tracing::debug!(shared_runs, ranks = n, "placements taken from a twin rank");
    // Each rank is propagated again at most MAX_PASSES - 1 times (a bound on pathological
    // message chains; zoo pipelines settle in a few).
    let mut runs = vec![1usize; n];
    // Ranks propagated again read their recvs' current senders: one whose reads, graph and
    // every other read equal an earlier rank's latest run takes its placements (`Again`).
    let mut again_twins = Again::new(&sh, n);
    let mut again_shared = 0usize;
    while let Some(r) = again.pop_first() {
        if runs[r] >= MAX_PASSES {
            continue;
        }
        runs[r] += 1;
        progress.enter(&format!("placements of rank {r} of {n}, pass {}", runs[r]));
        let reads = Again::reads(&sh, r, &done);
        let prev = done[r].take().unwrap_or_default();
        let (rp, changed) = match again_twins.of(&sh, r, &reads, &done) {
            Some(q) => {
                again_shared += 1;
                let rp = done[q].clone().unwrap_or_default();
                let changed = !std::sync::Arc::ptr_eq(&rp, &prev) && rp.places != prev.places;
                (rp, changed)
            }
            // The run again edits its own copy where `prev` is shared with twins.
            None => {
                let (rp, changed) =
                    propagate_rank_again(&sh, r, &done, std::sync::Arc::unwrap_or_clone(prev));
                (std::sync::Arc::new(rp), changed)
            }
        };
        // Either way `r`'s placements are now what a run reading `reads` gives.
        again_twins.note(&sh, r, reads);
        done[r] = Some(rp);
        if changed {
            again.extend(receivers[r].iter().copied());
        }
    }
    tracing::debug!(
        runs = runs.iter().sum::<usize>(),
        ranks = n,
        "propagations, the receiving ranks' again included"
    );
    tracing::debug!(again_shared, "runs again taken from a twin rank");
    let Shared { metas, groups, .. } = sh;
    Ok(Propagation {
        ranks: done.into_iter().map(Option::unwrap_or_default).collect(),
        schedule: sched,
        metas,
        groups,
        twin_ranks: shared_runs,
        again_runs: runs.iter().sum::<usize>() - n,
        again_twin_runs: again_shared,
    })
}

/// Checks `case`: propagation, then every spatial and temporal check (see the crate docs).
pub fn check_case(case: &Case) -> Result<Report, Invalid> {
    check_case_counted(case, &Progress::default())
}

/// [`check_case`], counting its work in `progress` (see [`propagate_counted`]), for another
/// thread to show while it runs.
///
/// A violated report's postcondition, legality, SPMD-type and placement findings get their
/// hint from [`synth::synthesize`] where the search finds edits after which the program checks
/// with no finding (small programs only: see [`synth::MAX_NODES`]).
pub fn check_case_counted(case: &Case, progress: &Progress) -> Result<Report, Invalid> {
    let mut report = check_unfixed(case, progress)?;
    if report.verdict == Verdict::Violated {
        let fix = synth::synthesize(case, &report, &|c| check_case_without_fixes(c).ok());
        if let Some(fix) = fix {
            let text = fix.describe(case);
            for f in &mut report.findings {
                if matches!(
                    f.check,
                    Check::Postcondition
                        | Check::CommLegality
                        | Check::SpmdType
                        | Check::PlacementConsistency
                ) {
                    f.hint =
                        format!("{text} (synthesized: with it the program checks with no finding)");
                }
            }
        }
    }
    Ok(report)
}

/// [`check_case`] without fix synthesis: the hints are the rules' own. The check
/// [`synth::synthesize`] runs on each candidate program.
pub fn check_case_without_fixes(case: &Case) -> Result<Report, Invalid> {
    check_unfixed(case, &Progress::default())
}

/// Turns twin ranks off (`true`) or back on for this thread's propagations: tests compare
/// every rank's placements with and without them (a twin must get what its own run gives).
pub fn twins_off(off: bool) {
    engine::NO_TWINS.with(|f| f.set(off));
}

/// Whether mesh dim `m` is a pipeline's (named `pp`): its coordinates run different stage
/// programs, so no value along it is a piece of another stage's tensor.
pub(crate) fn is_pipeline_dim(mesh: &shardproof_ir::Mesh, m: usize) -> bool {
    mesh.dims.get(m).is_some_and(|(name, _)| name == "pp")
}

/// Whether a case tensor laid out as `pl` is, on mesh dim `m`, a pipeline stage's own: `m` is
/// the pipeline's (more than one stage) and `at:` leaves out some of its stages.
fn stage_own(mesh: &shardproof_ir::Mesh, pl: &shardproof_case::PlacedLayout, m: usize) -> bool {
    let stages = mesh.dims.get(m).map_or(0, |d| d.1);
    is_pipeline_dim(mesh, m)
        && stages > 1
        && pl
            .at
            .iter()
            .any(|h| h.dim == m && (0..stages).any(|c| !h.coords.contains(&c)))
}

/// The checks, without fix synthesis.
fn check_unfixed(case: &Case, progress: &Progress) -> Result<Report, Invalid> {
    let prop = propagate_counted(case, progress)?;
    let program = &case.program;
    let nd = program.mesh.dims.len();
    let mut raw: Vec<RawFinding> = Vec::new();
    for rp in &prop.ranks {
        raw.extend(rp.findings.iter().cloned());
    }
    // Postcondition: every expected output in the placement the case declares.
    let mut outputs_checked = 0;
    let mut unchecked = 0;
    let mut unknown_outputs = BTreeSet::new();
    let mut declared: BTreeSet<(usize, ValueId)> = BTreeSet::new();
    // Whether two ranks compute their values of one declared output the same way along a
    // mesh dim (`outputs::Comparison::same`).
    let mut comparison = outputs::Comparison::new(program, &prop);
    for exp in &case.outputs {
        let Layout::Placed(pl) = &exp.layout else {
            unknown_outputs.insert(format!("{} (an expression layout)", exp.spec_name));
            continue;
        };
        let value_on: HashMap<usize, ValueId> = exp.rank_values.iter().copied().collect();
        for &(r, v) in &exp.rank_values {
            declared.insert((r, v));
            let rp = &prop.ranks[r];
            let got = rp.of(v, nd);
            let g = &program.ranks[r];
            for (m, &have) in got.iter().enumerate() {
                if pl.at.iter().any(|h| h.dim == m) {
                    continue;
                }
                let want = Place::from_case(pl.placements[m]);
                outputs_checked += 1;
                // A shard declared with fused blocks or replicated pieces is the layout
                // `Blocked(d, k)` names only for k equal unreplicated blocks; any other
                // reading of it is not proven (a plain `Shard(d)` concatenates the pieces
                // contiguously, which a fused layout does not).
                let blocked_want = match (want, &pl.blocks) {
                    (Place::Shard(d), Blocks::Equal { count, replicas: 1 }) if *count > 1 => {
                        u16::try_from(*count).ok().map(|k| Place::Blocked(d, k))
                    }
                    _ => None,
                };
                let fused = !pl.blocks.is_trivial() && matches!(want, Place::Shard(_));
                let scale_unknown = rp.scale_unknown
                    [(rp.offsets[v.node] as usize + v.output) * nd + m]
                    && have.is_partial()
                    && want.is_partial();
                // A replicated output that a peer along this dim computes otherwise (another
                // operator, other inputs, other literals under the output's name): whether
                // the ranks hold one tensor is not proven (issue 44, soundness; was a pass,
                // as rules compare a node with its peer node of the same name and operator,
                // and a peer with none counted as "not varying"). Graphs that differ only
                // by a replicated term added on some ranks still compute the output the same
                // way where the output does not read that term's sum.
                // A declared shard or partial too (round 3): its pieces are pieces (or
                // summands) of one tensor only where every peer computes its piece the same
                // way from its own pieces of the leaves (was: a pass for `mm(h, w)`, `w`
                // sharded, and `h * p`, `p` partial, with `h` computed otherwise on a peer
                // under the same name; `run` finds `y` wrong). A correct partial whose ranks
                // add a term alone is inconclusive here (no zoo plan declares one).
                let otherwise = want == have
                    && matches!(want, Place::Replicate | Place::Shard(_) | Place::Partial(_))
                    && program.mesh.dims[m].1 > 1
                    && !is_pipeline_dim(&program.mesh, m)
                    && engine::peers(&program.mesh, r, m).into_iter().any(|p| {
                        p != r
                            && value_on
                                .get(&p)
                                .is_none_or(|&pv| !comparison.same(r, v, p, pv, m))
                    });
                let ok = match (want, have) {
                    (_, Place::Unknown) => {
                        unknown_outputs.insert(exp.spec_name.clone());
                        true
                    }
                    _ if otherwise => {
                        unchecked += 1;
                        unknown_outputs.insert(format!(
                            "{} ({want} over `{}`, computed otherwise on a peer rank: not proven)",
                            exp.spec_name, program.mesh.dims[m].0
                        ));
                        true
                    }
                    // Pieces scaled by a number whose meaning is not known: what they
                    // combine to is not proven (a partial declared where another placement
                    // is, is a finding as before).
                    _ if scale_unknown => {
                        unchecked += 1;
                        let why = if rp.part_rows[(rp.offsets[v.node] as usize + v.output) * nd + m]
                        {
                            "a reduction over part of each rank's rows (one microbatch's)"
                        } else {
                            "its pieces scaled by a number whose meaning is not known"
                        };
                        unknown_outputs.insert(format!(
                            "{} ({have} over `{}`, {why}: not proven)",
                            exp.spec_name, program.mesh.dims[m].0
                        ));
                        true
                    }
                    // A replicated value divided by n where the spec need not divide (`scaled`:
                    // its n copies sum to the undivided value) declared replicated: each copy
                    // is 1/n of the spec's tensor unless the spec divides too, which the
                    // record does not say (was: a pass; `run` finds the output wrong). A
                    // plan is its own spec: the division is in the program it declares.
                    (Place::Replicate, Place::Replicate)
                        if !case.spec.nodes.is_empty()
                            && rp.scaled[(rp.offsets[v.node] as usize + v.output) * nd + m] =>
                    {
                        unchecked += 1;
                        unknown_outputs.insert(format!(
                            "{} (Replicate() over `{}`, divided by the mesh size where the spec may not divide: not proven)",
                            exp.spec_name, program.mesh.dims[m].0
                        ));
                        true
                    }
                    (_, h) if fused && blocked_want == Some(h) => true,
                    (Place::Shard(_), _) if fused => {
                        unchecked += 1;
                        unknown_outputs.insert(format!(
                            "{} ({have} over `{}` where {want} with fused blocks is declared: layout not proven)",
                            exp.spec_name, program.mesh.dims[m].0
                        ));
                        true
                    }
                    (w, h) if w == h => true,
                    // Differs across ranks, but in no layout the checker knows: whether it is
                    // the declared shard is not proven (inconclusive, never a pass).
                    (
                        Place::Shard(_),
                        Place::Varying | Place::Rows(..) | Place::Rolled(..) | Place::Permuted(..),
                    ) => {
                        unchecked += 1;
                        unknown_outputs.insert(format!(
                            "{} ({have} over `{}` where {want} is declared: layout not proven)",
                            exp.spec_name, program.mesh.dims[m].0
                        ));
                        true
                    }
                    // A sum declared and an average held, or the reverse (was: a pass): pieces
                    // that sum to the tensor average to 1/n of it. Not a finding: the labels
                    // follow scalings by a number (`partial_scaling`), but a product with a
                    // tensor the checker does not know to be scaled may still make up for the
                    // difference; which the values are is not proven (inconclusive, never a
                    // pass). A max or min against a sum is a finding.
                    (Place::Partial(a), Place::Partial(b)) if a.is_linear() && b.is_linear() => {
                        unchecked += 1;
                        unknown_outputs.insert(format!(
                            "{} ({have} over `{}` where {want} is declared: pieces that sum and pieces that average differ by the mesh size, unless a scaling by 1/n the checker does not follow makes up for it: not proven)",
                            exp.spec_name, program.mesh.dims[m].0
                        ));
                        true
                    }
                    _ => false,
                };
                if !ok {
                    let dim = &program.mesh.dims[m].0;
                    let what = match (want, have) {
                        (Place::Partial(_), Place::Partial(_)) => {
                            "pieces that combine by another reduction"
                        }
                        (_, Place::Partial(_) | Place::Unmasked) => "an unreduced partial sum",
                        (
                            _,
                            Place::Varying
                            | Place::Rows(..)
                            | Place::Rolled(..)
                            | Place::Permuted(..),
                        ) => "a tensor that differs across ranks in no declared layout",
                        _ => "a different placement",
                    };
                    let hint = match (want, have) {
                        (_, Place::Partial(red)) => {
                            let o = rp.origin[(rp.offsets[v.node] as usize + v.output) * nd + m];
                            let origin = if o == u32::MAX { v.node } else { o as usize };
                            let on = &g.nodes[origin];
                            let at = on
                                .loc
                                .as_ref()
                                .map(|l| format!(", {}:{}", l.file, l.line))
                                .unwrap_or_default();
                            format!(
                                "insert all_reduce({}) over {} after `{}`{at}",
                                red.name(),
                                group_name_for(&prop, program, m),
                                on.name
                            )
                        }
                        _ => format!(
                            "make `{}` {want} over `{dim}` (or declare the placement it has)",
                            exp.impl_name
                        ),
                    };
                    raw.push(RawFinding {
                        check: Check::Postcondition,
                        rank: r,
                        node: v.node,
                        message: format!(
                            "output `{}` must be {want} over mesh dim `{dim}`, but the rank holds {what}: {have}",
                            exp.spec_name
                        ),
                        placements: vec![format!("`{}` {{{dim}: {have}}}", g.value_name(v))],
                        hint,
                    });
                }
            }
        }
    }
    // Program outputs the case does not declare must not be pending sums.
    for (r, g) in program.ranks.iter().enumerate() {
        for v in g.outputs.iter().flatten() {
            if declared.contains(&(r, *v)) {
                continue;
            }
            for m in 0..nd {
                let p = prop.ranks[r].of(*v, nd)[m];
                if p.is_partial() {
                    let dim = &program.mesh.dims[m].0;
                    raw.push(RawFinding {
                        check: Check::Postcondition,
                        rank: r,
                        node: v.node,
                        message: format!("the program returns `{}`, {p} over mesh dim `{dim}`, which the case does not declare partial", g.value_name(*v)),
                        placements: vec![format!("`{}` {{{dim}: {p}}}", g.value_name(*v))],
                        hint: format!("reduce it over {} before returning it, or declare it Partial in the case's outputs", group_name_for(&prop, program, m)),
                    });
                }
            }
        }
    }
    // Temporal checks per rank: a function of the rank's graph (the rank only labels the
    // findings), so once per graph that several ranks load, relabelled for each.
    let mut temporal_of: HashMap<*const shardproof_ir::Graph, (usize, Vec<RawFinding>)> =
        HashMap::new();
    for (r, g) in program.ranks.iter().enumerate() {
        let (first, found) = temporal_of
            .entry(std::sync::Arc::as_ptr(g))
            .or_insert_with(|| (r, temporal::temporal(g, r, &case.ops)));
        raw.extend(found.iter().map(|f| {
            debug_assert_eq!(f.rank, *first);
            RawFinding {
                rank: r,
                ..f.clone()
            }
        }));
    }
    // Gradient duality, where a rank's program has a backward. Its findings are a function of
    // the rank's graph, local metas, placements (what `varies_over` reads) and of where its
    // point-to-point calls go, the rank itself only labelling them: a rank whose graph and
    // metas are an earlier rank's (the same allocations), whose placements are equal and
    // whose messages go to peers at the same coordinate offsets (`p2p_routes`: the pairing
    // of sends with recvs, and which run along the pipeline, depend on nothing else) has
    // none where that rank had none (issue 44: per rank, it was a tenth of the check).
    let mut p2p_nodes: HashMap<*const Graph, Vec<usize>> = HashMap::new();
    let mut no_duality: HashMap<DualityKey, Vec<usize>> = HashMap::new();
    for (r, g) in program.ranks.iter().enumerate() {
        let rp = &prop.ranks[r];
        let nodes = p2p_nodes
            .entry(std::sync::Arc::as_ptr(g))
            .or_insert_with(|| {
                g.nodes
                    .iter()
                    .enumerate()
                    .filter(|(_, n)| {
                        n.op()
                            .is_some_and(|o| o.namespace == shardproof_ops::P2P_NAMESPACE)
                    })
                    .map(|(i, _)| i)
                    .collect()
            });
        let key: Option<DualityKey> = p2p_routes(program, r, nodes).map(|routes| {
            (
                std::sync::Arc::as_ptr(g),
                std::sync::Arc::as_ptr(&prop.metas[r]),
                routes,
            )
        });
        let alike = key
            .as_ref()
            .and_then(|k| no_duality.get(k))
            .is_some_and(|qs| {
                qs.iter().any(|&q| {
                    std::sync::Arc::ptr_eq(&prop.ranks[q], rp) || prop.ranks[q].places == rp.places
                })
            });
        if alike {
            continue;
        }
        let varies_over = |v: ValueId, group: &str| {
            let dims: Vec<usize> = match prop.groups.get(group) {
                Some(Some(d)) => d.clone(),
                _ => (0..nd).collect(),
            };
            let places = rp.of(v, nd);
            dims.iter()
                .any(|&m| places.get(m).is_some_and(|p| *p != Place::Replicate))
        };
        let found = duality::duality(
            g,
            r,
            &program.mesh,
            &shardproof_ops::program_members(program, r),
            &prop.metas[r],
            &varies_over,
        );
        if let Some(key) = key.filter(|_| found.is_empty()) {
            no_duality.entry(key).or_default().push(r);
        }
        raw.extend(found);
    }
    // Cross-rank matching: the schedule, then the shapes of what meets.
    raw.extend(schedule_findings(case, &prop));
    raw.extend(pipeline_findings(program, &prop));
    let mut findings = merge_findings(program, raw);
    findings.sort_by_key(|f| (f.check.is_temporal(), f.ranks[0], f.line, f.node.clone()));
    findings.dedup();
    // Unknown placements.
    let mut sources: BTreeMap<String, (usize, String)> = BTreeMap::new();
    for (r, rp) in prop.ranks.iter().enumerate() {
        let g = &program.ranks[r];
        for (i, reason) in &rp.unknown_sources {
            let e = sources.entry(reason.clone()).or_insert((0, located(g, *i)));
            e.0 += 1;
        }
    }
    let unknown_values: usize = prop.ranks.iter().map(|rp| rp.unknown_values).sum();
    let verdict = if !findings.is_empty() {
        Verdict::Violated
    } else if unknown_values > 0 || !unknown_outputs.is_empty() {
        Verdict::Inconclusive
    } else {
        Verdict::Holds
    };
    let operators = program
        .ranks
        .iter()
        .map(|g| {
            g.nodes
                .iter()
                .filter(|n| matches!(n.kind, NodeKind::Call { .. }))
                .count()
        })
        .sum();
    Ok(Report {
        case: case.name.clone(),
        verdict,
        ranks: program.ranks.len(),
        operators,
        outputs_checked,
        outputs_layout_unchecked: unchecked,
        meetings: prop.schedule.meetings.len() + prop.schedule.messages.len(),
        findings,
        unknown_values,
        unknown: sources
            .into_iter()
            .map(|(reason, (count, first))| UnknownSource {
                reason,
                count,
                first,
            })
            .collect(),
        unknown_outputs: unknown_outputs.into_iter().collect(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Propagating a receiving rank again from its first changed recv gives what a run from
    /// the start gives, on the pipeline demos (recvs from later stages resolve in a second
    /// run).
    #[test]
    fn resuming_at_the_first_changed_recv_is_a_full_run() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/plans");
        for name in [
            "pp_2stage.plan",
            "pp_2stage_missing_microbatch.plan",
            "sp_mlp_train.plan",
        ] {
            let case = plan::load_plan(&dir.join(name)).unwrap();
            let resumed = propagate(&case).unwrap();
            engine::FULL_RERUNS.with(|f| f.set(true));
            let full = propagate(&case).unwrap();
            engine::FULL_RERUNS.with(|f| f.set(false));
            for (a, b) in resumed.ranks.iter().zip(&full.ranks) {
                assert_eq!(a.places, b.places, "{name}");
                assert_eq!(a.findings.len(), b.findings.len(), "{name}");
                assert_eq!(a.unknown_values, b.unknown_values, "{name}");
            }
        }
    }

    /// Propagates `case` with and without twins, asserts that every rank gets the same
    /// placements, findings and unknowns and the report is the same; returns the twin ranks.
    fn twins_exact(case: &Case, label: &str) -> usize {
        let shared = propagate(case).unwrap();
        engine::NO_TWINS.with(|f| f.set(true));
        let own = propagate(case).unwrap();
        let own_report = check_case(case).unwrap().render();
        engine::NO_TWINS.with(|f| f.set(false));
        assert_eq!(own.twin_ranks, 0);
        for (a, b) in shared.ranks.iter().zip(&own.ranks) {
            assert_eq!(a.places, b.places, "{label}");
            assert_eq!(a.findings.len(), b.findings.len(), "{label}");
            assert_eq!(a.unknown_values, b.unknown_values, "{label}");
            assert_eq!(a.unknown_sources, b.unknown_sources, "{label}");
        }
        assert_eq!(check_case(case).unwrap().render(), own_report, "{label}");
        shared.twin_ranks
    }

    /// A rank whose placements are taken from a twin gets what its own run gives, on every
    /// demo plan (twins among them: the tensor-parallel ranks of `tp_linear`, whose graphs
    /// are equal), and the report is the same.
    #[test]
    fn a_twin_rank_gets_what_its_own_run_gives() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/plans");
        let mut names: Vec<_> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|x| x == "plan"))
            .collect();
        names.sort();
        let mut twins = 0;
        for path in names {
            let case = plan::load_plan(&path).unwrap();
            twins += twins_exact(&case, &path.display().to_string());
        }
        assert!(twins > 0, "no demo plan has a twin rank");
    }
}
