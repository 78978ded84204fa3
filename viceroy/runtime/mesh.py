"""`Mesh`: the handle users hold. A mesh is a view (named dims over ranks) onto a running set of
processes; `slice`, `split`, `flatten`, `rename` and `select` give sub-meshes over the same
processes."""

from __future__ import annotations

import atexit
import itertools
import linecache
import os
import sys
from collections import OrderedDict
from collections.abc import Callable
from typing import Any, Literal, overload

import numpy as np

from viceroy.runtime import arguments, reading, serialize
from viceroy.runtime.compiled import TAG as compiled_tag
from viceroy.runtime.controller import Controller, Listener, shutdown_all
from viceroy.runtime.execution import check_syntax
from viceroy.runtime.file_names import in_traceback
from viceroy.runtime.future import Future
from viceroy.runtime.handles import Ref
from viceroy.runtime.shape import Shape, ShapeOps, describe_ranks, format_rank_set
from viceroy.runtime.starting import MeshStarts
from viceroy.runtime.values import ValueMesh

atexit.register(shutdown_all)

_cell_ids = itertools.count(1)
_cell_numbers: OrderedDict[str, int] = OrderedDict()


def _cell_number(code: str) -> int:
    """Tracebacks name code strings ``<mesh-cell-N>``; the same text keeps its number, so the
    ranks' compile cache serves repeated calls."""
    n = _cell_numbers.pop(code, None) or next(_cell_ids)
    _cell_numbers[code] = n
    if len(_cell_numbers) > 512:
        _cell_numbers.popitem(last=False)
    return n


