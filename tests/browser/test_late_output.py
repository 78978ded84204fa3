"""Where a rank's late output lands in a real JupyterLab: what a thread a `%%mesh` cell started
prints after the cell ended is shown under that cell, even once other cells have run."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.browser.conftest import LabServer, kernel_idle_js, run_cell, write_notebook

pytestmark = [pytest.mark.browser, pytest.mark.timeout(240)]


def test_a_ranks_thread_printing_after_its_cell_ended_shows_under_that_cell(lab: LabServer, page: Any,
                                                                            tmp_path: Path) -> None:
    from playwright.sync_api import expect

    release = tmp_path / "release"
    later = (
        "%%mesh\nimport pathlib, threading, time\n"
        "def later():\n"
        f"    while not pathlib.Path(r'{release}').exists():\n"
        "        time.sleep(0.01)\n"
        "    print('late line from', rank, flush=True)\n"
        "threading.Thread(target=later, daemon=True).start()\n"
        "print('started', rank)"
    )
    write_notebook(lab.root / "late.ipynb", ["%mesh up gpus=2 --preload none", later, "1 + 1"])
    page.goto(lab.page_url("/lab/tree/late.ipynb"), wait_until="domcontentloaded")
    page.wait_for_function(kernel_idle_js(), timeout=60_000)
    cells = page.locator(".jp-Notebook .jp-CodeCell")
    for i, shown in ((0, "mesh up"), (1, "started"), (2, "2")):
        run_cell(page, i)
        expect(cells.nth(i).locator(".jp-OutputArea")).to_contain_text(shown, timeout=60_000)
        page.wait_for_function(kernel_idle_js(), timeout=60_000)
    release.touch()
    expect(cells.nth(1).locator(".jp-OutputArea")).to_contain_text("late line from 0", timeout=30_000)
    expect(cells.nth(1).locator(".jp-OutputArea")).to_contain_text("late line from 1", timeout=30_000)
    expect(cells.nth(2).locator(".jp-OutputArea")).not_to_contain_text("late line")
