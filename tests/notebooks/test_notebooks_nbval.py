"""The tutorial notebooks run clean on the Viceroy kernel (nbval, lax mode), as CI runs them."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from viceroy.kernel.kernelspec import write_kernel_spec

REPO = Path(__file__).resolve().parents[2]
NOTEBOOKS = sorted(p.name for p in (REPO / "notebooks").glob("*.ipynb"))


@pytest.mark.timeout(600)
@pytest.mark.parametrize("name", NOTEBOOKS)
def test_notebook_runs_under_nbval(name: str, tmp_path: Path):
    write_kernel_spec(tmp_path / "kernels" / "viceroy", executable=sys.executable)
    env = {**os.environ, "JUPYTER_PATH": str(tmp_path)}
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "--nbval-lax",
            "--nbval-kernel-name",
            "viceroy",
            "-p",
            "no:cacheprovider",
            "-q",
            str(REPO / "notebooks" / name),
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=540,
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    assert " passed" in result.stdout and "failed" not in result.stdout
