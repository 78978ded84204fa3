"""Named-dim shapes and the mesh algebra shared by `Mesh`, `ValueMesh` and actor meshes.

A `Shape` is an ordered set of named dims (``{"hosts": 2, "gpus": 8}``) over a list of global
rank ids laid out row-major. Every operation returns a new `Shape`; `ShapeOps` gives any class
that holds a shape the same vocabulary (`slice`, `split`, `flatten`, `rename`, `size`, `dims`).
"""

from __future__ import annotations

import bisect
import itertools
import math
import operator
from collections.abc import Iterable, Iterator, Mapping, Sequence, Set
from typing import Any, TypeVar

from viceroy.runtime.arguments import as_int


class Shape:
    """Ordered named dims over global rank ids (row-major)."""

    __slots__ = ("_dims", "_ranks", "_runs")

    def __init__(self, dims: Mapping[str, int], ranks: Sequence[int] | None = None) -> None:
        dims = dict(dims)
        for name, size in dims.items():
            if not isinstance(name, str) or not name.isidentifier():
                raise ValueError(f"dim names must be identifiers, got {name!r}")
            if _positive_int(size) is None:
                raise ValueError(f"dim {name!r} must be a positive int, got {size!r}")
            dims[name] = int(size)  # numpy's too, as a plain int (JSON headers)
        n = math.prod(dims.values())
        ranks = tuple(range(n)) if ranks is None else tuple(ranks)
        if len(ranks) != n:
            raise ValueError(f"a shape of dims {dims} holds {n} ranks, got {len(ranks)}")
        self._dims = dims
        self._ranks = ranks
        self._runs: list[list[int]] | None = None

    # --- reading -------------------------------------------------------------------------

    @property
    def dims(self) -> dict[str, int]:
        return dict(self._dims)

    @property
    def ranks(self) -> tuple[int, ...]:
        return self._ranks

    def runs(self) -> list[list[int]]:
        """The ranks as ``[start, stop)`` runs (computed once): how messages carry them."""
        if self._runs is None:
            self._runs = rank_runs(self._ranks)
        return self._runs

    def __len__(self) -> int:
        return len(self._ranks)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Shape) and (self._dims, self._ranks) == (other._dims, other._ranks)

    def __hash__(self) -> int:
        return hash((tuple(self._dims.items()), self._ranks))

    def __repr__(self) -> str:
        return f"Shape({self.describe()})"

    def describe(self) -> str:
        """``hosts=2, gpus=8``"""
        return ", ".join(f"{k}={v}" for k, v in self._dims.items()) or "scalar"

    def size(self, dim: str | None = None) -> int:
        if dim is None:
            return len(self._ranks)
        self._check_dim(dim)
        return self._dims[dim]

    def coords(self) -> Iterator[dict[str, int]]:
        """The coordinates of each position, row-major (aligned with `ranks`)."""
        names = list(self._dims)
        for idx in itertools.product(*(range(s) for s in self._dims.values())):
            yield dict(zip(names, idx, strict=True))

    def position(self, **coords: int) -> int:
        """Row-major position of the entry at `coords`; every dim must be named."""
        for name in coords:
            self._check_dim(name)
        missing = [d for d in self._dims if d not in coords]
        if missing:
            raise ValueError(
                f"give a coordinate for every dim: missing {', '.join(missing)} "
                f"(dims are {self.describe()})"
            )
        pos = 0
        for name, size in self._dims.items():
            c: object = coords[name]
            if isinstance(c, slice):
                raise TypeError(f"item takes one coordinate per dim, got {name}={_fmt_slice(c)}: "
                                f"take a part with .slice({name}=slice(...)) instead")
            i = self._check_index(name, c, "an int")
            pos = pos * size + i
        return pos

    # --- algebra ---------------------------------------------------------------------------

    def slice(self, **sel: int | slice) -> Shape:
        """Select along dims: an int drops the dim, a slice keeps it."""
        for name in sel:
            self._check_dim(name)
        ranges: list[range] = []
        new_dims: dict[str, int] = {}
        for name, size in self._dims.items():
            if name not in sel:
                ranges.append(range(size))
                new_dims[name] = size
                continue
            s = sel[name]
            if isinstance(s, slice):
                r = range(size)[_check_slice(name, s)]
                if len(r) == 0:
                    raise IndexError(
                        f"{name}={_fmt_slice(s)} selects nothing: dim {name!r} has size {size}"
                    )
                ranges.append(r)
                new_dims[name] = len(r)
            else:
                ranges.append(range(self._check_index(name, s), self._check_index(name, s) + 1))
        strides = _strides(list(self._dims.values()))
        ranks = [
            self._ranks[sum(i * st for i, st in zip(idx, strides, strict=True))]
            for idx in itertools.product(*ranges)
        ]
        return Shape(new_dims, ranks)

    def split(self, **spec: Any) -> Shape:
        """``split(gpus=("dp", "tp"), tp=2)``: replace dim gpus by dp × tp (one size may be left out)."""
        targets = {k: v for k, v in spec.items() if isinstance(v, tuple | list)}
        sizes = {k: v for k, v in spec.items() if k not in targets}
        given = [(k, v) for k, v in spec.items() if isinstance(v, dict) and v]
        if not targets and len(given) == 1:  # split(gpus={"dp": 2, "tp": 2}): say how it is written
            (old, named), = given
            *names, last = named
            raise ValueError("split takes the new dims' names as a tuple and their sizes as keywords: "
                             f"split({old}={(*names, last)!r}, {last}={named[last]!r})")
        if len(targets) != 1:
            raise ValueError(
                'split takes one dim to split, e.g. split(gpus=("dp", "tp"), tp=2); '
                f"got {spec!r}"
            )
        (old, new_names), = targets.items()
        self._check_dim(old)
        new_names = list(new_names)
        if len(new_names) < 2 or len(set(new_names)) != len(new_names):
            raise ValueError(f"split {old!r} into two or more distinct names, got {new_names}")
        for name in new_names:
            if name in self._dims and name != old:
                raise ValueError(f"dim {name!r} already exists (dims are {self.describe()})")
        unknown = [k for k in sizes if k not in new_names]
        if unknown:
            raise ValueError(f"sizes given for {unknown}, which are not among {new_names}")
        total = self._dims[old]
        free = [n for n in new_names if n not in sizes]
        bad = {k: v for k, v in sizes.items() if _positive_int(v) is None}
        if bad:
            raise ValueError(f"split sizes must be positive integers, got {bad}")
        sizes = {k: _positive_int(v) for k, v in sizes.items()}
        known = math.prod(sizes.values())
        if len(free) > 1:
            raise ValueError(f"split({old}={tuple(new_names)!r}): give the size of all but one of the new dims, "
                             f"e.g. split({old}={tuple(new_names)!r}, {free[-1]}=N) ({old} has size {total})")
        if total % known:
            raise ValueError(f"dim {old!r} of size {total} cannot split into parts of {sizes}")
        if free:
            sizes[free[0]] = total // known
        if math.prod(sizes.values()) != total:
            raise ValueError(f"sizes {sizes} do not multiply to {old}={total}")
        new_dims: dict[str, int] = {}
        for name, size in self._dims.items():
            if name == old:
                new_dims.update({n: int(sizes[n]) for n in new_names})
            else:
                new_dims[name] = size
        return Shape(new_dims, self._ranks)

    def flatten(self, name: str) -> Shape:
        """All dims into one named `name`."""
        return Shape({name: len(self._ranks)}, self._ranks)

    def rename(self, **names: str) -> Shape:
        """``rename(gpus="dp")``"""
        for old in names:
            self._check_dim(old)
        new_dims = {names.get(k, k): v for k, v in self._dims.items()}
        if len(new_dims) != len(self._dims):
            taken = [names.get(k, k) for k in self._dims]
            clash = next(n for n in taken if taken.count(n) > 1)
            raise ValueError(
                f"rename({', '.join(f'{k}={v!r}' for k, v in names.items())}) makes two dims named "
                f"{clash!r} (dims are {self.describe()}); rename the other one too, or pick a new name"
            )
        return Shape(new_dims, self._ranks)

    def select(self, ranks: Sequence[int], name: str = "ranks") -> Shape:
        """A flat shape over a subset of this shape's ranks, in the order given."""
        if not isinstance(ranks, Iterable) or isinstance(ranks, str | Mapping | Set):  # no order, or not ranks
            raise TypeError(f"select takes a list of rank numbers, in the order wanted, e.g. select([0, 3]); "
                            f"got {ranks!r}")
        ranks = list(ranks)
        # numpy or torch integers too, as plain ints (they travel in JSON headers); no bools:
        # a mask (select([True, False])) is not a list of ranks
        ints = [as_int(r) for r in ranks]
        wanted = [r for r in ints if r is not None]
        if len(wanted) != len(ranks):
            mask = bool(ranks) and all(type(r).__name__ in ("bool", "bool_") for r in ranks)
            raise TypeError(f"select takes rank numbers, e.g. select([0, 3]), got {ranks!r}"
                            + (" (a mask: pass the ranks where it is True)" if mask else ""))
        if not wanted:
            raise ValueError("select needs at least one rank, got none")
        have = set(self._ranks)
        missing = [r for r in wanted if r not in have]
        if missing:
            raise IndexError(
                f"rank(s) {_fmt_ranks(missing)} not in this mesh (its ranks are "
                f"{_fmt_ranks(self._ranks)})"
            )
        if len(set(wanted)) != len(wanted):
            twice = sorted({r for r in wanted if wanted.count(r) > 1})
            raise ValueError(f"select needs distinct ranks: {_fmt_ranks(twice)} given more than once in {wanted}")
        return Shape({name: len(wanted)}, wanted)

    # --- checks ----------------------------------------------------------------------------

    def _check_dim(self, name: str) -> None:
        if name not in self._dims:
            dims = ", ".join(self._dims) or "none"
            raise ValueError(f"this mesh has no dim {name!r}; its dims are: {dims}")

    def _check_index(self, name: str, given: object, takes: str = "an int or a slice") -> int:
        size = self._dims[name]
        i = as_int(given)  # numpy or torch integers too
        if i is None:
            raise TypeError(f"{name}= takes {takes}, got {given!r}")
        j = i + size if i < 0 else i
        if not 0 <= j < size:
            raise IndexError(f"{name}={i} is out of range: dim {name!r} has size {size} (0..{size - 1})")
        return j


