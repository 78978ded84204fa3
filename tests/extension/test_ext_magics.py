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


@pytest.mark.parametrize(
    ("cell", "message"),
    [
        # IPython said "Line magic function `%%mesh` not found": as if Viceroy were not loaded
        ("# train\n%%mesh\nprint(rank)\n", "%%mesh must be the cell's first line (here a comment comes before it, "
         "so IPython reads it as a line magic it does not know): move %%mesh to the top; comments go below it"),
        ("\n# a\n\n%%px --ranks 0\nx = 1\n", "%%px must be the cell's first line"),
        # IPython said "Did you mean the line magic %mesh (single %)?", which runs no code
        ("%%mesh print(rank)", "%%mesh: the cell has no code below its first line; the ranks run the lines under "
         "%%mesh, whose own line takes only options (--where, --ranks, --no-fail-fast, --timeout). For one line of "
         "code: %px CODE"),
        ("%%px\n", "%%px: the cell has no code below its first line"),
    ],
)
def test_a_misplaced_or_empty_cell_magic_says_where_the_code_goes(shell: InteractiveShell, cell: str, message: str,
                                                                  capsys: pytest.CaptureFixture[str]):
    result = shell.run_cell(cell)
    assert isinstance(result.error_before_exec, UsageError)
    assert str(result.error_before_exec).startswith(message)
    assert "\n" not in str(result.error_before_exec)
    assert capsys.readouterr().err.startswith(f"UsageError: {message}")


def test_cells_that_only_look_like_misplaced_magics_run(shell: InteractiveShell):
    assert shell.run_cell("s = \"\"\"\n%%mesh\n\"\"\"\n").success
    assert shell.user_ns["s"] == "\n%%mesh\n"
    assert shell.run_cell("%%mesh?\n").success  # help on the magic
    shell.run_line_magic("unload_ext", "viceroy")
    try:  # unloading takes the check away with the magics
        assert all(getattr(t, "__name__", "") != "check_magic_line" for t in shell.input_transformers_cleanup)
    finally:
        shell.run_line_magic("load_ext", "viceroy")


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


def test_up_takes_the_output_limit_the_notice_tells_a_notebook_to_raise(shell: InteractiveShell):
    # A rank's notice said "raise it with Mesh.local(output_limit=...)", which a notebook's
    # %mesh up had no way to: it now takes --output-limit, and the notice names it.
    shell.run_line_magic("mesh", "up gpus=1 --preload none --output-limit 100")
    try:
        mesh = current_session(shell).mesh
        assert mesh is not None
        mesh.run("for i in range(50): print('line', i)")
        notice = next(ln for ln in mesh.logs(0).splitlines() if "passed the limit" in ln)
        assert notice.startswith("[viceroy] rank 0: output of this call passed the limit of 100 bytes")
        assert "%mesh up ... --output-limit BYTES" in notice
    finally:
        shell.run_line_magic("mesh", "down")
    with pytest.raises(UsageError, match=r"^%mesh up: --output-limit takes a positive number of bytes .*, got 0;"):
        shell.run_line_magic("mesh", "up gpus=1 --output-limit 0")


def test_torch_dist_with_backend_gloo_makes_the_default_group_gloo_for_every_device():
    # It ran init_process_group() with torch's default, nccl for CUDA tensors where there are GPUs.
    from viceroy.extension.session import MeshSession

    session = MeshSession(None)
    try:
        mesh = session.up({"gpus": 2}, backend="gloo", torch_dist=True, preload=["torch"])
        assert mesh.run("import torch.distributed as dist\ndist.get_backend()").values() == ["gloo", "gloo"]
    finally:
        session.close()


