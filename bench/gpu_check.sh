#!/usr/bin/env bash
# The nccl backend end to end, on a machine with a GPU. Prints a short table; exit 0 when every
# check that could run passed, 1 when one failed, 2 when nothing could run (no GPU / no CuPy).
#
#   bash bench/gpu_check.sh            # from the repository root, after `make setup`
#
# Checks: CuPy and NCCL import; device binding (the ranks of a host see its GPUs, and each
# runs on the one at its local rank: torch, CuPy, an actor's thread, stock set_device(LOCAL_RANK));
# a communicator built through the rendezvous store; all_reduce,
# all_gather, reduce_scatter, broadcast on CuPy arrays and on torch CUDA tensors; an interrupt
# that releases a blocked nccl all_reduce and a rebuild after it; device-to-host fetch bandwidth
# (a CUDA tensor pulled to the controller); the tensor engine on CUDA tensors (ops on each
# rank's own GPU, fetch, vr.reduce, and a to_mesh ring over nccl send/recv in one group call);
# stock torch.distributed on the GPU (env:// init, DDP, vr.device_mesh(), a DTensor) and the
# view's GPU figures (mesh.stats(), before and after CUDA starts on the rank);
# and, with 2+ GPUs, nccl all_reduce bus bandwidth at 256 MiB vs raw torch.distributed nccl in
# the same processes (goal >= 95 %).
#
# With ONE GPU the mesh has one rank (NCCL refuses two ranks on one GPU in one communicator),
# so the multi-rank checks are skipped; a one-rank communicator is driven directly instead
# (every operation, every dtype, a grouped send/receive to itself, abort), and a last probe
# starts 2 ranks on the one GPU to see that NCCL's refusal comes back as a clear error, in time.
#
# No network on the lent machines: CuPy must already be in the Python used. viceroy's own
# dependencies (pyzmq, cloudpickle) are taken from wheels in $VICEROY_WHEELS (default
# bench/out/wheels) when that Python lacks them, e.g. made beforehand with
#   pip download --only-binary=:all: --python-version 3.12 --platform manylinux2014_x86_64 \
#       -d bench/out/wheels pyzmq cloudpickle
# Every rank call has a timeout, and a watchdog prints the table and stops after
# $GPU_CHECK_BUDGET_S seconds (default 420).
set -u
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
[ -x "$PY" ] || PY=python3

if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >/dev/null 2>&1; then
    echo "gpu_check: skipped: no GPU here (nvidia-smi finds none)"; exit 2
fi
nvidia-smi -L
echo "CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES-<unset>}; /proc/driver/nvidia/gpus: $(ls /proc/driver/nvidia/gpus 2>/dev/null | wc -l) entries (ranks are given these); /dev/shm: $(df -h --output=size /dev/shm 2>/dev/null | tail -1 | tr -d ' ') (NCCL needs more than Docker's 64M)"

