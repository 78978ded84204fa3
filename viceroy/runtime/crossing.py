"""Collectives that crossed from one call into another, found on the controller as a call ends.

Calls sent without waiting (``block=False``, the tensor engine's batches, an actor's calls)
queue on each rank. A rank that finishes a call without joining a collective its peers start
in it (``if rank == 1: vr.all_reduce(t)``) goes straight on to the next call, whose collective
on the same group meets the one its peer waits in: the backend takes them for the same
operation, both return the other's data, and from there on the group's collectives are off by
one between them. Within one call the peers are told who finished (see `call_peers`) and stop;
across calls nothing on the ranks can tell, as each collective completes.

Each rank reports, with its answer, how many collectives it started on each group in the call
(``cc``; a group is named by its ranks, "0.1.2.3"). Every member of a group starts the same
number in a call that ran right; a rank that succeeded having started more than a member that
answered means its extra ones met collectives from outside the call. Then its result is not to
be trusted (it fails, naming who started fewer), and the calls queued behind on the group's
ranks are cancelled: the member left waiting for a partner is released (its communicator given
up, so the next collective starts afresh), and what those calls' collectives on the group
returned is not trusted either (`distrusted`). A group one of whose collectives failed in the
call on some rank (its communicator given up, or a usage error; see `call_peers.broke`) is
left out: a rank may have caught the error and gone on, and the counts no longer line up."""

from __future__ import annotations

from viceroy.runtime.calls import Call
from viceroy.runtime.errors import RankFailure
from viceroy.runtime.shape import describe_ranks

_ORDER = ("Every rank of a group must start its collectives in the same order, in every call: "
          "with calls queued, one that a rank skips meets the next call's instead")


def crossed(call: Call) -> dict[str, dict[int, RankFailure]]:
    """The groups (by name) whose collectives crossed out of `call`, each with the failures of
    its ranks that returned what they cannot trust."""
    out: dict[str, dict[int, RankFailure]] = {}
    ranks = set(call.shape.ranks)
    for group in sorted({g for cc in call.collectives.values() for g in cc}):
        ranks_of = members(group)
        if not ranks.issuperset(ranks_of):  # a group reaching outside the call: the others are not seen
            continue
        if any(len(cc.get(group, ())) > 2 for cc in call.collectives.values()):
            continue  # one of its collectives failed (see call_peers.broke): the group started afresh
        known = {r: _started(call, r, group) for r in ranks_of if _answered(call, r)}
        if not known:
            continue
        least = min(known.values())
        short = [r for r, n in known.items() if n == least]
        over = {r: n for r, n in known.items() if n > least and r in call.results}
        if over:
            out[group] = {r: _failure(n, least, short, ranks_of) for r, n in over.items()}
    return out


def distrusted(call: Call, cause: dict[str, str]) -> dict[int, RankFailure]:
    """The failures of the ranks of `call` (queued behind one whose collectives crossed, see
    `crossed`) that succeeded having started a collective on a group `cause` names: what it
    returned may be another call's data. `cause`: group -> the call whose collectives crossed."""
    out: dict[int, RankFailure] = {}
    for r in call.results:
        hit = [g for g in call.collectives.get(r, {}) if g in cause]
        if hit:
            g = hit[0]
            out[r] = RankFailure("error", (
                f"viceroy.CollectiveError: its collectives over {describe_ranks(members(g))} may have met those "
                f"of {cause[g]}, queued before it, which crossed out of that call: what it returned is not to "
                f"be trusted. {_ORDER}."), exc_type="CollectiveError")
    return out


def _answered(call: Call, r: int) -> bool:
    """Whether rank `r` answered `call` itself, so that its count of collectives is known
    (not one given up on or dead: it may have started more)."""
    if r in call.results or r in call.collectives:
        return True
    f = call.failures.get(r)
    return f is not None and f.kind == "error"


def _started(call: Call, r: int, group: str) -> int:
    return int(call.collectives.get(r, {}).get(group, (0,))[0])


def members(group: str) -> list[int]:
    """The ranks of a group, from its name ("0.1.2.3")."""
    return [int(r) for r in group.split(".")]


def _failure(n: int, least: int, short: list[int], over: list[int]) -> RankFailure:
    which = _nth(least + 1) + ("" if n == least + 1 else f" to {_nth(n)}")
    return RankFailure("error", (
        f"viceroy.CollectiveError: it started {n} collective{'s' if n != 1 else ''} over "
        f"{describe_ranks(over)} in this call, {describe_ranks(short)} only {least}: its {which} met "
        f"collectives from outside this call (a call queued behind it on {describe_ranks(short)}), so what it "
        f"returned is not to be trusted. The calls queued behind this one on those ranks are cancelled. "
        f"{_ORDER}."), exc_type="CollectiveError")


def _nth(n: int) -> str:
    return f"{n}{'th' if 10 <= n % 100 <= 20 else {1: 'st', 2: 'nd', 3: 'rd'}.get(n % 10, 'th')}"
