"""Loads PyTorch flight-recorder pickles without running arbitrary code.

A pickle can name any importable callable, so ``pickle.load`` on a file from a crashed job
is code execution. The recorder's dumps (written by TorchScript's pickler) hold only dicts,
lists, tuples, strings, numbers, booleans and None, plus, in some versions, the pickler's
typed-list helpers ``torch.jit._pickle.build_*list``. Those are mapped to ``list``; any
other global, and any persistent id, is refused.
"""

from __future__ import annotations

import io
import pickle
from typing import Any

from collector.errors import ParseError

#: Dumps larger than this are refused before unpickling (the recorder's default buffer of
#: 2000 entries dumps to well under a megabyte without stack traces).
MAX_PICKLE_BYTES = 256 * 1024 * 1024

_TYPED_LISTS = frozenset(
    {"build_intlist", "build_doublelist", "build_boollist", "build_stringlist", "build_list"}
)


class _RestrictedUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if module == "torch.jit._pickle" and name in _TYPED_LISTS:
            return list
        raise ParseError(
            f"the pickle names {module}.{name}, which a flight-recorder dump never holds; "
            "refusing to load it (it could run code)"
        )

    def persistent_load(self, pid: Any) -> Any:
        raise ParseError("the pickle holds persistent ids (tensors?), which a dump never holds")


def safe_loads(data: bytes) -> Any:
    """Unpickles containers and scalars only.

    Raises:
        ParseError: the data is not a pickle, is truncated, is too large, or names any
            callable other than TorchScript's typed-list builders.
    """
    if len(data) > MAX_PICKLE_BYTES:
        raise ParseError(f"pickle of {len(data)} bytes is larger than {MAX_PICKLE_BYTES}")
    try:
        return _RestrictedUnpickler(io.BytesIO(data)).load()
    except ParseError:
        raise
    except Exception as exc:  # a corrupt pickle raises anything from EOFError to KeyError
        raise ParseError(f"not a readable pickle ({type(exc).__name__}: {exc})") from exc
