"""Big arrays between the controller and ranks of its host go through shared memory: one copy
for all ranks, files reused only once nothing maps them, none left behind."""

import os
import resource

import numpy as np
import pytest

import viceroy as vr
from tests.conftest import wait_until
from viceroy.runtime import shm


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
    assert len(_shm_files(mesh)) == 3  # the ranks' answers, kept for reuse, and the push, which they hold
    mesh.shutdown()
    assert _shm_files(mesh) == []
    assert float(back[1][0]) == 1.0  # what the controller holds outlives the files


def test_a_held_result_is_never_written_over(start_mesh):
    mesh = start_mesh(gpus=1)
    mesh.run("import numpy as np; x = np.full(1 << 18, 1.0)")  # 2 MiB
    first = mesh.pull("x").values()[0]
    mesh.run("x[:] = 2.0")
    second = mesh.pull("x").values()[0]
    assert (first.min(), first.max(), second.min()) == (1.0, 1.0, 2.0)
    assert len(_shm_files(mesh)) == 2


def test_a_dropped_result_gives_its_file_back_for_the_next_answer(start_mesh):
    mesh = start_mesh(gpus=1)
    mesh.run("import numpy as np; x = np.zeros(1 << 18)")
    seen = set()
    for i in range(4):
        mesh.run(f"x[:] = {i}")
        value = mesh.pull("x").values()[0]
        assert (value.min(), value.max()) == (i, i)
        seen |= set(_shm_files(mesh))
        del value
    assert len(seen) == 1, seen  # one file, written over each time


def test_segments_reuse_only_what_comes_back_and_drop_strangers(tmp_path):
    token = f"test{os.getpid()}"
    seg = shm.Segments(token, keep_bytes=3 << 20)
    try:
        a = seg.write(memoryview(bytes(1 << 20)))
        b = seg.write(memoryview(bytes(1 << 20)))
        assert a != b  # a is still lent
        seg.returned([a])
        assert seg.write(memoryview(b"x" * (1 << 20))) == a
        with open(a, "rb") as f:
            assert f.read(2) == b"xx"
        stranger = shm.prefix(token) + "999999-1"
        open(stranger, "wb").close()  # left by a rank that was restarted under the same number
        seg.returned([stranger, a, b])
        assert not os.path.exists(stranger)
        assert seg.free_bytes() == 2 << 20
        big = seg.write(memoryview(bytes(4 << 20)))  # no free file of that size: a new one
        seg.returned([big])
        assert seg.free_bytes() <= 3 << 20  # the oldest free files were dropped
    finally:
        seg.close()
    assert not [n for n in os.listdir("/dev/shm") if n.startswith(os.path.basename(shm.prefix(token)))]


def test_torch_tensors_travel_through_shared_memory(start_mesh):
    torch = pytest.importorskip("torch")
    mesh = start_mesh(gpus=2, preload=["torch"])
    t = torch.arange(1 << 20, dtype=torch.float32)
    mesh.push(t=t)
    assert mesh.run("float(t.sum())").values() == [float(t.sum())] * 2
    out = mesh.run("t * rank").values()
    assert torch.equal(out[1], t)
    del out
    mesh.shutdown()
    assert _shm_files(mesh) == []


def test_a_failed_call_lets_go_of_its_arguments_file(start_mesh):
    mesh = start_mesh(gpus=2)
    for _ in range(3):
        with pytest.raises(vr.MeshError, match="ZeroDivisionError"):
            mesh.run(lambda a: 1 / 0, np.zeros(1 << 18))
    assert len(_push_files(mesh)) == 1  # let go of with the failure: written over by the next call
    mesh.shutdown()
    assert _shm_files(mesh) == []


def test_a_functions_arguments_file_is_written_over_by_the_next_call(start_mesh):
    mesh = start_mesh(gpus=2)
    for i in range(4):
        assert mesh.run(lambda a: float(a.max()), np.full(1 << 18, float(i))).values() == [i, i]
    assert len(_push_files(mesh)) == 1  # the arguments are dropped before the answer goes


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


def test_large_answers_are_copied_whole_by_torch_or_by_slice(tmp_path):
    import mmap

    pytest.importorskip("torch")  # loaded: answers of PARALLEL_COPY or more go through it
    n = shm.PARALLEL_COPY + 3  # an odd size
    data = np.random.default_rng(1).integers(0, 256, n, dtype=np.uint8)
    for src in (memoryview(data), memoryview(data.tobytes())):  # writable, then read-only
        m = mmap.mmap(-1, n)
        shm._fill(m, src)
        assert m[:] == data.tobytes()


def _push_files(mesh):
    """The files the controller wrote (the ranks' answers carry their own pids)."""
    return [n for n in _shm_files(mesh) if n.split("-")[2] == str(os.getpid())]


def test_a_push_writes_over_the_file_of_one_every_rank_let_go(start_mesh):
    # Fresh tmpfs pages cost several times a copy into pages already there: a push of the same
    # size writes into the file of an earlier one once no rank maps it any more.
    mesh = start_mesh(gpus=2)
    seen = set()
    for i in range(5):
        mesh.push(x=np.full(1 << 18, float(i)))  # 2 MiB; replaces (lets go of) the last one
        assert mesh.run("(float(x.min()), float(x.max()))").values() == [(i, i)] * 2
        seen |= set(_push_files(mesh))
    # The ranks let go of the last x when the next one replaces it, so after that push: two
    # files in turn, neither written while a rank maps it.
    assert len(seen) == 2, seen


def test_a_pushed_array_a_rank_still_holds_is_never_written_over(start_mesh):
    mesh = start_mesh(gpus=2)
    mesh.push(x=np.full(1 << 18, 1.0))
    mesh.run("if rank == 1: kept = x")  # rank 0 lets go of the first file; rank 1 does not
    for i in (2.0, 3.0, 4.0):
        mesh.push(x=np.full(1 << 18, i))
        assert mesh.run("float(x.max())").values() == [i, i]
        assert mesh.slice(gpus=1).run("(float(kept.min()), float(kept.max()))").values() == [(1.0, 1.0)]
    assert len(_push_files(mesh)) == 3  # the held one, and two in turn
    mesh.run("if rank == 1: del kept")
    mesh.push(x=np.full(1 << 18, 5.0))
    assert len(_push_files(mesh)) == 3  # the one let go of is free again: no new file


def test_a_dead_ranks_hold_on_a_pushed_file_ends_with_it(start_mesh):
    import signal

    mesh = start_mesh(gpus=2)
    mesh.push(x=np.full(1 << 18, 1.0))
    first = set(_push_files(mesh))
    os.kill(mesh.pids()[1], signal.SIGKILL)
    wait_until(lambda: mesh.states()[1] == "dead", 10, "rank 1's death to be known")
    mesh.slice(gpus=0).push(x=np.full(1 << 18, 2.0))  # rank 0 lets go; rank 1 never will
    mesh.slice(gpus=0).push(x=np.full(1 << 18, 3.0))
    files = set(_push_files(mesh))
    assert first <= files and len(files) == 2, "the first file was written over (rank 1's hold ended with it)"
    assert mesh.slice(gpus=0).run("float(x.max())").values() == [3.0]
    mesh.shutdown()
    assert _shm_files(mesh) == []
