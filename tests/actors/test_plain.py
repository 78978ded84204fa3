"""The fast path for plain values: what takes it, and that everything reads back the same."""

from __future__ import annotations

import numpy as np

import viceroy as vr
from viceroy.runtime import serialize
from viceroy.runtime.actors import plain


class Point:
    def __init__(self, x: int) -> None:
        self.x = x


def test_plain_values_are_recognised_and_others_are_not():
    assert plain.is_plain(((1, "a", 2.5, None, True, b"x"), {"by": 2}))
    assert plain.is_plain([{"k": [1, 2]}, (3j,)])
    assert not plain.is_plain(((Point(1),), {}))
    assert not plain.is_plain({1: "int keys go the slow way"})
    assert not plain.is_plain((np.zeros(3),))
    assert not plain.is_plain(list(range(100)))  # long containers: not worth scanning
    assert not plain.is_plain([[[[[1]]]]])  # deep ones neither


def test_both_paths_read_back_with_serialize_loads():
    fn = lambda v: v + 1  # noqa: E731  (code travels by value: the slow path)
    for value in [((1, "a"), {"by": 2}), [None, 1.5], ((Point(3), fn), {}), np.arange(5000.0)]:
        payload, bufs = plain.dumps(value)
        back = serialize.loads(payload, [b.raw() for b in bufs])
        if isinstance(value, np.ndarray):
            assert (back == value).all()
        elif isinstance(value, tuple) and isinstance(value[0][0], Point):
            assert back[0][0].x == 3 and back[0][1](1) == 2
        else:
            assert back == value


def test_scalar_arguments_go_inline_and_keep_their_types():
    assert plain.inline((1, 2.0, True, None, "s"), {"by": -0.0}) == {"args": [1, 2.0, True, None, "s"],
                                                                     "kw": {"by": -0.0}}
    assert plain.inline(((1,),), {}) is None  # a tuple would come back a list: pickled
    assert plain.inline((np.float32(1),), {}) is None
    assert plain.inline(("x" * 5000,), {}) is None


class Echo(vr.Actor):
    @vr.endpoint
    def types(self, *args: object, **kwargs: object) -> list[tuple[str, object]]:
        return [(type(v).__name__, v) for v in (*args, *kwargs.values())]


def test_inline_and_pickled_arguments_arrive_the_same(start_mesh):
    mesh = start_mesh(gpus=1)
    echo = mesh.spawn(Echo)
    got = echo.types.call_one(1, 2.0, True, None, "s", big=2**70, nan=float("inf")).get()
    assert got == [("int", 1), ("float", 2.0), ("bool", True), ("NoneType", None), ("str", "s"),
                   ("int", 2**70), ("float", float("inf"))]
    assert echo.types.call_one((1, 2), [3]).get() == [("tuple", (1, 2)), ("list", [3])]
