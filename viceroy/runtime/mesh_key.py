"""The mesh key of an attach mesh: what signs every message between the controller and agents it
did not start. It never travels: both sides read it from a 0600 file (hex) or $VICEROY_MESH_KEY,
and the controller writes a fresh one when the file does not exist yet."""

from __future__ import annotations

import os
import secrets
import stat
import tempfile

KEY_ENV = "VICEROY_MESH_KEY"



def read_key(path: str | None) -> bytes:
    """The mesh key from a 0600 file (hex), else from $VICEROY_MESH_KEY."""
    if path is None:
        text = os.environ.get(KEY_ENV)
        if not text:
            raise ValueError(f"no mesh key: pass --key-file FILE (a 0600 file) or set ${KEY_ENV}")
        where = f"${KEY_ENV}"
    else:
        try:
            mode = os.stat(path).st_mode
        except FileNotFoundError:
            raise FileNotFoundError(
                f"no key file {path}: copy the mesh's key file from the controller's machine (Mesh.attach "
                f"writes it there, mode 0600) to {path} here, or set ${KEY_ENV} to its contents"
            ) from None
        if stat.S_ISDIR(mode):
            raise IsADirectoryError(f"{path} is a directory; --key-file names the mesh's key file (e.g. mesh.key)")
        if mode & (stat.S_IRWXG | stat.S_IRWXO):
            raise PermissionError(
                f"{path} is readable by others (mode {stat.S_IMODE(mode):o}); the mesh key must be "
                f"private: chmod 600 {path}"
            )
        with open(path) as f:
            text = f.read()
        where = path
    try:
        key = bytes.fromhex(text.strip())
    except ValueError:
        raise ValueError(f"the mesh key in {where} is not hex (expected 64 hex digits)") from None
    if len(key) < 16:
        raise ValueError(f"the mesh key in {where} is {len(key)} bytes; use at least 16 (32 is the default)")
    return key


def key_for_controller(path: str | None, port: int) -> tuple[bytes, str | None]:
    """The key of an attach mesh: from `path` if it exists, else a fresh one written there
    (mode 0600); with no path, from $VICEROY_MESH_KEY, else ~/.viceroy/attach-PORT.key."""
    if path is None:
        if os.environ.get(KEY_ENV):
            return read_key(None), None
        folder = os.path.expanduser("~/.viceroy")
        os.makedirs(folder, mode=0o700, exist_ok=True)
        path = os.path.join(folder, f"attach-{port}.key")
    if os.path.exists(path):
        return read_key(path), path
    key = secrets.token_bytes(32)
    try:  # written aside (mode 0600), then linked in whole: an agent never reads it empty
        fd, aside = tempfile.mkstemp(prefix=".viceroy-key-", dir=os.path.dirname(path) or ".")
    except FileNotFoundError:
        raise FileNotFoundError(f"key_file={path!r}: there is no directory {os.path.dirname(path) or '.'} to create "
                                "it in (a missing key file is created, mode 0600)") from None
    try:
        with os.fdopen(fd, "w") as f:
            f.write(key.hex() + "\n")
        os.link(aside, path)  # never over a key another controller wrote meanwhile (FileExistsError)
    finally:
        os.unlink(aside)
    return key, path
