"""Why a rank died, when its last words say: C++ code that ends the process (an uncaught
exception: ``std::terminate``, then SIGABRT) writes the exception to stderr first, and some of
those causes are ours to explain in the words of the call that failed."""

from __future__ import annotations

import re
from collections.abc import Callable

_TERMINATE = re.compile(r"terminate called after throwing an instance of '([^']+)'\n\s*what\(\):\s*(.*)")
_WHERE = re.compile(r"^\[[^\]]*\]\s*")  # "[enforce fail at .../pair.cc:456] "
_GLOO_SIZES = ("op.preamble.length <= op.nbytes", "Received data size doesn't match expected size")

GLOO_SIZE_MISMATCH = (
    "gloo ended it on receiving more bytes than it expected: the ranks passed tensors of "
    "different sizes or dtypes to a collective (every member must pass the same)"
)


def explain(reason: str, last_words: Callable[[], str]) -> str | None:
    """What ended a rank that died for `reason` (``"SIGABRT"``), from the tail of its output
    (`last_words()`, read only for such a death); None when it does not say."""
    if reason != "SIGABRT":
        return None
    found = list(_TERMINATE.finditer(last_words()))
    if not found:
        return None
    kind, what = found[-1].group(1), found[-1].group(2).strip()
    if any(s in what for s in _GLOO_SIZES):
        return GLOO_SIZE_MISMATCH
    what = _WHERE.sub("", what)
    return f"C++ code ended it: uncaught {kind}: {what[:200]}"
