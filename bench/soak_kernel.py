"""Soak a real Viceroy kernel: phases of N cells of one kind, then the kernel's, ranks' and
agent's RSS/fds/threads and the session's and controller's bookkeeping (nonzero counts only).

    .venv/bin/python bench/soak_kernel.py --cells 1000 plain print fail status api tensor spawn updown

Phases: see PHASES, plus interrupt (N/10 cells), restart (N/30 kills + restart --failed),
updown (N/30 down/up cycles); none named: all of them. Compare a phase's second run with its
first: the first warms up.
"""

import argparse
import glob
import json
import os
import pathlib
import sys
import tempfile
import time

HERE = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE / "tests" / "kernel"))
import psutil  # noqa: E402  (after the path is set up)
from kernel_harness import Kernel  # noqa: E402

from viceroy.kernel.kernelspec import write_kernel_spec  # noqa: E402

N = 300  # cells per phase (--cells; the environment's N, as before, sets the default)
PROBE = r"""
import threading, gc, sys, os, json
from viceroy.extension import current_session
s = current_session(get_ipython()); m = s.mesh; c = m._controller if m else None
st = s.state
d = dict(threads=threading.active_count(),
 hidden=len(s._hidden_calls), listeners=len(s._listeners), inbox=len(s._cells._inbox._events), bell=s._cells._inbox._bell.qsize(),
 echo=len(s._echo._calls), st_calls=len(st._calls), st_inflight=sum(map(len, st._in_flight.values())), st_tb=len(st._tracebacks), st_partial=len(st._partial),
 user_ns=len(get_ipython().user_ns), out_cache=len(get_ipython().displayhook.shell.user_ns.get('Out', {})),
 comms=len(getattr(get_ipython().kernel, 'comm_manager', None).comms) if getattr(get_ipython().kernel, 'comm_manager', None) else -1,
 gc=len(gc.get_objects()))
if c:
  d.update(calls=len(c._calls), queries=len(c._queries), stuck=sum(map(len,c._stuck.values())), hostsets=len(c._hosts_of_ranks), tasks=len(c._tasks),
    ctl_listeners=len(c._listeners), logs=sum(map(len, c.logs._tails.values())), logs_partial=len(c.logs._partial), engines=len(c.engines),
    pids=m.pids(), agents=[a.proc.pid for a in c.agent_processes()], returns=str(getattr(c._returns,'__dict__',''))[:200])
print("PROBE" + json.dumps(d))
"""


def pinfo(pid):
    try:
        p = psutil.Process(pid)
        return dict(
            rss=p.memory_info().rss >> 10,
            fds=len(os.listdir(f"/proc/{pid}/fd")),
            thr=p.num_threads(),
        )
    except Exception as e:
        return str(e)


def probe(k, tag):
    ex = k.execute(PROBE)
    txt = ex.stream()
    line = [ln for ln in txt.splitlines() if ln.startswith("PROBE")]
    if not line:
        print(tag, "PROBE FAILED", ex.reply, ex.outputs)
        return {}
    d = json.loads(line[0][5:])
    d["kernel"] = pinfo(k.pid)
    d["ranks"] = {r: pinfo(p) for r, p in d.pop("pids", {}).items()}
    d["agentp"] = [pinfo(p) for p in d.pop("agents", [])]
    d["shm"] = len(glob.glob("/dev/shm/*"))
    d["tmp"] = len(os.listdir("/tmp"))
    d["children"] = len(psutil.Process(k.pid).children(recursive=True))
    kr = d.pop("kernel")
    rk = d.pop("ranks")
    ag = d.pop("agentp")
    def fmt(p):
        return f"{p['rss'] // 1024}M/{p['fds']}fd/{p['thr']}t" if isinstance(p, dict) else p

    print(
        f"[{time.strftime('%X')}] {tag:28s} K {fmt(kr)} | R "
        + " ".join(fmt(v) for v in rk.values())
        + " | A "
        + " ".join(map(fmt, ag))
        + " | "
        + " ".join(f"{a}={b}" for a, b in d.items() if b not in (0, "", [])),
        flush=True,
    )
    return d


