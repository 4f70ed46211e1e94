"""Eagle Eye's dashboard: the router. Run it with `eagleeye dashboard`."""

from __future__ import annotations

import sys
from pathlib import Path

import streamlit as st

# Streamlit runs this file as a script; make the project importable the same way.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dashboard import data  # noqa: E402
from eagleeye.errors import EagleEyeError  # noqa: E402

st.set_page_config(page_title="Eagle Eye", layout="wide")

PAGES = [
    st.Page("app_pages/overview.py", title="Overview", default=True),
    st.Page("app_pages/ranks.py", title="Ranks"),
    st.Page("app_pages/training.py", title="Training"),
    st.Page("app_pages/findings.py", title="Findings"),
    st.Page("app_pages/actions.py", title="Actions"),
    st.Page("app_pages/checkpoints.py", title="Checkpoints"),
    st.Page("app_pages/planner.py", title="Planner"),
]

page = st.navigation(PAGES)
try:
    st.session_state["run"] = data.selected_run()
except EagleEyeError as exc:
    st.session_state["run"] = None
    st.sidebar.warning(str(exc))
if st.session_state["run"]:
    st.sidebar.caption(f"run: **{data.run_label(st.session_state['run'])}**")
st.sidebar.toggle("live refresh", value=True, key="live")
page.run()
