"""Plans: what a torch op makes, learnt once by running it on meta tensors, and the cache key
that finds the plan again for the next op of the same kind on inputs of the same shapes.

The engine looks a plan up (or makes one) for every op it cannot take the short road for;
the short road itself (`mesh_tensor.torch_function`) reads the plan's `kind`, `meta`, `sig`,
`index` and `slots`.
"""

from __future__ import annotations

import contextlib
import os
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
    mutates,
    sig_of,
)
from viceroy.runtime.tensors.refusals import data_shaped, needs_data


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
    MeshTensor's shape here as it will on the ranks). Local tensors among the arguments travel
    with the op; here they stand in as meta tensors where torch wants every tensor on one
    device. An op that meta tensors cannot run (it needs the values) raises one clear error."""
    name = getattr(func, "__name__", "")
    in_place = mutates(name, kwargs)
    with torch._C.DisableTorchFunctionSubclass():
        grad = torch.is_grad_enabled()
        try:
            # In place: no autograd here, whose leaf checks do not know which MeshTensors are
            # leaves on the ranks (they check for themselves).
            with torch.no_grad() if in_place else contextlib.nullcontext():
                if name in _PROMOTING_IN_PLACE:
                    _check_cast(func, args)
                out = _run_meta(func, args, kwargs, in_leaves)
                _check_dtypes(func, args, kwargs, in_leaves)
        except (RuntimeError, NotImplementedError) as exc:
            raise as_the_users(_explained(name, args, exc)) from None
        except Exception as exc:  # (IndexError: ``t[9]``; TypeError, ValueError: bad arguments)
            raise as_the_users(exc)  # noqa: B904 (the same exception: its chain stays)
        # An op that changed an input's shape, stride or dtype (``unsqueeze_``, ``out=``) is
        # checked each time: only running it changes the MeshTensor's own meta tensor.
        changed = False
        if in_place and grad and any(isinstance(x, torch.Tensor) and x.requires_grad for x in in_leaves):
            target = kwargs.get("out", args[0] if args else None)
            if type(target) is MeshTensor and (target.is_floating_point() or target.is_complex()):
                target.requires_grad_(True)  # x.add_(w): x now requires grad, as on the ranks
        for x in in_leaves:
            if isinstance(x, MeshTensor):
                sig = sig_of(tuple(x.shape), x.stride(), x.dtype, x.requires_grad)
                if sig != x._sig:
                    x._sig = sig
                    changed = True
    leaves, spec = pytree.tree_flatten(out)
    if not any(isinstance(leaf, torch.Tensor) for leaf in leaves):
        # A question (``t.shape``, ``t.dtype``: a property's ``__get__``; ``t.dim()``) is
        # answered here; an op that changes its input (``add_``, ``t[i] = v``, ``t.data = x``:
        # ``__set__``) runs on the ranks too.
        if not (mutates(name, kwargs) or name == "__set__"):
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
            shape, stride, grad = tuple(leaf.shape), tuple(leaf.stride()), leaf.requires_grad
            meta = torch.empty_strided(shape, stride, dtype=leaf.dtype, device="meta", requires_grad=grad)
            outputs.append(("new", (meta, sig_of(shape, stride, leaf.dtype, grad))))
    if kind is GENERAL and not isinstance(out, CONTAINERS) and len(outputs) == 1:
        kind = NEW if outputs[0][0] == "new" else INPLACE
    slots = tuple(i for i, a in enumerate(args) if type(a) is MeshTensor)
    return Plan(kind, tuple(outputs), spec, answer=out if kind is VALUE else None, slots=slots,
                 cacheable=not changed)


def factory_meta(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> torch.Tensor:
    """What a factory (``torch.randn(2, 3)``) makes, on the meta device: its shape and dtype."""
    with torch._C.DisableTorchFunctionSubclass():
        try:
            return func(*args, **{**kwargs, "device": "meta"})
        except Exception as exc:
            if isinstance(exc, RuntimeError) and "Expected cond to be True" in str(exc):
                # The meta kernels of randn and normal word a bad size as this placeholder; the
                # CPU kernel refuses it as the user would read it without a mesh (at once: it is bad).
                try:
                    func(*args, **{**kwargs, "device": "cpu"})
                except RuntimeError as worded:
                    raise as_the_users(worded) from None
                raise
            raise as_the_users(exc)  # noqa: B904 (the same exception: its chain stays)


# In-place arithmetic whose result type must cast back to the target's dtype; torch's meta
# kernels skip that check for some of them (``long_t.mul_(2.5)`` passes on meta tensors).
_PROMOTING_IN_PLACE = frozenset({
    "add_", "sub_", "mul_", "div_", "true_divide_", "floor_divide_", "remainder_", "fmod_", "pow_",
    "__iadd__", "__isub__", "__imul__", "__itruediv__", "__ifloordiv__", "__imod__", "__ipow__",
})


def _check_cast(func: Any, args: tuple[Any, ...]) -> None:
    """Raise as torch does on real tensors when ``args[0] op= args[1]`` cannot keep args[0]'s
    dtype: the op runs on one-element CPU stand-ins of the same dtypes (a zero-dim operand stays
    zero-dim, as type promotion treats it apart), so torch itself judges and words it."""
    if len(args) < 2 or not isinstance(args[0], torch.Tensor):
        return
    other, ndim = args[1], 0
    if isinstance(other, torch.Tensor):
        other, ndim = torch.empty((1,) * other.dim(), dtype=other.dtype), other.dim()
    elif not isinstance(other, bool | int | float | complex):
        return  # the meta run judges anything else
    try:
        func(torch.empty((1,) * max(1, ndim), dtype=args[0].dtype), other)
    except RuntimeError as exc:
        if "can't be cast" in str(exc):
            raise


# What torch's real kernels say of inputs of dtypes that do not go together.
_DTYPE_WORDS = ("dtype", "scalar type", "should be the same", "must have the same")


def _check_dtypes(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], in_leaves: list[Any]) -> None:
    """Meta kernels skip some dtype checks the real kernels make (``f32 @ f64``, ``F.linear``
    with weights of another dtype, an int32 target for ``cross_entropy``): where the tensor
    inputs have more than one dtype, the op runs once more on CPU stand-ins (zeros, every dim at
    most 1), and a dtype error there is raised here, as torch words it, rather than on every
    rank. Any other error of the stand-ins (their shapes are not the real ones) is ignored, and
    so is "not implemented for" (a CPU kernel missing where the ranks' GPU has one)."""
    if len({x.dtype for x in in_leaves if isinstance(x, torch.Tensor)}) < 2 or "generator" in kwargs:
        return

    def stand_in(x: Any) -> Any:
        if not isinstance(x, torch.Tensor):
            return x
        return torch.zeros(tuple(min(d, 1) for d in x.shape), dtype=x.dtype)

    a, kw = pytree.tree_map(stand_in, (args, kwargs))
    try:
        with torch.random.fork_rng(devices=[]), torch.no_grad():  # (the controller's RNG stays as it was)
            func(*a, **kw)
    except Exception as exc:
        text = str(exc)
        if any(w in text for w in _DTYPE_WORDS) and "not implemented for" not in text:
            raise RuntimeError(text) from None


def _is_local(x: Any) -> bool:
    return isinstance(x, torch.Tensor) and type(x) is not MeshTensor and x.device.type != "meta"


def _as_meta(x: Any) -> Any:
    if not _is_local(x):
        return x
    return torch.empty_strided(tuple(x.shape), x.stride(), dtype=x.dtype, device="meta", requires_grad=x.requires_grad)


def _run_meta(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], in_leaves: list[Any]) -> Any:
    try:
        return func(*args, **kwargs)
    except RuntimeError as exc:
        if getattr(func, "__name__", "") in _INDEXING and len(args) > 1 and _NO_VALUES[1] in str(exc):
            # ``x[i]`` with a 0-d integer index tensor (``i = t.argmax()``) selects, as an int
            # does: torch reads its value, which a meta tensor has not; the shape does not depend
            # on it, so any valid int stands in for it here (the ranks use the real one).
            index = _ints_for_scalar_indices(args[1])
            if index is not args[1]:
                return _run_meta(func, (args[0], index, *args[2:]), kwargs, in_leaves)
        # A local tensor next to meta ones: ``t + torch.ones(3)``. (Indexing takes local index
        # tensors as they are, and a local mask's values give the result's shape: tried first.)
        if "device" not in str(exc) or not any(_is_local(x) for x in in_leaves):
            raise
    args, kwargs = pytree.tree_map(_as_meta, (args, kwargs))
    return func(*args, **kwargs)


