"""The webhook receiver, over real HTTP on loopback, feeding a real Remediator."""

from __future__ import annotations

import json
import socket
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from datetime import UTC, datetime

import pytest

from eagleeye.alerting import AlertWebhook, alert_to_finding
from eagleeye.alerting.webhook import MAX_CONNECTIONS
from eagleeye.errors import EagleEyeError
from ft_runtime.testing import FakeRuntime
from ft_runtime.types import ActionKind
from remediation import Hooks, Remediator, parse_policy

POLICY = """
[policy]
dry_run = false
[[rule]]
kind = "xid"
min_severity = "critical"
do = ["checkpoint:replica", "evict:node", "restart:replica"]
"""


def alert(status: str = "firing", **labels: str) -> dict:
    base = {"alertname": "GpuXidFatal", "kind": "xid", "severity": "critical", "gpu": "0"}
    return {
        "status": status,
        "labels": {**base, **labels},
        "annotations": {"value": "79"},
        "startsAt": "2026-11-22T00:10:00.123456789Z",
        "fingerprint": "abc",
    }


@pytest.fixture
def hook() -> Iterator[tuple[AlertWebhook, FakeRuntime]]:
    runtime = FakeRuntime()
    remediator = Remediator(parse_policy(POLICY), runtime, hooks=Hooks())
    stored: list = []
    webhook = AlertWebhook(remediator.handle, token="s3cret", on_decision=stored.append).start()
    yield webhook, runtime
    webhook.stop()


def post(url: str, body: object, token: str | None = "s3cret") -> tuple[int, dict]:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method="POST")
    if token is not None:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def test_a_fatal_xid_alert_evicts_its_node(hook) -> None:
    webhook, runtime = hook
    assert webhook.url.startswith("http://127.0.0.1:")
    status, body = post(webhook.url, {"alerts": [alert(node="n7")]})
    assert status == 200
    assert body["decisions"] == 3
    assert [(a.kind, a.target) for a in runtime.actions] == [
        (ActionKind.CHECKPOINT, "job"),
        (ActionKind.EVICT, "node:n7"),
        (ActionKind.RESTART, "job"),
    ]
    (finding,) = webhook.received
    assert finding.evidence == {"value": 79.0, "gpu": 0.0}
    assert finding.detector == "alertmanager:GpuXidFatal"
    # Alertmanager re-sends the same alert: the same finding, no second eviction.
    post(webhook.url, {"alerts": [alert(node="n7")]})
    assert len(runtime.actions) == 3


def test_token_path_and_payload_are_checked(hook) -> None:
    webhook, runtime = hook
    assert post(webhook.url, {"alerts": [alert()]}, token=None)[0] == 401
    assert post(webhook.url, {"alerts": [alert()]}, token="wrong")[0] == 401
    assert post(webhook.url.replace("/alerts", "/x"), {})[0] == 404
    status, body = post(webhook.url, b"{not json")
    assert status == 400
    assert "not an Alertmanager payload" in body["error"]
    status, body = post(webhook.url, {"alerts": [{"labels": {"alertname": "Other"}}]})
    assert status == 400
    assert "no 'kind' label" in body["error"]
    assert runtime.actions == []


def test_resolved_alerts_are_ignored_and_dcgm_hostnames_name_the_node() -> None:
    assert alert_to_finding(alert("resolved")) is None
    finding = alert_to_finding(alert(Hostname="gpu-node-07", rank="5"))
    assert finding is not None
    assert finding.subject.node == "gpu-node-07"
    assert finding.subject.rank == 5
    expected = datetime(2026, 11, 22, 0, 10, 0, 123456, tzinfo=UTC).timestamp()
    assert finding.time == pytest.approx(expected)


def test_a_webhook_without_a_token_is_refused() -> None:
    with pytest.raises(EagleEyeError, match="needs a token"):
        AlertWebhook(lambda f: [], token="")


