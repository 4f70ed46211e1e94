"""The shipped sbatch script's variable handling, with stand-ins for srun, scontrol and
eagleeye on PATH that record how they were called: the controller listens on the first
node of the allocation, each node's agent gets SLURM_NODEID as its node rank and the
training arguments intact, and a failed controller requeues the job."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "slurm" / "eagleeye.sbatch"
STUBS = {
    "scontrol": """#!/bin/bash
if [ "$1 $2" = "show hostnames" ]; then printf 'gpu-a1\\ngpu-a2\\n'; exit 0; fi
echo "$*" >> "$CALLS/scontrol"
""",
    "srun": """#!/bin/bash
while [ "${1#--}" != "$1" ]; do shift; done   # srun's own options
for node in 0 1; do SLURM_NODEID=$node "$@"; done
""",
    "eagleeye": """#!/bin/bash
# one write of a whole line (O_APPEND): the controller and the agents run at once
python3 -c 'import json, os, sys
fd = os.open(os.path.join(os.environ["CALLS"], "eagleeye"), os.O_WRONLY | os.O_APPEND | os.O_CREAT)
os.write(fd, (json.dumps(sys.argv[1:]) + "\\n").encode())' "$@"
[ "$1" = controller ] && exit "${CONTROLLER_EXIT:-0}"
exit 0
""",
}


def run_sbatch(tmp: Path, controller_exit: int) -> tuple[list[list[str]], str]:
    bin_dir, calls = tmp / "bin", tmp / "calls"
    bin_dir.mkdir()
    calls.mkdir()
    for name, text in STUBS.items():
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    env = {
        **os.environ,
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "CALLS": str(calls),
        "CONTROLLER_EXIT": str(controller_exit),
        "SLURM_JOB_NODELIST": "gpu-a[1-2]",
        "SLURM_NNODES": "2",
        "SLURM_JOB_ID": "77",
        "EAGLEEYE_NPROC_PER_NODE": "4",
        "EAGLEEYE_SECRET_FILE": "/etc/eagleeye/job.secret",
    }
    subprocess.run(
        ["bash", str(SCRIPT), "train.py", "--lr", "3e-4", "--name", "a b"],
        env=env,
        check=True,
        timeout=60,
    )
    calls_made = [json.loads(line) for line in (calls / "eagleeye").read_text().splitlines()]
    requeue = (calls / "scontrol").read_text() if (calls / "scontrol").exists() else ""
    return calls_made, requeue


def test_the_controller_and_one_agent_per_node_get_slurms_layout(tmp_path: Path) -> None:
    calls, requeue = run_sbatch(tmp_path, controller_exit=0)
    controller = next(c for c in calls if c[0] == "controller")
    assert controller == [
        *("controller", "--listen", "gpu-a1:29400", "--secret-file", "/etc/eagleeye/job.secret"),
        *("--nnodes", "2", "--nproc-per-node", "4", "--run-id", "slurm-77-0"),
        *("--grace-period", "0"),
    ]
    agents = sorted(
        (c for c in calls if c[0] == "agent"), key=lambda c: c[c.index("--node-rank") + 1]
    )
    assert [a[a.index("--node-rank") + 1] for a in agents] == ["0", "1"]
    for agent in agents:
        assert agent[agent.index("--controller") + 1] == "gpu-a1:29400"
        assert agent[agent.index("--secret-file") + 1] == "/etc/eagleeye/job.secret"
        assert agent[agent.index("--grace-period") + 1] == "0"
        assert agent[-5:] == ["train.py", "--lr", "3e-4", "--name", "a b"]
    assert requeue == ""  # a job that succeeded is not run again


def test_a_failed_controller_requeues_the_job(tmp_path: Path) -> None:
    _, requeue = run_sbatch(tmp_path, controller_exit=1)
    assert requeue.strip() == "requeue 77"


def test_outside_sbatch_the_script_says_what_is_missing(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    done = subprocess.run(
        ["bash", str(SCRIPT), "train.py"], env=env, capture_output=True, text=True, timeout=30
    )
    assert done.returncode != 0
    assert "run this under sbatch" in done.stderr
    if not SCRIPT.stat().st_mode & 0o100:
        pytest.fail("the sbatch script is not executable")
