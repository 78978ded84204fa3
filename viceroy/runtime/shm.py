"""Large buffers between processes of one host through shared memory instead of sockets.

The sender writes a buffer once into a file under /dev/shm (without mapping it, so its own RSS
does not grow); each receiver maps the file copy-on-write (MAP_PRIVATE), so N ranks share one
physical copy until one of them writes to its array. The file is unlinked as soon as no one
needs to open it again; mapped pages live on until the last mapping goes.

Only the signed header of a message carries the file names, and a receiver opens only names
with its mesh's prefix.

Fresh tmpfs pages cost more than the copy into them (allocating and zeroing 64 MiB takes about
three times as long as copying it), so a sender that answers the same receiver again and again
(a rank answering the controller) keeps its files in `Segments`: the receiver says when its
last map of a file is gone, and the sender writes the next answer over the same pages. The
controller's pushes do the same through a `Lender`: a file lent to several ranks is written over
only once every one of them has let go of it (or died).
"""

from __future__ import annotations

import itertools
import mmap
import os
import sys
import threading
import weakref
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

from viceroy.runtime.shape import RunSet

SHM_DIR = "/dev/shm" if os.path.isdir("/dev/shm") else None
THRESHOLD = 1 << 20  # buffers at least this large go through shared memory
_counter = itertools.count()


def available() -> bool:
    return SHM_DIR is not None


def prefix(mesh_token: str) -> str:
    assert SHM_DIR is not None
    return os.path.join(SHM_DIR, f"viceroy-{mesh_token}-")


def offload(buffers: Sequence[Any], mesh_token: str, segments: Segments | Lent | None = None) -> tuple[list[Any], list[list[Any]], list[str]]:
    """Split buffers into (frames to send, shm descriptors, paths written and not kept).

    A descriptor is ``[position, path, nbytes]``, or ``[position, path, nbytes, 1]`` for a file
    of `segments` (a `Segments`, or a `Lender`'s files for some ranks) that the receiver hands
    back when done; `restore` puts the buffers back in order.
    """
    frames: list[Any] = []
    entries: list[list[Any]] = []
    paths: list[str] = []
    for pos, buf in enumerate(buffers):
        mv = memoryview(buf).cast("B")
        if mv.nbytes < THRESHOLD or not available():
            frames.append(buf)
            continue
        if segments is not None:
            entries.append([pos, segments.write(mv), mv.nbytes, 1])
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


def restore(
    frames: Sequence[Any],
    entries: Sequence[Sequence[Any]],
    mesh_token: str,
    unlink: bool,
    on_release: Callable[[str], None] | None = None,
) -> list[Any]:
    """Inverse of `offload` on the receiving side: shm entries become private writable maps.

    A file the sender reuses (a `Segments` entry) is never unlinked here; once the map of it is
    garbage, ``on_release(path)`` runs (on whatever thread collects it), so the sender can
    write over it again. Without `on_release` such a file is unlinked like any other."""
    if not entries:
        return list(frames)
    out: list[Any] = []
    by_pos = {int(e[0]): (str(e[1]), int(e[2]), len(e) > 3 and bool(e[3])) for e in entries}
    it = iter(frames)
    for pos in range(len(frames) + len(entries)):
        if pos not in by_pos:
            out.append(next(it))
            continue
        path, nbytes, reused = by_pos[pos]
        if not path.startswith(prefix(mesh_token)) or os.sep in path[len(prefix(mesh_token)):]:
            raise ValueError(f"refusing shared-memory path outside this mesh: {path!r}")
        fd = os.open(path, os.O_RDONLY)
        try:
            if os.fstat(fd).st_size != nbytes:
                raise ValueError(f"shared-memory buffer {path} has the wrong size")
            m = mmap.mmap(fd, nbytes, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ | mmap.PROT_WRITE)
        finally:
            os.close(fd)
            if unlink and not (reused and on_release is not None):
                discard([path])
        if reused and on_release is not None:
            weakref.finalize(m, on_release, path)
        out.append(memoryview(m))
    return out


PARALLEL_COPY = 4 << 20  # answers this large are copied with every intra-op thread of torch


