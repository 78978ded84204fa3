"""The one error type of the data plane."""

from __future__ import annotations


class CollectiveError(RuntimeError):
    """A collective could not complete: a peer died, raised, was interrupted, or never came.

    The message names the operation, the group (its dims or ranks) and the rank at the root of
    the failure. The communicator involved has been aborted; the next collective over the same
    group builds a fresh one.
    """


CollectiveError.__module__ = "viceroy"  # as tracebacks name it: viceroy.CollectiveError (exported there)


class BackendUnavailable(CollectiveError):
    """The backend a tensor needs is not usable on this rank (e.g. nccl without CuPy or a GPU)."""
