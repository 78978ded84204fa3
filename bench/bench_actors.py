"""Actor benchmarks (issue 7): Viceroy beside Monarch and Ray, each round measuring all of them
one after another, so that the load of a shared machine falls on all alike.

  call()        one tiny endpoint call on N actors, all results gathered (ValueMesh)
  call_one()    one tiny endpoint call on a one-actor mesh
  broadcast     pipelined fire-and-forget messages to N actors per second (then one gathered
                call, which the actors' FIFO order makes wait for all of them)

Baselines in the same run: raw pyzmq ROUTER/DEALER to N processes + gather
(bench_runtime.child_zmq, the floor any Python mesh pays) and mesh.run("a=1"). Monarch
(torchmonarch) and Ray run from the peers' venv (`--peers-python`, default .venv-bench/bin/python,
made by `make bench-peers`; see bench/peers/); when a peer cannot be imported there, the table
says so and the import error is printed.

Usage:  python bench/bench_actors.py [--n 4] [--rounds 3] [--peers-python PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import RESULT_TAG, emit, fmt_time, median, run_child, table, timeit

HERE = os.path.dirname(os.path.abspath(__file__))

REPS = 1500
BUDGET_S = 4.0
PEERS = {"monarch": "monarch.actor", "ray": "ray"}


def child_viceroy(n: str) -> None:
    sys.path.insert(0, os.path.join(HERE, "peers"))
    from children import _rate

    import viceroy as vr

    class Echo(vr.Actor):
        def __init__(self) -> None:
            self.count = 0

        @vr.endpoint
        def ping(self) -> int:
            return 1

        @vr.endpoint
        def bump(self) -> None:
            self.count += 1

        @vr.endpoint
        def total(self) -> int:
            return self.count

    with vr.Mesh.local(gpus=int(n), preload=[], echo=False) as mesh:
        actors = mesh.spawn(Echo)
        one = actors.slice(gpus=0)
        emit("viceroy_call", median(timeit(lambda: actors.ping.call().get(), 200, REPS, BUDGET_S)))
        emit("viceroy_call_one", median(timeit(lambda: one.ping.call_one().get(), 200, REPS, BUDGET_S)))
        emit("viceroy_run_a1", median(timeit(lambda: mesh.run("a=1"), 200, REPS, BUDGET_S)))
        emit("viceroy_broadcast_rate", _rate(actors.bump.broadcast, lambda: actors.total.call().get().values(),
                                             int(n)), unit="msg/s")


def run_peer(python: str, func: str, n: int, timeout: float = 300) -> dict[str, dict[str, object]]:
    """`bench/peers/children.func(n)` in the peers' interpreter; what it emits."""
    code = f"import sys; sys.path.insert(0, {os.path.join(HERE, 'peers')!r}); import children; children.{func}({str(n)!r})"
    proc = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        raise RuntimeError(f"{func} failed:\n{proc.stderr[-3000:]}")
    return {rec["key"]: rec for rec in (json.loads(ln[len(RESULT_TAG):]) for ln in proc.stdout.splitlines()
                                        if ln.startswith(RESULT_TAG))}


def peer_status(python: str) -> dict[str, str]:
    """name -> "" when importable in the peers' interpreter, else why not (the error text)."""
    out = {}
    for name, mod in PEERS.items():
        if not os.path.exists(python):
            out[name] = f"no peers' interpreter at {python} (make bench-peers creates it)"
            continue
        proc = subprocess.run([python, "-c", f"import {mod}"], capture_output=True, text=True, timeout=120)
        out[name] = "" if proc.returncode == 0 else (proc.stderr.strip().splitlines() or ["failed"])[-1]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--peers-python", default=os.path.join(os.path.dirname(HERE), ".venv-bench", "bin", "python"))
    args = ap.parse_args()
    n = args.n
    status = peer_status(args.peers_python)
    failed: dict[str, str] = {}
    acc: dict[str, list[float]] = {}

    def add(res: dict) -> None:
        for k, rec in res.items():
            acc.setdefault(k, []).append(rec["value"])

    for rnd in range(args.rounds):
        add({f"{k}@{n}": v for k, v in run_child("bench_runtime", "child_zmq", str(n)).items()})
        add({f"{k}@1": v for k, v in run_child("bench_runtime", "child_zmq", "1").items()})
        order = ["viceroy", *(name for name, why in status.items() if not why)]
        for name in order[rnd % len(order):] + order[:rnd % len(order)]:  # each goes first in turn
            if name == "viceroy":
                add(run_child("bench_actors", "child_viceroy", str(n)))
            elif name not in failed:
                try:
                    add(run_peer(args.peers_python, f"child_{name}", n))
                except (RuntimeError, subprocess.TimeoutExpired) as exc:
                    failed[name] = str(exc).strip().splitlines()[-1]
        print(f"round {rnd + 1}/{args.rounds} done", file=sys.stderr)

    m = {k: statistics.median(v) for k, v in acc.items()}
    zn, z1 = m[f"zmq_bcast_gather@{n}"], m["zmq_bcast_gather@1"]

    def peer(key: str, rate: bool = False) -> str:
        name = key.split("_")[0]
        if key in m:
            return f"{m[key]:.0f} msg/s" if rate else fmt_time(m[key])
        return "not installed" if status[name] else "failed"

    def vs(key: str, ours: str, rate: bool = False) -> str:
        if key not in m:
            return "-"
        ratio = m[ours] / m[key] if rate else m[key] / m[ours]
        return f"{ratio:.2f}x"

    rows = [
        (f"call() on {n} actors", fmt_time(m["viceroy_call"]), peer("monarch_call"), vs("monarch_call", "viceroy_call"),
         peer("ray_call"), vs("ray_call", "viceroy_call"),
         f"zmq {fmt_time(zn)}; mesh.run {fmt_time(m['viceroy_run_a1'])}"),
        ("call_one()", fmt_time(m["viceroy_call_one"]), peer("monarch_call_one"),
         vs("monarch_call_one", "viceroy_call_one"), peer("ray_call_one"), vs("ray_call_one", "viceroy_call_one"),
         f"zmq 1:1 {fmt_time(z1)}"),
        (f"broadcast to {n}, pipelined", f"{m['viceroy_broadcast_rate']:.0f} msg/s",
         peer("monarch_broadcast_rate", True), vs("monarch_broadcast_rate", "viceroy_broadcast_rate", True),
         peer("ray_broadcast_rate", True), vs("ray_broadcast_rate", "viceroy_broadcast_rate", True), "-"),
    ]
    print(f"\nbench_actors: {args.rounds} rounds (viceroy and the peers in turn), medians over rounds; "
          f"{os.cpu_count()} CPUs; load {os.getloadavg()[0]:.2f}\n")
    print(table(rows, ("measurement", "viceroy", "monarch", "monarch/us", "ray", "ray/us", "baselines (same run)")))
    print("\nmonarch/us, ray/us: how many times faster viceroy is (>1: viceroy faster).")
    print("each round (latencies in us, rates in msg/s): " + "; ".join(
        f"{k} {'/'.join(f'{v:.0f}' if 'rate' in k else f'{v * 1e6:.0f}' for v in acc[k])}"
        for k in sorted(acc) if not k.startswith("zmq")))
    for name, why in {**{k: v for k, v in status.items() if v}, **failed}.items():
        print(f"{name}: not measured: {why}")


if __name__ == "__main__":
    main()
