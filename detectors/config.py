"""Detector configuration: which detectors run, with which parameters, and how to fuse.

Precedence: explicit arguments > the file named by ``EAGLEEYE_DETECTORS_CONFIG`` > defaults.
A config file is TOML::

    [[detectors]]
    name = "peer_outlier"
    params = { z = 6.0, persistence = 3 }

    [fusion]
    hold_steps = 2

    [hang]             # the limits of hang detection in a live run (detectors.progress)
    stopped_s = 0.5
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from detectors.errors import DetectorError
from detectors.fusion import FusionPolicy
from detectors.pipeline import DetectorPipeline
from detectors.progress import HangLimits
from detectors.registry import create

CONFIG_ENV = "EAGLEEYE_DETECTORS_CONFIG"
"""Path of a TOML file with ``[[detectors]]`` entries and a ``[fusion]`` table."""


@dataclass(frozen=True)
class DetectorSpec:
    """One detector of the pipeline: its registry name and keyword parameters."""

    name: str
    params: Mapping[str, Any] = field(default_factory=dict)


#: The default pipeline for per-step rank telemetry: every fault class of FAULTS.md.
DEFAULT_SPECS: tuple[DetectorSpec, ...] = (
    DetectorSpec("process_exit"),
    DetectorSpec("non_finite_loss"),
    DetectorSpec("xid"),
    DetectorSpec("memory_fatal"),
    DetectorSpec("collective_timeout"),
    DetectorSpec("collective_hang", {"k": 4.0, "min_silence_s": 15.0}),
    DetectorSpec("peer_outlier"),
    DetectorSpec("trend"),
    DetectorSpec("generic_peer"),
    DetectorSpec("loss_spike"),
    DetectorSpec("grad_norm_spike"),
    DetectorSpec("throughput_change", {"h": 1.0}),
    DetectorSpec("divergence"),
)


@dataclass(frozen=True)
class DetectorsConfig:
    """The detectors to run, the fusion policy and the limits of live hang detection."""

    specs: tuple[DetectorSpec, ...] = DEFAULT_SPECS
    fusion: FusionPolicy = field(default_factory=FusionPolicy)
    hang: HangLimits = field(default_factory=HangLimits)

    def build(self) -> DetectorPipeline:
        """A fresh pipeline (every detector newly constructed, no learnt state)."""
        return DetectorPipeline([create(s.name, s.params) for s in self.specs], self.fusion)


def load_config(path: Path | None = None) -> DetectorsConfig:
    """Reads a TOML config (``path``, else $EAGLEEYE_DETECTORS_CONFIG, else defaults).

    Raises:
        DetectorError: the file is missing, is not TOML, or has a malformed entry.
    """
    if path is None:
        env = os.environ.get(CONFIG_ENV)
        if not env:
            return DetectorsConfig()
        path = Path(env)
    try:
        data = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise DetectorError(f"cannot read detector config {path}: {exc}") from None
    return from_mapping(data, str(path))


def from_mapping(data: Mapping[str, Any], origin: str = "config") -> DetectorsConfig:
    """Builds a config from parsed TOML data; missing sections keep their defaults."""
    specs = DEFAULT_SPECS
    if "detectors" in data:
        specs = tuple(_spec(entry, origin) for entry in data["detectors"])
    try:
        fusion = FusionPolicy(**data.get("fusion", {}))
    except (TypeError, ValueError) as exc:
        raise DetectorError(f"{origin}: bad [fusion] table: {exc}") from None
    hang = data.get("hang", {})
    if not isinstance(hang, Mapping):
        raise DetectorError(f"{origin}: [hang] must be a table of limits")
    return DetectorsConfig(specs, fusion, HangLimits.from_mapping(hang, f"{origin}: [hang]"))


def _spec(entry: Any, origin: str) -> DetectorSpec:
    if not isinstance(entry, Mapping) or "name" not in entry:
        raise DetectorError(f"{origin}: each [[detectors]] entry needs a name, got {entry!r}")
    params = entry.get("params", {})
    if not isinstance(params, Mapping):
        raise DetectorError(f"{origin}: params of {entry['name']!r} must be a table")
    return DetectorSpec(str(entry["name"]), dict(params))


def specs_names(specs: Sequence[DetectorSpec]) -> list[str]:
    return [s.name for s in specs]
