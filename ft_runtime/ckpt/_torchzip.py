"""Where ``torch.save`` put a tensor's raw bytes inside a larger file, from the zip headers.

``torch.distributed.checkpoint`` writes each tensor with ``torch.save`` at some offset of a
``.distcp`` file. ``torch.save`` writes an uncompressed zip whose ``<archive>/data/<key>``
record holds the storage's raw bytes; knowing its offset lets a reader fetch the tensor
with one plain read, straight into its destination, and never touch the pickle beside it.
Only the zip's headers (a few KiB) are read here.
"""

from __future__ import annotations

import re
import struct
import sys
import zipfile
from typing import BinaryIO

_LOCAL_HEADER = struct.Struct("<IHHHHHIIIHH")
_LOCAL_SIG = 0x04034B50
_DATA_RECORD = re.compile(r"^[^/]+/data/\d+$")


class _Window:
    """The byte range ``[start, start+length)`` of a file, as a seekable file."""

    def __init__(self, f: BinaryIO, start: int, length: int) -> None:
        self.f, self.start, self.length, self.pos = f, start, length, 0

    def seek(self, off: int, whence: int = 0) -> int:
        base = (0, self.pos, self.length)[whence]
        self.pos = max(0, min(self.length, base + off))
        return self.pos

    def tell(self) -> int:
        return self.pos

    def read(self, n: int = -1) -> bytes:
        n = self.length - self.pos if n is None or n < 0 else min(n, self.length - self.pos)
        self.f.seek(self.start + self.pos)
        data = self.f.read(n)
        self.pos += len(data)
        return data

    def seekable(self) -> bool:
        return True


def tensor_data(f: BinaryIO, blob_offset: int, blob_length: int) -> tuple[int, int]:
    """``(file offset, length)`` of the raw bytes of the one tensor that ``torch.save``
    wrote at ``[blob_offset, blob_offset + blob_length)`` of ``f``.

    Raises:
        ValueError: the range is not a torch.save zip of exactly one uncompressed storage,
            or it was written with the other byte order.
    """
    w = _Window(f, blob_offset, blob_length)
    try:
        with zipfile.ZipFile(w) as z:
            infos = z.infolist()
            data = [i for i in infos if _DATA_RECORD.match(i.filename)]
            order = [i for i in infos if i.filename.endswith("/byteorder")]
            if order and z.read(order[0]).decode() != sys.byteorder:
                raise ValueError(f"tensor written {z.read(order[0]).decode()}-endian")
    except zipfile.BadZipFile as exc:
        raise ValueError(f"not a torch.save zip ({exc})") from None
    if len(data) != 1:
        raise ValueError(f"{len(data)} storage records where one tensor has one")
    info = data[0]
    if info.compress_type != zipfile.ZIP_STORED:
        raise ValueError(f"storage record {info.filename} is compressed")
    w.seek(info.header_offset)
    head = w.read(_LOCAL_HEADER.size)
    if len(head) != _LOCAL_HEADER.size or _LOCAL_HEADER.unpack(head)[0] != _LOCAL_SIG:
        raise ValueError(f"no zip header at {info.header_offset} for {info.filename}")
    fields = _LOCAL_HEADER.unpack(head)
    start = info.header_offset + _LOCAL_HEADER.size + fields[9] + fields[10]
    if start + info.file_size > blob_length:
        raise ValueError(f"storage record {info.filename} runs past its item")
    return blob_offset + start, info.file_size
