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
    /// Ranks per stage (`dp * tp`): the distance to the same rank of the next stage.
    stride: usize,
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
                let input = (!pos.first()).then(|| g.recv(&boundary, pos.rank - pos.stride, mb));
                if let Some(out) = stage.forward(g, mb, input) {
                    // The planted bug: the first stage's schedule stops one send short.
                    let dropped = bug == Some(Mutation::PpMismatchedSendRecv)
                        && pos.first()
                        && Some(mb) == last_forward;
                    if !dropped {
                        g.send(&out, pos.rank + pos.stride, mb);
                    }
                }
            }
            Pass::Backward(mb) => {
                if bug == Some(Mutation::PpGradSyncBeforeLastMicrobatch)
                    && Some(mb) == last_backward
                {
                    sync_over_dp(g, &mut acc, dp);
                }
                let grad = (!pos.last()).then(|| g.recv(&boundary, pos.rank + pos.stride, mb));
                let (grads, gx) = stage.backward(g, mb, grad);
                train::accumulate(g, &mut acc, grads);
                if !pos.first() {
                    g.send(&gx, pos.rank - pos.stride, mb);
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

/// The mlp on one stage.
struct MlpStage<'a> {
    cfg: &'a MlpConfig,
    step: &'a Step<'a>,
    pos: Position,
    layers: Range<usize>,
    weights: &'a Weights,
    /// The rank's inputs `x` (first stage) and targets (last stage).
    data: StageData,
    /// Per microbatch: each block's saved values and (last stage) `y - target`.
    saved: BTreeMap<usize, (Vec<BlockSaved>, Option<Val>)>,
    losses: LossReport,
}

impl MlpStage<'_> {
    /// The rows of a microbatch.
    fn rows(&self) -> usize {
        self.cfg.batch / self.step.dp / self.step.microbatches()
    }

    /// The stage's weights for one pass, by name: w1, b1, w2, b2 of layer `l`.
    fn block_weights<'w>(
        &self,
        w: &'w BTreeMap<String, Val>,
        l: usize,
    ) -> (&'w Val, &'w Val, &'w Val, &'w Val) {
        let name = |p: &str| &w[&format!("{p}_{l}")];
        (name("w1"), name("b1"), name("w2"), name("b2"))
    }
}

impl Stage for MlpStage<'_> {
    fn boundary(&self) -> Vec<usize> {
        vec![self.rows(), self.cfg.hidden]
    }

    fn forward(&mut self, g: &mut GraphBuilder, mb: usize, input: Option<Val>) -> Option<Val> {
        let m = self.step.microbatches();
        let w = self.weights.pass(g);
        let mut act = match input {
            Some(x) => x,
            None => self.data.inputs(g, mb, m),
        };
        let mut blocks = Vec::new();
        for l in self.layers.clone() {
            let (y, saved) = mlp::block(
                g,
                &act,
                l,
                self.block_weights(&w, l),
                self.step.tp,
                self.step.bug,
            );
            blocks.push(saved);
            act = y;
        }
        if !self.pos.last() {
            self.saved.insert(mb, (blocks, None));
            return Some(act);
        }
        let target = self.data.labels(g, mb, m, self.step.bug);
        let diff = g.sub("sub", &act, &target);
        let sq = g.square(&diff);
        let local = g.mean(local_loss_name(self.step, "mean"), &sq);
        self.losses.add(g, self.step, local);
        self.saved.insert(mb, (blocks, Some(diff)));
        None
    }

    fn backward(&mut self, g: &mut GraphBuilder, mb: usize, grad: Option<Val>) -> (Grads, Val) {
        let w = self.weights.pass(g);
        let (blocks, diff) = self.saved.remove(&mb).expect("forward before backward");
        let mut grad_y = match (grad, diff) {
            (Some(grad), _) => grad,
            (None, Some(diff)) => {
                // d mean((y - t)^2) / dy = 2 (y - t) / numel.
                let twice = g.mul_scalar("mul", &diff, Arg::I(2));
                let seed = g.div_scalar(
                    "div",
                    &twice,
                    Arg::I((self.rows() * self.cfg.hidden) as i64),
                );
                train::scale_seed(g, self.step, &seed)
            }
            (None, None) => unreachable!("only the last stage starts the backward"),
        };
        let mut grads = BTreeMap::new();
        for (l, saved) in self.layers.clone().zip(&blocks).rev() {
            let names: Vec<String> = ["w1", "b1", "w2", "b2"]
                .iter()
                .map(|p| format!("{p}_{l}"))
                .collect();
            let names: Vec<&str> = names.iter().map(String::as_str).collect();
            let (w1, _, w2, _) = self.block_weights(&w, l);
            // Every layer but the model's first passes a gradient back.
            if let Some(gx) = mlp::block_backward(
                g,
                &grad_y,
                saved,
                (w1, w2),
                l > 0,
                self.step.tp,
                &names,
                &mut grads,
            ) {
                grad_y = gx;
            }
        }
        (grads, grad_y)
    }
}

