"""Data-plane benchmarks (issue: data plane), each against raw torch.distributed in the same run.

  bandwidth   vr.all_reduce of 64 MiB (float32) on 4 CPU ranks  vs  dist.all_reduce on the
              default gloo group of the same ranks; bus bandwidth = bytes * 2(n-1)/n / time
  latency     the same with 4 bytes (one float32)

Usage:  python bench/bench_collectives.py [--ranks 4] [--mib 64] [--rounds 8]
Both sides run in the same processes (a viceroy mesh in a child process), in interleaved rounds
that alternate which goes first, so a noisy neighbour hits both; medians are reported.
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import emit, fmt_time, median, run_child, table

# --- on the ranks --------------------------------------------------------------------------------


def _measure(nbytes: int, iters: int, rounds: int) -> dict[str, list[float]]:
    """Per-op seconds for each side, one entry per round (runs on every rank)."""
    import time

    import torch
    import torch.distributed as dist

    import viceroy as vr

    if not dist.is_initialized():
        dist.init_process_group("gloo")
    ours = torch.ones(max(1, nbytes // 4))
    raw = torch.ones(max(1, nbytes // 4))
    sides = {"viceroy": lambda: vr.all_reduce(ours), "raw": lambda: dist.all_reduce(raw)}
    for f in sides.values():  # warm up: build communicators, touch memory
        f()
        f()
    out: dict[str, list[float]] = {k: [] for k in sides}
    for r in range(rounds):
        order = list(sides) if r % 2 == 0 else list(reversed(sides))
        for name in order:
            dist.barrier()
            t0 = time.perf_counter()
            for _ in range(iters):
                sides[name]()
            out[name].append((time.perf_counter() - t0) / iters)
    return out


def child(ranks: str, mib: str, rounds: str) -> None:
    import viceroy as vr

    n = int(ranks)
    with vr.Mesh.local(gpus=n, echo=False) as mesh:
        # Latency rounds are short and noisy on a shared machine: more of them.
        for key, nbytes, iters, k in (("bw", int(float(mib) * (1 << 20)), 2, 1), ("lat", 4, 100, 2)):
            res = mesh.run(_measure, nbytes, iters, k * int(rounds), timeout=600).item(gpus=0)
            for side, per_round in res.items():
                emit(f"{key}/{side}", median(per_round), rounds=per_round, nbytes=nbytes, n=n)


# --- report --------------------------------------------------------------------------------------


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--mib", type=float, default=64)
    ap.add_argument("--rounds", type=int, default=8)
    a = ap.parse_args()
    res = run_child("bench_collectives", "child", str(a.ranks), str(a.mib), str(a.rounds), timeout=1200)
    n = a.ranks

    def busbw(key: str) -> float:
        rec = res[key]
        return float(rec["nbytes"]) * 2 * (n - 1) / n / float(rec["value"])  # type: ignore[arg-type]

    bw_ours, bw_raw = busbw("bw/viceroy"), busbw("bw/raw")
    lat_ours, lat_raw = float(res["lat/viceroy"]["value"]), float(res["lat/raw"]["value"])  # type: ignore[arg-type]
    rows = [
        (f"all_reduce {a.mib:g} MiB, {n} CPU ranks: bus bandwidth",
         f"{bw_ours / 1e9:.2f} GB/s", f"{bw_raw / 1e9:.2f} GB/s", f"{bw_ours / bw_raw:.0%}", ">= 90 %"),
        (f"all_reduce 4 B, {n} CPU ranks: latency",
         fmt_time(lat_ours), fmt_time(lat_raw), f"{lat_ours / lat_raw:.2f}x", "<= 1.2x"),
    ]
    print(table(rows, ("measure", "viceroy", "raw torch.distributed gloo", "ratio", "goal")))


if __name__ == "__main__":
    main()
