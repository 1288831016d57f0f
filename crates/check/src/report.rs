//! Findings and the report: text and JSON, deterministic.

use serde::Serialize;
use std::fmt::Write as _;

/// The check a finding belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Check {
    /// A program output whose placement is not the one the case declares (a partial output
    /// the case does not declare partial included).
    Postcondition,
    /// A collective on an input it cannot take (an all-reduce of a replicated tensor, an
    /// all-gather of a partial sum, a mismatched reduction).
    CommLegality,
    /// Inputs whose placements admit no output placement (shards on different dims, a norm or
    /// softmax over a sharded dim), or ranks that disagree on a placement.
    PlacementConsistency,
    /// Sizes through a collective: group sizes, divisibility, split sizes; and a replicated
    /// operand of the piece's size paired with a shard (global shapes that do not broadcast).
    ShapeDivisibility,
    /// The SPMD type rules: partial x partial, partial + replicate, a nonlinear function of a
    /// partial, an unmasked vocabulary lookup.
    SpmdType,
    /// A forward communication without its dual in the backward (all-gather <->
    /// reduce-scatter, all-to-all <-> all-to-all, send <-> recv).
    GradientDuality,
    /// A functional collective's result read before its `wait_tensor`.
    MissingWait,
    /// A functional collective whose result is never waited on.
    OrphanedHandle,
    /// An in-place write to a buffer an unfinished collective reads or writes.
    DataRace,
    /// Two unfinished collectives on the same buffer.
    BufferAliasing,
    /// Ranks whose collectives cannot meet (a hang), or meet with incompatible shapes or
    /// dtypes.
    CollectiveMismatch,
    /// A pipeline order that is incomplete (a microbatch's forward or backward missing on a
    /// stage, or run twice), or whose gradients are synchronized before the last microbatch.
    PipelineSchedule,
    /// A recv whose matching send never comes (a hang), or a message of another type than its
    /// recv declares.
    DependencyViolation,
}

impl Check {
    /// The name used in reports (`spmd-type`, `missing-wait`, ...).
    pub fn name(self) -> &'static str {
        match self {
            Check::Postcondition => "postcondition",
            Check::CommLegality => "comm-legality",
            Check::PlacementConsistency => "placement-consistency",
            Check::ShapeDivisibility => "shape-divisibility",
            Check::SpmdType => "spmd-type",
            Check::GradientDuality => "gradient-duality",
            Check::MissingWait => "missing-wait",
            Check::OrphanedHandle => "orphaned-handle",
            Check::DataRace => "data-race",
            Check::BufferAliasing => "buffer-aliasing",
            Check::CollectiveMismatch => "collective-mismatch",
            Check::DependencyViolation => "dependency-violation",
            Check::PipelineSchedule => "pipeline-schedule",
        }
    }

    /// Whether the check is spatial (placements) or temporal (program order, schedule).
    pub fn is_temporal(self) -> bool {
        matches!(
            self,
            Check::MissingWait
                | Check::OrphanedHandle
                | Check::DataRace
                | Check::BufferAliasing
                | Check::CollectiveMismatch
                | Check::DependencyViolation
                | Check::PipelineSchedule
        )
    }
}

/// A finding of one rank, before findings of many ranks are merged.
#[derive(Clone, Debug)]
pub struct RawFinding {
    /// The check.
    pub check: Check,
    /// The rank.
    pub rank: usize,
    /// The node index in the rank's graph.
    pub node: usize,
    /// What is wrong.
    pub message: String,
    /// The placements involved, as text.
    pub placements: Vec<String>,
    /// How to fix it.
    pub hint: String,
}

/// A finding: a check that fails at an operator, on one or more ranks.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Finding {
    /// The check.
    pub check: Check,
    /// The ranks where it fails, in increasing order.
    pub ranks: Vec<usize>,
    /// The operator's node name (the first rank's).
    pub node: String,
    /// The operator, for call nodes.
    pub op: Option<String>,
    /// The graph file of the first rank.
    pub file: String,
    /// The node's line in that file.
    pub line: Option<usize>,
    /// The Python source the node was captured from (`file:line`), when recorded.
    pub source: Option<String>,
    /// What is wrong.
    pub message: String,
    /// The placements involved (each tensor with its placement and SPMD type per mesh dim).
    pub placements: Vec<String>,
    /// How to fix it.
    pub hint: String,
}

