"""MeshTensors on several views of one mesh: each keeps its own tensors, equal views share an
engine, collectives in the engine fail fast, and ``to_mesh`` moves tensors between views."""

import gc
import inspect as pyinspect
import time

import pytest

import viceroy as vr
from tests.conftest import wait_until

torch = pytest.importorskip("torch")
reduce = vr.reduce


@pytest.fixture
def mesh4(seeded_mesh):
    return seeded_mesh(gpus=4)


def test_tensors_of_overlapping_views_never_share_a_slot_on_a_rank(mesh4):
    with mesh4.activate():
        a = torch.ones(3)
    sub = mesh4.slice(gpus=0)
    with sub.activate():
        b = torch.zeros(3)
    assert [t.tolist() for t in a.fetch().values()] == [[1.0] * 3] * 4
    del b
    gc.collect()
    with sub.activate():
        c = torch.full((2,), 7.0)
    assert a.fetch(gpus=0).tolist() == [1.0] * 3  # b's free did not take a with it
    assert c.fetch().values()[0].tolist() == [7.0, 7.0]


def test_equal_views_share_one_engine(mesh4):
    with mesh4.slice(gpus=slice(0, 2)).activate():
        a = torch.ones(2)
    with mesh4.slice(gpus=slice(0, 2)).activate():
        b = torch.ones(2) * 2
    assert [t.tolist() for t in (a + b).fetch().values()] == [[3.0, 3.0]] * 2
    with (pytest.raises(ValueError, match=r"different views of one mesh \(gpus=2, ranks 0-1 and gpus=4, ranks 0-3\); keep the work on one view"),
          mesh4.activate()):
        a + torch.ones(2)


def test_a_rank_failing_before_a_reduce_ends_it_on_every_rank_at_once(mesh4):
    with mesh4.activate():
        x = torch.randn(1, 1) - 0.5  # seeded per rank: 1.04, 0.16, -0.11, 0.30 on ranks 0-3
        c = torch.linalg.cholesky(x)  # not positive definite on rank 2 only
        line = pyinspect.currentframe().f_lineno - 1
    total = reduce(c, "sum")
    start = time.monotonic()
    with pytest.raises(vr.MeshError) as info:
        total.fetch()
    assert time.monotonic() - start < 5, "the other ranks waited in the reduce for rank 2"
    text = str(info.value)
    assert "rank 2" in text and f"line {line}" in text and "cholesky" in text
    # the engine carries on, and the data plane works again
    with mesh4.activate():
        y = torch.ones(2)
    assert [t.tolist() for t in reduce(y, "sum").fetch().values()] == [[4.0, 4.0]] * 4


def _values(t):
    return [x.tolist() for x in t.fetch().values()]


def test_to_mesh_moves_each_ranks_tensor_to_its_partner_in_the_other_view(seeded_mesh):
    mesh = seeded_mesh(stage=2, gpus=2)
    first, second = mesh.slice(stage=0), mesh.slice(stage=1)
    with first.activate():
        h = torch.randn(3) * 2
    sent = h.fetch().values()
    h1 = h.to_mesh(second)
    assert repr(h1) == "MeshTensor(shape=(3,), dtype=float32, mesh=gpus=2)"
    assert _values(h1) == [t.tolist() for t in sent]
    with second.activate():
        out = h1 + 1  # the moved tensor is an ordinary tensor of the second view
    del h
    gc.collect()
    assert _values(out) == [(t + 1).tolist() for t in sent]


def test_to_mesh_around_a_ring_where_every_rank_sends_and_receives(mesh4):
    with mesh4.activate():
        x = torch.randn(1000)
    sent = _values(x)
    turned = x.to_mesh(mesh4.select([1, 2, 3, 0]))  # rank i sends to rank i+1
    got = dict(zip([1, 2, 3, 0], _values(turned), strict=True))
    assert [got[r] for r in range(4)] == [sent[3], sent[0], sent[1], sent[2]]


def test_to_mesh_onto_an_overlapping_view_copies_where_a_rank_keeps_its_own(mesh4):
    with mesh4.select([0, 1]).activate():
        a = torch.ones(2)
    b = a.to_mesh(mesh4.select([0, 2]))  # rank 0 keeps its piece, rank 1 sends to rank 2
    with mesh4.select([0, 2]).activate():
        b.add_(5)
    assert _values(b) == [[6.0, 6.0]] * 2
    assert _values(a) == [[1.0, 1.0]] * 2  # a copy, not the same tensor


