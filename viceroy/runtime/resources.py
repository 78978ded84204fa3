"""What a rank measures of itself for the "stats" query (the mesh view's memory and GPU
figures): resident memory, and GPU memory and utilisation where there is a GPU."""

from __future__ import annotations

import os
import sys
from typing import Any

from viceroy.runtime import devices


def use() -> dict[str, Any]:
    """This process's memory and GPU use, for the "stats" query: ``rss`` (bytes), ``gpu_mem``
    (bytes) and ``gpu_util`` (0-100), each None where unknown. GPU figures come from torch when
    it has already initialised CUDA here (never initialised for this), else from NVML (pynvml)
    if installed; a rank without a GPU reports None."""
    gpu_mem, gpu_util = gpu_use()
    return {"rss": rss(), "gpu_mem": gpu_mem, "gpu_util": gpu_util}


def rss() -> int | None:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        pass
    try:
        import psutil

        return int(psutil.Process().memory_info().rss)
    except Exception:
        return None


nvml: dict[str, Any] = {}


def gpu_use() -> tuple[int | None, float | None]:
    torch = sys.modules.get("torch")
    try:
        if torch is not None and torch.cuda.is_initialized():
            device = torch.cuda.current_device()
            mem = int(torch.cuda.memory_reserved(device))
            try:
                util: float | None = float(torch.cuda.utilization(device))
            except Exception:  # needs pynvml
                util = None
            return mem, util
    except Exception:
        pass
    return _nvml_use()


def _nvml_use() -> tuple[int | None, float | None]:
    """Memory this process holds on its GPU and that GPU's utilisation, through NVML; (None,
    None) without pynvml, a driver, or a GPU. The handle is looked up once."""
    if nvml.get("failed"):
        return None, None
    try:
        if "handle" not in nvml:
            import pynvml

            pynvml.nvmlInit()
            visible = devices.physical_id() or "0"
            handle = (pynvml.nvmlDeviceGetHandleByIndex(int(visible)) if visible.isdigit()
                      else pynvml.nvmlDeviceGetHandleByUUID(visible))
            nvml.update(handle=handle, lib=pynvml)
        lib, handle = nvml["lib"], nvml["handle"]
        util = float(lib.nvmlDeviceGetUtilizationRates(handle).gpu)
        mem = None
        for proc in lib.nvmlDeviceGetComputeRunningProcesses(handle):
            if proc.pid == os.getpid():
                mem = int(proc.usedGpuMemory or 0)
        return mem, util
    except Exception:
        nvml["failed"] = True
        return None, None
