"""A JupyterLab server and a headless Chromium for the browser tests.

The server runs on a free localhost port with a token, in its own process group, with every
Jupyter directory in a temp dir (kernelspecs still come from the venv, where `pip install -e`
put the `viceroy` one). The labextension is served from the repo's build output
(viceroy/labextension, `make frontend`), ahead of any installed copy, so the tests see the
current sources. Chromium is Debian's /usr/bin/chromium; Playwright never downloads one.

Screenshots go to $VICEROY_ARTIFACTS if set, else to a pytest temp dir (printed at the end).
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests.conftest import leaks_fail

REPO = Path(__file__).resolve().parents[2]
LABEXT_BUILD = REPO / "viceroy" / "labextension"
LABEXT_NAME = "viceroy-labextension"
CHROMIUM = os.environ.get("VICEROY_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-dev-shm-usage",
    "--disable-gpu",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
SERVER_START_TIMEOUT = 90.0


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Skip the browser tests where there is no Chromium or no Playwright (CI has both)."""
    missing = None
    if not Path(CHROMIUM).exists():
        missing = f"no Chromium at {CHROMIUM} (apt-get install chromium; make test does, as root)"
    else:
        try:
            import playwright  # noqa: F401
        except ImportError:
            missing = "playwright is not installed (pip install -e '.[test]')"
    if missing is None:
        return
    for item in items:
        if "browser" in item.keywords:
            item.add_marker(pytest.mark.skip(reason=missing))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class LabServer:
    url: str
    token: str
    root: Path
    proc: subprocess.Popen[bytes]
    log: Path
    sessions: list[str] = field(default_factory=list)

    def api(self, method: str, path: str, body: Any = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(
            f"{self.url}{path}",
            data=data,
            method=method,
            headers={"Authorization": f"token {self.token}", "Content-Type": "application/json"},
        )
        with urllib.request.urlopen(req, timeout=30) as resp:
            raw = resp.read()
        return json.loads(raw) if raw else None

    def page_url(self, path: str) -> str:
        """With a fresh JupyterLab workspace (``reset``): the server keeps the last one, and a
        notebook an earlier test left open would otherwise come back and start its kernel
        beside this test's."""
        if path.startswith("/lab") and "reset" not in path:
            path += ("&" if "?" in path else "?") + "reset"
        sep = "&" if "?" in path else "?"
        return f"{self.url}{path}{sep}token={self.token}"

    def kernel_pids(self) -> set[int]:
        """Processes under the server: kernels and everything they started."""
        try:
            return {p.pid for p in psutil.Process(self.proc.pid).children(recursive=True)}
        except psutil.NoSuchProcess:
            return set()

    def shutdown_kernels(self, timeout: float = 30.0) -> None:
        """Stop every session and kernel (through the server), and wait for their processes."""
        for s in self.api("GET", "/api/sessions"):
            self.api("DELETE", f"/api/sessions/{s['id']}")
        for k in self.api("GET", "/api/kernels"):
            self.api("DELETE", f"/api/kernels/{k['id']}")
        deadline = time.monotonic() + timeout
        while self.kernel_pids() and time.monotonic() < deadline:
            time.sleep(0.1)
        left = self.kernel_pids()
        assert not left, f"kernel processes outlived their shutdown: {sorted(left)}"


def write_settings(settings: Path) -> None:
    """No news or update pop-ups in the screenshots (the values Galata sets)."""
    target = settings / "@jupyterlab" / "apputils-extension" / "notification.jupyterlab-settings"
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(json.dumps({"fetchNews": "false", "checkForUpdates": False}))


@pytest.fixture(scope="session")
def artifacts(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = Path(os.environ["VICEROY_ARTIFACTS"]) if "VICEROY_ARTIFACTS" in os.environ else (
        tmp_path_factory.mktemp("browser-artifacts")
    )
    path.mkdir(parents=True, exist_ok=True)
    return path


@pytest.fixture(scope="package")
def lab_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LabServer]:
    if not (LABEXT_BUILD / "package.json").is_file():
        pytest.fail("the labextension is not built: run `make frontend`")
    base = tmp_path_factory.mktemp("lab")
    root, extra = base / "root", base / "labextensions"
    root.mkdir()
    extra.mkdir()
    (extra / LABEXT_NAME).symlink_to(LABEXT_BUILD, target_is_directory=True)
    settings = base / "settings"
    write_settings(settings)
    config = base / "config"
    config.mkdir()
    server_config = {
        "LabServerApp": {"extra_labextensions_path": [str(extra)]},
        "LabApp": {"expose_app_in_browser": True},
        "JupyterNotebookApp": {"expose_app_in_browser": True},
    }
    (config / "jupyter_server_config.json").write_text(json.dumps(server_config))
    env = dict(os.environ)
    env.update(
        JUPYTER_CONFIG_DIR=str(config),
        JUPYTER_DATA_DIR=str(base / "data"),
        JUPYTER_RUNTIME_DIR=str(base / "runtime"),
        JUPYTERLAB_SETTINGS_DIR=str(settings),
        JUPYTERLAB_WORKSPACES_DIR=str(base / "workspaces"),
        PYTHONUNBUFFERED="1",
    )
    env.pop("JUPYTER_PATH", None)
    port, token = free_port(), secrets.token_hex(16)
    log = base / "server.log"
    cmd = [
        sys.executable, "-m", "jupyter", "lab", "--no-browser", "--allow-root",
        "--ip=127.0.0.1", f"--port={port}", "--ServerApp.port_retries=0",
        f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={root}",
        "--LabApp.extension_manager=readonly", "--LabApp.news_url=",
        "--ServerApp.disable_check_xsrf=False",
    ]  # fmt: skip
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            cmd, cwd=root, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    server = LabServer(f"http://127.0.0.1:{port}", token, root, proc, log)
    try:
        deadline = time.monotonic() + SERVER_START_TIMEOUT
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"jupyter lab exited ({proc.returncode}):\n{log.read_text()}")
            try:
                server.api("GET", "/api/status")
                break
            except (urllib.error.URLError, ConnectionError, OSError):
                if time.monotonic() > deadline:
                    raise RuntimeError(f"jupyter lab did not start:\n{log.read_text()}") from None
                time.sleep(0.2)
        yield server
    finally:
        stop_process_group(proc)


