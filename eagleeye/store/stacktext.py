"""How a rank's stacks name their host in the store's ``stacks`` table.

The table (schema version 3) has no host column: a stack read on another host (across
hosts, by that host's agent) is stored with a first line ``host NAME``, which
``RunReader.stacks()`` takes off into a ``host`` column (empty for a stack of
``eagleeye run``, read on its own machine). No stack text of py-spy (``Process ...``),
faulthandler (``Thread ...``) or a missing one (``no stacks: ...``) starts so.

>>> with_host("Thread 1", "b7")
'host b7\\nThread 1'
>>> split_host(with_host("Thread 1", "b7"))
('b7', 'Thread 1')
>>> split_host("Thread 1")
('', 'Thread 1')
"""

from __future__ import annotations

_PREFIX = "host "


def with_host(text: str, host: str) -> str:
    """``text`` as stored: after a ``host NAME`` line when a host is named."""
    host = "".join(host.split())  # one word on one line
    return f"{_PREFIX}{host}\n{text}" if host else text


def split_host(text: str) -> tuple[str, str]:
    """The host a stored text names ("" for none) and the text without that line."""
    if not text.startswith(_PREFIX) or "\n" not in text:
        return "", text
    first, rest = text.split("\n", 1)
    return first[len(_PREFIX) :], rest


__all__ = ["split_host", "with_host"]
