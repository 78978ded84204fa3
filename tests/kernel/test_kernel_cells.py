"""%%mesh cells in a real Viceroy kernel: live, grouped output; displays; one error output."""

from __future__ import annotations

import pytest
from kernel_harness import Kernel, error_text

pytestmark = pytest.mark.timeout(180)


def test_identical_lines_from_ranks_are_shown_once_with_their_rank_set(mesh_kernel: Kernel):
    ex = mesh_kernel.ok('%%mesh\nprint("hello")\nprint("from", rank)')
    assert ex.stream() == "[0-1] hello\n[0] from 0\n[1] from 1\n"


def test_rank_output_streams_while_the_cell_runs(mesh_kernel: Kernel):
    ex = mesh_kernel.ok(
        '%%mesh\nimport time\nprint("first", flush=True)\ntime.sleep(1.5)\nprint("second")'
    )
    first_at = next(t for t, m in ex.messages if "first" in m["content"].get("text", ""))
    assert ex.replied_at - first_at > 1.0, "the first line should arrive long before the reply"
    assert ex.stream() == "[0-1] first\n[0-1] second\n"


def test_stdout_and_stderr_lines_reach_the_cell_in_the_order_they_were_written(mesh_kernel: Kernel):
    ex = mesh_kernel.ok(
        "%%mesh\nimport sys, warnings\n"
        "for i in range(3):\n"
        "    print('step', i)\n"
        "    warnings.warn(f'careful {i}')\n"
    )
    shown = [(m["content"]["name"], line) for m in ex.outputs if m["msg_type"] == "stream"
             for line in m["content"]["text"].splitlines() if "step" in line or "UserWarning" in line]
    assert [(name, "step" if "step" in line else "careful") for name, line in shown] == [
        ("stdout", "step"), ("stderr", "careful")] * 3, shown


def test_trailing_expression_values_come_back_as_a_value_mesh(mesh_kernel: Kernel):
    ex = mesh_kernel.ok("%%mesh\nrank * 10")
    (result,) = ex.of_type("execute_result")
    assert "gpus=1: 10" in result["data"]["text/plain"]
    assert mesh_kernel.ok("%%mesh\nx = 1").of_type("execute_result") == []


def test_carriage_return_progress_renders_as_one_updating_block(mesh_kernel: Kernel):
    code = (
        "%%mesh\nimport sys, time\n"
        "for i in range(101):\n"
        "    sys.stderr.write(f'\\r{i:3d}%'); sys.stderr.flush(); time.sleep(0.005)\n"
        "sys.stderr.write('\\n')\nprint('done')"
    )
    ex = mesh_kernel.ok(code)
    assert ex.stream("stdout") == "[0-1] done\n"
    assert ex.stream("stderr") == "[0-1] 100%\n", "progress frames must not flood the stream"
    shown = ex.of_type("display_data")
    updates = ex.of_type("update_display_data")
    assert len(shown) == 1 and shown[0]["transient"]["display_id"]
    assert len(updates) < 30, "progress updates are throttled"
    assert "%" in updates[-2]["data"]["text/plain"]
    assert updates[-1]["data"] == {}, "the finished bar is a line: the block shows nothing more"


def test_rank_displays_arrive_as_display_data_tagged_with_their_rank(mesh_kernel: Kernel):
    ex = mesh_kernel.ok(
        "%%mesh\nfrom IPython.display import HTML, display\ndisplay(HTML(f'<b>rank {rank}</b>'))"
    )
    shown = {d["metadata"]["viceroy"]["rank"]: d["data"] for d in ex.of_type("display_data")}
    assert sorted(shown) == [0, 1]
    assert "<b>rank 1</b>" in shown[1]["text/html"]


def test_a_failing_cell_gives_one_grouped_error_with_the_source_line(mesh_kernel: Kernel):
    # --no-fail-fast: both ranks raise, rather than one racing the other's fail-fast stop
    ex = mesh_kernel.execute("%%mesh --no-fail-fast\nx = 1\n1 / (rank - rank)")
    assert ex.status == "error"
    assert len(ex.errors) == 1
    err = ex.errors[0]
    text = error_text(err)
    assert err["ename"] == "MeshError"
    assert "ranks 0-1: ZeroDivisionError" in text
    assert "1 / (rank - rank)" in text, "the user's source line is shown"
    assert "viceroy/extension" not in text and "interactiveshell" not in text
    assert mesh_kernel.ok("1 + 1").of_type("execute_result")[0]["data"]["text/plain"] == "2"


