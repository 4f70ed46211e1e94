from __future__ import annotations

from pathlib import Path

import pytest

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


@pytest.fixture
def fixtures() -> Path:
    """The folder of canned inputs (exporter text, kernel logs, flight-recorder dumps)."""
    return FIXTURES
