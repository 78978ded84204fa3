"""Actors: long-lived objects on the ranks, one per rank, called through endpoints.

actor.py        `Actor`, `@endpoint` (what users write)
actor_mesh.py   `ActorMesh` and its `Endpoint` adverbs (call, call_one, choose, broadcast, stream)
stream.py       a `stream()`'s values as they come, for `for` and `async for`
spawn.py        `spawn(mesh, cls, ...)`, behind `Mesh.spawn`
registry.py     the controller's records of actor meshes; relays calls ranks make
cycles.py       cycles of waits between actors (calls ranks make), failed at once
oneway.py       pipelined broadcasts, coalesced into one message per rank
supervision.py  `ActorFailure`, and where failures go when no caller waits for them
host.py         the ranks' side: actor messages from the control thread, handed to...
actor_thread.py ...one thread (and an event loop for async endpoints) per actor
answers.py      what a rank sends back for an actor call
rank_client.py  actor meshes used from a rank: calls go through the controller
plain.py        plain arguments and results pickled by the C pickler
"""

from viceroy.runtime.actors.actor import Actor, endpoint
from viceroy.runtime.actors.actor_mesh import ActorMesh, Endpoint
from viceroy.runtime.actors.spawn import spawn
from viceroy.runtime.actors.supervision import ActorFailure

__all__ = ["Actor", "ActorFailure", "ActorMesh", "Endpoint", "endpoint", "spawn"]

