"""Policy and fault files: every number finite and in range, binary files one clear error."""

from __future__ import annotations

import pytest

from ft_runtime.errors import FaultSpecError
from ft_runtime.faults import FaultSpec, load_scenario, parse_specs
from remediation.config import load_policy, parse_policy
from remediation.errors import PolicyError

RULE = '[[rule]]\nkind = "hang"\n'


@pytest.mark.parametrize(
    ("text", "named"),
    [
        (RULE + 'do = ["notify"]\ncooldown_s = nan\n', "cooldown_s"),
        (RULE + 'do = ["notify"]\ncooldown_s = inf\n', "cooldown_s"),
        (RULE + 'do = ["notify"]\nreset_after_s = -inf\n', "reset_after_s"),
        (RULE + 'ladder = [{ do = ["rollback"], params = { lr_factor = nan } }]\n', "params"),
        (RULE + 'ladder = [{ do = ["rollback"], params = { lr_factor = 0 } }]\n', "lr_factor"),
        (RULE + 'ladder = [{ do = ["rollback"], params = { lr_factor = 2.0 } }]\n', "lr_factor"),
        (RULE + 'ladder = [{ do = ["rollback"], params = { lr_factor = true } }]\n', "params"),
        ("[limits]\nevict = { max = 2, per_s = nan }\n" + RULE + 'do = ["evict"]\n', "evict"),
        ("[limits]\nevict = { max = 2, per_s = 0 }\n" + RULE + 'do = ["evict"]\n', "evict"),
    ],
)
def test_policy_numbers_must_be_finite_and_in_range(text: str, named: str) -> None:
    with pytest.raises(PolicyError, match=f"key '{named}'"):
        parse_policy(text, "p.toml")


def test_a_valid_lr_factor_is_kept() -> None:
    policy = parse_policy(RULE + 'ladder = [{ do = ["rollback"], params = { lr_factor = 0.5 } }]')
    assert dict(policy.rules[0].ladder[0].steps[0].params) == {"lr_factor": 0.5}


@pytest.mark.parametrize("content", [bytes(range(256)), "é = 1".encode("latin-1"), b"\x00" * 64])
def test_a_binary_policy_file_is_one_clear_error(tmp_path, content: bytes) -> None:
    path = tmp_path / "policy.toml"
    path.write_bytes(content)
    with pytest.raises(PolicyError, match="policy"):
        load_policy(path)


@pytest.mark.parametrize("content", [bytes(range(256)), "kill:rank=0@step=1 # é".encode("latin-1")])
def test_a_binary_scenario_file_is_one_clear_error(tmp_path, content: bytes) -> None:
    path = tmp_path / "faults.txt"
    path.write_bytes(content)
    with pytest.raises(FaultSpecError, match="not UTF-8 text"):
        load_scenario(path)


@pytest.mark.parametrize(
    "spec",
    [
        "kill:rank=-1@step=5",
        "kill:rank=0@step=-5",
        "slow:rank=0@step=1,seconds=inf",
        "slow:rank=0@step=1,seconds=-1",
        "slow:rank=0@step=1,seconds=nan",
        "slow:rank=0@step=1",
        "stop:rank=0@step=1,seconds=nan",
        "loss_spike:rank=0@step=1,factor=nan",
        "kill:rank=0@step=1,attempt=-1",
        "slow:rank=0@step=1,seconds=1,steps=-2",
    ],
)
def test_inject_specs_out_of_range_are_refused(spec: str) -> None:
    with pytest.raises(FaultSpecError, match="fault spec"):
        parse_specs([spec])


def test_valid_specs_still_parse() -> None:
    assert FaultSpec.parse("slow:rank=2@step=20,seconds=0.3").seconds == 0.3
    assert FaultSpec.parse("kill:rank=0@step=0").step == 0
