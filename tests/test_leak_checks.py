"""The leak checks of tests/conftest.py judge this test run only: another run on the same machine
(a loop beside a run, a second worktree) makes and removes files of its own meshes all the time."""

import os
import shutil
import subprocess
import sys
import tempfile

import pytest

import viceroy as vr
from tests.conftest import SHARED_TEMP, leaks_fail, viceroy_temp_files


def test_the_run_has_a_temp_directory_of_its_own_that_its_processes_inherit():
    mine = tempfile.gettempdir()
    assert mine != SHARED_TEMP and os.path.isdir(mine) and os.environ["TMPDIR"] == mine
    seen = subprocess.run([sys.executable, "-c", "import tempfile; print(tempfile.gettempdir())"],
                          capture_output=True, text=True, check=True).stdout.strip()
    assert seen == mine


def test_another_runs_mesh_files_are_neither_this_tests_leak_nor_removed():
    """A mesh of another run, started while this test ran and still running after it, makes its
    socket directory in the shared temp directory. Before, the check failed this test with it
    ('test left files in the temp directory') and removed it under that mesh."""
    theirs: list[str] = []
    try:
        with leaks_fail():
            theirs.append(tempfile.mkdtemp(prefix="viceroy-", dir=SHARED_TEMP))
        assert os.path.isdir(theirs[0])
    finally:
        for path in theirs:
            shutil.rmtree(path, ignore_errors=True)

def test_a_file_of_this_run_left_behind_still_fails_and_is_removed():
    with pytest.raises(pytest.fail.Exception, match="test left files in the temp directory"), leaks_fail():
        mine = tempfile.mkdtemp(prefix="viceroy-")
    assert not os.path.exists(mine)


def test_a_mesh_keeps_its_files_in_the_runs_temp_directory():
    before = viceroy_temp_files()
    with vr.Mesh.local(gpus=1, preload=[], echo=False) as mesh:
        controller = mesh._controller
        (agent,) = controller.agent_processes()
        files = {
            os.path.dirname(controller._sockets.address_in.removeprefix("ipc://")),  # its sockets
            os.path.dirname(controller.agent_info[0]["endpoints"][0].removeprefix("ipc://")),  # the agent's
            agent._log_path,  # the agent's log
        }
        assert files <= viceroy_temp_files() - before
