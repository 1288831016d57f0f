//! `verify` hands what relation inference cannot decide to the element-level prover
//! (crates/prove; issue 45 item 5): an inconclusive verdict becomes verified when the prover
//! proves the case, and refuted when it refutes it with a counterexample the reference
//! interpreter confirmed; a refutation that no run could confirm gets the prover's
//! counterexample (item 4). The prover works on the shape-reduced case within a time limit,
//! so a large case costs verify at most that limit.

use serde::Serialize;
use shardproof_case::Case;
use shardproof_prove::{
    prove_case_or_full_size, prove_staged, Proof, ProveConfig, Verdict as ProofVerdict,
};
use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

/// What the prover was asked to do.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub(crate) enum Asked {
    /// Decide a case relation inference left inconclusive.
    Decide,
    /// Find a counterexample for a refutation no run confirmed.
    Confirm,
}

/// The prover's counterexample, as verify reports it (the tensors go to `--counterexample`).
#[derive(Clone, Debug, Serialize)]
pub(crate) struct ProvedCounterexample {
    /// The expected output that differs.
    pub output: String,
    /// The element that differs.
    pub index: Vec<usize>,
    /// The interpreter's spec value there.
    pub spec_value: f64,
    /// The value rebuilt from the interpreter's rank outputs there.
    pub rebuilt_value: f64,
    /// Whether the inputs have the shape-reduced sizes (the full-size case is over the
    /// prover's element limit); otherwise they have the case's own.
    pub reduced: bool,
    /// The stage it refutes, when the case was proved in stages (it has cuts).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stage: Option<String>,
}

/// What the prover did with the case, for verify's report.
#[derive(Clone, Debug, Serialize)]
pub(crate) struct Handoff {
    /// Why it was asked.
    pub asked: Asked,
    /// `proved`, `refuted` or `inconclusive`.
    pub verdict: ProofVerdict,
    /// Distinct goals per deciding layer (`normal-form`, `random-witness`,
    /// `product-expansion`, `case-split`, `z3`, `unknown`).
    pub layers: BTreeMap<String, usize>,
    /// Why it is not proved, in words.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// The confirmed counterexample of a refutation.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub counterexample: Option<ProvedCounterexample>,
    /// `full size`, `shape-reduced: A tensor elements instead of B`, or `in N stages`.
    pub sizes: String,
    /// Whether the time limit stopped it.
    pub time_limited: bool,
    /// Seconds taken: counted in the report's own `seconds`, not serialized here, so that the
    /// report stays the same from run to run.
    #[serde(skip)]
    pub seconds: f64,
    /// Where the counterexample's files were written (`--counterexample`).
    #[serde(skip)]
    pub written: Option<String>,
}

/// The prover's settings under verify.
pub(crate) struct Settings<'a> {
    /// Wall-clock limit of the hand-off (0: none).
    pub time_limit: f64,
    /// Threads for a staged proof.
    pub jobs: usize,
    /// Where to write a refutation's counterexample.
    pub counterexample: Option<&'a Path>,
}

