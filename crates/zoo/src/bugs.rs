//! The bug catalog: named mutations of a correct distributed plan.

/// How a catalog bug mutates the correct plan.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mutation {
    /// The all-reduce after the row-parallel linear of layer 0 is removed.
    TpMissingAllreduce,
    /// The row-parallel bias of layer 0 is added before the all-reduce (counted tp times).
    TpBiasBeforeAllreduce,
    /// The data-parallel loss is summed over dp and divided by 1 instead of dp.
    DpLossNotAveraged,
    /// The gradient all-reduce over dp is not followed by the division by dp.
    DpGradNotAveraged,
    /// The row-parallel all-reduce of layer 0 runs over the `dp` group instead of `tp`.
    WrongGroup,
}

/// One entry of the bug catalog.
#[derive(Clone, Copy, Debug)]
pub struct Bug {
    /// The name used on the command line (`--bug ID`).
    pub id: &'static str,
    /// Where the bug class comes from.
    pub source: &'static str,
    /// One line: what goes wrong.
    pub description: &'static str,
    /// The parallelism the bug needs.
    pub parallelism: &'static str,
    /// The engine(s) expected to catch it.
    pub engines: &'static str,
    /// The spec operator where a refinement check should fail.
    pub spec_op: &'static str,
    /// The mutation applied to the plan.
    pub mutation: Mutation,
    /// Needs a `dp` mesh dim larger than 1.
    pub needs_dp: bool,
    /// Needs a `tp` mesh dim larger than 1.
    pub needs_tp: bool,
    /// Needs the full iteration (backward and optimizer step).
    pub needs_backward: bool,
    /// Whether the bug changes the loss (otherwise only the updated weights differ).
    pub changes_loss: bool,
}

/// Every bug this version of the zoo can plant.
pub const BUGS: &[Bug] = &[
    Bug {
        id: "tp-missing-allreduce",
        source: "MISSION.md: missing communication (Megatron-LM row-parallel linear)",
        description: "the all-reduce after the row-parallel fc2 of layer 0 is removed",
        parallelism: "tp",
        engines: "run",
        spec_op: "aten.add.Tensor adding the fc2 bias of layer 0",
        mutation: Mutation::TpMissingAllreduce,
        needs_dp: false,
        needs_tp: true,
        needs_backward: false,
        changes_loss: true,
    },
    Bug {
        id: "tp-bias-before-allreduce",
        source: "MISSION.md: wrong scaling (bias added to every partial sum, Megatron-LM)",
        description:
            "the fc2 bias of layer 0 is added before the all-reduce, so it counts tp times",
        parallelism: "tp",
        engines: "run",
        spec_op: "aten.add.Tensor adding the fc2 bias of layer 0",
        mutation: Mutation::TpBiasBeforeAllreduce,
        needs_dp: false,
        needs_tp: true,
        needs_backward: false,
        changes_loss: true,
    },
    Bug {
        id: "dp-loss-not-averaged",
        source: "MISSION.md: wrong scaling (loss averaging across data-parallel ranks)",
        description: "the loss is all-reduced over dp and divided by 1 instead of dp",
        parallelism: "dp",
        engines: "run",
        spec_op: "aten.mean.default computing the loss",
        mutation: Mutation::DpLossNotAveraged,
        needs_dp: true,
        needs_tp: false,
        needs_backward: false,
        changes_loss: true,
    },
    Bug {
        id: "dp-grad-not-averaged",
        source:
            "MISSION.md: wrong scaling (gradient all-reduce without 1/dp, DeepSpeed/Megatron-LM)",
        description: "gradients are all-reduced over dp but not divided by dp before the SGD step",
        parallelism: "dp (full iteration)",
        engines: "run",
        spec_op: "aten.sub.Tensor of the SGD step (w - lr * grad)",
        mutation: Mutation::DpGradNotAveraged,
        needs_dp: true,
        needs_tp: false,
        needs_backward: true,
        changes_loss: false,
    },
    Bug {
        id: "wrong-group",
        source: "MISSION.md: wrong process group in a collective",
        description: "the row-parallel all-reduce of layer 0 runs over the dp group instead of tp",
        parallelism: "dp x tp",
        engines: "run",
        spec_op: "aten.add.Tensor adding the fc2 bias of layer 0",
        mutation: Mutation::WrongGroup,
        needs_dp: true,
        needs_tp: true,
        needs_backward: false,
        changes_loss: true,
    },
];

/// The catalog entry named `id`.
pub fn find_bug(id: &str) -> Option<&'static Bug> {
    BUGS.iter().find(|b| b.id == id)
}

impl Bug {
    /// Why the bug cannot be planted in a plan with these sizes, if it cannot.
    pub fn check_applies(&self, dp: usize, tp: usize, forward_only: bool) -> Result<(), String> {
        let mut missing = Vec::new();
        if self.needs_dp && dp < 2 {
            missing.push("a dp mesh dim of size >= 2");
        }
        if self.needs_tp && tp < 2 {
            missing.push("a tp mesh dim of size >= 2");
        }
        if self.needs_backward && forward_only {
            missing.push("the full iteration (drop --forward-only)");
        }
        if missing.is_empty() {
            Ok(())
        } else {
            Err(format!("bug `{}` needs {}", self.id, missing.join(" and ")))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_unique_and_found() {
        for (i, b) in BUGS.iter().enumerate() {
            assert!(BUGS[..i].iter().all(|o| o.id != b.id), "{}", b.id);
            assert_eq!(find_bug(b.id).map(|f| f.mutation), Some(b.mutation));
        }
        assert!(find_bug("nope").is_none());
    }

    #[test]
    fn applicability() {
        let wg = find_bug("wrong-group").unwrap();
        assert!(wg.check_applies(2, 2, true).is_ok());
        let e = wg.check_applies(1, 2, true).unwrap_err();
        assert!(e.contains("dp mesh dim"), "{e}");
        let g = find_bug("dp-grad-not-averaged").unwrap();
        assert!(g
            .check_applies(2, 1, true)
            .unwrap_err()
            .contains("--forward-only"));
    }
}
