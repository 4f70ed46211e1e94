"""Follows a growing text file (a log) without blocking, one complete line at a time."""

from __future__ import annotations

import os
from collections import Counter

#: Most bytes one read takes; a huge backlog is read over several calls.
MAX_CHUNK = 16 * 1024 * 1024
#: An unfinished line longer than this is garbage, not a line still being written.
MAX_PARTIAL = 16384


class FileTail:
    """Returns what was appended to a file since the last call, in whole lines.

    A file that shrank (rotated or truncated) is read again from its start. A missing or
    unreadable file counts ``read_error`` in :attr:`dropped` and yields nothing.
    """

    def __init__(self, path: str | os.PathLike[str], *, max_chunk: int | None = None) -> None:
        self.path = os.fspath(path)
        self.max_chunk = max_chunk or MAX_CHUNK
        self._offset = 0
        self._partial = ""
        self.dropped: Counter[str] = Counter()

    def read_lines(self) -> str:
        """The complete lines appended since the last call (possibly empty)."""
        try:
            size = os.path.getsize(self.path)
            if size < self._offset:
                self._offset, self._partial = 0, ""
            with open(self.path, "rb") as f:
                f.seek(self._offset)
                chunk = f.read(min(size - self._offset, self.max_chunk))
        except OSError:
            self.dropped["read_error"] += 1
            return ""
        self._offset += len(chunk)
        text = self._partial + chunk.decode("utf-8", "replace")
        # A line still being written waits for the next call.
        complete, _, self._partial = text.rpartition("\n")
        if len(self._partial) > MAX_PARTIAL:
            self._partial = ""
            self.dropped["line_too_long"] += 1
        return complete
