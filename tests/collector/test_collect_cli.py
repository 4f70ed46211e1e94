"""`eagleeye collect` on real files, a real exporter and a real Prometheus server."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from collector.errors import CollectorError, ParseError
from collector.sniff import KINDS, read_source, sniff_kind
from eagleeye.cli import main


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(["collect", *argv])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize(
    ("name", "kind"),
    [
        ("telemetry/dcgm-exporter-3.3-h100.prom", "exporter"),
        ("telemetry/node-exporter.prom", "exporter"),
        ("telemetry/kmsg-xid.log", "kernel-log"),
        ("telemetry/nccl-watchdog.log", "nccl-log"),
        ("nccl/nccl_trace_rank_0", "flight-recorder"),
        ("nccl/nccl_trace_rank_0.json", "flight-recorder"),
    ],
)
def test_kind_is_sniffed_from_the_content(fixtures: Path, name: str, kind: str) -> None:
    assert sniff_kind((fixtures / name).read_bytes(), Path(name).name) == kind
    assert read_source(str(fixtures / name))[0] == kind


def test_table_of_an_exporter_file_shows_samples_events_and_drops(
    fixtures: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = fixtures / "telemetry" / "dcgm-exporter-4.1-h100-xid79.prom"
    code, out, _ = _run(capsys, str(path), "--limit", "3")
    assert code == 0
    assert "46 samples" in out
    assert "DCGM_FI_DEV_SM_CLOCK" in out
    assert "43 more" in out
    assert "gpu_xid" in out
    assert "GPU has fallen off the bus" in out
    assert "dcgm_sentinel: 1" in out
    assert "nan: 1" in out


def test_a_folder_of_dumps_names_the_rank_left_behind(
    fixtures: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = _run(capsys, str(fixtures / "nccl"), "--json")
    assert code == 0
    rows = [json.loads(line) for line in out.splitlines()]
    behind = [r["event"] for r in rows if "event" in r and r["event"]["kind"] == "nccl_rank_behind"]
    assert [(e["labels"]["rank"], e["value"]) for e in behind] == [("1", 5.0)]
    assert rows[-1] == {"dropped": {}}


def test_a_live_exporter_url_is_scraped(exporter: int, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _run(capsys, f"http://127.0.0.1:{exporter}/metrics", "--json")
    assert code == 0
    rows = [json.loads(line) for line in out.splitlines()]
    temps = {
        r["sample"]["labels"]["gpu"]: r["sample"]["value"]
        for r in rows
        if "sample" in r and r["sample"]["name"] == "ee_test_gpu_temp"
    }
    assert temps == {"0": 41.0, "1": 77.0}
    xids = [r["event"] for r in rows if "event" in r]
    assert [(e["labels"]["node"], e["value"]) for e in xids] == [("gpu-node-07", 79.0)]


@pytest.mark.integration
@pytest.mark.timeout(90)
def test_a_prometheus_query(prometheus: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _run(capsys, prometheus, "--query", "max(ee_test_gpu_temp)")
    assert code == 0
    assert "1 samples" in out
    assert "77" in out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["no/such/file"], "cannot read"),
        (["http://127.0.0.1:1/metrics", "--timeout", "2"], "cannot reach"),
        (["http://127.0.0.1:1", "--kind", "prometheus"], "needs a query"),
    ],
)
def test_bad_sources_exit_2_with_one_clear_line(
    capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    code, out, err = _run(capsys, *argv)
    assert code == 2
    assert message in err
    assert err.count("\n") == 1


def test_a_file_of_unknown_kind_asks_for_kind(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "notes.txt"
    path.write_text("hello there\nnothing to see\n")
    code, _, err = _run(capsys, str(path))
    assert code == 2
    assert "--kind" in err
    with pytest.raises(ParseError, match="unknown kind"):
        read_source(str(path), kind="csv")


def test_a_corrupt_dump_names_the_file(tmp_path: Path, fixtures: Path) -> None:
    dump = tmp_path / "nccl_trace_rank_0"
    dump.write_bytes((fixtures / "nccl" / "nccl_trace_rank_0").read_bytes()[:200])
    with pytest.raises(ParseError, match="nccl_trace_rank_0.*pickle"):
        read_source(str(dump))


@settings(
    max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(st.binary(max_size=2000), st.sampled_from(["dump", "nccl_trace_rank_7", "kern.log"]))
def test_any_file_gives_a_reading_or_a_collector_error(
    tmp_path: Path, data: bytes, name: str
) -> None:
    path = tmp_path / name
    path.write_bytes(data)
    try:
        kind, parsed = read_source(str(path))
    except CollectorError:
        return
    assert kind in KINDS
    assert all(v > 0 for v in parsed.dropped.values())


def test_a_console_log_gives_xids_and_timeouts_both(tmp_path: Path, fixtures: Path) -> None:
    log = tmp_path / "console.log"
    log.write_text(
        (fixtures / "telemetry" / "kmsg-xid.log").read_text()
        + (fixtures / "telemetry" / "nccl-watchdog.log").read_text()
    )
    kind, parsed = read_source(str(log))
    assert kind == "kernel-log"
    kinds = {e.kind for e in parsed.events}
    assert kinds == {"gpu_xid", "nccl_timeout", "nccl_watchdog_failure"}
    assert parsed.dropped == {"malformed_xid": 1, "malformed_timeout": 1}
    only_xids = read_source(str(log), kind="kernel-log")[1]
    assert {e.kind for e in only_xids.events} == {"gpu_xid"}
