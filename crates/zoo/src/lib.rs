//! The model zoo of shardproof: emits a specification graph, its distributed rank graphs
//! (torch.fx readable text) and a case file, for a model, a parallel plan on a mesh and
//! optionally a planted bug from the catalog.

pub mod bugs;
pub mod cp;
pub mod deepseek;
pub mod gpt2;
pub mod graph;
pub mod llama;
pub mod mlp;
pub mod pipeline;
pub mod presets;
mod share;
pub mod suggest;
pub mod train;

pub use bugs::{find_bug, Bug, Mutation, Site, BUGS, MISSION_CLASSES};
pub use cp::CpPlan;
pub use deepseek::{DeepseekConfig, EpDispatch};
pub use gpt2::Gpt2Config;
pub use llama::LlamaConfig;
pub use mlp::{MlpConfig, MlpOptions};
pub use pipeline::{Division, PipelineOptions, Schedule};
pub use presets::{find_preset, Preset, SizeFlags, TablePlan, PRESETS};
pub use train::{AdamConfig, Optimizer, TrainOptions, ZeroStage};

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

/// The models the zoo can emit: name and one line.
pub const MODELS: &[(&str, &str)] = &[
    (
        "mlp",
        "fc1 + relu + fc2 blocks with an MSE loss (sizes: hidden, ffn, batch, layers)",
    ),
    (
        "llama",
        "Llama-3 style decoder: RMSNorm, RoPE, GQA causal attention, SwiGLU, LM head, \
         cross-entropy (sizes: hidden, heads, kv_heads, ffn, layers, seq, batch, vocab)",
    ),
    (
        "gpt2",
        "GPT-2 style decoder: learned positions, LayerNorm, biased q/k/v and output \
         projection, causal attention, GELU MLP, LM head tied to the embedding, cross-entropy \
         (sizes: hidden, heads, ffn, layers, seq, batch, vocab)",
    ),
    (
        "deepseek",
        "DeepSeek-V3 style MoE decoder: llama's attention, each MLP a MoE block (sigmoid \
         router, top-k gates, routed SwiGLU experts, a shared expert) plus the sequence-wise \
         auxiliary load-balancing loss (sizes: hidden, heads, kv_heads, ffn (shared expert), \
         moe_ffn, experts, top_k, layers, seq, batch, vocab)",
    ),
];

/// How a parameter is laid out over the `tp` mesh dim.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TpLayout {
    /// The same on every tp rank.
    Replicate,
    /// Split along this tensor dim.
    Shard(usize),
    /// Split along `dim` into `tp / replicas` pieces, each held by `replicas` consecutive tp
    /// ranks (GQA kv heads when tp exceeds them).
    ShardReplicas {
        /// The split tensor dim.
        dim: usize,
        /// Consecutive tp ranks holding the same piece.
        replicas: usize,
    },
}

/// A parameter of a model: its name, global shape and tp layout.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Param {
    /// Name in every graph (e.g. `w1_0`, `wq_1`).
    pub name: String,
    /// Global (spec) shape.
    pub shape: Vec<usize>,
    /// Megatron layout over tp.
    pub tp: TpLayout,
}

impl Param {
    /// The shape a rank of a `tp`-way plan holds.
    pub fn local_shape(&self, tp: usize) -> Vec<usize> {
        let mut shape = self.shape.clone();
        match self.tp {
            TpLayout::Replicate => {}
            TpLayout::Shard(d) => shape[d] /= tp,
            TpLayout::ShardReplicas { dim, replicas } => shape[dim] /= tp / replicas,
        }
        shape
    }
}

/// The parallelisms (mesh dims) the zoo can emit: name and one line, in mesh order (the
/// first is outermost in the rank order).
pub const PARALLELISMS: &[(&str, &str)] = &[
    (
        "pp",
        "pipeline parallel (mlp, llama, gpt2): layers in contiguous stages (even, or \
         --pp-first-layers / --pp-last-layers), microbatches \
         (--microbatches M) scheduled GPipe or 1F1B (--pp-schedule), activations and gradients \
         sent between stages (shardproof_p2p send/recv); outermost in the rank order",
    ),
    (
        "dp",
        "data parallel: batch Shard(0), loss and gradients all-reduced and averaged over dp",
    ),
    (
        "cp",
        "context parallel (llama, deepseek, gpt2): the sequence in 2*cp load-balanced causal \
         chunks, cp rank i holding chunks i and 2*cp-1-i (selected from the dp rank's batch); \
         RoPE at global positions (gpt2: the learned position rows of the chunks' global \
         positions, their gradient scattered back to those rows); ring attention passing K/V \
         blocks (and in the backward their gradients) with shardproof_p2p send/recv, partial \
         results merged by log-sum-exp; loss and gradients averaged over dp x cp",
    ),
    (
        "tp",
        "Megatron tensor parallel: column parallel (mlp fc1; llama q/k/v by heads, gate/up; \
         gpt2 q/k/v, fc1), row parallel with an all-reduce (mlp fc2; llama o, down; gpt2 o, \
         fc2; biases added once after it)",
    ),
    (
        "ep",
        "expert parallel (deepseek): batch Shard(0) like dp, stacked expert weights Shard(0); \
         tokens dispatched by all-gather and combined by reduce-scatter over ep \
         (--ep-dispatch alltoall: all_to_all_single both ways)",
    ),
];

/// The training options of the full iteration (flags of `zoo emit`): flag and one line.
pub const TRAINING: &[(&str, &str)] = &[
    (
        "--optimizer sgd|adam",
        "SGD (default) or Adam with bias correction (--adam-step T, default 1); Adam's \
         exp_avg_<param> and exp_avg_sq_<param> are inputs laid out like the parameter, \
         their updates outputs",
    ),
    (
        "--clip-grad MAXNORM",
        "global gradient-norm clipping; tp-sharded squared norms all-reduced over tp, \
         tp-replicated ones counted once (Megatron)",
    ),
    (
        "--loss-scale S",
        "static loss scaling: the backward seeded with S, gradients unscaled by 1/S before \
         clipping and the optimizer",
    ),
    (
        "--grad-accum M",
        "M microbatches per dp rank, each loss scaled by 1/M, gradients summed before the dp \
         reduction (the spec trains the whole batch)",
    ),
    (
        "--zero 1|2|3",
        "ZeRO over dp (dp >= 2): optimizer states split (1), gradients reduce-scattered (2), \
         parameters split and all-gathered before the forward and the backward (3); each \
         parameter is split along its first dim that tp leaves whole",
    ),
];

/// A mesh of the zoo's plans: sizes of its dims in the order of [`PARALLELISMS`] (`pp`, then
/// `dp`, `cp`, `tp`, `ep`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mesh {
    /// The dims in mesh order, with their sizes.
    pub dims: Vec<(&'static str, usize)>,
}