def stop_process_group(proc: subprocess.Popen[bytes], timeout: float = 20.0) -> None:
    """SIGTERM the server's process group (it shuts its kernels down), then SIGKILL what is left."""
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # anything of the group still there
    except ProcessLookupError:
        pass
    proc.wait(timeout=10)


@pytest.fixture
def lab(
    lab_server: LabServer, artifacts: Path, request: pytest.FixtureRequest
) -> Iterator[LabServer]:
    """The shared server; each test's kernels (and their meshes) are stopped after it. The
    server's log (with the kernels' stderr) is kept when the test fails."""
    start = lab_server.log.stat().st_size
    yield lab_server
    rep = getattr(request.node, "rep_call", None)
    if rep is not None and rep.failed:
        with open(lab_server.log, "rb") as f:
            f.seek(start)
            (artifacts / f"{request.node.name}-server.log").write_bytes(f.read())
    lab_server.shutdown_kernels()


# Pids of the Playwright driver and browser: Chromium starts helper processes (renderers, a
# storage service) under them whenever it likes; they are the browser's, not a test's leak.
_BROWSER_ROOTS: set[int] = set()


def _children() -> set[int]:
    return {p.pid for p in psutil.Process().children(recursive=False)}


def _descendants() -> set[int]:
    return {p.pid for p in psutil.Process().children(recursive=True)}


