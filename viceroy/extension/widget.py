"""`MeshView`: the live mesh widget (anywidget), and the same state as static HTML and text.

The widget's synced trait ``state`` holds a full snapshot (set when the widget opens and when
the front end asks for one, e.g. after a gap in ``seq``); diffs and replies to requests travel
as custom messages, requests arrive as custom messages (protocol: `viceroy.extension.comm`).
Where no widget front end exists (nbconvert, GitHub), the ``text/html`` grid and the
``text/plain`` table of its display bundle show the state as it was when displayed.

>>> view(session)          # MeshView when anywidget is installed, else a StaticView
"""

from __future__ import annotations

import html
import importlib.util
import itertools
import pathlib
import weakref
from typing import Any

from viceroy.extension.comm import FrontEnd, StateChannel, channel_for, route_by_header
from viceroy.extension.session import MeshSession, describe_dims
from viceroy.extension.state import summarize

STATIC = pathlib.Path(__file__).parent / "static"
ESM = STATIC / "mesh_view.js"
CSS = STATIC / "mesh_view.css"
# Shown only in a checkout where the front end has not been built yet.
_UNBUILT_ESM = """export default { render({ el }) {
  el.textContent = "viceroy: the mesh view is not built (viceroy/extension/static/mesh_view.js)";
} };"""
MAX_TEXT_ROWS = 64
MAX_HTML_COLS = 16  # tiles side by side in the static grid; more wrap (as MAX_GRID_COLS live)

# State -> tile colours (background, text) for the static HTML; the state is also written out.
COLOURS = {
    "starting": ("#e8eaf6", "#283593"),
    "idle": ("#f5f5f5", "#424242"),
    "running": ("#e3f2fd", "#0d47a1"),
    "done": ("#e8f5e9", "#1b5e20"),
    "error": ("#ffebee", "#b71c1c"),
    "dead": ("#424242", "#ffffff"),
    "interrupted": ("#fff8e1", "#e65100"),
}


# --- static renderings ------------------------------------------------------------------------


def fmt_bytes(n: int | None) -> str:
    if n is None:
        return "–"
    size = float(n)
    for unit in ("B", "KB", "MB", "GB"):
        if size < 1024 or unit == "GB":
            return f"{size:.0f} {unit}" if unit in ("B", "KB") else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} TB"  # unreachable


def fmt_seconds(s: float | None) -> str:
    if s is None:
        return ""
    return f"{s * 1000:.0f} ms" if s < 1 else f"{s:.1f} s" if s < 60 else f"{int(s // 60)}m{int(s % 60):02d}s"


def headline(snap: dict[str, Any]) -> str:
    """``mesh gpus=4 · 4/4 alive · 1 running · 1 failed`` (`` · 2 starting`` while some are)"""
    if snap.get("dims") is None:
        return "no mesh is up; start one with `%mesh up gpus=4`"
    s = snap.get("summary") or summarize(snap["ranks"])
    return (
        f"mesh {describe_dims(snap['dims'])} · {s['alive']}/{s['total']} alive · "
        f"{s['running']} running · {s['failed']} failed"
        + (f" · {s['starting']} starting" if s.get("starting") else "")
        + (" · auto on" if snap.get("auto") else "")
    )


def _detail(r: dict[str, Any]) -> str:
    """What a tile says under its state: the error, the exit, or the last output line."""
    if r["state"] == "error" and r.get("error"):
        return str(r["error"])
    if r["state"] == "dead":
        return f"exited: {r.get('exit') or 'unknown'}"
    return str(r.get("last_line") or "")


