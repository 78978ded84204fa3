"""Tensor-engine and transfer benchmarks (issue: handles and the tensor engine), each against a
baseline measured in the same run.

  dispatch   controller cost per small op under mesh.activate(), 1,000 ops then one fetch
             vs   the same ops run locally on CPU tensors            (goal: <= 50 us per op)
  pull       64 MiB tensor pulled from one local rank
             vs   dst.copy_(src) of 64 MiB in one process            (goal: >= 50 % of memcpy)
  push       64 MiB tensor pushed to 4 local ranks, per rank        (goal: >= 50 % of memcpy)
  to_mesh    64 MiB tensor moved from ranks 0-1 to ranks 2-3 (t.to_mesh(view), then sync)
             vs   dist.send / dist.recv of 64 MiB between the same ranks, gloo, into a reused
                  buffer, and into a fresh tensor each time as to_mesh must (no goal)

Usage: python bench/bench_tensors.py [--only dispatch]
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import emit, fmt_time, median, run_child, table, timeit

MiB = 1 << 20
BIG = 64 * MiB


def child_memcpy() -> None:
    import torch

    src = torch.ones(BIG // 4)
    dst = torch.empty_like(src)
    emit("memcpy", median(timeit(lambda: dst.copy_(src), 5, 40)))


def raw_sendrecv(nbytes: int, iters: int, fresh: bool) -> float:
    """On each of 4 ranks: ranks 0-1 send to ranks 2-3 with torch.distributed (gloo), as
    to_mesh does; seconds per transfer. `fresh`: receive into a new tensor each time (its
    pages are faulted in as it fills), else into one reused buffer."""
    import torch
    import torch.distributed as dist

    if not dist.is_initialized():
        dist.init_process_group("gloo")
    t = torch.ones(nbytes // 4)
    r = dist.get_rank()

    def once() -> None:
        if r < 2:
            dist.send(t, r + 2)
        else:
            dist.recv(torch.empty(nbytes // 4) if fresh else t, r - 2)

    once()
    dist.barrier()
    t0 = time.perf_counter()
    for _ in range(iters):
        once()
    dist.barrier()
    return (time.perf_counter() - t0) / iters


def child_engine(only: str = "") -> None:
    import torch

    import viceroy as vr

    x = torch.ones(16)

    def local_ops() -> None:  # 1,000 ops: 500 multiplies, 500 adds
        y = x
        for _ in range(500):
            y = y * 1.0001 + 1
        y.sum()

    emit("local_1000_ops", median(timeit(local_ops, 2, 10)))
    table_l = torch.ones(4000, 4)
    emit("local_1000_getitem", median(timeit(lambda: [table_l[i] for i in range(1000)], 2, 10)))
    with vr.Mesh.local(gpus=4, echo=False) as mesh:
        with mesh.activate():
            a = torch.ones(16)
        a.fetch()

        times, cpu = [], []
        for _ in range(6):
            t0, c0 = time.perf_counter(), time.thread_time()
            with mesh.activate():
                y = a
                for _ in range(500):
                    y = y * 1.0001 + 1
            # The controller's side: dispatch only. CPU time of this thread is the cost; wall
            # time also holds the ranks running the ops on the same two cores meanwhile.
            cpu.append(time.thread_time() - c0)
            times.append(time.perf_counter() - t0)
            y.sum().fetch(gpus=0)
        emit("mesh_1000_ops_dispatch", median(times[1:]))
        emit("mesh_1000_ops_dispatch_cpu", median(cpu[1:]))

        with mesh.activate():
            rows_t = torch.ones(4000, 4)
        rows_t.fetch(gpus=0)
        cpu = []
        for k in range(4):  # new indices each round: a row is x[i] for an i not seen before
            c0 = time.thread_time()
            with mesh.activate():
                picked = [rows_t[i] for i in range(k * 1000, (k + 1) * 1000)]
            cpu.append(time.thread_time() - c0)
            picked[-1].fetch(gpus=0)
            del picked
        emit("mesh_1000_getitem_cpu", median(cpu[1:]))
        if only == "dispatch":
            return

        big = torch.ones(BIG // 4)
        mesh.slice(gpus=0).push(big=big)
        one = mesh.slice(gpus=0)
        emit("pull_64MiB", median(timeit(lambda: one.pull("big"), 2, 10)))
        emit("push_64MiB_4ranks", median(timeit(lambda: mesh.push(big=big), 2, 10)))

        first, second = mesh.slice(gpus=slice(0, 2)), mesh.slice(gpus=slice(2, 4))
        with first.activate():
            m = torch.ones(BIG // 4)

        def move() -> None:
            m.to_mesh(second)._engine.sync()

        ours, raw, fresh = [], [], []
        for _ in range(5):  # interleaved rounds: a noisy neighbour hits every side
            ours.append(median(timeit(move, 1, 3)))
            raw.append(mesh.run(raw_sendrecv, BIG, 3, False).item(gpus=2))
            fresh.append(mesh.run(raw_sendrecv, BIG, 3, True).item(gpus=2))
        emit("move_64MiB", median(ours))
        emit("raw_sendrecv_64MiB", median(raw))
        emit("raw_sendrecv_fresh_64MiB", median(fresh))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", choices=["dispatch"], help="run only this part (dispatch: no 64 MiB transfers)")
    only = parser.parse_args().only or ""
    m = {} if only else run_child("bench_tensors", "child_memcpy")
    m.update(run_child("bench_tensors", "child_engine", only))
    v = {k: r["value"] for k, r in m.items()}
    gbs = lambda s: f"{BIG / s / 1e9:.2f} GB/s"  # noqa: E731
    rows = [
        ("per op, 1,000 ops pipelined (controller CPU)", fmt_time(v["mesh_1000_ops_dispatch_cpu"] / 1000),
         f"same ops locally: {fmt_time(v['local_1000_ops'] / 1000)}", f"{v['mesh_1000_ops_dispatch_cpu'] / v['local_1000_ops']:.1f}x",
         "<= 50 us per op"),
        ("per op, 1,000 ops pipelined (controller wall)", fmt_time(v["mesh_1000_ops_dispatch"] / 1000),
         f"same ops locally: {fmt_time(v['local_1000_ops'] / 1000)}", f"{v['mesh_1000_ops_dispatch'] / v['local_1000_ops']:.1f}x",
         ""),
        ("x[i] for 1,000 new i (controller CPU per op)", fmt_time(v["mesh_1000_getitem_cpu"] / 1000),
         f"locally: {fmt_time(v['local_1000_getitem'] / 1000)}", f"{v['mesh_1000_getitem_cpu'] / v['local_1000_getitem']:.1f}x",
         "<= 50 us per op"),
    ]
    if not only:
        rows += [
            ("pull 64 MiB from one rank", gbs(v["pull_64MiB"]), f"memcpy: {gbs(v['memcpy'])}",
             f"{v['memcpy'] / v['pull_64MiB'] * 100:.0f} %", ">= 50 %"),
            ("push 64 MiB to 4 ranks, per rank", gbs(v["push_64MiB_4ranks"] / 4), f"memcpy: {gbs(v['memcpy'])}",
             f"{v['memcpy'] / (v['push_64MiB_4ranks'] / 4) * 100:.0f} %", ">= 50 %"),
            ("to_mesh 64 MiB, ranks 0-1 to 2-3", gbs(v["move_64MiB"]), f"dist.send/recv: {gbs(v['raw_sendrecv_64MiB'])}",
             f"{v['raw_sendrecv_64MiB'] / v['move_64MiB'] * 100:.0f} %", ""),
            ("", "", f"into a fresh tensor: {gbs(v['raw_sendrecv_fresh_64MiB'])}",
             f"{v['raw_sendrecv_fresh_64MiB'] / v['move_64MiB'] * 100:.0f} %", ""),
        ]
    print(f"\nbench_tensors: medians; {os.cpu_count()} CPUs; load {os.getloadavg()[0]:.2f}\n")
    print(table(rows, ("measurement", "viceroy", "baseline (same run)", "ratio", "goal")))


if __name__ == "__main__":
    main()
