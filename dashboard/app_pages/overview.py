"""Overview: job health at a glance, refreshed live while the run writes."""

from __future__ import annotations

import time

import altair as alt
import streamlit as st

from dashboard import data, health

st.title("Overview")
run = data.current_run()


@st.fragment(run_every=2.0 if st.session_state.get("live") else None)
def overview() -> None:
    events = data.events(run)
    steps = data.samples(run, ("step_time", "tokens"))
    status = health.job_status(events, steps, time.time())
    cols = st.columns(5)
    cols[0].metric("job", status.phase, f"attempt {status.attempt}", delta_color="off")
    cols[1].metric("current step", status.current_step)
    cols[2].metric("steps/s", f"{status.steps_per_s:.2f}")
    cols[3].metric("tokens/s", f"{status.tokens_per_s:,.0f}")
    cols[4].metric("ETTR", "-" if status.ettr != status.ettr else f"{status.ettr:.0%}")
    ranks = health.rank_health(
        health.ranks_of(events), steps, data.findings(run), events, time.time()
    )
    st.subheader("Replicas × ranks")
    if ranks.empty:
        st.caption("no ranks launched yet")
        return
    ranks["replica_rank"] = ranks.groupby("replica").cumcount()
    grid = (
        alt.Chart(ranks)
        .mark_rect(stroke="white")
        .encode(
            x=alt.X("replica_rank:O", title="rank in replica"),
            y=alt.Y("replica:O", title="replica"),
            color=alt.Color(
                "health:N",
                scale=alt.Scale(
                    domain=list(health.HEALTH_ORDER),
                    range=["#2e7d32", "#f9a825", "#9e9e9e", "#c62828"],
                ),
            ),
            tooltip=["rank", "replica", "node", "last_step", "health"],
        )
        .properties(height=60 * ranks["replica"].nunique() + 40)
    )
    labels = grid.mark_text(color="white").encode(text="rank:O", color=alt.value("white"))
    st.altair_chart(grid + labels, width="stretch")
    st.dataframe(ranks.drop(columns="replica_rank"), hide_index=True)


overview()
