#!/usr/bin/env python3
"""Replays a `shardproof prove` counterexample in PyTorch.

Reads replay.json (the spec graph, the ranks' graphs, the communication schedule and the
output placement) and inputs.safetensors next to this file, evaluates every graph operator
with the matching torch.ops call, runs the collectives and send/recv as the schedule pairs
them, rebuilds the ranks' output by its placement and compares it with the spec's output.

Exit status: 1 when the outputs differ (the counterexample reproduces), 0 when they agree,
3 when the replay cannot run (torch missing, an operator without a PyTorch equivalent).
Floats are evaluated in float64: rounding is outside the prover's semantics.
"""
import json
import math
import pathlib
import sys

try:
    import torch
    from safetensors.torch import load_file
except ImportError as exc:  # pragma: no cover - depends on the environment
    print(f"replay.py needs torch and safetensors: {exc}")
    sys.exit(3)

HERE = pathlib.Path(__file__).resolve().parent
PLAN = json.loads((HERE / "replay.json").read_text())

DTYPES = {
    "f64": torch.float64, "f32": torch.float64, "bf16": torch.float64, "f16": torch.float64,
    "f8e4m3fn": torch.float64, "f8e5m2": torch.float64,
    "i64": torch.int64, "i32": torch.int32, "i16": torch.int16, "i8": torch.int8,
    "u8": torch.uint8, "b8": torch.bool,
}


class Unsupported(Exception):
    """An operator or argument the replay has no PyTorch equivalent for."""


def where(graph, node):
    line = node.get("line")
    return f"{graph.get('file') or graph['name']}:{line}" if line else graph["name"]


def decode(arg, env):
    if isinstance(arg, list):
        return [decode(a, env) for a in arg]
    if not isinstance(arg, dict):
        return arg
    if "value" in arg:
        return env[tuple(arg["value"])]
    if "float" in arg:
        return float(arg["float"])
    if "dtype" in arg:
        return DTYPES[arg["dtype"]]
    if "device" in arg:
        return torch.device("cpu")
    if "layout" in arg:
        return getattr(torch, arg["layout"])
    if "memory_format" in arg:
        return getattr(torch, arg["memory_format"])
    raise Unsupported(f"argument {arg}")


# A view of a tensor whose strides do not allow it is an error in eager PyTorch but a
# reshape in the graph's semantics (the capture's own strides are not replayed).
AS_RESHAPE = {("aten", "view"), ("aten", "_unsafe_view")}


def aten_call(graph, node, env):
    ns, name, overload = node["op"]
    if (ns, name) in AS_RESHAPE and overload in ("", "default"):
        ns, name, overload = "aten", "reshape", "default"
    try:
        packet = getattr(getattr(torch.ops, ns), name)
        fn = getattr(packet, overload or "default")
    except (AttributeError, RuntimeError) as exc:
        raise Unsupported(f"{where(graph, node)}: {ns}.{name}.{overload} has no torch.ops equivalent ({exc})")
    args = [decode(a, env) for a in node["args"]]
    kwargs = {k: decode(a, env) for k, a in node["kwargs"].items()}
    return fn(*args, **kwargs)


def store(node, index, result, env):
    outs = node["outputs"]
    if isinstance(result, (tuple, list)) and not (len(outs) == 1 and len(result) != 1):
        for i, r in enumerate(result):
            env[(index, i)] = r
    else:
        env[(index, 0)] = result


def reduce_all(op, xs):
    if op == "sum":
        return sum(xs[1:], xs[0].clone())
    if op == "avg":
        return sum(xs[1:], xs[0].clone()) / len(xs)
    if op == "product":
        out = xs[0].clone()
        for x in xs[1:]:
            out = out * x
        return out
    if op == "max":
        return torch.stack(xs).amax(0)
    if op == "min":
        return torch.stack(xs).amin(0)
    raise Unsupported(f"reduce op {op}")


def arg_of(node, env, pos, key):
    if key in node["kwargs"]:
        return decode(node["kwargs"][key], env)
    return decode(node["args"][pos], env)


