"""Policy files: TOML in, a validated Policy out, or an error naming the line and the key.

The format (remediation/policies/default.toml is the reference)::

    [policy]
    name = "default"
    dry_run = true                       # the default: decide and record only
    approval = ["evict"]                 # action kinds that wait for approval

    [limits]
    evict = { max = 2, per_s = 3600 }    # at most 2 evictions per hour

    [[rule]]
    kind = "slow_rank"                   # a finding kind (any string)
    min_severity = "warn"                # info | warn | critical
    on = "rank"                          # the finding's subject scope, or "any"
    cooldown_s = 60
    ladder = [
      { do = ["notify:subject"] },
      { do = ["checkpoint:replica"], after = 3 },
      { do = ["evict:node"], after_steps = 50 },
    ]

Each action is ``kind[:scope]`` with scope job (the default), replica, node or subject.
"""

from __future__ import annotations

import math
import re
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from detectors.types import Severity
from ft_runtime.types import ActionKind
from remediation.errors import PolicyError
from remediation.policy import SCOPES, Limit, Policy, Rule, Rung, Step

_POLICY_KEYS = {"name", "dry_run", "approval"}
_RULE_KEYS = {"kind", "min_severity", "on", "cooldown_s", "reset_after_s", "ladder", "do"}
_RUNG_KEYS = {"do", "after", "after_steps", "max_times", "params"}


class _Where:
    """Finds the line of a key in the text, so semantic errors can name it."""

    def __init__(self, text: str, source: str) -> None:
        self.lines = text.splitlines()
        self.source = source
        headers = [i for i, line in enumerate(self.lines) if line.strip() == "[[rule]]"]
        self.rule_spans = list(zip(headers, [*headers[1:], len(self.lines)], strict=False))

    def error(
        self, key: str, message: str, rule: int | None = None, value: object = None
    ) -> PolicyError:
        """An error naming the line of ``key`` (within rule ``rule``, on a line holding
        ``value`` when given: a ladder repeats its keys on several lines)."""
        start, end = self.rule_spans[rule] if rule is not None else (0, len(self.lines))
        k = re.escape(key)
        pattern = re.compile(rf"(^|[\s{{,]){k}\s*=|^\s*\[\[?{k}\]\]?\s*$")
        hits = [i for i in range(start, end) if pattern.search(self.lines[i])]
        if value is not None:
            hits = [i for i in hits if str(value) in self.lines[i]] or hits
        line = hits[0] if hits else None
        if line is None and rule is not None:
            line = start
        at = f"line {line + 1}, " if line is not None else ""
        return PolicyError(f"{self.source}: {at}key {key!r}: {message}")


def builtin_policy(name: str) -> Path:
    """Path of a policy file shipped with Eagle Eye (``default``, ``replica``)."""
    path = Path(__file__).resolve().parent / "policies" / f"{name}.toml"
    if not path.is_file():
        known = sorted(p.stem for p in path.parent.glob("*.toml"))
        raise PolicyError(f"no built-in policy {name!r}; known: {', '.join(known)}")
    return path


def load_policy(path: str | Path) -> Policy:
    """Reads a policy file.

    Raises:
        PolicyError: the file is missing, is not TOML, or holds an unusable policy; the
            message names the file, the line and the key.
    """
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise PolicyError(f"cannot read policy file {path}: {exc.strerror}") from exc
    except UnicodeDecodeError as exc:
        raise PolicyError(
            f"policy file {path} is not UTF-8 text (byte {exc.start}); give a TOML file"
        ) from None
    return parse_policy(text, source=str(path))


