"""Enforces ARCHITECTURE.md's arrows: nothing imports upward."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("collector", "detectors", "remediation", "dashboard", "ft_runtime", "eagleeye")
# Which of our packages each package may import. Records-only rules are checked below.
ALLOWED = {
    "ft_runtime": set(),
    "collector": set(),
    "detectors": {"collector"},
    "remediation": {"detectors", "ft_runtime", "collector"},
    "dashboard": {"collector", "detectors", "ft_runtime", "remediation", "eagleeye"},
    "eagleeye": set(PACKAGES),
}
# Modules of another package that are "records" (or a store reader) and may be imported.
RECORD_MODULES = {
    "remediation": {
        "detectors.types",
        "ft_runtime.types",
        "ft_runtime.base",
        "collector.types",
        "collector.vocabulary",
    },
    "dashboard": {
        "collector.types",
        "collector.vocabulary",
        "detectors.types",
        "ft_runtime.types",
        "remediation.types",
        "eagleeye.store",
        "eagleeye.store.reader",
        "eagleeye.store.runs",
        "eagleeye.errors",
        "ft_runtime.planner.plan",  # the planner's public API, for the what-if page
        "eagleeye.goodput",  # the summary's ETTR: the dashboard shows the same figure
        "eagleeye.summary",  # the summary's throughput, likewise
    },
    # the XID catalogue is data (frozen records) that the collector, the alert rules and
    # the XID detector share, so that they agree on every code
    "detectors": {"collector.types", "collector.vocabulary", "collector.xid"},
}


def imports_of(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
    return found


def project_imports(package: str) -> list[tuple[Path, str]]:
    pairs = []
    for path in sorted((ROOT / package).rglob("*.py")):
        for module in imports_of(path):
            if module.split(".")[0] in PACKAGES and module.split(".")[0] != package:
                pairs.append((path.relative_to(ROOT), module))
    return pairs


@pytest.mark.parametrize("package", PACKAGES)
def test_package_imports_only_what_the_architecture_allows(package: str) -> None:
    bad = [
        f"{path} imports {module}"
        for path, module in project_imports(package)
        if module.split(".")[0] not in ALLOWED[package]
    ]
    assert not bad, "imports against ARCHITECTURE.md:\n" + "\n".join(bad)


@pytest.mark.parametrize("package", sorted(RECORD_MODULES))
def test_package_takes_only_records_from_others(package: str) -> None:
    allowed = RECORD_MODULES[package]
    bad = [
        f"{path} imports {module}"
        for path, module in project_imports(package)
        if module not in allowed and not module.startswith(package)
    ]
    assert not bad, f"{package} may only import records of other packages:\n" + "\n".join(bad)


def test_the_walker_sees_imports() -> None:
    # Guards the two tests above against silently walking nothing.
    pairs = project_imports("detectors")
    assert "collector.types" in {module for _, module in pairs}
