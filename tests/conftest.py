"""Shared test rules: every test leaves no process, and no file of ours in the temp directory,
behind. The temp directory is this session's own (see `session_temp_dir`)."""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import signal
import tempfile
import time
from collections.abc import Callable, Iterator
from typing import Any

import psutil
import pytest

import viceroy as vr

# Tests press Ctrl-C by sending this process SIGINT. A shell without job control starts what it
# runs in the background with SIGINT ignored, and Python then installs no KeyboardInterrupt
# handler: give it back (children exec'd from here get the default again too).
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


# The temp directory every test run on this machine shares (/tmp), as it was before this run took
# one of its own (`session_temp_dir`).
SHARED_TEMP = tempfile.gettempdir()


def wait_until(cond: Callable[[], object], timeout: float, what: str, interval: float = 0.02) -> object:
    """Poll `cond` until it returns something truthy or fail after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = cond()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(interval)


def wait_running(mesh: vr.Mesh, text: str = "<mesh-cell", timeout: float = 10) -> None:
    """Wait until every rank of `mesh` is inside user code whose stack shows `text` (a line of
    the call, a function name): the call has really started, not just been sent."""
    wait_until(lambda: all(text in s for s in mesh.stacks(timeout=1).values()), timeout,
               f"every rank to be running {text!r}")


def fails_within(fut: vr.Future, act: Callable[[], object], within: float, timeout: float = 30) -> vr.MeshError:
    """Do `act` (a kill, a cut link, an interrupt) while `fut`'s call runs: the call fails
    within `within` seconds of it. Its error."""
    t0 = time.monotonic()
    act()
    with pytest.raises(vr.MeshError) as info:
        fut.get(timeout=timeout)
    took = time.monotonic() - t0
    assert took < within, f"the call failed {took:.1f} s after, not within {within} s"
    return info.value


def live_pids(pids: list[int]) -> list[int]:
    alive = []
    for pid in pids:
        try:
            p = psutil.Process(pid)
            if p.status() != psutil.STATUS_ZOMBIE:
                alive.append(pid)
        except psutil.NoSuchProcess:
            pass
    return alive


def remove_files(paths: list[str]) -> None:
    """Remove what a controller a test killed outright left in /tmp (its socket directory, its
    agents' logs): cleaning up after the processes it killed is the test's job."""
    for path in paths:
        if os.path.isdir(path):
            shutil.rmtree(path, ignore_errors=True)
        else:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)


def viceroy_temp_files() -> set[str]:
    """Socket directories and logs of ours (``viceroy-*``) in the temp directory: this session's
    own, so another session's meshes (and the netns tests' lock, kept in /tmp for all of them)
    are not in it."""
    return set(glob.glob(os.path.join(tempfile.gettempdir(), "viceroy-*")))


@pytest.fixture(scope="session", autouse=True)
def session_temp_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A temp directory of this session's own, for it and for every process it starts (TMPDIR;
    the test sshd sets it for its logins too): the sockets and logs of its meshes go there, and
    the leak checks look there only. Test runs side by side on one machine (two worktrees, a
    loop beside a run) shared /tmp: each took the files of the other's live meshes for its own
    test's leak, failed that test, and removed them, socket directories included, under a mesh
    that was still running or starting."""
    path = str(tmp_path_factory.mktemp("tmp"))
    saved_env, saved_dir = os.environ.get("TMPDIR"), tempfile.tempdir
    os.environ["TMPDIR"] = tempfile.tempdir = path
    try:
        yield path
    finally:
        tempfile.tempdir = saved_dir
        if saved_env is None:
            os.environ.pop("TMPDIR", None)
        else:
            os.environ["TMPDIR"] = saved_env


@contextlib.contextmanager
def leaks_fail(exempt: Callable[[], set[int]] = set) -> Iterator[None]:
    """Fail (after killing them) if descendant processes started inside the block outlive it by
    5 s; pids `exempt()` names at the end are left alone. Then fail (after removing them) if
    files of ours made in the temp directory inside the block outlive those processes by 5 s."""
    me = psutil.Process()
    before = {p.pid for p in me.children(recursive=True)}
    files_before = viceroy_temp_files()
    yield
    _no_leaked_processes(me, before, exempt)
    _no_leaked_files(files_before)


def _left_after(leftovers: Callable[[], Any], timeout: float = 5.0) -> Any:
    """What `leftovers()` still gives once it gives nothing, or after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    left = leftovers()
    while left and time.monotonic() < deadline:
        time.sleep(0.05)
        left = leftovers()
    return left


def _no_leaked_files(before: set[str]) -> None:
    left = _left_after(lambda: viceroy_temp_files() - before)
    if left:
        remove_files(sorted(left))
        pytest.fail(f"test left files in the temp directory: {sorted(left)}")


def _no_leaked_processes(me: psutil.Process, before: set[int], exempt: Callable[[], set[int]]) -> None:
    def running(p: psutil.Process) -> bool:  # gone between the listing and the look: not a leak
        try:
            return p.status() != psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return False

    def describe(p: psutil.Process) -> str:
        try:
            return f"{p.pid} {' '.join(p.cmdline()[:4])}"
        except psutil.Error:
            return f"{p.pid} (gone since)"

    def leftovers() -> list[psutil.Process]:
        spared = before | exempt()
        return [p for p in me.children(recursive=True) if p.pid not in spared and running(p)]

    left = _left_after(leftovers)
    if left:
        desc = [describe(p) for p in left]
        for p in left:
            try:
                os.kill(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        pytest.fail(f"test leaked processes: {desc}")


@pytest.fixture(autouse=True)
def no_leaked_processes() -> Iterator[None]:
    """A test that leaves a descendant process running, or a file of ours in the temp directory,
    fails (and the process is killed, the file removed)."""
    with leaks_fail():
        yield


class Owner:
    """A controller-side owner of actor meshes (``owner=``): keeps the failures it is given."""

    def __init__(self) -> None:
        self.failures: list[vr.ActorFailure] = []

    def __supervise__(self, failure: vr.ActorFailure) -> bool:
        self.failures.append(failure)
        return True

    def by_rank(self) -> dict[int, str]:
        return {r: f.summary for f in list(self.failures) for r in f.ranks}


@pytest.fixture
def start_mesh() -> Iterator[Callable[..., vr.Mesh]]:
    """``start_mesh(gpus=4)``: a light local mesh (no torch preload), shut down after the test."""
    meshes: list[vr.Mesh] = []

    def start(**kw: object) -> vr.Mesh:
        kw.setdefault("preload", [])
        kw.setdefault("echo", False)
        m = vr.Mesh.local(**kw)  # type: ignore[arg-type]
        meshes.append(m)
        return m

    yield start
    for m in meshes:
        m.shutdown()