impl Mesh {
    /// Parses `dp=2,tp=2` (any order, each dim at most once, sizes at least 1).
    pub fn parse(text: &str) -> Result<Mesh, String> {
        let mut dims: Vec<(&'static str, usize)> = Vec::new();
        for part in text.split(',').map(str::trim) {
            let Some((name, size)) = part.split_once('=') else {
                return Err(format!(
                    "mesh entry `{part}` is not NAME=SIZE (e.g. dp=2,tp=2)"
                ));
            };
            let Some(&(dim, _)) = PARALLELISMS.iter().find(|(n, _)| *n == name.trim()) else {
                return Err(suggest::unknown(
                    "mesh dim",
                    name.trim(),
                    PARALLELISMS.iter().map(|(n, _)| *n),
                    "shardproof zoo list",
                ));
            };
            let size: usize = match size.trim().parse() {
                Ok(s) if s >= 1 => s,
                _ => {
                    return Err(format!(
                        "mesh dim `{dim}` has size `{}`: not a positive integer",
                        size.trim()
                    ))
                }
            };
            if dims.iter().any(|(d, _)| *d == dim) {
                return Err(format!("mesh dim `{dim}` is given twice"));
            }
            dims.push((dim, size));
        }
        dims.sort_by_key(|(d, _)| PARALLELISMS.iter().position(|(n, _)| n == d));
        Ok(Mesh { dims })
    }

    /// The size of `dim` (1 when the mesh lacks it).
    pub fn size(&self, dim: &str) -> usize {
        self.dims
            .iter()
            .find(|(d, _)| *d == dim)
            .map_or(1, |(_, s)| *s)
    }

    /// The number of ranks.
    pub fn ranks(&self) -> usize {
        self.dims.iter().map(|(_, s)| s).product()
    }

    /// The coordinates of rank `rank`, in mesh order (outermost first; the last dim varies
    /// fastest along the rank order).
    pub fn coords(&self, rank: usize) -> Vec<usize> {
        let mut rest = rank;
        let mut coords = vec![0; self.dims.len()];
        for (c, (_, size)) in coords.iter_mut().zip(&self.dims).rev() {
            *c = rest % size;
            rest /= size;
        }
        coords
    }

    /// A short label, e.g. `dp2-tp2`.
    pub fn label(&self) -> String {
        let parts: Vec<String> = self.dims.iter().map(|(d, s)| format!("{d}{s}")).collect();
        parts.join("-")
    }
}

/// What to emit.
#[derive(Clone, Debug)]
pub struct EmitOptions {
    /// The model name (see [`MODELS`]).
    pub model: String,
    /// The sizes of the MLP (used when the model is `mlp`).
    pub mlp: MlpConfig,
    /// The sizes of the Llama model (used when the model is `llama`).
    pub llama: LlamaConfig,
    /// The mesh of the distributed plan.
    pub mesh: Mesh,
    /// A catalog bug to plant, if any.
    pub bug: Option<&'static Bug>,
    /// Emit the forward pass and loss only (no backward, no optimizer step).
    pub forward_only: bool,
    /// Llama: split the embedding and LM head along the vocabulary over tp (Megatron's
    /// vocab-parallel embedding and cross-entropy).
    pub vocab_parallel: bool,
}

/// Options of models added after [`EmitOptions`] had users outside this crate: kept apart so
/// that their struct literals keep compiling ([`emit`] uses the defaults).
#[derive(Clone, Debug, Default)]
pub struct EmitExtras {
    /// The sizes of the GPT-2 model (used when the model is `gpt2`).
    pub gpt2: Gpt2Config,
    /// gpt2: Megatron sequence parallelism over tp (activations outside the tensor-parallel
    /// regions split along the sequence; all-gather and reduce-scatter around them); deepseek:
    /// sequence parallelism in the MoE blocks (each tp rank runs the block on its sequence
    /// chunk, the experts replicated over tp; the chunks all-gathered after it).
    pub sequence_parallel: bool,
    /// The sizes of the DeepSeek MoE model (used when the model is `deepseek`).
    pub deepseek: DeepseekConfig,
    /// How the rank graphs are stored: a file per rank (the default) or a file per distinct
    /// rank program.
    pub rank_graphs: RankGraphs,
    /// The preset the sizes and plan come from, if any: named in the case's name and header.
    pub preset: Option<&'static Preset>,
    /// deepseek under expert parallelism: how tokens reach the experts' ranks (all-gather and
    /// reduce-scatter, the default, or all-to-all).
    pub ep_dispatch: EpDispatch,
    /// mlp: activation recomputation and FP8 weights (`--recompute`, `--fp8`).
    pub mlp_options: MlpOptions,
    /// gpt2 under SP: TP communication overlap (`--tp-comm-overlap`), the row-parallel weight
    /// gradients computed chunk by chunk as the gathered output gradient arrives.
    pub tp_comm_overlap: bool,
}

impl EmitExtras {
    /// The model-option flags the extras turn on (`--recompute`, `--fp8`,
    /// `--tp-comm-overlap`), for the bugs that need them.
    pub fn option_flags(&self) -> Vec<&'static str> {
        let mut flags = Vec::new();
        if self.mlp_options.recompute {
            flags.push("--recompute");
        }
        if self.mlp_options.fp8 {
            flags.push("--fp8");
        }
        if self.tp_comm_overlap {
            flags.push("--tp-comm-overlap");
        }
        flags
    }
}

/// How the rank graphs of an emitted case are stored.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum RankGraphs {
    /// One file per rank, `r<rank>.py`.
    #[default]
    PerRank,
    /// One file per distinct rank program, named after the first rank that runs it; the case's
    /// `graphs:` names it for every rank that runs it. Data-parallel replicas run the same
    /// program, so a 512-rank plan of identical replicas stores a handful of graphs instead of
    /// 512 (the case format maps ranks to graph paths and lets several ranks name one file).
    Shared,
}

/// Where the files of an emitted case go, one at a time: kept in memory ([`Emitted`]) or
/// written to a directory as they are produced ([`DirSink`]), so that no more than one rank
/// graph need be held at once.
pub trait EmitSink {
    /// Stores the file `name` with `text`.
    fn put(&mut self, name: &str, text: &str) -> Result<(), String>;
    /// Whether the file `name`, stored earlier, holds exactly `text` (how a rank graph is found
    /// equal to an earlier one under [`RankGraphs::Shared`]).
    fn holds(&self, name: &str, text: &str) -> Result<bool, String>;
}

impl EmitSink for Emitted {
    fn put(&mut self, name: &str, text: &str) -> Result<(), String> {
        self.files.push((name.to_string(), text.to_string()));
        Ok(())
    }

    fn holds(&self, name: &str, text: &str) -> Result<bool, String> {
        Ok(self.files.iter().any(|(n, t)| n == name && t == text))
    }
}

/// Writes each file of an emitted case into a directory as it is produced.
#[derive(Clone, Debug)]
pub struct DirSink {
    dir: PathBuf,
}

