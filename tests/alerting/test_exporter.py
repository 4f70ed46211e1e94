"""The exporter's output: what promtool accepts, what the samples feed, which labels exist."""

from __future__ import annotations

import math
import subprocess
import urllib.request

import pandas as pd
import pytest
from prometheus_client.parser import text_string_to_metric_families

from collector.nvml import NvmlPoller
from collector.testing import FakeNVML
from collector.types import Sample, Subject
from detectors.types import Finding, Severity
from eagleeye.exporter import EagleEyeExporter
from eagleeye.goodput import STEP_COLUMNS, effective_training
from ft_runtime.testing import FakeRuntime
from remediation import Hooks, Remediator, synchronous_restart_policy
from tests.alerting.conftest import PROMTOOL, need

RUN = "run-a"
GPU_LABELS = {"run", "Hostname", "node", "gpu", "UUID"}


def step(rank: int, n: int, seconds: float, **parts: float) -> list[Sample]:
    """What the hook sends for one step of a rank (its aliases, as the workload sends)."""
    labels = {"rank": str(rank), "replica": "0", "node": "node0", "attempt": "0"}
    at = 100.0 + n
    rows = [Sample("step_time", seconds, at, labels, step=n)]
    rows += [Sample(name, value, at, labels, step=n) for name, value in parts.items()]
    return rows


def busy_exporter() -> EagleEyeExporter:
    ex = EagleEyeExporter(run=RUN, hostname="host-a", ettr_every_s=0.0)
    samples = [
        Sample("loss", 2.5, 1.0, {"rank": "0", "replica": "1"}, step=12),
        Sample("lr", 3e-4, 1.0, {"rank": "0"}),
        Sample("tokens", 64.0, 1.0, {"rank": "0"}, step=12),
        Sample("tokens", 64.0, 1.0, {"rank": "3"}, step=12),
        Sample("step_time", float("nan"), 1.0, {"rank": "4"}),  # dropped, not exported
        Sample("unknown_thing", 1.0, 1.0, {}),
        Sample("event.checkpoint", 10.0, 1.0, {"rank": "0", "tier": "disk"}, step=10),
        Sample("event.checkpoint", 12.0, 1.0, {"rank": "0", "tier": "memory"}, step=12),
    ]
    for n in range(3):
        samples += step(3, n, 0.2, **{"section.data": 0.03, "collective_time": 0.05})
    ex.observe_samples(samples)
    ex.observe_samples(NvmlPoller(node="node1", nvml=FakeNVML(gpus=2)).collect())
    ex.observe_rank(3, "node1", 1, gpu="1")
    ex.track_progress(lambda: {"3": "stepping"})
    finding = Finding("process_exit", Subject(rank=3), 1.0, Severity.CRITICAL, 1.0, 12)
    ex.observe_finding(finding)
    ex.observe_finding(Finding("slow_rank", Subject(rank=3), 1.0, Severity.WARN, 1.0, 12))
    rem = Remediator(synchronous_restart_policy(), FakeRuntime(), hooks=Hooks())
    for decision in rem.handle(finding):
        ex.observe_decision(decision)
    return ex


def values(text: bytes) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for family in text_string_to_metric_families(text.decode()):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def one(got: dict, name: str, **labels: str) -> float:
    """The value of the one series of ``name`` whose labels include ``labels``."""
    hits = [
        v for (n, pairs), v in got.items() if n == name and labels.items() <= dict(pairs).items()
    ]
    assert len(hits) == 1, (name, labels, hits)
    return hits[0]


def test_promtool_check_metrics_accepts_the_output() -> None:
    result = subprocess.run(
        [need(PROMTOOL, "promtool"), "check", "metrics"],
        input=busy_exporter().text(),
        capture_output=True,
        timeout=30,
    )
    # dcgm-exporter's own field names break one lint (a counter named ..._COUNTER); they
    # are kept as they are so that its rules and dashboards join. Ours pass every lint.
    problems = (result.stderr.decode() + result.stdout.decode()).splitlines()
    assert [p for p in problems if not p.startswith("DCGM_FI_")] == []
    assert result.returncode in (0, 3)  # 3: lint problems only, none of them ours


def test_every_series_carries_the_run_and_no_created_series() -> None:
    got = values(busy_exporter().text())
    assert all(dict(pairs).get("run") == RUN for _, pairs in got), [
        n for n, p in got if dict(p).get("run") != RUN
    ]
    assert not [name for name, _ in got if name.endswith("_created")]


