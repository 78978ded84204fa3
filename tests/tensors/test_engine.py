"""The tensor engine: torch on the controller, tensors on the ranks."""

import copy
import gc
import inspect as pyinspect
import os
import threading
import traceback

import psutil
import pytest

import viceroy as vr
from tests.conftest import wait_until

torch = pytest.importorskip("torch")
from viceroy.runtime.tensors import MeshTensor, assemble, inspect, worker  # noqa: E402
from viceroy.runtime.tensors.plans import NOTHING_SENT, as_the_users  # noqa: E402


@pytest.fixture
def tmesh(seeded_mesh):
    return seeded_mesh(gpus=2)


def _engine_tensors(mesh):
    return mesh.run(worker.count).values()


def test_ops_run_on_every_rank_and_fetch_returns_each_ranks_tensor(tmesh):
    with tmesh.activate():
        a = torch.randn(8, 8)
        b = (a @ a.T).relu().sum(dim=0)
    assert isinstance(b, MeshTensor) and b.shape == (8,) and b.dtype == torch.float32
    assert repr(b) == "MeshTensor(shape=(8,), dtype=float32, mesh=gpus=2)"
    a0, a1 = a.fetch().values()
    assert not torch.equal(a0, a1)  # each rank made its own
    torch.testing.assert_close(b.fetch(gpus=1), (a1 @ a1.T).relu().sum(dim=0))


def test_in_place_ops_and_item_assignment_change_the_ranks_tensor(tmesh):
    with tmesh.activate():
        a = torch.zeros(3)
        a.add_(2)
        a[0] = 7
    assert [t.tolist() for t in a.fetch().values()] == [[7.0, 2.0, 2.0]] * 2


def _vals(t):
    return [x.tolist() for x in t.fetch().values()]


def test_deepcopy_copies_each_ranks_tensor_and_keeps_parameters_parameters(tmesh):
    with tmesh.activate():
        t = torch.randn(2, 3)  # differs from rank to rank
        model = torch.nn.Linear(3, 2)
        c, again, tt = copy.deepcopy([t, t, t.T])  # under activate(), as a target-network copy often is
    assert type(c) is MeshTensor and c is not t and again is c  # the memo: one copy of one tensor
    assert c.shape == (2, 3) and tt.shape == (3, 2) and tt.stride() == t.T.clone().stride()
    assert _vals(c) == _vals(t) and _vals(tt) == _vals(t.T)
    tmesh.run("w.grad = torch.full_like(w, 7.0)", w=model.weight)  # a step's gradient, on the ranks
    ema = copy.deepcopy(model)  # outside activate() too
    for p, q in zip(model.parameters(), ema.parameters(), strict=True):
        assert isinstance(q, torch.nn.Parameter) and q.requires_grad and q._id != p._id
        assert _vals(q) == _vals(p)
    assert tmesh.run(lambda w: (type(w).__name__, w.requires_grad, w.is_leaf, w.grad.tolist()), ema.weight).values() \
        == [("Tensor", True, True, [[7.0] * 3] * 2)] * 2
    before = _vals(ema.weight)
    with tmesh.activate(), torch.no_grad():
        t.add_(1)
        model.weight.mul_(0)  # the copies are copies: they do not change with the originals
    assert _vals(c) != _vals(t) and _vals(ema.weight) == before and _vals(model.weight) != before