impl DirSink {
    /// A sink writing into `dir`, created when missing.
    pub fn create(dir: &Path) -> Result<DirSink, String> {
        std::fs::create_dir_all(dir)
            .map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
        Ok(DirSink {
            dir: dir.to_path_buf(),
        })
    }
}

impl EmitSink for DirSink {
    fn put(&mut self, name: &str, text: &str) -> Result<(), String> {
        let path = self.dir.join(name);
        std::fs::write(&path, text).map_err(|e| format!("cannot write {}: {e}", path.display()))
    }

    fn holds(&self, name: &str, text: &str) -> Result<bool, String> {
        let path = self.dir.join(name);
        let stored =
            std::fs::read(&path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        Ok(stored == text.as_bytes())
    }
}

/// What an emission produced.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EmitSummary {
    /// Ranks of the plan.
    pub ranks: usize,
    /// Rank graph files written (the ranks' count unless [`RankGraphs::Shared`]).
    pub rank_files: usize,
    /// Nodes of the spec graph (see [`graph::GraphBuilder::nodes`]).
    pub spec_nodes: usize,
    /// Nodes of all rank graphs together, each rank counted (shared files too): the size of
    /// the distributed program an engine reads.
    pub rank_nodes: usize,
}

/// An emitted case: file names (relative to the output directory) and their contents.
#[derive(Clone, Debug)]
pub struct Emitted {
    /// `case.yaml`, `spec.py`, `r0.py`, ... in that order.
    pub files: Vec<(String, String)>,
}

impl Emitted {
    /// Writes every file into `dir` (created when missing).
    pub fn write(&self, dir: &Path) -> std::io::Result<()> {
        std::fs::create_dir_all(dir)?;
        for (name, text) in &self.files {
            std::fs::write(dir.join(name), text)?;
        }
        Ok(())
    }
}

/// Builds the graph of one rank (given its index) of a plan.
pub(crate) type RankBuilder<'a> = Box<dyn Fn(usize) -> graph::GraphBuilder + 'a>;

/// A model's plan, ready to be written out.
struct Plan<'a> {
    spec: graph::GraphBuilder,
    /// Builds each rank's graph on demand, so that emission never holds them all.
    rank: RankBuilder<'a>,
    /// Non-parameter inputs: (name, sharded over dp along dim 0, else replicated).
    data: Vec<(&'static str, bool)>,
    params: Vec<Param>,
    /// Process groups beyond one per mesh dim: (name, explicit rank lists).
    groups: Vec<(&'static str, Vec<Vec<usize>>)>,
    /// Parameters also split along dim 0 over the `ep` mesh dim (stacked expert weights).
    ep_sharded: Vec<String>,
}

/// The step of the single-device spec: one rank, no bug, trained with `spec_train` (the
/// options' [`TrainOptions::for_spec`]) at learning rate `lr`.
fn spec_step(spec_train: &TrainOptions, lr: f64) -> train::Step<'_> {
    train::Step {
        opts: spec_train,
        dp: 1,
        tp: 1,
        dp_rank: 0,
        tp_rank: 0,
        cp: 1,
        stages: 1,
        shared_copies: &[],
        bug: None,
        lr,
    }
}

/// Emits the case described by `opts` (with the default [`EmitExtras`]), or says why it
/// cannot.
pub fn emit(opts: &EmitOptions) -> Result<Emitted, String> {
    emit_with(opts, &EmitExtras::default())
}

/// Emits the case described by `opts` and `extras` (with the default [`TrainOptions`]), or says
/// why it cannot.
pub fn emit_with(opts: &EmitOptions, extras: &EmitExtras) -> Result<Emitted, String> {
    emit_training(opts, extras, &TrainOptions::default())
}

/// Emits the case described by `opts` and `extras` whose full iteration is trained with
/// `train` (optimizer, clipping, loss scaling, gradient accumulation, ZeRO), or says why it
/// cannot.
pub fn emit_training(
    opts: &EmitOptions,
    extras: &EmitExtras,
    train: &TrainOptions,
) -> Result<Emitted, String> {
    emit_pipelined(opts, extras, train, &PipelineOptions::default())
}

/// [`emit_training`] with the microbatches and schedule of a pipeline-parallel plan (a `pp`
/// mesh dim; see [`pipeline`]), or says why it cannot.
pub fn emit_pipelined(
    opts: &EmitOptions,
    extras: &EmitExtras,
    train: &TrainOptions,
    pipeline: &PipelineOptions,
) -> Result<Emitted, String> {
    let mut emitted = Emitted { files: Vec::new() };
    emit_into(opts, extras, train, pipeline, &mut emitted)?;
    // The case file is written last (it names the rank graph files); list it first.
    emitted.files.rotate_right(1);
    Ok(emitted)
}

/// Emits the case described by `opts`, `extras`, `train` and `pipeline` into the directory
/// `dir`, each rank graph written as soon as it is built, or says why it cannot.
pub fn emit_to_dir(
    opts: &EmitOptions,
    extras: &EmitExtras,
    train: &TrainOptions,
    pipeline: &PipelineOptions,
    dir: &Path,
) -> Result<EmitSummary, String> {
    // Check the options before creating anything.
    let (plan, stages) = check_and_plan(opts, extras, train, pipeline)?;
    let mut sink = DirSink::create(dir)?;
    share::write_plan(opts, extras, train, (plan, stages), &mut sink)
}

/// Emits the case described by `opts`, `extras`, `train` and `pipeline` into `sink`: the
/// spec graph, the rank graphs in rank order, then `case.yaml`.
pub fn emit_into(
    opts: &EmitOptions,
    extras: &EmitExtras,
    train: &TrainOptions,
    pipeline: &PipelineOptions,
    sink: &mut dyn EmitSink,
) -> Result<EmitSummary, String> {
    let planned = check_and_plan(opts, extras, train, pipeline)?;
    share::write_plan(opts, extras, train, planned, sink)
}

