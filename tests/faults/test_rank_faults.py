"""Faults on ranks: a raise, a SIGKILL, an interrupt. Each breaks something real."""

import os
import pathlib
import signal
import subprocess
import sys
import threading
import time
from collections import deque

import psutil
import pytest
import zmq

import viceroy as vr
from tests.conftest import live_pids, wait_running, wait_until

# Rank code whose rank 1 then holds its output reader: what it prints is sent by nobody, so
# only the rank's pipes, which its agent reads out after a death, can save it.
_RANK_1_READER_HELD = (
    "import gc, os, signal, sys, threading, time\nfrom viceroy.runtime import output\n"
    "capture = next(o for o in gc.get_objects() if isinstance(o, output.OutputCapture))\n"
    "if rank == 1:\n    capture._sending.acquire()\n"
)


def test_one_rank_raising_fails_the_call_fast_and_interrupts_the_others(start_mesh):
    mesh = start_mesh(gpus=4)
    mesh.run("keep = rank")
    code = "import time\nif rank == 2:\n    time.sleep(0.2)\n    raise ValueError('bad shard ' + str(rank))\ntime.sleep(60)"
    t0 = time.monotonic()
    with pytest.raises(vr.MeshError) as info:
        mesh.run(code)
    assert time.monotonic() - t0 < 2.0
    err = info.value
    text = str(err)
    assert "rank 2: ValueError: bad shard 2" in text
    assert "raise ValueError('bad shard ' + str(rank))" in text  # the user's own source line
    assert "ranks 0-1,3: stopped by fail-fast after rank 2 failed" in text
    assert "viceroy/runtime" not in text  # none of our plumbing
    assert {r: f.kind for r, f in err.failures.items()} == {0: "interrupted", 1: "interrupted", 2: "error", 3: "interrupted"}
    assert mesh.run("keep").values() == [0, 1, 2, 3]  # the next run works, state intact


def test_identical_failures_are_grouped_by_rank_set(start_mesh):
    mesh = start_mesh(gpus=4)
    with pytest.raises(vr.MeshError) as info:
        mesh.run("1 / (rank - rank)", fail_fast=False)  # every rank gets to raise
    text = str(info.value)
    assert text.count("ZeroDivisionError: division by zero") == 2  # summary line + traceback tail, once
    assert "ranks 0-3: ZeroDivisionError" in text


def test_without_fail_fast_the_others_finish(start_mesh):
    mesh = start_mesh(gpus=3)
    with pytest.raises(vr.MeshError) as info:
        mesh.run("import time\nif rank == 0: raise KeyError('k')\ntime.sleep(0.3)\nrank", fail_fast=False)
    assert info.value.partial == {1: 1, 2: 2}


def test_sigkilled_rank_fails_the_call_within_a_second_and_restarts_alone(start_mesh):
    mesh = start_mesh(gpus=4)
    mesh.run("state = rank * 100")
    fut = mesh.run("import time\ntime.sleep(60)", block=False)
    victim = mesh.pids()[1]
    wait_running(mesh, "time.sleep(60)")
    t0 = time.monotonic()
    os.kill(victim, signal.SIGKILL)
    with pytest.raises(vr.MeshError) as info:
        fut.get(timeout=5)
    assert time.monotonic() - t0 < 1.0
    text = str(info.value)
    assert "rank 1: died (SIGKILL)" in text and "restart(failed_only=True)" in text
    assert mesh.degraded and mesh.states()[1] == "dead"
    with pytest.raises(vr.MeshError, match=r"failed on 1 of 4 ranks\nrank 1: dead \(SIGKILL\) before the call"):
        mesh.run("1")
    t0 = time.monotonic()
    mesh.restart(failed_only=True)
    assert time.monotonic() - t0 < 3.0
    assert mesh.pids()[1] != victim
    assert mesh.run("state if rank != 1 else 'fresh'").values() == [0, "fresh", 200, 300]


def test_a_rank_exiting_by_itself_is_reported_with_its_code(start_mesh):
    mesh = start_mesh(gpus=2)
    with pytest.raises(vr.MeshError, match=r"rank 1: died \(exit code 3\)"):
        mesh.run("import os\nif rank == 1: os._exit(3)")


