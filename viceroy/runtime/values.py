"""`ValueMesh`: one value per rank, shaped like the mesh it came from."""

from __future__ import annotations

import hashlib
import pickle
import sys
from collections import Counter
from collections.abc import Iterator, Mapping
from typing import Any, Generic, TypeVar

from viceroy.runtime.shape import Shape, ShapeOps, describe_ranks, format_rank_set

T = TypeVar("T")


class ValueMesh(ShapeOps, Generic[T]):
    """Values indexed by mesh coordinates.

    >>> vals = mesh.run("rank * 10")
    >>> vals.item(gpus=3)
    30
    >>> list(vals.items())[:2]   # (coordinates, value) pairs, row-major
    [({'gpus': 0}, 0), ({'gpus': 1}, 10)]
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
            return self._shape == other._shape and all(
                _equal(a, b) for a, b in zip(self.values(), other.values(), strict=True))
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        head = f"ValueMesh({self._shape.describe()})"
        # Grouped by content, shown cut short: values that differ only past what is shown
        # (or inside numpy's "..." summary) are not "all" the same.
        vals = self.values()
        keys = [_content_key(v) for v in vals]
        keyed: dict[Any, list[int]] = {}
        for pos, key in enumerate(keys):
            if _is_unique(key):  # cannot be pickled: group it with an earlier one it == equals
                key = keys[pos] = next(
                    (k for k, ps in keyed.items() if _is_unique(k) and _equal(vals[ps[0]], vals[pos])), key)
            keyed.setdefault(key, []).append(pos)
        texts = {k: _short_repr(vals[ps[0]]) for k, ps in keyed.items()}
        alike = Counter(texts.values())
        for n, k in enumerate(keyed, 1):
            if alike[texts[k]] > 1:  # a value that could not be pickled was compared by == alone
                why = "not equal (==) to the others" if _is_unique(k) else "differs from the others beyond what is shown"
                texts[k] += f"  [value {n}: {why}]"
        if len(keyed) == 1 and len(self) > 1:
            return f"{head}: all {texts[keys[0]]}"
        if not self._shape.dims:  # one rank, no dims (e.g. mesh.slice(gpus=0))
            return f"{head}: {texts[keys[0]]}"
        lines = [head + ":"]
        dims = list(self._shape.dims)
        coords = list(self._shape.coords())
        if len(keyed) == len(self):
            for pos, (c, key) in enumerate(zip(coords, keys, strict=True)):
                lines.append(f"  {_fmt_coords(c, dims)}{self._which_ranks([pos])}: {texts[key]}")
        else:
            sizes = self._shape.dims
            for key, positions in keyed.items():
                label = "; ".join(_group_labels([coords[p] for p in positions], dims, sizes))
                lines.append(f"  {label}{self._which_ranks(positions)}: {texts[key]}")
        return "\n".join(lines)

    def _which_ranks(self, positions: list[int]) -> str:
        """`` (rank 3)`` after a label of a selection (``mesh.select([1, 3])``, ``%%mesh --ranks
        1,3``), whose one dim is named "ranks" but counts the positions in it: ``ranks=1`` read
        alone is rank 1. "" for any other label."""
        ranks = self._shape.ranks
        if list(self._shape.dims) != ["ranks"] or list(ranks) == list(range(len(ranks))):
            return ""
        return f" ({describe_ranks([ranks[p] for p in positions])})"

    def _repr_pretty_(self, p: Any, cycle: bool) -> None:
        p.text(repr(self))


def _equal(a: object, b: object) -> bool:
    """Values equal as a whole: arrays and tensors (whose == is elementwise) by content."""
    if a is b:
        return True
    try:
        return bool(a == b)
    except Exception:  # "truth value of an array ... is ambiguous"
        return type(a) is type(b) and _content_key(a) == _content_key(b)


def _group_labels(coords: list[dict[str, int]], dims: list[str], sizes: dict[str, int]) -> list[str]:
    """Coordinates of a group of equal values, as few labels as a user reads at a glance: a
    group that is a product of per-dim sets is one label naming only the dims it does not
    cover whole (``tp=0,2``: every dp); any other is split along the leading dim."""
    seen = {d: sorted({c[d] for c in coords}) for d in dims}
    n = 1
    for d in dims:
        n *= len(seen[d])
    if n == len(coords):
        return [", ".join(f"{d}={format_rank_set(seen[d])}" for d in dims if len(seen[d]) != sizes[d])]
    lead, rest = dims[0], dims[1:]
    labels = []
    for v in seen[lead]:
        for label in _group_labels([c for c in coords if c[lead] == v], rest, sizes):
            labels.append(f"{lead}={v}, {label}" if label else f"{lead}={v}")
    return labels


def _fmt_coords(coords: dict[str, int], dims: list[str]) -> str:
    return ", ".join(f"{d}={coords[d]}" for d in dims)


def _safe_repr(v: object) -> str:
    """``repr(v)``, or, where that raises, a stand-in that says so: one value's broken
    ``__repr__`` must not hide the whole ValueMesh."""
    try:
        return repr(v)
    except Exception as e:
        try:
            why = f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
        except Exception:
            why = type(e).__name__
    return f"<{type(v).__name__} object: repr raised {why}>"


def _short_repr(v: object, limit: int = 200) -> str:
    if isinstance(v, (bytes, bytearray, str)) and len(v) > limit:  # repr of 300 MB takes seconds
        note = f"... ({len(v):,} {'characters' if isinstance(v, str) else 'bytes'})"
        return repr(v[:limit])[: limit - len(note)] + note
    text = _safe_repr(v)
    if "\n" in text:
        text = text.replace("\n", "\n    ")
    return text if len(text) <= limit else text[: limit - 3] + "..."


_SMALL = 4096


def _content_key(v: object) -> Any:
    """Equal for values that look the same and are the same: their repr when it is short and
    says all (small plain values), else a digest of their contents."""
    if isinstance(v, (bytes, bytearray, memoryview)):
        return ("bytes", _digest(v))
    if isinstance(v, str):
        return v if len(v) <= _SMALL else ("str", _digest(v.encode("utf-8", "surrogatepass")))
    np = sys.modules.get("numpy")
    if np is not None and isinstance(v, np.ndarray) and v.dtype != object:
        return ("ndarray", v.dtype.str, v.shape, _digest(np.ascontiguousarray(v).view(np.uint8)))
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(v, torch.Tensor) and v.device.type == "cpu" and v.layout == torch.strided:
        try:
            raw = v.detach().contiguous().reshape(-1).view(torch.uint8).numpy()
            return ("tensor", str(v.dtype), tuple(v.shape), v.requires_grad, _digest(raw))
        except (RuntimeError, TypeError):
            pass
    text = _safe_repr(v)
    if type(v) in (int, float, bool, complex, type(None)) or (len(text) <= 80 and " object" not in text):
        return text
    try:  # an object whose repr may not tell it apart (<...HTML object>, cut lists)
        return ("pickled", text, _digest(pickle.dumps(v, protocol=5)))
    except Exception:
        return ("unique", id(v))


def _is_unique(key: Any) -> bool:
    return isinstance(key, tuple) and len(key) == 2 and key[0] == "unique"


def _digest(data: Any) -> bytes:
    view = memoryview(data)  # cast("B") refuses a zero in the shape ((2, 0) arrays) and gaps
    raw = view.cast("B") if view.nbytes and view.c_contiguous else view.tobytes()
    return hashlib.blake2b(raw, digest_size=16).digest()
