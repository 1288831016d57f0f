//! Pipeline parallelism (a `pp` mesh dim): the layers are divided into contiguous stages, each
//! rank runs its stage on microbatches of its dp shard of the batch, and the stages pass
//! activations forward and gradients back with `shardproof_p2p.send` / `recv`.
//!
//! - Stages: `layers / pp` consecutive layers each (Megatron's default division: layers must
//!   then divide evenly), or, with `--pp-first-layers` / `--pp-last-layers` (Megatron's
//!   `--decoder-first-pipeline-num-layers` / `--decoder-last-pipeline-num-layers`), the first
//!   and/or last stage given its own count and the remaining layers divided evenly over the
//!   other stages (see [`Division`]). The first stage also holds the
//!   input side (llama's embedding, the mlp's input), the last the output side (llama's final
//!   norm, LM head and cross-entropy; the mlp's MSE loss).
//! - Ranks: row-major over `pp`, `dp`, `tp` (`pp` outermost), so stage `s` holds the ranks
//!   `[s * dp * tp, (s + 1) * dp * tp)`; a rank talks to the rank of the same dp and tp index in
//!   the neighbouring stage. Messages are tagged by microbatch.
//! - Microbatches: each dp rank's batch is sliced into `M` (`--microbatches`); each microbatch
//!   loss is scaled by `1/M`, so the gradients accumulated over the microbatches are those of
//!   the rank's batch (the same machinery as `--grad-accum`, see [`crate::train`]).
//! - Schedules (`--pp-schedule`): GPipe runs every forward, then every backward; 1F1B runs
//!   `pp - 1 - stage` warm-up forwards, then alternates one forward and one backward, then the
//!   remaining backwards (Megatron's non-interleaved schedule). Either way each stage
//!   accumulates its own parameters' gradients; then, as without pp, the tp synchronization,
//!   the dp all-reduce and the optimizer run per stage.
//! - The spec is the single-device model on the whole batch, as for every plan of the zoo.

use crate::bugs::Mutation;
use crate::cp::CpPlan;
use crate::deepseek::{self, DeepseekConfig, EpDispatch, MoeCtx};
use crate::gpt2::{self, Embedded, HeadSaved as Gpt2Head, Masks};
use crate::graph::{Arg, GraphBuilder, Val};
use crate::llama::{
    self, AttnShape, AttnTables, CrossEntropy, HeadSaved, LayerSaved, VocabEmbedding,
};
use crate::mlp::{self, BlockSaved};
use crate::train::{self, LossReport, Step, Weights};
use crate::{Gpt2Config, LlamaConfig, MlpConfig, Param, TpLayout, TrainOptions};
use std::collections::{BTreeMap, BTreeSet};
use std::ops::Range;

mod stages;
use stages::*;

/// The process group of the pp mesh dim (the zoo declares one group per mesh dim, named after
/// it). A stage's index in it is its stage number: the stage's sends and recvs name their
/// peers by it, so every data-parallel (and tensor-parallel) replica of a stage writes the
/// same text.
const PP_GROUP: &str = "pp";

/// The order in which a stage runs the forward and backward passes of its microbatches.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Schedule {
    /// Every forward, then every backward (GPipe).
    #[default]
    GPipe,
    /// One forward, one backward after a warm-up of `pp - 1 - stage` forwards (PipeDream-flush,
    /// Megatron's non-interleaved 1F1B).
    OneFOneB,
}

impl Schedule {
    /// The schedule named `gpipe` or `1f1b`.
    pub fn parse(name: &str) -> Result<Schedule, String> {
        match name {
            "gpipe" => Ok(Schedule::GPipe),
            "1f1b" => Ok(Schedule::OneFOneB),
            other => Err(crate::suggest::unknown(
                "pipeline schedule",
                other,
                ["gpipe", "1f1b"],
                "shardproof zoo emit --help",
            )),
        }
    }

    /// The command-line name.
    pub fn name(self) -> &'static str {
        match self {
            Schedule::GPipe => "gpipe",
            Schedule::OneFOneB => "1f1b",
        }
    }
}

/// The pipeline-parallel options of a plan with a `pp` mesh dim.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PipelineOptions {
    /// Microbatches per dp rank (`--microbatches`).
    pub microbatches: usize,
    /// The schedule (`--pp-schedule`).
    pub schedule: Schedule,
    /// Layers of the first stage (`--pp-first-layers`; `None`: the even share).
    pub first_stage_layers: Option<usize>,
    /// Layers of the last stage (`--pp-last-layers`; `None`: the even share).
    pub last_stage_layers: Option<usize>,
}

