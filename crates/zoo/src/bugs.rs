//! The bug catalog: named mutations of a correct distributed plan.

use crate::train::TrainOptions;

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
    /// Llama: the all-reduce after the row-parallel attention output projection of layer 0 is
    /// removed.
    LlamaOprojMissingAllreduce,
    /// Llama: the attention softmax scale is computed from the rank's share of the projection
    /// width, `1/sqrt(head_dim / tp)`, instead of `1/sqrt(head_dim)`.
    LlamaAttnScaleLocal,
    /// Llama: the backward all-reduce over tp of the input gradient of layer 0's
    /// column-parallel q/k/v projections (Megatron's `f` operator) is removed.
    LlamaQkvGradMissingAllreduce,
    /// Llama: the gradients of kv-head weights replicated over tp ranks (tp > kv heads) are
    /// not all-reduced across the replicas before the optimizer step.
    LlamaKvGradUnsynced,
    /// Llama with a vocab-parallel embedding: the rows looked up for tokens outside the rank's
    /// vocabulary range are not zeroed before the all-reduce.
    LlamaVocabEmbeddingUnmasked,
    /// Sequence parallel: the gradients of the LayerNorm weights and biases (computed on
    /// sequence chunks, so partial over tp) are not all-reduced over tp.
    SpLayernormGradNotReduced,
    /// Sequence parallel: each rank keeps the next rank's sequence chunk of the embedding
    /// output instead of its own.
    SpScatterWrongChunk,
    /// Gradient accumulation: the microbatch losses are not scaled by 1/M (neither the reported
    /// loss nor the backward seed).
    GradAccumLossNotScaled,
    /// ZeRO: the last dp rank skips the update of its shards (all-gathers, or under ZeRO-3
    /// keeps, the stale parameter shard).
    ZeroParamUpdateSkipped,
    /// Gradient clipping: the squared norms of the tp-replicated parameters are summed on
    /// every tp rank before the all-reduce, so the global norm counts them tp times.
    GradNormReplicatedOvercounted,
    /// Loss scaling: the gradients are not divided by the loss scale before clipping and the
    /// optimizer.
    LossScaleNotUnscaled,
    /// DeepSeek MoE: each tp rank adds the whole auxiliary load-balancing loss instead of its
    /// 1/tp share, so the tp ranks' sum counts it tp times (loss and router gradients).
    MoeAuxLossNotDividedByTp,
    /// DeepSeek MoE: the router weight gradients, partial over tp, are not all-reduced over tp
    /// before the optimizer step.
    MoeRouterGradUnsynced,
    /// DeepSeek MoE under expert parallelism: the routed experts' gradients are divided by the
    /// expert-data-parallel size (dp) instead of the whole data-parallel size (dp x ep).
    EpExpertGradNotAveraged,
    /// Pipeline: the gradients are all-reduced over dp before the last microbatch's backward,
    /// whose gradients are then added unreduced.
    PpGradSyncBeforeLastMicrobatch,
    /// Pipeline: the last stage pairs each microbatch's activations with the labels (targets)
    /// of the next microbatch.
    PpShuffledMicrobatches,
    /// Pipeline: the stage division assigns the last layer of stage 0 to stage 1 as well, so
    /// the forward runs it twice.
    PpWrongStageDivision,
    /// Pipeline: the first stage's schedule skips the send of its last forward activation,
    /// so the next stage's recv has no partner.
    PpMismatchedSendRecv,
    /// DeepSeek under tp: the RMSNorm before layer 0's MoE block takes its mean of squares over
    /// the rank's tp shard of the hidden dim instead of the whole hidden dim.
    NormShardedHidden,
    /// GPT-2 under SP: before layer 0's attention all-gather each rank pads its sequence chunk
    /// by one row, and the gathered tensor is sliced to its first `seq` rows instead of
    /// dropping each chunk's padding.
    SpPadSliceMismatch,
    /// MLP: block 0's fc1 weight and bias gradients are computed but left dangling; the
    /// finalization reads zero-filled gradient buffers that nothing in the backward produces.
    DanglingBackwardTensor,
    /// GPT-2 under ZeRO: the tied token embedding and LM head are updated as if untied: the
    /// LM head's gradient never reaches the embedding's update.
    ZeroTiedEmbeddingUntied,
    /// MLP under tp: the row-parallel all-reduce of block 0 is read without its `wait_tensor`.
    AsyncAllreduceNoWait,
    /// MLP with activation recomputation: block 1's recomputation reads block 0's checkpointed
    /// input (a stale buffer) instead of its own.
    RecomputeStaleInput,
    /// MLP with FP8 weights: the amax all-reduce of the per-tensor FP8 scaling runs over the
    /// `dp` group instead of `tp`.
    Fp8AmaxWrongGroup,
    /// MLP with FP8 weights and activation recomputation: the recomputation of block 0 reads
    /// fc1's master weight instead of its FP8 cast.
    Fp8RecomputeWrongCast,
    /// GPT-2 under SP with TP communication overlap: the chunked weight-gradient GEMMs pair
    /// the output-gradient chunks in ring-arrival order with activation chunks in rank order.
    TpOverlapWrongChunkOrder,
    /// DeepSeek under SP: the routed experts stay split over tp (as without SP) while each tp
    /// rank runs them on its own sequence chunk, so the cross terms are never computed.
    MoeExpertsShardedUnderSp,
    /// Context parallelism: RoPE rotates the rank's sequence chunks by their local positions
    /// `0..seq/cp` instead of their global positions (the chunks' offsets are dropped).
    CpRopeNoOffset,
    /// Context parallelism: the rank's loss is multiplied by the cp size an extra time before
    /// the reduction over dp x cp, so the loss and every gradient are cp times too large.
    CpLossOverscaled,
    /// Context parallelism: every ring step masks its block causally by the block-local
    /// indices of queries and keys instead of their global positions.
    CpCausalMaskLocal,
    /// Tensor x context parallelism: the RMSNorm weight gradients, complete on every tp rank,
    /// are all-reduced over tp once more, so they come out tp times too large.
    TpCpNormGradScaledByTp,
    /// Context parallelism: a kernel of the ring attention backward reads a non-contiguous
    /// input with the wrong strides. Listed only: a graph has value semantics, so no emitted
    /// graph can express it.
    CpAttnGradNonContiguous,
}

/// What a mutation needs of the pipeline (a `pp` mesh dim and its microbatches).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PipelineNeeds {
    /// At least two pipeline stages.
    pub stages: bool,
    /// At least two microbatches.
    pub microbatches: bool,
}

impl Mutation {
    /// What the mutation needs of the pipeline (nothing for the mutations of other
    /// parallelisms).
    pub fn pipeline_needs(self) -> PipelineNeeds {
        let stages = PipelineNeeds {
            stages: true,
            microbatches: false,
        };
        match self {
            Mutation::PpGradSyncBeforeLastMicrobatch | Mutation::PpShuffledMicrobatches => {
                PipelineNeeds {
                    microbatches: true,
                    ..stages
                }
            }
            Mutation::PpWrongStageDivision | Mutation::PpMismatchedSendRecv => stages,
            _ => PipelineNeeds::default(),
        }
    }
}

/// The training options (beyond forward + backward + SGD) a mutation needs to be planted.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TrainingNeeds {
    /// Gradient accumulation over at least 2 microbatches (`--grad-accum`).
    pub grad_accum: bool,
    /// ZeRO over dp (`--zero`).
    pub zero: bool,
    /// Global gradient-norm clipping (`--clip-grad`).
    pub clip_grad: bool,
    /// Static loss scaling (`--loss-scale`).
    pub loss_scale: bool,
}

