"""``with mesh.activate():``: torch calls on the controller make and use MeshTensors.

A torch function mode routes ops on MeshTensors to their handler, and factory functions
(``torch.randn(...)`` with no tensor to go by) to the active view's `Engine`.
``torch.manual_seed`` is plain Python, which the mode does not see: it is wrapped, once, so that
under ``activate()`` it seeds the ranks too; outside ``activate()`` it is torch's own. So is
``torch.utils.swap_tensors``, which torch runs without asking the tensor engine: given a
MeshTensor it is refused with what to do instead (as ``MeshTensor.set_``).
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch.overrides import TorchFunctionMode
from torch.utils import _pytree as pytree

from viceroy.runtime.tensors.engine import Engine
from viceroy.runtime.tensors.mesh_tensor import MeshTensor, _general, torch_function
from viceroy.runtime.tensors.placement import is_own
from viceroy.runtime.tensors.refusals import repointed

# Torch functions that make tensors from nothing: under activate() they make MeshTensors.
FACTORIES = {
    torch.randn, torch.rand, torch.randint, torch.zeros, torch.ones, torch.empty, torch.full,
    torch.arange, torch.linspace, torch.eye, torch.tensor, torch.randperm, torch.normal,
    torch.as_tensor, torch.asarray, torch.logspace, torch.scalar_tensor, torch.empty_strided,
    torch.tril_indices, torch.triu_indices, torch.hann_window, torch.hamming_window,
    torch.blackman_window, torch.bartlett_window, torch.kaiser_window,
}


class _ActivateMode(TorchFunctionMode):
    def __init__(self, engine: Engine) -> None:
        super().__init__()
        self.engine = engine

    # Ops on MeshTensors go straight to the tensors' handler (the one Python call of the short
    # road); calling func again would cost a second round of torch's dispatch.
    __torch_function__ = torch_function

    def _fallback(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any] | None) -> Any:
        kwargs = kwargs or {}
        if func not in FACTORIES:
            if any(type(x) is MeshTensor for x in args):
                return _general(func, args, kwargs)
            return func(*args, **kwargs)
        if not any(isinstance(x, MeshTensor) for x in pytree.tree_leaves((args, kwargs))):
            device = kwargs.get("device")
            if device is not None:
                # "cuda" (a string or a torch.device, no index), or a MeshTensor's own device
                # (``device=x.device``, which reads meta here): the rank's own device.
                if not is_own(device):
                    return func(*args, **kwargs)  # an explicit device: a local tensor, on purpose
                kwargs = {**kwargs, "device": "cuda"}
            return self.engine.factory(func, args, kwargs)
        return func(*args, **kwargs)


@contextmanager
def activate(engine: Engine) -> Iterator[Engine]:
    with _ActivateMode(engine):
        yield engine
    engine.flush()


def _active_engine() -> Engine | None:
    """The engine of the innermost ``activate()`` of this thread, if any."""
    for mode in reversed(torch.overrides._get_current_function_mode_stack()):
        if isinstance(mode, _ActivateMode):
            return mode.engine
    return None


def _manual_seed_everywhere(seed: Any) -> Any:
    generator = _manual_seed(seed)  # first: a seed torch refuses is refused here, and sent nowhere
    engine = _active_engine()
    if engine is not None:
        engine.seed(int(seed))
    return generator


# Wrapped once per process (see the module's docstring).
_manual_seed = getattr(torch.random.manual_seed, "__viceroy_wrapped__", torch.random.manual_seed)
if not hasattr(torch.manual_seed, "__viceroy_wrapped__"):
    _wrapper = functools.wraps(_manual_seed)(_manual_seed_everywhere)
    _wrapper.__viceroy_wrapped__ = _manual_seed  # type: ignore[attr-defined]
    torch.manual_seed = _wrapper
    torch.random.manual_seed = _wrapper


def _swap_tensors_checked(t1: Any, t2: Any) -> Any:
    if isinstance(t1, MeshTensor) or isinstance(t2, MeshTensor):
        raise RuntimeError(repointed("torch.utils.swap_tensors(...)"))
    return _swap_tensors(t1, t2)


_swap_tensors = getattr(torch.utils.swap_tensors, "__viceroy_wrapped__", torch.utils.swap_tensors)
if not hasattr(torch.utils.swap_tensors, "__viceroy_wrapped__"):
    _swap_wrapper = functools.wraps(_swap_tensors)(_swap_tensors_checked)
    _swap_wrapper.__viceroy_wrapped__ = _swap_tensors  # type: ignore[attr-defined]
    torch.utils.swap_tensors = _swap_wrapper
