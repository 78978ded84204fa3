"""What an actor's rank sends back for a call: its value, its error, "interrupted" or a bare
ok, each with the collectives the call started (for peers still waiting in one, see
`call_peers`). Nobody waits for a one-way broadcast (header id <= ONEWAY): its error goes to the
controller, which hands it to supervision, and the rest is not sent. The kinds of what ranks
publish for actors (requests to call an actor mesh, waits for their replies, one-way errors and waits) are named here."""

from __future__ import annotations

from typing import Any

from viceroy.runtime import call_peers, serialize
from viceroy.runtime import context as context_mod
from viceroy.runtime.actors import plain

REQUEST = "viceroy.actors.request"  # an endpoint calls an actor mesh: the controller relays it
ONEWAY_ERROR = "viceroy.actors.oneway_error"
OW_WAIT = "viceroy.actors.oneway_wait"  # a rank waits in a collective of a one-way call...
OW_DONE = "viceroy.actors.oneway_done"  # ...and a peer finished that call (see actors/host.py)
# An endpoint that holds its actor blocks on a request's reply ("over": no longer): the controller
# looks for a cycle of such waits between actors (see actors/cycles.py)
WAIT = "viceroy.actors.wait"
# An endpoint gave up on a request it awaited (its task was cancelled): the controller cancels the
# call it relayed, as it does its own calls whose awaiting task is cancelled (Future.__await__)
GIVE_UP = "viceroy.actors.give_up"
ONEWAY = 0  # the header id of broadcasts: nothing is sent back, unless it fails; ids <= 0 are one-way

rank: Any = None  # the Rank object, set by `host.handle` on the first actor message


def send(header: dict[str, Any], signed: list[Any], data: list[Any]) -> None:
    """An answer, with the collectives its call started (on peers still waiting in one, see
    `call_peers`): sent from within the call's context."""
    if cc := call_peers.counts():
        header["cc"] = cc
    rank._send_result(header, signed, data)


def oneway_done(actor: str, ow: int, asker: int, cc: Any) -> None:
    """This rank finished one-way call `ow` of `actor`, having started the collectives `cc`
    (or its actor is gone here: STOPPED): word for the rank that asked (see actors/host.py)."""
    rank._publish(OW_DONE, {"actor": actor, "ow": ow, "asker": asker, "cc": cc})


def interrupted(call_id: int, summary: str = "interrupted") -> None:
    if call_id > ONEWAY:
        send({"id": call_id, "ok": False, "kind": "interrupted", "summary": summary, "tb": ""}, [], [])


def ok(call_id: int) -> None:
    if call_id > ONEWAY:
        send({"id": call_id, "ok": True}, [], [])


def reply(call_id: int, value: Any, what: str = "") -> None:
    if value is None:
        ok(call_id)
        return
    if serialize.json_scalar(value):  # in the header, like a run's scalar result
        send({"id": call_id, "ok": True, "v": value}, [], [])
        return
    try:
        payload, bufs = plain.dumps(value)
    except Exception as exc:
        error(call_id, "TypeError",
               f"TypeError: {what} returned {type(value).__name__}, which cannot be sent back: {exc}. "
               "Return something picklable (or keep it on the actor and return a summary).")
        return
    send({"id": call_id, "ok": True}, [payload], [b.raw() for b in bufs])


def error(call_id: int, etype: str, summary: str, tb: str = "", where: tuple[str, str] = ("", "")) -> None:
    if call_id <= ONEWAY:  # nobody waits: the controller hands it to supervision
        context_mod.context()._publish(ONEWAY_ERROR, {"actor": where[0], "ep": where[1], "rank": rank.rank,
                                                      "etype": etype, "summary": summary, "tb": tb})
        return
    send({"id": call_id, "ok": False, "kind": "error", "etype": etype, "summary": summary, "tb": tb}, [], [])