def test_samples_findings_and_actions_land_in_their_metrics() -> None:
    got = values(busy_exporter().text())
    assert one(got, "eagleeye_training_loss", replica="1") == 2.5
    assert one(got, "eagleeye_training_step", replica="1") == 12
    assert one(got, "eagleeye_rank_step_time_seconds", rank="3") == 0.2
    assert not [p for n, p in got if n.startswith("eagleeye_rank") and ("rank", "4") in p]
    assert one(got, "eagleeye_findings_total", kind="process_exit", severity="critical") == 1
    assert one(got, "eagleeye_findings_total", kind="slow_rank", severity="warning") == 1
    # dry-run: the restart was decided and skipped
    assert one(got, "eagleeye_actions_total", kind="restart", status="skipped") == 1
    assert one(got, "eagleeye_run_active") == 1


def test_counters_for_steps_and_tokens_and_a_step_time_histogram() -> None:
    got = values(busy_exporter().text())
    assert one(got, "eagleeye_steps_total") == 3
    assert one(got, "eagleeye_rank_steps_total", rank="3") == 3
    assert one(got, "eagleeye_tokens_total") == 128
    assert one(got, "eagleeye_step_time_seconds_count") == 3
    assert one(got, "eagleeye_step_time_seconds_sum") == pytest.approx(0.6)
    assert one(got, "eagleeye_step_time_seconds_bucket", le="0.32") == 3
    assert one(got, "eagleeye_step_time_seconds_bucket", le="0.16") == 0


def test_compute_data_wait_and_collective_wait_split_the_step() -> None:
    got = values(busy_exporter().text())
    assert one(got, "eagleeye_rank_data_wait_seconds", rank="3") == pytest.approx(0.03)
    assert one(got, "eagleeye_rank_collective_wait_seconds", rank="3") == pytest.approx(0.05)
    assert one(got, "eagleeye_rank_compute_seconds", rank="3") == pytest.approx(0.12)


def test_rank_info_names_where_a_rank_runs_with_its_gpu_uuid() -> None:
    got = values(busy_exporter().text())
    info = [dict(p) for n, p in got if n == "eagleeye_rank_info"]
    assert len(info) == 1
    assert info[0]["rank"] == "3"
    assert info[0]["replica"] == "1"
    assert info[0]["node"] == "node1"
    assert info[0]["hostname"] == "host-a"
    assert info[0]["gpu"] == "1"
    uuid = one(got, "DCGM_FI_DEV_GPU_TEMP", node="node1", gpu="1")  # the GPU is exported
    assert uuid == 45.0
    gpu1 = [dict(p) for n, p in got if n == "DCGM_FI_DEV_GPU_TEMP" and ("gpu", "1") in p]
    assert info[0]["uuid"] == gpu1[0]["UUID"] != ""


def test_a_relaunch_elsewhere_replaces_the_rank_info() -> None:
    ex = busy_exporter()
    ex.observe_rank(3, "node0", 0, gpu="0")
    info = [dict(p) for n, p in values(ex.text()) if n == "eagleeye_rank_info"]
    assert [(i["node"], i["replica"]) for i in info] == [("node0", "0")]


def test_gpu_series_use_dcgm_names_units_and_labels() -> None:
    got = values(busy_exporter().text())
    gpu = [(n, dict(p)) for n, p in got if n.startswith("DCGM_FI_")]
    assert {n for n, _ in gpu} >= {
        "DCGM_FI_DEV_GPU_TEMP",
        "DCGM_FI_DEV_GPU_UTIL",
        "DCGM_FI_DEV_FB_USED",
        "DCGM_FI_DEV_POWER_USAGE",
        "DCGM_FI_DEV_XID_ERRORS",
        "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
        "DCGM_FI_DEV_ROW_REMAP_FAILURE",
        "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS",
        "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL",
    }
    assert all(labels.keys() == GPU_LABELS for _, labels in gpu)
    assert all(labels["Hostname"] == "host-a" for _, labels in gpu)
    assert one(got, "DCGM_FI_DEV_GPU_UTIL", gpu="0") == 97  # percent, as dcgm-exporter
    assert one(got, "DCGM_FI_DEV_FB_USED", gpu="0") == pytest.approx(70 * 1024)  # MiB
    assert one(got, "DCGM_FI_DEV_POWER_USAGE", gpu="0") == pytest.approx(412.0)  # W
    assert one(got, "DCGM_FI_DEV_XID_ERRORS", gpu="0") == 0  # known GPU, no XID yet