def _fill(m: mmap.mmap, mv: memoryview) -> None:
    """``m[:n] = mv``. A slice assignment copies on one thread, at about half the bandwidth of
    torch's own copy on two cores; a rank that has torch loaded copies large answers with it."""
    torch = sys.modules.get("torch")
    n = mv.nbytes
    if torch is None or n < PARALLEL_COPY or mv.readonly:  # (torch warns on read-only buffers)
        m[0:n] = mv
        return
    torch.frombuffer(m, dtype=torch.uint8, count=n).copy_(torch.frombuffer(mv, dtype=torch.uint8))


class _FreeFiles:
    """Files no receiver maps any more, kept to be written over: oldest first, at most `keep`
    bytes of them (the owner's lock held around every use)."""

    def __init__(self, keep: int) -> None:
        self._keep = keep
        self._files: list[tuple[str, int]] = []

    def take(self, n: int) -> str | None:
        """A free file of exactly `n` bytes, no longer free; None when there is none."""
        i = next((i for i, (_, size) in enumerate(self._files) if size == n), None)
        return None if i is None else self._files.pop(i)[0]

    def add(self, path: str, n: int) -> list[str]:
        """`path` is free; the oldest files beyond `keep` bytes, to drop."""
        self._files.append((path, n))
        drop = []
        while self._files and sum(size for _, size in self._files) > self._keep:
            drop.append(self._files.pop(0)[0])
        return drop

    def remove(self, paths: Sequence[str]) -> None:
        self._files = [(p, size) for p, size in self._files if p not in paths]

    def paths(self) -> list[str]:
        return [p for p, _ in self._files]

    def nbytes(self) -> int:
        return sum(size for _, size in self._files)


class Segments:
    """A sender's shared-memory files, written over again once their receiver is done with them.

    Each file stays mapped here (shared), so writing an answer into a reused file is a plain
    memory copy into resident pages, about the speed of memcpy; `os.write` into tmpfs, or fresh
    pages, cost two to six times that. The price: these pages count in the sender's RSS while
    kept. `write` reuses a free file of exactly the size needed or makes a new one; `returned`
    takes back files the receiver no longer maps. At most `keep_bytes` of free files are kept,
    oldest dropped first. Thread-safe: results may leave from several threads.
    """

    def __init__(self, mesh_token: str, keep_bytes: int = 256 << 20) -> None:
        self._prefix = prefix(mesh_token)
        self._free = _FreeFiles(keep_bytes)
        self._lent: set[str] = set()
        self._maps: dict[str, mmap.mmap] = {}
        self._lock = threading.Lock()

    def write(self, mv: memoryview) -> str:
        n = mv.nbytes
        with self._lock:
            path = self._free.take(n) or f"{self._prefix}{os.getpid()}-{next(_counter)}"
            self._lent.add(path)
            m = self._maps.get(path)
        try:
            if m is None:
                fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
                try:
                    os.ftruncate(fd, n)
                    m = mmap.mmap(fd, n, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ | mmap.PROT_WRITE)
                finally:
                    os.close(fd)
                with self._lock:
                    self._maps[path] = m
            _fill(m, mv)
        except BaseException:
            self._drop([path])
            raise
        return path

    def returned(self, paths: Sequence[str]) -> None:
        """The receiver unmapped these. Files this process did not lend (a rank that was
        restarted under the same number) are stale and removed."""
        stale, drop = [], []
        with self._lock:
            for p in paths:
                if p not in self._lent:
                    stale.append(p)
                    continue
                self._lent.discard(p)
                if p in self._maps:
                    drop += self._free.add(p, len(self._maps[p]))
        discard([p for p in stale if p.startswith(self._prefix) and os.sep not in p[len(self._prefix):]])
        self._drop(drop)

    def free_bytes(self) -> int:
        with self._lock:
            return self._free.nbytes()

    def close(self) -> None:
        with self._lock:
            paths = self._free.paths() + list(self._lent)
        self._drop(paths)

    def _drop(self, paths: Sequence[str]) -> None:
        with self._lock:
            maps = [self._maps.pop(p) for p in paths if p in self._maps]
            self._lent.difference_update(paths)
            self._free.remove(paths)
        for m in maps:
            m.close()
        discard(paths)


