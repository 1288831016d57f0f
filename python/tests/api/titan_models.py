"""torchtitan's own Llama 3 (torchtitan 0.3.0 from PyPI: its model, its sharding config, its
`Module.parallelize`), built tiny, with what runs on CPU: torchtitan's language-model attention
backends are flex and varlen only, so the inner attention is its `ScaledDotProductAttention`
(causal), and the rotary cache its real `CosSinRoPE` (`ComplexRoPE`'s cache is complex)."""

from __future__ import annotations

import torch

DIM, HEADS, VOCAB, SEQ = 8, 2, 16, 4


def llama_config(sequence_parallel: bool = False):
    """A one-layer Llama 3 config with torchtitan's TP sharding config filled in."""
    import torchtitan.models.llama3 as llama3
    from torchtitan.models.common import Embedding, Linear, RMSNorm
    from torchtitan.models.common.attention import ScaledDotProductAttention
    from torchtitan.models.common.rope import CosSinRoPE
    from torchtitan.models.llama3.model import Llama3Model
    from torchtitan.models.llama3.sharding import set_llama3_sharding_config

    # `_build_llama3_layers` maps a backend name to the inner attention; the SDPA module is
    # the one torchtitan itself builds for non-language models.
    saved = llama3.get_attention_config
    llama3.get_attention_config = lambda backend: ScaledDotProductAttention.Config()
    try:
        layers = llama3._build_llama3_layers(
            fuse_qkv=False, n_layers=1, dim=DIM, n_heads=HEADS, hidden_dim=16,
            rope=CosSinRoPE.Config(dim=DIM // HEADS, max_seq_len=SEQ), attn_backend="sdpa",
        )
    finally:
        llama3.get_attention_config = saved
    config = Llama3Model.Config(
        dim=DIM, vocab_size=VOCAB,
        tok_embeddings=Embedding.Config(num_embeddings=VOCAB, embedding_dim=DIM, param_init=llama3._EMBEDDING_INIT),
        norm=RMSNorm.Config(normalized_shape=DIM, param_init=llama3._NORM_INIT),
        lm_head=Linear.Config(in_features=DIM, out_features=VOCAB, param_init=llama3._output_linear_init(DIM)),
        layers=layers,
    )
    set_llama3_sharding_config(config, enable_sp=sequence_parallel)
    return config


def build_llama(sequence_parallel: bool = False) -> torch.nn.Module:
    """The model, its states initialized by torchtitan's own initializers."""
    model = llama_config(sequence_parallel).build()
    model.init_states()
    return model


def titan_plan(tp: int, drop_w2_reduce: bool = False):
    """The `plan` callable: torchtitan's own `Module.parallelize` over its ParallelDims, on the
    DTensor backend. `drop_w2_reduce` plants a bug: the FFN's row-parallel w2 declares its
    partial sums replicated instead of all-reducing them."""

    def plan(module, mesh):
        import torchtitan.distributed.parallel_dims as parallel_dims
        from torch.distributed.tensor import DTensor, Replicate

        # torchtitan falls back to "cuda" when no accelerator is present.
        parallel_dims.device_type = "cpu"
        dims = parallel_dims.ParallelDims(dp_replicate=1, dp_shard=1, cp=1, tp=tp, pp=1, ep=1,
                                          world_size=tp, spmd_backend="partial_dtensor")
        module.parallelize(dims)
        if drop_w2_reduce:
            w2 = module.layers["0"].feed_forward.w2

            def unreduced(outputs):
                return DTensor.from_local(outputs.to_local(), outputs.device_mesh, (Replicate(),),
                                          run_check=False)

            w2._redistribute_outputs = lambda _dims, outputs: unreduced(outputs)
        return module

    return plan


def tokens(batch: int = 2) -> torch.Tensor:
    return torch.randint(0, VOCAB, (batch, SEQ), generator=torch.Generator().manual_seed(7))
