import pytest

from viceroy.runtime.shape import Shape
from viceroy.runtime.values import ValueMesh


def vm(dims, values):
    s = Shape(dims)
    return ValueMesh(s, dict(zip(s.ranks, values, strict=True)))


def test_item_by_coordinates():
    v = vm({"hosts": 2, "gpus": 2}, [0, 10, 20, 30])
    assert v.item(hosts=1, gpus=0) == 20
    with pytest.raises(ValueError, match="missing gpus"):
        v.item(hosts=1)


def test_items_and_values_are_row_major():
    v = vm({"gpus": 3}, ["a", "b", "c"])
    assert v.values() == ["a", "b", "c"]
    assert list(v.items())[1] == ({"gpus": 1}, "b")
    assert len(v) == 3


def test_slicing_a_value_mesh_keeps_values_aligned():
    v = vm({"hosts": 2, "gpus": 2}, [0, 1, 2, 3])
    assert v.slice(gpus=1).values() == [1, 3]
    assert v.split(hosts=("a", "b"), b=1).item(a=1, b=0, gpus=1) == 3


def test_repr_collapses_equal_values():
    assert repr(vm({"gpus": 4}, [7, 7, 7, 7])) == "ValueMesh(gpus=4): all 7"
    text = repr(vm({"gpus": 4}, [1, 1, 2, 1]))
    assert "gpus=0-1,3: 1" in text and "gpus=2: 2" in text


def test_repr_lists_distinct_values_by_coordinate():
    text = repr(vm({"gpus": 2}, [0, 10]))
    assert "gpus=0: 0" in text and "gpus=1: 10" in text
