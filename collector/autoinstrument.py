"""Zero-code telemetry: what a training script reports without a line of Eagle Eye in it.

``ZeroCode(hook).start()`` arranges for four things to be installed the moment the script
imports torch (at once if it has already), all through public PyTorch interfaces:

- ``collector.autostep``: step boundaries and step times from the global optimizer step
  hook, the loss from ``backward()``;
- ``collector.instrument``: enter and exit, op, bytes and group of every collective
  called through ``torch.distributed``;
- ``collector.ddp``: DistributedDataParallel's gradient all-reduce through PyTorch's
  reference comm hook, so the wrappers see it;
- ``collector.autosave``: the script's own checkpoints, from ``torch.save`` to a file.

A script that never imports torch (one that only prints) costs nothing: nothing is
imported for it. Errors while installing are logged and leave the script untouched.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import logging
import sys
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

from collector.hooks import TrainingHook

log = logging.getLogger(__name__)


class ZeroCode:
    """Installs the zero-code instrumentation into this interpreter (see the module)."""

    def __init__(self, hook: TrainingHook) -> None:
        self.hook = hook
        self._undo: list[Callable[[], None]] = []
        self._finder: _AfterImport | None = None

    def start(self) -> None:
        """Installs now if torch is imported, else when the script imports it."""
        if "torch" in sys.modules:
            self._install(sys.modules["torch"])
        else:
            self._finder = _AfterImport("torch", self._install)
            sys.meta_path.insert(0, self._finder)

    @property
    def installed(self) -> bool:
        return bool(self._undo)

    def stop(self) -> None:
        """Removes everything installed (and the import watch, if torch never came)."""
        if self._finder is not None and self._finder in sys.meta_path:
            sys.meta_path.remove(self._finder)
        for undo in reversed(self._undo):
            undo()
        self._undo = []

    def _install(self, torch: ModuleType) -> None:
        from collector.autosave import watch_saves
        from collector.autostep import AutoSteps
        from collector.ddp import watch_ddp
        from collector.instrument import patch_collectives

        steps: Sequence[Callable[[], Callable[[], None]]] = (
            AutoSteps(self.hook).install,
            lambda: patch_collectives(self.hook),
            watch_ddp,
            lambda: watch_saves(self.hook),
        )
        for install in steps:
            try:
                self._undo.append(install())
            except Exception as exc:  # an older torch without a hook: that part stays off
                log.warning("eagleeye zero-code telemetry: part not installed: %s", exc)


class _AfterImport(importlib.abc.MetaPathFinder):
    """Calls ``then(module)`` once module ``name`` has been imported, by wrapping the
    loader the other finders return for it."""

    def __init__(self, name: str, then: Callable[[ModuleType], None]) -> None:
        self.name = name
        self.then = then

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != self.name:
            return None
        sys.meta_path.remove(self)  # once, and the search below must not find us again
        spec = importlib.util.find_spec(fullname)
        if spec is not None and spec.loader is not None:
            spec.loader = _Then(spec.loader, self.then)
        return spec


class _Then(importlib.abc.Loader):
    def __init__(self, loader: Any, then: Callable[[ModuleType], None]) -> None:
        self._loader = loader
        self._then = then

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self._loader.create_module(spec)  # type: ignore[no-any-return]

    def exec_module(self, module: ModuleType) -> None:
        self._loader.exec_module(module)
        module.__loader__ = self._loader  # the module keeps its own loader, not this one
        if module.__spec__ is not None:
            module.__spec__.loader = self._loader
        try:
            self._then(module)
        except Exception as exc:
            log.warning("eagleeye zero-code telemetry not installed: %s", exc)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._loader, name)
