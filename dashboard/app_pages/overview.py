"""Overview: the job's state now, its throughput and ETTR (the summary's figures), and every
rank's health on a grid of hosts; during a hang, the culprit apart from the waiting ranks."""

from __future__ import annotations

import time

import altair as alt
import pandas as pd
import streamlit as st

from dashboard import data, health, units

st.title("Overview")
run = data.current_run()
GRID_LABELS = 64  # rank numbers drawn in the cells up to this many ranks


@st.fragment(run_every=2.0 if st.session_state.get("live") else None)
def overview() -> None:
    events = data.events(run)
    steps = data.progress_samples(run)
    findings = data.findings(run)
    meta = data.meta(run)
    now = time.time()
    status = health.job_status(events, steps, meta, findings, now)
    cols = st.columns(3)
    cols[0].metric(
        "job", status.phase, f"attempt {status.attempt}", delta_color="off", delta_arrow="off"
    )
    cols[1].metric("current step", status.current_step)
    cols[2].metric("ETTR", units.percent(status.ettr), help="as the run summary computes it")
    cols = st.columns(3)
    cols[0].metric("steps/s", f"{status.steps_per_s:.2f}", help="over the run's wall time")
    cols[1].metric("steps/s, last 30 s", f"{status.recent_steps_per_s:.2f}")
    cols[2].metric("tokens/s", f"{status.tokens_per_s:,.0f}")
    if status.hang is not None:
        show_hang(status.hang, now)
    ranks = health.rank_health(
        health.ranks_of(events),
        steps,
        findings,
        events,
        now,
        status.hang,
        meta.get("progress") or {},
    )
    st.subheader("Ranks by host")
    if ranks.empty:
        st.caption("no ranks launched yet")
        return
    st.altair_chart(rank_grid(ranks), width="stretch")
    counts = ranks["health"].value_counts()
    st.caption(", ".join(f"{counts[h]} {h}" for h in health.HEALTH_ORDER if h in counts))
    trouble = ranks[ranks["health"] != "ok"]
    st.dataframe(trouble if len(ranks) > GRID_LABELS else ranks, hide_index=True)


def show_hang(hang: health.Hang, now: float) -> None:
    held = units.human_seconds(now - hang.since)
    if hang.culprits:
        who = ", ".join(f"rank {r}" for r in hang.culprits)
        st.error(
            f"**Hung** for {held} since step {hang.step}: culprit **{who}** "
            f"({hang.reason or 'no progress'}); {len(hang.waiting)} ranks waiting for it."
        )
    else:
        st.error(
            f"**Hung** for {held} since step {hang.step}: every rank waits in a collective "
            "that never completes; no culprit named."
        )
    waiting = ", ".join(str(r) for r in hang.waiting[:32])
    more = len(hang.waiting) - 32
    st.caption(f"waiting ranks: {waiting}" + (f" (+{more} more)" if more > 0 else ""))


def rank_grid(ranks: pd.DataFrame) -> alt.LayerChart | alt.Chart:
    shown = ranks.assign(
        node=ranks["node"].fillna("?").astype(str),
        local=ranks.groupby(ranks["node"].fillna("?")).cumcount(),
        tag=ranks["rank"].astype(str) + ranks["health"].map({"hung": " culprit"}).fillna(""),
    )
    hosts = shown["node"].nunique()
    # room for the legend (7 entries) however few the hosts; 8 px a host at scale
    height = min(640, max(200, (36 if len(shown) <= GRID_LABELS else 8) * hosts))
    base = alt.Chart(shown).encode(
        x=alt.X("local:O", title="rank on host"),
        y=alt.Y("node:N", title="host", sort=None, axis=alt.Axis(labelOverlap=True)),
    )
    grid = base.mark_rect(stroke="white" if len(shown) <= GRID_LABELS else None).encode(
        color=alt.Color(
            "health:N",
            scale=alt.Scale(domain=list(health.HEALTH_ORDER), range=list(health.HEALTH_COLOURS)),
        ),
        tooltip=["rank", "replica", "node", "last_step", "progress", "health"],
    )
    chart: alt.LayerChart | alt.Chart = grid
    if len(shown) <= GRID_LABELS:
        chart = grid + base.mark_text(color="white").encode(text="tag:N")
    return chart.properties(height=height)


overview()
