"""An NCCL communicator's operations (through CuPy), for CuPy arrays and torch CUDA tensors.

Operations run on the tensor's current stream (torch's for torch tensors, CuPy's for CuPy
arrays), with the tensor's device current, and the call returns when they are done, like the
gloo path; waiting polls a CUDA event in short slices so an interrupt gets through, and gives up
after the communicator's timeout (NCCL over shared memory or NVLink never reports a dead peer).
Aborting calls ``ncclCommAbort``; every use of the raw communicator holds one lock, so an abort
from another thread never frees it under a call in flight. `nccl.py` says when the backend can
run and how a group's members build one of these.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from typing import Any

from viceroy.runtime.collectives.backend import Communicator, Pending


def _uint8() -> int:
    from cupy.cuda import nccl

    return int(nccl.NCCL_UINT8)


def is_torch(t: Any) -> bool:
    return type(t).__module__.split(".")[0] == "torch"


def _buffer(t: Any) -> tuple[int, int, Any]:
    """(device pointer, element count, dtype key) of a CuPy array or torch CUDA tensor."""
    if is_torch(t):
        return t.data_ptr(), t.numel(), str(t.dtype).removeprefix("torch.")
    return t.data.ptr, t.size, t.dtype.name


def _bytes(t: Any) -> tuple[int, int]:
    """(device pointer, size in bytes): for operations that only move data, whatever the dtype
    (bool, int16, complex, float8 have no NCCL type of their own), sent as NCCL_UINT8."""
    if is_torch(t):
        return t.data_ptr(), t.numel() * t.element_size()
    return t.data.ptr, t.nbytes


def tensor_device(t: Any) -> int:
    return int(t.device.index) if is_torch(t) else int(t.device.id)


def _stream(t: Any) -> Any:
    """The stream the caller's work on `t` is queued on, as a CuPy stream."""
    import cupy

    if is_torch(t):
        import torch

        ptr = torch.cuda.current_stream(t.device).cuda_stream
        return cupy.cuda.ExternalStream(ptr)
    return cupy.cuda.get_current_stream()


class NcclPending(Pending):
    def __init__(self, comm: NcclCommunicator, stream: Any, after: Any = None) -> None:
        import cupy

        self._comm = comm
        self._event = cupy.cuda.Event(block=False, disable_timing=True)
        self._event.record(stream)
        self._after = after
        self._started = time.monotonic()
        self._deadline = self._started + comm.timeout

    def wait(self, seconds: float) -> bool:
        # Spin briefly (small messages finish in microseconds), then sleep in steps kept small
        # against the time already spent, so a long operation is noticed within ~10 % of its
        # duration (a bandwidth measurement would otherwise see the sleeps).
        end = time.monotonic() + seconds
        while not self._event.done:
            self._comm.check()  # a peer's failure, seen by NCCL
            now = time.monotonic()
            if now >= self._deadline:
                raise NcclFailure(
                    f"no progress in {self._comm.timeout:g} s: a peer is gone or stuck (NCCL over shared "
                    "memory or NVLink does not notice a dead peer by itself)"
                )
            if now >= end:
                return False
            spent = now - self._started
            if spent > 200e-6:
                time.sleep(min(max(20e-6, 0.1 * spent), 0.01, end - now))
        self._comm.check()
        if self._after is not None:
            self._after()
            self._after = None
        return True


class NcclFailure(RuntimeError):
    """The communicator is broken (aborted, timed out, or NCCL reported a failure)."""

    broken = True  # raised while starting an operation, it still means the group is broken


@contextlib.contextmanager
def _failures() -> Iterator[None]:
    """NCCL's errors from a call into the communicator, as NcclFailure: after one, the group is
    not usable (CuPy raises KeyError for codes it cannot name: 6 ncclRemoteError before
    cupy#8662, 7 ncclInProgress)."""
    from cupy.cuda import nccl

    try:
        yield
    except nccl.NcclError as exc:
        raise NcclFailure(str(exc)) from None
    except KeyError as exc:
        code = exc.args[0] if exc.args else "?"
        why = " (ncclRemoteError: a peer exited or the network failed)" if code == 6 else ""
        raise NcclFailure(f"NCCL error {code}{why}") from None