/// An operator whose outputs the checker could not place.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct UnknownSource {
    /// The reason (no rule for `aten.foo`, an input without a layout, ...).
    pub reason: String,
    /// How many nodes over all ranks.
    pub count: usize,
    /// The first such node: `file:line: node`.
    pub first: String,
}

/// The verdict of a check.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Verdict {
    /// No finding, and every tensor placed.
    Holds,
    /// At least one finding.
    Violated,
    /// No finding, but some placements are unknown: no conclusion.
    Inconclusive,
}

/// What `check` found on a program.
#[derive(Clone, Debug, Serialize)]
pub struct Report {
    /// The case's name.
    pub case: String,
    /// The verdict.
    pub verdict: Verdict,
    /// Ranks checked.
    pub ranks: usize,
    /// Operator calls checked, over every rank.
    pub operators: usize,
    /// Output placements compared with the case's expectations (per rank, per mesh dim).
    pub outputs_checked: usize,
    /// Output placements not proven: `Varying` where the case declares a shard, a value a
    /// peer computes otherwise, a share divided by the mesh size, a partial scaled by a factor
    /// whose meaning is not known (each makes the verdict inconclusive unless there is a
    /// finding; the report lists each output and why).
    pub outputs_layout_unchecked: usize,
    /// Collectives and messages matched across ranks by the simulated schedule.
    pub meetings: usize,
    /// The findings, spatial then temporal, in rank and program order.
    pub findings: Vec<Finding>,
    /// Values whose placement is unknown on some mesh dim, over every rank.
    pub unknown_values: usize,
    /// Why: the operators (or inputs) whose outputs could not be placed.
    pub unknown: Vec<UnknownSource>,
    /// Expected outputs whose placement is unknown.
    pub unknown_outputs: Vec<String>,
}

impl Report {
    /// The report as text (what `shardproof check` prints).
    pub fn render(&self) -> String {
        let mut s = String::new();
        let verdict = match self.verdict {
            Verdict::Holds => "holds: no findings",
            Verdict::Violated => "violated",
            Verdict::Inconclusive => "inconclusive",
        };
        let _ = writeln!(s, "check {}: {verdict}", self.case);
        let _ = writeln!(
            s,
            "  {} ranks, {} operators, {} output placements checked ({} not proven, inconclusive), {} collectives and messages matched",
            self.ranks, self.operators, self.outputs_checked, self.outputs_layout_unchecked, self.meetings
        );
        for (k, f) in self.findings.iter().enumerate() {
            let at = match f.line {
                Some(l) => format!("{}:{l}", f.file),
                None => f.file.clone(),
            };
            let src = f
                .source
                .as_ref()
                .map(|s| format!(" ({s})"))
                .unwrap_or_default();
            let op = f.op.as_ref().map(|o| format!(" ({o})")).unwrap_or_default();
            let _ = writeln!(
                s,
                "finding {}: {} on {}: {at}: node `{}`{op}{src}",
                k + 1,
                f.check.name(),
                ranks_text(&f.ranks),
                f.node
            );
            let _ = writeln!(s, "  {}", f.message);
            for p in &f.placements {
                let _ = writeln!(s, "  placement: {p}");
            }
            let _ = writeln!(s, "  hint: {}", f.hint);
        }
        if self.unknown_values > 0 {
            let _ = writeln!(
                s,
                "unknown placements: {} values (never guessed); from:",
                self.unknown_values
            );
            for u in &self.unknown {
                let _ = writeln!(s, "  {} x {} (first: {})", u.count, u.reason, u.first);
            }
        }
        if !self.unknown_outputs.is_empty() {
            let _ = writeln!(s, "outputs whose placement is not proven:");
            for o in &self.unknown_outputs {
                let _ = writeln!(s, "  output `{o}`");
            }
        }
        s
    }
}

/// `rank 3`, `ranks 0-3`, `ranks 0, 2`.
pub fn ranks_text(ranks: &[usize]) -> String {
    match ranks {
        [r] => format!("rank {r}"),
        _ if ranks.windows(2).all(|w| w[1] == w[0] + 1) && ranks.len() > 2 => {
            format!("ranks {}-{}", ranks[0], ranks[ranks.len() - 1])
        }
        _ => {
            let v: Vec<String> = ranks.iter().map(usize::to_string).collect();
            format!("ranks {}", v.join(", "))
        }
    }
}
