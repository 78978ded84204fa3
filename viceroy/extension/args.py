"""Parsing what users type after ``%mesh`` / ``%%mesh``; every mistake is a one-line UsageError.

>>> parse_run_options("--where gpus=0:2 --timeout 30").where
{'gpus': slice(0, 2, None)}
>>> parse_command("up gpus=4").dims
{'gpus': 4}
"""

from __future__ import annotations

import argparse
import functools
import keyword
import math
import re
import shlex
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, NoReturn

from IPython.core.error import UsageError

from viceroy.extension.assignments import parse_assignments
from viceroy.extension.ipp_options import translate
from viceroy.extension.rank_lists import parse_ranks

COMMANDS = (
    "up",
    "down",
    "status",
    "restart",
    "interrupt",
    "logs",
    "stacks",
    "push",
    "pull",
    "scatter",
    "gather",
    "auto",
    "sync",
)
HELP_WORDS = {"help", "-h", "--help"}
RUN_OPTIONS = ("--where", "--ranks", "--no-fail-fast", "--timeout")  # of %%mesh / %%px / %px
RUN_OPTIONS_HELP = (
    "options: --where DIM=A:B (repeatable), --ranks 0,3, --no-fail-fast, --timeout SECONDS"
)
# Longer waits overflow the millisecond timeouts the transport polls with (~24 days).
MAX_TIMEOUT_S = 1_000_000
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class _Parser(argparse.ArgumentParser):
    """argparse that raises a one-line UsageError instead of printing and exiting."""

    def __init__(self, prog: str, hint: str) -> None:
        super().__init__(prog=prog, add_help=False, exit_on_error=False)
        self.hint = hint

    def error(self, message: str) -> NoReturn:
        message = message.replace("unrecognized arguments", "unknown option(s)")
        raise UsageError(f"{self.prog}: {message}; {self.hint}")


def _split(line: str, prog: str) -> list[str]:
    try:
        return shlex.split(line)
    except ValueError as e:  # unbalanced quotes
        raise UsageError(f"{prog}: cannot parse {line!r}: {e}") from None


# --- selecting ranks ---------------------------------------------------------------------------


def parse_where(text: str) -> tuple[str, int | slice]:
    """``gpus=0:2`` -> ``("gpus", slice(0, 2))``; ``gpus=1`` -> ``("gpus", 1)``."""
    dim, eq, sel = text.partition("=")
    dim, sel = dim.strip(), sel.strip()
    if not eq or not dim.isidentifier() or not sel:
        raise UsageError(
            f"--where takes DIM=INDEX or DIM=START:STOP (e.g. --where gpus=0:2), got {text!r}"
        )
    try:
        if ":" not in sel:
            return dim, int(sel)
        parts = sel.split(":")
        if len(parts) > 3:
            raise ValueError
        nums = [int(p) if p.strip() else None for p in parts]
        return dim, slice(*nums)
    except ValueError:
        raise UsageError(
            f"--where {text}: {sel!r} is not an index or START:STOP range of ints (e.g. gpus=0:2)"
        ) from None


@dataclass
class RunOptions:
    """Which ranks run a cell, and how."""

    where: dict[str, int | slice] = field(default_factory=dict)
    ranks: list[int] | None = None
    fail_fast: bool = True
    timeout: float | None = None


@functools.lru_cache(maxsize=8)  # building an argparse parser costs more than a mesh call
def _run_parser(prog: str) -> _Parser:
    p = _Parser(prog, RUN_OPTIONS_HELP)
    p.add_argument("--where", action="append", default=[])
    p.add_argument("--ranks", action="append", default=[])  # given twice is a mistake, said below
    p.add_argument("--no-fail-fast", dest="fail_fast", action="store_false")
    p.add_argument("--timeout", type=float, action="append", default=[])
    return p


def _once(values: list[Any], option: str, prog: str, example: str) -> Any:
    """The one value of an option that takes one; given more than once is a UsageError (the
    last one silently won)."""
    if len(values) > 1:
        given = ", ".join(f"{option} {v:g}" if isinstance(v, float) else f"{option} {v}" for v in values)
        raise UsageError(f"{prog}: {option} given {len(values)} times ({given}); give it once, e.g. {example}")
    return values[0] if values else None


