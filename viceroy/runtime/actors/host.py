"""The ranks' side of actors. `handle` runs on a rank's control thread for every "actor"
message and never blocks: each actor has its own thread and event loop, and a FIFO queue of
messages (`actor_thread`), so one actor handles its messages in order while other actors, and %%mesh cells on
the main thread, go on.

An actor spawned on a view of the mesh (a slice, a split) runs its constructor, endpoints and
hooks within that view: `vr.context()` gives its coords and dims there, and collectives with no
dims cover the actor mesh's ranks (as for `view.run(...)`).

An actor mesh passed to an actor arrives as an `ActorMesh` whose client is
`rank_client.RankClient`: its calls go to the controller as requests, which sends them on and
replies (the replies come here, kind "reply").

Collectives in endpoints are watched by their call (`call_peers`). A call sent to part of the
actor mesh knows which actors it was not sent to. A one-way broadcast (header id 0) carries an
id of its own ("ow", negative): a rank waiting in one of its collectives asks the controller
(OW_WAIT), which asks the others (kind "ow_status"); those that finished it say so (OW_DONE),
and the controller passes their word on (kind "ow_peers"). One whose actor is gone here (stopped)
says so: it will never run the call. One still running it answers once it finishes it; an asker
that finished it (its broadcast raised, and its next collective waits for the others) says so
in the question, which a peer waiting in a collective of the call takes as word of it."""

from __future__ import annotations

from typing import Any

from viceroy.runtime import call_peers, shm
from viceroy.runtime.actors import actor_thread, answers, output
from viceroy.runtime.actors.actor_thread import ActorHost
from viceroy.runtime.actors.rank_client import resolve_reply
from viceroy.runtime.execution import format_user_traceback, register_source


def handle(rank: Any, header: dict[str, Any], signed: list[Any], data: list[Any]) -> None:
    """Entry point from the rank's control thread."""
    answers.rank = rank
    call_id, kind = header["id"], header["a"]
    try:
        if "shm" in header:
            data = shm.restore(data, header["shm"], rank.token, unlink=False)
        if kind == "reply":
            answers.ok(call_id)
            resolve_reply(header["req"], signed, data)
            return
        if kind == "ow_status":  # a peer waits in a collective of one-way call "ow": finished here?
            asked = actor_thread.get(header["actor"])  # None: stopped (before the controller knew)
            cc = (call_peers.STOPPED if asked is None
                  else asked.finished_oneway(header["ow"], int(header["asker"]), header.get("asker_cc")))
            if cc is not None:
                answers.oneway_done(header["actor"], header["ow"], header["asker"], cc)
            return
        if kind == "ow_peers":  # the controller's word on a one-way call this rank waits in
            call_peers.peers_done(header["ow"], {int(r): cc for r, cc in header["done"]})
            return
        if kind == "spawn":
            output.install(rank._send_output)
            for filename, source in header.get("sources", {}).items():
                register_source(filename, source)
            host = ActorHost(header["actor"], header["name"], header.get("spawned_on"))
            actor_thread.add(host)
            host.files = header.get("files", {})
            # A restart respawns some actors only: the others do not run the constructor.
            host.post((call_id, "spawn", None, signed, data, False, host.outside(header["ranks"])))
            return
        host_ = actor_thread.get(header["actor"])
        if host_ is None and kind == "stop":
            answers.ok(call_id)  # stopped already (a drop's stop, say): what the stop asks for
        elif host_ is None:
            answers.error(call_id, "RuntimeError", f"RuntimeError: no actor {header['actor']!r} on rank {rank.rank} "
                   "(it was stopped, or never started here)", "", (header["actor"], header.get("ep", "")))
        elif kind == "call":
            args = (tuple(header["args"]), header["kw"]) if "args" in header else signed  # see plain.inline
            host_.post((header.get("ow", call_id), "call", header["ep"], args, data, call_id == answers.ONEWAY,
                        host_.outside(header["ranks"])))
        elif kind == "batch":  # queued broadcasts, sent together (see oneway.py)
            outside = host_.outside(header["ranks"])
            host_.post_many([(ow, "call", ep, [payload], [], True, outside)
                             for ep, payload, ow in zip(header["eps"], signed, header["ows"], strict=True)])
        elif kind == "supervise":
            host_.post((call_id, "supervise", None, signed, data, False, ()))
        elif kind == "stop":  # at once: no new calls, running async endpoints cancelled
            host_.begin_stop(cancel=not header.get("drain"))  # (drain: a dropped handle's stop)
            host_.post((call_id, "stop", None, signed, data, False, ()))
    except BaseException as exc:  # never let the control thread die
        answers.error(call_id, *format_user_traceback(exc))


def cancel(rank: Any, call_id: int) -> bool:
    """For the rank's control thread, on a cancel: True when `call_id` is an actor call here
    (queued: answered "interrupted" at once; running async: cancelled)."""
    return actor_thread.cancel(call_id)
