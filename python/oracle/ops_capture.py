"""Captures every per-operator case: graph text, inputs and PyTorch's outputs, and a manifest."""

from __future__ import annotations

import os
import sys
import time
import traceback

import torch
from torch.fx.experimental.proxy_tensor import make_fx

from .common import Gen, dtype_name, flatten_outputs, graph_text, make_module, op_names, save_tensors, write_json, write_text
from .ops_cases import CASES, OpCase


def _placeholder_values(ep, args: tuple) -> list[torch.Tensor]:
    """The value of every placeholder of an exported graph, in order: user inputs, and the
    lifted parameters, buffers and tensor constants."""
    from torch.export.graph_signature import InputKind

    user = iter(args)
    values = []
    for spec in ep.graph_signature.input_specs:
        if spec.kind == InputKind.USER_INPUT:
            values.append(next(user))
        elif spec.kind == InputKind.CONSTANT_TENSOR:
            values.append(ep.constants[spec.target])
        else:
            values.append(ep.state_dict[spec.target])
    return values


def _trace(c: OpCase, names: list[str], args: tuple):
    """The graph module of a case, its placeholder values, the tracer, and whether
    decompositions were run."""
    if c.tracer == "make_fx":
        def forward(*a):
            return c.fn(*a)

        gm = make_fx(forward, tracing_mode="real")(*args)
        gm = torch.fx.GraphModule(gm, gm.graph, class_name="GraphModule")
        # make_fx names placeholders `x_1`; give them the case's names back.
        for n, name in zip([n for n in gm.graph.nodes if n.op == "placeholder"], names):
            n._rename(name)
            n.target = name
        gm.recompile()
        return gm, list(args), "make_fx(real)", False
    mod = make_module(c.fn, names)
    ep = torch.export.export(mod, args, strict=False)
    ops, _ = op_names(ep.graph_module)
    if not all(t in ops for t in c.targets):
        ep2 = ep.run_decompositions({})
        ops2, _ = op_names(ep2.graph_module)
        if all(t in ops2 for t in c.targets):
            return ep2.graph_module, _placeholder_values(ep2, args), "torch.export+run_decompositions({})", True
    return ep.graph_module, _placeholder_values(ep, args), "torch.export", False


def capture_case(c: OpCase, out_dir: str) -> dict:
    inputs = c.make_inputs(Gen(c.name))
    names = list(inputs)
    gm, args, tracer, decomposed = _trace(c, names, tuple(inputs[n] for n in names))
    placeholders = [n.name for n in gm.graph.nodes if n.op == "placeholder"]
    if len(placeholders) != len(args):
        raise RuntimeError(f"{c.name}: {len(placeholders)} placeholders for {len(args)} inputs")
    with torch.no_grad():
        outs = flatten_outputs(gm(*args))
    ops, other = op_names(gm)
    missing = [t for t in c.targets if t not in ops]
    text = graph_text(gm)
    write_text(os.path.join(out_dir, f"{c.name}.py"), text)
    tensors = {f"input.{p}": a for p, a in zip(placeholders, args)}
    tensors.update({f"output.{i}": o for i, o in enumerate(outs)})
    save_tensors(os.path.join(out_dir, f"{c.name}.safetensors"), tensors)
    entry = {
        "name": c.name,
        "graph": f"{c.name}.py",
        "tensors": f"{c.name}.safetensors",
        "targets": c.targets,
        "ops": ops,
        "targets_missing": missing,
        "other_calls": [o for o in other if not o.endswith("getitem")],
        "tracer": tracer,
        "decomposed": decomposed,
        "precision": c.precision,
        "strict": c.strict,
        "inputs": [{"name": p, "dtype": dtype_name(a.dtype), "shape": list(a.shape)} for p, a in zip(placeholders, args)],
        "outputs": [{"dtype": dtype_name(o.dtype), "shape": list(o.shape)} for o in outs],
    }
    if c.note:
        entry["note"] = c.note
    return entry


def capture_ops(out_root: str, only: str | None = None) -> dict:
    out_dir = os.path.join(out_root, "ops")
    os.makedirs(out_dir, exist_ok=True)
    cases, failures = [], []
    t0 = time.time()
    for c in CASES:
        if only and only not in c.name:
            continue
        try:
            cases.append(capture_case(c, out_dir))
        except Exception as e:  # keep going: the manifest lists what could not be captured
            failures.append({"name": c.name, "targets": c.targets, "error": f"{type(e).__name__}: {e}"[:2000]})
            print(f"capture: op case {c.name} FAILED: {type(e).__name__}: {str(e)[:300]}", file=sys.stderr)
            if os.environ.get("SHARDPROOF_ORACLE_DEBUG"):
                traceback.print_exc()
    targets = sorted({t for e in cases for t in e["targets"] if t not in e["targets_missing"]})
    all_ops = sorted({o for e in cases for o in e["ops"]})
    manifest = {
        "version": 1,
        "torch": torch.__version__,
        "cases": cases,
        "not_captured": failures,
        "targets_emitted": targets,
        "ops_emitted": all_ops,
    }
    write_json(os.path.join(out_dir, "manifest.json"), manifest)
    for e in cases:
        if e["targets_missing"]:
            print(f"capture: op case {e['name']}: torch emitted {e['ops']}, not {e['targets_missing']}", file=sys.stderr)
    print(f"capture: {len(cases)} op cases ({len(failures)} failed), {len(all_ops)} distinct ops, "
          f"{time.time() - t0:.1f}s", file=sys.stderr)
    return manifest