/// What the last llama stage keeps of a microbatch's forward for its backward.
struct LlamaHead {
    head: HeadSaved,
    ce: CrossEntropy,
}

/// What a llama stage keeps of a microbatch's forward for its backward.
struct LlamaSaved {
    /// Each of the stage's layers.
    layers: Vec<LayerSaved>,
    /// The microbatch's token ids (first stage: the embedding's backward reads them).
    tokens: Option<Val>,
    /// The masks of a vocab-parallel embedding (first stage).
    embedding: Option<VocabEmbedding>,
    /// The final norm, LM head and loss (last stage).
    head: Option<LlamaHead>,
}

/// The llama decoder on one stage.
struct LlamaStage<'a> {
    cfg: &'a LlamaConfig,
    step: &'a Step<'a>,
    pos: Position,
    layers: Range<usize>,
    weights: &'a Weights,
    dims: AttnShape,
    tables: AttnTables,
    /// Under vocabulary parallelism, the rank's rows `(v0, vl)` of the embedding and the LM head.
    vocab: Option<(usize, usize)>,
    /// The rank's token ids (first stage) and labels (last stage).
    data: StageData,
    /// Per microbatch: the layers' saved values, the tokens (first stage), the head (last).
    saved: BTreeMap<usize, LlamaSaved>,
    losses: LossReport,
}