/// Checks the options and sets up the plan (its spec built, its ranks built on demand), with
/// where each tensor lives under pipeline parallelism.
fn check_and_plan<'a>(
    opts: &'a EmitOptions,
    extras: &'a EmitExtras,
    train: &'a TrainOptions,
    pipeline: &PipelineOptions,
) -> Result<(Plan<'a>, Option<Stages>), String> {
    if !MODELS.iter().any(|(m, _)| *m == opts.model) {
        return Err(suggest::unknown(
            "model",
            &opts.model,
            MODELS.iter().map(|(m, _)| *m),
            "shardproof zoo list",
        ));
    }
    if opts.mesh.dims.is_empty() {
        return Err("the mesh has no dims (e.g. --mesh tp=2)".into());
    }
    let (dp, tp) = (opts.mesh.size("dp"), opts.mesh.size("tp"));
    let llama = opts.model == "llama";
    let gpt2 = opts.model == "gpt2";
    let deepseek = opts.model == "deepseek";
    let ep = opts.mesh.size("ep");
    if !deepseek && opts.mesh.dims.iter().any(|(d, _)| *d == "ep") {
        return Err(format!(
            "the ep mesh dim applies to the deepseek model, not `{}`",
            opts.model
        ));
    }
    let cp = opts.mesh.size("cp");
    check_cp(opts, extras, train, cp)?;
    let sp = extras.sequence_parallel;
    if opts.vocab_parallel && (!llama || tp < 2) {
        return Err(
            "vocab parallelism applies to the llama model on a tp mesh dim of size >= 2".into(),
        );
    }
    if sp && (!(gpt2 || deepseek) || tp < 2) {
        return Err(
            "sequence parallelism applies to the gpt2 and deepseek models on a tp mesh dim of \
             size >= 2"
                .into(),
        );
    }
    if extras.ep_dispatch != EpDispatch::default() && (!deepseek || ep < 2) {
        return Err(format!(
            "--ep-dispatch {} applies to the deepseek model on an ep mesh dim of size >= 2",
            extras.ep_dispatch.name()
        ));
    }
    let mlp_opts = extras.mlp_options;
    if (mlp_opts.recompute || mlp_opts.fp8) && opts.model != "mlp" {
        return Err(format!(
            "--recompute and --fp8 apply to the mlp model, not `{}`",
            opts.model
        ));
    }
    if mlp_opts.recompute && opts.forward_only {
        return Err("--recompute needs the full iteration (drop --forward-only)".into());
    }
    if extras.tp_comm_overlap && (!gpt2 || !sp || opts.forward_only) {
        return Err(
            "--tp-comm-overlap applies to the gpt2 model's full iteration under \
             --sequence-parallel"
                .into(),
        );
    }
    if deepseek {
        extras.deepseek.check_split(dp, tp, ep)?;
        let seq = extras.deepseek.base.seq;
        if sp && !seq.is_multiple_of(tp) {
            return Err(format!(
                "seq {seq} is not divisible by tp = {tp} (sequence parallelism)"
            ));
        }
    } else if llama {
        opts.llama.check_split(dp, tp, opts.vocab_parallel)?;
    } else if gpt2 {
        extras.gpt2.check_split(dp, tp, sp)?;
    } else {
        opts.mlp.check_split(dp, tp)?;
    }
    if deepseek && *train != TrainOptions::PLAIN {
        return Err(format!(
            "the deepseek model supports plain SGD only, not {}",
            train.flags().join(" ")
        ));
    }
    let (batch, params) = match opts.model.as_str() {
        "deepseek" => (extras.deepseek.base.batch, extras.deepseek.params(tp)),
        "llama" => (opts.llama.batch, opts.llama.params(tp, opts.vocab_parallel)),
        "gpt2" => (extras.gpt2.batch, extras.gpt2.params()),
        _ => (opts.mlp.batch, opts.mlp.params()),
    };
    train.check(&params, (dp, tp), batch / dp, opts.forward_only)?;
    if train.zero.is_some() && llama && opts.llama.kv_replicas(tp) > 1 {
        return Err(format!(
            "--zero with kv heads replicated over tp ranks (tp = {tp} > kv_heads = {}) is not \
             supported: a case placement cannot give both replicas and a second sharded dim",
            opts.llama.kv_heads
        ));
    }
    let has_pp = opts.mesh.dims.iter().any(|(d, _)| *d == "pp");
    if has_pp && !extras.option_flags().is_empty() {
        return Err(format!(
            "{} cannot be combined with a pp mesh dim",
            extras.option_flags().join(" ")
        ));
    }
    if !has_pp && *pipeline != PipelineOptions::default() {
        return Err(
            "--microbatches, --pp-schedule, --pp-first-layers and --pp-last-layers apply to a pp \
             mesh dim (e.g. --mesh pp=2)"
                .into(),
        );
    }
    // The training options a pipelined rank runs: its microbatches are the pipeline's.
    let pp_train = TrainOptions {
        grad_accum: pipeline.microbatches.max(1),
        ..*train
    };
    if let Some(bug) = opts.bug {
        bug.check_applies_with_options(
            &Site {
                model: &opts.model,
                dp,
                tp,
                forward_only: opts.forward_only,
                kv_replicated: llama && opts.llama.kv_replicas(tp) > 1,
                vocab_parallel: opts.vocab_parallel,
                sequence_parallel: sp,
            },
            if has_pp { &pp_train } else { train },
            &extras.option_flags(),
        )?;
        if bug.mutation == Mutation::RecomputeStaleInput && opts.mlp.layers < 2 {
            return Err(format!(
                "bug `{}` needs at least two layers (--layers 2)",
                bug.id
            ));
        }
        bug.check_ep(ep)?;
        bug.check_cp(cp)?;
        bug.check_pipeline(opts.mesh.size("pp"), pipeline.microbatches)?;
        if bug.mutation == Mutation::PpGradSyncBeforeLastMicrobatch && train.zero.is_some() {
            return Err(format!(
                "bug `{}` is not defined with --zero (its early all-reduce would bypass the \
                 ZeRO gradient split)",
                bug.id
            ));
        }
    }
    if has_pp {
        return emit_pipeline_plan(opts, extras, train, pipeline)
            .map(|(plan, st)| (plan, Some(st)));
    }
    let mutation = opts.bug.map(|b| b.mutation);
    // The spec trains the whole batch on one device: no microbatches, no ZeRO.
    let spec_train = train.for_spec();
    let spec_step = |lr| spec_step(&spec_train, lr);
    // Rank = (dp_i * cp + cp_i) * tp + tp_i (cp = 1 without context parallelism).
    let rank_step = move |r: usize, lr| train::Step {
        opts: train,
        dp,
        tp,
        dp_rank: r / (cp * tp),
        tp_rank: r % tp,
        cp,
        stages: 1,
        shared_copies: &[],
        bug: mutation,
        lr,
    };
    let plan = if deepseek {
        deepseek_plan(
            &extras.deepseek,
            &opts.mesh,
            extras,
            opts.forward_only,
            mutation,
        )
    } else if gpt2 {
        let cfg = &extras.gpt2;
        // Rank = (dp_i * cp + cp_i) * tp + tp_i; ranks differ only by their sequence chunk
        // under SP and their chunks of the sequence under cp.
        let rank: RankBuilder = Box::new(move |r| {
            let plan = gpt2::RankPlan {
                dp,
                tp,
                tp_rank: r % tp,
                sequence_parallel: sp,
                tp_comm_overlap: extras.tp_comm_overlap,
            };
            let cp = cp_plan(r, cp, tp);
            gpt2::build_rank_cp(cfg, plan, &cp, &rank_step(r, cfg.lr), opts.forward_only)
        });
        let groups = if dp > 1 && cp > 1 {
            // The data group of every parameter: the dp x cp ranks of one tp index.
            vec![("dp_cp", sub_mesh_groups(&opts.mesh, &["dp", "cp"]))]
        } else {
            Vec::new()
        };
        gpt2_plan(opts, cfg, &spec_step(cfg.lr), rank, groups)
    } else if llama {
        let cfg = &opts.llama;
        // Rank = (dp_i * cp + cp_i) * tp + tp_i; ranks differ only by their vocabulary range
        // and their sequence chunks.
        let rank: RankBuilder = Box::new(move |r| {
            let plan = llama::RankPlan {
                dp,
                tp,
                tp_rank: r % tp,
                vocab_parallel: opts.vocab_parallel,
                cp: cp_plan(r, cp, tp),
            };
            llama::build_rank(cfg, plan, &rank_step(r, cfg.lr), opts.forward_only)
        });
        let mut plan = llama_plan(opts, &spec_step(cfg.lr), rank, (1, dp * cp, tp));
        if dp > 1 && cp > 1 {
            // The data group of every parameter: the dp x cp ranks of one tp index.
            plan.groups
                .push(("dp_cp", sub_mesh_groups(&opts.mesh, &["dp", "cp"])));
        }
        plan
    } else {
        let cfg = &opts.mlp;
        // Ranks differ only where the training options make them (clipping, ZeRO).
        let rank: RankBuilder = Box::new(move |r| {
            mlp::build_rank(cfg, &rank_step(r, cfg.lr), opts.forward_only, mlp_opts)
        });
        mlp_plan(opts, &spec_step(cfg.lr), rank, mlp_opts)
    };
    Ok((plan, None))
}

