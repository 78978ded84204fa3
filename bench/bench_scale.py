"""Scale (issue: many hosts): broadcast-and-gather (`mesh.run("rank")`: code to every rank, one
value back from each) on many light ranks (no torch) spread over simulated hosts: one agent per
host, all on this machine. Reports latency and the controller's CPU per call as hosts and ranks
grow. The controller's cost should grow with hosts, not ranks: each agent relays one message to
its ranks and sends back one aggregate. A single host on the controller's machine ("1 x N") is
the direct path, where the controller talks to every rank itself: shown for contrast.

Usage: python bench/bench_scale.py [--layouts 1x64,4x16,16x4,4x64,16x16,16x64] [--calls 50]
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import emit, fmt_time, median, pct, run_child, table


def child(hosts: str, gpus: str, calls: str) -> None:
    import viceroy as vr

    h, g, n = int(hosts), int(gpus), int(calls)
    dims = {"hosts": h, "gpus": g} if h > 1 else {"gpus": g}
    t0 = time.perf_counter()
    mesh = vr.Mesh.local(dims, preload=[], echo=False, startup_timeout=1200)
    emit("up", time.perf_counter() - t0)
    assert mesh.run("rank").values() == list(range(h * g))  # every rank answers, in order
    for _ in range(5):
        mesh.run("rank")
    times, c0, w0 = [], time.process_time(), time.perf_counter()
    for _ in range(n):
        t = time.perf_counter()
        mesh.run("rank").values()  # the values read, as a user would
        times.append(time.perf_counter() - t)
    cpu, wall = (time.process_time() - c0) / n, (time.perf_counter() - w0) / n
    # What the controller spends with no call at all (heartbeats to and from every agent),
    # over the same wall time as a call: calls get slower with more ranks on these 2 CPUs,
    # so this part grows with them without being per-call work.
    c0, t0 = time.process_time(), time.perf_counter()
    time.sleep(3)
    idle = (time.process_time() - c0) / (time.perf_counter() - t0) * wall
    emit("cpu_per_call", cpu)
    emit("idle_per_call", idle)
    emit("net_per_call", max(0.0, cpu - idle))
    emit("p50", median(times))
    emit("p90", pct(times, 0.9))
    t0 = time.perf_counter()
    mesh.shutdown()
    emit("shutdown", time.perf_counter() - t0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layouts", default="1x64,4x16,16x4,4x64,16x16,16x64")
    ap.add_argument("--calls", type=int, default=50)
    args = ap.parse_args()
    rows, cpu = [], {}
    for layout in args.layouts.split(","):
        h, g = (int(x) for x in layout.split("x"))
        r = run_child("bench_scale", "child", str(h), str(g), str(args.calls), timeout=2400)
        cpu[(h, g)] = r["net_per_call"]["value"]
        rows.append((f"{h} host{'s' if h > 1 else ''} x {g}" + (" (direct)" if h == 1 else ""), str(h * g),
                     fmt_time(r["up"]["value"]), fmt_time(r["p50"]["value"]), fmt_time(r["p90"]["value"]),
                     fmt_time(r["cpu_per_call"]["value"]), fmt_time(r["idle_per_call"]["value"]),
                     fmt_time(r["net_per_call"]["value"]), fmt_time(r["shutdown"]["value"])))
    print(f"\nbench_scale: {os.cpu_count()} CPUs; load {os.getloadavg()[0]:.2f}; every host is an agent on this "
          f"machine; {args.calls} calls of mesh.run('rank') per layout\n")
    print(table(rows, ("layout", "ranks", "start", "p50", "p90", "controller CPU per call", "of which idle",
                       "net per call", "shutdown")))
    print("\n(idle: the controller's CPU with no call in flight, heartbeats mostly, over a call's wall "
          "time; net = CPU per call - idle. Ratios and the fit below use net.)")
    print()
    for h in sorted({h for h, _ in cpu}):
        gs = sorted(g for hh, g in cpu if hh == h)
        if h > 1 and len(gs) > 1:
            a, b = gs[0], gs[-1]
            print(f"{h} hosts, ranks x{b // a} ({h * a} -> {h * b}): controller CPU per call x{cpu[(h, b)] / cpu[(h, a)]:.2f}")
    relayed = [(h, g) for h, g in cpu if h > 1]
    if len({h for h, _ in relayed}) > 1 and len({h * g for h, g in relayed}) > 1:
        import numpy as np

        a = np.array([[1.0, h, h * g] for h, g in relayed])
        coef = np.linalg.lstsq(a, np.array([cpu[k] for k in relayed]), rcond=None)[0]
        print(f"least-squares fit over the relayed layouts: controller CPU per call = {fmt_time(coef[0])} "
              f"+ {fmt_time(coef[1])} per host + {fmt_time(coef[2])} per rank")
    for n in sorted({h * g for h, g in cpu}):
        same = sorted((h, g) for h, g in cpu if h * g == n and h > 1)
        if len(same) > 1:
            lo, hi = same[0], same[-1]
            print(f"{n} ranks, hosts x{hi[0] // lo[0]} ({lo[0]} -> {hi[0]}): controller CPU per call "
                  f"x{cpu[hi] / cpu[lo]:.2f}")


if __name__ == "__main__":
    main()
