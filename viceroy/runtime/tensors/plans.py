"""Plans: what a torch op makes, learnt once by running it on meta tensors, and the cache key
that finds the plan again for the next op of the same kind on inputs of the same shapes.

The engine looks a plan up (or makes one) for every op it cannot take the short road for;
the short road itself (`mesh_tensor.torch_function`) reads the plan's `kind`, `meta`, `sig`,
`index` and `slots`.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.utils import _pytree as pytree

from viceroy.runtime.tensors.mesh_tensor import (
    ANSWER,
    GENERAL,
    INPLACE,
    KEYABLE,
    NEW,
    VALUE,
    MeshTensor,
    sig_of,
)


class Plan:
    """What an op makes, from its meta run. `kind`: NEW, INPLACE, VALUE, ANSWER or GENERAL (see
    mesh_tensor). `outputs`, per output leaf: ("value", v) | ("input", index of the input leaf
    it returns) | ("new", (meta, sig)). For the short road (`mesh_tensor.torch_function`): `meta`, `sig`
    of the one new tensor, `index` of the input returned, `slots` (the positions of MeshTensors
    among the arguments); `answer`: what ANSWER and VALUE return."""

    __slots__ = ("answer", "cacheable", "index", "kind", "meta", "outputs", "sig", "slots", "spec")

    def __init__(self, kind: int, outputs: tuple[tuple[str, Any], ...] = (), spec: Any = None,
                 answer: Any = None, slots: tuple[int, ...] = (), cacheable: bool = True) -> None:
        self.kind = kind
        self.outputs = outputs
        self.spec = spec
        self.answer = answer
        self.slots = slots
        self.cacheable = cacheable
        self.meta: Any = None
        self.sig = 0
        self.index = -1
        if kind is NEW:
            self.meta, self.sig = outputs[0][1]
        elif kind is INPLACE:
            self.index = outputs[0][1]


def make_plan(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], in_leaves: list[Any]) -> Plan:
    """Run `func` on the MeshTensors' meta tensors themselves (an in-place op changes the
    MeshTensor's shape here as it will on the ranks)."""
    with torch._C.DisableTorchFunctionSubclass():
        out = func(*args, **kwargs)
        # An op that changed an input's shape, stride or dtype (``unsqueeze_``, ``out=``) is
        # checked each time: only running it changes the MeshTensor's own meta tensor.
        changed = False
        for x in in_leaves:
            if isinstance(x, MeshTensor):
                sig = sig_of(tuple(x.shape), x.stride(), x.dtype)
                if sig != x._sig:
                    x._sig = sig
                    changed = True
    leaves, spec = pytree.tree_flatten(out)
    name = getattr(func, "__name__", "")
    if not any(isinstance(leaf, torch.Tensor) for leaf in leaves):
        if not (name.endswith("_") or name == "__setitem__"):
            return Plan(ANSWER, answer=out)
        kind = VALUE
    else:
        kind = GENERAL
    outputs: list[tuple[str, Any]] = []
    for leaf in leaves:
        if not isinstance(leaf, torch.Tensor):
            outputs.append(("value", leaf))
            continue
        same = next((i for i, x in enumerate(in_leaves) if x is leaf and isinstance(x, MeshTensor)), None)
        if same is not None:
            outputs.append(("input", same))
        else:
            shape, stride = tuple(leaf.shape), tuple(leaf.stride())
            meta = torch.empty_strided(shape, stride, dtype=leaf.dtype, device="meta")
            outputs.append(("new", (meta, sig_of(shape, stride, leaf.dtype))))
    if kind is GENERAL and not isinstance(out, CONTAINERS) and len(outputs) == 1:
        kind = NEW if outputs[0][0] == "new" else INPLACE
    slots = tuple(i for i, a in enumerate(args) if type(a) is MeshTensor)
    return Plan(kind, tuple(outputs), spec, answer=out if kind is VALUE else None, slots=slots,
                 cacheable=not changed)


CONTAINERS = (list, tuple, dict)
_TREE = object()  # starts the key of an op with nested arguments (never in a flat key)


def signature(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """A hashable key for an op with nested arguments and the shapes of its inputs; None when
    not cacheable. (Flat arguments get their key in mesh_tensor.torch_function.)"""
    parts: list[Any] = [func, _TREE]
    if not _encode(args, parts) or not _encode(kwargs, parts):
        return None
    return tuple(parts)


def _encode(x: Any, parts: list[Any]) -> bool:
    t = type(x)
    if t is MeshTensor:
        parts.append(x._sig)
    elif t in KEYABLE:
        parts.append(t)
        parts.append(x)
    elif t is slice:
        parts.append(slice)
        return _encode((x.start, x.stop, x.step), parts)
    elif isinstance(x, list | tuple):
        parts.append((t, len(x)))
        return all(_encode(y, parts) for y in x)
    elif t is dict:
        parts.append((dict, tuple(x)))
        return all(_encode(y, parts) for y in x.values())
    else:
        return False  # a local tensor's values may matter (indexing): check each time
    return True
