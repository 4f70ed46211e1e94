"""`eagleeye run`'s metrics server: a busy or bad port is one error before the run folder
exists, and the final state stays scrapable for the linger."""

from __future__ import annotations

import socket
import threading
import time
import urllib.error
import urllib.request

import pytest

from eagleeye.cli import main
from eagleeye.errors import EagleEyeError
from eagleeye.launch import JobConfig, run_job
from eagleeye.runmetrics import RunMetrics
from ft_runtime.layout import JobLayout
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
    metrics = RunMetrics.open("r", JobLayout(1, 2), 0, linger_s=1.0)
    metrics.say = said.append
    metrics.update(LifecycleEvent("rank:1", Phase.LAUNCH, 1.0, 0, {"node": "node0", "replica": 0}))
    closer = threading.Thread(target=metrics.close)
    closer.start()
    time.sleep(0.3)
    text = scrape(metrics.url)  # the run is over, its metrics are still there
    assert 'eagleeye_run_active{run="r"} 0.0' in text
    assert 'eagleeye_rank_info{gpu="",hostname=' in text
    assert 'rank="1"' in text
    closer.join(10)
    assert said
    assert metrics.url in said[0]
    with pytest.raises(urllib.error.URLError, match="refused"):
        scrape(metrics.url)
