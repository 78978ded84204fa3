"""The tensor engine on a rank: a table of this rank's tensors by id, and the ops that fill it.

Functions here are sent by reference (this module is importable on every rank) and run on the
rank's main thread, in order with its other calls. What the controller asks of one tensor of
the table (as a handle, fetched, summarised) is in `rank_reads`.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any

from viceroy.runtime import devices, handles, heap
from viceroy.runtime.context import context
from viceroy.runtime.tensors.placement import OwnDevice

_TABLE = "__viceroy_tensors__"
_FAILED = "__viceroy_failed_tensors__"


@dataclass(frozen=True)
class Slot:
    """Stands for tensor `id` of the rank's table inside an op's arguments."""

    id: int


# A queued op is a tuple (func, args, kwargs, slots, out, where, factory):
#   args, kwargs   the call's arguments; kwargs may be None; with slots None they may hold
#                  `placement.OwnDevice`, this rank's device (``y.to(x.device)``)
#   slots          positions in `args` holding tensor ids (flat arguments), or None: the
#                  arguments hold `Slot`s anywhere in their trees
#   out            the id the result gets (int), None (keep nothing), or a list with an id or
#                  None per leaf of the result
#   where          (file, line) of the controller line that issued it
#   factory        a tensor made from nothing: it goes on this rank's device unless placed
Op = tuple


class OpFailed(RuntimeError):
    """An op issued on the controller failed on this rank. Its message names the op, the
    controller line that issued it and why: the controller shows it as it is, without this
    type's name or the engine's frames (`execution.format_user_traceback`)."""

    says_all = True


def table() -> dict[int, Any]:
    tab: dict[int, Any] = context().namespace.setdefault(_TABLE, {})
    return tab


def failures() -> dict[int, str]:
    """Tensor id -> why it has no value on this rank (see `apply_batch`)."""
    failed: dict[int, str] = context().namespace.setdefault(_FAILED, {})
    return failed


def rank_device() -> Any:
    """Where this rank's tensors live: its own GPU (`viceroy.runtime.devices`), or the CPU."""
    import torch

    if not torch.cuda.is_available():
        return torch.device("cpu")
    own = devices.own()
    return torch.device("cuda") if own is None else torch.device("cuda", own)


def pack_ops(ops: list[Op]) -> bytes | list[Op]:
    """Ops pickled with the standard (C) pickler: torch functions and methods travel by name,
    several times faster than through cloudpickle. Ops holding code defined in a notebook
    (a lambda as an argument) need cloudpickle: those stay a list."""
    import pickle

    try:
        return pickle.dumps(ops, protocol=5)
    except Exception:
        return ops


