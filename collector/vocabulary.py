"""One name and one unit per metric, from the hook to the dashboard.

Every quantity Eagle Eye reads has one canonical name and unit (the names of the trace
format, docs/trace-format.md). What other sources call it (dcgm-exporter's field names,
the NVML poller's names, the hook's ``section.data`` and ``collective_time``, a value in
seconds where ours is in milliseconds) is an *alias*: a name and the factor that turns
its value into the canonical unit. Conversion happens once, at the edge (trace loading,
the detectors' input, the exporter), through the functions below; docs/metrics.md lists
every metric, who emits it and who reads it.

>>> canonical("DCGM_FI_DEV_FB_USED", 1024.0)  # MiB of framebuffer -> GB
('mem_used', 1.073741824)
>>> canonical("gpu_temp_c", 71.0)
('gpu_temp', 71.0)
>>> canonical_name("step_time_ms"), canonical("step_time_ms", 250.0)[1]
('step_time', 0.25)
>>> canonical("my_own_metric", 3.0)  # unknown names pass through unchanged
('my_own_metric', 3.0)
>>> canonical_values({"section.data": 0.05, "loss": 2.0})
{'data_wait_ms': 50.0, 'loss': 2.0}
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from collector._metric_table import TABLE

#: Unit -> (Prometheus base unit, factor to it). Units without an entry are their own base.
BASE_UNITS: Mapping[str, tuple[str, float]] = MappingProxyType(
    {
        "s": ("seconds", 1.0),
        "ms": ("seconds", 1e-3),
        "GB": ("bytes", 1e9),
        "B": ("bytes", 1.0),
        "°C": ("celsius", 1.0),
        "%": ("ratio", 0.01),
        "W": ("watts", 1.0),
        "J": ("joules", 1.0),
        "MHz": ("hertz", 1e6),
        "Gbit/s": ("bits_per_second", 1e9),
        "B/s": ("bytes_per_second", 1.0),
    }
)


@dataclass(frozen=True, slots=True)
class Alias:
    """Another name for a metric: ``canonical value = value * scale``."""

    name: str
    scale: float = 1.0
    source: str = ""  # who uses this name: "hook", "nvml", "dcgm", "host", "unit", "export"


@dataclass(frozen=True, slots=True)
class Metric:
    """A canonical metric.

    Attributes:
        name: the canonical name (the trace format's, where it has one).
        unit: the canonical unit ("s", "ms", "GB", "°C", "%", "MHz", "count", "0/1", ...).
        help: what it measures, in one line.
        aliases: the other names it goes by, each with its factor to ``unit``.
        scope: what one value is about: "rank", "gpu", "node" or "job".
        kind: "gauge", "counter" (cumulative) or "event" (reported when it happens).
    """

    name: str
    unit: str
    help: str
    aliases: tuple[Alias, ...] = field(default=())
    scope: str = "rank"
    kind: str = "gauge"

    @property
    def base_unit(self) -> str:
        """The Prometheus base unit of this metric ("seconds", "bytes", ...)."""
        return BASE_UNITS.get(self.unit, (self.unit, 1.0))[0]

    def to_base(self, value: float) -> float:
        """A canonical value in the Prometheus base unit (ms -> seconds, GB -> bytes)."""
        return value * BASE_UNITS.get(self.unit, ("", 1.0))[1]


def _build() -> tuple[dict[str, Metric], dict[str, tuple[str, float]]]:
    metrics: dict[str, Metric] = {}
    aliases: dict[str, tuple[str, float]] = {}
    for name, unit, scope, kind, help_text, alias_rows in TABLE:
        entry = Metric(name, unit, help_text, tuple(Alias(*a) for a in alias_rows), scope, kind)
        if name in metrics:
            raise ValueError(f"metric {name!r} is listed twice")
        metrics[name] = entry
    for entry in metrics.values():
        for alias in entry.aliases:
            if alias.name in metrics or alias.name in aliases:
                raise ValueError(f"alias {alias.name!r} of {entry.name!r} is taken")
            aliases[alias.name] = (entry.name, alias.scale)
    return metrics, aliases


_METRICS, _ALIASES = _build()
#: Canonical name -> Metric, for every metric Eagle Eye knows.
METRICS: Mapping[str, Metric] = MappingProxyType(_METRICS)
#: Alias -> (canonical name, factor to the canonical unit).
ALIASES: Mapping[str, tuple[str, float]] = MappingProxyType(_ALIASES)
#: Name families: every ``section.<name>`` is a section time in seconds (the hook's).
SECTION_PREFIX = "section."
_TOTAL = "_total"


def _resolve(name: str) -> tuple[str, float] | None:
    """(canonical, factor) of an alias; Prometheus's ``_total`` on a counter's samples
    (``DCGM_FI_DEV_PCIE_REPLAY_COUNTER_total``) is the same name."""
    hit = _ALIASES.get(name)
    if hit is None and name.endswith(_TOTAL) and name not in _METRICS:
        bare = name[: -len(_TOTAL)]
        hit = _ALIASES.get(bare) or ((bare, 1.0) if bare in _METRICS else None)
    return hit


def canonical_name(name: str) -> str:
    """The canonical name of ``name`` (itself when canonical or unknown)."""
    hit = _resolve(name)
    return hit[0] if hit is not None else name


def canonical(name: str, value: float) -> tuple[str, float]:
    """``(canonical name, value in the canonical unit)``; unknown names pass unchanged."""
    hit = _resolve(name)
    if hit is None:
        return name, value
    return hit[0], value * hit[1]


def scale_of(name: str) -> float:
    """The factor that turns a value named ``name`` into its canonical unit (1 if none)."""
    hit = _resolve(name)
    return 1.0 if hit is None else hit[1]


def canonical_values(values: Mapping[str, float]) -> dict[str, float]:
    """A mapping of named values in canonical names and units.

    When a canonical name and one of its aliases are both present, the canonical value
    wins (it is what the reporter meant; the alias is usually a raw source beside it).
    """
    present = {name for name in values if _resolve(name) is None}
    out: dict[str, float] = {}
    for name, value in values.items():
        hit = _resolve(name)
        if hit is None:
            out[name] = value
        elif hit[0] not in present and hit[0] not in out:
            out[hit[0]] = value * hit[1]
    return out


def lookup(name: str) -> Metric | None:
    """The Metric a name (canonical or alias) stands for, or None when unknown."""
    metric = _METRICS.get(canonical_name(name))
    if metric is None and name.startswith(SECTION_PREFIX):
        return Metric(name, "s", f"time spent in the {name[len(SECTION_PREFIX) :]!r} section")
    return metric


def is_canonical(name: str) -> bool:
    """Whether ``name`` is a canonical metric name (or a ``section.<name>``)."""
    return name in _METRICS or (name.startswith(SECTION_PREFIX) and _resolve(name) is None)


__all__ = [
    "ALIASES",
    "BASE_UNITS",
    "METRICS",
    "SECTION_PREFIX",
    "Alias",
    "Metric",
    "canonical",
    "canonical_name",
    "canonical_values",
    "is_canonical",
    "lookup",
    "scale_of",
]
