from __future__ import annotations

import math

import pytest

from ft_runtime.errors import FaultSpecError, LaunchError
from ft_runtime.faults import FaultInjector, FaultSpec, parse_specs
from ft_runtime.layout import JobLayout


def test_environment_is_torchrun_compatible_plus_replica_fields() -> None:
    layout = JobLayout(nnodes=2, nproc_per_node=3, replicas=3)
    env = layout.environment(layout.rank(4), "127.0.0.1", 29500, attempt=2, run_id="r")
    assert env["RANK"] == "4"
    assert env["WORLD_SIZE"] == "6"
    assert env["LOCAL_RANK"] == "1"
    assert env["GROUP_RANK"] == "1"
    assert env["LOCAL_WORLD_SIZE"] == "3"
    assert env["MASTER_ADDR"] == "127.0.0.1"
    assert env["MASTER_PORT"] == "29500"
    assert env["TORCHELASTIC_RESTART_COUNT"] == "2"
    assert env["EAGLEEYE_REPLICA"] == "2"
    assert env["EAGLEEYE_REPLICA_RANK"] == "0"
    assert env["EAGLEEYE_NODE"] == "node1"


def test_a_world_that_does_not_split_into_replicas_is_refused() -> None:
    with pytest.raises(LaunchError, match="cannot be split into 4 equal replicas"):
        JobLayout(nnodes=1, nproc_per_node=6, replicas=4)


def test_fault_specs_parse_with_options() -> None:
    spec = FaultSpec.parse("slow:rank=2@step=20,seconds=0.3,steps=5")
    assert (spec.kind, spec.rank, spec.step, spec.seconds, spec.steps) == ("slow", 2, 20, 0.3, 5)
    assert spec.active(24)
    assert not spec.active(25)
    assert not spec.active(19)
    assert [s.kind for s in parse_specs(["kill:rank=1@step=3;nan:rank=0@step=4"])] == [
        "kill",
        "nan",
    ]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("explode:rank=1@step=2", "unknown fault kind 'explode'"),
        ("kill:rank=1", "needs one of step= or time="),
        ("kill:rank=x@step=2", "bad number"),
        ("kill:rank=1@step=2,color=red", "unknown keys"),
        ("kill:rank=1@step=2,phase=lunch", "unknown phase"),
        ("kill:rank1@step=2", "is not key=value"),
    ],
)
def test_bad_fault_specs_say_what_is_wrong(text: str, message: str) -> None:
    with pytest.raises(FaultSpecError, match=message):
        FaultSpec.parse(text)


def test_injector_keeps_its_rank_and_attempt_and_scales_the_loss() -> None:
    announced = []
    specs = parse_specs(
        [
            "nan:rank=1@step=5",
            "loss_spike:rank=1@step=6,factor=20",
            "nan:rank=0@step=5",
            "nan:rank=1@step=7,attempt=1",
        ]
    )
    injector = FaultInjector(specs, rank=1, attempt=0, notify=announced.append)
    assert math.isnan(injector.loss_multiplier(5))
    assert injector.loss_multiplier(6) == 20.0
    assert injector.loss_multiplier(7) == 1.0
    assert [s.kind for s in announced] == ["nan", "loss_spike"]


def test_a_scenario_file_lists_specs_and_names_the_bad_line(tmp_path) -> None:
    from ft_runtime.errors import FaultSpecError
    from ft_runtime.faults import load_scenario

    good = tmp_path / "faults.txt"
    good.write_text("# two faults\nkill:rank=1@step=10\n\nstop:rank=2@step=30  # a hang\n")
    assert load_scenario(good) == ["kill:rank=1@step=10", "stop:rank=2@step=30"]
    bad = tmp_path / "bad.txt"
    bad.write_text("kill:rank=1@step=10\nexplode:rank=1@step=3\n")
    with pytest.raises(FaultSpecError, match="bad.txt, line 2: unknown fault kind 'explode'"):
        load_scenario(bad)
    with pytest.raises(FaultSpecError, match="cannot read fault scenario"):
        load_scenario(tmp_path / "missing.txt")
