"""The fast path for plain values: what takes it, and that everything reads back the same."""

from __future__ import annotations

import numpy as np

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