def test_to_mesh_refuses_views_that_do_not_pair_up_and_sends_nothing(mesh4, start_mesh):
    with mesh4.slice(gpus=slice(0, 2)).activate():
        a = torch.ones(2)
    with pytest.raises(ValueError, match=r"same sizes.*\(gpus=2\).*\(gpus=3\)"):
        a.to_mesh(mesh4.slice(gpus=slice(1, 4)))
    other = start_mesh(gpus=2, preload=["torch"])
    with pytest.raises(ValueError, match=r"the tensor's mesh and the target are different meshes \(both gpus=2\): "
                                         "fetch it and push it"):
        a.to_mesh(other)
    with pytest.raises(TypeError, match="takes a Mesh"):
        a.to_mesh("gpus=1")
    assert _values(a) == [[1.0, 1.0]] * 2


@pytest.mark.parametrize("dead", [1, 3], ids=["source rank dead", "target rank dead"])
def test_to_mesh_with_a_dead_rank_fails_at_once_naming_it_and_gives_no_handle(mesh4, dead):
    import os
    import signal

    first, second = mesh4.slice(gpus=slice(0, 2)), mesh4.slice(gpus=slice(2, 4))
    with first.activate():
        h = torch.arange(3.0) + 10
    assert [v.tolist() for v in h.fetch().values()] == [[10.0, 11.0, 12.0]] * 2
    os.kill(mesh4.pids()[dead], signal.SIGKILL)
    wait_until(lambda: mesh4.states()[dead] == "dead", 10, f"rank {dead} to be seen dead")
    t0 = time.monotonic()
    with pytest.raises(vr.MeshError) as info:
        h.to_mesh(second)  # here, not at a later fetch of a handle whose tensor exists nowhere
    assert time.monotonic() - t0 < 1.0
    msg = str(info.value)
    assert f"rank {dead}: dead (SIGKILL) before the call" in msg, msg
    assert "to_mesh (ranks 0-1 -> 2-3) failed" in msg and "mesh.restart(failed_only=True)" in msg, msg
    mesh4.restart(failed_only=True)
    # Nothing was half-moved, nor left due: the source is intact, and the move works now.
    if dead == 3:
        assert [v.tolist() for v in h.fetch().values()] == [[10.0, 11.0, 12.0]] * 2
    else:
        with pytest.raises(vr.MeshError, match=r"rank 1: .*does not exist on this rank: the rank was restarted since"):
            h.fetch()  # the source rank restarted has lost its piece, and says so
        with first.activate():
            h = torch.arange(3.0) + 10
    moved = h.to_mesh(second)
    assert [v.tolist() for v in moved.fetch().values()] == [[10.0, 11.0, 12.0]] * 2


def test_to_mesh_of_a_tensor_that_failed_ends_at_once_naming_its_line(mesh4):
    with mesh4.slice(gpus=slice(0, 2)).activate():
        a = torch.arange(4.0)
        bad = a[torch.tensor([10])]  # fine on meta tensors, out of range on the ranks
    moved = bad.to_mesh(mesh4.slice(gpus=slice(2, 4)))
    line = pyinspect.currentframe().f_lineno - 1
    start = time.monotonic()
    with pytest.raises(vr.MeshError) as info:
        moved.fetch()
    assert time.monotonic() - start < 5, "the receivers waited for senders that had nothing"
    assert f"to_mesh (issued at {__file__}, line {line})" in str(info.value)
    with pytest.raises(vr.MeshError, match="__getitem__"):  # the source's own failure, at its next sync
        a.fetch()
    assert _values(a) == [[0.0, 1.0, 2.0, 3.0]] * 2
    again = a.to_mesh(mesh4.slice(gpus=slice(2, 4)))  # and the data plane works again
    assert _values(again) == [[0.0, 1.0, 2.0, 3.0]] * 2


def test_a_restarted_rank_explains_that_its_tensors_are_gone(mesh4):
    import os
    import signal

    with mesh4.activate():
        a = torch.ones(2)
    a.fetch()
    os.kill(mesh4.pids()[1], signal.SIGKILL)
    wait_until(lambda: mesh4.states()[1] == "dead", 10, "rank 1 to be seen dead")
    mesh4.restart(failed_only=True)
    with pytest.raises(vr.MeshError) as info:
        a.fetch()
    assert "rank 1:" in str(info.value) and "the rank was restarted since" in str(info.value)
    assert a.fetch(gpus=0).tolist() == [1.0, 1.0]  # the others kept theirs
    with pytest.raises(vr.MeshError, match=r"rank 1:.*restarted since"):
        vr.inspect(a)


