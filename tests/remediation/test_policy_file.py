"""Policy files: the default parses, and each kind of mistake names its line and key."""

from __future__ import annotations

from pathlib import Path

import pytest

from ft_runtime.types import ActionKind
from remediation import PolicyError, load_policy, parse_policy

DEFAULT = Path(__file__).resolve().parents[2] / "remediation" / "policies" / "default.toml"

GOOD = """
[policy]
name = "t"
approval = ["evict"]

[limits]
evict = { max = 1, per_s = 60 }

[[rule]]
kind = "slow_rank"
ladder = [
  { do = ["notify:subject"] },
  { do = ["evict:node"], after = 3 },
]
"""


def test_the_default_policy_loads_and_is_a_dry_run() -> None:
    policy = load_policy(DEFAULT)
    assert policy.dry_run
    assert policy.source == str(DEFAULT)
    kinds = {rule.kind for rule in policy.rules}
    assert {"process_exit", "hang", "nan", "slow_rank", "xid", "loss_spike"} <= kinds
    limits = {limit.action: limit.max for limit in policy.limits}
    assert limits[ActionKind.EVICT] == 2


def test_a_good_policy_gives_its_ladder_limits_and_approval() -> None:
    policy = parse_policy(GOOD)
    (rule,) = policy.rules
    assert [r.steps[0].action for r in rule.ladder] == [ActionKind.NOTIFY, ActionKind.EVICT]
    assert [r.steps[0].scope for r in rule.ladder] == ["subject", "node"]
    assert policy.approval == frozenset({ActionKind.EVICT})
    assert policy.name == "t"


@pytest.mark.parametrize(
    ("text", "line", "key"),
    [
        (GOOD.replace('"evict:node"', '"explode:node"'), 13, "do"),
        (GOOD.replace('"evict:node"', '"evict:rack"'), 13, "do"),
        (GOOD.replace("after = 3", "after = 0"), 13, "after"),
        (GOOD.replace("after = 3", 'after = "3"'), 13, "after"),
        (GOOD.replace('kind = "slow_rank"', 'kind = "slow_rank"\ncooldown = 5'), 11, "cooldown"),
        (GOOD.replace('approval = ["evict"]', 'approval = ["nuke"]'), 4, "approval"),
        (GOOD.replace("max = 1,", "max = 1.5,"), 7, "evict"),
        (
            GOOD.replace('kind = "slow_rank"', 'kind = "slow_rank"\nmin_severity = "fatal"'),
            11,
            "min_severity",
        ),
        (GOOD.replace("[limits]", "[limit]"), 6, "limit"),
    ],
)
def test_a_semantic_mistake_names_line_and_key(text: str, line: int, key: str) -> None:
    with pytest.raises(PolicyError) as caught:
        parse_policy(text, source="p.toml")
    message = str(caught.value)
    assert message.startswith(f"p.toml: line {line}, key {key!r}"), message


def test_a_syntax_error_names_line_and_column() -> None:
    with pytest.raises(PolicyError, match=r"p.toml: not valid TOML: .*line 3, column"):
        parse_policy('[policy]\nname = "x"\ndry_run = tru\n', source="p.toml")


def test_missing_file_and_empty_policy_are_clear(tmp_path: Path) -> None:
    with pytest.raises(PolicyError, match="cannot read policy file"):
        load_policy(tmp_path / "nope.toml")
    with pytest.raises(PolicyError, match="at least one \\[\\[rule\\]\\]"):
        parse_policy("[policy]\nname = 'x'\n")