WHEELS=${VICEROY_WHEELS:-bench/out/wheels}
if ! "$PY" -c "import zmq, cloudpickle" 2>/dev/null; then
    DEPS=$PWD/bench/out/pydeps
    if ls "$WHEELS"/*.whl >/dev/null 2>&1; then
        # Each wheel into a folder of its own; the first that imports is used (no pip needed).
        found=$("$PY" - "$WHEELS" "$DEPS" <<'PYDEPS'
import glob, os, subprocess, sys, zipfile
wheels, deps = sys.argv[1], sys.argv[2]
used = []
for pattern, module in (("cloudpickle-*.whl", "cloudpickle"), ("pyzmq-*.whl", "zmq")):
    for whl in sorted(glob.glob(os.path.join(wheels, pattern)), reverse=True):
        where = os.path.join(deps, os.path.basename(whl)[:-4])
        zipfile.ZipFile(whl).extractall(where)
        if subprocess.run([sys.executable, "-c", f"import {module}"], env={**os.environ, "PYTHONPATH": where},
                          capture_output=True).returncode == 0:
            used.append(where)
            break
print(os.pathsep.join(used))
PYDEPS
)
        [ -n "$found" ] && export PYTHONPATH="$found${PYTHONPATH:+:$PYTHONPATH}"
    fi
    if ! why=$("$PY" -c "import zmq, cloudpickle" 2>&1); then
        echo "gpu_check: skipped: $PY cannot import pyzmq and cloudpickle (${why##*$'\n'}), and $WHEELS has no wheel of them that works"
        exit 2
    fi
fi
# torch first: its wheel brings libnccl, which CuPy's wheel (that has none of its own) then finds.
if ! versions=$("$PY" -c "
import torch, cupy, cupy.cuda.nccl as n
assert n.available, 'CuPy found no NCCL library'
print(f'torch {torch.__version__} (its NCCL {torch.cuda.nccl.version()}), CuPy {cupy.__version__}, '
      f'NCCL {n.get_version()} at run time / {n.get_build_version()} at CuPy build')" 2>&1); then
    echo "gpu_check: skipped: needs CuPy with NCCL in $PY (pip install 'viceroy-kernel[gpu]'): ${versions##*$'\n'}"
    exit 2
fi
echo "$versions"

exec "$PY" - <<'EOF'
import os
import sys
import threading
import time
import traceback

sys.path.insert(0, "bench")
from common import table  # noqa: E402

import viceroy as vr  # noqa: E402

ngpu = int(__import__("cupy").cuda.runtime.getDeviceCount())
rows, failed = [], False
HEADER = ("check", "result", "detail", "time")
ENV = {"VICEROY_COLLECTIVE_TIMEOUT": "60"}  # a stuck collective fails in a minute, not ten
T = 120  # seconds for any one call on the ranks


def report_and_exit(code):
    print(table(rows, HEADER), flush=True)
    os._exit(code)


def watchdog():
    rows.append(("(watchdog)", "FAILED", f"still running after {budget:.0f} s; stopped here", ""))
    report_and_exit(1)  # the ranks go with this process (their lifelines)


budget = float(os.environ.get("GPU_CHECK_BUDGET_S", "420"))
timer = threading.Timer(budget, watchdog)
timer.daemon = True
timer.start()


sub_rows = []  # rows a check adds under its own (its steps)
LOG = os.environ.get("GPU_CHECK_LOG", "bench/out/gpu_check.log")  # each failure in full
os.makedirs(os.path.dirname(LOG) or ".", exist_ok=True)


def check(name, fn):
    global failed
    t0 = time.perf_counter()
    try:
        detail = fn()
        row = (name, "ok", str(detail or ""), f"{time.perf_counter() - t0:.2f} s")
    except Exception as exc:  # report and go on; the whole error goes to the log
        failed = True
        with open(LOG, "a") as log:
            log.write(f"==== {name}\n{''.join(traceback.format_exception(exc))}\n")
        first = str(exc).strip().splitlines()
        detail = f"{type(exc).__name__}: {' / '.join(first[:2]) if first else ''}"
        row = (name, "FAILED", detail[:200], f"{time.perf_counter() - t0:.2f} s")
    for r in [row, *sub_rows]:
        rows.append(r)
        print("gpu_check:", " | ".join(r), flush=True)  # as it goes: a kill still leaves these
    sub_rows.clear()


# Several ranks cannot share a GPU in one NCCL communicator: one rank per GPU, at least one.
n = max(1, ngpu)
SETUP = "import os, time, torch, cupy, viceroy as vr\nfrom viceroy.runtime import collectives as C\n"
mesh = None


def start():
    global mesh
    mesh = vr.Mesh.local(gpus=n, echo=False, env=ENV)
    mesh.run(SETUP, timeout=T)
    return f"{n} rank(s), torch and cupy imported on each"


def binding():
    # Every rank sees the host's GPUs (one list, as under torchrun) and runs on the one at its
    # local rank: torch (made current when CUDA starts, not at import), CuPy (at import), an
    # actor's thread, and stock code choosing the device by LOCAL_RANK.
    got = mesh.run("(torch.cuda.is_initialized(), os.environ.get('CUDA_VISIBLE_DEVICES'), "
                   "int(os.environ['LOCAL_RANK']), vr.context().device, torch.cuda.device_count(), "
                   "torch.cuda.current_device(), cupy.cuda.runtime.getDevice())", timeout=T).by_rank()
    for r, (started, visible, local, device, count, current, cupy_current) in got.items():
        assert not started, f"rank {r}: importing torch started CUDA: {got}"
        assert device == local % count and current == device and cupy_current == device, got
    assert len({v[1] for v in got.values()}) == 1, f"ranks see different GPUs: {got}"
    stock = mesh.run("torch.cuda.set_device(int(os.environ['LOCAL_RANK'])); "
                     "torch.ones(1, device='cuda').device.index", timeout=T).values()
    assert stock == [int(v[3]) for v in got.values()], stock

    class OnGpu(vr.Actor):
        @vr.endpoint
        def where(self):
            import torch

            return torch.ones(1, device="cuda").device.index

    actors = mesh.spawn(OnGpu)
    try:
        on_actor = actors.where.call().get(timeout=T).values()
    finally:
        actors.stop()
    assert on_actor == [v[3] for v in got.values()], on_actor
    return str(got)


ONE_RANK = '''
from viceroy.runtime.collectives.nccl import NcclBackend, NcclFailure
from viceroy.runtime.collectives.store import rendezvous
from torch.distributed import PrefixStore

def _done(p):
    while not p.wait(0.05):
        pass

def _one_rank_checks():
    out = {}
    def step(name, fn):
        try:
            out[name] = ("ok", str(fn() or ""))
        except Exception as exc:
            out[name] = ("FAILED", f"{type(exc).__name__}: {str(exc).strip()[:160]}")
    rendezvous.get(30)
    comm = NcclBackend().connect(PrefixStore(f"check/{time.time()}", rendezvous.client(30)), 0, 1, 0, 30)

    def basic():
        x = cupy.ones(1024, dtype=cupy.float32) * 3
        _done(comm.all_reduce(x, "sum"))
        y = torch.ones(1024, device="cuda") * 2
        _done(comm.all_reduce(y, "avg"))
        assert (float(x[0]), y[0].item()) == (3.0, 2.0), (float(x[0]), y[0].item())
        out_ = torch.empty(1, 3, device="cuda")
        _done(comm.all_gather([out_[0]], torch.tensor([1.0, 2.0, 3.0], device="cuda")))
        rs = torch.empty(4, device="cuda")
        _done(comm.reduce_scatter(rs, [torch.arange(4.0, device="cuda")], "sum"))
        b = torch.full((3,), 7.0, device="cuda")
        _done(comm.broadcast(b, 0))
        assert out_.tolist() == [[1.0, 2.0, 3.0]] and rs.tolist() == [0.0, 1.0, 2.0, 3.0] and b.tolist() == [7.0] * 3
        return "all_reduce sum (CuPy) and avg (torch), all_gather, reduce_scatter, broadcast"

    def side_stream():
        s = torch.cuda.Stream()
        with torch.cuda.stream(s):
            z = torch.full((1 << 22,), 5.0, device="cuda") * 1
            _done(comm.all_reduce(z, "max"))  # on s, after the fill queued on s
            got = z.sum().item()
        assert got == 5.0 * (1 << 22), got
        return "queued on torch's current (side) stream"

    def self_exchange():
        a = torch.arange(5.0, device="cuda"); b = torch.zeros(5, device="cuda")
        _done(comm.exchange(a, 0, b, 0))
        cx = cupy.arange(5, dtype=cupy.float64); cy = cupy.zeros(5, dtype=cupy.float64)
        _done(comm.exchange(cx, 0, cy, 0))
        assert b.tolist() == a.tolist() and cy.tolist() == cx.tolist(), (b, cy)
        return "send and receive to itself in one NCCL group (torch, CuPy)"

    def dtypes():
        done = []
        for dt in ("bfloat16", "float16", "float64", "int8", "uint8", "int32", "int64", "bool"):
            t = torch.ones(7, device="cuda", dtype=getattr(torch, dt))
            _done(comm.all_reduce(t, "sum"))
            assert t.tolist() == torch.ones(7, dtype=getattr(torch, dt)).tolist(), (dt, t)
            done.append(dt)
        for dt in ("int16", "complex64", "bool"):
            src = (torch.arange(3, device="cuda") % 2).to(getattr(torch, dt))
            o = torch.empty(1, 3, device="cuda", dtype=src.dtype)
            _done(comm.all_gather([o[0]], src))
            assert o[0].tolist() == src.tolist(), (dt, o)
            done.append(dt + " (moved)")
        return ", ".join(done)

    def timing():
        # One rank: NCCL copies locally, so this measures what each side adds per operation
        # (ours: CuPy's binding and our stream handling; torch's: ProcessGroupNCCL), not a network.
        import statistics
        import torch.distributed as dist
        if not dist.is_initialized():
            dist.init_process_group("nccl", rank=0, world_size=1, store=PrefixStore(f"raw/{time.time()}", rendezvous.client(30)))
        res = {}
        for nbytes, iters in ((4, 200), (256 << 20, 10)):
            ours = torch.ones(max(1, nbytes // 4), device="cuda"); raw = ours.clone()
            sides = {"viceroy": lambda: _done(comm.all_reduce(ours, "sum")),
                     "raw": lambda: (dist.all_reduce(raw), torch.cuda.synchronize())}
            times = {k: [] for k in sides}
            for f in sides.values():
                f(); f()
            for r in range(6):
                for k in (sides if r % 2 == 0 else list(reversed(sides))):
                    torch.cuda.synchronize(); t0 = time.perf_counter()
                    for _ in range(iters):
                        sides[k]()
                    times[k].append((time.perf_counter() - t0) / iters)
            res[nbytes] = {k: statistics.median(v) for k, v in times.items()}
        small, big = res[4], res[256 << 20]
        return (f"4 B: viceroy {small['viceroy'] * 1e6:.1f} us vs raw {small['raw'] * 1e6:.1f} us "
                f"({small['viceroy'] / small['raw']:.2f}x); 256 MiB: viceroy {big['viceroy'] * 1e3:.2f} ms "
                f"vs raw {big['raw'] * 1e3:.2f} ms ({big['viceroy'] / big['raw']:.2f}x); one rank, same process")

    def abort():
        comm.abort()
        try:
            comm.all_reduce(torch.ones(1, device="cuda"), "sum")
        except NcclFailure:
            return "an aborted communicator refuses work"
        raise AssertionError("an aborted communicator took work")

    for name, fn in (("basic", basic), ("side stream", side_stream), ("send/recv to self", self_exchange),
                     ("dtypes", dtypes), ("timing", timing), ("abort", abort)):
        step(name, fn)
    return out
'''


def one_rank():
    out = mesh.slice(gpus=slice(0, 1)).run(ONE_RANK + "_one_rank_checks()", timeout=T).item(gpus=0)
    sub_rows.extend((f"  one rank: {name}", result, detail, "") for name, (result, detail) in out.items())
    bad = [k for k, (r, _) in out.items() if r != "ok"]
    if bad:
        raise AssertionError(f"failed: {', '.join(bad)}")
    return "communicator built through the rendezvous store; steps below"


def collectives_cupy():
    out = mesh.run(
        "a = cupy.ones(1 << 20, dtype=cupy.float32) * (rank + 1)\n"
        "vr.all_reduce(a)\n"
        "g = vr.all_gather(cupy.full((2,), rank, dtype=cupy.int32))\n"
        "s = vr.reduce_scatter(cupy.arange(2 * mesh['gpus'], dtype=cupy.float32))\n"
        "b = cupy.full((3,), float(rank)); vr.broadcast(b, src=0)\n"
        "cupy.cuda.Device().synchronize()\n"
        "float(a[0]), g.tolist(), s.tolist(), b.tolist()", timeout=T)
    want = float(n * (n + 1) // 2)
    for r, v in enumerate(out.values()):
        assert v[0] == want, v
        assert v[1] == [[i, i] for i in range(n)], v  # all_gather: every rank's row, in order
        assert v[2] == [float(n * 2 * r), float(n * (2 * r + 1))], v  # reduce_scatter: its chunk
        assert v[3] == [0.0] * 3, v
    return f"all_reduce={want:g}, all_gather, reduce_scatter, broadcast on {n} rank(s)" + (
        "" if n > 1 else " (one rank: no NCCL involved)")


def collectives_torch():
    out = mesh.run(
        "t = torch.ones(1 << 20, device='cuda') * (rank + 1)\n"
        "vr.all_reduce(t, op='max')\n"
        "h = torch.arange(4., device='cuda') + rank; vr.broadcast(h, src=0)\n"
        "t[0].item(), h.tolist()", timeout=T)
    for v in out.values():
        assert v == (float(n), [0.0, 1.0, 2.0, 3.0]), v
    return "max, broadcast on torch CUDA tensors" + ("" if n > 1 else " (one rank: no NCCL involved)")


def interrupt_and_rebuild():
    if n < 2:
        return "skipped: needs 2 GPUs"
    fut = mesh.run("if rank == 1: time.sleep(30)\nelse: vr.all_reduce(cupy.ones(4))", block=False)
    time.sleep(1.0)
    t0 = time.monotonic()
    mesh.interrupt()
    try:
        fut.get(timeout=10)
        raise AssertionError("the call should have been interrupted")
    except vr.MeshError:
        pass
    took = time.monotonic() - t0
    assert took < 2, took
    v = mesh.run("a = cupy.ones(4); vr.all_reduce(a); float(a[0])", timeout=T).values()
    assert set(v) == {float(n)}, v
    return f"released in {took:.2f} s, rebuilt"


def tensor_engine_cuda():
    import torch

    with mesh.activate():
        a = torch.ones(256, 256)  # made on each rank's own GPU
        b = (a @ a).sum(dim=0)
    devices = [d["device"] for d in vr.inspect(b).values()]
    assert all(d.startswith("cuda") for d in devices), devices
    assert b.fetch(gpus=0).tolist() == [256.0 * 256] * 256
    total = vr.reduce(b, "sum").fetch(gpus=0)
    assert total.tolist() == [256.0 * 256 * n] * 256, total[:4]
    # Dispatch: 1,000 small ops pipelined on the ranks' CUDA tensors, then one fetch; the
    # controller's CPU per op, against the same ops run on a rank by its own code.
    cpu, wall = [], []
    for _ in range(4):
        t0, c0 = time.perf_counter(), time.thread_time()
        with mesh.activate():
            y = a[0, :16]
            for _ in range(500):
                y = y * 1.0001 + 1
        cpu.append(time.thread_time() - c0)
        y.sum().fetch(gpus=0)
        wall.append(time.perf_counter() - t0)
    local = mesh.slice(gpus=slice(0, 1)).run(
        "def _ops():\n"
        "    y = torch.ones(16, device='cuda')\n"
        "    torch.cuda.synchronize(); t0 = time.perf_counter()\n"
        "    for _ in range(500):\n"
        "        y = y * 1.0001 + 1\n"
        "    y.sum().item(); return time.perf_counter() - t0\n"
        "_ops(); sorted(_ops() for _ in range(3))[1]", timeout=T).item(gpus=0)
    per = sorted(cpu[1:])[1] / 1000
    dispatch = (f"; dispatch {per * 1e6:.1f} us/op on the controller (goal <= 50), 1,000 ops + fetch "
                f"{sorted(wall[1:])[1] * 1e3:.1f} ms vs {local * 1e3:.1f} ms run on the rank")
    assert per <= 50e-6, dispatch
    if n < 2:
        return f"ops on {devices[0]}, fetch, reduce (one rank: no ring){dispatch}"
    turned = mesh.select([*range(1, n), 0])  # rank i sends to rank i+1: every rank sends and receives
    with mesh.activate():
        x = torch.arange(4.0)
    mesh.run("t.add_(10 * rank)", t=x, timeout=T)  # a MeshTensor is a handle: each rank's own tensor
    where = mesh.run(lambda t: str(t.device), x, timeout=T).values()
    moved = x.to_mesh(turned)
    got = dict(zip(turned.ranks, (t.tolist() for t in moved.fetch().values()), strict=True))
    for r in range(n):
        src = (r - 1) % n
        assert got[r] == [10.0 * src + i for i in range(4)], (r, got[r])
    return f"ops on {devices[0]}, fetch, reduce, to_mesh ring over {n} ranks ({where[0]}){dispatch}"


def results_on_host():
    # A rank's CUDA tensor comes back to the controller as a CPU tensor (no CUDA started here).
    v = mesh.slice(gpus=slice(0, 1)).run("torch.arange(3.0, device='cuda')", timeout=T).item(gpus=0)
    assert v.device.type == "cpu" and v.tolist() == [0.0, 1.0, 2.0], v
    # large ones (through pinned memory): transposed, bfloat16 (no numpy dtype), twice each
    import torch

    code = "torch.arange(1 << 20, device='cuda').to(torch.{}).view(1024, -1).t()"
    for dtype in ("float32", "bfloat16", "float32", "bfloat16"):
        got = mesh.slice(gpus=slice(0, 1)).run(code.format(dtype), timeout=T).item(gpus=0)
        want = torch.arange(1 << 20).to(getattr(torch, dtype)).view(1024, -1).t()
        assert got.dtype == want.dtype and torch.equal(got, want), (dtype, got[:2, :2])
    # over PINNED_MAX: through a page-locked piece at a time (320 MiB, transposed, int32)
    got = mesh.slice(gpus=slice(0, 1)).run(
        "torch.arange(80 << 20, device='cuda', dtype=torch.int32).view(-1, 1024).t()", timeout=T).item(gpus=0)
    assert torch.equal(got, torch.arange(80 << 20, dtype=torch.int32).view(-1, 1024).t()), got[:2, :2]
    assert not torch.cuda.is_initialized(), "the controller started CUDA to read a result"
    return ("cuda tensor results -> CPU tensors on the controller (small; 2-4 MiB transposed, float32 and "
            "bfloat16; 320 MiB transposed int32, in pieces)")


def fetch_bandwidth():
    # A CUDA tensor pulled from rank 0 to the controller (the rank copies it to page-locked host
    # memory, then into shared memory), against what its two copies cost alone, in the same run:
    # the rank's device-to-host copy and a host memcpy here (dst.copy_(src)).
    import statistics

    import torch

    nbytes = 256 << 20
    one = mesh.slice(gpus=slice(0, 1))
    one.run(f"big = torch.ones({nbytes // 4}, device='cuda'); big.cpu(); None", timeout=T)

    def pull_named(name, numel):
        t0 = time.perf_counter()
        got = one.run(name, timeout=T).item(gpus=0)
        dt = time.perf_counter() - t0
        assert got.shape == (numel,) and got.device.type == "cpu", got.shape
        return dt

    pull_named("big", nbytes // 4)  # the first maps the shared memory
    took = statistics.median(pull_named("big", nbytes // 4) for _ in range(5))
    pageable, d2h = one.run(
        "import statistics\n"
        "def _d2h(copy):\n"
        "    torch.cuda.synchronize(); t0 = time.perf_counter(); copy(); return time.perf_counter() - t0\n"
        "def _median(copy):\n"
        "    _d2h(copy); return statistics.median(_d2h(copy) for _ in range(5))\n"
        "_median(big.cpu), _median(lambda: torch.empty(big.shape, pin_memory=True).copy_(big))",
        timeout=T).item(gpus=0)
    src, dst = torch.ones(nbytes // 4), torch.empty(nbytes // 4)
    dst.copy_(src)

    def memcpy():
        t0 = time.perf_counter()
        dst.copy_(src)
        return time.perf_counter() - t0

    host = statistics.median(memcpy() for _ in range(5))
    # Over PINNED_MAX (1 GiB): in pieces through page-locked memory, against .cpu() on the rank
    one.run("del big; huge = torch.ones(1 << 28, device='cuda'); None", timeout=T)
    huge = statistics.median(pull_named("huge", 1 << 28) for _ in range(3))
    huge_cpu = one.run("_median(huge.cpu)", timeout=T).item(gpus=0)
    one.run("del huge; torch.cuda.empty_cache(); None", timeout=T)
    gbs = {k: nbytes / v / 1e9 for k, v in (("pull", took), ("d2h", d2h), ("memcpy", host))}
    ceiling = nbytes / (d2h + host) / 1e9  # the two copies back to back
    return (f"pull {gbs['pull']:.2f} GB/s; the rank's copy to pinned memory {gbs['d2h']:.2f} GB/s "
            f"(big.cpu(): {nbytes / pageable / 1e9:.2f} GB/s), host memcpy "
            f"{gbs['memcpy']:.2f} GB/s, both in turn {ceiling:.2f} GB/s: pull at {gbs['pull'] / ceiling:.0%} "
            "(256 MiB, rank 0 -> controller, median of 5); "
            f"1 GiB in pieces: pull {(1 << 30) / huge / 1e9:.2f} GB/s, its .cpu() alone {(1 << 30) / huge_cpu / 1e9:.2f} GB/s")


def nccl_bandwidth():
    if n < 2:
        return "skipped: needs 2 GPUs"

    def measure(nbytes, iters, rounds):
        import time

        import cupy
        import torch
        import torch.distributed as dist

        import viceroy as vr

        if not dist.is_initialized():
            dist.init_process_group("nccl")
        ours = torch.ones(nbytes // 4, device="cuda")
        raw = torch.ones(nbytes // 4, device="cuda")
        sides = {"viceroy": lambda: vr.all_reduce(ours),
                 "raw": lambda: (dist.all_reduce(raw), torch.cuda.synchronize())}
        for f in sides.values():
            f(); f()
        out = {k: [] for k in sides}
        for r in range(rounds):
            for name in (sides if r % 2 == 0 else list(reversed(sides))):
                dist.barrier(); torch.cuda.synchronize()
                t0 = time.perf_counter()
                for _ in range(iters):
                    sides[name]()
                torch.cuda.synchronize()
                out[name].append((time.perf_counter() - t0) / iters)
        cupy.cuda.Device().synchronize()
        return {k: sorted(v)[len(v) // 2] for k, v in out.items()}

    nbytes = 256 << 20
    res = mesh.run(measure, nbytes, 10, 6, timeout=300).item(gpus=0)
    bus = {k: nbytes * 2 * (n - 1) / n / v for k, v in res.items()}
    ratio = bus["viceroy"] / bus["raw"]
    assert ratio >= 0.95, f"{ratio:.0%} of raw"
    return f"viceroy {bus['viceroy'] / 1e9:.1f} GB/s vs raw {bus['raw'] / 1e9:.1f} GB/s: {ratio:.0%} (goal >= 95 %)"


STOCK = """
import torch, torch.distributed as dist, viceroy as vr
from torch.distributed.tensor import Shard, distribute_tensor
from viceroy.runtime.collectives import install_torch_hooks
install_torch_hooks()
dist.init_process_group()  # env://, as `%mesh up --torch-dist` does: gloo for CPU tensors, nccl for CUDA
torch.manual_seed(0)
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(8, 1).cuda())
opt = torch.optim.SGD(model.parameters(), lr=0.1)
x = torch.randn(64, 8, device="cuda"); y = x.sum(dim=1, keepdim=True)
losses = []
for _ in range(30):
    opt.zero_grad(); loss = torch.nn.functional.mse_loss(model(x), y); loss.backward(); opt.step()
    losses.append(loss.item())
dm = vr.device_mesh()
d = distribute_tensor(torch.arange(8.0, device="cuda"), dm, [Shard(0)])
keep = torch.empty(1 << 28, device="cuda")  # 1 GiB held, for the view's figures
(str(dist.get_backend()), losses[0], losses[-1], dm.device_type, dm.mesh_dim_names,
 d.full_tensor().sum().item(), str(d.to_local().device), str(next(model.parameters()).device))
"""


def stock_torch_dist():
    # A fresh mesh: the view's GPU figures before CUDA starts on the rank (through NVML) and
    # after (through torch); then what `--torch-dist` sets up, and stock code on the rank's GPU.
    m = vr.Mesh.local(gpus=1, echo=False, env=ENV)
    try:
        before = m.stats()["ranks"][0]
        backend, first, last, kind, names, total, dev, param = m.run(STOCK, timeout=T).item(gpus=0)
        after = m.stats()["ranks"][0]
    finally:
        m.shutdown()
    assert last < first / 4, (first, last)
    assert (kind, names, total, dev, param) == ("cuda", ("gpus",), 28.0, "cuda:0", "cuda:0"), (kind, names, total, dev, param)
    assert after["gpu_mem"] is not None and after["gpu_mem"] >= 1 << 30 and after["gpu_util"] is not None, after
    return (f"backend {backend}; DDP loss {first:.3f} -> {last:.4f}; device_mesh {kind} {names}, DTensor; "
            f"view figures before CUDA (NVML) {before}, after {after}")


def two_ranks_one_gpu():
    # NCCL: "Using the same CUDA device multiple times as different ranks of the same NCCL
    # communicator is not supported and may lead to hangs." What matters here: the error comes
    # back to every rank, in time, naming the ranks that share the GPU, and nothing hangs.
    if ngpu != 1:
        return "skipped: only on a machine with one GPU"
    m2 = vr.Mesh.local(gpus=2, echo=False, env={"VICEROY_COLLECTIVE_TIMEOUT": "40"})
    try:
        m2.run(SETUP, timeout=T)
        try:
            v = m2.run("t = torch.ones(4, device='cuda') * (rank + 1); vr.all_reduce(t); t[0].item()",
                       timeout=90).values()
            return f"NCCL ran 2 ranks on 1 GPU: all_reduce gave {v}"
        except vr.MeshError as exc:
            text = str(exc)
            assert "timed out after" not in text, f"hung until the call's timeout: {text[-300:]}"
            why = next((ln.strip() for ln in text.splitlines() if "CollectiveError" in ln), None)
            assert why, f"not a CollectiveError: {text[-300:]}"
            assert "ranks 0-1 share GPU 0 of" in why and "one rank per GPU" in why, why
            return f"refused: {why[:400]}"
    finally:
        m2.shutdown()


check("mesh up (torch, cupy on every rank)", start)
try:
    if mesh is not None:
        check("device binding (a GPU per local rank)", binding)
        check("nccl communicator, one rank (CuPy + torch CUDA)", one_rank)
        check("collectives on CuPy arrays", collectives_cupy)
        check("collectives on torch CUDA tensors", collectives_torch)
        check("interrupt releases nccl all_reduce, then rebuild", interrupt_and_rebuild)
        check("tensor engine on CUDA tensors", tensor_engine_cuda)
        check("a rank's CUDA tensor returns as a CPU tensor", results_on_host)
        check("device-to-host fetch bandwidth", fetch_bandwidth)
        check("nccl all_reduce 256 MiB bus bandwidth", nccl_bandwidth)
finally:
    if mesh is not None:
        try:
            mesh.shutdown()
        except Exception as exc:
            rows.append(("mesh.shutdown()", "FAILED", f"{type(exc).__name__}: {exc}"[:160], ""))
if mesh is not None:
    check("stock torch.distributed on the GPU: DDP, device_mesh, DTensor; GPU figures", stock_torch_dist)
    check("2 ranks on 1 GPU: a clear error, not a hang", two_ranks_one_gpu)
timer.cancel()
report_and_exit(1 if failed else 0)
EOF
