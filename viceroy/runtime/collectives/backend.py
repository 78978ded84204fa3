"""The backend interface: what gloo and nccl each provide.

A `Backend` says whether it can run at all here and which tensors it takes, and builds a
`Communicator` for one group. A `Communicator` starts operations (each returns a `Pending`),
and can be aborted from any thread, at any time, releasing every operation in flight on this
rank and, through the broken connections, on its peers.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from typing import Any

OPS = ("sum", "avg", "product", "min", "max", "band", "bor", "bxor")


def check_op(op: str, dtype: Any, what: str, ops: tuple[str, ...] = OPS) -> None:
    """Refuse an `op` not among `ops`, or one a tensor of `dtype` (torch's, CuPy's or numpy's)
    cannot take, before anything is sent: the backend would fail part-way, on some members and
    not others, leaving the group's communicator aborted. An average of integers is no integer,
    bitwise ops need integers, complex numbers have no order (and the backends multiply them
    not). `what` names the call ("all_reduce", "reduce"). Used on the ranks by the collectives
    and on the controller by vr.reduce, which has only the tensor's dtype there."""
    if op not in ops:
        raise ValueError(f"{what}: op must be one of {', '.join(ops)}; got {op!r}")
    if op == "sum":
        return
    if hasattr(dtype, "is_floating_point"):  # torch's
        floating, complex_ = dtype.is_floating_point, dtype.is_complex
    else:
        floating, complex_ = dtype.kind == "f", dtype.kind == "c"
    name = str(dtype).removeprefix("torch.")
    if op == "avg" and not (floating or complex_):
        raise ValueError(f"{what} 'avg' needs a floating-point tensor; this one is {name}: convert it first "
                         "(t.float()), or use 'sum' and divide")
    if op in ("band", "bor", "bxor") and (floating or complex_):
        raise ValueError(f"{what} {op!r} is bitwise: it needs an integer or bool tensor; this one is {name}: "
                         "use 'min' or 'max' (on 0/1 values, 'min' is an and, 'max' an or), or convert it (t.int())")
    if complex_ and op not in ("sum", "avg"):
        instead = ("reduce t.abs() or t.real instead (complex numbers have no order)" if op in ("min", "max")
                   else "reduce torch.view_as_real(t) to act on the real and imaginary parts apart")
        raise ValueError(f"{what} {op!r} of a complex tensor: complex numbers are reduced with 'sum' or 'avg' "
                         f"only; this one is {name}: {instead}")

# The ranks' environment variable that chooses a backend for every device (%mesh up --backend):
# "gloo" sends GPU tensors through gloo too; "nccl" is the default (gloo for CPU tensors, nccl
# for GPU ones), with the extension's check that every rank has a GPU.
BACKEND_ENV = "VICEROY_BACKEND"
BACKENDS = ("gloo", "nccl")


def check_backend_env(env: Any) -> None:
    """Refuse a `BACKEND_ENV` in `env` (a mesh's added environment) that names no backend: the
    ranks would ignore it and follow the tensor, silently."""
    value = env.get(BACKEND_ENV) if isinstance(env, Mapping) else None
    if value is not None and value not in BACKENDS:
        raise ValueError(f"env: {BACKEND_ENV}={value!r} names no backend: give 'gloo' (GPU tensors through gloo "
                         "too) or 'nccl' (the default: gloo for CPU tensors, nccl for GPU ones), or leave it out; "
                         "%mesh up takes it as --backend gloo|nccl")


class Pending(ABC):
    """An operation in flight."""

    @abstractmethod
    def wait(self, seconds: float) -> bool:
        """Wait up to `seconds`; True when done. Raises the backend's error if it failed."""


class AllOf(Pending):
    """Several operations in flight, done when all are."""

    def __init__(self, pending: list[Pending]) -> None:
        self._left = pending

    def wait(self, seconds: float) -> bool:
        while self._left:
            if not self._left[0].wait(seconds):
                return False
            self._left.pop(0)
        return True


class Communicator(ABC):
    """One group's connections on this rank. Tensors are the backend's native kind."""

    @abstractmethod
    def all_reduce(self, t: Any, op: str) -> Pending: ...
    @abstractmethod
    def all_gather(self, outs: list[Any], t: Any) -> Pending: ...
    @abstractmethod
    def reduce_scatter(self, out: Any, ins: list[Any], op: str) -> Pending: ...
    @abstractmethod
    def broadcast(self, t: Any, root: int) -> Pending: ...
    @abstractmethod
    def send(self, t: Any, peer: int) -> Pending: ...
    @abstractmethod
    def recv(self, t: Any, peer: int) -> Pending: ...
    @abstractmethod
    def barrier(self) -> Pending: ...

    def exchange(self, out: Any, to: int | None, into: Any, frm: int | None) -> Pending:
        """Send `out` to member `to` and receive `into` from member `frm` (either pair may be
        None), both in flight at once: in a ring of exchanges no member waits on a peer that
        is itself waiting to send. Backends whose sends block until received override this."""
        started = []
        if out is not None:
            started.append(self.send(out, to))  # type: ignore[arg-type]
        if into is not None:
            started.append(self.recv(into, frm))  # type: ignore[arg-type]
        return AllOf(started)

    @abstractmethod
    def abort(self) -> None:
        """Cut every connection; thread-safe and idempotent."""

    def healthy(self) -> bool | None:
        """Whether every peer still holds its end, if the backend can tell without asking
        anyone (None: ask the store)."""
        return None

    def lost_peer(self, error: BaseException) -> int | None:
        """The group index of the peer an error is about, when the backend can tell."""
        return None


class Backend(ABC):
    name: str

    @abstractmethod
    def unavailable(self) -> str | None:
        """None when usable here, else why not (one sentence, with what to do)."""

    @abstractmethod
    def accepts(self, t: Any) -> bool:
        """Whether `t` is a tensor this backend moves."""

    def device_of(self, t: Any) -> int | None:
        """The device a tensor lives on, when communicators are per device (nccl)."""
        return None

    @abstractmethod
    def connect(self, store: Any, index: int, size: int, device: int | None, timeout: float) -> Communicator:
        """Build a communicator; every member calls this with the same (prefixed) store.
        Blocks until all members joined; runs on a helper thread."""

    @abstractmethod
    def is_failure(self, error: BaseException) -> bool:
        """Whether `error` from `Pending.wait` means the group is broken (vs a usage error)."""
