"""Faults, restarts and stops on users' scripts with no Eagle Eye code in them
(tests/clients/), under `eagleeye run --remediate`: `--inject kill` and `--inject stop`
fire from outside on every script, a killed DDP job resumes from its own checkpoint, and a
signal to `eagleeye run` leaves no process of the job behind."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import psutil
import pytest

from eagleeye.store import RunReader, newest_run
from tests.eagleeye.procs import ended
from tests.eagleeye.test_clients_e2e import CLIENTS, eagleeye_run, spawn_eagleeye

pytestmark = [pytest.mark.slow, pytest.mark.integration]


def _faults_and_findings(run: Path) -> tuple[list[tuple[str, int]], list[tuple[str, int]]]:
    with RunReader(run) as reader:
        faults = reader.faults()
        findings = reader.findings()
    fired = sorted(zip(faults["spec"], faults["attempt"], strict=True))
    found = sorted(zip(findings["kind"], findings["rank"], strict=True))
    return fired, found


@pytest.mark.timeout(300)
def test_a_killed_and_a_stopped_ddp_job_resume_from_the_scripts_own_checkpoint(
    tmp_path,
) -> None:
    # steps as the zero-code telemetry counts them: from 0 in each process
    kill, stop = "kill:rank=1@step=30", "stop:rank=0@step=10"
    result = eagleeye_run(
        tmp_path,
        "--inject",
        kill,
        "--inject",
        f"{stop},attempt=1",
        "--resume-args",
        "--init_from=resume",
        str(CLIENTS / "ddp_train.py"),
        *("--max_iters", "60", "--eval_interval", "20", "--out_dir", "out"),
        timeout=280,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    run = newest_run(tmp_path / "runs")
    fired, found = _faults_and_findings(run)
    assert fired == [(kill, 0), (stop, 1)]
    assert ("process_exit", 1) in found
    assert ("hang", 0) in found  # the stop, found from /proc, on the stopped rank
    with RunReader(run) as reader:
        launches = reader.events().query("subject == 'job' and phase == 'launch'")
        assert reader.meta()["result"]["attempts"] == 3
    resumed = [d.get("resume_from", "") for d in launches["detail"].iloc[1:]]
    assert resumed == [str(tmp_path / "out" / "ckpt.pt")] * 2  # its own torch.save
    for attempt in (1, 2):
        log = (run / "logs" / f"attempt-{attempt}" / "rank-0.log").read_text()
        assert "Resuming training from out" in log
    final = (run / "logs" / "attempt-2" / "rank-0.log").read_text()
    assert "done after 60 iterations" in final
    # the console: rank output with prefixes, the killed rank named with its signal
    assert "[rank0]: Resuming training from out" in result.stdout
    assert "rank 1 failed with exit code -9 (SIGKILL)" in result.stderr
    assert "resuming from" in result.stderr


@pytest.mark.timeout(300)
def test_kill_and_stop_fire_on_a_lightning_script(tmp_path) -> None:
    kill, stop, never = "kill:rank=1@step=8", "stop:rank=0@step=8", "kill:rank=0@step=999"
    result = eagleeye_run(
        tmp_path,
        *("--inject", kill, "--inject", f"{stop},attempt=1", "--inject", f"{never},attempt=2"),
        str(CLIENTS / "lightning_train.py"),
        *("--max_steps", "16", "--val_every", "100", "--out_dir", "out"),
        timeout=280,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    fired, found = _faults_and_findings(newest_run(tmp_path / "runs"))
    assert fired == [(kill, 0), (stop, 1)]
    assert ("process_exit", 1) in found
    assert ("hang", 0) in found
    assert "no checkpoint known" in result.stderr  # the script saved nothing Eagle Eye saw
    assert f"fault {never} never fired" in result.stderr
    with RunReader(newest_run(tmp_path / "runs")) as reader:
        assert reader.meta()["faults_unfired"] == [never]


@pytest.mark.timeout(200)
def test_kill_and_stop_at_a_time_fire_on_a_script_without_steps(tmp_path) -> None:
    kill, stop = "kill:rank=1@time=3", "stop:rank=0@time=3"
    result = eagleeye_run(
        tmp_path,
        *("--inject", kill, "--inject", f"{stop},attempt=1"),
        str(CLIENTS / "print_only.py"),
        *("--seconds", "6", "--every", "1"),
        timeout=180,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    fired, found = _faults_and_findings(newest_run(tmp_path / "runs"))
    assert fired == [(kill, 0), (stop, 1)]
    assert ("process_exit", 1) in found
    assert ("hang", 0) in found


def _start(root: Path, *args: str) -> subprocess.Popen[str]:
    command = ["run", "--nproc-per-node", "2", "--remediate", "--runs-dir", str(root / "runs")]
    return spawn_eagleeye(root, *command, *args)


def _rank_pids(root: Path, wait_for_step: int | None, timeout_s: float = 120) -> list[int]:
    """The ranks' pids by rank, once they run (and have reported ``wait_for_step``)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        time.sleep(0.2)
        try:
            reader = RunReader(newest_run(root / "runs"))
        except Exception:
            continue
        with reader:
            events = reader.events()
            launches = events[(events["phase"] == "launch") & events["subject"].str.match("rank:")]
            if len(launches) < 2:
                continue
            if wait_for_step is not None:
                steps = reader.samples(names=["step_time"])
                if steps.empty or steps["step"].max() < wait_for_step:
                    continue
        launches = launches.sort_values("subject")  # rank 0 first, whichever started first
        return [int(d["pid"]) for d in launches["detail"]]
    raise AssertionError("the ranks never started")


