"""Meshes for the tensor-engine tests."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

import viceroy as vr


@pytest.fixture
def seeded_mesh(start_mesh: Callable[..., vr.Mesh]) -> Callable[..., vr.Mesh]:
    """``seeded_mesh(gpus=4)``: a mesh whose ranks imported torch and seeded it with their rank
    (so ``torch.randn`` differs from rank to rank, the same on every run)."""

    def start(**dims: int) -> vr.Mesh:
        mesh = start_mesh(preload=["torch"], **dims)
        mesh.run("import torch\ntorch.manual_seed(rank)")
        return mesh

    return start


@pytest.fixture(scope="module")
def mesh() -> Iterator[vr.Mesh]:
    """A 2-rank mesh that imported torch, shared by a module's tests."""
    m = vr.Mesh.local(gpus=2, preload=["torch"], echo=False)
    yield m
    m.shutdown()
