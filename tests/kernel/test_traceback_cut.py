"""`user_frames_only` (viceroy/kernel/tracebacks.py), which cuts the traceback the kernel shows
where it enters the viceroy package, keeps a frame whose instruction has no line of its own.
A KeyboardInterrupt can be raised at such an instruction; its traceback entry's tb_lineno is
None, the cut raised TypeError, and IPython then dropped the kernel's error rendering for the
rest of the session ("Custom TB Handler failed, unregistering"): found by interrupting a loop
of display() calls (tests/kernel/test_shell_replies.py). And a second interrupt that lands
while the kernel renders an error (a double press of stop) is dropped, for the same reason."""

from __future__ import annotations

import sys
import types

from viceroy.kernel.tracebacks import user_frames_only


def _with_block() -> types.FrameType:
    with open(__file__):
        return sys._getframe()


def test_a_frame_at_an_instruction_without_a_line_is_kept():
    frame = _with_block()
    no_line = next(i * 2 for i, pos in enumerate(frame.f_code.co_positions()) if pos[0] is None)
    tb = types.TracebackType(None, frame, no_line, -1)
    assert tb.tb_lineno is None  # as Python gives it
    cut = user_frames_only(tb)
    assert cut is not None and cut.tb_frame is frame and cut.tb_lasti == no_line
    assert cut.tb_lineno is None and cut.tb_next is None


def test_frames_keep_their_lines_and_the_cut_drops_the_package():
    def raising() -> None:
        user_frames_only(5)  # type: ignore[arg-type]  # fails inside the viceroy package

    try:
        raising()
    except AttributeError as e:
        tb = e.__traceback__
    full = []
    t = tb
    while t is not None:
        full.append(t.tb_frame.f_code.co_name)
        t = t.tb_next
    assert full[-1] == "user_frames_only"  # the package's frame, at the bottom
    cut = user_frames_only(tb)
    lines = []
    while cut is not None:
        lines.append((cut.tb_frame.f_code.co_name, cut.tb_lineno))
        cut = cut.tb_next
    assert [name for name, _ in lines] == full[:-1] == [
        "test_frames_keep_their_lines_and_the_cut_drops_the_package", "raising"]
    assert all(isinstance(line, int) for _, line in lines)


def test_a_second_interrupt_while_the_error_renders_leaves_the_rendering_in_place(kernel):
    """A double press of the stop button: the second SIGINT lands while the kernel renders the
    first one's error. It is dropped; IPython would otherwise unregister the kernel's error
    rendering for the rest of the session ("Custom TB Handler failed")."""
    ex = kernel.execute(
        "import os, signal\n"
        "ip = get_ipython()\n"
        "render = ip.InteractiveTB.structured_traceback\n"
        "def pressed_again(*args, **kwargs):\n"
        "    os.kill(os.getpid(), signal.SIGINT)  # the second press, mid-rendering\n"
        "    return render(*args, **kwargs)\n"
        "ip.InteractiveTB.structured_traceback = pressed_again\n"
        "raise KeyboardInterrupt"
    )
    assert [e["ename"] for e in ex.errors] == ["KeyboardInterrupt"]
    assert "Custom TB Handler failed" not in ex.stream("stderr") + ex.stream("stdout")
    ex = kernel.ok("ip.InteractiveTB.structured_traceback = render\nprint(len(ip.custom_exceptions))")
    assert int(ex.stream().strip()) > 0  # the kernel's rendering is still registered
