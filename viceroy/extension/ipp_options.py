"""ipyparallel's ``%px`` options, for ipyparallel habits: ``--targets`` (``-t``) is translated
into ``--ranks``, ``--block`` and ``--stream`` are what a Viceroy cell does anyway, and the
options with no counterpart here say what to do instead, each as one line.

>>> translate(["--targets", "::2", "--block"], "%%px", [0, 1, 2, 3])
['--ranks', '0,2']
>>> translate(["-t", "[1,3]"], "%px", [0, 1, 2, 3])
['--ranks', '1,3']
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from IPython.core.error import UsageError

from viceroy.extension.rank_lists import parse_ranks

TARGETS = ("--targets", "-t")
DEFAULTS = ("--block", "--stream")  # what every Viceroy cell does: waits, and streams its output
INSTEAD = {
    "--noblock": "a cell waits for its ranks (the stop button interrupts them); for work in the background "
                 "call mesh.run(CODE, block=False) in a plain cell: it returns a Future",
    "--local": "the cell runs on the ranks only; run the code in a plain cell too for the controller",
    "--no-stream": "rank output always streams into the cell as it is written",
    "--group-outputs": "identical lines from several ranks are shown once with their rank set, each rank's "
                       "own lines in order; there is no other grouping",
    "--save-name": "the cell's value is a ValueMesh of the ranks' last expression: bind it in the next cell "
                   "with `r = _`",
    "--progress-after": "a running cell shows its ranks' output live, and the mesh view each rank's state",
    "--verbose": "the mesh view and %mesh status show what each rank runs",
}
FORMS = "a rank (3), ranks (0,2 or [0,2]), a slice of the ranks (1:3, ::2) or all"


def translate(tokens: list[str], prog: str, mesh_ranks: Sequence[int] | None) -> list[str]:
    """`tokens` of a run magic's line with ipyparallel's options translated (``%px``, ``%%px``)
    or refused with what to use instead (``%%mesh``, whose users are told the option's name
    here)."""
    out: list[str] = []
    i = 0
    while i < len(tokens):
        name, eq, value = tokens[i].partition("=")
        if name in TARGETS:
            if not eq:
                if i + 1 >= len(tokens):
                    raise UsageError(f"{prog}: {name} needs the engines to run on, as ipyparallel takes them: {FORMS}")
                i, value = i + 1, tokens[i + 1]
            if "px" not in prog:
                raise UsageError(f"{prog}: {name} is ipyparallel's; here choose ranks with --ranks 0,2 or "
                                 "--where DIM=A:B (%%px takes --targets too)")
            ranks = _targets(value, prog, mesh_ranks)
            if ranks is not None:
                out += ["--ranks", ranks]
        elif name in DEFAULTS:
            if "px" not in prog:
                raise UsageError(f"{prog}: {name} is ipyparallel's; a %%mesh cell does it anyway: leave it out")
        elif name in INSTEAD:
            raise UsageError(f"{prog}: ipyparallel's {name} has no counterpart here: {INSTEAD[name]}")
        else:
            out.append(tokens[i])
        i += 1
    return out


def _targets(text: str, prog: str, mesh_ranks: Sequence[int] | None) -> str | None:
    """ipyparallel's targets as ``--ranks`` takes them: None for all, as ipyparallel reads
    ``all``; a slice picks among the mesh's ranks (with no mesh up, the cell says so later)."""
    text = text.strip()
    if text == "all":
        return None
    if ":" in text:
        parts = text.split(":")
        if len(parts) > 3 or not all(re.fullmatch(r"\s*-?\d*\s*", p) for p in parts):
            raise UsageError(f"{prog}: --targets {text}: not a slice of the ranks; give {FORMS}")
        if mesh_ranks is None:
            return None
        picked = list(mesh_ranks)[slice(*(int(p) if p.strip() else None for p in parts))]
        if not picked:
            raise UsageError(f"{prog}: --targets {text} picks none of the mesh's {len(mesh_ranks)} ranks")
        return ",".join(map(str, picked))
    inner = text[1:-1] if text[:1] + text[-1:] in ("[]", "()") else text
    numbers = [p.strip() for p in inner.split(",") if p.strip()]
    if not numbers or not all(re.fullmatch(r"\d+", n) for n in numbers):
        raise UsageError(f"{prog}: --targets {text}: give {FORMS}")
    try:
        parse_ranks(",".join(numbers), mesh_ranks)  # said here in the words the user chose
    except UsageError as e:
        raise UsageError(f"{prog}: --targets {text}: {str(e).removeprefix('--ranks: ')}") from None
    return ",".join(numbers)
