"""The kernel's per-cell bookkeeping is lighter than stock ipykernel's (see
viceroy/kernel/iostream.py), and loses nothing: output still arrives before the cell ends and
history is complete when asked for and written to disk within about a second. It also skips
ipykernel's 0.5 ms sleep after each cell (see ViceroyKernel._execute_sleep), its second
transform of each cell (ViceroyKernel.do_execute) and passes over a cell that cannot change it
(viceroy/kernel/cell_passes.py)."""

from __future__ import annotations

import json
import sqlite3
import time

import pytest
from kernel_harness import Kernel, wait_until

pytestmark = pytest.mark.timeout(120)


def test_output_without_a_newline_arrives_before_the_cell_ends(kernel: Kernel):
    for _ in range(3):  # also after cells that printed nothing
        assert kernel.ok("y = 1").outputs == []
        ex = kernel.ok("import sys\nprint('out', end='')\nsys.stderr.write('err')")
        assert ex.stream("stdout") == "out"
        assert ex.stream("stderr") == "err"


def test_history_requests_see_the_cell_just_run(kernel: Kernel):
    kernel.ok("marker_5831 = 1")
    msg_id = kernel.kc.history(hist_access_type="tail", n=5, raw=True, output=False)
    reply = kernel.kc.get_shell_msg(timeout=30)
    assert reply["parent_header"]["msg_id"] == msg_id
    assert "marker_5831 = 1" in [source for _, _, source in reply["content"]["history"]]


def test_history_reaches_the_database_within_about_a_second(kernel: Kernel):
    ex = kernel.ok("hm = get_ipython().history_manager\nprint(hm.hist_file, hm.session_number, sep='\\n')")
    path, session = ex.stream().split("\n")[:2]
    if path == ":memory:":
        pytest.skip("IPython history is kept in memory here")
    kernel.ok("marker_9417 = 2")
    started = time.monotonic()

    def stored() -> bool:
        with sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=5) as db:
            rows = db.execute("SELECT source_raw FROM history WHERE session = ?", (int(session),)).fetchall()
        return any("marker_9417" in r[0] for r in rows)

    wait_until(stored, 5, "the cell to be written to the history database")
    assert time.monotonic() - started < 3


def test_no_sleep_after_a_cell_and_no_debug_records_that_no_handler_prints(kernel: Kernel):
    ex = kernel.ok(
        "import logging\nk = get_ipython().kernel\n"
        "print(k._execute_sleep, k.log.isEnabledFor(logging.DEBUG), min(h.level for h in k.log.handlers) > logging.DEBUG)"
    )
    assert ex.stream().split() == ["0.0", "False", "True"]


def test_each_cell_is_transformed_once(kernel: Kernel):
    """ipykernel transforms a cell to decide whether it is async and again to run it; the second
    reuses the first (IPython's tokenizer is a good part of a small cell's cost)."""
    kernel.ok(
        "seen_8812 = []\n"
        "def count_8812(lines):\n"
        "    seen_8812.append(''.join(lines))\n"
        "    return lines\n"
        "get_ipython().input_transformers_post.append(count_8812)"
    )
    kernel.ok("y_8812 = 41")
    kernel.ok("y_8812 += 1")
    ex = kernel.ok("get_ipython().input_transformers_post.remove(count_8812)\nprint(seen_8812[:2], y_8812)")
    assert ex.stream().strip() == "['y_8812 = 41\\n', 'y_8812 += 1\\n'] 42"


