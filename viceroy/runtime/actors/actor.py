"""`Actor` and `@endpoint`: what a user writes. An actor is a class whose instances live on the
ranks, one per rank of the mesh it was spawned on; its endpoints are the methods other code may
call from outside.

    class Counter(vr.Actor):
        def __init__(self, start: int):
            self.n = start

        @vr.endpoint
        def incr(self, by: int = 1) -> int:
            self.n += by
            return self.n
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar, overload

F = TypeVar("F", bound=Callable[..., Any])

_MARK = "__viceroy_endpoint__"


class Actor:
    """Base class of actors. Subclass it, mark the methods callable from outside with
    `@endpoint`, and spawn one instance per rank with ``mesh.spawn(MyActor, *args)``.

    Optional hooks, run on the actor's own thread:
      ``__supervise__(self, failure)``: an actor mesh this actor owns lost an actor (its rank
          died, or a `broadcast` to it raised); return True when handled.
      ``__cleanup__(self)``: runs when the actor mesh is stopped: by ``stop()`` (which raises a
          MeshError naming the ranks where it raised), once no handle is left, or as the mesh
          shuts down (within ~1.5 s for all actors; errors, and actors still busy in a sync
          endpoint then, are printed).
    """


@dataclass(frozen=True)
class EndpointSpec:
    """What the controller knows of one endpoint: enough to check arguments before sending."""

    name: str
    qualname: str
    signature: inspect.Signature
    concurrent: bool
    is_async: bool

    def check(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        """Raise TypeError naming the endpoint when these arguments do not fit it."""
        try:
            self.signature.bind(*args, **kwargs)
        except TypeError as exc:
            shown = self.signature.replace(return_annotation=inspect.Signature.empty)
            raise TypeError(f"{self.qualname}{shown}: {exc}") from None


@overload
def endpoint(fn: F, /) -> F: ...
@overload
def endpoint(*, concurrent: bool = False) -> Callable[[F], F]: ...


def endpoint(fn: Callable[..., Any] | None = None, /, *, concurrent: bool = False) -> Any:
    """Mark an actor method as callable from outside (sync or ``async def``; a static or class
    method too, above or below its decorator).

    By default an actor handles its messages one at a time, in the order sent, async ones too:
    such an endpoint cannot wait for a call that includes its own actor (the wait raises at
    once), nor close a cycle of waits through other actors (A's endpoint waits for B's, which
    waits for a call on A: the wait that closes the cycle raises RuntimeError at once, naming
    them, and its call is cancelled). ``@endpoint(concurrent=True)`` on an ``async def`` lets
    calls start in order but overlap while they await, so it may await one.
    """

    def mark(f: Any) -> Any:
        fn = f.__func__ if isinstance(f, staticmethod | classmethod) else f  # the mark goes on the function
        if not callable(fn):
            raise TypeError(f"@endpoint decorates a method, got {type(f).__name__}")
        if concurrent and not inspect.iscoroutinefunction(fn):
            raise TypeError(
                f"@endpoint(concurrent=True) on {fn.__qualname__}: only async def endpoints can "
                "overlap; make it async or drop concurrent=True"
            )
        setattr(fn, _MARK, {"concurrent": concurrent})
        return f

    return mark(fn) if fn is not None else mark


class _Annotation(str):
    """A string annotation (``from __future__ import annotations``) shown without quotes."""

    def __repr__(self) -> str:
        return str(self)


def _readable(sig: inspect.Signature, drop_first: bool = True) -> inspect.Signature:
    def plain(a: Any) -> Any:
        return _Annotation(a) if isinstance(a, str) else a

    params = list(sig.parameters.values())[1 if drop_first else 0 :]
    return sig.replace(parameters=[p.replace(annotation=plain(p.annotation)) for p in params],
                       return_annotation=plain(sig.return_annotation))


def endpoints_of(cls: type) -> dict[str, EndpointSpec]:
    """The endpoints of an actor class, inherited ones included."""
    found: dict[str, EndpointSpec] = {}
    for klass in reversed(cls.__mro__):
        for name, attr in vars(klass).items():
            fn = attr.__func__ if isinstance(attr, staticmethod | classmethod) else attr
            opts = getattr(fn, _MARK, None)
            if opts is None:
                found.pop(name, None)  # overridden without @endpoint: no longer an endpoint
                continue
            found[name] = EndpointSpec(
                name=name,
                qualname=f"{cls.__name__}.{name}",
                # without self (or cls); a static method has neither
                signature=_readable(inspect.signature(fn), drop_first=not isinstance(attr, staticmethod)),
                concurrent=bool(opts["concurrent"]),
                is_async=inspect.iscoroutinefunction(fn),
            )
    return found


def check_constructor(cls: type, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    """Raise TypeError on the controller when the arguments do not fit ``cls.__init__``."""
    init = cls.__init__  # type: ignore[misc]
    if init is object.__init__:
        if args or kwargs:
            raise TypeError(f"{cls.__name__}() takes no arguments (it defines no __init__)")
        return
    sig = _readable(inspect.signature(init)).replace(return_annotation=inspect.Signature.empty)
    try:
        sig.bind(*args, **kwargs)
    except TypeError as exc:
        raise TypeError(f"{cls.__name__}{sig}: {exc}") from None
