"""Values to bytes and back: cloudpickle for code, raw out-of-band frames for array data.

numpy arrays and torch CPU tensors are not copied into the pickle stream: their memory travels
as separate buffers (pickle protocol 5), which ZeroMQ sends as frames without copying.
"""

from __future__ import annotations

import io
import math
import pickle
import sys
from collections.abc import Sequence
from typing import Any

import cloudpickle

# Buffers smaller than this stay in-band: a frame per tiny array costs more than the copy.
OUT_OF_BAND_MIN = 16 * 1024


# What is sent as a reference to something on the ranks, checked before sending (MeshTensors too).
_CHECKED = {("Ref", "viceroy.runtime.handles"), ("ActorMesh", "viceroy.runtime.actors.actor_mesh")}


class _Pickler(cloudpickle.CloudPickler):
    def __init__(self, *args: Any, seen_refs: list[Any] | None = None, to_host: bool = False, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.seen_refs = seen_refs
        self.to_host = to_host

    def reducer_override(self, obj: Any) -> Any:
        torch = sys.modules.get("torch")
        if torch is not None and type(obj) is torch.Tensor:
            if obj.device.type == "cpu":
                return _reduce_tensor(obj)
            if self.to_host and obj.device.type != "meta":
                return _reduce_tensor(_host_copy(obj, torch))
        name = type(obj).__name__
        if (name, type(obj).__module__) in _CHECKED:
            if self.seen_refs is not None:
                self.seen_refs.append(obj)
        elif name == "MeshTensor" and type(obj).__module__ == "viceroy.runtime.tensors.mesh_tensor":
            if self.seen_refs is not None:
                self.seen_refs.append(obj)
            return obj.as_handle()  # each rank's own tensor
        elif isinstance(obj, io.IOBase) and not isinstance(obj, (io.BytesIO, io.StringIO)) and not _is_std_stream(obj):
            # cloudpickle would read the whole file into a StringIO: another kind of object,
            # detached from the file, the file read to its end.
            file_name = getattr(obj, "name", None)
            what = f"an open file ({file_name!r})" if isinstance(file_name, str) else f"an open {type(obj).__name__}"
            raise pickle.PicklingError(
                f"{what} cannot be sent to another process: send its name, or what you read from it")
        return super().reducer_override(obj)


def _is_std_stream(obj: Any) -> bool:
    """sys.stdout and its kind, which cloudpickle sends as "this process's own"."""
    return any(obj is getattr(sys, n, None) for n in ("stdin", "stdout", "stderr", "__stdin__", "__stdout__", "__stderr__"))


PINNED_MIN = 1 << 20  # device tensors this large come to the host through page-locked memory
PINNED_MAX = 256 << 20  # ... in one piece up to this size; larger ones in pieces of STAGE bytes
STAGE = 64 << 20


def _host_copy(t: Any, torch: Any) -> Any:
    """A device tensor's copy in host memory. `.cpu()` copies into fresh pageable memory, which
    the driver stages through a bounce buffer of its own while the kernel faults the pages in:
    on an H200 (a VM) 256 MiB came over at 1.1-1.8 GB/s. A large CUDA tensor is copied into
    page-locked memory from torch's caching host allocator instead, which DMA fills at full speed
    (53-55 GB/s there) and which the next answer reuses. That cache keeps what it has allocated
    (rounded up to a power of two), so a tensor over PINNED_MAX goes through one page-locked
    piece of STAGE bytes at a time into ordinary memory: what stays locked on the rank is bounded
    by the block sizes up to PINNED_MAX, whatever it returns. bench/gpu_check.sh measures each way."""
    t = t.detach()
    nbytes = t.numel() * t.element_size()
    if t.device.type != "cuda" or nbytes < PINNED_MIN:
        return t.cpu()
    if nbytes <= PINNED_MAX:
        return torch.empty(t.shape, dtype=t.dtype, pin_memory=True).copy_(t)
    src = t.contiguous().reshape(-1).view(torch.uint8)
    out = torch.empty(t.shape, dtype=t.dtype)
    dst = out.reshape(-1).view(torch.uint8)
    stage = torch.empty(STAGE, dtype=torch.uint8, pin_memory=True)
    for start in range(0, nbytes, STAGE):
        n = min(STAGE, nbytes - start)
        stage[:n].copy_(src[start : start + n])
        dst[start : start + n].copy_(stage[:n])
    return out


_SAME_SIZE_INT = {1: "uint8", 2: "int16", 4: "int32", 8: "int64"}


def _reduce_tensor(t: Any) -> Any:
    import torch

    if t.layout != torch.strided or t.is_quantized:
        return NotImplemented
    base = t.detach().contiguous()
    try:
        arr = base.numpy()
    except (TypeError, RuntimeError):  # no numpy dtype (bfloat16, float8s, complex32...): as raw ints
        raw = _SAME_SIZE_INT.get(base.element_size())
        if raw is None:
            return NotImplemented
        try:
            arr = base.view(getattr(torch, raw)).numpy()
        except (TypeError, RuntimeError):
            return NotImplemented
    dtype = base.dtype
    return _rebuild_tensor, (arr, str(dtype).removeprefix("torch."), t.requires_grad)


def _rebuild_tensor(arr: Any, dtype: str, requires_grad: bool) -> Any:
    import torch

    if not arr.flags.writeable:
        arr = arr.copy()
    t = torch.from_numpy(arr)
    target = getattr(torch, dtype)
    if t.dtype != target:
        t = t.view(target)
    if requires_grad:
        t.requires_grad_(True)
    return t


def dumps(
    obj: Any, seen_refs: list[Any] | None = None, to_host: bool = False
) -> tuple[bytes, list[pickle.PickleBuffer]]:
    """``obj`` -> (pickle stream, out-of-band buffers). Handles (and MeshTensors, handles to
    one tensor per rank, and actor meshes) met on the way are appended to `seen_refs`, so the
    caller can check them (`check_usable_on`) before sending. `to_host`: torch tensors on a
    GPU travel as CPU tensors (a rank's results: the controller may have no GPU, and should
    not start CUDA to read a value)."""
    buffers: list[pickle.PickleBuffer] = []

    def keep(buf: pickle.PickleBuffer) -> bool:
        if buf.raw().nbytes < OUT_OF_BAND_MIN:
            return True  # in-band
        buffers.append(buf)
        return False

    f = io.BytesIO()
    _Pickler(f, protocol=5, buffer_callback=keep, seen_refs=seen_refs, to_host=to_host).dump(obj)
    return f.getvalue(), buffers


_SCALARS = frozenset({int, float, bool, str, type(None)})
MAX_INLINE_STR = 1024


def json_scalar(value: Any) -> bool:
    """True for values JSON gives back with the same type and value, whether json or orjson
    reads it (ints within 64 bits, finite floats, bool, None, and strings up to
    `MAX_INLINE_STR` characters): these can travel inside a message's header instead of as a
    pickle, which lets an agent send a host's results as one column."""
    t = type(value)
    if t is float:
        return math.isfinite(value)
    if t is int:
        return -(1 << 63) <= value < 1 << 64
    return t in _SCALARS and (t is not str or len(value) <= MAX_INLINE_STR)


def loads(data: bytes | memoryview, buffers: Sequence[Any] = ()) -> Any:
    """Inverse of `dumps`. Buffers are made writable (one copy) so received arrays can be
    modified in place, as users expect."""
    return pickle.loads(data, buffers=[_writable(b) for b in buffers])


def _writable(buf: Any) -> Any:
    mv = memoryview(buf)
    return mv if not mv.readonly else bytearray(mv)


def check_picklable(values: dict[str, Any]) -> None:
    """Raise a TypeError naming the first value that cannot be sent."""
    for name, value in values.items():
        try:
            dumps(value)
        except Exception as exc:
            raise TypeError(
                f"{name} ({type(value).__name__}) cannot be sent to the ranks: {exc}. "
                "Create it on the ranks instead, or send something picklable."
            ) from None
