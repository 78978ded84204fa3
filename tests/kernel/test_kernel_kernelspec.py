"""Installing the kernelspec, and the `viceroy` command line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
from jupyter_client.kernelspec import KernelSpecManager

from viceroy.kernel.kernelspec import kernel_json, write_kernel_spec

REPO = Path(__file__).resolve().parents[2]


def run_cli(*args: str, timeout: float = 60, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "viceroy", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=REPO,
        **kw,
    )


def test_the_shipped_kernelspec_is_what_the_code_writes(tmp_path: Path):
    shipped = REPO / "kernelspec" / "viceroy"
    spec = json.loads((shipped / "kernel.json").read_text())
    assert spec == kernel_json()
    assert spec["argv"][0] == "python", "the server substitutes its own Python"
    assert spec["argv"][1:3] == ["-m", "viceroy.kernel"]
    write_kernel_spec(tmp_path)
    for name in ("logo-32x32.png", "logo-64x64.png", "logo-svg.svg"):
        assert (shipped / name).read_bytes() == (tmp_path / name).read_bytes(), name


def test_viceroy_install_prefix_writes_a_spec_jupyter_finds(tmp_path: Path):
    result = run_cli("install", "--prefix", str(tmp_path))
    assert result.returncode == 0, result.stderr
    spec_dir = tmp_path / "share" / "jupyter" / "kernels" / "viceroy"
    assert str(spec_dir) in result.stdout
    spec = json.loads((spec_dir / "kernel.json").read_text())
    assert spec["argv"][0] == sys.executable
    found = KernelSpecManager(kernel_dirs=[str(spec_dir.parent)]).get_kernel_spec("viceroy")
    assert found.display_name == "Viceroy" and found.language == "python"


def test_install_locations_are_mutually_exclusive():
    result = run_cli("install", "--user", "--sys-prefix")
    assert result.returncode == 2
    assert "not allowed with argument" in result.stderr


def test_the_cli_lists_its_subcommands():
    result = run_cli("--help")
    assert result.returncode == 0
    for name in ("install", "demo", "agent"):
        assert name in result.stdout


def test_viceroy_agent_is_the_runtime_agent_entry_point():
    result = run_cli("agent", input="")
    assert result.returncode != 0
    assert "viceroy agent: expected a configuration line on stdin" in result.stderr


@pytest.mark.timeout(180)
def test_viceroy_demo_runs_a_notebook_headlessly_and_prints_its_outputs(tmp_path: Path):
    nb = nbformat.v4.new_notebook()
    nb.cells = [
        nbformat.v4.new_code_cell("%mesh up gpus=2 --preload none"),
        nbformat.v4.new_code_cell("%%mesh\nprint('demo says hi')"),
        nbformat.v4.new_code_cell("%mesh down"),
    ]
    path = tmp_path / "tiny.ipynb"
    nbformat.write(nb, path)
    env = {**os.environ, "JUPYTER_PATH": ""}  # the demo brings its own kernelspec
    result = run_cli("demo", str(path), timeout=150, env=env)
    assert result.returncode == 0, result.stdout + result.stderr
    assert ">>> %%mesh" in result.stdout
    assert "[0-1] demo says hi" in result.stdout


def test_the_wheel_ships_the_kernelspec_as_shared_data_and_the_quickstart(tmp_path: Path):
    """`pip install .` then installs the kernelspec with no extra step."""
    import subprocess
    import sys
    import zipfile

    repo = Path(__file__).resolve().parents[2]
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(tmp_path), str(repo)],
        check=True,
        timeout=300,
    )
    (wheel,) = tmp_path.glob("viceroy_kernel-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert any(n.endswith(".data/data/share/jupyter/kernels/viceroy/kernel.json") for n in names)
    assert "viceroy/runtime/mesh.py" in names
    # `viceroy demo` finds the quickstart in an installed wheel, where no notebooks/ lies beside it.
    assert "viceroy/kernel/notebooks/01-quickstart.ipynb" in names


def test_the_demo_prints_nothing_for_a_display_without_data():
    from viceroy.kernel.demo import _output_text

    assert _output_text({"output_type": "display_data", "data": {}, "metadata": {}}) == ""
    assert _output_text({"output_type": "display_data", "data": {"text/html": "<b>"}}) == "<text/html>\n"
    assert _output_text({"output_type": "execute_result", "data": {"text/plain": "3"}}) == "3\n"
