import pytest

from viceroy.runtime.shape import Shape, format_rank_set


def test_ranks_are_row_major_and_coords_follow_dims():
    s = Shape({"hosts": 2, "gpus": 3})
    assert s.ranks == (0, 1, 2, 3, 4, 5)
    assert list(s.coords())[4] == {"hosts": 1, "gpus": 1}
    assert s.position(hosts=1, gpus=2) == 5


def test_slice_with_int_drops_the_dim_and_slice_keeps_it():
    s = Shape({"hosts": 2, "gpus": 4})
    assert s.slice(gpus=1).dims == {"hosts": 2}
    assert s.slice(gpus=1).ranks == (1, 5)
    sub = s.slice(hosts=1, gpus=slice(0, 2))
    assert sub.dims == {"gpus": 2}
    assert sub.ranks == (4, 5)
    assert s.slice(gpus=-1).ranks == (3, 7)


def test_slices_compose_over_global_ranks():
    s = Shape({"gpus": 8}).slice(gpus=slice(2, 8)).slice(gpus=slice(0, 6, 2))
    assert s.ranks == (2, 4, 6)


def test_split_infers_the_missing_size_and_keeps_rank_order():
    s = Shape({"hosts": 2, "gpus": 4}).split(gpus=("dp", "tp"), tp=2)
    assert s.dims == {"hosts": 2, "dp": 2, "tp": 2}
    assert s.ranks == tuple(range(8))
    assert s.slice(tp=0).ranks == (0, 2, 4, 6)


def test_flatten_and_rename():
    s = Shape({"hosts": 2, "gpus": 2})
    assert s.flatten("ranks").dims == {"ranks": 4}
    assert s.rename(gpus="dp").dims == {"hosts": 2, "dp": 2}


def test_select_makes_a_flat_view_in_the_given_order():
    s = Shape({"gpus": 4}).select([3, 0])
    assert s.dims == {"ranks": 2}
    assert s.ranks == (3, 0)


def test_unknown_dim_lists_the_real_ones():
    with pytest.raises(ValueError, match="no dim 'gpu'; its dims are: hosts, gpus"):
        Shape({"hosts": 2, "gpus": 4}).slice(gpu=0)


def test_out_of_range_index_says_the_size():
    with pytest.raises(IndexError, match=r"gpus=9 is out of range: dim 'gpus' has size 4"):
        Shape({"gpus": 4}).slice(gpus=9)
    with pytest.raises(IndexError, match="selects nothing"):
        Shape({"gpus": 4}).slice(gpus=slice(5, 9))


@pytest.mark.parametrize(
    "spec, message",
    [
        ({"gpus": ("dp", "tp"), "tp": 3}, "cannot split"),
        ({"gpus": ("dp", "tp")}, r"^split\(gpus=\('dp', 'tp'\)\): give the size of all but one of the new dims, "
                                 r"e\.g\. split\(gpus=\('dp', 'tp'\), tp=N\) \(gpus has size 4\)$"),
        ({"gpus": {"dp": 2, "tp": 2}}, r"^split takes the new dims' names as a tuple and their sizes as keywords: "
                                       r"split\(gpus=\('dp', 'tp'\), tp=2\)$"),
        ({"gpus": ("dp",)}, "two or more"),
        ({"gpus": ("hosts", "tp"), "tp": 2}, "already exists"),
        ({"gpus": ("dp", "tp"), "tp": 0}, r"positive integers, got \{'tp': 0\}"),
        ({"gpus": ("dp", "tp"), "tp": 2.0}, "positive integers"),
    ],
)
def test_bad_splits_explain_themselves(spec, message):
    with pytest.raises(ValueError, match=message):
        Shape({"hosts": 1, "gpus": 4}).split(**spec)


@pytest.mark.parametrize("dims", [{"gpus": 0}, {"gpus": -1}, {"gpus": 1.5}, {"2d": 2}])
def test_bad_dims_are_rejected_with_the_value(dims):
    with pytest.raises(ValueError):
        Shape(dims)