@pytest.fixture(scope="package")
def browser() -> Iterator[Any]:
    """Package-scoped: Playwright's sync API keeps an event loop running on the main thread
    while it is open, and later tiers call asyncio.run()."""
    from playwright.sync_api import sync_playwright

    before = _children()
    before_all = _descendants()
    spawned: set[int] = set()
    try:
        with sync_playwright() as p:
            b = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
            _BROWSER_ROOTS.update(_children() - before)
            try:
                yield b
            finally:
                b.close()
                spawned = _descendants() - before_all  # before the driver exits and they are orphaned
    finally:
        _BROWSER_ROOTS.clear()
        _reap(spawned)


def _running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _reap(pids: set[int], grace: float = 10.0) -> None:
    """Chromium helpers that outlive the browser's close: wait for them, then kill them by pid,
    so the next tier's leak check does not find them."""
    deadline = time.monotonic() + grace
    alive = set(pids)
    while alive and time.monotonic() < deadline:
        alive = {pid for pid in alive if _running(pid)}
        if alive:
            time.sleep(0.05)
    for pid in alive:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def _browser_processes() -> set[int]:
    pids = set()
    for root in _BROWSER_ROOTS:
        try:
            proc = psutil.Process(root)
            pids.add(root)
            pids.update(c.pid for c in proc.children(recursive=True))
        except psutil.NoSuchProcess:
            pass
    return pids


@pytest.fixture(autouse=True)
def no_leaked_processes() -> Iterator[None]:
    """tests/conftest.py's leak check, less the browser's own helper processes: a kernel, a
    rank or a server left behind still fails the test (and is killed, by pid)."""
    with leaks_fail(exempt=_browser_processes):
        yield


@pytest.fixture
def page(browser: Any, artifacts: Path, request: pytest.FixtureRequest) -> Iterator[Any]:
    context = browser.new_context(viewport={"width": 1400, "height": 900})
    context.set_default_timeout(30_000)
    pg = context.new_page()
    errors: list[str] = []
    pg.on("pageerror", lambda e: errors.append(str(e)))
    pg.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    pg.console_errors = errors  # type: ignore[attr-defined]
    try:
        yield pg
    finally:
        if getattr(request.node, "rep_call", None) is not None and request.node.rep_call.failed:
            pg.screenshot(path=str(artifacts / f"{request.node.name}-failure.png"))
            (artifacts / f"{request.node.name}-console.txt").write_text("\n".join(errors))
        context.close()


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    rep = yield
    setattr(item, f"rep_{rep.when}", rep)
    return rep


def write_notebook(path: Path, cells: list[str], kernel: str = "viceroy") -> None:
    nb = {
        "cells": [
            {"cell_type": "code", "execution_count": None, "id": f"c{i}", "metadata": {},
             "outputs": [], "source": src}
            for i, src in enumerate(cells)
        ],
        "metadata": {
            "kernelspec": {"name": kernel, "display_name": "Viceroy", "language": "python"},
            "language_info": {"name": "python"},
        },
        "nbformat": 4,
        "nbformat_minor": 5,
    }  # fmt: skip
    path.write_text(json.dumps(nb))


def run_cell(page: Any, index: int) -> None:
    """Select cell `index` of the current notebook and start running it (through the app's
    commands); returns at once, without waiting for the cell to finish."""
    page.evaluate(
        """(i) => { const nb = window.jupyterapp.shell.currentWidget.content;
                    nb.activeCellIndex = i;
                    void window.jupyterapp.commands.execute('notebook:run-cell'); }""",
        index,
    )


def kernel_idle_js(app: str = "window.jupyterapp") -> str:
    """A predicate: the current notebook's kernel is connected and idle."""
    return (
        f"() => {{ const w = {app} && {app}.shell.currentWidget;"
        " const k = w && w.sessionContext && w.sessionContext.session"
        " && w.sessionContext.session.kernel;"
        " return !!k && k.status === 'idle' && k.connectionStatus === 'connected'; }"
    )


def copy_if(path: Path, dest: str | None) -> None:
    if dest:
        Path(dest).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, dest)
