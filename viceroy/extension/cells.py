"""Running one cell on the mesh: its call, the ranks' output streamed into the cell while it
runs, its value or its grouped error, and what an interrupt does.

`MeshSession` owns one `CellRunner`; the runtime's events reach it through `post` (from the
runtime's threads) and are handled on the thread running the cell.
"""

from __future__ import annotations

import ast
import functools
import re
import threading
import time
from typing import TYPE_CHECKING, Any

from IPython.core.error import UsageError

from viceroy.extension.args import RUN_OPTIONS, RunOptions
from viceroy.extension.cell_code import cell_code
from viceroy.extension.displays import CellSink, Sink
from viceroy.extension.errors import interrupted, render_mesh_error, syntax_error
from viceroy.extension.inbox import Inbox
from viceroy.extension.live import LiveOutput
from viceroy.extension.output import format_rank_set
from viceroy.runtime.handles import is_handle
from viceroy.runtime.shape import describe_ranks

if TYPE_CHECKING:
    from viceroy import Mesh

SETTLE_S = 0.3  # after a call's value arrives, how long to wait for its last output events
INTERRUPT_GRACE_S = 2.0  # how long an interrupted cell waits for its ranks to stop
# Events that need not wake the cell's thread (see Inbox): a rank finishing matters at once
# only when lines may wait for it in a group, and a finished call is followed by its future's
# own "future_done".
_RIDE_ALONG = ("call_started", "rank_done", "ranks_done", "call_finished")


def _where_text(sel: int | slice) -> str:
    """``slice(0, 2)`` -> ``0:2``, as --where took it."""
    if isinstance(sel, int):
        return str(sel)
    text = f"{'' if sel.start is None else sel.start}:{'' if sel.stop is None else sel.stop}"
    return text if sel.step is None else f"{text}:{sel.step}"


