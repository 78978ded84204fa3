"""A/B of one change inside one Viceroy kernel (a diagnostic beside bench_kernel.py): a cell is
timed (execute_request to idle, through jupyter_client) with the change switched on and off in
alternating blocks, so that this VM's drift in speed, which moves a whole run by 2x within an
hour, falls on both sides alike. It prints both medians and in how many rounds the change won;
a change that wins about half of them is noise.

--toggle is code run in the kernel before each block, with ``{on}`` replaced by True or False.
--setup runs once before (a file of Python, or inline code). Examples (session 33's):

  # IPython's tokenizer skipped for plain cells (viceroy/kernel/cell_passes.py)
  python bench/kernel_ab.py --code-file cell40 \\
      --setup "import re, viceroy.kernel.cell_passes as cp; real = cp.IPYTHON_SYNTAX" \\
      --toggle "cp.IPYTHON_SYNTAX = real if {on} else re.compile('')"

  # the ranks' wait for calls in SCHED_BATCH (viceroy/runtime/links.py), a %%mesh toggle
  python bench/kernel_ab.py --toggle $'%%mesh\\nimport contextlib, viceroy.runtime.links as l
l.__dict__.setdefault("orig", l._waiting_in_batch)
l._waiting_in_batch = l.orig if {on} else contextlib.nullcontext'

  # the main shell's replies sent from the main thread (viceroy/kernel/shell_replies.py, session 36)
  python bench/kernel_ab.py --setup $'m = get_ipython().kernel.shell_channel_thread.manager
routed = m.get_subshell_to_shell_channel_socket; pair = routed(None)._pair_end
old = lambda sid: pair if sid is None else routed(sid)' \\
      --toggle "m.get_subshell_to_shell_channel_socket = routed if {on} else old"

  # IOPub messages sent inline (viceroy/kernel/iopub.py, session 36)
  python bench/kernel_ab.py --setup $'io = get_ipython().kernel.iopub_thread; h = io.send_multipart.__self__
queued = lambda msg, *a, **k: h.schedule(lambda: h._send(msg, a, k))' \\
      --toggle "io.send_multipart = h.send_multipart if {on} else queued"

Usage: python bench/kernel_ab.py --toggle CODE [--setup CODE|FILE] [--code CELL | --code-file F]
                                 [--rounds 12] [--block 40] [--ranks 4]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_kernel import _execute, viceroy_kernel
from common import CELL_40


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--toggle", required=True, help="code switching the change; {on} is True or False")
    ap.add_argument("--setup", default="", help="code, or a file of it, run once before")
    ap.add_argument("--code", default="%%mesh\na=1", help="the cell timed (default: %%%%mesh a=1)")
    ap.add_argument("--code-file", help="the cell timed, from a file; 'cell40' for bench_kernel's 40-line cell")
    ap.add_argument("--rounds", type=int, default=12)
    ap.add_argument("--block", type=int, default=40, help="cells per block (one block on, one off, per round)")
    ap.add_argument("--ranks", type=int, default=4)
    args = ap.parse_args()
    if "{on}" not in args.toggle:
        ap.error("--toggle must contain {on}")
    code = args.code
    if args.code_file:
        code = CELL_40 if args.code_file == "cell40" else Path(args.code_file).read_text()
    setup = Path(args.setup).read_text() if args.setup and os.path.isfile(args.setup) else args.setup
    times: dict[bool, list[float]] = {True: [], False: []}
    rounds: list[tuple[float, float]] = []
    with viceroy_kernel(args.ranks) as (_km, kc):
        if setup:
            _execute(kc, setup)
        for _ in range(30):  # warm-up
            _execute(kc, code)
        for r in range(args.rounds):
            medians = {}
            for on in (True, False) if r % 2 == 0 else (False, True):  # who goes first alternates too
                _execute(kc, args.toggle.replace("{on}", str(on)))
                block = [_execute(kc, code) for _ in range(args.block)]
                times[on] += block
                medians[on] = statistics.median(block)
            rounds.append((medians[True], medians[False]))
    on, off = statistics.median(times[True]), statistics.median(times[False])
    wins = sum(a < b for a, b in rounds)
    print(f"\nkernel_ab: {args.rounds} rounds of {args.block} cells each way, {args.ranks} ranks; "
          f"{os.cpu_count()} CPUs; load {os.getloadavg()[0]:.2f}")
    print(f"  on  {on * 1e3:.3f} ms   off  {off * 1e3:.3f} ms   ({(on - off) * 1e3:+.3f} ms); "
          f"on faster in {wins} of {len(rounds)} rounds")
    print("  rounds (on/off, ms): " + " ".join(f"{a * 1e3:.2f}/{b * 1e3:.2f}" for a, b in rounds))


if __name__ == "__main__":
    main()
