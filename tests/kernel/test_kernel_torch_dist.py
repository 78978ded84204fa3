"""`%mesh up --torch-dist` and `--backend`: stock torch.distributed code in %%mesh cells."""

from __future__ import annotations

import pytest
from kernel_harness import Kernel

pytestmark = pytest.mark.timeout(180)


def test_torch_dist_initialises_the_default_group_on_every_rank(kernel: Kernel):
    kernel.ok("%mesh up gpus=2 --torch-dist --backend gloo")
    ex = kernel.ok(
        "%%mesh\nimport os, torch, torch.distributed as dist\n"
        "t = torch.ones(2) * (rank + 1)\ndist.all_reduce(t)\n"
        "print(dist.get_world_size(), dist.is_initialized(), os.environ['VICEROY_BACKEND'], t.tolist())"
    )
    assert ex.stream() == "[0-1] 2 True gloo [3.0, 3.0]\n"
    kernel.ok("%mesh down")
