"""The user's annotation file (TTrace Figure 3): which tensors to trace and how they are split.

Two layouts are accepted. The flat one of the paper mixes parameter and module annotations at the
top level and tells them apart by their keys::

    word_embeddings.weight:       # a parameter: tp_dim
      tp_dim: 0
    linear_qkv:                   # a module: input / output / ep
      input:  {sp_dim: 0, cp_dim: 0}
      output: {tp_dim: -1, cp_dim: 0}

The structured one puts them under ``parameters:`` and ``modules:``. A key matches every
canonical name equal to it or ending in ``.KEY`` (``*`` and ``?`` glob within one dotted
segment); the longest matching key
wins. Errors name the file, line and column, what was expected, and a hint.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple, Union

import yaml

#: Parallelisms a parameter's per-microbatch gradient may be a partial sum over.
PARTIAL_GRAD_KINDS = ("sp", "pp", "cp", "tp")
#: Keys of one tensor's split annotation.
SPLIT_KEYS = ("sp_dim", "cp_dim", "tp_dim")
PARAM_KEYS = ("tp_dim", "ep", "partial_grad", "exact_replicas")
MODULE_KEYS = ("input", "output", "ep", "exact_replicas")


class AnnotationError(ValueError):
    """A malformed annotation file: the message names file:line:col, what was expected, a hint."""


@dataclass(frozen=True)
class TensorSplit:
    """How one activation is split: the dimension each parallelism splits (None: not split)."""

    sp_dim: Optional[int] = None
    cp_dim: Optional[int] = None
    tp_dim: Optional[int] = None


@dataclass(frozen=True)
class ParamAnnotation:
    """A parameter annotation: its TP split dimension, whether it is an expert parameter, and the
    parallelisms over which one rank's per-microbatch gradient is only a partial sum (reduced after
    backward, e.g. layernorm weights under SP, tied embeddings under PP). `exact_replicas`: the
    copies of its gradients and values on different ranks are bit-identical in a correct run
    (see `ModuleAnnotation`)."""

    tp_dim: Optional[int] = None
    ep: bool = False
    partial_grad: Tuple[str, ...] = ()
    exact_replicas: bool = False


@dataclass(frozen=True)
class ModuleAnnotation:
    """A module annotation: the splits of its traced inputs and outputs (None: not traced). A
    single split applies to every floating-point input (output); a list gives one per position.
    `exact_replicas` declares that in a correct run the copies of its traced tensors held by
    different ranks are bit-identical (computed by the same kernels from bit-identical inputs,
    or reduced by an order-independent operation such as a max): the comparer then reports any
    difference between them, not only one beyond the tolerance."""

    input: Optional[Union[TensorSplit, Tuple[TensorSplit, ...]]] = None
    output: Optional[Union[TensorSplit, Tuple[TensorSplit, ...]]] = None
    ep: bool = False
    exact_replicas: bool = False

    def input_split(self, index: int) -> Optional[TensorSplit]:
        """The split of input `index`, or None when that input is not traced."""
        return _split_at(self.input, index)

    def output_split(self, index: int) -> Optional[TensorSplit]:
        """The split of output `index`, or None when that output is not traced."""
        return _split_at(self.output, index)


def _split_at(spec, index: int) -> Optional[TensorSplit]:
    if spec is None:
        return None
    if isinstance(spec, TensorSplit):
        return spec
    return spec[index] if index < len(spec) else None


@dataclass
class Annotations:
    """All annotations of one model, looked up by canonical name."""

    parameters: Dict[str, ParamAnnotation] = field(default_factory=dict)
    modules: Dict[str, ModuleAnnotation] = field(default_factory=dict)
    source: str = "<annotations>"

    def param(self, canonical_name: str) -> Optional[ParamAnnotation]:
        """The annotation of a parameter, or None if no key matches it."""
        return _lookup(self.parameters, canonical_name)

    def module(self, canonical_name: str) -> Optional[ModuleAnnotation]:
        """The annotation of a module, or None if no key matches it (the module is not traced)."""
        return _lookup(self.modules, canonical_name)


def _glob_regex(key: str) -> "re.Pattern[str]":
    # `*` and `?` stay within one dotted segment, so `layers.*` names layers, not their children.
    body = "".join("[^.]*" if c == "*" else "[^.]" if c == "?" else re.escape(c) for c in key)
    return re.compile(rf"(?:.*\.)?{body}")


def _matches(key: str, name: str) -> bool:
    if "*" in key or "?" in key:
        return _glob_regex(key).fullmatch(name) is not None
    return name == key or name.endswith("." + key)


def _lookup(table: dict, name: str):
    best = None
    for key, value in table.items():
        if _matches(key, name) and (best is None or len(key) > len(best[0])):
            best = (key, value)
    return None if best is None else best[1]


# --------------------------------------------------------------------------------------------
# Parsing with positions: PyYAML's composer keeps each node's start mark.


def _where(source: str, node) -> str:
    mark = node.start_mark
    return f"{source}:{mark.line + 1}:{mark.column + 1}"


def _fail(source: str, node, what: str, hint: str) -> AnnotationError:
    return AnnotationError(f"{_where(source, node)}: {what} (hint: {hint})")


def _mapping(source: str, node, what: str, hint: str) -> List[Tuple[str, yaml.Node]]:
    if isinstance(node, yaml.ScalarNode) and node.tag == "tag:yaml.org,2002:null":
        return []
    if not isinstance(node, yaml.MappingNode):
        raise _fail(source, node, f"expected a mapping for {what}, found {_describe(node)}", hint)
    seen: Dict[str, yaml.Node] = {}
    items = []
    for key_node, value_node in node.value:
        if not isinstance(key_node, yaml.ScalarNode) or key_node.tag != "tag:yaml.org,2002:str":
            raise _fail(source, key_node, f"expected a name as key of {what}, found {_describe(key_node)}", hint)
        if key_node.value in seen:
            first = seen[key_node.value].start_mark.line + 1
            raise _fail(source, key_node, f"duplicate key `{key_node.value}` in {what} (first at line {first})",
                        "merge the two entries")
        seen[key_node.value] = key_node
        items.append((key_node.value, value_node))
    return items


def _describe(node) -> str:
    if isinstance(node, yaml.MappingNode):
        return "a mapping"
    if isinstance(node, yaml.SequenceNode):
        return "a list"
    return f"`{node.value}`" if node.value != "" else "nothing"


def _int(source: str, node, what: str) -> int:
    if isinstance(node, yaml.ScalarNode) and node.tag == "tag:yaml.org,2002:int":
        return int(node.value, 0)
    raise _fail(source, node, f"expected an integer dimension for {what}, found {_describe(node)}",
                "write a tensor dimension such as 0 or -1")


def _bool(source: str, node, what: str) -> bool:
    if isinstance(node, yaml.ScalarNode) and node.tag == "tag:yaml.org,2002:bool":
        return node.value.lower() in ("true", "yes", "on")
    raise _fail(source, node, f"expected true or false for {what}, found {_describe(node)}", "write true or false")


def _split(source: str, node, what: str) -> TensorSplit:
    values = {}
    for key, value in _mapping(source, node, what, "write e.g. {sp_dim: 0, tp_dim: -1}; {} means replicated"):
        if key not in SPLIT_KEYS:
            raise _fail(source, node, f"unknown key `{key}` in {what}; expected one of {', '.join(SPLIT_KEYS)}",
                        "a traced tensor names the dimension each parallelism splits")
        values[key] = _int(source, value, f"{what}.{key}")
    return TensorSplit(**values)


def _splits(source: str, node, what: str):
    if isinstance(node, yaml.SequenceNode):
        return tuple(_split(source, item, f"{what}[{i}]") for i, item in enumerate(node.value))
    return _split(source, node, what)


def _param(source: str, name: str, node) -> ParamAnnotation:
    values: dict = {}
    for key, value in _mapping(source, node, f"parameter `{name}`", "write e.g. {tp_dim: 0}"):
        if key == "tp_dim":
            values["tp_dim"] = _int(source, value, f"{name}.tp_dim")
        elif key in ("ep", "exact_replicas"):
            values[key] = _bool(source, value, f"{name}.{key}")
        elif key == "partial_grad":
            items = value.value if isinstance(value, yaml.SequenceNode) else [value]
            kinds = []
            for item in items:
                if not isinstance(item, yaml.ScalarNode) or item.value not in PARTIAL_GRAD_KINDS:
                    raise _fail(source, item, f"expected one of {', '.join(PARTIAL_GRAD_KINDS)} in {name}.partial_grad, "
                                f"found {_describe(item)}", "e.g. partial_grad: [sp] for a layernorm weight under SP")
                kinds.append(item.value)
            values["partial_grad"] = tuple(kinds)
        else:
            raise _fail(source, value, f"unknown key `{key}` in parameter `{name}`; expected one of {', '.join(PARAM_KEYS)}",
                        "module annotations use input/output instead")
    return ParamAnnotation(**values)


def _module(source: str, name: str, node) -> ModuleAnnotation:
    values: dict = {}
    for key, value in _mapping(source, node, f"module `{name}`", "write e.g. {input: {sp_dim: 0}, output: {tp_dim: -1}}"):
        if key in ("input", "output"):
            values[key] = _splits(source, value, f"{name}.{key}")
        elif key in ("ep", "exact_replicas"):
            values[key] = _bool(source, value, f"{name}.{key}")
        else:
            raise _fail(source, value, f"unknown key `{key}` in module `{name}`; expected one of {', '.join(MODULE_KEYS)}",
                        "parameter annotations (tp_dim) belong to names ending in .weight or .bias")
    return ModuleAnnotation(**values)


def _is_module_entry(node) -> Optional[bool]:
    """True for a module entry, False for a parameter entry, None when the keys do not say."""
    if not isinstance(node, yaml.MappingNode):
        return None
    keys = {k.value for k, _ in node.value if isinstance(k, yaml.ScalarNode)}
    if keys & {"input", "output"}:
        return True
    if keys & {"tp_dim", "partial_grad"}:
        return False
    return None


def parse_annotations(text: str, source: str = "<annotations>") -> Annotations:
    """Parses annotation text; `source` names it in error messages."""
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.MarkedYAMLError as err:
        mark = err.problem_mark or err.context_mark
        where = f"{source}:{mark.line + 1}:{mark.column + 1}" if mark else source
        raise AnnotationError(f"{where}: not valid YAML: {err.problem or err} "
                              "(hint: check the indentation and the colons)") from None
    result = Annotations(source=source)
    if root is None:
        return result
    top = _mapping(source, root, "the annotation file", "the file maps names to annotations")
    if top and {k for k, _ in top} <= {"parameters", "modules"}:
        for section, node in top:
            for name, value in _mapping(source, node, f"`{section}`", "map names to annotations"):
                if section == "parameters":
                    result.parameters[name] = _param(source, name, value)
                else:
                    result.modules[name] = _module(source, name, value)
        return result
    for name, value in top:
        kind = _is_module_entry(value)
        if kind is None:
            # Keys alone do not say (e.g. `ep: true` or an empty entry): the name does.
            kind = not (name.endswith(".weight") or name.endswith(".bias"))
        if kind:
            result.modules[name] = _module(source, name, value)
        else:
            result.parameters[name] = _param(source, name, value)
    return result


def load_annotations(path: str) -> Annotations:
    """Reads and parses an annotation file."""
    with open(path, encoding="utf-8") as handle:
        return parse_annotations(handle.read(), source=str(path))


def splits_as_dict(split: Optional[TensorSplit]) -> Optional[dict]:
    """A split as a plain dict (for messages and tests)."""
    return None if split is None else {k: getattr(split, k) for k in SPLIT_KEYS if getattr(split, k) is not None}


__all__: Sequence[str] = ["AnnotationError", "Annotations", "ModuleAnnotation", "ParamAnnotation", "TensorSplit",
                          "load_annotations", "parse_annotations"]
