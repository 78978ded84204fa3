"""Kernels for tests run from a kernelspec in a temp dir (JUPYTER_PATH), never a global one."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator

import pytest
from kernel_harness import Kernel

from viceroy.kernel.kernelspec import write_kernel_spec


@pytest.fixture(scope="session", autouse=True)
def jupyter_path(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    root = tmp_path_factory.mktemp("jupyter")
    write_kernel_spec(root / "kernels" / "viceroy", executable=sys.executable)
    saved = os.environ.get("JUPYTER_PATH")
    os.environ["JUPYTER_PATH"] = str(root)
    yield str(root)
    if saved is None:
        os.environ.pop("JUPYTER_PATH", None)
    else:
        os.environ["JUPYTER_PATH"] = saved


@pytest.fixture
def kernel() -> Iterator[Kernel]:
    """A fresh Viceroy kernel with no mesh; shut down (and checked for leftovers) after."""
    k = Kernel()
    try:
        yield k
    finally:
        k.close()


@pytest.fixture(scope="module")
def mesh_kernel() -> Iterator[Kernel]:
    """One kernel with ``%mesh up gpus=2`` shared by a module's tests (meshes cost CPU)."""
    k = Kernel()
    try:
        k.ok("%mesh up gpus=2 --preload none", timeout=120)
        yield k
    finally:
        k.close()