def test_fail_fast_interrupts_the_other_ranks(mesh_kernel: Kernel):
    ex = mesh_kernel.execute(
        "%%mesh --timeout 30\nimport time\nif rank == 1: raise ValueError('bad input')\ntime.sleep(20)"
    )
    assert ex.status == "error" and ex.replied_at < 10
    text = error_text(ex.errors[0])
    assert "ValueError: bad input" in text and "rank 0" in text


def test_no_fail_fast_lets_the_other_ranks_finish(mesh_kernel: Kernel):
    ex = mesh_kernel.execute(
        "%%mesh --no-fail-fast\nimport time\nif rank == 1: raise ValueError('x')\n"
        "time.sleep(0.5)\nprint('finished')"
    )
    assert ex.status == "error"
    assert "[0] finished" in ex.stream()


def test_where_and_ranks_select_the_ranks_that_run(mesh_kernel: Kernel):
    assert mesh_kernel.ok("%%mesh --where gpus=1\nprint('here')").stream() == "[1] here\n"
    assert mesh_kernel.ok("%%mesh --ranks 0\nprint('here')").stream() == "[0] here\n"
    assert mesh_kernel.ok("%px print('px', rank)").stream() == "[0] px 0\n[1] px 1\n"
    # ipyparallel's own option names, for its habits
    assert mesh_kernel.ok("%%px --targets 1 --block\nprint('here')").stream() == "[1] here\n"
    assert mesh_kernel.ok("%px -t ::2 print('even')").stream() == "[0] even\n"


def test_a_syntax_error_is_reported_before_anything_runs(mesh_kernel: Kernel):
    ex = mesh_kernel.execute("%%mesh\ndef broken(:\n    pass")
    assert ex.status == "error" and len(ex.errors) == 1
    assert ex.errors[0]["ename"] == "SyntaxError"
    assert not any("site-packages" in line for line in ex.errors[0]["traceback"])


def test_push_pull_logs_stacks_status(mesh_kernel: Kernel):
    mesh_kernel.ok("%mesh push lr=0.5 names=['a', 'b']")
    pulled = mesh_kernel.ok("%mesh pull lr").of_type("execute_result")[0]["data"]["text/plain"]
    assert "all 0.5" in pulled
    assert mesh_kernel.ok("%px print('logged', names)").stream() == "[0-1] logged ['a', 'b']\n"
    assert "logged ['a', 'b']" in mesh_kernel.ok("%mesh logs 1").stream()
    assert "--- ranks 0-1 ---" in mesh_kernel.ok("%mesh stacks").stream() or (
        "--- rank 0 ---" in mesh_kernel.ok("%mesh stacks").stream()
    )
    assert mesh_kernel.ok("%mesh status").stream().startswith("mesh gpus=2: ranks 0-1 idle")


def test_scatter_and_gather_magics(mesh_kernel: Kernel):
    assert mesh_kernel.ok("%mesh scatter part=[[10, 20], [30, 40]]").stream() == "scattered part over ranks 0-1\n"
    assert mesh_kernel.ok("%px print(part)").stream() == "[0] [10, 20]\n[1] [30, 40]\n"
    gathered = mesh_kernel.ok("%mesh gather part").of_type("execute_result")[0]["data"]["text/plain"]
    assert gathered == "[10, 20, 30, 40]"
    failed = mesh_kernel.execute("%mesh scatter part=[1, 2, 3]")
    assert failed.status == "error" and failed.errors == []  # a one-line usage error, no traceback
    err = failed.stream("stderr")
    assert err.count("\n") == 1 and "%mesh scatter: scatter needs one value per rank: this mesh has 2 ranks" in err


def test_auto_mode_runs_plain_cells_on_the_ranks(mesh_kernel: Kernel):
    mesh_kernel.ok("%mesh auto on")
    try:
        assert mesh_kernel.ok("print('auto', rank)").stream() == "[0] auto 0\n[1] auto 1\n"
    finally:
        mesh_kernel.ok("%mesh auto off")
    assert mesh_kernel.ok("print('here')").stream() == "here\n"
    mesh_kernel.ok("%autopx")
    try:
        assert mesh_kernel.ok("print('px')").stream() == "[0-1] px\n"
    finally:
        mesh_kernel.ok("%autopx")
    assert mesh_kernel.ok("print('back')").stream() == "back\n"


