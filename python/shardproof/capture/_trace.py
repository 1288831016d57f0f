"""Tracing one program (the spec, or one rank) with make_fx into the fx text shardproof reads.

The traced function is a functional step over the module's state: every parameter and buffer
is a graph input named after its FQN, so the spec and every rank name the same tensor the same
way whatever order the tracer meets them in. Outputs are renamed too (`out`, `loss`,
`next_<param>`), and every node keeps the innermost frame of the user's own code as its
`# File:` comment, so reports point into the user's source rather than into torch.
"""

from __future__ import annotations

import keyword
import os
import re
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import torch
import torch.fx.traceback as fx_traceback
import torch.utils._pytree as pytree
from torch.fx.experimental.proxy_tensor import make_fx

from ._layout import CaptureError

_FRAME = re.compile(r'File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<func>[^\n]+)\n(?P<code>[^\n]*)')
_TORCH_DIR = os.path.dirname(os.path.abspath(torch.__file__)) + os.sep
_OWN_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep


def tensor_name(fqn: str, taken: set[str]) -> str:
    """A graph-value name for a parameter FQN or argument name (`layers.0.w` -> `layers_0_w`),
    unique among `taken` (which it joins)."""
    base = re.sub(r"\W", "_", fqn) or "t"
    if base[0].isdigit() or keyword.iskeyword(base):
        base = "p_" + base
    name, k = base, 1
    while name in taken:
        name, k = f"{base}_{k}", k + 1
    taken.add(name)
    return name


@dataclass
class Program:
    """What a traced step needs besides the module: its inputs in order, and how to finish."""

    state_fqns: list[str]  # parameters then buffers, by FQN
    state_names: list[str]  # their graph names
    trainable: list[bool]  # per state entry: updated by the training step
    data_names: list[str]  # the model's arguments
    loss_names: list[str]  # the loss function's extra arguments (training only)
    train: bool
    lr: float
    loss_fn: Callable[..., Any] | None
    output_names: list[str] = field(default_factory=list)  # filled by `trace`
    # What the framework's training loop does to the gradients between backward and the
    # optimizer (Megatron's `finalize_model_grads`): `(fqns, grads) -> grads`, per trainable
    # parameter in order; None leaves them as autograd returns them.
    grad_sync: Callable[[list[str], list[Any]], list[Any]] | None = None


def _user_frame(stack: str | None) -> str | None:
    """The innermost frame of a stack trace outside torch and this package, in the traceback
    form print_readable turns into `# File: PATH:LINE in FUNC, code: CODE`."""
    if not stack:
        return None
    best = None
    for m in _FRAME.finditer(stack):
        path = os.path.abspath(m.group("file"))
        if path.startswith(_TORCH_DIR) or path.startswith(_OWN_DIR) or m.group("file").startswith("<"):
            continue
        best = m
    if best is None:
        return None
    return f'  File "{best.group("file")}", line {best.group("line")}, in {best.group("func")}\n    {best.group("code").strip()}\n'


def _rename_outputs(gm: torch.fx.GraphModule, names: Sequence[str]) -> None:
    """Gives the graph's outputs the given names; an output that is an input, a repeat of
    another output, or a value also read elsewhere is first copied by `aten.clone`, so the
    renamed node is the output and nothing else."""
    graph = gm.graph
    out_node = next(n for n in graph.nodes if n.op == "output")
    flat = list(out_node.args[0]) if isinstance(out_node.args[0], (tuple, list)) else [out_node.args[0]]
    if len(flat) != len(names):
        raise CaptureError(f"the traced step returned {len(flat)} values, expected {len(names)}")
    by_name = {n.name: n for n in graph.nodes}
    # Free the wanted names first: an unrelated node called `loss` would otherwise collide.
    for name in names:
        if name in by_name and by_name[name].op != "placeholder":
            by_name[name]._rename(name + "_")
    seen: set[torch.fx.Node] = set()
    new_flat = []
    for node, name in zip(flat, names):
        if not isinstance(node, torch.fx.Node):
            raise CaptureError(f"output `{name}` is not a tensor computed by the step: {node!r}")
        if node.op == "placeholder" or node in seen or len(node.users) > 1:
            with graph.inserting_before(out_node):
                copy = graph.call_function(torch.ops.aten.clone.default, (node,))
            copy.meta = dict(node.meta)
            node = copy
        seen.add(node)
        node._rename(name)
        if node.name != name:
            raise CaptureError(f"cannot name output `{name}` (got `{node.name}`)")
        new_flat.append(node)
    out_node.args = (tuple(new_flat),)
    graph.lint()
    gm.recompile()