/// Where global rank `r` of a mesh whose dims inside cp have `inner` ranks sits on a cp mesh
/// dim of size `cp` (rank = (.. * cp + cp_i) * inner + ..).
fn cp_plan(r: usize, cp: usize, inner: usize) -> CpPlan {
    if cp < 2 {
        return CpPlan::NONE;
    }
    CpPlan {
        cp,
        cp_rank: r / inner % cp,
    }
}

/// The process groups spanning the mesh dims `dims` of `mesh`: one group per coordinate of the
/// other dims, each listing its ranks in rank order.
fn sub_mesh_groups(mesh: &Mesh, dims: &[&str]) -> Vec<Vec<usize>> {
    let mut groups: BTreeMap<Vec<usize>, Vec<usize>> = BTreeMap::new();
    for r in 0..mesh.ranks() {
        // The coordinates of r along the dims not spanned, outermost first.
        let key: Vec<usize> = mesh
            .coords(r)
            .into_iter()
            .zip(&mesh.dims)
            .filter(|(_, (d, _))| !dims.contains(d))
            .map(|(c, _)| c)
            .collect();
        groups.entry(key).or_default().push(r);
    }
    groups.into_values().collect()
}

/// Why context parallelism over `cp` ranks cannot apply to the request, if it cannot.
fn check_cp(
    opts: &EmitOptions,
    extras: &EmitExtras,
    train: &TrainOptions,
    cp: usize,
) -> Result<(), String> {
    if !opts.mesh.dims.iter().any(|(d, _)| *d == "cp") {
        return Ok(());
    }
    let seq = match opts.model.as_str() {
        "llama" => opts.llama.seq,
        "deepseek" => extras.deepseek.base.seq,
        "gpt2" => extras.gpt2.seq,
        other => {
            return Err(format!(
                "the cp mesh dim (context parallelism) applies to the llama, deepseek and gpt2 \
                 models, not `{other}`"
            ))
        }
    };
    if opts.mesh.size("pp") > 1 {
        return Err(
            "context parallelism (cp) is not combined with pipeline parallelism (pp) in the \
             zoo: drop one of the two mesh dims"
                .into(),
        );
    }
    if !seq.is_multiple_of(2 * cp) {
        return Err(format!(
            "seq {seq} does not split into 2 * cp = {} load-balanced chunks (set --seq to a \
             multiple of {})",
            2 * cp,
            2 * cp
        ));
    }
    if cp > 1 && train.zero.is_some() {
        return Err(
            "--zero is not combined with context parallelism (cp) in the zoo: its gradients \
             are averaged over dp x cp, its split runs over dp"
                .into(),
        );
    }
    let tp = opts.mesh.size("tp");
    if opts.model == "gpt2" && extras.sequence_parallel && !(seq / cp).is_multiple_of(tp) {
        return Err(format!(
            "the rank's {} positions (seq {seq} / cp = {cp}) do not split over tp = {tp} \
             (--sequence-parallel)",
            seq / cp
        ));
    }
    Ok(())
}

/// Where the tensors of a pipelined plan live, for its case file.
struct Stages {
    /// Tensor name -> the pp coordinates that hold it (absent: every stage).
    held_at: BTreeMap<String, Vec<usize>>,
    /// The pipeline options, for the case's name and header.
    options: PipelineOptions,
    /// The layers of each stage (the intended division).
    layers: Vec<std::ops::Range<usize>>,
}

/// Emits a plan with a `pp` mesh dim (dims pp, dp, tp): the spec is the single-device model,
/// the ranks run its stages (see [`pipeline`]).
fn emit_pipeline_plan<'a>(
    opts: &'a EmitOptions,
    extras: &'a EmitExtras,
    train: &'a TrainOptions,
    options: &PipelineOptions,
) -> Result<(Plan<'a>, Stages), String> {
    let mesh = &opts.mesh;
    let (pp, dp, tp) = (mesh.size("pp"), mesh.size("dp"), mesh.size("tp"));
    let plan = pipeline::PipelinePlan {
        model: &opts.model,
        mlp: &opts.mlp,
        llama: &opts.llama,
        gpt2: &extras.gpt2,
        sequence_parallel: extras.sequence_parallel,
        deepseek: &extras.deepseek,
        ep: mesh.size("ep"),
        dispatch: extras.ep_dispatch,
        pp,
        dp,
        tp,
        vocab_parallel: opts.vocab_parallel,
        pipeline: *options,
        train,
        bug: opts.bug.map(|b| b.mutation),
        forward_only: opts.forward_only,
    };
    let (layers, batch) = match opts.model.as_str() {
        "mlp" => (opts.mlp.layers, opts.mlp.batch),
        "llama" => (opts.llama.layers, opts.llama.batch),
        "gpt2" => (extras.gpt2.layers, extras.gpt2.batch),
        // The batch is split over dp x ep.
        "deepseek" => (
            extras.deepseek.base.layers,
            extras.deepseek.base.batch / mesh.size("ep"),
        ),
        _ => (0, 1),
    };
    let division = pipeline::check(&plan, layers, batch / dp)?;
    let stage_ranges = (0..pp).map(|s| division.stage(s, None)).collect();
    let (rank, held_at) = pipeline::build_ranks(plan, division);
    let spec_train = train.for_spec();
    let spec_step = |lr| spec_step(&spec_train, lr);
    let plan = if opts.model == "mlp" {
        let cfg = &opts.mlp;
        mlp_plan(opts, &spec_step(cfg.lr), rank, MlpOptions::default())
    } else if opts.model == "deepseek" {
        let mutation = opts.bug.map(|b| b.mutation);
        let mut plan = deepseek_plan(&extras.deepseek, mesh, extras, opts.forward_only, mutation);
        plan.rank = rank;
        // The data group of the replicated parameters: the dp x ep ranks of one pp and tp
        // index.
        plan.groups = if dp > 1 && mesh.size("ep") > 1 {
            vec![("dp_ep", sub_mesh_groups(mesh, &["dp", "ep"]))]
        } else {
            Vec::new()
        };
        plan
    } else if opts.model == "gpt2" {
        let cfg = &extras.gpt2;
        // The tied token embedding's copies on the first and the last stage.
        let groups = vec![("embd", pipeline::embedding_groups(pp, dp, tp))];
        gpt2_plan(opts, cfg, &spec_step(cfg.lr), rank, groups)
    } else {
        llama_plan(opts, &spec_step(opts.llama.lr), rank, (pp, dp, tp))
    };
    let stages = Stages {
        held_at,
        options: *options,
        layers: stage_ranges,
    };
    Ok((plan, stages))
}

