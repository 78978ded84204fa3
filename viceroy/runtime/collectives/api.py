"""The collectives rank code calls: ``vr.all_reduce(t, op="sum", dims="gpus")`` and friends.

Every function runs over the whole mesh (``dims=None``) or over the named dims: the group is
the ranks that share this rank's coordinates on every other dim. The backend follows the
tensor: CPU torch tensors and numpy arrays go through gloo, CUDA torch tensors and CuPy arrays
through nccl (``VICEROY_BACKEND=gloo`` sends CUDA tensors through gloo instead).
"""

from __future__ import annotations

import operator
import os
from collections.abc import Callable
from typing import Any, TypeVar

from viceroy.runtime import call_peers
from viceroy.runtime.collectives import communicators
from viceroy.runtime.collectives.backend import (
    BACKEND_ENV,
    Backend,
    Communicator,
    Pending,
    check_op,
)
from viceroy.runtime.collectives.errors import BackendUnavailable
from viceroy.runtime.collectives.gloo import GlooBackend
from viceroy.runtime.collectives.groups import Dims, Group, group_for, pair_group
from viceroy.runtime.collectives.nccl import NcclBackend
from viceroy.runtime.context import context
from viceroy.runtime.shape import format_rank_set

T = TypeVar("T")

_gloo = GlooBackend()
_nccl = NcclBackend()


def all_reduce(t: T, op: str = "sum", dims: Dims = None) -> T:
    """Reduce `t` in place across the group; every member ends with the result.

    >>> t = torch.ones(4) * rank
    >>> vr.all_reduce(t, op="sum", dims="gpus")      # on gpus=4: tensor([6., 6., 6., 6.])

    op: "sum", "avg", "product", "min", "max", "band", "bor", "bxor". Returns `t`.
    """
    backend, x = _native(t, "all_reduce", writes=True)
    check_op(op, x.dtype, "all_reduce")
    _run(f"all_reduce({op!r})", backend, _group(dims), x, lambda c: c.all_reduce(x, op))
    return t


def all_gather(t: Any, dims: Dims = None) -> Any:
    """Every member's `t`, stacked in group order: a new tensor of shape ``(n, *t.shape)``.

    >>> vr.all_gather(torch.tensor([rank]))          # on gpus=4: tensor([[0], [1], [2], [3]])
    """
    backend, x = _native(t, "all_gather")
    group = _group(dims)
    out = _empty(x, (group.size, *x.shape))
    parts = [out[i] for i in range(group.size)]
    _run("all_gather", backend, group, x, lambda c: c.all_gather(parts, x), lambda: _copy(parts[0], x))
    return _like(t, out)


def reduce_scatter(t: Any, op: str = "sum", dims: Dims = None) -> Any:
    """Reduce `t` across the group and return this member's share: `t` is cut into n equal
    chunks along its first dim, and member i gets chunk i reduced.

    >>> vr.reduce_scatter(torch.arange(4.) + rank)   # on gpus=4, rank 1 gets tensor([10.])
    """
    backend, x = _native(t, "reduce_scatter")
    check_op(op, x.dtype, "reduce_scatter")
    group = _group(dims)
    n = group.size
    if not x.shape or x.shape[0] % n:
        raise ValueError(
            f"reduce_scatter over {group.label} cuts the first dim into {n} equal chunks; "
            f"got a tensor of shape {tuple(x.shape)}")
    k = x.shape[0] // n
    chunks = [x[i * k:(i + 1) * k] for i in range(n)]
    out = _empty(x, (k, *x.shape[1:]))
    _run(f"reduce_scatter({op!r})", backend, group, x, lambda c: c.reduce_scatter(out, chunks, op),
         lambda: _copy(out, x))
    return _like(t, out)


def broadcast(t: T, src: int = 0, dims: Dims = None) -> T:
    """Overwrite `t` on every member with member `src`'s `t` (in place; returns `t`).

    src is the position in the group: the global rank for the whole mesh, the coordinate
    along the dim for one dim (``broadcast(w, src=0, dims="gpus")``: from gpus=0).
    """
    src = _rank_arg(src, "src", "broadcast", "the sender's position in the group (src=0)")
    backend, x = _native(t, "broadcast", writes=True)
    group = _group(dims)
    if not 0 <= src < group.size:
        raise ValueError(f"broadcast: src={src} is not a position in {group.label}, of {group.size} members: src "
                         f"counts 0..{group.size - 1} along the group (the sender's position in it, its coordinate "
                         "along the dim for one dim)")
    _run("broadcast", backend, group, x, lambda c: c.broadcast(x, src), agree=f"broadcast(src={src})")
    return t


