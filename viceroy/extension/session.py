"""The notebook's mesh: starting and stopping it, its state for the views, and its cells (run
by a `CellRunner`, see cells.py).

One `MeshSession` per IPython shell; the magics, the comm and the kernel all go through it.

>>> session = MeshSession(get_ipython())
>>> session.up({"gpus": 2})
>>> session.run_cell("print('hi', rank)", RunOptions())    # streams "[0] hi 0", "[1] hi 1"
>>> session.down()
"""

from __future__ import annotations

import contextlib
import inspect
import os
import sys
import threading
import warnings
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from IPython.core.error import UsageError

from viceroy.extension import display_hook, launching
from viceroy.extension.args import RunOptions, parse_dims
from viceroy.extension.cells import CellRunner
from viceroy.extension.displays import Sink
from viceroy.extension.echo import ApiEcho, CallCells, current_cell
from viceroy.extension.errors import interrupted_start
from viceroy.extension.state import MeshState, rank_hosts
from viceroy.runtime import file_names
from viceroy.runtime.collectives.backend import BACKEND_ENV, BACKENDS
from viceroy.runtime.errors import PreloadWarning
from viceroy.runtime.shape import describe_ranks

if TYPE_CHECKING:
    from viceroy import Mesh
    from viceroy.runtime.ssh import Synced

AUTO_MESH_ENV = "VICEROY_MESH"  # e.g. "gpus=4": start this mesh on first use, if none is up
NO_MESH = "no mesh is up: start one with `%mesh up gpus=4` (any NAME=SIZE dims)"
AUTO_HINT = "; auto mode is on, so this cell was sent to the ranks (`%mesh auto off` runs cells here again)"
NCCL_HINT = ("Leave --backend out: collectives follow the tensor (gloo for CPU tensors; nccl for GPU tensors, "
             "where every rank has a GPU), or pass --backend gloo")


def describe_dims(dims: dict[str, int]) -> str:
    """``{"hosts": 2, "gpus": 4}`` -> ``"hosts=2 gpus=4"``."""
    return " ".join(f"{k}={v}" for k, v in dims.items())


def _init_torch_distributed() -> None:
    """On a rank: torch's default process group (env://; the mesh set RANK, WORLD_SIZE,
    MASTER_ADDR/PORT), tracked so an interrupt can release it; gloo for every device under
    ``--backend gloo``, else torch's default (gloo for CPU tensors, nccl for GPU ones)."""
    import torch.distributed as dist

    from viceroy.runtime.collectives import install_torch_hooks

    install_torch_hooks()
    if not dist.is_initialized():
        dist.init_process_group(backend="gloo" if os.environ.get(BACKEND_ENV) == "gloo" else None)


def _chosen_backend(backend: str | None, env: dict[str, str] | None) -> str | None:
    """``--backend``, or the same given as ``--env VICEROY_BACKEND=...`` (checked alike, GPUs
    and all); given both ways, they must agree."""
    given = (env or {}).get(BACKEND_ENV)
    if given is None:
        return backend
    if given not in BACKENDS:  # the ranks would ignore it and follow the tensor, silently
        raise UsageError(f"%mesh up: --env {BACKEND_ENV}={given} names no backend; choose one with --backend gloo "
                         "or --backend nccl (or leave both out: collectives follow the tensor)")
    if backend is not None and backend != given:
        raise UsageError(f"%mesh up: --backend {backend} and --env {BACKEND_ENV}={given} disagree; give --backend alone")
    return given


def _rank_gpu() -> int | None:
    """On a rank: its GPU (an index among the visible ones), None without one."""
    from viceroy.runtime.context import context

    return context().device


