"""The detectors' edge: what every detector may assume about the frames it reads.

Telemetry arrives in its sources' names and units, with cumulative counters, and with
the hook's raw timings; the pipeline passes each frame and step through ``Edge`` once:

* names and units become canonical (collector.vocabulary): ``DCGM_FI_DEV_FB_USED`` in MiB
  is ``mem_used`` in GB, ``section.data`` in seconds is ``data_wait_ms``;
* derived features are added when absent: ``compute_ms`` (the step less collectives,
  data wait and checkpoint: the rank's own work), ``throttle_thermal`` (from NVML's
  throttle-reason bits), and ``<counter>_rate`` per second for every cumulative counter
  (NIC errors, ECC counts), from its change since the rank's previous report;
* ``since_launch``: the steps a rank has reported since it was (re)launched (or first
  seen), present while any rank is within ``WARM_HORIZON`` steps of it. A ``launched``
  report or a completed step (``step_time``) that goes back (a restart from a checkpoint)
  starts it again: a warming rank is no outlier. A scrape stamped with the step in
  progress may arrive before the previous step's completion (a node's clock a little
  behind): that is no restart.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from collector.types import Frame
from collector.vocabulary import METRICS
from detectors._canonical import canonical_batch, canonical_frame
from detectors._layout import RankLayout, to_slots
from detectors.stepbatch import StepBatch

#: Steps after a launch during which ``since_launch`` is reported.
WARM_HORIZON = 64
THERMAL_BITS = 0x20 | 0x40  # NVML clock-event reasons: software and hardware thermal
COUNTERS = frozenset(m.name for m in METRICS.values() if m.kind == "counter")


def derive(values: dict[str, float]) -> dict[str, float]:
    """Adds the features a frame's own values imply (``compute_ms``, ``throttle_thermal``)."""
    if "step_time" in values and "compute_ms" not in values:
        checkpoint = 1000.0 * values.get("section.checkpoint", 0.0)
        own = 1000.0 * values["step_time"] - checkpoint
        own -= values.get("comm_ms", 0.0) + values.get("data_wait_ms", 0.0)
        values["compute_ms"] = max(own, 0.0)
    reasons = values.get("throttle_reasons")
    if reasons is not None and "throttle_thermal" not in values and np.isfinite(reasons):
        values["throttle_thermal"] = float(int(reasons) & THERMAL_BITS != 0)
    return values


