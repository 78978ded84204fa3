"""Starting the notebook's mesh with a launcher (``%mesh up ... --launcher local|ssh|slurm|attach``)
and copying files to its hosts (``%mesh sync``); every mistake is a one-line UsageError."""

from __future__ import annotations

import os
import shlex
from typing import TYPE_CHECKING, Any

from IPython.core.error import UsageError

if TYPE_CHECKING:
    from viceroy.runtime.ssh import Synced


# The options of `%mesh up` that go to one launcher: (launcher, its keyword in Mesh.ssh/Mesh.slurm)
LAUNCHER_OPTIONS: dict[str, tuple[str, str]] = {
    "--identity": ("ssh", "identity"),
    "--ssh-port": ("ssh", "port"),
    "--ssh-options": ("ssh", "ssh_options"),
    "--salloc-options": ("slurm", "salloc_options"),
    "--srun-options": ("slurm", "srun_options"),
    "--agents-per-node": ("slurm", "agents_per_node"),
}


def check_launcher_options(
    launcher: str,
    dims: dict[str, int],
    hostfile: str | None,
    listen: str | None,
    key_file: str | None,
    options: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Which ``%mesh up`` options go with which launcher, and all that can be checked of them
    without starting anything (a hostfile that reads, a key file's directory, the form of
    --listen): a mistake is a one-line UsageError naming the option, raised before the running
    mesh is stopped. Returns `options` (``{"--identity": "k", ...}``) as keywords of
    Mesh.ssh / Mesh.slurm."""
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
    kwargs: dict[str, Any] = {}
    for name, value in (options or {}).items():
        goes_with, keyword = LAUNCHER_OPTIONS[name]
        if launcher != goes_with:
            raise UsageError(f"%mesh up: {name} goes with --launcher {goes_with}")
        kwargs[keyword] = _check_value(name, value)
    per_node = kwargs.get("agents_per_node", 1)
    if launcher == "slurm" and isinstance(dims.get("hosts"), int) and dims["hosts"] % per_node:
        raise UsageError(f"%mesh up: hosts={dims['hosts']} does not split into nodes of --agents-per-node {per_node}: "
                         "give a multiple of it")
    if hostfile:
        _check_hostfile(hostfile, dims)
        _check_ssh_options(hostfile, kwargs)
    if launcher == "attach":
        _check_attach(listen, key_file)
    elif listen is not None:
        _check_listen(listen)
    return kwargs


def _check_listen(listen: str) -> None:
    """--listen of ssh and slurm: an address of this machine the controller can listen on."""
    from viceroy.runtime.launcher import rendezvous_env

    try:
        rendezvous_env(listen)  # binds a socket there, at once closed
    except ValueError as e:  # (or $VICEROY_MASTER_PORT, which names itself)
        text, at = str(e), f"interface={listen!r}: "
        raise UsageError(f"%mesh up: --listen {listen}: {text.removeprefix(at)}" if text.startswith(at)
                         else f"%mesh up: {text}") from None


def _check_value(name: str, value: Any) -> Any:
    if name in ("--ssh-options", "--salloc-options", "--srun-options"):
        try:
            return shlex.split(value)
        except ValueError as e:
            raise UsageError(f"%mesh up: {name} {value!r}: {e}") from None
    if name == "--ssh-port" and not 0 < value < 65536:
        raise UsageError(f"%mesh up: --ssh-port takes a port number 1-65535, got {value}")
    if name == "--agents-per-node" and value < 1:
        raise UsageError(f"%mesh up: --agents-per-node takes a positive number, got {value}")
    if name == "--identity" and not os.path.isfile(os.path.expanduser(value)):
        why = "a directory" if os.path.isdir(os.path.expanduser(value)) else "No such file or directory"
        raise UsageError(f"%mesh up: --identity {value}: {why} (name the private key file ssh -i takes)")
    return value


def _check_hostfile(hostfile: str, dims: dict[str, int]) -> None:
    from viceroy.runtime.ssh import read_hostfile

    try:
        n = len(read_hostfile(hostfile))
    except OSError as e:
        raise UsageError(f"%mesh up: --hostfile {hostfile}: {e.strerror or e}") from None
    except ValueError as e:  # it names the file (and line)
        raise UsageError(f"%mesh up: --hostfile {e}") from None
    if dims.get("hosts", n) != n:
        raise UsageError(f"%mesh up: hosts={dims['hosts']} but --hostfile {hostfile} lists {n} host(s)")


def _check_ssh_options(hostfile: str, kwargs: dict[str, Any]) -> None:
    """What ssh itself refuses of --ssh-options, --ssh-port, --identity (`ssh -G`: no connection)."""
    from viceroy.runtime.ssh import SshLauncher, read_hostfile

    launcher = SshLauncher(read_hostfile(hostfile), port=kwargs.get("port"), identity=kwargs.get("identity"),
                           options=kwargs.get("ssh_options", ()))
    try:
        launcher.check_options()
    except (OSError, ValueError) as e:
        raise UsageError(f"%mesh up: {e}") from None


def _check_attach(listen: str | None, key_file: str | None) -> None:
    from viceroy.runtime.arguments import split_address
    from viceroy.runtime.mesh_key import read_key

    if listen is not None:
        try:
            split_address(listen)
        except ValueError as e:
            why = "" if str(e).startswith("expected HOST:PORT") else f" ({str(e).partition(', in ')[0]})"
            raise UsageError(
                f"%mesh up: --listen for --launcher attach takes HOST:PORT, e.g. 0.0.0.0:7777; got {listen!r}{why}"
            ) from None
    if key_file is None:
        return
    if os.path.exists(key_file):  # it will be read: it must be the key, private
        try:
            read_key(key_file)
        except (OSError, ValueError) as e:
            text = str(e)
            text = text if text.startswith(key_file) else f"{key_file}: {text}"
            raise UsageError(f"%mesh up: --key-file {text}") from None
        return
    folder = os.path.dirname(key_file) or "."
    if not os.path.isdir(folder):
        raise UsageError(
            f"%mesh up: --key-file {key_file}: there is no directory {folder} to create it in "
            "(a missing key file is created, mode 0600)"
        )


def start(
    launcher: str,
    dims: dict[str, int],
    kwargs: dict[str, Any],
    hostfile: str | None = None,
    listen: str | None = None,
    key_file: str | None = None,
    launcher_kwargs: dict[str, Any] | None = None,
) -> Any:
    """The mesh `launcher` starts with these dims (`kwargs`: the dims and `Mesh.local`'s
    options; `launcher_kwargs`: Mesh.ssh's or Mesh.slurm's own, from `check_launcher_options`),
    or a UsageError that says what to fix."""
    from viceroy.runtime.errors import MeshStartError

    try:
        return _start(launcher, dims, kwargs, hostfile, listen, key_file, launcher_kwargs or {})
    except MeshStartError as e:  # the hosts or ranks at fault and why: our frames add nothing
        raise UsageError(f"%mesh up: {e}") from None


def _start(launcher: str, dims: dict[str, int], kwargs: dict[str, Any], hostfile: str | None,
           listen: str | None, key_file: str | None, launcher_kwargs: dict[str, Any]) -> Any:
    import viceroy as vr
    from viceroy.runtime.slurm import SlurmError

    if launcher == "local":
        return vr.Mesh.local(**kwargs)
    if launcher == "ssh":
        return _start_ssh(dims, kwargs, str(hostfile), listen, launcher_kwargs)
    params: dict[str, Any] = {k: v for k, v in kwargs.items() if k not in dims}
    try:
        if launcher == "slurm":
            other: dict[str, Any] = {k: v for k, v in dims.items() if k != "hosts"}
            return vr.Mesh.slurm(dims.get("hosts"), interface=listen or "127.0.0.1", **other, **params,
                                 **launcher_kwargs)
        return vr.Mesh.attach(listen=listen or "127.0.0.1:7777", key_file=key_file, **dims, **params)
    except (SlurmError, OSError, ValueError, TypeError) as e:
        raise UsageError(f"%mesh up --launcher {launcher}: {e}") from None


def _start_ssh(dims: dict[str, int], kwargs: dict[str, Any], hostfile: str, listen: str | None,
               launcher_kwargs: dict[str, Any]) -> Any:
    import viceroy as vr

    params: dict[str, Any] = {k: v for k, v in kwargs.items() if k not in dims}
    params.update({k: v for k, v in dims.items() if k != "hosts"})
    try:  # the hostfile was read by check_launcher_options
        return vr.Mesh.ssh(hostfile, interface=listen or "127.0.0.1", **params, **launcher_kwargs)
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
