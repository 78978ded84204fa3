"""nccl through CuPy (``cupy.cuda.nccl``), for CuPy arrays and torch CUDA tensors: whether it
can run here, and how a group's members build one communicator (its operations: `nccl_comm`).

Nothing here imports CuPy until a GPU tensor asks for it; without CuPy or a GPU the backend
says why (`unavailable`) and is never half-used. Members check that each has a GPU of its own,
pass the NCCL unique id through the rendezvous store, and warm the communicator up before it is
handed out; one communicator per (group, device).

First run on a GPU in session 32 (one H200, CuPy 14, NCCL 2.28): ``bench/gpu_check.sh``
exercises every operation there on a one-rank communicator, and NCCL between ranks where a
machine has several GPUs.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import socket
import sys
import time
from datetime import timedelta
from typing import Any

from viceroy.runtime import devices
from viceroy.runtime.collectives.backend import Backend, Communicator
from viceroy.runtime.collectives.nccl_comm import (
    NcclCommunicator,
    NcclFailure,
    is_torch,
    tensor_device,
)
from viceroy.runtime.shape import describe_ranks

__all__ = ["NcclBackend", "NcclFailure", "shared_gpus", "unique_id_from", "unique_id_text"]

SKIPPED = "skipped: needs CuPy and a GPU"
_usable = False  # unavailable() found CuPy, NCCL and a GPU once: a process keeps them


class NcclBackend(Backend):
    name = "nccl"

    def unavailable(self) -> str | None:
        global _usable
        if _usable:
            return None
        if "torch" not in sys.modules and importlib.util.find_spec("torch") is not None:
            # torch's wheel ships libnccl (nvidia-nccl-cu12) and loads it; CuPy's wheel has none
            # of its own and finds the one already loaded. Once cupy.cuda.nccl was imported
            # without it, it stays unavailable in this process.
            with contextlib.suppress(Exception):
                import torch  # noqa: F401
        try:
            import cupy
            from cupy.cuda import nccl
        except Exception as exc:  # ImportError, or CuPy failing to load a CUDA library
            return (f"nccl {SKIPPED} ({exc}); install the gpu extra (pip install "
                    "'viceroy-kernel[gpu]') on a machine with a GPU, or use CPU tensors (gloo)")
        if not getattr(nccl, "available", True):  # CuPy imports, but found no libnccl
            return (f"nccl {SKIPPED}: CuPy found no NCCL library; pip install nvidia-nccl-cu12 (or "
                    "import torch first, which ships one), or use CPU tensors (gloo)")
        try:
            count = cupy.cuda.runtime.getDeviceCount()
        except Exception as exc:
            return f"nccl {SKIPPED}: no usable GPU ({type(exc).__name__}: {exc})"
        if count == 0:
            return f"nccl {SKIPPED}: no GPU visible (CUDA_VISIBLE_DEVICES?)"
        _usable = True
        return None

    def accepts(self, t: Any) -> bool:
        if is_torch(t):
            return bool(t.is_cuda)
        return type(t).__module__.split(".")[0] == "cupy"

    def device_of(self, t: Any) -> int | None:
        return tensor_device(t)

    def is_failure(self, error: BaseException) -> bool:
        from cupy.cuda import nccl

        return isinstance(error, NcclFailure | nccl.NcclError)

    def connect(self, store: Any, index: int, size: int, device: int | None, timeout: float) -> Communicator:
        import cupy
        from cupy.cuda import nccl

        from viceroy.runtime.context import context

        dev = cupy.cuda.Device(device if device is not None else devices.own() or 0)
        with dev:
            # NCCL refuses two members on one GPU with only "invalid usage": say which, and why.
            store.set(f"gpu/{index}", json.dumps([context().rank, socket.gethostname(), _boot_id(), dev.pci_bus_id, dev.id]))
            keys = [f"gpu/{i}" for i in range(size)]
            store.wait(keys, timedelta(seconds=timeout))
            if shared := shared_gpus([json.loads(store.get(k)) for k in keys]):
                raise NcclFailure(shared)
            if index == 0:
                uid = nccl.get_unique_id()
                store.set("uid", unique_id_text(uid))
            else:
                store.wait(["uid"], timedelta(seconds=timeout))
                uid = unique_id_from(store.get("uid"))
            comm = nccl.NcclCommunicator(size, uid, index)
            try:
                _warm_up(comm, index, size, timeout)
            except BaseException:
                with contextlib.suppress(Exception):
                    comm.abort()
                raise
        return NcclCommunicator(comm, size, timeout)


def _boot_id() -> str:
    """This machine, as its kernel names it since boot: containers of one machine share it (and
    its GPUs); machines that share a host name (two containers called "localhost") do not."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:
        return socket.gethostname()


