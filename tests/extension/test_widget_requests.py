"""What the view's requests answer on a real mesh: log tails, tracebacks and stacks as text a
browser can show."""

from __future__ import annotations

import pytest

from tests.extension.test_ext_session import kill_rank, run
from viceroy.extension.comm import StateChannel
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
