"""The chaos harness: `eagleeye run` as a process of its own, the processes of its job
found from outside, faults carried out against them, and the invariants read back.

A schedule is drawn from a seed (:func:`draw`); :class:`ChaosRun` starts the run, carries
the schedule out once the ranks train, waits for the end (resuming a run whose controller
was killed) and :func:`check_invariants` reads the store and the host back. Everything
specific to replica recovery (the quorum's store process, the catch-up servers) is in the
section "Replica mode" below, so that it can follow that API when it changes.
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from eagleeye.snapshots import _job_name
from eagleeye.store import RunReader
from ft_runtime.checkpoint import MANIFEST
from ft_runtime.ports import free_port
from tests.eagleeye.chaos_forgery import Forgeries
from tests.workload_args import tiny_workload

REPO = Path(__file__).resolve().parents[2]

# Faults against a process of the job (they may make findings and actions) and forged or
# malformed messages (they must never do either).
PROCESS_FAULTS = {
    "job": (
        "kill_rank",
        "stop_rank",
        "pause_rank",
        "kill_holder",
        "pause_holder",
        "kill_controller",
        "pause_controller",
    ),
    "replica": (
        "kill_rank",
        "stop_rank",
        "kill_store",
        "pause_store",
        "pause_controller",
        "kill_controller",
    ),
}
FORGERIES = {
    "job": ("forge_telemetry", "forge_holder", "forge_webhook", "forge_metrics"),
    "replica": ("forge_telemetry", "forge_catch_up", "forge_webhook", "forge_metrics"),
}
# What a fault of the job's ranks may be answered with; anything else is acted on a lie.
RANK_FAULTS = {"kill_rank", "stop_rank", "pause_rank"}
ACTED_KINDS = {"process_exit", "hang", "quorum_stall", "progress_stall"}


@dataclass(frozen=True, slots=True)
class Fault:
    kind: str
    at_s: float  # after the ranks first train
    together: bool = False  # carried out at once with the fault before it


@dataclass(frozen=True, slots=True)
class Schedule:
    seed: int
    mode: str  # "job" or "replica"
    faults: tuple[Fault, ...]
    tight_disk: bool  # the checkpoint folder is a small, nearly full tmpfs

    def __str__(self) -> str:
        parts = [f"{'+' if f.together else ''}{f.kind}@{f.at_s:.1f}s" for f in self.faults]
        disk = " on a full tmpfs" if self.tight_disk else ""
        return f"seed {self.seed} ({self.mode}{disk}): {' '.join(parts)}"


def draw(seed: int) -> Schedule:
    """One seed's schedule: a mode, two to four faults (one pair of them at once) at times
    drawn over the first seconds of training, at least one forgery, maybe a full disk."""
    rng = random.Random(seed)
    mode = "replica" if seed % 3 == 2 else "job"
    tight = mode == "job" and rng.random() < 0.25  # no holders then: checkpoints on disk
    kinds = [k for k in PROCESS_FAULTS[mode] if not (tight and "holder" in k)]
    forgeries = [k for k in FORGERIES[mode] if not (tight and "holder" in k)]
    rng.shuffle(kinds)
    chosen = [*kinds[: rng.randint(1, 2)], rng.choice(forgeries)]
    if rng.random() < 0.5:
        chosen.append(rng.choice(forgeries))
    # a killed controller ends the schedule: the run is resumed after it
    chosen.sort(key=lambda k: k == "kill_controller")
    faults: list[Fault] = []
    at = rng.uniform(0.3, 1.0)
    for i, kind in enumerate(chosen):
        together = i > 0 and kind in PROCESS_FAULTS[mode] and rng.random() < 0.5
        if i and not together:
            at += rng.uniform(0.2, 1.2)
        faults.append(Fault(kind, round(at, 2), together))
    return Schedule(seed, mode, tuple(faults), tight)


# --- the job's processes, found from outside ------------------------------------------


def alive(proc: psutil.Process) -> bool:
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def environ(pid: int) -> dict[str, str]:
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return {}
    pairs = (item.split(b"=", 1) for item in raw.split(b"\0") if b"=" in item)
    return {k.decode(errors="replace"): v.decode(errors="replace") for k, v in pairs}


def _is_rank(proc: psutil.Process) -> bool:
    """A training rank, not the local agent whose command line ends with the rank's."""
    line = _cmdline(proc)
    return "eagleeye.workload.train" in line and " eagleeye agent " not in line


