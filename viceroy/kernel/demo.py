"""``viceroy demo``: execute a notebook headlessly on the Viceroy kernel and print its outputs.

The kernelspec is written to a temporary directory first, so the demo works before
``viceroy install``.
"""

from __future__ import annotations

import os
import re
import sys
import tempfile
from pathlib import Path
from typing import Any

from viceroy.kernel.kernelspec import KERNEL_NAME, write_kernel_spec

# The wheel carries a copy beside this module (pyproject's force-include); a checkout has the original.
_PACKAGED = Path(__file__).resolve().parent / "notebooks" / "01-quickstart.ipynb"
QUICKSTART = _PACKAGED if _PACKAGED.exists() else Path(__file__).resolve().parents[2] / "notebooks" / "01-quickstart.ipynb"
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def _output_text(out: dict[str, Any]) -> str:
    kind = out.get("output_type")
    if kind == "stream":
        return str(out.get("text", ""))
    if kind == "error":
        return _ANSI.sub("", "\n".join(out.get("traceback", []))) + "\n"
    data = out.get("data", {})
    if "text/plain" in data:
        return str(data["text/plain"]) + "\n"
    if not data:  # a display made to be updated later (a progress bar's first draw): nothing yet
        return ""
    return f"<{', '.join(data)}>\n"


def run_demo(notebook: str | None = None, timeout: float = 300) -> int:
    """Run ``notebook`` (default: the quickstart), print each cell and its outputs; 0 if clean."""
    try:
        import nbformat
        from nbclient import NotebookClient
    except ImportError:
        print("viceroy demo needs nbclient: pip install nbclient", file=sys.stderr)
        return 2

    path = Path(notebook) if notebook else QUICKSTART
    if not path.exists():
        print(f"viceroy demo: no notebook at {path}; pass one: viceroy demo PATH", file=sys.stderr)
        return 2
    nb = nbformat.read(path, as_version=4)
    with tempfile.TemporaryDirectory() as tmp:
        write_kernel_spec(Path(tmp) / "kernels" / KERNEL_NAME, executable=sys.executable)
        os.environ["JUPYTER_PATH"] = os.pathsep.join(
            [tmp, *filter(None, [os.environ.get("JUPYTER_PATH")])]
        )
        from jupyter_client.manager import KernelManager

        # Unix sockets: the kernel is local, and it then has no TCP warning to print.
        km = KernelManager(kernel_name=KERNEL_NAME, transport="ipc", ip=os.path.join(tmp, "kernel"))
        try:
            NotebookClient(
                nb,
                km=km,
                kernel_name=KERNEL_NAME,
                timeout=timeout,
                allow_errors=True,
                resources={"metadata": {"path": str(path.parent)}},
            ).execute()
        finally:
            if km.has_kernel:
                km.shutdown_kernel(now=False)
    unexpected = 0
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        print("\n".join(">>> " + ln for ln in cell.source.splitlines()))
        expected_error = "raises-exception" in cell.get("metadata", {}).get("tags", [])
        for out in cell.get("outputs", []):
            sys.stdout.write(_output_text(out))
            unexpected += out.get("output_type") == "error" and not expected_error
        print()
    print(
        f"viceroy demo: ran {path.name}"
        + (f", {unexpected} unexpected error(s)" if unexpected else "")
    )
    return 1 if unexpected else 0