impl PipelineOptions {
    /// One microbatch, GPipe, even stages.
    pub const DEFAULT: PipelineOptions = PipelineOptions {
        microbatches: 1,
        schedule: Schedule::GPipe,
        first_stage_layers: None,
        last_stage_layers: None,
    };
}

impl Default for PipelineOptions {
    /// One microbatch, GPipe, even stages.
    fn default() -> Self {
        PipelineOptions::DEFAULT
    }
}

/// How the layers are divided into the pipeline's stages: contiguous ranges, stage `s` running
/// layers `starts[s]..starts[s + 1]`.
///
/// Megatron's rule: by default every stage runs `layers / pp` layers and `layers` must be a
/// multiple of `pp` (Megatron asserts it; the zoo refuses with exit 2 rather than choose a
/// split the user did not ask for). `--pp-first-layers F` / `--pp-last-layers L` (Megatron's
/// `--decoder-first-pipeline-num-layers` / `--decoder-last-pipeline-num-layers`) give the first
/// / last stage its own count, and the remaining layers are divided evenly over the other
/// stages (which must divide them). The usual reason is balance: the first stage also runs the
/// embedding, the last the final norm, LM head and loss, so they get fewer layers (Llama 3
/// 405B: "we reduce one Transformer layer each from the first and the last stages").
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Division {
    starts: Vec<usize>,
}

impl Division {
    /// The division of `layers` over `stages` with the first / last stage's counts `first` /
    /// `last` when given, or why there is none.
    pub fn new(
        layers: usize,
        stages: usize,
        first: Option<usize>,
        last: Option<usize>,
    ) -> Result<Division, String> {
        if stages == 0 {
            return Err("a pipeline needs at least one stage".into());
        }
        let mut counts: Vec<Option<usize>> = vec![None; stages];
        if let Some(f) = first {
            counts[0] = Some(f);
        }
        if let Some(l) = last {
            if stages == 1 && first.is_some_and(|f| f != l) {
                return Err(format!(
                    "--pp-first-layers {} and --pp-last-layers {l} name the same single stage",
                    first.unwrap_or(0)
                ));
            }
            counts[stages - 1] = Some(l);
        }
        if counts.contains(&Some(0)) {
            return Err("--pp-first-layers / --pp-last-layers must be at least 1".into());
        }
        let fixed: usize = counts.iter().flatten().sum();
        let free = counts.iter().filter(|c| c.is_none()).count();
        let explicit = first.is_some() || last.is_some();
        if fixed > layers {
            return Err(format!(
                "--pp-first-layers / --pp-last-layers take {fixed} layers, more than the model's \
                 {layers}"
            ));
        }
        let rest = layers - fixed;
        let per = if free == 0 {
            if rest != 0 {
                return Err(format!(
                    "the first and last stages take {fixed} of {layers} layers; with pp = \
                     {stages} there is no other stage for the remaining {rest}"
                ));
            }
            0
        } else if rest < free || !rest.is_multiple_of(free) {
            return Err(if explicit {
                format!(
                    "the {rest} layer(s) left by --pp-first-layers / --pp-last-layers do not \
                     divide into the other {free} stage(s) evenly"
                )
            } else {
                format!(
                    "{layers} layer(s) do not divide into pp = {stages} stages of equal size \
                     (each stage runs layers / pp consecutive layers; set --layers to a \
                     multiple of {stages}, or give the first and/or last stage its own count \
                     with --pp-first-layers / --pp-last-layers, Megatron's uneven stages)"
                )
            });
        } else {
            rest / free
        };
        let mut starts = vec![0];
        for c in counts {
            let next = starts.last().copied().unwrap_or(0) + c.unwrap_or(per);
            starts.push(next);
        }
        Ok(Division { starts })
    }

    /// `layers / stages` layers per stage (`layers` a multiple of `stages`).
    pub fn even(layers: usize, stages: usize) -> Division {
        Division::new(layers, stages, None, None).expect("an even division")
    }

    /// The number of stages.
    pub fn stages(&self) -> usize {
        self.starts.len() - 1
    }