def test_interrupt_stops_busy_loops_on_every_rank_within_a_second(start_mesh):
    mesh = start_mesh(gpus=4)
    fut = mesh.run("while True:\n    pass", block=False)
    wait_running(mesh)
    t0 = time.monotonic()
    mesh.interrupt()
    with pytest.raises(vr.MeshError) as info:
        fut.get(timeout=2)
    assert time.monotonic() - t0 < 1.0
    assert {f.kind for f in info.value.failures.values()} == {"interrupted"}
    assert mesh.run("rank").values() == [0, 1, 2, 3]


def test_interrupt_gets_through_code_that_swallows_keyboard_interrupt(start_mesh):
    mesh = start_mesh(gpus=1)
    code = "import time\ncaught = 0\ntry:\n    time.sleep(30)\nexcept KeyboardInterrupt:\n    caught += 1\ntime.sleep(30)"
    fut = mesh.run(code, block=False)
    wait_running(mesh, "line 4,")  # inside the try
    mesh.interrupt()
    with pytest.raises(vr.MeshError):
        fut.get(timeout=3)
    assert mesh.run("caught").values() == [1]


def test_an_interrupt_never_cuts_a_message_in_half(start_mesh):
    # A rank that sends all the time (displays, actor requests): the interrupt lands while a
    # message is on its way out. Half a message garbled the next one, the call's result
    # among them, so the call waited out its grace and its ranks were given up on.
    mesh = start_mesh(gpus=2)
    code = "from viceroy.runtime import context\nctx = context.context()\nwhile True:\n    ctx._publish('noise', {'x': 1})"
    for i in range(12):
        fut = mesh.run(code, block=False)
        wait_running(mesh, "ctx._publish")
        time.sleep(0.01 * (i % 4))
        t0 = time.monotonic()
        mesh.interrupt()
        with pytest.raises(vr.MeshError, match="interrupted") as info:
            fut.get(timeout=5)
        assert time.monotonic() - t0 < 3, f"try {i}: {info.value}"
        assert "did not stop" not in str(info.value)
        assert mesh.run("rank", timeout=5).values() == [0, 1]
    assert mesh.stats()["controller"]["dropped"] == 0


@pytest.mark.parametrize("dims", [{"gpus": 2}, {"hosts": 2, "gpus": 1}], ids=["direct", "relayed"])
def test_an_interrupt_on_the_controller_never_cuts_a_message_in_half(start_mesh, monkeypatch, dims):
    # The kernel's stop button raises KeyboardInterrupt wherever the controller's main thread
    # is, inside sending a call too. Half a message sent would garble the next one. Here the
    # button is pressed (SIGINT) on the main thread right after the first frame of a message
    # (ZeroMQ, to agents) or the first buffer of it (a local link, straight to the ranks).
    from viceroy.runtime import links, multipart

    mesh = start_mesh(**dims)
    send_frame, write, pressed = multipart._send, links.write, []

    def press() -> None:
        if threading.current_thread() is threading.main_thread() and not pressed:
            pressed.append(1)
            signal.raise_signal(signal.SIGINT)

    def send_frame_then_sigint(sock, frame, flags, copy, track):
        send_frame(sock, frame, flags, copy, track)
        if flags & zmq.SNDMORE:
            press()

    def write_head_then_sigint(sock, bufs):
        write(sock, deque([bufs.popleft()]))
        press()
        write(sock, bufs)

    monkeypatch.setattr(multipart, "_send", send_frame_then_sigint)
    monkeypatch.setattr(links, "write", write_head_then_sigint)
    for _ in range(3):
        pressed.clear()
        with pytest.raises(KeyboardInterrupt):
            mesh.run("x = 1", block=False)
        assert pressed
    monkeypatch.setattr(multipart, "_send", send_frame)
    monkeypatch.setattr(links, "write", write)
    assert mesh.run("rank", timeout=5).values() == [0, 1]
    wait_until(lambda: not mesh._controller._calls, 10, f"calls left: {list(mesh._controller._calls)}")
    stats = mesh.stats()
    assert [r["dropped"] for r in [*stats["ranks"].values(), *stats["agents"].values()]] == [0] * (2 + len(stats["agents"]))


