"""Stock torch.distributed groups on a rank: make them abortable too.

``init_process_group()`` and ``new_group()`` build their gloo groups through
``torch.distributed.distributed_c10d.ProcessGroupGloo``. `install` puts a subclass there that
notes each group's sockets as it is built, so `abort_torch_groups` can release a rank blocked in
stock code (DDP's allreduce, ``dist.barrier()``): the blocked call raises "Connection closed",
on this rank and on its peers. NCCL groups have a real ``abort()``, which is called instead.
"""

from __future__ import annotations

import os
import threading
from datetime import timedelta
from typing import Any

from viceroy.runtime.collectives import sockets

_lock = threading.Lock()
# The sockets of each group, by (fd, inode): the Python wrapper of a group does not live as
# long as the group, and a group destroyed since has closed its fds, which `cut` then skips.
_groups: list[list[sockets.Socket]] = []


def install() -> None:
    """Idempotent; imports torch.distributed (cheap once torch is imported)."""
    import torch.distributed.distributed_c10d as c10d

    base = c10d.ProcessGroupGloo
    if getattr(base, "_viceroy_tracked", False):
        return

    class ProcessGroupGloo(base):  # type: ignore[misc, valid-type]
        _viceroy_tracked = True

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            before = sockets.socket_fds()
            super().__init__(*args, **kwargs)
            new = {fd: link for fd, link in sockets.socket_fds().items() if before.get(fd) != link}
            store_port = int(os.environ.get("MASTER_PORT", "0") or 0)
            found = sockets.tcp_sockets(new, exclude_port=store_port)
            conns = [s for s, (_, listening) in found.items() if not listening]
            with _lock:
                _groups[:] = [g for g in _groups if any(sockets.is_current(s) for s in g)]
                _groups.append(conns)

    ProcessGroupGloo.__name__ = ProcessGroupGloo.__qualname__ = "ProcessGroupGloo"
    c10d.ProcessGroupGloo = ProcessGroupGloo  # type: ignore[misc]


# What gloo says when a connection of its group is gone (cut by `abort_torch_groups` here or on a
# peer, or a peer exited).
_GLOO_LOST = ("Connection closed by peer", "Connection reset by peer", "Broken pipe")
RECOVER = (
    "on every rank run `vr.reinit_process_group()` (and wrap models in DistributedDataParallel "
    "again: they hold the old group)"
)


def explain(exc: BaseException) -> str | None:
    """For an error a stock gloo group raised because its connections are gone: a summary that
    says what happened and how to go on (a gloo group never works again after that). Else None."""
    text = str(exc)
    if not isinstance(exc, RuntimeError) or "gloo/transport" not in text or not any(s in text for s in _GLOO_LOST):
        return None
    return (
        f"{type(exc).__name__}: this torch.distributed group lost its connections (gloo: "
        f"{next(s for s in _GLOO_LOST if s in text)}): to release a collective that an interrupt or a "
        "failing rank left blocked, they were cut, or a peer exited. A gloo group cannot be used "
        f"again: {RECOVER}"
    )


def reinit_process_group(backend: str | None = None, timeout: float = 300.0) -> None:
    """On every rank of the mesh, together: a new default torch.distributed process group in
    place of the current one (say, one cut to release an interrupted collective; see `explain`).
    ``destroy_process_group(); init_process_group()`` is not enough: the new group would reuse
    the old one's keys in the rendezvous store, and a rank could read a peer's stale address.
    This one meets on keys of its own. Models wrapped in DistributedDataParallel hold the old
    group: wrap them again. `backend`: the old group's, else torch's default; one torch cannot
    make here (a misspelt name, nccl in a CPU build) raises ValueError, the current group kept."""
    import torch.distributed as dist

    from viceroy.runtime.collectives.store import rendezvous

    install()
    if backend is not None:
        _check_backend(backend)  # before the current group is destroyed: a typo keeps it
    if dist.is_initialized():
        backend = backend or dist.get_backend()
        dist.destroy_process_group()
    world = int(os.environ["WORLD_SIZE"])
    store, incarnation = rendezvous.get(timeout)
    # The i-th time every rank calls this, each draws a ticket in [i*world + 1, (i+1)*world].
    attempt = (int(store.add(f"viceroy/{incarnation}/reinit", 1)) - 1) // world
    dist.init_process_group(
        backend=backend,
        store=dist.PrefixStore(f"viceroy/{incarnation}/reinit/{attempt}", rendezvous.client(timeout)),
        rank=int(os.environ["RANK"]),
        world_size=world,
        timeout=timedelta(seconds=timeout),
    )


def _check_backend(backend: Any) -> None:
    """Refuse a backend `init_process_group` could not make: not one of torch's (for each
    device in ``"cpu:gloo,cuda:nccl"``), or not built into this torch."""
    import torch.distributed as dist

    what = f"reinit_process_group(backend={backend!r})"
    if not isinstance(backend, str):
        raise TypeError(f"{what}: backend is a name, e.g. 'gloo' or 'nccl' (or None: the current group's)")
    known = [b for b in dist.Backend.backend_list if b not in ("undefined", "fake")]
    for part in backend.split(","):
        name = part.rpartition(":")[2].strip().lower()
        if name not in known:
            raise ValueError(f"{what}: {name!r} is no torch.distributed backend ({', '.join(known)}); the current "
                             "group is kept")
        available = getattr(dist, f"is_{name}_available", None)
        if available is not None and not available():
            raise ValueError(f"{what}: {name!r} is not available in this torch build; pass 'gloo', or None for the "
                             "current group's backend; the current group is kept")


def abort_torch_groups() -> int:
    """Cut every live gloo group built through torch.distributed since `install`, and abort
    every NCCL group; returns how many groups were hit. Any thread."""
    with _lock:
        live = [g for g in _groups if any(sockets.is_current(s) for s in g)]
    for conns in live:
        sockets.cut(conns)
    hit = len(live)
    try:
        import torch.distributed.distributed_c10d as c10d

        pgs = list(c10d._world.pg_map) if c10d.is_initialized() else []
    except Exception:
        pgs = []
    for pg in pgs:
        try:
            backend = pg._get_backend(__import__("torch").device("cuda"))
        except Exception:
            continue
        if type(backend).__name__ == "ProcessGroupNCCL":
            backend.abort()
            hit += 1
    return hit