def test_cells_are_transformed_exactly_as_ipython_does(kernel: Kernel):
    """The kernel gives a ``%%magic`` cell its call, and a cell with none of IPython's syntax its
    text, without IPython's tokenizer pass: the result must be IPython's own, cleanup transforms
    (prompts, indentation, one that adds a cell magic as auto mode does) included."""
    cells = [
        "%%mesh\na=1", "%%mesh --where gpus=0:2 --timeout 30\nprint(1)\n!ls\nx = %pwd\n", "%%mesh?",
        "%%time\nx = %pwd\n", "\n\n%%mesh\nb=2\n", "    %%mesh\n    a=1\n", ">>> %%mesh\n>>> a=1\n",
        "%%mesh\n>>> a = 1\n... b\n", "In [3]: %%mesh\n   ...: c\n", "x = %pwd", "!echo hi", "a?", "%%?\nx",
        "%%mesh x 'y\n\"\"\"\n", "%%mesh", "", "%%px\nawait f()\n", "#t\na=1\n",
        # plain Python: skips the tokenizer when none of IPython's escapes can be in it
        "a = 1\nb = a * 2\nprint(b)\n", "def f(a,\n      b):\n    return a / b\n", "    a = 1\n    b = 2\n",
        "\n\nx = 1\n", ">>> a = 1\n... b = 2\n", "x = '%d' % 3\n", "if a != b:\n    pass\n", "x = 1  # what?\n",
        "/print 1\n", ",print a b\n", ";print a b\n", "x = [1,\n, 2]\n", "s = '''\n/not an escape\n'''\n",
        "    if 1:\n  a = 1\n", "x = (\n",
    ]
    ex = kernel.ok(
        "import json\nfrom IPython.core.inputtransformer2 import TransformerManager\n"
        "m_8813 = get_ipython().input_transformer_manager\n"
        f"cells_8813 = {cells!r}\n"
        "def one_8813(f, c):\n"  # a cell refused (a %%mesh with no code under it) is refused alike
        "    try:\n"
        "        return f(c)\n"
        "    except Exception as e:\n"
        "        return f'{type(e).__name__}: {e}'\n"
        "def both_8813():\n"
        "    return [(one_8813(m_8813.transform_cell, c), one_8813(lambda c: TransformerManager.transform_cell(m_8813, c), c))\n"
        "            for c in cells_8813]\n"
        "off_8813 = both_8813()\n"
        "def timed_8813(lines):\n"
        "    return ['%%time\\n', *lines] if lines and lines[0].startswith('#t') else lines\n"
        "get_ipython().input_transformers_cleanup.append(timed_8813)\n"
        "on_8813 = both_8813()\n"
        "get_ipython().input_transformers_cleanup.remove(timed_8813)\n"
        "print(json.dumps([off_8813, on_8813]))"
    )
    off, on = json.loads(ex.stream())
    for pairs in (off, on):
        for (ours, ipythons), cell in zip(pairs, cells, strict=True):
            assert ours == ipythons, cell
    assert off[0][0] == "get_ipython().run_cell_magic('mesh', '', 'a=1\\n')\n"
    assert off[cells.index("%%mesh")][0].startswith("UsageError: %%mesh: the cell has no code below its first line")
    assert on[cells.index("#t\na=1\n")][0] == "get_ipython().run_cell_magic('time', '', '#t\\na=1\\n')\n"  # made one


def test_history_is_still_written_after_a_shell_escape_forks_the_kernel(kernel: Kernel):
    """IPython stops its history-saving thread before every fork (``!cmd`` forks); the next
    write must start it again, not crash the writer thread into whatever cell is running."""
    ex = kernel.ok("hm = get_ipython().history_manager\nprint(hm.hist_file, hm.session_number, sep='\\n')")
    path, session = ex.stream().split("\n")[:2]
    if path == ":memory:":
        pytest.skip("IPython history is kept in memory here")
    assert kernel.ok("!echo forked_7731").stream().strip() == "forked_7731"
    kernel.ok("marker_6620 = 3")

    def stored(marker: str) -> bool:
        with sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=5) as db:
            rows = db.execute("SELECT source_raw FROM history WHERE session = ?", (int(session),)).fetchall()
        return any(marker in r[0] for r in rows)

    wait_until(lambda: stored("marker_6620"), 10, "the cell after !cmd to be written to the history database")
    # and again after a second fork: the writer thread lived through the first
    kernel.ok("!true")
    kernel.ok("marker_6621 = 4")
    wait_until(lambda: stored("marker_6621"), 10, "the cell after a second !cmd to be written")
    names = kernel.ok("import threading\nprint(sorted(t.name for t in threading.enumerate()))").stream()
    assert "viceroy-history" in names
    # nothing was printed by a dying thread, into a cell or outside one
    printed = [m["content"].get("text", "") for m in kernel.stray if m["msg_type"] == "stream"]
    assert not any("Exception in thread" in t for t in printed), printed


