"""Large buffers between processes of one host through shared memory instead of sockets.

The sender writes a buffer once into a file under /dev/shm (without mapping it, so its own RSS
does not grow); each receiver maps the file copy-on-write (MAP_PRIVATE), so N ranks share one
physical copy until one of them writes to its array. The file is unlinked as soon as no one
needs to open it again; mapped pages live on until the last mapping goes.

Only the signed header of a message carries the file names, and a receiver opens only names
with its mesh's prefix.
"""

from __future__ import annotations

import itertools
import mmap
import os
from collections.abc import Sequence
from typing import Any

SHM_DIR = "/dev/shm" if os.path.isdir("/dev/shm") else None
THRESHOLD = 1 << 20  # buffers at least this large go through shared memory
_counter = itertools.count()


def available() -> bool:
    return SHM_DIR is not None


def prefix(mesh_token: str) -> str:
    assert SHM_DIR is not None
    return os.path.join(SHM_DIR, f"viceroy-{mesh_token}-")


def offload(buffers: Sequence[Any], mesh_token: str) -> tuple[list[Any], list[list[Any]], list[str]]:
    """Split buffers into (frames to send, shm descriptors, paths written).

    A descriptor is ``[position, path, nbytes]``; `restore` puts the buffers back in order.
    """
    frames: list[Any] = []
    entries: list[list[Any]] = []
    paths: list[str] = []
    for pos, buf in enumerate(buffers):
        mv = memoryview(buf).cast("B")
        if mv.nbytes < THRESHOLD or not available():
            frames.append(buf)
            continue
        path = f"{prefix(mesh_token)}{os.getpid()}-{next(_counter)}"
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
        try:
            written = 0
            while written < mv.nbytes:
                written += os.write(fd, mv[written : written + (64 << 20)])
        finally:
            os.close(fd)
        entries.append([pos, path, mv.nbytes])
        paths.append(path)
    return frames, entries, paths


def restore(frames: Sequence[Any], entries: Sequence[Sequence[Any]], mesh_token: str, unlink: bool) -> list[Any]:
    """Inverse of `offload` on the receiving side: shm entries become private writable maps."""
    if not entries:
        return list(frames)
    out: list[Any] = []
    by_pos = {int(e[0]): (str(e[1]), int(e[2])) for e in entries}
    it = iter(frames)
    for pos in range(len(frames) + len(entries)):
        if pos not in by_pos:
            out.append(next(it))
            continue
        path, nbytes = by_pos[pos]
        if not path.startswith(prefix(mesh_token)) or os.sep in path[len(prefix(mesh_token)):]:
            raise ValueError(f"refusing shared-memory path outside this mesh: {path!r}")
        fd = os.open(path, os.O_RDONLY)
        try:
            if os.fstat(fd).st_size != nbytes:
                raise ValueError(f"shared-memory buffer {path} has the wrong size")
            m = mmap.mmap(fd, nbytes, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ | mmap.PROT_WRITE)
        finally:
            os.close(fd)
            if unlink:
                discard([path])
        out.append(memoryview(m))
    return out


def discard(paths: Sequence[str]) -> None:
    for p in paths:
        try:
            os.unlink(p)
        except FileNotFoundError:
            pass


def discard_mesh(mesh_token: str) -> None:
    """Remove whatever this mesh left in /dev/shm (a crash between write and unlink)."""
    if not available():
        return
    head = os.path.basename(prefix(mesh_token))
    assert SHM_DIR is not None
    for name in os.listdir(SHM_DIR):
        if name.startswith(head):
            discard([os.path.join(SHM_DIR, name)])