def apply_batch(packed: bytes | list[Op], frees: list[int], start: tuple[Any, bool] | None = None,
                stop_on_failure: bool = False, first_op: tuple[str, str, int] | None = None) -> None:
    """Run one batch of ops on this rank, in order. What happens when an op fails:

    - An op that raises has *failed*. What it should have produced has no value on this rank
      from then on: the tensors it makes, and the ones it changes in place (``x.add_(...)``,
      ``x[i] = v``, ``out=x``), since their values are no longer what the controller's program
      says. Each is marked with the failure ("add_ (issued at cell.py, line 4) failed: ...").
    - An op that uses a tensor with no value does not run and fails the same way: what it
      should have produced is marked with the *first* failure, so every message names the op
      that failed first and the controller line that issued it.
    - Every other op runs as if nothing had failed: one failed op never loses unrelated work,
      and ranks where nothing failed do exactly what ranks where something failed do with the
      rest of the batch.
    - The batch raises at its end with its first failure (which surfaces at the controller's
      next fetch or sync); later fetches, `inspect`, `to_mesh` or rank code given such a tensor
      raise with the failure too, never an old value. Freeing the tensor (dropping the
      MeshTensor) forgets the failure.
    - Interrupted part-way (Ctrl-C, or fail-fast after another rank failed), the op running and
      the ops not yet run are marked as interrupted; the interrupt names the op running and its
      line (`first_op`, sent apart, while a long batch is still unpacked: see `_unpacked`).
    - `stop_on_failure` (batches of collectives): the batch stops at its first failure and
      marks the ops after it as not run, so that this rank never joins a later collective that
      its peers, still waiting in the failed one, would pair with the wrong one.

    `start`: (default dtype, grad mode) the controller had when the batch's first op was
    issued (None: torch's defaults, float32 with grad enabled); `_modes` ops in the batch change
    them as the controller's did. The rank's own modes are put back after the batch.
    """
    import torch
    from torch.utils import _pytree as pytree

    ops = _unpacked(packed, frees, first_op)

    tab = table()
    failed = failures()
    device = rank_device()
    local = device.type != "cpu"  # a controller's local tensor in an op goes to this device

    def resolve(x: Any) -> Any:
        if isinstance(x, Slot):
            return _value(tab, failed, x.id)
        if type(x) is OwnDevice:  # ``y.to(x.device)``, ``x.cuda()`` on the controller
            return device
        if local and isinstance(x, torch.Tensor):
            return x.to(device)
        return x

    first: tuple[str, BaseException | None] | None = None
    n_failed = 0
    i = 0
    saved = (torch.get_default_dtype(), torch.is_grad_enabled())
    dtype, grad = start if start is not None else (torch.float32, True)
    if (dtype, grad) != saved:
        torch.set_default_dtype(dtype)
        torch.set_grad_enabled(grad)
    try:
        for i, op in enumerate(ops):
            func, args, kwargs, slots, out, where, factory = op
            try:
                if slots is None:
                    a, kw = pytree.tree_map(resolve, (args, kwargs))
                elif slots:
                    a, kw = list(args), kwargs
                    for j in slots:
                        tid = a[j]
                        try:
                            a[j] = tab[tid]
                        except KeyError:
                            raise _Unmade(failed.get(tid)) from None
                else:
                    a, kw = args, kwargs
                if factory and kw.get("device") in (None, "cuda"):
                    kw = {**kw, "device": device}
                result = func(*a, **kw) if kw else func(*a)
            except Exception as exc:
                issued = f"{_name(func)} (issued at {where[0]}, line {where[1]})"
                report: tuple[str, BaseException | None]
                if isinstance(exc, _Unmade):
                    if exc.root is None:  # it uses a tensor this rank never had
                        root = f"{issued} did not run: it uses a tensor that {_MISSING}"
                        report = (root, None)
                    else:  # it uses what a failed op should have made
                        root = exc.root
                        report = (f"{issued} did not run: it uses a result of an op that failed: {root}", None)
                else:
                    root = f"{issued} failed: {type(exc).__name__}: {exc}"
                    report = (root, exc)
                _mark(tab, failed, op, root)
                n_failed += 1
                if first is None:
                    first = report
                if stop_on_failure:
                    _mark_rest(tab, failed, ops, i + 1, f"did not run: an earlier collective of its batch failed: {root}")
                    break
                continue
            if type(out) is int:
                tab[out] = result
            elif out is not None:
                for tid, leaf in zip(out, pytree.tree_leaves(result), strict=False):
                    if tid is not None:
                        tab[tid] = leaf
    except BaseException as exc:
        # Interrupted: the op running may have half run, and the rest never will. A second
        # interrupt (they are repeated until the call ends) must not leave this half done.
        while True:
            try:
                func, where = ops[i][0], ops[i][5]
                at = f"{_name(func)} (issued at {where[0]}, line {where[1]})"
                _mark(tab, failed, ops[i], f"{at} was interrupted")
                _mark_rest(tab, failed, ops, i + 1, f"did not run: the ranks were interrupted before it, at {at}")
                if isinstance(exc, KeyboardInterrupt) and not exc.args:  # where, for the controller's report
                    exc.args = (f"{_name(func)}, issued at {where[0]}, line {where[1]}",)
                break
            except KeyboardInterrupt:
                continue
        raise
    finally:
        # Frees were recorded after every op of this batch that uses them was queued: apply
        # them last.
        heap.freed(_free(tab, failed, frees))
        if (torch.get_default_dtype(), torch.is_grad_enabled()) != saved:
            torch.set_default_dtype(saved[0])
            torch.set_grad_enabled(saved[1])
    if first is not None:
        msg, cause = first
        if n_failed > 1:
            msg += f"\n({n_failed - 1} more op{'s' if n_failed > 2 else ''} of this batch failed or did not run; " \
                   "every op that did not depend on a failed one ran)"
        raise OpFailed(msg) from cause


def _unpacked(packed: bytes | list[Op], frees: list[int], first_op: tuple[str, str, int] | None) -> list[Op]:
    """The batch's ops. Interrupted meanwhile, before any op ran: its frees are applied, its
    tensors do not exist here, and the interrupt names `first_op` (name, file, line)."""
    import pickle

    try:
        return pickle.loads(packed) if isinstance(packed, bytes) else packed
    except KeyboardInterrupt as exc:
        heap.freed(_free(table(), failures(), frees))  # as after the batch (they were for its ops)
        if first_op is None or exc.args:
            raise
        # A fresh one: the frames it hit in (torch's unpickling code) are not where the user was.
        raise KeyboardInterrupt("{}, issued at {}, line {}, before it began: the rank was still unpacking its "
                                "batch of ops".format(*first_op)) from None