def test_top_level_await_still_runs_async_and_other_cells_skip_the_check(kernel: Kernel):
    """Only cells that say ``await`` or ``async`` are compiled to learn whether they await at
    top level (viceroy/kernel/cell_passes.py); the others run as before."""
    ex = kernel.ok("import asyncio\nawait asyncio.sleep(0)\nprint('awaited_1')")
    assert ex.stream().strip() == "awaited_1"
    ex = kernel.ok("async def gen_2():\n    yield 2\nprint([x async for x in gen_2()])")
    assert ex.stream().strip() == "[2]"
    ex = kernel.ok("print('no await here, but the word: async')")  # compiled, and sync
    assert ex.stream().strip() == "no await here, but the word: async"
    ex = kernel.ok(
        "sh = get_ipython()\n"
        "print([sh.should_run_async(c, transformed_cell=c) for c in ('x = 1', 'await asyncio.sleep(0)', 's = \"await\"')])"
    )
    assert ex.stream().strip() == "[False, True, False]"


def test_plain_python_cells_skip_the_tokenizer(kernel: Kernel):
    """IPython's tokenizer is pure Python (~0.8 ms for a 40-line cell); a cell that cannot hold
    IPython syntax does not go through it (viceroy/kernel/cell_passes.py)."""
    kernel.ok(
        "m_2291 = get_ipython().input_transformer_manager\n"
        "calls_2291 = []\n"
        "tokens_2291 = m_2291.do_token_transforms\n"
        "def count_2291(lines):\n"
        "    calls_2291.append(''.join(lines))\n"
        "    return tokens_2291(lines)\n"
        "m_2291.do_token_transforms = count_2291"
    )
    kernel.ok("y_2291 = 6\nz_2291 = y_2291 * 7")
    kernel.ok("w_2291 = !echo hi")
    ex = kernel.ok("m_2291.do_token_transforms = tokens_2291\nprint(len(calls_2291), calls_2291[0], z_2291, w_2291)")
    assert ex.stream().split("\n") == ["1 w_2291 = !echo hi", " 42 ['hi']", ""]


def test_a_cells_value_is_shown_unless_it_ends_with_a_semicolon_without_tokenizing_it(kernel: Kernel):
    """IPython's display hook tokenized every cell with a value to show, looking for a final
    ``;``; a cell with no ``;`` in it is answered without (viceroy/kernel/cell_passes.py).
    What is shown is as before."""
    shown = {
        "x_7310 = 6\nx_7310 * 7": "42",
        "x_7310 * 7;": None,
        "x_7310 * 7  # ;": "42",
        "s_7310 = ';'\ns_7310": "';'",
        "x_7310 * 7; x_7310 + 1": "7",
        "x_7310 * 7 ;  # quiet": None,
    }
    for code, value in shown.items():
        results = kernel.ok(code).of_type("execute_result")
        assert [r["data"]["text/plain"] for r in results] == ([value] if value else []), code
    kernel.ok(
        "import tokenize\n"
        "tokenized_7310 = []\n"
        "generate_7310 = tokenize.generate_tokens\n"
        "tokenize.generate_tokens = lambda *a, **k: tokenized_7310.append(1) or generate_7310(*a, **k)"
    )
    assert kernel.ok("x_7310 + 100").of_type("execute_result")[0]["data"]["text/plain"] == "106"
    ex = kernel.ok("tokenize.generate_tokens = generate_7310\nprint(len(tokenized_7310))")
    assert ex.stream().strip() == "0"