impl Mutation {
    /// The model options (flags of `zoo emit` beyond the mesh and the training options) the
    /// mutation needs to be planted, as `(flag, what it turns on)`.
    pub fn option_needs(self) -> &'static [(&'static str, &'static str)] {
        const RECOMPUTE: (&str, &str) = ("--recompute", "activation recomputation");
        const FP8: (&str, &str) = ("--fp8", "FP8 weights");
        match self {
            Mutation::RecomputeStaleInput => &[RECOMPUTE],
            Mutation::Fp8AmaxWrongGroup => &[FP8],
            Mutation::Fp8RecomputeWrongCast => &[FP8, RECOMPUTE],
            Mutation::TpOverlapWrongChunkOrder => {
                &[("--tp-comm-overlap", "TP communication overlap")]
            }
            _ => &[],
        }
    }

    /// Whether the mutation leaves every value the same: the interpreter (and any engine that
    /// reads graphs as dataflow) computes exactly the correct plan's outputs, and only an
    /// engine that models when collectives complete can tell.
    pub fn numerically_invisible(self) -> bool {
        self == Mutation::AsyncAllreduceNoWait
    }

    /// The training options the mutation needs (none for the mutations of the model itself).
    pub fn training_needs(self) -> TrainingNeeds {
        let none = TrainingNeeds::default();
        match self {
            Mutation::GradAccumLossNotScaled => TrainingNeeds {
                grad_accum: true,
                ..none
            },
            Mutation::ZeroParamUpdateSkipped | Mutation::ZeroTiedEmbeddingUntied => {
                TrainingNeeds { zero: true, ..none }
            }
            Mutation::GradNormReplicatedOvercounted => TrainingNeeds {
                clip_grad: true,
                ..none
            },
            Mutation::LossScaleNotUnscaled => TrainingNeeds {
                loss_scale: true,
                ..none
            },
            _ => none,
        }
    }
}

/// The facts about a plan that decide whether a bug can be planted in it.
#[derive(Clone, Copy, Debug)]
pub struct Site<'a> {
    /// The model (see [`crate::MODELS`]).
    pub model: &'a str,
    /// Size of the `dp` mesh dim (1 when absent).
    pub dp: usize,
    /// Size of the `tp` mesh dim (1 when absent).
    pub tp: usize,
    /// The plan is forward and loss only.
    pub forward_only: bool,
    /// Some weights are replicated over groups of tp ranks (GQA with tp > kv heads).
    pub kv_replicated: bool,
    /// The embedding and LM head are split over tp along the vocabulary.
    pub vocab_parallel: bool,
    /// Activations outside the tensor-parallel regions are split along the sequence over tp.
    pub sequence_parallel: bool,
}

/// One entry of the bug catalog.
#[derive(Clone, Copy, Debug)]
pub struct Bug {
    /// The name used on the command line (`--bug ID`).
    pub id: &'static str,
    /// Where the bug class comes from, cited by content: the papers by their short names
    /// (TrainVerify: "Equivalence-Based Verification for Distributed LLM Training", SOSP'25;
    /// Entangle: "It Takes Two to Entangle", ASPLOS'26; TTrace: "Lightweight Error Checking and
    /// Diagnosis for Distributed Training"), upstream issues by URL or by project and number.
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
    /// The models the mutation is defined for.
    pub models: &'static [&'static str],
    /// Needs kv-head weights replicated over tp ranks (tp > kv heads).
    pub needs_kv_replicas: bool,
    /// Needs the vocab-parallel embedding and LM head (`--vocab-parallel`).
    pub needs_vocab_parallel: bool,
    /// Needs sequence parallelism (`--sequence-parallel`).
    pub needs_sequence_parallel: bool,
}

/// Every model of the zoo.
const ALL: &[&str] = &["mlp", "llama", "gpt2"];
/// The models whose row-parallel linears have a bias (the MLP's fc2, GPT-2's fc2).
const BIASED: &[&str] = &["mlp", "gpt2"];
/// The GPT-2 model only.
const GPT2: &[&str] = &["gpt2"];
/// The Llama model only.
const LLAMA: &[&str] = &["llama"];
/// The DeepSeek MoE model only.
const DEEPSEEK: &[&str] = &["deepseek"];
/// The models the zoo pipelines.
const PIPELINED: &[&str] = &["mlp", "llama", "gpt2", "deepseek"];
/// The pipelined models whose gradients finish over one data group (`dp`): not deepseek, whose
/// replicated and expert parameters finish over different groups (dp x ep, dp).
const PIPELINED_DP: &[&str] = &["mlp", "llama", "gpt2"];
/// The MLP model only.
const MLP: &[&str] = &["mlp"];

/// The fields the DeepSeek MoE bugs share; every entry sets its own id, texts and mutation.
const DEEPSEEK_BUG: Bug = Bug {
    id: "",
    source: "",
    description: "",
    parallelism: "",
    engines: "run",
    spec_op: "",
    mutation: Mutation::MoeAuxLossNotDividedByTp,
    needs_dp: false,
    needs_tp: false,
    needs_backward: false,
    changes_loss: false,
    models: DEEPSEEK,
    needs_kv_replicas: false,
    needs_vocab_parallel: false,
    needs_sequence_parallel: false,
};

/// The fields the pipeline bugs share; every entry sets its own id, texts and mutation.
const PIPELINE_BUG: Bug = Bug {
    mutation: Mutation::PpMismatchedSendRecv,
    models: PIPELINED,
    ..DEEPSEEK_BUG
};

/// The models with ring attention under context parallelism.
const CP_MODELS: &[&str] = &["llama", "deepseek", "gpt2"];
/// The dense models under context parallelism.
const CP_DENSE: &[&str] = &["llama", "gpt2"];

/// The fields the context-parallel bugs share; every entry sets its own id, texts and mutation.
const CP_BUG: Bug = Bug {
    mutation: Mutation::CpRopeNoOffset,
    models: LLAMA,
    ..DEEPSEEK_BUG
};

