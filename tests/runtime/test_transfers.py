"""Big arrays between the controller and ranks of its host go through shared memory: one copy
for all ranks, none left behind."""

import os
import resource

import numpy as np
import pytest

import viceroy as vr
from tests.conftest import wait_until


def _shm_files(mesh):
    prefix = f"viceroy-{mesh._controller.token}-"
    return [n for n in os.listdir("/dev/shm") if n.startswith(prefix)]


def test_large_push_and_pull_round_trip_through_shared_memory(start_mesh):
    mesh = start_mesh(gpus=2)
    big = np.random.default_rng(0).standard_normal(1 << 20)  # 8 MiB
    mesh.push(big=big)
    assert mesh.run("float(big[12345])").values() == [float(big[12345])] * 2
    assert mesh.run("big.flags.writeable").values() == [True, True]
    mesh.run("big[0] = rank")  # copy-on-write: each rank's write is its own
    back = mesh.pull("big").values()
    assert [float(b[0]) for b in back] == [0.0, 1.0]
    np.testing.assert_array_equal(back[0][1:], big[1:])
    back[0][5] = 7  # the controller's copy is writable too
    assert _shm_files(mesh) == []  # every file was unlinked once read


def test_torch_tensors_travel_through_shared_memory(start_mesh):
    torch = pytest.importorskip("torch")
    mesh = start_mesh(gpus=2, preload=["torch"])
    t = torch.arange(1 << 20, dtype=torch.float32)
    mesh.push(t=t)
    assert mesh.run("float(t.sum())").values() == [float(t.sum())] * 2
    out = mesh.run("t * rank").values()
    assert torch.equal(out[1], t)
    assert _shm_files(mesh) == []


def test_a_failed_call_leaves_no_shared_memory_behind(start_mesh):
    mesh = start_mesh(gpus=2)
    with pytest.raises(vr.MeshError, match="ZeroDivisionError"):
        mesh.run(lambda a: 1 / 0, np.zeros(1 << 18))
    assert _shm_files(mesh) == []


@pytest.mark.slow
def test_pushing_1gib_to_8_ranks_keeps_controller_memory_flat(start_mesh):
    mesh = start_mesh(gpus=8)
    arr = np.ones(1 << 27, dtype=np.float64)  # 1 GiB, allocated and touched before measuring
    base = _peak_rss_bytes()
    mesh.push(arr=arr)
    assert mesh.run("(arr.shape, float(arr[-1]))").values() == [((1 << 27,), 1.0)] * 8
    growth = _peak_rss_bytes() - base
    assert growth < 1.5 * (1 << 30), f"peak RSS grew by {growth / (1 << 30):.2f} GiB"
    mesh.run("del arr")
    wait_until(lambda: not _shm_files(mesh), 5, "shared memory to be released")


def _peak_rss_bytes():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
