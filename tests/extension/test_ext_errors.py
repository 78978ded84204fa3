"""A failed mesh call renders as one error: grouped by rank set, no plumbing frames."""

from __future__ import annotations

import re

from viceroy.extension.errors import interrupted, render_mesh_error, syntax_error
from viceroy.runtime.errors import MeshError, RankFailure


def test_mesh_errors_render_as_their_grouped_message():
    err = MeshError(
        "%%mesh",
        {
            0: RankFailure(
                "error", "ZeroDivisionError: division by zero", "Traceback ...\n  1/0\n"
            ),
            1: RankFailure(
                "error", "ZeroDivisionError: division by zero", "Traceback ...\n  1/0\n"
            ),
            2: RankFailure("died", "died (SIGKILL)"),
        },
        partial={3: None},
        hint="Bring dead ranks back with mesh.restart(failed_only=True).",
    )
    lines = render_mesh_error(err)._render_traceback_()
    plain = [
        ln.replace("\x1b[0;31m", "").replace("\x1b[1m", "").replace("\x1b[0m", "") for ln in lines
    ]
    assert plain[0] == "MeshError: %%mesh failed on 3 of 4 ranks"
    assert "ranks 0-1: ZeroDivisionError: division by zero" in plain
    assert "rank 2: died (SIGKILL)" in plain
    assert "      1/0" in plain
    assert plain[-1] == "Bring dead ranks back with `%mesh restart --failed`."
    # The reply's evalue (what nbclient and other tools print) says the same as the output.
    assert str(err).endswith("Bring dead ranks back with `%mesh restart --failed`.")
    assert "failed_only" not in str(err) and str(err) == err.args[0]


def test_interrupts_render_as_one_line():
    exc = interrupted("0-3")
    assert isinstance(exc, KeyboardInterrupt)
    assert exc._render_traceback_() == [
        "\x1b[0;31mKeyboardInterrupt\x1b[0m: interrupted the mesh call on ranks 0-3"
    ]


def test_syntax_errors_show_the_line_and_caret_without_frames():
    try:
        compile("def f(:\n  pass", "<%%mesh>", "exec")
    except SyntaxError as e:
        exc = syntax_error(e)
    assert type(exc).__name__ == "SyntaxError"
    text = "\n".join(exc._render_traceback_())
    assert 'File "<%%mesh>", line 1' in text and "def f(:" in text and "^" in text


def test_an_interrupt_that_left_ranks_running_says_which_and_what_to_expect():
    text = interrupted("0-3", still_running="1-2")._render_traceback_()[0]
    assert "interrupted the mesh call on ranks 0-3; some ranks have not stopped yet (ranks 1-2" in text
    assert "%mesh stacks" in text and "the next cell waits for them" in text
    assert "(rank 3:" in interrupted("0-3", still_running="3")._render_traceback_()[0]


def test_shell_escapes_and_magics_in_rank_code_get_a_hint():
    from viceroy.extension.cells import ipython_syntax_hint

    def hint(code: str) -> str:
        try:
            compile(code, "<%%mesh>", "exec")
        except SyntaxError as e:
            return ipython_syntax_hint(code, e)
        raise AssertionError(f"{code!r} compiled")

    assert hint("x = 1\n!nvidia-smi").startswith("shell escapes (!cmd) are IPython syntax")
    assert "subprocess.run(" in hint("!nvidia-smi")
    assert hint("files = !ls").startswith("shell escapes (!cmd)")
    assert hint("%timeit 1 + 1").startswith("%magics are IPython syntax")
    for asked in ("os?", "?os", "os.path.join??", "x = 1\n  np.zeros ?"):
        assert hint(asked).startswith("?/?? help is IPython syntax"), asked
    assert hint("x = 1 +") == "" and hint("a = 5 % 3\nb = (") == ""  # plain mistakes: no hint
    # The magic's options a line too low (`%%mesh` alone, then `--ranks 0`) were a bare SyntaxError.
    assert hint("--ranks 0\nprint(rank)") == (
        "--ranks is an option of the magic: it goes on the %%mesh (or %%px) line itself, e.g. "
        "`%%mesh --ranks 0`; the cell's body is the code the ranks run")
    assert hint("x = 1\n  --where gpus=0:2 --timeout 30").startswith("--where is an option of the magic")
    assert hint("x = 1 +\n--ranks 0") == ""  # the error is elsewhere
    try:
        compile("!nvidia-smi", "<%%mesh>", "exec")
    except SyntaxError as e:
        exc = syntax_error(e, hint=hint("!nvidia-smi"))
    lines = [ln.replace("\x1b[1m", "").replace("\x1b[0m", "") for ln in exc._render_traceback_()]
    assert lines[-1].startswith("hint: shell escapes (!cmd)")
    assert "!nvidia-smi" in "\n".join(lines)


def test_a_call_that_did_not_stop_is_worded_for_the_magics():
    # "mesh.restart() ends it" is the Python API's word; in a cell it is %mesh restart.
    from viceroy.runtime.calls import STUCK_HINT

    summary = f"timed out after 1.0 s; did not stop within 1.0 s {STUCK_HINT}"
    err = MeshError("%%mesh", {0: RankFailure("busy", summary), 1: RankFailure("busy", summary)})
    text = re.sub(r"\x1b\[[0-9;]*m", "", "\n".join(render_mesh_error(err)._render_traceback_()))
    assert "ranks 0-1: timed out after 1.0 s; did not stop within 1.0 s (busy in native code?)" in text, text
    assert "`%mesh restart`" in text and "mesh.restart()" not in text, text
    assert "It stays" not in text  # one message for one rank or several
