"""Findings: what Eagle Eye found, filterable, with its evidence; a link to the rank."""

from __future__ import annotations

import json

import streamlit as st

from dashboard import data

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
table = shown.assign(evidence=shown["evidence"].map(json.dumps))
st.dataframe(
    table[
        [
            "id",
            "time",
            "step",
            "kind",
            "severity",
            "scope",
            "rank",
            "replica",
            "node",
            "score",
            "detector",
            "evidence",
        ]
    ],
    hide_index=True,
)

ranks = sorted(int(r) for r in shown["rank"].dropna().unique())
if ranks:
    rank = st.selectbox("open a rank in the Ranks view", ranks)
    if st.button("open rank"):
        st.session_state["focus_rank"] = rank
        st.switch_page("app_pages/ranks.py")
