"""Under ``activate()``, torch's factories (tensors made from nothing) make MeshTensors: one
tensor per rank, on each rank's own device, equal to what the same call makes locally."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")
from viceroy.runtime.tensors import MeshTensor  # noqa: E402

_MADE = [
    lambda: torch.as_tensor([1.0, 2.0]),
    lambda: torch.as_tensor(np.arange(3), dtype=torch.float64),
    lambda: torch.asarray([[1, 2], [3, 4]]),
    lambda: torch.logspace(0, 2, 3),
    lambda: torch.scalar_tensor(3.5),
    lambda: torch.empty_strided((2, 3), (1, 2)).fill_(1.0),
    lambda: torch.tril_indices(3, 3),
    lambda: torch.triu_indices(3, 3, 1),
    lambda: torch.hann_window(4),
    lambda: torch.kaiser_window(5),
]


@pytest.mark.parametrize("make", _MADE, ids=["as_tensor", "as_tensor_np", "asarray", "logspace", "scalar_tensor",
                                             "empty_strided", "tril_indices", "triu_indices", "hann_window",
                                             "kaiser_window"])
def test_a_factory_under_activate_makes_a_mesh_tensor_equal_to_the_local_one(mesh, make):
    local = make()
    with mesh.activate():
        made = make()
    assert type(made) is MeshTensor, f"a local {type(made).__name__}: the ranks never got it"
    assert (made.shape, made.dtype) == (local.shape, local.dtype)
    for piece in made.fetch().values():
        assert torch.equal(piece, local)
