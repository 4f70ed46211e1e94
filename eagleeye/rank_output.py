"""The ranks' output on the console, as torchrun shows it: each line with its rank's prefix.

Each rank writes to its own log file (``logs/attempt-N/rank-R.log``, or
``logs/replica-R-I/rank-R.log`` under replica recovery); a thread follows those files and
prints their complete lines as ``[rank3]: ...``, for every rank or the chosen ones.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Collection
from pathlib import Path
from typing import TextIO

POLL_S = 0.1
READ_BYTES = 1 << 20


def parse_ranks(text: str) -> frozenset[int] | None:
    """``all`` (None: every rank), ``none`` (no rank) or a comma list such as ``0,3``.

    >>> sorted(parse_ranks("0,3") or ())
    [0, 3]
    """
    text = text.strip().lower()
    if text == "all":
        return None
    if text == "none":
        return frozenset()
    try:
        ranks = frozenset(int(part) for part in text.split(","))
    except ValueError:
        raise ValueError(f"{text!r} is not all, none or a comma list of ranks") from None
    if any(rank < 0 for rank in ranks):
        raise ValueError(f"{text!r} names a negative rank")
    return ranks


class RankOutput:
    """Follows the ranks' log files under ``log_root`` and prints them with rank prefixes.

    Args:
        log_root: the run's ``logs`` folder.
        ranks: the ranks to show (None: all).
        out: where lines go (stdout by default).
        skip_existing: start after what the logs already hold (a resumed run's earlier
            attempts were shown by their own run).
    """

    def __init__(
        self,
        log_root: Path,
        ranks: Collection[int] | None = None,
        out: TextIO | None = None,
        skip_existing: bool = False,
    ) -> None:
        self.log_root = log_root
        self.ranks = None if ranks is None else frozenset(ranks)
        self.out = out or sys.stdout
        self._offsets: dict[Path, int] = {}
        if skip_existing:
            self._offsets = {p: p.stat().st_size for p in log_root.glob("*/rank-*.log")}
        self._partial: dict[Path, bytes] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._follow, daemon=True, name="rank-output")

    def start(self) -> RankOutput:
        if self.ranks != frozenset():
            self._thread.start()
        return self

    def stop(self) -> None:
        """Prints what is left (partial last lines too) and stops following."""
        if self._thread.is_alive():
            self._stop.set()
            self._thread.join()
            self._read_all(final=True)

    def __enter__(self) -> RankOutput:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _follow(self) -> None:
        while not self._stop.wait(POLL_S):
            self._read_all(final=False)

    def _read_all(self, final: bool) -> None:
        for path in sorted(self.log_root.glob("*/rank-*.log"), key=_launch_order):
            rank = _rank_of(path)
            if rank is None or (self.ranks is not None and rank not in self.ranks):
                continue
            self._read(path, rank, final)

    def _read(self, path: Path, rank: int, final: bool) -> None:
        offset = self._offsets.get(path, 0)
        try:
            with open(path, "rb") as log:
                log.seek(offset)
                data = log.read(READ_BYTES)
        except OSError:
            return
        if not data and not final:
            return
        self._offsets[path] = offset + len(data)
        data = self._partial.pop(path, b"") + data
        lines = data.split(b"\n")
        rest = lines.pop()
        if rest and not final:
            self._partial[path] = rest
        elif rest:
            lines.append(rest)
        if lines:
            text = "".join(f"[rank{rank}]: {line.decode(errors='replace')}\n" for line in lines)
            try:
                self.out.write(text)
                self.out.flush()
            except (OSError, ValueError):  # the console went away: the logs keep everything
                self._stop.set()


def _rank_of(path: Path) -> int | None:
    try:
        return int(path.stem.removeprefix("rank-"))
    except ValueError:
        return None


def _launch_order(path: Path) -> tuple[float, str]:
    try:
        return path.stat().st_mtime, str(path)
    except OSError:
        return 0.0, str(path)
