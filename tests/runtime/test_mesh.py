"""A local mesh driven from plain Python: running code, namespaces, sub-meshes, transfers."""

import contextlib
import os
import re
import sys
import textwrap
import threading
import time

import numpy as np
import pytest

import viceroy as vr
from tests.conftest import viceroy_temp_files, wait_running, wait_until


def test_code_returns_each_ranks_last_expression(start_mesh):
    mesh = start_mesh(gpus=4)
    assert mesh.dims == {"gpus": 4}
    vals = mesh.run("x = rank * 10\nx")
    assert isinstance(vals, vr.ValueMesh)
    assert vals.values() == [0, 10, 20, 30]
    assert vals.item(gpus=3) == 30
    assert mesh.run("y = 1").values() == [None] * 4


def test_namespaces_persist_and_predefine_rank_coords_mesh(start_mesh):
    mesh = start_mesh(hosts=1, gpus=2)
    mesh.run("counter = rank")
    mesh.run("counter += 100")
    assert mesh.run("counter").values() == [100, 101]
    assert mesh.run("coords").values() == [{"hosts": 0, "gpus": 0}, {"hosts": 0, "gpus": 1}]
    assert mesh.run("mesh").values() == [{"hosts": 1, "gpus": 2}] * 2


def test_the_ranks_mesh_is_its_dims_and_says_so_when_used_as_the_controllers(start_mesh):
    # `mesh.run(...)` in rank code (a %%mesh cell, auto mode) failed with "'dict' object has no
    # attribute 'run'", which does not say what `mesh` is there.
    mesh = start_mesh(gpus=2)
    with pytest.raises(vr.MeshError) as info:
        mesh.run("mesh.run('1')", fail_fast=False)  # every rank's own error
    assert ("ranks 0-1: AttributeError: on a rank, `mesh` is the dims of the mesh running this code "
            "({'gpus': 2}), a dict with no 'run'; mesh.run(...) is the controller's: call it in a cell without "
            "%%mesh (in auto mode, after %mesh auto off)") in str(info.value)
    # still a dict in every other way, on a view too
    assert mesh.run("mesh == {'gpus': 2}, mesh['gpus'], list(mesh), hasattr(mesh, 'run')").values() == [
        (True, 2, ["gpus"], False)] * 2
    assert mesh.split(gpus=("dp", "tp"), tp=2).run("import json\njson.dumps(mesh)").values() == ['{"dp": 1, "tp": 2}'] * 2


def test_functions_closures_and_context_travel_by_value(start_mesh):
    mesh = start_mesh(dp=2, tp=2)
    factor = 3

    def scaled(a):
        return a * factor * vr.context().rank

    assert mesh.run(scaled, 10).values() == [0, 30, 60, 90]
    assert mesh.run(lambda: vr.context().coords).item(dp=1, tp=0) == {"dp": 1, "tp": 0}
    assert mesh.run(lambda *, k: k + 1, k=1).values() == [2] * 4


def test_context_is_only_available_on_ranks():
    with pytest.raises(RuntimeError, match="only available on a rank"):
        vr.context()


def test_a_collective_called_on_the_controller_says_collectives_run_on_ranks():
    # It said only "viceroy.context() is only available on a rank", naming a call the user
    # never made.
    pytest.importorskip("torch")
    with pytest.raises(RuntimeError, match=r"so are the collectives that use it \(vr.all_reduce"):
        vr.barrier()


def test_sub_meshes_run_only_on_their_ranks(start_mesh):
    mesh = start_mesh(gpus=4)
    mesh.run("y = -1")
    sub = mesh.slice(gpus=slice(0, 2))
    assert sub.run("y = rank; y").values() == [0, 1]
    assert mesh.run("y").values() == [0, 1, -1, -1]
    assert mesh.select([3, 1]).run("rank").values() == [3, 1]
    assert mesh.split(gpus=("dp", "tp"), tp=2).slice(tp=1).run("rank").values() == [1, 3]
    assert mesh.rename(gpus="dp").run("rank").item(dp=2) == 2
    assert mesh.flatten("all").dims == {"all": 4}


