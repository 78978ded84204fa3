"""Through agents (several hosts), each host's answers come back as one message: plain values in
columns, everything else item by item, and the controller puts them together unchanged."""

from __future__ import annotations

import numpy as np
import pytest

import viceroy as vr
from viceroy.runtime.answers import aggregate


def test_an_agent_packs_plain_values_in_columns_and_sends_the_rest_item_by_item():
    items = [
        {"r": 4, "ok": True, "signed": 1},
        {"r": 5, "ok": True, "signed": 0},  # no value
        {"r": 6, "ok": False, "kind": "error", "summary": "boom", "signed": 0},
        {"r": 7, "ok": True, "signed": 1, "lens": [4]},  # a value with an array beside it
    ]
    header, signed, data = aggregate(9, items, [b"p4", b"p7"], [b"dddd"])
    assert (header["id"], header["done"], header["packed"]) == (9, [4, 5], [2, 0])
    assert [item["r"] for item in header["items"]] == [6, 7]
    assert signed == [b"p4", b"p7"] and data == [b"dddd"]  # packed pickles lead


def test_no_plain_values_means_no_columns():
    header, signed, _ = aggregate(1, [{"r": 0, "ok": False, "kind": "died", "signed": 0}], [], [])
    assert "done" not in header and signed == []


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
