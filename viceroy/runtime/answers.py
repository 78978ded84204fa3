"""An agent's side of a call: its ranks' answers, collected and sent on as one message.

`Relay` holds the calls in flight on this host; `aggregate` makes one message of answers.

The controller's work per call should grow with hosts, not ranks; `aggregate` is where a host's
answers become one message, with plain values in columns the controller unpacks cheaply
(`Call.record_packed`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from viceroy.runtime.shape import rank_runs


@dataclass
class PendingCall:
    """A call this agent relayed: ranks yet to answer, and answers not yet sent on."""

    ranks: set[int]
    items: list[dict[str, Any]] = field(default_factory=list)
    signed: list[Any] = field(default_factory=list)
    data: list[Any] = field(default_factory=list)
    held_since: float | None = None  # answers held back, waiting for the host's other ranks


# The longest a rank's answer waits for the host's other ranks before it goes on alone: the
# controller tells ranks still in a call who finished it (see call_peers).
HOLD_S = 0.5

Send = Callable[[dict[str, Any], list[Any], list[Any]], None]


class Relay:
    """The calls an agent relayed to its ranks: their answers are collected and sent on as one
    message when every rank answered, at once for a failure (fail fast needs it without
    waiting for the slow ranks), or once held `HOLD_S`."""

    def __init__(self, send: Send) -> None:
        self._send = send
        self._calls: dict[int, PendingCall] = {}

    def expect(self, call_id: int, ranks: set[int], refused: list[dict[str, Any]]) -> None:
        """A call went to `ranks`; `refused` are answers for those it could not reach."""
        call = self._calls[call_id] = PendingCall(ranks, list(refused))
        self._flush(call_id, call, force=bool(refused))

    def answer(self, call_id: int, item: dict[str, Any], signed: list[Any], data: list[Any]) -> None:
        """One rank's answer (dropped if not awaited: late, or repeated)."""
        call = self._calls.get(call_id)
        r = item["r"]
        if call is None or r not in call.ranks:
            return
        call.ranks.discard(r)
        call.items.append(item)
        call.signed.extend(signed)
        call.data.extend(data)
        if call.held_since is None:
            call.held_since = time.monotonic()
        self._flush(call_id, call, force=not item["ok"])

    def rank_gone(self, r: int) -> None:
        """Rank `r` died: no call waits for it any longer (the controller hears of the death)."""
        for call_id, call in list(self._calls.items()):
            if r in call.ranks:
                call.ranks.discard(r)
                self._flush(call_id, call)

    def flush_held(self, longest: float) -> float:
        """Send on answers held `HOLD_S`; returns how long until the next is due (at most
        `longest`)."""
        now, due = time.monotonic(), longest
        for call_id, call in list(self._calls.items()):
            if call.held_since is not None:
                if now - call.held_since >= HOLD_S:
                    self._flush(call_id, call, force=True)
                else:
                    due = min(due, call.held_since + HOLD_S - now)
        return due

    def _flush(self, call_id: int, call: PendingCall, force: bool = False) -> None:
        if not (force or not call.ranks):
            return
        if call.items:
            self._send(*aggregate(call_id, call.items, call.signed, call.data))
            call.items, call.signed, call.data = [], [], []
            call.held_since = None
        if not call.ranks:
            del self._calls[call_id]


def aggregate(call_id: int, items: list[dict[str, Any]], signed: list[Any], data: list[Any]) -> tuple[dict[str, Any], list[Any], list[Any]]:
    """Many ranks' answers as one message to the controller, plain successes in columns, in
    rank order, their ranks as ``[start, stop)`` runs (one run for a whole host):

    - ``vals``: ``[runs, values]`` for scalar results, which came in the ranks' headers
      (`serialize.json_scalar`);
    - ``done`` and ``packed``: the ranks of other plain results (a pickle without arrays, or
      no value) and the length of each one's pickle (0 for none; ``packed`` left out when no
      rank has one), the pickles joined in one leading signed frame.

    The controller's work for a column is a few C-speed passes (`Call.record_scalars`,
    `Call.record_packed`), not Python per rank. The rest go item by item."""
    scalars: list[tuple[int, Any]] = []
    plain: list[tuple[int, bytes]] = []
    rest: list[dict[str, Any]] = []
    rest_signed: list[Any] = []
    rest_data: list[Any] = []
    si = di = 0
    for item in items:
        ns, nd = item.get("signed", 0), len(item.get("lens", ()))
        sig, dat = signed[si : si + ns], data[di : di + nd]
        si, di = si + ns, di + nd
        columnar = item.get("ok") and "cc" not in item  # collective counts (call_peers) go whole
        if columnar and "v" in item:
            scalars.append((item["r"], item["v"]))
        elif columnar and ns <= 1 and not nd and "shm" not in item:
            raw = (sig[0].bytes if hasattr(sig[0], "bytes") else bytes(sig[0])) if ns else b""
            plain.append((item["r"], raw))
        else:
            rest.append(item)
            rest_signed.extend(sig)
            rest_data.extend(dat)
    header: dict[str, Any] = {"op": "results", "id": call_id, "items": rest}
    if scalars:
        scalars.sort(key=_first)
        header["vals"] = [rank_runs(r for r, _ in scalars), [v for _, v in scalars]]
    if plain:
        plain.sort(key=_first)
        header["done"] = rank_runs(r for r, _ in plain)
        if any(raw for _, raw in plain):
            header["packed"] = [len(raw) for _, raw in plain]
        rest_signed.insert(0, b"".join(raw for _, raw in plain))
    return header, rest_signed, rest_data


def _first(pair: tuple[int, Any]) -> int:
    return pair[0]