impl Stage for LlamaStage<'_> {
    fn boundary(&self) -> Vec<usize> {
        vec![self.dims.b, self.dims.s, self.dims.h]
    }

    fn forward(&mut self, g: &mut GraphBuilder, mb: usize, input: Option<Val>) -> Option<Val> {
        let m = self.step.microbatches();
        let forward = self.weights.pass(g);
        let w = |name: &str| forward[name].clone();
        let (mut x, tokens, embedding) = match input {
            Some(x) => (x, None, None),
            None => {
                let tokens = self.data.inputs(g, mb, m);
                let (x, vpe) =
                    llama::token_embedding(g, &w("embed"), &tokens, self.vocab, self.step.bug);
                (x, Some(tokens), vpe)
            }
        };
        let mut layers = Vec::new();
        for l in self.layers.clone() {
            let (out, saved) = llama::decoder_layer(
                g,
                &x,
                l,
                &w,
                self.dims,
                &self.tables,
                self.cfg.eps,
                self.step.bug,
            );
            x = out;
            layers.push(saved);
        }
        if !self.pos.last() {
            let saved = LlamaSaved {
                layers,
                tokens,
                embedding,
                head: None,
            };
            self.saved.insert(mb, saved);
            return Some(x);
        }
        let (logits, head) = llama::lm_head(g, &x, &w, self.cfg.eps);
        let labels = self.data.labels(g, mb, m, self.step.bug);
        let labels1 = g.view(&labels, &[self.dims.tokens()]);
        let name = local_loss_name(self.step, "nll_loss");
        let ce = match self.vocab {
            Some((v0, _)) => llama::vocab_cross_entropy(g, &logits, &labels1, v0, name),
            None => llama::cross_entropy(g, &logits, &labels1, name),
        };
        self.losses.add(g, self.step, ce.loss().clone());
        let head = Some(LlamaHead { head, ce });
        self.saved.insert(
            mb,
            LlamaSaved {
                layers,
                tokens,
                embedding,
                head,
            },
        );
        None
    }

    fn backward(&mut self, g: &mut GraphBuilder, mb: usize, grad: Option<Val>) -> (Grads, Val) {
        let backward = self.weights.pass(g);
        let w = |name: &str| backward[name].clone();
        let LlamaSaved {
            layers,
            tokens,
            embedding,
            head,
        } = self.saved.remove(&mb).expect("forward before backward");
        let (mut grads, mut gx) = match (grad, head) {
            (Some(grad), _) => (BTreeMap::new(), grad),
            (None, Some(h)) => {
                let g_logits = h.ce.backward(g);
                let g_logits = train::scale_seed(g, self.step, &g_logits);
                llama::lm_head_backward(g, &g_logits, &h.head, &w, self.vocab.is_some())
            }
            (None, None) => unreachable!("only the last stage starts the backward"),
        };
        for (l, saved) in self.layers.clone().zip(&layers).rev() {
            gx = llama::decoder_layer_backward(
                g,
                &gx,
                saved,
                l,
                &w,
                self.dims,
                &self.tables,
                &mut grads,
                self.step.bug,
            );
        }
        if let Some(tokens) = tokens {
            let rows = self.vocab.map_or(self.cfg.vocab, |(_, vl)| vl);
            let g_embed = llama::token_embedding_backward(
                g,
                &gx,
                embedding.as_ref(),
                &tokens,
                rows,
                self.step.bug,
            );
            grads.insert("embed".into(), g_embed);
        }
        (grads, gx)
    }
}

/// What a gpt2 stage keeps of a microbatch's forward for its backward.
struct Gpt2Saved {
    layers: Vec<gpt2::LayerSaved>,
    masks: Masks,
    /// The embeddings' (first stage).
    embedded: Option<Embedded>,
    /// The final LayerNorm, LM head and loss (last stage).
    head: Option<Gpt2Head>,
}

/// The gpt2 decoder on one stage. Its token embedding is tied to the LM head: the first
/// stage embeds with it, the last stage's LM head multiplies by it, each holds a copy and
/// computes its share of the gradient, and the two shares are summed over the `embd` group
/// before the dp reduction (Megatron's embedding group).
struct Gpt2Stage<'a> {
    step: &'a Step<'a>,
    pos: Position,
    layers: Range<usize>,
    weights: &'a Weights,
    dims: &'a gpt2::Dims<'a>,
    /// The rank's token ids (first stage) and labels (last stage).
    data: StageData,
    saved: BTreeMap<usize, Gpt2Saved>,
    /// The parameters applied to sequence chunks (their gradients are partial over tp under SP).
    seq_partial: BTreeSet<String>,
    losses: LossReport,
}

