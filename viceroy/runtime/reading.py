"""Reading a name from every rank's namespace (`Mesh.pull`, `Mesh.gather`). A name some ranks
lack is the caller's mistake, not those ranks failing: each rank answers that it lacks the name
(its call ends well, so views of the mesh do not show it in "error"), and the controller raises
the MeshError (NameError) naming those ranks."""

from __future__ import annotations

from typing import Any

from viceroy.runtime.context import context
from viceroy.runtime.errors import MeshError, RankFailure
from viceroy.runtime.values import ValueMesh


class Missing:
    """A rank's answer for a name its namespace lacks."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "<missing>"


def value_of(name: str) -> Any:
    """On a rank: `name` as code reading it would see it (builtins too), or a `Missing`."""
    try:
        return eval(name, context().namespace)  # a bare name: a lookup, nothing else runs
    except NameError:
        return Missing()


def found(values: ValueMesh[Any], name: str, what: str) -> ValueMesh[Any]:
    """`values`, the ranks' answers to `value_of(name)`; a MeshError (NameError) naming the
    ranks that lack `name`, with the others' values as its partial results."""
    by_rank = values.by_rank()
    missing = [r for r, v in by_rank.items() if isinstance(v, Missing)]
    if not missing:
        return values
    failure = RankFailure("error", f"NameError: name {name!r} is not defined", exc_type="NameError")
    raise MeshError(f"{what} {name}", dict.fromkeys(missing, failure),
                    {r: v for r, v in by_rank.items() if r not in missing})
