"""Which device an op names, as PyTorch code names it: on the controller a MeshTensor's
``.device`` reads ``meta`` (only its shape and dtype are there), and ``"cuda"`` (no index) is each
rank's own GPU. Either, given to an op (``y.to(x.device)``, ``x.to("cuda")``, ``x.cuda()``,
``x.new_zeros(n, device=x.device)``), means where the MeshTensor lives on each rank: the rank's
own device (its GPU, or the CPU on a rank without one), as for a factory (`activation`).

`placed` rewrites such an op twice: for the meta run here (``"meta"``) and for the ranks
(`OwnDevice`, which `worker.apply_batch` turns into the rank's device).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch


@dataclass(frozen=True)
class OwnDevice:
    """Stands for the rank's own device inside an op's arguments."""


_OWN = OwnDevice()
_NAMES = frozenset({"cuda", "meta"})


def is_own(device: Any) -> bool:
    """Whether `device` (a str or a torch.device) means the rank's own device: ``"cuda"``
    with no index, or ``meta`` (a MeshTensor's ``.device`` on the controller)."""
    return isinstance(device, str | torch.device) and str(device) in _NAMES


def _numbered(device: Any) -> bool:
    """A GPU named by its index (``"cuda:0"``, ``torch.device("cuda", 1)``)."""
    try:
        d = torch.device(device) if isinstance(device, str | torch.device) else None
    except RuntimeError:
        return False
    return d is not None and d.type == "cuda" and d.index is not None


def _refuse_numbered(what: str) -> None:
    raise RuntimeError(f"{what}: a MeshTensor lives on each rank's own device; a numbered GPU would be the same one "
                       "on every rank. Name the rank's own: \"cuda\" or x.device (each rank's GPU, or its CPU on a "
                       "rank without one)")


def placed(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, ...] | None:
    """``(func, meta_args, meta_kwargs, rank_args, rank_kwargs)`` for an op that names the
    rank's own device, None for any other. ``t.cuda()`` is ``t.to(own device)`` (``model.cuda()``
    calls ``t.cuda(None)``)."""
    name = getattr(func, "__name__", "")
    if name == "cuda" and func is torch.Tensor.cuda:
        index = kwargs.get("device", args[1] if len(args) > 1 else None)
        if isinstance(index, int) or _numbered(index):
            _refuse_numbered(f"cuda({index})")
    if name == "to":
        for d in (*args[1:], kwargs.get("device")):
            if _numbered(d):
                _refuse_numbered(f"to({torch.device(d)})")
    if name == "cuda" and func is torch.Tensor.cuda and (len(args) == 1 or (len(args) == 2 and args[1] is None)) \
            and kwargs.get("device") is None:
        rest = {k: v for k, v in kwargs.items() if k != "device"}
        return torch.Tensor.to, (args[0], "meta"), rest, (args[0], _OWN), rest
    own_kw = is_own(kwargs.get("device"))
    at = [i for i, a in enumerate(args) if i and is_own(a)] if name == "to" else []
    if not own_kw and not at:
        return None
    meta_args, rank_args = list(args), list(args)
    for i in at:
        meta_args[i], rank_args[i] = "meta", _OWN
    meta_kw, rank_kw = dict(kwargs), dict(kwargs)
    if own_kw:
        meta_kw["device"], rank_kw["device"] = "meta", _OWN
    return func, tuple(meta_args), meta_kw, tuple(rank_args), rank_kw