def test_a_call_sent_as_the_stop_button_lands_is_stopped_on_the_ranks(start_mesh, monkeypatch):
    # The interrupt comes while the call is being sent: the caller gets KeyboardInterrupt, not
    # the future, so the call must not go on running on the ranks with nobody to stop it.
    mesh = start_mesh(gpus=2)
    controller = mesh._controller
    send = controller._to_ranks

    def send_then_sigint(*args, **kwargs):
        send(*args, **kwargs)
        signal.raise_signal(signal.SIGINT)  # the kernel's interrupt, mid-send

    monkeypatch.setattr(controller, "_to_ranks", send_then_sigint)
    with pytest.raises(KeyboardInterrupt):
        mesh.run("import time\ntime.sleep(30)", block=False)
    monkeypatch.setattr(controller, "_to_ranks", send)
    t0 = time.monotonic()
    assert mesh.run("rank", timeout=5).values() == [0, 1]
    assert time.monotonic() - t0 < 2
    assert not controller._calls


def test_timeout_cancels_the_call(start_mesh):
    mesh = start_mesh(gpus=2)
    t0 = time.monotonic()
    with pytest.raises(vr.MeshError, match=r"timed out after 0\.5 s"):
        mesh.run("import time\ntime.sleep(30)", timeout=0.5)
    assert time.monotonic() - t0 < 2.0


def test_keyboard_interrupt_on_the_controller_interrupts_the_ranks(start_mesh):
    mesh = start_mesh(gpus=2)
    main = threading.get_ident()
    threading.Timer(0.3, lambda: signal.pthread_kill(main, signal.SIGINT)).start()
    t0 = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        mesh.run("while True:\n    pass")
    assert time.monotonic() - t0 < 1.5
    assert mesh.states() == {0: "idle", 1: "idle"}  # the ranks stopped, not just the waiting
    assert mesh.run("rank").values() == [0, 1]


def test_syntax_error_is_raised_here_and_nothing_is_sent(start_mesh):
    mesh = start_mesh(gpus=2)
    seen = []
    mesh.subscribe(seen.append)
    with pytest.raises(SyntaxError):
        mesh.run("x = = 1")
    assert seen == []


def test_unpicklable_argument_is_named(start_mesh):
    mesh = start_mesh(gpus=1)
    with pytest.raises(TypeError, match=r"argument 1 \(lock\) cannot be sent to the ranks"):
        mesh.run(lambda a, b: None, 1, threading.Lock())


def test_unpicklable_result_is_a_clear_rank_error(start_mesh):
    mesh = start_mesh(gpus=1)
    with pytest.raises(vr.MeshError, match=r"the result \(lock\) cannot be sent back"):
        mesh.run("import threading\nthreading.Lock()")
    assert mesh.run("1").values() == [1]


def test_bad_dims_and_indexes_explain_themselves(start_mesh):
    with pytest.raises(ValueError, match="must be a positive int, got 0"):
        vr.Mesh.local(gpus=0)
    mesh = start_mesh(gpus=2)
    with pytest.raises(ValueError, match="its dims are: gpus"):
        mesh.slice(hosts=0)
    with pytest.raises(IndexError, match="has size 2"):
        mesh.slice(gpus=5)


def test_sys_exit_on_a_rank_is_an_error_not_a_death(start_mesh):
    # It said only "SystemExit: 2", which reads as a failure without saying what happened.
    mesh = start_mesh(gpus=1)
    mesh.run("kept = 'state'")
    with pytest.raises(vr.MeshError, match=r"rank 0: SystemExit: exit\(2\) ends only the call on a rank: the rank "
                                           r"stays up, its state kept; to end the ranks, shut the mesh down"):
        mesh.run("import sys\nsys.exit(2)")
    with pytest.raises(vr.MeshError, match=r"rank 0: SystemExit: exit\(\) ends only the call"):
        mesh.run("exit()")
    assert mesh.run("kept").values() == ["state"]


def test_killed_agent_marks_its_ranks_dead(start_mesh):
    mesh = start_mesh(hosts=2, gpus=1)
    agent = mesh._controller.agent_processes()[1]
    rank_pid = mesh.pids()[1]
    fut = mesh.run("import time\ntime.sleep(60)", block=False)
    os.kill(agent.proc.pid, signal.SIGKILL)
    with pytest.raises(vr.MeshError, match="agent on host 1 exited"):
        fut.get(timeout=5)
    wait_until(lambda: not live_pids([rank_pid]), 5, "the orphaned rank to exit via its lifeline")


