"""The Viceroy kernelspec: what it says, and installing it.

The wheel ships ``share/jupyter/kernels/viceroy`` (from ``kernelspec/viceroy``), so ``pip install``
needs no extra step. `install` writes the same spec elsewhere:

>>> install(user=True)                 # ~/.local/share/jupyter/kernels/viceroy
>>> install(prefix="/tmp/env")         # /tmp/env/share/jupyter/kernels/viceroy
"""

from __future__ import annotations

import json
import struct
import sys
import tempfile
import zlib
from pathlib import Path
from typing import Any

KERNEL_NAME = "viceroy"
DISPLAY_NAME = "Viceroy"

# The mesh as a logo: four ranks in a 2x2 grid.
_COLORS = [(0x3B, 0x5B, 0xDB), (0x12, 0xB8, 0x86), (0xF5, 0x9F, 0x00), (0xE0, 0x31, 0x31)]
LOGO_SVG = """<svg xmlns="http://www.w3.org/2000/svg" width="64" height="64" viewBox="0 0 64 64">
  <rect x="4" y="4" width="26" height="26" rx="4" fill="#3b5bdb"/>
  <rect x="34" y="4" width="26" height="26" rx="4" fill="#12b886"/>
  <rect x="4" y="34" width="26" height="26" rx="4" fill="#f59f00"/>
  <rect x="34" y="34" width="26" height="26" rx="4" fill="#e03131"/>
</svg>
"""


def kernel_json(executable: str = "python", display_name: str = DISPLAY_NAME) -> dict[str, Any]:
    """The kernel.json contents. ``argv[0] == "python"`` means "the server's Python"."""
    return {
        "argv": [executable, "-m", "viceroy.kernel", "-f", "{connection_file}"],
        "display_name": display_name,
        "language": "python",
        "interrupt_mode": "signal",
        "kernel_protocol_version": "5.5",
        "metadata": {"debugger": True},
    }


def logo_png(size: int) -> bytes:
    """A ``size`` x ``size`` PNG of the logo (written without any imaging library)."""
    gap, half = max(1, size // 16), size // 2
    rows = []
    for y in range(size):
        row = bytearray([0])  # filter: none
        for x in range(size):
            inside = gap <= x < size - gap and gap <= y < size - gap
            in_gutter = abs(x - half + 0.5) < gap / 2 + 0.5 or abs(y - half + 0.5) < gap / 2 + 0.5
            if inside and not in_gutter:
                r, g, b = _COLORS[(y >= half) * 2 + (x >= half)]
                row += bytes((r, g, b, 255))
            else:
                row += b"\0\0\0\0"
        rows.append(bytes(row))

    def chunk(tag: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + tag + data + struct.pack(">I", zlib.crc32(tag + data))

    header = struct.pack(">IIBBBBB", size, size, 8, 6, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(b"".join(rows), 9))
        + chunk(b"IEND", b"")
    )


def write_kernel_spec(
    path: str | Path, executable: str = "python", display_name: str = DISPLAY_NAME
) -> Path:
    """Write kernel.json and the logos into directory ``path``; returns it."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    spec = kernel_json(executable, display_name)
    (path / "kernel.json").write_text(json.dumps(spec, indent=2) + "\n")
    (path / "logo-svg.svg").write_text(LOGO_SVG)
    for size in (32, 64):
        (path / f"logo-{size}x{size}.png").write_bytes(logo_png(size))
    return path


def install(
    user: bool = False,
    prefix: str | None = None,
    kernel_name: str = KERNEL_NAME,
    display_name: str = DISPLAY_NAME,
    executable: str | None = None,
) -> str:
    """Install the kernelspec (system-wide by default; ``user=True`` or ``prefix=...``).

    The spec runs this Python (``sys.executable``) unless ``executable`` says otherwise.
    Returns the directory written.
    """
    from jupyter_client.kernelspec import KernelSpecManager

    with tempfile.TemporaryDirectory() as tmp:
        src = write_kernel_spec(Path(tmp) / kernel_name, executable or sys.executable, display_name)
        return KernelSpecManager().install_kernel_spec(
            str(src), kernel_name=kernel_name, user=user, prefix=prefix
        )
