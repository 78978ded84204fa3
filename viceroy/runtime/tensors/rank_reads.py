"""What the controller asks of one of a rank's engine tensors: the tensor itself, for rank code
given a MeshTensor (`resolve`); its values, for a fetch (`get`); a summary, for `vr.inspect`
(`summary`). Each raises `worker.OpFailed` naming why the tensor has no value on this rank (the
op that failed first, and its line), never returning an old value.

Functions here are sent by reference, as `worker`'s are, and run on the rank's main thread in
order with its other calls (after the ops the controller issued before asking).
"""

from __future__ import annotations

from typing import Any

from viceroy.runtime import handles
from viceroy.runtime.context import context
from viceroy.runtime.tensors.worker import OpFailed, lookup, table


def resolve(tid: int, token: str, describe: str) -> Any:
    """A MeshTensor sent to the ranks, as this rank's own tensor (see MeshTensor.as_handle)."""
    if context().mesh_token != token:
        raise ValueError(f"a MeshTensor of mesh ({describe}) reached a rank of another mesh")
    t = lookup(table(), tid)
    handles.resolved(tid, t)
    return t


def get(tid: int, shape: tuple[int, ...] | None = None, dtype: Any = None) -> Any:
    """This rank's tensor, on the CPU; OpFailed if it is not of the `shape` and `dtype` the
    controller has for it (rank code changed it, where only its values may change)."""
    t = lookup(table(), tid)
    if shape is not None and (tuple(t.shape) != shape or t.dtype != dtype):
        def kind(dt: Any, sh: tuple[int, ...]) -> str:
            return f"{str(dt).removeprefix('torch.')}[{', '.join(map(str, sh))}]"

        raise OpFailed(f"this tensor is {kind(t.dtype, tuple(t.shape))} here, but {kind(dtype, shape)} on the "
                       "controller, which checks the ops on it against that: rank code changed it (it may change "
                       "a MeshTensor's values in place, not its shape or dtype). Take it as it is with "
                       "mesh.run(lambda t: t, t), and make the MeshTensor again under mesh.activate()")
    return t.detach().cpu()


def summary(tid: int) -> dict[str, Any]:
    """Shape, dtype, device, min, max, mean, norm. A complex tensor has no min or max (None);
    its mean is a complex number and its norm the norm of the complex values."""
    import torch

    t = lookup(table(), tid)
    some = t.numel() > 0
    if t.is_complex():
        c = t.detach().to(torch.complex128)
        mean: Any = complex(c.mean()) if some else None
        return {"shape": tuple(t.shape), "dtype": str(t.dtype).removeprefix("torch."), "device": str(t.device),
                "min": None, "max": None, "mean": mean, "norm": float(c.norm()) if some else None}
    f = t.detach().float()
    return {
        "shape": tuple(t.shape),
        "dtype": str(t.dtype).removeprefix("torch."),
        "device": str(t.device),
        "min": float(f.min()) if some else None,
        "max": float(f.max()) if some else None,
        "mean": float(f.mean()) if some else None,
        "norm": float(f.norm()) if some else None,
    }
