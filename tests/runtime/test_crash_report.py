"""A rank's crash report, trimmed to the user's threads and frames (crash_report.trim)."""

import sysconfig

from viceroy.runtime.crash_report import trim

_STDLIB = sysconfig.get_paths()["stdlib"]
_PKGS = "/venv/lib/python3.11/site-packages"
_RT = "/src/viceroy/runtime"


def _report(*threads: tuple[str, list[str]]) -> str:
    parts = ["Fatal Python error: Segmentation fault", ""]
    for header, files in threads:
        parts.append(f"{header} (most recent call first):")
        parts += [f'  File "{f}", line {i + 1} in fn{i}' for i, f in enumerate(files)]
        parts.append("")
    parts.append("Extension modules: zmq.backend.cython._zmq, numpy._core._multiarray_umath (total: 2)")
    return "\n".join(parts) + "\n"


def test_the_runtimes_threads_and_frames_go_and_the_users_stay():
    text = _report(
        ("Thread 0x00007f0000000001", [f"{_PKGS}/zmq/sugar/socket.py", f"{_RT}/rank_channels.py",
                                       f"{_STDLIB}/threading.py"]),
        ("Thread 0x00007f0000000002", [f"{_STDLIB}/queue.py", "/home/me/loader.py", f"{_STDLIB}/threading.py"]),
        ("Current thread 0x00007f0000000003", [f"{_STDLIB}/ctypes/__init__.py", "<mesh-cell-4>",
                                               f"{_RT}/execution.py", f"{_RT}/zygote.py", "<frozen runpy>"]),
    )
    assert trim(text) == (
        "Fatal Python error: Segmentation fault\n\n"
        "Thread 0x00007f0000000002 (most recent call first):\n"
        f'  File "{_STDLIB}/queue.py", line 1 in fn0\n'
        '  File "/home/me/loader.py", line 2 in fn1\n\n'
        "Current thread 0x00007f0000000003 (most recent call first):\n"
        f'  File "{_STDLIB}/ctypes/__init__.py", line 1 in fn0\n'
        '  File "<mesh-cell-4>", line 2 in fn1\n'
    )


def test_a_crash_outside_user_code_keeps_the_crashing_thread_whole():
    frames = [f"{_PKGS}/zmq/sugar/socket.py", f"{_RT}/output.py", f"{_STDLIB}/threading.py"]
    text = _report(("Current thread 0x00007f0000000009", frames), ("Thread 0x00007f000000000a", [f"{_RT}/rank.py"]))
    kept = trim(text)
    assert kept.startswith("Fatal Python error: Segmentation fault\n\nCurrent thread 0x00007f0000000009")
    assert all(f'File "{f}"' in kept for f in frames)
    assert "0x00007f000000000a" not in kept and "Extension modules" not in kept


def test_text_that_is_not_a_report_passes_through():
    assert trim("terminate called after throwing an instance of 'x'\n  what():  y\n") == (
        "terminate called after throwing an instance of 'x'\n  what():  y\n")
    assert trim("") == ""
