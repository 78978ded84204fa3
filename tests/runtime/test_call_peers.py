"""The rank-side bookkeeping of calls that failed here while their peers may still run them
(viceroy.runtime.settling), in one process: the controller's word "settled" may come before
or after the rank's own failure, and neither order may hold a later collective."""

from __future__ import annotations

import time

import pytest

from viceroy.runtime import settling


@pytest.fixture(autouse=True)
def fresh_state(monkeypatch):
    monkeypatch.setattr(settling, "_unsettled", set())
    monkeypatch.setattr(settling, "_settled_early", set())


def _waits(slice_s: float = 0.01) -> float:
    t0 = time.monotonic()
    settling.wait_settled(slice_s)
    return time.monotonic() - t0


def test_a_failed_call_holds_the_next_collective_until_it_settles(monkeypatch):
    monkeypatch.setattr(settling, "SETTLE_WAIT_S", 0.3)
    settling.failed(5)
    assert _waits() >= 0.3  # no word: it waited its whole bound
    settling.failed(6)
    settling.settled(6)
    assert _waits() < 0.3


def test_settled_before_it_failed_here_holds_nothing(monkeypatch):
    # The controller gave up on this rank (it did not stop in time) and ended the call; the
    # rank's failure comes later.
    monkeypatch.setattr(settling, "SETTLE_WAIT_S", 5)
    settling.settled(7)
    settling.failed(7)
    assert _waits() < 1


def test_the_word_for_a_call_that_then_succeeded_here_is_dropped_at_the_next_call():
    # Given up on, the call went on to succeed here: no failure ever claims the word, which
    # was kept for good (one entry per such call) until the next call on the main thread.
    settling.settled(7)
    settling.main_call_starts(7)
    assert settling._settled_early == {7}
    settling.main_call_starts(8)
    assert settling._settled_early == set()