def _wait_gone(pids: list[int], timeout_s: float = 10) -> None:
    deadline = time.monotonic() + timeout_s
    while not all(ended(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.05)


@pytest.mark.timeout(240)
def test_sigterm_with_a_grace_period_lets_the_job_checkpoint_and_leaves_no_process(
    tmp_path,
) -> None:
    job = _start(
        tmp_path,
        *("--grace-period", "30", "--stream", "none"),
        str(CLIENTS / "ddp_train.py"),
        *("--max_iters", "100000", "--eval_interval", "100000", "--out_dir", "out"),
    )
    pids = _rank_pids(tmp_path, wait_for_step=10)
    asked = time.time()
    job.send_signal(signal.SIGTERM)
    _, err = job.communicate(timeout=120)
    assert job.returncode == 128 + signal.SIGTERM, err[-2000:]
    assert all(ended(pid) for pid in pids)
    run = newest_run(tmp_path / "runs")
    with RunReader(run) as reader:
        saved = reader.checkpoints()
        stop = reader.events().query("subject == 'job' and phase == 'failed'")
        assert reader.meta()["result"]["stopped_by"] == "SIGTERM"
    assert (saved["time"] >= asked).any(), saved  # the save on preemption, seen by Eagle Eye
    assert (tmp_path / "out" / "ckpt.pt").is_file()
    assert list(stop["detail"].map(lambda d: d["reason"])) == ["stopped by SIGTERM"]
    assert "preempted at iteration" in (run / "logs" / "attempt-0" / "rank-0.log").read_text()


@pytest.mark.timeout(240)
def test_sigterm_with_a_grace_period_asks_a_hooked_loop_to_save_at_one_step(tmp_path) -> None:
    """Ranks that all-reduce every few milliseconds leave their loop at the same step."""
    hooked = Path(__file__).parents[1] / "fixtures" / "scripts" / "hooked_loop.py"
    job = _start(tmp_path, "--grace-period", "60", "--stream", "none", str(hooked))
    pids = _rank_pids(tmp_path, wait_for_step=50)
    job.send_signal(signal.SIGTERM)
    _, err = job.communicate(timeout=120)
    assert job.returncode == 128 + signal.SIGTERM, err[-2000:]
    assert all(ended(pid) for pid in pids)
    run = newest_run(tmp_path / "runs")
    logs = [(run / "logs" / "attempt-0" / f"rank-{r}.log").read_text() for r in (0, 1)]
    left = [line for log in logs for line in log.splitlines() if " left at step " in line]
    assert len(left) == 2, logs  # both ranks got out of the loop, neither was killed in it
    assert left[0].split()[-1] == left[1].split()[-1]
    with RunReader(run) as reader:
        saved = reader.checkpoints()
    assert sorted(saved["rank"]) == [0, 1], saved
    assert saved["step"].nunique() == 1
    assert int(saved["step"].iloc[0]) > 50


@pytest.mark.timeout(120)
def test_sigint_ends_every_rank_even_a_stopped_one(tmp_path) -> None:
    job = _start(tmp_path, str(CLIENTS / "print_only.py"), "--seconds", "300", "--every", "1")
    pids = _rank_pids(tmp_path, wait_for_step=None)
    log = newest_run(tmp_path / "runs") / "logs" / "attempt-0" / "rank-0.log"
    deadline = time.monotonic() + 60
    while "still working" not in log.read_text() and time.monotonic() < deadline:
        time.sleep(0.1)
    os.kill(pids[1], signal.SIGSTOP)
    job.send_signal(signal.SIGINT)
    out, err = job.communicate(timeout=60)
    assert job.returncode == 128 + signal.SIGINT, err[-2000:]
    assert all(ended(pid) for pid in pids)
    assert "[rank0]: [rank 0] still working" in out
    assert "stopped by SIGINT" in err


@pytest.mark.timeout(180)
def test_sigterm_to_the_demo_leaves_no_process_of_it(tmp_path) -> None:
    demo = spawn_eagleeye(tmp_path, "demo", "--no-reference", "--steps", "400")
    _rank_pids(tmp_path, wait_for_step=5)
    family = psutil.Process(demo.pid).children(recursive=True)  # ranks, the quorum's store
    assert len(family) >= 5
    demo.send_signal(signal.SIGTERM)
    _, err = demo.communicate(timeout=60)
    assert demo.returncode == 128 + signal.SIGTERM, err[-2000:]
    assert "eagleeye demo: stopped by signal 15" in err
    gone, alive = psutil.wait_procs(family, timeout=10)
    assert not alive, alive


@pytest.mark.timeout(180)
def test_a_sigkilled_demo_leaves_no_rank_holder_or_segment(tmp_path) -> None:
    # synchronous restarts checkpoint into snapshot holders
    demo = spawn_eagleeye(tmp_path, "demo", "--no-reference", "--steps", "400", "--recovery", "job")
    _rank_pids(tmp_path, wait_for_step=25)  # past the first snapshot (every 20 steps)
    family = psutil.Process(demo.pid).children(recursive=True)
    holders = [p for p in family if "ft_runtime.ckpt" in " ".join(p.cmdline())]
    assert len(holders) == 2
    job = newest_run(tmp_path / "runs").name
    assert list(Path("/dev/shm").glob(f"eeckpt.{job}*"))  # the snapshots live there
    demo.kill()
    demo.communicate()
    _, alive = psutil.wait_procs(family, timeout=20)
    assert not alive, alive
    assert not list(Path("/dev/shm").glob(f"eeckpt.{job}*")), "segments left in /dev/shm"


@pytest.mark.timeout(300)
def test_a_run_whose_controller_was_killed_is_resumed_from_its_store(tmp_path) -> None:
    first = _start(
        tmp_path,
        *("--stream", "none", "--resume-args", "--init_from=resume"),
        str(CLIENTS / "ddp_train.py"),
        *("--max_iters", "100000", "--eval_interval", "10", "--out_dir", "out"),
    )
    pids = _rank_pids(tmp_path, wait_for_step=25)
    _kill_between_saves(first, pids[0], tmp_path / "out" / "ckpt.pt")
    first.communicate()
    _wait_gone(pids)  # each may end, and be reaped, at any point of the look
    assert all(ended(pid) for pid in pids)
    run = newest_run(tmp_path / "runs")
    with RunReader(run) as reader:
        before = len(reader.samples(names=["step_time"]))
        assert "result" not in reader.meta()
    resumed = spawn_eagleeye(tmp_path, "run", "--resume", str(run), "--stream", "0")
    _wait_for_log(run / "logs" / "attempt-1" / "rank-0.log", "Resuming training from out")
    _wait_for_samples(run, "step_time", more_than=before)  # the resumed run trained
    resumed.send_signal(signal.SIGTERM)
    out, err = resumed.communicate(timeout=120)
    assert resumed.returncode == 128 + signal.SIGTERM, err[-2000:]
    with RunReader(run) as reader:
        events = reader.events()
        assert len(reader.samples(names=["step_time"])) > before  # nothing lost, more added
    jobs = events[events["subject"] == "job"]
    resumed_at = jobs[jobs["phase"] == "recovering"]["detail"].iloc[-1]["reason"]
    assert "resumed from the run's store" in resumed_at
    launch = jobs[(jobs["phase"] == "launch") & (jobs["attempt"] == 1)]["detail"].iloc[0]
    assert launch["resume_from"] == str(tmp_path / "out" / "ckpt.pt")
    assert launch["resume_args"] == "--init_from=resume"
    assert "[rank0]: Resuming training from out" in out
    assert "[rank0]: iter 10:" not in out.split("Resuming")[0]  # earlier output not repeated


def _kill_between_saves(controller: subprocess.Popen[str], saver: int, ckpt: Path) -> None:
    """Kills the controller (its ranks die with it) while the rank that saves is stopped
    outside a save: the script's plain ``torch.save`` killed mid-write would leave a torn
    ``ckpt.pt`` that no resume can load, whatever Eagle Eye does."""
    while True:
        os.kill(saver, signal.SIGSTOP)
        while _state(saver) not in ("T", "t"):
            time.sleep(0.01)
        if str(ckpt) not in _open_files(saver):
            controller.kill()
            return
        os.kill(saver, signal.SIGCONT)  # mid-save: let it finish
        time.sleep(0.05)


def _state(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


def _open_files(pid: int) -> set[str]:
    found = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            found.add(os.readlink(fd))
        except FileNotFoundError:
            continue
    return found


def _wait_for_samples(run: Path, name: str, more_than: int, timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with RunReader(run) as reader:
            if len(reader.samples(names=[name])) > more_than:
                return
        time.sleep(0.2)
    raise AssertionError(f"no {name} sample came after the first {more_than}")


def _wait_for_log(path: Path, text: str, timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if path.is_file() and text in path.read_text(errors="replace"):
            return
        time.sleep(0.1)
    raise AssertionError(f"{text!r} never appeared in {path}")