/// Every bug this version of the zoo can plant.
pub const BUGS: &[Bug] = &[
    Bug {
        id: "tp-missing-allreduce",
        source: "Megatron-LM row-parallel linear: missing all-reduce (TrainVerify (SOSP'25) section 8.3: incorrect or missing communication operators; Entangle (ASPLOS'26): missing all-reduce in a row-parallel linear under a wrong config)",
        description: "the reduction after the row-parallel fc2 of layer 0 (all-reduce; reduce-scatter under SP) is removed",
        parallelism: "tp",
        engines: "check, run, verify",
        spec_op: "the fc2 bias of layer 0 (mlp: aten.add.Tensor; gpt2: aten.addmm.default)",
        mutation: Mutation::TpMissingAllreduce,
        needs_dp: false,
        needs_tp: true,
        needs_backward: false,
        changes_loss: true,
        models: BIASED,
        needs_kv_replicas: false,
        needs_vocab_parallel: false,
        needs_sequence_parallel: false,
    },
    Bug {
        id: "tp-bias-before-allreduce",
        source: "Megatron-LM row-parallel linear: bias added to every partial sum before the all-reduce (TrainVerify (SOSP'25) section 8.3: wrong scaling of distributed state)",
        description:
            "the fc2 bias of layer 0 is added before the all-reduce (reduce-scatter under SP), so it counts tp times",
        parallelism: "tp",
        engines: "check, run, verify",
        spec_op: "the fc2 bias of layer 0 (mlp: aten.add.Tensor; gpt2: aten.addmm.default)",
        mutation: Mutation::TpBiasBeforeAllreduce,
        needs_dp: false,
        needs_tp: true,
        needs_backward: false,
        changes_loss: true,
        models: BIASED,
        needs_kv_replicas: false,
        needs_vocab_parallel: false,
        needs_sequence_parallel: false,
    },
    Bug {
        id: "dp-loss-not-averaged",
        source: "TTrace Table 1: wrong DP loss scaling (the loss not averaged across data-parallel ranks, Megatron-LM)",
        description: "the loss is all-reduced over dp and divided by 1 instead of dp",
        parallelism: "dp",
        engines: "run, verify, trace",
        spec_op: "the loss (aten.mean.default for mlp, aten.nll_loss_forward.default for llama and gpt2)",
        mutation: Mutation::DpLossNotAveraged,
        needs_dp: true,
        needs_tp: false,
        needs_backward: false,
        changes_loss: true,
        models: ALL,
        needs_kv_replicas: false,
        needs_vocab_parallel: false,
        needs_sequence_parallel: false,
    },
    Bug {
        id: "dp-grad-not-averaged",
        source: "TTrace Table 1: wrong DP loss scaling (gradient all-reduce without 1/dp, DeepSpeed / Megatron-LM)",
        description: "gradients are all-reduced over dp but not divided by dp before the SGD step",
        parallelism: "dp (full iteration)",
        engines: "run, verify",
        spec_op: "the first updated parameter's weight gradient, which no rank averages (mlp: aten.mm.default; llama: aten.embedding_dense_backward.default; gpt2: aten.add.Tensor summing the tied embedding's two gradients), then its SGD step",
        mutation: Mutation::DpGradNotAveraged,
        needs_dp: true,
        needs_tp: false,
        needs_backward: true,
        changes_loss: false,
        models: ALL,
        needs_kv_replicas: false,
        needs_vocab_parallel: false,
        needs_sequence_parallel: false,
    },
    Bug {
        id: "wrong-group",
        source: "TrainVerify (SOSP'25) section 8.3: wrong device/group assignment (a collective over the wrong process group)",
        description: "the row-parallel all-reduce of layer 0 (mlp: fc2, llama and gpt2: attention output projection) runs over the dp group instead of tp",
        parallelism: "dp x tp",
        engines: "check, run, verify",
        spec_op: "aten.add.Tensor after the row-parallel linear of layer 0 (bias or residual; gpt2: the output projection's aten.addmm.default, which adds the bias)",
        mutation: Mutation::WrongGroup,
        needs_dp: true,
        needs_tp: true,
        needs_backward: false,
        changes_loss: true,
        models: ALL,
        needs_kv_replicas: false,
        needs_vocab_parallel: false,
        needs_sequence_parallel: false,
    },
    Bug {
        id: "llama-oproj-missing-allreduce",
        source: "Megatron-LM RowParallelLinear: missing all-reduce after a row-parallel matmul (also in the bug table of a static verification framework for distributed LLM training)",
        description: "the all-reduce after the row-parallel attention output projection of layer 0 is removed",
        parallelism: "tp",
        engines: "check, run, verify",
        spec_op: "aten.add.Tensor of the attention residual of layer 0",
        mutation: Mutation::LlamaOprojMissingAllreduce,
        needs_dp: false,
        needs_tp: true,
        needs_backward: false,
        changes_loss: true,
        models: LLAMA,
        needs_kv_replicas: false,
        needs_vocab_parallel: false,
        needs_sequence_parallel: false,
    },
    Bug {
        id: "llama-attn-scale-local",
        source: "TrainVerify (SOSP'25) section 8.3: wrong scaling of distributed state (a size taken per rank instead of global under TP)",
        description: "the softmax scale is 1/sqrt(head_dim / tp), from the rank's share of the projection width, not 1/sqrt(head_dim)",
        parallelism: "tp",
        engines: "run, verify",
        spec_op: "aten.mul.Scalar scaling the attention scores of every layer",
        mutation: Mutation::LlamaAttnScaleLocal,
        needs_dp: false,
        needs_tp: true,
        needs_backward: false,
        changes_loss: true,
        models: LLAMA,
        needs_kv_replicas: false,
        needs_vocab_parallel: false,
        needs_sequence_parallel: false,
    },
    Bug {
        id: "llama-qkv-grad-missing-allreduce",
        source: "Megatron-LM copy_to_tensor_model_parallel_region: the all-reduce of a column-parallel input gradient missing in the backward (TrainVerify (SOSP'25) section 8.3: incorrect or missing communication operators)",
        description: "the backward all-reduce over tp of the input gradient of layer 0's column-parallel q/k/v projections is removed",
        parallelism: "tp (full iteration)",
        engines: "check, run, verify",
        spec_op: "aten.add.Tensor summing the q/k/v input gradients of layer 0",
        mutation: Mutation::LlamaQkvGradMissingAllreduce,
        needs_dp: false,
        needs_tp: true,
        needs_backward: true,
        changes_loss: false,
        models: LLAMA,
        needs_kv_replicas: false,
        needs_vocab_parallel: false,
        needs_sequence_parallel: false,
    },
    Bug {
        id: "llama-kv-grad-unsynced",
        source: "GQA kv heads replicated under TP > kv heads, the replicas' gradients never all-reduced (TrainVerify (SOSP'25) section 8.3: incorrect or missing communication operators)",
        description: "the k/v projection gradients of kv heads replicated over tp ranks are not all-reduced across the replicas",
        parallelism: "tp > kv heads (full iteration)",
        engines: "run, verify",
        spec_op: "aten.sub.Tensor of the SGD step of the k/v projections",
        mutation: Mutation::LlamaKvGradUnsynced,
        needs_dp: false,
        needs_tp: true,
        needs_backward: true,
        changes_loss: false,
        models: LLAMA,
        needs_kv_replicas: true,
        needs_vocab_parallel: false,
        needs_sequence_parallel: false,
    },
    Bug {
        id: "llama-vocab-embedding-unmasked",
        source: "TTrace Table 1: wrong vocab-parallel embedding mask (Megatron-LM VocabParallelEmbedding)",
        description: "the vocab-parallel embedding does not zero the rows of tokens outside the rank's vocabulary range before the all-reduce",
        parallelism: "tp with --vocab-parallel",
        engines: "check, run, trace",
        spec_op: "aten.embedding.default of the token embedding",
        mutation: Mutation::LlamaVocabEmbeddingUnmasked,
        needs_dp: false,
        needs_tp: true,
        needs_backward: false,
        changes_loss: true,
        models: LLAMA,
        needs_kv_replicas: false,
        needs_vocab_parallel: true,
        needs_sequence_parallel: false,
    },
    Bug {
        id: "sp-layernorm-grad-not-reduced",
        source: "Entangle (ASPLOS'26) appendix A: layernorm weight gradient not registered for the SP all-reduce; TTrace Table 1: layernorm weights not synchronized under SP (Megatron-LM)",
        description: "under sequence parallelism the LayerNorm weight and bias gradients, computed on sequence chunks, are not all-reduced over tp",
        parallelism: "tp with --sequence-parallel (full iteration)",
        engines: "check, run, verify, trace",
        spec_op: "aten.sub.Tensor of the SGD step of the LayerNorm weights and biases",
        mutation: Mutation::SpLayernormGradNotReduced,
        needs_dp: false,
        needs_tp: true,
        needs_backward: true,
        changes_loss: false,
        models: GPT2,
        needs_kv_replicas: false,
        needs_vocab_parallel: false,
        needs_sequence_parallel: true,
    },
    Bug {
        id: "sp-scatter-wrong-chunk",
        source: "TrainVerify (SOSP'25) section 8.3: misaligned slice; Entangle (ASPLOS'26) appendix A: padding/slicing mismatch before an all-gather",
        description: "under sequence parallelism each rank keeps the next rank's sequence chunk of the embedding output instead of its own",
        parallelism: "tp with --sequence-parallel",
        engines: "run",
        spec_op: "aten.add.Tensor adding the position embedding (the residual stream entering layer 0)",
        mutation: Mutation::SpScatterWrongChunk,
        needs_dp: false,
        needs_tp: true,
        needs_backward: false,
        changes_loss: true,
        models: GPT2,
        needs_kv_replicas: false,
        needs_vocab_parallel: false,
        needs_sequence_parallel: true,
    },
    Bug {
        id: "grad-accum-loss-not-scaled",
        source: "Entangle (ASPLOS'26) appendix A, bug 6: gradient-accumulation loss not scaled (https://github.com/huggingface/transformers/issues/14638, https://github.com/huggingface/trl/issues/2175)",
        description: "with gradient accumulation the microbatch losses are not scaled by 1/M: the reported loss and every gradient are M times too large",
        parallelism: "any, with --grad-accum >= 2 (full iteration)",
        engines: "run, verify",
        spec_op: "the loss (aten.mean.default for mlp, aten.nll_loss_forward.default for llama and gpt2)",
        mutation: Mutation::GradAccumLossNotScaled,
        needs_dp: false,
        needs_tp: false,
        needs_backward: true,
        changes_loss: true,
        models: ALL,
        needs_kv_replicas: false,
        needs_vocab_parallel: false,
        needs_sequence_parallel: false,
    },
    Bug {
        id: "zero-param-update-skipped",
        source: "TTrace Table 1, bug 9: ZeRO parameter update skipped (https://github.com/NVIDIA/Megatron-LM/issues/663, fix 75120db)",
        description: "under ZeRO the last dp rank skips the update of its parameter shards: it all-gathers (ZeRO-3: keeps) the stale shards",
        parallelism: "dp with --zero 1|2|3 (full iteration)",
        engines: "run, verify, trace",
        spec_op: "the optimizer step of every ZeRO-split parameter (aten.sub.Tensor for SGD, aten.addcdiv.default for Adam)",
        mutation: Mutation::ZeroParamUpdateSkipped,
        needs_dp: true,
        needs_tp: false,
        needs_backward: true,
        changes_loss: false,
        models: ALL,
        needs_kv_replicas: false,
        needs_vocab_parallel: false,
        needs_sequence_parallel: false,
    },
    Bug {
        id: "grad-norm-replicated-overcounted",
        source: "TrainVerify (SOSP'25) section 8.3, category 4: wrong scaling of distributed state, gradient norm (Megatron-LM counts a tp-replicated parameter once: param_is_not_tensor_parallel_duplicate)",
        description: "the squared norms of tp-replicated parameters are summed on every tp rank before the all-reduce, so the clipping norm counts them tp times",
        parallelism: "tp with --clip-grad (full iteration)",
        engines: "check, run, verify",
        spec_op: "aten.add.Tensor of the running sum of squared gradient norms (the norm every rank adds for a replicated parameter), then the clip coefficient and every clipped gradient",
        mutation: Mutation::GradNormReplicatedOvercounted,
        needs_dp: false,
        needs_tp: true,
        needs_backward: true,
        changes_loss: false,
        models: ALL,
        needs_kv_replicas: false,
        needs_vocab_parallel: false,
        needs_sequence_parallel: false,
    },
    Bug {
        id: "loss-scale-not-unscaled",
        source: "TrainVerify (SOSP'25) section 8.3, category 4: wrong scaling of distributed state, loss scaling",
        description: "with a static loss scale the gradients are not divided by the scale before clipping and the optimizer step",
        parallelism: "any, with --loss-scale (full iteration)",
        engines: "run, verify",
        spec_op: "aten.mul.Scalar unscaling each gradient by 1/S (then the optimizer step)",
        mutation: Mutation::LossScaleNotUnscaled,
        needs_dp: false,
        needs_tp: false,
        needs_backward: true,
        changes_loss: false,
        models: ALL,
        needs_kv_replicas: false,
        needs_vocab_parallel: false,
        needs_sequence_parallel: false,
    },
    Bug {
        id: "moe-aux-loss-not-divided-by-tp",
        source: "Entangle (ASPLOS'26) bug 2, seen at ByteDance: incorrect scaling of the MoE auxiliary loss with TP",
        description: "every tp rank adds the whole auxiliary load-balancing loss instead of 1/tp of it, so the loss and the router gradients count it tp times",
        parallelism: "tp",
        engines: "check, run, verify",
        spec_op: "aten.add.Tensor adding the auxiliary loss to the cross-entropy",
        mutation: Mutation::MoeAuxLossNotDividedByTp,
        needs_tp: true,
        changes_loss: true,
        ..DEEPSEEK_BUG
    },
    Bug {
        id: "moe-router-grad-unsynced",
        source: "TTrace Table 1 #6 and Entangle bug 8: router weights not synchronized under TP+SP (Megatron-LM issue 599, pull 619)",
        description: "the router weight gradients, partial over tp (the gates weight the experts' tp-partial outputs), are not all-reduced over tp",
        parallelism: "tp (full iteration)",
        engines: "run, verify, check, trace",
        spec_op: "aten.sub.Tensor of the SGD step of the router weights",
        mutation: Mutation::MoeRouterGradUnsynced,
        needs_tp: true,
        needs_backward: true,
        ..DEEPSEEK_BUG
    },
    Bug {
        id: "ep-expert-grad-not-averaged",
        source: "TrainVerify (SOSP'25) section 8.3, wrong scaling of distributed state under expert parallelism (Megatron-LM commit 3373641, fix scaling down expert grads)",
        description: "the routed experts' gradients are divided by the expert-data-parallel size dp instead of dp x ep, though each expert saw the tokens of its whole ep group",
        parallelism: "ep (full iteration)",
        engines: "run, verify",
        spec_op: "the routed experts' weight gradient (aten.bmm.default), which no rank averages over dp x ep, then the SGD step of the expert weights",
        mutation: Mutation::EpExpertGradNotAveraged,
        needs_backward: true,
        ..DEEPSEEK_BUG
    },
    Bug {
        id: "pp-grad-sync-before-last-microbatch",
        source: "TrainVerify (SOSP'25) section 8.3, category 5, incorrect pipeline scheduling: gradient synchronization before the final backward iteration of a batch (Megatron-LM commits 1f387c2, 32bbb76)",
        description: "each stage all-reduces and averages its gradients over dp before the last microbatch's backward, whose gradients are then added unreduced",
        parallelism: "dp x pp with --microbatches >= 2 (full iteration)",
        engines: "run, verify",
        spec_op: "the first updated parameter's accumulated gradient (mlp: aten.mm.default; llama: aten.embedding_dense_backward.default; gpt2: aten.add.Tensor summing the tied embedding's two gradients), then every SGD step",
        mutation: Mutation::PpGradSyncBeforeLastMicrobatch,
        needs_dp: true,
        needs_backward: true,
        models: PIPELINED_DP,
        ..PIPELINE_BUG
    },
    Bug {
        id: "pp-shuffled-microbatches",
        source: "TrainVerify (SOSP'25) section 8.3, category 5, incorrect pipeline scheduling: microbatches mistakenly shuffled (Megatron-LM commit 6bd74b0)",
        description: "the last stage pairs each microbatch's activations with the labels of the next microbatch",
        parallelism: "pp with --microbatches >= 2",
        engines: "run, verify",
        spec_op: "the loss (aten.nll_loss_forward.default for llama, gpt2 and deepseek; for mlp the aten.sub.Tensor of the predictions and the targets inside the MSE)",
        mutation: Mutation::PpShuffledMicrobatches,
        changes_loss: true,
        ..PIPELINE_BUG
    },
    Bug {
        id: "pp-wrong-stage-division",
        source: "TTrace Table 1, bug 10: PP wrong stage division, a wrong model gets trained (Megatron-LM issue 468, fix 8e98a72)",
        description: "the last layer of stage 0 is also assigned to stage 1, so the forward runs it twice",
        parallelism: "pp",
        spec_op: "the first operator of the layer after the duplicated one (its input is the duplicated layer's output)",
        mutation: Mutation::PpWrongStageDivision,
        changes_loss: true,
        engines: "run, trace",
        ..PIPELINE_BUG
    },
    Bug {
        id: "pp-mismatched-send-recv",
        source: "static verification framework for distributed LLM training: mismatched send/recv in a pipeline schedule (deadlock under specific schedules)",
        description: "the first stage's schedule skips the send of its last forward activation, so the next stage's recv waits for a partner that never sends",
        parallelism: "pp",
        engines: "check, run",
        spec_op: "none: the implementation deadlocks (the interpreter names the waiting recv)",
        mutation: Mutation::PpMismatchedSendRecv,
        changes_loss: true,
        ..PIPELINE_BUG
    },
    Bug {
        id: "norm-sharded-hidden",
        source: "static verification framework for distributed LLM training: LayerNorm on a sharded hidden dim; TrainVerify (SOSP'25) section 8.3, category 3: splitting a non-partitionable dimension of a norm operator without aggregation",
        description: "the RMSNorm before layer 0's MoE block takes its mean of squares over the rank's tp shard of the hidden dim (h / tp features) instead of all h",
        parallelism: "tp",
        engines: "check, run, verify",
        spec_op: "aten.mean.dim of the mlp_norm_0 RMSNorm (the mean of squares over the hidden dim)",
        mutation: Mutation::NormShardedHidden,
        needs_tp: true,
        changes_loss: true,
        ..DEEPSEEK_BUG
    },
    Bug {
        id: "sp-pad-slice-mismatch",
        source: "Entangle (ASPLOS'26) appendix A, bug 3, seen at ByteDance: mismatched padding and slicing around an all-gather under SP",
        description: "under SP each rank pads its sequence chunk by one row before layer 0's attention all-gather, and the gathered tensor is sliced to its first seq rows instead of dropping each chunk's padding (real rows dropped, padding kept)",
        parallelism: "tp with --sequence-parallel",
        spec_op: "aten.addmm.default of layer 0's q/k/v projections (their input rows)",
        mutation: Mutation::SpPadSliceMismatch,
        needs_tp: true,
        needs_sequence_parallel: true,
        changes_loss: true,
        models: GPT2,
        ..DEEPSEEK_BUG
    },
    Bug {
        id: "dangling-backward-tensor",
        source: "TrainVerify (SOSP'25) section 8.3, violation class C2 found in nnScaler: dangling tensors in the backward pass (consumers without producers)",
        description: "block 0's fc1 weight and bias gradients are computed but never consumed; the finalization reads zero-filled gradient buffers that no backward operator produces, so fc1 of block 0 is never updated",
        parallelism: "any (full iteration)",
        engines: "run, verify",
        spec_op: "block 0's fc1 weight gradient: its aten.mm.default under dp (never reduced), else its aten.mul.Scalar by the learning rate (never applied); then the SGD step of w1_0 and b1_0",
        mutation: Mutation::DanglingBackwardTensor,
        needs_backward: true,
        models: MLP,
        ..DEEPSEEK_BUG
    },
    Bug {
        id: "zero-tied-embedding-untied",
        source: "TTrace Table 1, bug 5: ZeRO, embedding and LM head untied (Megatron-LM issue 656, fix db2040f)",
        description: "under ZeRO the tied token embedding and LM head are updated as two weights: the embedding's update takes its lookup gradient only, the LM head's gradient never reaches it",
        parallelism: "dp with --zero 1|2|3 (full iteration)",
        engines: "run, verify, trace",
        spec_op: "aten.add.Tensor adding the LM head's gradient to the token embedding's (then its optimizer step)",
        mutation: Mutation::ZeroTiedEmbeddingUntied,
        needs_dp: true,
        needs_backward: true,
        models: GPT2,
        ..DEEPSEEK_BUG
    },
    Bug {
        id: "async-allreduce-no-wait",
        source: "static verification framework for distributed LLM training: async all-reduce without wait (temporal checks: missing wait, orphaned handle)",
        description: "block 0's row-parallel all-reduce is read without its wait_tensor (a race on real hardware; the dataflow, and so every value, is that of the correct plan)",
        parallelism: "tp",
        engines: "check (missing wait); invisible to run and verify",
        spec_op: "none: the values are right; only the missing wait_tensor after _c10d_functional.all_reduce of block 0 is wrong",
        mutation: Mutation::AsyncAllreduceNoWait,
        needs_tp: true,
        models: MLP,
        ..DEEPSEEK_BUG
    },
    Bug {
        id: "recompute-stale-input",
        source: "TTrace Table 1, bug 2: activation recomputation reads a wrong (stale) input (Megatron-LM issue 371, fix fc2c81d)",
        description: "with --recompute, block 1's recomputation in the backward reads block 0's checkpointed input instead of its own, so the backward of block 1 and below uses wrong activations",
        parallelism: "any, with --recompute and --layers >= 2 (full iteration)",
        spec_op: "aten.mm.default of block 1's fc2 weight gradient (it reads the recomputed relu)",
        mutation: Mutation::RecomputeStaleInput,
        needs_backward: true,
        models: MLP,
        engines: "run, trace",
        ..DEEPSEEK_BUG
    },
    Bug {
        id: "fp8-amax-wrong-group",
        source: "TTrace Table 1, bug 7: TP, wrong FP8 communication group (Megatron-LM issue 335, pull 442)",
        description: "with --fp8, the amax of each tp-split weight's per-tensor FP8 scaling is all-reduced (max) over dp instead of tp, so the tp ranks quantize their shards with different scales",
        parallelism: "dp x tp with --fp8",
        spec_op: "aten.div.Tensor dividing by the weight amax in the FP8 scaling (the amax itself relates, as a max over ranks, though no rank computes it), then the quantize-dequantize and fc1 of block 0",
        mutation: Mutation::Fp8AmaxWrongGroup,
        needs_dp: true,
        needs_tp: true,
        changes_loss: true,
        models: MLP,
        engines: "check, run, verify, trace",
        ..DEEPSEEK_BUG
    },
    Bug {
        id: "fp8-recompute-wrong-cast",
        source: "TTrace Table 1, bug 8: activation recomputation reads a wrong tensor from an FP8 cast (Megatron-LM issue 539, pull 646)",
        description: "with --fp8 --recompute, block 0's recomputation reads fc1's master (higher precision) weight instead of its FP8 cast, so the recomputed activations differ from the forward's",
        parallelism: "any, with --fp8 --recompute (full iteration)",
        spec_op: "aten.mm.default of block 0's fc2 weight gradient (it reads the recomputed relu)",
        mutation: Mutation::Fp8RecomputeWrongCast,
        needs_backward: true,
        models: MLP,
        engines: "run, trace",
        ..DEEPSEEK_BUG
    },
    Bug {
        id: "tp-overlap-wrong-chunk-order",
        source: "TTrace Table 1, bug 11: TP, wrong gradients with communication overlap (Megatron-LM issue 1616, pull 1554)",
        description: "with --tp-comm-overlap, the row-parallel weight gradients, computed chunk by chunk as the all-gathered output gradient arrives, pair each gradient chunk (ring-arrival order) with the activation chunk of the wrong rank",
        parallelism: "tp with --sequence-parallel --tp-comm-overlap (full iteration)",
        spec_op: "aten.mm.default of every layer's o and fc2 weight gradients",
        mutation: Mutation::TpOverlapWrongChunkOrder,
        needs_tp: true,
        needs_backward: true,
        needs_sequence_parallel: true,
        models: GPT2,
        engines: "check, run, trace",
        ..DEEPSEEK_BUG
    },
    Bug {
        id: "moe-experts-sharded-under-sp",
        source: "Entangle (ASPLOS'26) appendix A, bug 4, seen at ByteDance: experts sharded instead of replicated when SP parallelizes a MoE model",
        description: "under SP the routed experts stay split over tp (gate/up by rows, down by columns) while each tp rank runs them on its own sequence chunk with no reduction: X_i A_i B_i, never the cross terms X_i A_j",
        parallelism: "tp with --sequence-parallel",
        spec_op: "aten.bmm.default of layer 0's routed experts (gate and up projections)",
        mutation: Mutation::MoeExpertsShardedUnderSp,
        needs_tp: true,
        needs_sequence_parallel: true,
        changes_loss: true,
        ..DEEPSEEK_BUG
    },
    Bug {
        id: "cp-rope-no-offset",
        source: "TrainVerify (SOSP'25) section 8.3: RoPE applied to a sequence shard without the offset (Entangle (ASPLOS'26): the RoPE offset missing in a custom backward under SP is the same class)",
        description: "under context parallelism RoPE rotates each rank's chunks by their local positions 0..seq/cp, not their global positions: keys from other cp ranks meet queries at wrong relative distances (gpt2, learned positions: each rank looks up, and updates, the position-embedding rows 0..seq/cp instead of its chunks' rows)",
        parallelism: "cp",
        spec_op: "aten.mul.Tensor of RoPE (x * cos) on the queries and keys of every layer (gpt2: aten.add.Tensor adding the position embedding)",
        mutation: Mutation::CpRopeNoOffset,
        changes_loss: true,
        models: CP_MODELS,
        ..CP_BUG
    },
    Bug {
        id: "cp-loss-overscaled",
        source: "TTrace Table 1: wrong CP loss scaling (Megatron-LM's per-token loss multiplied by the cp size once more); TrainVerify (SOSP'25) section 8.3: CP replica counting",
        description: "each rank's loss is multiplied by the cp size before the reduction over dp x cp, which averages over cp already: the loss and every gradient are cp times too large",
        parallelism: "cp",
        spec_op: "the loss (aten.nll_loss_forward.default)",
        mutation: Mutation::CpLossOverscaled,
        changes_loss: true,
        models: CP_DENSE,
        engines: "run, trace",
        ..CP_BUG
    },
    Bug {
        id: "cp-causal-mask-local",
        source: "TrainVerify (SOSP'25) section 8.3: misaligned mask under a sequence split (wrong partitioning of a non-partitionable dimension)",
        description: "every ring-attention step masks its block causally by the block-local indices of queries and keys (is_causal on every block) instead of their global positions, hiding keys that precede the queries",
        parallelism: "cp",
        spec_op: "aten.add.Tensor adding the causal mask to the attention scores of every layer",
        mutation: Mutation::CpCausalMaskLocal,
        changes_loss: true,
        models: CP_MODELS,
        ..CP_BUG
    },
    Bug {
        id: "tp-cp-layernorm-grad-scaled-by-tp",
        source: "TTrace Table 1: TP+CP layernorm gradients scaled by the TP size (Megatron-LM)",
        description: "under tp x cp the RMSNorm weight gradients (gpt2: the LayerNorm weights and biases), already complete on every tp rank, are all-reduced over tp once more (as if partial over a sequence split), so they come out tp times too large",
        parallelism: "tp x cp (full iteration)",
        spec_op: "aten.sub.Tensor of the SGD step of the RMSNorm weights (gpt2: LayerNorm)",
        mutation: Mutation::TpCpNormGradScaledByTp,
        needs_tp: true,
        needs_backward: true,
        models: CP_DENSE,
        engines: "run, trace",
        ..CP_BUG
    },
    Bug {
        id: "cp-attn-grad-noncontiguous",
        source: "TTrace Table 1: wrong CP attention gradients (a non-contiguous input handed to a kernel, Megatron-LM / Transformer Engine)",
        description: "a kernel of the ring-attention backward reads a non-contiguous tensor with the strides of a contiguous one; a graph has value semantics (operators read values, not memory), so the bug is numerically invisible in any emitted graph and the zoo does not plant it; numerical differential testing of a real run (TTrace's engine, real kernels) catches it",
        parallelism: "cp (full iteration)",
        engines: "trace (real runs); no graph engine",
        spec_op: "none: invisible in a graph",
        mutation: Mutation::CpAttnGradNonContiguous,
        needs_backward: true,
        ..CP_BUG
    },
];