def render_text(snap: dict[str, Any]) -> str:
    """A compact table, one rank a row (the first 64, then a count)."""
    lines = [headline(snap)]
    if snap.get("dims") is None:
        return lines[0]
    lines.append(f"{'rank':>4}  {'coords':<14} {'state':<11} {'call':<24} {'time':>8}  {'rss':>8}  {'gpu':>14}  last")
    for r in snap["ranks"][:MAX_TEXT_ROWS]:
        coords = ",".join(str(v) for v in r["coords"].values())
        call = (r.get("label") or "")[:24]
        gpu = "" if r.get("gpu_mem") is None else fmt_bytes(r["gpu_mem"])
        if r.get("gpu_util") is not None:
            gpu += f" {r['gpu_util']:.0f}%"
        lines.append(
            f"{r['rank']:>4}  {coords:<14} {r['state']:<11} {call:<24} {fmt_seconds(r.get('elapsed')):>8}  "
            f"{fmt_bytes(r.get('rss')) if r.get('rss') is not None else '':>8}  {gpu:>14}  {_detail(r)[:60]}"
        )
    if len(snap["ranks"]) > MAX_TEXT_ROWS:
        lines.append(f"… {len(snap['ranks']) - MAX_TEXT_ROWS} more ranks")
    return "\n".join(lines)


def _tile(r: dict[str, Any]) -> str:
    bg, fg = COLOURS.get(r["state"], ("#ffffff", "#000000"))
    bits = [f"<b>{r['rank']}</b> <span>{html.escape(r['state'])}</span>"]
    if r.get("label"):
        timing = fmt_seconds(r.get("elapsed"))
        bits.append(html.escape(r["label"]) + (f" · {timing}" if timing else ""))
    mem = [f"rss {fmt_bytes(r['rss'])}"] if r.get("rss") is not None else []
    if r.get("gpu_mem") is not None:
        mem.append(f"gpu {fmt_bytes(r['gpu_mem'])}")
    if r.get("gpu_util") is not None:
        mem.append(f"{r['gpu_util']:.0f}%")
    if mem:
        bits.append(" · ".join(mem))
    detail = _detail(r)
    if detail:
        bits.append(f"<code>{html.escape(detail[:80])}</code>")
    title = html.escape(f"rank {r['rank']} " + " ".join(f"{k}={v}" for k, v in r["coords"].items()) + f" on {r.get('host', '')}")
    style = (
        f"background:{bg};color:{fg};border:1px solid {fg};border-radius:4px;padding:4px 6px;"
        "min-width:9em;max-width:16em;font:12px/1.35 monospace;overflow:hidden;text-overflow:ellipsis"
    )
    return (
        f'<div class="viceroy-tile viceroy-{html.escape(r["state"])}" data-rank="{r["rank"]}" '
        f'title="{title}" style="{style}">' + "<br>".join(bits) + "</div>"
    )


def _grid(ranks: list[dict[str, Any]], dims: list[str], sizes: dict[str, int]) -> str:
    """Tiles in rows by the second-to-last dim, columns by the last (one row for one dim);
    at most MAX_HTML_COLS columns, more wrap."""
    cols = min(sizes[dims[-1]] if dims else max(1, len(ranks)), MAX_HTML_COLS)
    style = f"display:inline-grid;grid-template-columns:repeat({cols},auto);gap:4px"
    return f'<div style="{style}">' + "".join(_tile(r) for r in ranks) + "</div>"


def render_html(snap: dict[str, Any]) -> str:
    """A self-contained grid of tiles laid out by the mesh's dims; more than two dims give one
    small grid per combination of the leading dims. State shows in colour and in words."""
    head = f'<div style="font:bold 12px monospace;margin:2px 0">{html.escape(headline(snap))}</div>'
    dims = snap.get("dims")
    if not dims:
        return f'<div class="viceroy-mesh-static">{head}</div>'
    names = list(dims)
    ranks = snap["ranks"]
    # A last dim too wide to lay beside the others: one wrapped grid per row.
    split = -1 if dims[names[-1]] > MAX_HTML_COLS else -2
    if len(names) <= -split:
        body = _grid(ranks, names, dims)
    else:
        outer, inner = names[:split], names[split:]
        parts = []
        for key, group in itertools.groupby(ranks, key=lambda r: tuple(r["coords"][d] for d in outer)):
            label = " ".join(f"{d}={v}" for d, v in zip(outer, key, strict=True))
            parts.append(
                f'<div style="display:inline-block;margin:0 8px 8px 0;vertical-align:top">'
                f'<div style="font:11px monospace">{html.escape(label)}</div>{_grid(list(group), inner, dims)}</div>'
            )
        body = "".join(parts)
    return f'<div class="viceroy-mesh-static">{head}{body}</div>'


