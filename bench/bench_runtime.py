"""Runtime benchmarks (issue: runtime core), each against a baseline measured in the same run.

  call latency   mesh.run("a=1") on N local ranks  vs  raw pyzmq ROUTER/DEALER broadcast to N
                 processes + gather of N replies (the floor any Python mesh pays), and vs the
                 same over plain Unix stream sockets (the floor of our local links)
  a new cell     mesh.run of a 40-line cell's text the mesh has not seen (compiled on the
                 controller, for its syntax and for the ranks)  vs  the same text run again,
                 and vs new texts with every rank compiling them (runtime/compiled.py off)
  startup        Mesh.local(gpus=4) until every rank answers + `import torch` on every rank
                 vs  one `python -c "import torch"`
  shutdown       mesh.shutdown() (absolute; the goal is <= 1 s)

Usage:  python bench/bench_runtime.py [--ns 4,8,16] [--rounds 3] [--gap-ms 3 --skip-startup]
Each measurement runs in its own child process; rounds interleave ours and the baseline so a
noisy neighbour hits both. Medians over rounds are reported.
"""

from __future__ import annotations

import argparse
import itertools
import os
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import CELL_40, emit, fmt_time, median, run_child, table, timeit

REPS = 1500
BUDGET_S = 4.0


# --- children ---------------------------------------------------------------------------------

def _zmq_worker(addr: str, idx: int) -> None:
    import zmq

    ctx = zmq.Context()
    s = ctx.socket(zmq.DEALER)
    s.setsockopt(zmq.IDENTITY, b"w%d" % idx)
    s.connect(addr)
    s.send(b"ready")
    while True:
        msg = s.recv_multipart()
        if msg[0] == b"q":
            break
        s.send_multipart(msg)


def child_zmq(n: str, gap_ms: str = "0") -> None:
    import multiprocessing as mp

    import zmq

    n_ = int(n)
    ctx = zmq.Context()
    r = ctx.socket(zmq.ROUTER)
    port = r.bind_to_random_port("tcp://127.0.0.1")
    procs = [mp.get_context("fork").Process(target=_zmq_worker, args=(f"tcp://127.0.0.1:{port}", i)) for i in range(n_)]
    for p in procs:
        p.start()
    ids = sorted(r.recv_multipart()[0] for _ in range(n_))

    def bcast() -> None:
        for i in ids:
            r.send_multipart([i, b"e", b"x"])
        for _ in ids:
            r.recv_multipart()

    emit("zmq_bcast_gather", median(timeit(bcast, 200, REPS, BUDGET_S, float(gap_ms) / 1000)))
    for i in ids:
        r.send_multipart([i, b"q"])
    for p in procs:
        p.join()


def _unix_worker(path: str) -> None:
    import socket

    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(path)
    while True:
        msg = s.recv(65536)
        if not msg or msg == b"q":
            break
        s.sendall(msg)


def child_unix(n: str, gap_ms: str = "0") -> None:
    import multiprocessing as mp
    import select
    import socket
    import tempfile

    n_ = int(n)
    path = os.path.join(tempfile.mkdtemp(), "s")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(n_)
    procs = [mp.get_context("fork").Process(target=_unix_worker, args=(path,)) for _ in range(n_)]
    for p in procs:
        p.start()
    conns = [listener.accept()[0] for _ in range(n_)]
    poller = select.poll()
    for c in conns:
        poller.register(c, select.POLLIN)

    def bcast() -> None:
        for c in conns:
            c.sendall(b"x")
        left = n_
        while left:
            for fd, _ in poller.poll():
                left -= len(os.read(fd, 4096))

    emit("unix_bcast_gather", median(timeit(bcast, 200, REPS, BUDGET_S, float(gap_ms) / 1000)))
    for c in conns:
        c.sendall(b"q")
    for p in procs:
        p.join()
    os.unlink(path)
    os.rmdir(os.path.dirname(path))


def child_viceroy_calls(n: str, gap_ms: str = "0") -> None:
    import viceroy as vr

    gap = float(gap_ms) / 1000
    with vr.Mesh.local(gpus=int(n), preload=[], echo=False) as mesh:
        emit("viceroy_run_a1", median(timeit(lambda: mesh.run("a=1"), 200, REPS, BUDGET_S, gap)))
        f = lambda: 1  # noqa: E731
        emit("viceroy_run_fn", median(timeit(lambda: mesh.run(f), 200, REPS, BUDGET_S, gap)))
        # A cell's first run (a text new to the mesh: a notebook's cells run once per edit)
        # against the same text run again, which every rank keeps compiled.
        texts = (f"{CELL_40}z = {i}\n" for i in itertools.count())
        emit("viceroy_run_new40", median(timeit(lambda: mesh.run(next(texts)), 20, 300, BUDGET_S, gap)))
        emit("viceroy_run_again40", median(timeit(lambda: mesh.run(CELL_40), 20, 300, BUDGET_S, gap)))
        # The same, the controller's compiled code not sent along: every rank compiles the text.
        mesh._controller.shipments.code_for = lambda source: None
        emit("viceroy_run_new40_unshipped", median(timeit(lambda: mesh.run(next(texts)), 20, 300, BUDGET_S, gap)))


