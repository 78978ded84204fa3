"""An agent's side of a call: its ranks' answers, collected and sent on as one message.

The controller's work per call should grow with hosts, not ranks; `aggregate` is where a host's
answers become one message, with plain values in columns the controller unpacks cheaply
(`Call.record_packed`).
"""

from __future__ import annotations

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