impl Stage for Gpt2Stage<'_> {
    fn boundary(&self) -> Vec<usize> {
        self.dims.stream()
    }

    fn forward(&mut self, g: &mut GraphBuilder, mb: usize, input: Option<Val>) -> Option<Val> {
        let m = self.step.microbatches();
        let w = self.weights.pass(g);
        let (mut x, embedded, masks) = match input {
            Some(x) => (x, None, gpt2::stage_masks(g, self.dims)),
            None => {
                let tokens = self.data.inputs(g, mb, m);
                let (x, embedded, masks) = gpt2::embed_forward(g, self.dims, &w, &tokens);
                (x, Some(embedded), masks)
            }
        };
        let mut layers = Vec::new();
        for l in self.layers.clone() {
            let (out, saved) = gpt2::layer_forward(g, self.dims, &w, &masks, &x, l);
            x = out;
            layers.push(saved);
        }
        let mut saved = Gpt2Saved {
            layers,
            masks,
            embedded,
            head: None,
        };
        if !self.pos.last() {
            self.saved.insert(mb, saved);
            return Some(x);
        }
        let labels = self.data.labels(g, mb, m, self.step.bug);
        let name = local_loss_name(self.step, "nll_loss");
        let (local, head) = gpt2::head_forward(g, self.dims, &w, &x, &labels, name);
        self.losses.add(g, self.step, local);
        saved.head = Some(head);
        self.saved.insert(mb, saved);
        None
    }

    fn backward(&mut self, g: &mut GraphBuilder, mb: usize, grad: Option<Val>) -> (Grads, Val) {
        let w = self.weights.pass(g);
        let saved = self.saved.remove(&mb).expect("forward before backward");
        let mut grads = BTreeMap::new();
        let (mut gx, g_wte_head) = match (grad, &saved.head) {
            (Some(grad), _) => (grad, None),
            (None, Some(head)) => {
                let (gx, g_head) = gpt2::head_backward(
                    g,
                    self.dims,
                    self.step,
                    &w,
                    head,
                    &mut grads,
                    &mut self.seq_partial,
                );
                (gx, Some(g_head))
            }
            (None, None) => unreachable!("only the last stage starts the backward"),
        };
        for (l, sv) in self.layers.clone().zip(&saved.layers).rev() {
            gx = gpt2::layer_backward(
                g,
                self.dims,
                self.step,
                &w,
                &saved.masks,
                &gx,
                sv,
                l,
                &mut grads,
                &mut self.seq_partial,
            );
        }
        match &saved.embedded {
            Some(embedded) => {
                gpt2::embed_backward(g, self.dims, gx.clone(), embedded, g_wte_head, &mut grads)
            }
            None => {
                // The last stage's share of the tied embedding's gradient: the LM head's.
                if let Some(g_head) = g_wte_head {
                    grads.insert("wte".into(), g_head);
                }
            }
        }
        (grads, gx)
    }
}

/// What a deepseek stage keeps of a microbatch's forward for its backward.
struct DeepseekSaved {
    layers: Vec<deepseek::LayerSaved>,
    /// The microbatch's token ids (first stage).
    tokens: Option<Val>,
    /// The final norm, LM head and cross-entropy (last stage).
    head: Option<LlamaHead>,
}

/// The deepseek decoder on one stage. Each stage's MoE layers add their balance losses: the
/// forward sums the stage's shares (each microbatch's divided by M), and after the schedule
/// they are all-reduced over `pp` into the last stage's loss (Megatron reduces its aux-loss
/// tracker over the pipeline group the same way); the backward seeds each layer's balance
/// loss with `1 / M` inside the stage, as Megatron's `MoEAuxLossAutoScaler` does, so no
/// gradient crosses stages for it.
struct DeepseekStage<'a> {
    pos: Position,
    layers: Range<usize>,
    w: BTreeMap<String, Val>,
    dims: AttnShape,
    tables: AttnTables,
    cx: MoeCtx<'a>,
    /// The rank's token ids (first stage) and labels (last stage).
    data: StageData,
    saved: BTreeMap<usize, DeepseekSaved>,
    /// The stage's balance-loss shares, summed over the microbatches (each divided by M).
    aux: Option<Val>,
    /// Last stage: the cross-entropies, summed over the microbatches (each divided by M).
    ce: Option<Val>,
}

impl DeepseekStage<'_> {
    /// `x / M` with M microbatches (`x` itself with one), added to `total`.
    fn add_share(g: &mut GraphBuilder, total: &mut Option<Val>, x: Val, m: usize) {
        let x = if m > 1 {
            g.div_scalar("div", &x, Arg::I(m as i64))
        } else {
            x
        };
        deepseek::add_to_total(g, total, x);
    }
}

