"""Copying a directory to every host of an ssh mesh (`%mesh sync`; the launcher's `sync`): rsync over the
same ssh as the agents', leaving out what is never worth copying (version control, Python
environments by any name, caches)."""

from __future__ import annotations

import os
import shlex
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from viceroy.runtime.ssh import SshHost, SshLauncher

# Not worth copying to the hosts: version control, environments, caches.
SYNC_EXCLUDES = (".git", ".venv", "venv", "__pycache__", ".ipynb_checkpoints", ".mypy_cache", ".ruff_cache", ".pytest_cache", "node_modules")


def python_envs(src: str) -> tuple[str, ...]:
    """The folders of `src` that are Python environments, whatever their name (a venv has
    pyvenv.cfg, a conda environment conda-meta/): machine-specific, never worth copying."""
    try:
        entries = list(os.scandir(src))
    except OSError:
        return ()
    return tuple(sorted(e.name for e in entries if e.is_dir(follow_symlinks=False) and (
        os.path.exists(os.path.join(e.path, "pyvenv.cfg")) or os.path.isdir(os.path.join(e.path, "conda-meta")))))


@dataclass(frozen=True)
class Synced:
    """One host's part in a sync: `address:dest` was synced (in a dry run, `would_copy` files
    would be), or it was `skipped`, saying why."""

    address: str
    dest: str
    would_copy: int | None = None
    skipped: str = ""

    def __str__(self) -> str:
        if self.skipped:
            return f"{self.address}: skipped ({self.skipped})"
        return f"{self.address}:{self.dest}" + (f" (would copy {self.would_copy} file(s))" if self.would_copy is not None else "")


def rsync_argv(ssh: list[str], address: str, src: str, dest: str, dry_run: bool = False,
               envs: tuple[str, ...] = ()) -> list[str]:
    """rsync over `ssh` (the command line before the host): `src`'s contents into `dest` on
    `address` (created if missing); `envs` are more folders of `src` to leave out (Python
    environments by any name)."""
    return [
        "rsync", "-az", "--mkpath", *(["--dry-run", "--itemize-changes"] if dry_run else []),
        *(f"--exclude={p}" for p in SYNC_EXCLUDES), *(f"--exclude=/{e}/" for e in envs),
        "-e", shlex.join(ssh), src.rstrip("/") + "/", f"{address}:{dest.rstrip('/')}/",
    ]


def sync(launcher: SshLauncher, src: str, dest: str | None = None, dry_run: bool = False,
         lost: frozenset[int] = frozenset()) -> list[Synced]:
    """Copy the directory `src` to every host of `launcher` (at `dest`, by default the same
    absolute path, where the ranks look for the controller's working directory). One `Synced`
    per host; hosts in `lost` (indices) are skipped, saying why. A host that fails does not
    stop the others: the error, raised at the end, names each one at fault and what was synced."""
    import shutil
    import subprocess

    src = os.path.abspath(src)
    if not os.path.isdir(src):
        raise NotADirectoryError(f"{src} is not a directory")
    if shutil.which("rsync") is None:
        raise FileNotFoundError("rsync is not installed on this machine (the controller's); install it "
                                "here and on every host, e.g. `apt-get install rsync`")
    dest = dest or src
    envs = python_envs(src)
    indices: dict[str, list[int]] = {}
    for i, h in enumerate(launcher.hosts):
        indices.setdefault(h.address, []).append(i)  # type: ignore[union-attr]
    lines: list[Synced] = []
    failed: list[str] = []
    for address, idx in indices.items():  # each distinct host once
        host: SshHost = launcher.hosts[idx[0]]  # type: ignore[assignment]
        if all(i in lost for i in idx):
            which = ", ".join(map(str, idx))
            lines.append(Synced(address, dest, skipped=f"host {which} is lost; sync again after mesh.restart(failed_only=True)"))
            continue
        proc = subprocess.run(launcher.rsync_argv(host, src, dest, dry_run, envs), capture_output=True, text=True)
        if proc.returncode != 0:
            failed.append(f"rsync to {address}:{dest} failed (exit code {proc.returncode}): "
                          f"{proc.stderr.strip()}\n{_advice(launcher, host, proc.returncode, proc.stderr)}")
            continue
        files = sum(1 for ln in proc.stdout.splitlines() if ln[1:2] == "f")  # itemized: ">f+++++++++ path"
        lines.append(Synced(address, dest, would_copy=files if dry_run else None))
    if failed:
        done = "; ".join(map(str, lines)) if lines else "nothing"
        raise RuntimeError("\n".join(failed) + f"\nsynced: {done}")
    return lines


def _advice(launcher: SshLauncher, host: SshHost, code: int, stderr: str) -> str:
    if code == 255:  # ssh itself failed
        port = f"-p {launcher.port} " if launcher.port is not None else ""
        return f"(ssh could not reach {host.address}: make `ssh {port}{host.address} true` work, then sync again)"
    if "not found" in stderr or code in (12, 127):
        return f"(is rsync installed on {host.address}? e.g. `apt-get install rsync` there)"
    return f"(check that {host.address} can write the destination; --to PATH picks another)"