def get(url: str, token: str | None = "s3cret") -> tuple[int, dict]:
    request = urllib.request.Request(url)
    if token is not None:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def test_manual_approval_over_http() -> None:
    runtime = FakeRuntime()
    policy = parse_policy(
        POLICY.replace("dry_run = false", 'dry_run = false\napproval = ["evict"]')
    )
    remediator = Remediator(policy, runtime, hooks=Hooks())
    stored: list = []
    webhook = AlertWebhook(
        remediator.handle,
        token="s3cret",
        on_decision=stored.append,
        approvals=remediator,
        approval_token="approver",
    ).start()
    base = webhook.url.removesuffix("/alerts")
    try:
        post(webhook.url, {"alerts": [alert(node="n3")]})
        assert [a.kind for a in runtime.actions] == [ActionKind.CHECKPOINT, ActionKind.RESTART]
        assert get(f"{base}/pending", token="bad")[0] == 401
        # The token that sends alerts approves nothing; the approval token sends no alert.
        assert get(f"{base}/pending", token="s3cret")[0] == 401
        assert post(webhook.url, {"alerts": [alert(node="n4")]}, token="approver")[0] == 401
        status, body = get(f"{base}/pending", token="approver")
        assert status == 200
        (item,) = body["pending"]
        assert item["action"]["target"] == "node:n3"
        approve = f"{base}/pending/{item['id']}/approve"
        assert post(approve, {}, token="s3cret")[0] == 401
        status, body = post(approve, {}, token="approver")
        assert status == 200
        assert body["outcome"]["status"] == "done"
        assert runtime.actions[-1].target == "node:n3"
        assert stored[-1].outcome.status.value == "done"
        assert post(approve, {}, token="approver")[0] == 404  # already decided
        assert get(f"{base}/pending", token="approver")[1] == {"pending": []}
    finally:
        webhook.stop()


def test_approvals_need_their_own_token() -> None:
    remediator = Remediator(parse_policy(POLICY), FakeRuntime(), hooks=Hooks())
    with pytest.raises(EagleEyeError, match="its own token"):
        AlertWebhook(remediator.handle, token="s3cret", approvals=remediator)
    with pytest.raises(EagleEyeError, match="two different tokens"):
        AlertWebhook(
            remediator.handle, token="s3cret", approvals=remediator, approval_token="s3cret"
        )


@pytest.mark.parametrize(
    ("label", "severity"),
    [("warning", "warn"), ("critical", "critical"), ("info", "info"), ("warn", "warn")],
)
def test_the_severities_alertmanager_sends_are_accepted(hook, label, severity) -> None:
    webhook, _ = hook
    status, _ = post(webhook.url, {"alerts": [alert(severity=label, node="n9")]})
    assert status == 200
    assert webhook.received[-1].severity.value == severity


def test_an_unknown_severity_is_a_400_naming_it(hook) -> None:
    webhook, _ = hook
    status, body = post(webhook.url, {"alerts": [alert(severity="bogus")]})
    assert status == 400
    assert "bogus" in body["error"]


def _raw(webhook: AlertWebhook, head: bytes) -> bytes:
    """Sends raw request bytes; returns the status line."""
    host, port = webhook.host, int(webhook.url.split(":")[2].split("/")[0])
    with socket.create_connection((host, port), timeout=5) as conn:
        conn.sendall(head)
        return conn.recv(4096).split(b"\r\n", 1)[0]


@pytest.mark.parametrize(
    ("length", "status"), [(b"abc", b"400"), (b"-1", b"400"), (None, b"411"), (b"9999999", b"413")]
)
def test_content_length_is_checked_strictly(hook, length, status) -> None:
    webhook, runtime = hook
    header = b"" if length is None else b"Content-Length: " + length + b"\r\n"
    line = _raw(
        webhook,
        b"POST /alerts HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer s3cret\r\n"
        + header
        + b"\r\n{}",
    )
    assert line.split()[1] == status
    assert post(webhook.url, {"alerts": [alert()]})[0] == 200  # still serving
    assert runtime.actions


def test_half_open_connections_hold_a_bounded_number_of_threads(hook) -> None:
    webhook, _ = hook
    host, port = webhook.host, int(webhook.url.split(":")[2].split("/")[0])
    before = threading.active_count()
    idle = [socket.create_connection((host, port), timeout=5) for _ in range(64)]
    try:
        time.sleep(0.5)
        assert threading.active_count() - before <= MAX_CONNECTIONS
    finally:
        for conn in idle:
            conn.close()
    deadline = time.monotonic() + 10
    while post(webhook.url, {"alerts": []})[0] != 200 and time.monotonic() < deadline:
        time.sleep(0.1)  # the slots come back as the idle connections close
    assert post(webhook.url, {"alerts": []})[0] == 200
