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


def test_repr_names_groups_by_coordinates_over_several_dims():
    # A group was labelled by row-major positions ("positions 0,2,4,6"), which are neither
    # ranks nor coordinates.
    text = repr(vm({"dp": 2, "tp": 4}, [0, 1, 0, 1, 0, 1, 0, 1]))
    assert text.splitlines()[1:] == ["  tp=0,2: 0", "  tp=1,3: 1"]
    text = repr(vm({"dp": 2, "tp": 4}, [0, 0, 0, 0, 1, 1, 1, 1]))
    assert text.splitlines()[1:] == ["  dp=0: 0", "  dp=1: 1"]
    # Not a product of per-dim sets: split along the leading dim.
    text = repr(vm({"dp": 2, "tp": 2}, ["a", "b", "b", "b"]))
    assert text.splitlines()[1:] == ["  dp=0, tp=0: 'a'", "  dp=0, tp=1; dp=1: 'b'"]


def test_a_selection_names_the_ranks_its_positions_hold():
    # `%%mesh --ranks 1,3` (mesh.select([1, 3])) showed "ranks=0: 10" for rank 1's value: its dim
    # is named "ranks", but counts positions in the selection.
    s = Shape({"gpus": 4}).select([1, 3])
    assert repr(ValueMesh(s, {1: 10, 3: 30})).splitlines() == [
        "ValueMesh(ranks=2):", "  ranks=0 (rank 1): 10", "  ranks=1 (rank 3): 30"]
    s = Shape({"gpus": 4}).select([3, 1, 2])
    assert repr(ValueMesh(s, {3: "a", 1: "a", 2: "b"})).splitlines()[1:] == [
        "  ranks=0-1 (ranks 1,3): 'a'", "  ranks=2 (rank 2): 'b'"]
    assert repr(ValueMesh(s, {3: 0, 1: 0, 2: 0})) == "ValueMesh(ranks=3): all 0"
    s = Shape({"gpus": 4}).select([0, 1])  # positions are the ranks: nothing to add
    assert repr(ValueMesh(s, {0: 5, 1: 6})).splitlines()[1:] == ["  ranks=0: 5", "  ranks=1: 6"]


def test_repr_lists_distinct_values_by_coordinate():
    text = repr(vm({"gpus": 2}, [0, 10]))
    assert "gpus=0: 0" in text and "gpus=1: 10" in text


def test_values_that_differ_beyond_what_is_shown_are_not_all_the_same():
    import time

    import numpy as np
    import torch

    lists = vm({"gpus": 2}, [[*range(100), 0], [*range(100), 1]])
    assert "all" not in repr(lists)
    arrays = [np.zeros(10000), np.zeros(10000)]
    arrays[1][5000] = 1  # inside numpy's "..." summary
    text = repr(vm({"gpus": 2}, arrays))
    assert "all" not in text and "differs from the others beyond what is shown" in text, text
    tensors = vm({"gpus": 3}, [torch.zeros(5000), torch.zeros(5000), torch.ones(5000)])
    assert "gpus=0-1: tensor(" in repr(tensors) and "gpus=2: tensor(" in repr(tensors)
    same = vm({"gpus": 2}, [np.arange(5000.0), np.arange(5000.0)])
    assert repr(same).startswith("ValueMesh(gpus=2): all array(")
    big = vm({"gpus": 4}, [bytes(50 << 20)] * 4)  # repr of the whole value would take seconds
    t0 = time.thread_time()  # CPU time: a loaded machine's preemptions do not count
    text = repr(big)
    assert text.startswith("ValueMesh(gpus=4): all b'\\x00") and "52,428,800 bytes" in text
    assert time.thread_time() - t0 < 1.0, "showing large values should not repr them whole"


class _ReprRaises:
    """A value whose __repr__ raises; `lock` (when given) makes it unpicklable."""

    def __init__(self, x: int = 0, lock: bool = False) -> None:
        import threading

        self.x = x
        self.lock = threading.Lock() if lock else None

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _ReprRaises) and other.x == self.x

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        raise RuntimeError("repr boom")