def test_python_api_calls_show_their_output_before_their_value(mesh_kernel: Kernel):
    ex = mesh_kernel.ok('mesh.run(\'print("api", rank); print("same")\')')
    kinds = [m["msg_type"] for m in ex.outputs]
    assert kinds[-1] == "execute_result"
    assert ex.stream() == "[0] api 0\n[1] api 1\n[0-1] same\n"


def test_a_handle_bound_to_a_controller_name_resolves_on_every_rank(mesh_kernel: Kernel):
    mesh_kernel.ok("%%mesh\nweights = [rank] * 3")
    mesh_kernel.ok('w = mesh.ref("weights")\nplain = "controller only"')
    ex = mesh_kernel.ok("%%mesh\nprint(rank, sum(w))")
    assert ex.stream() == "[0] 0 0\n[1] 1 3\n"
    # a plain controller value is not sent: the ranks have no `plain`
    failed = mesh_kernel.execute("%%mesh\nplain")
    assert failed.status == "error" and "NameError" in error_text(failed.errors[0])


def test_a_mesh_tensor_bound_to_a_controller_name_is_each_ranks_tensor(mesh_kernel: Kernel):
    mesh_kernel.ok("import torch\nwith mesh.activate():\n    z = torch.ones(2) * 3")
    ex = mesh_kernel.ok("%%mesh\nprint(rank, z.sum().item())")
    # (in arrival order: a rank still importing torch for the engine's first batch prints later)
    assert sorted(ex.stream().splitlines()) == ["[0] 0 6.0", "[1] 1 6.0"]


def test_a_mesh_tensor_deleted_in_a_cell_is_gone_from_the_ranks_when_the_cell_ends(mesh_kernel: Kernel):
    """Dropping a MeshTensor frees each rank's tensor after the cell, with no fetch to carry the
    free: the name a `%%mesh` cell bound to it goes too, so its memory comes back."""
    mesh_kernel.ok("import torch\nfrom viceroy.runtime.tensors import worker\n"
                   "with mesh.activate():\n    gone = torch.ones(2)\n    kept = torch.zeros(2)")
    mesh_kernel.ok("%%mesh\nseen = gone.sum().item() + kept.sum().item()")
    mesh_kernel.ok("held = mesh.run(worker.count).values()")
    mesh_kernel.ok("del gone")
    ex = mesh_kernel.ok("%%mesh\nprint('gone' in globals(), 'kept' in globals(), seen)")
    assert sorted(ex.stream().splitlines()) == ["[0-1] False True 2.0"]
    ex = mesh_kernel.ok("print([h - n for h, n in zip(held, mesh.run(worker.count).values())])")
    assert ex.stream() == "[1, 1]\n", "one tensor fewer on each rank"

def test_a_tensor_op_that_failed_on_the_ranks_names_the_notebook_cell_that_issued_it(mesh_kernel: Kernel):
    # It named IPython's file for the cell, /tmp/ipykernel_1234/4025209863.py, which the
    # notebook shows nowhere; its tracebacks say "Cell In[5], line 4".
    code = "import torch\nwith mesh.activate():\n    v = torch.arange(4.0)\n    w = v[torch.tensor([7])]"
    for _ in range(2):  # the same code again is another cell (IPython names both one file)
        issued = mesh_kernel.ok(code)
        failed = mesh_kernel.execute("w.fetch()")
        assert failed.status == "error"
        n = issued.reply["execution_count"]
        assert f"__getitem__ (issued at Cell In[{n}], line 4) failed: IndexError" in error_text(failed.errors[0])


def test_a_rank_traceback_through_a_function_of_the_notebook_names_its_cell(mesh_kernel: Kernel):
    # The ranks' frame read File "/tmp/ipykernel_1234/1508945788.py", line 3, in square.
    defined = mesh_kernel.ok("def square(x):\n    y = x * x\n    return y + undefined_name")
    failed = mesh_kernel.execute("mesh.run(square, 3)")
    n = defined.reply["execution_count"]
    text = error_text(failed.errors[0])
    assert f"Cell In[{n}], line 3, in square\n" in text and "ipykernel_" not in text, text


