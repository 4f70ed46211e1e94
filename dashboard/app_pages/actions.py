"""Actions: the audit trail, finding → action → outcome, with the reason for each."""

from __future__ import annotations

import streamlit as st

from dashboard import data, units

st.title("Actions")
run = data.current_run()

actions = data.actions(run)
if actions.empty:
    st.success("No actions in this run.")
    st.stop()
trail = units.readable(actions).assign(
    finding=actions["finding_kind"]
    + " on "
    + actions["finding_scope"]
    + " "
    + actions["finding_rank"].astype("Int64").astype("string").fillna(""),
    mode=actions["dry_run"].map({0: "executed", 1: "dry-run"}),
)
st.dataframe(
    trail[
        ["time", "finding", "kind", "target", "mode", "status", "detail", "reason", "key"]
    ].rename(columns={"time": "time (UTC)"}),
    hide_index=True,
)
# A command is recorded pending, then as it ended: count it once, by how it ended.
ended = trail.loc[trail["status"] != "pending", "key"]
final = trail[~((trail["status"] == "pending") & trail["key"].isin(ended))]
counts = final.groupby(["kind", "status"]).size().rename("count").reset_index()
st.bar_chart(counts, x="kind", y="count", color="status")
