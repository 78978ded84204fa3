"""nccl through CuPy (``cupy.cuda.nccl``), for CuPy arrays and torch CUDA tensors.

Nothing here imports CuPy until a GPU tensor asks for it; without CuPy or a GPU the backend
says why (`unavailable`) and is never half-used. The NCCL unique id travels through the
rendezvous store, one communicator per (group, device).

Operations run on the tensor's current stream (torch's for torch tensors, CuPy's for CuPy
arrays) and the call returns when they are done, like the gloo path; waiting polls a CUDA event
in short slices so an interrupt gets through, and aborting calls ``ncclCommAbort``.
"""

from __future__ import annotations

import json
import threading
import time
from datetime import timedelta
from typing import Any

from viceroy.runtime.collectives.backend import Backend, Communicator, Pending

SKIPPED = "skipped: needs CuPy and a GPU"


def _is_torch(t: Any) -> bool:
    return type(t).__module__.split(".")[0] == "torch"


def _buffer(t: Any) -> tuple[int, int, Any]:
    """(device pointer, element count, dtype key) of a CuPy array or torch CUDA tensor."""
    if _is_torch(t):
        return t.data_ptr(), t.numel(), str(t.dtype).removeprefix("torch.")
    return t.data.ptr, t.size, t.dtype.name


def _stream(t: Any) -> Any:
    """The stream the caller's work on `t` is queued on, as a CuPy stream."""
    import cupy

    if _is_torch(t):
        import torch

        ptr = torch.cuda.current_stream(t.device).cuda_stream
        return cupy.cuda.ExternalStream(ptr)
    return cupy.cuda.get_current_stream()


class NcclPending(Pending):
    def __init__(self, comm: Any, stream: Any, after: Any = None) -> None:
        import cupy

        self._comm = comm
        self._event = cupy.cuda.Event(block=False, disable_timing=True)
        self._event.record(stream)
        self._after = after

    def wait(self, seconds: float) -> bool:
        # Spin briefly (small messages finish in microseconds), then back off to sleeping.
        end = time.monotonic() + seconds
        spin_until = time.monotonic() + 200e-6
        delay = 20e-6
        while not self._event.done:
            self._comm.check_async_error()  # a peer's failure, seen by NCCL
            now = time.monotonic()
            if now >= end:
                return False
            if now > spin_until:
                time.sleep(min(delay, end - now))
                delay = min(delay * 2, 0.01)
        self._comm.check_async_error()
        if self._after is not None:
            self._after()
            self._after = None
        return True