def test_an_xid_through_the_fake_nvml_sets_the_sticky_gauge_and_counts() -> None:
    ex = EagleEyeExporter(run=RUN)
    nvml = FakeNVML(gpus=2)
    poller = NvmlPoller(node="node0", nvml=nvml)
    ex.observe_samples(poller.collect())
    nvml.inject_xid(1, 79)
    ex.observe_samples(poller.collect())
    got = values(ex.text())
    assert one(got, "DCGM_FI_DEV_XID_ERRORS", gpu="1") == 79
    assert one(got, "DCGM_FI_DEV_XID_ERRORS", gpu="0") == 0
    assert one(got, "eagleeye_gpu_xid_events_total", gpu="1", xid="79") == 1
    ex.observe_xid("node0", "1", 0)  # a reset to XID 0 is no event
    got = values(ex.text())
    assert one(got, "DCGM_FI_DEV_XID_ERRORS", gpu="1") == 0
    assert [n for n, p in got if n == "eagleeye_gpu_xid_events_total"] == [
        "eagleeye_gpu_xid_events_total"
    ]


def test_checkpoint_states_are_filled_from_checkpoint_events() -> None:
    got = values(busy_exporter().text())
    assert one(got, "eagleeye_checkpoints", state="persistent") == 1
    assert one(got, "eagleeye_checkpoints", state="cached") == 1
    assert one(got, "eagleeye_checkpoints", state="broken") == 0
    assert one(got, "eagleeye_checkpoint_last_step") == 12


def test_the_ettr_gauge_is_the_summarys_function_on_the_same_samples() -> None:
    ex = EagleEyeExporter(run=RUN, ettr_every_s=0.0)
    rows, samples = [], []
    for n, (seconds, at) in enumerate([(0.2, 1.0), (0.2, 1.2), (0.3, 1.5), (0.2, 2.9), (0.2, 3.1)]):
        labels = {"rank": "0", "attempt": str(int(n >= 3))}
        samples.append(Sample("step_time", seconds, at, labels, step=n))
        rows.append(("step_time", n, seconds, at, int(n >= 3)))
    ex.observe_samples(samples)
    expected, lost = effective_training(pd.DataFrame(rows, columns=list(STEP_COLUMNS)), 1)
    got = values(ex.text())
    assert math.isclose(one(got, "eagleeye_ettr_ratio"), expected)
    assert math.isclose(one(got, "eagleeye_training_lost_seconds"), lost)
    assert 0 < expected < 1


def test_finish_marks_the_run_ended() -> None:
    ex = busy_exporter()
    ex.finish()
    assert one(values(ex.text()), "eagleeye_run_active") == 0


def test_a_scrape_that_sees_the_run_ended_sees_its_final_ettr(monkeypatch) -> None:
    """The final ETTR is set before ``eagleeye_run_active`` falls to 0: a scrape between
    the two (the server does not take the exporter's lock) must not read an ended run
    that has no final ETTR."""
    ex = EagleEyeExporter(run=RUN, ettr_every_s=3600.0)
    ex.observe_samples([Sample("step_time", 0.2, 1.0 + n, {"rank": "0"}, step=n) for n in range(5)])
    seen_while_computing: list[float] = []

    def effective_training_seen_by_a_scrape(table, replicas):
        seen_while_computing.append(one(values(ex.text()), "eagleeye_run_active"))
        return effective_training(table, replicas)

    monkeypatch.setattr("eagleeye.exporter.effective_training", effective_training_seen_by_a_scrape)
    ex.finish()
    assert seen_while_computing == [1]
    got = values(ex.text())
    assert one(got, "eagleeye_run_active") == 0
    assert 0 < one(got, "eagleeye_ettr_ratio") <= 1


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


def test_rank_progress_is_read_at_each_scrape_and_stops_with_the_run() -> None:
    ex = EagleEyeExporter(run=RUN)
    states = {"0": "waiting", "1": "stopped"}
    ex.track_progress(lambda: states)
    got = values(ex.text())
    assert one(got, "eagleeye_rank_progress", rank="1") == 1
    assert [dict(p)["state"] for n, p in got if n == "eagleeye_rank_progress"] == [
        "waiting",
        "stopped",
    ]
    states["1"] = "stepping"
    assert one(values(ex.text()), "eagleeye_rank_progress", rank="1", state="stepping") == 1
    ex.finish()
    assert not [n for n, _ in values(ex.text()) if n == "eagleeye_rank_progress"]
