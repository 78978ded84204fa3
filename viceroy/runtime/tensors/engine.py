"""The tensor engine on the controller: checks each torch op on meta tensors, queues it, and
sends queued ops to the ranks in order, in batches (one mesh call per batch, not per op).

An op that fails on a rank surfaces at the next fetch, with the controller line that issued it;
the ops after it still run unless they use what it should have made (`worker.apply_batch`).

The ranks run the ops as the controller checked them: a factory carries the dtype the
controller computed, and the controller's default dtype and grad mode (``torch.
set_default_dtype``, ``torch.no_grad()``) go with the ops. ``torch.manual_seed(s)`` under
``activate()`` seeds the controller and every rank of the view with the same `s`, as a
``torch.distributed`` script does on each of its processes (the same initial weights
everywhere); for a stream per rank, seed on the ranks: ``mesh.run("torch.manual_seed(s + rank)")``.
"""

from __future__ import annotations

import itertools
import threading
from typing import TYPE_CHECKING, Any

import torch
from torch.utils import _pytree as pytree

from viceroy.runtime.errors import MeshError
from viceroy.runtime.tensors import rank_ops, rank_reads, unsent, worker
from viceroy.runtime.tensors.mesh_tensor import (
    ANSWER,
    BATCH_MAX,
    GENERAL,
    VALUE,
    MeshTensor,
    new,
    where,
)
from viceroy.runtime.tensors.placement import placed
from viceroy.runtime.tensors.plans import CONTAINERS, Plan, factory_meta, make_plan, signature
from viceroy.runtime.tensors.refusals import (
    autocast_refused,
    check_needs_no_data,
    check_sendable,
    module_reads_grad,
)

if TYPE_CHECKING:
    from viceroy.runtime.mesh import Mesh

_NO_KEY = object()
PENDING_MAX = 64  # batches in flight before the ones that already succeeded are forgotten
# Tensor ids, unique across every engine here: views of one mesh share its ranks, and a rank
# keeps all its engine tensors in one table.
_IDS = itertools.count(1)
# The op that talks to other ranks: sent in calls of their own that interrupt every rank once one
# fails, or the others would wait in it for the failed rank (see `_send`).
_TALKER = rank_ops.reduced
_MODES = worker._modes
_default_dtype = torch.get_default_dtype
_grad_enabled = torch.is_grad_enabled
_autocast = torch._C._is_any_autocast_enabled


def engine_for(mesh: Mesh) -> Engine:
    """The engine of `mesh`'s view: one per view shape, so that equal views (two calls of
    ``mesh.slice(gpus=0)``) share their tensors."""
    engines = mesh._controller.engines
    engine = engines.get(mesh._shape)
    if engine is None:
        engine = engines.setdefault(mesh._shape, Engine(mesh))
    return engine


def send_queued(controller: Any) -> None:
    """Send the ops and frees every view of the mesh has queued, without waiting for them (the
    notebook calls it after each cell: a cell's tensor work starts on the ranks, and a dropped
    MeshTensor's memory there comes back, without waiting for the next fetch)."""
    for engine in list(controller.engines.values()):
        if engine._queue or engine._frees:
            engine.flush()


