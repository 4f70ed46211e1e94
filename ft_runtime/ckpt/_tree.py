"""Splits a state into tensors and a JSON tree of plain data, and joins them back.

This is what keeps loading safe: nothing is ever pickled. Dicts (with str, int, float,
bool or None keys), lists, tuples, str, int, float, bool, None, bytes and tensors are
accepted; anything else is refused at save time with the path that holds it.
"""

from __future__ import annotations

import base64
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from ft_runtime.errors import CheckpointError

_KEY_TYPES = (str, int, float, bool, type(None))


def flatten(state: Any) -> tuple[Any, list[tuple[str, torch.Tensor]]]:
    """Returns ``(tree, tensors)``: a JSON-serialisable tree with tensors replaced by
    ``{"t": index}`` and the ``(path, tensor)`` list in index order.

    Raises:
        CheckpointError: a value that is neither a tensor nor plain data.
    """
    tensors: list[tuple[str, torch.Tensor]] = []
    tree = _enc(state, "", tensors)
    return tree, tensors


def _enc(obj: Any, path: str, out: list[tuple[str, torch.Tensor]]) -> Any:
    if isinstance(obj, torch.Tensor):
        out.append((path or "root", obj))
        return {"t": len(out) - 1}
    if obj is None or isinstance(obj, bool | int | float | str):
        return obj
    if isinstance(obj, Mapping):
        items = []
        for k, v in obj.items():
            if not isinstance(k, _KEY_TYPES):
                raise CheckpointError(f"dict key {k!r} at {path or 'root'!r} is not plain data")
            items.append([k, _enc(v, f"{path}/{k}" if path else str(k), out)])
        return {"d": items}
    if isinstance(obj, tuple | list):
        vals = [_enc(v, f"{path}/{i}" if path else str(i), out) for i, v in enumerate(obj)]
        return {"u" if isinstance(obj, tuple) else "l": vals}
    if isinstance(obj, bytes):
        return {"b": base64.b64encode(obj).decode("ascii")}
    raise CheckpointError(
        f"{type(obj).__name__} at {path or 'root'!r} cannot be checkpointed: only tensors and "
        "plain data (dict, list, tuple, str, int, float, bool, None, bytes) are stored, so "
        "that loading never unpickles; convert it (e.g. a numpy array with torch.from_numpy)"
    )


def unflatten(tree: Any, tensors: Sequence[torch.Tensor]) -> Any:
    """Inverse of :func:`flatten`: rebuilds the state around ``tensors``.

    Raises:
        CheckpointError: a tree of the wrong shape (it comes from a file or a peer).
    """
    try:
        return _unflatten(tree, tensors)
    except CheckpointError:
        raise
    except (IndexError, KeyError, TypeError, ValueError, RecursionError) as exc:
        raise CheckpointError(f"malformed checkpoint tree ({exc!r:.200})") from None


def _unflatten(tree: Any, tensors: Sequence[torch.Tensor]) -> Any:
    if tree is None or isinstance(tree, bool | int | float | str):
        return tree
    if not isinstance(tree, dict) or len(tree) != 1:
        raise CheckpointError(f"malformed checkpoint tree node: {tree!r:.80}")
    ((tag, val),) = tree.items()
    if tag == "t":
        if isinstance(val, bool) or not isinstance(val, int) or not 0 <= val < len(tensors):
            raise CheckpointError(f"checkpoint tree names tensor {val!r:.40}, not one it holds")
        return tensors[val]
    if tag == "d":
        return {k: _unflatten(v, tensors) for k, v in val}
    if tag == "l":
        return [_unflatten(v, tensors) for v in val]
    if tag == "u":
        return tuple(_unflatten(v, tensors) for v in val)
    if tag == "b":
        return base64.b64decode(val, validate=True)
    raise CheckpointError(f"unknown checkpoint tree tag {tag!r}")
