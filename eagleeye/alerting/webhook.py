"""Alertmanager's webhook receiver: firing alerts become Findings handed to remediation.

It binds to loopback unless told otherwise. ``POST /alerts`` requires
``Authorization: Bearer <token>``, the token Alertmanager holds. Given a Remediator and an
approval token (a different one: whoever can send alerts must not approve actions), it
also serves manual approval: ``GET /pending`` lists the actions waiting,
``POST /pending/<id>/approve`` and ``POST /pending/<id>/reject`` decide them.
Each firing alert becomes one Finding: ``kind`` and ``severity`` from its labels
(Alertmanager's ``warning`` and ``critical``, and ``info``; ``warn`` too), the
subject from ``rank``, ``node`` (or dcgm-exporter's ``Hostname``) and ``replica``, the time
from ``startsAt`` (so a re-sent alert is the same finding and deduplicates), and the
alert's value as evidence. Resolved alerts are acknowledged and ignored.
"""

from __future__ import annotations

import hmac
import json
import logging
import math
import ssl
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from collector.types import Subject
from detectors.types import Finding, Severity
from eagleeye.errors import EagleEyeError
from remediation.errors import RemediationError
from remediation.remediator import Decision, Remediator

log = logging.getLogger(__name__)
Handle = Callable[[Finding], Sequence[Decision]]
MAX_BODY = 1 << 20
MAX_CONNECTIONS = 16
REQUEST_TIMEOUT_S = 5.0


def decode_alerts(body: bytes) -> list[Finding]:
    """The findings of a webhook body (JSON of Alertmanager's payload), checked whole
    before any is handled.

    Raises:
        ValueError: the body is not JSON, or not such a payload (whatever its nesting,
            types or numbers); the message says what was wrong.
    """
    try:
        payload = json.loads(body)
    except (ValueError, RecursionError) as exc:
        raise ValueError(f"not JSON: {str(exc)[:100]}") from None
    if not isinstance(payload, dict):
        raise ValueError("the payload must be a JSON object")
    return findings_of(payload)


def findings_of(payload: Mapping[str, Any]) -> list[Finding]:
    """The findings of the firing alerts of a decoded payload.

    Raises:
        ValueError: ``alerts`` is not a list of alerts, or one of them is malformed.
    """
    alerts = payload.get("alerts", [])
    if not isinstance(alerts, list):
        raise ValueError("'alerts' must be a list")
    findings = []
    for alert in alerts:
        try:
            finding = alert_to_finding(alert)
        except (TypeError, AttributeError, OverflowError, RecursionError, OSError) as exc:
            raise ValueError(f"malformed alert: {type(exc).__name__}: {str(exc)[:100]}") from None
        if finding is not None:
            findings.append(finding)
    return findings


def alert_to_finding(alert: Mapping[str, Any]) -> Finding | None:
    """The finding a firing alert stands for, or None for a resolved one.

    Raises:
        ValueError: the alert lacks a ``kind`` label or has an unknown severity.
    """
    if not isinstance(alert, Mapping):
        raise ValueError("an alert must be a JSON object")
    if alert.get("status", "firing") != "firing":
        return None
    labels = alert.get("labels", {})
    if not isinstance(labels, Mapping) or not all(isinstance(v, str) for v in labels.values()):
        raise ValueError("an alert's labels must be an object of strings")
    kind = labels.get("kind")
    if not kind:
        raise ValueError(f"alert {labels.get('alertname', '?')} has no 'kind' label")
    node = labels.get("node") or labels.get("Hostname") or labels.get("hostname")
    subject = Subject(
        replica=_int(labels.get("replica")), rank=_int(labels.get("rank")), node=node or None
    )
    evidence = {}
    annotations = alert.get("annotations", {})
    value = annotations.get("value") if isinstance(annotations, Mapping) else None
    if value is not None:
        if not isinstance(value, str | int | float) or isinstance(value, bool):
            raise ValueError(f"annotation value {str(value)[:40]!r} is not a number")
        evidence["value"] = float(value)  # OverflowError for a huge integer: caught above
        if not math.isfinite(evidence["value"]):
            raise ValueError(f"annotation value {value!r} is not finite")
    if labels.get("gpu", "").isdigit():
        evidence["gpu"] = float(labels["gpu"])
    return Finding(
        kind=kind,
        subject=subject,
        score=1.0,
        severity=severity_of(labels.get("severity")),
        time=_time(alert.get("startsAt")),
        step=None,
        evidence=evidence,
        detector=f"alertmanager:{labels.get('alertname', kind)}",
    )


