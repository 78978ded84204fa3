"""Bench helpers: medians after warm-up, each framework in its own child process, ratios
against baselines measured in the same run (the method of ../shared/reference/peers_bench.py)."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable

RESULT_TAG = "@@RESULT@@ "

# A cell of the size notebooks hold (40 lines of plain Python, cheap to run, its last line's
# value shown): what every cell costs the kernel around the user's code grows with its text.
CELL_40 = """# One epoch's statistics, as a notebook cell would compute them
import math


def step(batch, scale=2.0):
    # the mean of the scaled square roots
    total = 0.0
    for x in batch:
        total += math.sqrt(abs(x)) * scale
    return total / max(len(batch), 1)


class Meter:
    def __init__(self):
        self.values = []

    def add(self, v):
        self.values.append(v)

    @property
    def mean(self):
        return sum(self.values) / len(self.values) if self.values else 0.0


# two short epochs
meter = Meter()
for epoch in range(2):
    batch = [epoch + i * 0.5 for i in range(4)]
    meter.add(step(batch))
    if meter.mean > 100:
        break

# what the next cell shows
summary = {
    "epochs": 2,
    "mean": round(meter.mean, 3),
    "last": meter.values[-1],
}
assert summary["epochs"] == 2
summary["mean"]
"""


def timeit(
    fn: Callable[[], object], warmup: int, reps: int, budget_s: float | None = None, gap_s: float = 0.0
) -> list[float]:
    """Times of `reps` calls of `fn` after `warmup` untimed ones. `gap_s`: between calls, keep
    this thread busy that long, untimed (as a kernel is between two cells), so that the other
    processes idle and wake as they would there."""
    for _ in range(warmup):
        fn()
    out: list[float] = []
    spent = 0.0  # time in the loop, gaps left out
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        t1 = time.perf_counter()
        out.append(t1 - t0)
        while gap_s and time.perf_counter() - t1 < gap_s:
            pass
        spent += t1 - t0
        if budget_s is not None and spent > budget_s and len(out) >= 30:
            break
    return out


def median(xs: list[float]) -> float:
    return statistics.median(xs)


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    k = (len(xs) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def emit(key: str, value: float, **extra: object) -> None:
    """Child -> parent: one measurement (seconds unless `unit` says otherwise)."""
    print(RESULT_TAG + json.dumps({"key": key, "value": value, **extra}), flush=True)


def run_child(module: str, func: str, *args: str, timeout: float = 300) -> dict[str, dict[str, object]]:
    """Run `module.func(*args)` in a fresh interpreter; collect what it emits."""
    here = os.path.dirname(os.path.abspath(__file__))
    code = f"import sys; sys.path.insert(0, {here!r}); import {module}; {module}.{func}(*sys.argv[1:])"
    proc = subprocess.run(
        [sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=timeout
    )
    results = {}
    for line in proc.stdout.splitlines():
        if line.startswith(RESULT_TAG):
            rec = json.loads(line[len(RESULT_TAG):])
            results[rec["key"]] = rec
    if proc.returncode != 0:
        raise RuntimeError(f"{module}.{func}{args} failed:\n{proc.stderr[-3000:]}")
    return results


def fmt_time(s: float) -> str:
    if s < 1e-3:
        return f"{s * 1e6:.0f} us"
    if s < 1:
        return f"{s * 1e3:.2f} ms"
    return f"{s:.2f} s"


def table(rows: list[tuple[str, ...]], header: tuple[str, ...]) -> str:
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    line = lambda r: "| " + " | ".join(str(c).ljust(w) for c, w in zip(r, widths, strict=True)) + " |"  # noqa: E731
    sep = "|" + "|".join("-" * (w + 2) for w in widths) + "|"
    return "\n".join([line(header), sep, *(line(r) for r in rows)])
