"""Scale (issue: many hosts): mesh.run('a=1') on many light ranks spread over simulated hosts
(one agent per host, all on this machine), reporting latency and the controller's CPU per call.
The controller's cost should grow with hosts, not ranks: agents relay and aggregate.

Usage: python bench/bench_scale.py [--layouts 4x16,16x4,16x16,4x64] [--calls 50]
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import emit, fmt_time, median, run_child, table


def child(hosts: str, gpus: str, calls: str) -> None:
    import viceroy as vr

    h, g, n = int(hosts), int(gpus), int(calls)
    t0 = time.perf_counter()
    mesh = vr.Mesh.local(hosts=h, gpus=g, preload=[], echo=False, startup_timeout=600)
    emit("up", time.perf_counter() - t0)
    for _ in range(5):
        mesh.run("a=1")
    times, c0 = [], time.process_time()
    for _ in range(n):
        t = time.perf_counter()
        mesh.run("a=1")
        times.append(time.perf_counter() - t)
    emit("cpu_per_call", (time.process_time() - c0) / n)
    emit("latency", median(times))
    t0 = time.perf_counter()
    mesh.shutdown()
    emit("shutdown", time.perf_counter() - t0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layouts", default="4x16,16x4,16x16,4x64")
    ap.add_argument("--calls", type=int, default=50)
    args = ap.parse_args()
    rows = []
    for layout in args.layouts.split(","):
        h, g = layout.split("x")
        r = run_child("bench_scale", "child", h, g, str(args.calls), timeout=1200)
        rows.append((f"{h} hosts x {g}", str(int(h) * int(g)), fmt_time(r["up"]["value"]),
                     fmt_time(r["latency"]["value"]), fmt_time(r["cpu_per_call"]["value"]), fmt_time(r["shutdown"]["value"])))
    print(f"\nbench_scale: {os.cpu_count()} CPUs; load {os.getloadavg()[0]:.2f}; every host is an agent on this machine\n")
    print(table(rows, ("layout", "ranks", "start", "run('a=1') median", "controller CPU per call", "shutdown")))


if __name__ == "__main__":
    main()
