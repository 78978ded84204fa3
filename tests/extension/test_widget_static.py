"""The static fallback (nbconvert, GitHub) of a wide mesh stays about as wide as a page."""

from __future__ import annotations

import re

from viceroy.extension.session import MeshSession
from viceroy.extension.widget import render_html


def page_for(dims: dict[str, int]) -> str:
    n = 1
    for size in dims.values():
        n *= size
    s = MeshSession(None)
    s.state.reset(dims, dict.fromkeys(range(n), "idle"))
    return render_html(s.state.snapshot())


def columns(page: str) -> list[int]:
    return [int(c) for c in re.findall(r"grid-template-columns:repeat\((\d+),auto\)", page)]


def test_one_dim_of_64_ranks_wraps_at_16_columns():
    page = page_for({"gpus": 64})
    assert columns(page) == [16] and page.count('class="viceroy-tile') == 64


def test_a_wide_last_dim_gives_one_wrapped_grid_per_row():
    page = page_for({"hosts": 2, "gpus": 64})
    assert columns(page) == [16, 16] and "hosts=0" in page and "hosts=1" in page
    assert columns(page_for({"hosts": 16, "gpus": 8})) == [8], "rows × columns while they fit"
