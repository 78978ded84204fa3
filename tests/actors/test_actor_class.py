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

    with pytest.raises(TypeError, match=r"^spawn takes a subclass of viceroy\.Actor; Plain is not one: declare it "
                                        r"`class Plain\(vr\.Actor\)`, its endpoints marked @vr\.endpoint$"):
        spawn(None, Plain)  # type: ignore[arg-type]
    # An instance was shown as "got <...Base object at 0x7f...>"
    with pytest.raises(TypeError, match=r"^spawn takes the actor class, not an instance of it: mesh\.spawn\(Base, "
                                        r"\*args\) makes one per rank, with those arguments$"):
        spawn(None, Base.__new__(Base))  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"^spawn takes a subclass of viceroy\.Actor, got 'Base' \(str\)$"):
        spawn(None, "Base")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"endpoint name\(s\) stop clash with ActorMesh"):
        spawn(None, Clash)  # type: ignore[arg-type]


class Account(vr.Actor):
    def __init__(self, owner: str, balance: int = 0) -> None:
        self.owner, self.balance = owner, balance

    @vr.endpoint
    def who(self) -> str:
        return self.owner


class Ledger(vr.Actor):
    def __init__(self, *, owner: str = "bank") -> None:
        self.owner = owner


def test_a_constructor_owner_given_as_a_keyword_is_said_to_be_spawns_own(start_mesh):
    # It said only "missing a required argument: 'owner'", or "owner must be an ActorMesh or
    # have a __supervise__ method, got str": nothing about why, nor what to do.
    clash = (r"owner= is spawn's own keyword \(who hears of failures no caller waits for\), and "
             r"Account.__init__ also takes `owner`: pass Account's owner positionally, e\.g\. "
             r"mesh\.spawn\(Account, 'alice', \.\.\.\)")
    with pytest.raises(TypeError, match=r"missing a required argument: 'owner'\. Note: " + clash):
        spawn(None, Account, owner="alice")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=clash):
        spawn(None, Account, balance=5, owner="alice")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"owner must be an ActorMesh .* got str\. Note: .*Ledger's is "
                                        r"keyword-only, so spawn cannot pass it: rename that parameter"):
        spawn(None, Ledger, owner="alice")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"got str$"):  # no note for a class without an `owner`
        spawn(None, Base, 1, owner="alice")  # type: ignore[arg-type]
    mesh = start_mesh(gpus=1)
    assert mesh.spawn(Account, "alice").slice(gpus=0).who.call_one().get(timeout=10) == "alice"


class Statics(vr.Actor):
    @vr.endpoint
    @staticmethod
    def inner(x: int) -> int:
        return x

    @staticmethod
    @vr.endpoint
    def outer(x: int) -> int:
        return x + 1

    @vr.endpoint
    @classmethod
    def klass(cls, x: int) -> str:
        return f"{cls.__name__}{x}"


def test_static_and_class_methods_can_be_endpoints_with_their_own_signatures(start_mesh):
    # @vr.endpoint over @staticmethod dropped its first parameter as if it were self ("A.inner():
    # too many positional arguments"), under it the mark was not seen ("has no endpoint
    # 'outer'"), and over @classmethod it was refused ("decorates a method, got classmethod").
    eps = endpoints_of(Statics)
    assert {name: str(ep.signature) for name, ep in eps.items()} == {
        "inner": "(x: int) -> int", "outer": "(x: int) -> int", "klass": "(x: int) -> str"}
    actors = start_mesh(gpus=1).spawn(Statics)
    assert actors.inner.call_one(1).get(timeout=10) == 1
    assert actors.outer.call_one(1).get(timeout=10) == 2
    assert actors.klass.call_one(1).get(timeout=10) == "Statics1"
