#!/usr/bin/env bash
# The nccl backend end to end, on a machine with a GPU. Prints a short table; exit 0 when every
# check that could run passed, 1 when one failed, 2 when nothing could run (no GPU / no CuPy).
#
#   bash bench/gpu_check.sh            # from the repository root, after `make setup`
#
# Checks: CuPy and NCCL import; device pinning (each rank sees one GPU through
# CUDA_VISIBLE_DEVICES); a communicator built through the rendezvous store; all_reduce,
# all_gather, reduce_scatter, broadcast on CuPy arrays and on torch CUDA tensors; an interrupt
# that releases a blocked nccl all_reduce and a rebuild after it; device-to-host fetch bandwidth
# (a CUDA tensor pulled to the controller); the tensor engine on CUDA tensors (ops on each
# rank's own GPU, fetch, vr.reduce, and a to_mesh ring over nccl send/recv in one group call);
# and, with 2+ GPUs, nccl all_reduce bus bandwidth at 256 MiB vs raw torch.distributed nccl in
# the same processes (goal >= 95 %).
#
# No network on the lent machines: CuPy must already be in the venv (pip install
# 'viceroy-kernel[gpu]', i.e. cupy-cuda12x) — the script says so and stops if it is not.
set -u
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
[ -x "$PY" ] || PY=python3

if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >/dev/null 2>&1; then
    echo "gpu_check: skipped: no GPU here (nvidia-smi finds none)"; exit 2
fi
nvidia-smi -L
if ! "$PY" -c "import cupy, cupy.cuda.nccl as n; assert getattr(n, 'available', True)" 2>/dev/null; then
    echo "gpu_check: skipped: needs CuPy with NCCL in $PY (pip install 'viceroy-kernel[gpu]')"; exit 2
fi

exec "$PY" - <<'EOF'
import sys
import time

import viceroy as vr

ngpu = int(__import__("cupy").cuda.runtime.getDeviceCount())
rows, failed = [], False


def check(name, fn):
    global failed
    t0 = time.perf_counter()
    try:
        detail = fn()
        rows.append((name, "ok", str(detail or ""), f"{time.perf_counter() - t0:.2f} s"))
    except Exception as exc:  # report and go on
        failed = True
        first = str(exc).strip().splitlines()
        rows.append((name, "FAILED", f"{type(exc).__name__}: {first[0] if first else ''}"[:160], ""))


# Several ranks cannot share a GPU in one NCCL communicator: one rank per GPU, at least one.
n = max(1, ngpu)
mesh = vr.Mesh.local(gpus=n, echo=False)
SETUP = "import os, time, torch, cupy, viceroy as vr\nfrom viceroy.runtime import collectives as C\n"
mesh.run(SETUP)

check("device pinning (CUDA_VISIBLE_DEVICES per rank)",
      lambda: dict(mesh.run("(os.environ.get('CUDA_VISIBLE_DEVICES'), torch.cuda.device_count())").items()))