/// The catalog entry named `id`.
pub fn find_bug(id: &str) -> Option<&'static Bug> {
    BUGS.iter().find(|b| b.id == id)
}

impl Site<'_> {
    /// A plan of `model` on `dp` x `tp` ranks with no kv replicas, no vocabulary or sequence
    /// parallelism.
    pub fn new(model: &str, dp: usize, tp: usize, forward_only: bool) -> Site<'_> {
        Site {
            model,
            dp,
            tp,
            forward_only,
            kv_replicated: false,
            vocab_parallel: false,
            sequence_parallel: false,
        }
    }
}

impl Bug {
    /// Needs a `cp` mesh dim larger than 1 (context parallelism).
    pub fn needs_cp(&self) -> bool {
        matches!(
            self.mutation,
            Mutation::CpRopeNoOffset
                | Mutation::CpLossOverscaled
                | Mutation::CpCausalMaskLocal
                | Mutation::TpCpNormGradScaledByTp
                | Mutation::CpAttnGradNonContiguous
        )
    }

    /// Whether the entry is in the catalog for reference only: no graph can express it, so the
    /// zoo never plants it (the description says which engine could catch it).
    pub fn listed_only(&self) -> bool {
        self.mutation == Mutation::CpAttnGradNonContiguous
    }

    /// Why the bug cannot be planted on a mesh whose `cp` dim has size `cp` (1 when absent),
    /// if it cannot.
    pub fn check_cp(&self, cp: usize) -> Result<(), String> {
        if self.needs_cp() && cp < 2 {
            return Err(format!(
                "bug `{}` needs a cp mesh dim of size >= 2",
                self.id
            ));
        }
        Ok(())
    }