def test_cancelling_an_awaiting_task_interrupts_the_ranks(start_mesh):
    import asyncio

    mesh = start_mesh(gpus=2)

    async def main():
        task = asyncio.ensure_future(mesh.run("while True:\n    pass", block=False))
        await asyncio.sleep(0.3)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
    wait_until(lambda: mesh.states() == {0: "idle", 1: "idle"}, 2, "the ranks to stop")
    assert mesh.run("rank").values() == [0, 1]


ASYNC_CELL = (
    "import asyncio\nlog = []\n"
    "try:\n    await asyncio.sleep(30)\n    log.append('resumed')\n"
    "except asyncio.CancelledError:\n    log.append('cancelled')\n    raise\n"
    "finally:\n    log.append('finally')\n"
)


@pytest.mark.parametrize("how", ["interrupt", "timeout"])
def test_async_code_interrupted_while_it_awaits_is_cancelled_there_and_never_resumes(start_mesh, how):
    # The interrupt landed in the loop's wait and left the task pending on the rank's loop:
    # its cleanup did not run, and the next async call resumed it ("resumed" in a later cell).
    mesh = start_mesh(gpus=2)
    fut = mesh.run(ASYNC_CELL, block=False, timeout=1.5 if how == "timeout" else None)
    wait_running(mesh, "await asyncio.sleep(30)")  # the stacks show the line it awaits at
    if how == "interrupt":
        mesh.interrupt()
    with pytest.raises(vr.MeshError) as info:
        fut.get(timeout=10)
    for failure in info.value.failures.values():
        assert "line 4: await asyncio.sleep(30)" in failure.summary, failure.summary
    assert mesh.run("log").values() == [["cancelled", "finally"]] * 2
    mesh.run("import asyncio\nawait asyncio.sleep(0.2)")
    assert mesh.run("log").values() == [["cancelled", "finally"]] * 2


def test_errors_in_functions_sent_by_value_show_the_users_file_and_line(start_mesh, tmp_path):
    import textwrap

    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent("""
        import viceroy as vr

        def step(x):
            return x / (x - x)  # the line users must see

        with vr.Mesh.local(gpus=1, preload=[], echo=False) as mesh:
            try:
                mesh.run(step, 1)
            except vr.MeshError as e:
                print(e)
    """))
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60)
    assert f'File "{script}", line 5, in step' in out.stdout, out.stdout + out.stderr
    assert "return x / (x - x)  # the line users must see" in out.stdout


def test_a_rank_deaf_to_the_interrupt_counts_as_running_until_it_answers(start_mesh):
    mesh = start_mesh(gpus=2)
    deaf = ("import signal, time\n"
            "if rank == 1:\n"
            "    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})\n"
            "    time.sleep(3)\n"
            "    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})")
    fut = mesh.run(deaf, block=False)
    wait_running(mesh.slice(gpus=1), "time.sleep")
    mesh.interrupt()
    with pytest.raises(vr.MeshError, match="did not stop within"):
        fut.get(timeout=10)
    assert mesh.states() == {0: "idle", 1: "running"}  # the call is over, rank 1 is not
    wait_until(lambda: mesh.states()[1] == "idle", 10, "rank 1 to answer late")
    assert mesh.run("rank").values() == [0, 1]