def _cmdline(proc: psutil.Process) -> str:
    try:
        return " ".join(proc.cmdline())
    except psutil.Error:
        return ""


def _described(proc: psutil.Process) -> str:
    """What a leftover process is: enough to tell which run started it and why it lives."""
    try:
        with proc.oneshot():
            age = time.time() - proc.create_time()
            state = f"ppid {proc.ppid()} {proc.status()} {age:.1f} s old"
    except psutil.Error:
        state = "gone"
    return f"{proc.pid} ({state}) {_cmdline(proc)[:160]}{_stacks(proc.pid)}"


def _stacks(pid: int) -> str:
    """The process's Python stacks (py-spy, when installed): where it waits."""
    spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    try:
        dump = subprocess.run(
            [spy, "dump", "--pid", str(pid)], capture_output=True, text=True, timeout=20
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return ""
    return f"\n{dump[:2500]}" if dump else ""


def holders_of(job: str) -> list[psutil.Process]:
    """Holder processes of the job, wherever they were reparented to."""
    found = []
    for proc in psutil.process_iter():
        line = _cmdline(proc)
        if "ft_runtime.ckpt" in line and job in line and alive(proc):
            found.append(proc)
    return found


def ranks_of(run_dir: Path) -> list[psutil.Process]:
    """Rank processes of the run (they carry its folder in their environment)."""
    want = str(run_dir.resolve())
    found = []
    for proc in psutil.process_iter():
        if "eagleeye" not in _cmdline(proc) or not alive(proc):
            continue
        if environ(proc.pid).get("EAGLEEYE_RUN_DIR") == want:
            found.append(proc)
    return found


def segments_of(job: str) -> list[Path]:
    return list(Path("/dev/shm").glob(f"eeckpt.{job}.*"))


@contextmanager
def small_tmpfs(where: Path, size: str = "1m") -> Iterator[bool]:
    """A small tmpfs mounted at ``where`` for the block (False: mounting is not allowed)."""
    where.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)],
        capture_output=True,
        check=False,
    )
    try:
        yield done.returncode == 0
    finally:
        if done.returncode == 0:
            subprocess.run(["umount", "-l", str(where)], capture_output=True, check=False)


# --- one run under a schedule ----------------------------------------------------------


@dataclass
class Outcome:
    """What a schedule did and what the run left."""

    schedule: Schedule
    run_dir: Path
    returncodes: list[int] = field(default_factory=list)  # one per controller started
    stderr: list[str] = field(default_factory=list)
    done: list[str] = field(default_factory=list)  # faults carried out, in order
    skipped: list[str] = field(default_factory=list)  # faults with nothing to act on
    forged: int = 0
    seen: dict[int, psutil.Process] = field(default_factory=dict)  # every job process seen
    # per forgery of the holders: how many were up, whether each is still the same
    # process, and whether the run ended meanwhile (its holders then stop as they should)
    holder_pids_after_forgery: list[tuple[int, bool, bool]] = field(default_factory=list)
    killed_after_result: bool = False  # the controller's kill landed once it had recorded
    endpoint_answers: dict[str, int] = field(default_factory=dict)