def test_a_0d_integer_mesh_tensor_indexes_as_an_int_on_each_rank(tmesh):
    with tmesh.activate():
        x = torch.arange(10.0).reshape(5, 2)
        i = x.sum(dim=1).argmax()  # 0-d int64: 4 on every rank
        j = torch.zeros((), dtype=torch.long)
    tmesh.run(lambda t: t.fill_(vr.context().rank + 1), j)  # 1 on rank 0, 2 on rank 1
    with tmesh.activate():
        row, col, pair, one = x[i], x[:, j - 1], x[i, None], x[j, 1]
    assert (row.shape, col.shape, pair.shape, one.shape) == ((2,), (5,), (1, 2), ())
    assert _vals(row) == [[8.0, 9.0]] * 2 and _vals(one) == [3.0, 5.0]
    assert _vals(col) == [[0.0, 2.0, 4.0, 6.0, 8.0], [1.0, 3.0, 5.0, 7.0, 9.0]]
    with tmesh.activate():
        x[j] = -1.0  # and assignment
        x[i, 0] = 7.0
    assert _vals(row) == [[7.0, 9.0]] * 2  # a view, as in torch: x[i] selects
    assert _vals(x) == [[[0.0, 1.0], [-1.0, -1.0], [4.0, 5.0], [6.0, 7.0], [7.0, 9.0]],
                        [[0.0, 1.0], [2.0, 3.0], [-1.0, -1.0], [6.0, 7.0], [7.0, 9.0]]]
    with tmesh.activate(), pytest.raises(RuntimeError, match=r"^indexing with a boolean mask \(t\[mask\]\)"):
        x[i > 2]  # a 0-d bool index is a mask: its value gives the shape


def test_x_of_i_in_a_loop_shares_one_plan_and_each_i_selects_its_row(tmesh):
    # The plan's key held the index's value: each new i ran the op on meta tensors again
    # (~200 us, against ~10 for a known op). Any int within the first dim shares one plan now;
    # its value still goes to the ranks, and one out of range is still torch's IndexError here.
    with tmesh.activate():
        x = torch.arange(12.0).reshape(6, 2)
        plans = len(x._engine._plans)
        rows = [x[i] for i in range(-6, 6)]
        assert len(x._engine._plans) == plans + 1
        with pytest.raises(IndexError, match="index 6 is out of bounds for dimension 0 with size 6"):
            x[6]
        with pytest.raises(IndexError, match="out of bounds"):
            x[-7]
        y = torch.zeros(3, 4)
        col = y[2]  # another shape: a plan of its own
    assert col.shape == (4,) and [r.shape for r in rows] == [(2,)] * 12
    assert [_vals(r)[0] for r in rows] == [[2.0 * (i % 6), 2.0 * (i % 6) + 1] for i in range(-6, 6)]
    assert _vals(rows[3]) == [[6.0, 7.0]] * 2


def test_a_shape_error_is_raised_here_and_nothing_reaches_the_ranks(tmesh):
    with tmesh.activate():
        a = torch.ones(4, 3)
        b = torch.ones(5, 2)
    a.fetch()
    seen = []
    tmesh.subscribe(lambda ev: ev["type"] == "call_started" and seen.append(ev))
    with tmesh.activate(), pytest.raises(RuntimeError, match=r"\[4, 3\] X \[5, 2\]"):
        a @ b
    assert seen == []


def test_torchs_refusal_of_an_op_is_raised_by_the_engine_saying_nothing_was_sent(tmesh):
    """A shape, index or size torch refuses (its C++ checks, or its Python meta kernels many
    frames down) is raised from the engine's own frame, without torch's frames below it, so a
    kernel can show the user's line and torch's message only; a note says the ranks got nothing."""
    torch_dir = os.path.dirname(os.path.abspath(torch.__file__)) + os.sep
    with tmesh.activate():
        a = torch.ones(4, 3)
    ops = {
        "shape '[7, -1]' is invalid": lambda: a.view(7, -1),  # C++
        "index 9 is out of bounds": lambda: a[9],  # C++, an IndexError
        "Sizes of tensors must match": lambda: torch.cat([a, torch.ones(2, 2)]),  # Python meta kernel
        "negative dimension -1": lambda: torch.zeros(-1),  # a factory
        "same dtype|expected scalar type|should be the same":  # the meta kernel lets it through
            lambda: a @ torch.ones(3, 2, dtype=torch.float64),
    }
    for message, op in ops.items():
        with tmesh.activate(), pytest.raises((RuntimeError, IndexError), match=message.replace("[", r"\[")) as info:
            op()
        files = [f.filename for f in traceback.extract_tb(info.value.__traceback__)]
        assert not any(f.startswith(torch_dir) for f in files), (message, files)
        assert files[-1].endswith(os.path.join("viceroy", "runtime", "tensors", "plans.py")), (message, files)
        assert info.value.__notes__ == [NOTHING_SENT]
        assert info.value.__suppress_context__