def test_backend_nccl_on_ranks_without_a_gpu_is_refused_naming_them(capsys: pytest.CaptureFixture[str],
                                                                   monkeypatch: pytest.MonkeyPatch):
    # It was accepted and did nothing: CPU tensors went through gloo all the same.
    from viceroy.runtime import devices

    if devices.visible_gpus():
        pytest.skip("the ranks here have GPUs")
    from viceroy.extension.session import MeshSession

    # As for ranks on other hosts: the controller's machine may have a GPU, the ranks' none
    # (the local agent, another process, still sees none).
    monkeypatch.setattr(devices, "visible_gpus", lambda: ["0"])
    session = MeshSession(None)
    try:
        with pytest.raises(UsageError) as info:
            session.up({"hosts": 2, "gpus": 2}, backend="nccl", preload=[])
        assert str(info.value) == (
            "%mesh up --backend nccl: ranks 0-3 have no GPU, and nccl moves GPU tensors only; the mesh was "
            "stopped. Leave --backend out: collectives follow the tensor (gloo for CPU tensors; nccl for GPU "
            "tensors, where every rank has a GPU), or pass --backend gloo")
        assert session.mesh is None
        assert "stopped the previous mesh" not in capsys.readouterr().out
    finally:
        session.close()


def test_a_backend_given_through_env_is_checked_like_backend(shell: InteractiveShell):
    # --env VICEROY_BACKEND=mpi (or Gloo) was accepted and ignored: collectives followed the
    # tensor; =nccl skipped --backend nccl's check that every rank has a GPU.
    from viceroy.runtime.devices import visible_gpus

    shell.run_line_magic("mesh", "up gpus=1 --preload none")
    session = current_session(shell)
    first = session.mesh
    for line, message in [
        ("up gpus=2 --preload none --env VICEROY_BACKEND=Gloo",
         r"^%mesh up: --env VICEROY_BACKEND=Gloo names no backend; choose one with --backend gloo or --backend nccl "
         r"\(or leave both out: collectives follow the tensor\)$"),
        ("up gpus=2 --preload none --backend gloo --env VICEROY_BACKEND=nccl",
         r"^%mesh up: --backend gloo and --env VICEROY_BACKEND=nccl disagree; give --backend alone$"),
    ]:
        with pytest.raises(UsageError, match=message):
            shell.run_line_magic("mesh", line)
        assert session.mesh is first, "the refused options left the running mesh up"
    shell.run_line_magic("mesh", "up gpus=2 --preload none --env VICEROY_BACKEND=gloo")
    assert session.require().run("import os\nos.environ['VICEROY_BACKEND']").values() == ["gloo"] * 2
    if not visible_gpus():
        with pytest.raises(UsageError, match=r"^%mesh up --backend nccl: this machine has no GPU"):
            shell.run_line_magic("mesh", "up gpus=2 --preload none --env VICEROY_BACKEND=nccl")


def test_backend_nccl_on_a_machine_without_a_gpu_is_refused_before_the_running_mesh_stops():
    # The running mesh (its ranks' state) was stopped first, then the new one refused.
    from viceroy.extension.session import MeshSession
    from viceroy.runtime.devices import visible_gpus

    if visible_gpus():
        pytest.skip("this machine has GPUs")
    session = MeshSession(None)
    try:
        mesh = session.up({"gpus": 1}, preload=[])
        mesh.run("state = 42")
        with pytest.raises(UsageError) as info:
            session.up({"gpus": 2}, backend="nccl", preload=[])
        assert str(info.value) == (
            "%mesh up --backend nccl: this machine has no GPU, and nccl moves GPU tensors only; nothing was "
            "started; the mesh up (gpus=1) keeps running. Leave --backend out: collectives follow the tensor "
            "(gloo for CPU tensors; nccl for GPU tensors, where every rank has a GPU), or pass --backend gloo")
        assert session.mesh is mesh and mesh.run("state").values() == [42]
    finally:
        session.close()


