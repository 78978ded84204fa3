"""The ``viceroy`` command.

    viceroy install [--user | --sys-prefix | --prefix P] [--name N] [--display-name D]
    viceroy demo [NOTEBOOK]        run the quickstart notebook headlessly and print its outputs
    viceroy agent                  a host agent (started by launchers: config on stdin)
    viceroy agent --connect HOST:PORT --key-file F [--host N]
                                   a host agent that attaches to a waiting mesh (Mesh.attach)

Each subcommand is one entry in `COMMANDS`: ``name: (help, add_arguments, run)``.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Callable

AddArguments = Callable[[argparse.ArgumentParser], None]
Run = Callable[[argparse.Namespace], int]


def _no_arguments(p: argparse.ArgumentParser) -> None:
    pass


# --- install ---------------------------------------------------------------------------------


def _install_args(p: argparse.ArgumentParser) -> None:
    where = p.add_mutually_exclusive_group()
    where.add_argument("--user", action="store_true", help="install for the current user")
    where.add_argument(
        "--sys-prefix", action="store_true", help=f"install into this environment ({sys.prefix})"
    )
    where.add_argument("--prefix", help="install into PREFIX/share/jupyter/kernels")
    p.add_argument("--name", default="viceroy", help="kernelspec name (default: viceroy)")
    p.add_argument("--display-name", default="Viceroy", help="name shown in launchers")


def _install(ns: argparse.Namespace) -> int:
    from viceroy.kernel.kernelspec import install

    prefix = sys.prefix if ns.sys_prefix else ns.prefix
    dest = install(user=ns.user, prefix=prefix, kernel_name=ns.name, display_name=ns.display_name)
    print(f"installed kernelspec {ns.name!r} in {dest}")
    return 0


# --- demo ------------------------------------------------------------------------------------


def _demo_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("notebook", nargs="?", help="notebook to run (default: the quickstart)")
    p.add_argument("--timeout", type=float, default=300, help="seconds per cell (default 300)")


def _demo(ns: argparse.Namespace) -> int:
    from viceroy.kernel.demo import run_demo

    return run_demo(ns.notebook, timeout=ns.timeout)


# --- agent -----------------------------------------------------------------------------------


def _agent_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--connect", metavar="HOST:PORT", help="attach to the mesh waiting there (Mesh.attach)")
    p.add_argument("--key-file", help="the mesh key, hex, in a file only you can read (chmod 600); "
                   "or set $VICEROY_MESH_KEY")
    p.add_argument("--host", type=int, help="ask for this host index (default: the lowest still waiting)")
    p.add_argument("--wait", type=_seconds, default=60.0, help="seconds to keep trying to reach the controller")


def _seconds(text: str) -> float:
    """A positive, finite number of seconds (argparse type)."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not 0 < value < math.inf:
        raise argparse.ArgumentTypeError(f"{text!r}: give a positive number of seconds, e.g. --wait 120")
    return value


def _agent(ns: argparse.Namespace) -> int:
    from viceroy.runtime.agent import Agent
    from viceroy.runtime.agent import main as agent_main

    if ns.connect is None:
        if ns.key_file or ns.host is not None:
            print("viceroy agent: --key-file and --host go with --connect HOST:PORT", file=sys.stderr)
            return 2
        agent_main()
        return 0
    from viceroy.runtime.attach_agent import request_config
    from viceroy.runtime.mesh_key import read_key

    try:
        cfg = request_config(ns.connect, read_key(ns.key_file), want=ns.host, wait=ns.wait)
    except (OSError, ValueError, RuntimeError) as e:
        print(f"viceroy agent: {e}", file=sys.stderr)
        return 1
    print(f"viceroy agent: attached to {ns.connect} as host {cfg['host']} "
          f"({len(cfg['ranks'])} rank(s))", file=sys.stderr, flush=True)
    Agent(cfg).run()
    return 0


COMMANDS: dict[str, tuple[str, AddArguments, Run]] = {
    "install": ("install the Viceroy kernelspec for Jupyter", _install_args, _install),
    "demo": ("run the quickstart notebook headlessly and print its outputs", _demo_args, _demo),
    "agent": ("run a host agent (launchers start it, or attach one with --connect)", _agent_args, _agent),
}


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``viceroy`` script."""
    parser = argparse.ArgumentParser(prog="viceroy", description="Viceroy: a notebook rules a mesh")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, (help_text, add_arguments, _) in COMMANDS.items():
        add_arguments(sub.add_parser(name, help=help_text, description=help_text))
    ns = parser.parse_args(argv)
    return COMMANDS[ns.command][2](ns)


if __name__ == "__main__":
    sys.exit(main())