    /// The layers stage `stage` runs. With the planted `pp-wrong-stage-division`, stage 1 also
    /// runs the last layer of stage 0.
    pub fn stage(&self, stage: usize, bug: Option<Mutation>) -> Range<usize> {
        let (start, end) = (self.starts[stage], self.starts[stage + 1]);
        if stage == 1 && bug == Some(Mutation::PpWrongStageDivision) {
            return start - 1..end;
        }
        start..end
    }

    /// Whether every stage runs the same number of layers.
    pub fn is_even(&self) -> bool {
        let first = self.starts[1] - self.starts[0];
        self.starts.windows(2).all(|w| w[1] - w[0] == first)
    }
}

/// One pass of a stage: the forward or the backward of a microbatch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pass {
    /// The forward of microbatch `.0`.
    Forward(usize),
    /// The backward of microbatch `.0`.
    Backward(usize),
}

/// The passes stage `stage` of `stages` runs, in order, for `microbatches` microbatches.
pub fn passes(
    schedule: Schedule,
    stages: usize,
    stage: usize,
    microbatches: usize,
    forward_only: bool,
) -> Vec<Pass> {
    let m = microbatches;
    if forward_only {
        return (0..m).map(Pass::Forward).collect();
    }
    match schedule {
        Schedule::GPipe => (0..m)
            .map(Pass::Forward)
            .chain((0..m).map(Pass::Backward))
            .collect(),
        Schedule::OneFOneB => {
            let warmup = (stages - 1 - stage).min(m);
            let mut out: Vec<Pass> = (0..warmup).map(Pass::Forward).collect();
            for i in 0..m - warmup {
                out.push(Pass::Forward(warmup + i));
                out.push(Pass::Backward(i));
            }
            out.extend((m - warmup..m).map(Pass::Backward));
            out
        }
    }
}

/// Which microbatch of the labels (targets) the last stage pairs with microbatch `mb` of the
/// activations: the same one, or with the planted `pp-shuffled-microbatches` the next one.
fn label_microbatch(mb: usize, microbatches: usize, bug: Option<Mutation>) -> usize {
    if bug == Some(Mutation::PpShuffledMicrobatches) {
        (mb + 1) % microbatches
    } else {
        mb
    }
}

/// Where a rank sits in the pipeline.
#[derive(Clone, Copy, Debug)]
struct Position {
    /// Its stage.
    stage: usize,
    /// The number of stages.
    stages: usize,
    /// Its global rank.
    rank: usize,
}

impl Position {
    fn first(&self) -> bool {
        self.stage == 0
    }

    fn last(&self) -> bool {
        self.stage + 1 == self.stages
    }
}

/// The data a stage reads of its dp rank's batch: the inputs on the first stage, the labels
/// on the last; each pass slices its microbatch.
struct StageData {
    /// First stage: the rank's inputs (token ids; the mlp's `x`).
    inputs: Option<Val>,
    /// Last stage: the rank's labels (the mlp's targets).
    labels: Option<Val>,
}

impl StageData {
    /// Declares the graph inputs `inputs` and `labels` of `dtype` and `shape` on the stages at
    /// `pos` that read them.
    fn declare(
        g: &mut GraphBuilder,
        pos: Position,
        [inputs, labels]: [&str; 2],
        dtype: &'static str,
        shape: &[usize],
    ) -> StageData {
        StageData {
            inputs: pos.first().then(|| g.input_typed(inputs, dtype, shape)),
            labels: pos.last().then(|| g.input_typed(labels, dtype, shape)),
        }
    }

    /// The `tokens` and `labels` of a decoder's `batch` sequences of `seq` positions.
    fn tokens(g: &mut GraphBuilder, pos: Position, batch: usize, seq: usize) -> StageData {
        Self::declare(g, pos, ["tokens", "labels"], "i64", &[batch, seq])
    }

    /// The inputs of microbatch `mb` of `m` (first stage).
    fn inputs(&self, g: &mut GraphBuilder, mb: usize, m: usize) -> Val {
        let all = self
            .inputs
            .as_ref()
            .expect("the first stage reads the inputs");
        train::microbatch(g, all, mb, m)
    }

    /// The labels of microbatch `mb` of `m` (last stage), as [`label_microbatch`] pairs them.
    fn labels(&self, g: &mut GraphBuilder, mb: usize, m: usize, bug: Option<Mutation>) -> Val {
        let all = self
            .labels
            .as_ref()
            .expect("the last stage reads the labels");
        train::microbatch(g, all, label_microbatch(mb, m, bug), m)
    }
}

