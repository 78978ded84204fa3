"""Which ranks take part in a collective: the whole mesh, or the ranks that share this rank's
coordinates on every dim *not* named (``dims="gpus"`` on ``{"hosts": 2, "gpus": 4}`` groups the
four ranks of this rank's host)."""

from __future__ import annotations

import difflib
import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass

from viceroy.runtime.context import context
from viceroy.runtime.shape import format_rank_set


@dataclass(frozen=True)
class Group:
    """A set of global ranks, in the order that gives each its index in the group."""

    ranks: tuple[int, ...]
    label: str  # for messages: "dims ('gpus',) (ranks 4-7)"

    @property
    def size(self) -> int:
        return len(self.ranks)

    @property
    def name(self) -> str:
        """Stable across processes: keys in the rendezvous store."""
        return ".".join(map(str, self.ranks))

    def index(self, rank: int) -> int:
        return self.ranks.index(rank)


_cache: dict[tuple[tuple[str, ...] | None, int, object], Group] = {}


Dims = str | Sequence[str] | Group | None


def group_for(dims: Dims) -> Group:
    """The group of the calling rank along `dims` (None: the whole mesh). A `Group` passes
    through: callers that computed the ranks themselves (the tensor engine, for sub-mesh views
    whose dims exist only on the controller) give it directly."""
    if isinstance(dims, Group):
        return dims
    ctx = context()
    names = None if dims is None else ((dims,) if isinstance(dims, str) else tuple(dims))
    key = (names, ctx.rank, ctx.view_key)
    group = _cache.get(key)
    if group is None:
        if len(_cache) >= 1024:
            _cache.clear()
        group = _cache[key] = _build(names, ctx.rank, ctx.coords, ctx.dims, ctx.ranks)
    return group


def pair_group(a: int, b: int) -> Group:
    """Two ranks, lower first: point-to-point traffic."""
    lo, hi = sorted((a, b))
    return Group((lo, hi), f"ranks {lo} and {hi}")


def _build(names: tuple[str, ...] | None, rank: int, coords: dict[str, int], dims: dict[str, int],
           view: tuple[int, ...] | None = None) -> Group:
    """The group along `names` (None: all) of the mesh, or of the view whose position i is
    global rank ``view[i]``."""
    if names is None:
        n = math.prod(dims.values())
        ranks = tuple(range(n)) if view is None else view
        return Group(ranks, f"the whole {'mesh' if view is None else 'view'} (ranks {format_rank_set(ranks)})")
    unknown = [d for d in names if d not in dims]
    if unknown:
        close = difflib.get_close_matches(unknown[0], list(dims), n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise ValueError(f"dims {list(names)}: this mesh has no dim {unknown[0]!r}{hint}; its dims are {list(dims)}")
    if len(set(names)) != len(names):
        raise ValueError(
            f"dims {list(names)} must name distinct dims of this mesh; its dims are {list(dims)}"
        )
    order = list(dims)
    strides = {d: math.prod(dims[e] for e in order[i + 1:]) for i, d in enumerate(order)}
    fixed = sum(coords[d] * strides[d] for d in order if d not in names)
    # Row-major over the named dims, in the order the mesh lists them.
    named = [d for d in order if d in names]
    ranks = tuple(
        fixed + sum(i * strides[d] for d, i in zip(named, idx, strict=True))
        for idx in itertools.product(*(range(dims[d]) for d in named))
    )
    if view is not None:
        ranks = tuple(view[p] for p in ranks)
    where = ", ".join(f"{d}={coords[d]}" for d in order if d not in names)
    label = f"dims {'/'.join(named)}" + (f" at {where}" if where else "")
    return Group(ranks, f"{label} (ranks {format_rank_set(list(ranks))})")
