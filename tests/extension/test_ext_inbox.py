"""The inbox between the runtime's IO thread and the cell's thread: events that need no prompt
handling do not wake the cell's thread, and every event still comes out, in order."""

from __future__ import annotations

import threading

from viceroy.extension.inbox import Inbox


def _taker(inbox: Inbox, timeout: float) -> tuple[threading.Thread, list[list[dict]]]:
    got: list[list[dict]] = []
    t = threading.Thread(target=lambda: got.append(inbox.take(timeout)), daemon=True)
    t.start()
    return t, got


def test_an_event_that_rides_along_does_not_wake_the_taker_and_comes_out_with_the_next():
    inbox = Inbox()
    t, got = _taker(inbox, timeout=30)
    inbox.post({"n": 1}, wake=False)
    t.join(0.3)
    assert t.is_alive(), "a ride-along event woke the taker"
    inbox.post({"n": 2})
    t.join(10)
    assert not t.is_alive()
    assert got == [[{"n": 1}, {"n": 2}]]


def test_queued_ride_along_events_are_taken_at_once_without_waiting():
    inbox = Inbox()
    inbox.post({"n": 1}, wake=False)
    t, got = _taker(inbox, timeout=30)
    t.join(10)
    assert not t.is_alive() and got == [[{"n": 1}]]


def test_take_returns_after_its_timeout_when_nothing_comes_and_bounds_a_round():
    inbox = Inbox()
    assert inbox.take(0.05) == []
    for n in range(5):
        inbox.post({"n": n})
    assert [e["n"] for e in inbox.take(0, limit=3)] == [0, 1, 2]
    assert [e["n"] for e in inbox.take(0)] == [3, 4]
    assert inbox.take(0) == []