/// The name of a microbatch's local loss: `loss` where it is the reported loss itself (one dp
/// rank, one microbatch), `partial` where it is one share of it.
fn local_loss_name(step: &Step, partial: &'static str) -> &'static str {
    if step.dp > 1 || step.microbatches() > 1 {
        partial
    } else {
        "loss"
    }
}

/// Gradients of parameters, by name.
type Grads = BTreeMap<String, Val>;

/// What a model computes on one stage for one microbatch.
trait Stage {
    /// The shape of the activation a stage passes to the next (and of its gradient).
    fn boundary(&self) -> Vec<usize>;
    /// The forward of microbatch `mb` from the activation received from the previous stage
    /// (`None` on the first stage, which reads its inputs); returns the activation to send on
    /// (`None` on the last stage, which records the microbatch's loss instead).
    fn forward(&mut self, g: &mut GraphBuilder, mb: usize, input: Option<Val>) -> Option<Val>;
    /// The backward of microbatch `mb` from the gradient received from the next stage (`None`
    /// on the last stage, which starts from its loss): the microbatch's gradients of the
    /// stage's parameters, by name, and the gradient of the stage's input (sent back by every
    /// stage but the first).
    fn backward(&mut self, g: &mut GraphBuilder, mb: usize, grad: Option<Val>) -> (Grads, Val);
}

/// Runs `passes` of `stage` at `pos`, receiving each pass's input from the neighbouring stage
/// and sending its result on; returns the stage's parameter gradients, by name, accumulated
/// over the microbatches. Honours the planted pipeline bugs of the schedule: a dropped send
/// (`pp-mismatched-send-recv`) and a dp gradient all-reduce before the last backward
/// (`pp-grad-sync-before-last-microbatch`, averaged over `dp`).
fn run_passes(
    g: &mut GraphBuilder,
    pos: Position,
    passes: &[Pass],
    stage: &mut dyn Stage,
    bug: Option<Mutation>,
    dp: usize,
) -> Grads {
    let mut acc = BTreeMap::new();
    let boundary = stage.boundary();
    let last_backward = passes.iter().rev().find_map(|p| match p {
        Pass::Backward(mb) => Some(*mb),
        Pass::Forward(_) => None,
    });
    let last_forward = passes.iter().rev().find_map(|p| match p {
        Pass::Forward(mb) => Some(*mb),
        Pass::Backward(_) => None,
    });
    for pass in passes {
        match *pass {
            Pass::Forward(mb) => {
                let input = (!pos.first()).then(|| g.recv(&boundary, pos.stage - 1, mb, PP_GROUP));
                if let Some(out) = stage.forward(g, mb, input) {
                    // The planted bug: the first stage's schedule stops one send short.
                    let dropped = bug == Some(Mutation::PpMismatchedSendRecv)
                        && pos.first()
                        && Some(mb) == last_forward;
                    if !dropped {
                        g.send(&out, pos.stage + 1, mb, PP_GROUP);
                    }
                }
            }
            Pass::Backward(mb) => {
                if bug == Some(Mutation::PpGradSyncBeforeLastMicrobatch)
                    && Some(mb) == last_backward
                {
                    sync_over_dp(g, &mut acc, dp);
                }
                let grad = (!pos.last()).then(|| g.recv(&boundary, pos.stage + 1, mb, PP_GROUP));
                let (grads, gx) = stage.backward(g, mb, grad);
                train::accumulate(g, &mut acc, grads);
                if !pos.first() {
                    g.send(&gx, pos.stage - 1, mb, PP_GROUP);
                }
            }
        }
    }
    acc
}

/// The planted `pp-grad-sync-before-last-microbatch`: the gradients accumulated so far are
/// all-reduced and averaged over dp now, before the last microbatch's backward adds its own.
fn sync_over_dp(g: &mut GraphBuilder, grads: &mut Grads, dp: usize) {
    for grad in grads.values_mut() {
        let total = g.all_reduce_sum(grad, "dp");
        *grad = g.div_scalar("div", &total, Arg::I(dp as i64));
    }
}

/// Who holds a parameter of a pipelined model.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Owner {
    /// The first stage (the embedding).
    First,
    /// The stages that run this layer.
    Layer(usize),
    /// The last stage (the final norm and the LM head).
    Last,
    /// The first and the last stage (gpt2's token embedding, tied to the LM head).
    Tied,
}

