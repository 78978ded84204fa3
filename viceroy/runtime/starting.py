"""Starting a mesh: on this machine (`Mesh.local`), over ssh, as Slurm job steps, or with agents
started by anything else (`Mesh.attach`). A mixin of `Mesh`: each returns the new mesh."""

from __future__ import annotations

import difflib
import importlib.util
import os
import sys
import warnings
from collections.abc import Iterable, Mapping
from typing import Any, Self

from viceroy.runtime.arguments import check_count, check_flag, check_seconds
from viceroy.runtime.controller import Controller
from viceroy.runtime.errors import PreloadWarning
from viceroy.runtime.launcher import Launcher, LocalLauncher, check_env
from viceroy.runtime.shape import Shape

_START_OPTIONS = ("echo", "preload", "output_limit", "startup_timeout", "env")
# Every keyword a constructor takes that is not a dim: a keyword dim named like one of these is
# a typo far more often than a dim (``startup_timout=30`` would start 30x the ranks).
_OPTION_NAMES = (*_START_OPTIONS, "interface", "launcher", "python", "port", "identity", "ssh_options",
                 "agents_per_node", "srun_options", "salloc_options", "allocation_timeout", "listen", "key_file")


def _check_keyword_dims(named_dims: dict[str, Any]) -> None:
    for name in named_dims:
        close = difflib.get_close_matches(name, _OPTION_NAMES, n=1, cutoff=0.8)
        if close and close[0] != name:
            raise TypeError(
                f"{name}={named_dims[name]!r} would be a dim of the mesh; did you mean the option "
                f"{close[0]}=? A dim really named {name!r} can be given in a dict: "
                f"Mesh.local({{{name!r}: {named_dims[name]!r}}})"
            )


def _preload_list(preload: list[str] | str | None) -> list[str]:
    """The modules to preload: None -> torch when installed; a string is one name or several
    joined by commas, ``"none"`` (as the magic's ``--preload none``) none at all."""
    if preload is None:
        return ["torch"] if importlib.util.find_spec("torch") is not None else []
    if not isinstance(preload, str | list | tuple):
        raise TypeError(f"preload={preload!r}: give a list of module names, e.g. preload=['torch', 'numpy'] "
                        "(or 'torch,numpy'), or preload=[] for none")
    names = [n.strip() for n in preload.split(",")] if isinstance(preload, str) else list(preload)
    if names == ["none"]:
        return []
    for name in names:
        if not isinstance(name, str) or not all(part.isidentifier() for part in name.split(".")):
            raise ValueError(
                f"preload={preload!r}: {name!r} is not a module name; give module names, e.g. "
                "preload=['torch', 'numpy'] (or 'torch,numpy'), or preload=[] for none"
            )
    return names


