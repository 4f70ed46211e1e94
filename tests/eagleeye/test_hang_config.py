"""Every hang limit is a flag of `eagleeye run` and a key of the detectors' config file."""

from __future__ import annotations

import pytest

from detectors.config import CONFIG_ENV
from detectors.errors import DetectorError
from detectors.progress import HangLimits, ProgressStall
from eagleeye.cli import build_parser
from eagleeye.detection import live_config
from eagleeye.errors import EagleEyeError
from eagleeye.launch import detector_config, job_config_from_args


def config_of(*flags: str):
    args = build_parser().parse_args(["run", *flags, "train.py"])
    return job_config_from_args(args)


def test_flags_set_the_limits_and_instrumentation(monkeypatch) -> None:
    monkeypatch.delenv(CONFIG_ENV, raising=False)
    config = config_of("--hang-stopped-s", "0.5", "--hang-idle-s", "30", "--no-instrument")
    assert config.hang == {"stopped_s": 0.5, "idle_s": 30.0}
    assert not config.instrument
    limits, fused = detector_config(config.hang)
    assert limits == HangLimits(stopped_s=0.5, idle_s=30.0)
    assert fused is None
    assert config_of().instrument
    assert config_of().hang == {}


def test_the_ranks_start_through_the_boot_unless_told_not_to(tmp_path) -> None:
    script = tmp_path / "train.py"
    script.write_text("pass\n")
    booted = config_of()
    booted = type(booted)(script=str(script), script_args=["--lr", "1"])
    assert booted.command() == ["-m", "eagleeye.boot", str(script), "--lr", "1"]
    bare = type(booted)(script=str(script), instrument=False)
    assert bare.command() == [str(script)]


def test_flags_override_the_hang_table_and_a_file_without_detectors_keeps_the_live_ones(
    tmp_path, monkeypatch
) -> None:
    path = tmp_path / "detectors.toml"
    path.write_text("[hang]\nstopped_s = 1.0\nblocked_s = 10\n")
    monkeypatch.setenv(CONFIG_ENV, str(path))
    limits, fused = detector_config(config_of("--hang-stopped-s", "0.5").hang)
    assert (limits.stopped_s, limits.blocked_s) == (0.5, 10.0)
    assert fused is not None
    assert fused.specs == live_config().specs
    stall = ProgressStall(**{"stopped_s": limits.stopped_s})
    assert stall.stopped_limit() == 0.5
    path.write_text("[hang]\nstartup_grace_s = 120\n")
    with pytest.raises(DetectorError, match="unknown hang limit"):
        detector_config(config_of().hang)


def test_the_controller_takes_its_hang_limits_over_the_hang_table(tmp_path, monkeypatch) -> None:
    from eagleeye.commands.hang_flags import hang_limits

    common = ["controller", "--listen", "127.0.0.1:1", "--secret-file", "s", "--nnodes", "2"]

    def controller(*flags: str) -> HangLimits:
        return hang_limits(build_parser().parse_args([*common, *flags]))

    monkeypatch.delenv(CONFIG_ENV, raising=False)
    assert controller() == HangLimits()
    assert controller("--hang-k", "4", "--hang-min-silence-s", "2") == HangLimits(
        k=4.0, min_silence_s=2.0
    )
    path = tmp_path / "detectors.toml"
    path.write_text("[hang]\nmin_silence_s = 8.0\n")
    monkeypatch.setenv(CONFIG_ENV, str(path))
    assert (controller().min_silence_s, controller("--hang-k", "3").k) == (8.0, 3.0)
    idle = controller("--hang-idle-s", "3", "--hang-blocked-s", "7")  # as eagleeye run's
    assert (idle.idle_s, idle.blocked_s, idle.min_silence_s) == (3.0, 7.0, 8.0)
    with pytest.raises(SystemExit):  # only the limits the controller judges by
        build_parser().parse_args([*common, "--hang-collective-s", "3"])


def test_the_no_step_telemetry_notice_is_a_flag() -> None:
    # ranks that sent no step are announced this far into an attempt (60 s by default)
    assert config_of().no_step_notice_s == 60.0
    assert config_of("--no-step-notice", "20").no_step_notice_s == 20.0
    with pytest.raises(EagleEyeError, match="--no-step-notice 0.0 is not a number of seconds"):
        config_of("--no-step-notice", "0")
