"""Why members gave a generation of a group up, kept in the rendezvous store under it, and
the root cause they point to ("rank a lost rank b" followed to the rank that started it).
See `communicators` for generations."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import Any


@dataclass
class Record:
    """Why a member gave up a generation of a group."""

    rank: int
    reason: str
    time: float
    lost: int | None = None  # the rank whose connection it lost, if that was the failure
    stale: bool = False  # it left an attempt of its own that an interrupt cut short
    shared: bool = False  # `reason` is the group's failure, not this member's ("ranks 2-3 did not join")


def write_record(store: Any, prefix: str, record: Record) -> None:
    store.append(f"{prefix}/aborts", json.dumps(asdict(record)) + "\n")


def read_records(store: Any, prefix: str) -> list[Record]:
    if not store.check([f"{prefix}/aborts"]):
        return []
    out = []
    for line in store.get(f"{prefix}/aborts").decode().splitlines():
        d = json.loads(line)
        out.append(Record(int(d["rank"]), str(d["reason"]), float(d["time"]), d.get("lost"), bool(d.get("stale")),
                          bool(d.get("shared"))))
    return out


def root_cause(records: list[Record], lost: int | None, fallback: str) -> str:
    """Follow "rank a lost rank b" to the rank that started it: one that was interrupted or
    failed (it says so), or one that left no record (it died)."""
    if lost is None:
        return records[0].reason if records else fallback
    first: dict[int, Record] = {}
    for r in records:
        first.setdefault(r.rank, r)
    seen: set[int] = set()
    x = lost
    while x not in seen:
        seen.add(x)
        rec = first.get(x)
        if rec is None:
            return f"the connection to rank {x} was lost (it died, or left the collective)"
        if rec.lost is None:
            return rec.reason
        x = rec.lost
    return fallback