class CellRunner:
    """Runs cells, one at a time, for a shell (``shell.user_ns`` holds the handles a cell may
    read; None outside IPython)."""

    def __init__(self, shell: Any = None) -> None:
        self.shell = shell
        self.active = False  # a cell is running: its events go to the inbox
        self._inbox = Inbox()
        self._printed = False  # a rank of the running cell's call has sent output
        self._title: tuple[int | None, str] = (None, "")  # (thread running the cell, title)

    def title_for(self, thread: int) -> str | None:
        """How views should name a call started on `thread`: the cell's title, if the cell
        running now started it there."""
        ident, title = self._title
        return title if ident == thread else None

    def post(self, ev: dict[str, Any]) -> None:
        """A runtime event for the running cell, or a rank's exit (any thread)."""
        kind = ev.get("type")
        if kind in ("output", "publish"):
            self._printed = True
        wake = kind not in _RIDE_ALONG or (self._printed and kind in ("rank_done", "ranks_done"))
        self._inbox.post(ev, wake=wake)

    def view(self, mesh: Mesh, opts: RunOptions) -> Mesh:
        """The part of `mesh` a cell's ``--where`` / ``--ranks`` selects."""
        view = mesh
        if opts.where:
            try:
                view = view.slice(**opts.where)
            except (ValueError, IndexError, TypeError) as e:
                raise UsageError(f"--where: {e}") from None
        if opts.ranks is not None:
            missing = sorted(set(opts.ranks) - set(view.ranks))
            if opts.where and missing:  # ranks of the mesh, maybe, but not of the part --where chose
                where = " ".join(f"--where {dim}={_where_text(sel)}" for dim, sel in opts.where.items())
                raise UsageError(
                    f"--ranks: rank(s) {format_rank_set(missing)} not among the ranks {where} selects "
                    f"({format_rank_set(view.ranks)})"
                )
            try:
                view = view.select(opts.ranks)
            except (ValueError, IndexError) as e:
                raise UsageError(f"--ranks: {e}") from None
        return view

    def run(self, mesh: Mesh, code: str, opts: RunOptions, label: str = "%%mesh", sink: Sink | None = None) -> Any:
        """Run ``code`` on the ranks of `mesh` that `opts` select, streaming their output into
        the cell.

        Returns the ValueMesh of trailing-expression values, or None when every rank gave None.
        Raises a rendered `viceroy.MeshError` when ranks fail, and KeyboardInterrupt (after
        interrupting the ranks) when the user interrupts.
        """
        view = self.view(mesh, opts)
        sink = sink or CellSink()
        self._report_exits_since_last_cell(sink)
        self._report_busy_ranks(view, sink)
        self._printed = False
        self.active = True
        self._title = (threading.get_ident(), cell_title(label, code))
        fut: Any = None
        live: LiveOutput | None = None
        try:
            try:
                fut = self._submit(view, code, opts, label)
                live = LiveOutput(view.ranks, fut.call_id, sink)
                # Wake the pump the moment the value is in (the runtime announces
                # call_finished just before it resolves the future).
                fut.add_done_callback(lambda _f: self._inbox.post({"type": "future_done", "call": fut.call_id}))
                self._pump(live, fut)
            except KeyboardInterrupt:  # also one landing before the pump started
                if live is None and fut is not None:
                    live = LiveOutput(view.ranks, fut.call_id, sink)
                self._stop(view, live, fut)
            finally:
                if live is not None:
                    live.close()
        finally:
            self.active = False
            self._title = (None, "")
        try:
            value = fut.get()
        except Exception as e:
            if hasattr(e, "failures"):  # a MeshError: show it grouped, without our frames
                raise render_mesh_error(e) from None
            raise
        values = value.values() if hasattr(value, "values") else [value]
        return None if all(v is None for v in values) else value

    def _submit(self, view: Mesh, code: str, opts: RunOptions, label: str) -> Any:
        """Send the cell's call; its future. Mistakes found before sending are one error."""
        sent = cell_code(self.shell, code, label)  # named and numbered as the notebook shows it
        try:
            return view.run(
                sent,
                block=False,
                timeout=opts.timeout,
                fail_fast=opts.fail_fast,
                label=label,
                **self._handles_used_by(code),
            )
        except SyntaxError as e:
            raise syntax_error(e, hint=ipython_syntax_hint(sent, e)) from None
        except ValueError as e:  # a handle from another mesh, or from one shut down
            raise UsageError(str(e)) from None

    def _handles_used_by(self, code: str) -> dict[str, Any]:
        """Controller names the cell reads that hold handles (`mesh.ref(...)`, MeshTensors):
        each rank binds its own value under that name (a MeshTensor's, until the controller drops
        it: `viceroy.runtime.handles`). Nothing else from the controller is sent."""
        if self.shell is None:
            return {}
        ns = self.shell.user_ns
        return {name: ns[name] for name in names_read_by(code) if is_handle(ns.get(name))}

    def _pump(self, live: LiveOutput, fut: Any) -> None:
        done_at: float | None = None
        while True:
            now = time.monotonic()
            self._drain(live, timeout=live.next_wakeup(now))
            if fut.done():
                done_at = done_at if done_at is not None else now
                if live.finished or now - done_at > SETTLE_S:
                    self._drain(live, timeout=0)
                    return

    def _drain(self, live: LiveOutput, timeout: float) -> None:
        """Handle queued events (waiting up to ``timeout`` for one), then emit what is due.
        Bounded per round, so a flood cannot starve the ticks."""
        events = self._inbox.take(timeout)
        with live.batch():  # one write (one message) per stream run, not per line
            for i, ev in enumerate(events):
                try:
                    live.handle(ev, time.monotonic())
                except KeyboardInterrupt:  # the rest are handled after it (by _stop)
                    self._inbox.put_back(events[i + 1 :])
                    raise
            live.tick(time.monotonic())

    def _stop(self, view: Mesh, live: LiveOutput | None, fut: Any) -> None:
        """Interrupt the cell's ranks, show what they print while stopping, and end the cell.
        ``fut`` is None (and `live` too) when the interrupt came while the call was being sent:
        then whatever runs on the cell's ranks is interrupted."""
        ranks = format_rank_set(view.ranks)
        try:
            view.interrupt()
            deadline = time.monotonic() + INTERRUPT_GRACE_S
            while fut is not None and live is not None and not fut.done() and time.monotonic() < deadline:
                self._drain(live, timeout=0.05)
            if live is not None:
                self._drain(live, timeout=0)
        except KeyboardInterrupt:
            pass  # a second Ctrl-C: stop waiting, report what we know
        # The call's future resolves once the runtime gives up waiting for ranks that did not
        # answer the interrupt; those ranks still run it (the runtime's states say so).
        busy = self._stuck_ranks(view)
        done = fut is None or fut.done()
        still = format_rank_set(busy or view.ranks) if busy or not done else ""
        raise interrupted(ranks, still_running=still) from None

    def _stuck_ranks(self, view: Mesh) -> list[int]:
        """Ranks of `view` whose main thread still runs a call given up on (interrupted or
        timed out, the ranks did not stop). (Ranks in a live call, such as the tensor engine's,
        or still running an actor endpoint given up on, on its own thread, take the cell as
        usual: not reported.)"""
        try:
            blocked = view._controller.blocked_ranks()
        except Exception:  # a mesh shut down meanwhile: nothing runs
            return []
        return [r for r in blocked if r in view.ranks]

    def _report_busy_ranks(self, view: Mesh, sink: Sink) -> None:
        """A cell sent to ranks still busy with a call given up on waits for them: say so,
        once, rather than seem to hang."""
        stuck = self._stuck_ranks(view)
        if stuck:
            sink.write(
                "stderr",
                f"[viceroy] {describe_ranks(stuck)} still running an earlier call that was "
                "interrupted but has not stopped; this cell runs there once it ends. "
                "`%mesh stacks` shows where they are\n",
            )

    def _pending_exits(self) -> dict[int, str]:
        """rank -> why it exited, for exits since the last cell (taken from the inbox)."""
        exits: dict[int, str] = {}
        while events := self._inbox.take(0):
            for ev in events:
                if ev.get("type") == "rank_exit":
                    exits[ev["rank"]] = ev.get("reason", "unknown")
        return exits

    def forget_exits(self, ranks: Any = None) -> None:
        """Exits of these ranks (None: all) are old news: restarted, or the mesh was replaced."""
        if self.active:
            return
        for rank, reason in self._pending_exits().items():
            if ranks is not None and rank not in ranks:
                self._inbox.post({"type": "rank_exit", "rank": rank, "reason": reason}, wake=False)

    def _report_exits_since_last_cell(self, sink: Sink) -> None:
        exits = self._pending_exits()
        for reason in sorted(set(exits.values())):
            ranks = sorted(r for r, why in exits.items() if why == reason)
            sink.write(
                "stderr",
                f"[viceroy] {describe_ranks(ranks)} exited ({reason}) since the last cell; "
                "`%mesh restart --failed` brings back only the dead ranks\n",
            )


