"""Signed multipart messages: ``[signature + header, *signed frames, *data frames]``.

The first frame is a 32-byte HMAC-SHA256 signature followed by the JSON header. The signature
covers the header and the first ``header["signed"]`` frames after it (pickle streams, code,
text). Any further frames are raw array data, length-checked against ``header["lens"]`` and
only ever used as out-of-band buffers of a signed pickle stream, so they cannot carry code
(and large arrays are not hashed at every hop). A message that fails the check is dropped
before anything in it is parsed or unpickled, and counted.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets
from collections.abc import Sequence
from typing import Any

Frame = Any  # bytes | memoryview | zmq.Frame | PickleBuffer

_SIG = 32
_json_dumps = json.JSONEncoder(separators=(",", ":")).encode
_json_decode = json.JSONDecoder().decode


def _dumps_json(header: dict[str, Any]) -> bytes:
    return _json_dumps(header).encode()


def _loads_json(h: bytes) -> Any:
    return _json_decode(h.decode())


try:  # orjson, where installed, packs a header in a fifth of the time; the same JSON either way
    import orjson

    _NON_STR_KEYS = orjson.OPT_NON_STR_KEYS

    def _dumps(header: dict[str, Any]) -> bytes:
        try:
            return orjson.dumps(header, option=_NON_STR_KEYS)
        except TypeError:  # beyond what orjson writes (an int past 64 bits): as json would
            return _dumps_json(header)

    _DecodeError = orjson.JSONDecodeError

    def _loads(h: bytes) -> Any:
        try:
            return orjson.loads(h)
        except _DecodeError:  # a lone surrogate, which json writes (escaped) and orjson refuses
            return _loads_json(h)  # (an undecodable file name, say); junk fails here as well

except ImportError:  # pragma: no cover - orjson is a dependency
    _dumps, _loads = _dumps_json, _loads_json


def _keyed(key: bytes) -> Any:
    """An HMAC-SHA256 already keyed with `key`; `.copy()` of it starts a message without
    hashing the key again (OpenSSL's object where available: no Python wrapper per message)."""
    try:
        import _hashlib

        return _hashlib.hmac_new(key, digestmod="sha256")
    except (ImportError, AttributeError, ValueError):
        return hmac.new(key, digestmod=hashlib.sha256)


def new_key() -> bytes:
    return secrets.token_bytes(32)


class BadMessage(Exception):
    """A message that is malformed or not signed with the mesh key."""


class Signer:
    """Signs and verifies messages with one per-mesh key; counts what it drops."""

    __slots__ = ("_keyed", "dropped", "key")

    def __init__(self, key: bytes) -> None:
        self.key = key  # handed to the processes this one starts
        self._keyed = _keyed(key)
        self.dropped = 0

    def pack(self, header: dict[str, Any], signed: Sequence[Frame] = (), data: Sequence[Frame] = ()) -> list[Frame]:
        header["signed"] = len(signed)
        if data:
            header["lens"] = [memoryview(d).nbytes for d in data]
        h = _dumps(header)
        mac = self._keyed.copy()
        mac.update(h)
        for f in signed:
            mac.update(f)
        return [mac.digest() + h, *signed, *data]

    def unpack(self, frames: Sequence[Frame]) -> tuple[dict[str, Any], list[Frame], list[Frame]]:
        """-> (header, signed frames, data frames); raises BadMessage (and counts it)."""
        try:
            first = frames[0]
            first = first.bytes if hasattr(first, "bytes") else bytes(first)
            if len(first) <= _SIG:
                raise BadMessage("no header")
            h = first[_SIG:]
            # The signed count sits inside the header; a forged count fails the MAC below
            # because the header itself is covered by it.
            n_signed = _peek_signed(h)
            if 1 + n_signed > len(frames):
                raise BadMessage("bad frame count")
            mac = self._keyed.copy()
            mac.update(h)
            signed = list(frames[1 : 1 + n_signed])
            for f in signed:
                mac.update(f.buffer if hasattr(f, "buffer") else f)
            if not hmac.compare_digest(mac.digest(), first[:_SIG]):
                raise BadMessage("bad signature")
            header = _loads(h)
            data = list(frames[1 + n_signed :])
            if data or "lens" in header:
                lens = header.get("lens", [])
                if len(lens) != len(data) or any(_nbytes(d) != n for d, n in zip(data, lens, strict=True)):
                    raise BadMessage("data frames do not match the signed lengths")
            return header, signed, data
        except BadMessage:
            self.dropped += 1
            raise
        except Exception as exc:  # malformed JSON, non-buffer frames...
            self.dropped += 1
            raise BadMessage(str(exc)) from None


def _nbytes(f: Frame) -> int:
    return f.buffer.nbytes if hasattr(f, "buffer") else memoryview(f).nbytes


def _peek_signed(header: bytes) -> int:
    i = header.rfind(b'"signed":')
    if i < 0:
        raise BadMessage("no signed count")
    j = k = i + 9
    while k < len(header) and 48 <= header[k] <= 57:
        k += 1
    if k == j:
        raise BadMessage("bad signed count")
    return int(header[j:k])