/// Runs the prover on `case`: shape-reduced first; where shape reduction refuses an operator
/// (pipelines' send/recv, top-k), at full size within what time is left (the prover's element
/// limit bounds its size). A case with cuts is proved in stages, as `prove` does.
pub(crate) fn hand_off(case: &Case, asked: Asked, s: &Settings) -> Handoff {
    let started = Instant::now();
    let time_limit = (s.time_limit > 0.0).then(|| Duration::from_secs_f64(s.time_limit));
    let cfg = ProveConfig {
        time_limit,
        started: Some(started),
        ..ProveConfig::default()
    };
    let timed_out = || time_limit.is_some_and(|t| started.elapsed() >= t);
    let mut h = if case.inputs.iter().any(|r| r.cut) {
        let staged = prove_staged(case, &cfg, s.jobs.max(1));
        let mut h = Handoff {
            asked,
            verdict: staged.verdict,
            layers: staged.layers.clone(),
            message: staged.message.clone(),
            counterexample: None,
            sizes: format!(
                "in {} stages ({} distinct)",
                staged.stages.len(),
                staged.distinct_stages
            ),
            time_limited: false,
            seconds: 0.0,
            written: None,
        };
        if let Some(p) = &staged.refuted {
            let stage = staged
                .stages
                .iter()
                .find(|st| st.verdict == Some(ProofVerdict::Refuted) && !st.memo_hit)
                .map(|st| format!("stage {} {}", st.index, st.target));
            h.counterexample = counterexample_of(p, stage);
            write(&mut h, p, s.counterexample);
        }
        h
    } else {
        let (proof, _) = prove_case_or_full_size(case, &cfg);
        let mut h = Handoff {
            asked,
            verdict: proof.verdict,
            layers: proof.layers.clone(),
            message: proof.message.clone(),
            counterexample: counterexample_of(&proof, None),
            sizes: proof.reduction.as_ref().map_or("full size".into(), |r| {
                format!(
                    "shape-reduced: {} tensor elements instead of {}",
                    r.elements_after, r.elements_before
                )
            }),
            time_limited: false,
            seconds: 0.0,
            written: None,
        };
        write(&mut h, &proof, s.counterexample);
        h
    };
    // Soundness rests on the prover: it says proved only when every goal was decided equal,
    // and refuted only with a counterexample its interpreter run confirmed. Anything else
    // (a refutation without one) is not a verdict.
    if h.verdict == ProofVerdict::Refuted && h.counterexample.is_none() {
        h.verdict = ProofVerdict::Inconclusive;
        h.message = Some(format!(
            "{} (refuted without a confirmed counterexample, so not a verdict)",
            h.message.as_deref().unwrap_or("refuted")
        ));
    }
    h.time_limited = h.verdict == ProofVerdict::Inconclusive && timed_out();
    h.seconds = started.elapsed().as_secs_f64();
    h
}

fn counterexample_of(p: &Proof, stage: Option<String>) -> Option<ProvedCounterexample> {
    let c = p.counterexample.as_ref()?;
    Some(ProvedCounterexample {
        output: c.output.clone(),
        index: c.index.clone(),
        spec_value: c.spec_value,
        rebuilt_value: c.rebuilt_value,
        reduced: p
            .reduction
            .as_ref()
            .is_some_and(|r| r.counterexample_reduced),
        stage,
    })
}

/// Writes the proof's counterexample into `dir` when asked; a failure to write is reported in
/// the hand-off's message, not as a verdict.
fn write(h: &mut Handoff, p: &Proof, dir: Option<&Path>) {
    let (Some(dir), Some(cx)) = (dir, &p.counterexample) else {
        return;
    };
    match cx.write(dir, &p.case) {
        Ok(()) => h.written = Some(dir.display().to_string()),
        Err(e) => {
            h.message = Some(format!(
                "{}; the counterexample could not be written: {e}",
                h.message.as_deref().unwrap_or("refuted")
            ));
        }
    }
}

impl Handoff {
    /// One line: what the prover decided, by which layers, on which sizes.
    pub(crate) fn summary(&self) -> String {
        let what = match self.verdict {
            ProofVerdict::Proved => format!(
                "the element-level prover proves every expected output equal to the spec's for all inputs ({}; {})",
                crate::prove::layers_text(&self.layers),
                self.sizes
            ),
            ProofVerdict::Refuted => format!(
                "the element-level prover refutes it ({}): {}",
                self.sizes,
                self.counterexample
                    .as_ref()
                    .map(ProvedCounterexample::describe)
                    .unwrap_or_default()
            ),
            ProofVerdict::Inconclusive => format!(
                "the element-level prover did not decide it{}: {}",
                if self.time_limited {
                    " within its time limit (--prove-time-limit)"
                } else {
                    ""
                },
                self.message.as_deref().unwrap_or("undecided goals")
            ),
        };
        match &self.written {
            Some(dir) => format!("{what} (counterexample written to {dir})"),
            None => what,
        }
    }
}

impl ProvedCounterexample {
    /// `output `o` element [i, j]: spec 1.5, rebuilt 0.75 (interpreter-confirmed inputs ...)`.
    pub(crate) fn describe(&self) -> String {
        format!(
            "output `{}` element {:?} is {} in the spec and {} rebuilt from the ranks on inputs the reference interpreter confirms{}{}",
            self.output,
            self.index,
            self.spec_value,
            self.rebuilt_value,
            if self.reduced { " (at the shape-reduced sizes)" } else { "" },
            self.stage
                .as_ref()
                .map(|s| format!(", at {s}"))
                .unwrap_or_default()
        )
    }
}
