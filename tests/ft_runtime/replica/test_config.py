"""Replica recovery's defaults live in one torch-free module that every layer reads."""

from __future__ import annotations

import inspect
import subprocess
import sys

import pytest

from ft_runtime.replica import config
from ft_runtime.replica.config import DEFAULTS, ReplicaConfig


def test_the_command_line_reads_the_defaults_without_importing_torch() -> None:
    code = (
        "import sys, eagleeye.commands.run, ft_runtime.replica.config; "
        "print('torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_every_layer_defaults_to_the_config() -> None:
    from eagleeye.cli import build_parser
    from eagleeye.launch import JobConfig
    from ft_runtime.catchup import SERVE_NICE
    from ft_runtime.quorum import QuorumService
    from ft_runtime.replica import ReplicaSupervisor

    job = JobConfig("train.py")
    for name, value in DEFAULTS.as_dict().items():
        assert getattr(job, name) == value, name
    quorum = inspect.signature(QuorumService).parameters
    for name in ("stall_factor", "stall_floor_s", "lateness_factor"):
        assert quorum[name].default == getattr(DEFAULTS, name), name
    supervisor = inspect.signature(ReplicaSupervisor).parameters
    for name in ("max_restarts", "max_job_restarts", "command_timeout_s", "joiner_nice"):
        assert supervisor[name].default == getattr(DEFAULTS, name), name
    assert SERVE_NICE == config.SERVE_NICE  # the rank side keeps its own copy: they agree
    args = build_parser().parse_args(["run", "train.py"])
    assert (args.min_replicas, args.max_restarts) == (DEFAULTS.min_replicas, DEFAULTS.max_restarts)


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("stall_factor", float("nan"), "replica stall_factor nan must be > 0"),
        ("stall_floor_s", -1.0, "replica stall_floor_s -1 must be >= 0"),
        ("min_replicas", 0, "replica min_replicas 0 must be > 0"),
        ("joiner_nice", 25, "replica joiner_nice 25 must be a nice increment in 0..19"),
    ],
)
def test_a_bad_setting_is_refused_with_its_name(field: str, value: float, message: str) -> None:
    with pytest.raises(ValueError, match="^" + message.replace(".", r"\.") + "$"):
        ReplicaConfig(**{field: value})  # type: ignore[arg-type]
