"""Errors a mesh call can end with, and the grouped message users read."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from viceroy.runtime.file_names import in_traceback
from viceroy.runtime.shape import describe_ranks

FailureKind = Literal["error", "died", "interrupted", "timeout", "unavailable"]


@dataclass(frozen=True)
class RankFailure:
    """Why one rank did not return a value.

    kind: "error" (user code raised), "died" (the process exited), "interrupted" (cancelled by
    an interrupt or by fail-fast), "timeout" (did not finish in time), "unavailable" (dead
    before the call was sent).
    """

    kind: FailureKind
    summary: str
    traceback: str = ""
    exc_type: str = ""

    def __post_init__(self) -> None:
        if self.traceback:  # frames in the controller's notebook cells named as IPython names them
            object.__setattr__(self, "traceback", in_traceback(self.traceback))

    def describe(self) -> str:
        return self.summary + ("\n" + self.traceback.rstrip() if self.traceback else "")


@dataclass
class MeshError(Exception):
    """A mesh call failed on one or more ranks.

    ``str(err)`` groups identical failures by rank set; ``failures`` maps rank -> `RankFailure`;
    ``partial`` holds the values of the ranks that finished.
    """

    what: str
    failures: dict[int, RankFailure]
    partial: dict[int, Any] = field(default_factory=dict)
    hint: str = ""
    total: int | None = None  # ranks the call was for, where some neither failed nor finished

    def __post_init__(self) -> None:
        super().__init__(self._message())

    def __str__(self) -> str:
        return self._message()

    def __reduce__(self) -> tuple[Any, ...]:
        # Exception's own rebuilds from args (the message): a pickle or copy must pass the
        # fields (a MeshError through multiprocessing, copy.copy(err)).
        return (type(self), (self.what, self.failures, self.partial, self.hint, self.total))

    @property
    def ranks(self) -> list[int]:
        """Ranks that failed (any kind), sorted."""
        return sorted(self.failures)

    def _message(self) -> str:
        n_total = self.total or len(self.failures) + len(self.partial)
        primary = {r: f for r, f in self.failures.items() if f.kind != "interrupted"} or self.failures
        lines = [f"{self.what} failed on {len(primary)} of {n_total} rank{'s' if n_total != 1 else ''}"]
        groups: dict[str, list[int]] = {}
        order: list[str] = []
        for rank in sorted(self.failures):
            text = self.failures[rank].describe()
            if text not in groups:
                groups[text] = []
                order.append(text)
            groups[text].append(rank)
        # Real failures first, then the ranks that were stopped because of them.
        order.sort(key=lambda t: self.failures[groups[t][0]].kind == "interrupted")
        for text in order:
            ranks = groups[text]
            first, _, rest = text.partition("\n")
            lines.append(f"{describe_ranks(ranks)}: {first}")
            if rest:
                lines.extend("    " + ln for ln in rest.splitlines())
        if self.hint:
            lines.append(self.hint)
        return "\n".join(lines)


class MeshClosedError(RuntimeError):
    """The mesh was shut down; start a new one."""


class PreloadWarning(UserWarning):
    """A module given to `preload` could not be imported by a host's template process; the mesh
    started, and its ranks import the module themselves when their code does."""


class MeshStartError(RuntimeError):
    """A mesh could not start: the message names the hosts or ranks at fault, and why (an
    agent's last words, a timeout)."""
