"""Leave one category out: the constants are chosen on the other categories only."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from detectors.eval.nab import PROFILES
from detectors.eval.nab_families import BOTH, CadFamily, FusionFamily, RecordFamily
from detectors.eval.nab_loco import leave_one_out


def _corpus(root: Path) -> None:
    rng = np.random.default_rng(1)
    labels = {}
    for cat, spike in (("catA", 8.0), ("catB", 1.5)):
        (root / "data" / cat).mkdir(parents=True)
        for k in range(2):
            t = pd.date_range("2020-01-01", periods=600, freq="5min")
            x = np.sin(np.arange(600) / 6.0) + 0.05 * rng.normal(size=600)
            x[400 + 20 * k] += spike
            name = f"{cat}/f{k}.csv"
            pd.DataFrame({"timestamp": t.astype(str), "value": x}).to_csv(
                root / "data" / name, index=False
            )
            labels[name] = [[str(t[390 + 20 * k]), str(t[415 + 20 * k])]]
    (root / "windows.json").write_text(json.dumps(labels))


class _Fixed:
    """A family of two settings: flag nothing, or flag the 410th point (in every window)."""

    name = "fixed"

    def settings(self) -> list[tuple[float, ...]]:
        return [(0.0,), (1.0,)]

    def flags(self, files, setting):  # type: ignore[no-untyped-def]
        out = []
        for f in files:
            flags = np.zeros(len(f.values), dtype=bool)
            if setting[0]:
                flags[410] = True
            out.append(flags)
        return out


def test_each_category_is_scored_with_the_setting_chosen_on_the_others(tmp_path: Path) -> None:
    _corpus(tmp_path)
    result = leave_one_out(tmp_path, _Fixed())  # type: ignore[arg-type]
    assert {(h.category, h.profile) for h in result.held} == {
        (c, p)
        for c in ("catA", "catB")
        for p in ("standard", "reward_low_FP_rate", "reward_low_FN_rate")
    }
    for h in result.held:
        # Flagging inside every window is best on the other category: chosen, and scores.
        assert h.setting == (1.0,)
        assert h.score > 50.0
        assert h.false_positives == 0
    assert set(result.whole) == set(result.mean)


def test_cad_and_fusion_families_run_the_protocol(tmp_path: Path) -> None:
    _corpus(tmp_path)
    cad = CadFamily({"threshold": (0.7, 0.9), "rest": (0.2,), "margin": (0.0,)})
    result = leave_one_out(tmp_path, cad)
    assert len(result.held) == 6
    assert all(h.setting in cad.settings() and np.isfinite(h.score) for h in result.held)
    fusion = FusionFamily(RecordFamily(), cad)
    settings = list(fusion.settings())
    assert any(s[0] == BOTH for s in settings)
    assert all(len(s) == 1 + 3 + 7 for s in settings)


def test_the_cli_runs_the_cad_family_held_out(tmp_path: Path) -> None:
    from eagleeye.cli import main

    _corpus(tmp_path)
    out = tmp_path / "loco.json"
    args = ["eval", "nab", "--loco", "--family", "cad", "--root", str(tmp_path)]
    assert main([*args, "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["family"] == "cad"
    assert {h["category"] for h in result["held"]} == {"catA", "catB"}
    assert all(len(h["setting"]) == 3 for h in result["held"])  # threshold, rest, margin
    assert set(result["whole"]) == {"standard", "reward_low_FP_rate", "reward_low_FN_rate"}


def test_the_selection_decides_how_the_other_categories_weigh() -> None:
    from detectors.eval.nab import FileScore
    from detectors.eval.nab_corpus import NabFile
    from detectors.eval.nab_loco import held_out

    def hits(k: int, of: int) -> FileScore:  # k of ``of`` windows found at once, no FP
        return FileScore(float(k) - (of - k), k, 0, of - k, of, of)

    # Category big (ten windows), small (one window) and the held-out one. Setting 1 finds
    # everything in big and nothing in small; setting 2 finds half of big and all of small.
    files = [NabFile(f"{c}/f.csv", np.zeros(1), np.zeros(1), ()) for c in ("big", "held", "small")]
    table = {
        (1.0,): {p.name: [hits(10, 10), hits(0, 1), hits(0, 1)] for p in PROFILES},
        (2.0,): {p.name: [hits(5, 10), hits(1, 1), hits(1, 1)] for p in PROFILES},
    }
    chosen = {
        select: {h.setting for h in held_out(files, table, select).held if h.category == "held"}
        for select in ("pooled", "mean", "min")
    }
    # Pooled, the big category's ten windows outvote the small one's; per category, not.
    assert chosen == {"pooled": {(1.0,)}, "mean": {(2.0,)}, "min": {(2.0,)}}
    with pytest.raises(ValueError, match="select must be one of"):
        held_out(files, table, "median")