def _mark_backward(loss: torch.Tensor) -> None:
    """Registers hooks on the loss's autograd graph that tag the nodes its backward traces
    with the forward operator's sequence number (`autograd_backward`, `seq_nr`), as
    AOTAutograd does; without torch's helper the backward nodes stay unlocated."""
    try:
        from torch._functorch._aot_autograd.logging_utils import setup_stacktrace_preservation_hooks
    except ImportError:
        return
    grad_fn = getattr(loss, "grad_fn", None)
    if grad_fn is not None:
        setup_stacktrace_preservation_hooks([grad_fn])


def _locate(gm: torch.fx.GraphModule, by_sequence: bool) -> None:
    """Keeps in each node's `stack_trace` only its innermost frame of the user's code. With
    `by_sequence`, a backward node without one is located at the user's line of the forward
    operator it differentiates (the same autograd sequence number)."""
    forward_frames: dict[int, str] = {}
    for node in gm.graph.nodes:
        frame = _user_frame(node.meta.get("stack_trace"))
        seq = node.meta.get("seq_nr")
        if node.meta.get("autograd_backward"):
            if by_sequence and frame is None and isinstance(seq, int):
                frame = forward_frames.get(seq)
        elif frame is not None and isinstance(seq, int):
            forward_frames.setdefault(seq, frame)
        if frame is None:
            node.meta.pop("stack_trace", None)
        else:
            node.meta["stack_trace"] = frame


def _functionalized(gm: torch.fx.GraphModule, example: Sequence[torch.Tensor]) -> torch.fx.GraphModule:
    """The captured graph re-traced under `torch.func.functionalize`: every in-place update
    (Megatron's collectives write their results back with `copy_`, its cross-entropy updates
    its logits in place) becomes a new value that later reads see, by PyTorch's own alias
    tracking. The graph holds only ATen and functional-collective calls by now, which
    functionalization accepts (the module's autograd.Functions, which it refuses, were traced
    through). Replayed node by node with node meta preserved, so frames and sequence numbers
    carry over to the new nodes."""

    def replay(*args: torch.Tensor) -> Any:
        return torch.fx.Interpreter(gm).run(*args)

    with fx_traceback.preserve_node_meta():
        out = make_fx(torch.func.functionalize(replay, remove="mutations"))(*example)
    # Functionalization leaves unread aliases behind (`alias(all_reduce)` before its wait, which
    # the static check reads as a race); a functional graph's unread values are dead.
    out.graph.eliminate_dead_code()
    out.recompile()
    return out


def _out_to_in_place(gm: torch.fx.GraphModule) -> None:
    """`aten.exp.out(x, out=x)` (Megatron's vocab-parallel cross-entropy writes its exp into
    the logits) becomes `aten.exp_.default(x)`: the same function, writing into and returning
    the same tensor, in the in-place form the importer functionalizes. Only where `out` is the
    first argument itself and the in-place overload takes exactly the other arguments."""
    for node in gm.graph.nodes:
        target = node.target
        if node.op != "call_function" or not isinstance(target, torch._ops.OpOverload):
            continue
        if target._overloadname != "out" or not node.args or node.kwargs.get("out") is not node.args[0]:
            continue
        packet = getattr(torch.ops.aten, target._schema.name.split("::")[-1] + "_", None)
        if packet is None or not target._schema.name.startswith("aten::"):
            continue
        want = [a.name for a in target._schema.arguments if a.name != "out"]
        for overload in packet.overloads():
            op = getattr(packet, overload)
            if [a.name for a in op._schema.arguments] == want:
                node.target = op
                node.kwargs = {k: v for k, v in node.kwargs.items() if k != "out"}
                break
    gm.graph.lint()
    gm.recompile()


