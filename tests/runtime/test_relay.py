"""Through agents (several hosts), each host's answers come back as one message: plain values in
columns, everything else item by item, and the controller puts them together unchanged."""

from __future__ import annotations

import pickle

import numpy as np
import psutil
import pytest

import viceroy as vr
from viceroy.runtime.answers import aggregate
from viceroy.runtime.calls import Call
from viceroy.runtime.future import Future
from viceroy.runtime.shape import Shape


def test_an_agent_packs_plain_values_in_columns_and_sends_the_rest_item_by_item():
    items = [
        {"r": 4, "ok": True, "signed": 1},
        {"r": 5, "ok": True, "signed": 0},  # no value
        {"r": 6, "ok": False, "kind": "error", "summary": "boom", "signed": 0},
        {"r": 7, "ok": True, "signed": 1, "lens": [4]},  # a value with an array beside it
    ]
    header, signed, data = aggregate(9, items, [b"p4", b"p7"], [b"dddd"])
    assert (header["id"], header["done"], header["packed"]) == (9, [[4, 6]], [2, 0])
    assert [item["r"] for item in header["items"]] == [6, 7]
    assert signed == [b"p4", b"p7"] and data == [b"dddd"]  # packed pickles lead


def test_a_hosts_plain_answers_go_in_rank_order_as_one_run():
    # Answers arrive in any order; the columns are in rank order, so a host is one run.
    items = [{"r": r, "ok": True, "signed": 1} for r in (10, 8, 11, 9)]
    header, signed, _ = aggregate(3, items, [b"a10", b"a8", b"a11", b"a9"], [])
    assert (header["done"], header["packed"], signed) == ([[8, 12]], [2, 2, 3, 3], [b"a8a9a10a11"])


def test_when_no_rank_has_a_value_only_the_ranks_travel():
    header, signed, _ = aggregate(3, [{"r": r, "ok": True, "signed": 0} for r in range(64)], [], [])
    assert (header["done"], "packed" in header, signed) == ([[0, 64]], False, [b""])


def test_scalar_results_go_in_a_column_of_the_header():
    items = [{"r": 3, "ok": True, "v": "three", "signed": 0}, {"r": 2, "ok": True, "v": 2, "signed": 0},
             {"r": 1, "ok": True, "signed": 0}]
    header, _, _ = aggregate(5, items, [], [])
    assert header["vals"] == [[[2, 4]], [2, "three"]]
    assert (header["done"], "packed" in header, header["items"]) == ([[1, 2]], False, [])


def test_no_plain_values_means_no_columns():
    header, signed, _ = aggregate(1, [{"r": 0, "ok": False, "kind": "died", "signed": 0}], [], [])
    assert "done" not in header and signed == []


SCALARS = "[7, 2.5, True, 'x' * 1025, float('inf'), -0.0, 10 ** 30, 'é', None][rank]"


@pytest.mark.parametrize("dims", [{"gpus": 9}, {"hosts": 3, "gpus": 3}], ids=["direct", "relayed"])
def test_scalar_results_keep_their_type_and_value(start_mesh, dims):
    values = start_mesh(**dims).run(SCALARS).values()
    assert values == [7, 2.5, True, "x" * 1025, float("inf"), -0.0, 10**30, "é", None]
    assert [type(v) for v in values] == [int, float, bool, str, float, float, int, str, type(None)]
    assert str(values[5]) == "-0.0"


@pytest.mark.parametrize("dims", [{"gpus": 2}, {"hosts": 2, "gpus": 1}], ids=["direct", "relayed"])
def test_only_an_agent_that_relays_listens_for_its_ranks_links(start_mesh, dims):
    mesh = start_mesh(**dims)
    relays = "hosts" in dims
    for info in mesh._controller.agent_info.values():
        listening = {c.laddr for c in psutil.Process(info["pid"]).net_connections(kind="unix") if c.laddr}
        hello = info["endpoints"][0].removeprefix("ipc://")
        assert hello in listening
        assert bool(listening - {hello}) == relays, listening


def test_relayed_values_none_arrays_and_failures_arrive_as_sent(start_mesh):
    mesh = start_mesh(hosts=2, gpus=2)
    out = mesh.run("import numpy as np\n[rank * 10, None, np.arange(3) * rank, {'r': rank}][rank]")
    values = out.values()
    assert values[0] == 0 and values[1] is None and values[3] == {"r": 3}
    np.testing.assert_array_equal(values[2], [0, 2, 4])
    with pytest.raises(vr.MeshError) as err:
        mesh.run("1 / 0 if rank == 1 else rank", fail_fast=False)
    assert err.value.ranks == [1] and "ZeroDivisionError" in str(err.value)
    assert err.value.partial == {0: 0, 2: 2, 3: 3}


def _call(ranks: list[int]) -> Call:
    return Call(1, "test", Shape({"gpus": len(ranks)}, ranks), Future(1, lambda: None), True, None, None)


def test_packed_answers_unpickle_into_results_and_a_bad_one_fails_only_its_rank():
    call = _call([0, 1, 2])
    blob = pickle.dumps("zero") + b"\x80\x05junk" + pickle.dumps(2)
    lens = [len(pickle.dumps("zero")), 6, len(pickle.dumps(2))]
    assert call.record_packed([0, 1, 2], lens, blob) == ([0, 2], [1])
    assert call.results == {0: "zero", 2: 2}
    assert "could not be unpickled" in call.failures[1].summary


def test_repeated_or_garbled_packed_answers_change_nothing_already_recorded():
    call = _call([0, 1])
    assert call.record_packed([0], None, b"") == ([0], [])
    assert call.record_packed([0, 1], [2, 1], b"xy") == ([], [1])  # lengths disagree with the blob
    assert call.results == {0: None} and "garbled" in call.failures[1].summary
    assert call.record_packed([0, 1], None, b"") == ([], [])  # both already answered
    assert call.complete()
