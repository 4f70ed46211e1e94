"""Eagle Eye: keeps large training jobs productive.

In a training loop::

    import eagleeye

    ee = eagleeye.init()
    restored = ee.load_checkpoint()
    for step in range(start, steps):
        ee.step_start(step)
        with ee.section("forward"):
            loss = ...
        ee.step_end(step, loss=loss.item())

The CLI is ``eagleeye`` (see ``eagleeye --help``). Imports are lazy, so the CLI starts fast.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from eagleeye.session import RankSession, init

__all__ = ["RankSession", "init"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from eagleeye import session

        return getattr(session, name)
    raise AttributeError(f"module 'eagleeye' has no attribute {name!r}")
