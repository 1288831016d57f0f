"""Runs one traced training iteration of the example GPT: the single-device reference in this
process, or a parallel candidate as real processes on CPU (`torch.distributed`, gloo).

One iteration: every microbatch forward and backward (the 1F1B schedule across pipeline stages,
with batched send/recv between them; Megatron's interleaved 1F1B with virtual stages), gradient reduction (DP x CP, SP layernorms over TP, the tied embedding
over the first and last stage), then an SGD-with-momentum step on float32 copies of the parameters whose
state is partitioned over DP when `zero` is on (ZeRO-1 as Megatron's distributed optimizer: contiguous
flat buffers split evenly across DP ranks, see `ZeroSGD`).
"""

from __future__ import annotations

import os
import pickle
import re
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import List, Optional, Tuple

import torch
import torch.distributed as dist

from ..annotations import Annotations, TensorSplit, load_annotations
from ..collector import Perturbation, Tracer
from ..generator import ConsistentGenerator
from ..layout import ParallelConfig, extract_local, shard_map
from .gpt import Context, GPTStage, ModelSpec, RunOptions
from .parallel import Groups, all_gather, all_reduce, reduce_scatter

#: The annotation file of the example GPT.
ANNOTATIONS = os.path.join(os.path.dirname(__file__), "gpt.yaml")


@dataclass(frozen=True)
class RunSpec:
    """One run: the parallel layout (with microbatches per dp rank), options, sizes, seed."""

    config: ParallelConfig
    options: RunOptions = field(default_factory=RunOptions)
    spec: ModelSpec = field(default_factory=ModelSpec)
    seed: int = 0
    iteration: int = 0

    def reference(self) -> "RunSpec":
        """The single-device reference of this run: no parallelism, every global microbatch in
        sequence (gradient accumulation), no recomputation, no ZeRO, no bug; the same model
        (MoE layers or not)."""
        cfg = self.config
        ref = ParallelConfig(num_layers=self.spec.layers, microbatches=cfg.dp * cfg.microbatches)
        return RunSpec(config=ref, options=RunOptions(dtype=self.options.dtype, moe=self.options.moe), spec=self.spec,
                       seed=self.seed, iteration=self.iteration)


@dataclass(frozen=True)
class TraceJob:
    """What to record: where, in which role, with module-wise rewrites or not, perturbed or not."""

    out: str
    role: str
    rewrite: bool = False
    perturbation: Optional[Perturbation] = None
    annotations: str = ANNOTATIONS
    align_with: Optional[ParallelConfig] = None


_LAYER_PATH = re.compile(r"^layers\.(\d+)\.(.*)$")


def init_parameters(model: GPTStage, ctx: Context, gen: ConsistentGenerator) -> None:
    """Fills every parameter with its shard of a generated full tensor, keyed by the global name
    the model itself believes the parameter has (its layers' `layer_number`)."""
    with torch.no_grad():
        for name, param in model.named_parameters():
            match = _LAYER_PATH.match(name)
            if match:
                name = f"layers.{model.layers[int(match.group(1))].layer_number}.{match.group(2)}"
            smap = shard_map(TensorSplit(tp_dim=param.tp_dim), ctx.config, ctx.coords,
                             local_shape=tuple(param.shape), what=name)
            full = smap.full_shape
            if "layernorm.weight" in name:
                mean, std = 1.0, 0.1
            elif name.endswith(".bias"):
                mean, std = 0.0, 0.1
            elif "embeddings" in name:
                mean, std = 0.0, 0.3
            elif "router" in name:
                mean, std = 0.0, 0.5  # gates well away from uniform
            else:
                mean, std = 0.0, 1.0 / (full[1] ** 0.5)
            param.copy_(gen.shard(f"init:{name}", smap, dtype=param.dtype, std=std, mean=mean))


