"""What can run on the controller does; what cannot says so in one clear message naming the op
and what to do, never in torch's meta-tensor internals."""

import gc
import re
import threading
import warnings

import numpy as np
import pytest

import viceroy as vr

torch = pytest.importorskip("torch")
from viceroy.runtime.tensors import inspect, rank_reads, reduce  # noqa: E402


@pytest.fixture
def t(mesh):
    with mesh.activate():
        return torch.arange(6.0).reshape(2, 3)


_LOCAL = torch.ones(2)


def _sent(mesh):
    """How many calls reached the ranks so far (to show that a refusal sent nothing)."""
    seen = []
    mesh.subscribe(lambda ev: ev["type"] == "call_started" and seen.append(ev))
    return seen


def test_metadata_questions_are_answered_here(t, mesh):
    assert len(t) == 2 and f"{t}" == repr(t) == "MeshTensor(shape=(2, 3), dtype=float32, mesh=gpus=2)"
    assert [row.shape for row in t] == [(3,), (3,)]  # rows: MeshTensors too
    with mesh.activate(), pytest.raises(TypeError, match="len\\(\\) of a 0-d tensor"):
        len(t.sum())


def test_reading_metadata_sends_nothing_to_the_ranks(t, mesh):
    """``t.shape``, ``t.dtype``, ``t.device``, ``t.ndim`` (properties: torch sees their
    ``__get__``) are answered from the meta tensor, inside activate() or not: nothing queued,
    no call; a failed tensor's shape read later fails nothing else."""
    t.fetch()
    sent = _sent(mesh)
    engine = t._engine
    for _ in range(2):
        assert (t.shape, t.dtype, t.ndim, t.requires_grad, t.is_leaf) == ((2, 3), torch.float32, 2, False, True)
        assert t.device.type == "meta" and t.dim() == 2 and t.size(1) == 3
        with mesh.activate():
            assert (t.shape, t.dtype, t.ndim) == ((2, 3), torch.float32, 2) and t.device.type == "meta"
    assert engine._queue == []
    t.fetch()
    assert sent == [call for call in sent if call["label"] == "fetch"]
    with mesh.activate():
        bad = torch.linalg.cholesky(torch.zeros(2, 2))  # fails on the ranks
        ok = torch.ones(2)
    with pytest.raises(vr.MeshError, match="cholesky"):
        ok.fetch()
    assert (bad.shape, bad.dtype) == ((2, 2), torch.float32)
    assert ok.fetch(gpus=0).tolist() == [1.0, 1.0]  # nothing of bad's went out to fail


@pytest.mark.parametrize("op, what", [
    (lambda t, y: t.set_(y), r"t\.set_\(\.\.\.\)"),
    (lambda t, y: t.set_(), r"t\.set_\(\.\.\.\)"),
    (lambda t, y: torch.utils.swap_tensors(t, y), r"torch\.utils\.swap_tensors"),
    # A local tensor made before activate(): under it, torch.ones would make a MeshTensor, whose
    # queued op (or, once dropped, its free) reaches the ranks at a time of the engine's choosing.
    (lambda t, y: torch.utils.swap_tensors(_LOCAL, t), r"torch\.utils\.swap_tensors"),
])
def test_making_a_mesh_tensor_hold_another_tensor_is_refused(t, mesh, op, what):
    """torch runs set_ and swap_tensors without __torch_function__: the tensor engine never saw
    them, so the controller's shape changed and the ranks' tensor did not. Refused, saying what
    to do instead; nothing changes here or there."""
    with mesh.activate():
        y = torch.arange(5.0)
    y.fetch()
    sent = _sent(mesh)
    for active in (False, True):
        with mesh.activate() if active else _nothing(), pytest.raises(RuntimeError, match=what) as info:
            op(t, y)
        assert "t = other" in str(info.value) and "copy_" in str(info.value)
    assert t.shape == (2, 3) and sent == []
    assert t.fetch(gpus=0).shape == (2, 3)
    a, b = torch.zeros(2), torch.ones(2)
    torch.utils.swap_tensors(a, b)  # local tensors: torch's own
    assert a.tolist() == [1.0, 1.0] and torch.zeros(1).set_(torch.ones(3)).tolist() == [1.0] * 3


