"""An op that fails on the ranks: the ops after it still run unless they use what it should
have made; those fail naming the op that failed first and its line (worker.apply_batch)."""

import inspect as pyinspect
import os
import re
import time

import pytest

import viceroy as vr
from tests.conftest import wait_until

torch = pytest.importorskip("torch")
from viceroy.runtime.tensors import reduce  # noqa: E402


def _line() -> int:
    return pyinspect.currentframe().f_back.f_lineno - 1


@pytest.fixture
def tmesh(seeded_mesh):
    return seeded_mesh(gpus=2)


def _index_bad_on_rank_1(mesh):
    """A MeshTensor index: 0 on every rank, 10 on rank 1 (out of range for a 4-long tensor)."""
    with mesh.activate():
        i = torch.zeros(1, dtype=torch.long)
    mesh.run(lambda t: t.fill_(10 if vr.context().rank == 1 else 0), i)
    return i


def test_ops_after_a_failed_op_of_the_same_batch_still_run(tmesh):
    with tmesh.activate():
        x = torch.zeros(4)
        bad = x[torch.tensor([10])]  # fine on meta tensors, out of range on the ranks
        line = _line()
        x.add_(1)  # independent of `bad`: runs
        y = x * 2  # independent of `bad`: runs
    with pytest.raises(vr.MeshError, match=f"line {line}"):
        x.fetch()  # the failure surfaces once, at the next fetch
    assert [t.tolist() for t in x.fetch().values()] == [[1.0] * 4] * 2
    assert [t.tolist() for t in y.fetch().values()] == [[2.0] * 4] * 2
    del bad


def test_a_failure_raised_at_the_fetch_of_a_tensor_it_did_not_touch_says_what_to_do(tmesh):
    """The fetch of `good` raises the failure of an op `good` does not depend on: the message
    names that op, its line and the ranks, and says that `good` is unharmed (fetch it again) and
    to fix the line named and make its results again."""
    with tmesh.activate():
        x = torch.zeros(4)
        bad = x[torch.tensor([10])]
        line = _line()
        good = x + 2
    with pytest.raises(vr.MeshError) as info:
        good.fetch(gpus=0)
    text = str(info.value)
    assert f"ranks 0-1: __getitem__ (issued at {__file__}, line {line}) failed: IndexError" in text
    assert re.search(r"\nRaised at this fetch, the first since that op failed on the ranks: tensors made without "
                     r"its result are unharmed \(fetch them again\); fix the line it names, and make again the "
                     r"tensors made from it$", text), text
    assert good.fetch(gpus=0).tolist() == [2.0] * 4
    del bad


def test_ops_using_a_failed_result_fail_naming_the_first_failed_op_and_its_line(tmesh):
    with tmesh.activate():
        x = torch.zeros(4)
        bad = x[torch.tensor([10])]
        line = _line()
        z = (bad + 1) * 2  # uses it, through another op
        x.add_(bad.sum())  # in place, from it: x's value is not what the program says
    with pytest.raises(vr.MeshError) as info:
        z.fetch()
    text = str(info.value)
    assert f"test_failures.py, line {line}" in text and "IndexError" in text
    assert "did not run" in text and "more ops of this batch failed or did not run" in text
    for t in (z, x):  # later fetches say why, naming the first failure, and never an old value
        with pytest.raises(vr.MeshError, match=rf"no value here: __getitem__ \(issued at .*line {line}\) failed: IndexError"):
            t.fetch()
    with tmesh.activate():
        w = bad * 3  # a later batch: still the first failure, not "does not exist"
    with pytest.raises(vr.MeshError) as info:
        w.fetch()
    assert f"line {line}) failed: IndexError" in str(info.value) and "does not exist" not in str(info.value)


