"""What the view's requests answer on a real mesh: log tails, tracebacks and stacks as text a
browser can show."""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.extension.test_ext_session import kill_rank, run
from viceroy.extension.comm import StateChannel, route_by_header
from viceroy.extension.session import MeshSession

pytestmark = pytest.mark.timeout(120)


def test_a_log_tail_is_plain_text_as_a_terminal_shows_it(session: MeshSession):
    run(session, "import sys\nprint('\\x1b[1;32mok\\x1b[0m green')\nsys.stderr.write('\\r 10%\\r 50%\\r100%\\n')")
    reply = StateChannel(session).answer({"request": "logs", "rank": 0})
    assert reply["type"] == "logs" and reply["rank"] == 0
    assert "ok green" in reply["text"] and "100%" in reply["text"]
    assert "\x1b" not in reply["text"] and "[0m" not in reply["text"] and "10%" not in reply["text"]


def test_a_rank_that_printed_nothing_or_died_still_has_a_log(session: MeshSession):
    ch = StateChannel(session)
    assert ch.answer({"request": "logs", "rank": 1}) == {"type": "logs", "rank": 1, "text": ""}
    run(session, "print('last words', flush=True)", ranks=[1])
    kill_rank(session, 1)
    reply = ch.answer({"request": "logs", "rank": 1})
    assert reply["type"] == "logs" and "last words" in reply["text"]
    assert ch.answer({"request": "traceback", "rank": 1}) == {"type": "traceback", "rank": 1, "text": ""}


def test_a_widget_request_keeps_the_subshell_it_came_on_and_a_close_goes_to_the_main_shell():
    """anywidget wraps the view's requests as {"method": "custom", "content": {...}}: those keep
    their subshell (or they wait behind the running cell), as the panel's bare requests do."""

    class Comm:
        def _reply_subshell_for(self, data: Any, default: Any) -> Any:
            return "last-reply-subshell"

    c = Comm()
    route_by_header(c)
    assert c._reply_subshell_for({"method": "custom", "content": {"request": "interrupt"}}, "sub") == "sub"
    assert c._reply_subshell_for({"request": "logs", "rank": 1}, "sub") == "sub"
    assert c._reply_subshell_for({}, "sub") is None  # a close
    assert c._reply_subshell_for({"method": "custom", "content": {"other": 1}}, "sub") is None
    assert c._reply_subshell_for({"method": "update", "state": {}}, "sub") is None


@pytest.fixture
def kernel(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """A real Viceroy kernel from a kernelspec in a temp dir (as tests/kernel runs them)."""
    sys.path.insert(0, str(Path(__file__).parents[1] / "kernel"))
    from kernel_harness import Kernel

    from viceroy.kernel.kernelspec import write_kernel_spec

    write_kernel_spec(tmp_path / "kernels" / "viceroy", executable=sys.executable)
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path))
    k = Kernel()
    try:
        yield k
    finally:
        k.close()


def test_the_widgets_requests_on_a_subshell_are_answered_while_a_cell_runs(kernel: Any):
    """JupyterLab sends a widget's messages on a subshell: the view's buttons (logs, interrupt)
    must answer while a cell runs, not after it."""
    kc = kernel.kc
    ex = kernel.ok("%mesh up gpus=2 --preload none", timeout=120)
    opens = [m for _, m in ex.messages if m["msg_type"] == "comm_open"
             and m["content"]["data"].get("state", {}).get("_model_name") == "AnyModel"]
    assert len(opens) == 1, "%mesh up shows one MeshView"
    comm_id = opens[0]["content"]["comm_id"]
    kernel.ok("%%mesh\nprint('rank step', rank)")
    kc.control_channel.send(kc.session.msg("create_subshell_request", {}))
    subshell = kc.control_channel.get_msg(timeout=30)["content"]["subshell_id"]

    def send(content: dict[str, Any]) -> None:
        msg = kc.session.msg("comm_msg", {"comm_id": comm_id, "data": {"method": "custom", "content": content}})
        msg["header"]["subshell_id"] = subshell
        kc.shell_channel.send(msg)

    def reply_of(kind: str) -> dict[str, Any]:
        msg = kernel.iopub_until(
            lambda m: m["msg_type"] == "comm_msg" and m["content"]["comm_id"] == comm_id
            and m["content"]["data"].get("method") == "custom"
            and m["content"]["data"]["content"].get("type") == kind, 10, f"the widget's {kind!r} reply")
        return msg["content"]["data"]["content"]

    busy = kc.execute("import time\nprint('controller busy', flush=True)\ntime.sleep(60)")
    kernel.iopub_until(
        lambda m: m["msg_type"] == "stream" and "controller busy" in m["content"]["text"], 30, "the cell to run"
    )
    started = time.monotonic()
    send({"request": "logs", "rank": 1})
    assert "rank step 1" in reply_of("logs")["text"]
    send({"request": "interrupt"})
    assert reply_of("interrupted")["ranks"] == []  # nothing ran on the mesh
    assert time.monotonic() - started < 5, "the replies waited for the cell"
    kernel.km.interrupt_kernel()
    while True:
        reply = kc.get_shell_msg(timeout=30)
        if reply["parent_header"]["msg_id"] == busy:
            break
    assert reply["content"]["status"] == "error"
