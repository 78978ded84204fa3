"""The data plane: collectives among ranks, on gloo (CPU tensors) and nccl (GPU tensors).

On a rank::

    import viceroy as vr, torch
    t = torch.ones(4) * rank
    vr.all_reduce(t, op="sum", dims="gpus")     # also all_gather, reduce_scatter, broadcast,
                                                # send/recv, barrier; dims=None: the whole mesh

Importing this package imports neither torch nor CuPy; the backends do, on first use.
"""

from __future__ import annotations

from viceroy.runtime.collectives.api import (
    all_gather,
    all_reduce,
    barrier,
    broadcast,
    recv,
    reduce_scatter,
    send,
)
from viceroy.runtime.collectives.checking import check_collectives
from viceroy.runtime.collectives.entries import set_timeout
from viceroy.runtime.collectives.errors import BackendUnavailable, CollectiveError


def abort_all() -> int:
    """Release this rank from every collective it is blocked in, viceroy's and stock
    torch.distributed's (gloo groups built after `install_torch_hooks`, NCCL groups): their
    connections are cut, the blocked call raises, the peers' calls too. Callable from any
    thread; meant for the runtime's interrupt path. Returns how many communicators were hit."""
    import sys

    from viceroy.runtime.collectives.entries import abort_all as _ours

    hit = _ours()
    if "torch.distributed" in sys.modules:
        from viceroy.runtime.collectives.stock import abort_torch_groups

        hit += abort_torch_groups()
    return hit


def install_torch_hooks() -> None:
    """Track the gloo groups stock torch.distributed code builds on this rank, so `abort_all`
    can release them. Imports torch.distributed."""
    from viceroy.runtime.collectives.stock import install

    install()


def reinit_process_group(backend: str | None = None, timeout: float = 300.0) -> None:
    """On every rank, together: a new default torch.distributed process group in place of the
    current one (one cut to release a blocked collective cannot be used again). Imports torch.
    See `viceroy.runtime.collectives.stock.reinit_process_group`."""
    from viceroy.runtime.collectives.stock import reinit_process_group as _reinit

    _reinit(backend, timeout)


__all__ = [
    "BackendUnavailable",
    "CollectiveError",
    "abort_all",
    "all_gather",
    "all_reduce",
    "barrier",
    "broadcast",
    "check_collectives",
    "install_torch_hooks",
    "recv",
    "reduce_scatter",
    "reinit_process_group",
    "send",
    "set_timeout",
]