def test_down_turns_auto_mode_off_and_says_so(shell: InteractiveShell, capsys: pytest.CaptureFixture[str]):
    session = current_session(shell)
    shell.run_line_magic("mesh", "up gpus=1 --preload none")
    assert capsys.readouterr().out.startswith("mesh up: gpus=1 (1 rank); `mesh` is bound to it\n")  # was "(1 ranks)"
    shell.run_line_magic("mesh", "up gpus=2 --preload none")
    assert "mesh up: gpus=2 (2 ranks); `mesh` is bound to it\n" in capsys.readouterr().out
    shell.run_line_magic("mesh", "auto on")
    capsys.readouterr()
    shell.run_line_magic("mesh", "down")
    assert capsys.readouterr().out == "mesh stopped; auto mode is off: cells run here again\n"
    assert session.auto is False
    assert shell.transform_cell("x = 1\n") == "x = 1\n", "plain cells run on the controller again"


def test_with_no_mesh_auto_mode_is_named_in_the_error_and_the_status(shell: InteractiveShell):
    from viceroy.extension.magics import MeshMagics

    session = current_session(shell)
    session.state.auto = True  # e.g. left on by a mesh that failed to come back up
    try:
        with pytest.raises(UsageError, match=r"no mesh is up.*auto mode is on.*`%mesh auto off`"):
            shell.run_cell_magic("mesh", "", "x = 1")
        magics = shell.magics_manager.registry[MeshMagics.__name__]
        assert "`%mesh auto off`" in magics.status_text().splitlines()[1]
    finally:
        session.state.auto = False
    assert magics.status_text() == "no mesh is up; start one with `%mesh up gpus=4`"


def test_values_that_cannot_travel_are_one_line_usage_errors_and_gather_is_named(shell: InteractiveShell):
    shell.run_line_magic("mesh", "up gpus=2 --preload none")
    shell.run_cell("import threading\nlock = threading.Lock()")
    with pytest.raises(UsageError, match=r"^%mesh push: lock \(lock\) cannot be sent to the ranks") as e:
        shell.run_line_magic("mesh", "push lock")
    assert "\n" not in str(e.value)
    with pytest.raises(UsageError, match=r"^%mesh push: gen \(generator\) cannot be sent"):
        shell.run_line_magic("mesh", "push gen=(i for i in range(3))")
    with pytest.raises(UsageError, match=r"^%mesh scatter: parts \(list\) cannot be sent"):
        shell.run_line_magic("mesh", "scatter parts=[threading.Lock(), threading.Lock()]")
    # A name the ranks lack was a NameError with a traceback through our wrapper's frame
    # (File "<pull nosuch cell 1>"), as if it were the user's code.
    shell.run_cell_magic("mesh", "", "if rank == 1:\n    half = 1")
    for magic in ("pull", "gather"):
        with pytest.raises(UsageError, match=rf"^%mesh {magic}: ranks 0-1 have no variable 'nosuch'$"):
            shell.run_line_magic("mesh", f"{magic} nosuch")
        with pytest.raises(UsageError, match=rf"^%mesh {magic}: rank 0 has no variable 'half'$"):
            shell.run_line_magic("mesh", f"{magic} half")
    shell.run_cell_magic("mesh", "", "def broken(): raise ValueError('no')\nclass B:\n    def __reduce__(self): broken()\nb = B()")
    with pytest.raises(Exception, match="pull b failed on 2 of 2 ranks") as failed:
        shell.run_line_magic("mesh", "pull b")  # any other failure keeps its grouped rendering
    assert "failed on 2 of 2 ranks" in failed.value._render_traceback_()[0]  # type: ignore[attr-defined]