#: Severity labels of the ecosystem (and our own older ``warn``) -> a finding's severity.
SEVERITIES = {
    "critical": Severity.CRITICAL,
    "error": Severity.CRITICAL,
    "page": Severity.CRITICAL,
    "warning": Severity.WARN,
    "warn": Severity.WARN,
    "info": Severity.INFO,
    "none": Severity.INFO,
}


def severity_of(label: str | None) -> Severity:
    """A finding's severity for an alert's ``severity`` label.

    Raises:
        ValueError: a label that names no severity.
    """
    if label is None:
        return Severity.WARN
    severity = SEVERITIES.get(label.lower())
    if severity is None:
        known = ", ".join(sorted(SEVERITIES))
        raise ValueError(f"unknown severity {label!r}; use one of {known}")
    return severity


def _int(text: str | None) -> int | None:
    return int(text) if text is not None and text.lstrip("-").isdigit() else None


def _time(text: object) -> float:
    if not text:
        return time.time()
    if not isinstance(text, str):
        raise ValueError(f"startsAt {str(text)[:40]!r} is not a time")
    # Alertmanager writes nanoseconds; fromisoformat takes at most microseconds.
    head, dot, rest = text.partition(".")
    if dot:
        digits = "".join(c for c in rest if c.isdigit())
        zone = rest[len(digits) :]
        text = f"{head}.{digits[:6]}{zone}"
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


class AlertWebhook:
    """An HTTP server for Alertmanager's webhook; ``POST /alerts``.

    Args:
        handle: called with each finding (``Remediator.handle``); returns decisions.
        token: the bearer token Alertmanager sends with alerts; required.
        host: loopback by default.
        port: 0 picks a free port.
        on_decision: called with every decision (the controller stores them).
        approvals: the Remediator whose pending actions ``/pending`` lists and decides.
        approval_token: the bearer token of ``/pending``; required with ``approvals`` and
            different from ``token``.

    Raises:
        EagleEyeError: a missing token, or an approval token missing or equal to ``token``.
    """

    def __init__(
        self,
        handle: Handle,
        token: str,
        host: str = "127.0.0.1",
        port: int = 0,
        on_decision: Callable[[Decision], None] = lambda d: None,
        approvals: Remediator | None = None,
        approval_token: str | None = None,
        tls: ssl.SSLContext | None = None,
    ) -> None:
        if not token:
            raise EagleEyeError("the alert webhook needs a token (EAGLEEYE_TOKEN)")
        if approvals is not None and not approval_token:
            raise EagleEyeError(
                "approving actions needs its own token (EAGLEEYE_APPROVAL_TOKEN), "
                "not the one Alertmanager sends alerts with"
            )
        if approval_token is not None and hmac.compare_digest(approval_token, token):
            raise EagleEyeError(
                "the approval token equals the alert token: whoever sends alerts could "
                "approve actions; give two different tokens"
            )
        self.handle = handle
        self.token = token
        self.approval_token = approval_token
        self.on_decision = on_decision
        self.host = host
        self.approvals = approvals
        self.received: list[Finding] = []
        self.refused = 0  # requests without the right bearer token
        self._server = _BoundedServer((host, port), _handler(self))
        self.scheme = "http" if tls is None else "https"
        if tls is not None:  # the handshake runs in the request's thread, not the acceptor
            self._server.socket = tls.wrap_socket(
                self._server.socket, server_side=True, do_handshake_on_connect=False
            )
        # stop() waits for the loop to see it: one poll, a tenth of a second, not half
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True
        )

    @property
    def url(self) -> str:
        return f"{self.scheme}://{self.host}:{self._server.server_port}/alerts"

    def start(self) -> AlertWebhook:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)

    def authorised(self, header: str | None, approving: bool = False) -> bool:
        """Whether ``header`` carries the alert token (or, ``approving``, the approval one)."""
        token = self.approval_token if approving else self.token
        if not token:
            return False
        expected = f"Bearer {token}".encode()
        return hmac.compare_digest((header or "").encode(), expected)

    def refuse(self, client: str, path: str) -> None:
        """Counts a request without the right token; the first few are logged."""
        self.refused += 1
        if self.refused <= 16:
            log.warning(
                "alert webhook refused %s %s: missing or wrong bearer token (refusal %d)",
                client,
                path,
                self.refused,
            )

    def pending(self) -> list[dict[str, Any]]:
        if self.approvals is None:
            return []
        return [
            {
                "id": p.id,
                "action": p.action.to_json(),
                "finding": p.finding.to_json(),
                "since": p.since,
            }
            for p in self.approvals.pending()
        ]

    def decide(self, path: str) -> Decision:
        """Approves or rejects ``/pending/<id>/<approve|reject>``.

        Raises:
            RemediationError: no approvals, an unknown id or verb.
        """
        parts = path.strip("/").split("/")
        if self.approvals is None or len(parts) != 3 or not parts[1].isdigit():
            raise RemediationError(f"no such approval path {path}; use /pending/<id>/approve")
        if parts[2] == "approve":
            decision = self.approvals.approve(int(parts[1]))
        elif parts[2] == "reject":
            decision = self.approvals.reject(int(parts[1]), "rejected through the webhook")
        else:
            raise RemediationError(f"unknown verb {parts[2]!r}; use approve or reject")
        self.on_decision(decision)
        return decision

    def accept(self, payload: Mapping[str, Any]) -> list[Decision]:
        """Turns a webhook payload into findings and hands each to remediation.

        Raises:
            ValueError: the payload is not an Alertmanager payload (nothing is handled).
        """
        return self.accept_findings(findings_of(payload))

    def accept_findings(self, findings: Sequence[Finding]) -> list[Decision]:
        """Hands each finding of a checked payload to remediation."""
        decisions: list[Decision] = []
        for finding in findings:
            self.received.append(finding)
            for decision in self.handle(finding):
                decisions.append(decision)
                try:
                    self.on_decision(decision)
                except Exception:
                    log.exception("on_decision raised; the decision stands")
        return decisions