    /// Needs an `ep` mesh dim larger than 1. (A method rather than a field, so that catalog
    /// entries written before expert parallelism keep compiling.)
    pub fn needs_ep(&self) -> bool {
        self.mutation == Mutation::EpExpertGradNotAveraged
    }

    /// Why the bug cannot be planted on a mesh whose `ep` dim has size `ep` (1 when absent),
    /// if it cannot.
    pub fn check_ep(&self, ep: usize) -> Result<(), String> {
        if self.needs_ep() && ep < 2 {
            return Err(format!(
                "bug `{}` needs an ep mesh dim of size >= 2",
                self.id
            ));
        }
        Ok(())
    }

    /// [`Bug::check_applies`] on a mesh whose `ep` dim has size `ep` (1 when absent).
    pub fn check_applies_with_ep(&self, site: &Site, ep: usize) -> Result<(), String> {
        self.check_applies(site)?;
        self.check_ep(ep)
    }

    /// Why the bug cannot be planted in the plan described by `site` with the default training
    /// options (SGD, no clipping, loss scale, accumulation or ZeRO) and no pipeline stages, if
    /// it cannot.
    pub fn check_applies(&self, site: &Site) -> Result<(), String> {
        self.check_applies_in(site, &TrainOptions::default())?;
        self.check_pipeline(1, 1)?;
        self.check_cp(1)
    }

