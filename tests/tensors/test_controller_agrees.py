"""What the controller says of a MeshTensor is what the ranks hold: dtypes under another default
dtype, requires_grad and grad mode; torch.manual_seed under activate() seeds the ranks."""

import pytest

torch = pytest.importorskip("torch")


@pytest.fixture
def tmesh(seeded_mesh):
    return seeded_mesh(gpus=2)


@pytest.fixture
def float64_default():
    before = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(before)


def _on_ranks(mesh, fn, *args):
    return mesh.run(fn, *args).values()


def test_factories_and_ops_follow_the_controllers_default_dtype(tmesh, float64_default):
    with tmesh.activate():
        a = torch.ones(3)
        b = torch.tensor([0.1, 0.2])
        c = a.sum() + 0.1
        d = torch.arange(4) / 2  # int / int: the default dtype
        e = a.view(torch.int64)  # legal for float64 only
    for t in (a, b, c, d):
        assert t.dtype == torch.float64
        assert {v.dtype for v in t.fetch().values()} == {torch.float64}
    assert b.fetch(gpus=0).tolist() == [0.1, 0.2]
    assert e.fetch(gpus=1).tolist() == [4607182418800017408] * 3
    torch.set_default_dtype(torch.float32)  # changed back mid-way: the ops after it follow
    with tmesh.activate():
        f = torch.arange(4) / 2
        g = torch.zeros(2)
    assert (f.dtype, g.dtype) == (torch.float32, torch.float32)
    assert [v.dtype for v in (f.fetch(gpus=0), g.fetch(gpus=0))] == [torch.float32, torch.float32]


def test_the_ranks_own_default_dtype_does_not_change_the_engines_ops(tmesh):
    tmesh.run("torch.set_default_dtype(torch.float64)")
    with tmesh.activate():
        a = torch.ones(2)
        b = torch.arange(2) / 2
    assert [a.fetch(gpus=0).dtype, b.fetch(gpus=0).dtype] == [torch.float32, torch.float32]
    assert tmesh.run("torch.get_default_dtype()").values() == [torch.float64] * 2  # theirs is kept


def test_requires_grad_agrees_and_grad_mode_goes_with_the_ops(tmesh):
    def grads(*ts):
        return [_on_ranks(tmesh, lambda t: t.requires_grad, t)[0] for t in ts]

    with tmesh.activate():
        w = torch.ones(3, requires_grad=True)
        h = w * 2
        h.relu_()  # in place on a result (not a leaf on the ranks): fine on both sides
        d, z = w.detach(), torch.zeros_like(w)
        with torch.no_grad():
            n = w * 2
        x = torch.zeros(3)
        x.add_(w)  # x now requires grad, as on the ranks
    here = [t.requires_grad for t in (w, h, d, z, n, x)]
    assert here == [True, True, False, False, False, True]
    assert grads(w, h, d, z, n, x) == here
    assert h.fetch(gpus=0).tolist() == [2.0] * 3
    with pytest.raises(RuntimeError, match=r"backward\(\): autograd runs on the ranks[\s\S]*mesh\.run"):
        h.sum().backward()
    with pytest.raises(RuntimeError, match=r"\.grad: autograd runs on the ranks"):
        w.grad  # noqa: B018


def test_manual_seed_under_activate_seeds_every_rank_alike(tmesh):
    torch.manual_seed(0)  # outside activate(): the controller only
    with tmesh.activate():
        r = torch.randn(3)
    a, b = r.fetch().values()
    assert not torch.equal(a, b)  # the ranks' own streams (the fixture seeds them with their rank)
    runs = []
    for _ in range(2):
        with tmesh.activate():
            torch.manual_seed(0)
            runs.append(torch.randn(3))
    first, second = (r.fetch().values() for r in runs)
    torch.manual_seed(0)
    local = torch.randn(3)  # the controller was seeded too
    assert all(torch.equal(t, local) for t in first + second)  # reproducible, the same on every rank
    assert torch.manual_seed.__doc__ and torch.manual_seed(1) is torch.default_generator


def test_a_seed_torch_refuses_is_refused_once_at_its_line_and_sent_to_no_rank(tmesh):
    with tmesh.activate():
        with pytest.raises((ValueError, RuntimeError), match="Overflow"):
            torch.manual_seed(2**70)
        x = torch.ones(2)
    assert [t.tolist() for t in x.fetch().values()] == [[1.0, 1.0]] * 2  # not a second time, at the fetch


def test_an_op_under_autocast_is_refused_rather_than_run_in_full_precision(tmesh):
    """torch.autocast reaches neither the ranks nor the meta tensors the controller checks ops
    on: an op under it would silently run in full precision. It is refused at its line, naming
    the op, autocast and what to do; nothing is sent, and the ops after the block run."""
    with tmesh.activate():
        a = torch.ones(2, 2)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            with pytest.raises(RuntimeError, match=r"matmul\S*: torch\.autocast is on[\s\S]*full precision[\s\S]*"
                                                   r"cast explicitly[\s\S]*mesh\.run"):
                a @ a
            with pytest.raises(RuntimeError, match=r"randn: torch\.autocast is on"):
                torch.randn(2)
        b = a @ a
    assert b.dtype == torch.float32 and b.fetch(gpus=0).tolist() == [[2.0, 2.0]] * 2