def collectives_cupy():
    out = mesh.run(
        "a = cupy.ones(1 << 20, dtype=cupy.float32) * (rank + 1)\n"
        "vr.all_reduce(a)\n"
        "g = vr.all_gather(cupy.full((2,), rank, dtype=cupy.int32))\n"
        "s = vr.reduce_scatter(cupy.arange(2 * mesh['gpus'], dtype=cupy.float32))\n"
        "b = cupy.full((3,), float(rank)); vr.broadcast(b, src=0)\n"
        "cupy.cuda.Device().synchronize()\n"
        "float(a[0]), g.tolist(), s.tolist(), b.tolist()")
    want = float(n * (n + 1) // 2)
    for r, v in enumerate(out.values()):
        assert v[0] == want, v
        assert v[1] == [[i, i] for i in range(n)], v  # all_gather: every rank's row, in order
        assert v[2] == [float(n * 2 * r), float(n * (2 * r + 1))], v  # reduce_scatter: its chunk
        assert v[3] == [0.0] * 3, v
    return f"all_reduce={want:g}, all_gather, reduce_scatter, broadcast on {n} rank(s)"


def collectives_torch():
    out = mesh.run(
        "t = torch.ones(1 << 20, device='cuda') * (rank + 1)\n"
        "vr.all_reduce(t, op='max')\n"
        "h = torch.arange(4., device='cuda') + rank; vr.broadcast(h, src=0)\n"
        "t[0].item(), h.tolist()")
    for v in out.values():
        assert v == (float(n), [0.0, 1.0, 2.0, 3.0]), v
    return "max, broadcast on torch CUDA tensors"


def communicator_one_rank():
    # With one GPU the mesh's groups have one member and skip NCCL: build one directly.
    return mesh.slice(gpus=slice(0, 1)).run(
        "from viceroy.runtime.collectives.nccl import NcclBackend\n"
        "from viceroy.runtime.collectives.store import rendezvous\n"
        "from torch.distributed import PrefixStore\n"
        "store, inc = rendezvous.get(30)\n"
        "comm = NcclBackend().connect(PrefixStore(f'check/{time.time()}', rendezvous.client(30)), 0, 1, 0, 30)\n"
        "x = cupy.ones(1024, dtype=cupy.float32) * 3\n"
        "p = comm.all_reduce(x, 'sum')\n"
        "while not p.wait(0.05): pass\n"
        "y = torch.ones(1024, device='cuda') * 2\n"
        "p = comm.all_reduce(y, 'avg')\n"
        "while not p.wait(0.05): pass\n"
        "comm.abort()\n"
        "float(x[0]), y[0].item()").item(gpus=0)


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
    v = mesh.run("a = cupy.ones(4); vr.all_reduce(a); float(a[0])").values()
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
    if n < 2:
        return f"ops on {devices[0]}, fetch, reduce (one rank: no ring)"
    turned = mesh.select([*range(1, n), 0])  # rank i sends to rank i+1: every rank sends and receives
    with mesh.activate():
        x = torch.arange(4.0)
    mesh.run("t.add_(10 * rank)", t=x)  # a MeshTensor is a handle: each rank's own tensor
    where = mesh.run(lambda t: str(t.device), x).values()
    moved = x.to_mesh(turned)
    got = dict(zip(turned.ranks, (t.tolist() for t in moved.fetch().values()), strict=True))
    for r in range(n):
        src = (r - 1) % n
        assert got[r] == [10.0 * src + i for i in range(4)], (r, got[r])
    return f"ops on {devices[0]}, fetch, reduce, to_mesh ring over {n} ranks ({where[0]})"


def fetch_bandwidth():
    nbytes = 256 << 20
    mesh.slice(gpus=slice(0, 1)).run(f"big = torch.ones({nbytes // 4}, device='cuda')")
    t0 = time.perf_counter()
    mesh.slice(gpus=slice(0, 1)).run("big.cpu()")
    dt = time.perf_counter() - t0
    return f"{nbytes / dt / 1e9:.2f} GB/s (256 MiB, rank 0 -> controller)"


def nccl_bandwidth():
    if n < 2:
        return "skipped: needs 2 GPUs"

    def measure(nbytes, iters, rounds):
        import time

        import cupy
        import torch
        import torch.distributed as dist

        import viceroy as vr

        torch.cuda.set_device(0)
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


check("nccl communicator, one rank (CuPy + torch CUDA)", communicator_one_rank)
check("collectives on CuPy arrays", collectives_cupy)
check("collectives on torch CUDA tensors", collectives_torch)
check("interrupt releases nccl all_reduce, then rebuild", interrupt_and_rebuild)
check("tensor engine on CUDA tensors", tensor_engine_cuda)
check("device-to-host fetch bandwidth", fetch_bandwidth)
check("nccl all_reduce 256 MiB bus bandwidth", nccl_bandwidth)
mesh.shutdown()

sys.path.insert(0, "bench")
from common import table  # noqa: E402

print(table(rows, ("check", "result", "detail", "time")))
sys.exit(1 if failed else 0)
EOF