class Edge:
    """Stateful conversion of frames and steps for the detectors (see the module doc)."""

    def __init__(self) -> None:
        self._layout = RankLayout()
        self._since = np.zeros(0)
        self._last_step = np.zeros(0)
        self._last_done = np.zeros(0)  # the newest completed step (``step_time``) of a rank
        self._counters: dict[str, tuple[np.ndarray, np.ndarray]] = {}  # value, time per slot

    def frame(self, frame: Frame) -> Frame:
        """One frame: a rank's step goes through ``batch``; others are only derived."""
        frame = canonical_frame(frame)
        rank = frame.subject.rank
        if rank is None:
            return replace(frame, values=derive(dict(frame.values)))
        if frame.step is None:
            if "launched" in frame.values:  # a lifecycle report: the warm-up starts over
                slots = self._layout.rows_to_slots(
                    np.array([rank]), np.array([frame.subject.node or ""], dtype=object)
                )
                self._grow(len(self._layout.ranks))
                slot = 0 if slots is None else int(slots[0])
                self._since[slot], self._last_step[slot] = 0.0, -np.inf
                self._last_done[slot] = -np.inf
            return frame
        (out,) = self.batch(StepBatch.from_frames([frame])).frames()
        return replace(frame, values=out.values)

    def batch(self, batch: StepBatch) -> StepBatch:
        # Column-major from here on: every detector reads the step a feature at a time.
        batch = canonical_batch(batch).column_major()
        slots = self._layout.rows_to_slots(batch.ranks, batch.nodes, batch.replicas)
        self._grow(len(self._layout.ranks))
        extra: dict[str, np.ndarray] = {}
        self._derive_columns(batch, extra)
        self._rates(batch, slots, extra)
        since = self._launches(batch, slots)
        if since is not None:
            extra["since_launch"] = since
        return _with_columns(batch, extra)

    def _grow(self, size: int) -> None:
        extra = size - len(self._since)
        if extra > 0:
            self._since = np.concatenate([self._since, np.zeros(extra)])
            self._last_step = np.concatenate([self._last_step, np.full(extra, -np.inf)])
            self._last_done = np.concatenate([self._last_done, np.full(extra, -np.inf)])
            for name, (value, time) in self._counters.items():
                self._counters[name] = (
                    np.concatenate([value, np.full(extra, np.nan)]),
                    np.concatenate([time, np.full(extra, np.nan)]),
                )

    def _derive_columns(self, batch: StepBatch, extra: dict[str, np.ndarray]) -> None:
        has = set(batch.features)
        if "step_time" in has and "compute_ms" not in has:
            own = 1000.0 * batch.column("step_time")
            if "section.checkpoint" in has:  # reported on checkpoint steps only
                own = own - 1000.0 * np.nan_to_num(batch.column("section.checkpoint"))
            for name in ("comm_ms", "data_wait_ms"):
                if name in has:
                    own = own - _part(batch.column(name))
            extra["compute_ms"] = np.maximum(own, 0.0)
        if "throttle_reasons" in has and "throttle_thermal" not in has:
            reasons = batch.column("throttle_reasons")
            known = np.isfinite(reasons)
            bits = np.where(known, reasons, 0).astype(np.int64) & THERMAL_BITS
            extra["throttle_thermal"] = np.where(known, (bits != 0).astype(float), np.nan)

    def _rates(
        self, batch: StepBatch, slots: np.ndarray | None, extra: dict[str, np.ndarray]
    ) -> None:
        size = len(self._since)
        for name in COUNTERS.intersection(batch.features):
            value = to_slots(batch.column(name), slots, size)
            old, when = self._counters.get(name, (np.full(size, np.nan), np.full(size, np.nan)))
            dt = batch.time - when
            with np.errstate(invalid="ignore", divide="ignore"):
                rate = (value - old) / dt
            rate[~(dt > 0) | (rate < 0)] = np.nan  # first report, or a counter reset
            seen = np.isfinite(value)
            old, when = old.copy(), when.copy()
            old[seen], when[seen] = value[seen], batch.time
            self._counters[name] = (old, when)
            extra[f"{name}_rate"] = rate if slots is None else rate[slots]

    def _launches(self, batch: StepBatch, slots: np.ndarray | None) -> np.ndarray | None:
        """Steps each rank reported since its launch, the current one included."""
        size = len(self._since)
        present = batch.present if batch.present is not None else np.isfinite(batch.values)
        here = to_slots(present.any(axis=1).astype(float), slots, size) > 0
        stepped = here
        if "launched" in batch.features:
            launched = to_slots(batch.reported("launched").astype(float), slots, size) > 0
            self._since[launched] = 0.0
            self._last_step[launched] = self._last_done[launched] = -np.inf
            stepped = here & ~launched
        step = float(batch.step)
        newer = stepped & (step > self._last_step)
        if newer.all():  # the usual step: every rank moved on
            self._since += 1.0
        else:
            self._since[newer] += 1.0
        if "step_time" in batch.features:  # only a completed step going back is a restart
            done = stepped & (to_slots(batch.reported("step_time").astype(float), slots, size) > 0)
            self._since[done & (step < self._last_done)] = 1.0  # this step is its first
            self._last_done[done] = step
        if stepped.all():
            self._last_step.fill(step)
        else:
            self._last_step[stepped] = step
        if self._since.min(initial=WARM_HORIZON) >= WARM_HORIZON:
            return None
        return self._since.copy() if slots is None else self._since[slots]


def _part(column: np.ndarray) -> np.ndarray:
    """A part of the step time to take out of it: 0 where no rank of the step reported
    the part, NaN where this rank did not while its peers did (its compute is then
    unknown: taken as the whole step, a rank that missed one report would look slow)."""
    return column if np.isfinite(column).any() else np.zeros_like(column)


def _with_columns(batch: StepBatch, extra: dict[str, np.ndarray]) -> StepBatch:
    """The batch with extra columns (features it already has are left as they are)."""
    extra = {k: v for k, v in extra.items() if k not in batch.features}
    if not extra:
        return batch
    names = tuple(extra)
    width = len(batch.features)
    values = np.empty((len(batch.ranks), width + len(names)), order="F")
    values[:, :width] = batch.values
    for j, name in enumerate(names, width):
        values[:, j] = extra[name]
    present = None
    if batch.present is not None:
        present = np.empty(values.shape, dtype=bool, order="F")
        present[:, :width] = batch.present
        for j, name in enumerate(names, width):
            present[:, j] = np.isfinite(extra[name])
    return replace(batch, features=batch.features + names, values=values, present=present)
