"""Real Viceroy kernels for tests: start, execute with every iopub message timed, and kill
everything started (checked by pid with psutil)."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import time
from dataclasses import dataclass, field
from typing import Any

import psutil
from jupyter_client.manager import KernelManager

from tests.conftest import wait_until

__all__ = ["Execution", "Kernel", "error_text", "wait_until"]

OUTPUT_TYPES = ("stream", "error", "execute_result", "display_data", "update_display_data")


@dataclass
class Execution:
    """One execute_request: its reply and the iopub messages it produced, with arrival times."""

    reply: dict[str, Any]
    messages: list[tuple[float, dict[str, Any]]] = field(default_factory=list)
    replied_at: float = 0.0

    @property
    def status(self) -> str:
        return self.reply["status"]

    @property
    def outputs(self) -> list[dict[str, Any]]:
        return [m for _, m in self.messages if m["msg_type"] in OUTPUT_TYPES]

    def stream(self, name: str = "stdout") -> str:
        return "".join(
            m["content"]["text"]
            for m in self.outputs
            if m["msg_type"] == "stream" and m["content"]["name"] == name
        )

    def of_type(self, msg_type: str) -> list[dict[str, Any]]:
        return [m["content"] for m in self.outputs if m["msg_type"] == msg_type]

    @property
    def errors(self) -> list[dict[str, Any]]:
        return self.of_type("error")


def error_text(error: dict[str, Any]) -> str:
    """An error output's traceback as plain text (ANSI colours removed)."""
    return re.sub(r"\x1b\[[0-9;]*m", "", "\n".join(error["traceback"]))


class Kernel:
    """A kernel subprocess and a client on it."""

    def __init__(self, kernel_name: str = "viceroy") -> None:
        self.km = KernelManager(kernel_name=kernel_name)
        self.km.start_kernel()
        self.pid: int = self.km.provisioner.process.pid  # type: ignore[union-attr]
        self.kc = self.km.client()
        self.kc.start_channels()
        self.kc.wait_for_ready(timeout=60)
        self.seen_pids: set[int] = set()
        self.stray: list[dict[str, Any]] = []  # iopub messages not caused by an execute

    def descendants(self) -> list[psutil.Process]:
        try:
            procs = psutil.Process(self.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            return []
        self.seen_pids.update(p.pid for p in procs)
        return procs

    def execute(self, code: str, timeout: float = 60, hook: Any = None) -> Execution:
        """Run ``code``; collect its iopub messages until idle. ``hook(msg)`` sees each live."""
        t0 = time.monotonic()
        msg_id = self.kc.execute(code)
        ex = Execution(reply={})
        deadline = t0 + timeout
        while True:
            msg = self.kc.get_iopub_msg(timeout=max(0.1, deadline - time.monotonic()))
            if msg["parent_header"].get("msg_id") != msg_id:
                self.stray.append(msg)
                continue
            ex.messages.append((time.monotonic() - t0, msg))
            if hook is not None:
                hook(msg)
            if msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
                break
        while True:
            reply = self.kc.get_shell_msg(timeout=max(0.1, deadline - time.monotonic()))
            if reply["parent_header"].get("msg_id") == msg_id:
                ex.reply = reply["content"]
                ex.replied_at = time.monotonic() - t0
                return ex

    def iopub_until(self, condition: Any, timeout: float, what: str) -> dict[str, Any]:
        """Read iopub (after the stray messages already read) until ``condition(msg)``."""
        while self.stray:
            msg = self.stray.pop(0)
            if condition(msg):
                return msg
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                msg = self.kc.get_iopub_msg(timeout=max(0.05, deadline - time.monotonic()))
            except Exception:
                continue
            if condition(msg):
                return msg
        raise AssertionError(f"timed out after {timeout} s waiting for {what}")

    def ok(self, code: str, timeout: float = 60) -> Execution:
        ex = self.execute(code, timeout)
        assert ex.status == "ok", (code, ex.reply, ex.outputs)
        return ex

    def close(self, now: bool = False) -> None:
        """Stop the kernel; then nothing it started may be left (waits up to 10 s)."""
        self.descendants()
        self.kc.stop_channels()
        self.km.shutdown_kernel(now=now)
        assert_all_gone(self.seen_pids, timeout=10)

    def sigkill(self) -> None:
        self.descendants()
        os.kill(self.pid, signal.SIGKILL)
        self.kc.stop_channels()
        self.km.cleanup_resources()


def alive(pids: set[int]) -> list[int]:
    out = []
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                out.append(pid)
        except psutil.NoSuchProcess:
            pass
    return out


def assert_all_gone(pids: set[int], timeout: float) -> None:
    """Every pid in ``pids`` exits within ``timeout`` s; survivors are killed, then we fail."""
    deadline = time.monotonic() + timeout
    while alive(pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    survivors = alive(pids)
    for pid in survivors:  # clean up after a failure: only processes this test started
        with contextlib.suppress(psutil.NoSuchProcess):
            psutil.Process(pid).kill()
    assert not survivors, f"processes still alive {timeout} s later: {survivors}"
