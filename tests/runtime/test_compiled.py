"""A code string new to the mesh travels with the controller's compiled code, and the ranks
run it without compiling; a rank whose Python differs, or that gets a text again, or that
missed its first send, compiles it itself. Real ranks; each counts its own compiles."""

from __future__ import annotations

import pytest

import viceroy as vr
from viceroy.runtime import compiled

# On every rank: count the texts it compiles itself (not those it was sent compiled).
COUNT = ("import viceroy.runtime.execution as _ex\n"
         "_compiles = []\n"
         "_real = _ex._compile_text\n"
         "def _counting(source):\n"
         "    _compiles.append(source)\n"
         "    return _real(source)\n"
         "_ex._compile_text = _counting\n")
COMPILED = "len(_compiles)"
CELL = "def f(x):\n    return x * 2\ny = [f(i) for i in range(3)]\nsum(y) + rank"


@pytest.fixture(params=[{"gpus": 3}, {"hosts": 3, "gpus": 1}], ids=["direct", "relayed"])
def mesh(start_mesh, request) -> vr.Mesh:
    m = start_mesh(**request.param)
    m.run(COUNT)
    assert m.run(COMPILED).values() == [0, 0, 0]  # this text too: the ranks keep it from here
    return m


def test_a_new_text_runs_on_every_rank_without_the_rank_compiling_it(mesh):
    assert mesh.run(CELL).values() == [6, 7, 8]
    assert mesh.run(COMPILED).values() == [0, 0, 0]


def test_a_rank_whose_python_differs_compiles_the_text_itself(mesh):
    mesh.select([1]).run("import viceroy.runtime.compiled as _c\n_c.TAG = 'another python'")
    assert mesh.run(CELL).values() == [6, 7, 8]
    assert mesh.run(COMPILED).values() == [0, 1, 0]


def test_a_rank_that_missed_a_texts_first_send_compiles_it_when_it_comes_again(mesh):
    assert mesh.select([0]).run(CELL).values() == [6]
    assert mesh.run(CELL).values() == [6, 7, 8]  # sent without its code: rank 0 kept its own
    assert mesh.run(COMPILED).values() == [0, 1, 1]


def test_the_controller_sends_a_texts_code_only_the_first_time():
    shipments = compiled.Shipments()
    first = shipments.code_for(CELL)
    assert first is not None and shipments.code_for(CELL) is None
    assert shipments.code_for(CELL + "\n") is not None  # another text


def test_a_failure_in_shipped_code_shows_the_users_line_and_cell_name(mesh):
    with pytest.raises(vr.MeshError) as info:
        mesh.run("x = 1\ny = x / (rank - 1)\n")
    assert mesh.run(COMPILED).values() == [0, 0, 0]
    failure = info.value.failures[1]
    assert failure.summary == "ZeroDivisionError: division by zero", failure
    assert "line 2" in failure.traceback and "y = x / (rank - 1)" in failure.traceback, failure.traceback
    assert "<mesh-cell-" in failure.traceback, failure.traceback