_CALLS_INTO_TORCH = frozenset({_run_meta.__code__, _check_cast.__code__, _check_dtypes.__code__, factory_meta.__code__})
_NO_VALUES = ("no data", "item() cannot be called on meta", "cannot be called on meta tensors")
_INDEXING = {"__getitem__": "", "__setitem__": " = v"}  # (what ``t[index]`` is followed by)
_MASKS = (torch.bool, torch.uint8)  # index tensors torch takes as masks, 0-d ones too


def _is_scalar_index(x: Any) -> bool:
    """A 0-d integer tensor in an index: torch selects with its value, as with an int."""
    return isinstance(x, torch.Tensor) and x.dim() == 0 and not (
        x.dtype.is_floating_point or x.dtype.is_complex or x.dtype in _MASKS)


def _ints_for_scalar_indices(index: Any) -> Any:
    """`index` (``t[index]``) with each 0-d integer tensor in it (or in its top tuple) as the
    int 0, whose result has the same shape; `index` itself where it holds none."""
    if _is_scalar_index(index):
        return 0
    if type(index) is tuple and any(_is_scalar_index(x) for x in index):
        return tuple(0 if _is_scalar_index(x) else x for x in index)
    return index


def _index_what(name: str, index: Any) -> str:
    """How a failing ``t[index]`` (or ``t[index] = v``) is named: a mask only if it is one."""
    parts = index if isinstance(index, tuple | list) else (index,)
    mask = any(isinstance(x, torch.Tensor) and x.dtype in _MASKS for x in parts)
    return (f"indexing with a boolean mask (t[mask]{_INDEXING[name]})" if mask
            else f"indexing with tensors (t[index]{_INDEXING[name]})")


