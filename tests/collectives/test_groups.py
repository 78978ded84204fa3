"""Which ranks a collective over some dims involves (pure: no processes)."""

from __future__ import annotations

import math
from collections.abc import Iterator

import pytest

from viceroy.runtime import context as context_mod
from viceroy.runtime.collectives import groups
from viceroy.runtime.collectives.sockets import ports_in


@pytest.fixture
def on_rank() -> Iterator[object]:
    def place(rank: int, dims: dict[str, int]) -> None:
        coords, rest = {}, rank
        for name, size in reversed(dims.items()):
            coords[name] = rest % size
            rest //= size
        context_mod._set_context(context_mod.Context(
            rank=rank, coords=dict(reversed(coords.items())), dims=dims, local_rank=rank,
            world_size=math.prod(dims.values()), host=0,
            namespace={}, _publish=lambda k, d: None))
        groups._cache.clear()

    yield place
    context_mod._set_context(None)  # type: ignore[arg-type]
    groups._cache.clear()


def test_no_dims_means_the_whole_mesh(on_rank):
    on_rank(5, {"hosts": 2, "gpus": 4})
    g = groups.group_for(None)
    assert g.ranks == tuple(range(8))
    assert "whole mesh" in g.label


def test_one_dim_groups_the_ranks_sharing_the_other_coordinates(on_rank):
    on_rank(5, {"hosts": 2, "gpus": 4})  # hosts=1, gpus=1
    assert groups.group_for("gpus").ranks == (4, 5, 6, 7)
    assert groups.group_for("hosts").ranks == (1, 5)
    assert groups.group_for("gpus").index(5) == 1
    assert "hosts=1" in groups.group_for("gpus").label


def test_several_dims_keep_the_mesh_order(on_rank):
    on_rank(7, {"a": 2, "b": 2, "c": 2})  # a=1, b=1, c=1
    assert groups.group_for(["c", "a"]).ranks == (2, 3, 6, 7)
    assert groups.group_for(("a", "b", "c")).ranks == tuple(range(8))


def test_unknown_or_repeated_dims_say_which_dims_exist(on_rank):
    on_rank(0, {"dp": 2, "tp": 2})
    with pytest.raises(ValueError, match=r"its dims are \['dp', 'tp'\]"):
        groups.group_for("gpus")
    with pytest.raises(ValueError, match="distinct"):
        groups.group_for(["dp", "dp"])
    # A near miss was not pointed out
    with pytest.raises(ValueError, match=r"^dims \['tps'\]: this mesh has no dim 'tps' \(did you mean 'tp'\?\); "
                                         r"its dims are \['dp', 'tp'\]$"):
        groups.group_for("tps")


def test_pair_groups_put_the_lower_rank_first():
    assert groups.pair_group(3, 1).ranks == (1, 3)


def test_gloo_error_ports_are_read_both_ways():
    # gloo prints ports in network byte order: 38177 shows up as 8597.
    assert 38177 in ports_in("Connection closed by peer [127.0.0.1]:8597. This is ...")
