"""The extension inside a plain IPython shell (no kernel, no mesh)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from IPython.core.error import UsageError
from IPython.core.interactiveshell import InteractiveShell

from viceroy.extension import current_session


@pytest.fixture
def shell() -> Iterator[InteractiveShell]:
    ip = InteractiveShell.instance()
    ip.run_line_magic("load_ext", "viceroy")
    yield ip
    ip.run_line_magic("unload_ext", "viceroy")


def test_load_ext_registers_the_magics(shell: InteractiveShell):
    assert {"mesh", "px", "autopx"} <= set(shell.magics_manager.magics["line"])
    assert {"mesh", "px"} <= set(shell.magics_manager.magics["cell"])
    assert "%%mesh [--where DIM=A:B]" in shell.magics_manager.magics["line"]["mesh"].__doc__


def test_no_mesh_means_a_usage_error_that_says_what_to_do(shell: InteractiveShell):
    with pytest.raises(UsageError, match=r"no mesh is up: start one with `%mesh up gpus=4`"):
        shell.run_cell_magic("mesh", "", "print(rank)")
    with pytest.raises(UsageError, match="no mesh is up"):
        shell.run_line_magic("autopx", "")


def test_auto_mode_turns_plain_cells_into_mesh_cells(shell: InteractiveShell):
    session = current_session(shell)
    session.state.auto = True
    try:
        assert shell.transform_cell("x = rank\n").startswith("get_ipython().run_cell_magic('mesh'")
        assert "run_line_magic('mesh', 'auto off')" in shell.transform_cell("%mesh auto off\n")
        assert shell.transform_cell("\n") == "\n"
    finally:
        session.state.auto = False
    assert shell.transform_cell("x = rank\n") == "x = rank\n"


def test_reload_ext_keeps_the_magics_working(shell: InteractiveShell):
    first = current_session(shell)
    shell.run_line_magic("reload_ext", "viceroy")
    assert current_session(shell) is not first
    with pytest.raises(UsageError, match="unknown %mesh command 'nope'"):
        shell.run_line_magic("mesh", "nope")


def test_up_sets_environment_variables_on_every_rank():
    from viceroy.extension.args import parse_command
    from viceroy.extension.session import MeshSession

    cmd = parse_command("up gpus=2 --preload none --backend gloo --env VICEROY_TEST_VAR=a=b")
    session = MeshSession(None)
    try:
        mesh = session.up(cmd.dims, backend=cmd.backend, preload=cmd.preload, env=cmd.env)
        seen = mesh.run("import os\n(os.environ['VICEROY_TEST_VAR'], os.environ['VICEROY_BACKEND'])").values()
        assert seen == [("a=b", "gloo")] * 2
    finally:
        session.close()
