"""A code string compiled once, by the controller, for all the ranks it goes to.

The controller compiles every code string it sends anyway: its syntax is checked before
anything goes out (`execution.check_syntax`). The first time a mesh is sent a text, the
compiled code goes with it, marshalled: a rank loads it in microseconds where compiling
takes ~30 us a line (a 40-line cell ~0.3 ms on every rank), and in a notebook most cells run
once per edit, so most texts are new. Marshal's format and bytecode belong to one Python
version and optimisation level, so the code travels with a tag, and a rank whose Python
differs compiles the text itself, as does a rank that gets a text again (it keeps what it
compiled) or that missed its first send (it was not in that call's view, or has restarted)."""

from __future__ import annotations

import importlib.util
import marshal
import sys
import threading
from collections import OrderedDict
from typing import Any

from viceroy.runtime.execution import compile_text

TAG = f"{importlib.util.MAGIC_NUMBER.hex()}-O{sys.flags.optimize}"
_KEPT = 256  # texts remembered as sent, as many as the ranks keep compiled


class Shipments:
    """The controller's side: which texts have gone out with their code."""

    def __init__(self) -> None:
        self._sent: OrderedDict[str, None] = OrderedDict()  # the last used last
        self._lock = threading.Lock()

    def code_for(self, source: str) -> bytes | None:
        """`source` compiled and marshalled, the first time it is sent; None after (it is
        remembered among the last texts sent)."""
        with self._lock:
            if source in self._sent:
                self._sent.move_to_end(source)
                return None
            self._sent[source] = None
            if len(self._sent) > _KEPT:
                self._sent.popitem(last=False)
        return marshal.dumps(compile_text(source))


def take(source: str, tag: str, blob: Any) -> None:
    """A rank's side: keep the code the controller compiled for `source` (`blob`, marshalled),
    where its Python is this rank's (`tag`); otherwise the rank compiles the text itself."""
    if tag == TAG:
        compile_text(source, shipped=lambda: marshal.loads(memoryview(blob)))
