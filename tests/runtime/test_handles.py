"""Handles: values stay on the ranks; a handle sent back resolves to each rank's own value."""

import importlib.util

import numpy as np
import pytest

import viceroy as vr


def test_a_handle_in_a_code_keyword_binds_each_ranks_value(start_mesh):
    mesh = start_mesh(gpus=3)
    mesh.run("x = rank + 1")
    x = mesh.ref("x")
    assert mesh.run("y = x * 2\ny", x=x).values() == [2, 4, 6]
    assert "'x'" in repr(x) and "gpus=3" in repr(x)


def test_handles_resolve_in_arguments_and_closures(start_mesh):
    mesh = start_mesh(gpus=2)
    mesh.run("import numpy as np\nw = np.full(4, float(rank))")
    w = mesh.ref("w")
    assert mesh.run(lambda a: float(a.sum()), w).values() == [0.0, 4.0]
    assert mesh.run(lambda: float(w.sum()) + 1).values() == [1.0, 5.0]
    mesh.push(alias=w)
    assert mesh.run("alias is w").values() == [True, True]  # no copy was made


def test_plain_values_are_sent_only_when_asked(start_mesh):
    mesh = start_mesh(gpus=2)
    mesh.run("z = 'rank value'")
    z = "controller value"  # noqa: F841 - a code string never sees controller names
    assert mesh.run("z").values() == ["rank value"] * 2
    assert mesh.run("z", z="sent").values() == ["sent"] * 2


def test_a_handle_to_a_missing_name_says_which_rank(start_mesh):
    mesh = start_mesh(gpus=2)
    mesh.run("if rank == 0: only_on_zero = 1")
    with pytest.raises(vr.MeshError, match=r"rank 1: NameError: handle 'only_on_zero': no variable 'only_on_zero' on this rank"):
        mesh.run("v = h", h=mesh.ref("only_on_zero"), fail_fast=False)


def test_ranks_missing_a_handles_name_are_one_group(start_mesh):
    # The message named each rank ("rank 0 has no variable"), so every rank was its own group.
    mesh = start_mesh(gpus=3)
    with pytest.raises(vr.MeshError) as e:
        mesh.run("v = h", h=mesh.ref("nowhere"), fail_fast=False)
    lines = [ln for ln in str(e.value).splitlines() if not ln.startswith(" ")]
    assert lines[1:] == ["ranks 0-2: NameError: handle 'nowhere': no variable 'nowhere' on this rank "
                         "(define it on the ranks first)"], str(e.value)


def test_a_handle_from_another_mesh_is_refused_before_sending(start_mesh):
    a = start_mesh(gpus=2)
    b = start_mesh(gpus=1)
    a.run("x = 1")
    with pytest.raises(ValueError, match=r"handle 'x' belongs to mesh \(gpus=2\), not to this mesh \(gpus=1\)"):
        b.run(lambda v: v, a.ref("x"))
    twin = start_mesh(gpus=2)  # the same dims: the message must not read as one mesh twice
    with pytest.raises(ValueError, match=r"handle 'x' belongs to another mesh, not to this one \(both gpus=2\); "
                                         r"values move between meshes only through the controller"):
        twin.run(lambda v: v, a.ref("x"))


def test_a_handle_after_shutdown_is_refused(start_mesh):
    a = start_mesh(gpus=1)
    a.run("x = 1")
    x = a.ref("x")
    a.shutdown()
    b = start_mesh(gpus=1)
    with pytest.raises(ValueError, match="which was shut down"):
        b.run("y = x", x=x)
    with pytest.raises(RuntimeError, match="shut down"):
        a.ref("x")


def test_scatter_gives_each_rank_its_part_and_gather_joins_them(start_mesh):
    mesh = start_mesh(gpus=3)
    data = np.arange(10)
    mesh.scatter("part", data)
    assert [len(p) for p in mesh.pull("part").values()] == [4, 3, 3]
    np.testing.assert_array_equal(mesh.gather("part"), data)
    mesh.scatter("name", ["a", "b", "c"])
    assert mesh.pull("name").values() == ["a", "b", "c"]
    with pytest.raises(ValueError, match="this mesh has 3 ranks, got 2 values"):
        mesh.scatter("bad", [1, 2])


