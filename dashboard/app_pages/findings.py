"""Findings: what Eagle Eye found, filterable, each finding's evidence shown whole, a link to
the rank."""

from __future__ import annotations

import json

import streamlit as st

from dashboard import data, units

st.title("Findings")
run = data.current_run()

findings = data.findings(run)
if findings.empty:
    st.success("No findings in this run.")
    st.stop()
kinds = st.multiselect("kind", sorted(findings["kind"].unique()))
severities = st.multiselect("severity", sorted(findings["severity"].unique()))
shown = findings
if kinds:
    shown = shown[shown["kind"].isin(kinds)]
if severities:
    shown = shown[shown["severity"].isin(severities)]
table = units.readable(shown).assign(
    evidence=shown["evidence"].map(lambda e: json.dumps(e, sort_keys=False))
)
columns = ["id", "time", "step", "kind", "severity", "scope", "rank", "replica", "node"]
st.dataframe(
    table[[*columns, "score", "detector", "evidence"]].rename(columns={"time": "time (UTC)"}),
    hide_index=True,
    column_config={"evidence": st.column_config.TextColumn("evidence", width="large")},
)

st.subheader("Evidence")
ids = [int(i) for i in shown["id"]]
labels = {
    int(r["id"]): f"#{int(r['id'])} {r['kind']} on {r['scope']} "
    + ("" if r["rank"] != r["rank"] else str(int(r["rank"])))
    for r in shown.to_dict("records")
}
chosen = st.selectbox("finding", ids, format_func=labels.__getitem__)
st.json(shown.loc[shown["id"] == chosen, "evidence"].iloc[0], expanded=True)

ranks = sorted(int(r) for r in shown["rank"].dropna().unique())
if ranks:
    rank = st.selectbox("open a rank in the Ranks view", ranks)
    if st.button("open rank"):
        st.session_state["focus_rank"] = rank
        st.switch_page("app_pages/ranks.py")