def _microbatch_data(run: RunSpec, ctx: Context, gen: ConsistentGenerator, local_mb: int):
    s, b, vocab = run.spec.seq, run.spec.micro_batch, run.spec.vocab
    g = ctx.config.global_microbatch(ctx.coords.dp, local_mb)
    tokens = gen.integers(("tokens", run.iteration, g), (s, b), vocab)
    labels = gen.integers(("labels", run.iteration, g), (s, b), vocab)
    cp_split = TensorSplit(cp_dim=0)
    smap = shard_map(cp_split, ctx.config, ctx.coords, full_shape=(s, b))
    positions = extract_local(torch.arange(s), shard_map(cp_split, ctx.config, ctx.coords, full_shape=(s,)))
    return extract_local(tokens, smap), positions, extract_local(labels, smap)


def _loss_scale(run: RunSpec, ctx: Context) -> float:
    """1 / (tokens of all global microbatches): every rank sums its local per-token losses."""
    cfg = ctx.config
    tokens = run.spec.seq * run.spec.micro_batch
    if ctx.bug("cp_loss_scale"):
        tokens //= cfg.cp  # Table 1 bug 3: scaled by the local (CP-chunk) token count
    microbatches = cfg.microbatches * cfg.dp
    if ctx.bug("dp_loss_scale"):
        microbatches = cfg.microbatches  # Table 1 bug 4: the data-parallel size left out
    return 1.0 / (tokens * microbatches)


def _p2p_shape(run: RunSpec, ctx: Context) -> Tuple[int, ...]:
    cfg = ctx.config
    s = run.spec.seq // cfg.cp // (cfg.tp if ctx.sp else 1)
    return (s, run.spec.micro_batch, run.spec.hidden)


def _p2p(send: Optional[Tuple[torch.Tensor, int]] = None, recv: Optional[Tuple[tuple, torch.dtype, int]] = None):
    """A send and/or a receive posted together (non-blocking, then waited), in float32, so that
    neighbouring stages never wait on each other's blocking send (Megatron's batched p2p)."""
    requests = []
    if send is not None:
        tensor, dst = send
        buffer = tensor.detach().float().contiguous()
        requests.append(dist.isend(buffer, dst))
    received = None
    if recv is not None:
        shape, dtype, src = recv
        received = torch.empty(shape, dtype=torch.float32)
        requests.append(dist.irecv(received, src))
    for request in requests:
        request.wait()
    return None if received is None else received.to(recv[1])


def run_schedule(run: RunSpec, ctx: Context, model: GPTStage, tracer: Tracer, gen: ConsistentGenerator) -> None:
    """Forward and backward of every local microbatch: one after the other without PP, else the
    non-interleaved 1F1B schedule (warm-up forwards, then one forward one backward, then the
    remaining backwards), exchanging activations and gradients with the neighbouring stages."""
    cfg, groups = ctx.config, ctx.groups
    scale = _loss_scale(run, ctx)
    dtype = ctx.options.compute_dtype
    shape = _p2p_shape(run, ctx)
    first, last = model.pre_process, model.post_process
    data = [_microbatch_data(run, ctx, gen, m) for m in range(cfg.microbatches)]

    def forward(m: int, received: Optional[torch.Tensor]):
        tokens, positions, labels = data[m]
        stage_input = tokens if first else received.requires_grad_(True)
        with tracer.microbatch(m):
            output = model(stage_input, positions, labels)
            if last:
                output = output.sum() * scale
        return stage_input, output

    def backward(m: int, stage_input, output, grad):
        with tracer.microbatch(m):
            if last:
                output.backward()
            else:
                torch.autograd.backward(output, grad)
        return None if first else stage_input.grad

    if cfg.pp == 1:
        for m in range(cfg.microbatches):
            backward(m, *forward(m, None), None)
        return

    recv_forward = None if first else (shape, dtype, groups.pp_prev)
    recv_backward = None if last else (shape, dtype, groups.pp_next)
    total = cfg.microbatches
    warmup = min(cfg.pp - ctx.coords.pp - 1, total)
    in_flight = []
    for m in range(warmup):
        stage_input, output = forward(m, _p2p(recv=recv_forward))
        _p2p(send=None if last else (output, groups.pp_next))
        in_flight.append((m, stage_input, output))
    received = _p2p(recv=recv_forward) if warmup < total else None
    for m in range(warmup, total):
        stage_input, output = forward(m, received)
        in_flight.append((m, stage_input, output))
        grad = _p2p(send=None if last else (output, groups.pp_next), recv=recv_backward)
        oldest = in_flight.pop(0)
        input_grad = backward(*oldest, grad)
        more = m + 1 < total
        received = _p2p(send=None if first else (input_grad, groups.pp_prev),
                        recv=recv_forward if more else None)
    while in_flight:
        oldest = in_flight.pop(0)
        input_grad = backward(*oldest, _p2p(recv=recv_backward))
        _p2p(send=None if first else (input_grad, groups.pp_prev))