_IPYTHON_SYNTAX = re.compile(r"^\s*(?:[A-Za-z_]\w*\s*=\s*)?(!|%)")
_HELP_SYNTAX = re.compile(r"^\s*(?:\?{1,2}\s*[A-Za-z_][\w.]*|[A-Za-z_][\w.]*\s*\?{1,2})\s*$")  # os? ?os obj.f??
_OPTION_LINE = re.compile(rf"^\s*(?:{'|'.join(RUN_OPTIONS)})\b")  # %%mesh's options, a line too low


def ipython_syntax_hint(code: str, err: SyntaxError) -> str:
    """Why a cell the ranks cannot parse may have looked fine: IPython syntax (``!cmd``,
    ``x = !cmd``, ``%magic``, ``obj?``) is the controller's; ranks run plain Python; or the
    magic's options were put in the cell's body. "" if none is used."""
    lines = code.splitlines()
    if err.lineno is not None and 0 < err.lineno <= len(lines) and _OPTION_LINE.match(lines[err.lineno - 1]):
        option = lines[err.lineno - 1].strip()
        return (f"{option.split()[0]} is an option of the magic: it goes on the %%mesh (or %%px) line itself, "
                f"e.g. `%%mesh {option}`; the cell's body is the code the ranks run")
    suspects = [i for i, line in enumerate(lines, 1) if _IPYTHON_SYNTAX.match(line) or _HELP_SYNTAX.match(line)]
    if not suspects or (err.lineno is not None and err.lineno not in suspects):
        return ""
    line = lines[(err.lineno or suspects[0]) - 1].strip()
    if _HELP_SYNTAX.match(line):
        return ("?/?? help is IPython syntax, answered by the controller's kernel; ranks run plain "
                "Python. Ask on the controller (a cell without %%mesh), or on the ranks use "
                "help(...) or print(obj.__doc__)")
    kind = "shell escapes (!cmd)" if "!" in line.split("%", 1)[0] else "%magics"
    return (
        f"{kind} are IPython syntax, run by the controller's kernel; ranks run plain Python. "
        "On the ranks use subprocess.run(...) (e.g. subprocess.run(['nvidia-smi'])) or "
        "os.system(...) for shell commands, and plain Python for what a magic does"
    )


@functools.lru_cache(maxsize=256)
def names_read_by(code: str) -> frozenset[str]:
    """The names ``code`` reads (cached: a notebook reruns the same cells); none if it does not
    parse, which the runtime then reports with the line."""
    try:
        tree = ast.parse(code)
    except SyntaxError:
        return frozenset()
    return frozenset(n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load))


def cell_title(label: str, code: str) -> str:
    """How views name a cell's call: ``%%mesh x = 1 / 0`` (its first line of code)."""
    first = next((ln.strip() for ln in code.splitlines() if ln.strip() and not ln.strip().startswith("#")), "")
    return f"{label} {first}".strip()
