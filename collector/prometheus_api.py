"""A Prometheus server's HTTP API (instant and range queries) into Samples.

For sites that already run Prometheus: Eagle Eye reads what it scrapes instead of scraping
the exporters again. A query answers with Samples whose name is the series' ``__name__``
(or the ``name`` given, for expressions such as ``rate(...)`` that have none) and whose
labels are the series' labels.

Example (against a running server)::

    client = PrometheusClient("http://127.0.0.1:9090")
    client.query('DCGM_FI_DEV_GPU_TEMP{hostname="gpu-node-07"}')
"""

from __future__ import annotations

import json
import logging
import math
import time as _time
from collections import Counter
from collections.abc import Mapping
from typing import Any

from collector import _http
from collector.errors import CollectorError
from collector.types import Sample

_log = logging.getLogger(__name__)

#: Prometheus refuses range queries of more points per series than this.
MAX_POINTS = 11000


class PrometheusQueryError(CollectorError):
    """Prometheus refused a query (bad PromQL, bad range) or answered something unreadable."""


class PrometheusClient:
    """Instant and range queries against one Prometheus server.

    Args:
        url: the server's base URL, e.g. ``http://127.0.0.1:9090``.
        timeout: seconds to wait for an answer.

    Raises (from every query):
        CollectorError: the server is unreachable (``HTTPSourceError``) or refused the
            query (``PrometheusQueryError``, with Prometheus's own message).
    """

    def __init__(self, url: str, *, timeout: float = 10.0) -> None:
        if timeout <= 0:
            raise CollectorError(f"timeout must be positive, got {timeout}")
        self.url = url.rstrip("/")
        self.timeout = timeout

    def query(
        self, promql: str, *, time: float | None = None, name: str | None = None
    ) -> list[Sample]:
        """Evaluates ``promql`` at one instant (now when ``time`` is None)."""
        params = {"query": promql}
        if time is not None:
            params["time"] = repr(float(time))
        data = self._get("/api/v1/query", params, promql)
        return _samples(data, name or promql)

    def query_range(
        self, promql: str, *, start: float, end: float, step: float, name: str | None = None
    ) -> list[Sample]:
        """Evaluates ``promql`` every ``step`` seconds from ``start`` to ``end``.

        Raises:
            PrometheusQueryError: ``step`` is not positive, ``end`` is before ``start``, the
                range holds more than ``MAX_POINTS`` points, or Prometheus refused it.
        """
        if not step > 0:
            raise PrometheusQueryError(f"step must be positive, got {step}")
        if end < start:
            raise PrometheusQueryError(f"end ({end}) is before start ({start})")
        if (end - start) / step > MAX_POINTS:
            raise PrometheusQueryError(
                f"{(end - start) / step:.0f} points per series is more than Prometheus allows "
                f"({MAX_POINTS}); use a larger step"
            )
        params = {"query": promql, "start": repr(start), "end": repr(end), "step": repr(step)}
        data = self._get("/api/v1/query_range", params, promql)
        return _samples(data, name or promql)

    def _get(self, path: str, params: dict[str, str], promql: str) -> dict[str, Any]:
        status, body = _http.get(self.url + path, timeout=self.timeout, params=params)
        try:
            answer = json.loads(body)
        except ValueError:
            answer = None
        if not isinstance(answer, dict):
            raise PrometheusQueryError(
                f"{self.url} answered HTTP {status} with no Prometheus JSON; is it a "
                f"Prometheus server? ({body[:120].decode('utf-8', 'replace')!r})"
            )
        if answer.get("status") != "success":
            kind = answer.get("errorType", f"HTTP {status}")
            raise PrometheusQueryError(
                f"Prometheus refused {promql!r}: {kind}: {answer.get('error')}"
            )
        data = answer.get("data")
        if not isinstance(data, dict):
            raise PrometheusQueryError(f"Prometheus answered {promql!r} without data")
        return data


def _samples(data: Mapping[str, Any], default_name: str) -> list[Sample]:
    kind = data.get("resultType")
    result = data.get("result")
    if kind in ("scalar", "string"):
        return [_sample({}, result, default_name)]
    if kind not in ("vector", "matrix") or not isinstance(result, list):
        raise PrometheusQueryError(f"unexpected result type {kind!r} from Prometheus")
    samples: list[Sample] = []
    for series in result:
        metric = series.get("metric") if isinstance(series, dict) else None
        if not isinstance(series, dict) or not isinstance(metric, dict):
            raise PrometheusQueryError(f"unreadable series {series!r} in Prometheus's answer")
        points = [series.get("value")] if kind == "vector" else series.get("values")
        if not isinstance(points, list):
            raise PrometheusQueryError(f"series {metric!r} has no list of points")
        samples.extend(_sample(metric, point, default_name) for point in points)
    return samples


def _sample(metric: Mapping[str, str], point: Any, default_name: str) -> Sample:
    try:
        stamp, text = point
        value = float(text)
        when = float(stamp)
    except (TypeError, ValueError) as exc:
        raise PrometheusQueryError(f"unreadable point {point!r} in Prometheus's answer") from exc
    labels = {str(k): str(v) for k, v in metric.items() if k != "__name__"}
    return Sample(str(metric.get("__name__", default_name)), value, when, labels)


class PrometheusQuerySource:
    """A Source that runs instant queries on each ``collect()``.

    A failed query is counted in :attr:`dropped` (by query name) and logged once; the
    others still answer. NaN results are dropped and counted as ``nan``.

    Args:
        client: the server to ask.
        queries: sample name -> PromQL, e.g. ``{"gpu_temp": "DCGM_FI_DEV_GPU_TEMP"}``.
    """

    def __init__(self, client: PrometheusClient, queries: Mapping[str, str]) -> None:
        if not queries:
            raise CollectorError("PrometheusQuerySource needs at least one query")
        self.client = client
        self.queries = dict(queries)
        self.dropped: Counter[str] = Counter()
        self._logged: set[str] = set()

    def collect(self) -> list[Sample]:
        samples: list[Sample] = []
        for name, promql in self.queries.items():
            try:
                answer = self.client.query(promql, time=_time.time())
            except CollectorError as exc:
                self.dropped[name] += 1
                if str(exc) not in self._logged:
                    self._logged.add(str(exc))
                    _log.warning("query %s failed: %s", name, exc)
                continue
            for s in answer:
                if math.isnan(s.value):
                    self.dropped["nan"] += 1
                else:
                    samples.append(Sample(name, s.value, s.time, s.labels))
        return samples
