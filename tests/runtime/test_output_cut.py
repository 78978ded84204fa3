"""Where a rank's output is cut when it reaches the per-call limit: after the last whole line
that fits, never inside one (a piece of a line reads as a different line)."""

from viceroy.runtime.output import cut_at

CHUNK = b"00005140 xxxx\n00005141 xxxx\n"


def test_the_cut_falls_after_the_last_whole_line_that_fits():
    assert cut_at(CHUNK, room=20, first=False) == 14
    assert cut_at(CHUNK, room=len(CHUNK), first=False) == len(CHUNK)


def test_when_no_whole_line_fits_nothing_more_is_sent():
    # (it used to send the first `room` bytes: "0000", a line of its own downstream)
    assert cut_at(CHUNK, room=4, first=False) == 0


def test_a_first_line_longer_than_the_whole_limit_still_shows_its_start():
    assert cut_at(b"y" * 100, room=10, first=True) == 10
    assert cut_at(CHUNK, room=4, first=True) == 4