def send(t: Any, dst: int) -> None:
    """Send `t` to rank `dst` (a global rank), which receives it with ``recv(buf, src=...)``."""
    dst = _rank_arg(dst, "dst", "send", "the global rank to send to (dst=1)")
    backend, x = _native(t, "send")
    group = _pair(dst, "send")
    _run(f"send to rank {dst}", backend, group, x, lambda c: c.send(x, group.index(dst)), agree="send/recv")


def recv(t: T, src: int) -> T:
    """Receive into `t` (in place) what rank `src` sent with ``send``; returns `t`."""
    src = _rank_arg(src, "src", "recv", "the global rank to receive from (src=1)")
    backend, x = _native(t, "recv", writes=True)
    group = _pair(src, "recv")
    _run(f"recv from rank {src}", backend, group, x, lambda c: c.recv(x, group.index(src)), agree="send/recv")
    return t


def exchange(out: Any, to: int | None, into: Any, frm: int | None, group: Group, what: str = "exchange") -> None:
    """Send `out` to rank `to` while receiving into `into` from rank `frm` (global ranks; either
    pair may be None), over `group`, whose every member calls this at once. Both are in flight
    together, so a ring of exchanges (each rank sending to the next) cannot deadlock. The two
    tensors must be of one kind (both CPU, or both on the GPU)."""
    if out is None and into is None:
        raise ValueError(f"{what}: nothing to send or receive")
    backend, x = _native(out if out is not None else into, what, writes=out is None)
    sx = x if out is not None else None
    rx = x if out is None else (None if into is None else _native(into, what, writes=True)[1])
    to_i = None if to is None else group.index(to)
    frm_i = None if frm is None else group.index(frm)
    _run(what, backend, group, x, lambda c: c.exchange(sx, to_i, rx, frm_i), agree=None)


def barrier(dims: Dims = None) -> None:
    """Return once every member of the group has called it."""
    if _gloo.unavailable():
        raise BackendUnavailable(f"barrier: {_gloo.unavailable()}")
    _run("barrier", _gloo, _group(dims), None, lambda c: c.barrier())


# --- plumbing ------------------------------------------------------------------------------------


def _run(what: str, backend: Backend, group: Group, x: Any, start: Callable[[Communicator], Pending],
         alone: Callable[[], Any] | None = None, agree: str | None = "") -> None:
    """`agree`: what the members' calls must share besides `x`'s dtype and shape (default: `what`
    itself; "send/recv" for a pair; None: nothing, as in exchanges of pieces of any size)."""
    if group.size == 1:  # nothing to exchange; only the local effect
        if alone is not None:
            alone()
        return
    device = backend.device_of(x) if x is not None else None
    sig = None if agree is None else (agree or what) + ("" if x is None else f" {_describe(x)}")
    communicators.run(what, backend, group, device, start, sig, like=x)


def _describe(x: Any) -> str:
    """``float32[4, 3]``: a tensor's dtype and shape, as members compare them."""
    return f"{str(x.dtype).removeprefix('torch.')}{list(x.shape)}"


def _group(dims: Dims) -> Group:
    """`group_for`, after checking what `dims` is (a name, a list of names, None or a Group)."""
    if dims is None or type(dims) is str or isinstance(dims, Group):  # the common cases, first
        return group_for(dims)
    if not isinstance(dims, list | tuple) or not all(isinstance(d, str) for d in dims):
        raise TypeError(f"dims takes a dim name or a list of dim names (dims='gpus', dims=['dp', 'tp']), or None "
                        f"for the whole mesh; got {dims!r}. This rank's dims are {list(context().dims)}")
    return group_for(dims)


def _rank_arg(value: Any, name: str, what: str, means: str) -> int:
    """`value` as an int (a numpy or 0-d tensor integer too), refused before anything is sent
    when it is none (a str, a float, a bool)."""
    if not isinstance(value, bool) and hasattr(type(value), "__index__"):
        try:
            return operator.index(value)
        except TypeError:
            pass  # a tensor of more than one element, or of floats
    raise TypeError(f"{what}: {name} must be an int, {means}; got {value!r} ({type(value).__name__})")


