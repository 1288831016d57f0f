"""The trace collector and tensor rewrites (TTrace section 4.3).

A `Tracer` hooks the annotated modules of one rank's model (one module, or a list of virtual
pipeline chunks) for one training iteration and records, by canonical id and shard map:

* module inputs and outputs (forward pre-hooks and forward hooks),
* the gradients w.r.t. them (full backward pre-hooks and full backward hooks),
* each parameter's gradient of one microbatch (tensor hooks: the contribution of that microbatch
  before accumulation, so that under DP a rank's local microbatch lines up with the reference's
  global one),
* main gradients and parameters before the optimizer step, parameters after it.

Module inputs are seen as the caller passes them (the tracer's forward pre-hook runs before
any other, e.g. before `parallelize_module`'s input conversion) and outputs as the caller
receives them (after every other forward hook). A DTensor value is recorded as its local
tensor with the shard map of its placements (see `dtensor`); plain tensors are split as the
annotation says.

In **rewrite mode** (module-wise testing) every traced floating-point module input is overwritten
with its shard of the consistent generator's tensor for that input's canonical id, and every
traced output gradient likewise in backward, so the reference and the candidate modules consume
identical inputs. The rewrite keeps the graph: the gradient flows through to the original input.

In a **perturbed run** (section 4.5), parameters, data inputs given to `data_input` and (in
rewrite mode) rewritten tensors get a relative perturbation of `relative_scale` (the run dtype's
machine epsilon by default) times standard-normal noise seeded by (run seed, canonical id).
"""

from __future__ import annotations

import contextlib
import threading
from dataclasses import dataclass
from typing import Dict, Iterator, List, Optional, Sequence, Union

import torch

from . import dtensor
from .annotations import Annotations, ModuleAnnotation, ParamAnnotation, TensorSplit, load_annotations
from .generator import ConsistentGenerator, perturbation_noise
from .layout import (CanonicalId, LayoutError, ParallelConfig, ShardMap, canonical_name, flat_shard_map,
                     param_split, shard_map)
from .writer import ROLES, RankTraceWriter, storage_dtype, write_trace_json

_STATE = threading.local()


@contextlib.contextmanager
def recomputing() -> Iterator[None]:
    """Marks a forward recomputation (activation checkpointing): hooks still rewrite inputs (so
    the recomputed graph equals the original one), and record the recomputed inputs and outputs
    as `recompute_input` / `recompute_output` instead of the forward kinds (unless the tracer's
    `record_recompute` is off). The comparer requires each to equal the same rank's forward
    value bit for bit: a recomputation runs the same kernels on the same inputs."""
    previous = getattr(_STATE, "recomputing", False)
    _STATE.recomputing = True
    try:
        yield
    finally:
        _STATE.recomputing = previous


def _is_recomputing() -> bool:
    return getattr(_STATE, "recomputing", False)


@dataclass(frozen=True)
class Perturbation:
    """One perturbed reference run: its seed and the relative size of the perturbation."""

    seed: int
    relative_scale: float

    def as_json(self) -> dict:
        """The `perturbation` object of trace.json."""
        return {"seed": self.seed, "relative_scale": self.relative_scale}


def machine_epsilon(run_dtype: str) -> float:
    """The machine epsilon of a run dtype's storage dtype (bfloat16 for emulated fp8)."""
    return float(torch.finfo(storage_dtype(run_dtype)).eps)


class _Rewrite(torch.autograd.Function):
    """Forward: the replacement value. Backward: the gradient passes to the original tensor."""

    @staticmethod
    def forward(ctx, original, replacement):  # noqa: D401 - autograd signature
        return replacement.clone()

    @staticmethod
    def backward(ctx, grad):
        return grad, None


def _is_float(value) -> bool:
    return isinstance(value, torch.Tensor) and value.is_floating_point()


def _as_list(value) -> List:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (tuple, list)):
        return list(value)
    return []


