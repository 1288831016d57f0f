"""Canonical mapping (TTrace section 4.1): canonical ids, canonical module names and shard maps.

* A **canonical id** names one logical tensor in any run: iteration, global microbatch, kind,
  canonical module (or parameter) name, position.
* A **canonical name** removes wrapper prefixes (``module.``) and maps pipeline-stage-local layer
  indices (PP, virtual PP) back to global layers, and local expert indices back to global experts.
* A **shard map** lists the boxes of the local tensor and where each lies in the logical full
  tensor (half-open ``[start, end)`` per dimension). Context parallelism with load balancing gives
  a rank two non-contiguous sequence chunks, hence two pieces.
"""

from __future__ import annotations

import itertools
import re
from dataclasses import asdict, dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

from .annotations import ParamAnnotation, TensorSplit

#: Tensor kinds, in phase order (forward, backward, optimizer). `recompute_input` and
#: `recompute_output` are a module's inputs and outputs in an activation recomputation (during
#: backward): the comparer checks each against the same trace's forward_input / forward_output,
#: bit for bit, and never against the reference.
KINDS = ("forward_input", "forward_output", "grad_output", "grad_input", "param_grad", "recompute_input",
         "recompute_output", "main_grad", "param_before_step", "param_after_step")


class LayoutError(ValueError):
    """A tensor or name that does not fit the parallel configuration (e.g. a dimension that a
    parallelism cannot split evenly)."""


@dataclass(frozen=True)
class CanonicalId:
    """The canonical id of one logical tensor (trace format version 1, field `id`)."""

    iteration: int
    microbatch: int
    kind: str
    module: str
    index: int = 0

    def __post_init__(self):
        if self.kind not in KINDS:
            raise LayoutError(f"unknown tensor kind `{self.kind}`; expected one of {', '.join(KINDS)}")

    def __str__(self) -> str:
        return f"it{self.iteration}/mb{self.microbatch}/{self.kind}/{self.module}/{self.index}"

    def as_json(self) -> dict:
        """The `id` object of the index file."""
        return asdict(self)


@dataclass(frozen=True)
class Coords:
    """One rank's position on each parallel dimension."""

    pp: int = 0
    dp: int = 0
    cp: int = 0
    tp: int = 0
    ep: int = 0

    def as_json(self) -> dict:
        """The `coords` object of the index file."""
        return {"pp": self.pp, "dp": self.dp, "cp": self.cp, "tp": self.tp, "ep": self.ep}


@dataclass(frozen=True)
class ParallelConfig:
    """The parallel layout of a run. Ranks are ordered tp fastest, then cp, dp, pp (Megatron's
    default order); expert parallelism is carved out of the dp dimension (ep divides dp).

    `num_layers` (global transformer layers) is needed to map PP/VPP stage-local layer indices;
    `microbatches` is the number of microbatches per dp rank in one iteration; `num_experts` maps
    local expert indices under EP. `layer_offsets`, if given, overrides the even division: it maps
    (pp rank, virtual chunk) to the global index of that chunk's first layer."""

    tp: int = 1
    dp: int = 1
    pp: int = 1
    cp: int = 1
    ep: int = 1
    vpp: int = 1
    sp: bool = False
    num_layers: Optional[int] = None
    microbatches: int = 1
    num_experts: Optional[int] = None
    layer_offsets: Optional[Dict[Tuple[int, int], int]] = field(default=None, hash=False, compare=False)

    def __post_init__(self):
        for name in ("tp", "dp", "pp", "cp", "ep", "vpp", "microbatches"):
            if getattr(self, name) < 1:
                raise LayoutError(f"{name} must be at least 1, got {getattr(self, name)}")
        if self.dp % self.ep:
            raise LayoutError(f"ep={self.ep} must divide dp={self.dp} (experts are sharded over data-parallel ranks)")
        if self.sp and self.tp == 1:
            raise LayoutError("sequence parallelism needs tp > 1 (it splits over the tensor-parallel group)")

    @property
    def world_size(self) -> int:
        """Ranks in the run."""
        return self.tp * self.cp * self.dp * self.pp

    def coords(self, rank: int) -> Coords:
        """The coordinates of `rank`."""
        if not 0 <= rank < self.world_size:
            raise LayoutError(f"rank {rank} outside world size {self.world_size}")
        tp, rest = rank % self.tp, rank // self.tp
        cp, rest = rest % self.cp, rest // self.cp
        dp, pp = rest % self.dp, rest // self.dp
        return Coords(pp=pp, dp=dp, cp=cp, tp=tp, ep=dp % self.ep)

    def rank(self, coords: Coords) -> int:
        """The rank at `coords`."""
        return coords.tp + self.tp * (coords.cp + self.cp * (coords.dp + self.dp * coords.pp))

    def group(self, rank: int, dim: str) -> List[int]:
        """The ranks that differ from `rank` only along `dim` (tp, cp, dp or pp), in order."""
        c = self.coords(rank)
        size = getattr(self, dim)
        return [self.rank(Coords(**{**c.__dict__, dim: i})) for i in range(size)]

    def as_json(self) -> dict:
        """The `parallel` object of trace.json."""
        return {"tp": self.tp, "dp": self.dp, "pp": self.pp, "cp": self.cp, "ep": self.ep, "vpp": self.vpp,
                "sp": self.sp}

    # ---- PP / VPP layer mapping -------------------------------------------------------------

    def layer_offset(self, pp_rank: int, chunk: int = 0) -> int:
        """The global index of the first layer held by virtual chunk `chunk` of stage `pp_rank`.

        With even division, L layers over P stages and V virtual chunks give each chunk L/(P*V)
        layers, and chunk v of stage p starts at global layer (v*P + p) * L/(P*V) (Megatron's
        interleaved schedule)."""
        if self.layer_offsets is not None:
            try:
                return self.layer_offsets[(pp_rank, chunk)]
            except KeyError:
                raise LayoutError(f"layer_offsets has no entry for stage {pp_rank}, chunk {chunk}") from None
        if self.pp == 1 and self.vpp == 1:
            return 0
        if self.num_layers is None:
            raise LayoutError("num_layers is needed to map pipeline-stage-local layer indices")
        per_chunk, rem = divmod(self.num_layers, self.pp * self.vpp)
        if rem:
            raise LayoutError(f"{self.num_layers} layers do not divide evenly over pp={self.pp} x vpp={self.vpp}; "
                              "give layer_offsets")
        return (chunk * self.pp + pp_rank) * per_chunk

    def global_microbatch(self, dp_rank: int, local_microbatch: int) -> int:
        """dp rank d's local microbatch m of M is global microbatch d*M + m (the reference's
        gradient-accumulation order)."""
        if not 0 <= local_microbatch < self.microbatches:
            raise LayoutError(f"local microbatch {local_microbatch} outside 0..{self.microbatches - 1}")
        return dp_rank * self.microbatches + local_microbatch