class MeshSession:
    """Owns at most one mesh for a shell and turns runtime events into cell output and state."""

    def __init__(self, shell: Any = None) -> None:
        self.shell = shell
        self.mesh: Mesh | None = None
        self.state = MeshState()
        self._cells = CellRunner(shell)
        self._unsubscribe: Callable[[], Any] | None = None
        self._listeners: list[Callable[[], None]] = []
        self._setup = threading.local()
        self._hidden_calls: set[Any] = set()
        self._restarting: frozenset[int] = frozenset()  # ranks our own restart is replacing
        self._echo = ApiEcho(all_ranks=lambda: self.mesh.ranks if self.mesh is not None else [])
        self._call_cells = CallCells()  # which cell each call's output goes to
        self._cell_call: Any = None  # the call of the %%mesh cell running (or run last)

    # --- lifecycle ---------------------------------------------------------------------------

    @property
    def auto(self) -> bool:
        return self.state.auto

    @auto.setter
    def auto(self, on: bool) -> None:
        self.state.auto = on
        self._notify()

    def up(
        self,
        dims: dict[str, int],
        launcher: str = "local",
        backend: str | None = None,
        preload: list[str] | None = None,
        hostfile: str | None = None,
        listen: str | None = None,
        torch_dist: bool = False,
        key_file: str | None = None,
        env: dict[str, str] | None = None,
        launcher_options: dict[str, Any] | None = None,
        output_limit: int | None = None,
    ) -> Mesh:
        """Start a mesh with these dims, local or through `launcher` (stopping the previous
        one), and bind ``mesh``.

        ``preload``: modules the ranks import once before starting (runtime default if None).
        ``env``: environment variables for every rank.
        ``output_limit``: bytes of output each rank forwards per call (runtime default if None).
        ``launcher_options``: ``{"--identity": "KEYFILE", ...}`` (see `launching.LAUNCHER_OPTIONS`).
        Every option is checked before the running mesh is stopped: a typo leaves it up
        (``backend="nccl"``: a local mesh's GPUs are this machine's, checked here; other hosts'
        ranks check theirs, and any without a GPU stop the new mesh).
        """
        import viceroy as vr
        from viceroy.runtime.devices import visible_gpus

        backend = _chosen_backend(backend, env)
        if backend == "nccl" and launcher == "local" and not visible_gpus():  # as the local agent will find
            keeps = f"; the mesh up ({describe_dims(self.mesh.dims)}) keeps running" if self.mesh is not None else ""
            raise UsageError(f"%mesh up --backend nccl: this machine has no GPU, and nccl moves GPU tensors only; "
                             f"nothing was started{keeps}. {NCCL_HINT}")

        launcher_kwargs = launching.check_launcher_options(launcher, dims, hostfile, listen, key_file, launcher_options)
        params = inspect.signature(vr.Mesh.local).parameters
        reserved = sorted(d for d in dims if d in params)
        if reserved:
            raise UsageError(
                f"%mesh up: {', '.join(reserved)} cannot name a dim (it is an option of "
                "Mesh.local); pick another name, e.g. gpus"
            )
        kwargs: dict[str, Any] = {"echo": False, **dims}
        if preload is not None:
            kwargs["preload"] = preload
        if output_limit is not None:
            kwargs["output_limit"] = output_limit
        if env or backend is not None:
            kwargs["env"] = dict(env or {})
        if backend is not None:
            # Collectives follow the tensor (CPU: gloo, CUDA: nccl); this forces one.
            kwargs["env"][BACKEND_ENV] = backend
        if self.mesh is not None:
            old = describe_dims(self.mesh.dims)
            self.down()
            print(f"stopped the previous mesh ({old})")
        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always", PreloadWarning)
                mesh = launching.start(launcher, dims, kwargs, hostfile, listen, key_file, launcher_kwargs)
            for w in caught:  # a preload that failed: one line in the cell, not a warning from our code
                if issubclass(w.category, PreloadWarning):
                    print(f"%mesh up: {w.message}", file=sys.stderr)
                else:
                    warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
            self._attach(mesh)
            with self._setup_calls():
                if backend == "nccl":
                    self._check_gpus(mesh)
                mesh.run(display_hook.install)
                if torch_dist:
                    try:
                        mesh.run(_init_torch_distributed, label="torch.distributed.init_process_group")
                    except Exception as e:
                        raise UsageError(f"%mesh up --torch-dist: {str(e).splitlines()[-1]}") from None
        except KeyboardInterrupt:  # a mesh half set up is no mesh: stop what came up
            self.down()
            raise interrupted_start() from None
        if self.shell is not None:
            self.shell.user_ns["mesh"] = mesh
        return mesh

    def _check_gpus(self, mesh: Mesh) -> None:
        """``--backend nccl``: every rank must have a GPU (nccl moves nothing else); else the
        mesh is stopped and a UsageError names the ranks without one."""
        without = [r for r, gpu in zip(mesh.ranks, mesh.run(_rank_gpu).values(), strict=True) if gpu is None]
        if without:
            self.down()
            have = "has" if len(without) == 1 else "have"
            raise UsageError(
                f"%mesh up --backend nccl: {describe_ranks(without)} {have} no GPU, and nccl moves GPU tensors "
                f"only; the mesh was stopped. {NCCL_HINT}")

    def sync(self, src: str, dest: str | None, dry_run: bool) -> list[Synced]:
        """``%mesh sync``: copy a directory to every host of the ssh mesh that is up."""
        return launching.sync_hosts(self.mesh, src, dest, dry_run)

    def _attach(self, mesh: Mesh) -> None:
        self._cells.forget_exits()  # of a previous mesh's ranks
        self.mesh = mesh
        self._unsubscribe = mesh.subscribe(self._on_event)
        self.state.reset(mesh.dims, mesh.states(), mesh.pids(), rank_hosts(mesh))
        self._notify()

    def down(self) -> bool:
        """Stop the mesh (if any) and every process of it. True if one was running."""
        mesh, self.mesh = self.mesh, None
        if mesh is None:
            return False
        if self._unsubscribe is not None:
            self._unsubscribe()
            self._unsubscribe = None
        try:
            mesh.shutdown()
        finally:
            self.state.reset(None)
            self._notify()
            if self.shell is not None and self.shell.user_ns.get("mesh") is mesh:
                del self.shell.user_ns["mesh"]
        return True

    def restart(self, failed_only: bool = False) -> list[int]:
        """Restart every rank, or only the dead ones; the ranks restarted."""
        mesh = self.require()
        ranks = [r for r, s in mesh.states().items() if s == "dead" or not failed_only]
        if not ranks:
            return ranks
        self.state.starting(ranks)
        self._restarting = frozenset(ranks)
        self._notify()
        try:
            mesh.restart(failed_only=failed_only)
            with self._setup_calls():  # only on the new processes: the others may be busy
                mesh.select(ranks).run(display_hook.install)
        finally:
            self._restarting = frozenset()
            self._cells.forget_exits(ranks)  # the dead ones among them are back
            self.state.set_states(mesh.states())
            self._notify()
        return ranks

    def require(self) -> Mesh:
        """The running mesh; starts ``$VICEROY_MESH`` if set and none is up."""
        if self.mesh is None:
            spec = os.environ.get(AUTO_MESH_ENV, "").strip()
            if not spec:
                raise UsageError(NO_MESH + (AUTO_HINT if self.auto else ""))
            self.up(parse_dims(spec.split(), prog=f"${AUTO_MESH_ENV}"))
        assert self.mesh is not None
        return self.mesh

    # --- state listeners (the comm) ----------------------------------------------------------

    def add_listener(self, fn: Callable[[], None]) -> None:
        """``fn()`` is called, on any thread, whenever the state snapshot may have changed."""
        self._listeners.append(fn)

    def remove_listener(self, fn: Callable[[], None]) -> None:
        if fn in self._listeners:
            self._listeners.remove(fn)

    def _notify(self) -> None:
        for fn in list(self._listeners):
            fn()

    @contextlib.contextmanager
    def _setup_calls(self) -> Iterator[None]:
        """Calls this thread makes inside are the session's own (installing hooks): the mesh
        state does not show them, so ranks stay "idle" until the user's first call."""
        self._setup.active = True
        try:
            yield
        finally:
            self._setup.active = False

    def _on_event(self, ev: dict[str, Any]) -> None:
        # Runs on the runtime's IO thread (call_started: on the submitting thread): record and
        # enqueue, nothing else.
        kind, call = ev.get("type"), ev.get("call")
        if kind == "rank_exit" and ev.get("rank") in self._restarting:
            # Our own restart replacing the process: not news for the next cell (the state
            # still records the exit, and keeps the rank "starting").
            self.state.apply(ev)
            self._notify()
            return
        if kind == "call_started" and getattr(self._setup, "active", False):
            self._hidden_calls.add(call)
        if kind == "call_started":
            title = self._cells.title_for(threading.get_ident())
            if title is not None:
                ev = {**ev, "label": title}  # views show the cell, not just "%%mesh"
                self._cell_call = call
            if call not in self._hidden_calls:
                self._call_cells.started(ev, current_cell())
        if call in self._hidden_calls and kind in ("call_started", "rank_done", "ranks_done", "call_finished"):
            if kind == "call_finished":
                self._hidden_calls.discard(call)
        elif self.state.apply(ev):
            self._notify()
        if kind in ("output", "publish") and call is None:  # written between calls: see CallCells
            call = self._call_cells.call_of(ev)
            ev = {**ev, "call": call}
        if kind == "rank_exit" or (self._cells.active and call in (None, self._cell_call)):
            self._cells.post(ev)
        elif kind in ("call_started", "output", "publish", "rank_done", "ranks_done", "call_finished"):
            # a call made through the Python API, or one whose cell has ended: into its cell
            self._echo.put({**ev, "parent": self._call_cells.cell_of(call)})

    # --- running a cell (see cells.py) ------------------------------------------------------

    def run_cell(
        self, code: str, opts: RunOptions, label: str = "%%mesh", sink: Sink | None = None
    ) -> Any:
        """Run ``code`` on the ranks `opts` select, streaming their output into the cell (see
        `CellRunner.run`)."""
        return self._cells.run(self.require(), code, opts, label, sink)

    def before_cell(self, *_: Any) -> None:
        """Before every cell (IPython's pre_run_cell): messages name the lines of this shell's
        cells as its tracebacks do, "Cell In[5], line 4", not by the file IPython compiled them
        under (/tmp/ipykernel_1234/4025209863.py)."""
        file_names.name_files(self._cell_name)

    def _cell_name(self, file: str) -> str | None:
        try:
            label = self.shell.compile.format_code_name(file)
        except Exception:  # a shell without IPython's compiler
            return None
        return f"{label[0]} {label[1]}" if label else None

    def after_cell(self, *_: Any) -> None:
        """After every cell (IPython's post_run_cell): tensor ops and frees the cell queued go to
        the ranks now, so a MeshTensor deleted in a cell frees the ranks' memory when it ends."""
        controller = getattr(self.mesh, "_controller", None)
        if controller is None or not controller.engines:  # (no engine: torch never came into it)
            return
        from viceroy.runtime.tensors.engine import send_queued

        try:
            send_queued(controller)
        except Exception as e:  # the cell is over; its result stands
            print(f"viceroy: sending the cell's tensor ops failed: {e}", file=sys.stderr)

    def interrupt_running(self) -> None:
        """Interrupt every call in flight on the mesh (safe to call from any thread)."""
        mesh = self.mesh
        if mesh is not None and "running" in self.state.states().values():
            try:
                mesh.interrupt()
            except Exception as e:  # interrupting must never take the kernel down
                print(f"viceroy: interrupting the mesh failed: {e}", file=sys.stderr)

    # --- teardown ----------------------------------------------------------------------------

    def close(self) -> None:
        """Stop the mesh; used by kernel shutdown and extension unload."""
        try:
            self.down()
        except Exception as e:  # shutting down must not fail the kernel's own shutdown
            print(f"viceroy: stopping the mesh failed: {e}", file=sys.stderr)
        finally:
            self._echo.stop()