def _pair(peer: int, what: str) -> Group:
    ctx = context()
    me = ctx.rank
    if peer == me:
        raise ValueError(f"{what}: rank {me} cannot talk to itself")
    if not 0 <= peer < ctx.world_size:
        raise ValueError(f"{what}: there is no rank {peer} (ranks 0..{ctx.world_size - 1})")
    # On a view only its ranks run this code; an actor's peer may be another actor mesh's.
    if ctx.ranks is not None and peer not in ctx.ranks and not call_peers.in_actor():
        raise ValueError(
            f"{what}: rank {peer} is not in this call, which runs on ranks {format_rank_set(ctx.ranks)} "
            f"(a view of the mesh), so it would wait for rank {peer} forever: {what} "
            f"{'to' if what == 'send' else 'from'} one of those ranks, or run the call on a view (or the "
            "mesh) that includes both")
    return pair_group(me, peer)


def _native(t: Any, what: str, writes: bool = False) -> tuple[Backend, Any]:
    """The backend for `t`, and `t` as that backend takes it (numpy arrays as torch views).
    `writes`: the result goes into `t` (a read-only numpy array is refused)."""
    kind = type(t).__module__.partition(".")[0]
    if kind == "torch" and t.device.type == "cpu":  # the common case, first
        if not t.is_contiguous():
            raise ValueError(_not_dense(t, what))
        if _gloo.unavailable():
            raise BackendUnavailable(f"{what}: {_gloo.unavailable()}")
        return _gloo, t
    if kind == "numpy":
        import numpy as np
        import torch

        if not isinstance(t, np.ndarray):  # a numpy scalar: nothing to reduce in place
            raise TypeError(f"{what} takes a torch tensor, a numpy array or a CuPy array; got a numpy "
                            f"{type(t).__name__}: pass np.array([x])")
        if writes and not t.flags.writeable:  # torch would write into it all the same
            raise ValueError(f"{what} writes its result into the array, and this one is read-only (a view of bytes, "
                             "or writeable=False): pass a writable copy (a.copy())")
        if not t.flags.c_contiguous:
            raise ValueError(f"{what} needs a contiguous array: pass np.ascontiguousarray(a) (and copy the result "
                             "back)")
        try:
            t = torch.from_numpy(t)
        except TypeError:
            raise TypeError(f"{what} takes numpy arrays of numbers or bools; this one's dtype is {t.dtype}: "
                            "convert it (a.astype(np.float32))") from None
        kind = "torch"
    if kind == "torch":
        if t.device.type == "meta":
            raise ValueError(f"{what} needs a tensor with data; this one is on the meta device (a shape and a "
                             "dtype only): make it on the CPU or the rank's GPU")
        if t.device.type == "cpu" or os.environ.get(BACKEND_ENV) == "gloo":
            backend: Backend = _gloo
        else:
            backend = _nccl
    elif kind == "cupy":
        backend = _nccl
    else:
        raise TypeError(f"{what} takes a torch tensor, a numpy array or a CuPy array; got {type(t).__name__}")
    why = backend.unavailable()
    if why:
        raise BackendUnavailable(f"{what}: {why}")
    contiguous = t.flags.c_contiguous if kind == "cupy" else t.is_contiguous()
    if not contiguous:
        raise ValueError(_not_dense(t, what))
    return backend, t


def _not_dense(t: Any, what: str) -> str:
    """Why `t` (not contiguous) cannot be sent as it is, and what to pass instead."""
    layout = getattr(t, "layout", None)
    if layout is not None and str(layout) != "torch.strided":
        name = str(layout).removeprefix("torch.")
        return (f"{what} needs a dense tensor; this one is {name}: pass t.to_dense() (and convert the result "
                "back, e.g. .to_sparse())")
    return f"{what} needs a contiguous tensor: pass t.contiguous() (and copy the result back)"


def _copy(dst: Any, src: Any) -> None:
    dst[...] = src


def _empty(x: Any, shape: tuple[int, ...]) -> Any:
    if type(x).__module__.startswith("cupy"):
        import cupy

        with x.device:  # on x's GPU, not the current one
            return cupy.empty(shape, dtype=x.dtype)
    return x.new_empty(shape)


def _like(original: Any, out: Any) -> Any:
    """Results come back in the kind of array that went in."""
    return out.numpy() if type(original).__module__.startswith("numpy") else out