class NcclCommunicator(Communicator):
    def __init__(self, comm: Any, size: int) -> None:
        self.comm = comm
        self._size = size
        self._lock = threading.Lock()
        self._aborted = False

    @staticmethod
    def _dtype(key: str) -> int:
        from cupy.cuda import nccl

        names = {
            "float32": "NCCL_FLOAT32", "float64": "NCCL_FLOAT64", "float16": "NCCL_FLOAT16",
            "bfloat16": "NCCL_BFLOAT16", "int32": "NCCL_INT32", "int64": "NCCL_INT64",
            "int8": "NCCL_INT8", "uint8": "NCCL_UINT8",
        }
        if key not in names or not hasattr(nccl, names[key]):
            raise TypeError(f"nccl does not move {key} tensors (it takes {', '.join(names)})")
        return int(getattr(nccl, names[key]))

    @staticmethod
    def _op(op: str) -> tuple[int, bool]:
        """(NCCL op, divide afterwards?)"""
        from cupy.cuda import nccl

        if op == "avg":
            return (nccl.NCCL_AVG, False) if hasattr(nccl, "NCCL_AVG") else (nccl.NCCL_SUM, True)
        table = {"sum": "NCCL_SUM", "product": "NCCL_PROD", "min": "NCCL_MIN", "max": "NCCL_MAX"}
        if op not in table:
            raise ValueError(f"nccl has no {op!r} reduction (it has sum, avg, product, min, max)")
        return int(getattr(nccl, table[op])), False

    def _divide(self, t: Any, divide: bool) -> Any:
        return (lambda: t.__itruediv__(self._size)) if divide else None

    def all_reduce(self, t: Any, op: str) -> Pending:
        ptr, n, dt = _buffer(t)
        nop, divide = self._op(op)
        s = _stream(t)
        self.comm.allReduce(ptr, ptr, n, self._dtype(dt), nop, s.ptr)
        return NcclPending(self.comm, s, self._divide(t, divide))

    def all_gather(self, outs: list[Any], t: Any) -> Pending:
        ptr, n, dt = _buffer(t)
        out_ptr = _buffer(outs[0])[0]  # the parts are consecutive rows of one buffer
        s = _stream(t)
        self.comm.allGather(ptr, out_ptr, n, self._dtype(dt), s.ptr)
        return NcclPending(self.comm, s)

    def reduce_scatter(self, out: Any, ins: list[Any], op: str) -> Pending:
        in_ptr = _buffer(ins[0])[0]  # the chunks are consecutive slices of one buffer
        out_ptr, n, dt = _buffer(out)
        nop, divide = self._op(op)
        s = _stream(out)
        self.comm.reduceScatter(in_ptr, out_ptr, n, self._dtype(dt), nop, s.ptr)
        return NcclPending(self.comm, s, self._divide(out, divide))

    def broadcast(self, t: Any, root: int) -> Pending:
        ptr, n, dt = _buffer(t)
        s = _stream(t)
        self.comm.broadcast(ptr, ptr, n, self._dtype(dt), root, s.ptr)
        return NcclPending(self.comm, s)

    def send(self, t: Any, peer: int) -> Pending:
        ptr, n, dt = _buffer(t)
        s = _stream(t)
        self.comm.send(ptr, n, self._dtype(dt), peer, s.ptr)
        return NcclPending(self.comm, s)

    def recv(self, t: Any, peer: int) -> Pending:
        ptr, n, dt = _buffer(t)
        s = _stream(t)
        self.comm.recv(ptr, n, self._dtype(dt), peer, s.ptr)
        return NcclPending(self.comm, s)

    def barrier(self) -> Pending:
        raise NotImplementedError("barrier runs on gloo")

    def abort(self) -> None:
        with self._lock:
            if self._aborted:
                return
            self._aborted = True
        self.comm.abort()


class NcclBackend(Backend):
    name = "nccl"

    def unavailable(self) -> str | None:
        try:
            import cupy
            from cupy.cuda import nccl  # noqa: F401
        except ImportError as exc:
            return (f"nccl {SKIPPED} ({exc}); install the gpu extra (pip install "
                    "'viceroy-kernel[gpu]') on a machine with a GPU, or use CPU tensors (gloo)")
        try:
            count = cupy.cuda.runtime.getDeviceCount()
        except Exception as exc:
            return f"nccl {SKIPPED}: no usable GPU ({type(exc).__name__}: {exc})"
        if count == 0:
            return f"nccl {SKIPPED}: no GPU visible (CUDA_VISIBLE_DEVICES?)"
        return None

    def accepts(self, t: Any) -> bool:
        if _is_torch(t):
            return bool(t.is_cuda)
        return type(t).__module__.split(".")[0] == "cupy"

    def device_of(self, t: Any) -> int | None:
        return int(t.device.index) if _is_torch(t) else int(t.device.id)

    def is_failure(self, error: BaseException) -> bool:
        from cupy.cuda import nccl

        return isinstance(error, nccl.NcclError | RuntimeError)

    def connect(self, store: Any, index: int, size: int, device: int | None, timeout: float) -> Communicator:
        import cupy
        from cupy.cuda import nccl

        with cupy.cuda.Device(device or 0):
            if index == 0:
                uid = nccl.get_unique_id()
                store.set("uid", json.dumps(list(uid)))
            else:
                store.wait(["uid"], timedelta(seconds=timeout))
                uid = tuple(json.loads(store.get("uid")))
            comm = nccl.NcclCommunicator(size, uid, index)
        return NcclCommunicator(comm, size)
