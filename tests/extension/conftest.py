"""Fixtures shared by the extension's tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from viceroy.extension.session import MeshSession


@pytest.fixture
def session() -> Iterator[MeshSession]:
    """A MeshSession outside IPython with a local 2-rank mesh up (no preload), closed after."""
    s = MeshSession(None)
    try:
        s.up({"gpus": 2}, preload=[])
        yield s
    finally:
        s.close()
