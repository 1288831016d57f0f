"""A tiny Megatron-core GPT, built the way Megatron's own unit tests build theirs: local (non
Transformer-Engine) layer spec, CPU initialization, tensor-parallel size from the parallel state."""

from __future__ import annotations

import torch


def gpt_config(**overrides):
    """A one-layer GPT config: RMSNorm, plain GELU MLP, no biases, no dropout, learned positions
    (rotary embeddings are precomputed tables, lifted as constants the importer does not read)."""
    from megatron.core import parallel_state
    from megatron.core.transformer.transformer_config import TransformerConfig

    kw = dict(
        num_layers=1, hidden_size=8, num_attention_heads=4, ffn_hidden_size=16,
        use_cpu_initialization=True, normalization="RMSNorm", add_bias_linear=False,
        bias_dropout_fusion=False, hidden_dropout=0.0, attention_dropout=0.0,
        masked_softmax_fusion=False, gradient_accumulation_fusion=False, params_dtype=torch.float32,
        tensor_model_parallel_size=parallel_state.get_tensor_model_parallel_world_size(),
    )
    kw.update(overrides)
    return TransformerConfig(**kw)


VOCAB, SEQ = 16, 4


def build_gpt(layer_spec=None):
    """Megatron's GPTModel with its local layer spec; logits stay vocabulary-parallel."""
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec

    spec = layer_spec or get_gpt_layer_local_spec(normalization="RMSNorm")
    return GPTModel(gpt_config(), spec, vocab_size=VOCAB, max_sequence_length=SEQ,
                    position_embedding_type="learned_absolute", parallel_output=True)


def gpt_inputs(batch: int = 2):
    g = torch.Generator().manual_seed(5)
    ids = torch.randint(0, VOCAB, (batch, SEQ), generator=g)
    pos = torch.arange(SEQ).expand(batch, SEQ).contiguous()
    # An explicit causal mask (True: masked): Megatron's default one is built on CUDA.
    mask = torch.triu(torch.ones(SEQ, SEQ, dtype=torch.bool), diagonal=1)[None, None]
    return ids, pos, mask


def build_gpt_without_fc2_reduce():
    """A planted bug: the MLP's row-parallel fc2 keeps its partial sums, as a layer wrongly
    flagged as an expert's (whose communication Megatron leaves to the token dispatcher) does."""
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.tensor_parallel.layers import RowParallelLinear

    class RowParallelWithoutReduce(RowParallelLinear):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.explicit_expert_comm = True

    spec = get_gpt_layer_local_spec(normalization="RMSNorm")
    spec.submodules.mlp.submodules.linear_fc2 = RowParallelWithoutReduce
    return build_gpt(spec)


class GPTLoss(torch.nn.Module):
    """The training objective Megatron's pretrain_gpt computes: the model's per-token
    vocab-parallel cross-entropy (labels given), averaged over the tokens."""

    def __init__(self, gpt):
        super().__init__()
        self.gpt = gpt

    def forward(self, input_ids, position_ids, attention_mask, labels):
        return self.gpt(input_ids, position_ids, attention_mask, labels=labels).mean()


def build_gpt_loss():
    return GPTLoss(build_gpt())


def build_gpt_loss_without_fc1_dgrad_reduce():
    """A planted bug in the backward only: the MLP's column-parallel fc1 skips the all-reduce of
    its input gradient (`disable_grad_reduce`, as a layer whose gradient some other code was
    meant to reduce), so each rank carries its partial sum of the gradient into the
    pre-MLP norm. The forward is untouched."""
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.tensor_parallel.layers import ColumnParallelLinear

    class ColumnParallelWithoutDgradReduce(ColumnParallelLinear):
        def __init__(self, *args, **kwargs):
            kwargs["disable_grad_reduce"] = True
            super().__init__(*args, **kwargs)

    spec = get_gpt_layer_local_spec(normalization="RMSNorm")
    spec.submodules.mlp.submodules.linear_fc1 = ColumnParallelWithoutDgradReduce
    return GPTLoss(build_gpt(spec))


class SequenceParallelRMSNorm(torch.nn.RMSNorm):
    """The local spec's norm (torch's RMSNorm, as Megatron's WrappedTorchNorm builds it) for
    sequence parallelism, which WrappedTorchNorm refuses outright: the math is the same per
    token; the weight is marked `sequence_parallel`, as Megatron's own fused and TE norms mark
    theirs (their grads are then all-reduced over the tensor-parallel group)."""

    def __init__(self, config, hidden_size: int, eps: float = 1e-5, **_unused):
        super().__init__(hidden_size, eps=eps)
        self.weight.sequence_parallel = config.sequence_parallel


def build_gpt_sequence_parallel():
    """The GPT with sequence parallelism: norms and residuals sequence-sharded, the linear
    layers' all-gathers and reduce-scatters Megatron's own."""
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer.transformer_block import TransformerBlockSubmodules

    layer = get_gpt_layer_local_spec(normalization="RMSNorm")
    layer.submodules.input_layernorm = SequenceParallelRMSNorm
    layer.submodules.pre_mlp_layernorm = SequenceParallelRMSNorm
    block = TransformerBlockSubmodules(layer_specs=[layer], layer_norm=SequenceParallelRMSNorm)
    from megatron.core import parallel_state

    sp = parallel_state.get_tensor_model_parallel_world_size() > 1
    return GPTModel(gpt_config(sequence_parallel=sp), block, vocab_size=VOCAB, max_sequence_length=SEQ,
                    position_embedding_type="learned_absolute", parallel_output=True)


def build_gpt_sequence_parallel_loss():
    """The sequence-parallel GPT's training objective, as `build_gpt_loss`."""
    return GPTLoss(build_gpt_sequence_parallel())
