"""Actor futures in a real Viceroy kernel: ``.get()`` in plain cells and ``await`` in async
cells, with every warning shown, print none; an endpoint's print shows in the calling cell."""

from __future__ import annotations

import sys

import pytest

from tests.kernel.kernel_harness import Kernel
from viceroy.kernel.kernelspec import write_kernel_spec

pytestmark = pytest.mark.timeout(240)

COUNTER = '''
import viceroy as vr

class Counter(vr.Actor):
    def __init__(self, start):
        self.n = start

    @vr.endpoint
    def incr(self, by: int = 1) -> int:
        self.n += by
        print("now", self.n)
        return self.n
'''


def test_get_and_await_on_actor_futures_in_cells_without_warnings(tmp_path, monkeypatch):
    write_kernel_spec(tmp_path / "kernels" / "viceroy", executable=sys.executable)
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path))
    k = Kernel()
    try:
        k.ok("%mesh up gpus=2 --preload none", timeout=120)
        k.ok("import warnings\nwarnings.simplefilter('always')")
        k.ok(COUNTER)
        cells = [
            k.ok("counters = mesh.spawn(Counter, 0)\ncounters.incr.call(by=2).get()"),
            k.ok("await counters.incr.call()"),
            k.ok("await counters.slice(gpus=1).incr.call_one()"),
            k.ok("counters.slice(gpus=0).incr.call_one().get()"),
        ]
        results = [ex.of_type("execute_result")[0]["data"]["text/plain"] for ex in cells]
        assert "2" in results[0] and "3" in results[1]
        assert results[2] == "4" and results[3] == "4"  # rank 1, then rank 0
        assert all(ex.stream("stderr") == "" for ex in cells), [ex.stream("stderr") for ex in cells]
        assert "now 2" in cells[0].stream() and "now 4" in cells[3].stream()
        k.ok("counters.stop()\n%mesh down", timeout=60)
    finally:
        k.close()