/// The mlp plan around its rank graph builder `rank`: the spec (built with `spec_step`), the data
/// inputs and the parameters.
fn mlp_plan<'a>(
    opts: &EmitOptions,
    spec_step: &train::Step,
    rank: RankBuilder<'a>,
    options: MlpOptions,
) -> Plan<'a> {
    let cfg = &opts.mlp;
    // The spec is the single-device model: FP8 like the ranks, no recomputation.
    let spec_options = MlpOptions {
        recompute: false,
        ..options
    };
    Plan {
        spec: mlp::build_rank(cfg, spec_step, opts.forward_only, spec_options),
        rank,
        data: vec![("x", true), ("target", true)],
        params: cfg.params(),
        groups: Vec::new(),
        ep_sharded: Vec::new(),
    }
}

/// The gpt2 plan of the sizes `cfg` around its rank graph builder `rank`: the spec (built with
/// `spec_step`), the data inputs, the parameters and the process groups `groups`.
fn gpt2_plan<'a>(
    opts: &EmitOptions,
    cfg: &Gpt2Config,
    spec_step: &train::Step,
    rank: RankBuilder<'a>,
    groups: Vec<(&'static str, Vec<Vec<usize>>)>,
) -> Plan<'a> {
    Plan {
        spec: gpt2::build_rank(cfg, gpt2::RankPlan::SPEC, spec_step, opts.forward_only),
        rank,
        data: vec![("tokens", true), ("labels", true)],
        params: cfg.params(),
        groups,
        ep_sharded: Vec::new(),
    }
}

/// The llama plan around its rank graph builder `rank` on a `pp` x `dp` x `tp` mesh: the spec (built
/// with `spec_step`), the data inputs, the parameters, and the `kv` groups when kv heads are
/// replicated over tp ranks.
fn llama_plan<'a>(
    opts: &EmitOptions,
    spec_step: &train::Step,
    rank: RankBuilder<'a>,
    (pp, dp, tp): (usize, usize, usize),
) -> Plan<'a> {
    let cfg = &opts.llama;
    let rep = cfg.kv_replicas(tp);
    let groups = if rep > 1 {
        vec![("kv", pipeline::kv_groups(pp, dp, tp, rep))]
    } else {
        Vec::new()
    };
    Plan {
        spec: llama::build_rank(cfg, llama::RankPlan::SPEC, spec_step, opts.forward_only),
        rank,
        data: vec![("tokens", true), ("labels", true), ("rope_inv_freq", false)],
        params: cfg.params(tp, opts.vocab_parallel),
        groups,
        ep_sharded: Vec::new(),
    }
}

/// `place` restricted to the pp coordinates `stages` (`at: { pp: .. }`), in entry form.
fn held_on(place: String, stages: &[usize]) -> String {
    let at = match stages {
        [one] => format!("at: {{ pp: {one} }}"),
        many => {
            let list: Vec<String> = many.iter().map(|s| s.to_string()).collect();
            format!("at: {{ pp: [{}] }}", list.join(", "))
        }
    };
    match place.strip_suffix(" }") {
        // Already an entry (`{ placement: .., replicas: 2 }`): add the key.
        Some(entry) if place.starts_with("{ placement:") => format!("{entry}, {at} }}"),
        _ => format!("{{ placement: {place}, {at} }}"),
    }
}

/// The deepseek plan on `mesh` (dims in the order dp, tp, ep): rank
/// `(dp_i * tp + tp_i) * ep + ep_i`; ranks differ only by the experts their ep index holds.
fn deepseek_plan<'a>(
    cfg: &'a DeepseekConfig,
    mesh: &Mesh,
    extras: &EmitExtras,
    forward_only: bool,
    mutation: Option<Mutation>,
) -> Plan<'a> {
    let (dp, tp, ep) = (mesh.size("dp"), mesh.size("tp"), mesh.size("ep"));
    let cp = mesh.size("cp");
    let (dispatch, sequence_parallel) = (extras.ep_dispatch, extras.sequence_parallel);
    // Rank = ((dp_i * cp + cp_i) * tp + tp_i) * ep + ep_i.
    let plan = move |r: usize| deepseek::RankPlan {
        dp,
        tp,
        ep,
        ep_rank: r % ep,
        tp_rank: (r / ep) % tp,
        dispatch,
        sequence_parallel,
        cp: cp_plan(r, cp, tp * ep),
    };
    let rank: RankBuilder =
        Box::new(move |r| deepseek::build(cfg, plan(r), forward_only, mutation));
    let groups = if cp > 1 {
        // The data group of the replicated parameters (the dp x cp x ep ranks of one tp
        // index) and the expert-data-parallel group (dp x cp), where they span several dims.
        let mut groups = Vec::new();
        let (data, _) = plan(0).data_group();
        let spanned: Vec<&str> = data.split('_').collect();
        if spanned.len() > 1 {
            groups.push((data, sub_mesh_groups(mesh, &spanned)));
        }
        if dp > 1 && ep > 1 {
            groups.push(("dp_cp", sub_mesh_groups(mesh, &["dp", "cp"])));
        }
        groups
    } else if dp > 1 && ep > 1 {
        // The data group of the replicated parameters: the dp x ep ranks of one tp index.
        let lists = (0..tp)
            .map(|j| {
                (0..dp)
                    .flat_map(|i| (0..ep).map(move |e| (i * tp + j) * ep + e))
                    .collect()
            })
            .collect();
        vec![("dp_ep", lists)]
    } else {
        Vec::new()
    };
    let params = cfg.plan_params(&plan(0), mutation);
    let ep_sharded = params
        .iter()
        .filter(|p| DeepseekConfig::is_expert(&p.name))
        .map(|p| p.name.clone())
        .collect();
    Plan {
        spec: deepseek::build(cfg, deepseek::RankPlan::SPEC, forward_only, None),
        rank,
        data: vec![("tokens", true), ("labels", true), ("rope_inv_freq", false)],
        params,
        groups,
        ep_sharded,
    }
}