/// The stages that hold a parameter owned by `owner`, for `division` (with the planted bug if
/// any).
fn holders(owner: Owner, division: &Division, bug: Option<Mutation>) -> Vec<usize> {
    let stages = division.stages();
    match owner {
        Owner::First => vec![0],
        Owner::Last => vec![stages - 1],
        Owner::Tied if stages > 1 => vec![0, stages - 1],
        Owner::Tied => vec![0],
        Owner::Layer(l) => (0..stages)
            .filter(|&s| division.stage(s, bug).contains(&l))
            .collect(),
    }
}

/// The owner of each parameter of `model`'s `params` (in model order).
fn owners(model: &str, params: &[Param], layers: usize) -> Vec<Owner> {
    match model {
        // Per layer: w1, b1, w2, b2.
        "mlp" => (0..params.len()).map(|i| Owner::Layer(i / 4)).collect(),
        // The tied token embedding, the position embedding, sixteen parameters per layer, the
        // final LayerNorm's weight and bias.
        // By name: the embedding, `<name>_<layer>`, the final norm and the LM head.
        "deepseek" => params
            .iter()
            .map(|p| match p.name.as_str() {
                "embed" => Owner::First,
                "final_norm" | "lm_head" => Owner::Last,
                name => Owner::Layer(
                    name.rsplit('_')
                        .next()
                        .and_then(|l| l.parse().ok())
                        .expect("a layer parameter ends in its layer"),
                ),
            })
            .collect(),
        "gpt2" => (0..params.len())
            .map(|i| match i {
                0 => Owner::Tied,
                1 => Owner::First,
                i if i < 2 + 16 * layers => Owner::Layer((i - 2) / 16),
                _ => Owner::Last,
            })
            .collect(),
        // The embedding, nine parameters per layer, the final norm and the LM head.
        _ => (0..params.len())
            .map(|i| match i {
                0 => Owner::First,
                i if i <= 9 * layers => Owner::Layer((i - 1) / 9),
                _ => Owner::Last,
            })
            .collect(),
    }
}

/// The sizes and options a pipelined plan is built from.
pub(crate) struct PipelinePlan<'a> {
    /// `mlp` or `llama`.
    pub model: &'a str,
    /// The mlp's sizes (when the model is `mlp`).
    pub mlp: &'a MlpConfig,
    /// The llama's sizes (when the model is `llama`).
    pub llama: &'a LlamaConfig,
    /// The gpt2's sizes (when the model is `gpt2`).
    pub gpt2: &'a Gpt2Config,
    /// gpt2, deepseek: Megatron sequence parallelism within each stage.
    pub sequence_parallel: bool,
    /// The deepseek's sizes (when the model is `deepseek`).
    pub deepseek: &'a DeepseekConfig,
    /// deepseek: size of the `ep` mesh dim (1 for the other models).
    pub ep: usize,
    /// deepseek: the expert dispatcher.
    pub dispatch: EpDispatch,
    /// Sizes of the `pp`, `dp` and `tp` mesh dims.
    pub pp: usize,
    /// Size of the `dp` mesh dim.
    pub dp: usize,
    /// Size of the `tp` mesh dim.
    pub tp: usize,
    /// llama: the embedding and LM head split along the vocabulary over tp.
    pub vocab_parallel: bool,
    /// The pipeline options.
    pub pipeline: PipelineOptions,
    /// The training options of the full iteration (without microbatches: those are
    /// `pipeline.microbatches`).
    pub train: &'a TrainOptions,
    /// The planted bug.
    pub bug: Option<Mutation>,
    /// Forward and loss only.
    pub forward_only: bool,
}

impl PipelinePlan<'_> {
    /// The passes the rank at `pos` runs, in order ([`passes`]).
    fn passes(&self, pos: Position) -> Vec<Pass> {
        passes(
            self.pipeline.schedule,
            pos.stages,
            pos.stage,
            self.pipeline.microbatches,
            self.forward_only,
        )
    }
}

