"""Checked collectives, on request: the members compare what they pass before anything is sent.

Backends notice a mismatch only when it leaves them waiting (see `agreement`); one of the same
byte size completes with wrong values: float32[2] against int32[2] reinterprets the bytes,
"sum" on one rank and "max" on another gives both the sum, a broadcast from different roots
or a recv buffer larger than what is sent fills what it can. With checking on
(``vr.check_collectives()`` in rank code, or ``VICEROY_CHECK_COLLECTIVES=1`` in the ranks'
environment), each operation is preceded by a small all_reduce over the same communicator that
tells whether every member passed the same (a digest of the operation, dtype, shape and root);
when not, the members gather their signatures (`SIG_BYTES` each) and all raise the same error,
naming what each rank passed, and, nothing having been sent, the communicator stays as it was.
The setting belongs to a communicator: the members compare it when they build one (see
`building`), so one rank checking and another not (a rank restarted alone starts unchecked)
is an error, not a misread comparison.
It costs each operation one more small collective: meant for debugging, as torch's
``TORCH_DISTRIBUTED_DEBUG=DETAIL``.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Sequence
from typing import Any

from viceroy.runtime.collectives.backend import Communicator, Pending
from viceroy.runtime.collectives.entries import give_up_all
from viceroy.runtime.context import context
from viceroy.runtime.shape import describe_ranks

SIG_BYTES = 128  # per member; a longer signature keeps its start and a digest of the whole

_on: bool | None = None  # None: as the environment says


def check_collectives(on: bool = True) -> None:
    """Check every collective this rank takes part in from now on (or stop, with False): the
    members compare the operation, dtype, shape and root they pass before anything is sent, and
    a mismatch raises a CollectiveError on every member instead of giving wrong values. Every
    member must have the same setting: set it in code that runs on every rank (a rank restarted
    alone starts without it). The members compare their settings when they build a
    communicator, and a difference raises a CollectiveError naming the ranks. A change cuts this
    rank's communicators (call it between collectives); their next use rebuilds them. Costs one more small collective per
    operation; ``VICEROY_CHECK_COLLECTIVES=1`` turns it on for a mesh's ranks from the start."""
    global _on
    if not isinstance(on, bool | int) or on not in (0, 1):  # "off" is a true str
        raise TypeError(f"check_collectives takes True or False; got {on!r} ({type(on).__name__})")
    was, _on = checking(), bool(on)
    if _on != was:  # its communicators were built with the other setting: rebuild them
        give_up_all(f"rank {context().rank} turned checking of collectives {'on' if _on else 'off'}")


def checking() -> bool:
    """Whether collectives are checked on this rank (read when a communicator is built: ranks
    are forked before the mesh's environment is theirs). ``VICEROY_CHECK_COLLECTIVES`` unset, 0,
    false, no or off: not checked."""
    if _on is not None:
        return _on
    return os.environ.get("VICEROY_CHECK_COLLECTIVES", "").strip().lower() not in _OFF


_OFF = ("", "0", "false", "no", "off")


class Signatures:
    """One member's side of the comparison. `agree` all-reduces a digest of its signature (the
    largest digest and the largest negated one: equal everywhere only if every member's is);
    only when they differ does `gather` collect the signatures themselves, for the message."""

    def __init__(self, sig: str, members: Sequence[int], like: Any) -> None:
        self.sig, self.members, self._like = sig, members, like
        digest = int.from_bytes(hashlib.sha1(sig.encode()).digest()[:7], "big")  # < 2**56: negates safely
        self._digests = self._array([digest, -digest], "int64")
        self._all: list[Any] = []

    def agree(self, comm: Communicator) -> Pending:
        return comm.all_reduce(self._digests, "max")

    def differ(self) -> bool:
        """After `agree`: whether some member's signature differs from another's."""
        top, minus_bottom = (int(v) for v in self._digests.tolist())
        return top != -minus_bottom

    def gather(self, comm: Communicator) -> Pending:
        rows = self._array([[0] * SIG_BYTES for _ in self.members], "uint8")  # rows of one buffer, as nccl wants
        self._all = [rows[i] for i in range(len(self.members))]
        return comm.all_gather(self._all, self._array(list(_encode(self.sig)), "uint8"))

    def mismatch(self) -> str:
        """After `gather`: "rank 0: all_reduce('sum') float32[2]; rank 1: ...", ranks grouped."""
        sigs: dict[str, list[int]] = {}
        for rank, got in zip(self.members, self._all, strict=True):
            sigs.setdefault(_decode(bytes(got.tolist())), []).append(rank)
        return "; ".join(f"{describe_ranks(ranks)}: {sig}" for sig, ranks in sorted(sigs.items(), key=lambda kv: kv[1]))

    def _array(self, values: list[Any], dtype: str) -> Any:
        """`values` in an array the backend takes, where the operation's tensor lives."""
        like = self._like
        if like is not None and type(like).__module__.startswith("cupy"):
            import cupy

            with like.device:  # on the tensor's GPU, not the current one
                return cupy.asarray(values, dtype=dtype)
        import torch

        return torch.tensor(values, dtype=getattr(torch, dtype), device=like.device if like is not None else "cpu")


def _encode(sig: str) -> bytes:
    raw = sig.encode()
    if len(raw) > SIG_BYTES:
        raw = raw[: SIG_BYTES - 20] + b"~" + hashlib.sha1(raw).hexdigest()[:19].encode()
    return raw.ljust(SIG_BYTES, b"\0")


def _decode(raw: bytes) -> str:
    return raw.rstrip(b"\0").decode(errors="replace")
