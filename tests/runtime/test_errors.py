"""MeshError as a value: what it says survives pickling and copying."""

from __future__ import annotations

import copy
import pickle

from viceroy.runtime.errors import MeshError, RankFailure


def test_a_mesh_error_pickles_and_copies_with_everything_it_says():
    # Exception's own __reduce__ rebuilt it from its message alone, which its __init__ refused:
    # passing one through multiprocessing, or copy.copy(err), raised a TypeError.
    err = MeshError("mesh.run", {1: RankFailure("error", "ZeroDivisionError: division by zero", "  1/0\n",
                                                "ZeroDivisionError")},
                    partial={0: 5}, hint="Fix it.", total=3)
    for again in (pickle.loads(pickle.dumps(err)), copy.copy(err), copy.deepcopy(err)):
        assert type(again) is MeshError
        assert str(again) == str(err) and again.args == err.args
        assert again.failures == err.failures and again.partial == {0: 5} and again.total == 3
