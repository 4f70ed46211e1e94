"""Stock torchrun with `--rdzv-backend eagleeye`: a user's DDP script (tests/clients) gets
Eagle Eye's detection and job restarts without `eagleeye run`.

Real torchrun (torch.distributed.run), real gloo ranks, the backend found through the
package's `torchrun.handlers` entry point."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from eagleeye.store import RunReader
from ft_runtime.ports import free_port

pytestmark = [pytest.mark.slow, pytest.mark.integration, pytest.mark.timeout(300)]
REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "tests" / "clients" / "ddp_train.py"


def _torchrun(
    root: Path,
    conf: str,
    iters: int,
    nodes: int = 1,
    port: int | None = None,
    env: dict[str, str] | None = None,
) -> subprocess.Popen[str]:
    """`torchrun` of the client DDP script, 2 ranks over ``nodes`` agents."""
    path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)
    endpoint = f"127.0.0.1:{port or free_port('127.0.0.1')}"
    launcher = (
        f"--nnodes {nodes} --nproc-per-node {2 // nodes} --rdzv-backend eagleeye "
        f"--rdzv-endpoint {endpoint} --rdzv-id ddp-job --max-restarts 1"
    ).split()
    script = f"--max_iters {iters} --out_dir {root / 'out'} --eval_interval 1000".split()
    return subprocess.Popen(
        [
            *(sys.executable, "-m", "torch.distributed.run", *launcher),
            *("--rdzv-conf", f"eagleeye_runs_dir={root / 'runs'}{conf}"),
            *("-m", "eagleeye.boot", str(SCRIPT), *script),
        ],
        cwd=root,
        env={**os.environ, "PYTHONPATH": path, "OMP_NUM_THREADS": "1", **(env or {})},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def _run_dirs(root: Path, count: int = 1, timeout_s: float = 60.0) -> list[Path]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = [p for p in (root / "runs").glob("ddp-job-*") if (p / "run.db").exists()]
        if len(found) >= count:
            return sorted(found)
        time.sleep(0.2)
    raise AssertionError(f"torchrun made fewer than {count} Eagle Eye run folders")


def _run_dir(root: Path) -> Path:
    return _run_dirs(root)[0]


def _steps_of(run_dir: Path, rank: int) -> int:
    try:
        with RunReader(run_dir) as reader:
            steps = reader.samples(names=["step_time"])
    except Exception:
        return 0
    mine = steps[steps["rank"] == rank] if not steps.empty else steps
    return 0 if mine.empty else int(mine["step"].max())


def _worker(torchrun: subprocess.Popen[str], rank: int) -> psutil.Process:
    for child in psutil.Process(torchrun.pid).children():
        try:
            if child.environ().get("RANK") == str(rank):
                return child
        except psutil.Error:
            continue
    raise AssertionError(f"no worker of rank {rank}")


def _stop_rank_once_training(
    torchruns: list[subprocess.Popen[str]], run_dir: Path, rank: int
) -> None:
    """SIGSTOPs the rank (a worker of one of ``torchruns``) once ``run_dir``'s store shows
    it has trained 5 steps."""
    deadline = time.monotonic() + 120
    while _steps_of(run_dir, rank) < 5:
        assert time.monotonic() < deadline, "the rank never trained 5 steps"
        for torchrun in torchruns:
            assert torchrun.poll() is None, torchrun.communicate()[0][-3000:]
        time.sleep(0.2)
    for torchrun in torchruns:
        try:
            _worker(torchrun, rank).send_signal(signal.SIGSTOP)
        except AssertionError:
            continue
        return
    raise AssertionError(f"no worker of rank {rank}")


def _launched_ranks(run_dir: Path) -> set[int]:
    with RunReader(run_dir) as reader:
        events = reader.events()
    if events.empty:
        return set()
    launched = events[(events["phase"] == "launch") & events["subject"].str.startswith("rank:")]
    return {int(s.removeprefix("rank:")) for s in launched["subject"]}


def _store_of_rank(run_dirs: list[Path], rank: int, timeout_s: float = 60.0) -> Path:
    """The run folder of the host whose agent launched ``rank``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for run_dir in run_dirs:
            if rank in _launched_ranks(run_dir):
                return run_dir
        time.sleep(0.2)
    raise AssertionError(f"no host's store shows rank {rank} launched")


def _finish(torchrun: subprocess.Popen[str], timeout_s: float = 240) -> str:
    try:
        out, _ = torchrun.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        for child in psutil.Process(torchrun.pid).children(recursive=True):
            child.send_signal(signal.SIGCONT)
            child.kill()
        torchrun.kill()
        out, _ = torchrun.communicate()
        raise AssertionError(f"torchrun did not end:\n{out[-4000:]}") from None
    return out


def _left_behind(torchrun: subprocess.Popen[str]) -> list[str]:
    left = []
    for proc in psutil.process_iter(["cmdline"]):
        line = " ".join(proc.info["cmdline"] or [])
        if str(SCRIPT) in line and "torch.distributed.run" not in line:
            left.append(f"{proc.pid} {line[:100]}")
    return left


