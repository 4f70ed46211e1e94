"""A real-process SPARe run: N single-rank groups on gloo, SIGKILLs mid-step, exact gradient.

The harness process hosts the TCPStore (so the store outlives any group), runs ReCtlr and
is the fault injector. Workers (``ft_runtime.spare._worker``) train a tiny MLP on N shard
types with the stacked layout. When a group is killed, ReCtlr plans who computes which
type at which stack number; survivors join a new process group under a new store prefix,
patch-compute and retry the step. The final parameters are returned for comparison with a
fault-free run (``_model.reference_run``).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import timedelta

import numpy as np
from torch._C._distributed_c10d import TCPStore

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

    def __post_init__(self) -> None:
        groups = [g for _, g in self.kills]
        if len(set(groups)) != len(groups) or any(not 0 <= g < self.n_groups for g in groups):
            raise ValueError(f"kills must name distinct groups in [0, {self.n_groups}): {groups}")
        if any(not 0 <= s < self.steps for s, _ in self.kills):
            raise ValueError(f"kill steps must be in [0, {self.steps}): {self.kills}")


@dataclass(frozen=True, slots=True)
class HarnessResult:
    """Final parameters (identical on every survivor, checked) and the plans used."""

    params: np.ndarray
    survivors: tuple[int, ...]
    plans: tuple[Assignment, ...]
    wiped_out: bool = False
    exit_codes: dict[int, int] = field(default_factory=dict)


def _publish(store: TCPStore, gen: int, plan: Assignment | None) -> None:
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


def _spawn(cfg: HarnessConfig, port: int) -> dict[int, subprocess.Popen[bytes]]:
    payload = json.dumps(
        {
            "n_groups": cfg.n_groups,
            "seed": cfg.seed,
            "batch": cfg.batch,
            "dim": cfg.dim,
            "lr": cfg.lr,
            "steps": cfg.steps,
            "kills": list(cfg.kills),
            "timeout_s": cfg.timeout_s,
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


def run_spare(cfg: HarnessConfig) -> HarnessResult:
    """Train with SPARe across real processes, killing groups as ``cfg.kills`` says.

    Raises:
        TimeoutError: the run did not finish within ``cfg.deadline_s``.
        RuntimeError: a survivor exited with an error or survivors disagree.
    """
    layout = StackedLayout.build(cfg.n_groups, cfg.redundancy)
    ctl = ReCtlr(layout)
    store = TCPStore(
        "127.0.0.1",
        0,
        is_master=True,
        wait_for_workers=False,
        timeout=timedelta(seconds=cfg.deadline_s),
    )
    plans = [ctl.reset()]
    _publish(store, 0, plans[0])
    procs = _spawn(cfg, store.port)
    wiped = False
    try:
        for gen, (step, victim) in enumerate(sorted(cfg.kills), start=1):
            store.wait([f"computed/{step}/{victim}"], timedelta(seconds=cfg.deadline_s))
            os.kill(procs[victim].pid, signal.SIGKILL)
            procs[victim].wait()
            try:
                plans.append(ctl.fail([victim]))
            except WipeOutError:
                _publish(store, gen, None)
                wiped = True
                break
            _publish(store, gen, plans[-1])
        codes = _wait_all(procs, time.monotonic() + cfg.deadline_s)
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()
                p.wait()
    return _collect(store, cfg, codes, tuple(plans), wiped)


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
    store: TCPStore,
    cfg: HarnessConfig,
    codes: dict[int, int],
    plans: Sequence[Assignment],
    wiped: bool,
) -> HarnessResult:
    killed = {g for _, g in cfg.kills}
    survivors = tuple(g for g in sorted(codes) if g not in killed)
    if wiped:
        return HarnessResult(np.empty(0), survivors, tuple(plans), True, codes)
    bad = {g: codes[g] for g in survivors if codes[g] != 0}
    if bad:
        raise RuntimeError(f"surviving groups exited with errors: {bad}")
    raw = [bytes.fromhex(store.get(f"result/{g}").decode()) for g in survivors]
    finals = [np.frombuffer(b, dtype=np.float64) for b in raw]
    if any(not np.array_equal(finals[0], f) for f in finals[1:]):
        raise RuntimeError("survivors ended with different parameters")
    return HarnessResult(finals[0], survivors, tuple(plans), False, codes)
