"""The mesh state the comm publishes follows runtime events."""

from __future__ import annotations

from viceroy.extension.state import MeshState, rank_coords


def test_coords_are_row_major():
    assert rank_coords({"hosts": 2, "gpus": 4}, 5) == {"hosts": 1, "gpus": 1}


def test_state_follows_the_life_of_calls_and_ranks():
    s = MeshState()
    s.reset({"gpus": 2}, {0: "idle", 1: "idle"})
    s.apply({"type": "call_started", "call": 4, "ranks": [0, 1], "label": "%%mesh"})
    snap = s.snapshot()
    assert [r["state"] for r in snap["ranks"]] == ["running", "running"]
    assert snap["calls"] == [{"call": 4, "label": "%%mesh", "ranks": [0, 1]}]
    s.apply({"type": "output", "rank": 0, "stream": "stdout", "text": "a\nstep 3\n", "call": 4})
    s.apply({"type": "rank_done", "call": 4, "rank": 0, "ok": True})
    s.apply({"type": "rank_exit", "rank": 1, "reason": "SIGKILL"})
    s.apply({"type": "call_finished", "call": 4, "ok": False})
    snap = s.snapshot()
    assert [(r["state"], r["last_line"], r["exit"]) for r in snap["ranks"]] == [
        ("idle", "step 3", None),
        ("dead", "", "SIGKILL"),
    ]
    assert snap["calls"] == []
    s.apply({"type": "rank_ready", "rank": 1, "pid": 123})
    assert s.states() == {0: "idle", 1: "idle"}


def test_no_mesh_has_no_dims():
    s = MeshState()
    s.reset(None)
    assert s.snapshot()["dims"] is None and s.snapshot()["ranks"] == []
