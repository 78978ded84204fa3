"""The actor class surface, checked in-process (no mesh): endpoints, options, signatures."""

from __future__ import annotations

import pytest

import viceroy as vr
from viceroy.runtime.actors.actor import check_constructor, endpoints_of
from viceroy.runtime.actors.spawn import spawn


class Base(vr.Actor):
    def __init__(self, a: int, *, b: str = "x") -> None:
        self.a = a

    @vr.endpoint
    def ping(self) -> int:
        return self.a

    @vr.endpoint
    def shadowed(self) -> None:
        pass


class Child(Base):
    @vr.endpoint(concurrent=True)
    async def overlap(self, n: int) -> int:
        return n

    def shadowed(self) -> None:  # overridden without @endpoint: no longer callable from outside
        pass


def test_endpoints_are_collected_through_inheritance_with_their_options():
    eps = endpoints_of(Child)
    assert sorted(eps) == ["overlap", "ping"]
    assert eps["overlap"].concurrent and eps["overlap"].is_async
    assert not eps["ping"].concurrent and not eps["ping"].is_async
    assert str(eps["overlap"].signature) == "(n: int) -> int"


def test_endpoints_stay_plain_methods_locally():
    assert Child(3).ping() == 3


def test_concurrent_needs_an_async_endpoint():
    with pytest.raises(TypeError, match=r"concurrent=True.*only async def endpoints can overlap"):

        class Bad(vr.Actor):
            @vr.endpoint(concurrent=True)
            def sync(self) -> None:
                pass


def test_constructor_arguments_are_checked_against_init():
    check_constructor(Base, (1,), {"b": "y"})
    with pytest.raises(TypeError, match=r"Base\(a: int, \*, b: str = 'x'\): missing a required argument: 'a'"):
        check_constructor(Base, (), {})


def test_spawn_refuses_what_is_not_an_actor_and_names_that_clash():
    class Plain:
        pass

    class Clash(vr.Actor):
        @vr.endpoint
        def stop(self) -> None:
            pass

    with pytest.raises(TypeError, match=r"spawn takes a subclass of viceroy\.Actor"):
        spawn(None, Plain)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"endpoint name\(s\) stop clash with ActorMesh"):
        spawn(None, Clash)  # type: ignore[arg-type]
