"""Name → factory map of detectors, plus entry-point plugins (group ``eagleeye.detectors``).

Built-ins are registered by plain calls at the bottom of this module; third parties
register through entry points, loaded once by ``load_plugins()``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from importlib.metadata import entry_points
from typing import Any

from detectors.base import Detector
from detectors.errors import DetectorError, UnknownDetectorError

DetectorFactory = Callable[..., Detector]
DETECTORS: dict[str, DetectorFactory] = {}
ENTRY_POINT_GROUP = "eagleeye.detectors"


def register(name: str, factory: DetectorFactory) -> None:
    """Adds a detector factory; a name that exists already is an error."""
    if name in DETECTORS:
        raise DetectorError(f"detector {name!r} is already registered")
    DETECTORS[name] = factory


def create(name: str, params: Mapping[str, Any] | None = None) -> Detector:
    """Builds a registered detector with keyword parameters."""
    try:
        factory = DETECTORS[name]
    except KeyError:
        known = ", ".join(sorted(DETECTORS))
        raise UnknownDetectorError(f"unknown detector {name!r}; known: {known}") from None
    try:
        return factory(**dict(params or {}))
    except TypeError as exc:
        raise DetectorError(f"bad parameters for detector {name!r}: {exc}") from None


def load_plugins() -> None:
    """Registers the detectors that installed distributions declare as entry points."""
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        if ep.name not in DETECTORS:
            register(ep.name, ep.load())


def _register_builtins() -> None:
    from detectors.changepoint import ThroughputChange
    from detectors.generic import GenericPeer
    from detectors.hang import CollectiveHang
    from detectors.learned import autoencoder, isolation_forest, lstm_vae, pca_reconstruction
    from detectors.numerics import Divergence, grad_norm_spike, loss_spike
    from detectors.peer import PeerOutlier
    from detectors.progress import ProgressStall
    from detectors.quiet import QuietJob
    from detectors.rules import (
        CollectiveTimeout,
        MemoryFatal,
        NonFiniteLoss,
        ProcessExit,
        ThermalThrottle,
        XidError,
    )
    from detectors.trend import Trend

    register("process_exit", ProcessExit)
    register("non_finite_loss", NonFiniteLoss)
    register("progress_stall", ProgressStall)
    register("xid", XidError)
    register("memory_fatal", MemoryFatal)
    register("collective_timeout", CollectiveTimeout)
    register("thermal_throttle", ThermalThrottle)
    register("collective_hang", CollectiveHang)
    register("peer_outlier", PeerOutlier)
    register("loss_spike", loss_spike)
    register("grad_norm_spike", grad_norm_spike)
    register("throughput_change", ThroughputChange)
    register("divergence", Divergence)
    register("trend", Trend)
    register("generic_peer", GenericPeer)
    register("when_quiet", QuietJob)
    register("isolation_forest", isolation_forest)
    register("pca_reconstruction", pca_reconstruction)
    register("autoencoder", autoencoder)
    register("lstm_vae", lstm_vae)


_register_builtins()
