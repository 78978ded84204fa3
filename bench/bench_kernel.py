"""Kernel benchmarks (issue: the Viceroy kernel), through real kernels driven by jupyter_client:
execute_request until the kernel is idle again.

  a=1 (Viceroy kernel)                     vs   a=1 in a stock ipykernel
  a 40-line cell (Viceroy kernel)          vs   the same cell in a stock ipykernel
  %%mesh a=1 on 4 ranks (Viceroy kernel)   vs   a=1 in the same kernel   (overhead, goal <= 2 ms)
                                            vs   %px a=1 on 4 ipyparallel engines in a stock
                                                 ipykernel (goal: <= 1/5 of it), when ipyparallel
                                                 is installed (pip install ipyparallel)

The Viceroy cells run in turn, rep after rep, so load falls on both alike. %px and the
stock kernel's cells run in blocks of their own between theirs, in --rounds rounds: ipyparallel's
controller and engines keep working after each %px (storing results), and run cell by cell that
work would land on the Viceroy cells (a third kernel woken in every turn would leave the others'
caches colder too); rounds keep a slow drift of the machine's speed (this VM's moves by 2x
within an hour) from landing on one side only.

Usage: python bench/bench_kernel.py [--reps 300] [--rounds 3]
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from typing import Any

import psutil

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import CELL_40, fmt_time, table


def _execute(kc, code: str, timeout: float = 60) -> float:
    t0 = time.perf_counter()
    msg_id = kc.execute(code)
    while True:
        msg = kc.get_iopub_msg(timeout=timeout)
        if (
            msg["parent_header"].get("msg_id") == msg_id
            and msg["msg_type"] == "status"
            and msg["content"]["execution_state"] == "idle"
        ):
            elapsed = time.perf_counter() - t0
            break
        if msg["msg_type"] == "error" and msg["parent_header"].get("msg_id") == msg_id:
            raise RuntimeError("\n".join(msg["content"]["traceback"]))
    reply = kc.get_shell_msg(timeout=timeout)
    if reply["content"]["status"] != "ok":
        raise RuntimeError(f"{code!r} failed: {reply['content']}")
    return elapsed


def _start(kernel_name: str):
    from jupyter_client.manager import start_new_kernel

    return start_new_kernel(kernel_name=kernel_name, startup_timeout=120)


@contextlib.contextmanager
def _viceroy_kernelspec() -> Iterator[None]:
    """The "viceroy" kernelspec, for this Python, in a temporary JUPYTER_PATH."""
    from viceroy.kernel.kernelspec import write_kernel_spec

    with tempfile.TemporaryDirectory() as tmp:
        write_kernel_spec(os.path.join(tmp, "kernels", "viceroy"), sys.executable)
        os.environ["JUPYTER_PATH"] = tmp
        yield


@contextlib.contextmanager
def viceroy_kernel(ranks: int) -> Iterator[tuple[Any, Any]]:
    """A Viceroy kernel (its kernelspec in a temporary JUPYTER_PATH) with a local mesh of `ranks`
    up and no preload: (manager, client). The mesh and the kernel are shut down after."""
    with _viceroy_kernelspec():
        km, kc = _start("viceroy")
        try:
            _execute(kc, f"%mesh up gpus={ranks} --preload none")
            yield km, kc
            _execute(kc, "%mesh down")
        finally:
            kc.stop_channels()
            km.shutdown_kernel(now=False)


def _in_turn(runs: list[tuple[object, str]], reps: int) -> list[list[float]]:
    """Times of each (client, code), run in turn rep after rep, so that load on the machine
    falls on every measurement alike."""
    times: list[list[float]] = [[] for _ in runs]
    for _ in range(reps):
        for i, (kc, code) in enumerate(runs):
            times[i].append(_execute(kc, code))
    return times


def _cpu_s(pids: list[int]) -> float:
    """CPU time the threads of `pids` have run, in seconds (the scheduler's count, in ns)."""
    total = 0
    for pid in pids:
        try:
            tasks = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        for tid in tasks:
            try:
                with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                    total += int(f.read().split()[0])
            except (OSError, ValueError, IndexError):
                continue
    return total / 1e9


def _cpu_per_cell(km, kc, code: str, reps: int) -> float:
    """CPU seconds per cell of `code`, of the kernel, every process under it (ranks, agents,
    an ipyparallel cluster) and this client, over a block of `reps` cells."""
    kernel = psutil.Process(km.provisioner.process.pid)
    pids = [kernel.pid, *(p.pid for p in kernel.children(recursive=True)), os.getpid()]
    before = _cpu_s(pids)
    for _ in range(reps):
        _execute(kc, code)
    return (_cpu_s(pids) - before) / reps


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=300, help="executions of each Viceroy cell")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    have_ipp = importlib.util.find_spec("ipyparallel") is not None
    kernels: list[tuple[object, object, str]] = []
    ours: list[list[float]] = [[], [], []]  # a=1, %%mesh a=1, CELL_40
    stock_a1: list[float] = []
    stock_40: list[float] = []
    px: list[float] = []
    per_round: list[float] = []  # each round's %%mesh median over its %px median
    cpu: dict[str, float] = {}
    with _viceroy_kernelspec():
        try:
            km, kc = _start("viceroy")
            kernels.append((km, kc, "%mesh down"))
            _execute(kc, "%mesh up gpus=4 --preload none")
            from jupyter_client.kernelspec import NATIVE_KERNEL_NAME

            skm, skc = _start(NATIVE_KERNEL_NAME)
            kernels.append((skm, skc, "pass"))
            viceroy_runs = [(kc, "a=1"), (kc, "%%mesh\na=1"), (kc, CELL_40)]
            if have_ipp:
                pkm, pkc = _start(NATIVE_KERNEL_NAME)
                kernels.append((pkm, pkc, "cluster.stop_cluster_sync()"))
                _execute(pkc, "import ipyparallel as ipp\ncluster = ipp.Cluster(n=4, log_level=40)\n"
                              "rc = cluster.start_and_connect_sync()\nrc.wait_for_engines(4, timeout=120)\n"
                              "rc[:].activate()", timeout=180)
                _in_turn([(pkc, "%px a=1")], 30)  # warm-up
            _in_turn(viceroy_runs, 30)
            for _ in range(args.rounds):
                plain_round, mesh_round, cell_round = _in_turn(viceroy_runs, args.reps // args.rounds)
                ours[0] += plain_round
                ours[1] += mesh_round
                ours[2] += cell_round
                stock_a1_round, stock_40_round = _in_turn([(skc, "a=1"), (skc, CELL_40)], args.reps // args.rounds)
                stock_a1 += stock_a1_round
                stock_40 += stock_40_round
                if have_ipp:
                    px_round = _in_turn([(pkc, "%px a=1")], max(20, args.reps // (3 * args.rounds)))[0]
                    px += px_round
                    per_round.append(statistics.median(mesh_round) / statistics.median(px_round))
            # After the timed rounds: how much CPU each cell takes, all processes counted. A
            # cell that keeps the CPUs busy slows down with the machine; one that mostly waits
            # (timers, polls) does not, which is why the ratio to %px moves with this VM's speed.
            cpu = {"a=1": _cpu_per_cell(km, kc, "a=1", 100), "%%mesh a=1": _cpu_per_cell(km, kc, "%%mesh\na=1", 100)}
            if have_ipp:
                cpu["%px a=1"] = _cpu_per_cell(pkm, pkc, "%px a=1", 30)
        finally:
            for km, kc, stop in reversed(kernels):
                try:
                    _execute(kc, stop, timeout=60)
                finally:
                    kc.stop_channels()
                    km.shutdown_kernel(now=False)
    plain, mesh, stock = statistics.median(ours[0]), statistics.median(ours[1]), statistics.median(stock_a1)
    cell, stock_cell = statistics.median(ours[2]), statistics.median(stock_40)
    rows = [
        ("a=1 (Viceroy kernel, controller)", fmt_time(plain), f"a=1, stock ipykernel: {fmt_time(stock)}",
         f"{plain / stock:.2f}x", ""),
        ("a 40-line cell (Viceroy kernel, controller)", fmt_time(cell), f"stock ipykernel: {fmt_time(stock_cell)}",
         f"{cell / stock_cell:.2f}x", ""),
        ("%%mesh a=1, 4 ranks", fmt_time(mesh), f"a=1 in the same kernel: {fmt_time(plain)}",
         f"+{fmt_time(mesh - plain)}", "overhead <= 2 ms"),
    ]
    if have_ipp:
        p = statistics.median(px)
        rows.append(("%%mesh a=1 vs %px a=1 (ipyparallel, 4 engines)", fmt_time(mesh), f"%px a=1: {fmt_time(p)}",
                     f"{mesh / p:.2f}x", "<= 0.2x"))
    else:
        rows.append(("%px a=1, 4 ipyparallel engines", "not installed", "-", "-", "pip install ipyparallel"))
    print(f"\nbench_kernel: medians of {len(ours[0])} executions of each Viceroy cell and {len(px)} of %px, "
          f"in {args.rounds} rounds; {os.cpu_count()} CPUs; load {os.getloadavg()[0]:.2f}\n")
    print(table(rows, ("measurement", "viceroy", "baseline (same run)", "ratio", "goal")))
    if per_round:
        print("\n%%mesh a=1 over %px a=1, round by round (this VM's speed drifts between rounds): "
              + ", ".join(f"{r:.2f}x" for r in per_round))
    walls = {"a=1": plain, "%%mesh a=1": mesh, "%px a=1": statistics.median(px) if px else 0.0}
    print("\nCPU per cell, the kernel and all under it plus this client (wall: median above): "
          + "; ".join(f"{k} {fmt_time(v)} in {fmt_time(walls[k])}" for k, v in cpu.items()))


if __name__ == "__main__":
    main()
