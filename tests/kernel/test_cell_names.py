"""Each cell is compiled under the file name ipykernel gives it (a hash of its text), which the
debugger computes alike to find the cell: ViceroyKernel hashes faster and remembers recent cells,
and must give the same names."""

from __future__ import annotations

import os
import random

import pytest
from ipykernel import compiler
from kernel_harness import Kernel

from viceroy.kernel.cell_passes import murmur2_x86

pytestmark = pytest.mark.timeout(120)
_REFERENCE = compiler.murmur2_x86  # this process runs no ViceroyKernel: ipykernel's own


def test_the_hash_is_ipykernels():
    assert _REFERENCE is not murmur2_x86
    rng = random.Random(7)
    for n in range(0, 260):  # every length of tail, ASCII and beyond
        text = "".join(
            chr(rng.choice([rng.randint(32, 126), rng.randint(0x80, 0x2FFF), rng.randint(0x10000, 0x10FFFF)]))
            for _ in range(n)
        )
        for seed in (compiler.get_tmp_hash_seed(), 0, 0xFFFFFFFF):
            assert murmur2_x86(text, seed) == _REFERENCE(text, seed), (n, seed)


def test_a_cell_is_compiled_under_the_name_the_debugger_gives_it(kernel: Kernel):
    code = "import os, tempfile\ndef where_4410():\n    pass\nprint(where_4410.__code__.co_filename, os.getpid(), tempfile.gettempdir(), sep='\\n')\n"
    for _ in range(2):  # named the same again (remembered)
        filename, pid, tmp = kernel.ok(code).stream().strip().split("\n")
        assert filename == os.path.join(tmp, f"ipykernel_{pid}", f"{_REFERENCE(code, compiler.get_tmp_hash_seed())}.py")
    ours = kernel.ok("import ipykernel.compiler\nprint(ipykernel.compiler.murmur2_x86.__module__)").stream().strip()
    assert ours == "viceroy.kernel.cell_passes"
