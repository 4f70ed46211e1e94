"""Planner: what-if on GPUs, MTBF, restart and checkpoint costs (needs the planner extra)."""

from __future__ import annotations

import streamlit as st

st.title("Planner")
st.info("The planner page needs the planner package; install with `pip install eagleeye[planner]`.")
