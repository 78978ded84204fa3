"""The state channel (throttled numbered diffs, requests), the MeshView model, the static views."""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Iterator
from typing import Any

import comm
import pytest
from comm.base_comm import BaseComm

from tests.conftest import wait_until
from viceroy.extension import comm as vcomm
from viceroy.extension.comm import MIN_INTERVAL, FrontEnd, StateChannel
from viceroy.extension.session import MeshSession
from viceroy.extension.widget import MeshView, StaticView, render_html, render_text
from viceroy.extension.widget import view as widget_view


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def session_with(n: int = 4, dims: dict[str, int] | None = None) -> MeshSession:
    s = MeshSession(None)
    s.state.reset(dims or {"gpus": n}, dict.fromkeys(range(n), "idle"))
    return s


def recorder() -> tuple[FrontEnd, list[dict[str, Any]]]:
    got: list[dict[str, Any]] = []
    return FrontEnd(got.append), got


def apply(session: MeshSession, ev: dict[str, Any]) -> None:
    session.state.apply(ev)
    session._notify()


# --- front ends that die without closing their comm -----------------------------------------


class SidePanelComm:
    """The kernel's end of a side panel's ``viceroy.mesh`` comm, as `StateChannel._on_open` uses it."""

    def __init__(self) -> None:
        self.sent: list[dict[str, Any]] = []
        self.closed = False
        self.on_message: Any = None

    def send(self, msg: dict[str, Any]) -> None:
        self.sent.append(msg)

    def close(self) -> None:
        self.closed = True

    def on_msg(self, handler: Any) -> None:
        self.on_message = handler

    def on_close(self, handler: Any) -> None:
        pass

    def says(self, data: dict[str, Any]) -> None:
        self.on_message({"content": {"data": data}})


def test_a_side_panel_that_stops_saying_it_is_alive_is_closed_and_one_that_never_did_is_not():
    clock = Clock()
    ch = StateChannel(session_with(), clock=clock, silence=180)
    pinging, older = SidePanelComm(), SidePanelComm()
    ch._on_open(pinging, {})
    ch._on_open(older, {})  # a side panel from before the pings
    pinging.says({"request": "alive"})
    assert ch.front_ends == 2
    for _ in range(10):  # alive every 30 s: kept
        clock.t += 30
        pinging.says({"request": "alive"})
        assert ch.expire() == 0
    clock.t += 150
    pinging.says({"request": "logs", "rank": 0})  # any request says it is there too
    clock.t += 179
    assert ch.expire() == 0 and not pinging.closed
    clock.t += 2  # then silence: a crashed tab
    assert ch.expire() == 1
    assert pinging.closed and not older.closed and ch.front_ends == 1
    assert ch._requests.qsize() == 1  # the logs request, to be answered; pings are not answered
    clock.t += 10_000
    assert ch.expire() == 0 and ch.front_ends == 1


# --- throttling, with a fake clock -------------------------------------------------------------


def test_changes_within_200_ms_are_coalesced_into_one_diff():
    clock, session = Clock(), session_with()
    ch = StateChannel(session, clock=clock)
    session.add_listener(ch.changed)
    fe, got = recorder()
    ch.attach(fe)
    assert ch.flush() is None
    assert [m["type"] for m in got] == ["state"] and got[0]["seq"] == 1

    apply(session, {"type": "call_started", "call": 1, "ranks": [0, 1, 2, 3], "label": "%%mesh"})
    clock.t += 0.05
    wait = ch.flush()
    assert len(got) == 1, "nothing may be sent 50 ms after the last message"
    assert wait == pytest.approx(MIN_INTERVAL - 0.05)
    for r in range(3):
        apply(session, {"type": "rank_done", "call": 1, "rank": r, "ok": True})
    clock.t += wait
    assert ch.flush() is None
    assert len(got) == 2
    diff = got[1]
    assert diff["type"] == "diff" and diff["seq"] == 2
    assert {k: v["state"] for k, v in diff["ranks"].items()} == {"0": "done", "1": "done", "2": "done", "3": "running"}
    assert diff["summary"]["running"] == 1

    clock.t += 5
    session._notify()  # a change that changed nothing
    ch.flush()
    assert len(got) == 2, "no message when nothing changed"


def test_at_most_five_messages_a_second_under_a_stream_of_changes():
    clock, session = Clock(), session_with()
    ch = StateChannel(session, clock=clock)
    session.add_listener(ch.changed)
    fe, got = recorder()
    ch.attach(fe)
    sent_at: list[float] = []
    for i in range(200):  # a change every 10 ms for 2 s
        apply(session, {"type": "output", "rank": i % 4, "text": f"line {i}\n"})
        before = len(got)
        ch.flush()
        if len(got) > before:
            sent_at.append(clock.t)
        clock.t += 0.01
    gaps = [b - a for a, b in itertools.pairwise(sent_at)]
    assert min(gaps) >= MIN_INTERVAL - 1e-9
    assert 9 <= len(sent_at) <= 11
    assert [m["seq"] for m in got] == list(range(1, len(got) + 1))
    clock.t += 1
    ch.flush()
    last = {int(k): v["last_line"] for m in got if m["type"] == "diff" for k, v in m["ranks"].items() if "last_line" in v}
    assert last[3] == "line 199", "the latest change is never lost to coalescing"


