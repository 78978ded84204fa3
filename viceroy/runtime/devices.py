"""A rank's GPU: which one it is, and making it the current device.

Every rank on a host sees the same GPUs in the same order (``CUDA_VISIBLE_DEVICES`` lists the
GPUs the mesh uses there), as under torchrun, and uses the one at its local rank (more ranks
than GPUs share them round-robin): ``vr.context().device``. Stock code that calls
``torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))`` works, and so does code that just says
``"cuda"``: the rank's own GPU is made the current device.

Why not give each rank its GPU alone (``CUDA_VISIBLE_DEVICES=3``, seen as ``cuda:0``)? Stock code
setting the device by ``LOCAL_RANK`` then fails on every local rank but 0 ("invalid device
ordinal"), and NCCL misbehaves when each process sees a different set of GPUs on NVSwitch
machines (H100, H200): a first collective seconds slow under cuMem (NVIDIA/nccl#1749), wrong
NVLS ordering and hangs (ray-project/ray#61073, where torchrun's shared view has none of it).

CUDA's current device is per thread, and making a device current creates its context (hundreds
of MiB), which a rank that never touches its GPU should not pay. So:

- torch: a call queued on torch.cuda's lazy initialisation makes the rank's GPU current on the
  thread that starts CUDA, when it does (queued at start when torch is preloaded, else when the
  rank imports it);
- CuPy, which has no such queue: when the rank imports it, on the importing thread;
- the rank's own threads that run user code (the main thread, each actor's) call
  `make_current` before each call: once CUDA has started, a thread of ours that has not yet been
  given the rank's GPU gets it, once (after that, a device the user sets stays).

Threads the user starts begin on device 0, as under torchrun:
``torch.cuda.set_device(vr.context().device)`` in them.
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Callable
from importlib.machinery import ModuleSpec
from types import ModuleType
from typing import Any

_device: int | None = None  # this rank's GPU, an index among the visible ones; None: no GPU
_bound = threading.local()  # .done: this thread has been given the rank's GPU
_warned: set[str] = set()


def visible_gpus() -> list[str]:
    """This host's GPU ids, found without initialising CUDA (which must not happen before the
    fork server forks ranks): CUDA_VISIBLE_DEVICES if set, else the NVIDIA driver's list."""
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    if env is not None:
        return [d.strip() for d in env.split(",") if d.strip() and d.strip() != "-1"]
    try:
        return [str(i) for i in range(len(os.listdir("/proc/driver/nvidia/gpus")))]
    except OSError:
        return []


def assign(local_rank: int, local_ranks: int, gpus: list[str]) -> tuple[dict[str, str], int | None]:
    """A rank's GPU environment on a host with `gpus` that runs `local_ranks` ranks: the GPUs the
    host's ranks use, the same list for each (order kept), and this rank's index in it."""
    if not gpus:
        return {}, None
    used = gpus[: max(1, local_ranks)]
    return {"CUDA_VISIBLE_DEVICES": ",".join(used)}, local_rank % len(used)


def own() -> int | None:
    """This rank's GPU (an index among the visible ones); None without a GPU or off a rank."""
    return _device


def physical_id() -> str | None:
    """This rank's GPU as the driver names it (an index or a UUID, for NVML); None without."""
    if _device is None:
        return None
    visible = visible_gpus()
    return visible[_device] if _device < len(visible) else None


def bind(index: int | None) -> None:
    """On a rank, at start: `index` is its GPU; have it made current when CUDA starts."""
    global _device
    _device = index
    if index is None:
        return
    for name, binder in (("torch", _bind_torch), ("cupy", _bind_cupy)):
        module = sys.modules.get(name)
        if module is not None:
            binder(module)
        else:
            after_import(name, binder)


def make_current() -> None:
    """Before a call runs user code on one of the rank's threads (see the module docstring)."""
    if _device is None or getattr(_bound, "done", False):
        return
    torch, cupy = sys.modules.get("torch"), sys.modules.get("cupy")
    try:
        if torch is not None and torch.cuda.is_initialized():
            _set(lambda: torch.cuda.set_device(_device))
        elif cupy is not None:
            runtime = cupy.cuda.runtime
            _set(lambda: runtime.setDevice(_device))
    except AttributeError:  # a module another thread is still importing: at the next call
        pass


def _bind_torch(torch: ModuleType) -> None:
    cuda = getattr(torch, "cuda", None)
    lazy_call = getattr(cuda, "_lazy_call", None)
    if lazy_call is None:  # a torch without the queue: each thread of ours at its next call
        return
    lazy_call(lambda: _set(lambda: torch.cuda.set_device(_device)))


def _bind_cupy(cupy: ModuleType) -> None:
    _set(lambda: cupy.cuda.runtime.setDevice(_device))


def _set(make: Callable[[], Any]) -> None:
    """Make the rank's GPU this thread's device; a failure is said once, never raised (the
    user's own code, which may have chosen its GPUs itself, goes on)."""
    _bound.done = True
    try:
        make()
    except Exception as exc:
        why = f"{type(exc).__name__}: {exc}"
        if why not in _warned:
            _warned.add(why)
            print(f"viceroy: could not make GPU {_device} (of CUDA_VISIBLE_DEVICES="
                  f"{os.environ.get('CUDA_VISIBLE_DEVICES', '<unset>')}) this rank's device: {why}. "
                  "Choose it in your code, e.g. torch.cuda.set_device(...)", file=sys.stderr)


# --- running code after a module is imported -------------------------------------------------


class _AfterImport:
    """A meta path finder that finds nothing itself: for a watched module it asks the finders
    after it, and wraps the loader they give so that the hook runs once the module is loaded."""

    def __init__(self) -> None:
        self.hooks: dict[str, Callable[[ModuleType], None]] = {}
        self.lock = threading.Lock()

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> ModuleSpec | None:
        if fullname not in self.hooks:
            return None
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None)
            if finder is self or find is None:
                continue
            spec = find(fullname, path, target)
            if spec is not None:
                break
        else:
            return None
        with self.lock:
            hook = self.hooks.pop(fullname, None)
            if not self.hooks and self in sys.meta_path:
                sys.meta_path.remove(self)
        if hook is not None and spec.loader is not None and hasattr(spec.loader, "exec_module"):
            spec.loader = _ThenLoader(spec.loader, hook)
        return spec


class _ThenLoader:
    """A module's own loader, then the hook; the module keeps its own loader afterwards."""

    def __init__(self, loader: Any, hook: Callable[[ModuleType], None]) -> None:
        self._loader = loader
        self._hook = hook

    def create_module(self, spec: ModuleSpec) -> ModuleType | None:
        create = getattr(self._loader, "create_module", None)
        return create(spec) if create is not None else None

    def exec_module(self, module: ModuleType) -> None:
        self._loader.exec_module(module)
        module.__loader__ = self._loader
        if module.__spec__ is not None:
            module.__spec__.loader = self._loader
        try:
            self._hook(module)
        except Exception as exc:  # the import itself succeeded: it stands
            print(f"viceroy: after importing {module.__name__}: {type(exc).__name__}: {exc}", file=sys.stderr)

    def __getattr__(self, name: str) -> Any:  # get_resource_reader, is_package, ... during exec
        return getattr(self._loader, name)


_finder = _AfterImport()


def after_import(name: str, hook: Callable[[ModuleType], None]) -> None:
    """Run ``hook(module)`` once the top-level module `name` is first imported in this process
    (not if it is already: check ``sys.modules`` first)."""
    with _finder.lock:
        _finder.hooks[name] = hook
        if _finder not in sys.meta_path:
            sys.meta_path.insert(0, _finder)
