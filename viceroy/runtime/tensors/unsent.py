"""Tensor ops the controller did not send: a batch whose view had dead ranks goes to no rank.
What its ops should have made or changed is marked as having no value on every rank, and the
sync that waits for it raises an error naming its ops and what to do as of then."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from viceroy.runtime.errors import MeshError
from viceroy.runtime.shape import describe_ranks
from viceroy.runtime.tensors import worker

if TYPE_CHECKING:
    from viceroy.runtime.tensors.engine import Engine


def refused(exc: BaseException | None) -> bool:
    """Whether a batch's call failed before it was sent: ranks of the view were dead."""
    return isinstance(exc, MeshError) and bool(exc.failures) and \
        all(f.kind == "unavailable" for f in exc.failures.values())


class NotSent:
    """In `Engine._pending`, a batch the controller did not send (see `not_sent`): a
    failed future whose error names the batch's ops, and says what to do as of the sync that
    reports it (the dead ranks may have been restarted since)."""

    __slots__ = ("controller", "error", "ops")

    def __init__(self, controller: Any, ops: list[tuple[Any, ...]], error: MeshError) -> None:
        self.controller = controller
        self.ops = [(worker._name(op[0]), op[5]) for op in ops]  # (the ops themselves may hold big tensors)
        self.error = error

    def done(self) -> bool:
        return True

    def exception(self, timeout: float | None = None) -> MeshError:
        exc = self.error
        ranks = sorted(exc.failures)
        states = self.controller.states()
        still = [r for r in ranks if states[r] == "dead"]
        (name, (file, line)), n = self.ops[0], len(self.ops)
        first = f"{name} (issued at {file}, line {line})"
        if n == 1:
            what, it = f"the op {first} never ran", "it should have made or changed"
        else:
            last_name, (last_file, last_line) = self.ops[-1]
            what = (f"the {n} ops issued from {first} to {last_name} (issued at {last_file}, line {last_line}) "
                    "never ran")
            it = "they should have made or changed"
        hint = (f"Nothing was sent to any rank: {what}, and the tensors {it} have no value on any rank (using "
                "or fetching one names the op): make them again")
        if still:
            hint += (f", once {describe_ranks(still)} {'is' if len(still) == 1 else 'are'} back: "
                     "mesh.restart(failed_only=True) (the tensors dead ranks held are gone with them)")
        else:
            hint += (f". {describe_ranks(ranks).capitalize()} {'was' if len(ranks) == 1 else 'were'} restarted "
                     f"since: the tensors {'it' if len(ranks) == 1 else 'they'} held before are gone too "
                     "(the other ranks keep theirs)")
        return MeshError(exc.what, exc.failures, partial=exc.partial, hint=hint, total=exc.total)

    def get(self, timeout: float | None = None) -> Any:
        raise self.exception()


def not_sent(engine: Engine, ops: list[tuple[Any, ...]], frees: list[int], exc: MeshError) -> NotSent | None:
    """A batch the controller did not send, because ranks of this view were dead: none of
    its ops ran on any rank. What they make or change is marked as having no value, on
    every rank, by an op put first in the queue (`worker.lost`; a restarted rank gets the
    marks too), so that fetching or using one of those tensors names the op and its line;
    the batch's frees go with the next batch. The sync that waits for it raises a
    `NotSent` error naming its ops (None: it held none of the user's ops, only marks)."""
    dead = describe_ranks(sorted(exc.failures))
    marks: dict[int, str] = {}
    user_ops = [op for op in ops if op[0] is not worker.lost and op[0] is not worker._modes]
    for op in ops:
        if op[0] is worker.lost:  # the marks of a batch not sent before, not sent again
            for tid, why in op[1][0].items():
                marks.setdefault(tid, why)
            continue
        mine: dict[int, str] = {}
        where_ = op[5]
        worker._mark({}, mine, op, f"{worker._name(op[0])} (issued at {where_[0]}, line {where_[1]}) never ran: "
                                   f"{dead} {'was' if len(exc.failures) == 1 else 'were'} dead when it "
                                   "was sent, so it went to no rank")
        for tid, why in mine.items():
            marks.setdefault(tid, why)
    q = engine._queue
    if q and q[0][0] is worker.lost:  # an earlier chunk's marks, put there by this send: first
        for tid, why in marks.items():
            q[0][1][0].setdefault(tid, why)
    elif marks:
        q[:0] = [(worker.lost, (marks,), None, (), None, ops[0][5], False)]
    if frees:
        engine._frees[:0] = frees
    return NotSent(engine._controller, user_ops, exc) if user_ops else None
