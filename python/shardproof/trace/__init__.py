"""`shardproof.trace`: TTrace-style trace collection for differential testing of distributed
PyTorch training against a single-device reference (seed 002, sections 3-5).

Typical use on every rank (see README.md)::

    from shardproof import trace
    tracer = trace.Tracer(model, "annotations.yaml", trace.ParallelConfig(tp=2, sp=True),
                          rank=dist.get_rank(), out="traces/cand", role="candidate", dtype="bfloat16")
    with tracer.iteration():
        for m, batch in enumerate(microbatches):
            with tracer.microbatch(m):
                model(batch).backward()
        reduce_gradients(); tracer.before_step(); optimizer.step(); tracer.after_step()
    tracer.save()

The traces are read by the Rust comparer, `shardproof trace compare REF CAND`.
"""

from .annotations import (AnnotationError, Annotations, ModuleAnnotation, ParamAnnotation, TensorSplit,
                          load_annotations, parse_annotations)
from .collector import Perturbation, Tracer, machine_epsilon, recomputing
from .generator import ConsistentGenerator, stable_seed
from .layout import (KINDS, CanonicalId, Coords, LayoutError, ParallelConfig, Piece, ShardMap, canonical_name,
                     extract_local, param_split, shard_map)
from .writer import FORMAT, PRODUCER, VERSION, storage_dtype

__all__ = [
    "AnnotationError", "Annotations", "CanonicalId", "ConsistentGenerator", "Coords", "FORMAT", "KINDS",
    "LayoutError", "ModuleAnnotation", "ParallelConfig", "ParamAnnotation", "Perturbation", "Piece", "PRODUCER",
    "ShardMap", "TensorSplit", "Tracer", "VERSION", "canonical_name", "extract_local", "load_annotations",
    "machine_epsilon", "param_split", "parse_annotations", "recomputing", "shard_map", "stable_seed",
    "storage_dtype",
]
