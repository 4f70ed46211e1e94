from __future__ import annotations

import math
import sqlite3

import numpy as np
import pandas as pd

from dashboard.grid import MAX_CELLS, MAX_READ, MAX_ROWS, heat, layout, step_width
from dashboard.units import human_bytes, human_seconds, to_datetime


def cells(ranks: int, steps: int, slow: int) -> tuple[pd.DataFrame, pd.DataFrame]:
    rng = np.random.default_rng(0)
    rank, step = np.meshgrid(np.arange(ranks), np.arange(steps), indexing="ij")
    value = 1.0 + 0.01 * rng.random(rank.shape)
    value[slow] *= 3
    frame = pd.DataFrame({"rank": rank.ravel(), "step": step.ravel(), "value": value.ravel()})
    nodes = pd.DataFrame(
        {"rank": np.arange(ranks), "node": [f"node{r // 8}" for r in range(ranks)]}
    )
    return frame, nodes


def test_the_slow_rank_and_its_host_come_first_with_one_row_per_rank() -> None:
    frame, nodes = cells(64, 10, slow=42)
    order = layout(frame, nodes)
    assert len(order) == 64
    assert order["row"].is_unique
    assert order["rank"].iloc[0] == 42
    assert set(order["rank"][:8]) == set(range(40, 48))  # its host's ranks follow it
    assert order["label"].iloc[0] == "node5 · rank 42"
    assert order["label"].is_unique


def test_at_10k_ranks_rows_are_aggregated_and_the_straggler_still_shows() -> None:
    frame, nodes = cells(10_000, 4, slow=7_777)
    order = layout(frame, nodes)
    assert order["row"].nunique() <= MAX_ROWS
    top = order[order["row"] == 0]
    assert 7_777 in set(top["rank"])
    shown = heat(frame, order)
    assert shown["row"].nunique() <= MAX_ROWS
    assert shown.loc[shown["row"] == 0, "value"].min() > 2.9  # the largest value per row
    assert shown.loc[shown["row"] == 1, "value"].max() < 1.1


def test_step_buckets_keep_the_heatmap_under_its_cell_budget() -> None:
    for ranks, steps in ((4, 30), (512, 1000), (10_000, 1000)):
        columns = -(-steps // step_width(steps, ranks))
        assert min(ranks, MAX_ROWS) * columns <= MAX_CELLS
        assert ranks * columns <= max(MAX_READ, 20 * ranks)
        assert columns >= 20
    assert step_width(30, 4) == 1


def test_sizes_durations_and_times_read_as_people_write_them() -> None:
    assert [human_bytes(v) for v in (512, 1536, 3 << 30, float("nan"))] == [
        "512 B", "1.5 KiB", "3.0 GiB", ""
    ]  # fmt: skip
    assert [human_seconds(v) for v in (0.0123, 2.5, 75.0)] == ["12.3 ms", "2.50 s", "1 min 15 s"]
    stamp = to_datetime(pd.Series([1_700_000_000.25]))
    assert str(stamp.iloc[0]) == "2023-11-14 22:13:20.250000+00:00"


def test_charts_get_only_finite_values(tmp_path) -> None:
    from dashboard import data
    from eagleeye.store import RunStore

    RunStore(tmp_path).close()
    with sqlite3.connect(tmp_path / "run.db") as conn:
        rows = [(float(s), s, 0, r, 0, "n0", name, v) for s, r, v in (
            (0, 0, 1.0), (0, 1, 2.0), (1, 0, math.inf), (1, 1, math.inf),
            (2, 0, None), (2, 1, None), (3, 0, 0.5), (3, 1, 0.7),
        ) for name in ("loss", "step_time")]  # fmt: skip
        conn.executemany("INSERT INTO samples VALUES (?, ?, ?, ?, ?, ?, ?, ?)", rows)
    curve = data.per_step.__wrapped__(str(tmp_path), "loss")
    assert list(curve["step"]) == [0, 3]
    cells = data.rank_cells.__wrapped__(str(tmp_path), "step_time", 2)
    assert sorted(cells["step"].unique()) == [0, 3]
