"""ARTime joined with the record detector and the new-extreme trigger, for the protocol."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from detectors.eval import nab_loco
from detectors.eval.nab_artime_fusion import (
    ALONE,
    BOTH,
    EITHER,
    EXTREME,
    EXTREME_RECORD,
    NONE,
    RECORD_PARTNER,
    ArtimeFusionFamily,
)
from detectors.eval.nab_corpus import NabFile, load_corpus
from detectors.eval.nab_loco import leave_one_out


@pytest.fixture
def small_grid(monkeypatch: pytest.MonkeyPatch) -> None:
    grid = {k: v[:1] for k, v in nab_loco.GRID.items()}
    monkeypatch.setattr(nab_loco, "GRID", dict(grid, record=(2.0, 4.0)))


def _corpus(root: Path) -> None:
    rng = np.random.default_rng(2)
    labels = {}
    for cat, spike in (("catA", 20.0), ("catB", 14.0)):
        (root / "data" / cat).mkdir(parents=True)
        t = pd.date_range("2020-01-01", periods=3000, freq="5min")
        x = 10 + np.sin(np.arange(3000) * 2 * np.pi / 40) + 0.05 * rng.normal(size=3000)
        x[2000] = spike
        name = f"{cat}/f.csv"
        pd.DataFrame({"timestamp": t.astype(str), "value": x}).to_csv(
            root / "data" / name, index=False
        )
        labels[name] = [[str(t[1980]), str(t[2040])]]
    (root / "windows.json").write_text(json.dumps(labels))


def test_the_grid_holds_artime_alone_and_every_rule_with_every_partner(small_grid) -> None:
    fam = ArtimeFusionFamily(thresholds=(0.0, 0.5), margins=(0.1,))
    settings = list(fam.settings())
    assert len(settings) == len(set(settings))
    alone = [s for s in settings if s[0] == ALONE]
    assert [s[1] for s in alone] == [0.0, 0.5]
    assert {s[2] for s in alone} == {NONE}
    # Per rule and threshold: 2 record settings, 1 margin, 2 record settings x 1 margin.
    for rule in (EITHER, BOTH):
        joined = [s for s in settings if s[0] == rule]
        assert [sum(s[2] == k for s in joined) for k in (RECORD_PARTNER, EXTREME)] == [4, 2]
        assert sum(s[2] == EXTREME_RECORD for s in joined) == 4
    assert len(settings) == 2 + 2 * 2 * 5


def test_rules_join_artime_and_its_partner(tmp_path: Path, small_grid) -> None:
    _corpus(tmp_path)
    files: list[NabFile] = list(load_corpus(tmp_path))
    fam = ArtimeFusionFamily(thresholds=(0.0,), margins=(0.1,))
    record = (*(v[0] for v in nab_loco.GRID.values()),)
    art = fam.flags(files, (ALONE, 0.0, NONE, 0.1, *record))
    either = fam.flags(files, (EITHER, 0.0, EXTREME, 0.1, *record))
    both = fam.flags(files, (BOTH, 0.0, EXTREME, 0.1, *record))
    extreme = [fam.extreme(f, 0.1) for f in files]
    for a, e, o, b in zip(art, extreme, either, both, strict=True):
        assert a.any()
        assert e.any()
        assert o.any()
        assert not (o & ~(a | e)).any()
        assert not (b & ~(a | e)).any()
        # The spike is new to both: confirmed by both within a quarter probation.
        assert b[2000:2030].any()


def test_the_protocol_runs_the_family(tmp_path: Path, small_grid) -> None:
    _corpus(tmp_path)
    result = leave_one_out(tmp_path, ArtimeFusionFamily(thresholds=(0.0,), margins=(0.1,)))
    assert {h.category for h in result.held} == {"catA", "catB"}
    assert all(h.score > 90.0 for h in result.held if h.profile == "standard")
