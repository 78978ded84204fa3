"""`viceroy.context()`: who am I, on a rank."""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Context:
    """What a rank knows about itself: its coordinates in the mesh, or, during a call made on
    a view of it (``mesh.split(gpus=("dp", "tp"), tp=2).run(...)``), in that view; collectives
    by dim name and over the whole (``dims=None``) follow the same view.

    >>> mesh.run(lambda: vr.context().coords)      # {"gpus": 0}, {"gpus": 1}, ...
    """

    rank: int
    coords: dict[str, int]
    dims: dict[str, int]
    local_rank: int
    world_size: int
    host: int
    namespace: dict[str, Any] = field(repr=False)
    _publish: Callable[[str, Any], None] = field(repr=False)
    mesh_token: str = field(default="", repr=False)
    # This rank's GPU, an index among the GPUs its host's ranks all see (CUDA_VISIBLE_DEVICES,
    # the same list on each), made the current device when CUDA starts; None without a GPU.
    # (See viceroy.runtime.devices.)
    device: int | None = None
    # While a call runs on a view of the mesh (a slice, split, rename, selection), `coords` and
    # `dims` are the view's, and `ranks` holds the global rank at each of its positions
    # (row-major); None: the whole mesh, in order. `view_key` names the view (group caches).
    ranks: tuple[int, ...] | None = field(default=None, repr=False)
    view_key: Any = field(default=None, repr=False)

    def publish(self, kind: str, data: Any) -> None:
        """Send an event ``{"type": "publish", "kind": kind, "data": data, ...}`` to the
        controller's subscribers (the notebook uses it for displays)."""
        self._publish(kind, data)


_current: Context | None = None


_in_call = threading.local()  # .view: the Context of the call this thread runs on a view


def context() -> Context:
    """This rank's `Context`; only valid on a rank (in code or functions sent by `Mesh.run`)."""
    view = getattr(_in_call, "view", None)
    if view is not None:
        return view
    if _current is None:
        raise RuntimeError(
            "viceroy.context() is only available on a rank, and so are the collectives that use "
            "it (vr.all_reduce, vr.barrier, ...): call them in code or a function sent with "
            "mesh.run(...), or in a %%mesh cell. On the controller, vr.reduce(t, ...) combines a "
            "MeshTensor's pieces"
        )
    return _current


def _set_context(ctx: Context) -> None:
    global _current
    _current = ctx


def view_of(names: list[str], sizes: list[int], runs: list[list[int]]) -> Context:
    """This rank's `Context` in the view whose dims are `names`/`sizes` (row-major) and whose
    global ranks are the runs ``[start, stop)`` in `runs`; the rank must be one of them."""
    ctx = context()
    ranks = tuple(r for start, stop in runs for r in range(start, stop))
    pos = ranks.index(ctx.rank)
    coords: dict[str, int] = {}
    for name, size in zip(reversed(names), reversed(sizes), strict=True):  # row-major
        pos, coords[name] = divmod(pos, size)
    coords = {name: coords[name] for name in names}
    dims = dict(zip(names, sizes, strict=True))
    return dataclasses.replace(ctx, coords=coords, dims=dims, ranks=ranks,
                               view_key=(tuple(names), tuple(sizes), ranks))


def set_thread_view(view: Context | None) -> None:
    """For a thread that runs on one view for its whole life (an actor spawned on a slice or
    split of the mesh): `context()`, and the collectives that use it, give `view` on this
    thread. The namespace's ``coords`` and ``mesh`` are the main thread's and stay as they are."""
    _in_call.view = view


_provided: dict[str, Any] = {}  # "coords"/"mesh" -> the object the runtime put under that name


class MeshDims(dict[str, int]):
    """A rank's ``mesh``: the dims of the mesh (or view) running its code, ``{"gpus": 4}``. A
    dict, not the controller's Mesh, and its missing attributes say so: ``mesh.run(...)`` in
    rank code (a %%mesh cell, auto mode) was "'dict' object has no attribute 'run'"."""

    __slots__ = ()

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        raise AttributeError(
            f"on a rank, `mesh` is the dims of the mesh running this code ({dict(self)}), a dict with no {name!r}; "
            f"mesh.{name}(...) is the controller's: call it in a cell without %%mesh (in auto mode, after "
            "%mesh auto off)")


def provide(ns: dict[str, Any], coords: dict[str, int], dims: dict[str, int]) -> None:
    """Put this rank's ``coords`` and ``mesh`` (its dims) in the namespace: names the user's
    code reads, and may rebind (``mesh = init_device_mesh(...)``), which then stay the user's."""
    for name, value in (("coords", coords), ("mesh", MeshDims(dims))):
        ns[name] = _provided[name] = value


@contextmanager
def calling_view(names: list[str], sizes: list[int], runs: list[list[int]]) -> Iterator[None]:
    """For one call made on a view of the mesh, on this thread: `context()` gives this rank's
    `coords` and `dims` in the view (and the namespace's ``coords`` and ``mesh`` hold them,
    unless the user's code rebound those names), then what it gave before. Other threads
    (actors answering meanwhile) keep theirs."""
    view = view_of(names, sizes, runs)
    ns = view.namespace
    ours = [n for n in ("coords", "mesh") if n in ns and ns[n] is _provided.get(n)]  # not rebound by the user
    saved = {n: ns[n] for n in ours}
    before = getattr(_in_call, "view", None)
    _in_call.view = view
    for n, value in (("coords", dict(view.coords)), ("mesh", MeshDims(view.dims))):
        if n in ours:
            ns[n] = _provided[n] = value
    try:
        yield
    finally:
        _in_call.view = before
        for n in ours:
            if ns.get(n) is _provided[n]:  # what the call left there is still ours: put back
                ns[n] = _provided[n] = saved[n]
