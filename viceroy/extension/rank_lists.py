"""``--ranks`` lists (``0,3,5-7``): parsed, and checked against the mesh before any range is
expanded, so a range of a hundred million ranks is one line at once, not a list of ints."""

from __future__ import annotations

import bisect
from collections.abc import Sequence

from IPython.core.error import UsageError

from viceroy.runtime.shape import format_rank_set

# More ranks than any mesh has: a --ranks range is checked against this (or the mesh's own
# ranks, when known) before it is expanded into a list.
MAX_RANKS = 1 << 20


def parse_ranks(text: str, mesh_ranks: Sequence[int] | None = None) -> list[int]:
    """``"0,3,5-7"`` -> ``[0, 3, 5, 6, 7]``.

    Every range is checked before it is expanded: against `mesh_ranks` (the ranks of the mesh
    the cell goes to) when given, else against MAX_RANKS, so ``--ranks 0-100000000`` is one
    line at once, not a list of a hundred million ints.
    """
    spans: list[tuple[int, int]] = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        lo, dash, hi = part.partition("-")
        try:
            first = int(lo)
            last = int(hi) if dash else first
        except ValueError:
            raise UsageError(f"--ranks takes rank numbers like 0,3 or 0-2,5, got {text!r}") from None
        if last < first:
            raise UsageError(f"--ranks: the range {part!r} runs backwards; write LOW-HIGH, e.g. 0-2")
        spans.append((first, last))
    if not spans:
        raise UsageError(f"--ranks takes rank numbers like 0,3 or 0-2,5, got {text!r}")
    if mesh_ranks is not None:
        have = sorted(set(mesh_ranks))
        missing = [gap for span in spans for gap in _gaps(span, have)]
        if missing:
            raise UsageError(
                f"--ranks: rank(s) {_format_spans(missing)} not in this mesh (its ranks are "
                f"{format_rank_set(have)})"
            )
    past = next((span for span in spans if span[1] >= MAX_RANKS), None)
    if past is not None:
        raise UsageError(
            f"--ranks: {_format_spans([past])} goes past rank {MAX_RANKS - 1:,}, the last a mesh "
            "can have; give ranks of the mesh, e.g. --ranks 0,3"
        )
    count = sum(last - first + 1 for first, last in spans)
    if count > MAX_RANKS:  # so ranks given more than once
        raise UsageError(
            f"--ranks {text}: {count:,} ranks, more than a mesh can have ({MAX_RANKS:,}); "
            "give each rank once, e.g. --ranks 0-3,5"
        )
    return [r for first, last in spans for r in range(first, last + 1)]


def _gaps(span: tuple[int, int], have: list[int]) -> list[tuple[int, int]]:
    """The parts of ``first..last`` not in `have` (sorted), as inclusive spans."""
    first, last = span
    out = []
    at = first
    for r in have[bisect.bisect_left(have, first) : bisect.bisect_right(have, last)]:
        if r > at:
            out.append((at, r - 1))
        at = r + 1
    if at <= last:
        out.append((at, last))
    return out


def _format_spans(spans: list[tuple[int, int]]) -> str:
    """``[(5, 7), (0, 0), (1, 2)]`` -> ``0-2,5-7``: as `format_rank_set` writes those ranks."""
    merged: list[list[int]] = []
    for first, last in sorted(spans):
        if merged and first <= merged[-1][1] + 1:
            merged[-1][1] = max(merged[-1][1], last)
        else:
            merged.append([first, last])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in merged)
