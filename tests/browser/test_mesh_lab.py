"""The mesh view in a real JupyterLab: the anywidget in the notebook, the side panel, the status
bar, clicks that fetch a traceback; and the extension activating in Notebook 7."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from tests.browser.conftest import LabServer, copy_if, kernel_idle_js, run_cell, write_notebook

pytestmark = [pytest.mark.browser, pytest.mark.timeout(240)]

# --no-fail-fast: the other ranks finish (done) however slow the machine; with fail-fast one
# still running when rank 2 raises would rightly end "interrupted".
FAIL_ON_2 = "%%mesh --no-fail-fast\nif rank == 2:\n    1/0\nprint('rank', rank, 'fine')"


def test_mesh_view_in_lab(lab: LabServer, page: Any, artifacts: Path) -> None:
    from playwright.sync_api import expect

    write_notebook(lab.root / "mesh.ipynb", ["%mesh up gpus=4", FAIL_ON_2])
    page.goto(lab.page_url("/lab/tree/mesh.ipynb"), wait_until="domcontentloaded")
    page.wait_for_function(kernel_idle_js(), timeout=60_000)

    # %mesh up: the widget in the output shows 4 tiles
    run_cell(page, 0)
    widget = page.locator(".jp-OutputArea .viceroy-mesh").first
    tiles = widget.locator(".viceroy-tile")
    expect(tiles).to_have_count(4, timeout=60_000)
    expect(widget.locator(".viceroy-tile[data-state='idle']")).to_have_count(4, timeout=30_000)

    # a cell that fails on rank 2 only
    run_cell(page, 1)
    expect(widget.locator(".viceroy-tile[data-rank='2'][data-state='error']")).to_be_visible(
        timeout=60_000
    )
    for r in (0, 1, 3):
        expect(widget.locator(f".viceroy-tile[data-rank='{r}']")).to_have_attribute(
            "data-state", "done", timeout=30_000
        )
    expect(widget.locator(".viceroy-tile[data-rank='2'] .viceroy-state")).to_have_text("error")
    expect(widget.locator(".viceroy-summary")).to_have_text(re.compile(r"1 failed"))

    # the side panel and the status bar agree
    page.evaluate("window.jupyterapp.commands.execute('viceroy:open-mesh-panel')")
    panel = page.locator("#viceroy-mesh-panel")
    expect(panel).to_be_visible()
    expect(panel.locator(".viceroy-tile")).to_have_count(4)
    expect(panel.locator(".viceroy-tile[data-rank='2']")).to_have_attribute("data-state", "error")
    expect(panel.locator(".viceroy-tile[data-state='done']")).to_have_count(3)
    expect(panel.locator(".viceroy-summary")).to_have_text("mesh 4/4 · 1 failed")
    status = page.locator(".viceroy-statusbar")
    expect(status).to_have_text("mesh 4/4 · 1 failed")

    # click tile 2 (in the widget, then in the panel): its traceback
    widget.locator(".viceroy-tile[data-rank='2']").click()
    detail = widget.locator(".viceroy-detail")
    expect(detail.locator(".viceroy-detail-title")).to_have_text("rank 2 · traceback")
    expect(detail.locator(".viceroy-detail-text")).to_contain_text("ZeroDivisionError", timeout=30_000)
    panel.locator(".viceroy-tile[data-rank='2']").click()
    expect(panel.locator(".viceroy-detail-text")).to_contain_text("ZeroDivisionError", timeout=30_000)

    shot = artifacts / "mesh-view-lab.png"
    page.screenshot(path=str(shot))
    widget.screenshot(path=str(artifacts / "mesh-view-widget.png"))
    panel.screenshot(path=str(artifacts / "mesh-view-panel.png"))
    copy_if(shot, _readme_target())
    assert not [e for e in page.console_errors if "viceroy" in e.lower()], page.console_errors


def test_extension_activates_in_notebook7(lab: LabServer, page: Any, artifacts: Path) -> None:
    from playwright.sync_api import expect

    write_notebook(lab.root / "nb7.ipynb", ["%mesh up gpus=2"])
    page.goto(lab.page_url("/notebooks/nb7.ipynb"), wait_until="domcontentloaded")
    page.wait_for_function(
        "() => document.body.dataset.viceroyExtension === 'activated'", timeout=60_000
    )
    assert page.evaluate("window.jupyterapp.commands.hasCommand('viceroy:interrupt-mesh')")
    page.wait_for_function(kernel_idle_js(), timeout=60_000)
    # the panel follows the notebook's kernel here too
    page.evaluate("window.jupyterapp.commands.execute('viceroy:open-mesh-panel')")
    run_cell(page, 0)
    panel = page.locator("#viceroy-mesh-panel")
    expect(panel.locator(".viceroy-tile")).to_have_count(2, timeout=60_000)
    expect(panel.locator(".viceroy-summary")).to_have_text("mesh 2/2 · idle", timeout=30_000)
    expect(page.locator(".jp-OutputArea .viceroy-tile")).to_have_count(2)
    page.screenshot(path=str(artifacts / "mesh-view-notebook7.png"))


def _readme_target() -> str | None:
    import os

    return os.environ.get("VICEROY_README_SCREENSHOT")


def set_cell(page: Any, index: int, source: str) -> None:
    page.evaluate(
        """([i, src]) => { const nb = window.jupyterapp.shell.currentWidget.content;
                           nb.widgets[i].model.sharedModel.setSource(src); }""",
        [index, source],
    )


def test_panel_follows_a_kernel_restart(lab: LabServer, page: Any, artifacts: Path) -> None:
    """The side panel drops the mesh when the kernel restarts and reopens its comm after."""
    from playwright.sync_api import expect

    write_notebook(lab.root / "restart.ipynb", ["%mesh up gpus=2"])
    page.goto(lab.page_url("/lab/tree/restart.ipynb"), wait_until="domcontentloaded")
    page.wait_for_function(kernel_idle_js(), timeout=60_000)
    page.evaluate("window.jupyterapp.commands.execute('viceroy:open-mesh-panel')")
    panel = page.locator("#viceroy-mesh-panel")
    status = page.locator(".viceroy-statusbar")
    expect(panel.locator(".viceroy-summary")).to_have_text("no mesh", timeout=30_000)
    run_cell(page, 0)
    expect(panel.locator(".viceroy-tile")).to_have_count(2, timeout=60_000)
    expect(status).to_have_text("mesh 2/2 · idle", timeout=30_000)

    page.evaluate(
        "window.jupyterapp.shell.currentWidget.sessionContext.session.kernel.restart()"
    )
    expect(panel.locator(".viceroy-tile")).to_have_count(0, timeout=30_000)
    page.wait_for_function(kernel_idle_js(), timeout=60_000)
    set_cell(page, 0, "%mesh up gpus=3")
    run_cell(page, 0)
    expect(panel.locator(".viceroy-tile")).to_have_count(3, timeout=60_000)
    expect(panel.locator(".viceroy-summary")).to_have_text("mesh 3/3 · idle", timeout=30_000)
    expect(status).to_have_text("mesh 3/3 · idle")
    panel.screenshot(path=str(artifacts / "mesh-view-after-restart.png"))


def open_commands_notebook(lab: LabServer, page: Any, name: str, cells: list[str]) -> Any:
    write_notebook(lab.root / name, cells)
    page.goto(lab.page_url(f"/lab/tree/{name}"), wait_until="domcontentloaded")
    page.wait_for_function(kernel_idle_js(), timeout=60_000)
    command(page, "viceroy:open-mesh-panel")
    return page.locator("#viceroy-mesh-panel")


def command(page: Any, name: str, args: dict[str, Any] | None = None) -> None:
    """Run a command as the palette does (without waiting for what it starts)."""
    page.evaluate(
        "([id, args]) => { void window.jupyterapp.commands.execute(id, args); }", [name, args or {}]
    )


def test_palette_commands(lab: LabServer, page: Any, artifacts: Path) -> None:
    """Restart failed ranks and show a rank's log: the Viceroy commands, as the palette runs
    them, acting through the side panel's comm."""
    from playwright.sync_api import expect

    cells = [
        "%mesh up gpus=2",
        "%%mesh\nprint('hello from', rank, flush=True)",
        "%%mesh --ranks 1\nimport os\nos._exit(3)",
    ]
    panel = open_commands_notebook(lab, page, "commands.ipynb", cells)
    run_cell(page, 0)
    expect(panel.locator(".viceroy-tile[data-state='idle']")).to_have_count(2, timeout=60_000)
    run_cell(page, 1)
    expect(panel.locator(".viceroy-tile[data-state='done']")).to_have_count(2, timeout=30_000)
    page.wait_for_function(kernel_idle_js(), timeout=30_000)

    run_cell(page, 2)
    expect(panel.locator(".viceroy-tile[data-rank='1']")).to_have_attribute(
        "data-state", "dead", timeout=30_000
    )
    expect(panel.locator(".viceroy-summary")).to_have_text("mesh 1/2 · 1 failed")
    expect(page.locator(".viceroy-statusbar")).to_have_text("mesh 1/2 · 1 failed")
    page.wait_for_function(kernel_idle_js(), timeout=30_000)
    command(page, "viceroy:restart-failed")
    expect(panel.locator(".viceroy-notice")).to_have_text("restarted ranks 1", timeout=60_000)
    expect(panel.locator(".viceroy-tile[data-rank='1']")).to_have_attribute(
        "data-state", "idle", timeout=30_000
    )
    expect(panel.locator(".viceroy-summary")).to_have_text("mesh 2/2 · idle")

    command(page, "viceroy:show-rank-log", {"rank": 0})
    expect(panel.locator(".viceroy-detail-title")).to_have_text("rank 0 · log")
    expect(panel.locator(".viceroy-detail-text")).to_contain_text("hello from 0", timeout=30_000)
    panel.screenshot(path=str(artifacts / "mesh-view-commands.png"))


def test_interrupt_command_while_a_cell_runs(lab: LabServer, page: Any) -> None:
    """The palette's "Interrupt the Mesh" stops a running %%mesh cell."""
    from playwright.sync_api import expect

    cells = ["%mesh up gpus=2", "%%mesh\nimport time\nprint('sleeping on', rank, flush=True)\ntime.sleep(60)"]
    panel = open_commands_notebook(lab, page, "interrupt.ipynb", cells)
    run_cell(page, 0)
    expect(panel.locator(".viceroy-tile[data-state='idle']")).to_have_count(2, timeout=60_000)
    run_cell(page, 1)
    expect(panel.locator(".viceroy-tile[data-state='running']")).to_have_count(2, timeout=30_000)
    expect(page.locator(".viceroy-statusbar")).to_have_text("mesh 2/2 · running")
    command(page, "viceroy:interrupt-mesh")
    try:
        expect(panel.locator(".viceroy-tile[data-state='interrupted']")).to_have_count(
            2, timeout=20_000
        )
    finally:  # end the cell either way, so that the test leaves no busy kernel behind
        page.evaluate(
            "window.jupyterapp.shell.currentWidget.sessionContext.session.kernel.interrupt()"
        )
