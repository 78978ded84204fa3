"""Where a `%%mesh a=1` cell's time goes, stage by stage, in a real Viceroy kernel driven by
jupyter_client (a diagnostic beside bench_kernel.py, which gives the goals' ratios).

Inside the kernel, the cell runner's `run` and `_submit` and the controller's `_handle` (each
message the IO thread reads) are wrapped to note the time (CLOCK_MONOTONIC, shared by the
processes), and the client notes when it sent the request and when it saw the kernel idle:

  client -> run             request sent until the %%mesh magic starts running the cell
  submit                    sending the call to the ranks
  submit -> first answer    until the controller's IO thread reads the first rank's answer
  first -> last answer      the other ranks' answers
  last answer -> run end    the cell's value built, the kernel's main thread woken and done
  run end -> idle           until the client sees the kernel idle

Usage: python bench/kernel_stages.py [--cells 400] [--ranks 4] [--batch on|off]
  --batch off   ranks wait for calls as SCHED_OTHER, as before session 9 (see RankLink.recv)

It also prints, per cell, the CPU time and the context switches (voluntary: the thread waited;
involuntary: it was preempted) of every thread of the kernel and of each rank that did any,
and the client's CPU time (Linux: read from /proc).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_kernel import _execute, viceroy_kernel

_INSTRUMENT = r'''
import time as _t
from viceroy.extension import cells as _cells
from viceroy.runtime import controller as _ctl
_stages = []
_orig = (_cells.CellRunner.run, _cells.CellRunner._submit, _ctl.Controller._handle)

def _run(self, *a, **k):
    _stages.append({"run0": _t.monotonic(), "answers": []})
    try:
        return _orig[0](self, *a, **k)
    finally:
        _stages[-1]["run1"] = _t.monotonic()

def _submit(self, *a, **k):
    _stages[-1]["sub0"] = _t.monotonic()
    try:
        return _orig[1](self, *a, **k)
    finally:
        _stages[-1]["sub1"] = _t.monotonic()

def _handle(self, frames, link=None):
    if _stages and "run1" not in _stages[-1]:
        _stages[-1]["answers"].append(_t.monotonic())
    return _orig[2](self, frames, link)

_cells.CellRunner.run, _cells.CellRunner._submit, _ctl.Controller._handle = _run, _submit, _handle
'''
_UNDO = "_cells.CellRunner.run, _cells.CellRunner._submit, _ctl.Controller._handle = _orig"
_NO_BATCH = "%%mesh\nimport contextlib, viceroy.runtime.links\nviceroy.runtime.links._waiting_in_batch = contextlib.nullcontext"


def _printed(kc, code: str) -> str:
    msg_id, out = kc.execute(code), []
    while True:
        msg = kc.get_iopub_msg(timeout=60)
        if msg["parent_header"].get("msg_id") != msg_id:
            continue
        if msg["msg_type"] == "stream":
            out.append(msg["content"]["text"])
        elif msg["msg_type"] == "error":
            raise RuntimeError("\n".join(msg["content"]["traceback"]))
        elif msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
            kc.get_shell_msg(timeout=60)
            return "".join(out)


def _threads(pid: int) -> dict[int, tuple[float, int, int]]:
    """tid -> (CPU seconds, voluntary and involuntary context switches) of `pid`'s threads."""
    out = {}
    tick = os.sysconf("SC_CLK_TCK")
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            with open(f"/proc/{pid}/task/{tid}/status") as f:
                status = dict(line.split(":", 1) for line in f if ":" in line)
        except OSError:  # the thread ended meanwhile
            continue
        cpu = (int(fields[11]) + int(fields[12])) / tick
        out[int(tid)] = (cpu, int(status["voluntary_ctxt_switches"]), int(status["nonvoluntary_ctxt_switches"]))
    return out


def _comm(pid: int, tid: int) -> str:
    """A thread's name as the system knows it (ZeroMQ names its IO threads)."""
    try:
        with open(f"/proc/{pid}/task/{tid}/comm") as f:
            return f.read().strip()
    except OSError:
        return str(tid)


def _client_cpu() -> float:
    use = resource.getrusage(resource.RUSAGE_SELF)
    return use.ru_utime + use.ru_stime


def _print_threads(before: dict, after: dict, names: dict[int, str], cells: int, client: float) -> None:
    print(f"\n  per cell: CPU ms, context switches voluntary / involuntary\n  {'client (this process)':32s} {1e3 * client / cells:6.3f}")
    for (pid, who), threads in after.items():
        for tid, (cpu, vol, invol) in sorted(threads.items()):
            cpu0, vol0, invol0 = before[(pid, who)].get(tid, (0.0, 0, 0))
            if cpu - cpu0 < 0.01 * cells / 1000 and vol - vol0 < cells / 10:
                continue
            name = f"{who}: {names.get(tid) or ('main' if tid == pid else _comm(pid, tid))}"
            print(f"  {name:32s} {1e3 * (cpu - cpu0) / cells:6.3f}  {(vol - vol0) / cells:5.2f} / {(invol - invol0) / cells:4.2f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cells", type=int, default=400)
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--batch", choices=("on", "off"), default="on")
    args = ap.parse_args()
    with viceroy_kernel(args.ranks) as (km, kc):
        if args.batch == "off":
            _execute(kc, _NO_BATCH)
        for _ in range(30):
            _execute(kc, "%%mesh\na=1")
        _execute(kc, _INSTRUMENT)
        kernel_pid = km.provisioner.process.pid
        names = {int(k): v for k, v in json.loads(_printed(
            kc, "import json, threading\nprint(json.dumps({t.native_id: t.name for t in threading.enumerate()}))")).items()}
        ranks = json.loads(_printed(kc, "import json\nprint(json.dumps(mesh.pids()))"))
        procs = [(kernel_pid, "kernel"), *((int(pid), f"rank {r}") for r, pid in ranks.items())]
        before, client0 = {p: _threads(p[0]) for p in procs}, _client_cpu()
        sent: list[tuple[float, float]] = []
        for _ in range(args.cells):
            t0 = time.monotonic()
            _execute(kc, "%%mesh\na=1")
            sent.append((t0, time.monotonic()))
        after, client = {p: _threads(p[0]) for p in procs}, _client_cpu() - client0
        _execute(kc, _UNDO)
        stages = json.loads(_printed(kc, f"import json\nprint(json.dumps(_stages[-{args.cells}:]))"))
    rows: dict[str, list[float]] = {k: [] for k in (
        "client -> run", "submit", "submit -> first answer", "first -> last answer",
        "last answer -> run end", "run end -> idle", "total")}
    for (t0, t1), s in zip(sent, stages, strict=True):
        first, last = s["answers"][0], s["answers"][-1]
        for name, value in (("client -> run", s["run0"] - t0), ("submit", s["sub1"] - s["sub0"]),
                            ("submit -> first answer", first - s["sub1"]), ("first -> last answer", last - first),
                            ("last answer -> run end", s["run1"] - last), ("run end -> idle", t1 - s["run1"]),
                            ("total", t1 - t0)):
            rows[name].append(value)
    print(f"\nkernel_stages: medians of {args.cells} `%%mesh a=1` cells on {args.ranks} ranks, "
          f"ranks' wait in SCHED_BATCH {args.batch}; {os.cpu_count()} CPUs; load {os.getloadavg()[0]:.2f}\n")
    for name, values in rows.items():
        print(f"  {name:24s} {1e3 * statistics.median(values):6.3f} ms")
    _print_threads(before, after, names, args.cells, client)


if __name__ == "__main__":
    main()
