"""The peers' side of bench/bench_actors.py: the same three measurements on Monarch's and Ray's
actors. Runs in the peers' venv (.venv-bench), which has no viceroy: stdlib and bench/common only.

  call        one tiny endpoint on N actors, every result gathered
  call_one    one tiny endpoint on one actor
  broadcast   pipelined fire-and-forget messages to all N actors, then one gathered call (FIFO
              per sender and actor makes it wait for all of them): messages per second
"""

from __future__ import annotations

import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from common import emit, median, timeit

REPS = 1500
BUDGET_S = 4.0
BROADCASTS = 3000
ROUNDS = 3


def _rate(send: object, total: object, n: int) -> float:
    rates = []
    for _ in range(ROUNDS):
        before = total()  # type: ignore[operator]
        t0 = time.perf_counter()
        for _ in range(BROADCASTS):
            send()  # type: ignore[operator]
        after = total()  # type: ignore[operator]
        dt = time.perf_counter() - t0
        assert [a - b for a, b in zip(after, before, strict=True)] == [BROADCASTS] * n, (before, after)
        rates.append(BROADCASTS / dt)
    return median(rates)


def child_monarch(n: str) -> None:
    from monarch.actor import Actor, endpoint, this_host

    class Echo(Actor):
        def __init__(self) -> None:
            self.count = 0

        @endpoint
        def ping(self) -> int:
            return 1

        @endpoint
        def bump(self) -> None:
            self.count += 1

        @endpoint
        def total(self) -> int:
            return self.count

    procs = this_host().spawn_procs(per_host={"gpus": int(n)})
    actors = procs.spawn("echo", Echo)
    one = actors.slice(gpus=0)
    emit("monarch_call", median(timeit(lambda: actors.ping.call().get(), 200, REPS, BUDGET_S)))
    emit("monarch_call_one", median(timeit(lambda: one.ping.call_one().get(), 200, REPS, BUDGET_S)))
    emit("monarch_broadcast_rate", _rate(actors.bump.broadcast, lambda: list(actors.total.call().get().values()),
                                         int(n)), unit="msg/s")
    procs.stop().get()


def child_ray(n: str) -> None:
    import ray

    ray.init(num_cpus=int(n), include_dashboard=False, logging_level="ERROR")

    @ray.remote
    class Echo:
        def __init__(self) -> None:
            self.count = 0

        def ping(self) -> int:
            return 1

        def bump(self) -> None:
            self.count += 1

        def total(self) -> int:
            return self.count

    actors = [Echo.remote() for _ in range(int(n))]  # type: ignore[attr-defined]

    def bump_all() -> None:
        for a in actors:
            a.bump.remote()  # the ObjectRef is dropped: fire and forget

    emit("ray_call", median(timeit(lambda: ray.get([a.ping.remote() for a in actors]), 200, REPS, BUDGET_S)))
    emit("ray_call_one", median(timeit(lambda: ray.get(actors[0].ping.remote()), 200, REPS, BUDGET_S)))
    emit("ray_broadcast_rate", _rate(bump_all, lambda: ray.get([a.total.remote() for a in actors]), int(n)),
         unit="msg/s")
    ray.shutdown()