def trace(
    module: torch.nn.Module,
    prog: Program,
    state: Sequence[torch.Tensor],
    data: Sequence[torch.Tensor],
    loss_inputs: Sequence[torch.Tensor],
    wrap: Callable[[int, torch.Tensor], Any],
    finish: Callable[[str, Any], torch.Tensor],
    loss_ctx: Callable[[], Any] = nullcontext,
    functional: bool = False,
) -> torch.fx.GraphModule:
    """make_fx over the functional step; placeholders and outputs named as in `prog`.

    `wrap(i, local)` turns state entry i into what the module holds (a DTensor on a rank, the
    tensor itself in the spec); `finish(name, value)` turns a returned value into the local
    tensor the graph returns (and may record its layout). `functional` re-traces the captured
    graph under PyTorch's own functionalization (see `_functionalized`).
    """
    n_state, n_data = len(state), len(data)

    def step(*flat: torch.Tensor):
        local_state = flat[:n_state]
        args = flat[n_state : n_state + n_data]
        extra = flat[n_state + n_data :]
        held = {fqn: wrap(i, t) for i, (fqn, t) in enumerate(zip(prog.state_fqns, local_state))}
        out = torch.func.functional_call(module, held, tuple(args), strict=False, tie_weights=False)
        if not prog.train:
            leaves, _ = pytree.tree_flatten(out)
            names = prog.output_names or (["out"] if len(leaves) == 1 else [f"out_{i}" for i in range(len(leaves))])
            prog.output_names = names
            return tuple(finish(n, v) for n, v in zip(names, leaves))
        with loss_ctx():
            loss = prog.loss_fn(out, *extra) if prog.loss_fn is not None else out
            if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
                raise CaptureError("a training step needs a scalar loss: give loss_fn, or return the loss")
            _mark_backward(loss)
            leaves = [t for t, tr in zip(local_state, prog.trainable) if tr]
            grads = torch.autograd.grad(loss, leaves, allow_unused=True)
            if prog.grad_sync is not None:
                fqns = [f for f, tr in zip(prog.state_fqns, prog.trainable) if tr]
                grads = tuple(prog.grad_sync(fqns, list(grads)))
        nxt = []
        for t, g in zip(leaves, grads):
            # A parameter the loss does not read keeps its value (plain SGD with a zero grad).
            nxt.append(t.detach() * 1 if g is None else t - prog.lr * g)
        train_names = [n for n, tr in zip(prog.state_names, prog.trainable) if tr]
        prog.output_names = ["loss"] + [f"next_{n}" for n in train_names]
        return (finish("loss", loss),) + tuple(finish(f"next_{n}", v) for n, v in zip(train_names, nxt))

    state_in = [
        t.detach().clone().requires_grad_(prog.train and tr) for t, tr in zip(state, prog.trainable)
    ]
    try:
        # Node meta preserved: every node records its autograd sequence number, and backward
        # nodes the number of the forward operator they differentiate (see `_mark_backward`).
        with fx_traceback.preserve_node_meta():
            gm = make_fx(step, record_stack_traces=True)(*state_in, *data, *loss_inputs)
        if functional:
            _locate(gm, by_sequence=True)
            gm = _functionalized(gm, [*state_in, *data, *loss_inputs])
    except CaptureError:
        raise
    except Exception as e:  # the tracer's own errors carry the reason; keep it
        raise CaptureError(f"make_fx could not trace the step: {type(e).__name__}: {e}") from e

    names = list(prog.state_names) + list(prog.data_names) + list(prog.loss_names)
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    if len(placeholders) != len(names):
        raise CaptureError(f"the traced step has {len(placeholders)} inputs, expected {len(names)}")
    for node, name in zip(placeholders, names):
        node._rename(name)
        node.target = node.name
        if node.name != name:
            raise CaptureError(f"cannot name input `{name}` (got `{node.name}`)")
    # Functionalization's replay numbers the nodes' autograd sequence afresh, so backward
    # nodes are matched with their forward operators before it, and only keep their frames.
    _locate(gm, by_sequence=not functional)
    _out_to_in_place(gm)
    _rename_outputs(gm, prog.output_names)
    return gm


def graph_text(gm: torch.fx.GraphModule) -> str:
    """The readable fx text shardproof's importer reads, ending in a newline."""
    text = gm.print_readable(print_output=False)
    return text if text.endswith("\n") else text + "\n"


def collective_groups(gm: torch.fx.GraphModule) -> list[str]:
    """The process-group names the graph's functional collectives use, in first-use order."""
    out: list[str] = []
    for node in gm.graph.nodes:
        if node.op != "call_function" or not str(node.target).startswith("_c10d_functional"):
            continue
        group = node.kwargs.get("group_name")
        if group is None:
            strings = [a for a in node.args if isinstance(a, str)]
            group = strings[-1] if strings else None
        if group is not None and group not in out:
            out.append(group)
    return out