PHASES = {
    "plain": lambda i: f"%%mesh\nx = rank + {i}",
    "print": lambda i: "%%mesh\nfor j in range(200): print('line', j, rank, 'x'*60)",
    "fail": lambda i: "%%mesh\n1/0",
    "status": lambda i: "%mesh status",
    "pushpull": lambda i: f"zz = {i}\n%mesh push zz\n",
    "api": lambda i: "r = mesh.run('rank*2'); print(r.values())",
    "apiprint": lambda i: "mesh.run('print(rank, \"hello\")')",
    "tensor": lambda i: (
        "import torch\nwith mesh.activate():\n    t = torch.ones(4) * 2 + 1\n    v = t.sum()\n"
    ),
    "actor": lambda i: f"r = act.f.call({i}).get()",
    "pull": lambda i: "%mesh pull x",
    "spawn": lambda i: "a2 = mesh.spawn(A); a2.f.call(1).get()",
    "stacks": lambda i: "%mesh stacks",
    "bigtensor": lambda i: (
        "import torch\nwith mesh.activate():\n    t = torch.ones(1_000_000) * 2\n    u = (t + 1).sum()\n"
        f"    f = u.fetch() if {i} % 10 == 0 else None\n"
    ),
    "tensorfail": lambda i: (
        "import torch\nwith mesh.activate():\n    t = torch.ones(1_000_000) * 2\n    u = t @ torch.ones(3, 3)\n"
    ),
    "fullrestart": lambda i: "%mesh restart" if i % 10 == 0 else "%%mesh\nx = 1",
    "spawnstop": lambda i: "a2 = mesh.spawn(A); a2.f.call(1).get(); a2.stop()",
    "logs": lambda i: "%mesh logs 0",
    "timeout": lambda i: "%%mesh --timeout 0.05\nimport time; time.sleep(0.2)",
    "nff": lambda i: "%%mesh --no-fail-fast\nif rank == 0: raise ValueError(rank)",
    "where": lambda i: f"%%mesh --ranks {i % 2}\ny = rank",
    "bigpull": lambda i: (
        "%%mesh\nimport numpy as np\nbig = np.full(300_000, rank)\n"
        if i == 0
        else "pb = %mesh pull big"
    ),
    "bigpush": lambda i: f"import numpy as np\narr = np.ones(300_000) * {i}\n%mesh push arr",
    "bigret": lambda i: "v = mesh.run('import numpy as np; np.ones(300_000)'); del v",
    "bigretkeep": lambda i: "v = mesh.run('import numpy as np; np.ones(300_000)')",
}


WAIT_FOR_A_DEATH = """import time
deadline = time.monotonic() + 30
while "dead" not in mesh.states().values() and time.monotonic() < deadline:
    time.sleep(0.01)"""


SPECIAL = ("interrupt", "restart", "updown")


def main():
    global N
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("phases", nargs="*", metavar="PHASE", help=f"any of: {', '.join([*PHASES, *SPECIAL])}")
    ap.add_argument("--cells", type=int, default=int(os.environ.get("N", "300")), help="cells per phase")
    args = ap.parse_args()
    unknown = [p for p in args.phases if p not in PHASES and p not in SPECIAL]
    if unknown:  # before a kernel starts (argparse's choices= refuses an empty list on 3.11)
        ap.error(f"no phase {', '.join(map(repr, unknown))}; the phases: {', '.join([*PHASES, *SPECIAL])}")
    N = args.cells
    phases = args.phases or [*PHASES, *SPECIAL]
    root = tempfile.mkdtemp(prefix="soak-jupyter-")
    write_kernel_spec(pathlib.Path(root) / "kernels" / "viceroy", executable=sys.executable)
    os.environ["JUPYTER_PATH"] = root
    k = Kernel()
    print("kernel pid", k.pid, flush=True)
    try:
        k.ok("%mesh up gpus=2", timeout=180)
        k.ok(
            "import viceroy\nclass A(viceroy.Actor):\n    @viceroy.endpoint\n    def f(self, x): return x + 1\nact = mesh.spawn(A)"
        )
        probe(k, "start")
        for ph in phases:
            if ph == "interrupt":
                t0 = time.time()
                for _ in range(N // 10):
                    mid = k.kc.execute("%%mesh\nimport time\ntime.sleep(30)")
                    time.sleep(0.3)
                    k.km.interrupt_kernel()
                    while True:
                        msg = k.kc.get_iopub_msg(timeout=30)
                        if (
                            msg["parent_header"].get("msg_id") == mid
                            and msg["msg_type"] == "status"
                            and msg["content"]["execution_state"] == "idle"
                        ):
                            break
                    k.kc.get_shell_msg(timeout=30)
                probe(k, f"interrupt x{N // 10} {time.time() - t0:.0f}s")
                continue
            if ph == "restart":
                t0 = time.time()
                for _ in range(N // 30):
                    k.ok("import os, signal\nos.kill(mesh.pids()[1], signal.SIGKILL)")
                    k.ok(WAIT_FOR_A_DEATH)
                    k.execute("%mesh restart --failed", timeout=120)
                probe(k, f"restart x{N // 30} {time.time() - t0:.0f}s")
                continue
            if ph == "updown":
                t0 = time.time()
                for _ in range(N // 30):
                    k.ok("%mesh down")
                    k.ok("%mesh up gpus=2", timeout=180)
                k.ok(
                    "import viceroy\nclass A(viceroy.Actor):\n    @viceroy.endpoint\n    def f(self, x): return x + 1\nact = mesh.spawn(A)"
                )
                probe(k, f"updown x{N // 30} {time.time() - t0:.0f}s")
                continue
            gen = PHASES[ph]
            t0 = time.time()
            bad = 0
            for i in range(N):
                ex = k.execute(gen(i), timeout=120)
                bad += ex.status != "ok"
                if ex.status != "ok" and bad == 1:
                    print(
                        "FIRST BAD",
                        ph,
                        [o.get("content", o) for o in ex.outputs][:2],
                        ex.reply.get("evalue"),
                    )
            probe(k, f"{ph} x{N} bad={bad} {time.time() - t0:.0f}s")
        print("stray", len(k.stray))
    finally:
        k.close()
        left = glob.glob("/dev/shm/*")
        print("after close: shm", len(left), left[:5])
        __import__("shutil").rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
