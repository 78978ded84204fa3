"""`viceroy.context()`: who am I, on a rank."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Context:
    """What a rank knows about itself.

    >>> mesh.run(lambda: vr.context().coords)      # {"gpus": 0}, {"gpus": 1}, ...
    """

    rank: int
    coords: dict[str, int]
    dims: dict[str, int]
    local_rank: int
    world_size: int
    host: int
    namespace: dict[str, Any] = field(repr=False)
    _publish: Callable[[str, Any], None] = field(repr=False)
    mesh_token: str = field(default="", repr=False)

    def publish(self, kind: str, data: Any) -> None:
        """Send an event ``{"type": "publish", "kind": kind, "data": data, ...}`` to the
        controller's subscribers (the notebook uses it for displays)."""
        self._publish(kind, data)


_current: Context | None = None


def context() -> Context:
    """This rank's `Context`; only valid on a rank (in code or functions sent by `Mesh.run`)."""
    if _current is None:
        raise RuntimeError(
            "viceroy.context() is only available on a rank: call it inside code or a function "
            "sent with mesh.run(...)"
        )
    return _current


def _set_context(ctx: Context) -> None:
    global _current
    _current = ctx
