"""`ValueMesh`: one value per rank, shaped like the mesh it came from."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any, Generic, TypeVar

from viceroy.runtime.shape import Shape, ShapeOps, format_rank_set

T = TypeVar("T")


class ValueMesh(ShapeOps, Generic[T]):
    """Values indexed by mesh coordinates.

    >>> vals = mesh.run("rank * 10")
    >>> vals.item(gpus=3)
    30
    >>> dict(vals.items())   # {(("gpus", 0),): 0, ...} keyed by coordinates
    """

    __slots__ = ("_by_rank", "_shape")

    def __init__(self, shape: Shape, by_rank: Mapping[int, T]) -> None:
        self._shape = shape
        self._by_rank = {r: by_rank[r] for r in shape.ranks}

    @classmethod
    def _adopt(cls, shape: Shape, by_rank: dict[int, T]) -> ValueMesh[T]:
        """Take `by_rank` as is: its keys are exactly `shape`'s ranks (a finished call's)."""
        vm = cls.__new__(cls)
        vm._shape, vm._by_rank = shape, by_rank
        return vm

    def _reshaped(self, shape: Shape) -> ValueMesh[T]:
        return ValueMesh(shape, self._by_rank)

    def item(self, **coords: int) -> T:
        """The value at the given coordinates (every dim named): ``item(hosts=0, gpus=3)``."""
        if not coords and len(self._shape) == 1:
            return self._by_rank[self._shape.ranks[0]]
        return self._by_rank[self._shape.ranks[self._shape.position(**coords)]]

    def items(self) -> Iterator[tuple[dict[str, int], T]]:
        """``(coords, value)`` pairs, row-major."""
        for coords, r in zip(self._shape.coords(), self._shape.ranks, strict=True):
            yield coords, self._by_rank[r]

    def values(self) -> list[T]:
        """Values, row-major."""
        return [self._by_rank[r] for r in self._shape.ranks]

    def by_rank(self) -> dict[int, T]:
        """Values keyed by global rank id."""
        return dict(self._by_rank)

    def __len__(self) -> int:
        return len(self._shape)

    def __iter__(self) -> Iterator[T]:
        return iter(self.values())

    def __eq__(self, other: object) -> bool:
        if isinstance(other, ValueMesh):
            return self._shape == other._shape and self.values() == other.values()
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        head = f"ValueMesh({self._shape.describe()})"
        groups: dict[str, list[int]] = {}
        for pos, v in enumerate(self.values()):
            groups.setdefault(_short_repr(v), []).append(pos)
        if len(groups) == 1 and len(self) > 1:
            (text,) = groups
            return f"{head}: all {text}"
        lines = [head + ":"]
        dims = list(self._shape.dims)
        coords = list(self._shape.coords())
        if len(groups) == len(self):
            for c, v in zip(coords, self.values(), strict=True):
                lines.append(f"  {_fmt_coords(c, dims)}: {_short_repr(v)}")
        else:
            for text, positions in groups.items():
                label = "positions " + format_rank_set(positions) if len(dims) != 1 else (
                    f"{dims[0]}={format_rank_set(positions)}"
                )
                lines.append(f"  {label}: {text}")
        return "\n".join(lines)

    def _repr_pretty_(self, p: Any, cycle: bool) -> None:
        p.text(repr(self))


def _fmt_coords(coords: dict[str, int], dims: list[str]) -> str:
    return ", ".join(f"{d}={coords[d]}" for d in dims)


def _short_repr(v: object, limit: int = 200) -> str:
    text = repr(v)
    if "\n" in text:
        text = text.replace("\n", "\n    ")
    return text if len(text) <= limit else text[: limit - 3] + "..."
