"""An agent's side of a call: its ranks' answers, collected and sent on as one message.

The controller's work per call should grow with hosts, not ranks; `aggregate` is where a host's
answers become one message, with plain values in columns the controller unpacks cheaply
(`Controller._record_packed`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class PendingCall:
    """A call this agent relayed: ranks yet to answer, and answers not yet sent on."""

    ranks: set[int]
    items: list[dict[str, Any]] = field(default_factory=list)
    signed: list[Any] = field(default_factory=list)
    data: list[Any] = field(default_factory=list)


def aggregate(call_id: int, items: list[dict[str, Any]], signed: list[Any], data: list[Any]) -> tuple[dict[str, Any], list[Any], list[Any]]:
    """Many ranks' answers as one message to the controller. Plain successes (a value, or none,
    without arrays) go as two columns: ``done`` (their ranks) and ``packed`` (the length of each
    one's pickle, 0 for no value), the pickles joined in one leading signed frame; the
    controller's work for them is then a slice and an unpickle each. The rest go item by item."""
    done: list[int] = []
    lens: list[int] = []
    pickles: list[bytes] = []
    rest: list[dict[str, Any]] = []
    rest_signed: list[Any] = []
    rest_data: list[Any] = []
    si = di = 0
    for item in items:
        ns, nd = item.get("signed", 0), len(item.get("lens", ()))
        sig, dat = signed[si : si + ns], data[di : di + nd]
        si, di = si + ns, di + nd
        if item.get("ok") and ns <= 1 and not nd and "shm" not in item:
            raw = (sig[0].bytes if hasattr(sig[0], "bytes") else bytes(sig[0])) if ns else b""
            done.append(item["r"])
            lens.append(len(raw))
            pickles.append(raw)
        else:
            rest.append(item)
            rest_signed.extend(sig)
            rest_data.extend(dat)
    header: dict[str, Any] = {"op": "results", "id": call_id, "items": rest}
    if done:
        header["done"], header["packed"] = done, lens
        rest_signed.insert(0, b"".join(pickles))
    return header, rest_signed, rest_data