/// Why `plan` cannot be pipelined, if it cannot.
pub(crate) fn check(
    plan: &PipelinePlan,
    layers: usize,
    local_batch: usize,
) -> Result<Division, String> {
    let pp = plan.pp;
    if !["mlp", "llama", "gpt2", "deepseek"].contains(&plan.model) {
        return Err(format!(
            "pipeline parallelism (a pp mesh dim) applies to the mlp, llama, gpt2 and deepseek \
             models, not `{}`",
            plan.model
        ));
    }
    let division = Division::new(
        layers,
        pp,
        plan.pipeline.first_stage_layers,
        plan.pipeline.last_stage_layers,
    )?;
    if plan.bug == Some(Mutation::PpWrongStageDivision) && division.stage(0, None).is_empty() {
        return Err("bug `pp-wrong-stage-division` needs layers on the first stage".into());
    }
    let m = plan.pipeline.microbatches;
    if m == 0 {
        return Err("--microbatches 0: there must be at least one microbatch".into());
    }
    if !local_batch.is_multiple_of(m) {
        return Err(format!(
            "the batch per dp rank ({local_batch}) is not divisible into --microbatches {m} \
             (raise --batch)"
        ));
    }
    if plan.train.grad_accum > 1 {
        return Err(
            "--grad-accum with a pp mesh dim: the pipeline's microbatches are the accumulation \
             steps; use --microbatches instead"
                .into(),
        );
    }
    Ok(division)
}

/// The builder of a pipelined plan's rank graphs (given the rank, row-major over pp, dp, tp:
/// built on demand so that emission holds one at a time), and where each input and output
/// lives: tensor name -> the pp coordinates that hold it (absent: every stage).
pub(crate) fn build_ranks<'a>(
    plan: PipelinePlan<'a>,
    division: Division,
) -> (crate::RankBuilder<'a>, BTreeMap<String, Vec<usize>>) {
    let (pp, dp, tp) = (plan.pp, plan.dp, plan.tp);
    let m = plan.pipeline.microbatches;
    let train = TrainOptions {
        grad_accum: m,
        ..*plan.train
    };
    let (layers, params, data, lr) = match plan.model {
        "mlp" => (
            plan.mlp.layers,
            plan.mlp.params(),
            [("x", Owner::First), ("target", Owner::Last)],
            plan.mlp.lr,
        ),
        "gpt2" => (
            plan.gpt2.layers,
            plan.gpt2.params(),
            [("tokens", Owner::First), ("labels", Owner::Last)],
            plan.gpt2.lr,
        ),
        "deepseek" => (
            plan.deepseek.base.layers,
            plan.deepseek
                .plan_params(&deepseek_rank(&plan, 0), plan.bug),
            [("tokens", Owner::First), ("labels", Owner::Last)],
            plan.deepseek.base.lr,
        ),
        _ => (
            plan.llama.layers,
            plan.llama.params(tp, plan.vocab_parallel),
            [("tokens", Owner::First), ("labels", Owner::Last)],
            plan.llama.lr,
        ),
    };
    let owners = owners(plan.model, &params, layers);
    let mut held: BTreeMap<String, Vec<usize>> = BTreeMap::new();
    for (name, owner) in data {
        held.insert(name.into(), holders(owner, &division, None));
    }
    held.insert("loss".into(), vec![pp - 1]);
    for (p, &owner) in params.iter().zip(&owners) {
        // Inputs where the graphs read them; updated weights expected where the intended
        // division puts them.
        let read = holders(owner, &division, plan.bug);
        let intended = holders(owner, &division, None);
        for state in ["", "exp_avg_", "exp_avg_sq_"] {
            held.insert(format!("{state}{}", p.name), read.clone());
            held.insert(format!("{state}{}_new", p.name), intended.clone());
        }
    }
    let rank_graph = Box::new(move |rank: usize| {
        // The parameters the stage holds (with the planted bug, where it reads them).
        let stage_params = |stage: usize| -> Vec<Param> {
            params
                .iter()
                .zip(&owners)
                .filter(|(_, &o)| holders(o, &division, plan.bug).contains(&stage))
                .map(|(p, _)| p.clone())
                .collect()
        };
        if plan.model == "deepseek" {
            let per_stage = dp * tp * plan.ep;
            let stage = rank / per_stage;
            let pos = Position {
                stage,
                stages: pp,
                rank,
            };
            let specs = stage_params(stage);
            return build_deepseek_stage(&plan, pos, &specs, division.stage(stage, plan.bug));
        }
        let stage = rank / (dp * tp);
        let pos = Position {
            stage,
            stages: pp,
            rank,
        };
        let step = Step {
            opts: &train,
            dp,
            tp,
            dp_rank: rank / tp % dp,
            tp_rank: rank % tp,
            cp: 1,
            stages: pp,
            // The last stage's copy of gpt2's tied embedding (the first stage's counts).
            shared_copies: if plan.model == "gpt2" && pp > 1 && stage == pp - 1 {
                &["wte"]
            } else {
                &[]
            },
            bug: plan.bug,
            lr,
        };
        let specs = stage_params(stage);
        build_stage(&plan, pos, &step, &specs, division.stage(stage, plan.bug))
    });
    (rank_graph, held)
}

