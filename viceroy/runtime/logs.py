"""Rank output on the controller: decoded in order per rank, kept in a bounded tail for
`mesh.logs(rank)`, and optionally echoed as ``[rank] line``."""

from __future__ import annotations

import codecs
import sys
import threading
from collections import deque


class RankLogs:
    def __init__(self, echo: bool, max_lines: int = 5000) -> None:
        self._echo = echo
        self._max_lines = max_lines
        self._lock = threading.Lock()
        self._tails: dict[int, deque[str]] = {}
        self._appended: dict[int, int] = {}  # lines ever added to each rank's tail (see `mark`)
        self._partial: dict[tuple[int, str], str] = {}
        self._decoders: dict[tuple[int, str], codecs.IncrementalDecoder] = {}

    def feed(self, rank: int, stream: str, data: bytes) -> str:
        """Record a chunk; returns it decoded (split multi-byte characters are joined)."""
        key = (rank, stream)
        with self._lock:
            dec = self._decoders.get(key)
            if dec is None:
                dec = self._decoders[key] = codecs.getincrementaldecoder("utf-8")("replace")
            text = dec.decode(data)
            buf = self._partial.get(key, "") + text
            *lines, rest = buf.split("\n")
            self._partial[key] = rest
            tail = self._tails.setdefault(rank, deque(maxlen=self._max_lines))
            self._appended[rank] = self._appended.get(rank, 0) + len(lines)
            for line in lines:
                tail.append(line)
                if self._echo:
                    self._print(rank, stream, line)
        return text

    def flush(self) -> None:
        """Finish partial lines (at the end of a call)."""
        with self._lock:
            for (rank, stream), rest in list(self._partial.items()):
                if rest:
                    self._tails.setdefault(rank, deque(maxlen=self._max_lines)).append(rest)
                    self._appended[rank] = self._appended.get(rank, 0) + 1
                    if self._echo:
                        self._print(rank, stream, rest)
                    self._partial[(rank, stream)] = ""

    def mark(self, rank: int) -> int:
        """Where `rank`'s log is now: ``tail(rank, since=mark)`` gives only what came after."""
        with self._lock:
            return self._appended.get(rank, 0)

    def tail(self, rank: int, n: int = 200, since: int | None = None) -> str:
        with self._lock:
            lines = list(self._tails.get(rank, ()))
            if since is not None:  # only the lines added after that mark
                lines = lines[len(lines) - min(len(lines), self._appended.get(rank, 0) - since):]
            lines = lines[-n:]
            rest = [p for (r, _), p in self._partial.items() if r == rank and p]
        return "\n".join(lines + rest)

    @staticmethod
    def _print(rank: int, stream: str, line: str) -> None:
        out = sys.stderr if stream == "stderr" else sys.stdout
        # A carriage return redraws a progress bar; keep only what is visible.
        line = line.rsplit("\r", 1)[-1] if "\r" in line.rstrip("\r") else line.rstrip("\r")
        try:
            out.write(f"[{rank}] {line}\n")
            out.flush()
        except (OSError, ValueError):
            pass