# ---- canonical names ------------------------------------------------------------------------

#: Wrapper segments that frameworks insert into module paths (DDP, torch.compile, FSDP, checkpoint).
WRAPPER_SEGMENTS = ("module", "_orig_mod", "_fsdp_wrapped_module", "_checkpoint_wrapped_module")
_LAYER = re.compile(r"(^|\.)layers\.(\d+)(?=\.|$)")
_EXPERT = re.compile(r"(^|\.)experts\.(\d+)(?=\.|$)")


def canonical_name(local_name: str, config: ParallelConfig, coords: Coords, chunk: int = 0,
                   expert: bool = False) -> str:
    """Maps a module or parameter path of one rank to its canonical name: wrapper segments
    removed, the first `layers.N` shifted by the chunk's global layer offset, and (for expert
    modules under EP) `experts.N` shifted to the global expert index."""
    segments = [s for s in local_name.split(".") if s and s not in WRAPPER_SEGMENTS]
    name = ".".join(segments)
    offset = config.layer_offset(coords.pp, chunk)
    if offset:
        name = _LAYER.sub(lambda m: f"{m.group(1)}layers.{int(m.group(2)) + offset}", name, count=1)
    if expert and config.ep > 1:
        if config.num_experts is None or config.num_experts % config.ep:
            raise LayoutError(f"num_experts must be set and divisible by ep={config.ep} to map expert indices")
        local = config.num_experts // config.ep
        name = _EXPERT.sub(lambda m: f"{m.group(1)}experts.{coords.ep * local + int(m.group(2))}", name, count=1)
    return name


# ---- shard maps -----------------------------------------------------------------------------

#: One segment of a dimension: (local start, full start, length).
Segment = Tuple[int, int, int]


@dataclass(frozen=True)
class Piece:
    """A box of the local tensor and where it lies in the full tensor. A flat piece (`flat`
    set) instead takes the local tensor's row-major elements `flat[0]:flat[1]` and fills the
    full box with them in row-major order (a ZeRO shard of a contiguous buffer); its `local`
    is then the whole box of the full box's extents."""

    local: Tuple[Tuple[int, int], ...]
    full: Tuple[Tuple[int, int], ...]
    flat: Optional[Tuple[int, int]] = None

    def as_json(self) -> dict:
        """The piece object of the index file."""
        if self.flat is not None:
            return {"local_flat": list(self.flat), "full": [list(r) for r in self.full]}
        return {"local": [list(r) for r in self.local], "full": [list(r) for r in self.full]}


@dataclass(frozen=True)
class ShardMap:
    """The shard map of one local tensor."""

    full_shape: Tuple[int, ...]
    local_shape: Tuple[int, ...]
    pieces: Tuple[Piece, ...]