def shared_gpus(members: list[list[Any]]) -> str:
    """Why these members cannot form one NCCL communicator, or "": each is ``[rank, host name,
    boot id, PCI bus id, device index]``, and NCCL takes one member per GPU."""
    by_gpu: dict[tuple[str, str], list[list[Any]]] = {}
    for m in members:
        by_gpu.setdefault((m[2], m[3]), []).append(m)
    shared = [ms for ms in by_gpu.values() if len(ms) > 1]
    if not shared:
        return ""
    what = "; ".join(f"{describe_ranks(sorted(m[0] for m in ms))} share GPU {ms[0][4]} of {ms[0][1]} ({ms[0][3]})"
                     for ms in shared)
    machines = {m[2]: m[1] for m in members}
    found = ", ".join(f"{len({m[3] for m in members if m[2] == b})} on {name}" for b, name in sorted(machines.items(), key=lambda kv: kv[1]))
    return (f"{what}, and NCCL takes one rank per GPU: start at most as many ranks per host as it has "
            f"GPUs (the group found {found}), or use --backend gloo (GPU tensors then go through the "
            "CPU), or move these tensors to the CPU")


def unique_id_text(uid: bytes | tuple[int, ...]) -> str:
    """NCCL's unique id as text for the store, in the form this CuPy gave it: bytes from CuPy 14
    on, a tuple of (signed char) ints before. NcclCommunicator takes back only that form."""
    if isinstance(uid, bytes | bytearray):
        return json.dumps({"bytes": bytes(uid).hex()})
    return json.dumps({"ints": list(uid)})


def unique_id_from(text: str | bytes) -> bytes | tuple[int, ...]:
    got = json.loads(text)
    return bytes.fromhex(got["bytes"]) if "bytes" in got else tuple(got["ints"])


def _warm_up(comm: Any, index: int, size: int, timeout: float) -> None:
    """One tiny all_reduce and one grouped send/receive with the ring neighbours, here on the
    helper thread (which an interrupt may abandon), before the communicator is handed out.
    NCCL (2.22+ by default) connects peers lazily, inside the first operation that needs them,
    and that host-side wait for the peers cannot be interrupted nor aborted safely; this moves
    the first connections here, and proves the communicator works before any user data moves.
    Raises (and the caller aborts the communicator, releasing its kernels) if a peer does not
    take part within `timeout`."""
    import cupy
    from cupy.cuda import nccl

    buf = cupy.zeros(2, dtype=cupy.uint8)  # (one member: it sends to itself, as NCCL allows)
    stream = cupy.cuda.Stream(non_blocking=True)
    comm.allReduce(buf.data.ptr, buf.data.ptr, 1, nccl.NCCL_UINT8, nccl.NCCL_SUM, stream.ptr)
    nccl.groupStart()
    try:
        comm.send(buf.data.ptr, 1, nccl.NCCL_UINT8, (index + 1) % size, stream.ptr)
        comm.recv(buf.data.ptr + 1, 1, nccl.NCCL_UINT8, (index - 1) % size, stream.ptr)
    finally:
        nccl.groupEnd()
    done = cupy.cuda.Event(block=False, disable_timing=True)
    done.record(stream)
    deadline = time.monotonic() + timeout
    while not done.done:
        comm.check_async_error()
        if time.monotonic() > deadline:
            raise NcclFailure(f"the group's first operation did not complete within {timeout:g} s")
        time.sleep(0.001)
