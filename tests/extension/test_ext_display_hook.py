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
        print(sent[0][0], sorted(sent[0][1]["data"]), len(plt.get_fignums()), sent[0][1].get("end_of_call"))
        """
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "display ['image/png', 'text/plain'] 0 None", "shown where show() was called"


def test_figures_a_call_leaves_open_are_shown_and_closed_at_its_end():
    """As the inline backend does after a cell: no plt.show() needed, and nothing piles up for
    a later show(). A rank that picked another backend (Agg, to save files) keeps its figures."""
    pytest.importorskip("matplotlib")
    script = textwrap.dedent(
        """
        import viceroy.runtime.context as ctx
        from viceroy.runtime.execution import Executor
        sent, ns = [], {}
        ctx._set_context(ctx.Context(0, {"gpus": 0}, {"gpus": 1}, 0, 1, 0, ns,
                                     lambda kind, data: sent.append((kind, data))))
        from viceroy.extension import display_hook
        display_hook.install()
        display_hook.install()  # again, as after a restart: still one flush per call
        ex = Executor(ns)
        ex.run_code("import matplotlib.pyplot as plt\\nplt.figure()\\n_ = plt.plot([1, 2])", "<mesh-cell-1>")
        print("cell 1:", len(sent), sorted(sent[0][1]["data"]), len(ns["plt"].get_fignums()), sent[0][1]["end_of_call"])
        ex.run_code("x = 1", "<mesh-cell-2>")
        ex.run_code("plt.show()", "<mesh-cell-3>")
        print("cells 2-3:", len(sent))
        value = ex.call(lambda: ns["plt"].subplots()[0], (), {})
        print("function:", len(sent), type(value).__name__, len(ns["plt"].get_fignums()))
        try:
            ex.run_code("plt.figure()\\n1 / 0", "<mesh-cell-4>")
        except ZeroDivisionError:
            print("failed cell:", len(sent), len(ns["plt"].get_fignums()))
        ex.run_code("plt.switch_backend('agg')\\nplt.figure()", "<mesh-cell-5>")
        print("agg:", len(sent), len(ns["plt"].get_fignums()))
        """
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == [
        "cell 1: 1 ['image/png', 'text/plain'] 0 True",  # marked: the cell shows it at its end, in rank order
        "cells 2-3: 1",
        "function: 2 Figure 0",
        "failed cell: 3 0",
        "agg: 3 1",
    ]


def run_on_a_fake_rank(body: str) -> list[tuple[str, dict]]:
    """Run ``body`` in a fresh interpreter as a rank with the display hook installed; what it
    published."""
    script = textwrap.dedent(
        """
        import json, sys
        import viceroy.runtime.context as ctx
        sent, ns = [], {}
        ctx._set_context(ctx.Context(0, {"gpus": 0}, {"gpus": 1}, 0, 1, 0, ns,
                                     lambda kind, data: sent.append((kind, data))))
        from viceroy.extension import display_hook
        display_hook.install()
        """
    ) + textwrap.dedent(body) + "\nprint(json.dumps(sent))\n"
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    import json

    return [tuple(x) for x in json.loads(out.stdout.splitlines()[-1])]  # type: ignore[misc]


def test_display_of_a_figure_on_a_rank_sends_its_image():
    """The live-plot loop (``clear_output(wait=True); display(fig)``) shows the plot, as the
    inline backend's formatter does, not only the figure's repr."""
    pytest.importorskip("matplotlib")
    sent = run_on_a_fake_rank(
        """
        import matplotlib.pyplot as plt
        from IPython.display import display
        fig = plt.figure()
        plt.plot([1, 2])
        display(fig)
        plt.close(fig)
        """
    )
    assert len(sent) == 1
    data = sent[0][1]["data"]
    assert sorted(data) == ["image/png", "text/plain"]
    import base64

    assert base64.b64decode(data["image/png"]).startswith(b"\x89PNG")


def test_a_display_id_on_a_rank_gives_a_handle_and_updates_are_sent_as_updates():
    sent = run_on_a_fake_rank(
        """
        from IPython.display import DisplayHandle, display, update_display
        display("step 0", display_id="status")
        update_display("step 1", display_id="status")
        h = display("epoch 0", display_id=True)
        assert isinstance(h, DisplayHandle), h
        h.update("epoch 1")
        h.display("epoch 1 again")
        assert display("no id") is None
        """
    )
    ids = [(d["data"]["text/plain"], d.get("display_id"), d.get("update", False)) for _, d in sent]
    handle = ids[2][1]
    assert ids == [
        ("'step 0'", "status", False),
        ("'step 1'", "status", True),
        ("'epoch 0'", handle, False),
        ("'epoch 1'", handle, True),
        ("'epoch 1 again'", handle, False),
        ("'no id'", None, False),
    ]
    assert handle and handle != "status"


def test_clear_output_on_a_rank_is_sent_to_the_controller_not_printed_as_escapes():
    sent = run_on_a_fake_rank(
        """
        import io, contextlib
        from IPython.display import clear_output, display
        printed = io.StringIO()
        with contextlib.redirect_stdout(printed), contextlib.redirect_stderr(printed):
            clear_output(wait=True)
            clear_output()
            display("frame", clear=True)
        assert printed.getvalue() == "", repr(printed.getvalue())
        """
    )
    assert [(kind, d.get("wait", d.get("data"))) for kind, d in sent] == [
        ("clear_output", True), ("clear_output", False), ("clear_output", True),
        ("display", {"text/plain": "'frame'"}),
    ]


def test_tqdm_notebook_on_a_rank_draws_the_text_bar():
    """Its ipywidgets bar would live in the rank's process, which the notebook cannot reach."""
    pytest.importorskip("tqdm")
    sent = run_on_a_fake_rank(
        """
        import io
        import tqdm.auto
        import tqdm.notebook as nb
        import tqdm.std
        bars = io.StringIO()
        for _ in nb.tqdm(range(3), file=bars, display=True):
            pass
        for _ in nb.trange(2, file=bars):
            pass
        for _ in tqdm.auto.tqdm(range(2), file=bars):
            pass
        assert issubclass(nb.tqdm, tqdm.std.tqdm), nb.tqdm
        assert "3/3" in bars.getvalue() and "2/2" in bars.getvalue(), bars.getvalue()
        """
    )
    assert sent == [], "no widget displayed"


