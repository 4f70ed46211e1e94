"""Alertmanager's webhook inside `eagleeye run`: alerts routed to a run become its findings.

``eagleeye run --alerts-port PORT --alerts-token-file FILE`` serves ``POST /alerts`` (the
Alertmanager config of ``eagleeye alerts alertmanager`` points at it, with the same token
file). Each new firing alert becomes one finding, queued; the controller takes the queue
every tick and answers each finding as its own (stored, remediated with the run's policy,
exported), so the run store and the remediator are only ever touched from the
controller's thread. An alert Alertmanager re-sends is the same finding and is queued once.
An alert that names a host (dcgm-exporter's ``Hostname``) is placed on the job's node on
that host, or on the rank using its ``gpu`` (``locate``).
"""

from __future__ import annotations

import ssl
import threading
from collections.abc import Callable, Sequence
from dataclasses import replace

from collector.types import Subject
from detectors.types import Finding
from eagleeye.alerting.alertmanager import read_token_file
from eagleeye.alerting.webhook import AlertWebhook
from eagleeye.errors import EagleEyeError
from remediation.remediator import Decision


class RunAlerts:
    """The run's webhook and the findings it queued for the controller.

    Raises:
        EagleEyeError: the token file is missing or empty, or the address cannot be bound.
    """

    def __init__(
        self,
        token_file: str,
        port: int = 0,
        address: str = "127.0.0.1",
        tls: ssl.SSLContext | None = None,
    ) -> None:
        token = read_token_file(token_file)
        self._lock = threading.Lock()
        self._queue: list[Finding] = []
        self._seen: set[tuple[object, ...]] = set()
        #: (subject, gpu) -> where in the job it is (a hostname becomes the job's node)
        self.locate: Callable[[Subject, str | None], Subject] = lambda subject, gpu: subject
        try:
            self.webhook = AlertWebhook(
                self._queue_finding, token, host=address, port=port, tls=tls
            )
        except OSError as exc:
            raise EagleEyeError(
                f"cannot serve the alert webhook on {address}:{port}: "
                f"{exc.strerror or exc}; pick a free --alerts-port (0 picks one)"
            ) from None

    @property
    def url(self) -> str:
        return self.webhook.url

    def start(self) -> RunAlerts:
        self.webhook.start()
        return self

    def _queue_finding(self, finding: Finding) -> Sequence[Decision]:
        gpu = finding.evidence.get("gpu")
        placed = self.locate(finding.subject, None if gpu is None else str(int(gpu)))
        if placed != finding.subject:
            finding = replace(finding, subject=placed)
        key = (finding.kind, finding.subject, finding.time, finding.detector)
        with self._lock:
            if key not in self._seen:
                self._seen.add(key)
                self._queue.append(finding)
        return []  # decided on the controller's thread

    def take(self) -> list[Finding]:
        """The findings queued since the last call, oldest first."""
        with self._lock:
            taken, self._queue = self._queue, []
        return taken

    def close(self) -> None:
        self.webhook.stop()
