"""The exporter's output: what promtool accepts, what the samples feed, which labels exist."""

from __future__ import annotations

import subprocess
import urllib.request

from prometheus_client.parser import text_string_to_metric_families

from collector.types import Sample, Subject
from detectors.types import Finding, Severity
from eagleeye.exporter import EagleEyeExporter
from ft_runtime.testing import FakeRuntime
from remediation import Hooks, Remediator, synchronous_restart_policy
from tests.alerting.conftest import PROMTOOL, need

ALLOWED_LABELS = {"rank", "node", "replica", "gpu", "kind", "severity", "status", "state"}


def busy_exporter() -> EagleEyeExporter:
    ex = EagleEyeExporter()
    ex.observe_samples(
        [
            Sample("loss", 2.5, 1.0, {"rank": "0", "replica": "1"}, step=12),
            Sample("lr", 3e-4, 1.0, {"rank": "0"}),
            Sample("step_time", 0.2, 1.0, {"rank": "3"}, step=12),
            Sample("data_wait", 0.01, 1.0, {"rank": "3"}, step=12),
            Sample("gpu_temp", 81.0, 1.0, {"node": "n1", "gpu": "2"}),
            Sample("xid", 79.0, 1.0, {"node": "n1", "gpu": "2"}),
            Sample("step_time", float("nan"), 1.0, {"rank": "4"}),  # dropped, not exported
            Sample("unknown_thing", 1.0, 1.0, {}),
        ]
    )
    ex.observe_rank(3, "n1", 1)
    finding = Finding("process_exit", Subject(rank=3), 1.0, Severity.CRITICAL, 1.0, 12)
    ex.observe_finding(finding)
    rem = Remediator(synchronous_restart_policy(), FakeRuntime(), hooks=Hooks())
    for decision in rem.handle(finding):
        ex.observe_decision(decision)
    ex.set_checkpoint_states({"persistent": 3, "cached": 1})
    return ex


def values(text: bytes) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for family in text_string_to_metric_families(text.decode()):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def test_promtool_check_metrics_accepts_the_output(tmp_path) -> None:
    result = subprocess.run(
        [need(PROMTOOL, "promtool"), "check", "metrics"],
        input=busy_exporter().text(),
        capture_output=True,
        timeout=30,
    )
    assert result.returncode == 0, result.stderr.decode() + result.stdout.decode()
    assert result.stdout.decode().strip() == ""  # no lint warnings either


def test_samples_findings_and_actions_land_in_their_metrics() -> None:
    got = values(busy_exporter().text())
    assert got[("eagleeye_training_loss", (("replica", "1"),))] == 2.5
    assert got[("eagleeye_training_step", (("replica", "1"),))] == 12
    assert got[("eagleeye_rank_step_time_seconds", (("rank", "3"),))] == 0.2
    assert ("eagleeye_rank_step_time_seconds", (("rank", "4"),)) not in got
    assert got[("eagleeye_gpu_xid_last", (("gpu", "2"), ("node", "n1")))] == 79
    assert got[("eagleeye_gpu_xid_events_total", (("gpu", "2"), ("node", "n1")))] == 1
    key = ("eagleeye_findings_total", (("kind", "process_exit"), ("severity", "critical")))
    assert got[key] == 1
    # dry-run: the restart was decided and skipped
    assert got[("eagleeye_actions_total", (("kind", "restart"), ("status", "skipped")))] == 1
    assert got[("eagleeye_checkpoints", (("state", "persistent"),))] == 3
    assert got[("eagleeye_checkpoints", (("state", "broken"),))] == 0


def test_labels_stay_low_cardinality() -> None:
    got = values(busy_exporter().text())
    labels = {name for _, pairs in got for name, _ in pairs}
    assert labels <= ALLOWED_LABELS
    rank_series = [pairs for name, pairs in got if name.startswith("eagleeye_rank_step")]
    assert all(dict(p).keys() == {"rank"} for p in rank_series)


def test_serve_binds_loopback_and_answers() -> None:
    ex = busy_exporter()
    server, thread = ex.serve(0)
    try:
        assert server.server_address[0] == "127.0.0.1"
        url = f"http://127.0.0.1:{server.server_port}/metrics"
        with urllib.request.urlopen(url, timeout=5) as response:
            assert b"eagleeye_findings_total" in response.read()
    finally:
        server.shutdown()
        thread.join(timeout=5)
