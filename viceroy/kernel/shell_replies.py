"""The main thread's replies go onto the shell socket from the main thread.

ipykernel 7 gives the shell socket to its shell-channel thread, which reads every request at
once (so subshells, and the mesh view's requests while a cell runs, are served) and passes the
main shell's on to the main thread through an inproc socket pair. The main thread's replies
(execute_reply and every other) went back the same way: one more wake-up of that thread and
one more interpreter-lock hand-off per request, paid by every cell. Here the main thread sends
them on the shell socket itself, which it shares under one lock with the shell-channel thread
(`shared_socket.py`: the thread's reading, and its own and the subshells' replies, take the
lock too). Only the main shell's replies change path; each thread's replies keep their order.
"""

from __future__ import annotations

import sys
from typing import Any

from viceroy.kernel.shared_socket import SharedSocket


def send_replies_inline(kernel: Any) -> None:
    """Route `kernel`'s main-shell replies straight onto its shell socket. Call it once the
    kernel has started (its shell stream reads requests); a kernel without ipykernel's
    shell-channel thread is left as it is."""
    thread = getattr(kernel, "shell_channel_thread", None)
    stream = getattr(kernel, "shell_stream", None)
    if not getattr(kernel, "_supports_kernel_subshells", False) or thread is None or stream is None:
        return
    manager: Any = getattr(thread, "manager", None)
    if not hasattr(manager, "get_subshell_to_shell_channel_socket") or not hasattr(stream, "_handle_events"):
        print("viceroy: this ipykernel's shell channel is not as expected: replies go through its "
              "thread as in a stock kernel", file=sys.__stderr__)
        return
    try:
        shared = SharedSocket(stream.socket, thread.io_loop, stream)
    except RuntimeError as e:
        print(f"viceroy: {e}: replies go through the shell-channel thread as in a stock kernel",
              file=sys.__stderr__)
        return
    for name in ("send_multipart", "close"):  # the thread's sends (queued on the stream), and the end
        _take_lock(stream, name, shared)
    route = manager.get_subshell_to_shell_channel_socket
    direct = _DirectReplies(shared, route(None))

    def routed(subshell_id: str | None) -> Any:
        return direct if subshell_id is None else route(subshell_id)

    manager.get_subshell_to_shell_channel_socket = routed


def _take_lock(stream: Any, name: str, shared: SharedSocket) -> None:
    method = getattr(stream, name)

    def locked(*args: Any, **kwargs: Any) -> Any:
        with shared.lock:
            return method(*args, **kwargs)

    setattr(stream, name, locked)


class _DirectReplies:
    """Stands in for the main shell's end of the socket pair: sends go onto the shell socket;
    anything else is the pair's (so code that asks it for more finds what it found before)."""

    def __init__(self, shared: SharedSocket, pair_end: Any) -> None:
        self._shared = shared
        self._pair_end = pair_end

    def send_multipart(self, msg: Any, *args: Any, **kwargs: Any) -> Any:
        socket = self._shared.socket
        return self._shared.send(lambda: socket.send_multipart(msg, *args, **kwargs))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._pair_end, name)
