"""The mesh state the front ends see follows runtime events; streams send diffs in seq order."""

from __future__ import annotations

from viceroy.extension.state import MeshState, Stream, diff_ranks, first_line, rank_coords


class Clock:
    def __init__(self, t: float = 1000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def started(call: int, ranks: list[int], label: str = "%%mesh") -> dict:
    return {"type": "call_started", "call": call, "ranks": ranks, "label": label}


def done(call: int, rank: int, ok: bool = True, **failure: str) -> dict:
    return {"type": "rank_done", "call": call, "rank": rank, "ok": ok, **failure}


def fresh(n: int = 2, clock: Clock | None = None) -> MeshState:
    s = MeshState(clock=clock or Clock())
    s.reset({"gpus": n}, dict.fromkeys(range(n), "idle"), {r: 100 + r for r in range(n)}, {r: "node" for r in range(n)})
    return s


def by_rank(s: MeshState) -> dict[int, dict]:
    return {r["rank"]: r for r in s.snapshot()["ranks"]}


def test_coords_are_row_major():
    assert rank_coords({"hosts": 2, "gpus": 4}, 5) == {"hosts": 1, "gpus": 1}


def test_a_rank_record_has_every_protocol_field():
    rec = fresh().snapshot()["ranks"][1]
    assert rec == {
        "rank": 1, "coords": {"gpus": 1}, "host": "node", "state": "idle", "call": None, "label": "",
        "started": None, "elapsed": None, "rss": None, "gpu_mem": None, "gpu_util": None,
        "last_line": "", "pid": 101, "exit": None, "error": None,
    }


def test_a_call_leaves_ranks_done_error_or_interrupted_until_the_next_starts():
    clock = Clock()
    s = fresh(3, clock)
    s.apply(started(4, [0, 1, 2], "%%mesh\nx = 1 / (rank - 1)"))
    snap = s.snapshot()
    assert [r["state"] for r in snap["ranks"]] == ["running"] * 3
    assert snap["ranks"][0]["label"] == "%%mesh" and snap["ranks"][0]["started"] == 1000.0
    assert snap["calls"] == [{"call": 4, "label": "%%mesh", "ranks": [0, 1, 2], "started": 1000.0}]
    assert snap["summary"] == {"total": 3, "alive": 3, "running": 3, "starting": 0, "failed": 0}
    clock.t += 1.5
    s.apply(done(4, 0))
    s.apply(done(4, 1, ok=False, kind="error", summary="ZeroDivisionError: division by zero",
                 tb='Traceback (most recent call last):\n  File "<mesh-cell-1>", line 1\nZeroDivisionError: division by zero\n'))
    s.apply(done(4, 2, ok=False, kind="interrupted", summary="stopped by fail-fast after rank 1 failed"))
    s.apply({"type": "call_finished", "call": 4, "ok": False})
    ranks = by_rank(s)
    assert [ranks[r]["state"] for r in range(3)] == ["done", "error", "interrupted"]
    assert ranks[0]["elapsed"] == 1.5 and ranks[0]["call"] == 4
    assert ranks[1]["error"] == "ZeroDivisionError: division by zero"
    assert ranks[2]["error"] is None
    assert '<mesh-cell-1>", line 1' in s.traceback(1) and s.traceback(0) == ""
    assert s.snapshot()["calls"] == [] and s.snapshot()["summary"]["failed"] == 1
    s.apply(started(5, [1]))
    assert by_rank(s)[1]["state"] == "running" and by_rank(s)[1]["elapsed"] is None


def test_a_failure_without_details_is_still_an_error():
    s = fresh()
    s.apply(started(1, [0, 1]))
    s.apply(done(1, 0, ok=False))
    assert by_rank(s)[0]["state"] == "error" and by_rank(s)[0]["error"] == "failed"


def test_a_rank_stays_running_while_another_call_runs_there():
    s = fresh()
    s.apply(started(1, [0], "first"))
    s.apply(started(2, [0], "second"))
    s.apply(done(2, 0))
    assert by_rank(s)[0]["state"] == "running" and by_rank(s)[0]["label"] == "first"
    s.apply(done(1, 0))
    assert by_rank(s)[0]["state"] == "done"


def test_death_and_restart():
    s = fresh()
    s.apply(started(1, [0, 1]))
    s.apply({"type": "output", "rank": 1, "stream": "stdout", "text": "a\nstep 3\r step 4\n", "call": 1})
    assert by_rank(s)[1]["last_line"] == " step 4"
    s.apply({"type": "rank_exit", "rank": 1, "reason": "SIGKILL"})
    assert (by_rank(s)[1]["state"], by_rank(s)[1]["exit"], by_rank(s)[1]["pid"]) == ("dead", "SIGKILL", None)
    assert s.snapshot()["summary"] == {"total": 2, "alive": 1, "running": 1, "starting": 0, "failed": 1}
    s.starting([1])
    assert by_rank(s)[1]["state"] == "starting"
    s.apply({"type": "rank_ready", "rank": 1, "pid": 555})
    r1 = by_rank(s)[1]
    assert (r1["state"], r1["pid"], r1["exit"], r1["last_line"], r1["call"]) == ("idle", 555, None, "", None)


def test_restarting_a_live_rank_is_not_a_death():
    s = fresh()
    s.starting([0])
    s.apply({"type": "rank_exit", "rank": 0, "reason": "SIGTERM"})
    assert by_rank(s)[0]["state"] == "starting"


def test_reconciling_with_the_runtime_finds_ranks_a_finished_call_gave_up_on():
    s = fresh()
    s.apply(started(1, [0, 1]))
    s.apply(done(1, 0))
    s.apply({"type": "call_finished", "call": 1, "ok": False})  # rank 1 never answered in time
    assert s.set_states({0: "idle", 1: "running"}) is False  # still busy there
    assert s.set_states({0: "idle", 1: "idle"}) is True
    assert [r["state"] for r in s.snapshot()["ranks"]] == ["done", "interrupted"]
    s.apply(started(2, [0]))
    assert s.set_states({0: "idle", 1: "idle"}) is False, "a running call's rank is left alone"


def test_a_call_that_ends_after_one_given_up_on_leaves_its_ranks_done():
    # After an interrupt the ranks ignored, the next call's success left them "running" (or,
    # once reconciled, "interrupted", labelled with the call that succeeded) until a later call.
    s = fresh()
    s.apply(started(1, [0, 1], "busy"))
    s.apply({"type": "call_finished", "call": 1, "ok": False})  # interrupted; the ranks go on
    s.apply(started(2, [0, 1], "rank"))
    s.apply({"type": "ranks_done", "call": 2, "ranks": [0, 1]})
    s.apply({"type": "call_finished", "call": 2, "ok": True})
    assert [(r["state"], r["label"]) for r in s.snapshot()["ranks"]] == [("done", "rank")] * 2
    assert s.set_states({0: "idle", 1: "idle"}) is False
    assert s.apply(done(1, 0, ok=False, kind="interrupted")) is False, "a late answer to call 1 is old news"
    assert [r["state"] for r in s.snapshot()["ranks"]] == ["done", "done"]


def test_stats_fill_memory_fields():
    s = fresh()
    assert s.apply_stats({0: {"rss": 50_000_000, "gpu_mem": None, "gpu_util": None}}) is True
    assert s.apply_stats({0: {"rss": 50_000_000, "gpu_mem": None, "gpu_util": None}}) is False
    assert by_rank(s)[0]["rss"] == 50_000_000


def test_labels_are_one_line_of_at_most_80_chars():
    assert first_line("\n  %%mesh --ranks 0\nprint(1)") == "%%mesh --ranks 0"
    long = first_line("x" * 200)
    assert len(long) == 80 and long.endswith("…")


def test_no_mesh_has_no_dims():
    s = MeshState()
    s.reset(None)
    assert s.snapshot()["dims"] is None and s.snapshot()["ranks"] == []


def test_diffs_hold_only_changed_fields():
    old = [{"rank": 0, "state": "idle", "pid": 1}, {"rank": 1, "state": "idle", "pid": 2}]
    new = [{"rank": 0, "state": "running", "pid": 1}, {"rank": 1, "state": "idle", "pid": 2}]
    assert diff_ranks(old, new) == {"0": {"state": "running"}}


def test_a_stream_numbers_a_snapshot_then_diffs_and_stays_quiet_without_change():
    s = fresh()
    st = Stream()
    first = st.next(s.snapshot())
    assert first is not None and first["type"] == "state" and first["seq"] == 1
    assert st.next(s.snapshot()) is None
    s.apply(started(1, [1], "work"))
    diff = st.next(s.snapshot())
    assert diff is not None and diff["type"] == "diff" and diff["seq"] == 2
    assert diff["ranks"] == {"1": {"state": "running", "call": 1, "label": "work", "started": 1000.0}}
    assert diff["calls"][0]["call"] == 1 and diff["summary"]["running"] == 1 and diff["auto"] is False
    s.auto = True
    auto = st.next(s.snapshot())
    assert auto is not None and auto["ranks"] == {} and auto["auto"] is True and auto["seq"] == 3


def test_a_stream_resends_the_snapshot_when_asked_or_when_the_shape_changes():
    s = fresh()
    st = Stream()
    st.next(s.snapshot())
    st.want_snapshot = True  # the front end saw a gap
    again = st.next(s.snapshot())
    assert again is not None and again["type"] == "state" and again["seq"] == 2
    s.reset({"dp": 2, "tp": 2}, dict.fromkeys(range(4), "idle"))
    reshaped = st.next(s.snapshot())
    assert reshaped is not None and reshaped["type"] == "state" and reshaped["dims"] == {"dp": 2, "tp": 2}
    s.reset(None)
    gone = st.next(s.snapshot())
    assert gone is not None and gone["type"] == "state" and gone["dims"] is None and gone["seq"] == 4


def out(rank: int, text: str, stream: str = "stdout") -> dict:
    return {"type": "output", "rank": rank, "stream": stream, "text": text, "call": 1}


def test_the_last_line_joins_a_line_flushed_in_pieces():
    # print("epoch 3 loss ", end="", flush=True); ...; print(0.25): two chunks, one line
    s = fresh()
    s.apply(out(0, "epoch 3 loss "))
    assert by_rank(s)[0]["last_line"] == "epoch 3 loss "
    s.apply(out(0, "0.25\n"))
    assert by_rank(s)[0]["last_line"] == "epoch 3 loss 0.25"
    s.apply(out(0, "warn", stream="stderr"))  # another stream's line does not continue this one
    s.apply(out(0, "ing\n", stream="stderr"))
    assert by_rank(s)[0]["last_line"] == "warning"
    s.apply(out(0, "\r 10%"))
    s.apply(out(0, "\r 20%"))
    assert by_rank(s)[0]["last_line"] == " 20%"
    s.apply({"type": "rank_ready", "rank": 0, "pid": 9})  # a fresh process starts a fresh line
    s.apply(out(0, "hello\n"))
    assert by_rank(s)[0]["last_line"] == "hello"


def test_the_last_line_and_error_are_plain_text_without_terminal_escapes():
    s = fresh()
    s.apply(out(0, "\x1b[32mok\x1b[0m green \x1b]0;title\x07done\x07\n"))
    assert by_rank(s)[0]["last_line"] == "ok green done"
    s.apply(out(1, "\x1b[1m" + "é😀" * 300 + "\n"))
    assert by_rank(s)[1]["last_line"] == ("é😀" * 100)
    s.apply(started(2, [0]))
    s.apply(done(2, 0, ok=False, kind="error", summary="\x1b[0;31mValueError\x1b[0m: bad"))
    assert by_rank(s)[0]["error"] == "ValueError: bad"


def test_ranks_coming_back_are_counted_as_starting_not_idle():
    from viceroy.extension.widget import headline

    s = fresh(4)
    assert s.set_states({0: "idle", 1: "starting", 2: "starting", 3: "idle"})
    snap = s.snapshot()
    assert snap["summary"] == {"total": 4, "alive": 4, "running": 0, "starting": 2, "failed": 0}
    assert headline(snap) == "mesh gpus=4 · 4/4 alive · 0 running · 0 failed · 2 starting"
    s.set_states(dict.fromkeys(range(4), "idle"))
    assert headline(s.snapshot()) == "mesh gpus=4 · 4/4 alive · 0 running · 0 failed"