@pytest.mark.parametrize("op, what", [
    (lambda t: 3.0 in t, "`x in t`"),
    (lambda t: torch.equal(t, t), "equal()"),
    (lambda t: torch.allclose(t, t), "allclose()"),
    (lambda t: t.cpu(), "cpu()"),
    (lambda t: t.to("cpu"), "to()"),
    (lambda t: f"{t.sum():.2f}", "formatting a MeshTensor with '.2f'"),
    (lambda t: t[t.sum().long():], "indexing with tensors (t[index])"),  # not a mask
    # Python's own conversions, named as the user wrote them (not torch's dunders):
    (lambda t: bool(t.sum()), "bool(t) (`if t:`, `while t:`, `t and ...`, `assert t`)"),
    (lambda t: 1 if t.sum() > 0 else 0, "bool(t) (`if t:`"),
    (lambda t: float(t.sum()), "float(t)"),
    (lambda t: int(t.sum()), "int(t)"),
    (lambda t: range(t.sum().long()), "using t as an int (range(t), a list index)"),
    (lambda t: np.asarray(t), "np.asarray(t)"),
    (lambda t: t.sum().item(), "item()"),
    (lambda t: t.tolist(), "tolist()"),
])
def test_ops_that_need_the_values_say_fetch_or_mesh_run(t, op, what):
    with pytest.raises(RuntimeError) as info:
        op(t)
    text = str(info.value)
    assert text.startswith(what) and "needs the data, which lives on the ranks" in text
    assert "use .fetch()" in text and "mesh.run(fn, t)" in text and "meta" not in text


@pytest.mark.parametrize("op, what", [
    (lambda t: t[t > 2], "indexing with a boolean mask (t[mask])"),
    (lambda t: t.nonzero(), "nonzero()"),
    (lambda t: torch.unique(t), "unique()"),
    (lambda t: torch.masked_select(t, t > 2), "masked_select()"),
])
def test_ops_whose_shape_depends_on_the_values_say_run_them_on_the_ranks(t, mesh, op, what):
    with mesh.activate(), pytest.raises(RuntimeError) as info:
        op(t)
    text = str(info.value)
    assert text.startswith(f"{what}: the result's shape depends on the values")
    assert "mesh.run(fn, t)" in text and ".fetch(gpus=0)" in text and "meta" not in text


def test_local_tensors_mix_with_mesh_tensors_in_every_position(t, mesh):
    loc = torch.ones(3)  # made outside activate(): a local CPU tensor, sent with the op
    with mesh.activate():
        results = [t + loc, loc + t, torch.add(loc, t), t @ loc, t @ torch.ones(3, 2),
                   torch.where(t > 2, t, loc), t[torch.tensor([1])]]
    assert all(isinstance(r, vr.MeshTensor) for r in results)
    want = [(t.fetch(gpus=0) + 1), (t.fetch(gpus=0) + 1), (t.fetch(gpus=0) + 1), torch.tensor([3.0, 12.0]),
            torch.tensor([[3.0, 3.0], [12.0, 12.0]]), torch.tensor([[1.0, 1.0, 1.0], [3.0, 4.0, 5.0]]),
            torch.tensor([[3.0, 4.0, 5.0]])]
    for r, w in zip(results, want, strict=True):
        assert r.shape == w.shape
        torch.testing.assert_close(r.fetch(gpus=1), w)


@pytest.mark.parametrize("op, what", [
    (lambda loc, m: loc.add_(m), r"loc\.add_\(mesh_t\)"),
    (lambda loc, m: _iadd(loc, m), r"loc\.add_\(mesh_t\)"),  # refused, not loc rebound to a MeshTensor
    (lambda loc, m: loc.__setitem__(slice(None), m), r"loc\[\.\.\.\] = mesh_t"),
    (lambda loc, m: torch.add(m, 1, out=loc), r"add\(\.\.\., out=loc\)"),
])
def test_a_local_tensor_updated_in_place_from_a_mesh_tensor_is_refused(t, mesh, op, what):
    loc = torch.ones(2, 3)
    gc.collect()  # the earlier tests' tensors (held by tracebacks' cycles) freed now, not in the test
    t.fetch()
    seen = _sent(mesh)
    for active in (False, True):
        with mesh.activate() if active else _nothing(), pytest.raises(RuntimeError) as info:
            op(loc, t)
        assert __import__("re").match(what, str(info.value))
        assert "a local tensor cannot be updated in place from rank data" in str(info.value)
        assert "mesh_t + loc" in str(info.value) and "fetch" in str(info.value)
    assert torch.equal(loc, torch.ones(2, 3)) and seen == []