def test_an_error_raised_outside_torch_keeps_its_traceback_and_gets_no_note():
    def users_own():
        raise ValueError("the user's function failed")

    try:
        users_own()
    except ValueError as e:
        exc = e
    assert as_the_users(exc) is exc
    assert traceback.extract_tb(exc.__traceback__)[-1].name == "users_own"
    assert not hasattr(exc, "__notes__")


def test_an_in_place_op_that_cannot_keep_the_dtype_is_refused_here(tmesh):
    """Meta tensors let ``long_t.mul_(2.5)`` through (torch's CPU kernel refuses it): refused
    here all the same, at the user's line, and nothing reaches the ranks."""
    with tmesh.activate():
        n = torch.ones(3, dtype=torch.long)
    n.fetch()
    seen = []
    tmesh.subscribe(lambda ev: ev["type"] == "call_started" and seen.append(ev))
    with tmesh.activate():
        with pytest.raises(RuntimeError, match="result type Float can't be cast to the desired output type Long"):
            n.mul_(2.5)
        with pytest.raises(RuntimeError, match="can't be cast"):
            n *= 2.5
    assert seen == []
    with tmesh.activate():
        n.mul_(2)  # an int keeps it Long
        f = torch.ones(3)
        f.mul_(n)  # Long into Float casts
    assert n.fetch(gpus=0).tolist() == [2, 2, 2] and f.fetch(gpus=0).tolist() == [2.0, 2.0, 2.0]


def test_an_op_failing_on_a_rank_surfaces_at_the_next_fetch_with_its_line(tmesh):
    with tmesh.activate():
        a = torch.arange(4.0)
        bad = a[torch.tensor([10])]  # fine on meta tensors, out of range on the ranks
        line = pyinspect.currentframe().f_lineno - 1
    with pytest.raises(vr.MeshError) as info:
        bad.fetch()
    text = str(info.value)
    assert f"test_engine.py, line {line}" in text and "IndexError" in text
    assert "ranks 0-1" in text
    assert a.fetch(gpus=0).tolist() == [0.0, 1.0, 2.0, 3.0]  # the engine carries on


def test_asking_for_data_on_the_controller_explains_fetch(tmesh):
    with tmesh.activate():
        a = torch.ones(2)
    with pytest.raises(RuntimeError, match=r"use \.fetch\(\)"):
        a.sum().item()
    with pytest.raises(RuntimeError, match="needs the data"):
        bool(a[0])


def test_ops_mixing_meshes_are_refused(start_mesh):
    m1 = start_mesh(gpus=1, preload=["torch"])
    m2 = start_mesh(gpus=2, preload=["torch"])
    with m1.activate():
        a = torch.ones(2)
    with m2.activate():
        b = torch.ones(2)
    with pytest.raises(ValueError, match=r"mixes tensors of different meshes \(gpus=1 and gpus=2\)"):
        a + b
    twin = start_mesh(gpus=1, preload=["torch"])  # the same dims: not "gpus=1 and gpus=1"
    with twin.activate():
        c = torch.ones(2)
    with pytest.raises(ValueError, match=r"add mixes tensors of different meshes \(both gpus=1\); move one"):
        a + c


def test_ops_mixing_views_of_one_mesh_name_their_ranks_and_to_mesh(tmesh):
    left, right = tmesh.slice(gpus=slice(0, 1)), tmesh.slice(gpus=slice(1, 2))
    with left.activate():
        a = torch.ones(2)
    with right.activate():
        b = torch.ones(2)
    with pytest.raises(ValueError, match=r"views of one mesh \(.*rank 0 and .*rank 1\).*t\.to_mesh\(view\)"):
        a + b
    assert (a + b.to_mesh(left)).fetch(gpus=0).tolist() == [2.0, 2.0]