class ChaosRun(Forgeries):
    """Runs `eagleeye run` under ``schedule`` in ``root`` and gathers its :class:`Outcome`."""

    STEPS = {"job": 100, "replica": 100}

    def __init__(self, schedule: Schedule, root: Path, tag: str = "") -> None:
        self.schedule = schedule
        self.root = root
        self.run_id = f"chaos-{schedule.seed}-{os.getpid()}{tag}"
        self.job = _job_name(self.run_id)
        self.run_dir = root / "runs" / self.run_id
        self.outcome = Outcome(schedule, self.run_dir)
        self.metrics_port = free_port()
        self.alerts_port = free_port()
        self.token_file = root / "alerts.token"
        self.token_file.write_text("the-real-token\n")
        self.token_file.chmod(0o600)
        self.controller: subprocess.Popen[str] | None = None
        self._stderr: list[str] = []
        self._reader: threading.Thread | None = None
        self.rng = random.Random(schedule.seed * 7919 + 1)
        self.stopped: psutil.Process | None = None  # the rank stop_rank stopped for good
        self._stranded_since: float | None = None

    # the controller ------------------------------------------------------------------

    def _env(self) -> dict[str, str]:
        path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)
        return {**os.environ, "PYTHONPATH": path}

    def _args(self) -> list[str]:
        """The controller's job: two nodes of one rank (two replicas in replica mode)."""
        mode = self.schedule.mode
        fields: dict[str, object] = {
            "script": "eagleeye.workload.train",
            "module": True,
            "remediate": True,
            "max_restarts": 8,
            "stream_ranks": [],
            "metrics_port": self.metrics_port,
            "alerts_port": self.alerts_port,
            "alerts_token_file": str(self.token_file),
            "runs_dir": str(self.root / "runs"),
            "run_id": self.run_id,
        }
        if mode == "replica":
            fields["layout"] = {"nnodes": 2, "nproc_per_node": 1, "replicas": 2}
            fields["recovery"] = "replica"
            fields["script_args"] = [*tiny_workload(self.STEPS[mode], 40), "--step-floor-s", "0.04"]
        else:
            fields["layout"] = {"nnodes": 2, "nproc_per_node": 1}
            fields["snapshots"] = not self.schedule.tight_disk
            fields["script_args"] = tiny_workload(self.STEPS[mode], 10)
        return [json.dumps(fields)]

    def _start(self, args: list[str]) -> subprocess.Popen[str]:
        proc = subprocess.Popen(
            [sys.executable, "-m", "tests.eagleeye.chaos_controller", *args],
            cwd=self.root,
            env=self._env(),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        self._stderr = []
        lines = self._stderr

        def read() -> None:
            assert proc.stderr is not None
            for line in proc.stderr:
                lines.append(line)

        self._reader = threading.Thread(target=read, daemon=True)
        self._reader.start()
        self.controller = proc
        return proc

    def _finish(self, timeout_s: float) -> int:
        assert self.controller is not None
        assert self._reader is not None
        try:
            code = self.controller.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.controller.kill()
            code = self.controller.wait()
            self._stderr.append(f"chaos: the controller did not end within {timeout_s} s\n")
        self._reader.join(timeout=10)
        self.outcome.returncodes.append(code)
        self.outcome.stderr.append("".join(self._stderr))
        return code

    def _watch(self) -> None:
        """Remembers every process of the job while it runs."""
        assert self.controller is not None
        try:
            top = psutil.Process(self.controller.pid)
            self.outcome.seen.setdefault(top.pid, top)
            for proc in top.children(recursive=True):
                self.outcome.seen.setdefault(proc.pid, proc)
        except psutil.Error:
            pass  # holders, the store process and ranks are all the controller's children

    def _ranks(self) -> list[psutil.Process]:
        assert self.controller is not None
        try:
            kids = psutil.Process(self.controller.pid).children(recursive=True)
        except psutil.Error:
            return []
        return [p for p in kids if _is_rank(p) and alive(p)]

    def _wait_training(self, timeout_s: float = 120) -> bool:
        """Until the ranks have trained a few steps (or the run ended)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            self._watch()
            assert self.controller is not None
            if self.controller.poll() is not None:
                return False
            if len(self._ranks()) >= 2 and self._steps() >= 3:
                return True
            time.sleep(0.25)
        return False

    def _ended(self) -> bool:
        """Whether the run is over (or ending: its result is stored)."""
        assert self.controller is not None
        if self.controller.poll() is not None:
            return True
        try:
            with RunReader(self.run_dir) as reader:
                return "result" in reader.meta()
        except Exception:
            return False

    def _steps(self) -> int:
        try:
            with RunReader(self.run_dir) as reader:
                steps = reader.samples(names=["step_time"])
        except Exception:
            return 0
        return 0 if steps.empty else int(steps["step"].max())

    def run(self) -> Outcome:
        schedule = self.schedule
        with ExitOnError(self):
            if schedule.tight_disk:
                self._start_on_tight_disk()
            else:
                self._start(self._args())
            killed = False
            if self._wait_training():
                t0 = time.monotonic()
                for fault in schedule.faults:
                    if not fault.together:
                        while time.monotonic() - t0 < fault.at_s:
                            self._watch()
                            time.sleep(0.1)
                    assert self.controller is not None
                    if self.controller.poll() is not None:
                        self.outcome.skipped.append(f"{fault.kind} (the run had ended)")
                        continue
                    self._watch()
                    skipped = len(self.outcome.skipped)
                    getattr(self, fault.kind)()
                    if len(self.outcome.skipped) == skipped:  # done, not skipped
                        self.outcome.done.append(fault.kind)
                    killed = killed or fault.kind == "kill_controller"
            while self.controller is not None and self.controller.poll() is None:
                self._watch()
                self._continue_stranded()
                time.sleep(0.2)
                if killed:
                    break
            self._finish(timeout_s=240)
            if killed:
                self._resume()
        return self.outcome

    def _start_on_tight_disk(self) -> None:
        """The checkpoint folder becomes a 12 MiB tmpfs, filled but for about two of the
        tiny model's checkpoints (a rank's is about 1.3 MB), as soon as the run folder
        exists: the disk runs out a few checkpoints into the run."""
        proc = self._start(self._args())
        where = self.run_dir / "checkpoints"
        deadline = time.monotonic() + 60
        while not where.is_dir() and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.005)
        self.tmpfs = small_tmpfs(where, "12m")
        self.mounted = self.tmpfs.__enter__()
        if self.mounted:
            filler = where / ".filler"
            with open(filler, "wb") as out, suppress(OSError):
                while True:
                    out.write(b"\0" * 65536)
                    out.flush()
                    if psutil.disk_usage(str(where)).free < 6_000_000:
                        break
            self.outcome.done.append("full_tmpfs")
        else:
            self.outcome.skipped.append("full_tmpfs (mounting a tmpfs is not allowed here)")

    def _resume(self) -> None:
        """After the controller was killed: its job is gone; go on from its store (unless
        the run had recorded its result before the kill landed: nothing is left to do)."""
        self._reap()
        with RunReader(self.run_dir) as reader:
            if "result" in reader.meta():
                self.outcome.skipped.append("resume (the run had ended before the kill)")
                self.outcome.killed_after_result = True
                return
        self._start(["--resume", str(self.run_dir)])
        while self.controller is not None and self.controller.poll() is None:
            self._watch()
            time.sleep(0.2)
        self._finish(timeout_s=240)

    def _reap(self, timeout_s: float = 20) -> None:
        procs = [p for p in self.outcome.seen.values() if alive(p)]
        psutil.wait_procs(procs, timeout=timeout_s)

    def close(self) -> None:
        """Leaves nothing behind even when the harness itself failed."""
        for proc in self.outcome.seen.values():
            with suppress(psutil.Error):
                if alive(proc):
                    proc.send_signal(signal.SIGCONT)
        tmpfs = getattr(self, "tmpfs", None)
        if tmpfs is not None:
            self._reap(timeout_s=10)
            tmpfs.__exit__(None, None, None)

    # process faults --------------------------------------------------------------------

    def _pick_rank(self) -> psutil.Process | None:
        ranks = self._ranks()
        return self.rng.choice(ranks) if ranks else None

    def _signal(self, proc: psutil.Process | None, sig: int, fault: str) -> bool:
        if proc is None or not alive(proc):
            self.outcome.skipped.append(f"{fault} (no process)")
            return False
        with suppress(psutil.Error):
            proc.send_signal(sig)
        return True

    def _pause(self, proc: psutil.Process | None, seconds: float, fault: str) -> None:
        if self._signal(proc, signal.SIGSTOP, fault):
            assert proc is not None

            def resume() -> None:
                with suppress(psutil.Error):
                    proc.send_signal(signal.SIGCONT)

            threading.Timer(seconds, resume).start()

    def _rank_env(self) -> dict[str, str]:
        for proc in self._ranks():
            env = environ(proc.pid)
            if env:
                return env
        return {}

    def _holders(self) -> list[psutil.Process]:
        return holders_of(self.job)

    def kill_rank(self) -> None:
        self._signal(self._pick_rank(), signal.SIGKILL, "kill_rank")

    def stop_rank(self) -> None:  # stopped for good: found as a hang, fenced
        ranks = self._ranks()
        if len(ranks) == 1:  # its peer has ended: a stop of every rank left is a suspension
            self.outcome.skipped.append("stop_rank (a rank had ended: nobody waits for it)")
            return
        self.stopped = self.rng.choice(ranks) if ranks else None
        self._signal(self.stopped, signal.SIGSTOP, "stop_rank")

    def _continue_stranded(self, after_s: float = 10.0) -> None:
        """A rank stopped for good whose peers all ended after the stop (it was stopped in
        its last steps) is every rank left, stopped: a suspended job to Eagle Eye, which
        rightly waits. Its operator would continue it; so does the harness, after
        ``after_s``, saying so."""
        proc = self.stopped
        if proc is None or not alive(proc):
            return
        if any(p.pid != proc.pid for p in self._ranks()):
            self._stranded_since = None
            return
        now = time.monotonic()
        if self._stranded_since is None:
            self._stranded_since = now
        elif now - self._stranded_since >= after_s:
            with suppress(psutil.Error):
                proc.send_signal(signal.SIGCONT)
            self.outcome.skipped.append("stop_rank continued (its peers ended while stopped)")
            self.stopped = None

    def pause_rank(self) -> None:
        self._pause(self._pick_rank(), self.rng.uniform(0.5, 3.0), "pause_rank")

    def kill_holder(self) -> None:
        holders = holders_of(self.job)
        self._signal(self.rng.choice(holders) if holders else None, signal.SIGKILL, "kill_holder")

    def pause_holder(self) -> None:
        holders = holders_of(self.job)
        pick = self.rng.choice(holders) if holders else None
        self._pause(pick, self.rng.uniform(1.0, 4.0), "pause_holder")

    def kill_controller(self) -> None:
        assert self.controller is not None
        self.controller.kill()

    def pause_controller(self) -> None:
        assert self.controller is not None
        self._pause(
            psutil.Process(self.controller.pid), self.rng.uniform(1.0, 5.0), "pause_controller"
        )

    def kill_store(self) -> None:
        self._signal(self._store_process(), signal.SIGKILL, "kill_store")

    def pause_store(self) -> None:
        self._pause(self._store_process(), self.rng.uniform(1.0, 5.0), "pause_store")

    # --- Replica mode: the quorum's store process and the catch-up servers --------------

    def _store_process(self) -> psutil.Process | None:
        assert self.controller is not None
        try:
            kids = psutil.Process(self.controller.pid).children()
        except psutil.Error:
            return None
        return next((p for p in kids if "ft_runtime.storehost" in _cmdline(p)), None)


class ExitOnError:
    """Around a run: if the harness fails, the job is ended before the error goes on."""

    def __init__(self, run: ChaosRun) -> None:
        self.run = run

    def __enter__(self) -> ExitOnError:
        return self

    def __exit__(self, kind: object, *rest: object) -> None:
        if kind is not None and self.run.controller is not None:
            with suppress(Exception):
                self.run.controller.send_signal(signal.SIGCONT)
                self.run.controller.terminate()
                self.run.controller.wait(timeout=30)


# --- the invariants ----------------------------------------------------------------------

_FINDING = re.compile(r"\bfinding\b (\S+) on (\S+)")
_ACTION = re.compile(r"\baction\b (\S+) (\S+): ")


def check_invariants(outcome: Outcome) -> None:
    """Every invariant of a schedule; an AssertionError names the seed and what broke."""
    schedule = outcome.schedule
    where = f"{schedule} did {outcome.done}, skipped {outcome.skipped}"
    tail = "\n".join(s[-3000:] for s in outcome.stderr)
    # the job ended, succeeded or failed with its cause recorded
    with RunReader(outcome.run_dir) as reader:
        meta, findings, actions = reader.meta(), reader.findings(), reader.actions()
        events, checkpoints = reader.events(), reader.checkpoints()
    result = meta.get("result")
    assert result is not None, f"{where}: no result recorded\n{tail}"
    final = outcome.returncodes[-1]
    if not (outcome.killed_after_result and final == -signal.SIGKILL):
        assert (final == 0) == bool(result["succeeded"]), (where, final, result, tail)
    if not result["succeeded"]:
        failed = events[(events["subject"] == "job") & (events["phase"] == "failed")]
        assert not failed.empty, f"{where}: failed with no cause recorded\n{tail}"
        assert all(d.get("reason") for d in failed["detail"]), (where, failed)
    # every finding and action the controllers reported is in the store
    said_findings = [m for s in outcome.stderr for m in _FINDING.findall(s)]
    said_actions = [m for s in outcome.stderr for m in _ACTION.findall(s)]
    assert len(findings) >= len(said_findings), (where, said_findings, findings, tail)
    assert len(actions) >= len(said_actions), (where, said_actions, actions, tail)
    # the newest complete checkpoint a rank reported written to disk is still there, or a
    # newer complete one (space made on a full disk keeps only the newest)
    if not checkpoints.empty and "path" in checkpoints:
        on_disk = checkpoints[checkpoints["path"].astype(str).str.startswith("/")]
        if not on_disk.empty:
            newest = on_disk.sort_values("step").iloc[-1]
            kept = Path(newest["path"]).exists() or any(
                (folder / MANIFEST).exists()
                and int(folder.name.removeprefix("step-")) > int(newest["step"])
                for folder in Path(newest["path"]).parent.glob("step-[0-9]*")
            )
            assert kept, (where, newest.to_dict())
    # nothing was acted on a forged message
    # a full disk is a real fault too: ranks that cannot save fail, and are answered
    real = [k for k in outcome.done if k in RANK_FAULTS or k in ("kill_store", "full_tmpfs")]
    acted = set(actions["finding_kind"].dropna()) if not actions.empty else set()
    assert acted <= ACTED_KINDS, (where, actions)
    alerts = findings[findings["detector"].astype(str).str.contains("alert")]
    assert alerts.empty, f"{where}: a forged alert became a finding: {alerts}"
    if not real:
        worrying = set(findings["kind"]) & ACTED_KINDS
        assert not worrying, f"{where}: findings with no real fault: {findings}\n{tail}"
        assert actions.empty, f"{where}: actions with no real fault: {actions}\n{tail}"
    forged_then_killed = "kill_controller" in outcome.done  # it may have died first
    if "forge_telemetry" in outcome.done and not forged_then_killed:
        assert sum((meta.get("telemetry_rejected") or {}).values()) >= 1, (where, meta)
    for _held, kept, run_ended in outcome.holder_pids_after_forgery:
        assert kept or run_ended, f"{where}: a holder died of forged requests\n{tail}"
    for name in ("webhook", "metrics"):
        if name in outcome.endpoint_answers:
            assert outcome.endpoint_answers[name] == 1, f"{where}: {name} broke on forgery"
    served = outcome.endpoint_answers.get("catch_up_served", 0)
    assert not served, f"{where}: a catch-up server answered a stranger {served} times"
    # nothing of the job is left
    left = [p for p in outcome.seen.values() if alive(p)]
    if left:
        psutil.wait_procs(left, timeout=10)
        left = [_described(p) for p in left if alive(p)]
    assert not left, f"{where}: processes of the job outlived it: {left}"
    job = _job_name(outcome.run_dir.name)
    assert not holders_of(job), f"{where}: a holder outlived the job"
    assert not ranks_of(outcome.run_dir), f"{where}: a rank outlived the job"
    assert not segments_of(job), f"{where}: segments left in /dev/shm"
