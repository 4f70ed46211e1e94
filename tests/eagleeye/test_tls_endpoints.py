"""The HTTP endpoints over TLS: the run's metrics and Alertmanager's webhook answer HTTPS
with the given certificate, a request without the right token is refused (and counted),
and a bad certificate pair is one clear error before anything listens."""

from __future__ import annotations

import http.client
import json
import shutil
import ssl
import subprocess
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from eagleeye.errors import EagleEyeError
from eagleeye.runalerts import RunAlerts
from eagleeye.runmetrics import RunMetrics
from eagleeye.tls import TlsFiles, tls_files
from ft_runtime.layout import JobLayout

ALERT = {
    "status": "firing",
    "labels": {"alertname": "GpuHot", "kind": "thermal", "severity": "warning", "gpu": "0"},
    "startsAt": "2026-11-26T10:00:00Z",
}


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> TlsFiles:
    if shutil.which("openssl") is None:
        pytest.skip("openssl is not installed; it makes the test's certificate")
    folder = tmp_path_factory.mktemp("tls")
    cert, key = folder / "cert.pem", folder / "key.pem"
    subprocess.run(
        [
            *("openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1"),
            *("-keyout", str(key), "-out", str(cert), "-subj", "/CN=127.0.0.1"),
            *("-addext", "subjectAltName=IP:127.0.0.1"),
        ],
        check=True,
        capture_output=True,
    )
    return TlsFiles(str(cert), str(key))


def request(url: str, cafile: str, token: str | None = None, body: dict | None = None) -> int:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method="GET" if body is None else "POST")
    if token is not None:
        req.add_header("Authorization", f"Bearer {token}")
    context = ssl.create_default_context(cafile=cafile)
    try:
        with urllib.request.urlopen(req, timeout=5, context=context) as reply:
            return int(reply.status)
    except urllib.error.HTTPError as exc:
        return exc.code


def test_the_webhook_answers_https_and_refuses_a_wrong_token(
    pair: TlsFiles, tmp_path: Path
) -> None:
    (tmp_path / "token").write_text("s3cret\n")
    alerts = RunAlerts(str(tmp_path / "token"), 0, "127.0.0.1", pair.context()).start()
    try:
        url = alerts.url
        assert url.startswith("https://127.0.0.1:")
        assert request(url, pair.cert, "wrong", {"alerts": [ALERT]}) == 401
        assert alerts.take() == []  # refused: never acted on
        assert alerts.webhook.refused == 1
        assert request(url, pair.cert, "s3cret", {"alerts": [ALERT]}) == 200
        assert [f.kind for f in alerts.take()] == ["thermal"]
        # plain HTTP gets no answer from a TLS socket
        with pytest.raises((ConnectionError, http.client.HTTPException, urllib.error.URLError)):
            urllib.request.urlopen(url.replace("https", "http"), timeout=5)
    finally:
        alerts.close()


def test_the_metrics_are_served_over_https(pair: TlsFiles) -> None:
    metrics = RunMetrics.open("tls", JobLayout(), 0, "127.0.0.1", tls=pair)
    try:
        assert metrics.url.startswith("https://127.0.0.1:")
        assert request(metrics.url, pair.cert) == 200
    finally:
        metrics.close()


def test_a_bad_pair_is_one_clear_error(pair: TlsFiles, tmp_path: Path) -> None:
    with pytest.raises(EagleEyeError, match="go together"):
        tls_files(pair.cert, None)
    with pytest.raises(EagleEyeError, match="no such file"):
        TlsFiles(str(tmp_path / "none.pem"), pair.key).context()
    (tmp_path / "junk.pem").write_text("not a certificate\n")
    with pytest.raises(EagleEyeError, match="cannot load the certificate"):
        TlsFiles(str(tmp_path / "junk.pem"), pair.key).context()