def test_ops_issued_while_a_rank_is_dead_are_named_once_it_is_restarted(mesh4):
    """A batch issued while a rank of its view is dead goes to no rank: the next sync names
    its ops and says what to do as of then; the tensors they make or change say which op made
    them have no value; tensors made after the restart work."""
    import os
    import signal

    with mesh4.activate():
        a = torch.ones(2)
    a.fetch()
    os.kill(mesh4.pids()[1], signal.SIGKILL)
    wait_until(lambda: mesh4.states()[1] == "dead", 10, "rank 1 to be seen dead")
    with mesh4.activate():
        h = a + 1
        line = pyinspect.currentframe().f_lineno - 1
    with pytest.raises(vr.MeshError) as info:
        h.fetch()  # still dead: bring it back, then make the tensors again
    text = str(info.value)
    assert f"the op add (issued at {__file__}, line {line}) never ran" in text
    assert "once rank 1 is back: mesh.restart(failed_only=True)" in text
    with mesh4.activate():
        a.add_(1)  # in place, while rank 1 is still dead: a is not what the program says
        line2 = pyinspect.currentframe().f_lineno - 1
    mesh4.restart(failed_only=True)
    with mesh4.activate():
        k = torch.zeros(2)  # made after the restart
    with pytest.raises(vr.MeshError) as info:
        k.fetch()  # the batch not sent surfaces at the next sync, naming its op
    text = str(info.value)
    assert f"add_ (issued at {__file__}, line {line2}) never ran" in text and "restarted since" in text
    assert "mesh.restart" not in text
    assert [t.tolist() for t in k.fetch().values()] == [[0.0, 0.0]] * 4
    for t, n, op in ((h, line, "add"), (a, line2, "add_")):  # on every rank, the restarted one too
        for r in range(4):
            with pytest.raises(vr.MeshError, match=rf"no value here: {op} \(issued at .*line {n}\) never ran: "
                                                   "rank 1 was dead when it was sent"):
                t.fetch(gpus=r)


def test_a_mesh_tensor_sent_to_its_ranks_is_each_ranks_own_tensor(mesh4):
    with mesh4.activate():
        a = torch.arange(3.0) * 2  # still queued: sending it sends the queue first
    assert mesh4.run(lambda t: t.tolist(), a).values() == [[0.0, 2.0, 4.0]] * 4
    mesh4.run("t.add_(rank)", t=a)  # rank code may change its values in place
    assert [t.tolist() for t in a.fetch().values()] == [[r, 2.0 + r, 4.0 + r] for r in range(4)]
    first = mesh4.slice(gpus=slice(0, 2))
    with first.activate():
        b = torch.ones(2)
    assert first.run(lambda t: t.sum().item(), b).values() == [2.0, 2.0]
    assert first.spawn(Summer).total.call(b).get().values() == [2.0, 2.0]  # to actors on its ranks too


class Summer(vr.Actor):
    @vr.endpoint
    def total(self, t):
        return t.sum().item()


def test_a_mesh_tensor_sent_where_it_has_no_piece_is_refused_before_sending(mesh4, start_mesh):
    with mesh4.slice(gpus=slice(0, 2)).activate():
        b = torch.ones(2)
    with pytest.raises(ValueError, match=r"ranks 2-3 of this call have none: run on its view, or move it"):
        mesh4.run(lambda t: t, b)
    other = start_mesh(gpus=1, preload=["torch"])
    with pytest.raises(ValueError, match=r"MeshTensor of mesh \(gpus=2\) cannot be used on another mesh \(gpus=1\)"):
        other.run("t", t=b)
    assert mesh4.states() == dict.fromkeys(range(4), "idle")


def test_a_mesh_tensor_of_a_mesh_shut_down_says_so_at_the_users_line(start_mesh):
    mesh = start_mesh(gpus=2, preload=["torch"])
    with mesh.activate():
        a = torch.ones(2)
    mesh.shutdown()
    with pytest.raises(RuntimeError, match=r"this MeshTensor \(gpus=2\) belongs to a mesh that was shut down at"):
        a + 1  # at the line that uses it, not at a later fetch
    for use in (a.fetch, lambda: mesh.run(lambda t: t, a), mesh.activate):
        with pytest.raises(RuntimeError, match="shut down"):
            use()


def test_a_mesh_tensor_of_a_mesh_shut_down_used_on_a_new_mesh_says_to_make_it_again(start_mesh):
    # It said "cannot be used on another mesh (gpus=2): fetch it and push it instead", which
    # its shut-down mesh cannot do.
    old = start_mesh(gpus=2, preload=["torch"])
    with old.activate():
        a = torch.ones(2)
    old.shutdown()
    new = start_mesh(gpus=2, preload=["torch"])
    with new.activate():
        b = torch.ones(2)
    gone = (r"a MeshTensor of mesh \(gpus=2\), which was shut down, cannot be used on mesh \(gpus=2\): its pieces "
            r"went with its mesh, so it cannot be fetched either; make it again on the live mesh \(compute it "
            r"under mesh\.activate\(\)\)")
    for use, what in [(lambda: new.run("t", t=a), ""), (lambda: new.run(lambda t: t, a), ""),
                      (lambda: a + b, "add: "), (lambda: a.to_mesh(new), "to_mesh: ")]:
        with pytest.raises(ValueError, match="^" + what + gone + "$"):
            use()
    assert (b + 1).fetch(gpus=1).tolist() == [2.0, 2.0]