def test_a_failed_in_place_op_marks_its_tensor(tmesh):
    with tmesh.activate():
        x = torch.zeros(4)
        x[torch.tensor([10])] = 5.0  # fails on the ranks: x is not what the program says
        line = _line()
        x.add_(1)  # uses x: does not run
        other = torch.ones(2) + 1  # independent: runs
    with pytest.raises(vr.MeshError, match=f"line {line}"):
        other.fetch()
    assert other.fetch(gpus=1).tolist() == [2.0, 2.0]
    with pytest.raises(vr.MeshError, match=f"line {line}"):
        x.fetch()
    with pytest.raises(vr.MeshError, match=f"line {line}"):  # a handle in rank code too
        tmesh.run(lambda t: t.sum().item(), x)


def test_an_op_failing_on_one_rank_only_leaves_the_others_in_step(tmesh):
    i = _index_bad_on_rank_1(tmesh)
    with tmesh.activate():
        w = torch.zeros(4)
        picked = w[i]  # out of range on rank 1 only
        line = _line()
        w.add_(5)  # independent: runs on both ranks
    with pytest.raises(vr.MeshError, match=rf"failed on 1 of 2 ranks[\s\S]*line {line}"):
        w.fetch()
    assert [t.tolist() for t in w.fetch().values()] == [[5.0] * 4] * 2
    assert picked.fetch(gpus=0).tolist() == [0.0]
    with pytest.raises(vr.MeshError, match="rank 1:"):
        picked.fetch(gpus=1)


def test_a_collective_of_a_failed_tensor_fails_at_once_and_an_unrelated_one_runs(tmesh):
    with tmesh.activate():
        x = torch.ones(3)
        bad = x[torch.tensor([10])]
        line = _line()
        y = x * 2
    ok = reduce(y, "sum")  # in the same flow as the failure, independent of it
    lost = reduce(bad, "sum")  # no rank can join: every rank stops, none waits
    start = time.monotonic()
    with pytest.raises(vr.MeshError, match=f"line {line}"):
        lost.fetch()
    assert time.monotonic() - start < 30
    assert ok.fetch(gpus=0).tolist() == [4.0] * 3
    with pytest.raises(vr.MeshError, match=rf"no value here: __getitem__ \(issued at .*line {line}\)"):
        lost.fetch()


def test_a_collective_one_rank_cannot_join_ends_on_its_peers_naming_that_rank(tmesh):
    i = _index_bad_on_rank_1(tmesh)
    with tmesh.activate():
        x = torch.ones(4)
        picked = x[i]  # out of range on rank 1 only: rank 0 has a value and joins the reduce
        line = _line()
        y = x * 3
    ok = reduce(y, "sum")  # the collective before it: every rank finishes it, none is cut off
    lost = reduce(picked, "sum")
    start = time.monotonic()
    with pytest.raises(vr.MeshError, match=f"line {line}"):  # the failed op surfaces first
        lost.fetch()
    # Rank 0 waited in the reduce for rank 1, which could not join it: released, naming it.
    # (A fetch is not fail-fast: each rank says why it has no value.)
    with pytest.raises(vr.MeshError) as info:
        lost.fetch()
    assert re.search(r"^rank 0: .*rank 1 finished the call without joining", str(info.value), re.M), info.value
    assert re.search(rf"^rank 1: .*__getitem__ \(issued at .*line {line}\)", str(info.value), re.M), info.value
    assert time.monotonic() - start < 5
    assert [t.tolist() for t in ok.fetch().values()] == [[6.0] * 4] * 2


def test_to_mesh_of_a_failed_tensor_names_the_failure_on_both_sides(seeded_mesh):
    mesh = seeded_mesh(gpus=4)
    with mesh.slice(gpus=slice(0, 2)).activate():
        x = torch.zeros(4)
        bad = x[torch.tensor([10])]
        line = _line()
    moved = bad.to_mesh(mesh.slice(gpus=slice(2, 4)))
    moved_line = _line()
    with pytest.raises(vr.MeshError, match=rf"to_mesh \(issued at .*line {moved_line}\): .*line {line}\) failed: IndexError"):
        moved.fetch()
    with pytest.raises(vr.MeshError, match=rf"ranks 2-3: .*no value here: to_mesh \(issued at .*line {moved_line}\)"):
        moved.fetch()


