"""What a rank reports of its memory and GPU use through the "stats" query."""

from __future__ import annotations

import sys
import types

import pytest

from viceroy.runtime import resources


def test_a_rank_without_a_gpu_reports_its_rss_only(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setitem(resources.nvml, "failed", True)  # as on a machine without NVML
    use = resources.use()
    assert isinstance(use["rss"], int) and use["rss"] > 10 * 2**20
    assert use["gpu_mem"] is None and use["gpu_util"] is None


def test_gpu_use_comes_from_torch_once_it_has_initialised_cuda(monkeypatch: pytest.MonkeyPatch):
    cuda = types.SimpleNamespace(
        is_initialized=lambda: True,
        current_device=lambda: 0,
        memory_reserved=lambda device: 3 * 2**30,
        utilization=lambda device: 42,
    )
    monkeypatch.setitem(sys.modules, "torch", types.SimpleNamespace(cuda=cuda))
    assert resources.gpu_use() == (3 * 2**30, 42.0)

    def no_nvml(device: int) -> int:
        raise ModuleNotFoundError("pynvml")

    cuda.utilization = no_nvml
    assert resources.gpu_use() == (3 * 2**30, None)


def test_cuda_is_never_initialised_to_ask(monkeypatch: pytest.MonkeyPatch):
    def boom() -> int:
        raise AssertionError("asked for a device before CUDA was initialised")

    cuda = types.SimpleNamespace(is_initialized=lambda: False, current_device=boom)
    monkeypatch.setitem(sys.modules, "torch", types.SimpleNamespace(cuda=cuda))
    monkeypatch.setitem(resources.nvml, "failed", True)
    assert resources.gpu_use() == (None, None)