def test_a_ranks_figure_shows_its_rank_in_the_image_and_the_figure_is_left_as_it_was():
    """A front end shows a figure's image, not the text form that names the rank: the image
    has the rank's [N] drawn in its top left corner; the figure itself gets no label (a
    savefig on the rank after has none)."""
    pytest.importorskip("matplotlib")
    script = textwrap.dedent(
        """
        import base64, io
        import viceroy.runtime.context as ctx
        sent = []
        ctx._set_context(ctx.Context(3, {"gpus": 3}, {"gpus": 4}, 3, 4, 3, {},
                                     lambda kind, data: sent.append((kind, data))))
        from viceroy.extension import display_hook
        display_hook.install()
        import matplotlib.pyplot as plt
        import matplotlib.image as mpimg
        fig = plt.figure()
        plt.plot([1, 2, 3])
        plt.show(close=False)

        def corner(png):  # the top left 5% of the image: is anything drawn there?
            img = mpimg.imread(io.BytesIO(png))[..., :3]
            h, w = img.shape[:2]
            return bool((img[: h // 20, : w // 20] < 0.9).any())

        shown = base64.b64decode(sent[0][1]["data"]["image/png"])
        buf = io.BytesIO()
        fig.savefig(buf, format="png", bbox_inches="tight")
        print(corner(shown), corner(buf.getvalue()), len(fig.texts))
        """
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["True", "False", "0"]
