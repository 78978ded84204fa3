"""A freshly forked process becomes a rank: its output into its pipes from the first moment,
no stdin, its environment, its device, its own random state; then it serves (`Rank`) until the
end, and whatever stops it is printed as its last words."""

from __future__ import annotations

import os
import sys
import traceback
from typing import Any

from viceroy.runtime import devices
from viceroy.runtime.procs import die_now, die_with_group, hold_lifeline
from viceroy.runtime.rank import Rank


def _reseed_after_fork() -> None:
    """Forked ranks share the template's random state; give each its own, as separate
    processes would have. (Python's `random` reseeds itself at fork; numpy's global state does
    not. torch's default seed is the same in every process anyway: seed it on purpose.)"""
    np = sys.modules.get("numpy")
    if np is not None:
        np.random.seed()


def _no_input(prompt: object = "") -> str:
    raise EOFError(
        "input() on a rank: ranks have no terminal to read from. Pass values in instead "
        "(%mesh push NAME=VALUE, mesh.run(code, NAME=VALUE), or a function's arguments)"
    )


def _no_stdin() -> None:
    """Ranks read nothing: fd 0 is /dev/null, and `sys.stdin` a new reader of it. The one
    inherited from the fork server has read ahead of its own input (spawn requests, with the
    mesh's key): user code must not find that in its buffer. `input()` says what to do instead."""
    import builtins
    import io

    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    sys.stdin = io.TextIOWrapper(io.FileIO(0, "r", closefd=False), encoding="utf-8")
    sys.__stdin__ = sys.stdin  # type: ignore[misc]
    builtins.input = _no_input


def main(cfg: dict[str, Any], lifeline_fd: int) -> None:
    """Entry point in a freshly forked process. Never returns."""
    try:
        hold_lifeline(lifeline_fd, lambda: die_with_group(0))  # the agent is gone: so is what we started
        _output_into_pipes(cfg)
        _no_stdin()
        for k, v in cfg.get("env", {}).items():
            os.environ[k] = str(v)
        devices.bind(cfg.get("device"))
        _reseed_after_fork()
        if "torch" in sys.modules:  # preloaded: rank 0 opens the rendezvous store at once
            from viceroy.runtime.collectives.store import start_early

            start_early()
        Rank(cfg).serve()
    except BaseException:
        traceback.print_exc()
    finally:
        die_now(1)


def _output_into_pipes(cfg: dict[str, Any]) -> None:
    """fds 1 and 2 into the rank's output pipes from its first moment, not only once
    `OutputCapture` is set up: what a rank that fails before then prints (its traceback) is
    its last words, which the agent reads out of them, and not lost in the agent's log."""
    for fd, (_, w) in cfg.get("output_pipes", {}).items():
        os.dup2(w, int(fd))