def test_a_failing_mesh_cell_names_its_notebook_cell_and_line(mesh_kernel: Kernel):
    # The ranks' frame read File "<%%mesh cell 7>", line 2: a number the notebook shows nowhere,
    # and a line counted from below the %%mesh line.
    ex = mesh_kernel.execute("%%mesh --no-fail-fast\nx = 1\n1 / (rank - rank)")
    n = ex.reply["execution_count"]
    text = error_text(ex.errors[0])
    assert f"Cell In[{n}], line 3, in <module>\n" in text and "mesh cell" not in text, text
    # a function a %%mesh cell defined, failing when a later one calls it: both cells named
    defined = mesh_kernel.ok("%%mesh\n\ndef halve(v):\n    return v / 0")
    called = mesh_kernel.execute("%%mesh\nhalve(rank)")
    d, c = defined.reply["execution_count"], called.reply["execution_count"]
    text = error_text(called.errors[0])
    assert f"Cell In[{c}], line 2, in <module>\n" in text, text
    assert f"Cell In[{d}], line 4, in halve\n" in text and "return v / 0" in text, text
    # a syntax error names the notebook's line too
    bad = mesh_kernel.execute("%%mesh\nx = 1\ny = (")
    assert "line 3" in error_text(bad.errors[0]), error_text(bad.errors[0])


def test_auto_mode_and_a_one_line_px_name_the_cell_with_the_notebooks_lines(mesh_kernel: Kernel):
    mesh_kernel.ok("%mesh auto on")
    try:
        ex = mesh_kernel.execute("y = 2\nraise KeyError(rank)")  # no %%mesh line in the cell
    finally:
        mesh_kernel.ok("%mesh auto off")
    n = ex.reply["execution_count"]
    assert f"Cell In[{n}], line 2, in <module>\n" in error_text(ex.errors[0]), error_text(ex.errors[0])
    ex = mesh_kernel.execute("%px raise KeyError(rank)")
    n = ex.reply["execution_count"]
    assert f"Cell In[{n}], line 1, in <module>\n" in error_text(ex.errors[0]), error_text(ex.errors[0])


def test_an_unpicklable_push_is_a_one_line_usage_error(mesh_kernel: Kernel):
    mesh_kernel.ok("import threading\nlock = threading.Lock()")
    failed = mesh_kernel.execute("%mesh push lock")
    assert failed.status == "error" and failed.errors == []  # a one-line usage error, no traceback
    err = failed.stream("stderr")
    assert err.count("\n") == 1 and "%mesh push: lock (lock) cannot be sent to the ranks" in err


def test_shell_escapes_in_rank_code_get_a_hint_and_nothing_runs(mesh_kernel: Kernel):
    ex = mesh_kernel.execute("%%px\nprint('ran', rank)\n!nvidia-smi")
    assert ex.status == "error" and len(ex.errors) == 1
    assert ex.errors[0]["ename"] == "SyntaxError"
    text = error_text(ex.errors[0])
    assert "!nvidia-smi" in text
    assert "hint: shell escapes (!cmd) are IPython syntax" in text and "subprocess.run(" in text
    assert ex.stream() == "", "nothing was sent to the ranks"


def test_a_flood_of_lines_arrives_in_few_messages_complete_and_in_order(mesh_kernel: Kernel):
    ex = mesh_kernel.ok(
        "%%mesh\nimport sys\nfor i in range(3000):\n    print('line', i)\n"
        "    if i % 1000 == 0: print('warn', i, file=sys.stderr)"
    )
    streams = [m["content"] for m in ex.outputs if m["msg_type"] == "stream"]
    assert len(streams) < 100, f"{len(streams)} stream messages for 3000 lines"
    shown = [(s["name"], line) for s in streams for line in s["text"].splitlines()]
    # every rank printed the same lines: each shown once for both, in the order written
    # (identical lines may also come apart when a rank lags: then each rank's keep their order)
    for r in (0, 1):
        mine = [(name, line.split("] ", 1)[1]) for name, line in shown if _has_rank(line, r)]
        expected = []
        for i in range(3000):
            expected.append(("stdout", f"line {i}"))
            if i % 1000 == 0:
                expected.append(("stderr", f"warn {i}"))
        assert mine == expected


