"""The rank × step heatmap at any scale: ranks grouped by host, hosts and ranks sorted by
outlier score, and ranks aggregated into rows when they outnumber the rows a screen holds.

A rank's outlier score is the robust z-score of its median value against every rank's
(median and MAD over ranks); a host's is its worst rank's. Sorted so, the straggler and its
host are the top rows whatever the scale. An aggregated row holds consecutive ranks of the
sorted order and shows their largest value, so one slow rank still colours its row.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

#: Rows a heatmap draws at most (2 px each in HEIGHT_PX); more ranks share rows.
MAX_ROWS = 320
HEIGHT_PX = 640
#: Cells a heatmap holds at most; steps are bucketed to stay under it.
MAX_CELLS = 120_000
MAX_STEPS = 300
#: (rank, column) values read from the store at most, before ranks are aggregated to rows.
MAX_READ = 400_000


def step_width(steps: int, ranks: int) -> int:
    """Steps per column so that rows × columns stays under MAX_CELLS and ranks × columns
    under MAX_READ (at least 20 columns)."""
    rows = max(1, min(ranks, MAX_ROWS))
    columns = max(20, min(MAX_STEPS, MAX_CELLS // rows, MAX_READ // max(1, ranks)))
    return max(1, math.ceil(steps / columns))


def outlier_scores(cells: pd.DataFrame) -> pd.Series:
    """Each rank's robust z-score (its median over steps against all ranks'), by rank."""
    centre = cells.groupby("rank")["value"].median()
    median = float(centre.median()) if len(centre) else 0.0
    mad = float((centre - median).abs().median()) if len(centre) else 0.0
    scale = 1.4826 * mad if mad > 0 else max(abs(median) * 1e-3, 1e-12)
    return ((centre - median) / scale).fillna(0.0).rename("score")


def layout(cells: pd.DataFrame, ranks: pd.DataFrame, max_rows: int = MAX_ROWS) -> pd.DataFrame:
    """One row per rank: rank, node, score, and the heatmap ``row`` (0 at the top) and its
    ``label``, hosts with the worst outlier first, ranks within a host likewise."""
    scores = outlier_scores(cells)
    frame = pd.DataFrame({"rank": scores.index.astype(int), "score": scores.to_numpy()})
    nodes = ranks.set_index("rank")["node"] if not ranks.empty else pd.Series(dtype=object)
    frame["node"] = frame["rank"].map(nodes).fillna("?").astype(str)
    frame["node_score"] = frame.groupby("node")["score"].transform("max")
    frame = frame.sort_values(
        ["node_score", "node", "score", "rank"], ascending=[False, True, False, True]
    ).reset_index(drop=True)
    per_row = max(1, math.ceil(len(frame) / max_rows))
    frame["row"] = np.arange(len(frame)) // per_row
    first = frame.groupby("row").agg(
        node=("node", "first"),
        last_node=("node", "last"),
        ranks=("rank", lambda r: sorted(int(x) for x in r)),
    )
    frame["label"] = frame["row"].map(_labels(first))
    return frame.drop(columns="node_score")


def _labels(rows: pd.DataFrame) -> pd.Series:
    labels: dict[int, str] = {}
    seen: set[str] = set()
    for row, r in zip(rows.index, rows.to_dict("records"), strict=True):
        host = r["node"] if r["node"] == r["last_node"] else f"{r['node']}…{r['last_node']}"
        ranks = r["ranks"]
        if len(ranks) == 1:
            who = f"rank {ranks[0]}"
        elif len(ranks) <= 3:
            who = "ranks " + ", ".join(str(x) for x in ranks)
        else:
            who = f"{len(ranks)} ranks {ranks[0]}–{ranks[-1]}"
        label = f"{host} · {who}"
        labels[int(row)] = label if label not in seen else f"{label} (row {row})"
        seen.add(label)
    return pd.Series(labels)


def heat(cells: pd.DataFrame, order: pd.DataFrame) -> pd.DataFrame:
    """The cells aggregated to the layout's rows: row, label, step, value (the largest)."""
    placed = cells.merge(order[["rank", "row", "label"]], on="rank")
    return (
        placed.groupby(["row", "label", "step"], sort=False)["value"]
        .max()
        .reset_index()
        .dropna(subset=["value"])
    )


__all__ = [
    "HEIGHT_PX",
    "MAX_CELLS",
    "MAX_READ",
    "MAX_ROWS",
    "heat",
    "layout",
    "outlier_scores",
    "step_width",
]