def test_assemble_names_a_tensor_dim_the_pieces_lack(tmesh):
    with tmesh.activate():
        t = torch.ones(3)
    with pytest.raises(ValueError, match=r"mesh dim 'gpus' maps to tensor dim 5, but the pieces have 1 dim "
                                         r"\(shape \[3\]\): give a tensor dim from -1 to 0"):
        vr.assemble(t, dims={"gpus": 5})
    assert vr.assemble(t, dims={"gpus": -1}).shape == (6,)
    with pytest.raises(ValueError, match=r"these are 0-d \(one number per rank\), with none to concatenate along: "
                                         r"give them one first, vr\.assemble\(t\.reshape\(1\), dims=\{'gpus': 0\}\)"):
        vr.assemble(t.sum(), dims={"gpus": 0})
    assert vr.assemble(t.sum().reshape(1), dims={"gpus": 0}).tolist() == [3.0, 3.0]


def _rank0_rss(mesh):
    proc = psutil.Process(mesh.pids()[0])
    return lambda: proc.memory_info().rss


def _settled(mesh, rss):
    """A tensor made and fetched (the engine is set up on the ranks), for the caller to keep,
    with the ranks' engine tensor count and rank 0's memory after it."""
    with mesh.activate():
        t = torch.ones(1)
    t.fetch()
    return t, _engine_tensors(mesh), rss()


def _memory_comes_back(mesh, rss, before, count, slack=256 * (1 << 20)):
    """After the controller dropped its MeshTensors: the ranks free them with the next batch,
    their memory and engine tensor count come back to what they were."""
    gc.collect()
    mesh._engine.sync()
    wait_until(lambda: rss() < before + slack, 10, "rank memory to come back")
    assert _engine_tensors(mesh) == count


def test_dropping_the_last_reference_frees_the_ranks_tensors(tmesh):
    rss = _rank0_rss(tmesh)
    _kept, base_count, before = _settled(tmesh, rss)
    with tmesh.activate():
        big = [torch.ones(64, 1024, 1024) for _ in range(4)]  # 4 x 256 MiB per rank
    tmesh._engine.sync()  # they exist now (a fetch would leave its transfer buffer mapped)
    assert rss() > before + 512 * (1 << 20)
    del big
    _memory_comes_back(tmesh, rss, before, base_count)


def test_memory_of_many_small_tensors_goes_back_to_the_system_when_they_are_dropped(tmesh):
    """Tensors of a megabyte live in the C allocator's heap, which keeps what is freed for
    later; the memory the mesh view shows for a rank would stay up after they are dropped.
    Ranks give it back once enough was freed."""
    rss = _rank0_rss(tmesh)
    _kept, base_count, before = _settled(tmesh, rss)
    with tmesh.activate():
        # Freed, a 16 MiB block raises glibc's threshold for mapping blocks of their own (it
        # adapts to what the program frees), so that the next ones come from the heap.
        warm = torch.ones(4 << 20)
    tmesh._engine.sync()
    del warm
    gc.collect()
    tmesh._engine.sync()
    with tmesh.activate():
        small = [torch.ones(1 << 18) for _ in range(384)]  # 384 x 1 MiB per rank
    tmesh._engine.sync()
    assert rss() > before + 320 * (1 << 20)
    del small
    _memory_comes_back(tmesh, rss, before, base_count, slack=64 * (1 << 20))


def test_a_tensor_bound_to_a_name_of_rank_code_is_freed_with_its_handle(tmesh):
    """A MeshTensor bound to a name of a code string (what a %%mesh cell reading a controller
    name does) stays bound on the ranks while the handle lives, and goes when it is dropped:
    rank memory does not outlive the controller's handle. A name the rank code rebound, or an
    alias it made itself, is the rank's own and stays."""
    rss = _rank0_rss(tmesh)
    _kept, base_count, before = _settled(tmesh, rss)
    with tmesh.activate():
        big = torch.ones(256, 1024, 1024)  # 1 GiB per rank
        kept = torch.ones(3)
    tmesh.run("w = big.sum().item()", big=big)
    tmesh.run("w2 = big[0, 0, 0].item()", big=big)  # bound again: one binding
    tmesh.run("mine = kept\nkept = kept * 2", kept=kept)  # rebound by the rank code
    assert tmesh.run("big.shape[0]").values() == [256, 256], "bound names persist across calls"
    assert rss() > before + 768 * (1 << 20)
    del big, kept
    _memory_comes_back(tmesh, rss, before, base_count)
    assert tmesh.run("'big' in globals()").values() == [False, False]
    assert tmesh.run("(kept.tolist(), mine.tolist())").values() == [([2.0] * 3, [1.0] * 3)] * 2