def _to_run_options(ns: argparse.Namespace, prog: str, mesh_ranks: Sequence[int] | None = None) -> RunOptions:
    ranks = _once(ns.ranks, "--ranks", prog, "--ranks " + ",".join(ns.ranks))
    timeout = _once(ns.timeout, "--timeout", prog, "--timeout 30")
    opts = RunOptions(fail_fast=ns.fail_fast, timeout=timeout)
    for w in ns.where:
        for item in w.split(","):
            dim, sel = parse_where(item)
            if dim in opts.where:
                raise UsageError(f"{prog}: --where names dim {dim!r} twice")
            opts.where[dim] = sel
    if ranks is not None:
        opts.ranks = parse_ranks(ranks, mesh_ranks)
    if opts.timeout is not None and not (math.isfinite(opts.timeout) and 0 < opts.timeout <= MAX_TIMEOUT_S):
        raise UsageError(
            f"{prog}: --timeout must be a positive number of seconds, at most {MAX_TIMEOUT_S:,}; "
            f"got {opts.timeout:g} (leave it out to wait as long as the cell runs)"
        )
    return opts


def parse_run_options(line: str, prog: str = "%%mesh", mesh_ranks: Sequence[int] | None = None) -> RunOptions:
    """The options on a ``%%mesh`` line; ``--ranks`` is checked against `mesh_ranks` (the
    running mesh's ranks) when given."""
    if not line.strip():
        return RunOptions()
    tokens = _split(line, prog)
    if any(t in ("-h", "--help") for t in tokens):
        raise UsageError(f"{prog} [--where DIM=A:B] [--ranks 0,3] [--no-fail-fast] [--timeout S]")
    tokens = translate(tokens, prog, mesh_ranks)  # ipyparallel's --targets and friends
    p = _run_parser(prog)
    try:
        ns, extra = p.parse_known_args(tokens)
    except argparse.ArgumentError as e:
        p.error(str(e))
    if extra:
        bad = extra[0]
        if not bad.startswith("-"):
            raise UsageError(
                f"{prog}: unexpected {bad!r} on the magic line; code goes in the cell body "
                f"({RUN_OPTIONS_HELP})"
            )
        raise UsageError(f"{prog}: unknown option {bad!r}; {RUN_OPTIONS_HELP}")
    return _to_run_options(ns, prog, mesh_ranks)


def split_line_code(line: str, prog: str = "%px", mesh_ranks: Sequence[int] | None = None) -> tuple[RunOptions, str]:
    """``%px --ranks 0 print(rank)`` -> the options, and the code after them. A lone ``--``
    ends the options: ``%px --ranks 0 -- --x`` runs ``--x``."""
    rest = line.lstrip()
    opt_text = []
    takes_value = {"--where", "--ranks", "--timeout", "--targets", "-t"}
    while rest.startswith("--") or re.match(r"-t(\s|=)", rest):
        if rest == "--" or rest[:3] == "-- " or (rest.startswith("--") and rest[2].isspace()):  # `--`: code follows
            rest = rest[2:].lstrip()
            break
        m = re.match(r"(--[\w-]+|-t)(=\S+)?(?:\s+|$)", rest)
        if m is None:
            word = rest.split(None, 1)[0]
            raise UsageError(
                f"{prog}: cannot read option {word!r}; {RUN_OPTIONS_HELP}. "
                f"Put `--` before code that starts with `--`: {prog} -- CODE"
            )
        opt_text.append(m.group(0).strip())
        rest = rest[m.end() :]
        if m.group(1) in takes_value and not m.group(2):
            v = re.match(r"(\S+)\s*", rest)
            if v is None:
                raise UsageError(f"{prog}: {m.group(1)} needs a value; {RUN_OPTIONS_HELP}")
            opt_text.append(v.group(1))
            rest = rest[v.end() :]
    opts = parse_run_options(" ".join(shlex.quote(t) for t in opt_text), prog, mesh_ranks)
    if not rest.strip():
        raise UsageError(f"{prog}: give code to run on the ranks, e.g. {prog} print(rank)")
    return opts, rest


# --- %mesh subcommands -------------------------------------------------------------------------