def test_gather_stacks_scalars_and_names_itself_and_bad_names_and_0d_values_are_refused(start_mesh):
    mesh = start_mesh(gpus=3)
    mesh.run("import numpy as np\nloss = np.float64(rank) * np.ones(())")  # a 0-d array per rank
    np.testing.assert_array_equal(mesh.gather("loss"), [0.0, 1.0, 2.0])
    with pytest.raises(vr.MeshError, match=r"^gather nosuch failed"):
        mesh.gather("nosuch")
    for bad in (lambda: mesh.scatter("a b", [1, 2, 3]), lambda: mesh.push(**{"a b": 1}),
                lambda: mesh.pull("1x")):
        with pytest.raises(ValueError, match=r"takes variable names, got '(a b|1x)'"):
            bad()
    with pytest.raises(TypeError, match="a 0-d array or tensor has none: push gives every rank"):
        mesh.scatter("p", np.array(3))


def test_gather_of_values_that_cannot_be_joined_names_their_shapes_by_rank(start_mesh):
    """0-d on some ranks and 1-d on others, or other sizes past the first axis: a ValueError
    naming each rank's shape and what to do, not numpy's or torch's bare concatenation error."""
    mesh = start_mesh(gpus=3)
    mesh.run("import numpy as np\nx = np.array(float(rank)) if rank == 0 else np.ones(2)\n"
             "y = np.ones((2, 1 if rank < 2 else 3))")
    with pytest.raises(ValueError, match=r"^gather x: the ranks' values cannot be joined along their first axis "
                                         r"\(rank 0: float64\[\]; ranks 1-2: float64\[2\]\).*x\.reshape\(-1\).*"
                                         r"pull\('x'\)"):
        mesh.gather("x")
    with pytest.raises(ValueError, match=r"\(ranks 0-1: float64\[2, 1\]; rank 2: float64\[2, 3\]\)"):
        mesh.gather("y")
    if importlib.util.find_spec("torch") is not None:
        mesh.run("import torch\nt = torch.tensor(1.0) if rank == 1 else torch.ones(2)")
        with pytest.raises(ValueError, match=r"\(ranks 0,2: float32\[2\]; rank 1: float32\[\]\)"):
            mesh.gather("t")


def test_scatter_on_a_sub_mesh_uses_its_ranks(start_mesh):
    mesh = start_mesh(gpus=4)
    sub = mesh.slice(gpus=slice(2, 4))
    sub.scatter("s", [10, 20])
    assert sub.pull("s").values() == [10, 20]
    assert sub.gather("s") == [10, 20]


def test_a_handle_to_something_that_is_not_a_name_is_refused_at_once(start_mesh):
    mesh = start_mesh(gpus=1)
    for bad in (3, "a b", None):  # 3 failed inside our plumbing (AttributeError: 'int' ... isidentifier)
        with pytest.raises(ValueError, match=r"a handle names a variable on the ranks; .* is not a name"):
            mesh.ref(bad)
    with pytest.raises(ValueError, match=r"a handle names a variable on the ranks; 'class' is a Python keyword, "
                                         r"which no variable can be named"):
        mesh.ref("class")  # (was taken, and each rank then said it had no variable 'class')


def test_reading_a_value_off_a_handle_on_the_controller_says_where_it_is(start_mesh):
    mesh = start_mesh(gpus=2)
    mesh.run("import numpy as np\nw = np.zeros(3)")
    w = mesh.ref("w")
    with pytest.raises(AttributeError, match=r"^handle 'w' has no attribute 'shape' here: a handle names a value on "
                                             r"each rank, which stays there: mesh\.run\(lambda v: v\.shape, w\) reads "
                                             r"it on every rank, mesh\.pull\('w'\) fetches every rank's$"):
        w.shape  # noqa: B018
    assert not hasattr(w, "_repr_html_")  # (what IPython and copy look for: plain AttributeErrors)
    assert mesh.run(lambda v: v.shape, w).values() == [(3,), (3,)]
