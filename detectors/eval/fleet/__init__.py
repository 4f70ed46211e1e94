"""A second trace generator, designed apart from detectors.eval.generate.

It simulates a synchronous data-parallel job event by event and writes what its sources
would report, in their own names: step reports with the hook's section and collective
times in seconds, dcgm-exporter GPU polls (``DCGM_FI_DEV_*``, framebuffer in MiB) and
node-exporter NIC counters at their own scrape times, collective-wait reports, process
exits and relaunches. See docs/trace-format.md ("A second generator").
"""

from __future__ import annotations

from detectors.eval.fleet.plan import FLEET_FAULTS, FleetSpec
from detectors.eval.fleet.run import simulate

__all__ = ["FLEET_FAULTS", "FleetSpec", "simulate"]