class Tracer:
    """Records one rank's trace of one training iteration.

    `model` is the rank's module, or its list of virtual-pipeline chunks (chunk i = list index).
    `annotations` is an `Annotations` or the path of an annotation file. `role` is "reference",
    "candidate" or "perturbed" (then `perturbation` is required). `rank` is this process's rank
    in `config`'s layout (single-device reference: rank 0 of the default layout).

    `align_with` (for a reference) is the layout of the candidate it will be compared with:
    parameter gradients the candidate cannot record whole (see `partial_grad`) are left out of
    the reference too, so both traces hold the same ids.

    `record_recompute` (default on): record the inputs and outputs of traced modules run again
    inside `recomputing()` (activation recomputation). `shardproof trace compare` requires them
    bit-identical to the forward's, which holds when the recomputed kernels are deterministic
    (same kernels, same inputs, same shapes); turn it off for kernels that are not (e.g. GPU
    kernels reducing with atomics).

    `exact_replicas`: declare every traced tensor's copies on different ranks bit-identical in a
    correct run (as the annotations' `exact_replicas` does for one module or parameter), so the
    comparer reports any difference between replicas. True where every replica is computed by
    the same deterministic kernels from bit-identical inputs and every cross-rank reduction
    hands each rank the same bits: a max, or a sum over two ranks (fl(a + b) = fl(b + a)). A sum
    over three or more ranks depends on the order the collective adds in, which is the
    library's choice, so leave it off there (the tolerance judges those replicas)."""

    def __init__(self, model: Union[torch.nn.Module, Sequence[torch.nn.Module]],
                 annotations: Union[Annotations, str], config: ParallelConfig, rank: int, out: str, *,
                 role: str, dtype: str = "float32", iteration: int = 0, rewrite: bool = False,
                 generator: Optional[ConsistentGenerator] = None, perturbation: Optional[Perturbation] = None,
                 align_with: Optional[ParallelConfig] = None, record_recompute: bool = True,
                 exact_replicas: bool = False):
        if role not in ROLES:
            raise ValueError(f"unknown role `{role}`; expected one of {', '.join(ROLES)}")
        if (role == "perturbed") != (perturbation is not None):
            raise ValueError("a perturbed run, and only a perturbed run, needs a perturbation")
        self.chunks = list(model) if isinstance(model, (list, tuple, torch.nn.ModuleList)) else [model]
        self.annotations = annotations if isinstance(annotations, Annotations) else load_annotations(annotations)
        self.config = config
        self.rank = rank
        self.coords = config.coords(rank)
        self.out = out
        self.role = role
        self.dtype = dtype
        self.iteration_index = iteration
        self.rewrite = rewrite
        self.generator = generator or ConsistentGenerator()
        self.perturbation = perturbation
        self.align_with = align_with
        self.record_recompute = record_recompute
        self.exact_replicas = exact_replicas
        self.writer = RankTraceWriter(out, rank, self.coords, dtype)
        self._local_microbatch = 0
        self._handles: list = []
        self._active = False
        self._seen: set = set()
        self._param_grad_slot: Dict[str, int] = {}
        self._params = self._collect_params()

    # ---- public API -------------------------------------------------------------------------

    @contextlib.contextmanager
    def iteration(self) -> Iterator["Tracer"]:
        """Hooks the model for the duration of one training iteration (perturbing parameters
        first in a perturbed run)."""
        self.start()
        try:
            yield self
        finally:
            self.stop()

    @contextlib.contextmanager
    def microbatch(self, local_index: int) -> Iterator[None]:
        """Marks the forward or backward of local microbatch `local_index` of this dp rank."""
        self.config.global_microbatch(self.coords.dp, local_index)  # validates the index
        previous = self._local_microbatch
        self._local_microbatch = local_index
        try:
            yield
        finally:
            self._local_microbatch = previous

    def start(self) -> None:
        """Registers the hooks (and perturbs parameters in a perturbed run)."""
        if self._active:
            raise RuntimeError("the tracer is already started")
        self._active = True
        if self.perturbation is not None:
            self._perturb_parameters()
        for chunk_index, chunk in enumerate(self.chunks):
            for name, module in chunk.named_modules():
                if not name:
                    continue
                cname, annotation = self._module_name(name, chunk_index)
                if annotation is None:
                    continue
                cls = type(module).__name__
                self._handles.append(module.register_forward_pre_hook(self._pre_forward_hook(cname, annotation),
                                                                     prepend=True))
                self._handles.append(module.register_forward_hook(self._forward_hook(cname, annotation, cls)))
                self._handles.append(module.register_full_backward_pre_hook(
                    self._backward_pre_hook(cname, annotation, cls)))
                if annotation.input is not None:
                    self._handles.append(module.register_full_backward_hook(
                        self._backward_hook(cname, annotation, cls)))
        for cname, (param, annotation, cls) in self._params.items():
            if param.requires_grad and self._records_param_grad(annotation):
                self._handles.append(param.register_hook(self._param_grad_hook(cname, annotation, cls)))

    def stop(self) -> None:
        """Removes the hooks."""
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        self._active = False

    def data_input(self, tensor: torch.Tensor, name: str, split: Optional[TensorSplit] = None) -> torch.Tensor:
        """Passes a data input through: in a perturbed run a floating-point input is perturbed."""
        if self.perturbation is None or not _is_float(tensor):
            return tensor
        cid = self._id("forward_input", f"data.{name}", 0)
        if dtensor.is_dtensor(tensor):
            local, smap = dtensor.unwrap(tensor, str(cid))
            return dtensor.like(self._perturb(local, f"data:{cid}", smap), tensor, str(cid))
        smap = shard_map(split, self.config, self.coords, local_shape=tuple(tensor.shape), what=str(cid))
        return self._perturb(tensor, f"data:{cid}", smap)

    def before_step(self) -> None:
        """Records main gradients (`param.main_grad` if present, else `param.grad`) and the
        parameters, after gradient reduction and before the optimizer step. A parameter with
        `main_grad_range = (a, b)` holds only a ZeRO shard: `main_grad` is the 1-D tensor of the
        gradient's row-major elements a..b-1 (recorded with flat pieces); with `main_grad_range`
        None (a rank that owns none of it) none is recorded on this rank."""
        for cname, (param, annotation, cls) in self._params.items():
            sharded = hasattr(param, "main_grad_range")
            flat = getattr(param, "main_grad_range", None)
            grad = getattr(param, "main_grad", None)
            if grad is None and not sharded:
                grad = param.grad
            cid = CanonicalId(self.iteration_index, 0, "main_grad", cname, 0)
            if sharded and (grad is None) != (flat is None):
                raise LayoutError(f"{cid}: main_grad and main_grad_range must be set together")
            if grad is not None and flat is not None:
                # A ZeRO shard: the rank holds flat elements [a, b) of the parameter's gradient.
                smap = flat_shard_map(self._param_map(cname, param, annotation), flat[0], flat[1], str(cid))
                self._record(cid, grad, smap, cls, self._exact(annotation))
            elif grad is not None:
                self._record_value(cid, grad, param_split(annotation), cls, self._exact(annotation))
            self._record_value(CanonicalId(self.iteration_index, 0, "param_before_step", cname, 0), param,
                               param_split(annotation), cls, self._exact(annotation))

    def after_step(self) -> None:
        """Records the parameters after the optimizer step."""
        for cname, (param, annotation, cls) in self._params.items():
            self._record_value(CanonicalId(self.iteration_index, 0, "param_after_step", cname, 0), param,
                               param_split(annotation), cls, self._exact(annotation))

    def save(self) -> str:
        """Writes this rank's files (and trace.json on rank 0); returns the rank directory."""
        if self.rank == 0:
            write_trace_json(self.out, self.role, self.config.world_size, self.dtype, self.config,
                             None if self.perturbation is None else self.perturbation.as_json())
        return self.writer.close()

    # ---- names, ids, maps -------------------------------------------------------------------

    def _module_name(self, name: str, chunk: int):
        cname = canonical_name(name, self.config, self.coords, chunk)
        annotation: Optional[ModuleAnnotation] = self.annotations.module(cname)
        if annotation is not None and annotation.ep:
            cname = canonical_name(name, self.config, self.coords, chunk, expert=True)
        return cname, annotation

    def _collect_params(self) -> Dict[str, tuple]:
        params: Dict[str, tuple] = {}
        seen = set()
        for chunk_index, chunk in enumerate(self.chunks):
            owners = dict(chunk.named_modules())
            for name, param in chunk.named_parameters():
                if id(param) in seen:
                    continue
                seen.add(id(param))
                cname = canonical_name(name, self.config, self.coords, chunk_index)
                annotation: Optional[ParamAnnotation] = self.annotations.param(cname)
                if annotation is not None and annotation.ep:
                    cname = canonical_name(name, self.config, self.coords, chunk_index, expert=True)
                owner = owners.get(name.rpartition(".")[0])
                params[cname] = (param, annotation, None if owner is None else type(owner).__name__)
        return params

    def _id(self, kind: str, module: str, index: int) -> CanonicalId:
        microbatch = self.config.global_microbatch(self.coords.dp, self._local_microbatch)
        return CanonicalId(self.iteration_index, microbatch, kind, module, index)

    def _param_map(self, cname: str, param: torch.Tensor, annotation: Optional[ParamAnnotation]) -> ShardMap:
        if dtensor.is_dtensor(param):
            return dtensor.unwrap(param, cname)[1]
        return shard_map(param_split(annotation), self.config, self.coords, local_shape=tuple(param.shape),
                         what=cname)

    def _local(self, value, split: Optional[TensorSplit], what: str):
        """The tensor to store and its shard map: a DTensor's local tensor and placements, else
        the tensor itself split as annotated."""
        if dtensor.is_dtensor(value):
            return dtensor.unwrap(value, what)
        value = dtensor.settled(value)
        return value, shard_map(split, self.config, self.coords, local_shape=tuple(value.shape), what=what)

    def _record_value(self, cid: CanonicalId, value, split: Optional[TensorSplit], cls: Optional[str],
                      exact: bool = False) -> None:
        local, smap = self._local(value, split, str(cid))
        self._record(cid, local, smap, cls, exact)

    def _exact(self, annotation: Optional[Union[ModuleAnnotation, ParamAnnotation]]) -> bool:
        """Whether the copies of a tensor on different ranks are declared bit-identical."""
        return self.exact_replicas or bool(annotation is not None and annotation.exact_replicas)

    def _records_param_grad(self, annotation: Optional[ParamAnnotation]) -> bool:
        """A per-microbatch parameter gradient is recorded only where it is whole on the rank:
        under CP every rank holds a partial sum over its sequence chunks, and an annotation's
        `partial_grad` names other parallelisms under which it is partial."""
        for cfg in (self.config, self.align_with):
            if cfg is None:
                continue
            active = {"sp": cfg.sp and cfg.tp > 1, "pp": cfg.pp > 1, "cp": cfg.cp > 1, "tp": cfg.tp > 1}
            if active["cp"] or any(active[k] for k in (annotation.partial_grad if annotation else ())):
                return False
        return True

    def _record(self, cid: CanonicalId, tensor: torch.Tensor, smap: ShardMap, cls: Optional[str],
                exact: bool = False) -> None:
        key = str(cid)
        if key in self._seen:
            raise LayoutError(f"{key} recorded twice on rank {self.rank}: a traced module ran twice in one "
                              "microbatch (wrap recomputation in shardproof.trace.recomputing())")
        self._seen.add(key)
        self.writer.add(cid, tensor, smap, cls, exact)

    def _perturb(self, tensor: torch.Tensor, key: str, smap: ShardMap) -> torch.Tensor:
        noise = perturbation_noise(self.perturbation.seed, key, smap).to(tensor.device)
        delta = tensor.detach().float() * noise * self.perturbation.relative_scale
        return (tensor.float() + delta).to(tensor.dtype)

    def _perturb_parameters(self) -> None:
        with torch.no_grad():
            for cname, (param, annotation, _) in self._params.items():
                if param.is_floating_point():
                    local = dtensor.local_view(param)
                    local.copy_(self._perturb(local, f"param:{cname}", self._param_map(cname, param, annotation)))

    def _replacement(self, key: str, like: torch.Tensor, smap: ShardMap) -> torch.Tensor:
        value = self.generator.shard(f"rewrite:{key}", smap, dtype=like.dtype, device=like.device)
        if self.perturbation is not None:
            value = self._perturb(value, f"rewrite:{key}", smap)
        return value

    # ---- hooks ------------------------------------------------------------------------------

    def _rewritten(self, cid: CanonicalId, value, split: Optional[TensorSplit]):
        """`value` replaced by this rank's shard of the generated tensor for `cid` (the same
        kind of tensor: a DTensor with the same placements for a DTensor), and its shard map."""
        key = str(cid)
        if dtensor.is_dtensor(value):
            if dtensor.has_partial(value):
                raise LayoutError(f"{key}: a DTensor with a Partial placement cannot be rewritten; trace the "
                                  "module whose input it is after the reduction")
            smap = dtensor.unwrap(value, key)[1]
            local = self._replacement(key, dtensor.local_view(value), smap)
            return dtensor.like(local, value, key), smap
        value = dtensor.settled(value)
        smap = shard_map(split, self.config, self.coords, local_shape=tuple(value.shape), what=key)
        return self._replacement(key, value, smap), smap

    def _pre_forward_hook(self, cname: str, annotation: ModuleAnnotation):
        def hook(module, args):
            if annotation.input is None:
                return None
            new_args = list(args)
            changed = False
            for index, value in enumerate(args):
                split = annotation.input_split(index)
                if split is None or not _is_float(value):
                    continue
                cid = self._id("forward_input", cname, index)
                if self.rewrite:
                    replacement, _ = self._rewritten(cid, value, split)
                    value = _Rewrite.apply(value, replacement) if value.requires_grad else replacement
                    new_args[index] = value
                    changed = True
                if not _is_recomputing():
                    self._record_value(cid, value, split, type(module).__name__, self._exact(annotation))
                elif self.record_recompute:
                    self._record_value(self._id("recompute_input", cname, index), value, split,
                                       type(module).__name__)
            return tuple(new_args) if changed else None
        return hook

    def _forward_hook(self, cname: str, annotation: ModuleAnnotation, cls: str):
        def hook(module, args, output):
            if annotation.output is None:
                return None
            kind = "forward_output"
            if _is_recomputing():
                if not self.record_recompute:
                    return None
                kind = "recompute_output"
            for index, value in enumerate(_as_list(output)):
                split = annotation.output_split(index)
                if split is None or not _is_float(value):
                    continue
                self._record_value(self._id(kind, cname, index), value, split, cls, self._exact(annotation))
            return None
        return hook

    def _backward_pre_hook(self, cname: str, annotation: ModuleAnnotation, cls: str):
        def hook(module, grad_output):
            if annotation.output is None:
                return None
            new = list(grad_output)
            changed = False
            for index, grad in enumerate(grad_output):
                split = annotation.output_split(index)
                if split is None or grad is None:
                    continue
                cid = self._id("grad_output", cname, index)
                if self.rewrite:
                    grad, _ = self._rewritten(cid, grad, split)
                    new[index] = grad
                    changed = True
                self._record_value(cid, grad, split, cls, self._exact(annotation))
            return tuple(new) if changed else None
        return hook

    def _backward_hook(self, cname: str, annotation: ModuleAnnotation, cls: str):
        def hook(module, grad_input, grad_output):
            for index, grad in enumerate(grad_input):
                split = annotation.input_split(index)
                if split is None or grad is None:
                    continue
                self._record_value(self._id("grad_input", cname, index), grad, split, cls,
                                   self._exact(annotation))
            return None
        return hook

    def _param_grad_hook(self, cname: str, annotation: Optional[ParamAnnotation], cls: Optional[str]):
        def hook(grad):
            cid = self._id("param_grad", cname, 0)
            key = str(cid)
            local, smap = self._local(grad, param_split(annotation), cname)
            slot = self._param_grad_slot.get(key)
            if slot is not None:
                # The parameter took part in several backward passes of one microbatch
                # (e.g. recomputation): its microbatch gradient is their sum.
                name, stored = self.writer.tensors[slot]
                stored.add_(local.detach().to(device="cpu", dtype=stored.dtype))
                return None
            self._param_grad_slot[key] = len(self.writer.tensors)
            self._record(cid, local, smap, cls, self._exact(annotation))
            return None
        return hook
