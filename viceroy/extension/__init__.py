"""The IPython extension: ``%load_ext viceroy`` gives any IPython kernel the %mesh magics.

%load_ext viceroy
%mesh up gpus=2
%%mesh
print("hello from", rank)
"""

from __future__ import annotations

import contextlib
from typing import Any

from viceroy.runtime import file_names

_SESSIONS: dict[int, Any] = {}


def session_for(shell: Any) -> Any:
    """The `MeshSession` of ``shell`` (created on first use)."""
    from viceroy.extension.session import MeshSession

    key = id(shell)
    if key not in _SESSIONS:
        _SESSIONS[key] = MeshSession(shell)
    return _SESSIONS[key]


def current_session(shell: Any) -> Any:
    """The `MeshSession` of ``shell`` if the extension is loaded there, else None."""
    return _SESSIONS.get(id(shell))


def load_ipython_extension(ipython: Any) -> None:
    """Register the magics, the auto-mode transformer and the ``viceroy.mesh`` comm target."""
    from viceroy.extension.cell_magic_lines import check_magic_line
    from viceroy.extension.comm import StateChannel
    from viceroy.extension.magics import MeshMagics, auto_transformer

    session = session_for(ipython)
    if getattr(session, "_loaded", False):
        return
    ipython.register_magics(MeshMagics(ipython, session))
    transform = auto_transformer(session)
    ipython.input_transformers_cleanup.extend([check_magic_line, transform])  # before auto mode adds %%mesh
    channel = StateChannel(session)
    channel.register()
    ipython.events.register("pre_run_cell", session.before_cell)
    ipython.events.register("post_run_cell", session.after_cell)
    session._loaded = True
    session._unload = (transform, channel)


def unload_ipython_extension(ipython: Any) -> None:
    """Stop the mesh and remove what `load_ipython_extension` added."""
    from viceroy.extension.cell_magic_lines import check_magic_line

    session = _SESSIONS.pop(id(ipython), None)
    if session is None:
        return
    transform, channel = session._unload
    session.close()
    channel.unregister()
    with contextlib.suppress(ValueError):
        ipython.events.unregister("post_run_cell", session.after_cell)
    with contextlib.suppress(ValueError):
        ipython.events.unregister("pre_run_cell", session.before_cell)
    file_names.name_files(None)
    for t in (transform, check_magic_line):
        if t in ipython.input_transformers_cleanup:
            ipython.input_transformers_cleanup.remove(t)
    for kind in ("line", "cell"):
        for name in ("mesh", "px", "autopx"):
            ipython.magics_manager.magics[kind].pop(name, None)
