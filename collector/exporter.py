"""A Source that scrapes an exporter's ``/metrics`` (dcgm-exporter, node-exporter)."""

from __future__ import annotations

import logging
import time as _time
from collections import Counter, deque
from collections.abc import Callable, Mapping

from collector import _http
from collector.errors import CollectorError
from collector.events import Event, Parsed
from collector.promtext import DEFAULT_MAX_LABELS, XidTracker, parse_exposition
from collector.types import Sample

_log = logging.getLogger(__name__)


def fetch_text(url: str, *, timeout: float = 5.0) -> str:
    """The body of an exporter's metrics page.

    Raises:
        CollectorError: the server is unreachable or answered with an HTTP error.
    """
    status, body = _http.get(url, timeout=timeout)
    if status != 200:
        raise _http.HTTPSourceError(
            f"{url} answered HTTP {status}: {body[:200].decode('utf-8', 'replace')!r}"
        )
    return body.decode("utf-8", "replace")


class ExporterSource:
    """Scrapes exporter text on each ``collect()`` and keeps XID state between scrapes.

    A failed scrape or a bad line never raises: it is counted in :attr:`dropped` (reason
    ``scrape_error`` or the parser's reasons) and logged once per distinct message.

    Args:
        fetch: returns the exposition text; e.g. ``lambda: fetch_text(url)``.
        labels: added to every sample (say ``node`` for node-exporter, which names none).
        clock: seconds since the epoch, injected for tests.
        max_labels: series with more labels are dropped.

    Example:
        >>> src = ExporterSource(lambda: 'DCGM_FI_DEV_GPU_TEMP{gpu="0"} 41\\n', clock=lambda: 5.0)
        >>> [(s.name, s.value) for s in src.collect()]
        [('DCGM_FI_DEV_GPU_TEMP', 41.0)]
    """

    def __init__(
        self,
        fetch: Callable[[], str],
        *,
        labels: Mapping[str, str] | None = None,
        clock: Callable[[], float] = _time.time,
        max_labels: int = DEFAULT_MAX_LABELS,
    ) -> None:
        self._fetch = fetch
        self._labels = dict(labels or {})
        self._clock = clock
        self._max_labels = max_labels
        # A long-running scraper must not report an XID that predates it.
        self._tracker = XidTracker(report_initial=False)
        self._logged: set[str] = set()
        self.dropped: Counter[str] = Counter()
        # The latest events, bounded: a flapping exporter must not grow memory forever.
        self.events: deque[Event] = deque(maxlen=1000)

    @classmethod
    def from_url(
        cls,
        url: str,
        *,
        timeout: float = 5.0,
        labels: Mapping[str, str] | None = None,
        clock: Callable[[], float] = _time.time,
    ) -> ExporterSource:
        """A source scraping ``url`` (the exporter's full /metrics address)."""
        return cls(lambda: fetch_text(url, timeout=timeout), labels=labels, clock=clock)

    def read(self) -> Parsed:
        """One scrape, parsed; a failed scrape is an empty result with one counted drop."""
        try:
            text = self._fetch()
        except (CollectorError, OSError, ValueError) as exc:
            self._log_once(f"scrape failed: {exc}")
            self.dropped["scrape_error"] += 1
            return Parsed(dropped={"scrape_error": 1})
        parsed = parse_exposition(
            text,
            time=self._clock(),
            labels=self._labels,
            tracker=self._tracker,
            max_labels=self._max_labels,
        )
        self.dropped.update(parsed.dropped)
        return parsed

    def collect(self) -> list[Sample]:
        """Samples of one scrape, XID events included as ``gpu_xid`` samples."""
        parsed = self.read()
        self.events.extend(parsed.events)
        return parsed.all_samples()

    def _log_once(self, message: str) -> None:
        if message not in self._logged:
            self._logged.add(message)
            _log.warning("%s", message)