def test_rank_code_runs_after_the_tensor_ops_issued_before_it(tmesh):
    """A call reaching the ranks (run, pull, gather, push, scatter) sends the ops queued before
    it first, so rank code reading a MeshTensor bound to a name sees what they made, inside
    activate() or not, on the mesh or a view of it; never a stale value."""
    with tmesh.activate():
        t = torch.zeros(2)
    tmesh.run("pass", tt=t)  # each rank binds tt to its own t
    t.add_(5)  # outside activate(): queued
    assert tmesh.run("tt.tolist()").values() == [[5.0, 5.0]] * 2
    with tmesh.activate():
        t.add_(1)
        assert tmesh.run(lambda: vr.context().namespace["tt"].tolist()).values() == [[6.0, 6.0]] * 2
        t.add_(1)
        assert tmesh.pull("tt").values()[0].tolist() == [7.0, 7.0]
        t.add_(1)
        assert tmesh.gather("tt").tolist() == [8.0, 8.0] * 2
        t.add_(1)
        tmesh.push(k=1)
        tmesh.scatter("j", [0, 1])
        assert tmesh.run("tt.tolist()").values() == [[9.0, 9.0]] * 2
    view = tmesh.slice(gpus=1)
    with view.activate():
        v = torch.zeros(1)
    view.run("pass", vv=v)
    v.add_(3)
    assert tmesh.run("vv.tolist() if rank == 1 else None").values() == [None, [3.0]]
    assert t.fetch(gpus=0).tolist() == [9.0, 9.0]


def test_inspect_and_assemble(tmesh):
    with tmesh.activate():
        a = torch.ones(2, 3)
    summary = inspect(a).values()
    assert summary[0]["shape"] == (2, 3) and summary[0]["mean"] == 1.0
    whole = assemble(a, dims={"gpus": 0})
    assert whole.shape == (4, 3)
    with pytest.raises(ValueError, match="no dim 'hosts'"):
        assemble(a, dims={"hosts": 0})
    with pytest.raises(TypeError, match=r"vr.inspect takes a MeshTensor \(made under mesh.activate\(\)\); got "
                                        r"Tensor$"):  # (no dangling blank)
        inspect(torch.ones(2))


def test_a_fetch_gives_one_rank_s_tensor_only_when_every_dim_is_given_an_index(tmesh):
    """``fetch(gpus=0)`` is rank 0's tensor; ``fetch(gpus=slice(0, 1))`` keeps the dim, as
    mesh.slice does: a ValueMesh, whatever the slice's length (code written for two ranks
    works for one)."""
    with tmesh.activate():
        a = torch.ones(2)
    assert a.fetch(gpus=0).tolist() == [1.0, 1.0]
    for part, n in ((slice(0, 1), 1), (slice(0, 2), 2)):
        got = a.fetch(gpus=part)
        assert isinstance(got, vr.ValueMesh) and got.dims == {"gpus": n}, got