def _iadd(loc, m):
    loc += m


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def test_reduce_takes_views_and_refuses_what_cannot_work_before_sending(t, mesh):
    total = reduce(t.T, "sum")  # a view: the ranks reduce a contiguous copy
    assert total.shape == (3, 2) and total.is_contiguous()
    assert torch.equal(total.fetch(gpus=0), 2 * torch.arange(6.0).reshape(2, 3).T)
    seen = _sent(mesh)
    with pytest.raises(TypeError, match=r"vr\.reduce takes a MeshTensor \(made under mesh\.activate\(\)\); got Tensor"):
        reduce(torch.ones(2))
    with mesh.activate():
        ints = torch.arange(3)
    ints.fetch()
    seen.clear()
    with pytest.raises(ValueError, match=r"reduce 'avg' needs a floating-point tensor; this one is int64"):
        reduce(ints, "avg")
    with pytest.raises(TypeError, match=r"vr\.inspect takes a MeshTensor"):
        inspect(torch.ones(2))
    assert seen == []


def test_inspect_summarises_complex_tensors_without_warnings(mesh):
    with mesh.activate():
        c = torch.zeros(2, dtype=torch.complex64) + 1j
    summary = inspect(c).values()[0]
    assert summary["norm"] == pytest.approx(2**0.5) and summary["mean"] == 1j
    assert summary["min"] is None and summary["max"] is None

    def warned(tid):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            rank_reads.summary(tid)
        return [str(w.message) for w in caught]

    assert mesh.run(warned, c._id).values() == [[], []]


def test_reduce_and_assemble_check_their_dims_before_sending(t, mesh):
    # dims=5 and dims=None (assemble) failed in iteration ("'int' object is not iterable"),
    # assemble(dims="gpus") iterated the string ("no dim 'g'"), and a dim named twice was taken.
    with mesh.activate():
        c = torch.ones(2, dtype=torch.complex64)
    t.fetch()
    seen = _sent(mesh)
    with pytest.raises(TypeError, match=r"reduce: dims takes a dim name or a list of dim names \(dims='gpus', "
                                        r"dims=\['dp', 'tp'\]\), or None for the whole mesh; got 5\. "
                                        r"The mesh's dims are gpus"):
        reduce(t, "sum", dims=5)
    with pytest.raises(TypeError, match=r"got \['gpus', 0\]\. The mesh's dims are gpus"):
        reduce(t, dims=["gpus", 0])
    with pytest.raises(ValueError, match=r"reduce: dims \['gpus', 'gpus'\] must name distinct dims of the mesh "
                                         r"\('gpus' is named twice\): name each once; its dims are gpus"):
        reduce(t, dims=["gpus", "gpus"])
    with pytest.raises(ValueError, match=r"reduce: the mesh has no dim 'hosts'; its dims are gpus"):
        reduce(t, dims=("gpus", "hosts"))
    for bad in (None, "gpus", ["gpus"]):
        with pytest.raises(TypeError, match=r"assemble: dims maps each mesh dim to the tensor dim its pieces are "
                                            r"concatenated along \(dims=\{'gpus': 0\}\); got "
                                            + re.escape(repr(bad)) + r"\. The mesh's dims are gpus"):
            vr.assemble(t, dims=bad)
    # One check with the ranks' all_reduce (it said "use 'product'", which the ranks then refused
    # after the reduce was sent: the backends multiply no complex numbers).
    for op in ("min", "max"):
        with pytest.raises(ValueError, match=rf"^reduce '{op}' of a complex tensor: complex numbers are reduced with "
                                             r"'sum' or 'avg' only; this one is complex64: reduce t\.abs\(\) or "
                                             r"t\.real instead \(complex numbers have no order\)$"):
            reduce(c, op)
    with pytest.raises(ValueError, match=r"^reduce 'product' of a complex tensor: complex numbers are reduced with "
                                         r"'sum' or 'avg' only; this one is complex64: reduce torch\.view_as_real\(t\)"):
        reduce(c, "product")
    with pytest.raises(ValueError, match=r"^reduce: op must be one of sum, avg, product, min, max; got 'band'$"):
        reduce(t, "band")
    with pytest.raises(ValueError, match=r"reduce: dims=\[\] names no dim, so nothing would be reduced: name the "
                                         r"dims to reduce over \(dims='gpus'\), or leave dims out for the whole mesh"):
        reduce(t, dims=[])
    for bad in (True, 1.0, "0"):
        with pytest.raises(TypeError, match=r"assemble: mesh dim 'gpus' maps to " + re.escape(repr(bad))
                                            + r": give a tensor dim, an int from -2 to 1"):
            vr.assemble(t, dims={"gpus": bad})
    assert seen == []
    assert vr.assemble(t, dims={"gpus": np.int64(1)}).shape == (2, 6)  # numpy's ints are ints
    assert [x.tolist() for x in reduce(t, dims=("gpus",)).fetch()] == [(2 * torch.arange(6.0)).reshape(2, 3).tolist()] * 2


