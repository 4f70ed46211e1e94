"""A plan as a text table, a PNG plot and a self-contained HTML page."""

from __future__ import annotations

import base64
import html
import io
import math
from pathlib import Path

from ft_runtime.planner.config import Strategy
from ft_runtime.planner.plan import Plan, PlanRow

HEADER = (
    "strategy",
    "r",
    "ckpt period",
    "TTT/T0",
    "availability",
    "masked/wipe",
    "mean stack",
    "closed-form J",
)


def cells(row: PlanRow) -> tuple[str, ...]:
    """One row's cells as shown in every format."""
    ttt = f"{row.ttt_ratio:.2f}" if row.completed else "never (gave up)"
    period = "-" if math.isnan(row.checkpoint_s) else f"{row.checkpoint_s / 60:.1f} min"
    masked = "-" if math.isnan(row.masked_per_wipe) else f"{row.masked_per_wipe:.1f}"
    return (
        row.strategy.value,
        str(row.redundancy),
        period,
        ttt,
        f"{row.availability:.1%}",
        masked,
        f"{row.mean_stack:.2f}",
        "-" if row.closed_form is None else f"{row.closed_form:.2f}",
    )


def summary(plan: Plan) -> str:
    """The recommendation in one sentence."""
    b, c = plan.best, plan.cluster
    how = (
        "replica restart with peer catch-up"
        if b.strategy is Strategy.FT_HSDP
        else f"r = {b.redundancy}, a checkpoint every {b.checkpoint_s / 60:.1f} min"
    )
    return (
        f"Recommended for {c.gpus:,} GPUs in {c.n_groups} groups (system MTBF "
        f"{c.mtbf_s / 60:.1f} min): {b.strategy.value}, {how}; TTT/T0 = {b.ttt_ratio:.2f}, "
        f"availability {b.availability:.1%}."
    )


def text_table(plan: Plan) -> str:
    """A fixed-width table of every candidate."""
    rows = [HEADER, *(cells(r) for r in plan.rows)]
    widths = [max(len(r[i]) for r in rows) for i in range(len(HEADER))]
    return "\n".join("  ".join(v.rjust(w) for v, w in zip(r, widths, strict=True)) for r in rows)


def plot_png(plan: Plan) -> bytes:
    """TTT/T₀ against r per strategy, checkpoint-only as a line; PNG bytes."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.0), dpi=100)
    for strategy, marker in ((Strategy.REPLICATION, "s"), (Strategy.SPARE, "o")):
        rows = [r for r in plan.rows if r.strategy is strategy and r.completed]
        if rows:
            ax.plot(
                [r.redundancy for r in rows],
                [r.ttt_ratio for r in rows],
                marker=marker,
                label=f"{strategy.value} + checkpoint",
            )
    for strategy, style in ((Strategy.CKPT, "--"), (Strategy.FT_HSDP, ":")):
        flat = [r for r in plan.rows if r.strategy is strategy]
        if flat and math.isfinite(flat[0].ttt_ratio):
            ax.axhline(flat[0].ttt_ratio, color="grey", linestyle=style, label=strategy.value)
    ax.set_xlabel("redundancy r")
    ax.set_ylabel("time-to-train / T0")
    ax.set_title(f"{plan.cluster.gpus:,} GPUs, N = {plan.cluster.n_groups}")
    ax.legend()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", bbox_inches="tight")
    plt.close(fig)
    return buf.getvalue()


def write_png(plan: Plan, path: Path) -> Path:
    path.write_bytes(plot_png(plan))
    return path


def write_html(plan: Plan, path: Path) -> Path:
    """One HTML file: the recommendation, the table and the plot inlined."""
    head = "".join(f"<th>{html.escape(h)}</th>" for h in HEADER)
    body = "".join(
        "<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in cells(r)) + "</tr>"
        for r in plan.rows
    )
    img = base64.b64encode(plot_png(plan)).decode()
    path.write_text(
        "<!doctype html><html><head><meta charset='utf-8'><title>Eagle Eye plan</title></head>"
        f"<body><h1>Eagle Eye plan</h1><p>{html.escape(summary(plan))}</p>"
        f"<table border='1'><tr>{head}</tr>{body}</table>"
        f"<img alt='TTT/T0 against r' src='data:image/png;base64,{img}'></body></html>",
        encoding="utf-8",
    )
    return path
