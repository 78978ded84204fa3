"""The Viceroy Jupyter kernel: an IPython kernel that is also the controller of a mesh.

python -m viceroy.kernel -f CONNECTION_FILE      (what kernel.json runs)
"""

from __future__ import annotations

from typing import Any

__all__ = ["ViceroyKernel"]


def __getattr__(name: str) -> Any:
    # Lazy: `viceroy install` should not pay for importing ipykernel.
    if name == "ViceroyKernel":
        from viceroy.kernel.kernel import ViceroyKernel

        return ViceroyKernel
    raise AttributeError(f"module 'viceroy.kernel' has no attribute {name!r}")
