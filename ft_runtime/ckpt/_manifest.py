"""The manifest of a persisted shard: its format, and each file's size and checksum.

A file's checksum is a list of digests of its consecutive blocks (the last one shorter),
so a reader verifies blocks in parallel threads, each hashing the bytes it has just read
into their destination. The manifest names the algorithm and the block size::

    "files": {"__0_0.distcp": {"bytes": N, "checksum":
        {"algorithm": "sha256", "block_bytes": 16777216, "digests": ["9f2c...", ...]}}}

Manifests of the first format (``eagleeye-ckpt/1``) carry one sha256 of the whole file
(``{"bytes": N, "sha256": "..."}``); they read as a single block of the file's size.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any, BinaryIO

from ft_runtime.errors import CheckpointError

MANIFEST = "manifest.json"
FORMAT = "eagleeye-ckpt/2"
FORMATS = ("eagleeye-ckpt/1", FORMAT)  # what a reader accepts
BLOCK_BYTES = 16 << 20
_ALGORITHMS = ("sha256",)
PIECE_BYTES = 4 << 20  # bytes per read while hashing: the piece is still in cache when hashed


class CorruptCheckpoint(CheckpointError):
    """A persisted shard fails verification (checksum, size or manifest)."""


@dataclass(frozen=True, slots=True)
class Checksum:
    """Digests (``algorithm``, a hashlib name) of a file's consecutive ``block_bytes``
    blocks."""

    algorithm: str
    block_bytes: int
    digests: tuple[str, ...]

    def to_json(self) -> dict[str, Any]:
        return {
            "algorithm": self.algorithm,
            "block_bytes": self.block_bytes,
            "digests": list(self.digests),
        }

    @classmethod
    def from_manifest(cls, info: dict[str, Any], nbytes: int, where: str) -> Checksum:
        """The checksum of one manifest file entry of either format.

        Raises:
            CorruptCheckpoint: an unknown algorithm, or digests that do not cover the file.
        """
        if "checksum" in info:
            c = info["checksum"]
            out = cls(str(c["algorithm"]), int(c["block_bytes"]), tuple(map(str, c["digests"])))
        else:  # the first format: one sha256 of the whole file
            out = cls("sha256", max(nbytes, 1), (str(info["sha256"]),))
        if out.algorithm not in _ALGORITHMS:
            raise CorruptCheckpoint(
                f"{where}: checksum algorithm {out.algorithm!r} is not one of {_ALGORITHMS}"
            )
        if out.block_bytes <= 0 or len(out.digests) != n_blocks(nbytes, out.block_bytes):
            raise CorruptCheckpoint(
                f"{where}: {len(out.digests)} digests of {out.block_bytes}-byte blocks do not "
                f"cover its {nbytes} bytes"
            )
        return out

    def block(self, i: int, nbytes: int) -> tuple[int, int]:
        """Byte range ``[start, end)`` of block ``i`` of a file of ``nbytes``."""
        return i * self.block_bytes, min(nbytes, (i + 1) * self.block_bytes)


def n_blocks(nbytes: int, block_bytes: int) -> int:
    """Blocks of a file; an empty file has one (empty) block."""
    return max(1, -(-nbytes // block_bytes))


def compute(f: BinaryIO, nbytes: int, block_bytes: int = BLOCK_BYTES) -> Checksum:
    """Checksums the ``nbytes`` of ``f`` (read from its start) block by block, in one pass.

    Raises:
        OSError: the file is shorter than ``nbytes``.
    """
    digests = []
    scratch = memoryview(bytearray(min(PIECE_BYTES, max(nbytes, 1))))
    for i in range(n_blocks(nbytes, block_bytes)):
        h = hashlib.sha256()
        left = min(nbytes, (i + 1) * block_bytes) - i * block_bytes
        while left:
            mv = scratch[: min(left, len(scratch))]
            got = f.readinto(mv)  # type: ignore[attr-defined]
            if not got:
                raise OSError(f"{getattr(f, 'name', f)} ended {left} bytes early while hashed")
            h.update(mv[:got])
            left -= got
        digests.append(h.hexdigest())
    return Checksum("sha256", block_bytes, tuple(digests))
