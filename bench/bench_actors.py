"""Actor benchmarks (issue 7), each against baselines measured in the same run.

  call()        one tiny endpoint call on N actors, all results gathered (ValueMesh)
  call_one()    one tiny endpoint call on a one-actor mesh
  broadcast     pipelined fire-and-forget messages per second to N actors (then one call,
                which the actors' FIFO order makes wait for all of them)

Baselines: raw pyzmq ROUTER/DEALER to N processes + gather (bench_runtime.child_zmq: the floor
any Python mesh pays), mesh.run("a=1") on the same mesh, and Monarch's and Ray's equivalents
when they are installed in this environment (else "not installed").

Usage:  python bench/bench_actors.py [--n 4] [--rounds 3]
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import emit, fmt_time, median, run_child, table, timeit

REPS = 1500
BUDGET_S = 4.0
BROADCASTS = 3000


# --- children ---------------------------------------------------------------------------------

def child_viceroy(n: str) -> None:
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
        rates = []
        for _ in range(3):
            before = actors.total.call().get().values()
            t0 = time.perf_counter()
            for _ in range(BROADCASTS):
                actors.bump.broadcast()
            after = actors.total.call().get().values()
            dt = time.perf_counter() - t0
            assert [a - b for a, b in zip(after, before, strict=True)] == [BROADCASTS] * int(n)
            rates.append(BROADCASTS / dt)
        emit("viceroy_broadcast_rate", median(rates), unit="msg/s")


def child_monarch(n: str) -> None:
    from monarch.actor import Actor, endpoint, this_host

    class Echo(Actor):
        @endpoint
        def ping(self) -> int:
            return 1

    procs = this_host().spawn_procs(per_host={"gpus": int(n)})
    actors = procs.spawn("echo", Echo)
    one = actors.slice(gpus=0)
    emit("monarch_call", median(timeit(lambda: actors.ping.call().get(), 200, REPS, BUDGET_S)))
    emit("monarch_call_one", median(timeit(lambda: one.ping.call_one().get(), 200, REPS, BUDGET_S)))
    procs.stop().get()


def child_ray(n: str) -> None:
    import ray

    ray.init(num_cpus=int(n), include_dashboard=False, logging_level="ERROR")

    @ray.remote
    class Echo:
        def ping(self) -> int:
            return 1

    actors = [Echo.remote() for _ in range(int(n))]  # type: ignore[attr-defined]
    emit("ray_call", median(timeit(lambda: ray.get([a.ping.remote() for a in actors]), 200, REPS, BUDGET_S)))
    emit("ray_call_one", median(timeit(lambda: ray.get(actors[0].ping.remote()), 200, REPS, BUDGET_S)))
    ray.shutdown()


# --- parent -----------------------------------------------------------------------------------

def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    n = args.n
    peers = {name: importlib.util.find_spec(mod) is not None for name, mod in (("monarch", "monarch"), ("ray", "ray"))}
    acc: dict[str, list[float]] = {}

    def add(res: dict) -> None:
        for k, rec in res.items():
            acc.setdefault(k, []).append(rec["value"])

    for rnd in range(args.rounds):
        add({f"{k}@{n}": v for k, v in run_child("bench_runtime", "child_zmq", str(n)).items()})
        add({f"{k}@1": v for k, v in run_child("bench_runtime", "child_zmq", "1").items()})
        add(run_child("bench_actors", "child_viceroy", str(n)))
        for name, present in peers.items():
            if present:
                add(run_child("bench_actors", f"child_{name}", str(n)))
        print(f"round {rnd + 1}/{args.rounds} done", file=sys.stderr)

    m = {k: statistics.median(v) for k, v in acc.items()}
    zn, z1 = m[f"zmq_bcast_gather@{n}"], m["zmq_bcast_gather@1"]

    def peer(key: str) -> str:
        name = key.split("_")[0]
        return fmt_time(m[key]) if key in m else ("not installed" if not peers[name] else "failed")

    def vs(key: str, ours: str) -> str:
        return f"{m[key] / m[ours]:.2f}x slower" if key in m else "-"

    rows = [
        (f"call() on {n} actors", fmt_time(m["viceroy_call"]), f"{m['viceroy_call'] / zn:.2f}x of zmq {fmt_time(zn)}",
         f"{m['viceroy_call'] / m['viceroy_run_a1']:.2f}x of mesh.run {fmt_time(m['viceroy_run_a1'])}",
         peer("monarch_call"), vs("monarch_call", "viceroy_call"), peer("ray_call"), vs("ray_call", "viceroy_call")),
        ("call_one()", fmt_time(m["viceroy_call_one"]), f"{m['viceroy_call_one'] / z1:.2f}x of zmq {fmt_time(z1)}", "-",
         peer("monarch_call_one"), vs("monarch_call_one", "viceroy_call_one"),
         peer("ray_call_one"), vs("ray_call_one", "viceroy_call_one")),
        (f"broadcast, pipelined, {n} actors", f"{m['viceroy_broadcast_rate']:.0f} msg/s",
         f"{m['viceroy_broadcast_rate'] * zn:.2f} msgs per zmq round trip", "-", "-", "-", "-", "-"),
    ]
    print(f"\nbench_actors: {args.rounds} rounds, medians; {os.cpu_count()} CPUs; load {os.getloadavg()[0]:.2f}\n")
    print(table(rows, ("measurement", "viceroy", "raw zmq floor (same run)", "viceroy mesh.run",
                       "monarch", "monarch vs us", "ray", "ray vs us")))
    missing = [k for k, v in peers.items() if not v]
    if missing:
        print(f"\n{', '.join(missing)}: not installed in this environment; install torchmonarch / ray "
              "into the bench venv to compare in the same run.")


if __name__ == "__main__":
    main()
