"""Signed multipart messages: ``[signature, header, *frames]``.

The header is JSON. The first ``header["signed"]`` frames (pickle streams, code) are covered by
the HMAC-SHA256 signature together with the header; any further frames are raw array data,
length-checked against ``header["lens"]`` and only ever used as out-of-band buffers of a signed
pickle stream, so they cannot carry code. A message that fails the check is dropped before
anything in it is parsed or unpickled.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets
from collections.abc import Sequence
from typing import Any

Frame = Any  # bytes | memoryview | zmq.Frame | PickleBuffer


def new_key() -> bytes:
    return secrets.token_bytes(32)


class BadMessage(Exception):
    """A message that is malformed or not signed with the mesh key."""


class Signer:
    """Signs and verifies messages with one per-mesh key; counts what it drops."""

    __slots__ = ("_key", "dropped")

    def __init__(self, key: bytes) -> None:
        self._key = key
        self.dropped = 0

    def pack(self, header: dict[str, Any], signed: Sequence[Frame] = (), data: Sequence[Frame] = ()) -> list[Frame]:
        header = dict(header)
        header["signed"] = len(signed)
        if data:
            header["lens"] = [memoryview(d).nbytes for d in data]
        h = json.dumps(header, separators=(",", ":")).encode()
        mac = hmac.new(self._key, h, hashlib.sha256)
        for f in signed:
            mac.update(f)
        return [mac.digest(), h, *signed, *data]

    def unpack(self, frames: Sequence[Frame]) -> tuple[dict[str, Any], list[Frame], list[Frame]]:
        """-> (header, signed frames, data frames); raises BadMessage (and counts it)."""
        try:
            if len(frames) < 2:
                raise BadMessage("too few frames")
            views = [memoryview(f) for f in frames]
            mac = hmac.new(self._key, views[1], hashlib.sha256)
            header_bytes = bytes(views[1])
            # The signed count is inside the header; a forged count cannot pass the MAC check
            # because the header itself is covered by it.
            n_signed = _peek_signed(header_bytes)
            if n_signed < 0 or 2 + n_signed > len(views):
                raise BadMessage("bad frame count")
            for v in views[2 : 2 + n_signed]:
                mac.update(v)
            if not hmac.compare_digest(mac.digest(), bytes(views[0])):
                raise BadMessage("bad signature")
            header = json.loads(header_bytes)
            data = list(frames[2 + n_signed :])
            lens = header.get("lens", [])
            if len(lens) != len(data) or any(
                memoryview(d).nbytes != n for d, n in zip(data, lens, strict=True)
            ):
                raise BadMessage("data frames do not match the signed lengths")
            return header, list(frames[2 : 2 + n_signed]), data
        except BadMessage:
            self.dropped += 1
            raise
        except Exception as exc:  # malformed JSON, non-buffer frames...
            self.dropped += 1
            raise BadMessage(str(exc)) from None


def _peek_signed(header: bytes) -> int:
    # Cheap scan for '"signed":N' so the MAC can be checked before json.loads runs on
    # untrusted input.
    i = header.rfind(b'"signed":')
    if i < 0:
        raise BadMessage("no signed count")
    j = i + 9
    k = j
    while k < len(header) and 48 <= header[k] <= 57:
        k += 1
    if k == j:
        raise BadMessage("bad signed count")
    return int(header[j:k])