def test_a_factory_given_a_bad_size_says_what_is_wrong_not_torch_s_meta_placeholder(mesh):
    """torch's meta kernels of randn and normal word a negative size "Expected cond to be True";
    its CPU kernels say what is wrong, as the user would read it without a mesh."""
    gc.collect()
    mesh.run("0")  # (the frees of earlier tests' tensors go out first)
    sent = _sent(mesh)
    with mesh.activate():
        for make in (lambda: torch.randn(-1), lambda: torch.normal(0.0, 1.0, (2, -3)), lambda: torch.zeros(-1)):
            with pytest.raises(RuntimeError, match=r"negative dimension -\d|must be non-negative") as info:
                make()
            assert "Expected cond" not in str(info.value)
    assert sent == [] and mesh.run("1").values() == [1, 1]


def test_an_op_whose_argument_cannot_travel_is_refused_at_its_line_and_loses_no_other_op(mesh):
    """It was queued, and the batch holding it failed to go out at the next flush (the end of
    activate(), in a message about 'argument 0 (list)'), taking the ops queued with it along: a
    fetch then gave values from before them."""
    lock = threading.Lock()
    with mesh.activate():
        x = torch.ones(2)
        x.add_(1)
        with pytest.raises(TypeError, match=r"^apply_\(\): its argument <function .*<lambda>.* cannot be sent to the "
                                            r"ranks: cannot pickle '_thread.lock' object\. Nothing was sent: give it "
                                            r"something picklable, or run it on the ranks: mesh.run\(fn, t\)"):
            x.apply_(lambda v: v * 2 if lock else v)
        x.apply_(lambda v: v * 3)  # one that travels: by value, as rank code does
    assert x.fetch(gpus=0).tolist() == [6.0, 6.0]


def test_a_dtype_mismatch_the_meta_kernels_let_through_is_raised_at_its_line(mesh):
    """Meta kernels skip some dtype checks the real ones make (``x @ w64``, ``F.linear`` with
    weights of another dtype, an int32 target for ``cross_entropy``): raised here, as torch
    words it, so the ranks never get the op (the fetch after finds nothing failed there)."""
    import torch.nn.functional as F

    with mesh.activate():
        x = torch.ones(2, 3)
        w64 = torch.ones(4, 3, dtype=torch.float64)
        with pytest.raises(RuntimeError, match=r"same dtype|expected scalar type|should be the same"):
            x @ w64.T
        with pytest.raises(RuntimeError, match=r"same dtype|expected scalar type|should be the same"):
            F.linear(x, w64)
        with pytest.raises(RuntimeError, match=r"expected target dtype to be Long or Byte, but got Int"):
            F.cross_entropy(x, torch.zeros(2, dtype=torch.int32))
        fine = x @ w64.T.float() + torch.ones(1, dtype=torch.float64)  # promotion where torch promotes
        idx = x[torch.tensor([1, 0])] + torch.ones(3, dtype=torch.int64)
    assert fine.dtype == torch.float64 and fine.fetch(gpus=0).tolist() == [[4.0] * 4] * 2
    assert idx.fetch(gpus=1).tolist() == [[2.0] * 3] * 2


