"""The stop button stops the ranks running the cell within a second, sync and async."""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest
from kernel_harness import Execution, Kernel, error_text, wait_until

pytestmark = pytest.mark.timeout(180)

LOOP = """
import time
try:
    print("started", flush=True)
    while True:
        time.sleep(0.01)
except KeyboardInterrupt:
    print("stopped", flush=True)
    raise
"""


def _ranks_printed(text: str, word: str) -> set[int]:
    ranks: set[int] = set()
    for m in re.finditer(rf"^\[([\d,\-]+)\] {word}$", text, re.M):
        for part in m.group(1).split(","):
            lo, _, hi = part.partition("-")
            ranks.update(range(int(lo), int(hi or lo) + 1))
    return ranks


def test_interrupting_a_mesh_cell_stops_its_ranks_within_a_second(mesh_kernel: Kernel):
    seen: list[str] = []
    interrupted_at: list[float] = []

    def hook(msg: dict) -> None:
        if msg["msg_type"] == "stream":
            seen.append(msg["content"]["text"])
            if not interrupted_at and _ranks_printed("".join(seen), "started") == {0, 1}:
                interrupted_at.append(time.monotonic())
                mesh_kernel.km.interrupt_kernel()

    ex = mesh_kernel.execute("%%mesh" + LOOP, timeout=60, hook=hook)
    assert interrupted_at, "the ranks never started"
    latency = time.monotonic() - interrupted_at[0]
    assert ex.status == "error" and ex.reply["ename"] == "KeyboardInterrupt"
    assert len(ex.errors) == 1
    assert not any("site-packages" in line for line in ex.errors[0]["traceback"])
    assert _ranks_printed(ex.stream(), "stopped") == {0, 1}, "each rank got the interrupt"
    assert latency < 1.0, f"interrupt took {latency:.2f} s"
    after = mesh_kernel.ok("%%mesh\nprint('alive', rank)")
    assert after.stream() == "[0] alive 0\n[1] alive 1\n"


def test_interrupting_an_async_cell_that_awaits_the_mesh_stops_the_ranks(
    mesh_kernel: Kernel, tmp_path: Path
):
    code = (
        "fut = mesh.run('''\n"
        "import time, pathlib\n"
        f"pathlib.Path(r'{tmp_path}', f'started-{{rank}}').touch()\n"
        "while True:\n"
        "    time.sleep(0.01)\n"
        "''', block=False)\n"
        "await fut"
    )
    ex, latency = _interrupt_once_both_ranks_started(mesh_kernel, code, tmp_path)
    assert ex.status == "error"
    assert latency < 1.0, f"interrupt of an async cell took {latency:.2f} s"
    assert not any("viceroy/runtime" in line for line in ex.errors[0]["traceback"])
    # What the cancellation stands for, not a bare "CancelledError: ''".
    assert (ex.errors[0]["ename"], ex.errors[0]["evalue"]) == ("KeyboardInterrupt", "interrupted while the cell awaited")
    ex = mesh_kernel.ok("mesh.run('rank'), mesh.states()", timeout=20)
    assert "{0: 'idle', 1: 'idle'}" in ex.of_type("execute_result")[0]["data"]["text/plain"]


def test_interrupting_a_blocking_mesh_run_stops_the_ranks(mesh_kernel: Kernel, tmp_path: Path):
    code = (
        "mesh.run('''\n"
        "import time, pathlib\n"
        f"pathlib.Path(r'{tmp_path}', f'started-{{rank}}').touch()\n"
        "while True:\n"
        "    time.sleep(0.01)\n"
        "''')"
    )
    ex, latency = _interrupt_once_both_ranks_started(mesh_kernel, code, tmp_path)
    assert ex.status == "error" and ex.reply["ename"] == "KeyboardInterrupt"
    assert not any("viceroy/runtime" in line for line in ex.errors[0]["traceback"])
    assert latency < 1.0, f"interrupt of a blocking mesh.run took {latency:.2f} s"

    def states() -> str:  # the ranks' interrupted answers may still be on their way
        return mesh_kernel.ok("mesh.states()").of_type("execute_result")[0]["data"]["text/plain"]

    wait_until(lambda: states() == "{0: 'idle', 1: 'idle'}", 5, "both ranks to be idle again")


