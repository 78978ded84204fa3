"""Handles: references to values that live on the ranks. Nothing moves until asked.

    x = mesh.ref("x")
    mesh.run("y = x * 2", x=x)        # each rank binds its own x
    mesh.run(lambda v: v.sum(), x)    # in arguments and closures too

A name bound for a code string stays bound on the ranks across calls. Where the value belongs
to a handle whose owner frees it (a MeshTensor dropped on the controller), the names still
holding it go with it (`bind_names`, `unbind`), so a handle's memory on the ranks does not
outlive the handle.
"""

from __future__ import annotations

import keyword
import threading
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from viceroy.runtime.context import context

if TYPE_CHECKING:
    from viceroy.runtime.controller import Controller
    from viceroy.runtime.shape import Shape


class Ref:
    """A handle to the value each rank holds under `name`. Sent to the mesh (as an argument,
    in a closure, or bound to a name of a code string), it becomes that rank's own value."""

    __slots__ = ("__weakref__", "_controller", "_describe", "_token", "name")

    def __init__(self, name: str, controller: Controller, describe: str) -> None:
        if not isinstance(name, str) or not name.isidentifier():
            raise ValueError(f"a handle names a variable on the ranks; {name!r} is not a name")
        if keyword.iskeyword(name):
            raise ValueError(f"a handle names a variable on the ranks; {name!r} is a Python keyword, which no "
                             "variable can be named")
        self.name = name
        self._token = controller.token
        self._controller = weakref.ref(controller)
        self._describe = describe

    def __reduce__(self) -> tuple[Any, ...]:
        return _resolve, (self.name, self._token, self._describe)

    def __repr__(self) -> str:
        return f"<viceroy.Ref {self.name!r} on mesh {self._describe}>"

    def __getattr__(self, attr: str) -> Any:
        # (Only for names a Ref does not have; those of Python's protocols fail plainly.)
        if attr.startswith("_"):
            raise AttributeError(attr)
        name = self.name
        raise AttributeError(f"handle {name!r} has no attribute {attr!r} here: a handle names a value on each rank, "
                             f"which stays there: mesh.run(lambda v: v.{attr}, {name}) reads it on every rank, "
                             f"mesh.pull({name!r}) fetches every rank's")

    def check_usable_on(self, controller: Controller, shape: Shape) -> None:
        """Raise on the controller, before sending, if this handle cannot mean anything on
        the ranks of `shape`."""
        describe = shape.describe()
        mine = self._controller()
        if mine is None or mine.closed:
            raise ValueError(
                f"handle {self.name!r} belongs to mesh ({self._describe}), which was shut down; "
                f"make a new handle with mesh.ref({self.name!r})"
            )
        if self._token != controller.token:
            where = (f"another mesh, not to this one (both {describe})" if describe == self._describe
                     else f"mesh ({self._describe}), not to this mesh ({describe})")
            raise ValueError(f"handle {self.name!r} belongs to {where}; values move between meshes only through the "
                             "controller (pull, then push)")


def _no_value(symbol: str) -> tuple[Callable[..., Any], Callable[..., Any]]:
    """``ref + x`` and ``x + ref`` for a Ref: a handle has no value on the controller to compute
    with; an error that says where it is (and, next to a MeshTensor, how to bring it in)."""

    def refuse(self: Ref, other: Any, reflected: bool) -> Any:
        expr = f"{type(other).__name__} {symbol} handle" if reflected else f"handle {symbol} {type(other).__name__}"
        if is_handle(other) and not isinstance(other, Ref):  # a MeshTensor (torch is loaded)
            from viceroy.runtime.tensors.refusals import handle_in_op

            raise RuntimeError(handle_in_op(f"`{expr}`", self))
        raise TypeError(f"`{expr}`: handle {self.name!r} has no value here to compute with: a handle names a value "
                        f"on each rank, which stays there: compute on the ranks, mesh.run(lambda v: v {symbol} ..., "
                        f"{self.name}), or fetch every rank's value: mesh.pull({self.name!r})")

    return (lambda self, other: refuse(self, other, False)), (lambda self, other: refuse(self, other, True))


for _name, _symbol in (("add", "+"), ("sub", "-"), ("mul", "*"), ("truediv", "/"), ("floordiv", "//"),
                       ("mod", "%"), ("pow", "**"), ("matmul", "@")):
    _op, _rop = _no_value(_symbol)
    setattr(Ref, f"__{_name}__", _op)
    setattr(Ref, f"__r{_name}__", _rop)


def is_handle(value: Any) -> bool:
    """A `Ref`, or a MeshTensor (a handle to one tensor per rank): in a `%%mesh` cell, a
    controller name holding one is bound on each rank to that rank's own value."""
    return isinstance(value, Ref) or (
        type(value).__name__ == "MeshTensor" and type(value).__module__ == "viceroy.runtime.tensors.mesh_tensor"
    )


def _resolve(name: str, token: str, describe: str) -> Any:
    ctx = context()
    if ctx.mesh_token != token:
        raise ValueError(f"handle {name!r} belongs to mesh ({describe}), not to this rank's mesh")
    try:
        return ctx.namespace[name]
    except KeyError:
        raise NameError(
            # No rank number here: the MeshError names the ranks, and groups equal messages.
            f"handle {name!r}: no variable {name!r} on this rank (define it on the ranks first)"
        ) from None


# --- on a rank: names bound to handles' values ---------------------------------------------

_BOUND = "__viceroy_bound_names__"  # namespace entry: handle key -> names bound to its value
_binding = threading.local()  # .seen: (key, value) of each handle resolved while binding


def bind_names(namespace: dict[str, Any], load: Callable[[], dict[str, Any]]) -> None:
    """Bind in `namespace` the names a code string's call brings (``load()`` unpickles them;
    handles among them resolve to this rank's values). A name bound to a value whose resolver
    noted it (`resolved`) is remembered under that handle's key, for `unbind`."""
    seen: list[tuple[Any, Any]] = []
    _binding.seen = seen
    try:
        names = load()
    finally:
        _binding.seen = None
    namespace.update(names)
    if not seen:
        return
    keys = {id(value): key for key, value in seen}
    bound: dict[Any, set[str]] = namespace.setdefault(_BOUND, {})
    for name, value in names.items():
        key = keys.get(id(value))
        if key is not None:
            bound.setdefault(key, set()).add(name)


def resolved(key: Any, value: Any) -> None:
    """A resolver's note: the handle `key` became `value` here (remembered while `bind_names`
    loads, so that the owner can `unbind` it when it frees the value)."""
    seen = getattr(_binding, "seen", None)
    if seen is not None:
        seen.append((key, value))


def unbind(namespace: dict[str, Any], key: Any, value: Any) -> None:
    """The owner of handle `key` freed `value`: the names a call bound to it go, if they still
    hold it. A name the rank code rebound, or an alias it made itself (``mine = t``), stays."""
    bound = namespace.get(_BOUND)
    names = bound.pop(key, None) if bound else None
    for name in names or ():
        if namespace.get(name) is value:
            del namespace[name]