def test_an_interrupt_while_the_mesh_starts_leaves_no_process_behind(tmp_path, monkeypatch):
    # The stop button pressed during `%mesh up`: ranks still importing what they preload.
    (tmp_path / "slow_to_import.py").write_text("import time\ntime.sleep(60)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    me, main, started = psutil.Process(), threading.get_ident(), []

    def press_once_processes_are_up() -> None:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            kids = me.children(recursive=True)
            if len(kids) >= 2:  # the agent and its fork server
                started.extend(p.pid for p in kids)
                signal.pthread_kill(main, signal.SIGINT)
                return
            time.sleep(0.02)

    threading.Thread(target=press_once_processes_are_up, daemon=True).start()
    with pytest.raises(KeyboardInterrupt):
        vr.Mesh.local(gpus=2, preload=["slow_to_import"], echo=False)
    assert started
    wait_until(lambda: not live_pids(started), 5, f"the mesh's processes {started} to exit")


def test_restarting_ranks_busy_in_a_call_ends_the_call_and_leaves_them_idle(start_mesh):
    # The new process's hello (straight to the controller) and the agent's word that the old
    # one exited race; whichever comes first, the restart returns with every rank idle, the
    # interrupted call fails as restarted, and nothing later marks the ranks "starting" again.
    mesh = start_mesh(gpus=4)
    for _ in range(6):
        fut = mesh.run("import time\ntime.sleep(30)", block=False)
        wait_running(mesh, "time.sleep(30)")
        mesh.restart(timeout=10)
        with pytest.raises(vr.MeshError) as info:
            fut.get(timeout=5)
        assert "died" in str(info.value) or "restarted" in str(info.value), str(info.value)
        assert mesh.run("rank", timeout=10).values() == [0, 1, 2, 3]
        wait_until(lambda: set(mesh.states().values()) == {"idle"} and len(mesh.pids()) == 4, 3,
                   f"every rank idle with a pid, not {mesh.states()} {mesh.pids()}")


def test_ranks_that_exit_while_starting_fail_the_start_at_once_saying_why(monkeypatch, tmp_path):
    # Preloaded by the fork server, this makes every rank it forks (its grandchildren: each
    # rank is forked twice) exit at once.
    (tmp_path / "ranks_exit.py").write_text(
        "import os\n_depth = 0\n\ndef _child():\n    global _depth\n    _depth += 1\n"
        "    if _depth == 2:\n        os._exit(7)\n\nos.register_at_fork(after_in_child=_child)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    t0 = time.monotonic()
    with pytest.raises(RuntimeError, match=r"did not start: ranks? [0-9,-]+ exited while starting \(exit code 7\)"):
        vr.Mesh.local(gpus=2, preload=["ranks_exit"], echo=False, startup_timeout=20)
    assert time.monotonic() - t0 < 10


def test_a_rank_that_dies_while_restarting_ends_the_restart_at_once_with_its_traceback(start_mesh):
    """A restarted rank that exits before it is up (here its link to the controller is gone, as
    when a cleaner empties the run directory) fails mesh.restart at once, not after the whole
    timeout, with the traceback it printed; once the cause is gone a restart brings it back."""
    mesh = start_mesh(gpus=2)
    mesh.run("keep = rank\nprint('said by the old process')")
    path = mesh._controller._sockets.address_links
    os.rename(path, path + ".away")
    t0 = time.monotonic()
    with pytest.raises(RuntimeError) as info:
        mesh.select([1]).restart(timeout=60)
    assert time.monotonic() - t0 < 10
    text = str(info.value)
    assert text.startswith("rank 1 exited while restarting (exit code 1); mesh.restart(failed_only=True) tries again")
    assert "rank 1's last output:" in text and "FileNotFoundError" in text
    assert "said by the old process" not in text  # only what the new process printed
    assert mesh.states() == {0: "idle", 1: "dead"}
    assert mesh.select([0]).run("keep").values() == [0]  # the other rank is untouched
    os.rename(path + ".away", path)
    mesh.restart(failed_only=True, timeout=60)
    assert mesh.states() == {0: "idle", 1: "idle"}
    assert mesh.run("rank").values() == [0, 1]


def test_an_env_name_no_process_can_hold_is_refused_before_anything_starts():
    with pytest.raises(ValueError, match=r"env: 'BAD=NAME' is not an environment variable name"):
        vr.Mesh.local(gpus=1, env={"BAD=NAME": "x"}, echo=False)


@pytest.mark.parametrize(("env", "error", "message"), [
    ({"N": 5}, TypeError, "env: the value of N is 5, not a string: give the text the variable holds, e.g. env={'N': '5'}"),
    ({"DEBUG": None}, TypeError, "env: the value of DEBUG is None, not a string"),  # the ranks read "None"
    ({"P": pathlib.PurePosixPath("/x")}, TypeError, "env: the value of P is PurePosixPath('/x'), not a string"),
    (["A=1"], TypeError, "env=['A=1']: give a dict of variable names and values"),
])
def test_env_values_that_are_not_strings_are_refused_before_anything_starts(monkeypatch, env, error, message):
    # A value was str()-ed on the ranks (None -> "None"), or failed to travel once hosts were
    # starting (a path: "not JSON serializable"); a list was "dictionary update sequence ...".
    def refuse(*args, **kwargs):
        raise AssertionError("a controller was made before the env was refused")

    monkeypatch.setattr("viceroy.runtime.starting.Controller", refuse)
    with pytest.raises(error) as info:
        vr.Mesh.local(gpus=1, env=env, echo=False)
    assert str(info.value).startswith(message), str(info.value)


@pytest.mark.parametrize(("kwargs", "error", "message"), [
    ({"launcher": "ssh"}, TypeError, "launcher='ssh': give a Launcher object, or start through Mesh.ssh"),  # AttributeError
    ({"echo": "no"}, TypeError, "echo='no': give True or False"),  # it echoed
])
def test_bad_local_options_are_refused_before_anything_starts(monkeypatch, kwargs, error, message):
    def refuse(*args, **kwargs):
        raise AssertionError("a controller was made before the options were refused")

    monkeypatch.setattr("viceroy.runtime.starting.Controller", refuse)
    with pytest.raises(error) as info:
        vr.Mesh.local(gpus=1, preload=[], **kwargs)
    assert str(info.value).startswith(message), str(info.value)


def test_env_may_be_any_mapping_of_strings(start_mesh):
    import types

    mesh = start_mesh(gpus=1, env=types.MappingProxyType({"VICEROY_TEST_ENV": "yes"}))
    assert mesh.run("import os; os.environ['VICEROY_TEST_ENV']").values() == ["yes"]


def test_what_a_rank_wrote_just_before_it_died_still_arrives(start_mesh):
    # The rank's own reader cannot send it (held here, as a crash would stop it); the agent
    # reads it out of the rank's pipes after the death, before it reports the exit.
    mesh = start_mesh(gpus=2)
    events = []
    mesh.subscribe(events.append)
    code = _RANK_1_READER_HELD + "    os.write(2, b'last words\\n')\n    os._exit(3)\n"
    with pytest.raises(vr.MeshError, match="rank 1: died"):
        mesh.run(code, timeout=10)
    kinds = [(e["type"], e.get("rank"), e.get("text", "").strip()) for e in events if e.get("rank") == 1]
    assert ("output", 1, "last words") in kinds, kinds
    assert kinds.index(("output", 1, "last words")) < [k[0] for k in kinds].index("rank_exit")
    assert "last words" in mesh.logs(1)


# On rank 1, the reader thread, once it has taken what the fd-level pipes hold, waits 0.3 s
# before it sends it (`taken` is set then): a kill in that window caught it holding the lines.
_RANK_1_READER_SLOW = (
    "import gc, os, signal, sys, threading, time\nfrom viceroy.runtime import output\n"
    "capture = next(o for o in gc.get_objects() if isinstance(o, output.OutputCapture))\n"
    "taken = threading.Event()\n"
    "def slow_take(ready, take=capture._take_pipes):\n"
    "    take(ready)\n"
    "    if threading.current_thread().name == 'viceroy-output':\n"
    "        taken.set()\n        time.sleep(0.3)\n"
    "if rank == 1:\n    capture._take_pipes = slow_take\n"
)


@pytest.mark.parametrize("dims", [{"gpus": 2}, {"hosts": 2, "gpus": 1}], ids=["direct", "relayed"])
def test_a_line_printed_with_flush_just_before_a_kill_still_arrives(start_mesh, dims):
    # print(..., flush=True) once wrote the line into the rank's pipes for the agent to read out
    # after a death; but the reader may take it out of them first, and the kill came before it
    # sent it on (CI lost the line so). Now the flush sends it. If the reader takes it here, the
    # kill lands while it holds the line.
    mesh = start_mesh(**dims)
    events = []
    mesh.subscribe(events.append)
    code = (_RANK_1_READER_SLOW + "    print('last words', flush=True)\n    taken.wait(0.5)\n"
            "    os.kill(os.getpid(), signal.SIGKILL)\n")
    with pytest.raises(vr.MeshError, match=r"rank 1: died \(SIGKILL\)"):
        mesh.run(code, timeout=10)
    said = "".join(e.get("text", "") for e in events if e.get("type") == "output" and e.get("rank") == 1)
    assert "last words" in said, events
    assert "last words" in mesh.logs(1)


def test_lines_printed_just_before_os_exit_arrive_without_a_flush(start_mesh):
    # A plain print waits up to 2 ms in the rank's queue for lines to go out with it; os._exit
    # right after took it along. The rank's reader is held here, so only os._exit can save it.
    mesh = start_mesh(gpus=2)
    code = (_RANK_1_READER_HELD + "    print('last words')\n    print('on stderr', file=sys.stderr)\n"
            "    sys.stdout.write('unfinished')\n    os._exit(3)\n")
    with pytest.raises(vr.MeshError, match=r"rank 1: died \(exit code 3\)"):
        mesh.run(code, timeout=10)
    wait_until(lambda: "unfinished" in mesh.logs(1), 5, "rank 1's last output in its log")
    assert mesh.logs(1).splitlines() == ["last words", "on stderr", "unfinished"]


def test_fd_level_output_the_reader_took_but_had_not_sent_at_os_exit_arrives(start_mesh):
    # os._exit wrote the queue into the pipes and exited; lines the reader had just taken out
    # of them, not sent yet, went with the process. The exit now waits for the reader's send.
    mesh = start_mesh(gpus=2)
    code = (_RANK_1_READER_SLOW + "    os.write(1, b'last words\\n')\n"
            "    assert taken.wait(5), 'the reader never took the line'\n    os._exit(3)\n")
    with pytest.raises(vr.MeshError, match=r"rank 1: died \(exit code 3\)"):
        mesh.run(code, timeout=10)
    wait_until(lambda: "last words" in mesh.logs(1), 5, "rank 1's last words in its log")


def test_what_a_direct_rank_sent_on_its_link_before_dying_goes_before_its_death(start_mesh):
    # A rank on the controller's host sends its output on its own link; its agent reports its
    # death on ZeroMQ. The controller read ZeroMQ first, so a death reported in the same IO
    # round as the rank's last words was handled without them: "died (SIGABRT)", no cause
    # (gloo's last words say it), and the words came after the death. The controller's IO
    # thread is held here until the rank is gone and its agent has said so.
    mesh = start_mesh(gpus=2)
    pid = mesh.pids()[1]
    controller = mesh._controller
    pull = controller._sockets._pull

    def hold() -> None:  # on the IO thread
        deadline = time.monotonic() + 10
        while psutil.pid_exists(pid) and time.monotonic() < deadline:
            time.sleep(0.01)
        while not pull.get(zmq.EVENTS) & zmq.POLLIN and time.monotonic() < deadline:
            time.sleep(0.01)

    events = []
    mesh.subscribe(events.append)
    controller.call_soon(hold)
    code = ("import os, sys, viceroy as vr\nif rank == 1:\n"
            "    sys.stderr.write(\"terminate called after throwing an instance of 'gloo::EnforceNotMet'\\n\"\n"
            "                     '  what():  [enforce fail at pair.cc:456] op.preamble.length <= op.nbytes. 16 vs 8.\\n')\n"
            "    vr.context().publish('sent', 1)  # the words are on the link once this returns\n"
            "    os.abort()\n")
    with pytest.raises(vr.MeshError) as info:
        mesh.run(code, timeout=20)
    assert "rank 1: died (SIGABRT): gloo ended it on receiving more bytes than it expected" in str(info.value), str(info.value)
    kinds = [e["type"] for e in events if e.get("rank") == 1 and e["type"] in ("output", "publish", "rank_exit")]
    assert kinds.index("publish") < kinds.index("rank_exit"), kinds


def test_a_flush_returns_only_once_lines_another_thread_is_sending_are_sent_too(start_mesh):
    # A flush while another thread (the reader, or another flush) is sending the queue, this
    # thread's line in it, must not return before that line is out: a SIGKILL right after
    # would lose it. Sending the first line is slowed here.
    mesh = start_mesh(gpus=2)
    code = ("import gc, os, signal, sys, threading, time\nfrom viceroy.runtime import output\n"
            "capture = next(o for o in gc.get_objects() if isinstance(o, output.OutputCapture))\n"
            "if rank == 1:\n"
            "    send, sending = capture._send, threading.Event()\n"
            "    def slow_send(stream, data, call):\n"
            "        if b'first line' in data:\n"
            "            sending.set()\n            time.sleep(0.5)\n"
            "        send(stream, data, call)\n"
            "    capture._send = slow_send\n"
            "    threading.Thread(target=print, args=('first line',), kwargs={'flush': True}).start()\n"
            "    assert sending.wait(5)\n"
            "    print('second line', flush=True)\n"
            "    os.kill(os.getpid(), signal.SIGKILL)\n")
    with pytest.raises(vr.MeshError, match=r"rank 1: died \(SIGKILL\)"):
        mesh.run(code, timeout=10)
    wait_until(lambda: "second line" in mesh.logs(1), 5, "rank 1's last output in its log")
    assert mesh.logs(1).splitlines() == ["first line", "second line"]


def test_a_segfault_on_a_rank_shows_where_it_was(start_mesh):
    mesh = start_mesh(gpus=2)
    with pytest.raises(vr.MeshError) as e:
        mesh.run("import ctypes\ndef deep():\n    ctypes.string_at(0)\nif rank == 0:\n    deep()", timeout=10)
    assert "rank 0: died (SIGSEGV) (its Python stacks are in its output: mesh.logs(0) / %mesh logs 0)" in str(e.value)
    wait_until(lambda: "Segmentation fault" in mesh.logs(0), 5, "the fault's report in rank 0's log")
    log = mesh.logs(0)
    assert "in deep" in log and "<mesh-cell" in log, log
    # The user's frames only: none of the runtime's threads (its IO and output threads were
    # ~40 lines of our frames in the cell), nor the list of extension modules.
    assert "viceroy/runtime" not in log and "Extension modules" not in log, log
    assert log.count("(most recent call first)") == 1, log


def test_a_process_forked_on_a_rank_that_crashes_reports_on_the_ranks_output(start_mesh):
    # The rank's crash report goes to a file its agent reads when the rank dies; a child the
    # rank's code forked (a data loader's worker) writes its own to stderr, which the rank forwards.
    mesh = start_mesh(gpus=2)
    code = ("import ctypes, os\nif rank == 1:\n    pid = os.fork()\n    if pid == 0:\n        ctypes.string_at(0)\n"
            "    os.waitpid(pid, 0)\n'alive'")
    assert mesh.run(code, timeout=30).values() == ["alive", "alive"]
    wait_until(lambda: "Segmentation fault" in mesh.logs(1), 5, "the child's report in rank 1's log")
    assert mesh.states() == {0: "idle", 1: "idle"}


@pytest.mark.slow
def test_restarts_in_a_row_under_load_restart_every_rank(start_mesh):
    """A rank talks to the controller directly, so a restart can be over (the new rank said
    hello) before its agent has heard the new pid from the fork server; a restart landing in
    that window used to be skipped (old process kept, the rank "starting" for good: 1 to 3 in
    100 restarts with another mesh busy beside it). The busy mesh (a script of its own: gloo
    all_reduces in a loop) keeps the agent waiting for a CPU, which widens the window."""
    mesh = start_mesh(gpus=3)
    load = subprocess.Popen([sys.executable, "-c", _BUSY_MESH], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        assert load.stdout is not None and load.stdout.readline() == b"busy\n"
        for i in range(150):
            before = mesh.pids()
            mesh.restart(timeout=15)
            after = mesh.pids()
            assert not set(before.values()) & set(after.values()), f"restart {i}: kept {before} -> {after}"
            assert mesh.run("rank", timeout=15).values() == [0, 1, 2]
    finally:
        load.communicate(timeout=60)  # stdin closed: it shuts its mesh down and exits


_BUSY_MESH = """
import sys, threading, viceroy as vr
stop = threading.Event()
threading.Thread(target=lambda: (sys.stdin.read(), stop.set()), daemon=True).start()
with vr.Mesh.local(gpus=4, echo=False) as m:
    m.run("import torch, viceroy as vr")
    print("busy", flush=True)
    while not stop.is_set():
        m.run("for _ in range(20): vr.all_reduce(torch.ones(1000))")
"""


def test_an_exception_that_cannot_say_what_it_is_fails_the_call_not_the_rank(start_mesh):
    # str(exc) raised inside the rank's own error reporting, and the rank process died.
    mesh = start_mesh(gpus=2)
    mesh.run("x = 42")
    with pytest.raises(vr.MeshError) as info:
        mesh.run("class E(Exception):\n    def __str__(self):\n        raise RuntimeError('broken')\nraise E()", fail_fast=False)
    assert {f.kind for f in info.value.failures.values()} == {"error"}
    assert all(f.summary.startswith("E: <exception str() failed>") for f in info.value.failures.values()), info.value
    assert mesh.run("x").values() == [42, 42]