class Ranks:
    """Every rank's graph, evaluated in program order up to where the schedule needs it."""

    def __init__(self, inputs):
        n = len(PLAN["rank_graph"])
        self.graphs = [PLAN["graphs"][g] for g in PLAN["rank_graph"]]
        self.env = [dict() for _ in range(n)]
        self.next = [0] * n
        self.inputs = inputs
        self.done = {}  # (rank, node) -> result of a collective already run
        self.collective = {}
        for m in PLAN["meetings"]:
            for member, (r, ni) in enumerate(m["calls"]):
                self.collective[(r, ni)] = m
        self.sends = {tuple(x["recv"]): tuple(x["send"]) for x in PLAN["messages"]}

    def advance(self, r, upto):
        graph = self.graphs[r]
        while self.next[r] < upto:
            i = self.next[r]
            node = graph["nodes"][i]
            env = self.env[r]
            if node["kind"] in ("input", "constant"):
                env[(i, 0)] = self.inputs[r][node["outputs"][0]]
            elif (r, i) in self.collective:
                if (r, i) not in self.done:
                    raise Unsupported(f"{where(graph, node)}: a collective reached out of the schedule's order")
                env[(i, 0)] = self.done[(r, i)]
            elif node["op"][0] == "_c10d_functional" and node["op"][1] == "wait_tensor":
                env[(i, 0)] = arg_of(node, env, 0, "tensor")
            elif node["op"][0] == "shardproof_p2p" and node["op"][1] == "send":
                env[(i, 0)] = arg_of(node, env, 0, "input")
            elif node["op"][0] == "shardproof_p2p" and node["op"][1] == "recv":
                sr, sn = self.sends[(r, i)]
                self.advance(sr, sn + 1)
                env[(i, 0)] = self.env[sr][(sn, 0)].clone()
            else:
                store(node, i, aten_call(graph, node, env), env)
            self.next[r] = i + 1

    def meet(self, m):
        xs = []
        for r, ni in m["calls"]:
            self.advance(r, ni)
            node = self.graphs[r]["nodes"][ni]
            xs.append((node, self.env[r]))
        op = m["op"]
        inputs = [arg_of(node, env, 0, "input") for node, env in xs]
        n = len(inputs)
        for member, (r, ni) in enumerate(m["calls"]):
            node, env = xs[member]
            if op == "all_reduce":
                out = reduce_all(arg_of(node, env, 1, "reduce_op"), inputs)
            elif op == "all_gather_into_tensor":
                out = torch.cat(inputs, 0)
            elif op == "reduce_scatter_tensor":
                out = reduce_all(arg_of(node, env, 1, "reduce_op"), inputs).chunk(n, 0)[member].clone()
            elif op == "broadcast":
                out = inputs[arg_of(node, env, 1, "src")].clone()
            else:
                raise Unsupported(f"{where(self.graphs[r], node)}: collective {op}")
            self.done[(r, ni)] = out

    def run(self):
        for m in PLAN["meetings"]:
            self.meet(m)
        for r, g in enumerate(self.graphs):
            self.advance(r, len(g["nodes"]))


def run_spec(inputs):
    graph, env = PLAN["spec"], {}
    for i, node in enumerate(graph["nodes"]):
        if node["kind"] in ("input", "constant"):
            env[(i, 0)] = inputs[node["outputs"][0]]
        else:
            store(node, i, aten_call(graph, node, env), env)
    return env


def typed(tensors, dtypes):
    return {n: tensors[n].to(DTYPES[d]) for n, d in dtypes.items()}


def combine(source, outs):
    if source is None:
        return math.nan
    if isinstance(source, list):
        r, i = source
        return float(outs[r][i])
    xs = [combine(s, outs) for s in source["of"]]
    op = source["reduce"]
    if op == "sum":
        return sum(xs)
    if op == "avg":
        return sum(xs) / len(xs)
    return max(xs) if op == "max" else min(xs)


def clearly_differ(a, b):
    if math.isnan(a) or math.isnan(b):
        return False
    if math.isinf(a) or math.isinf(b):
        return a != b and (math.isfinite(a) or math.isfinite(b))
    return abs(a - b) > 1e-6 * (1.0 + max(abs(a), abs(b)))


def main():
    torch.set_printoptions(precision=6, linewidth=120)
    stored = load_file(str(HERE / "inputs.safetensors"))
    spec_inputs = typed(stored, PLAN["spec_dtypes"])
    rank_inputs = [
        typed({n: stored[f"r{r}/{n}"] for n in d}, d) for r, d in enumerate(PLAN["rank_dtypes"])
    ]
    try:
        spec_env = run_spec(spec_inputs)
        ranks = Ranks(rank_inputs)
        ranks.run()
    except Unsupported as exc:
        print(f"replay: cannot replay in PyTorch: {exc}")
        return 3
    shape = PLAN["shape"]
    spec = spec_env[tuple(PLAN["spec_value"])].to(torch.float64).reshape(-1)
    outs = {}
    for r, v in PLAN["holders"]:
        outs[r] = ranks.env[r][tuple(v)].to(torch.float64).reshape(-1).tolist()
    rebuilt = torch.tensor([combine(s, outs) for s in PLAN["sources"]], dtype=torch.float64)
    name = PLAN["output"]
    print(f"output `{name}` {shape}, ranks' pieces rebuilt by placement {PLAN['layout']}")
    print(f"spec (PyTorch):\n{spec.reshape(shape)}")
    print(f"rebuilt from the ranks (PyTorch):\n{rebuilt.reshape(shape)}")
    held = ~torch.isnan(rebuilt)
    diff = (spec - rebuilt).abs()[held]
    print(f"max |spec - rebuilt| = {diff.max().item() if diff.numel() else 0.0:.6g}")
    differing = [i for i, (a, b) in enumerate(zip(spec.tolist(), rebuilt.tolist())) if clearly_differ(a, b)]
    if differing:
        first = differing[0]
        index = list(torch.unravel_index(torch.tensor(first), shape)) if shape else []
        print(
            f"differ: {len(differing)} of {spec.numel()} elements, first at "
            f"{[int(x) for x in index]}: spec {spec[first].item():.6g} vs rebuilt {rebuilt[first].item():.6g}"
        )
        return 1
    print("agree: the ranks' output equals the spec's in PyTorch (the counterexample does not reproduce)")
    return 0


if __name__ == "__main__":
    try:
        status = main()
    except Exception:  # an error is never reported as a difference (exit 1)
        import traceback

        traceback.print_exc()
        print("replay: the replay failed (see above); it shows nothing about the outputs")
        status = 3
    sys.exit(status)