def parse_policy(text: str, source: str = "<policy>") -> Policy:
    """Parses policy TOML text; see the module docstring for the format."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise PolicyError(f"{source}: not valid TOML: {exc}") from exc
    where = _Where(text, source)
    _unknown(where, data, {"policy", "limits", "rule"}, None)
    head = _table(where, data, "policy")
    _unknown(where, head, _POLICY_KEYS, None)
    rules = data.get("rule", [])
    if not isinstance(rules, list) or not rules:
        raise where.error("rule", "a policy needs at least one [[rule]] table")
    return Policy(
        rules=tuple(_rule(where, i, r) for i, r in enumerate(rules)),
        name=str(_typed(where, head, "name", str, "custom")),
        dry_run=bool(_typed(where, head, "dry_run", bool, True)),
        limits=_limits(where, _table(where, data, "limits")),
        approval=frozenset(_kind(where, k, "approval") for k in head.get("approval", [])),
        source=source,
    )


def _rule(where: _Where, index: int, raw: Mapping[str, Any]) -> Rule:
    _unknown(where, raw, _RULE_KEYS, index)
    if not isinstance(raw.get("kind"), str) or not raw["kind"]:
        raise where.error("kind", f"rule {index + 1} needs a kind (a finding kind)", index)
    if "ladder" in raw and "do" in raw:
        raise where.error("do", "give either do or ladder, not both", index)
    rungs = raw.get("ladder", [{"do": raw.get("do")}])
    if not isinstance(rungs, list) or not rungs:
        raise where.error("ladder", "must be a list of {do = [...]} tables", index)
    ladder = tuple(_rung(where, index, r) for r in rungs)
    severity = raw.get("min_severity", "info")
    if severity not in {s.value for s in Severity}:
        raise where.error("min_severity", f"{severity!r}: use info, warn or critical", index)
    cooldown = _typed(where, raw, "cooldown_s", (int, float), 0.0, index)
    reset = _typed(where, raw, "reset_after_s", (int, float), 600.0, index)
    try:
        return Rule(
            kind=raw["kind"],
            min_severity=Severity(severity),
            on=str(raw.get("on", "any")),
            cooldown_s=float(cooldown),
            reset_after_s=float(reset),
            ladder=ladder,
        )
    except PolicyError as exc:
        key = "on" if " on " in str(exc) else "cooldown_s"
        raise where.error(key, str(exc).split(": ", 1)[-1], index) from exc


def _rung(where: _Where, index: int, raw: Any) -> Rung:
    if not isinstance(raw, dict):
        raise where.error("ladder", 'each rung must be a table like {do = ["notify"]}', index)
    _unknown(where, raw, _RUNG_KEYS, index)
    actions = raw.get("do")
    if isinstance(actions, str):
        actions = [actions]
    if not isinstance(actions, list) or not actions:
        raise where.error("do", 'must list actions like ["evict:node"]', index)
    params = raw.get("params", {})
    if not isinstance(params, dict) or not all(
        isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)
        for v in params.values()
    ):
        raise where.error(
            "params", "must be a table of finite numbers, like {lr_factor = 0.5}", index
        )
    factor = params.get("lr_factor", 1.0)
    if not 0 < factor <= 1:
        raise where.error(
            "lr_factor", f"must be in (0, 1] (it lowers the rate), got {factor}", index
        )
    steps = tuple(_step(where, index, a, params) for a in actions)
    after = _typed(where, raw, "after", int, 1, index)
    after_steps = _typed(where, raw, "after_steps", int, 0, index)
    max_times = _typed(where, raw, "max_times", int, None, index)
    for key, value, low in (("after", after, 1), ("after_steps", after_steps, 0)):
        if value < low:
            message = f"must be at least {low}, got {value}"
            raise where.error(key, message, index, f"{key} = {value}")
    if max_times is not None and max_times < 1:
        raise where.error("max_times", f"must be at least 1, got {max_times}", index)
    return Rung(steps, after=after, after_steps=after_steps, max_times=max_times)


def _step(where: _Where, index: int, text: Any, params: Mapping[str, float]) -> Step:
    if not isinstance(text, str):
        raise where.error("do", f'{text!r} is not an action like "evict:node"', index)
    kind, _, scope = text.partition(":")
    if scope and scope not in SCOPES:
        raise where.error(
            "do", f"{text!r}: scope {scope!r} is not one of {', '.join(SCOPES)}", index, text
        )
    return Step(_kind(where, kind, "do", index, text), scope or "job", params)


def _kind(
    where: _Where, name: Any, key: str, index: int | None = None, value: object = None
) -> ActionKind:
    try:
        return ActionKind(name)
    except ValueError:
        known = ", ".join(k.value for k in ActionKind)
        message = f"unknown action {name!r}; known: {known}"
        raise where.error(key, message, index, name if value is None else value) from None


def _limits(where: _Where, raw: Mapping[str, Any]) -> tuple[Limit, ...]:
    limits = []
    for name, value in raw.items():
        per_s = value.get("per_s", 3600) if isinstance(value, dict) else None
        if (
            not isinstance(value, dict)
            or not isinstance(value.get("max"), int)
            or isinstance(per_s, bool)
            or not isinstance(per_s, int | float)
            or not math.isfinite(per_s)
            or per_s <= 0
        ):
            raise where.error(name, "a limit is {max = K, per_s = seconds}, per_s finite > 0")
        try:
            limits.append(Limit(_kind(where, name, name), value["max"], value.get("per_s", 3600)))
        except PolicyError as exc:
            raise where.error(name, str(exc)) from exc
    return tuple(limits)


def _table(where: _Where, data: Mapping[str, Any], key: str) -> Mapping[str, Any]:
    value = data.get(key, {})
    if not isinstance(value, dict):
        raise where.error(key, f"must be a table ([{key}])")
    return value


def _typed(
    where: _Where,
    raw: Mapping[str, Any],
    key: str,
    kinds: type | tuple[type, ...],
    default: Any,
    rule: int | None = None,
) -> Any:
    value = raw.get(key, default)
    if isinstance(value, float) and not math.isfinite(value):
        raise where.error(key, f"must be a finite number, got {value!r}", rule)
    # bool is an int in Python; a policy that writes after = true is a mistake.
    if value is not default and (isinstance(value, bool) and kinds is not bool):
        raise where.error(key, f"expected a number, got {value!r}", rule)
    if value is not default and not isinstance(value, kinds):
        raise where.error(key, f"expected {_names(kinds)}, got {value!r}", rule, repr(value))
    return value


def _names(kinds: type | tuple[type, ...]) -> str:
    kinds = kinds if isinstance(kinds, tuple) else (kinds,)
    return " or ".join(k.__name__ for k in kinds)


def _unknown(where: _Where, raw: Mapping[str, Any], known: set[str], rule: int | None) -> None:
    for key in raw:
        if key not in known:
            raise where.error(key, f"unknown key; expected one of {', '.join(sorted(known))}", rule)