/// The case file of `plan`, whose rank `r` runs the graph file `graph_files[r]`.
fn case_yaml(
    opts: &EmitOptions,
    extras: &EmitExtras,
    train: &TrainOptions,
    plan: &Plan,
    stages: Option<&Stages>,
    graph_files: &[String],
) -> String {
    let (sequence_parallel, preset) = (extras.sequence_parallel, extras.preset);
    let dispatch = extras.ep_dispatch;
    let mesh = &opts.mesh;
    // Restricts a tensor's placement to the stages that hold it, under pipeline parallelism.
    let held = |name: &str, place: String| match stages.and_then(|s| s.held_at.get(name)) {
        Some(at) if stages.is_some_and(|s| at.len() < s.layers.len()) => held_on(place, at),
        _ => place,
    };
    let has = |d: &str| mesh.dims.iter().any(|(m, _)| *m == d);
    let on = |dim: &str, p: &str| {
        if has(dim) {
            format!("{{ {dim}: {p} }}")
        } else {
            "Replicate()".to_string()
        }
    };
    let tp_place = |l: TpLayout| match l {
        TpLayout::Replicate => "Replicate()".to_string(),
        TpLayout::Shard(d) => on("tp", &format!("Shard({d})")),
        TpLayout::ShardReplicas { dim, replicas } => format!(
            "{{ placement: {}, replicas: {replicas} }}",
            on("tp", &format!("Shard({dim})"))
        ),
    };
    // Per mesh dim, in mesh order; `Replicate()` when none applies.
    let per_dim = |pieces: &[(&str, String)]| {
        let present: Vec<String> = pieces
            .iter()
            .filter(|(d, _)| has(d))
            .map(|(d, p)| format!("{d}: {p}"))
            .collect();
        if present.is_empty() {
            "Replicate()".to_string()
        } else {
            format!("{{ {} }}", present.join(", "))
        }
    };
    let param_place = |p: &Param| {
        if !plan.ep_sharded.contains(&p.name) {
            return tp_place(p.tp);
        }
        let mut pieces = Vec::new();
        if let TpLayout::Shard(d) = p.tp {
            pieces.push(("tp", format!("Shard({d})")));
        }
        pieces.push(("ep", "Shard(0)".to_string()));
        per_dim(&pieces)
    };
    let batch_place = per_dim(&[
        ("dp", "Shard(0)".to_string()),
        ("ep", "Shard(0)".to_string()),
    ]);
    // ZeRO: the dim along which a parameter's optimizer states (and under ZeRO-3 the parameter
    // itself) are split over dp, on top of the tp layout.
    let (dp, tp) = (mesh.size("dp"), mesh.size("tp"));
    let zero_dim = |p: &Param| {
        train
            .zero
            .filter(|_| dp > 1)
            .and_then(|_| train::zero_shard_dim(p, tp, dp))
    };
    let place = |p: &Param, dp_split: Option<usize>| {
        let Some(z) = dp_split else {
            return param_place(p);
        };
        let mut dims = vec![format!("dp: Shard({z})")];
        let (tp_dim, replicas) = match p.tp {
            TpLayout::Replicate => (None, 1),
            TpLayout::Shard(d) => (Some(d), 1),
            TpLayout::ShardReplicas { dim, replicas } => (Some(dim), replicas),
        };
        if let Some(d) = tp_dim.filter(|_| has("tp")) {
            dims.push(format!("tp: Shard({d})"));
        }
        let map = format!("{{ {} }}", dims.join(", "));
        if replicas > 1 {
            format!("{{ placement: {map}, replicas: {replicas} }}")
        } else {
            map
        }
    };
    let param_split = |p: &Param| zero_dim(p).filter(|_| train.zero == Some(ZeroStage::Three));
    let mut name = format!(
        "{}-{}",
        preset.map_or(opts.model.as_str(), |p| p.name),
        mesh.label()
    );
    if opts.vocab_parallel {
        name.push_str("-vp");
    }
    if sequence_parallel {
        name.push_str("-sp");
    }
    if dispatch == EpDispatch::AllToAll {
        name.push_str("-a2a");
    }
    for flag in extras.option_flags() {
        let _ = write!(name, "-{}", flag.trim_start_matches("--"));
    }
    if opts.forward_only {
        name.push_str("-fw");
    }
    name.push_str(&train.label());
    if let Some(s) = stages {
        let _ = write!(
            name,
            "-mb{}-{}",
            s.options.microbatches,
            s.options.schedule.name()
        );
        if s.layers.iter().any(|r| r.len() != s.layers[0].len()) {
            name.push_str("-uneven");
        }
    }
    if let Some(b) = opts.bug {
        let _ = write!(name, "-{}", b.id);
    }
    let mut s = String::new();
    let _ = writeln!(
        s,
        "# Emitted by `shardproof zoo emit`: model {}, mesh {}.",
        opts.model,
        mesh.label()
    );
    let _ = writeln!(
        s,
        "# {}",
        if opts.forward_only {
            "Forward and loss only.".to_string()
        } else {
            train.describe()
        }
    );
    if let Some(st) = stages {
        let division: Vec<String> = st
            .layers
            .iter()
            .enumerate()
            .map(|(i, r)| format!("stage {i}: layers {}-{}", r.start, r.end - 1))
            .collect();
        let _ = writeln!(
            s,
            "# Pipeline: {} stages ({}), {} microbatch(es) per dp rank, {} schedule.",
            division.len(),
            division.join(", "),
            st.options.microbatches,
            st.options.schedule.name()
        );
    }
    if dispatch == EpDispatch::AllToAll {
        let _ = writeln!(
            s,
            "# Expert dispatch: all_to_all_single over ep (tokens and gates out, partial outputs back)."
        );
    }
    if !extras.option_flags().is_empty() {
        let _ = writeln!(s, "# Options: {}.", extras.option_flags().join(" "));
    }
    let cp = mesh.size("cp");
    if cp > 1 {
        let _ = writeln!(
            s,
            "# Context parallel: the sequence in {} load-balanced chunks, cp rank i holding \
             chunks i and {}-i (ring attention by send/recv). tokens and labels are laid out \
             over dp only: every cp rank reads its dp rank's sequences whole and selects its \
             two chunks (Megatron's get_batch_on_this_cp_rank); a placement cannot express \
             the two-chunk layout (Shard(1) over cp holds one contiguous chunk).",
            2 * cp,
            2 * cp - 1
        );
    }
    if let Some(b) = opts.bug {
        let _ = writeln!(s, "# Planted bug `{}`: {}.", b.id, b.description);
    }
    if let Some(p) = preset {
        let _ = writeln!(
            s,
            "# Preset `{}` (sizes given as flags override it): {}.",
            p.name,
            p.plan_note()
        );
    }
    let _ = writeln!(
        s,
        "version: 1\nname: {name}\nspec:\n  graph: spec.py\nimpl:"
    );
    let dims: Vec<String> = mesh.dims.iter().map(|(d, n)| format!("{d}: {n}")).collect();
    let _ = writeln!(s, "  mesh: {{ {} }}", dims.join(", "));
    let _ = writeln!(s, "  graphs: [{}]\n  groups:", graph_files.join(", "));
    for (d, _) in &mesh.dims {
        let _ = writeln!(s, "    \"{d}\": {d}");
    }
    for (group, lists) in &plan.groups {
        let lists: Vec<String> = lists
            .iter()
            .map(|l| {
                let ranks: Vec<String> = l.iter().map(|r| r.to_string()).collect();
                format!("[{}]", ranks.join(", "))
            })
            .collect();
        let _ = writeln!(s, "    \"{group}\": [{}]", lists.join(", "));
    }
    let _ = writeln!(s, "inputs:");
    for (input, batched) in &plan.data {
        let place = if *batched {
            batch_place.clone()
        } else {
            "Replicate()".to_string()
        };
        let _ = writeln!(s, "  {input}: {}", held(input, place));
    }
    for p in &plan.params {
        let _ = writeln!(
            s,
            "  {}: {}",
            p.name,
            held(&p.name, place(p, param_split(p)))
        );
    }
    if let Optimizer::Adam(_) = train.optimizer {
        for p in &plan.params {
            for state in ["exp_avg", "exp_avg_sq"] {
                let name = format!("{state}_{}", p.name);
                let _ = writeln!(s, "  {name}: {}", held(&name, place(p, zero_dim(p))));
            }
        }
    }
    let _ = writeln!(s, "outputs:");
    for out in plan.spec.outputs() {
        let updated = |p: &&Param| out.name == format!("{}_new", p.name);
        let state = |p: &&Param| {
            ["exp_avg", "exp_avg_sq"]
                .iter()
                .any(|st| out.name == format!("{st}_{}_new", p.name))
        };
        let place = if let Some(p) = plan.params.iter().find(updated) {
            place(p, param_split(p))
        } else if let Some(p) = plan.params.iter().find(state) {
            place(p, zero_dim(p))
        } else {
            "Replicate()".to_string()
        };
        let _ = writeln!(s, "  {}: {}", out.name, held(&out.name, place));
    }
    if ["llama", "gpt2", "deepseek"].contains(&opts.model.as_str()) {
        // The zoo's labels are vocabulary ids, never the loss's ignore_index (-100): a mean
        // cross-entropy over a split batch is then the mean of equal-sized per-rank means.
        let _ = writeln!(
            s,
            "assume:\n  ignore-index: unused   # labels never equal ignore_index (-100)"
        );
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mesh_parses_and_orders() {
        let m = Mesh::parse("tp=4, dp=2").unwrap();
        assert_eq!(m.dims, vec![("dp", 2), ("tp", 4)]);
        assert_eq!((m.ranks(), m.label()), (8, "dp2-tp4".to_string()));
        let m = Mesh::parse("tp=2,dp=2,pp=2").unwrap();
        assert_eq!(m.dims, vec![("pp", 2), ("dp", 2), ("tp", 2)]);
        for bad in ["tp", "zz=2", "tp=0", "tp=x", "tp=2,tp=2"] {
            assert!(Mesh::parse(bad).is_err(), "{bad}");
        }
    }

    /// The `graphs:` entries of an emitted case.
    fn graph_files(e: &Emitted) -> Vec<String> {
        let case = &e.files[0].1;
        let line = case
            .lines()
            .find_map(|l| l.trim().strip_prefix("graphs: ["))
            .expect("a graphs: line");
        line.trim_end_matches(']')
            .split(", ")
            .map(str::to_string)
            .collect()
    }

    #[test]
    fn shared_rank_graphs_hold_each_rank_its_own_program() {
        let cases = [
            ("mlp", "dp=2,tp=2", false),
            ("llama", "dp=2,tp=2", false),
            ("llama", "dp=2,tp=2", true),
            ("gpt2", "dp=2,tp=2", false),
            ("deepseek", "dp=2,tp=2,ep=2", false),
        ];
        let zero = TrainOptions {
            zero: Some(ZeroStage::One),
            ..TrainOptions::default()
        };
        for (model, mesh, vocab_parallel) in cases {
            for train in [TrainOptions::default(), zero] {
                if model == "deepseek" && train != TrainOptions::default() {
                    continue;
                }
                let opts = EmitOptions {
                    model: model.into(),
                    mlp: MlpConfig::default(),
                    llama: LlamaConfig::default(),
                    mesh: Mesh::parse(mesh).unwrap(),
                    bug: None,
                    forward_only: false,
                    vocab_parallel,
                };
                let per_rank = emit_training(&opts, &EmitExtras::default(), &train).unwrap();
                let shared_extras = EmitExtras {
                    rank_graphs: RankGraphs::Shared,
                    ..EmitExtras::default()
                };
                let shared = emit_training(&opts, &shared_extras, &train).unwrap();
                let text = |e: &Emitted, name: &str| {
                    e.files.iter().find(|(n, _)| n == name).unwrap().1.clone()
                };
                let (mine, theirs) = (graph_files(&per_rank), graph_files(&shared));
                assert_eq!(mine.len(), opts.mesh.ranks());
                assert_eq!(theirs.len(), opts.mesh.ranks());
                for (r, (a, b)) in mine.iter().zip(&theirs).enumerate() {
                    assert_eq!(a, &format!("r{r}.py"));
                    assert_eq!(
                        text(&per_rank, a),
                        text(&shared, b),
                        "{model} {mesh} rank {r}"
                    );
                }
                // Files are named after the first rank that runs them; no program is repeated.
                let files: Vec<&String> = shared.files[2..].iter().map(|(n, _)| n).collect();
                for (i, f) in files.iter().enumerate() {
                    let first = theirs.iter().position(|g| g == *f).unwrap();
                    assert_eq!(**f, format!("r{first}.py"));
                    for g in &files[i + 1..] {
                        assert_ne!(text(&shared, f), text(&shared, g));
                    }
                }
                // Everything but the graphs line of the case file is the same.
                let strip = |e: &Emitted| {
                    e.files[0]
                        .1
                        .lines()
                        .filter(|l| !l.trim().starts_with("graphs:"))
                        .collect::<Vec<_>>()
                        .join("\n")
                };
                assert_eq!(strip(&per_rank), strip(&shared));
            }
        }
    }
}