def _interrupt_once_both_ranks_started(kernel: Kernel, code: str, marks: Path) -> tuple[Execution, float]:
    """Run `code`; once both ranks have touched their start mark, interrupt the kernel.
    -> (the execution, seconds from the interrupt to the reply)."""
    interrupted_at: list[float] = []

    def hook(msg: dict) -> None:
        if msg["msg_type"] == "status" and msg["content"]["execution_state"] == "busy":
            wait_until(lambda: len(list(marks.glob("started-*"))) == 2, 30, "both ranks to start")
            interrupted_at.append(time.monotonic())
            kernel.km.interrupt_kernel()

    ex = kernel.execute(code, timeout=60, hook=hook)
    return ex, time.monotonic() - interrupted_at[0]


def test_ranks_that_do_not_stop_are_named_and_the_next_cell_says_it_waits(mesh_kernel: Kernel, tmp_path: Path):
    """os.system ignores SIGINT while its child runs: the ranks go on after the interrupt.
    The cell must not claim they stopped, and the next cell must not wait silently."""
    code = (
        "%%mesh\nimport os, pathlib\n"
        f"pathlib.Path(r'{tmp_path}', f'started-{{rank}}').touch()\n"
        "os.system('sleep 6')\n"
        "print('os.system returned')"
    )
    ex, latency = _interrupt_once_both_ranks_started(mesh_kernel, code, tmp_path)
    assert ex.status == "error" and ex.reply["ename"] == "KeyboardInterrupt"
    text = error_text(ex.errors[0])
    assert "some ranks have not stopped yet (ranks 0-1" in text, text
    assert latency < 3.0
    assert "ranks 0-1 running" in mesh_kernel.ok("%mesh status").stream()
    said = mesh_kernel.ok("%mesh interrupt").stream()  # cannot stop them either: says so
    assert "but ranks 0-1 did not stop" in said and "`%mesh restart` ends them" in said, said
    after = mesh_kernel.ok("%%mesh\nprint('next', rank)", timeout=60)
    notice = "[viceroy] ranks 0-1 still running an earlier call"
    assert after.stream("stderr").count(notice) == 1, after.stream("stderr")
    assert after.stream("stderr").count("\n") == 1
    assert after.stream() == "[0] next 0\n[1] next 1\n"
    # once they are free, nothing more is said
    assert mesh_kernel.ok("%%mesh\nx = 1").stream("stderr") == ""


def test_an_actor_endpoint_given_up_on_does_not_hold_the_next_cell(mesh_kernel: Kernel, tmp_path: Path):
    """Ctrl-C in ``.get()`` gives up on a sync endpoint that runs on (an actor's own thread): the
    next %%mesh cell runs on the ranks' main thread at once, so it must not say it waits for
    the endpoint (it said "still running an earlier call ... this cell runs there once it ends")."""
    release = tmp_path / "release"
    mesh_kernel.ok(
        "import pathlib, time, viceroy as vr\n"
        "class Napper(vr.Actor):\n"
        "    @vr.endpoint\n"
        "    def nap(self):\n"
        "        rank = vr.context().rank\n"
        f"        pathlib.Path(r'{tmp_path}', f'started-{{rank}}').touch()\n"
        f"        while not pathlib.Path(r'{release}').exists():\n"
        "            time.sleep(0.01)\n"
        "nappers = mesh.spawn(Napper)",
        timeout=60,
    )
    ex, _ = _interrupt_once_both_ranks_started(mesh_kernel, "nappers.nap.call().get()", tmp_path)
    assert ex.status == "error" and ex.reply["ename"] == "KeyboardInterrupt"
    try:
        after = mesh_kernel.ok("%%mesh\nprint('next', rank)", timeout=60)
        assert after.stream("stderr") == "", after.stream("stderr")
        assert after.stream() == "[0] next 0\n[1] next 1\n"
    finally:
        release.touch()
    mesh_kernel.ok("nappers.stop()", timeout=60)