    /// Whether the bug needs pipeline stages (a `pp` mesh dim).
    pub fn needs_pipeline(&self) -> bool {
        self.mutation.pipeline_needs() != PipelineNeeds::default()
    }

    /// Why the bug cannot be planted in a plan of `pp` pipeline stages (1 without a pp mesh
    /// dim) with `microbatches` microbatches, if it cannot.
    pub fn check_pipeline(&self, pp: usize, microbatches: usize) -> Result<(), String> {
        let needs = self.mutation.pipeline_needs();
        let mut missing = Vec::new();
        if needs.stages && pp < 2 {
            missing.push("a pp mesh dim of size >= 2");
        }
        if needs.microbatches && microbatches < 2 {
            missing.push("at least two microbatches (--microbatches 2 or more)");
        }
        if missing.is_empty() {
            Ok(())
        } else {
            Err(format!("bug `{}` needs {}", self.id, missing.join(" and ")))
        }
    }

    /// Whether the bug needs a training option (`--grad-accum`, `--zero`, `--clip-grad`,
    /// `--loss-scale`) or a model option (`--recompute`, `--fp8`, `--tp-comm-overlap`): the
    /// plans without flags beyond the mesh cannot have it.
    pub fn needs_training(&self) -> bool {
        self.mutation.training_needs() != TrainingNeeds::default()
            || !self.mutation.option_needs().is_empty()
    }

    /// Whether `shardproof run` can catch the bug: false for the bugs whose values are those
    /// of the correct plan (see [`Mutation::numerically_invisible`]) and for the entries no
    /// graph can express ([`Bug::listed_only`]).
    pub fn run_catches(&self) -> bool {
        !self.mutation.numerically_invisible() && !self.listed_only()
    }

    /// Why the bug cannot be planted in the plan described by `site` trained with `train`, if
    /// it cannot.
    pub fn check_applies_in(&self, site: &Site, train: &TrainOptions) -> Result<(), String> {
        self.check_applies_with_options(site, train, &[])
    }

