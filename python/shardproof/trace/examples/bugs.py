"""The planted bugs of the example GPT: which Table 1 bug of seed 002 each reproduces, what
configuration it needs, and where the comparer should localize it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Dict, Optional

from .runner import RunSpec


@dataclass(frozen=True)
class Bug:
    """One planted bug."""

    name: str
    table1: int                 # the bug's ID in seed 002's Table 1
    description: str
    needs: str                  # the configuration it needs, in words
    applies: Callable[[RunSpec], bool]
    example_config: str         # a demo configuration that expresses it
    example_dtype: str
    caught_at: str              # the first divergent tensor the comparer should report (or why none)


def _cfg(run: RunSpec):
    return run.config


BUGS: Dict[str, Bug] = {b.name: b for b in [
    Bug("embedding_mask", 1, "TP: the vocab-parallel embedding zeroes its output with a wrong mask (seed Figure 4)",
        "tp > 1", lambda r: _cfg(r).tp > 1, "tp2", "bf16",
        "forward_output of embedding.word_embeddings"),
    Bug("stale_recompute", 2, "AR: the recomputed MLP reads a stale input (one buffer shared by all layers)",
        "recompute", lambda r: r.options.recompute, "tp2-recompute", "bf16",
        "recompute_input of layers.2.mlp.linear_fc1 (its recomputation reads layer 3's input, where a correct "
        "recomputation is bit-identical to the forward; layers.3 recomputes right)"),
    Bug("cp_loss_scale", 3, "CP: the loss is scaled by the CP-local token count instead of the global one",
        "cp > 1", lambda r: _cfg(r).cp > 1, "cp2", "bf16", "grad_output of loss"),
    Bug("dp_loss_scale", 4, "DP: the loss scale leaves out the data-parallel size",
        "dp > 1", lambda r: _cfg(r).dp > 1, "dp2", "bf16", "grad_output of loss"),
    Bug("untied_embedding", 5, "PP: the word-embedding and LM-head gradients are not all-reduced between the "
        "first and last stage (embedding and head untied)", "pp > 1", lambda r: _cfg(r).pp > 1, "pp2", "bf16",
        "main_grad of embedding.word_embeddings.weight (replicas on the two stages differ)"),
    Bug("sp_router_unsynced", 6, "SP with MoE: the router weight gradients are not all-reduced over the TP group",
        "moe and tp > 1 with sp", lambda r: r.options.moe and _cfg(r).sp, "tp2-sp-moe", "bf16",
        "main_grad of layers.0.mlp.router.weight, its TP replicas (declared bit-identical) differing (by the "
        "tolerance alone the bf16 demo would flag layers.1's first: layer 0's router gradient answers one of the "
        "three perturbations with 32%, so its tolerance is above the bug's 1.13 spread)"),
    Bug("zero_no_update", 9, "ZeRO: the buffer ranges owned by other dp ranks are never gathered, so their "
        "parameters are never updated",
        "zero and dp > 1", lambda r: r.options.zero and _cfg(r).dp > 1, "dp2-zero", "bf16",
        "param_after_step of embedding.word_embeddings.weight (in dp rank 0's range of the flat buffer; "
        "dp rank 1 keeps the old value, so the replicas differ)"),
    Bug("pp_stage_division", 10, "PP: a later stage computes its first global layer from the wrong per-stage count "
        "(builds the wrong layers)", "pp > 1", lambda r: _cfg(r).pp > 1, "pp2", "bf16",
        "forward_output of layers.2.input_layernorm (the first layer of stage 1)"),
    Bug("fp8_wrong_group", 7, "TP with FP8: the amax of an input gathered in fp8 under SP is reduced over the "
        "data-parallel group instead of the tensor-parallel one, so each TP rank dequantizes the others' fp8 codes "
        "with its own scale", "fp8 and tp > 1 with sp", lambda r: r.options.fp8 and _cfg(r).sp, "tp2-sp", "fp8",
        "forward_output of layers.0.self_attention.linear_qkv.input_amax (the traced amax of the first input "
        "gathered in fp8: its TP replicas differ by 10% at seed 0, where a correct run's are bit-identical and "
        "bf16 perturbations move it by 1.5%)"),
    Bug("fp8_recompute_cast", 8, "FP8 with recompute: the recomputed MLP uses the master weights instead of "
        "their fp8 casts", "fp8 and recompute", lambda r: r.options.fp8 and r.options.recompute, "tp2-recompute",
        "fp8", "recompute_output of layers.3.mlp.linear_fc1 (the first recomputation in backward differs from "
        "the forward's output, where a correct run's recomputation is bit-identical; the gradients it feeds are off "
        "by about one fp8 rounding, about 6% on layers.0.mlp.linear_fc2's weight gradient, of the order of a correct "
        "emulated-fp8 run's own noise, so no tolerance separates them: see "
        "test_fp8_recompute_cast_is_within_emulated_fp8_noise)"),
    Bug("tp_overlap_grad", 11, "TP: the input gradient of a column-parallel linear is not all-reduced (overlap path)",
        "tp > 1 without sp", lambda r: _cfg(r).tp > 1 and not _cfg(r).sp, "tp2", "bf16",
        "grad_input of output_layer"),
    Bug("sp_layernorm_unsynced", 12, "SP: layernorm weight gradients are not all-reduced over the TP group",
        "tp > 1 with sp", lambda r: _cfg(r).sp, "tp2-sp", "bf16",
        "main_grad of layers.0.input_layernorm.weight (replicas on the TP ranks differ)"),
    Bug("cp_attention_grad", 13, "CP: the key/value gradients come back to their CP rank in the wrong chunk layout",
        "cp > 1", lambda r: _cfg(r).cp > 1, "cp2", "bf16",
        "grad_input of layers.3.self_attention.core_attention"),
    Bug("tpcp_layernorm_scale", 14, "TP+CP: layernorm gradients are summed over TP although TP ranks hold them whole",
        "tp > 1 and cp > 1 without sp", lambda r: _cfg(r).tp > 1 and _cfg(r).cp > 1 and not _cfg(r).sp,
        "tp2-cp2", "bf16", "main_grad of layers.0.input_layernorm.weight"),
]}


def check_applies(name: Optional[str], run: RunSpec) -> Optional[str]:
    """None when bug `name` (or no bug) can be expressed by `run`, else why not."""
    if name is None:
        return None
    bug = BUGS.get(name)
    if bug is None:
        return f"unknown bug `{name}`; known: {', '.join(BUGS)}"
    if not bug.applies(run):
        return f"bug `{name}` needs {bug.needs}; try --config {bug.example_config}"
    return None
