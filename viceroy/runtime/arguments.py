"""Checks of the arguments the Python API takes, shared so that every call words them alike and
refuses bad values before anything is sent (a restart with ``timeout="x"`` must not restart the
ranks first and fail after)."""

from __future__ import annotations

import math
import operator
import shlex
from collections.abc import Sequence
from typing import Any, overload

# Names Python itself keeps in a namespace (``__builtins__``, ``__name__``, ...): set from the
# controller, they break the ranks' namespaces (``import`` fails once __builtins__ is None).
_PYTHONS = "names of the form __x__ belong to Python's own use of the namespace"


@overload
def check_seconds(value: Any, name: str = ..., *, none: None) -> float: ...
@overload
def check_seconds(value: Any, name: str = ..., none: str = ...) -> float | None: ...
def check_seconds(value: Any, name: str = "timeout", none: str | None = "no limit") -> float | None:
    """`value` must be a positive, finite number of seconds (numpy's and torch's scalars too; not
    a bool), or None when `none` says what None means; returned as a plain int or float."""
    if value is None and none is not None:
        return None
    seconds = _as_number(value)
    if seconds is None or not 0 < seconds < math.inf:  # nan too
        also = f", or None for {none}" if none is not None else ""
        raise ValueError(f"{name}={value!r}: give a positive, finite number of seconds{also}")
    return seconds


def _as_number(value: Any) -> float | None:
    """`value` as a plain int or float if it is a real number (numpy's and torch's scalars too),
    not a bool (numpy's and torch's neither); else None."""
    n = as_int(value)
    if n is not None or _is_bool(value):
        return n
    dtype = str(getattr(value, "dtype", ""))
    if isinstance(value, float) or ("float" in dtype and tuple(getattr(value, "shape", (0,))) == ()):
        return float(value)  # np.float32, a 0-d torch tensor: not float's subclasses
    return None


def check_count(value: Any, name: str, what: str) -> int:
    """`value` must be a positive int, numpy's too (`what`: what it counts, for the message);
    returned as a plain int, which JSON takes. A bool or a float is refused."""
    n = as_int(value)
    if n is None or n < 1:
        raise ValueError(f"{name}={value!r}: give a positive whole number of {what}")
    return n


def as_int(value: Any) -> int | None:
    """`value` as a plain int if it is an integer (numpy's and torch's too), not a bool
    (numpy's and torch's neither); else None."""
    if _is_bool(value):
        return None
    try:
        return operator.index(value)
    except TypeError:
        return None


def _is_bool(value: Any) -> bool:
    return isinstance(value, bool) or str(getattr(value, "dtype", "")) in ("bool", "torch.bool")


def check_flag(value: Any, name: str) -> None:
    """`value` must be True or False (``block="no"`` would count as true)."""
    if not isinstance(value, bool):
        raise TypeError(f"{name}={value!r}: give True or False")


def check_python(value: Any, whose: str) -> None:
    """`value` must name a Python: a path (`whose`: on which machines, for the message)."""
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"python={value!r}: give the path of {whose} Python, e.g. '/opt/venv/bin/python'")


def check_argv(value: Any, name: str, tool: str, example: str) -> tuple[str, ...]:
    """`value`, a list of `tool`'s command-line arguments (not one string, which would go one
    letter per argument), as a tuple; `example`: some, as the user would type them."""
    if isinstance(value, str | bytes) or not isinstance(value, Sequence) or not all(isinstance(o, str) for o in value):
        raise TypeError(f"{name}={value!r}: give a list of {tool}'s arguments, e.g. {shlex.split(example)!r} "
                        f"(shlex.split({example!r}))")
    return tuple(value)


def check_label(value: Any) -> None:
    if value is not None and not isinstance(value, str):
        raise TypeError(f"label={value!r}: give a string (what the call is called in errors and the mesh view), or None")


def check_names(what: str, names: Any, assigns: bool = False, rank_names: tuple[str, ...] = ()) -> None:
    """Names of variables in the ranks' namespaces; `assigns`: names about to be set there,
    which must be none of `rank_names` (each rank's own) nor Python's ``__x__`` names."""
    for name in names:
        if not isinstance(name, str) or not name.isidentifier():
            raise ValueError(f"{what} takes variable names, got {name!r}")
        if not assigns:
            continue
        if name in rank_names:
            raise ValueError(f"{what} cannot set {name!r}: each rank's namespace holds its own rank, coords and "
                             f"mesh (its dims) under those names, which code on the ranks reads; choose another name")
        if name.startswith("__") and name.endswith("__"):
            raise ValueError(f"{what} cannot set {name!r}: {_PYTHONS}; choose another name")


def split_address(addr: str) -> tuple[str, int]:
    """``"tcp://10.0.0.1:7777"``, ``"10.0.0.1:7777"`` -> ("10.0.0.1", 7777)."""
    if not isinstance(addr, str):
        raise TypeError(f"expected HOST:PORT as a string (e.g. '127.0.0.1:7777'), got {addr!r}")
    host, _, port = addr.removeprefix("tcp://").rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"expected HOST:PORT (e.g. 127.0.0.1:7777), got {addr!r}")
    if not 0 < int(port) < 65536:  # zmq took 99999 and listened on another port
        raise ValueError(f"{int(port)} is not a port number (1-65535), in {addr!r}")
    return host.strip("[]"), int(port)
