"""`viceroy.device_mesh()`: the mesh as a torch ``DeviceMesh``, on a rank.

DTensor, FSDP2 and tensor parallelism take a ``DeviceMesh``; this one has the viceroy mesh's dim
names and sizes (``{"dp": 2, "tp": 2}`` gives ``mesh_dim_names=("dp", "tp")``), so
``device_mesh()["tp"]`` is the tensor-parallel group of this rank.
"""

from __future__ import annotations

from typing import Any

# Per device type and dims: (the default process group it was made over, the DeviceMesh).
_meshes: dict[tuple[str, tuple[tuple[str, int], ...]], tuple[Any, Any]] = {}


def device_mesh(device_type: str | None = None) -> Any:
    """This rank's torch ``DeviceMesh`` over the whole viceroy mesh, made once per shape and
    cached while torch's default process group stays the same (after
    ``vr.reinit_process_group()``, or a destroy and init, it is made again over the new one). Called in a call made on a view that covers every rank in order (a split, rename
    or flatten of the mesh), it has the view's dims: ``mesh.split(gpus=("dp", "tp"), tp=2)``.

    Initialises torch's default process group first if user code has not (``env://``: the
    mesh sets RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT): gloo on CPU, nccl on GPUs.
    `device_type`: "cuda" where the rank has a GPU, else "cpu", unless given; one that is no
    torch device type, or "cuda" on a rank without a GPU, raises ValueError before any group is made.

    >>> dm = vr.device_mesh()          # on Mesh.local(dp=2, tp=2)
    >>> dm["tp"].size()
    2
    """
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    from viceroy.runtime.collectives import install_torch_hooks
    from viceroy.runtime.context import context

    ctx = context()
    kind = device_type or ("cuda" if torch.cuda.is_available() else "cpu")
    if device_type is not None:
        _check_device_type(device_type)
    key = (kind, tuple(ctx.dims.items()))
    cached = _meshes.get(key)
    if cached is not None and dist.is_initialized() and cached[0] is dist.group.WORLD:
        return cached[1]
    if ctx.ranks is not None and ctx.ranks != tuple(range(ctx.world_size)):
        raise ValueError(
            f"device_mesh() spans every rank of the mesh, in order; this call runs on a view of "
            f"{len(ctx.ranks)} of its {ctx.world_size} ranks: call it on the whole mesh, or on a "
            "split, rename or flatten of it")
    install_torch_hooks()
    if kind == "cuda" and ctx.device is not None and not torch.cuda.is_initialized():
        # Before DeviceMesh picks one by global rank % GPUs per host: the rank's own, by its
        # local rank (the same on even hosts; right on uneven ones). viceroy.runtime.devices.
        # (Once CUDA runs, the rank's GPU is current already, or the one the user chose.)
        torch.cuda.set_device(ctx.device)
    if not dist.is_initialized():
        dist.init_process_group(backend="nccl" if kind == "cuda" else "gloo")
    dm = init_device_mesh(kind, tuple(ctx.dims.values()), mesh_dim_names=tuple(ctx.dims))
    _meshes[key] = (dist.group.WORLD, dm)
    return dm


def _check_device_type(kind: Any) -> None:
    """Refuse, before any group is made, a device type that is none (``"gpu"``) or that this
    rank has no device of (``"cuda"`` without a GPU: init_process_group would fail with "NCCL
    not built in", or with a DeviceMesh of devices that are not there)."""
    import torch

    what = f"device_mesh(device_type={kind!r})"
    try:
        torch.device(kind)
    except (RuntimeError, TypeError):
        raise ValueError(f"{what}: not a torch device type; use 'cuda' (the rank's GPU) or 'cpu'") from None
    if kind == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"{what}: this rank has no GPU; use 'cpu', or leave device_type out (the rank's "
                         "GPU where it has one, else the CPU)")
