"""`eagleeye run`'s metrics server: a busy or bad port is one error before the run folder
exists, and the final state stays scrapable for the linger."""

from __future__ import annotations

import json
import socket
import threading
import time
import urllib.error
import urllib.request

import pytest

from eagleeye.cli import main
from eagleeye.errors import EagleEyeError
from eagleeye.launch import JobConfig, run_job
from eagleeye.runalerts import RunAlerts
from eagleeye.runmetrics import RunMetrics
from ft_runtime.layout import JobLayout
from ft_runtime.ports import free_port
from ft_runtime.types import LifecycleEvent, Phase


def scrape(url: str) -> str:
    with urllib.request.urlopen(url, timeout=2) as reply:
        return reply.read().decode()


@pytest.fixture
def busy_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock.getsockname()[1]


def test_a_busy_port_fails_before_the_run_folder_exists(tmp_path, busy_port) -> None:
    script = tmp_path / "train.py"
    script.write_text("print('never runs')\n")
    runs = tmp_path / "runs"
    config = JobConfig(script=str(script), runs_dir=str(runs), metrics_port=busy_port)
    with pytest.raises(EagleEyeError, match=f"127.0.0.1:{busy_port}.*--metrics-port"):
        run_job(config)
    assert not runs.exists() or not any(runs.iterdir())


def test_the_cli_says_one_line_for_a_busy_port(tmp_path, busy_port, capsys) -> None:
    script = tmp_path / "train.py"
    script.write_text("print('never runs')\n")
    runs = tmp_path / "runs"
    code = main(["run", "--runs-dir", str(runs), "--metrics-port", str(busy_port), str(script)])
    err = capsys.readouterr().err.strip()
    assert code != 0
    assert len(err.splitlines()) == 1, err
    assert "in use" in err
    assert not runs.exists() or not any(runs.iterdir())


@pytest.mark.parametrize(
    ("port", "address", "says"),
    [(70000, "127.0.0.1", "not a port"), (0, "192.0.2.1", "cannot serve metrics on 192.0.2.1")],
)
def test_a_bad_port_or_address_is_a_clear_error(port, address, says) -> None:
    with pytest.raises(EagleEyeError, match=says):
        RunMetrics.open("r", JobLayout(), port, address)


def test_the_final_state_lingers_then_the_server_stops() -> None:
    said: list[str] = []
    metrics = RunMetrics.open("r", JobLayout(1, 2), 0, linger_s=5.0)
    metrics.say = said.append
    metrics.update(LifecycleEvent("rank:1", Phase.LAUNCH, 1.0, 0, {"node": "node0", "replica": 0}))
    closer = threading.Thread(target=metrics.close)
    closer.start()
    deadline = time.monotonic() + 4.0  # inside the linger, however late the closer starts
    while 'eagleeye_run_active{run="r"} 0.0' not in (text := scrape(metrics.url)):
        assert time.monotonic() < deadline, text  # the run is over, its metrics still there
        time.sleep(0.05)
    assert 'eagleeye_rank_info{gpu="",hostname=' in text
    assert 'rank="1"' in text
    closer.join(15)
    assert said
    assert metrics.url in said[0]
    with pytest.raises(urllib.error.URLError, match="refused"):
        scrape(metrics.url)


def post_alert(url: str, token: str, alert: dict) -> int:
    request = urllib.request.Request(
        url,
        data=json.dumps({"alerts": [alert]}).encode(),
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
        method="POST",
    )
    with urllib.request.urlopen(request, timeout=5) as reply:
        return int(reply.status)


def test_alerts_reach_the_run_once_however_often_they_are_sent(tmp_path) -> None:
    (tmp_path / "token").write_text("t0k\n")
    alerts = RunAlerts(str(tmp_path / "token")).start()
    alert = {
        "status": "firing",
        "labels": {"alertname": "GpuXidFatal", "kind": "xid", "severity": "critical"},
        "annotations": {"value": "79"},
        "startsAt": "2026-11-22T00:10:00.123Z",
    }
    alert["labels"] |= {"node": "node0", "gpu": "0"}
    try:
        assert post_alert(alerts.url, "t0k", alert) == 200
        assert post_alert(alerts.url, "t0k", alert) == 200  # Alertmanager re-sends it
        with pytest.raises(urllib.error.HTTPError, match="401"):
            post_alert(alerts.url, "wrong", alert)
        (finding,) = alerts.take()
        assert finding.kind == "xid"
        assert finding.subject.node == "node0"
        assert alerts.take() == []
    finally:
        alerts.close()


def test_an_alert_webhook_without_its_token_file_fails_before_the_run(tmp_path, busy_port) -> None:
    script = tmp_path / "train.py"
    script.write_text("print('never runs')\n")
    runs = tmp_path / "runs"
    metrics_port = free_port()
    config = JobConfig(
        script=str(script),
        runs_dir=str(runs),
        metrics_port=metrics_port,
        alerts_port=0,
        alerts_token_file=str(tmp_path / "missing"),
    )
    with pytest.raises(EagleEyeError, match="cannot read token file"):
        run_job(config)
    (tmp_path / "token").write_text("t0k\n")
    busy = JobConfig(
        script=str(script),
        runs_dir=str(runs),
        alerts_port=busy_port,
        alerts_token_file=str(tmp_path / "token"),
    )
    with pytest.raises(EagleEyeError, match="--alerts-port"):
        run_job(busy)
    assert not runs.exists() or not any(runs.iterdir())
    with socket.socket() as sock:  # the metrics server started first was stopped again
        sock.bind(("127.0.0.1", metrics_port))
