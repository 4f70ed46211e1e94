from __future__ import annotations

import shutil

import pytest

PROMTOOL = shutil.which("promtool")
AMTOOL = shutil.which("amtool")
PROMETHEUS = shutil.which("prometheus")
ALERTMANAGER = shutil.which("prometheus-alertmanager") or shutil.which("alertmanager")


def need(binary: str | None, name: str) -> str:
    if binary is None:
        pytest.skip(f"{name} is absent; run scripts/install-system-deps.sh")
    return binary
