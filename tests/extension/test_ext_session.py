"""A MeshSession on a real mesh: what the next cell is told about the ranks."""

from __future__ import annotations

import os
import signal
import threading
from typing import Any

import pytest

from tests.conftest import wait_until
from viceroy.extension.args import RunOptions
from viceroy.extension.session import MeshSession

pytestmark = pytest.mark.timeout(120)


class Sink:
    def __init__(self) -> None:
        self.writes: list[tuple[str, str]] = []

    def write(self, stream: str, text: str) -> None:
        self.writes.append((stream, text))

    def display(self, data: dict[str, Any], metadata: dict[str, Any], **_: Any) -> None:
        pass

    def progress(self, text: str) -> None:
        pass

    def text(self, stream: str) -> str:
        return "".join(t for s, t in self.writes if s == stream)


def run(session: MeshSession, code: str, **opts: Any) -> Sink:
    sink = Sink()
    session.run_cell(code, RunOptions(**opts), sink=sink)
    return sink


def kill_rank(session: MeshSession, rank: int) -> None:
    """SIGKILL a rank this test's mesh started; return once the session has heard of it."""
    assert session.mesh is not None
    heard = threading.Event()
    unsubscribe = session.mesh.subscribe(
        lambda ev: heard.set() if ev.get("type") == "rank_exit" and ev.get("rank") == rank else None
    )
    try:
        os.kill(session.mesh.pids()[rank], signal.SIGKILL)
        wait_until(heard.is_set, 10, f"rank {rank}'s exit to be reported")
    finally:
        unsubscribe()


def test_a_deliberate_restart_is_not_reported_as_ranks_exiting(session: MeshSession):
    session.restart()
    sink = run(session, "print('fresh')")
    assert sink.text("stderr") == ""
    # fresh ranks: the same line, shown grouped (or apart, grouping is time-windowed)
    assert sink.text("stdout") in ("[0-1] fresh\n", "[0] fresh\n[1] fresh\n")


def test_a_rank_that_died_is_reported_once_and_not_after_it_was_restarted(session: MeshSession):
    kill_rank(session, 1)
    sink = run(session, "print('still here')", ranks=[0])
    assert sink.text("stderr") == (
        "[viceroy] rank 1 exited (SIGKILL) since the last cell; "
        "`%mesh restart --failed` brings back only the dead ranks\n"
    )
    assert run(session, "x = 1", ranks=[0]).text("stderr") == "", "said once"
    session.restart(failed_only=True)
    kill_rank(session, 0)
    session.restart(failed_only=True)  # before any cell ran: that exit is old news now
    sink = run(session, "print('back', rank)")
    assert sink.text("stderr") == ""
    assert "back" in sink.text("stdout")


def test_an_interrupt_while_the_cell_is_being_sent_still_interrupts_the_ranks():
    from viceroy.extension.cells import CellRunner

    class Sending:
        """A mesh whose run() is interrupted by Ctrl-C while sending."""

        ranks = [0, 1]
        interrupts = 0

        def run(self, *args: Any, **kwargs: Any) -> Any:
            raise KeyboardInterrupt

        def interrupt(self) -> None:
            self.interrupts += 1

        def states(self) -> dict[int, str]:
            return {0: "idle", 1: "idle"}

    mesh = Sending()
    with pytest.raises(KeyboardInterrupt) as e:
        CellRunner().run(mesh, "x = 1", RunOptions(), sink=Sink())  # type: ignore[arg-type]
    assert mesh.interrupts == 1
    assert e.value._render_traceback_() == [  # type: ignore[attr-defined]
        "\x1b[0;31mKeyboardInterrupt\x1b[0m: interrupted the mesh call on ranks 0-1"
    ]


def test_a_cell_queued_behind_a_call_made_from_python_says_nothing(session: MeshSession):
    """Only ranks busy with a call given up on are reported (see test_kernel_interrupt); a
    call still in flight from Python (the tensor engine's, a block=False run) is the user's."""
    assert session.mesh is not None
    fut = session.mesh.run("import time\ntime.sleep(0.5)", block=False)
    wait_until(lambda: set(session.mesh.states().values()) == {"running"}, 10, "the call to start")  # type: ignore[union-attr]
    sink = run(session, "print('after')")
    assert fut.done()
    assert sink.text("stderr") == ""
    assert "after" in sink.text("stdout")


def test_an_interrupted_mesh_up_leaves_no_mesh_and_says_so_in_one_line(monkeypatch):
    # A Ctrl-C landing after the ranks came up (while the cell set them up) showed a raw
    # KeyboardInterrupt traceback through our frames, and left a half set-up mesh bound.
    import psutil

    started: list[Any] = []
    before = set(psutil.Process().children(recursive=True))
    real_attach = MeshSession._attach

    def attach_then_interrupted(self: MeshSession, mesh: Any) -> None:
        started.append(mesh)
        real_attach(self, mesh)
        raise KeyboardInterrupt

    monkeypatch.setattr(MeshSession, "_attach", attach_then_interrupted)
    s = MeshSession(None)
    try:
        with pytest.raises(KeyboardInterrupt) as info:
            s.up({"gpus": 2}, preload=[])
        assert s.mesh is None
        assert info.value._render_traceback_() == [  # type: ignore[attr-defined]
            "\x1b[0;31mKeyboardInterrupt\x1b[0m: %mesh up was interrupted; no mesh is up (run it again)"
        ]
        assert "shut down" in repr(started[0])
        wait_until(lambda: set(psutil.Process().children(recursive=True)) <= before, 10, "the mesh's processes to be gone")
    finally:
        s.close()
        for m in started:
            m.shutdown()


def test_ranks_outside_what_where_selects_are_named_against_where(session: MeshSession):
    from IPython.core.error import UsageError

    from viceroy.extension.args import parse_run_options

    with pytest.raises(UsageError) as e:
        session.run_cell("rank", parse_run_options("--where gpus=0:1 --ranks 1"))
    assert str(e.value) == "--ranks: rank(s) 1 not among the ranks --where gpus=0:1 selects (0)"
    with pytest.raises(UsageError) as e:
        session.run_cell("rank", parse_run_options("--ranks 0,5"))
    assert str(e.value) == "--ranks: rank(s) 5 not in this mesh (its ranks are 0-1)"
