"""Rank side: turn ``display(...)`` and matplotlib figures into ``publish("display", ...)`` events.

The notebook runs `install` on every rank when a mesh comes up (``mesh.run(install)``). After that,
``display(obj)`` on a rank (the predefined name, or ``from IPython.display import display``) and
``plt.show()`` send a MIME bundle to the controller, which shows it in the running cell tagged
with the rank. As in IPython, ``display(obj, display_id=...)`` (``True`` for a new id) returns a
`DisplayHandle`, and ``update_display`` / ``handle.update`` send updates of that display;
``clear_output(wait)`` asks the controller to clear this rank's displays (not the whole cell,
which all ranks share: see `viceroy.extension.displays.RankDisplays`). ``tqdm.notebook`` draws
tqdm's text bars: a widget made on a rank lives where the notebook cannot reach it.

>>> mesh.run(install)                                    # done by %mesh up
>>> mesh.run("from IPython.display import HTML; display(HTML('<b>hi</b>'))")
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import sys
from typing import Any

MPL_BACKEND = "module://viceroy.extension.mpl_backend"


def publish_bundle(
    data: dict[str, Any],
    metadata: dict[str, Any] | None = None,
    display_id: str | None = None,
    update: bool = False,
    end_of_call: bool = False,
) -> None:
    """Send one MIME bundle to the controller as a display event (with ``display_id``: one
    that later updates replace; ``update``: replacing the displays with that id;
    ``end_of_call``: shown after the call's code, as the figures it left open are, which the
    notebook shows at the cell's end in rank order)."""
    from viceroy import context

    event: dict[str, Any] = {"data": data, "metadata": metadata or {}}
    if display_id is not None:
        event["display_id"] = display_id
    if update:
        event["update"] = True
    if end_of_call:
        event["end_of_call"] = True
    context().publish("display", event)


def mimebundle(
    obj: Any, include: Any = None, exclude: Any = None
) -> tuple[dict[str, Any], dict[str, Any]]:
    """IPython's formatting of ``obj`` (``_repr_html_``, ``_repr_png_``, ...) without a shell;
    a matplotlib figure as its PNG, as the inline backend registers it in a kernel."""
    from IPython.core.formatters import DisplayFormatter

    formatter = DisplayFormatter()
    formatter.formatters["image/png"].for_type_by_name("matplotlib.figure", "Figure", _figure_png)
    data, md = formatter.format(obj, include=include, exclude=exclude)
    return data, md


def _figure_png(fig: Any) -> str:
    from viceroy.extension.mpl_backend import figure_png

    return figure_png(fig)


def display(
    *objs: Any,
    include: Any = None,
    exclude: Any = None,
    metadata: dict[str, Any] | None = None,
    transient: dict[str, Any] | None = None,
    display_id: Any = None,
    raw: bool = False,
    clear: bool = False,
    update: bool = False,
    **_: Any,
) -> Any:
    """Rank-side stand-in for ``IPython.display.display`` (the same arguments and result)."""
    display_id = display_id or (transient or {}).get("display_id")
    if display_id is True:
        import uuid

        display_id = uuid.uuid4().hex
    if update and not display_id:
        raise TypeError("display_id required for update_display")
    if not objs and display_id:  # an empty output, to be updated later
        objs, raw = ({},), True
    if clear:
        clear_output(wait=True)
    for obj in objs:
        md: dict[str, Any] = {}
        if raw:
            data = obj
        else:
            data, md = mimebundle(obj, include, exclude)
        if not data and not (raw and display_id):
            continue
        publish_bundle(data, {**md, **(metadata or {})}, display_id, update)
    if not display_id:
        return None
    from IPython.core.display_functions import DisplayHandle  # its methods call our display

    return DisplayHandle(display_id)


def clear_output(wait: bool = False) -> None:
    """Rank-side stand-in for ``IPython.display.clear_output``: clears this rank's displays in
    the cell (``wait``: when its next display comes, which replaces them). IPython's, without
    a shell, prints terminal escapes instead."""
    from viceroy import context

    context().publish("clear_output", {"wait": bool(wait)})


_DISPLAY_MODULE = "IPython.core.display_functions"  # IPython.display re-exports from here


def _patch_display(module: Any) -> None:
    """Our `display` and `clear_output` in one of IPython's display modules (its
    `update_display` and `DisplayHandle` call the module's `display`, so they are ours too)."""
    module.display = display
    module.clear_output = clear_output


def _text_progress_bars(module: Any) -> None:
    """``tqdm.notebook``'s bars are ipywidgets, whose state would live in this rank's process,
    where the notebook cannot reach it: on a rank they are tqdm's text bars (``tqdm.auto``
    already picks those, no kernel running here)."""
    from tqdm.std import tqdm as text_bar

    class tqdm_notebook(text_bar):
        def __init__(self, *args: Any, display: bool = True, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)  # (display: whether the widget shows at once)

    def tnrange(*args: Any, **kwargs: Any) -> Any:
        return tqdm_notebook(range(*args), **kwargs)

    module.tqdm = module.tqdm_notebook = tqdm_notebook
    module.trange = module.tnrange = tnrange


_PATCHES = {_DISPLAY_MODULE: _patch_display, "tqdm.notebook": _text_progress_bars}


class _PatchOnImport(importlib.abc.MetaPathFinder):
    """Patch a module of `_PATCHES` when it is first imported.

    Importing IPython costs ~0.2 s of CPU per rank, so `install` does not import it eagerly.
    """

    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        patch = _PATCHES.get(name)
        if patch is None:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return spec
        loader = spec.loader
        original = loader.exec_module

        def exec_module(module: Any) -> None:
            original(module)
            patch(module)

        loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


def install() -> bool:
    """Route this rank's displays and matplotlib figures to the notebook. Idempotent."""
    from viceroy import context

    context().namespace["display"] = display
    for name, patch in _PATCHES.items():
        if name in sys.modules:
            patch(sys.modules[name])
    if "IPython.display" in sys.modules:
        _patch_display(sys.modules["IPython.display"])
    if not any(isinstance(f, _PatchOnImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _PatchOnImport())
    os.environ["MPLBACKEND"] = MPL_BACKEND
    if "matplotlib" in sys.modules:
        import matplotlib

        matplotlib.use(MPL_BACKEND)
    _flush_figures_after_calls()
    return True


def _flush_figures_after_calls() -> None:
    """Figures a call left open are shown at its end, as the inline backend shows a cell's
    (a dict lookup per call when pyplot was never imported)."""
    from viceroy.runtime.execution import after_each_call

    after_each_call(_flush_figures_if_pyplot)


def _flush_figures_if_pyplot() -> None:
    if "matplotlib.pyplot" in sys.modules:
        _flush_figures()


def _flush_figures() -> None:
    try:
        from viceroy.extension.mpl_backend import flush_figures

        flush_figures()
    except Exception as e:  # showing figures must not turn the user's call into a failure
        print(f"viceroy: could not show this rank's figures: {type(e).__name__}: {e}", file=sys.stderr)
