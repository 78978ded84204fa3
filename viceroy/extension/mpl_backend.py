"""A matplotlib backend for ranks: ``plt.show()`` sends each figure to the notebook as a PNG.

Selected on ranks by `viceroy.extension.display_hook.install` (``MPLBACKEND``).
"""

from __future__ import annotations

import base64
import io
from typing import Any

from matplotlib.backend_bases import FigureManagerBase
from matplotlib.backends.backend_agg import FigureCanvasAgg

FigureCanvas = FigureCanvasAgg
FigureManager = FigureManagerBase


def show(close: bool = True, block: Any = None) -> None:
    """Publish every open figure, then close them (as the inline backend does)."""
    import matplotlib.pyplot as plt
    from matplotlib._pylab_helpers import Gcf

    from viceroy.extension.display_hook import publish_bundle

    for manager in Gcf.get_all_fig_managers():
        fig = manager.canvas.figure
        buf = io.BytesIO()
        fig.savefig(buf, format="png", bbox_inches="tight")
        publish_bundle(
            {"image/png": base64.b64encode(buf.getvalue()).decode("ascii"), "text/plain": repr(fig)}
        )
    if close:
        plt.close("all")