class Mesh(MeshStarts, ShapeOps):
    """A mesh of rank processes with named dims.

    >>> with vr.Mesh.local(gpus=4) as mesh:
    ...     mesh.run("x = rank * 10\\nx").item(gpus=3)
    30
    """

    def __init__(self, controller: Controller, shape: Shape) -> None:
        self._controller = controller
        self._shape = shape

    def _reshaped(self, shape: Shape) -> Mesh:
        self._controller._check_open()  # a view of a mesh shut down: say so at the slice
        return Mesh(self._controller, shape)

    def __enter__(self) -> Mesh:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    def __repr__(self) -> str:
        states = self._controller.states()
        counts: dict[str, int] = {}
        for r in self._shape.ranks:
            counts[states[r]] = counts.get(states[r], 0) + 1
        status = "shut down" if self._controller.closed else ", ".join(f"{n} {s}" for s, n in counts.items())
        return f"<viceroy.Mesh {self._shape.describe()}: {status}>"

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> Any:
        """As a notebook cell's value: the live mesh view, when the Viceroy extension that
        shows it is loaded and runs this mesh (looked up, never imported: the runtime does
        not depend on it); else None, and the plain repr is shown."""
        widget = sys.modules.get("viceroy.extension.widget")
        return widget.mesh_bundle(self) if widget is not None else None

    # --- running code ------------------------------------------------------------------------

    @overload
    def run(self, code: str | Callable[..., Any], *args: Any, block: Literal[True] = ..., timeout: float | None = ...,
            fail_fast: bool = ..., label: str | None = ..., **kwargs: Any) -> ValueMesh[Any]: ...
    @overload
    def run(self, code: str | Callable[..., Any], *args: Any, block: Literal[False], timeout: float | None = ...,
            fail_fast: bool = ..., label: str | None = ..., **kwargs: Any) -> Future[ValueMesh[Any]]: ...

    def run(
        self,
        code: str | Callable[..., Any],
        *args: Any,
        block: bool = True,
        timeout: float | None = None,
        fail_fast: bool = True,
        label: str | None = None,
        **kwargs: Any,
    ) -> ValueMesh[Any] | Future[ValueMesh[Any]]:
        """Run code on every rank of this (sub)mesh.

        ``mesh.run("x = rank * 2; x")`` runs a code string in each rank's persistent namespace
        (``rank``, ``coords``, ``mesh`` are predefined) and returns the value of its last
        expression per rank. ``mesh.run(fn, *args, **kwargs)`` calls a function sent by value.

        block=False returns a `Future`. timeout: cancel the call after this many seconds.
        fail_fast: when one rank fails, interrupt the others (default). The keywords block,
        timeout, fail_fast and label belong to `run`, not to `fn`.
        Raises `MeshError` when any rank fails; SyntaxError before anything is sent.
        The tensor ops queued so far (`activate()`) reach the ranks before it.
        """
        self._send_tensor_ops()
        return self._run(code, *args, block=block, timeout=timeout, fail_fast=fail_fast, label=label, **kwargs)

    def _send_tensor_ops(self) -> None:
        """Send what the tensor engines of this mesh (every view's) have queued, so that a call
        made after a tensor op runs after it on the ranks (rank code reading a MeshTensor bound
        to a name sees what the ops before it made). No engine (torch never came into it):
        nothing to do, nothing imported."""
        if self._controller.engines:
            from viceroy.runtime.tensors.engine import send_queued

            send_queued(self._controller)

    def _run(self, code: str | Callable[..., Any], *args: Any, block: bool = True, timeout: float | None = None,
             fail_fast: bool = True, label: str | None = None, **kwargs: Any) -> Any:
        """`run`, without sending the tensor engines' queued ops first (the engines' own calls)."""
        arguments.check_flag(block, "block")
        arguments.check_flag(fail_fast, "fail_fast")
        arguments.check_label(label)
        if isinstance(code, str):
            if args:
                raise TypeError(
                    "a code string takes no positional arguments; bind names with keywords, "
                    "mesh.run('y = x * 2', x=x), or pass a function"
                )
            n = _cell_number(code)
            # One name per distinct code: tracebacks and stacks read lines by it (linecache), so
            # two cells under one name would show one cell's lines for the other's frames. A
            # notebook's cell names its code itself (file_names.CellCode: "Cell In[5]").
            filename = getattr(code, "filename", None) or (f"<mesh-cell-{n}>" if label is None else f"<{label} cell {n}>")
            code = str(code)
            check_syntax(code, filename)
            extra: dict[str, Any] = {"code": code, "filename": filename}
            signed: list[Any] = []
            data: list[Any] = []
            if kwargs:  # names bound on every rank before the code runs
                _check_names("run", kwargs, assigns=True)
                signed, data = self._pack(kwargs, {f"{k}=": v for k, v in kwargs.items()})
            compiled = self._controller.shipments.code_for(code)
            if compiled is not None:  # a text new to the mesh: the ranks need not compile it
                signed.append(compiled)
                extra["pyc"] = compiled_tag
            what = label or f"mesh.run (cell {n})"
        elif callable(code):
            signed, data = self._pack(
                (code, args, kwargs),
                {"the function": code, **{f"argument {i}": a for i, a in enumerate(args)},
                 **{f"argument {k!r}": v for k, v in kwargs.items()}},
            )
            extra = {"sources": _sources_for(code), "fn_file": getattr(getattr(code, "__code__", None), "co_filename", None)}
            what = label or f"mesh.run({getattr(code, '__name__', type(code).__name__)})"
        else:
            raise TypeError(f"run takes a code string or a function, got {type(code).__name__}")
        fut = self._controller.submit(
            "run", self._shape, extra, signed, data, label=what, fail_fast=fail_fast, timeout=timeout
        )
        return fut.get() if block else fut

    def _pack(self, obj: Any, parts: dict[str, Any]) -> tuple[list[Any], list[Any]]:
        """Pickle what goes to the ranks; name the part that cannot travel; check handles."""
        refs: list[Any] = []
        try:
            payload, bufs = serialize.dumps(obj, seen_refs=refs)
        except Exception:
            serialize.check_picklable(parts)  # says which one
            raise
        for ref in refs:
            ref.check_usable_on(self._controller, self._shape)
        return [payload], [b.raw() for b in bufs]

    def ref(self, name: str) -> Ref:
        """A handle to each rank's `name`; nothing moves. Passed back to the mesh (argument,
        closure, or a keyword of a code string) it resolves to the rank's own value."""
        self._controller._check_open()
        return Ref(name, self._controller, self._shape.describe())

    def push(self, **values: Any) -> None:
        """Assign each value to a name in every rank's namespace: ``mesh.push(lr=0.1)``.
        Arrays and tensors travel as raw buffers; on this host, through shared memory once
        for all ranks."""
        if not values:
            raise TypeError("push takes names and values: mesh.push(lr=0.1)")
        _check_names("push", values, assigns=True)
        signed, data = self._pack(values, values)
        self._send_tensor_ops()
        self._controller.submit("push", self._shape, {}, signed, data, label=f"push {', '.join(values)}").get()

    def pull(self, name: str) -> ValueMesh[Any]:
        """Each rank's value of a name in its namespace; a MeshError (NameError) names the
        ranks that lack it."""
        return self._read(name, "pull")

    def _read(self, name: str, what: str) -> ValueMesh[Any]:
        # A lookup has nothing long-running to stop, so every rank answers for itself: a name
        # missing on all ranks is reported by all of them, not by whichever failed first.
        _check_names(what, [name])
        return reading.found(self.run(reading.value_of, name, label=f"{what} {name}", fail_fast=False), name, what)

    def scatter(self, name: str, values: Any) -> None:
        """Give each rank its own part, bound to `name`. `values` is a sequence with one item per
        rank (row-major), or an array/tensor split along its first axis into as many near-equal
        chunks as there are ranks (like numpy.array_split)."""
        _check_names("scatter", [name], assigns=True)
        n = len(self._shape)
        parts = _split_for_ranks(values, n)
        if len(parts) != n:
            raise ValueError(f"scatter needs one value per rank: this mesh has {n} ranks, got {len(parts)} values")
        by_rank = dict(zip(self._shape.ranks, parts, strict=True))
        signed, data = self._pack(by_rank, {name: values})
        self._send_tensor_ops()
        self._controller.submit("push", self._shape, {"scatter": name}, signed, data, label=f"scatter {name}").get()

    def gather(self, name: str) -> Any:
        """Every rank's `name`, joined in this mesh's order (rank order; a view's own order, as
        ``mesh.select([3, 1])`` gives): arrays and tensors concatenated along
        their first axis (0-d ones stacked), lists chained, anything else as a list."""
        return _join(self._read(name, "gather"), name)

    # --- actors ---------------------------------------------------------------------------

    def spawn(self, cls: type, *args: Any, owner: Any = None, **kwargs: Any) -> Any:
        """One actor per rank of this mesh: ``counters = mesh.spawn(Counter, 0)``. The class
        travels by value; `owner` (an actor mesh, or any object with ``__supervise__``) hears of
        failures no caller waits for. See `viceroy.runtime.actors`."""
        from viceroy.runtime.actors.spawn import spawn

        self._send_tensor_ops()
        return spawn(self, cls, *args, owner=owner, **kwargs)

    # --- the tensor engine ------------------------------------------------------------------

    def activate(self) -> Any:
        """``with mesh.activate():`` torch calls here make `MeshTensor`s whose ops run on this
        mesh's ranks (shapes and dtypes are checked here first, on meta tensors)."""
        from viceroy.runtime.tensors.activation import activate
        from viceroy.runtime.tensors.engine import engine_for

        self._controller._check_open()
        self._engine = engine_for(self)
        return activate(self._engine)

    # --- control --------------------------------------------------------------------------------

    def interrupt(self) -> None:
        """Interrupt every call running on this mesh's ranks (they get KeyboardInterrupt); the
        calls' futures fail with MeshError. Returns when the ranks have stopped (or 1.5 s)."""
        self._controller.interrupt(self._shape.ranks)

    def restart(self, failed_only: bool = False, timeout: float = 60.0) -> None:
        """Respawn ranks: only the dead ones with failed_only=True (the others keep their
        state), else all of this mesh's ranks (their state is lost)."""
        arguments.check_flag(failed_only, "failed_only")
        timeout = arguments.check_seconds(timeout, none=None)
        states = self._controller.states()
        ranks = [r for r in self._shape.ranks if not failed_only or states[r] == "dead"]
        self._controller.restart(ranks, timeout)

    def shutdown(self) -> None:
        """Stop every process of the mesh (all views of it)."""
        self._controller.shutdown()

    # --- watching -----------------------------------------------------------------------------

    def states(self) -> dict[int, str]:
        """rank -> "starting" | "idle" | "running" | "dead" (every rank, after shutdown)."""
        s = self._controller.states()
        return {r: s[r] for r in self._shape.ranks}

    @property
    def degraded(self) -> bool:
        """True when some rank of this mesh is dead."""
        return any(s == "dead" for s in self.states().values())

    def pids(self) -> dict[int, int]:
        """rank -> process id, for live ranks (none after shutdown)."""
        p = self._controller.pids()
        return {r: p[r] for r in self._shape.ranks if r in p}

    def logs(self, rank: int, tail: int = 200) -> str:
        """The last `tail` lines a rank printed."""
        r = arguments.as_int(rank)  # numpy's too
        if r is None:
            raise TypeError(f"logs takes a rank number, e.g. mesh.logs(0); got {rank!r}")
        if r not in self._shape.ranks:
            raise IndexError(f"rank {r} is not in this mesh (its ranks are {format_rank_set(self._shape.ranks)})")
        return self._controller.logs.tail(r, arguments.check_count(tail, "tail", "lines"))

    def stacks(self, timeout: float = 3.0) -> ValueMesh[str]:
        """Each rank's Python stacks, also while it is busy (dead or silent ranks: a note)."""
        replies = self._controller.query("stacks", self._shape.ranks, timeout)
        return ValueMesh(self._shape, {
            # frames of a notebook's cells named as the notebook shows them (file_names)
            r: in_traceback(replies[r]) if isinstance(replies.get(r), str) else "(no answer: the rank is dead or unresponsive)"
            for r in self._shape.ranks
        })

    def stats(self, timeout: float = 3.0) -> dict[str, Any]:
        """Transport counters and the ranks' resource use. ``dropped`` is the number of messages
        thrown away unread because they were not signed with this mesh's key; per rank, ``rss``
        is its resident memory in bytes, ``gpu_mem`` the GPU memory it holds in bytes and
        ``gpu_util`` its GPU's utilisation (0-100), None where unknown (no GPU, or neither torch
        with CUDA initialised nor pynvml on that rank). Live ranks only; waits up to `timeout`.

        -> ``{"controller": {"dropped": n}, "agents": {host: {...}}, "ranks": {rank: {...}}}``
        """
        replies = self._controller.query("stats", self._shape.ranks, timeout)
        rank_fields = ("dropped", "rss", "gpu_mem", "gpu_util")
        return {
            "controller": {"dropped": self._controller.signer.dropped},
            "agents": {k[1]: {"dropped": v["dropped"]} for k, v in replies.items() if isinstance(k, tuple)},
            "ranks": {k: {p: v.get(p) for p in rank_fields} for k, v in replies.items() if not isinstance(k, tuple)},
        }

    def subscribe(self, listener: Listener) -> Callable[[], None]:
        """Call ``listener(event)`` for every mesh event (output, call_started, rank_done,
        ranks_done, call_finished, rank_exit, rank_ready, publish), on the controller's IO
        thread; keep it quick and thread-safe. A rank's answer to a call is a ``rank_done``
        (``rank``, ``ok``; a failed one carries ``kind``, ``summary`` and ``tb``), or, for
        plain successes collected by a host's agent, one ``ranks_done`` (``ranks``) for the
        lot. Returns a function that unsubscribes."""
        return self._controller.subscribe(listener)