def rank_runs(ranks: Iterable[int]) -> list[list[int]]:
    """Rank ids as ``[start, stop)`` runs of consecutive ids, in the order given: a whole mesh
    of 1,024 ranks is ``[[0, 1024]]``. Messages carry rank sets this way, so their size and
    the work to read them grow with the runs (about one per host), not with the ranks."""
    runs: list[list[int]] = []
    for r in ranks:
        if runs and runs[-1][1] == r:
            runs[-1][1] = r + 1
        else:
            runs.append([r, r + 1])
    return runs


def expand_runs(runs: Iterable[Sequence[int]]) -> list[int]:
    """The rank ids of `rank_runs` output, in order."""
    return [r for start, stop in runs for r in range(start, stop)]


class RunSet:
    """Membership in a set of runs without expanding it (an agent asks for its own ranks)."""

    __slots__ = ("_starts", "_stops")

    def __init__(self, runs: Iterable[Sequence[int]]) -> None:
        ordered = sorted((int(a), int(b)) for a, b in runs)
        self._starts = [a for a, _ in ordered]
        self._stops = [b for _, b in ordered]

    def __contains__(self, r: int) -> bool:
        i = bisect.bisect_right(self._starts, r) - 1
        return i >= 0 and r < self._stops[i]


def _strides(sizes: list[int]) -> list[int]:
    strides = [1] * len(sizes)
    for k in range(len(sizes) - 2, -1, -1):
        strides[k] = strides[k + 1] * sizes[k + 1]
    return strides