impl Stage for DeepseekStage<'_> {
    fn boundary(&self) -> Vec<usize> {
        vec![self.dims.b, self.dims.s, self.dims.h]
    }

    fn forward(&mut self, g: &mut GraphBuilder, mb: usize, input: Option<Val>) -> Option<Val> {
        let m = self.cx.microbatches;
        let weights = &self.w;
        let w = |name: &str| weights[name].clone();
        let (mut x, tokens) = match input {
            Some(x) => (x, None),
            None => {
                let tokens = self.data.inputs(g, mb, m);
                (llama::embedding(g, &w("embed"), &tokens), Some(tokens))
            }
        };
        let mut layers = Vec::new();
        let mut aux_total: Option<Val> = None;
        for l in self.layers.clone() {
            let (hres, moe_out, aux, saved) =
                deepseek::layer_forward(g, &x, l, &w, self.dims, &self.tables, &self.cx);
            deepseek::add_to_total(g, &mut aux_total, aux);
            x = deepseek::layer_output(g, &hres, &moe_out, self.dims);
            layers.push(saved);
        }
        let aux = aux_total.expect("every stage runs a layer");
        Self::add_share(g, &mut self.aux, aux, m);
        if !self.pos.last() {
            let saved = DeepseekSaved {
                layers,
                tokens,
                head: None,
            };
            self.saved.insert(mb, saved);
            return Some(x);
        }
        let (logits, head) = llama::lm_head(g, &x, &w, self.cx.cfg.base.eps);
        let labels = self.data.labels(g, mb, m, self.cx.bug);
        let labels1 = g.view(&labels, &[self.dims.tokens()]);
        let ce = llama::cross_entropy(g, &logits, &labels1, "nll_loss");
        Self::add_share(g, &mut self.ce, ce.loss().clone(), m);
        let head = Some(LlamaHead { head, ce });
        self.saved.insert(
            mb,
            DeepseekSaved {
                layers,
                tokens,
                head,
            },
        );
        None
    }

    fn backward(&mut self, g: &mut GraphBuilder, mb: usize, grad: Option<Val>) -> (Grads, Val) {
        let m = self.cx.microbatches;
        let weights = &self.w;
        let w = |name: &str| weights[name].clone();
        let saved = self.saved.remove(&mb).expect("forward before backward");
        let (mut grads, mut gx) = match (grad, &saved.head) {
            (Some(grad), _) => (BTreeMap::new(), grad),
            (None, Some(h)) => {
                let g_logits = h.ce.backward(g);
                let g_logits = if m > 1 {
                    g.div_scalar("div", &g_logits, Arg::I(m as i64))
                } else {
                    g_logits
                };
                llama::lm_head_backward(g, &g_logits, &h.head, &w, false)
            }
            (None, None) => unreachable!("only the last stage starts the backward"),
        };
        for (l, sv) in self.layers.clone().zip(&saved.layers).rev() {
            gx = deepseek::layer_backward(
                g,
                &gx,
                sv,
                l,
                &w,
                self.dims,
                &self.tables,
                &self.cx,
                &mut grads,
            );
        }
        if let Some(tokens) = &saved.tokens {
            let vocab = self.cx.cfg.base.vocab;
            grads.insert(
                "embed".into(),
                llama::embedding_backward(g, &gx, tokens, vocab),
            );
        }
        (grads, gx)
    }
}

/// The deepseek rank plan of global rank `rank` (row-major over pp, dp, tp, ep).
fn deepseek_rank(plan: &PipelinePlan, rank: usize) -> deepseek::RankPlan {
    deepseek::RankPlan {
        dp: plan.dp,
        tp: plan.tp,
        ep: plan.ep,
        ep_rank: rank % plan.ep,
        tp_rank: rank / plan.ep % plan.tp,
        dispatch: plan.dispatch,
        sequence_parallel: plan.sequence_parallel,
        cp: CpPlan::NONE,
    }
}