@dataclass
class Command:
    """One parsed ``%mesh`` line."""

    name: str
    dims: dict[str, int] = field(default_factory=dict)
    launcher: str = "local"
    hostfile: str | None = None
    listen: str | None = None
    key_file: str | None = None
    # --identity, --ssh-port, --ssh-options (ssh); --salloc-options, --srun-options,
    # --agents-per-node (slurm): only those given, keyed by the option as spelled
    launcher_options: dict[str, Any] = field(default_factory=dict)
    sync_src: str = "."
    sync_dest: str | None = None
    dry_run: bool = False
    backend: str | None = None
    torch_dist: bool = False
    preload: list[str] | None = None
    env: dict[str, str] = field(default_factory=dict)  # NAME=VALUE for every rank
    output_limit: int | None = None  # bytes of output per rank per call (runtime default if None)
    failed_only: bool = False
    rank: int | None = None
    tail: int = 200
    names: list[str] = field(default_factory=list)
    assignments: list[tuple[str, str]] = field(default_factory=list)  # (name, expression)
    on: bool | None = None


_LAUNCHER_OPTIONS = ("--identity", "--ssh-port", "--ssh-options", "--salloc-options", "--srun-options",
                     "--agents-per-node")


def parse_dims(tokens: list[str], prog: str = "%mesh up") -> dict[str, int]:
    """``["gpus=4", "hosts=2"]`` -> ``{"gpus": 4, "hosts": 2}``."""
    dims: dict[str, int] = {}
    for tok in tokens:
        name, eq, size = tok.partition("=")
        if not eq or not name.isidentifier():  # as Mesh.local takes them: gpus, größe, ñ
            raise UsageError(f"{prog}: dims are NAME=SIZE, e.g. `%mesh up gpus=4`; got {tok!r}")
        try:
            n = int(size)
        except ValueError:
            n = 0
        if n < 1:
            raise UsageError(
                f"{prog}: {name} needs a positive whole size, e.g. {name}=4; got {tok!r}"
            )
        if name in dims:
            raise UsageError(f"{prog}: dim {name!r} given twice")
        dims[name] = n
    if not dims:
        raise UsageError(
            f"{prog}: name the mesh dims, e.g. `%mesh up gpus=4` or `%mesh up hosts=2 gpus=4`"
        )
    return dims


