"""Meshes for the data-plane tests: ranks forked from a template that imported torch."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

import viceroy as vr

pytest.importorskip("torch")

SETUP = "import os, signal, time, torch\nimport viceroy as vr\n"


@pytest.fixture
def torch_mesh(start_mesh: Callable[..., vr.Mesh]) -> Iterator[Callable[..., vr.Mesh]]:
    """``torch_mesh(gpus=4)``: a mesh whose ranks have torch, os, signal, time and vr imported."""

    def start(**dims: int) -> vr.Mesh:
        mesh = start_mesh(preload=["torch"], **dims)
        mesh.run(SETUP)
        return mesh

    yield start