class _BoundedServer(ThreadingHTTPServer):
    """At most ``MAX_CONNECTIONS`` requests are served at once, each by a thread of its own;
    a connection over the bound is closed at once (Alertmanager retries)."""

    daemon_threads = True

    def __init__(self, address: tuple[str, int], handler: type[BaseHTTPRequestHandler]) -> None:
        super().__init__(address, handler)
        self._slots = threading.BoundedSemaphore(MAX_CONNECTIONS)

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self._slots.acquire(blocking=False):
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._slots.release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()


def _handler(hook: AlertWebhook) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        timeout = REQUEST_TIMEOUT_S  # a half-open or slow connection gives its thread back

        def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
            if not hook.authorised(self.headers.get("Authorization"), approving=True):
                hook.refuse(self.client_address[0], self.path)
                return self._reply(401, {"error": "missing or wrong bearer token"})
            if self.path != "/pending":
                return self._reply(404, {"error": f"no such path {self.path}; use /pending"})
            return self._reply(200, {"pending": hook.pending()})

        def do_POST(self) -> None:  # noqa: N802 (http.server's naming)
            approving = self.path.startswith("/pending/")
            if not hook.authorised(self.headers.get("Authorization"), approving):
                hook.refuse(self.client_address[0], self.path)
                return self._reply(401, {"error": "missing or wrong bearer token"})
            if approving:
                try:
                    decision = hook.decide(self.path)
                except RemediationError as exc:
                    return self._reply(404, {"error": str(exc)})
                return self._reply(200, {"outcome": decision.outcome.to_json()})
            if self.path != "/alerts":
                return self._reply(404, {"error": f"no such path {self.path}; use /alerts"})
            declared = (self.headers.get("Content-Length") or "").strip()
            if not declared:
                return self._reply(411, {"error": "Content-Length is required"})
            if not declared.isdigit():
                return self._reply(400, {"error": f"bad Content-Length {declared[:40]!r}"})
            length = int(declared)
            if length > MAX_BODY:
                return self._reply(413, {"error": f"body over {MAX_BODY} bytes"})
            try:
                findings = decode_alerts(self.rfile.read(length))
            except ValueError as exc:
                return self._reply(400, {"error": f"not an Alertmanager payload: {exc}"})
            decisions = hook.accept_findings(findings)
            actions = [d.outcome.to_json() for d in decisions]
            return self._reply(200, {"decisions": len(decisions), "outcomes": actions})

        def _reply(self, status: int, body: Mapping[str, Any]) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: Any) -> None:
            log.debug("webhook: " + format, *args)

    return Handler
