"""Devices as PyTorch code names them: a MeshTensor's ``.device`` reads ``meta`` on the controller
(where only its shape and dtype are), and ``"cuda"`` means each rank's own device; both, given
to an op or a factory, put its result where the MeshTensor lives on each rank."""

import re

import pytest

torch = pytest.importorskip("torch")
from viceroy.runtime.tensors import MeshTensor  # noqa: E402

_OWN = "cuda" if torch.cuda.is_available() else "cpu"


def _devices(mesh, *ts):
    return mesh.run(lambda *xs: [x.device.type for x in xs], *ts).values()


def test_moving_to_a_mesh_tensors_own_device_keeps_it_on_the_ranks(mesh):
    """``y.to(x.device)``, ``x.to("cuda")``, ``x.cuda()``: on each rank, the rank's own device
    (its GPU, or the CPU on a rank without one); the values are untouched, and ``x`` itself too."""
    with mesh.activate():
        x = torch.arange(3.0)
        moved = [x.to(x.device), x.to("cuda"), x.to(device=torch.device("cuda")), x.cuda(),
                 x.to(x.device, torch.float64), x.to(device=x.device, dtype=torch.int64)]
        total = x + moved[0]
    assert all(type(m) is MeshTensor for m in moved)
    assert [m.dtype for m in moved[-2:]] == [torch.float64, torch.int64]
    assert [[v.tolist() for v in m.fetch().values()] for m in moved] == [[[0.0, 1.0, 2.0]] * 2] * 6
    assert [v.tolist() for v in total.fetch().values()] == [[0.0, 2.0, 4.0]] * 2
    assert _devices(mesh, x, *moved) == [[_OWN] * 7] * 2


def test_a_factory_on_a_mesh_tensors_device_is_a_mesh_tensor(mesh):
    """``torch.zeros(n, device=x.device)`` (and ``x.new_zeros``, ``torch.zeros_like(x,
    device=x.device)``): made on each rank's own device, as ``device="cuda"`` is."""
    with mesh.activate():
        x = torch.ones(2)
        made = [torch.zeros(2, device=x.device), torch.full((2,), 3.0, device=x.device),
                torch.arange(2, device=x.device), x.new_zeros(2, device=x.device),
                torch.zeros_like(x, device=x.device), torch.ones(2, device="meta")]
        summed = x + made[0] + made[1]
    assert [type(m) for m in made] == [MeshTensor] * 6
    assert [v.tolist() for v in summed.fetch().values()] == [[4.0, 4.0]] * 2
    assert made[2].fetch(gpus=1).tolist() == [0, 1]
    assert _devices(mesh, *made) == [[_OWN] * 6] * 2


def test_a_local_meta_tensor_in_an_op_is_refused_at_its_line(mesh):
    """A meta tensor made outside ``activate()`` has no values to send: refused where it is
    used, saying what to do, with nothing sent (and the mesh's tensors unharmed)."""
    hollow = torch.ones(2, device="meta")
    with mesh.activate():
        x = torch.ones(2)
        with pytest.raises(RuntimeError, match=r"add\(\): .*meta device.*no values.*make it under mesh.activate\(\)"):
            x + hollow
    assert x.fetch(gpus=0).tolist() == [1.0, 1.0]


def test_a_model_built_under_activate_converts_like_a_local_one(mesh):
    """``model.to("cuda")``, ``model.cuda()``, ``model.double()``, ``model.to(dtype)`` under
    ``activate()``: Module._apply reads each parameter's ``.grad``, which the controller cannot
    know (autograd is on the ranks); there it reads None, the parameters are converted on the
    ranks, and they stay the model's own (the same MeshTensors, still requiring grad)."""
    with mesh.activate():
        torch.manual_seed(0)
        model = torch.nn.Linear(3, 2)
        weight = model.weight
        assert model.to("cuda") is model and model.cuda() is model
        model.double()
        x = torch.ones(4, 3, dtype=torch.float64)
        y = model(x)
        model.to(torch.float32)
    torch.manual_seed(0)
    local = torch.nn.Linear(3, 2).double()
    assert model.weight is weight and isinstance(model.weight, torch.nn.Parameter)
    assert y.dtype == torch.float64 and model.weight.dtype == torch.float32
    torch.testing.assert_close(y.fetch(gpus=1), local(torch.ones(4, 3, dtype=torch.float64)))
    assert mesh.run(lambda w: (w.dtype, w.device.type, w.requires_grad), model.weight).values() == \
        [(torch.float32, _OWN, True)] * 2


def test_reading_grad_outside_a_module_conversion_is_still_refused(mesh):
    with mesh.activate():
        w = torch.nn.Linear(2, 2).weight
        w.to(torch.float64)  # (an op that Module conversions use, outside one)
        with pytest.raises(RuntimeError, match=r"\.grad: autograd runs on the ranks"):
            w.grad  # noqa: B018


@pytest.mark.parametrize("op, what", [
    (lambda x: x.to("cuda:0"), "to(cuda:0)"),
    (lambda x: x.to(device=torch.device("cuda", 1)), "to(cuda:1)"),
    (lambda x: x.cuda(0), "cuda(0)"),
])
def test_moving_a_mesh_tensor_to_a_numbered_gpu_says_to_name_the_ranks_own(mesh, op, what):
    """``x.to("cuda:0")`` would put every rank's tensor on the same GPU (and cannot be checked
    on a controller without one): refused at its line, saying to name "cuda" or x.device."""
    with mesh.activate():
        x = torch.ones(2)
        with pytest.raises(RuntimeError, match=rf"^{re.escape(what)}: a MeshTensor lives on each rank's own device; "
                                               r"a numbered GPU would be the same one on every rank\. Name the rank's "
                                               r"own: \"cuda\" or x\.device"):
            op(x)
    assert x.fetch(gpus=1).tolist() == [1.0, 1.0]