def test_a_value_whose_repr_raises_is_shown_as_such_and_still_grouped():
    # It was the controller's traceback through ValueMesh.__repr__, and the cell failed.
    shown = "<_ReprRaises object: repr raised RuntimeError: repr boom>"
    assert repr(vm({"gpus": 2}, [_ReprRaises(), _ReprRaises()])) == f"ValueMesh(gpus=2): all {shown}"
    text = repr(vm({"gpus": 3}, [_ReprRaises(1), 5, 5]))
    assert text.splitlines()[1:] == [f"  gpus=0: {shown}", "  gpus=1-2: 5"], text
    unpicklable = vm({"gpus": 3}, [_ReprRaises(1, lock=True), _ReprRaises(1, lock=True), _ReprRaises(2, lock=True)])
    lines = repr(unpicklable).splitlines()[1:]
    assert lines == [  # equal (==) values are one group even when they cannot be pickled
        f"  gpus=0-1: {shown}  [value 1: not equal (==) to the others]",
        f"  gpus=2: {shown}  [value 2: not equal (==) to the others]",
    ]


def test_the_docstring_examples_hold_on_a_real_mesh(start_mesh):
    import doctest

    mesh = start_mesh(gpus=4)
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
    for test in doctest.DocTestFinder(recurse=False).find(ValueMesh, globs={"mesh": mesh}):
        runner.run(test)
    assert runner.summarize(verbose=False).failed == 0


def test_a_one_rank_value_mesh_without_dims_shows_its_value_plainly():
    one = vm({"gpus": 4}, [0, 10, 20, 30]).slice(gpus=2)
    assert one.dims == {}
    assert repr(one) == "ValueMesh(scalar): 20"


def test_value_meshes_of_arrays_compare_by_content():
    import numpy as np
    import torch

    assert vm({"gpus": 2}, [np.zeros(3), np.ones(3)]) == vm({"gpus": 2}, [np.zeros(3), np.ones(3)])
    assert vm({"gpus": 2}, [np.zeros(3), np.ones(3)]) != vm({"gpus": 2}, [np.zeros(3), np.zeros(3)])
    assert vm({"gpus": 1}, [torch.arange(4)]) == vm({"gpus": 1}, [torch.arange(4)])
    assert vm({"gpus": 1}, [[np.zeros(2)]]) != vm({"gpus": 1}, [[np.ones(2)]])


def test_value_meshes_of_empty_arrays_show_and_compare():
    # A numpy array or tensor with a zero in a shape of 2+ dims raised "memoryview: cannot
    # cast view with zeros in shape or strides" when its ValueMesh was shown or compared.
    import numpy as np
    import torch

    for empty, other in [(np.zeros((2, 0)), np.zeros((0, 2))), (torch.zeros(2, 0), torch.zeros(0, 2)),
                         (np.zeros((3, 0)).T, np.zeros((3, 0)))]:
        same = vm({"gpus": 2}, [empty, empty])
        assert repr(same).startswith("ValueMesh(gpus=2): all "), repr(same)
        assert same == vm({"gpus": 2}, [empty, empty])
        assert same != vm({"gpus": 2}, [empty, other])  # same (no) bytes, another shape
        mixed = repr(vm({"gpus": 2}, [empty, other]))
        assert "gpus=0: " in mixed and "gpus=1: " in mixed, mixed


def test_empty_arrays_come_back_from_a_real_mesh(start_mesh):
    import numpy as np

    mesh = start_mesh(gpus=2)
    vals = mesh.run("import numpy as np; np.zeros((2, 0))")
    assert repr(vals) == "ValueMesh(gpus=2): all array([], shape=(2, 0), dtype=float64)"
    assert vals == mesh.run("np.zeros((2, 0))")
    mesh.scatter("part", np.zeros((0, 3)))
    parts = mesh.pull("part")
    assert [p.shape for p in parts] == [(0, 3), (0, 3)]
    assert repr(parts) == "ValueMesh(gpus=2): all array([], shape=(0, 3), dtype=float64)"
    assert mesh.gather("part").shape == (0, 3)