/// A model's synchronization of a parameter's gradient before the dp reduction (see
/// [`train::finish`]).
type GradSync<'a> = dyn FnMut(&mut GraphBuilder, &Param, Val) -> Val + 'a;

/// A stage's passes, run by its model (mlp, llama, gpt2): what [`build_stage`] finalizes.
struct StageRun<'a> {
    /// The stage's weights, as declared.
    weights: Weights,
    /// Its parameters' gradients, accumulated over the microbatches.
    acc: Grads,
    /// Its microbatches' losses (last stage).
    losses: LossReport,
    /// The model's synchronization of a parameter's gradient before the dp reduction.
    presync: Box<GradSync<'a>>,
}

/// The graph of the rank at `pos`: its inputs and the schedule's passes (run by the model's
/// stage), then the loss on the last stage and (full iteration) the gradient finalization and
/// optimizer step of the stage's parameters `specs`.
fn build_stage(
    plan: &PipelinePlan,
    pos: Position,
    step: &Step,
    specs: &[Param],
    layers: Range<usize>,
) -> GraphBuilder {
    let mut g = GraphBuilder::new();
    let run = match plan.model {
        "mlp" => run_mlp_stage(&mut g, plan, pos, step, specs, layers),
        "gpt2" => run_gpt2_stage(&mut g, plan, pos, step, specs, layers),
        _ => run_llama_stage(&mut g, plan, pos, step, specs, layers),
    };
    let StageRun {
        weights,
        acc,
        losses,
        presync,
    } = run;
    losses.finish(&mut g, step);
    if plan.forward_only {
        return g;
    }
    // Synchronized early by the planted bug: the dp reduction is not repeated.
    let finish_step = if step.bug == Some(Mutation::PpGradSyncBeforeLastMicrobatch) {
        Step {
            dp: 1,
            dp_rank: 0,
            ..*step
        }
    } else {
        *step
    };
    train::finish(&mut g, &finish_step, specs, &weights, &acc, presync);
    g
}

/// The explicit `embd` process groups of a pipelined gpt2: per dp and tp index, the ranks of
/// the first and the last stage, which hold the tied token embedding (rank
/// `(pp_i * dp + dp_i) * tp + tp_i`).
pub(crate) fn embedding_groups(pp: usize, dp: usize, tp: usize) -> Vec<Vec<usize>> {
    (0..dp * tp)
        .map(|i| vec![i, (pp - 1) * dp * tp + i])
        .collect()
}

