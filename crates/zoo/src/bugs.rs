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
    /// The training options the mutation needs (none for the mutations of the model itself).
    pub fn training_needs(self) -> TrainingNeeds {
        let none = TrainingNeeds::default();
        match self {
            Mutation::GradAccumLossNotScaled => TrainingNeeds {
                grad_accum: true,
                ..none
            },
            Mutation::ZeroParamUpdateSkipped => TrainingNeeds { zero: true, ..none },
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
const PIPELINED: &[&str] = &["mlp", "llama"];

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

/// Every bug this version of the zoo can plant.
pub const BUGS: &[Bug] = &[
    Bug {
        id: "tp-missing-allreduce",
        source: "MISSION.md: missing communication (Megatron-LM row-parallel linear)",
        description: "the reduction after the row-parallel fc2 of layer 0 (all-reduce; reduce-scatter under SP) is removed",
        parallelism: "tp",
        engines: "run",
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
        source: "MISSION.md: wrong scaling (bias added to every partial sum, Megatron-LM)",
        description:
            "the fc2 bias of layer 0 is added before the all-reduce (reduce-scatter under SP), so it counts tp times",
        parallelism: "tp",
        engines: "run",
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
        source: "MISSION.md: wrong scaling (loss averaging across data-parallel ranks)",
        description: "the loss is all-reduced over dp and divided by 1 instead of dp",
        parallelism: "dp",
        engines: "run",
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
        models: ALL,
        needs_kv_replicas: false,
        needs_vocab_parallel: false,
        needs_sequence_parallel: false,
    },
    Bug {
        id: "wrong-group",
        source: "MISSION.md: wrong process group in a collective",
        description: "the row-parallel all-reduce of layer 0 (mlp: fc2, llama and gpt2: attention output projection) runs over the dp group instead of tp",
        parallelism: "dp x tp",
        engines: "run",
        spec_op: "aten.add.Tensor after the row-parallel linear of layer 0 (bias or residual)",
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
        source: "MISSION.md: missing all-reduce after a row-parallel matmul (static verifier README; Megatron-LM RowParallelLinear)",
        description: "the all-reduce after the row-parallel attention output projection of layer 0 is removed",
        parallelism: "tp",
        engines: "run",
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
        source: "MISSION.md: wrong scaling of distributed state (a size taken per rank instead of global under TP)",
        description: "the softmax scale is 1/sqrt(head_dim / tp), from the rank's share of the projection width, not 1/sqrt(head_dim)",
        parallelism: "tp",
        engines: "run",
        spec_op: "aten.mul.Tensor scaling the attention scores of every layer",
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
        source: "MISSION.md: missing communication in the backward (Megatron-LM copy_to_tensor_model_parallel_region, the all-reduce of a column-parallel input gradient)",
        description: "the backward all-reduce over tp of the input gradient of layer 0's column-parallel q/k/v projections is removed",
        parallelism: "tp (full iteration)",
        engines: "run",
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
        source: "MISSION.md: missing communication (GQA kv heads replicated under TP > kv heads, gradients of the replicas never all-reduced)",
        description: "the k/v projection gradients of kv heads replicated over tp ranks are not all-reduced across the replicas",
        parallelism: "tp > kv heads (full iteration)",
        engines: "run",
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
        source: "MISSION.md: wrong vocab-parallel embedding mask (TTrace, Megatron-LM VocabParallelEmbedding)",
        description: "the vocab-parallel embedding does not zero the rows of tokens outside the rank's vocabulary range before the all-reduce",
        parallelism: "tp with --vocab-parallel",
        engines: "run",
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
        source: "MISSION.md: layernorm weight gradient not registered for the SP all-reduce (Entangle; TTrace: layernorm weights not synchronized under SP, Megatron-LM)",
        description: "under sequence parallelism the LayerNorm weight and bias gradients, computed on sequence chunks, are not all-reduced over tp",
        parallelism: "tp with --sequence-parallel (full iteration)",
        engines: "run",
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
        source: "MISSION.md: misaligned slice / padding-slicing mismatch before all-gather (TrainVerify, Entangle)",
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
        source: "MISSION.md: gradient-accumulation loss not scaled (Entangle appendix A, bug 6; upstream huggingface/transformers#14638, huggingface/trl#2175)",
        description: "with gradient accumulation the microbatch losses are not scaled by 1/M: the reported loss and every gradient are M times too large",
        parallelism: "any, with --grad-accum >= 2 (full iteration)",
        engines: "run",
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
        source: "MISSION.md: ZeRO parameter update skipped (TTrace Table 1, bug 9; upstream Megatron-LM issue #663, fix 75120db)",
        description: "under ZeRO the last dp rank skips the update of its parameter shards: it all-gathers (ZeRO-3: keeps) the stale shards",
        parallelism: "dp with --zero 1|2|3 (full iteration)",
        engines: "run",
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
        source: "MISSION.md: wrong scaling of distributed state, gradient norm (TrainVerify section 8.3, category 4; Megatron-LM counts a tp-replicated parameter once: param_is_not_tensor_parallel_duplicate)",
        description: "the squared norms of tp-replicated parameters are summed on every tp rank before the all-reduce, so the clipping norm counts them tp times",
        parallelism: "tp with --clip-grad (full iteration)",
        engines: "run",
        spec_op: "aten.clamp.default of the clip coefficient (then every clipped gradient)",
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
        source: "MISSION.md: wrong scaling of distributed state, loss scaling (TrainVerify section 8.3, category 4)",
        description: "with a static loss scale the gradients are not divided by the scale before clipping and the optimizer step",
        parallelism: "any, with --loss-scale (full iteration)",
        engines: "run",
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
        spec_op: "aten.sub.Tensor of the SGD step of the expert weights",
        mutation: Mutation::EpExpertGradNotAveraged,
        needs_backward: true,
        ..DEEPSEEK_BUG
    },
    Bug {
        id: "pp-grad-sync-before-last-microbatch",
        source: "TrainVerify (SOSP'25) section 8.3, category 5, incorrect pipeline scheduling: gradient synchronization before the final backward iteration of a batch (Megatron-LM commits 1f387c2, 32bbb76)",
        description: "each stage all-reduces and averages its gradients over dp before the last microbatch's backward, whose gradients are then added unreduced",
        parallelism: "dp x pp with --microbatches >= 2 (full iteration)",
        spec_op: "aten.sub.Tensor of the SGD step of every parameter (the accumulated gradient)",
        mutation: Mutation::PpGradSyncBeforeLastMicrobatch,
        needs_dp: true,
        needs_backward: true,
        ..PIPELINE_BUG
    },
    Bug {
        id: "pp-shuffled-microbatches",
        source: "TrainVerify (SOSP'25) section 8.3, category 5, incorrect pipeline scheduling: microbatches mistakenly shuffled (Megatron-LM commit 6bd74b0)",
        description: "the last stage pairs each microbatch's activations with the labels of the next microbatch",
        parallelism: "pp with --microbatches >= 2",
        spec_op: "the loss (aten.nll_loss_forward.default for llama, aten.mean.default for mlp)",
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
        ..PIPELINE_BUG
    },
    Bug {
        id: "pp-mismatched-send-recv",
        source: "static verifier README: mismatched send/recv in a pipeline schedule (deadlock under specific schedules)",
        description: "the first stage's schedule skips the send of its last forward activation, so the next stage's recv waits for a partner that never sends",
        parallelism: "pp",
        engines: "static, run",
        spec_op: "none: the implementation deadlocks (the interpreter names the waiting recv)",
        mutation: Mutation::PpMismatchedSendRecv,
        changes_loss: true,
        ..PIPELINE_BUG
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
        self.check_pipeline(1, 1)
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
    /// `--loss-scale`).
    pub fn needs_training(&self) -> bool {
        self.mutation.training_needs() != TrainingNeeds::default()
    }

    /// Why the bug cannot be planted in the plan described by `site` trained with `train`, if
    /// it cannot.
    pub fn check_applies_in(&self, site: &Site, train: &TrainOptions) -> Result<(), String> {
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

    fn site(model: &str, dp: usize, tp: usize, forward_only: bool) -> Site<'_> {
        Site::new(model, dp, tp, forward_only)
    }

    #[test]
    fn applicability() {
        let wg = find_bug("wrong-group").unwrap();
        assert!(wg.check_applies(&site("mlp", 2, 2, true)).is_ok());
        assert!(wg.check_applies(&site("llama", 2, 2, true)).is_ok());
        let e = wg.check_applies(&site("mlp", 1, 2, true)).unwrap_err();
        assert!(e.contains("dp mesh dim"), "{e}");
        let g = find_bug("dp-grad-not-averaged").unwrap();
        assert!(g
            .check_applies(&site("mlp", 2, 1, true))
            .unwrap_err()
            .contains("--forward-only"));
        let bias = find_bug("tp-bias-before-allreduce").unwrap();
        let e = bias.check_applies(&site("llama", 1, 2, true)).unwrap_err();
        assert!(e.contains("not `llama`"), "{e}");
        let kv = find_bug("llama-kv-grad-unsynced").unwrap();
        let e = kv.check_applies(&site("llama", 1, 2, false)).unwrap_err();
        assert!(e.contains("kv heads"), "{e}");
        let replicated = Site {
            kv_replicated: true,
            ..site("llama", 1, 4, false)
        };
        assert!(kv.check_applies(&replicated).is_ok());
        let vp = find_bug("llama-vocab-embedding-unmasked").unwrap();
        let e = vp.check_applies(&site("llama", 1, 2, true)).unwrap_err();
        assert!(e.contains("--vocab-parallel"), "{e}");
        let split = Site {
            vocab_parallel: true,
            ..site("llama", 1, 2, true)
        };
        assert!(vp.check_applies(&split).is_ok());
        let ln = find_bug("sp-layernorm-grad-not-reduced").unwrap();
        let e = ln.check_applies(&site("gpt2", 1, 2, false)).unwrap_err();
        assert!(e.contains("--sequence-parallel"), "{e}");
        let sp = Site {
            sequence_parallel: true,
            ..site("gpt2", 1, 2, false)
        };
        assert!(ln.check_applies(&sp).is_ok());
        let fw = Site {
            forward_only: true,
            ..sp
        };
        assert!(ln.check_applies(&fw).is_err());
        assert!(find_bug("tp-bias-before-allreduce")
            .unwrap()
            .check_applies(&sp)
            .is_ok());
        let e = wg.check_applies(&Site { dp: 2, ..sp }).unwrap_err();
        assert!(e.contains("not defined under --sequence-parallel"), "{e}");
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
