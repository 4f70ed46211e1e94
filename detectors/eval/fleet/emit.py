"""What the simulated sources report, written as the long rows of the trace format.

Each source speaks its own names: the hook (``step_time``, ``section.*`` and
``collective_time`` in seconds, ``in_collective`` seconds waited), dcgm-exporter
(``DCGM_FI_DEV_*``, framebuffer in MiB, the sticky XID gauge), NVML's XID events
(``gpu_xid``), node-exporter (``host_net_*_total`` counters) and the supervisor
(``exit_code``, ``collateral``, ``launched``). Readers map them to canonical names.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

from detectors.eval.trace import FaultWindow, Trace

MIB_PER_GB = 1e9 / 2**20


class Recorder:
    """Collects observations (a time, a step, and values of some ranks) in arrival order."""

    def __init__(self, ranks: int) -> None:
        self.ranks = ranks
        self._time: list[np.ndarray] = []
        self._step: list[np.ndarray] = []
        self._rank: list[np.ndarray] = []
        self._metric: list[np.ndarray] = []
        self._value: list[np.ndarray] = []
        self._names: dict[str, int] = {}

    def add(
        self,
        time: float,
        step: int,
        metric: str,
        values: np.ndarray | float,
        ranks: np.ndarray | None = None,
    ) -> None:
        """Values of ``metric`` reported at ``time`` by ``ranks`` (every rank by default)."""
        rows = np.arange(self.ranks) if ranks is None else np.asarray(ranks)
        if len(rows) == 0:
            return
        if np.ndim(values) == 0:
            vals = np.full(len(rows), float(values))
        else:
            vals = np.asarray(values, dtype=float)[rows]
        code = self._names.setdefault(metric, len(self._names))
        self._time.append(np.full(len(rows), time))
        self._step.append(np.full(len(rows), step, dtype=np.int64))
        self._rank.append(rows)
        self._metric.append(np.full(len(rows), code, dtype=np.int32))
        self._value.append(vals)

    def rows(self) -> pd.DataFrame:
        names = np.array(list(self._names), dtype=object)
        return pd.DataFrame(
            {
                "time": np.concatenate(self._time),
                "step": np.concatenate(self._step),
                "rank": np.concatenate(self._rank),
                "metric": names[np.concatenate(self._metric)],
                "value": np.concatenate(self._value),
            }
        )


def to_trace(
    rec: Recorder,
    job: str,
    node_of: np.ndarray,
    replicas: int,
    labels: Sequence[FaultWindow],
) -> Trace:
    """The recorded observations as a labelled trace in the documented format."""
    rows = rec.rows()
    n = rec.ranks
    rows["job"] = job
    rows["node"] = np.array([node_name(i) for i in node_of], dtype=object)[rows["rank"]]
    rows["replica"] = (rows["rank"].to_numpy() * replicas) // n
    ordered = rows.sort_values(["time", "rank"], kind="stable")
    return Trace.from_long(
        ordered[["time", "step", "job", "replica", "node", "rank", "metric", "value"]], labels
    )


def node_name(node: int) -> str:
    return f"host-{node:03d}"