def test_a_handle_in_a_torch_op_says_how_to_bring_its_value_into_the_engine(mesh):
    """A `mesh.ref` handle (a value rank code made) is not a MeshTensor: an op given one says
    so and how to bring it in, and that recipe works."""
    mesh.run("import torch\nmade_here = torch.full((2,), float(rank))")
    ref = mesh.ref("made_here")
    with mesh.activate():
        a = torch.ones(2)
        with pytest.raises(RuntimeError, match=r"^`MeshTensor \+ handle`: its argument <viceroy.Ref 'made_here' on mesh gpus=2> is "
                                               r"a handle to a value rank code made, not a MeshTensor[\s\S]*"
                                               r"mesh\.run\(lambda t, v: t\.copy_\(v\), t, ref\)"):
            a + ref
        t = torch.empty(2)
    mesh.run(lambda t, v: t.copy_(v), t, ref)
    with mesh.activate():
        b = a + t
    assert [v.tolist() for v in b.fetch().values()] == [[1.0, 1.0], [2.0, 2.0]]


def test_torch_compile_given_a_mesh_tensor_says_to_compile_on_the_ranks(mesh):
    """torch.compile traces on the controller, where a MeshTensor has no data: it says so
    (not autograd's refusal of ``.grad``, which dynamo's tracing reads), and what to do."""
    with mesh.activate():
        a = torch.ones(3)
        with pytest.raises(Exception) as info:  # (dynamo wraps what it meets in its own error types)
            torch.compile(lambda x: x * 2 + 1)(a)
        b = a * 2
    text = str(info.value)
    assert "torch.compile cannot trace a MeshTensor" in text and "autograd" not in text, text
    assert "mesh.run(lambda t: torch.compile(fn)(t), t)" in text
    assert b.fetch(gpus=0).tolist() == [2.0] * 3


def test_an_optimizer_stepped_on_the_controller_says_how_to_step_it_on_the_ranks(mesh):
    """torch.optim reads ``.grad``, which is on the ranks: its methods on the controller say so
    (never the torch.compile message: torch.optim wraps them with dynamo's disable), and how to
    make and step the optimizer on the ranks, a recipe that trains as the same code does locally."""
    with mesh.activate():
        torch.manual_seed(0)
        model = torch.nn.Linear(3, 1)
        x = torch.ones(8, 3)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for act in (opt.zero_grad, opt.step):
            with pytest.raises(RuntimeError, match=r"^torch\.optim on the controller: the gradients are on the ranks[\s\S]*"
                                                   r"mesh\.run\(\"import torch; opt = torch\.optim\.SGD\(model\.parameters\(\), lr=0\.1\)\", "
                                                   r"model=model\)[\s\S]*mesh\.run\(\"opt\.step\(\); opt\.zero_grad\(\)\"\)"):
                act()
    mesh.run("import torch; opt = torch.optim.SGD(model.parameters(), lr=0.1)", model=model)  # the recipe
    for _ in range(2):
        with mesh.activate():
            loss = model(x).pow(2).mean()
        mesh.run(lambda loss: loss.backward(), loss)
        mesh.run("opt.step(); opt.zero_grad()")
    torch.manual_seed(0)
    local = torch.nn.Linear(3, 1)
    local_opt = torch.optim.SGD(local.parameters(), lr=0.1)
    for _ in range(2):
        local(torch.ones(8, 3)).pow(2).mean().backward()
        local_opt.step()
        local_opt.zero_grad()
    torch.testing.assert_close(model.weight.fetch(gpus=1), local.weight.detach())
