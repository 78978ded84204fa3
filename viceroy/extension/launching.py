"""Starting the notebook's mesh with a launcher (``%mesh up ... --launcher local|ssh|slurm|attach``)
and copying files to its hosts (``%mesh sync``); every mistake is a one-line UsageError."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from IPython.core.error import UsageError

if TYPE_CHECKING:
    from viceroy.runtime.ssh import Synced


def check_launcher_options(
    launcher: str, dims: dict[str, int], hostfile: str | None, listen: str | None, key_file: str | None
) -> None:
    """Which ``%mesh up`` options go with which launcher; a mistake is a one-line UsageError."""
    if launcher not in ("local", "ssh", "slurm", "attach"):
        raise UsageError(f"%mesh up: unknown launcher {launcher!r}; use local, ssh, slurm or attach")
    if launcher == "ssh" and not hostfile:
        raise UsageError("%mesh up --launcher ssh needs --hostfile FILE (one host per line)")
    if hostfile and launcher != "ssh":
        raise UsageError("%mesh up: --hostfile goes with --launcher ssh")
    if launcher == "local" and listen:
        raise UsageError("%mesh up: --listen goes with --launcher ssh, slurm or attach")
    if key_file and launcher != "attach":
        raise UsageError("%mesh up: --key-file goes with --launcher attach")
    if launcher == "attach" and "hosts" not in dims:
        raise UsageError("%mesh up --launcher attach needs hosts=N (one agent per host), e.g. hosts=2 gpus=8")


def start(
    launcher: str,
    dims: dict[str, int],
    kwargs: dict[str, Any],
    hostfile: str | None = None,
    listen: str | None = None,
    key_file: str | None = None,
) -> Any:
    """The mesh `launcher` starts with these dims (`kwargs`: the dims and `Mesh.local`'s
    options), or a UsageError that says what to fix."""
    from viceroy.runtime.errors import MeshStartError

    try:
        return _start(launcher, dims, kwargs, hostfile, listen, key_file)
    except MeshStartError as e:  # the hosts or ranks at fault and why: our frames add nothing
        raise UsageError(f"%mesh up: {e}") from None


def _start(launcher: str, dims: dict[str, int], kwargs: dict[str, Any], hostfile: str | None,
           listen: str | None, key_file: str | None) -> Any:
    import viceroy as vr
    from viceroy.runtime.slurm import SlurmError

    if launcher == "local":
        return vr.Mesh.local(**kwargs)
    if launcher == "ssh":
        return _start_ssh(dims, kwargs, str(hostfile), listen)
    params: dict[str, Any] = {k: v for k, v in kwargs.items() if k not in dims}
    try:
        if launcher == "slurm":
            other: dict[str, Any] = {k: v for k, v in dims.items() if k != "hosts"}
            return vr.Mesh.slurm(dims.get("hosts"), interface=listen or "127.0.0.1", **other, **params)
        return vr.Mesh.attach(listen=listen or "127.0.0.1:7777", key_file=key_file, **dims, **params)
    except (SlurmError, OSError, ValueError, TypeError) as e:
        raise UsageError(f"%mesh up --launcher {launcher}: {e}") from None


def _start_ssh(dims: dict[str, int], kwargs: dict[str, Any], hostfile: str, listen: str | None) -> Any:
    import viceroy as vr
    from viceroy.runtime.ssh import read_hostfile

    try:
        n = len(read_hostfile(hostfile))
    except (OSError, ValueError) as e:
        raise UsageError(f"%mesh up: {e}") from None
    if dims.get("hosts", n) != n:
        raise UsageError(f"%mesh up: hosts={dims['hosts']} but {hostfile} lists {n} host(s)")
    params: dict[str, Any] = {k: v for k, v in kwargs.items() if k not in dims}
    params.update({k: v for k, v in dims.items() if k != "hosts"})
    try:
        return vr.Mesh.ssh(hostfile, interface=listen or "127.0.0.1", **params)
    except (OSError, ValueError, TypeError) as e:  # a controller on loopback for other machines, …
        raise UsageError(f"%mesh up --launcher ssh: {e}") from None


def sync_hosts(mesh: Any, src: str, dest: str | None, dry_run: bool) -> list[Synced]:
    """``%mesh sync``: rsync `src` to every host of the ssh mesh that is up (lost hosts are
    skipped, saying so)."""
    from viceroy.runtime.ssh import SshLauncher

    launcher = getattr(getattr(mesh, "_controller", None), "launcher", None)
    if not isinstance(launcher, SshLauncher):
        raise UsageError(
            "%mesh sync copies files to the hosts of an ssh mesh (`%mesh up ... --launcher ssh`); "
            "Slurm clusters and attached hosts usually share a filesystem"
            + ("" if mesh is None else f" (this mesh's launcher: {getattr(launcher, 'name', '?')})")
        )
    lost = frozenset(mesh._controller.lost_hosts())
    try:
        return launcher.sync(src, dest, dry_run, lost)
    except (OSError, RuntimeError) as e:
        raise UsageError(f"%mesh sync: {e}") from None


def sync_report(src: str, synced: list[Synced]) -> str:
    """What `%mesh sync` prints: one line per host, synced or skipped (a lost host)."""
    return "\n".join(f"not synced to {s}" if s.skipped else f"synced {src} -> {s}" for s in synced)
