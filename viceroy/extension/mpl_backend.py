"""A matplotlib backend for ranks: ``plt.show()`` sends each figure to the notebook as a PNG.

Selected on ranks by `viceroy.extension.display_hook.install` (``MPLBACKEND``), which also has
`flush_figures` run after each call, as IPython's inline backend does after each cell: figures
a cell made and did not show are shown (and closed) at its end, not kept for a later show().
Those are marked ``end_of_call``: ranks finish at different times, so the controller, which
alone sees every rank, holds them until the call ends and shows them in rank order.
"""

from __future__ import annotations

import base64
import io
import sys
from typing import Any

from matplotlib.backend_bases import FigureManagerBase
from matplotlib.backends.backend_agg import FigureCanvasAgg

FigureCanvas = FigureCanvasAgg
FigureManager = FigureManagerBase


def figure_png(fig: Any) -> str:
    """``fig`` as a base64 PNG, cropped to what is drawn (as the inline backend shows it), with
    the rank's ``[N]`` in its top left corner: a front end shows the image, not the text form
    that names the rank, and four ranks' plots must say whose each is. The label is drawn for
    this image only (the figure is left as it was: ``savefig`` on the rank has none)."""
    from viceroy import context

    label = fig.text(0, 1, f"[{context().rank}]", ha="left", va="top", fontsize=8, color="0.45", family="monospace")
    buf = io.BytesIO()
    try:
        fig.savefig(buf, format="png", bbox_inches="tight")
    finally:
        label.remove()
    return base64.b64encode(buf.getvalue()).decode("ascii")


def show(close: bool = True, block: Any = None, end_of_call: bool = False) -> None:
    """Publish every open figure, then close them (as the inline backend does).
    ``end_of_call``: the figures a call left open (see `flush_figures`)."""
    import matplotlib.pyplot as plt
    from matplotlib._pylab_helpers import Gcf

    from viceroy.extension.display_hook import publish_bundle

    for manager in Gcf.get_all_fig_managers():
        fig = manager.canvas.figure
        publish_bundle({"image/png": figure_png(fig), "text/plain": repr(fig)}, end_of_call=end_of_call)
    if close:
        plt.close("all")


def flush_figures() -> None:
    """After a call: show and close the figures still open, if pyplot is in use with this
    backend (a rank that chose another backend, e.g. Agg to save files, keeps its figures)."""
    if "matplotlib.pyplot" not in sys.modules:
        return
    import matplotlib
    from matplotlib._pylab_helpers import Gcf

    if not Gcf.get_all_fig_managers():
        return
    if matplotlib.get_backend() != f"module://{__name__}":
        return
    show(close=True, end_of_call=True)