def _check_slice(name: str, s: slice) -> slice:
    """`s` with plain-int bounds (numpy's too); a TypeError or ValueError naming the dim."""
    try:
        bounds = [None if b is None else operator.index(b) for b in (s.start, s.stop, s.step)]
    except TypeError:
        raise TypeError(f"{name}={_fmt_slice(s)}: slice bounds must be ints or None") from None
    if bounds[2] == 0:
        raise ValueError(f"{name}={_fmt_slice(s)}: a slice step cannot be zero")
    return slice(*bounds)


def _fmt_slice(s: slice) -> str:
    return f"{'' if s.start is None else s.start}:{'' if s.stop is None else s.stop}" + (
        f":{s.step}" if s.step is not None else ""
    )


def _fmt_ranks(ranks: Sequence[int]) -> str:
    return format_rank_set(ranks)


def format_rank_set(ranks: Iterable[int]) -> str:
    """``[0, 1, 2, 5]`` -> ``0-2,5``"""
    rs = sorted(set(ranks))
    parts: list[str] = []
    i = 0
    while i < len(rs):
        j = i
        while j + 1 < len(rs) and rs[j + 1] == rs[j] + 1:
            j += 1
        parts.append(str(rs[i]) if i == j else f"{rs[i]}-{rs[j]}")
        i = j + 1
    return ",".join(parts)