def test_a_fetch_of_a_tensor_with_no_value_anywhere_names_its_op_on_every_rank(seeded_mesh):
    """Each rank answers for itself: none is reported as stopped by fail-fast, however late it
    answers (rank 0, busy with other work here), and the message is the op, its line and the
    ranks, without the engine's own exception type."""
    mesh = seeded_mesh(gpus=4)
    with mesh.activate():
        x = torch.zeros(4)
        bad = x[torch.tensor([10])]  # fails on every rank
        line = _line()
    with pytest.raises(vr.MeshError, match=f"line {line}"):
        bad.fetch()
    for ask in (bad.fetch, lambda: vr.inspect(bad)):
        busy = mesh.slice(gpus=0).run("import time\ntime.sleep(0.5)", block=False)  # rank 0 answers last
        with pytest.raises(vr.MeshError) as info:
            ask()
        text = str(info.value)
        assert "failed on 4 of 4 ranks" in text and "fail-fast" not in text, text
        assert re.search(rf"^ranks 0-3: this tensor has no value here: __getitem__ \(issued at \S*test_failures.py, "
                         rf"line {line}\) failed: IndexError: index 10 is out of bounds", text, re.M), text
        assert "OpFailed" not in text and len(text.splitlines()) == 2, text
        busy.get()  # the fetch did not interrupt rank 0's own work


def test_a_tensor_lost_to_a_restart_says_so_without_an_internal_id(seeded_mesh):
    mesh = seeded_mesh(gpus=2)
    with mesh.activate():
        x = torch.ones(3)
    x.fetch()
    mesh.slice(gpus=1).restart()
    gone = (r"this tensor does not exist on this rank: the rank was restarted since it was made, or the ops that "
            r"made it were interrupted before they started")
    with pytest.raises(vr.MeshError) as info:
        x.fetch()
    assert re.search(rf"^rank 1: {gone}", str(info.value), re.M) and "#" not in str(info.value), info.value
    with mesh.activate():
        y = x * 2
        line = _line()
    for _ in range(2):  # the batch's failure, then the tensor's
        with pytest.raises(vr.MeshError) as info:
            y.fetch()
        text = str(info.value)
        assert re.search(rf"^rank 1: .*mul \(issued at \S*, line {line}\) did not run: it uses a tensor that does "
                         rf"not exist on this rank: the rank was restarted", text, re.M), text
        assert "#" not in text and "an op that failed" not in text and "OpFailed" not in text, text
    assert y.fetch(gpus=0).tolist() == [2.0] * 3
    total = reduce(x, "sum")  # rank 1 cannot join: it says why, by the name the user called
    line = _line()
    with pytest.raises(vr.MeshError) as info:
        total.fetch()
    assert re.search(rf"^rank 1: vr.reduce \(issued at \S*, line {line}\) did not run: it uses a tensor that does "
                     "not exist", str(info.value), re.M), info.value


def test_a_fetch_of_a_tensor_rank_code_reshaped_says_so_rather_than_return_another_shape(tmesh):
    """Rank code may change a MeshTensor's values in place, not its shape or dtype: the
    controller checks the ops after it against its own. A fetch of one changed anyway names the
    ranks, both shapes and what to do, rather than hand back pieces the controller disagrees with."""
    with tmesh.activate():
        e = torch.ones(2) * 3
    tmesh.slice(gpus=1).run("t.unsqueeze_(0)", t=e)
    with pytest.raises(vr.MeshError) as info:
        e.fetch()
    text = str(info.value)
    assert "failed on 1 of 2 ranks" in text, text
    assert re.search(r"^rank 1: this tensor is float32\[1, 2\] here, but float32\[2\] on the controller, which "
                     r"checks the ops on it against that: rank code changed it", text, re.M), text
    assert e.fetch(gpus=0).tolist() == [3.0, 3.0]
    tmesh.run("t.data = t.data.long()", t=e)
    with pytest.raises(vr.MeshError, match=r"rank 0: this tensor is int64\[2\] here, but float32\[2\] on the controller"):
        e.fetch(gpus=0)