class Lender:
    """On the controller: the files of its pushes, written over by a later push of the same size
    once every rank it was lent to has let go of it (each rank's answers carry what it let go
    of; a rank that died or was restarted holds nothing). Lent files are not mapped here, so the
    controller's RSS does not grow: a reused file is written with `os.pwrite` (into pages there
    already: about twice a memory copy, against five times for fresh ones). At most
    `keep_bytes` of free files are kept, oldest dropped first. Thread-safe."""

    def __init__(self, mesh_token: str, keep_bytes: int = 256 << 20) -> None:
        self._prefix = prefix(mesh_token)
        self._free = _FreeFiles(keep_bytes)
        self._holders: dict[str, set[int]] = {}  # lent file -> ranks that may still map it
        self._sizes: dict[str, int] = {}
        self._lock = threading.Lock()

    def to(self, ranks: Sequence[int]) -> Lent:
        """What `offload` writes files through for a push to `ranks`."""
        return Lent(self, frozenset(ranks))

    def write(self, mv: memoryview, ranks: frozenset[int]) -> str:
        n = mv.nbytes
        with self._lock:
            reused = self._free.take(n)
            path = reused or f"{self._prefix}{os.getpid()}-{next(_counter)}"
            self._holders[path] = set(ranks)
            self._sizes[path] = n
        try:
            fd = os.open(path, os.O_WRONLY if reused else os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
            try:
                written = 0
                while written < n:
                    written += os.pwrite(fd, mv[written : written + (64 << 20)], written)
            finally:
                os.close(fd)
        except BaseException:
            self._forget([path])
            raise
        return path

    def released(self, rank: int, paths: Sequence[str]) -> None:
        """`rank` no longer maps these files."""
        with self._lock:
            for p in paths:
                holders = self._holders.get(p)
                if holders is not None:
                    holders.discard(rank)
            drop = self._settle()
        discard(drop)

    def gone(self, rank: int) -> None:
        """`rank`'s process ended: it maps nothing."""
        with self._lock:
            for holders in self._holders.values():
                holders.discard(rank)
            drop = self._settle()
        discard(drop)

    def _settle(self) -> list[str]:
        """Under the lock: files no rank holds become free; the free beyond `keep_bytes` go."""
        drop: list[str] = []
        for p in [p for p, holders in self._holders.items() if not holders]:
            del self._holders[p]
            drop += self._free.add(p, self._sizes[p])
        for p in drop:
            del self._sizes[p]
        return drop

    def close(self) -> None:
        with self._lock:
            paths = list(self._sizes)
        self._forget(paths)

    def _forget(self, paths: Sequence[str]) -> None:
        with self._lock:
            for p in paths:
                self._holders.pop(p, None)
                self._sizes.pop(p, None)
            self._free.remove(paths)
        discard(paths)


class Lent:
    """A `Lender`'s files for one push, to `ranks` (see `offload`)."""

    __slots__ = ("lender", "ranks")

    def __init__(self, lender: Lender, ranks: frozenset[int]) -> None:
        self.lender, self.ranks = lender, ranks

    def write(self, mv: memoryview) -> str:
        return self.lender.write(mv, self.ranks)


class Returns:
    """On the controller: result files whose maps here are garbage, on their way back to the
    ranks that made them (their `Segments` reuse them), riding on the next work message to
    each. Lock-free: `released` may run anywhere, even from a finalizer inside a lock."""

    def __init__(self) -> None:
        self._released: deque[tuple[int, str]] = deque()

    def released(self, rank: int, path: str) -> None:
        self._released.append((rank, path))

    def header(self, op: str, runs: list[list[int]]) -> dict[str, Any]:
        """The ``returned`` header entry for a message of `op` to the ranks in `runs` (the
        ranks read it before running anything). The work grows with the files waiting, not
        with the ranks."""
        if op == "actor" or not self._released:
            return {}
        members = RunSet(runs)
        out: dict[str, list[str]] = {}
        for _ in range(len(self._released)):  # those for other ranks go back in the queue
            try:
                r, path = self._released.popleft()
            except IndexError:
                break
            if r in members:
                out.setdefault(str(r), []).append(path)
            else:
                self._released.append((r, path))
        return {"returned": out} if out else {}


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