def test_a_healthy_job_is_watched_and_left_alone(tmp_path: Path) -> None:
    torchrun = _torchrun(tmp_path, "", iters=30)
    out = _finish(torchrun)
    assert torchrun.returncode == 0, out[-3000:]
    with RunReader(_run_dir(tmp_path)) as reader:
        meta, findings, actions = reader.meta(), reader.findings(), reader.actions()
        steps = reader.samples(names=["step_time"])
    assert meta["result"]["succeeded"] is True, meta
    assert meta["config"]["launcher"] == "torchrun"
    assert findings.empty, findings
    assert actions.empty, actions
    assert set(steps["rank"]) == {0, 1}  # the zero-code telemetry of both ranks
    assert int(steps["step"].max()) >= 25
    assert not _left_behind(torchrun)


def test_a_stopped_rank_is_found_by_evidence_and_every_worker_restarted(tmp_path: Path) -> None:
    torchrun = _torchrun(tmp_path, ",eagleeye_remediate=1", iters=60)
    run_dir = _run_dir(tmp_path)
    _stop_rank_once_training([torchrun], run_dir, rank=1)
    out = _finish(torchrun)
    assert torchrun.returncode == 0, out[-4000:]
    with RunReader(run_dir) as reader:
        meta, findings, actions = reader.meta(), reader.findings(), reader.actions()
        events, stacks = reader.events(), reader.stacks()
    hangs = findings[findings["kind"] == "hang"]
    assert list(hangs["rank"]) == [1], findings  # one finding, on the stopped rank
    assert hangs.iloc[0]["evidence"]["stopped"] == 1.0
    assert not stacks.empty  # every rank's stack, taken before anything acted
    restart = actions[actions["kind"] == "restart"]
    assert list(restart["status"]) == ["done"], actions
    assert not restart["dry_run"].any()
    launches = events[(events["subject"] == "job") & (events["phase"] == "launch")]
    assert list(launches["attempt"]) == [0, 1], events  # a new rendezvous round
    assert meta["result"] == {**meta["result"], "succeeded": True, "attempts": 2}
    assert "asked torchrun's agents for a new rendezvous round" in out
    assert not _left_behind(torchrun)


def test_without_remediate_the_action_is_only_decided(tmp_path: Path) -> None:
    torchrun = _torchrun(tmp_path, "", iters=40)
    run_dir = _run_dir(tmp_path)
    _stop_rank_once_training([torchrun], run_dir, rank=0)
    deadline = time.monotonic() + 120
    while True:
        with RunReader(run_dir) as reader:
            actions = reader.actions()
        if not actions.empty:
            break
        assert time.monotonic() < deadline, "no action decided for the stopped rank"
        time.sleep(0.3)
    assert actions["dry_run"].all(), actions
    _worker(torchrun, 0).send_signal(signal.SIGCONT)  # the operator's call: it trains on
    out = _finish(torchrun)
    assert torchrun.returncode == 0, out[-3000:]
    with RunReader(run_dir) as reader:
        meta, events = reader.meta(), reader.events()
    launches = events[(events["subject"] == "job") & (events["phase"] == "launch")]
    assert len(launches) == 1  # nothing was restarted
    assert meta["result"]["succeeded"] is True


def test_two_hosts_restart_together_when_one_rank_stops(tmp_path: Path) -> None:
    """Two torchrun agents of one job, a rank each. The stopped rank's own host sees every
    rank it has stopped, which it cannot tell from a suspension of the host: no verdict
    there. The other host's rank waits in the all-reduce until the collective limit: a
    hang on the job, whose new rendezvous round restarts the workers of both hosts."""
    config = tmp_path / "detectors.toml"
    config.write_text("[hang]\ncollective_s = 15\n")
    port = free_port("127.0.0.1")
    env = {"EAGLEEYE_DETECTORS_CONFIG": str(config)}
    agents = [
        _torchrun(tmp_path, ",eagleeye_remediate=1", 60, nodes=2, port=port, env=env)
        for _ in range(2)
    ]
    run_dirs = _run_dirs(tmp_path, count=2)
    stopped_host = _store_of_rank(run_dirs, rank=1)
    _stop_rank_once_training(agents, stopped_host, rank=1)
    outs = [_finish(agent) for agent in agents]
    for agent, out in zip(agents, outs, strict=True):
        assert agent.returncode == 0, out[-4000:]
    for run_dir in run_dirs:
        with RunReader(run_dir) as reader:
            meta, events = reader.meta(), reader.events()
        launches = events[(events["subject"] == "job") & (events["phase"] == "launch")]
        assert list(launches["attempt"]) == [0, 1], (run_dir, events)
        assert meta["result"]["succeeded"] is True
    waiting_host = next(d for d in run_dirs if d != stopped_host)
    with RunReader(waiting_host) as reader:
        findings, actions = reader.findings(), reader.actions()
    hangs = findings[findings["kind"] == "hang"]
    assert len(hangs) == 1, findings
    assert hangs.iloc[0]["evidence"]["collective_never_completes"] == 1.0
    assert list(actions[actions["kind"] == "restart"]["status"]) == ["done"], actions
    for agent in agents:
        assert not _left_behind(agent)


def test_an_unknown_eagleeye_key_stops_torchrun_with_its_name(tmp_path: Path) -> None:
    torchrun = _torchrun(tmp_path, ",eagleeye_remediat=1", iters=5)
    out = _finish(torchrun, timeout_s=120)
    assert torchrun.returncode != 0
    assert "unknown --rdzv-conf keys ['eagleeye_remediat']" in out
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())