class _Unpacked(float):
    """A number that, unpickled on a rank, calls `fn(*args)` there (while the rank unpacks its
    batch of ops, before any op runs)."""

    def __new__(cls, value: float, fn: object, args: tuple) -> "_Unpacked":
        x = super().__new__(cls, value)
        x.call = (fn, args)
        return x

    def __reduce__(self) -> tuple:
        return self.call


def test_an_interrupt_while_a_rank_unpacks_a_batch_names_the_op_about_to_run(tmesh, tmp_path):
    # It said a bare "interrupted", or where in torch's unpickling code the interrupt hit.
    import tempfile

    from viceroy.runtime.tensors import worker

    with tmesh.activate():
        a = torch.ones(3)
        e = a * 3
    e.fetch()
    held = tmesh.run(worker.count).values()
    del e  # its free goes with the next batch, and applies though none of its ops runs
    arrived, fifo = tmp_path / "arrived", tmp_path / "fifo"
    arrived.mkdir()
    os.mkfifo(fifo)
    # Each rank, unpacking the batch, makes a file in `arrived`, then blocks opening `fifo` (no
    # writer ever comes) until it is interrupted.
    with tmesh.activate():
        b = torch.mul(a, _Unpacked(2.0, tempfile.mkstemp, (None, None, str(arrived))))
        line = _line()
        c = b + _Unpacked(1.0, open, (str(fifo),))
    tmesh.run("0", block=False)  # the ops go out first
    wait_until(lambda: len(os.listdir(arrived)) == 2, 30, "both ranks to unpack the batch")
    tmesh.interrupt()
    with pytest.raises(vr.MeshError) as info:
        c.fetch()
    failures = info.value.failures
    assert sorted(failures) == [0, 1], info.value
    for f in failures.values():
        assert re.fullmatch(rf"interrupted \(at mul, issued at \S*test_failures.py, line {line}, before it began: "
                            r"the rank was still unpacking its batch of ops\)", f.summary), info.value
    assert tmesh.run(worker.count).values() == [n - 1 for n in held]
    with tmesh.activate():
        d = a + 1
    assert d.fetch().values()[0].tolist() == [2.0, 2.0, 2.0], "the ranks take the next batch"


def test_an_interrupted_batch_names_the_op_it_stopped_at_and_its_line(tmesh):
    import psutil

    with tmesh.activate():
        a = torch.randn(400, 400)
    a.fetch()  # torch imported and the first batch run on every rank: the next is all the loop's
    ranks = [psutil.Process(pid) for pid in tmesh.pids().values()]
    busy = [sum(p.cpu_times()[:2]) for p in ranks]
    with tmesh.activate():
        for _ in range(2000):
            a = (a @ a).tanh()
        line = _line()
    tmesh.run("0", block=False)  # the ops go out first
    # Interrupted inside the loop's ops, not while a rank unpacks the batch: wait until each
    # rank has computed for a while (4,000 ops of about a millisecond each).
    wait_until(lambda: all(sum(p.cpu_times()[:2]) - b > 0.3 for p, b in zip(ranks, busy, strict=True)), 30,
               "the ranks to compute the batch")
    tmesh.interrupt()
    with pytest.raises(vr.MeshError) as info:
        a.fetch()
    failures = info.value.failures
    assert sorted(failures) == [0, 1], info.value
    for f in failures.values():
        assert re.fullmatch(rf"interrupted \(at (matmul|tanh), issued at \S*test_failures.py, line {line}\)",
                            f.summary), info.value