    /// [`Bug::check_applies_in`] for a plan emitted with the model options `options` (flags
    /// such as `--recompute`, `--fp8`, `--tp-comm-overlap`).
    pub fn check_applies_with_options(
        &self,
        site: &Site,
        train: &TrainOptions,
        options: &[&str],
    ) -> Result<(), String> {
        if self.listed_only() {
            return Err(format!(
                "bug `{}` is listed only and cannot be planted: {}",
                self.id, self.description
            ));
        }
        if !self.models.contains(&site.model) {
            return Err(format!(
                "bug `{}` is defined for the model(s) {}, not `{}`",
                self.id,
                self.models.join(", "),
                site.model
            ));
        }
        let mut missing = Vec::new();
        if self.needs_dp && site.dp < 2 {
            missing.push("a dp mesh dim of size >= 2");
        }
        if self.needs_tp && site.tp < 2 {
            missing.push("a tp mesh dim of size >= 2");
        }
        if self.needs_kv_replicas && !site.kv_replicated {
            missing.push("tp larger than the kv heads (e.g. --mesh tp=4 with 2 kv heads)");
        }
        if self.needs_vocab_parallel && !site.vocab_parallel {
            missing.push("the vocab-parallel embedding and LM head (--vocab-parallel)");
        }
        if self.needs_sequence_parallel && !site.sequence_parallel {
            missing.push("sequence parallelism (--sequence-parallel)");
        }
        if self.needs_backward && site.forward_only {
            missing.push("the full iteration (drop --forward-only)");
        }
        let needs = self.mutation.training_needs();
        if needs.grad_accum && train.grad_accum < 2 {
            missing.push("gradient accumulation (--grad-accum 2 or more)");
        }
        if needs.zero && train.zero.is_none() {
            missing.push("ZeRO (--zero 1, 2 or 3)");
        }
        if needs.clip_grad && train.clip_grad.is_none() {
            missing.push("gradient clipping (--clip-grad MAXNORM)");
        }
        if needs.loss_scale && train.loss_scale.is_none() {
            missing.push("loss scaling (--loss-scale S)");
        }
        let option_texts: Vec<String> = self
            .mutation
            .option_needs()
            .iter()
            .filter(|(flag, _)| !options.contains(flag))
            .map(|(flag, what)| format!("{what} ({flag})"))
            .collect();
        missing.extend(option_texts.iter().map(String::as_str));
        if self.mutation == Mutation::MoeAuxLossNotDividedByTp && site.sequence_parallel {
            // Under SP every tp rank computes the whole auxiliary loss: there is no share.
            return Err(format!(
                "bug `{}` is not defined under --sequence-parallel",
                self.id
            ));
        }
        if self.mutation == Mutation::WrongGroup && site.sequence_parallel {
            // Under SP the row-parallel reduction is a reduce-scatter whose result shape
            // depends on the group size: over dp it would be a shape error, not a silent bug.
            return Err(format!(
                "bug `{}` is not defined under --sequence-parallel",
                self.id
            ));
        }
        if missing.is_empty() {
            Ok(())
        } else {
            Err(format!("bug `{}` needs {}", self.id, missing.join(" and ")))
        }
    }
}

