"""The TypeScript front end, from pytest so that `make test` and CI run it: lint (tsc strict +
eslint), the vitest unit tests, the committed anywidget ESM being current, and the wheel
shipping the labextension."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
LABEXT = REPO / "labextension"
BIN = Path(sys.executable).parent
STATIC = REPO / "viceroy" / "extension" / "static"

pytestmark = [
    pytest.mark.frontend,
    pytest.mark.skipif(
        not (LABEXT / "node_modules").is_dir(), reason="run `make frontend` first (no node_modules)"
    ),
    pytest.mark.timeout(600),
]


def jlpm(*args: str, timeout: float = 540) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PATH=f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}", CI="true")
    env.pop("NODE_OPTIONS", None)
    proc = subprocess.run(
        [str(BIN / "jlpm"), *args],
        cwd=LABEXT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert proc.returncode == 0, f"jlpm {' '.join(args)} failed:\n{proc.stdout}\n{proc.stderr}"
    return proc


def test_typescript_lint() -> None:
    """tsc --noEmit (strict) over src and tests, then eslint with no warnings."""
    jlpm("lint")


def test_typescript_unit_tests() -> None:
    out = jlpm("test").stdout
    assert " passed" in out and " failed" not in out, out


def test_widget_bundle_is_current() -> None:
    """viceroy/extension/static is what labextension/src builds to (and, in CI, what is committed:
    the build there has rewritten the files, so a stale commit shows as a diff)."""
    jlpm("check:widget")
    if os.environ.get("CI") and shutil.which("git") and (REPO / ".git").exists():
        diff = subprocess.run(
            ["git", "diff", "--stat", "HEAD", "--", str(STATIC)],
            cwd=REPO,
            capture_output=True,
            text=True,
        )
        assert diff.stdout == "", f"commit the rebuilt widget bundle:\n{diff.stdout}"


def test_wheel_ships_the_labextension(tmp_path: Path) -> None:
    """The wheel carries the labextension as shared data (with install.json) and the widget ESM
    in the package; with the build output present it needs no node (as from an sdist)."""
    if not (REPO / "viceroy" / "labextension" / "static" / "style.js").is_file():
        pytest.skip("the labextension is not built (make frontend)")
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", ".", "--no-deps", "--no-build-isolation", "-q",
         "-w", str(tmp_path)],
        cwd=REPO, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (wheel,) = tmp_path.glob("*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    data = "viceroy_kernel-0.1.0.data/data/share/jupyter/"
    ext = data + "labextensions/viceroy-labextension/"
    assert ext + "package.json" in names
    assert ext + "install.json" in names
    assert any(n.startswith(ext + "static/remoteEntry.") for n in names)
    assert data + "kernels/viceroy/kernel.json" in names
    assert "viceroy/extension/static/mesh_view.js" in names
    assert "viceroy/extension/static/mesh_view.css" in names
    assert not any(n.startswith("viceroy/labextension/") for n in names)  # only as shared data