def test_each_front_end_has_its_own_seq_and_a_snapshot_request_is_honoured():
    clock, session = Clock(), session_with()
    ch = StateChannel(session, clock=clock)
    session.add_listener(ch.changed)
    a, got_a = recorder()
    ch.attach(a)
    ch.flush()
    apply(session, {"type": "call_started", "call": 1, "ranks": [0], "label": "x"})
    clock.t += 1
    ch.flush()
    b, got_b = recorder()
    ch.attach(b)
    ch.request(a, {"request": "snapshot"})
    clock.t += 1
    ch.flush()
    assert [(m["type"], m["seq"]) for m in got_a] == [("state", 1), ("diff", 2), ("state", 3)]
    assert [(m["type"], m["seq"]) for m in got_b] == [("state", 1)]
    ch.detach(a)
    apply(session, {"type": "rank_done", "call": 1, "rank": 0, "ok": True})
    clock.t += 1
    ch.flush()
    assert len(got_a) == 3 and got_b[-1]["type"] == "diff"


def test_a_front_end_that_went_away_is_dropped():
    clock, session = Clock(), session_with()
    ch = StateChannel(session, clock=clock)

    def broken(msg: dict[str, Any]) -> None:
        raise RuntimeError("comm closed")

    ch.attach(FrontEnd(broken))
    ch.flush()
    assert ch.front_ends == 0


# --- the real threads, with deadlines ----------------------------------------------------------


def test_the_pump_thread_throttles_real_time_updates():
    session = session_with()
    ch = StateChannel(session)
    ch.start()
    got: list[tuple[float, dict[str, Any]]] = []
    lock = threading.Lock()

    def send(msg: dict[str, Any]) -> None:
        with lock:
            got.append((time.monotonic(), msg))

    try:
        ch.attach(FrontEnd(send))
        wait_until(lambda: got, 5, "the first snapshot")
        end = time.monotonic() + 1.2
        i = 0
        while time.monotonic() < end:  # ~1000 changes a second
            apply(session, {"type": "output", "rank": 0, "text": f"tick {i}\n"})
            i += 1
            time.sleep(0.001)
        final = f"tick {i - 1}"
        wait_until(
            lambda: any(m.get("ranks", {}).get("0", {}).get("last_line") == final for _, m in got if m["type"] == "diff"),
            5, "the last change to arrive",
        )
    finally:
        ch.stop()
    with lock:
        times = [t for t, _ in got]
        seqs = [m["seq"] for _, m in got]
    assert seqs == list(range(1, len(seqs) + 1))
    # At most 5 a second: any 6 consecutive messages span a second (less a little jitter in
    # delivery; the exact spacing is checked with a fake clock above).
    assert len(times) >= 6
    assert all(times[i + 5] - times[i] >= 0.9 for i in range(len(times) - 5))


# --- requests ----------------------------------------------------------------------------------


def test_requests_without_a_mesh_or_with_bad_input_answer_with_errors_that_teach():
    ch = StateChannel(session_with())
    assert ch.answer({"request": "frob"}) == {
        "type": "error", "request": "frob",
        "message": "unknown request 'frob'; known: snapshot, logs, traceback, stacks, interrupt, restart_failed",
    }
    err = ch.answer({"request": "logs", "rank": 0})
    assert err["type"] == "error" and "no mesh is up" in err["message"]
    assert ch.answer("not a dict")["type"] == "error"


# --- static fallback ---------------------------------------------------------------------------


def failed_session() -> MeshSession:
    s = session_with(4, {"hosts": 2, "gpus": 2})
    s.state.apply({"type": "call_started", "call": 7, "ranks": [0, 1, 2, 3], "label": "%%mesh\n1/0"})
    s.state.apply_stats({0: {"rss": 150 * 2**20, "gpu_mem": 2 * 2**30, "gpu_util": 87.0}})
    for r in (0, 1, 3):
        s.state.apply({"type": "rank_done", "call": 7, "rank": r, "ok": True})
    s.state.apply({"type": "rank_done", "call": 7, "rank": 2, "ok": False, "kind": "error",
                   "summary": "ZeroDivisionError: division by zero", "tb": "..."})
    s.state.apply({"type": "output", "rank": 1, "text": "<b>loss</b> 0.5\n"})
    return s


def test_static_html_lays_out_tiles_by_dims_with_state_in_colour_and_words():
    page = render_html(failed_session().state.snapshot())
    assert "mesh hosts=2 gpus=2 · 4/4 alive · 0 running · 1 failed" in page
    assert "grid-template-columns:repeat(2,auto)" in page, "2 dims: rows by hosts, columns by gpus"
    assert page.count('class="viceroy-tile') == 4
    assert 'class="viceroy-tile viceroy-error" data-rank="2"' in page
    assert "<span>error</span>" in page and "ZeroDivisionError: division by zero" in page
    assert "#ffebee" in page, "error tiles are coloured"
    assert "&lt;b&gt;loss&lt;/b&gt; 0.5" in page, "output is escaped"
    assert "rss 150.0 MB · gpu 2.0 GB · 87%" in page