def test_reading_a_name_the_ranks_lack_does_not_mark_them_failed(shell: InteractiveShell):
    # A typo in `%mesh pull nosuch` showed the ranks in "error" (NameError) in %mesh status and
    # the widget, as if they had failed; through the Python API too.
    import viceroy as vr
    from tests.conftest import wait_until
    from viceroy.extension.magics import MeshMagics

    shell.run_line_magic("mesh", "up gpus=2 --preload none")
    session = current_session(shell)
    shell.run_cell_magic("mesh", "", "if rank == 1:\n    half = 1")
    with pytest.raises(UsageError, match=r"^%mesh pull: ranks 0-1 have no variable 'nosuch'$"):
        shell.run_line_magic("mesh", "pull nosuch")
    with pytest.raises(UsageError, match=r"^%mesh gather: rank 0 has no variable 'half'$"):
        shell.run_line_magic("mesh", "gather half")
    with pytest.raises(vr.MeshError, match=r"^pull nosuch failed on 2 of 2 ranks\nranks 0-1: NameError: name 'nosuch' "
                                          r"is not defined$") as e:
        session.require().pull("nosuch")
    assert e.value.failures[0].exc_type == "NameError" and e.value.partial == {}
    wait_until(lambda: all(r["state"] != "running" for r in session.state.snapshot()["ranks"]), 5,
               "the reads to end in the mesh state")
    ranks = session.state.snapshot()["ranks"]
    assert [(r["state"], r["error"]) for r in ranks] == [("done", None), ("done", None)]
    status = shell.magics_manager.registry[MeshMagics.__name__].status_text()
    assert status == "mesh gpus=2: ranks 0-1 idle"  # was "ranks 0-1 error (NameError: name 'nosuch' ...)"
    assert session.require().slice(gpus=1).pull("half").values() == [1]