NOTHING_SENT = "(checked on the controller, on meta tensors: nothing was sent to the ranks)"
_TORCH_DIR = os.path.dirname(os.path.abspath(torch.__file__)) + os.sep


def as_the_users(exc: BaseException) -> BaseException:
    """torch refusing an op (a shape, dtype, index or argument it does not take, found while
    the op ran on meta tensors) as the user's error: raised from the engine without the frames of
    torch's checks below it, so that a kernel shows the user's line and torch's message, as for
    the same op on a local tensor (`viceroy.kernel.tracebacks.trim_refusals`), and saying that
    nothing reached the ranks. Raised anywhere else (in a function the user handed to torch, or
    by a bug of the engine), it keeps its whole traceback, to be debugged."""
    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    if tb is None:
        return exc  # one of ours, made just now: raised from the engine already
    code = tb.tb_frame.f_code
    # The innermost frame is torch's (its Python checks), or one of ours whose call into torch
    # raised from C (torch's C++ checks leave no frame of their own), or that raised torch's words
    # again (_check_dtypes).
    if not (code.co_filename.startswith(_TORCH_DIR) or code in _CALLS_INTO_TORCH):
        return exc
    if NOTHING_SENT not in getattr(exc, "__notes__", ()):
        exc.add_note(NOTHING_SENT)
    exc.__suppress_context__ = True  # what torch handled on its way to raising it is torch's
    return exc.with_traceback(None)


def _explained(name: str, args: tuple[Any, ...], exc: BaseException) -> BaseException:
    """A meta-tensor failure that is not the user's shape or dtype error, as one clear error
    naming the op; the user's own errors (shapes, dtypes) as they are."""
    text = str(exc)
    what = _index_what(name, args[1]) if name in _INDEXING and len(args) > 1 else f"{name}()"
    if any(s in text for s in _NO_VALUES):
        return RuntimeError(needs_data(what))
    lower = text.lower()
    if isinstance(exc, NotImplementedError) or "data-dependent" in lower or "meta tensor" in lower or \
            "meta kernel" in lower:
        return RuntimeError(data_shaped(what))
    return exc


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