def interleaved_order(pp: int, vpp: int, microbatches: int, stage: int):
    """Megatron's interleaved 1F1B order for pipeline stage `stage`: a list of
    ("forward" | "backward", microbatch, chunk). Virtual step k runs chunk (k mod pp*vpp) // pp
    (reversed in backward) on microbatch (k // (pp*vpp)) * pp + k mod pp, so groups of `pp`
    microbatches go through one chunk before the next; (pp - stage - 1) * 2 + (vpp - 1) * pp
    warm-up forwards (all of them when microbatches == pp), then one forward one backward, then
    the remaining backwards."""
    if microbatches % pp:
        raise ValueError(f"the interleaved schedule needs microbatches ({microbatches}) divisible by pp ({pp})")
    group = pp * vpp
    total = microbatches * vpp

    def step(k: int, forward: bool):
        chunk = (k % group) // pp
        return ("forward" if forward else "backward", (k // group) * pp + k % pp,
                chunk if forward else vpp - 1 - chunk)

    warmup = total if microbatches == pp else min((pp - stage - 1) * 2 + (vpp - 1) * pp, total)
    order = [step(k, True) for k in range(warmup)]
    for k in range(total - warmup):
        order += [step(k + warmup, True), step(k, False)]
    order += [step(k, False) for k in range(total - warmup, total)]
    return order


def _tag(backward: bool, microbatch: int, virtual_stage: int) -> int:
    """The p2p tag of the activation (gradient) of `microbatch` entering (leaving backward)
    `virtual_stage`: every message of the schedule has its own, so arrival order never matters."""
    return (int(backward) * 4096 + microbatch) * 4096 + virtual_stage


def run_virtual_schedule(run: RunSpec, ctx: Context, chunks: List[GPTStage], tracer: Tracer,
                         gen: ConsistentGenerator) -> None:
    """Virtual pipeline (VPP), Megatron's interleaved 1F1B (`interleaved_order`): chunk v of
    stage p is virtual stage v*pp + p; activations go to the next virtual stage (stage p+1, or
    stage 0's next chunk after the last stage), gradients back. Sends are posted without
    waiting and each message has its own tag, so a stage blocks only on the receive the next
    step needs, which Megatron's order guarantees is on its way."""
    cfg, coords = ctx.config, ctx.coords
    scale = _loss_scale(run, ctx)
    dtype = ctx.options.compute_dtype
    shape = _p2p_shape(run, ctx)
    me = coords.__dict__
    prev_rank = cfg.rank(type(coords)(**{**me, "pp": (coords.pp - 1) % cfg.pp}))
    next_rank = cfg.rank(type(coords)(**{**me, "pp": (coords.pp + 1) % cfg.pp}))
    data = [_microbatch_data(run, ctx, gen, m) for m in range(cfg.microbatches)]
    sends = []

    def send(tensor: torch.Tensor, dst: int, tag: int) -> None:
        buffer = tensor.detach().float().contiguous()
        sends.append((buffer, dist.isend(buffer, dst, tag=tag)))

    def receive(src: int, tag: int) -> torch.Tensor:
        buffer = torch.empty(shape, dtype=torch.float32)
        dist.irecv(buffer, src, tag=tag).wait()
        return buffer.to(dtype)

    saved = {}
    for direction, m, c in interleaved_order(cfg.pp, cfg.vpp, cfg.microbatches, coords.pp):
        chunk = chunks[c]
        virtual_stage = c * cfg.pp + coords.pp
        if direction == "forward":
            tokens, positions, labels = data[m]
            stage_input = tokens if chunk.pre_process else \
                receive(prev_rank, _tag(False, m, virtual_stage)).requires_grad_(True)
            with tracer.microbatch(m):
                output = chunk(stage_input, positions, labels)
                if chunk.post_process:
                    output = output.sum() * scale
            if not chunk.post_process:
                send(output, next_rank, _tag(False, m, virtual_stage + 1))
            saved[(m, c)] = (stage_input, output)
        else:
            stage_input, output = saved.pop((m, c))
            with tracer.microbatch(m):
                if chunk.post_process:
                    output.backward()
                else:
                    torch.autograd.backward(output, receive(next_rank, _tag(True, m, virtual_stage)))
            if not chunk.pre_process:
                send(stage_input.grad, prev_rank, _tag(True, m, virtual_stage - 1))
    for _, request in sends:
        request.wait()


def _model_parallel_reduce(ctx: Context, name: str, param, grad: torch.Tensor) -> torch.Tensor:
    """The reductions a gradient (or a slice of one: every rank of each group holds the same
    slice) needs beyond DP x CP: sequence-parallel parameters over TP, the tied word embeddings
    over the first and last stage."""
    cfg = ctx.config
    layernorm = "layernorm" in name
    unsynced = (layernorm and ctx.bug("sp_layernorm_unsynced")) or (".router." in name and ctx.bug("sp_router_unsynced"))
    if ctx.sp and param.sequence_parallel and not unsynced:
        grad = all_reduce(grad, ctx.groups.tp)
    if layernorm and not ctx.sp and cfg.tp > 1 and cfg.cp > 1 and ctx.bug("tpcp_layernorm_scale"):
        # Table 1 bug 14: a sum over TP of gradients that TP ranks already hold in full.
        grad = all_reduce(grad, ctx.groups.tp)
    if cfg.pp > 1 and name == SHARED_EMBEDDING and not ctx.bug("untied_embedding"):
        grad = all_reduce(grad, ctx.groups.embedding)
    return grad


#: The word embeddings, tied with the LM head: held by the first and the last stage under PP.
SHARED_EMBEDDING = "embedding.word_embeddings.weight"


def finalize_gradients(ctx: Context, model: GPTStage) -> None:
    """Reduces gradients into `param.main_grad` (float32): the sum over DP x CP; sequence-parallel
    parameters also over TP; the tied word embeddings over the first and last stage."""
    for name, param in model.named_parameters():
        grad = param.grad.float() if param.grad is not None else torch.zeros(param.shape)
        param.main_grad = _model_parallel_reduce(ctx, name, param, all_reduce(grad, ctx.groups.dpcp))


class SGD:
    """SGD with momentum and weight decay, computed in float32 on every parameter."""

    def __init__(self, ctx: Context, params: List[torch.nn.Parameter], lr=0.1, momentum=0.9, weight_decay=0.01):
        self.ctx, self.params = ctx, params
        self.lr, self.momentum, self.weight_decay = lr, momentum, weight_decay
        self.state: dict = {}

    def update(self, key, master: torch.Tensor, grad: torch.Tensor) -> None:
        """One step of `master` (float32, in place) with gradient `grad`; momentum kept by `key`."""
        step = grad + self.weight_decay * master
        buffer = self.state.get(key)
        buffer = step.clone() if buffer is None else buffer.mul_(self.momentum).add_(step)
        self.state[key] = buffer
        master.sub_(self.lr * buffer)

    def reduce_gradients(self, chunks: List[GPTStage]) -> None:
        """`param.main_grad` of every parameter, reduced (`finalize_gradients`)."""
        for chunk in chunks:
            finalize_gradients(self.ctx, chunk)

    @torch.no_grad()
    def step(self) -> None:
        """One optimizer step on every parameter."""
        for index, param in enumerate(self.params):
            # The float32 master copy is taken at the step, so it holds the parameters the
            # iteration used (perturbed ones in a perturbed run).
            master = param.detach().float().clone()
            self.update(index, master, param.main_grad)
            param.copy_(master.to(param.dtype))


@dataclass
class Bucket:
    """Parameters laid end to end in one flat buffer of `size` elements (padded to a multiple of
    dp), split evenly: dp rank d owns elements [d*size/dp, (d+1)*size/dp)."""

    names: List[str]
    params: List[torch.nn.Parameter]
    offsets: List[int]
    size: int

    def owned(self, dp: int, index: int) -> Tuple[int, int]:
        """The range of the buffer dp rank `index` of `dp` owns."""
        share = self.size // dp
        return index * share, (index + 1) * share


class ZeroSGD(SGD):
    """ZeRO-1 as Megatron's distributed optimizer: each bucket's gradients, flattened into one
    contiguous buffer, are reduce-scattered over DP (all-reduced over CP first), so dp rank d
    holds the reduced gradients of its contiguous range only, which crosses parameter
    boundaries; it keeps the float32 master weights and momentum of that range, updates them,
    and the ranks all-gather the updated ranges into every parameter. The shared word embedding
    is a bucket of its own under PP (as in Megatron), so the first and last stage split it alike
    and its slices are all-reduced between them. Each parameter's `main_grad` is its slice of
    the owned range, with `main_grad_range` saying which flat elements of the parameter it holds
    (absent where the rank owns none of it)."""

    def __init__(self, ctx: Context, named: List[Tuple[str, torch.nn.Parameter]], **kwargs):
        super().__init__(ctx, [p for _, p in named], **kwargs)
        dp = ctx.groups.dp.size
        shared = [(n, p) for n, p in named if n == SHARED_EMBEDDING and ctx.config.pp > 1]
        rest = [(n, p) for n, p in named if not (n == SHARED_EMBEDDING and ctx.config.pp > 1)]
        self.buckets = [self._bucket(group, dp) for group in (shared, rest) if group]

    @staticmethod
    def _bucket(named, dp: int) -> Bucket:
        offsets, total = [], 0
        for _, param in named:
            offsets.append(total)
            total += param.numel()
        return Bucket([n for n, _ in named], [p for _, p in named], offsets, -(-total // dp) * dp)

    def _slices(self, bucket: Bucket):
        """(name, param, parameter's flat range, owned buffer's range) of each parameter the
        owned range meets."""
        lo, hi = bucket.owned(self.ctx.groups.dp.size, self.ctx.groups.dp.index)
        for name, param, offset in zip(bucket.names, bucket.params, bucket.offsets):
            a, b = max(lo, offset), min(hi, offset + param.numel())
            if a < b:
                yield name, param, (a - offset, b - offset), (a - lo, b - lo)

    def reduce_gradients(self, chunks: List[GPTStage]) -> None:
        """Reduce-scatters each bucket over DP and applies the model-parallel reductions to the
        owned slices."""
        groups = self.ctx.groups
        self.shards = []
        for bucket in self.buckets:
            flat = torch.zeros(bucket.size)
            for param, offset in zip(bucket.params, bucket.offsets):
                if param.grad is not None:
                    flat[offset:offset + param.numel()] = param.grad.float().flatten()
            flat = all_reduce(flat, groups.cp)
            shard = reduce_scatter(flat, groups.dp, dim=0)
            for param in bucket.params:
                param.main_grad, param.main_grad_range = None, None
            for name, param, (a, b), (s, e) in self._slices(bucket):
                shard[s:e] = _model_parallel_reduce(self.ctx, name, param, shard[s:e])
                param.main_grad, param.main_grad_range = shard[s:e], (a, b)
            self.shards.append(shard)

    @torch.no_grad()
    def step(self) -> None:
        """Updates the owned ranges and all-gathers them into every parameter."""
        dp = self.ctx.groups.dp
        for index, (bucket, grad) in enumerate(zip(self.buckets, self.shards)):
            flat = torch.zeros(bucket.size)
            for param, offset in zip(bucket.params, bucket.offsets):
                flat[offset:offset + param.numel()] = param.detach().float().flatten()
            lo, hi = bucket.owned(dp.size, dp.index)
            master = flat[lo:hi].clone()
            self.update(index, master, grad)
            if self.ctx.bug("zero_no_update"):
                flat[lo:hi] = master  # Table 1 bug 9: the other ranks' ranges are never gathered
            else:
                flat = all_gather(master, dp, dim=0)
            for param, offset in zip(bucket.params, bucket.offsets):
                param.copy_(flat[offset:offset + param.numel()].view(param.shape).to(param.dtype))


def run_rank(run: RunSpec, job: TraceJob, rank: int) -> None:
    """One rank's traced iteration (the process group, if any, is initialized)."""
    torch.manual_seed(0)
    cfg = run.config
    groups = Groups.build(cfg, rank) if cfg.world_size > 1 else Groups()
    ctx = Context(cfg, rank, groups, run.options, run.spec)
    gen = ConsistentGenerator(run.seed)
    chunks = [GPTStage(ctx, v) for v in range(cfg.vpp)]
    for chunk in chunks:
        init_parameters(chunk, ctx, gen)
    annotations: Annotations = load_annotations(job.annotations)
    tracer = Tracer(chunks, annotations, cfg, rank, job.out, role=job.role, dtype=run.options.dtype,
                    iteration=run.iteration, rewrite=job.rewrite, generator=gen, perturbation=job.perturbation,
                    align_with=job.align_with, exact_replicas=replicas_bit_identical(cfg))
    named = [(name, p) for chunk in chunks for name, p in chunk.named_parameters()]
    optimizer = ZeroSGD(ctx, named) if run.options.zero else SGD(ctx, [p for _, p in named])
    with tracer.iteration():
        if cfg.vpp > 1:
            run_virtual_schedule(run, ctx, chunks, tracer, gen)
        else:
            run_schedule(run, ctx, chunks[0], tracer, gen)
        optimizer.reduce_gradients(chunks)
        tracer.before_step()
        optimizer.step()
        tracer.after_step()
    tracer.save()


def replicas_bit_identical(cfg: ParallelConfig) -> bool:
    """Whether every copy of a traced tensor on different ranks is provably bit-identical in a
    correct run of this program: each rank runs the same single-threaded CPU kernels, so copies
    computed from bit-identical inputs are bit-identical, and what crosses ranks is a copy (a
    gather, a send), a max (the fp8 amax), or a float32 sum. A sum over two ranks is the same
    on both (fl(a + b) = fl(b + a)); over three or more, each rank's bits depend on the order
    gloo adds in, which is gloo's choice, not this program's. So: every sum group of at most two
    ranks. The sums run over TP (row-parallel outputs, input gradients, SP layernorm and router
    gradients), over DP x CP (gradient reduction; ZeRO's CP then DP), and between the first and
    the last pipeline stage (the tied embedding: two ranks). Elsewhere the annotations' own
    `exact_replicas` (the amax) still holds and the tolerance judges the other copies."""
    return cfg.tp <= 2 and cfg.dp * cfg.cp <= 2


def free_port() -> int:
    """A TCP port free on this machine now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _worker(rank: int, run: RunSpec, job: TraceJob, port: int) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=run.config.world_size)
    try:
        run_rank(run, job, rank)
        dist.barrier()
    finally:
        dist.destroy_process_group()


def launch(run: RunSpec, job: TraceJob, timeout: float = 600.0) -> None:
    """Runs `run` traced by `job`: in this process for one rank, else one fresh Python process
    per rank (`python -m shardproof.trace.examples.runner`), all joined; a failing rank stops
    the others and raises `RuntimeError` with its error output."""
    if run.config.world_size == 1:
        run_rank(run, job, 0)
        return
    launch_processes("shardproof.trace.examples.runner", (run, job), run.config.world_size, timeout)


def launch_processes(module: str, payload, world_size: int, timeout: float = 600.0) -> None:
    """Starts `python -m MODULE PAYLOAD_PICKLE RANK PORT` for every rank and joins them; a failing
    rank stops the others and raises `RuntimeError` with its error output."""
    package_root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    env = dict(os.environ)
    env["PYTHONPATH"] = package_root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.setdefault("OMP_NUM_THREADS", "1")
    with tempfile.TemporaryDirectory(prefix="shardproof-run-") as tmp:
        spec_path = os.path.join(tmp, "run.pickle")
        with open(spec_path, "wb") as handle:
            pickle.dump(payload, handle)
        port = free_port()
        procs = []
        for rank in range(world_size):
            log = open(os.path.join(tmp, f"rank{rank}.log"), "w+b")
            procs.append((subprocess.Popen([sys.executable, "-m", module, spec_path,
                                            str(rank), str(port)], env=env, stdout=log, stderr=subprocess.STDOUT),
                          log))
        deadline = time.monotonic() + timeout
        failed = None
        while any(p.poll() is None for p, _ in procs) and failed is None:
            failed = next((r for r, (p, _) in enumerate(procs) if p.poll() not in (None, 0)), None)
            if time.monotonic() > deadline:
                failed = -1
            time.sleep(0.02)
        if failed is None:
            failed = next((r for r, (p, _) in enumerate(procs) if p.returncode != 0), None)
        if failed is not None:
            for p, _ in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait()
            if failed == -1:
                raise RuntimeError(f"the {world_size}-rank run did not finish in {timeout:.0f} s")
            log = procs[failed][1]
            log.seek(0)
            tail = log.read().decode("utf-8", "replace")[-4000:]
            raise RuntimeError(f"rank {failed} of the {world_size}-rank run failed:\n{tail}")
        for _, log in procs:
            log.close()


def parse_config(name: str, spec: ModelSpec, dtype: str, bugs=frozenset()) -> RunSpec:
    """A run from a configuration name: dash-separated tokens tpN, dpN, ppN, cpN, vppN, mbN
    (microbatches per dp rank), sp, zero, recompute, moe. E.g. `tp2-sp-dp2-zero`."""
    sizes = {"tp": 1, "dp": 1, "pp": 1, "cp": 1, "vpp": 1, "mb": 1}
    flags = {"sp": False, "zero": False, "recompute": False, "moe": False}
    for token in name.split("-"):
        match = re.fullmatch(r"(tp|dp|pp|cp|vpp|mb)(\d+)", token)
        if match:
            sizes[match.group(1)] = int(match.group(2))
        elif token in flags:
            flags[token] = True
        else:
            raise ValueError(f"unknown configuration token `{token}` in `{name}`; expected tpN, dpN, ppN, cpN, vppN, mbN, "
                             "sp, zero, recompute or moe")
    config = ParallelConfig(tp=sizes["tp"], dp=sizes["dp"], pp=sizes["pp"], cp=sizes["cp"], vpp=sizes["vpp"], sp=flags["sp"],
                            num_layers=spec.layers, microbatches=sizes["mb"])
    if config.vpp > 1 and config.pp == 1:
        raise ValueError(f"`{name}`: vpp needs pp > 1")
    if config.vpp > 1 and config.microbatches % config.pp:
        raise ValueError(f"`{name}`: the interleaved schedule needs mbN with N a multiple of pp={config.pp}")
    if spec.layers % (config.pp * config.vpp):
        raise ValueError(f"`{name}`: {spec.layers} layers do not divide over pp x vpp = {config.pp * config.vpp}")
    options = RunOptions(dtype=dtype, recompute=flags["recompute"], zero=flags["zero"], moe=flags["moe"],
                         bugs=frozenset(bugs))
    return RunSpec(config=config, options=options, spec=spec)


__all__ = ["ANNOTATIONS", "RunSpec", "interleaved_order", "TraceJob", "launch", "launch_processes", "parse_config", "run_rank"]


if __name__ == "__main__":
    # One rank of a multi-process run started by `launch`: SPEC_PICKLE RANK PORT.
    with open(sys.argv[1], "rb") as spec_file:
        run_spec, trace_job = pickle.load(spec_file)
    _worker(int(sys.argv[2]), run_spec, trace_job, int(sys.argv[3]))