class MeshStarts:
    """`Mesh`'s constructors; `Mesh.local(gpus=4)` and the others start processes and return
    once every rank answers."""

    def __init__(self, controller: Controller, shape: Shape) -> None:  # Mesh's own
        raise NotImplementedError

    @classmethod
    def local(
        cls,
        dims: dict[str, int] | None = None,
        /,
        *,
        echo: bool = True,
        interface: str = "127.0.0.1",
        preload: list[str] | str | None = None,
        output_limit: int = 1 << 20,
        startup_timeout: float = 120.0,
        env: dict[str, str] | None = None,
        launcher: Launcher | None = None,
        **named_dims: int,
    ) -> Self:
        """Start ranks on this machine, one per position of `dims` (e.g. ``gpus=4`` or
        ``dp=2, tp=2``); returns when every rank answers.

        echo: print rank output here as ``[rank] line`` (the kernel turns this off and streams
            output into cells instead).
        preload: modules the ranks' template process imports once before forking them; default
            ``["torch"]`` when torch is installed, so ``import torch`` on a rank is instant;
            ``[]`` (or ``"none"``) for none. A string may name several: ``"torch,numpy"``. A
            module that cannot be imported is a `PreloadWarning` naming it; the mesh starts.
        output_limit: bytes of output forwarded per rank per call; the rest is dropped with a
            notice.
        A leading dim named ``hosts`` gets one agent per host index (the layout many-host
        launchers use), even on one machine. Dims may also come as a dict,
        ``Mesh.local({"gpus": 4})``, e.g. when a dim is named like one of the options above.
        """
        if dims is not None and not isinstance(dims, Mapping):  # Mesh.local(4), Mesh.local(["gpus"])
            raise TypeError(f"Mesh.local takes the dims as keywords or a dict of NAME: SIZE, e.g. Mesh.local(gpus=4) "
                            f"or Mesh.local({{'gpus': 4}}); got {dims!r}")
        if dims and named_dims:
            raise TypeError("give dims either as a dict or as keywords, not both")
        _check_keyword_dims(named_dims)
        dims = dict(dims or named_dims)
        if not dims:
            raise ValueError("give the mesh's dims, e.g. Mesh.local(gpus=4) or Mesh.local(dp=2, tp=2)")
        shape = Shape(dims)  # validates names and sizes
        output_limit = check_count(output_limit, "output_limit", "bytes per rank per call")
        startup_timeout = check_seconds(startup_timeout, "startup_timeout", none=None)
        check_flag(echo, "echo")
        if launcher is not None and not isinstance(launcher, Launcher):
            raise TypeError(f"launcher={launcher!r}: give a Launcher object, or start through Mesh.ssh, Mesh.slurm "
                            "or Mesh.attach (%mesh up --launcher ssh|slurm|attach)")
        if not isinstance(interface, str):
            raise TypeError(f"interface={interface!r}: give an address of this machine that every host can reach, "
                            "e.g. interface='10.0.0.1' (127.0.0.1, the default, when the mesh is on this machine alone)")
        check_env(env)  # (the controller checks it too, as given)
        env = dict(env or {})
        controller = Controller(
            shape.dims,
            launcher or LocalLauncher(),
            interface=interface,
            echo=echo,
            output_limit=output_limit,
            preload=_preload_list(preload),
            env=env,
        )
        controller.start(startup_timeout)
        for name, why in controller.preload_failures.items():
            warnings.warn(PreloadWarning(
                f"could not preload {name} ({why}): the ranks import it themselves, when their code does; "
                "check the name, or leave it out of preload"), stacklevel=2)
        return cls(controller, shape)

    @classmethod
    def ssh(
        cls,
        hosts: list[str] | str | os.PathLike[str],
        *,
        python: str | None = None,
        port: int | None = None,
        identity: str | None = None,
        ssh_options: list[str] | None = None,
        interface: str = "127.0.0.1",
        **kwargs: Any,
    ) -> Self:
        """Start one agent per host over ssh; dims are ``hosts=len(hosts)`` then yours:
        ``Mesh.ssh(["node1", "node2"], gpus=8)``. `hosts` may be a hostfile path (one host per
        line, optionally ``python=PATH``). `interface` is where the controller listens: an
        address every host can reach (loopback by default). Other keywords as `Mesh.local`.
        """
        from viceroy.runtime.ssh import SshLauncher, read_hostfile

        host_list: Any  # a list of names or SshHosts, or what SshLauncher refuses saying why
        if isinstance(hosts, (str, os.PathLike)):
            if not os.path.isfile(hosts):
                raise FileNotFoundError(
                    f"Mesh.ssh({str(hosts)!r}): there is no hostfile {str(hosts)!r} here; a host name goes in a "
                    f"list, Mesh.ssh([{str(hosts)!r}], ...)"
                )
            host_list = list(read_hostfile(os.fspath(hosts)))
        else:
            ordered = isinstance(hosts, Iterable) and not isinstance(hosts, bytes | Mapping | set | frozenset)
            host_list = list(hosts) if ordered else hosts  # else the launcher says what is wrong
        launcher = SshLauncher(
            host_list, python=sys.executable if python is None else python, port=port, identity=identity,
            options=() if ssh_options is None else ssh_options,
        )
        if launcher.identity is not None and not os.path.isfile(os.path.expanduser(launcher.identity)):
            why = "a directory" if os.path.isdir(os.path.expanduser(launcher.identity)) else "no such file"
            raise FileNotFoundError(f"identity={launcher.identity!r}: {why}; name the private key file ssh -i takes "
                                    "(ssh would go on without it, and the login fail)")
        _check_keyword_dims(kwargs)
        options = {k: kwargs.pop(k) for k in _START_OPTIONS if k in kwargs}
        return cls.local({"hosts": len(host_list), **kwargs}, launcher=launcher, interface=interface, **options)

    @classmethod
    def slurm(
        cls,
        hosts: int | None = None,
        *,
        agents_per_node: int = 1,
        python: str | None = None,
        srun_options: list[str] | None = None,
        salloc_options: list[str] | None = None,
        allocation_timeout: float = 300.0,
        interface: str = "127.0.0.1",
        **kwargs: Any,
    ) -> Self:
        """One agent per node as Slurm job steps (`srun`); dims are ``hosts`` then yours:
        ``Mesh.slurm(hosts=4, gpus=8)``. Inside an allocation (salloc/sbatch) its nodes are used
        and `hosts` defaults to their number; outside one, ``salloc`` asks for one (with
        `salloc_options`, e.g. ``["-p", "gpu", "-t", "60"]``; waiting at most
        `allocation_timeout` seconds), held while this process lives and ended at shutdown.
        That request names nodes and tasks only: where GPUs are scheduled resources, ask for
        them too, e.g. ``salloc_options=["--gpus-per-node=8"]`` (the agents' steps get every
        GPU of the allocation on their node). `agents_per_node` > 1 puts several hosts on each node. `interface`: an address every node
        can reach (loopback by default: one-node clusters only). Other keywords as `Mesh.local`.
        """
        from viceroy.runtime.slurm import SlurmLauncher

        launcher = SlurmLauncher(
            sys.executable if python is None else python, agents_per_node,
            () if srun_options is None else srun_options, () if salloc_options is None else salloc_options,
            allocation_timeout,
        )
        hosts = SlurmLauncher.hosts_in_allocation(agents_per_node) if hosts is None else hosts
        if hosts is None:
            raise TypeError("outside a Slurm allocation, say how many hosts: Mesh.slurm(hosts=4, gpus=8)")
        _check_keyword_dims(kwargs)
        options = {k: kwargs.pop(k) for k in _START_OPTIONS if k in kwargs}
        try:
            return cls.local({"hosts": hosts, **kwargs}, launcher=launcher, interface=interface, **options)
        except BaseException:
            launcher.close()
            raise

    @classmethod
    def attach(
        cls,
        *,
        listen: str = "127.0.0.1:7777",
        key_file: str | None = None,
        **kwargs: Any,
    ) -> Self:
        """Wait on `listen` for agents started by anything else (Kubernetes, torchrun, mpirun,
        a shell), one per host: ``Mesh.attach(hosts=2, gpus=8, listen="0.0.0.0:7777",
        key_file="mesh.key")``, then on each host ``viceroy agent --connect ADDR:7777 --key-file
        mesh.key``. The key file is created (mode 0600) if missing; without one the key comes
        from $VICEROY_MESH_KEY, else from ~/.viceroy/attach-PORT.key (made on first use).
        Listening beyond loopback is opt-in (name the interface).
        Returns when every rank answers (`startup_timeout`); other keywords as `Mesh.local`.
        """
        from viceroy.runtime.attach import AttachLauncher

        if "hosts" not in kwargs:
            raise TypeError("Mesh.attach needs hosts=N (one agent per host), e.g. Mesh.attach(hosts=2, gpus=8)")
        _check_keyword_dims(kwargs)
        Shape({"hosts": kwargs["hosts"], **{k: v for k, v in kwargs.items() if k not in _START_OPTIONS}})  # before
        launcher = AttachLauncher(listen, key_file)  # it listens, and makes a key file
        options = {k: kwargs.pop(k) for k in _START_OPTIONS if k in kwargs}
        print(f"viceroy: waiting for {kwargs['hosts']} agent(s); on each host run `{launcher.command()}`")
        dims = {"hosts": kwargs.pop("hosts"), **kwargs}
        try:
            return cls.local(dims, launcher=launcher, interface=launcher.interface, **options)
        except BaseException:
            launcher.close()
            raise

