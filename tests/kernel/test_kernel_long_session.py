"""A long notebook session: what the kernel keeps per cell stays bounded by a number of cells,
not by how many cells ran (see also tests/faults/test_soak.py for the runtime alone)."""

from __future__ import annotations

import json

import pytest
from kernel_harness import Kernel

from viceroy.kernel.iostream import OUTPUT_HISTORY_CELLS, OUTPUT_HISTORY_CHARS

pytestmark = pytest.mark.timeout(120)

CAPTURED = (
    "import json\nouts = get_ipython().history_manager.outputs\n"
    "print(json.dumps([len(outs), sum(len(s) for o in outs.values() for e in o "
    "for s in e.bundle.get('stream', ()))]))"
)


def _captured(kernel: Kernel) -> tuple[int, int]:
    """(cells with captured output, characters captured) in IPython's output history."""
    cells, chars = json.loads(kernel.ok(CAPTURED).stream().strip().splitlines()[-1])
    return cells, chars


def test_output_of_mesh_cells_is_not_kept_for_every_cell(mesh_kernel: Kernel):
    """IPython 9 keeps a copy of each cell's stdout/stderr in its history; every rank's lines
    of a `%%mesh` cell went there, for the whole session (30 MB per 1000 cells of 30 kB)."""
    cell = "%%mesh\nfor j in range(40): print('line', j, rank, 'x' * 40)"  # ~4 kB per cell, 2 ranks
    printed = len(mesh_kernel.ok(cell).stream())
    assert printed > 3000
    cells = OUTPUT_HISTORY_CELLS + 60
    for _ in range(cells):
        mesh_kernel.execute(cell)
    kept_cells, kept_chars = _captured(mesh_kernel)
    assert kept_cells <= OUTPUT_HISTORY_CELLS + 1, kept_cells
    assert kept_chars <= (OUTPUT_HISTORY_CELLS + 1) * printed * 1.1, (kept_chars, printed)

    # One cell printing far more than the cap keeps only the cap's worth.
    big = mesh_kernel.ok("%%mesh\nfor j in range(4000): print('line', j, rank, 'x' * 60)")
    assert len(big.stream()) > 4 * OUTPUT_HISTORY_CHARS  # the notebook still shows it all
    _, after = _captured(mesh_kernel)
    assert after - kept_chars < OUTPUT_HISTORY_CHARS + 1000, after - kept_chars


def test_tensors_of_failed_cells_are_freed_on_the_ranks_without_waiting_for_a_full_gc(kernel: Kernel):
    """A failed cell's frames stayed in a reference cycle (IPython's run_code frame holds the
    result, the result the exception, its traceback that frame) until a full collection: every
    MeshTensor they held, and its memory on every rank, lived on (here 21 tensors after 20
    failed cells). Only the last failure's may stay (``%debug``)."""
    kernel.ok("%mesh up gpus=2", timeout=120)
    kernel.ok("import gc, torch\ngc.disable()")  # what a long run between full collections sees
    raises = "def step():\n    t = torch.ones(1000) * 2\n    raise ValueError(t.shape)\nwith mesh.activate():\n    step()"
    # A shape error found on the controller: IPython's traceback formatting (stack_data)
    # leaves cycles of its own holding the frames it showed.
    bad_shape = "def step():\n    t = torch.ones(1000) * 2\n    return t @ torch.ones(3, 3)\nwith mesh.activate():\n    step()"
    for _ in range(10):
        assert kernel.execute(raises).status == "error"
        assert kernel.execute(bad_shape).status == "error"
    live = kernel.ok(
        "engine = next(iter(mesh._controller.engines.values()))\nprint(len(engine._refs))\ngc.enable()"
    ).stream()
    assert int(live.strip()) <= 4, live  # before: one per failed cell


def test_tracebacks_of_failed_cells_are_not_kept_for_every_cell(mesh_kernel: Kernel):
    """IPython 9 also keeps each failed cell's formatted traceback (2 MB per 1000 cells)."""
    for _ in range(OUTPUT_HISTORY_CELLS + 30):
        assert mesh_kernel.execute("%%mesh\n1/0").status == "error"
    kept = mesh_kernel.ok("print(len(get_ipython().history_manager.exceptions))").stream()
    assert int(kept.strip()) <= OUTPUT_HISTORY_CELLS, kept