def describe_meshes(described: Iterable[str]) -> str:
    """Several meshes' dims (each one's `describe`) named together: ``gpus=1 and gpus=2``, or
    ``both gpus=2`` when they read alike (different meshes all the same, which "gpus=2 and gpus=2"
    would hide)."""
    descs = sorted(described)
    if len(descs) > 1 and len(set(descs)) == 1:
        return f"{'both' if len(descs) == 2 else 'all'} {descs[0]}"
    return " and ".join(descs)


def describe_ranks(ranks: Sequence[int]) -> str:
    """``"rank 3"`` or ``"ranks 0-3"``."""
    return ("rank " if len(ranks) == 1 else "ranks ") + format_rank_set(ranks)


S = TypeVar("S", bound="ShapeOps")


class ShapeOps:
    """The mesh algebra for any class holding a `Shape`; subclasses define `_reshaped`."""

    _shape: Shape

    def _reshaped(self: S, shape: Shape) -> S:
        raise NotImplementedError

    @property
    def dims(self) -> dict[str, int]:
        """Named dims, in order: ``{"hosts": 2, "gpus": 8}``."""
        return self._shape.dims

    @property
    def ranks(self) -> list[int]:
        """Global rank ids covered, row-major."""
        return list(self._shape.ranks)

    def size(self, dim: str | None = None) -> int:
        """Number of ranks, or the size of one dim."""
        return self._shape.size(dim)

    def slice(self: S, **sel: int | slice) -> S:
        """``slice(gpus=0)`` drops the dim; ``slice(gpus=slice(0, 4))`` keeps it."""
        return self._reshaped(self._shape.slice(**sel))

    def split(self: S, **spec: Any) -> S:
        """``split(gpus=("dp", "tp"), tp=2)``"""
        return self._reshaped(self._shape.split(**spec))

    def flatten(self: S, name: str) -> S:
        """``flatten("ranks")``: one dim over every rank."""
        return self._reshaped(self._shape.flatten(name))

    def rename(self: S, **names: str) -> S:
        """``rename(gpus="dp")``"""
        return self._reshaped(self._shape.rename(**names))

    def select(self: S, ranks: Sequence[int]) -> S:
        """A flat view ``{"ranks": len(ranks)}`` over the given global ranks."""
        return self._reshaped(self._shape.select(ranks))


def _positive_int(v: Any) -> int | None:
    """`v` as an int (numpy's too) if it is a positive integer, not a bool; else None."""
    n = as_int(v)
    return n if n is not None and n >= 1 else None
