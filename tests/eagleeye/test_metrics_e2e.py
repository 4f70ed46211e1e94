"""`eagleeye run --metrics-port`: a running job's metrics, scraped over HTTP while it trains."""

from __future__ import annotations

import math
import re
import threading
import time
import urllib.error
import urllib.request

import pytest

from eagleeye.launch import JobConfig, run_job
from eagleeye.summary import summarize
from ft_runtime.layout import JobLayout
from ft_runtime.ports import free_port
from tests.workload_args import tiny_workload

pytestmark = [pytest.mark.slow, pytest.mark.integration, pytest.mark.timeout(240)]
STEP = r'^eagleeye_training_step\{replica="0",run="[^"]+"\} (\S+)$'
FINDING = r'eagleeye_findings_total\{[^}]*kind="process_exit"[^}]*\} 1\.0'


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as reply:
        return reply.read().decode()


def test_a_running_job_exports_its_training_metrics_and_findings(tmp_path) -> None:
    port = free_port()
    config = JobConfig(
        script="eagleeye.workload.train",
        module=True,
        script_args=tiny_workload(60, 10),
        layout=JobLayout(1, 2, 2),
        remediate=True,
        inject=("kill:rank=1@step=20",),
        runs_dir=str(tmp_path),
        metrics_port=port,
    )
    results = []
    job = threading.Thread(target=lambda: results.append(run_job(config)))
    job.start()
    seen_steps = set()
    text = ""
    while job.is_alive():
        try:
            text = scrape(port)
        except OSError:
            time.sleep(0.2)
            continue
        seen_steps.update(int(float(v)) for v in re.findall(STEP, text, re.M))
        # The counter exists from the start (at 0): wait for the finding itself.
        if re.search(FINDING, text) and len(seen_steps) > 3:
            break
        time.sleep(0.2)
    job.join(200)
    assert results[0].succeeded
    assert len(seen_steps) > 3, "the step gauge did not move while the job trained"
    assert re.search(FINDING, text)
    # Where each rank runs, and its steps split into compute and waits.
    assert len(re.findall(r"^eagleeye_rank_info\{", text, re.M)) == 2
    for series in ("compute", "data_wait", "collective_wait"):
        assert re.search(rf'^eagleeye_rank_{series}_seconds\{{rank="1",run=', text, re.M)
    assert re.search(r"^eagleeye_steps_total\{run=\S+ [1-9]", text, re.M)
    assert re.search(r"^eagleeye_tokens_total\{run=\S+ [1-9]", text, re.M)
    assert re.search(r'^eagleeye_checkpoints\{run="[^"]+",state="persistent"\} [1-9]', text, re.M)
    with pytest.raises(urllib.error.URLError):
        scrape(port)  # the exporter stops with the run


def test_the_final_state_lingers_with_the_summarys_ettr(tmp_path) -> None:
    port = free_port()
    config = JobConfig(
        script="eagleeye.workload.train",
        module=True,
        script_args=tiny_workload(30, 10),
        layout=JobLayout(1, 2, 1),
        runs_dir=str(tmp_path),
        metrics_port=port,
        metrics_linger_s=4.0,
    )
    results = []
    job = threading.Thread(target=lambda: results.append(run_job(config)))
    job.start()
    final = ""
    while job.is_alive():
        try:
            text = scrape(port)
        except OSError:
            time.sleep(0.2)
            continue
        if re.search(r"^eagleeye_run_active\{[^}]*\} 0\.0$", text, re.M):
            final = text  # the run is over, and its last state is still served
            break
        time.sleep(0.2)
    job.join(200)
    assert results[0].succeeded
    assert final, "the final state was not scrapable after the run"
    exported = float(re.findall(r"^eagleeye_ettr_ratio\{[^}]*\} (\S+)$", final, re.M)[0])
    summary = summarize(str(results[0].run_dir))
    assert math.isclose(exported, summary.ettr, rel_tol=1e-9), (exported, summary.ettr)
    steps = float(re.findall(r"^eagleeye_steps_total\{[^}]*\} (\S+)$", final, re.M)[0])
    assert steps == summary.last_step + 1 == 30