def test_ranks_start_in_the_controllers_directory_with_its_path(start_mesh, tmp_path, monkeypatch):
    (tmp_path / "helper_mod_for_ranks.py").write_text("def answer():\n    return 42\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    mesh = start_mesh(gpus=2)
    assert mesh.run("import helper_mod_for_ranks, os\n(helper_mod_for_ranks.answer(), os.getcwd())").values() == [
        (42, str(tmp_path))
    ] * 2


def test_a_module_that_cannot_be_preloaded_is_a_warning_naming_it_and_the_mesh_starts(start_mesh):
    # It was a line on the controller's own stderr (a Jupyter server's terminal): a misspelled
    # preload looked like a success.
    with pytest.warns(vr.PreloadWarning, match=r"^could not preload nosuchmodule_xyz \(ModuleNotFoundError: "
                                                r"No module named 'nosuchmodule_xyz'\): .*check the name") as caught:
        mesh = start_mesh(gpus=2, preload=["json", "nosuchmodule_xyz"])
    assert len(caught) == 1 and "/viceroy/" not in caught[0].filename  # where the user started the mesh
    assert mesh.run("import json\njson.dumps(rank)").values() == ["0", "1"]


def test_ranks_read_no_stdin_and_input_says_what_to_do_instead(start_mesh):
    # Ranks are forked by a server that reads spawn requests (with the mesh's key) on its stdin:
    # none of that may be readable on a rank.
    mesh = start_mesh(gpus=3)
    assert mesh.run("import sys\nsys.stdin.read(), sys.__stdin__.read()").values() == [("", "")] * 3
    with pytest.raises(vr.MeshError) as info:
        mesh.run("input('your name? ')", fail_fast=False)  # every rank's own error
    text = str(info.value)
    assert "ranks 0-2: EOFError: input() on a rank: ranks have no terminal" in text, text
    assert "%mesh push" in text


def test_a_debugger_on_a_rank_says_why_it_quit(start_mesh):
    # breakpoint() failed the call with a bare "bdb.BdbQuit" (and bdb's frames).
    mesh = start_mesh(gpus=1)
    for code in ("x = 1\nbreakpoint()\nx", "import pdb\npdb.set_trace()"):
        with pytest.raises(vr.MeshError) as info:
            mesh.run(code)
        assert ("rank 0: bdb.BdbQuit: the debugger (breakpoint(), pdb.set_trace()) quit at once: ranks have no "
                "terminal to read its commands from. Print what you need") in str(info.value)
    assert mesh.run("'still up'").values() == ["still up"]


def test_a_password_prompt_on_a_rank_says_how_to_pass_the_secret_in(start_mesh):
    # getpass.getpass() (huggingface_hub.login(), wandb.login()) failed with a bare EOFError.
    mesh = start_mesh(gpus=1)
    with pytest.raises(vr.MeshError) as info:
        mesh.run("import getpass\ntoken = getpass.getpass('token: ')")
    assert ("rank 0: EOFError: getpass() on a rank: ranks have no terminal to read a password from. Pass the "
            "secret in instead") in str(info.value), str(info.value)
    with pytest.raises(vr.MeshError) as info:  # any other EOFError keeps its own words
        mesh.run("raise EOFError('the file ended')")
    assert "rank 0: EOFError: the file ended" in str(info.value)


def test_a_task_started_without_an_await_says_how_to_start_it(start_mesh):
    # asyncio.create_task() in a cell without `await` (it works in a notebook, whose loop always
    # runs) failed with Python's bare "no running event loop".
    mesh = start_mesh(gpus=1)
    code = "import asyncio\nasync def tick():\n    await asyncio.sleep(0)\ntask = asyncio.create_task(tick())"
    with pytest.raises(vr.MeshError, match=r"rank 0: RuntimeError: no running event loop: a rank's event loop runs "
                                           r"only while a cell awaits .* give this code an `await`"):
        mesh.run(code)
    assert mesh.run(code + "\nawait asyncio.sleep(0)\nawait task\ntask.done()").values() == [True]


def test_rank_environment_names_rank_local_rank_world_and_rendezvous(start_mesh):
    mesh = start_mesh(hosts=2, gpus=2)
    env = mesh.run("import os\n(os.environ['RANK'], os.environ['LOCAL_RANK'], os.environ['WORLD_SIZE'])")
    assert env.values() == [("0", "0", "4"), ("1", "1", "4"), ("2", "0", "4"), ("3", "1", "4")]
    rdv = mesh.run("import os\n(os.environ['MASTER_ADDR'], int(os.environ['MASTER_PORT']))").values()
    assert len(set(rdv)) == 1 and rdv[0][0] == "127.0.0.1" and rdv[0][1] > 0


def test_hosts_dim_gets_one_agent_per_host(start_mesh):
    mesh = start_mesh(hosts=2, gpus=2)
    agents = {a.proc.pid for a in mesh._controller.agent_processes()}
    assert len(agents) == 2

    def parents() -> list[int] | None:
        # A rank is forked twice, the middle process exiting at once, so that it becomes its
        # agent's child (zygote.py); until the middle is gone (on a busy machine, after the
        # rank's first call), the middle is its parent.
        ppids = mesh.run("import os\nos.getppid()").values()
        return ppids if set(ppids) <= agents else None

    ppids = wait_until(parents, 10, "every rank to be its agent's child")
    assert ppids[0] == ppids[1] != ppids[2] == ppids[3]


def test_push_and_pull_move_values_by_name(start_mesh):
    mesh = start_mesh(gpus=2)
    mesh.push(lr=0.1, arr=np.arange(1 << 16))
    assert mesh.pull("lr").values() == [0.1, 0.1]
    sums = mesh.run("int(arr.sum())").values()
    assert sums == [int(np.arange(1 << 16).sum())] * 2


def test_push_and_scatter_refuse_the_names_each_rank_holds_its_own_place_in(start_mesh):
    # mesh.push(rank=99) made every rank's `rank` 99: code reading it afterwards misbehaved.
    mesh = start_mesh(gpus=2)
    for name in ("rank", "coords", "mesh"):
        with pytest.raises(ValueError, match=f"push cannot set '{name}': each rank's namespace holds its own"):
            mesh.push(**{name: 99})
        with pytest.raises(ValueError, match=f"scatter cannot set '{name}'"):
            mesh.scatter(name, [1, 2])
    assert mesh.run("rank, coords, mesh").values() == [(0, {"gpus": 0}, {"gpus": 2}), (1, {"gpus": 1}, {"gpus": 2})]


def test_names_bound_for_a_code_string_and_pythons_own_names_are_refused_like_pushes(start_mesh):
    # mesh.run("rank", rank=7) left every rank's `rank` 7 for good; push(__builtins__=None)
    # broke every later import on the ranks (SystemError) until a restart.
    mesh = start_mesh(gpus=2)
    with pytest.raises(ValueError, match="run cannot set 'rank': each rank's namespace holds its own"):
        mesh.run("rank", rank=7)
    for name in ("__builtins__", "__name__"):
        with pytest.raises(ValueError, match=f"push cannot set '{name}': names of the form __x__ belong to Python"):
            mesh.push(**{name: None})
        with pytest.raises(ValueError, match=f"run cannot set '{name}'"):
            mesh.run("1", **{name: None})
    with pytest.raises(ValueError, match="run takes variable names, got '1x'"):
        mesh.run("1", **{"1x": 2})
    assert mesh.run("import os\nrank").values() == [0, 1]
    assert mesh.run(lambda rank: rank * 2, rank=5).values() == [10, 10], "a function's keywords are its own"


def test_pulling_a_name_the_ranks_lack_shows_no_frame_of_ours(start_mesh):
    # The error showed a traceback through File "<pull nothere cell 1>", our wrapper, as if
    # it were the user's code.
    mesh = start_mesh(gpus=2)
    for read in (mesh.pull, mesh.gather):
        with pytest.raises(vr.MeshError) as e:
            read("nothere")
        what = read.__name__
        assert str(e.value) == f"{what} nothere failed on 2 of 2 ranks\nranks 0-1: NameError: name 'nothere' is not defined"
        assert {f.exc_type for f in e.value.failures.values()} == {"NameError"}


def test_large_arrays_come_back_intact_and_writable(start_mesh):
    mesh = start_mesh(gpus=2)
    out = mesh.run("import numpy as np\nnp.full(1 << 20, rank, dtype=np.float32)")
    for r, arr in enumerate(out.values()):
        assert arr.shape == (1 << 20,) and float(arr[123]) == r
        arr[0] = 5  # writable


def test_torch_tensors_round_trip(start_mesh):
    pytest.importorskip("torch")
    mesh = start_mesh(gpus=2, preload=["torch"])
    out = mesh.run("import torch\nt = torch.ones(1024, 1024) * rank\nt")
    assert [float(t.sum()) for t in out.values()] == [0.0, 1024.0 * 1024]


def test_preload_takes_a_string_of_module_names(start_mesh):
    # A string was iterated letter by letter ("none" preloaded modules n, o, n and e).
    check = "import sys\n('colorsys' in sys.modules, 'wave' in sys.modules)"
    assert start_mesh(gpus=1, preload="colorsys, wave").run(check).values() == [(True, True)]
    assert start_mesh(gpus=1, preload="none").run(check).values() == [(False, False)]
    with pytest.raises(ValueError, match=r"preload='torch numpy': 'torch numpy' is not a module name.*preload=\['torch', 'numpy'\]"):
        vr.Mesh.local(gpus=1, preload="torch numpy")


def test_non_blocking_run_returns_a_future(start_mesh):
    mesh = start_mesh(gpus=2)
    fut = mesh.run("import time\ntime.sleep(0.3)\nrank", block=False)
    assert isinstance(fut, vr.Future) and not fut.done()
    assert fut.get(timeout=10).values() == [0, 1]
    assert fut.done() and fut.result().values() == [0, 1]


def test_futures_are_awaitable(start_mesh):
    import asyncio

    mesh = start_mesh(gpus=2)

    async def main():
        return await mesh.run("rank + 1", block=False)

    assert asyncio.run(main()).values() == [1, 2]


def test_cancelling_the_task_that_awaits_a_call_stops_it_without_holding_the_loop(start_mesh):
    # asyncio.wait_for timing out, or a task cancelled: the call is cancelled on its ranks, with
    # that reason, and the event loop goes on at once (rank 1 ignores the interrupt and would
    # hold a loop that waited for the call to end).
    import asyncio

    mesh = start_mesh(gpus=2)
    code = ("import signal, time\n"
            "if rank == 1: signal.signal(signal.SIGINT, signal.SIG_IGN)\n"
            "time.sleep(3)")
    fut = mesh.run(code, block=False)
    wait_running(mesh, "time.sleep(3)")  # rank 1's SIGINT is ignored by then

    async def main():
        task = asyncio.ensure_future(fut)
        await asyncio.sleep(0)  # the task awaits the future
        t0 = time.monotonic()
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        return time.monotonic() - t0

    assert asyncio.run(main()) < 0.5
    with pytest.raises(vr.MeshError) as err:
        fut.get(timeout=20)
    text = str(err.value)
    assert "cancelled (the task awaiting it was cancelled)" in text and "KeyboardInterrupt" not in text, text
    assert mesh.run("1").values() == [1, 1]


def test_async_code_runs_on_ranks(start_mesh):
    mesh = start_mesh(gpus=2)
    code = "import asyncio\nawait asyncio.sleep(0.01)\nrank * 2"
    assert mesh.run(code).values() == [0, 2]


def test_an_async_cell_that_raises_shows_the_users_frames_only(start_mesh):
    # The traceback began in asyncio's run_until_complete (base_events.py), where the runtime
    # runs an async cell: plumbing, not the user's code.
    mesh = start_mesh(gpus=1)
    code = "import asyncio\nasync def boom():\n    await asyncio.sleep(0.01)\n    raise KeyError(rank)\nawait boom()"
    with pytest.raises(vr.MeshError) as info:
        mesh.run(code)
    failure = info.value.failures[0]
    frames = [ln.strip() for ln in failure.traceback.splitlines() if ln.strip().startswith("File ")]
    assert [f.split(", ")[-1] for f in frames] == ["in <module>", "in boom"], failure.traceback
    # the user's own asyncio.run keeps its frames
    with pytest.raises(vr.MeshError) as info:
        mesh.run("import asyncio\nasync def f():\n    1 / 0\nasyncio.run(f())")
    assert "run_until_complete" in info.value.failures[0].traceback


def test_output_is_echoed_and_kept_per_rank(start_mesh, capfd):
    mesh = start_mesh(gpus=2, echo=True)
    mesh.run("print('hello from', rank)\nimport os\nos.write(1, b'raw fd write\\n')")
    out = capfd.readouterr().out
    assert "[0] hello from 0" in out and "[1] hello from 1" in out and "[1] raw fd write" in out
    assert mesh.logs(1).splitlines() == ["hello from 1", "raw fd write"]


def test_output_events_arrive_before_the_call_ends(start_mesh):
    mesh = start_mesh(gpus=1)
    seen = []
    mesh.subscribe(lambda ev: seen.append((time.monotonic(), ev)))
    t0 = time.monotonic()
    mesh.run("import time\nprint('early', flush=True)\ntime.sleep(1.0)")
    early = [t for t, ev in seen if ev["type"] == "output" and "early" in ev["text"]]
    finished = [t for t, ev in seen if ev["type"] == "call_finished"]
    assert early and early[0] - t0 < 0.8 and finished[0] - early[0] > 0.5


def test_published_events_reach_subscribers(start_mesh):
    mesh = start_mesh(gpus=2)
    seen = []
    unsubscribe = mesh.subscribe(lambda ev: ev["type"] == "publish" and seen.append(ev))
    mesh.run(lambda: vr.context().publish("metric", {"loss": vr.context().rank}))
    assert sorted((ev["rank"], ev["kind"], ev["data"]["loss"]) for ev in seen) == [(0, "metric", 0), (1, "metric", 1)]
    unsubscribe()


def test_states_and_pids(start_mesh):
    mesh = start_mesh(gpus=2)
    assert mesh.states() == {0: "idle", 1: "idle"}
    fut = mesh.run("import time\ntime.sleep(0.5)", block=False)
    assert mesh.states() == {0: "running", 1: "running"}
    fut.get()
    assert set(mesh.pids()) == {0, 1} and os.getpid() not in mesh.pids().values()


def test_stacks_answer_while_ranks_are_busy(start_mesh):
    mesh = start_mesh(gpus=2)
    fut = mesh.run("def deep_in_user_code():\n    import time\n    time.sleep(5)\ndeep_in_user_code()", block=False)
    wait_running(mesh)
    t0 = time.monotonic()
    stacks = mesh.stacks()
    assert time.monotonic() - t0 < 1.5
    assert all("deep_in_user_code" in s for s in stacks.values())
    mesh.interrupt()
    with pytest.raises(vr.MeshError):
        fut.get()


def test_code_a_notebook_cell_names_is_named_so_in_stacks_tracebacks_and_syntax_errors(start_mesh):
    from viceroy.runtime.file_names import CellCode

    mesh = start_mesh(gpus=2)
    # as the kernel sends a %%mesh cell's body: a blank line for the %%mesh line above it
    code = CellCode("\ndef deep():\n    import time\n    time.sleep(5)\ndeep()", "Cell In[7]")
    fut = mesh.run(code, block=False)
    wait_running(mesh, "in deep")
    stack = mesh.stacks().item(gpus=0)
    assert "Cell In[7], line 5, in <module>" in stack and "Cell In[7], line 4, in deep" in stack, stack
    mesh.interrupt()
    with pytest.raises(vr.MeshError) as failed:
        fut.get()
    assert "interrupted (at Cell In[7], line 4: time.sleep(5))" in str(failed.value), str(failed.value)
    with pytest.raises(SyntaxError) as bad:
        mesh.run(CellCode("\nx = (", "Cell In[8]"))
    assert (bad.value.filename, bad.value.lineno) == ("Cell In[8]", 2)
    assert mesh.run("x = 3\nx").values() == [3, 3]  # plain code strings are named as before


def test_shutdown_is_fast_and_final(start_mesh):
    mesh = start_mesh(gpus=4)
    pids = list(mesh.pids().values())
    t0 = time.monotonic()
    mesh.shutdown()
    assert time.monotonic() - t0 < 1.0
    from tests.conftest import live_pids, wait_until

    wait_until(lambda: not live_pids(pids), 2, "ranks to exit")
    with pytest.raises(RuntimeError, match="shut down"):
        mesh.run("1")
    # What it says of itself is true: no rank "idle", no pid that may be another process's now.
    assert mesh.states() == dict.fromkeys(range(4), "dead") and mesh.pids() == {}


def test_context_manager_shuts_down():
    with vr.Mesh.local(gpus=2, preload=[], echo=False) as mesh:
        assert mesh.run("rank").values() == [0, 1]
    assert "shut down" in repr(mesh)


def test_plain_script_can_drive_a_mesh_without_jupyter(tmp_path):
    import subprocess

    script = tmp_path / "drive.py"
    script.write_text(textwrap.dedent("""
        import sys, viceroy as vr
        with vr.Mesh.local(gpus=2, preload=[]) as mesh:
            print(mesh.run("rank * 2").values())
        print(sorted(m for m in sys.modules if m.split('.')[0] in ('IPython', 'ipykernel', 'ipywidgets', 'jupyter_client')))
    """))
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines()[-2:] == ["[0, 2]", "[]"]


def test_dims_may_be_given_as_a_dict_even_when_named_like_an_option(start_mesh):
    mesh = vr.Mesh.local({"echo": 2}, preload=[], echo=False)
    try:
        assert mesh.dims == {"echo": 2}
        assert mesh.run("coords").values() == [{"echo": 0}, {"echo": 1}]
    finally:
        mesh.shutdown()


@pytest.mark.parametrize("start", [
    lambda: vr.Mesh.local(gpus=2, startup_timout=30),
    lambda: vr.Mesh.ssh(["localhost"], gpus=2, prelaod=[]),
    lambda: vr.Mesh.slurm(hosts=1, alocation_timeout=5),
])
def test_a_misspelt_option_is_not_taken_for_a_dim(start):
    with pytest.raises(TypeError, match=r"would be a dim of the mesh; did you mean the option \w+=\? A dim really"):
        start()


def test_stacks_show_only_user_frames(start_mesh):
    mesh = start_mesh(gpus=1)
    assert "(idle: waiting for work)" in mesh.stacks().item(gpus=0)
    assert "viceroy/runtime" not in mesh.stacks().item(gpus=0)


@pytest.mark.skipif(os.path.exists("/proc/driver/nvidia/gpus"), reason="this host has GPUs")
def test_without_gpus_ranks_run_on_cpu_quietly(start_mesh, monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    mesh = start_mesh(gpus=2, echo=True)
    assert mesh.run("import os\nos.environ.get('CUDA_VISIBLE_DEVICES')").values() == [None, None]
    assert mesh.logs(0) == "" and mesh.logs(1) == ""


def test_ranks_do_not_share_random_streams(start_mesh):
    mesh = start_mesh(gpus=3)
    draws = mesh.run("import numpy as np, random\n(float(np.random.rand()), random.random())").values()
    assert len({d[0] for d in draws}) == 3 and len({d[1] for d in draws}) == 3


@pytest.mark.parametrize("timeout", [float("inf"), float("nan"), 0, -1, "5", True])
def test_a_timeout_that_is_not_positive_and_finite_is_refused_before_anything_is_sent(start_mesh, timeout):
    mesh = start_mesh(gpus=2)
    with pytest.raises(ValueError, match=rf"timeout={timeout!r}: give a positive, finite number of seconds"):
        mesh.run("x = 1", timeout=timeout)
    assert mesh.run("rank", timeout=5).values() == [0, 1]


def test_bad_arguments_to_calls_are_refused_before_anything_is_sent_or_done(start_mesh):
    mesh = start_mesh(gpus=2)
    mesh.run("state = 'kept'")
    for call, message in [
        (lambda: mesh.restart(timeout=-1), r"timeout=-1: give a positive, finite number of seconds$"),
        (lambda: mesh.restart(timeout="x"), r"timeout='x': give a positive"),
        (lambda: mesh.restart(failed_only="no"), r"failed_only='no': give True or False"),  # restarted none
        (lambda: mesh.stacks(timeout=-1), r"timeout=-1: give a positive"),
        (lambda: mesh.stats(timeout=float("nan")), r"timeout=nan: give a positive"),
        (lambda: mesh.logs(0, tail=0), r"tail=0: give a positive whole number of lines"),
        (lambda: mesh.logs(0, tail=2.5), r"tail=2\.5: give a positive whole number of lines"),
        (lambda: mesh.run("x = 1", label=5), r"label=5: give a string"),
        (lambda: mesh.run("x = 1", block=3), r"block=3: give True or False"),
        (lambda: mesh.run("x = 1", fail_fast="x"), r"fail_fast='x': give True or False"),
        (lambda: mesh.run("x = 1", block=False).get(timeout=-1), r"timeout=-1: give a positive.*or None for waiting"),
        (lambda: mesh.logs("0"), r"logs takes a rank number, e.g. mesh.logs\(0\); got '0'"),
        (lambda: mesh.run("rank").item(gpus=None), r"gpus= takes an int, got None"),
    ]:
        with pytest.raises((ValueError, TypeError), match=message):
            call()
    assert mesh.run("state").values() == ["kept", "kept"], "the refused restart restarted nothing"


def test_numpy_integers_serve_as_counts_and_ranks_and_bools_and_floats_do_not(start_mesh):
    """An int from numpy (a computed size, a loop over np.arange) is an int: it starts a mesh and
    picks a rank's log; a bool or a float is refused, saying what to give."""
    mesh = start_mesh(gpus=np.int64(2), output_limit=np.int64(64))
    mesh.slice(gpus=1).run("print('x' * 200)")
    assert "dropped" in mesh.logs(np.int64(1), tail=np.int32(3))
    for call, message in [
        (lambda: mesh.logs(0, tail=np.float64(3.0)), r"tail=np.float64\(3.0\): give a positive whole number of lines"),
        (lambda: mesh.logs(0, tail=np.True_), r"tail=np.True_: give a positive whole number of lines"),
        (lambda: mesh.logs(np.True_), r"logs takes a rank number, e.g. mesh.logs\(0\); got np.True_"),
        (lambda: mesh.logs(1.0), r"logs takes a rank number, e.g. mesh.logs\(0\); got 1.0"),
    ]:
        with pytest.raises((ValueError, TypeError), match=message):
            call()
    with pytest.raises(ValueError, match=r"output_limit=np.float64\(64.0\): give a positive whole number of bytes"):
        vr.Mesh.local(gpus=1, echo=False, output_limit=np.float64(64))


def test_numpy_and_torch_scalars_serve_as_seconds_and_their_bools_do_not(start_mesh):
    """A timeout computed with numpy or torch (``np.int64(5)``, ``np.float32(0.5)``, a 0-d tensor)
    is a number of seconds everywhere one is taken; it was refused as not a number."""
    import torch

    mesh = start_mesh(gpus=2, startup_timeout=np.int64(60))
    assert mesh.run("rank", timeout=np.int64(5)).values() == [0, 1]
    assert mesh.run("rank", timeout=torch.tensor(5.0)).values() == [0, 1]
    assert mesh.run("rank", block=False).get(timeout=np.float32(10)).values() == [0, 1]
    assert mesh.stacks(timeout=torch.tensor(3)).values()[0]
    mesh.restart(timeout=np.float64(60))
    with pytest.raises(vr.MeshError, match=r"after 0\.5 s"):  # and it is kept: the call stops
        mesh.run("import time\ntime.sleep(60)", timeout=np.float32(0.5))
    for bad in (np.True_, torch.tensor(True), np.array([1.0]), torch.tensor([1.0]), np.float32("nan")):
        with pytest.raises(ValueError, match=r"timeout=.*: give a positive, finite number of seconds"):
            mesh.run("x = 1", timeout=bad)
    assert mesh.run("rank", timeout=5).values() == [0, 1]


@pytest.mark.parametrize("bad, message", [
    ({"preload": 5}, r"preload=5: give a list of module names"),
    ({"output_limit": -5}, r"output_limit=-5: give a positive whole number of bytes"),
    ({"startup_timeout": -1}, r"startup_timeout=-1: give a positive, finite number of seconds"),
    # It was ignored: collectives followed the tensor as if it were not there.
    ({"env": {"VICEROY_BACKEND": "Gloo"}}, r"env: VICEROY_BACKEND='Gloo' names no backend: give 'gloo' \(GPU tensors "
                                           r"through gloo too\) or 'nccl' .*; %mesh up takes it as --backend gloo\|nccl$"),
])
def test_bad_start_options_are_refused_before_any_process_starts(bad, message):
    with pytest.raises((ValueError, TypeError), match=message):
        vr.Mesh.local(gpus=1, echo=False, **bad)


@pytest.mark.parametrize("dims", [4, ["gpus"], "gpus=4"])  # were "'int' object is not iterable", dict()'s words
def test_dims_that_are_not_a_mapping_are_told_how_to_be_given(dims):
    with pytest.raises(TypeError, match=r"^Mesh.local takes the dims as keywords or a dict of NAME: SIZE, e\.g\. "
                                        r"Mesh.local\(gpus=4\) or Mesh.local\(\{'gpus': 4\}\); got "):
        vr.Mesh.local(dims, echo=False)


def test_an_error_on_the_controllers_io_thread_is_reported_and_calls_still_complete(start_mesh, capfd):
    mesh = start_mesh(gpus=2)

    def broken() -> None:
        raise RuntimeError("a bug in a task")

    mesh._controller.call_soon(broken)
    assert mesh.run("rank", timeout=10).values() == [0, 1]
    err = capfd.readouterr().err
    assert "the controller's IO thread hit an error and goes on" in err and "a bug in a task" in err


def test_a_function_from_an_earlier_labelled_cell_shows_its_own_lines_in_tracebacks(start_mesh):
    # The kernel labels every cell "%%mesh": the lines of a function defined in one cell must
    # not be read from the text of a later one.
    mesh = start_mesh(gpus=1)
    mesh.run("def normalize(v):\n    total = sum(v)\n    return [x / total for x in v]", label="%%mesh")
    with pytest.raises(vr.MeshError) as info:
        mesh.run("x = 1\ny = 2\nnormalize([0, 0])", label="%%mesh")
    text = str(info.value)
    assert "return [x / total for x in v]" in text and "normalize([0, 0])" in text, text


@pytest.mark.parametrize("bad, message", [
    ({"env": {"VICEROY_MASTER_PORT": "http"}}, r"VICEROY_MASTER_PORT='http' is not a port number"),
    ({"interface": "10.255.255.1"}, r"interface='10\.255\.255\.1': .*not an address of this machine.*127\.0\.0\.1"),
])
def test_a_mesh_refused_at_the_start_leaves_nothing_behind(bad, message, monkeypatch):
    """Refused before any process starts: the error names the value at fault, and neither a
    socket directory nor the controller's IO thread stays behind."""
    for name, value in bad.get("env", {}).items():
        monkeypatch.setenv(name, value)
    before, threads = viceroy_temp_files(), set(threading.enumerate())
    with pytest.raises(ValueError, match=message):
        vr.Mesh.local(gpus=1, preload=[], interface=bad.get("interface", "127.0.0.1"))
    assert viceroy_temp_files() == before
    assert [t.name for t in set(threading.enumerate()) - threads if t.is_alive()] == []


def test_strings_that_are_not_valid_unicode_reach_the_controller(start_mesh):
    # Lone surrogates (file names os.listdir decodes with surrogateescape) in a result or an
    # error message made the answer undecodable; it was dropped and the call never ended.
    mesh = start_mesh(gpus=2)
    mesh.run("name = b'caf\\xe9.txt'.decode('utf-8', 'surrogateescape')")
    name = b"caf\xe9.txt".decode("utf-8", "surrogateescape")
    assert mesh.run("name", timeout=10).values() == [name, name]
    with pytest.raises(vr.MeshError, match="cannot parse caf"):
        mesh.run("raise ValueError(f'cannot parse {name}')", timeout=10)
    assert mesh.run(lambda n: n * 2, name, timeout=10).values() == [name * 2] * 2


def test_classes_defined_in_rank_code_work_as_in_a_script(start_mesh):
    # The namespace's module, "__mesh__", was nowhere in sys.modules: dataclasses, pickle and
    # torch.save, which look a class up by its module, failed on the ranks.
    mesh = start_mesh(gpus=2)
    mesh.run("import dataclasses, pickle\n"
             "@dataclasses.dataclass\nclass Cfg:\n    lr: float = 0.1\n"
             "class Foo:\n    pass\n"
             "assert type(pickle.loads(pickle.dumps(Foo()))) is Foo")
    # Their instances still come back to the controller, which has no __mesh__ module: by value.
    got = mesh.run("Cfg(lr=0.5 + rank)").values()
    assert [g.lr for g in got] == [0.5, 1.5] and type(got[0]).__name__ == "Cfg"
    assert "__mesh__" not in sys.modules


def test_coords_and_mesh_follow_the_view_until_the_users_code_rebinds_them(start_mesh):
    m = start_mesh(gpus=4)
    sp = m.split(gpus=("dp", "tp"), tp=2)
    assert sp.run("coords, mesh").item(dp=1, tp=0) == ({"dp": 1, "tp": 0}, {"dp": 2, "tp": 2})
    assert m.run("coords, mesh").values()[2] == ({"gpus": 2}, {"gpus": 4})  # the whole mesh's again
    # A name the user rebinds is theirs: a call on a view undid `mesh = init_device_mesh(...)`.
    sp.run("mesh = 'my device mesh'")
    assert sp.run("mesh, coords").item(dp=1, tp=0) == ("my device mesh", {"dp": 1, "tp": 0})
    assert m.run("mesh, coords").values()[2] == ("my device mesh", {"gpus": 2})


def test_a_call_after_shutdown_fails_at_once_saying_so_and_one_in_flight_says_it_ran(start_mesh):
    """Every entry point of a mesh shut down raises MeshClosedError at once, saying when it was
    shut down and how to start another; only a call already running then says "while it ran"."""
    import torch

    from tests.actors.test_actors import Counter
    from viceroy.runtime.errors import MeshClosedError

    mesh = start_mesh(gpus=2, preload=["torch"])
    counters = mesh.spawn(Counter, 0)
    with mesh.activate():
        t = torch.ones(2)
    slow = mesh.run("import time\ntime.sleep(30)", block=False)
    with mesh.activate():
        u = t * 3
    mesh.run("1", block=False)  # sends u's op, which waits behind the sleep on each rank
    wait_running(mesh, "sleep")
    mesh.shutdown()
    with pytest.raises(MeshClosedError, match=r"the mesh was shut down while this call \(mesh.run.*\) ran"):
        slow.get(timeout=5)
    after = {
        "fetch of an op in flight at shutdown": u.fetch,
        "fetch": t.fetch,
        "run": lambda: mesh.run("1"),
        "run, not blocking": lambda: mesh.run("1", block=False),
        "pull": lambda: mesh.pull("x"),
        "slice": lambda: mesh.slice(gpus=0),
        "tensor op": lambda: t + 1,
        "to_mesh": lambda: t.to_mesh(mesh),
        "spawn": lambda: mesh.spawn(Counter, 0),
        "actor call": counters.incr.call,
        "actor broadcast": counters.incr.broadcast,
    }
    for name, use in after.items():
        t0 = time.monotonic()
        with pytest.raises(MeshClosedError) as info:
            use()
        took, msg = time.monotonic() - t0, str(info.value)
        assert took < 0.5, f"{name}: failed after {took:.1f} s, not at once"
        assert "while this call" not in msg, f"{name}: {msg}"
        assert re.search(r"was shut down at \d\d:\d\d:\d\d \(\d+ s ago\), before this call; nothing was sent", msg), f"{name}: {msg}"
        assert "vr.Mesh.local(...)" in msg and "%mesh up" in msg, f"{name}: {msg}"
    with pytest.raises(MeshClosedError, match=r"actor mesh Counter \(gpus=2\) belongs to a mesh that was shut down at"):
        counters.incr.call()
    with pytest.raises(MeshClosedError, match=r"this MeshTensor \(gpus=2\) belongs to a mesh that was shut down at"):
        t + 1
    with pytest.raises(MeshClosedError, match=r"this mesh \(gpus=2\) was shut down at"):
        mesh.run("1")