def test_rank_sets_collapse_into_ranges():
    assert format_rank_set([5, 0, 1, 2, 7, 8]) == "0-2,5,7-8"
    assert format_rank_set([3]) == "3"


def test_numpy_integers_serve_as_ranks_and_sizes():
    import numpy as np

    s = Shape({"gpus": 4})
    picked = s.select(np.array([2, 0]))
    assert picked.ranks == (2, 0) and all(type(r) is int for r in picked.ranks)  # JSON headers
    assert s.split(gpus=("dp", "tp"), tp=np.int64(2)).dims == {"dp": 2, "tp": 2}
    with pytest.raises(TypeError, match="select takes rank numbers"):
        s.select(["a"])


def test_numpy_integers_serve_as_indices_slice_bounds_and_dim_sizes():
    import numpy as np

    s = Shape({"hosts": 2, "gpus": np.int64(4)})
    assert s.dims == {"hosts": 2, "gpus": 4} and type(s.dims["gpus"]) is int
    assert s.slice(gpus=np.int64(1)).ranks == (1, 5)
    assert s.slice(gpus=np.int32(-1)).ranks == (3, 7)
    assert s.slice(gpus=slice(np.int64(1), np.int64(4), np.int64(2))).ranks == (1, 3, 5, 7)
    assert s.position(hosts=np.int64(1), gpus=np.uint8(2)) == 6


@pytest.mark.parametrize(
    "call, error, message",
    [
        (lambda s: s.slice(gpus=slice(0, 4, 0)), ValueError, r"gpus=0:4:0: a slice step cannot be zero"),
        (lambda s: s.slice(gpus=slice("a", 2)), TypeError, r"gpus=a:2: slice bounds must be ints or None"),
        (lambda s: s.slice(gpus=True), TypeError, r"gpus= takes an int or a slice, got True"),
        (lambda s: s.position(hosts=0, gpus=slice(0, 2)), TypeError, r"one coordinate per dim, got gpus=0:2"),
        (lambda s: s.select(3), TypeError, r"a list of rank numbers, in the order wanted, e\.g\. select\(\[0, 3\]\); got 3"),
        (lambda s: s.select({0: 1}), TypeError, r"a list of rank numbers, in the order wanted.*; got \{0: 1\}"),
        (lambda s: s.select({3, 1}), TypeError, r"a list of rank numbers, in the order wanted.*; got \{1, 3\}"),
        (lambda s: s.select([]), ValueError, "at least one rank"),
        # a mask read as ranks [1, 0]
        (lambda s: s.select([True, False]), TypeError, r"select takes rank numbers.*\(a mask: pass the ranks where it is True\)"),
        (lambda s: s.select([0, 1.5]), TypeError, r"select takes rank numbers, e\.g\. select\(\[0, 3\]\), got \[0, 1\.5\]$"),
        (lambda s: s.select([1, 2, 1]), ValueError, r"distinct ranks: 1 given more than once"),
        (lambda s: s.rename(gpus="hosts"), ValueError, r"rename\(gpus='hosts'\) makes two dims named 'hosts'"),
    ],
)
def test_bad_selections_name_the_dim_or_rank_at_fault(call, error, message):
    with pytest.raises(error, match=message) as info:
        call(Shape({"hosts": 2, "gpus": 4}))
    assert info.value.__context__ is None or info.value.__suppress_context__  # one error, not two


def test_a_view_names_its_own_ranks_when_asked_for_another(start_mesh):
    mesh = start_mesh(gpus=4)
    with pytest.raises(IndexError, match=r"rank 0 is not in this mesh \(its ranks are 1,3\)"):
        mesh.select([3, 1]).logs(0)
    with pytest.raises(IndexError, match=r"rank 2 is not in this mesh \(its ranks are 0-1,3\)"):
        mesh.select([0, 1, 3]).logs(2)