/// The explicit `kv` process groups of a llama whose kv heads are replicated over `rep`
/// consecutive tp ranks: per stage and dp index (rank `(pp_i * dp + dp_i) * tp + tp_i`), the
/// tp ranks `[j * rep, (j + 1) * rep)` holding kv head `j`.
pub(crate) fn kv_groups(pp: usize, dp: usize, tp: usize, rep: usize) -> Vec<Vec<usize>> {
    (0..pp * dp)
        .flat_map(|i| (0..tp / rep).map(move |j| (0..rep).map(|k| i * tp + j * rep + k).collect()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gpipe_runs_every_forward_then_every_backward() {
        use Pass::{Backward as B, Forward as F};
        assert_eq!(
            passes(Schedule::GPipe, 2, 0, 2, false),
            vec![F(0), F(1), B(0), B(1)]
        );
        assert_eq!(
            passes(Schedule::GPipe, 2, 1, 3, true),
            vec![F(0), F(1), F(2)]
        );
    }

    #[test]
    fn one_f_one_b_warms_up_by_the_stages_after() {
        use Pass::{Backward as B, Forward as F};
        // 4 stages, 4 microbatches: stage 0 warms up with 3 forwards, the last with none.
        assert_eq!(
            passes(Schedule::OneFOneB, 4, 0, 4, false),
            vec![F(0), F(1), F(2), F(3), B(0), B(1), B(2), B(3)]
        );
        assert_eq!(
            passes(Schedule::OneFOneB, 4, 2, 4, false),
            vec![F(0), F(1), B(0), F(2), B(1), F(3), B(2), B(3)]
        );
        assert_eq!(
            passes(Schedule::OneFOneB, 4, 3, 4, false),
            vec![F(0), B(0), F(1), B(1), F(2), B(2), F(3), B(3)]
        );
        // Fewer microbatches than warm-up slots.
        assert_eq!(
            passes(Schedule::OneFOneB, 4, 0, 2, false),
            vec![F(0), F(1), B(0), B(1)]
        );
        // Every schedule runs each pass once, a forward before its backward.
        for stages in 1..5 {
            for stage in 0..stages {
                for m in 1..6 {
                    let p = passes(Schedule::OneFOneB, stages, stage, m, false);
                    assert_eq!(p.len(), 2 * m);
                    for mb in 0..m {
                        let f = p.iter().position(|x| *x == F(mb)).unwrap();
                        let b = p.iter().position(|x| *x == B(mb)).unwrap();
                        assert!(f < b, "{stages} {stage} {m}: {p:?}");
                    }
                }
            }
        }
    }

    #[test]
    fn stages_divide_the_layers_and_the_bug_shares_one() {
        let even = Division::even(4, 2);
        assert_eq!(even.stage(0, None), 0..2);
        assert_eq!(even.stage(1, None), 2..4);
        let bug = Some(Mutation::PpWrongStageDivision);
        assert_eq!(even.stage(1, bug), 1..4);
        assert_eq!(holders(Owner::Layer(1), &even, bug), vec![0, 1]);
        assert_eq!(holders(Owner::Layer(1), &even, None), vec![0]);
        assert_eq!(holders(Owner::Last, &even, None), vec![1]);
        assert_eq!(
            label_microbatch(1, 2, Some(Mutation::PpShuffledMicrobatches)),
            0
        );
        assert_eq!(
            kv_groups(2, 1, 4, 2),
            vec![vec![0, 1], vec![2, 3], vec![4, 5], vec![6, 7]]
        );
    }

    #[test]
    fn uneven_stages_follow_megatrons_first_and_last_counts() {
        let ranges = |d: &Division| {
            (0..d.stages())
                .map(|s| d.stage(s, None))
                .collect::<Vec<_>>()
        };
        // Llama 3 405B: one layer fewer on the first and the last of 16 stages.
        let d = Division::new(126, 16, Some(7), Some(7)).unwrap();
        assert_eq!(d.stage(0, None), 0..7);
        assert_eq!(d.stage(1, None), 7..15);
        assert_eq!(d.stage(14, None), 111..119);
        assert_eq!(d.stage(15, None), 119..126);
        assert!(!d.is_even());
        assert_eq!(
            ranges(&Division::new(27, 2, None, Some(13)).unwrap()),
            vec![0..14, 14..27]
        );
        assert_eq!(
            ranges(&Division::new(5, 3, Some(1), None).unwrap()),
            vec![0..1, 1..3, 3..5]
        );
        assert!(Division::new(4, 2, None, None).unwrap().is_even());
        // Without counts the layers must divide; with them the rest must.
        assert!(Division::new(126, 16, None, None)
            .unwrap_err()
            .contains("--pp-first-layers"));
        assert!(Division::new(126, 16, Some(6), Some(7)).is_err());
        assert!(Division::new(10, 2, Some(4), Some(5)).is_err());
        assert!(Division::new(4, 2, Some(0), None).is_err());
        assert!(Division::new(4, 2, Some(5), None).is_err());
        assert!(Division::new(3, 4, None, None).is_err());
    }

    #[test]
    fn llama_parameters_belong_to_their_stage() {
        let cfg = LlamaConfig::default();
        let params = cfg.params(1, false);
        let o = owners("llama", &params, cfg.layers);
        assert_eq!(o[0], Owner::First);
        assert_eq!(
            (params[1].name.as_str(), o[1]),
            ("attn_norm_0", Owner::Layer(0))
        );
        assert_eq!(
            (params[18].name.as_str(), o[18]),
            ("w_down_1", Owner::Layer(1))
        );
        assert_eq!(o[19..], [Owner::Last, Owner::Last]);
        let mlp = MlpConfig {
            layers: 2,
            ..MlpConfig::default()
        };
        let o = owners("mlp", &mlp.params(), 2);
        assert_eq!(o, [0, 0, 0, 0, 1, 1, 1, 1].map(Owner::Layer));
    }
}