def child_viceroy_startup() -> None:
    import viceroy as vr

    t0 = time.perf_counter()
    mesh = vr.Mesh.local(gpus=4, echo=False)  # default preload: torch
    t_up = time.perf_counter() - t0
    mesh.run("import torch\nt = torch.ones(2)")
    emit("viceroy_startup_torch", time.perf_counter() - t0, up=t_up)
    t0 = time.perf_counter()
    mesh.shutdown()
    emit("viceroy_shutdown", time.perf_counter() - t0)


def child_torch_import() -> None:
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-c", "import torch"], check=True)
    emit("python_import_torch", time.perf_counter() - t0)


# --- parent -----------------------------------------------------------------------------------

def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ns", default="4,8,16")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--skip-startup", action="store_true")
    ap.add_argument("--gap-ms", type=float, default=0.0,
                    help="keep the caller busy this long between calls, untimed (a kernel's cadence)")
    args = ap.parse_args()
    ns = [int(x) for x in args.ns.split(",")]
    acc: dict[str, list[float]] = {}

    def add(res: dict, suffix: str = "") -> None:
        for k, rec in res.items():
            acc.setdefault(k + suffix, []).append(rec["value"])

    for rnd in range(args.rounds):
        for n in ns:
            add(run_child("bench_runtime", "child_zmq", str(n), str(args.gap_ms)), f"@{n}")
            add(run_child("bench_runtime", "child_unix", str(n), str(args.gap_ms)), f"@{n}")
            add(run_child("bench_runtime", "child_viceroy_calls", str(n), str(args.gap_ms)), f"@{n}")
        if not args.skip_startup:
            add(run_child("bench_runtime", "child_torch_import"))
            add(run_child("bench_runtime", "child_viceroy_startup"))
        print(f"round {rnd + 1}/{args.rounds} done", file=sys.stderr)

    m = {k: statistics.median(v) for k, v in acc.items()}
    rows = []
    for n in ns:
        base = m[f"zmq_bcast_gather@{n}"]
        rows.append((f"mesh.run('a=1'), {n} ranks", fmt_time(m[f"viceroy_run_a1@{n}"]),
                     f"raw zmq bcast+gather {n}: {fmt_time(base)}", f"{m[f'viceroy_run_a1@{n}'] / base:.2f}x",
                     "<= 3x" if n == 4 else ""))
        rows.append((f"mesh.run(fn), {n} ranks", fmt_time(m[f"viceroy_run_fn@{n}"]),
                     f"raw zmq bcast+gather {n}: {fmt_time(base)}", f"{m[f'viceroy_run_fn@{n}'] / base:.2f}x", ""))
        unix = m[f"unix_bcast_gather@{n}"]
        rows.append((f"mesh.run('a=1'), {n} ranks", fmt_time(m[f"viceroy_run_a1@{n}"]),
                     f"raw unix bcast+gather {n}: {fmt_time(unix)}", f"{m[f'viceroy_run_a1@{n}'] / unix:.2f}x", ""))
        again = m[f"viceroy_run_again40@{n}"]
        new, unshipped = m[f"viceroy_run_new40@{n}"], m[f"viceroy_run_new40_unshipped@{n}"]
        rows.append((f"mesh.run(a new 40-line cell), {n} ranks", fmt_time(new),
                     f"the same cell again: {fmt_time(again)}", f"{new / again:.2f}x", ""))
        rows.append((f"mesh.run(a new 40-line cell), {n} ranks", fmt_time(new),
                     f"each rank compiling it: {fmt_time(unshipped)}", f"{new / unshipped:.2f}x", ""))
    if not args.skip_startup:
        base = m["python_import_torch"]
        rows.append(("Mesh.local(gpus=4) + import torch on every rank", fmt_time(m["viceroy_startup_torch"]),
                     f"python -c 'import torch': {fmt_time(base)}", f"{m['viceroy_startup_torch'] / base:.2f}x", "<= 1.3x"))
        rows.append(("mesh.shutdown(), 4 ranks", fmt_time(m["viceroy_shutdown"]), "-", "-", "<= 1 s"))
    gap = f"; {args.gap_ms:g} ms of busy caller between calls" if args.gap_ms else ""
    print(f"\nbench_runtime: {args.rounds} rounds, medians{gap}; {os.cpu_count()} CPUs; load {os.getloadavg()[0]:.2f}\n")
    print(table(rows, ("measurement", "viceroy", "baseline (same run)", "ratio", "goal")))


if __name__ == "__main__":
    main()