class StaticView:
    """The mesh state as HTML and text, for front ends without widgets (or without anywidget)."""

    def __init__(self, snapshot: dict[str, Any]) -> None:
        self.snapshot = snapshot

    def _repr_mimebundle_(self, **kwargs: Any) -> dict[str, str]:
        return {"text/plain": render_text(self.snapshot), "text/html": render_html(self.snapshot)}


# --- the widget -------------------------------------------------------------------------------

HAVE_ANYWIDGET = importlib.util.find_spec("anywidget") is not None

if HAVE_ANYWIDGET:
    import anywidget
    import traitlets

    class MeshView(anywidget.AnyWidget):
        """The live mesh: one tile per rank, laid out by the mesh's dims."""

        _esm = ESM if ESM.is_file() else _UNBUILT_ESM
        _css = CSS if CSS.is_file() else ""
        state = traitlets.Dict().tag(sync=True)

        def __init__(self, session: MeshSession | None = None, channel: StateChannel | None = None, **kwargs: Any) -> None:
            if channel is None:
                if session is None:
                    raise TypeError("MeshView needs the MeshSession (or StateChannel) whose mesh it shows")
                channel = channel_for(session)
            fe = FrontEnd(self._send_diff, self._set_state)
            first = fe.stream.next(channel.session.state.snapshot())
            super().__init__(state=first, **kwargs)
            fe.pending, fe.sent_at = False, channel.clock()
            self._channel, self._front_end = channel, fe
            self.on_msg(self._on_custom)
            if self.comm is not None:
                route_by_header(self.comm)
            channel.attach(fe)

        def _set_state(self, msg: dict[str, Any]) -> None:
            if self.comm is None:
                raise RuntimeError("the widget was closed")
            self.state = msg

        def _send_diff(self, msg: dict[str, Any]) -> None:
            if self.comm is None:
                raise RuntimeError("the widget was closed")
            self.send(msg)

        def _on_custom(self, _widget: Any, content: Any, _buffers: Any) -> None:
            # Possibly on a subshell thread while a cell runs: enqueue only.
            self._channel.request(self._front_end, content)

        def close(self) -> None:
            self._channel.detach(self._front_end)
            super().close()

        def _repr_mimebundle_(self, **kwargs: Any) -> Any:
            bundle = super()._repr_mimebundle_(**kwargs)
            if bundle is None:
                return None
            data, metadata = bundle
            snap = self._channel.session.state.snapshot()
            data = {**data, "text/plain": render_text(snap), "text/html": render_html(snap)}
            return data, metadata


_VIEWS: weakref.WeakKeyDictionary[MeshSession, Any] = weakref.WeakKeyDictionary()


def view(session: MeshSession) -> Any:
    """Something to display for ``session``'s mesh: its live `MeshView` where anywidget is
    installed (one per session: each display is another view of the same widget, so the
    kernel sends each change once however often `%mesh status` ran), else a `StaticView` of
    the state now."""
    if not HAVE_ANYWIDGET:
        return StaticView(session.state.snapshot())
    widget = _VIEWS.get(session)
    if widget is None or widget.comm is None:  # none yet, or closed
        widget = _VIEWS[session] = MeshView(session)
    return widget


def mesh_bundle(mesh: Any) -> Any:
    """The display bundle of ``mesh`` as a cell's value (`Mesh._repr_mimebundle_`): the view
    of the session running it, or None when no session does (the plain repr is shown then)."""
    from viceroy.extension import _SESSIONS

    controller = getattr(mesh, "_controller", None)
    for session in list(_SESSIONS.values()):
        if session.mesh is not None and getattr(session.mesh, "_controller", None) is controller:
            return view(session)._repr_mimebundle_()
    return None
