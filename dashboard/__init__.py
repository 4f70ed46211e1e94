"""Streamlit pages that read the run store."""

from __future__ import annotations

__all__: list[str] = []
