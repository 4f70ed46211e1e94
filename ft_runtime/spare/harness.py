"""A real-process SPARe run: N single-rank groups on gloo, SIGKILLs mid-step, exact gradient.

The harness process hosts the TCPStore (so the store outlives any group), runs ReCtlr and
is the fault injector. Workers (``ft_runtime.spare._worker``) train a tiny MLP on N shard
types with the stacked layout. When a group is killed, ReCtlr plans who computes which
type at which stack number; survivors join a new process group under a new store prefix,
patch-compute and retry the step. The final parameters are returned for comparison with a
fault-free run (``_model.reference_run``). A wipe-out (a shard type lost every holder)
stops the survivors, and the harness relaunches every group from the last checkpoint.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import numpy as np
from torch._C._distributed_c10d import PrefixStore, Store, TCPStore

from ft_runtime.spare.controller import Assignment, ReCtlr
from ft_runtime.spare.errors import WipeOutError
from ft_runtime.spare.layout import StackedLayout


@dataclass(frozen=True, slots=True)
class HarnessConfig:
    """What to train and whom to kill.

    Attributes:
        n_groups: N groups (= processes = shard types); keep it small, each costs a process.
        redundancy: r shard types per group.
        steps: SGD steps.
        kills: (step, group) pairs: SIGKILL ``group`` after it computed ``step``.
        timeout_s: collective timeout; a survivor that is not the victim's ring neighbour
            notices the death only after it.
        ckpt_every: steps between checkpoints (written by the lowest surviving group).
        max_restarts: relaunches from checkpoint allowed after wipe-outs.
    """

    n_groups: int = 4
    redundancy: int = 2
    steps: int = 8
    kills: tuple[tuple[int, int], ...] = ()
    lr: float = 0.1
    seed: int = 0
    batch: int = 16
    dim: int = 8
    timeout_s: float = 5.0
    deadline_s: float = 120.0
    ckpt_every: int = 1
    max_restarts: int = 1

    def __post_init__(self) -> None:
        groups = [g for _, g in self.kills]
        if len(set(groups)) != len(groups) or any(not 0 <= g < self.n_groups for g in groups):
            raise ValueError(f"kills must name distinct groups in [0, {self.n_groups}): {groups}")
        steps = [s for s, _ in self.kills]
        if any(not 0 <= s < self.steps for s in steps) or len(set(steps)) != len(steps):
            # One kill per step: a second victim parked in the same step would never join
            # the survivors' new process group.
            raise ValueError(f"kill steps must be distinct and in [0, {self.steps}): {steps}")
        if self.ckpt_every < 1 or self.max_restarts < 0:
            raise ValueError("ckpt_every must be >= 1 and max_restarts >= 0")


@dataclass(frozen=True, slots=True)
class HarnessResult:
    """Final parameters (identical on every survivor, checked) and how the run went.

    Attributes:
        params: final parameters; empty when the run did not complete.
        survivors: groups alive at the end of the last launch.
        plans: every controller assignment, launch after launch.
        exit_codes: group -> exit status, one mapping per launch (a restart is a launch).
        completed: False when wipe-outs outnumbered ``max_restarts``.
    """

    params: np.ndarray
    survivors: tuple[int, ...]
    plans: tuple[Assignment, ...]
    exit_codes: tuple[dict[int, int], ...]
    completed: bool

    @property
    def wipe_outs(self) -> int:
        return len(self.exit_codes) - (1 if self.completed else 0)


def _publish(store: Store, gen: int, plan: Assignment | None) -> None:
    body = (
        {"wipe_out": True}
        if plan is None
        else {
            "wipe_out": False,
            "members": sorted(plan.computes),
            "computes": {str(g): list(ts) for g, ts in plan.computes.items()},
            "stack": plan.stack,
        }
    )
    store.set(f"plan/{gen}", json.dumps(body))


def _spawn(
    cfg: HarnessConfig, port: int, attempt: int, kills: tuple[tuple[int, int], ...], folder: Path
) -> dict[int, subprocess.Popen[bytes]]:
    payload = json.dumps(
        {
            "n_groups": cfg.n_groups,
            "seed": cfg.seed,
            "batch": cfg.batch,
            "dim": cfg.dim,
            "lr": cfg.lr,
            "steps": cfg.steps,
            "kills": list(kills),
            "timeout_s": cfg.timeout_s,
            "attempt": attempt,
            "ckpt_dir": str(folder),
            "ckpt_every": cfg.ckpt_every,
        }
    )
    env = dict(os.environ, OMP_NUM_THREADS="1")
    return {
        g: subprocess.Popen(
            [
                sys.executable,
                "-m",
                "ft_runtime.spare._worker",
                "127.0.0.1",
                str(port),
                str(g),
                payload,
            ],
            env=env,
        )
        for g in range(cfg.n_groups)
    }


def run_spare(cfg: HarnessConfig, ckpt_dir: Path | None = None) -> HarnessResult:
    """Train with SPARe across real processes, killing groups as ``cfg.kills`` says.

    A wipe-out stops the survivors; up to ``cfg.max_restarts`` times every group is then
    relaunched from the last checkpoint (kept in ``ckpt_dir``, a temporary folder if None).

    Raises:
        TimeoutError: the run did not finish within ``cfg.deadline_s``.
        RuntimeError: a survivor exited with an error or survivors disagree.
    """
    ctl = ReCtlr(StackedLayout.build(cfg.n_groups, cfg.redundancy))
    store = TCPStore(
        "127.0.0.1",
        0,
        is_master=True,
        wait_for_workers=False,
        timeout=timedelta(seconds=cfg.deadline_s),
    )
    plans: list[Assignment] = []
    codes: list[dict[int, int]] = []
    with tempfile.TemporaryDirectory(prefix="spare-") as tmp:
        folder = ckpt_dir or Path(tmp)
        for attempt in range(cfg.max_restarts + 1):
            kills = cfg.kills if attempt == 0 else ()  # replaced hardware: no more faults
            ns = PrefixStore(f"a{attempt}/", store)
            wiped = _attempt(ns, store.port, cfg, ctl, attempt, kills, folder, plans, codes)
            if not wiped:
                return _collect(ns, kills, codes, plans)
    return HarnessResult(np.empty(0), (), tuple(plans), tuple(codes), completed=False)


def _attempt(
    ns: Store,
    port: int,
    cfg: HarnessConfig,
    ctl: ReCtlr,
    attempt: int,
    kills: tuple[tuple[int, int], ...],
    folder: Path,
    plans: list[Assignment],
    codes: list[dict[int, int]],
) -> bool:
    """One launch of all N groups; True when it ended in a wipe-out."""
    plans.append(ctl.reset())
    _publish(ns, 0, plans[-1])
    procs = _spawn(cfg, port, attempt, kills, folder)
    wiped = False
    try:
        for gen, (step, victim) in enumerate(sorted(kills), start=1):
            ns.wait([f"computed/{step}/{victim}"], timedelta(seconds=cfg.deadline_s))
            os.kill(procs[victim].pid, signal.SIGKILL)
            procs[victim].wait()
            try:
                plans.append(ctl.fail([victim]))
            except WipeOutError:
                _publish(ns, gen, None)
                wiped = True
                break
            _publish(ns, gen, plans[-1])
        codes.append(_wait_all(procs, time.monotonic() + cfg.deadline_s))
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()
                p.wait()
    return wiped


def _wait_all(procs: dict[int, subprocess.Popen[bytes]], until: float) -> dict[int, int]:
    codes: dict[int, int] = {}
    for g, p in procs.items():
        left = max(0.1, until - time.monotonic())
        try:
            codes[g] = p.wait(timeout=left)
        except subprocess.TimeoutExpired as exc:
            raise TimeoutError(f"group {g} still running at the harness deadline") from exc
    return codes


def _collect(
    ns: Store,
    kills: tuple[tuple[int, int], ...],
    codes: list[dict[int, int]],
    plans: list[Assignment],
) -> HarnessResult:
    killed = {g for _, g in kills}
    last = codes[-1]
    survivors = tuple(g for g in sorted(last) if g not in killed)
    bad = {g: last[g] for g in survivors if last[g] != 0}
    if bad:
        raise RuntimeError(f"surviving groups exited with errors: {bad}")
    raw = [bytes.fromhex(ns.get(f"result/{g}").decode()) for g in survivors]
    finals = [np.frombuffer(b, dtype=np.float64) for b in raw]
    if any(not np.array_equal(finals[0], f) for f in finals[1:]):
        raise RuntimeError("survivors ended with different parameters")
    return HarnessResult(finals[0], survivors, tuple(plans), tuple(codes), completed=True)