def test_a_mesh_that_cannot_start_is_one_usage_error_naming_the_ranks(shell: InteractiveShell, monkeypatch, tmp_path):
    # It was a traceback through the magic, the session and the launcher to the error.
    (tmp_path / "ranks_exit.py").write_text(  # preloaded by the fork server: its ranks exit at once
        "import os\n_depth = 0\n\ndef _child():\n    global _depth\n    _depth += 1\n"
        "    if _depth == 2:\n        os._exit(7)\n\nos.register_at_fork(after_in_child=_child)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(UsageError, match=r"^%mesh up: the mesh did not start: ranks? [0-9,-]+ exited while starting \(exit code 7\)"):
        shell.run_line_magic("mesh", "up gpus=2 --preload ranks_exit")
    assert current_session(shell).mesh is None


def test_a_preload_that_fails_is_one_line_in_the_cell_and_the_mesh_is_up(
    shell: InteractiveShell, capsys: pytest.CaptureFixture[str]
):
    # `%mesh up --preload nosuchmodule` said only "mesh up"; the failure went to the server's terminal.
    shell.run_line_magic("mesh", "up gpus=2 --preload nosuchmodule_xyz")
    err = capsys.readouterr().err
    assert err.startswith("%mesh up: could not preload nosuchmodule_xyz (ModuleNotFoundError: "), err
    assert err.count("\n") == 1 and "viceroy/" not in err
    assert current_session(shell).mesh is not None
    assert shell.run_cell_magic("mesh", "", "rank").values() == [0, 1]


@pytest.mark.parametrize("line", ["--help", "-h", "help", "up --help", "logs -h"])
def test_asking_for_help_prints_every_command_with_its_options(
    shell: InteractiveShell, capsys: pytest.CaptureFixture[str], line: str
):
    # `%mesh --help` said "unknown %mesh command '--help'", `%mesh up --help` "unknown option(s)"
    shell.run_line_magic("mesh", line)
    out = capsys.readouterr().out
    for usage in ("%mesh up DIM=SIZE...", "--launcher local|ssh|slurm|attach", "--env NAME=VALUE",
                  "%mesh logs RANK [--tail N]", "%mesh restart [--failed]", "%mesh auto on|off",
                  "%%mesh [--where DIM=A:B] [--ranks 0,3] [--no-fail-fast] [--timeout S]"):
        assert usage in out, (usage, out)


def test_a_bad_launcher_option_leaves_the_running_mesh_up(shell: InteractiveShell, capsys: pytest.CaptureFixture[str]):
    session = current_session(shell)
    shell.run_line_magic("mesh", "up gpus=2 --preload none")
    try:
        mesh = session.mesh
        shell.run_cell_magic("mesh", "", "x = 42")
        capsys.readouterr()
        with pytest.raises(UsageError) as e:
            shell.run_line_magic("mesh", "up gpus=2 --launcher ssh --hostfile /nonexistent.txt")
        assert str(e.value) == "%mesh up: --hostfile /nonexistent.txt: No such file or directory"
        assert "stopped the previous mesh" not in capsys.readouterr().out
        assert session.mesh is mesh and shell.user_ns["mesh"] is mesh
        assert mesh.run("x").values() == [42, 42]
    finally:
        shell.run_line_magic("mesh", "down")


@pytest.mark.parametrize(
    ("line", "message"),
    [
        # pull and gather said only "give the names to fetch, e.g. `%mesh pull t`"
        ("pull 1x", r"^%mesh pull: '1x' is not a valid Python name; give the names to fetch, e\.g\. `%mesh pull t`$"),
        ("gather part,2y", r"^%mesh gather: '2y' is not a valid Python name; give the names to join"),
        ("pull lr --ranks 0", r"^%mesh pull takes no options, got '--ranks': it reads every rank; "
                              r"for some ranks only, use the mesh, e\.g\. mesh\.select\(\[0\]\)\.pull\('lr'\)$"),
        ("gather lr --ranks 0", r"^%mesh gather takes no options, got '--ranks'.*mesh\.select\(\[0\]\)\.gather\('lr'\)$"),
        # was "give NAME=EXPRESSION or NAME, e.g. `%mesh push lr=0.1`; got '1x=3'"
        ("push 1x=3", r"^%mesh push: '1x' \(in '1x=3'\) is not a valid Python name; give NAME=EXPRESSION or NAME, "
                      r"e\.g\. `%mesh push lr=0\.1`$"),
        # was "x=1 --ranks 0 is not a Python expression (invalid syntax)"
        ("push x=1 --ranks 0", r"^%mesh push takes no options, got '--ranks': it sends to every rank; "
                               r"for some ranks only, use the mesh, e\.g\. mesh\.select\(\[0\]\)\.push\(lr=0\.1\)$"),
        # was "cannot evaluate x=1 --where here: NameError: name 'where' is not defined"
        ("scatter part=[1, 2] --where gpus=0", r"^%mesh scatter takes no options, got '--where'"),
    ],
)
def test_a_bad_name_or_option_on_a_mesh_line_is_named(shell: InteractiveShell, line: str, message: str):
    with pytest.raises(UsageError, match=message) as e:
        shell.run_line_magic("mesh", line)
    assert "\n" not in str(e.value)


def test_an_option_given_twice_is_refused_not_overridden(shell: InteractiveShell):
    # `%%mesh --ranks 0 --ranks 1` ran the cell on rank 1 alone, as --where twice is refused
    with pytest.raises(UsageError) as e:
        shell.run_cell_magic("mesh", "--ranks 0 --ranks 1", "x = rank")
    assert str(e.value) == "%%mesh: --ranks given 2 times (--ranks 0, --ranks 1); give it once, e.g. --ranks 0,1"
    with pytest.raises(UsageError) as e:
        shell.run_line_magic("px", "--ranks 0 --ranks=1 x = rank")
    assert str(e.value) == "%px: --ranks given 2 times (--ranks 0, --ranks 1); give it once, e.g. --ranks 0,1"
    with pytest.raises(UsageError, match=r"^%%px: --timeout given 2 times \(--timeout 5, --timeout 30\); give it once"):
        shell.run_cell_magic("px", "--timeout 5 --timeout 30", "x = rank")


def test_a_rank_range_past_the_mesh_is_refused_before_it_is_expanded(shell: InteractiveShell):
    # The range became a list before it was checked against the mesh: --ranks 0-3000000 took
    # seconds to refuse, 0-100000000 could raise MemoryError, and this one OverflowError.
    huge = 10**30
    with pytest.raises(UsageError) as e:  # no mesh up: bounded by the most ranks a mesh has
        shell.run_cell_magic("mesh", f"--ranks 0-{huge}", "x = rank")
    assert str(e.value) == f"--ranks: 0-{huge} goes past rank 1,048,575, the last a mesh can have; give ranks of the mesh, e.g. --ranks 0,3"
    shell.run_line_magic("mesh", "up gpus=2 --preload none")
    try:
        with pytest.raises(UsageError) as e:
            shell.run_cell_magic("mesh", f"--ranks 0-{huge}", "x = rank")
        assert str(e.value) == f"--ranks: rank(s) 2-{huge} not in this mesh (its ranks are 0-1)"
        with pytest.raises(UsageError) as e:
            shell.run_line_magic("px", "--ranks 1,0-3000000 x = rank")
        assert str(e.value) == "--ranks: rank(s) 2-3000000 not in this mesh (its ranks are 0-1)"
        assert shell.run_cell_magic("mesh", "--ranks 1", "rank").values() == [1]
    finally:
        shell.run_line_magic("mesh", "down")


def test_pushing_a_variable_the_controller_lacks_names_it(shell: InteractiveShell):
    shell.run_line_magic("mesh", "up gpus=2 --preload none")
    try:
        # was "cannot evaluate undefined_var_xyz=undefined_var_xyz here: NameError: ...", an
        # assignment the user never typed
        for magic in ("push", "scatter"):
            with pytest.raises(UsageError) as e:
                shell.run_line_magic("mesh", f"{magic} undefined_var_xyz")
            assert str(e.value) == (
                f"%mesh {magic}: there is no variable 'undefined_var_xyz' here on the controller to send; "
                f"define it first, or give a value: `%mesh {magic} undefined_var_xyz=...`"
            )
        with pytest.raises(UsageError) as e:  # an expression keeps its assignment, as typed
            shell.run_line_magic("mesh", "push y=undefined_var_xyz + 1")
        assert str(e.value) == ("%mesh push: cannot evaluate y=undefined_var_xyz + 1 here: NameError: "
                                "name 'undefined_var_xyz' is not defined")
        shell.user_ns["undefined_var_xyz"] = 7
        shell.run_line_magic("mesh", "push undefined_var_xyz")
        assert current_session(shell).require().pull("undefined_var_xyz").values() == [7, 7]
    finally:
        shell.run_line_magic("mesh", "down")


def test_restart_says_which_ranks_it_restarted_and_when_none_had_died(
    shell: InteractiveShell, capsys: pytest.CaptureFixture[str]
):
    # `%mesh restart --failed` with no dead rank printed only the status (after a failed cell:
    # "ranks 0-1 error (...)"), which read as if the restart had failed or done something.
    import os
    import signal

    from tests.conftest import wait_until

    shell.run_line_magic("mesh", "up gpus=2 --preload none")
    mesh = current_session(shell).mesh
    assert mesh is not None
    capsys.readouterr()
    shell.run_line_magic("mesh", "restart --failed")
    assert capsys.readouterr().out == (
        "no rank had died: nothing restarted (`%mesh restart` restarts every rank)\nmesh gpus=2: ranks 0-1 idle\n"
    )
    os.kill(mesh.pids()[1], signal.SIGKILL)
    wait_until(lambda: mesh.states()[1] == "dead", 10, "rank 1's death to be known")
    shell.run_line_magic("mesh", "restart --failed")
    assert capsys.readouterr().out == "restarted rank 1\nmesh gpus=2: ranks 0-1 idle\n"
    shell.run_line_magic("mesh", "restart")
    assert capsys.readouterr().out == "restarted ranks 0-1\nmesh gpus=2: ranks 0-1 idle\n"