/// The bug classes the project sets out to catch, by the paper or tool that reports each, and
/// the catalog entries that plant each; an empty list marks a class the zoo does not plant, with the reason
/// in `docs/design.md`.
pub const MISSION_CLASSES: &[(&str, &[&str])] = &[
    (
        "TrainVerify: incorrect or missing communication operators",
        &[
            "tp-missing-allreduce",
            "llama-oproj-missing-allreduce",
            "llama-qkv-grad-missing-allreduce",
            "llama-kv-grad-unsynced",
        ],
    ),
    (
        "TrainVerify: wrong device/group assignment",
        &["wrong-group", "fp8-amax-wrong-group"],
    ),
    (
        "TrainVerify: wrong partitioning of a non-partitionable dimension (norm over a sharded dim)",
        &["norm-sharded-hidden"],
    ),
    (
        "TrainVerify: misaligned mask/slice",
        &[
            "sp-scatter-wrong-chunk",
            "sp-pad-slice-mismatch",
            "llama-vocab-embedding-unmasked",
            "cp-causal-mask-local",
        ],
    ),
    (
        "TrainVerify: wrong scaling of distributed state (loss scaling, grad norm, EP replica counting)",
        &[
            "loss-scale-not-unscaled",
            "grad-norm-replicated-overcounted",
            "ep-expert-grad-not-averaged",
            "tp-bias-before-allreduce",
            "llama-attn-scale-local",
        ],
    ),
    (
        "TrainVerify: wrong scaling of distributed state (CP replica counting, the Megatron CP per-token-loss over-scaling)",
        &["cp-loss-overscaled"],
    ),
    (
        "TrainVerify: RoPE applied to a sequence shard without the offset",
        &["cp-rope-no-offset"],
    ),
    (
        "TrainVerify: wrong pipeline scheduling (grad sync before the last microbatch, shuffled microbatches)",
        &["pp-grad-sync-before-last-microbatch", "pp-shuffled-microbatches"],
    ),
    (
        "TrainVerify: dangling backward tensors",
        &["dangling-backward-tensor"],
    ),
    (
        "Entangle: MoE auxiliary loss not divided by the TP size",
        &["moe-aux-loss-not-divided-by-tp"],
    ),
    (
        "Entangle: padding/slicing mismatch before all-gather",
        &["sp-pad-slice-mismatch"],
    ),
    (
        "Entangle: experts sharded instead of replicated under SP",
        &["moe-experts-sharded-under-sp"],
    ),
    (
        "Entangle: layernorm weight gradient not registered for the SP all-reduce",
        &["sp-layernorm-grad-not-reduced"],
    ),
    (
        "Entangle: gradient-accumulation loss not scaled",
        &["grad-accum-loss-not-scaled"],
    ),
    (
        "Entangle: missing all-reduce in a row-parallel linear under a wrong config",
        &["tp-missing-allreduce", "llama-oproj-missing-allreduce"],
    ),
    (
        "Entangle: missing router-weight all-reduce under TP+SP",
        &["moe-router-grad-unsynced"],
    ),
    (
        "Entangle: missing layernorm-weight all-reduce under SP",
        &["sp-layernorm-grad-not-reduced"],
    ),
    (
        "TTrace: wrong vocab-parallel embedding mask",
        &["llama-vocab-embedding-unmasked"],
    ),
    (
        "TTrace: stale input under activation recomputation",
        &["recompute-stale-input"],
    ),
    (
        "TTrace: wrong DP loss scaling",
        &["dp-loss-not-averaged", "dp-grad-not-averaged"],
    ),
    (
        "TTrace: untied embedding/LM-head under ZeRO",
        &["zero-tied-embedding-untied"],
    ),
    (
        "TTrace: router weights not synchronized under SP",
        &["moe-router-grad-unsynced"],
    ),
    (
        "TTrace: wrong FP8 communication group",
        &["fp8-amax-wrong-group"],
    ),
    (
        "TTrace: wrong tensor from an FP8 cast under recomputation",
        &["fp8-recompute-wrong-cast"],
    ),
    (
        "TTrace: ZeRO parameter update skipped",
        &["zero-param-update-skipped"],
    ),
    (
        "TTrace: wrong PP stage division",
        &["pp-wrong-stage-division"],
    ),
    (
        "TTrace: wrong CP loss scaling",
        &["cp-loss-overscaled"],
    ),
    (
        "TTrace: wrong CP attention gradients (non-contiguous input to a kernel)",
        &["cp-attn-grad-noncontiguous"],
    ),
    (
        "TTrace: TP+CP layernorm gradients scaled by the TP size",
        &["tp-cp-layernorm-grad-scaled-by-tp"],
    ),
    (
        "TTrace: wrong gradients with TP communication overlap",
        &["tp-overlap-wrong-chunk-order"],
    ),
    (
        "TTrace: layernorm weights not synchronized under SP",
        &["sp-layernorm-grad-not-reduced"],
    ),
    (
        "static verifier: missing all-reduce after a row-parallel matmul",
        &["llama-oproj-missing-allreduce", "tp-missing-allreduce"],
    ),
    (
        "static verifier: layernorm on a sharded hidden dim",
        &["norm-sharded-hidden"],
    ),
    (
        "static verifier: async all-reduce without wait",
        &["async-allreduce-no-wait"],
    ),
    (
        "static verifier: mismatched send/recv in a pipeline schedule",
        &["pp-mismatched-send-recv"],
    ),
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mission_classes_name_catalog_entries() {
        for (class, ids) in MISSION_CLASSES {
            for id in *ids {
                assert!(find_bug(id).is_some(), "{class}: no bug `{id}`");
            }
        }
        // Every catalog entry is some class's.
        let mapped = |id: &str| MISSION_CLASSES.iter().any(|(_, ids)| ids.contains(&id));
        for b in BUGS {
            assert!(mapped(b.id), "{} is in no MISSION class", b.id);
        }
        let unplanted: Vec<&str> = MISSION_CLASSES
            .iter()
            .filter(|(_, ids)| ids.is_empty())
            .map(|(c, _)| *c)
            .collect();
        assert!(unplanted.is_empty(), "{unplanted:?}");
    }

    #[test]
    fn option_bugs_need_their_flags() {
        let stale = find_bug("recompute-stale-input").unwrap();
        assert!(stale.needs_training());
        let site = Site::new("mlp", 2, 1, false);
        let e = stale.check_applies(&site).unwrap_err();
        assert!(e.contains("--recompute"), "{e}");
        let train = TrainOptions::default();
        assert!(stale
            .check_applies_with_options(&site, &train, &["--recompute"])
            .is_ok());
        let cast = find_bug("fp8-recompute-wrong-cast").unwrap();
        let e = cast
            .check_applies_with_options(&site, &train, &["--recompute"])
            .unwrap_err();
        assert!(e.contains("--fp8") && !e.contains("--recompute"), "{e}");
        let wait = find_bug("async-allreduce-no-wait").unwrap();
        assert!(!wait.run_catches() && !wait.engines.contains("run,"));
        let listed = find_bug("cp-attn-grad-noncontiguous").unwrap();
        assert!(!listed.run_catches() && listed.listed_only());
        assert!(BUGS.iter().filter(|b| !b.run_catches()).count() == 2);
    }

    #[test]
    fn ids_are_unique_and_found() {
        for (i, b) in BUGS.iter().enumerate() {
            assert!(BUGS[..i].iter().all(|o| o.id != b.id), "{}", b.id);
            assert_eq!(find_bug(b.id).map(|f| f.mutation), Some(b.mutation));
        }
        assert!(find_bug("nope").is_none());
    }

    fn site(model: &str, dp: usize, tp: usize, forward_only: bool) -> Site<'_> {
        Site::new(model, dp, tp, forward_only)
    }

    #[test]
    fn applicability() {
        let sp = Site {
            sequence_parallel: true,
            ..site("gpt2", 1, 2, false)
        };
        // (bug, site, `None` where it applies, else a word of why it does not; "" for any).
        let cases = [
            ("wrong-group", site("mlp", 2, 2, true), None),
            ("wrong-group", site("llama", 2, 2, true), None),
            ("wrong-group", site("mlp", 1, 2, true), Some("dp mesh dim")),
            (
                "dp-grad-not-averaged",
                site("mlp", 2, 1, true),
                Some("--forward-only"),
            ),
            (
                "tp-bias-before-allreduce",
                site("llama", 1, 2, true),
                Some("not `llama`"),
            ),
            (
                "llama-kv-grad-unsynced",
                site("llama", 1, 2, false),
                Some("kv heads"),
            ),
            (
                "llama-kv-grad-unsynced",
                Site {
                    kv_replicated: true,
                    ..site("llama", 1, 4, false)
                },
                None,
            ),
            (
                "llama-vocab-embedding-unmasked",
                site("llama", 1, 2, true),
                Some("--vocab-parallel"),
            ),
            (
                "llama-vocab-embedding-unmasked",
                Site {
                    vocab_parallel: true,
                    ..site("llama", 1, 2, true)
                },
                None,
            ),
            (
                "sp-layernorm-grad-not-reduced",
                site("gpt2", 1, 2, false),
                Some("--sequence-parallel"),
            ),
            ("sp-layernorm-grad-not-reduced", sp, None),
            (
                "sp-layernorm-grad-not-reduced",
                Site {
                    forward_only: true,
                    ..sp
                },
                Some(""),
            ),
            ("tp-bias-before-allreduce", sp, None),
            (
                "wrong-group",
                Site { dp: 2, ..sp },
                Some("not defined under --sequence-parallel"),
            ),
        ];
        for (id, site, refusal) in cases {
            let applies = find_bug(id).unwrap().check_applies(&site);
            match refusal {
                None => assert!(applies.is_ok(), "{id}: {applies:?}"),
                Some(word) => {
                    let e = applies.unwrap_err();
                    assert!(e.contains(word), "{id}: {e}");
                }
            }
        }
    }

    #[test]
    fn training_bugs_need_their_options() {
        let accum = find_bug("grad-accum-loss-not-scaled").unwrap();
        assert!(accum.needs_training());
        assert!(!find_bug("wrong-group").unwrap().needs_training());
        let e = accum.check_applies(&site("mlp", 2, 1, false)).unwrap_err();
        assert!(e.contains("--grad-accum"), "{e}");
        let two = TrainOptions {
            grad_accum: 2,
            ..TrainOptions::default()
        };
        assert!(accum
            .check_applies_in(&site("mlp", 2, 1, false), &two)
            .is_ok());
        let e = accum.check_applies_in(&site("mlp", 2, 1, true), &two);
        assert!(e.unwrap_err().contains("--forward-only"));
        let norm = find_bug("grad-norm-replicated-overcounted").unwrap();
        let clip = TrainOptions {
            clip_grad: Some(1.0),
            ..TrainOptions::default()
        };
        let e = norm.check_applies_in(&site("gpt2", 2, 1, false), &clip);
        assert!(e.unwrap_err().contains("tp mesh dim"));
        assert!(norm
            .check_applies_in(&site("gpt2", 1, 2, false), &clip)
            .is_ok());
    }

    #[test]
    fn pipeline_bugs_need_stages_and_microbatches() {
        let shuffled = find_bug("pp-shuffled-microbatches").unwrap();
        assert!(shuffled.needs_pipeline() && !shuffled.needs_training());
        let e = shuffled
            .check_applies(&site("mlp", 1, 1, true))
            .unwrap_err();
        assert!(e.contains("pp mesh dim"), "{e}");
        let e = shuffled.check_pipeline(2, 1).unwrap_err();
        assert!(e.contains("--microbatches 2"), "{e}");
        assert!(shuffled.check_pipeline(2, 2).is_ok());
        let stages = find_bug("pp-wrong-stage-division").unwrap();
        assert!(stages.check_pipeline(2, 1).is_ok());
        let sync = find_bug("pp-grad-sync-before-last-microbatch").unwrap();
        let e = sync.check_applies_in(&site("llama", 1, 1, false), &TrainOptions::default());
        assert!(e.unwrap_err().contains("dp mesh dim"));
        assert!(!find_bug("wrong-group").unwrap().needs_pipeline());
        assert!(find_bug("wrong-group")
            .unwrap()
            .check_pipeline(1, 1)
            .is_ok());
    }

    #[test]
    fn every_model_has_bugs_and_every_bug_a_model() {
        for (m, _) in crate::MODELS {
            assert!(BUGS.iter().any(|b| b.models.contains(m)), "{m}");
        }
        for b in BUGS {
            assert!(
                b.models
                    .iter()
                    .all(|m| crate::MODELS.iter().any(|(n, _)| n == m)),
                "{}",
                b.id
            );
        }
    }
}
