"""Eagle Eye's dashboard: the router and the run picker. Run it with `eagleeye dashboard`."""

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
    st.Page("app_pages/compare.py", title="Compare"),
    st.Page("app_pages/planner.py", title="Planner"),
]

page = st.navigation(PAGES)
first: str | None
try:
    first = data.selected_run()
except EagleEyeError as exc:
    first = None
    st.sidebar.warning(str(exc))
runs = data.available_runs()
if first is not None and str(Path(first).resolve()) not in runs:
    runs.insert(0, first)
if runs:
    default = str(Path(first).resolve()) if first else runs[0]
    if st.session_state.get("run_choice") not in runs:
        st.session_state["run_choice"] = default if default in runs else runs[0]
    st.sidebar.selectbox("run", runs, format_func=data.run_label, key="run_choice")
    st.session_state["run"] = st.session_state["run_choice"]
else:
    st.session_state["run"] = None
st.sidebar.toggle("live refresh", value=True, key="live")
page.run()