class NcclCommunicator(Communicator):
    def __init__(self, comm: Any, size: int, timeout: float) -> None:
        self._comm = comm
        self._size = size
        self.timeout = timeout
        self._lock = threading.Lock()  # held around every use of the raw communicator
        self._aborted = False

    def _call(self, method: str, *args: Any) -> None:
        with self._lock:
            if self._aborted:
                raise NcclFailure("the nccl communicator was aborted")
            with _failures():
                getattr(self._comm, method)(*args)

    def check(self) -> None:
        """Raise NcclFailure if NCCL saw the group fail (ncclCommGetAsyncError)."""
        self._call("check_async_error")

    @staticmethod
    def _dtype(key: str) -> int:
        """The NCCL type that reduces `key` elements (bool as uint8, as torch does)."""
        from cupy.cuda import nccl

        names = {
            "float32": "NCCL_FLOAT32", "float64": "NCCL_FLOAT64", "float16": "NCCL_FLOAT16",
            "bfloat16": "NCCL_BFLOAT16", "int32": "NCCL_INT32", "int64": "NCCL_INT64",
            "int8": "NCCL_INT8", "uint8": "NCCL_UINT8", "uint32": "NCCL_UINT32", "uint64": "NCCL_UINT64",
            "bool": "NCCL_UINT8",
        }
        if key not in names or not hasattr(nccl, names[key]):
            raise TypeError(f"nccl cannot reduce {key} tensors (it reduces {', '.join(names)}); "
                            "broadcast, all_gather, send/recv and to_mesh move any dtype")
        return int(getattr(nccl, names[key]))

    @staticmethod
    def _op(op: str, key: str = "") -> tuple[int, bool]:
        """(NCCL op, divide afterwards?) for elements of dtype `key`."""
        from cupy.cuda import nccl

        if key == "bool":  # 0/1 bytes: sum is "any", product is "all" (as torch maps them)
            if op not in ("sum", "max", "product", "min"):
                raise ValueError(f"nccl reduces bool tensors with sum, product, min or max, not {op!r}")
            return int(nccl.NCCL_MAX if op in ("sum", "max") else nccl.NCCL_MIN), False
        if op == "avg":  # the constant is always there; the library has it from 2.10
            return (nccl.NCCL_AVG, False) if nccl.get_version() >= 21000 else (nccl.NCCL_SUM, True)
        table = {"sum": "NCCL_SUM", "product": "NCCL_PROD", "min": "NCCL_MIN", "max": "NCCL_MAX"}
        if op not in table:
            raise ValueError(f"nccl has no {op!r} reduction (it has sum, avg, product, min, max)")
        return int(getattr(nccl, table[op])), False

    def _divide(self, t: Any, divide: bool) -> Any:
        return (lambda: t.__itruediv__(self._size)) if divide else None

    def _start(self, t: Any, method: str, *args: Any, after: Any = None) -> Pending:
        """Queue `method` on `t`'s stream, with `t`'s device current (the event too)."""
        import cupy

        with cupy.cuda.Device(tensor_device(t)):
            s = _stream(t)
            self._call(method, *args, s.ptr)
            return NcclPending(self, s, after)

    def all_reduce(self, t: Any, op: str) -> Pending:
        ptr, n, dt = _buffer(t)
        nop, divide = self._op(op, dt)
        return self._start(t, "allReduce", ptr, ptr, n, self._dtype(dt), nop, after=self._divide(t, divide))

    def all_gather(self, outs: list[Any], t: Any) -> Pending:
        ptr, nbytes = _bytes(t)
        out_ptr = _bytes(outs[0])[0]  # the parts are consecutive rows of one buffer
        return self._start(t, "allGather", ptr, out_ptr, nbytes, _uint8())

    def reduce_scatter(self, out: Any, ins: list[Any], op: str) -> Pending:
        in_ptr = _buffer(ins[0])[0]  # the chunks are consecutive slices of one buffer
        out_ptr, n, dt = _buffer(out)
        nop, divide = self._op(op, dt)
        return self._start(out, "reduceScatter", in_ptr, out_ptr, n, self._dtype(dt), nop, after=self._divide(out, divide))

    def broadcast(self, t: Any, root: int) -> Pending:
        ptr, nbytes = _bytes(t)
        return self._start(t, "broadcast", ptr, ptr, nbytes, _uint8(), root)

    def send(self, t: Any, peer: int) -> Pending:
        ptr, nbytes = _bytes(t)
        return self._start(t, "send", ptr, nbytes, _uint8(), peer)

    def recv(self, t: Any, peer: int) -> Pending:
        ptr, nbytes = _bytes(t)
        return self._start(t, "recv", ptr, nbytes, _uint8(), peer)

    def exchange(self, out: Any, to: int | None, into: Any, frm: int | None) -> Pending:
        """A send and a receive in one NCCL group call: issued one after the other on one
        stream, two ranks sending to each other would each wait for the other's receive."""
        import cupy
        from cupy.cuda import nccl

        t = out if out is not None else into
        u8 = _uint8()  # everything needed is computed before the group: nothing raises inside
        sent = None if out is None else _bytes(out)
        taken = None if into is None else _bytes(into)
        with cupy.cuda.Device(tensor_device(t)):
            s = _stream(t)
            with self._lock:
                if self._aborted:
                    raise NcclFailure("the nccl communicator was aborted")
                with _failures():
                    nccl.groupStart()
                    try:
                        if sent is not None:
                            self._comm.send(sent[0], sent[1], u8, to, s.ptr)
                        if taken is not None:
                            self._comm.recv(taken[0], taken[1], u8, frm, s.ptr)
                    finally:
                        nccl.groupEnd()
            return NcclPending(self, s)

    def barrier(self) -> Pending:
        raise NotImplementedError("barrier runs on gloo")

    def abort(self) -> None:
        with self._lock:
            if self._aborted:
                return
            self._aborted = True
            with contextlib.suppress(Exception):  # an abort never fails: the comm is gone either way
                self._comm.abort()

    def healthy(self) -> bool | None:
        # Aborted here (an interrupt aborts every communicator, idle ones too): rebuild. Else
        # NCCL cannot tell without an operation: ask the store whether a peer gave it up.
        return False if self._aborted else None