/// The graph of the deepseek rank at `pos`: its inputs, the schedule's passes, the loss (the
/// last stage's cross-entropy plus every stage's balance losses, all-reduced over pp) and,
/// for the full iteration, the finalization and SGD step of the stage's parameters `specs`.
fn build_deepseek_stage(
    plan: &PipelinePlan,
    pos: Position,
    specs: &[Param],
    layers: Range<usize>,
) -> GraphBuilder {
    let mut g = GraphBuilder::new();
    let cfg = plan.deepseek;
    let base = &cfg.base;
    let rank_plan = deepseek_rank(plan, pos.rank);
    let m = plan.pipeline.microbatches;
    let b_all = base.batch / (plan.dp * plan.ep);
    let data = StageData::tokens(&mut g, pos, b_all, base.seq);
    let dims = AttnShape::new(base, b_all / m, plan.tp);
    let inv_freq = g.input("rope_inv_freq", &[dims.hd / 2]);
    let w = deepseek::declare_weights(&mut g, specs, plan.tp, plan.ep);
    let tables = llama::attn_tables(&mut g, &inv_freq, base.seq);
    let cx = MoeCtx {
        cfg,
        plan: rank_plan,
        b: b_all / m,
        bug: plan.bug,
        microbatches: m,
    };
    let schedule = plan.passes(pos);
    let mut stage = DeepseekStage {
        pos,
        layers,
        w,
        dims,
        tables,
        cx,
        data,
        saved: BTreeMap::new(),
        aux: None,
        ce: None,
    };
    let acc = run_passes(&mut g, pos, &schedule, &mut stage, plan.bug, plan.dp);
    // The balance losses: the tp ranks' shares summed (under SP each computed the whole),
    // then every stage's summed over pp.
    let aux = stage.aux.take().expect("every stage runs a layer");
    let aux = rank_plan.aux_over_tp(&mut g, &aux);
    let aux = llama::reduce_if(&mut g, &aux, "pp", pos.stages);
    if let Some(ce) = stage.ce.take() {
        let loss = rank_plan.loss(&mut g, &ce, &aux);
        g.output(&loss);
    }
    if plan.forward_only {
        return g;
    }
    let weights = &stage.w;
    let w = |name: &str| weights[name].clone();
    deepseek::finalize(&mut g, specs, &acc, &w, rank_plan, plan.bug, base.lr);
    g
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
                stride: per_stage,
            };
            let specs = stage_params(stage);
            return build_deepseek_stage(&plan, pos, &specs, division.stage(stage, plan.bug));
        }
        let stage = rank / (dp * tp);
        let pos = Position {
            stage,
            stages: pp,
            rank,
            stride: dp * tp,
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

/// The mlp's passes on the stage at `pos` (see [`build_stage`]).
fn run_mlp_stage<'a>(
    g: &mut GraphBuilder,
    plan: &PipelinePlan<'a>,
    pos: Position,
    step: &Step,
    specs: &[Param],
    layers: Range<usize>,
) -> StageRun<'a> {
    let cfg = plan.mlp;
    let b = cfg.batch / plan.dp;
    let data = StageData::declare(g, pos, ["x", "target"], "f32", &[b, cfg.hidden]);
    let weights = train::declare(g, step, specs);
    let mut stage = MlpStage {
        cfg,
        step,
        pos,
        layers,
        weights: &weights,
        data,
        saved: BTreeMap::new(),
        losses: LossReport::default(),
    };
    let acc = run_passes(g, pos, &plan.passes(pos), &mut stage, step.bug, plan.dp);
    let losses = stage.losses;
    StageRun {
        weights,
        acc,
        losses,
        presync: Box::new(|_, _, grad| grad),
    }
}