def parse_command(line: str) -> Command:
    """Parse a ``%mesh`` line (``up gpus=4``, ``restart --failed``, ``logs 2``, ...)."""
    word, _, rest = line.strip().partition(" ")
    word = word or "status"
    if word in HELP_WORDS or {"-h", "--help"}.intersection(rest.split()):
        return Command("help")  # `%mesh --help`, `%mesh help`, `%mesh up -h`: the usage, not an error
    if word not in COMMANDS:
        raise UsageError(
            f"unknown %mesh command {word!r}; commands: {', '.join(COMMANDS)} "
            "(`%mesh --help` shows their options). To run code on the ranks use %px CODE or a "
            "%%mesh cell"
        )
    prog = f"%mesh {word}"
    cmd = Command(word)
    if word in ("push", "scatter"):
        example = "`%mesh push lr=0.1`" if word == "push" else "`%mesh scatter part=data`"
        cmd.assignments = parse_assignments(rest, prog, example)
        if not cmd.assignments:
            raise UsageError(f"{prog}: give NAME=EXPRESSION or NAME, e.g. {example}")
        return cmd
    tokens = _split(rest, prog)
    if word == "up":
        p = _Parser(
            prog,
            "usage: %mesh up DIM=SIZE... [--launcher local|ssh|slurm|attach] [--hostfile FILE] "
            "[--listen ADDR] [--key-file FILE] [--identity KEYFILE] [--ssh-port N] [--ssh-options=\"...\"] "
            "[--salloc-options=\"...\"] [--srun-options=\"...\"] [--agents-per-node N] "
            "[--backend gloo|nccl] [--torch-dist] [--preload MOD,MOD|none] [--env NAME=VALUE]... "
            "[--output-limit BYTES]",
        )
        p.add_argument("--launcher", default="local", choices=["local", "ssh", "slurm", "attach"])
        p.add_argument("--hostfile")
        p.add_argument("--listen")
        p.add_argument("--key-file")
        for name in _LAUNCHER_OPTIONS:
            p.add_argument(name, type=int if name in ("--ssh-port", "--agents-per-node") else str)
        p.add_argument("--torch-dist", action="store_true")
        p.add_argument("--backend", choices=["gloo", "nccl"])
        p.add_argument("--preload")
        p.add_argument("--env", action="append", default=[])
        p.add_argument("--output-limit", type=int)
        p.add_argument("dims", nargs="*")
        ns = _parse(p, tokens)
        cmd.launcher, cmd.backend = ns.launcher, ns.backend
        cmd.hostfile, cmd.listen, cmd.torch_dist = ns.hostfile, ns.listen, ns.torch_dist
        cmd.key_file = ns.key_file
        for name in _LAUNCHER_OPTIONS:
            value = getattr(ns, name[2:].replace("-", "_"))
            if value is not None:
                cmd.launcher_options[name] = value
        if ns.preload is not None:
            mods = [m for m in ns.preload.split(",") if m.strip()]
            cmd.preload = [] if mods == ["none"] else mods
        for item in ns.env:
            name, eq, value = item.partition("=")
            if not eq or not _ENV_NAME.match(name):
                raise UsageError(f"{prog}: --env takes NAME=VALUE (one variable each), e.g. --env NCCL_DEBUG=INFO; got {item!r}")
            cmd.env[name] = value
        if ns.output_limit is not None and ns.output_limit < 1:
            p.error(f"--output-limit takes a positive number of bytes (per rank, per call), got {ns.output_limit}")
        cmd.output_limit = ns.output_limit
        cmd.dims = parse_dims(ns.dims, prog)
    elif word == "sync":
        p = _Parser(prog, "usage: %mesh sync [DIR] [--to PATH] [--dry-run] (copies DIR, default the "
                    "working directory, to every host of an ssh mesh over rsync)")
        p.add_argument("src", nargs="?", default=".")
        p.add_argument("--to")
        p.add_argument("--dry-run", action="store_true")
        ns = _parse(p, tokens)
        cmd.sync_src, cmd.sync_dest, cmd.dry_run = ns.src, ns.to, ns.dry_run
    elif word == "restart":
        p = _Parser(prog, "usage: %mesh restart [--failed]")
        p.add_argument("--failed", action="store_true")
        cmd.failed_only = _parse(p, tokens).failed
    elif word == "logs":
        p = _Parser(prog, "usage: %mesh logs RANK [--tail N], e.g. `%mesh logs 2`")
        p.add_argument("rank", type=int)
        p.add_argument("--tail", type=int, default=200)
        ns = _parse(p, tokens)
        if ns.tail < 1:
            p.error(f"--tail takes a positive number of lines, got {ns.tail}")
        cmd.rank, cmd.tail = ns.rank, ns.tail
    elif word in ("pull", "gather"):
        what = "fetch, e.g. `%mesh pull t`" if word == "pull" else "join, e.g. `%mesh gather part`"
        option = next((t for t in tokens if re.match(r"--?[A-Za-z]", t)), None)
        if option is not None:
            name = next((n for t in tokens for n in t.split(",") if is_name(n)), "t")
            raise UsageError(
                f"{prog} takes no options, got {option.partition('=')[0]!r}: it reads every rank; "
                f"for some ranks only, use the mesh, e.g. mesh.select([0]).{word}({name!r})"
            )
        cmd.names = [n for n in tokens for n in n.split(",") if n]
        bad = [n for n in cmd.names if not is_name(n)]
        if bad:
            listed = ", ".join(repr(n) for n in bad)
            raise UsageError(
                f"{prog}: {listed} {'is not a valid Python name' if len(bad) == 1 else 'are not valid Python names'}; "
                f"give the names to {what}"
            )
        if not cmd.names:
            raise UsageError(f"{prog}: give the names to {what}")
    elif word == "auto":
        if tokens not in (["on"], ["off"]):
            raise UsageError("%mesh auto: say `%mesh auto on` or `%mesh auto off`")
        cmd.on = tokens == ["on"]
    elif tokens:
        raise UsageError(f"{prog} takes no arguments, got {' '.join(tokens)!r}")
    return cmd


def is_name(text: str) -> bool:
    """Whether `text` can name a variable: an identifier, not a keyword (``None``, ``class``)."""
    return text.isidentifier() and not keyword.iskeyword(text)


def _parse(p: _Parser, tokens: list[str]) -> argparse.Namespace:
    try:
        return p.parse_args(tokens)
    except argparse.ArgumentError as e:
        p.error(str(e))
