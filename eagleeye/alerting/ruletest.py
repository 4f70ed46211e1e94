"""`promtool test rules` on the shipped unit tests (rules_test.yml) of the generated rules."""

from __future__ import annotations

import re
import shutil
import subprocess
import tempfile
from importlib import resources
from pathlib import Path

from eagleeye.alerting.rules import alert_names, write_rules
from eagleeye.errors import EagleEyeError

TESTS = "rules_test.yml"


def shipped_tests() -> str:
    """The text of the shipped unit tests."""
    return resources.files("eagleeye.alerting").joinpath(TESTS).read_text(encoding="utf-8")


def tested_alerts() -> set[str]:
    """The alerts the shipped tests expect to fire at least once."""
    # Every expected alert's labels start with its name (the file's one convention).
    return set(re.findall(r"exp_labels: \{alertname: (\w+),", shipped_tests()))


def untested_alerts() -> list[str]:
    """Alerts of the rules that no shipped test sees firing (should be none)."""
    tested = tested_alerts()
    return [name for name in alert_names() if name not in tested]


def run_rule_tests(promtool: str | None = None) -> subprocess.CompletedProcess[str]:
    """Writes the default rules beside the shipped tests and runs ``promtool test rules``.

    Raises:
        EagleEyeError: promtool is not found, or a rule has no test that sees it fire.
    """
    binary = promtool or shutil.which("promtool")
    if binary is None:
        raise EagleEyeError(
            "promtool not found; install Prometheus (Debian: apt-get install prometheus) "
            "or pass --promtool PATH"
        )
    missing = untested_alerts()
    if missing:
        raise EagleEyeError(f"no rule test sees these alerts fire: {', '.join(missing)}")
    with tempfile.TemporaryDirectory(prefix="eagleeye-rules-") as tmp:
        write_rules(Path(tmp) / "rules.yml")
        (Path(tmp) / TESTS).write_text(shipped_tests(), encoding="utf-8")
        return subprocess.run(
            [binary, "test", "rules", TESTS],
            cwd=tmp,
            capture_output=True,
            text=True,
            timeout=120,
        )