/// The llama's passes on the stage at `pos` (see [`build_stage`]); the gradients of kv heads
/// replicated over tp ranks are summed over their replicas.
fn run_llama_stage<'a>(
    g: &mut GraphBuilder,
    plan: &PipelinePlan<'a>,
    pos: Position,
    step: &Step,
    specs: &[Param],
    layers: Range<usize>,
) -> StageRun<'a> {
    let cfg = plan.llama;
    let m = plan.pipeline.microbatches;
    let b_all = cfg.batch / plan.dp;
    let data = StageData::tokens(g, pos, b_all, cfg.seq);
    let dims = AttnShape::new(cfg, b_all / m, plan.tp);
    let inv_freq = g.input("rope_inv_freq", &[dims.hd / 2]);
    let weights = train::declare(g, step, specs);
    let tables = llama::attn_tables(g, &inv_freq, cfg.seq);
    let vl = cfg.vocab / plan.tp;
    let vocab = (plan.vocab_parallel && plan.tp > 1).then_some((step.tp_rank * vl, vl));
    let mut stage = LlamaStage {
        cfg,
        step,
        pos,
        layers,
        weights: &weights,
        dims,
        tables,
        vocab,
        data,
        saved: BTreeMap::new(),
        losses: LossReport::default(),
    };
    let acc = run_passes(g, pos, &plan.passes(pos), &mut stage, step.bug, plan.dp);
    let losses = stage.losses;
    let bug = step.bug;
    StageRun {
        weights,
        acc,
        losses,
        presync: Box::new(move |g, p, grad| {
            let kv_replicated = matches!(p.tp, TpLayout::ShardReplicas { .. });
            if kv_replicated && bug != Some(Mutation::LlamaKvGradUnsynced) {
                // Each replica saw only its own query heads' share of the kv head's gradient.
                g.all_reduce_sum(&grad, "kv")
            } else {
                grad
            }
        }),
    }
}

/// The gpt2's passes on the stage at `pos` (see [`build_stage`]); the tied embedding's shares
/// are summed over the `embd` group (the first and last stage's ranks of one dp and tp index),
/// as Megatron all-reduces the embedding group's gradients, before the dp reduction.
fn run_gpt2_stage<'a>(
    g: &mut GraphBuilder,
    plan: &PipelinePlan<'a>,
    pos: Position,
    step: &Step,
    specs: &[Param],
    layers: Range<usize>,
) -> StageRun<'a> {
    let cfg = plan.gpt2;
    let m = plan.pipeline.microbatches;
    let data = StageData::tokens(g, pos, cfg.batch / plan.dp, cfg.seq);
    let weights = train::declare(g, step, specs);
    let rank_plan = gpt2::RankPlan {
        dp: plan.dp,
        tp: plan.tp,
        tp_rank: step.tp_rank,
        sequence_parallel: plan.sequence_parallel,
        tp_comm_overlap: false,
    };
    let dims = gpt2::Dims::new(cfg, rank_plan, &CpPlan::NONE, step.bug, m);
    let mut stage = Gpt2Stage {
        step,
        pos,
        layers,
        weights: &weights,
        dims: &dims,
        data,
        saved: BTreeMap::new(),
        seq_partial: BTreeSet::new(),
        losses: LossReport::default(),
    };
    let acc = run_passes(g, pos, &plan.passes(pos), &mut stage, step.bug, plan.dp);
    let Gpt2Stage {
        losses,
        seq_partial,
        ..
    } = stage;
    let tied = pos.stages > 1 && (pos.first() || pos.last());
    let bug = step.bug;
    StageRun {
        weights,
        acc,
        losses,
        presync: Box::new(move |g, p, grad| {
            let grad = gpt2::sync_grad(g, &dims, &seq_partial, p, grad);
            if tied && p.name == "wte" && bug != Some(Mutation::ZeroTiedEmbeddingUntied) {
                g.all_reduce_sum(&grad, "embd")
            } else {
                grad
            }
        }),
    }
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
