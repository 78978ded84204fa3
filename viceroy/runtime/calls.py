"""A call in flight: which ranks answered, with what, and how it ends (a ValueMesh or one
grouped MeshError)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from viceroy.runtime import serialize, shm
from viceroy.runtime.errors import MeshError, RankFailure
from viceroy.runtime.future import Future
from viceroy.runtime.shape import Shape
from viceroy.runtime.values import ValueMesh

# After a call is cancelled, how long its ranks get to stop before the call ends without them.
STOP_GRACE_S = 1.0


@dataclass
class Call:
    id: int
    label: str
    shape: Shape
    future: Future[Any]
    fail_fast: bool
    deadline: float | None
    timeout: float | None
    results: dict[int, Any] = field(default_factory=dict)
    failures: dict[int, RankFailure] = field(default_factory=dict)
    stop_reason: str | None = None
    stop_deadline: float | None = None
    shm_paths: list[str] = field(default_factory=list)
    on_result: Callable[[int, bool, Any], None] | None = None

    def missing(self) -> list[int]:
        return [r for r in self.shape.ranks if r not in self.results and r not in self.failures]

    def answered(self, r: int) -> bool:
        return r in self.results or r in self.failures

    def complete(self) -> bool:
        """Every rank answered (results and failures only ever hold ranks of the call, once)."""
        return len(self.results) + len(self.failures) >= len(self.shape.ranks)

    def record_value(self, r: int, payload: Any) -> None:
        """A plain success: the pickle of the rank's value (no arrays), or None for no value."""
        try:
            self.results[r] = serialize.loads(payload, []) if payload is not None else None
        except Exception as exc:
            self.failures[r] = RankFailure(
                "error", f"its result could not be unpickled on the controller: {type(exc).__name__}: {exc}"
            )
        if self.on_result is not None:
            ok = r in self.results
            self.on_result(r, ok, self.results[r] if ok else self.failures[r])

    def record(
        self,
        item: dict[str, Any],
        signed: list[Any],
        data: list[Any],
        mesh_token: str,
        on_release: Callable[[str], None] | None = None,
    ) -> bool:
        """One rank's answer (an item of a "results" message). Returns True when it is a real
        failure (not an interruption), which fail-fast acts on. `on_release(path)` hands a
        shared-memory file back to the rank once its map here is garbage (see `shm.Segments`)."""
        r = item["r"]
        if item["ok"]:
            try:
                if "shm" in item:
                    data = shm.restore(data, item["shm"], mesh_token, unlink=True, on_release=on_release)
                self.results[r] = serialize.loads(signed[0], data) if signed else None
            except Exception as exc:
                self.failures[r] = RankFailure(
                    "error", f"its result could not be unpickled on the controller: {type(exc).__name__}: {exc}"
                )
        else:
            kind = item.get("kind", "error")
            summary = item.get("summary", "failed")
            if kind == "interrupted" and self.stop_reason:
                summary = self.stop_reason
            if item.get("where"):
                summary += f" (at {item['where']})"
            self.failures[r] = RankFailure(kind, summary, item.get("tb", ""), item.get("etype", ""))
        if self.on_result is not None:
            ok = r in self.results
            self.on_result(r, ok, self.results[r] if ok else self.failures[r])
        return r in self.failures and self.failures[r].kind != "interrupted"

    def give_up_on_missing(self) -> None:
        """The grace after a cancel is over: the ranks still busy are reported as such."""
        for r in self.missing():
            self.failures[r] = RankFailure(
                "interrupted",
                f"{self.stop_reason}; did not stop within {STOP_GRACE_S} s (busy in native "
                "code?). It stays busy; mesh.restart() ends it",
            )

    def resolve(self) -> None:
        """Settle the future: a ValueMesh, or one MeshError grouping every failure."""
        if self.failures:
            hint = ""
            if any(f.kind == "died" for f in self.failures.values()):
                hint = "Bring dead ranks back with mesh.restart(failed_only=True); the others keep their state."
            self.future._set_exception(MeshError(self.label, dict(self.failures), dict(self.results), hint))
        else:
            self.future._set_result(ValueMesh(self.shape, self.results))


@dataclass
class Query:
    """A control request answered by every targeted rank (stacks, stats)."""

    expected: set[Any]  # rank ids, and ("agent", host) for questions agents answer too
    deadline: float
    replies: dict[Any, Any] = field(default_factory=dict)
    done: threading.Event = field(default_factory=threading.Event)