_RANK_NAMES = ("rank", "coords", "mesh")  # every rank's own, in its namespace (see rank.py)


def _check_names(what: str, names: Any, assigns: bool = False) -> None:
    arguments.check_names(what, names, assigns, _RANK_NAMES)


def _split_for_ranks(values: Any, n: int) -> list[Any]:
    if getattr(values, "ndim", None) == 0:
        raise TypeError("scatter splits along a first axis, and a 0-d array or tensor has none: "
                        "push gives every rank the same value")
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(values, torch.Tensor):
        return list(torch.tensor_split(values, n))
    if isinstance(values, np.ndarray):
        return list(np.array_split(values, n))
    if isinstance(values, list | tuple):
        return list(values)
    raise TypeError(f"scatter takes a list, tuple, numpy array or torch tensor, got {type(values).__name__}")


def _join(vm: ValueMesh[Any], name: str) -> Any:
    """Arrays and tensors concatenated along their first axis (0-d ones, a loss per rank say,
    stacked into one axis); lists chained; anything else as a list."""
    values = vm.values()
    torch = sys.modules.get("torch")
    try:
        if values and torch is not None and all(isinstance(v, torch.Tensor) for v in values):
            return torch.stack(values) if all(v.dim() == 0 for v in values) else torch.cat(values)
        if values and all(isinstance(v, np.ndarray) for v in values):
            return np.stack(values) if all(v.ndim == 0 for v in values) else np.concatenate(values)
    except (RuntimeError, ValueError):
        raise ValueError(_unjoinable(vm, name)) from None
    if values and all(isinstance(v, list) for v in values):
        return [x for v in values for x in v]
    return values


def _unjoinable(vm: ValueMesh[Any], name: str) -> str:
    """Why the ranks' arrays or tensors cannot be concatenated: their shapes (dtypes), by rank."""
    by_shape: dict[str, list[int]] = {}
    for rank, v in zip(vm._shape.ranks, vm.values(), strict=True):
        by_shape.setdefault(f"{str(v.dtype).removeprefix('torch.')}{list(v.shape)}", []).append(rank)
    shapes = "; ".join(f"{describe_ranks(r)}: {s}" for s, r in by_shape.items())
    return (f"gather {name}: the ranks' values cannot be joined along their first axis ({shapes}); they need "
            "one number of dims and the same sizes past the first (0-d values are stacked only when all are "
            f"0-d): reshape them on the ranks (e.g. {name}.reshape(-1)), or pull({name!r}) for each rank's "
            "value as it is")


def _sources_for(fn: Any) -> dict[str, str]:
    """Source of notebook-defined functions (files that exist nowhere else), so rank tracebacks
    show the user's lines."""
    code = getattr(fn, "__code__", None)
    if code is None:
        return {}
    filename = code.co_filename
    if os.path.exists(filename):
        return {}
    lines = linecache.getlines(filename)
    return {filename: "".join(lines)} if lines else {}