def _norm_dim(dim: Optional[int], rank_: int, what: str) -> Optional[int]:
    if dim is None:
        return None
    if not -rank_ <= dim < rank_:
        raise LayoutError(f"{what}={dim} is outside a tensor of {rank_} dimensions")
    return dim % rank_


def _splits_per_dim(ndim: int, split: TensorSplit, config: ParallelConfig, coords: Coords):
    """Per dimension, the ordered list of splits applied to it: ('cp', cp, rank) first (the data
    loader's striped chunks), then ('tp', tp, rank) for SP or TP (contiguous)."""
    per_dim: Dict[int, list] = {}
    cp_dim = _norm_dim(split.cp_dim, ndim, "cp_dim")
    sp_dim = _norm_dim(split.sp_dim, ndim, "sp_dim")
    tp_dim = _norm_dim(split.tp_dim, ndim, "tp_dim")
    if config.sp and config.tp > 1 and sp_dim is not None and tp_dim is not None:
        # Both would split over the one tensor-parallel group: each rank would hold a diagonal
        # block, which no Megatron tensor does (a tensor is sequence- or hidden-split).
        raise LayoutError("sp_dim and tp_dim both given under sequence parallelism; both split over the "
                          "tensor-parallel group, so a tensor has only one of them")
    if config.cp > 1 and cp_dim is not None:
        per_dim.setdefault(cp_dim, []).append(("cp", config.cp, coords.cp))
    if config.tp > 1 and config.sp and sp_dim is not None:
        per_dim.setdefault(sp_dim, []).append(("tp", config.tp, coords.tp))
    if config.tp > 1 and tp_dim is not None:
        per_dim.setdefault(tp_dim, []).append(("tp", config.tp, coords.tp))
    return per_dim


def _dim_factor(splits) -> int:
    factor = 1
    for _, size, _ in splits:
        factor *= size  # CP: 2*cp chunks, two per rank
    return factor


def _apply(segments: List[Segment], kind: str, size: int, index: int, what: str) -> List[Segment]:
    length = sum(n for _, _, n in segments)
    if kind == "cp":
        if length % (2 * size):
            raise LayoutError(f"{what}: length {length} does not split into 2*cp={2 * size} load-balanced chunks")
        chunk = length // (2 * size)
        wanted = [(index * chunk, chunk), ((2 * size - 1 - index) * chunk, chunk)]
    else:
        if length % size:
            raise LayoutError(f"{what}: length {length} does not split evenly over {size} ranks")
        part = length // size
        wanted = [(index * part, part)]
    # `wanted` ranges are positions in the current local coordinates; intersect with segments.
    out: List[Segment] = []
    local_cursor = 0
    for start, n in wanted:
        end = start + n
        for seg_local, seg_full, seg_n in segments:
            lo, hi = max(start, seg_local), min(end, seg_local + seg_n)
            if lo < hi:
                out.append((local_cursor + lo - start, seg_full + lo - seg_local, hi - lo))
        local_cursor += n
    return out


def shard_map(split: Optional[TensorSplit], config: ParallelConfig, coords: Coords, *,
              local_shape: Optional[Sequence[int]] = None, full_shape: Optional[Sequence[int]] = None,
              what: str = "tensor") -> ShardMap:
    """The shard map of a tensor split as `split` on the rank at `coords`; give the local shape
    (collector) or the full shape (generator). None as split: replicated, one full piece."""
    if (local_shape is None) == (full_shape is None):
        raise LayoutError("give exactly one of local_shape and full_shape")
    ndim = len(local_shape if local_shape is not None else full_shape)
    per_dim = _splits_per_dim(ndim, split or TensorSplit(), config, coords)
    if full_shape is None:
        full_shape = tuple(int(n) * _dim_factor(per_dim.get(d, [])) for d, n in enumerate(local_shape))
    full_shape = tuple(int(n) for n in full_shape)
    dims: List[List[Segment]] = []
    for d, n in enumerate(full_shape):
        segments: List[Segment] = [(0, 0, n)]
        for kind, size, index in per_dim.get(d, []):
            segments = _apply(segments, kind, size, index, f"{what} dim {d}")
        dims.append(segments)
    derived_local = tuple(sum(n for _, _, n in segs) for segs in dims)
    if local_shape is not None and tuple(local_shape) != derived_local:
        raise LayoutError(f"{what}: local shape {tuple(local_shape)} does not fit full shape {full_shape}")
    pieces = []
    for combo in itertools.product(*dims):
        pieces.append(Piece(local=tuple((l, l + n) for l, _, n in combo),
                            full=tuple((f, f + n) for _, f, n in combo)))
    return ShardMap(full_shape=full_shape, local_shape=derived_local, pieces=tuple(pieces))


