"""On a rank, display() and IPython.display.display become publish("display", bundle)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest


def test_display_on_a_rank_publishes_a_mime_bundle():
    # In a fresh interpreter: install() patches IPython's display module on first import.
    script = textwrap.dedent(
        """
        import viceroy.runtime.context as ctx
        sent, ns = [], {}
        ctx._set_context(ctx.Context(0, {"gpus": 0}, {"gpus": 1}, 0, 1, 0, ns,
                                     lambda kind, data: sent.append((kind, data))))
        from viceroy.extension import display_hook
        display_hook.install()
        from IPython.display import HTML, display
        display(HTML("<b>x</b>"))
        ns["display"](42)
        print(sent)
        """
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert (
        "('display', {'data': {'text/plain': '<IPython.core.display.HTML object>', "
        "'text/html': '<b>x</b>'}, 'metadata': {}})" in out.stdout
    )
    assert "('display', {'data': {'text/plain': '42'}, 'metadata': {}})" in out.stdout


def test_matplotlib_figures_on_a_rank_are_published_as_png():
    pytest.importorskip("matplotlib")
    script = textwrap.dedent(
        """
        import viceroy.runtime.context as ctx
        sent = []
        ctx._set_context(ctx.Context(0, {"gpus": 0}, {"gpus": 1}, 0, 1, 0, {},
                                     lambda kind, data: sent.append((kind, data))))
        from viceroy.extension import display_hook
        display_hook.install()
        import matplotlib.pyplot as plt
        plt.plot([1, 2, 3])
        plt.show()
        print(sent[0][0], sorted(sent[0][1]["data"]), len(plt.get_fignums()))
        """
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "display ['image/png', 'text/plain'] 0"