def test_static_html_draws_small_multiples_for_three_dims():
    s = session_with(8, {"pp": 2, "dp": 2, "tp": 2})
    page = render_html(s.state.snapshot())
    assert "pp=0" in page and "pp=1" in page and page.count("display:inline-grid") == 2


def test_static_text_is_a_compact_table():
    text = render_text(failed_session().state.snapshot())
    lines = text.splitlines()
    assert lines[0] == "mesh hosts=2 gpus=2 · 4/4 alive · 0 running · 1 failed"
    assert len(lines) == 2 + 4
    row2 = lines[4].split()
    assert row2[:3] == ["2", "1,0", "error"] and "ZeroDivisionError: division by zero" in lines[4]
    assert "150.0 MB" in lines[2] and "87%" in lines[2]
    assert render_text(MeshSession(None).state.snapshot()).startswith("no mesh is up")


def test_static_view_bundle():
    bundle = StaticView(failed_session().state.snapshot())._repr_mimebundle_()
    assert set(bundle) == {"text/plain", "text/html"}


# --- the widget model --------------------------------------------------------------------------


class RecordingComm(BaseComm):
    sent: list[tuple[str, dict[str, Any]]]

    def publish_msg(self, msg_type: str, data: Any = None, metadata: Any = None, buffers: Any = None, **keys: Any) -> None:
        self.sent.append((msg_type, dict(data or {})))


@pytest.fixture
def comms(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[RecordingComm]]:
    made: list[RecordingComm] = []

    def create(*args: Any, **kwargs: Any) -> RecordingComm:
        c = RecordingComm.__new__(RecordingComm)
        c.sent = []
        BaseComm.__init__(c, *args, **kwargs)
        made.append(c)
        return c

    monkeypatch.setattr(comm, "create_comm", create)
    yield made


def test_mesh_view_opens_with_a_snapshot_then_sends_diffs_and_answers_requests(comms: list[RecordingComm]):
    clock, session = Clock(), session_with()
    ch = StateChannel(session, clock=clock)
    session.add_listener(ch.changed)
    view = MeshView(channel=ch)
    (c,) = [c for c in comms if c.sent[0][1]["state"]["_model_name"] == "AnyModel"]  # (and its Layout)
    kind, opened = c.sent[0]
    assert kind == "comm_open"
    assert opened["state"]["state"]["type"] == "state" and opened["state"]["state"]["seq"] == 1
    assert [r["state"] for r in opened["state"]["state"]["ranks"]] == ["idle"] * 4
    assert "_esm" in opened["state"]

    apply(session, {"type": "call_started", "call": 1, "ranks": [2], "label": "%%mesh"})
    clock.t += 1
    ch.flush()
    custom = [d["content"] for k, d in c.sent if k == "comm_msg" and d.get("method") == "custom"]
    assert custom == [{"type": "diff", "seq": 2, "ranks": {"2": {"state": "running", "call": 1, "label": "%%mesh",
                                                                     "started": custom[0]["ranks"]["2"]["started"]}},
                       "calls": custom[0]["calls"], "auto": False,
                       "summary": {"total": 4, "alive": 4, "running": 1, "starting": 0, "failed": 0}}]

    # a request from the browser: a snapshot comes back as the synced trait
    c.handle_msg({"content": {"data": {"method": "custom", "content": {"request": "snapshot"}}}, "buffers": []})
    clock.t += 1
    ch.flush()
    updates = [d["state"] for k, d in c.sent if k == "comm_msg" and d.get("method") == "update"]
    assert updates[-1]["state"]["seq"] == 3 and updates[-1]["state"]["type"] == "state"
    assert view.state["seq"] == 3

    view.close()
    assert ch.front_ends == 0


def test_mesh_view_display_bundle_carries_the_static_fallback(comms: list[RecordingComm]):
    session = failed_session()
    view = MeshView(channel=StateChannel(session))
    data, _meta = view._repr_mimebundle_()
    assert "application/vnd.jupyter.widget-view+json" in data
    assert "ZeroDivisionError" in data["text/html"] and data["text/plain"].startswith("mesh hosts=2 gpus=2")
    view.close()


def test_channel_for_reuses_the_registered_channel():
    session = session_with()
    ch = StateChannel(session)
    ch.start()
    try:
        assert vcomm.channel_for(session) is ch
    finally:
        ch.stop()
    other = vcomm.channel_for(session)
    assert other is not ch
    other.stop()


def test_the_view_is_one_widget_per_session_however_often_it_is_shown(comms: list[RecordingComm]):
    # Each %mesh status made a new widget, attached for the kernel's life: every change was
    # sent once per widget ever shown, up to 5 times a second each.
    session = session_with()
    ch = StateChannel(session)
    ch.start()
    try:
        first = widget_view(session)
        assert widget_view(session) is first and ch.front_ends == 1
        first.close()  # closed (its output cleared, say): the next display makes a new one
        again = widget_view(session)
        assert again is not first and ch.front_ends == 1
        again.close()
    finally:
        ch.stop()