def mesh_shard_map(full_shape: Sequence[int], mesh_shape: Sequence[int], coordinate: Sequence[int],
                   shard_dims: Sequence[Optional[int]], what: str = "tensor") -> ShardMap:
    """The shard map of a DTensor's local tensor: `shard_dims[i]` is the tensor dimension mesh
    dimension `i` shards (`Shard(d)`), or None where it replicates. Mesh dimensions shard in
    order, each splitting the previous one's local range the way `torch.chunk` does (DTensor's
    rule: chunks of ceil(n / k), the last ones shorter or empty)."""
    full_shape = tuple(int(n) for n in full_shape)
    if not len(mesh_shape) == len(coordinate) == len(shard_dims):
        raise LayoutError(f"{what}: mesh shape, coordinate and placements differ in length")
    ranges = [(0, n) for n in full_shape]  # (full start, length) of the local range per dimension
    for mesh_dim, dim in enumerate(shard_dims):
        if dim is None:
            continue
        d = _norm_dim(dim, len(full_shape), f"{what}: Shard dim")
        start, length = ranges[d]
        chunks, index = int(mesh_shape[mesh_dim]), int(coordinate[mesh_dim])
        chunk = -(-length // chunks)
        offset = min(index * chunk, length)
        ranges[d] = (start + offset, max(0, min(chunk, length - offset)))
    local_shape = tuple(n for _, n in ranges)
    piece = Piece(local=tuple((0, n) for n in local_shape), full=tuple((a, a + n) for a, n in ranges))
    return ShardMap(full_shape=full_shape, local_shape=local_shape, pieces=(piece,))


def flat_boxes(shape: Sequence[int], start: int, end: int) -> List[Tuple[Tuple[int, int], ...]]:
    """The boxes, in row-major order, whose elements are exactly the row-major elements
    `start:end` of a tensor of `shape`: a partial leading row, whole rows, a partial trailing
    row, recursively. Each box is itself contiguous in row-major order."""
    if start >= end:
        return []
    if not shape:
        return [()]
    inner = 1
    for n in shape[1:]:
        inner *= int(n)
    first, first_col = divmod(start, inner)
    last, last_col = divmod(end, inner)
    if first == last:
        return [((first, first + 1),) + box for box in flat_boxes(shape[1:], first_col, last_col)]
    boxes = []
    if first_col:
        boxes += [((first, first + 1),) + box for box in flat_boxes(shape[1:], first_col, inner)]
        first += 1
    if last > first:
        boxes.append(((first, last),) + tuple((0, int(n)) for n in shape[1:]))
    if last_col:
        boxes += [((last, last + 1),) + box for box in flat_boxes(shape[1:], 0, last_col)]
    return boxes


def flat_shard_map(smap: ShardMap, start: int, end: int, what: str = "tensor") -> ShardMap:
    """The shard map of a 1-D tensor holding row-major elements `start:end` of a local tensor
    whose shard map is `smap` (one piece covering the whole local tensor, as a parameter's)."""
    whole = tuple((0, n) for n in smap.local_shape)
    if len(smap.pieces) != 1 or smap.pieces[0].local != whole:
        raise LayoutError(f"{what}: a flat range needs a local tensor that is one box of the full tensor")
    total = 1
    for n in smap.local_shape:
        total *= n
    if not 0 <= start <= end <= total:
        raise LayoutError(f"{what}: flat range [{start}, {end}) outside the local tensor's {total} elements")
    origin = [a for a, _ in smap.pieces[0].full]
    pieces, cursor = [], 0
    for box in flat_boxes(smap.local_shape, start, end):
        count = 1
        for a, b in box:
            count *= b - a
        full = tuple((a + o, b + o) for (a, b), o in zip(box, origin))
        pieces.append(Piece(local=tuple((0, b - a) for a, b in box), full=full, flat=(cursor, cursor + count)))
        cursor += count
    return ShardMap(full_shape=smap.full_shape, local_shape=(end - start,), pieces=tuple(pieces))


def param_split(annotation: Optional[ParamAnnotation]) -> Optional[TensorSplit]:
    """The split of a parameter: its tp_dim (parameters are never split by SP or CP)."""
    if annotation is None or annotation.tp_dim is None:
        return None
    return TensorSplit(tp_dim=annotation.tp_dim)


def extract_local(full, smap: ShardMap):
    """The local shard of `full` (a torch tensor of the full shape) under `smap`."""
    local = full.new_empty(smap.local_shape)
    for piece in smap.pieces:
        part = full[tuple(slice(a, b) for a, b in piece.full)]
        if piece.flat is not None:
            local.view(-1)[piece.flat[0]:piece.flat[1]] = part.reshape(-1)
        else:
            local[tuple(slice(a, b) for a, b in piece.local)] = part
    return local