def _has_rank(line: str, rank: int) -> bool:
    label = line[1 : line.index("]")]
    return label == "0-1" or label == str(rank)


def test_a_very_long_line_is_not_followed_by_an_empty_one(mesh_kernel: Kernel):
    ex = mesh_kernel.ok("%%mesh\nprint('x' * 100000)\nprint('after')")
    lines = ex.stream().splitlines()
    assert lines[-1] == "[0-1] after" or sorted(lines[-2:]) == ["[0] after", "[1] after"]
    pieces = [line.split("] ", 1)[1] if "] " in line else "" for line in lines if "after" not in line]
    assert all(pieces), f"an empty line came out: {[p[:10] for p in pieces]}"
    assert sum(len(p) for p in pieces) in (100000, 200000)  # grouped, or each rank's own


def test_figures_a_cell_made_are_shown_at_its_end_tagged_and_not_again(mesh_kernel: Kernel):
    pytest.importorskip("matplotlib")
    mesh_kernel.ok("%%mesh\nimport matplotlib.pyplot as plt", timeout=120)
    ex = mesh_kernel.ok("%%mesh\nplt.figure()\n_ = plt.plot([1, 2, rank])")
    shown = ex.of_type("display_data")
    assert sorted(d["metadata"]["viceroy"]["rank"] for d in shown) == [0, 1]
    assert all("image/png" in d["data"] for d in shown)
    later = mesh_kernel.ok("%%mesh\nplt.show()\nlen(plt.get_fignums())")
    assert later.of_type("display_data") == [], "nothing piled up for a later show()"
    assert "all 0" in later.of_type("execute_result")[0]["data"]["text/plain"]
    # a plot call's value comes back without the controller drawing its own, untagged copy
    ex = mesh_kernel.ok("%%mesh\nplt.figure()\nplt.plot([1, rank])")
    assert [d["metadata"].get("viceroy") for d in ex.of_type("display_data")] in (
        [{"rank": 0}, {"rank": 1}], [{"rank": 1}, {"rank": 0}])


def test_bad_input_to_the_python_api_shows_the_users_frames_and_the_message_only(mesh_kernel: Kernel):
    ex = mesh_kernel.execute("def pick(m):\n    return m.slice(gpu=0)\n\npick(mesh)")
    assert ex.status == "error" and len(ex.errors) == 1
    err = ex.errors[0]
    text = error_text(err)
    assert err["ename"] == "ValueError"
    assert "this mesh has no dim 'gpu'; its dims are: gpus" in text
    assert "pick(mesh)" in text and "return m.slice(gpu=0)" in text, "the user's frames are shown"
    assert "viceroy/" not in text, "the runtime's frames below the user's call are not"
    again = error_text(mesh_kernel.execute("%tb").errors[0])
    assert "no dim 'gpu'" in again and "viceroy/" not in again, "%tb shows what the cell showed"


def test_a_shape_error_of_the_tensor_engine_shows_the_users_line_and_torchs_message_only(mesh_kernel: Kernel):
    mesh_kernel.ok("import torch\nwith mesh.activate():\n    a = torch.ones(4, 3)", timeout=120)
    ex = mesh_kernel.execute("b = torch.ones(2, 2)\nwith mesh.activate():\n    c = torch.cat([a, b])")
    assert ex.status == "error" and len(ex.errors) == 1
    text = error_text(ex.errors[0])
    assert ex.errors[0]["ename"] == "RuntimeError"
    assert "----> 3     c = torch.cat([a, b])" in text, "the user's line is shown"
    assert "Sizes of tensors must match except in dimension 0" in text and "nothing was sent to the ranks" in text
    assert "viceroy/" not in text and "torch/" not in text, "neither the engine's frames nor torch's checks"


def test_an_error_inside_viceroy_that_is_no_refusal_keeps_its_whole_traceback(mesh_kernel: Kernel):
    # A bug in the runtime (here: a method called on None) must stay debuggable: every frame shown.
    ex = mesh_kernel.execute("from viceroy.runtime.shape import Shape\nShape.slice(None, gpus=0)")
    text = error_text(ex.errors[0])
    assert ex.errors[0]["ename"] == "AttributeError" and "viceroy/runtime/shape.py" in text