class Engine:
    """One per mesh view: the queue of ops for its ranks and the ids of their tensors.

    Queued ops are tuples ``(func, args, kwargs, slots, out, where, factory)`` (see
    `worker.apply_batch`). The queue and the frees are appended to without a lock (a list append
    is atomic); a batch is taken by slicing, under `_send_lock`, so that batches leave in order."""

    def __init__(self, mesh: Mesh) -> None:
        self.mesh = mesh
        self._controller = mesh._controller
        self._ids = _IDS  # next() on it is atomic, so threads never share an id
        self._send_lock = threading.Lock()
        self._queue: list[tuple[Any, ...]] = []
        self._frees: list[int] = []
        self._pending: list[Any] = []  # futures of batches sent; changed under _send_lock
        # Meta results by op signature: a loop of the same ops is checked once, not each time
        # (meta kernels cost up to a millisecond each).
        self._plans: dict[Any, Plan] = {}
        # Tensor id -> weak reference to its MeshTensor (mesh_tensor._Ref), whose callback
        # (`_gone`, one bound method for all) frees the id on the ranks.
        self._refs: dict[int, Any] = {}
        self._gone = self._on_gone
        self._frees_posted = False  # a batch of frees is due to go out from the IO thread
        # The controller's default dtype and grad mode as of the last op queued; a batch starts
        # on the ranks in `_sent_modes` (None: torch's defaults), and `worker._modes` ops in the
        # queue change them (`check_modes`).
        self._dtype: torch.dtype = torch.float32
        self._grad = True
        self._switched = False
        self._sent_modes: tuple[torch.dtype, bool] | None = None

    def describe(self) -> str:
        return self.mesh._shape.describe()

    def foreign(self, other: str, usual: str, what: str = "") -> ValueError:
        """The error of this engine's tensor used with another mesh (`other`, described): `usual`,
        or, once this tensor's mesh was shut down, that (its pieces went with it: no fetch)."""
        if not self._controller.closed:
            return ValueError(usual)
        return ValueError(f"{what}a MeshTensor of mesh ({self.describe()}), which was shut down, cannot be used on "
                          f"mesh ({other}): its pieces went with its mesh, so it cannot be fetched either; make it "
                          "again on the live mesh (compute it under mesh.activate())")

    # --- recording -----------------------------------------------------------------------

    def _new_id(self) -> int:
        return next(self._ids)

    def check_modes(self, func: Any = None) -> None:
        """Before checking an op (`func`): if the controller's default dtype or grad mode
        changed since the last op, queue the change for the ranks (and forget the plans made
        under the old ones: their result dtypes and requires_grad may differ now). Under
        ``torch.autocast``, refuse it: autocast covers neither meta tensors nor the ranks, so
        it would silently run in full precision."""
        if _autocast():
            raise RuntimeError(autocast_refused(worker._name(func) if func is not None else "this op"))
        dtype, grad = _default_dtype(), _grad_enabled()
        if dtype is not self._dtype or grad is not self._grad:
            self._dtype, self._grad = dtype, grad
            self._switched = True
            self._plans.clear()
            self._enqueue((worker._modes, (dtype, grad), None, (), None, where(), False))

    def factory(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> MeshTensor:
        self.check_modes(func)
        meta = factory_meta(func, args, kwargs)
        if "dtype" not in kwargs:  # the dtype checked here, whatever the rank's default
            kwargs = {**kwargs, "dtype": meta.dtype}
        tid = self._new_id()
        self._enqueue((func, args, kwargs, (), tid, where(), True))
        return MeshTensor(meta, self, tid)

    def seed(self, seed: int) -> None:
        """``torch.manual_seed(seed)`` on every rank, in order with the ops."""
        self._enqueue((worker.seeded, (seed,), None, (), None, where(), False))

    def dispatch(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], flat: bool = False,
                 key: Any = _NO_KEY, plan: Plan | None = None) -> Any:
        """Check `func` on meta tensors here (raising shape errors at the user's line), then
        queue it for the ranks and return MeshTensors for its tensor outputs. `flat`: the
        caller saw that no argument is a container; `key`, `plan`: what it already looked up."""
        sent: tuple[Any, ...] = (args, kwargs)
        if plan is None:
            self.check_modes(func)
            own = placed(func, args, kwargs)
            if own is not None:
                # It names the rank's own device (``y.to(x.device)``, ``x.cuda()``): checked here
                # on the meta device, each time (its plan is not kept for the short road, which
                # would send the controller's device), and sent naming the rank's own.
                func, args, kwargs, *rank = own
                sent, key = tuple(rank), None
        flat = flat or (not any(isinstance(x, CONTAINERS) for x in args) and not any(
            isinstance(x, CONTAINERS) for x in kwargs.values()
        ))
        in_leaves = [*args, *kwargs.values()] if flat else pytree.tree_leaves((args, kwargs))
        if plan is None:
            if key is _NO_KEY:
                key = signature(func, args, kwargs)
            plan = self._plans.get(key) if key is not None else None
            if plan is None:
                if module_reads_grad(func):
                    return None
                check_needs_no_data(getattr(func, "__name__", str(func)), func)
                check_sendable(getattr(func, "__name__", str(func)), in_leaves)
                plan = make_plan(func, args, kwargs, in_leaves)
                if key is not None and plan.cacheable:
                    if len(self._plans) >= 4096:
                        self._plans.clear()
                    self._plans[key] = plan
        if plan.kind is ANSWER:
            return plan.answer  # a question about metadata (shape, dtype, dim...): answered here
        out_ids: list[int | None] = []
        results: list[Any] = []
        for kind, value in plan.outputs:
            if kind == "value":
                out_ids.append(None)
                results.append(value)
            elif kind == "input":  # in place: the op returned its input
                same = in_leaves[value]
                out_ids.append(same._id)
                results.append(same)
            else:
                meta, sig = value
                tid = self._new_id()
                out_ids.append(tid)
                results.append(new(self, meta, tid, sig))
        args, kwargs = sent
        if flat:
            slot_args = tuple(_to_slot(x) for x in args)
            slot_kwargs = {k: _to_slot(v) for k, v in kwargs.items()}
        else:
            slot_args, slot_kwargs = pytree.tree_map(_to_slot, (args, kwargs))
        self._enqueue((func, slot_args, slot_kwargs, None, out_ids, where(), False))
        if plan.kind is VALUE:
            return plan.answer
        return results[0] if plan.kind is not GENERAL else pytree.tree_unflatten(results, plan.spec)

    def rank_op(self, t: MeshTensor, fn: Any, *args: Any) -> MeshTensor:
        """Queue ``fn(tensor, *args)`` on every rank; its result (same shape and dtype,
        contiguous, no autograd) becomes a new MeshTensor. For functions meta tensors cannot
        check, like collectives."""
        with torch._C.DisableTorchFunctionSubclass():
            meta = torch.empty(tuple(t.shape), dtype=t.dtype, device="meta")
        tid = self._new_id()
        self._enqueue((fn, [t._id, *args], None, (0,), tid, where(), False))
        return MeshTensor(meta, self, tid)

    def copied(self, t: MeshTensor) -> MeshTensor:
        """``copy.deepcopy(t)`` (see MeshTensor.__deepcopy__): queued as one op, after the ops
        issued before it."""
        with torch._C.DisableTorchFunction():  # (plain meta tensors: no mode sees them)
            shape, stride, dtype, grad = tuple(t.shape), t.stride(), t.dtype, t.requires_grad
            # A clone's strides, as the ranks' clone will have them.
            meta = torch.empty_strided(shape, stride, dtype=dtype, device="meta").clone()
            if grad:
                meta.requires_grad_(True)
        tid = self._new_id()
        self._enqueue((rank_ops.deepcopied, [t._id], None, (0,), tid, where(), False))
        return MeshTensor(meta, self, tid)

    def _enqueue(self, op: tuple[Any, ...]) -> None:
        if self._controller.closed:
            raise self._controller.closed_error(f"this MeshTensor ({self.describe()})")
        q = self._queue
        q.append(op)
        if len(q) >= BATCH_MAX:
            self.flush()

    def _on_gone(self, r: Any) -> None:
        """A MeshTensor was garbage-collected: free its tensor on the ranks, with the next batch.
        May run in any thread, in the middle of anything: it only appends, and past a batch's
        worth of frees asks the controller's IO thread to send them."""
        tid = r.tid
        self._refs.pop(tid, None)
        frees = self._frees
        frees.append(tid)
        if len(frees) >= BATCH_MAX and not self._frees_posted:
            # Not from here: this may run inside the controller's own sending, under its locks.
            self._frees_posted = True
            self._controller.call_soon(self._send_frees)

    def _send_frees(self) -> None:
        """On the controller's IO thread: send the frees (and ops) queued so far."""
        self._frees_posted = False
        try:
            self.flush()
        except Exception:
            pass  # a closed mesh; otherwise the next flush retries

    # --- sending ---------------------------------------------------------------------------

    def flush(self) -> None:
        with self._send_lock:
            self._send()

    def _send(self) -> None:
        # Frees first: a free is recorded after every op using its tensor was queued, so each
        # free taken here has its ops in this batch or an earlier one (and runs after them).
        f = self._frees
        n = len(f)
        frees = f[:n]
        del f[:n]
        q = self._queue
        n = len(q)
        ops = q[:n]
        del q[:n]
        if not ops and not frees:
            return
        if self._controller.closed:
            return
        # No fail-fast: every rank runs its own ops to the end (a failed op fails only what uses
        # its results), so the ranks' tensor tables stay consistent with each other. Collectives
        # go in calls of their own, stopping at the first failure: a rank that cannot join one
        # stops, and its peers waiting in it are released by the counts of collectives the
        # ranks that finished had started (`viceroy.runtime.call_peers`), not by fail-fast,
        # which would also interrupt a peer still finishing the collective before it (a ring
        # all_reduce ends a little later on some ranks than on others).
        pending = self._pending
        chunks = _chunks(ops)
        for n, (chunk, talks) in enumerate(chunks):
            start = self._sent_modes
            if self._switched:
                for op in reversed(chunk):
                    if op[0] is _MODES:
                        dtype, grad = op[1]
                        self._sent_modes = None if dtype is torch.float32 and grad else op[1]
                        break
            last = n == len(chunks) - 1  # frees go last: after every op that uses them
            # What an interrupt names while the ranks unpack the batch (before its first op runs).
            first = next(((worker._name(op[0]), *op[5]) for op in chunk if op[0] is not _MODES), None)
            fut = self.mesh._run(worker.apply_batch, worker.pack_ops(chunk), frees if last else [], start, talks,
                                 first, block=False, label="tensor ops", fail_fast=False)
            if fut.done() and unsent.refused(fut.exception(0)):
                lost = unsent.not_sent(self, chunk, frees if last else [], fut.exception(0))
                if lost is not None:
                    pending.append(lost)
                continue
            pending.append(fut)
        if len(pending) >= PENDING_MAX:  # a long loop that never syncs: keep only what may fail
            pending[:] = [f for f in pending if not f.done() or f.exception(0) is not None]

    def sync(self, what: str = "call") -> None:
        """Send what is queued and wait for it; raise the first failure (`what`: the call that
        waits, as the failure's message names it)."""
        # A mesh shut down: what was in flight then ended with it; a sync now is a call after.
        self._controller._check_open()
        with self._send_lock:  # (a batch of frees may go out from another thread meanwhile)
            self._send()
            pending = self._pending
            self._pending = []
        first: BaseException | None = None
        for i, fut in enumerate(pending):
            try:
                fut.get()
            except MeshError as exc:
                first = first or exc
            except KeyboardInterrupt:
                # The batches not waited for stay due: the next sync reports how they ended
                # (interrupted), rather than only the tensors they did not make.
                with self._send_lock:
                    self._pending[:0] = pending[i:]
                raise
        if first is not None:
            if isinstance(first, MeshError) and not first.hint:
                # This call may be for a tensor the failed op never touched: say what holds.
                first.hint = (f"Raised at this {what}, the first since that op failed on the ranks: tensors made "
                              "without its result are unharmed (fetch them again); fix the line it names, and make "
                              "again the tensors made from it")
            raise first

    def fetch(self, t: MeshTensor, coords: dict[str, int]) -> Any:
        self.sync("fetch")
        view = self.mesh.slice(**coords) if coords else self.mesh
        # Not fail-fast: a lookup has nothing long-running to stop, and each rank says for
        # itself why it has no value (none is reported as stopped because another failed).
        with torch._C.DisableTorchFunctionSubclass():
            shape, dtype = tuple(t.shape), t.dtype  # (what the pieces must be: see rank_reads.get)
        vals = view._run(rank_reads.get, t._id, shape, dtype, label="fetch", fail_fast=False)
        # One rank's tensor when every dim is given an index (a slice keeps its dim, as in
        # mesh.slice: a ValueMesh, whatever its length).
        return vals.values()[0] if coords and not view.dims else vals

    def run_on_ranks(self, fn: Any, *args: Any, label: str) -> Any:
        """Call a worker function after every queued op has run."""
        self.sync(label)
        return self.mesh._run(fn, *args, label=label, fail_fast=False)  # (as a fetch)


def _chunks(ops: list[tuple[Any, ...]]) -> list[tuple[list[tuple[Any, ...]], bool]]:
    """`ops` cut into runs of collectives and runs of everything else (most batches: one run)."""
    talks = [op[0] is _TALKER for op in ops]  # (by identity: ops' functions need not hash)
    if not any(talks):
        return [(ops, False)]
    out: list[tuple[list[tuple[Any, ...]], bool]] = []
    for op, t in zip(ops, talks, strict=True):
        if out and out[-1][1] == t:
            out[-1][0].append(op)
        else:
            out.append(([op], t))
    return out


def _to_slot(x: Any) -> Any:
    return worker.Slot(x._id) if isinstance(x, MeshTensor) else x
