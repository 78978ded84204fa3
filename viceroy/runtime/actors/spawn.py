"""`spawn`: one actor per rank of a mesh (`Mesh.spawn` calls this)."""

from __future__ import annotations

import inspect
import linecache
import os
import reprlib
from typing import TYPE_CHECKING, Any

from viceroy.runtime.actors.actor import Actor, check_constructor, endpoints_of
from viceroy.runtime.actors.actor_mesh import ActorMesh, ActorMeshInfo
from viceroy.runtime.actors.registry import ActorRecord, registry_for

if TYPE_CHECKING:
    from viceroy.runtime.mesh import Mesh

_RESERVED = set(dir(ActorMesh))


def spawn(mesh: Mesh, cls: type[Actor], *args: Any, owner: Any = None, **kwargs: Any) -> ActorMesh:
    """Construct ``cls(*args, **kwargs)`` on every rank of `mesh`; -> an `ActorMesh` shaped like it.

    >>> counters = mesh.spawn(Counter, 0)
    >>> counters.incr.call(by=2).get()

    The class travels by value (it may be defined in the notebook). Arguments are checked
    against ``cls.__init__`` here, before anything is sent; a constructor that raises on some
    ranks raises a MeshError naming them (the actors made elsewhere are stopped).
    owner (spawn's own keyword; a constructor parameter named ``owner`` is passed positionally):
    who hears of failures no caller waits for (a rank death, a
    broadcast that raised): an ActorMesh, whose actors' ``__supervise__(failure)`` run, or any
    object with a ``__supervise__`` method (run on the controller). Default: nobody; the failure
    is kept in ``actors.unhandled`` and printed once.
    """
    if not (isinstance(cls, type) and issubclass(cls, Actor)):
        raise TypeError(_not_an_actor_class(cls))
    endpoints = endpoints_of(cls)
    clash = sorted(set(endpoints) & _RESERVED)
    if clash:
        raise TypeError(f"{cls.__name__}: endpoint name(s) {', '.join(clash)} clash with ActorMesh's own "
                        "attributes; rename them")
    owner_note = _owner_clash(cls, owner)
    try:
        check_constructor(cls, args, kwargs)
    except TypeError as exc:
        raise TypeError(f"{exc}{owner_note}") from None
    if owner is not None and not isinstance(owner, ActorMesh) and not callable(getattr(owner, "__supervise__", None)):
        raise TypeError(f"owner must be an ActorMesh or have a __supervise__ method, got {type(owner).__name__}{owner_note}")
    controller = mesh._controller
    controller._check_open()
    registry = registry_for(controller)
    info = ActorMeshInfo(registry.new_id(cls.__name__), cls.__name__, controller.token, endpoints)
    record = ActorRecord(controller, info, mesh._shape, owner, ({}, [], []))
    signed, data = _repack(record, cls, args, kwargs)
    extra: dict[str, Any] = {"a": "spawn", "actor": info.id, "name": cls.__name__, "sources": _sources_of(cls),
                            "files": _filenames_of(cls)}
    shape = mesh._shape
    if shape is not controller.shape and shape != controller.shape:  # the actors run within the view
        extra["spawned_on"] = [list(shape.dims), list(shape.dims.values()), shape.runs()]
    record.spawn_msg = (extra, signed, data)
    registry.records[info.id] = record
    try:
        record.spawn_on(list(mesh._shape.ranks), None, all_or_nothing=True)
    except BaseException:
        registry.records.pop(info.id, None)
        raise
    return registry.mesh(info, mesh._shape)


def _not_an_actor_class(cls: Any) -> str:
    if isinstance(cls, Actor):
        name = type(cls).__name__
        return (f"spawn takes the actor class, not an instance of it: mesh.spawn({name}, *args) makes one per "
                "rank, with those arguments")
    if isinstance(cls, type):
        return (f"spawn takes a subclass of viceroy.Actor; {cls.__name__} is not one: declare it "
                f"`class {cls.__name__}(vr.Actor)`, its endpoints marked @vr.endpoint")
    return f"spawn takes a subclass of viceroy.Actor, got {reprlib.repr(cls)} ({type(cls).__name__})"


def _owner_clash(cls: type, owner: Any) -> str:
    """What to add to an error when ``owner=`` was given and ``cls.__init__`` takes an `owner`
    too (spawn keeps the keyword for itself); "" otherwise."""
    if owner is None or cls.__init__ is object.__init__:  # type: ignore[misc]
        return ""
    try:
        param = inspect.signature(cls.__init__).parameters.get("owner")  # type: ignore[misc]
    except (TypeError, ValueError):
        return ""
    if param is None:
        return ""
    name = cls.__name__
    if param.kind in (param.POSITIONAL_ONLY, param.POSITIONAL_OR_KEYWORD):
        how = (f"pass {name}'s owner positionally, e.g. mesh.spawn({name}, {reprlib.repr(owner)}, ...), and "
               "spawn's owner= only for a supervisor")
    else:
        how = f"{name}'s is keyword-only, so spawn cannot pass it: rename that parameter"
    return (f". Note: owner= is spawn's own keyword (who hears of failures no caller waits for), and "
            f"{name}.__init__ also takes `owner`: {how}")


def _repack(record: ActorRecord, cls: type, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[list[Any], list[Any]]:
    from viceroy.runtime import serialize

    refs: list[Any] = []
    try:
        payload, bufs = serialize.dumps((cls, args, kwargs), seen_refs=refs)
    except Exception:
        what = f"spawn {cls.__name__}:"
        serialize.check_picklable({f"{what} the actor class": cls}
                                  | {f"{what} argument {i}": a for i, a in enumerate(args)}
                                  | {f"{what} argument {k!r}": v for k, v in kwargs.items()})
        raise
    for ref in refs:
        ref.check_usable_on(record.controller, record.shape)
    return [payload], [b.raw() for b in bufs]


def _functions_of(cls: type) -> list[Any]:
    fns = []
    for klass in cls.__mro__:
        for attr in vars(klass).values():
            fn = getattr(attr, "__func__", attr)
            if getattr(fn, "__code__", None) is not None:
                fns.append(fn)
    return fns


def _filenames_of(cls: type) -> dict[str, str]:
    """qualname -> file of each method: cloudpickle sends classes defined in a notebook or a
    script's __main__ with their files renamed "<dynamic-code>"; the ranks put them back, so
    tracebacks name the user's file and line."""
    return {fn.__qualname__: fn.__code__.co_filename for fn in _functions_of(cls)}


def _sources_of(cls: type) -> dict[str, str]:
    """Source of notebook cells the class's methods come from (files that exist nowhere else),
    so the ranks' tracebacks show the user's lines."""
    out: dict[str, str] = {}
    for fn in _functions_of(cls):
        filename = fn.__code__.co_filename
        if filename in out or os.path.exists(filename):
            continue
        lines = linecache.getlines(filename)
        if lines:
            out[filename] = "".join(lines)
    return out