def test_the_engine_functions_are_on_viceroy_itself_and_imported_on_first_use():
    import subprocess
    import sys

    code = ("import sys, viceroy as vr; before = 'torch' in sys.modules; f = vr.reduce\n"
            "print(before, 'torch' in sys.modules, f.__module__)\n"
            "try: vr.no_such_name\nexcept AttributeError as e: print(e)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.splitlines() == ["False True viceroy.runtime.tensors", "module 'viceroy' has no attribute 'no_such_name'"]
    assert vr.inspect is inspect and vr.assemble is assemble and vr.MeshTensor is MeshTensor


def test_a_factory_on_device_cuda_is_the_ranks_own_device_however_it_is_named(tmesh):
    """device="cuda" and device=torch.device("cuda") alike: a MeshTensor on each rank's own
    device (its GPU, or the CPU on a rank without one); any other device: a local tensor."""
    with tmesh.activate():
        made = [torch.zeros(2, device=d) for d in ("cuda", torch.device("cuda"), None)]
        local = torch.zeros(2, device=torch.device("cpu"))
    assert [type(t) for t in made] == [MeshTensor] * 3 and type(local) is torch.Tensor
    own = "cuda" if torch.cuda.is_available() else "cpu"
    assert {str(t.device.type) for m in made for t in m.fetch().values()} == {"cpu"}  # (fetch: CPU copies)
    assert tmesh.run(lambda *ts: [t.device.type for t in ts], *made).values() == [[own] * 3] * 2


def test_torch_outside_activate_stays_local(tmesh):
    with tmesh.activate():
        pass
    t = torch.ones(2)
    assert type(t) is torch.Tensor and t.sum().item() == 2.0


def test_long_pipelines_with_temporaries_span_batches_correctly(tmesh):
    from viceroy.runtime.tensors.engine import BATCH_MAX

    with tmesh.activate():
        a = torch.ones(4)
        y = a
        for _ in range(BATCH_MAX * 2):  # every temporary is freed as it goes
            y = y * 1.0 + 1
    assert y.fetch(gpus=0).tolist() == [1.0 + BATCH_MAX * 2] * 4
    tmesh._engine.sync()
    assert all(n <= 4 for n in _engine_tensors(tmesh))  # a, y and at most a couple in flight


def test_reduce_runs_over_the_data_plane_per_dim(seeded_mesh):
    mesh = seeded_mesh(hosts=1, gpus=4)
    from viceroy.runtime.tensors import reduce

    sub = mesh.flatten("r").split(r=("a", "b"), b=2)
    with sub.activate():
        x = torch.ones(3)
        y = x * 2
    per_b = reduce(y, "sum", dims="b")
    assert [t.tolist() for t in per_b.fetch().values()] == [[4.0] * 3] * 4
    total = reduce(y, "sum")
    assert total.fetch(a=1, b=0).tolist() == [8.0] * 3
    with pytest.raises(ValueError, match="no dim 'gpus'"):
        reduce(y, "sum", dims="gpus")


def test_repeated_ops_take_the_cached_road_with_the_right_results(tmesh):
    with tmesh.activate():
        a = torch.zeros(3)
        for _ in range(3):  # the same ops again: from the plan cache (short road)
            a[1] = 5  # a value, run on the ranks
            a.add_(1)  # in place: returns its input
        i = torch.arange(3)
        ints, floats, bools, again = i + 1, i + 1.0, i + True, i + 1  # equal keys, not equal ops
        sums = [a.sum(dim=0, keepdim=True) for _ in range(2)]  # keyword arguments
    assert a.fetch(gpus=1).tolist() == [3.0, 6.0, 3.0]
    assert (ints.dtype, floats.dtype, bools.dtype, again.dtype) == (torch.int64, torch.float32, torch.int64, torch.int64)
    assert floats.fetch(gpus=0).tolist() == [1.0, 2.0, 3.0] and again.fetch(gpus=0).tolist() == [1, 2, 3]
    assert [s.shape for s in sums] == [(1,), (1,)] and sums[1].fetch(gpus=0).tolist() == [12.0]


def test_in_place_ops_that_change_the_shape_change_it_here_every_time(tmesh):
    with tmesh.activate():
        a, b = torch.zeros(3), torch.zeros(3)
        a.unsqueeze_(0)
        b.unsqueeze_(0)  # the same op on the same signature: the controller's shape follows too
        c = b + 1
    assert a.shape == b.shape == c.shape == (1, 3)
    assert b.fetch(gpus=0).shape == (1, 3)


def test_ops_with_the_same_values_in_different_places_are_different_ops(tmesh):
    with tmesh.activate():
        a = torch.ones(3, 4)
        by_sizes = a.split([2, 1])  # sizes 2 and 1 along dim 0
        by_dim = a.split(2, 1)  # pieces of 2 along dim 1
    assert [t.shape for t in by_sizes] == [(2, 4), (1, 4)]
    assert [t.shape for t in by_dim] == [(3, 2), (3, 2)]
    assert [t.shape for t in by_dim[1].fetch().values()] == [(3, 2)] * 2


def test_a_cached_op_failing_on_a_rank_names_its_line(tmesh):
    with tmesh.activate():
        a = torch.arange(4)
        for _ in range(3):
            bad = a // 0  # fine on meta tensors, a ZeroDivisionError on the ranks
            line = pyinspect.currentframe().f_lineno - 1
    with pytest.raises(vr.MeshError) as info:
        bad.fetch()
    assert f"test_engine.py, line {line}" in str(info.value) and "ZeroDivisionError" in str(info.value)
    assert a.fetch(gpus=0).tolist() == [0, 1, 2, 3]


def test_frees_past_a_batch_go_out_on_their_own_even_when_dropped_inside_the_controllers_send(tmesh):
    """Tensors may be collected anywhere, even while the controller sends (holding its socket
    lock): the frees then go out from its IO thread, and nothing deadlocks."""
    with tmesh.activate():
        base = torch.ones(1)
    base.fetch()
    (base_count, *_) = _engine_tensors(tmesh)
    with tmesh.activate():
        many = [torch.ones(4) for _ in range(300)]
    tmesh._engine.sync()
    assert _engine_tensors(tmesh)[0] == base_count + 300
    router_lock = tmesh._controller._sockets._router_lock

    def drop_inside_a_send() -> None:
        with router_lock:  # as if the collection ran in the middle of the controller's send
            many.clear()
            gc.collect()

    t = threading.Thread(target=drop_inside_a_send, daemon=True)
    t.start()
    t.join(10)
    assert not t.is_alive(), "dropping tensors inside the controller's send deadlocked"
    wait_until(lambda: max(_engine_tensors(tmesh)) <= base_count + 300 - 256, 10, "the frees to go out on their own")


def test_a_loop_that_never_syncs_keeps_few_batches_yet_reports_an_early_failure(tmesh):
    from viceroy.runtime.tensors.engine import PENDING_MAX

    with tmesh.activate():
        a = torch.arange(4.0)
        bad = a[torch.tensor([10])]  # fails on the ranks, in the first batch
        line = pyinspect.currentframe().f_lineno - 1
        engine = tmesh._engine
        engine.flush()
        y = a
        for i in range(3 * PENDING_MAX):  # a batch each, none of them synced
            y = y + 1
            engine.flush()
            if i % 16 == 15:  # let the ranks catch up (done batches are forgotten, failed kept)
                last = engine._pending[-1]
                wait_until(last.done, 30, "the ranks to run the batches so far")
        assert len(engine._pending) <= PENDING_MAX
    with pytest.raises(vr.MeshError, match=f"line {line}"):
        y.fetch()
    assert y.fetch(gpus=0).tolist() == [3.0 * PENDING_MAX + i for i in range(4)]
    del bad


def test_ctrl_c_while_fetching_stops_the_ranks_and_the_next_sync_says_so(tmesh):
    import signal
    import sys

    main = threading.main_thread().ident
    with tmesh.activate():
        a = torch.randn(400, 400)
        for _ in range(2000):  # seconds of work on every rank
            a = (a @ a).tanh()

    def press_stop_once_fetch_waits() -> None:
        def waiting() -> bool:
            frame = sys._current_frames().get(main)
            while frame is not None:
                if frame.f_code.co_name == "get" and frame.f_code.co_filename.endswith("future.py"):
                    return True
                frame = frame.f_back
            return False

        wait_until(waiting, 10, "the fetch to wait on the ranks")
        signal.pthread_kill(main, signal.SIGINT)

    threading.Thread(target=press_stop_once_fetch_waits).start()
    with pytest.raises(KeyboardInterrupt):
        a.fetch()
    wait_until(lambda: set(tmesh.states().values()) == {"idle"}, 5, "the ranks to stop")
    with pytest.raises(vr.MeshError, match=r"interrupted \(KeyboardInterrupt on the controller\)"):
        tmesh._engine.sync()  # the batch's end is reported, not lost
    with pytest.raises(vr.MeshError, match="interrupted"):
        a.fetch()