def _modes(dtype: Any, grad: bool) -> None:
    """An op of its own: the controller's default dtype or grad mode changed (``torch.
    set_default_dtype``, ``torch.no_grad()``); the ops after it run as the controller checked
    them."""
    import torch

    torch.set_default_dtype(dtype)
    torch.set_grad_enabled(grad)


def seeded(seed: int) -> None:
    """``torch.manual_seed`` issued under ``activate()``: the same seed on every rank."""
    import torch

    torch.manual_seed(seed)


class _Unmade(Exception):
    """An op's input has no value on this rank (`root`: the failure that marked it; None: this
    rank never had it)."""

    def __init__(self, root: str | None) -> None:
        super().__init__(root)
        self.root = root


# Dunders that change their first argument in place (besides ``x.add_``-style names).
IN_PLACE_DUNDERS = frozenset({
    "__setitem__", "__iadd__", "__isub__", "__imul__", "__itruediv__", "__ifloordiv__", "__imod__",
    "__ipow__", "__iand__", "__ior__", "__ixor__", "__ilshift__", "__irshift__", "__imatmul__",
})


def _mark(tab: dict[int, Any], failed: dict[int, str], op: Op, why: str) -> None:
    """What `op` should have produced has no value here, because of `why`: the ids it makes,
    and the tensors it changes in place (its first argument for ``x.add_``/``x[i] = v``, and
    ``out=``)."""
    func, args, kwargs, slots, out, _where, _factory = op
    ids: list[int] = []
    if type(out) is int:
        ids.append(out)
    elif out is not None:
        ids.extend(t for t in out if t is not None)
    name = _name(func)
    if name in IN_PLACE_DUNDERS or (name.endswith("_") and not name.startswith("__")):
        first: Any = args[0] if args else None
        if slots and 0 in slots:
            ids.append(first)
        elif isinstance(first, Slot):
            ids.append(first.id)
    if kwargs:
        outs = kwargs.get("out")
        for x in outs if isinstance(outs, list | tuple) else (outs,):
            if isinstance(x, Slot):
                ids.append(x.id)
    for tid in ids:
        tab.pop(tid, None)
        failed[tid] = why


def lost(marks: dict[int, str]) -> None:
    """Tensors of ops that never ran on any rank (their batch was not sent: ranks of the view
    were dead) have no value here, for the reason given for each (see `Engine._not_sent`); one
    that failed before keeps that first failure."""
    tab, failed = table(), failures()
    for tid, why in marks.items():
        tab.pop(tid, None)
        failed.setdefault(tid, why)


def _mark_rest(tab: dict[int, Any], failed: dict[int, str], ops: list[Op], start: int, why: str) -> None:
    for op in ops[start:]:
        func, where = op[0], op[5]
        _mark(tab, failed, op, f"{_name(func)} (issued at {where[0]}, line {where[1]}) {why}")


# (A tensor id means nothing to the user: the op or the fetch that meets one names it.)
_MISSING = ("does not exist on this rank: the rank was restarted since it was made, or the ops that made it "
            "were interrupted before they started; make it again")


def _free(tab: dict[int, Any], failed: dict[int, str], frees: list[int]) -> int:
    """Forget tensors `frees` (and their names bound for rank code); the bytes of CPU memory
    they held (a view counts its whole storage)."""
    import torch

    ns = context().namespace
    nbytes = 0
    for tid in frees:
        t = tab.pop(tid, None)
        failed.pop(tid, None)
        if t is None:
            continue
        handles.unbind(ns, tid, t)
        if isinstance(t, torch.Tensor) and t.device.type == "cpu":
            with contextlib.suppress(Exception):  # a tensor without storage (sparse, ...)
                nbytes += t.untyped_storage().nbytes()
    return nbytes


def _value(tab: dict[int, Any], failed: dict[int, str], tid: int) -> Any:
    try:
        return tab[tid]
    except KeyError:
        raise _Unmade(failed.get(tid)) from None


def lookup(tab: dict[int, Any], tid: int) -> Any:
    """Tensor `tid` for a fetch, a handle, `inspect` or `to_mesh`: OpFailed naming why it has no
    value (the op that failed first, and its line)."""
    try:
        return tab[tid]
    except KeyError:
        why = failures().get(tid)
        if why is None:
            raise OpFailed(f"this tensor {_MISSING}") from None
        raise OpFailed(f"this tensor has no value here: {why}") from None


def _name(func: Any) -> str:
    """An op's name in messages: the name the user called it by (``op_name``: ``vr.reduce`` for
    the engine's own `rank_ops.reduced`), else its function's."""
    return str(getattr(func, "op_name", None) or getattr(func, "__name__", func))


def count() -> int:
    """How many engine tensors this rank holds (for tests and `inspect`)."""
    return len(table())
