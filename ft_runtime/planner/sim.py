"""A SimPy discrete-event simulation of a training job on a failing cluster.

One process trains: steps of S stack layers plus an all-reduce, blocking checkpoint saves
every T_c, global restarts after a wipe-out (rolling back to the last save). Another
process draws group failures (``ClusterConfig.failure_model``): by default every group has
a Weibull lifetime of mean N·m whose clock a global restart resets; only the groups that
train can fail the job (replication leaves the N mod r leftover groups idle). Groups that
fail during a restart stay down. Between restarts the redundancy scheme (``epochs``) says how
many failures are masked and the stack number after each; SPARe's comes from
Hopcroft–Karp on the layout. A masked failure in the middle of a step costs detection, the
controller, the communicator shrink, a patch layer (SPARe: survivors recompute the lost
types, or the new higher stack covers them) and a repeated all-reduce if it hit one.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Generator
from typing import Any

import numpy as np
import simpy

from ft_runtime.planner.config import ClusterConfig, SimResult, Strategy
from ft_runtime.planner.epochs import NoRedundancy, Replication, Scheme, Spare
from ft_runtime.planner.intervals import saxena_interval
from ft_runtime.planner.spare_math import mu, mu_replication
from ft_runtime.spare.layout import StackedLayout

Proc = Generator[simpy.Event, Any, bool]


def scheme_for(strategy: Strategy, n_groups: int, redundancy: int) -> Scheme:
    """The redundancy scheme of ``strategy`` over N groups."""
    if strategy is Strategy.CKPT:
        return NoRedundancy(n_groups)
    if strategy is Strategy.REPLICATION:
        return Replication(n_groups, redundancy)
    return Spare(StackedLayout.build(n_groups, redundancy))


def default_checkpoint(cfg: ClusterConfig, strategy: Strategy, redundancy: int) -> float:
    """Saxena's availability-optimal period with T_f = μ·m (one wipe-out per μ failures)."""
    if strategy is Strategy.CKPT:
        masked = 1.0
    elif strategy is Strategy.REPLICATION:
        masked = mu_replication(cfg.n_groups, redundancy)
    else:
        masked = mu(cfg.n_groups, redundancy)
    return saxena_interval(cfg.save_s, masked * cfg.mtbf_s, cfg.restart_s)


class _Job:
    def __init__(
        self,
        env: simpy.Environment,
        cfg: ClusterConfig,
        scheme: Scheme,
        strategy: Strategy,
        t_c: float,
        seed: int,
    ) -> None:
        self.env, self.cfg, self.scheme, self.strategy, self.t_c = env, cfg, scheme, strategy, t_c
        self.rng = np.random.default_rng(seed)
        self.done = self.saved = self.failures = self.wipes = self.masked_total = 0
        self.restart_t = self.save_t = self.lost_t = self.since_save = 0.0
        self.stack_t = self.step_t = self.last_save = 0.0
        self.restarting = False
        self.limit = cfg.give_up * cfg.t0
        self.fail_evt, self.epoch_evt, self.epoch_id = env.event(), env.event(), 0
        self.death = np.full(cfg.n_groups, np.inf)
        self._epoch()

    def _epoch(self) -> None:
        n = self.cfg.n_groups
        if self.cfg.failure_model in ("group", "fresh"):
            # "group": replaced groups start a fresh lifetime, survivors keep ageing (k < 1
            # means new hardware fails early, old hardware rarely). "fresh": a global
            # restart restarts every group's failure clock.
            dead = np.isinf(self.death) | (self.death <= self.env.now)
            if self.cfg.failure_model == "fresh":
                dead[:] = True
            scale = self.cfg.mtbf_s * n / self.cfg.weibull_mean
            fresh = scale * self.rng.weibull(self.cfg.weibull_shape, int(dead.sum()))
            self.death[dead] = self.env.now + fresh
            members = self.scheme.members
            self.order = members[np.argsort(self.death[members], kind="stable")]
        else:
            self.order = self.rng.permutation(self.scheme.members)
        self.fired = 0
        self.epoch_id += 1
        evt, self.epoch_evt = self.epoch_evt, self.env.event()
        evt.succeed()
        self.masked = self.scheme.masked(self.order)
        self.stacks = self.scheme.stacks(self.order, self.masked)
        self.k = 0

    def _jit(self, t: float) -> float:
        return t * max(0.0, self.rng.normal(1.0, self.cfg.jitter)) if self.cfg.jitter else t

    def _fire(self) -> None:
        self.failures += 1
        self.fired += 1
        evt, self.fail_evt = self.fail_evt, self.env.event()
        evt.succeed()

    def _group_failures(self) -> Generator[simpy.Event, Any, None]:
        while True:
            epoch = self.epoch_id
            due = self.death[self.order[self.fired]] if self.fired < len(self.order) else np.inf
            wait = self.env.timeout(due - self.env.now) if np.isfinite(due) else self.env.event()
            yield wait | self.epoch_evt
            if epoch == self.epoch_id and self.env.now >= due:
                self._fire()

    def failures_proc(self) -> Generator[simpy.Event, Any, None]:
        if self.cfg.failure_model in ("group", "fresh"):
            yield from self._group_failures()
            return
        n, members = self.cfg.n_groups, len(self.scheme.members)
        while True:
            carried = self.cfg.carry_restart_failures or not self.restarting
            alive = members - self.k if carried else members
            scale = self.cfg.mtbf_s * n / max(alive, 1) / self.cfg.weibull_mean
            yield self.env.timeout(scale * self.rng.weibull(self.cfg.weibull_shape))
            self._fire()

    def _work(self, duration: float, on_fail: Callable[[float], float | None]) -> Proc:
        """Spend ``duration``, extended by ``on_fail(remaining)``; False on a wipe-out."""
        end = self.env.now + duration
        while True:
            fail = self.fail_evt
            yield self.env.timeout(max(0.0, end - self.env.now)) | fail
            if not fail.processed and not fail.triggered:
                return True
            if self.env.now >= end:
                return True
            extra = on_fail(end - self.env.now)
            if extra is None:
                return False
            end += extra

    def _mask(self) -> bool:
        self.k += 1
        if self.k > self.masked:
            self.wipes += 1
            return False
        self.masked_total += 1
        return True

    def _step(self) -> Proc:
        stack = int(self.stacks[min(self.k, self.masked)])
        t_a = self._jit(self.cfg.t_allreduce)
        start = self.env.now

        def on_fail(remaining: float) -> float | None:
            old = int(self.stacks[min(self.k, self.masked)])
            if not self._mask():
                return None
            extra = self.cfg.detect_s + self.cfg.shrink_s
            if self.strategy is Strategy.SPARE:
                new = int(self.stacks[self.k])
                extra += self.cfg.controller_s + max(new - old, 1) * self._jit(self.cfg.layer_s)
            if remaining < t_a:  # the all-reduce was under way: run it again
                extra += t_a
            return extra

        ok = yield from self._work(stack * self._jit(self.cfg.layer_s) + t_a, on_fail)
        took = self.env.now - start
        if not ok:
            self.lost_t += self.since_save + took
            return False
        self.done += 1
        self.since_save += took
        self.stack_t += stack * took
        self.step_t += took
        return True

    def _save(self) -> Proc:
        start = self.env.now

        def on_fail(remaining: float) -> float | None:
            return self.cfg.detect_s + self.cfg.shrink_s if self._mask() else None

        ok = yield from self._work(self._jit(self.cfg.save_s), on_fail)
        self.save_t += self.env.now - start
        if ok:
            self.saved, self.since_save, self.last_save = self.done, 0.0, self.env.now
        else:
            self.lost_t += self.since_save
        return ok

    def _restart(self) -> Proc:
        """Global restart from the last save. Groups that fail while it runs stay down."""
        self.restarting = True
        start = self.env.now
        self._epoch()
        for _attempt in range(self.cfg.max_restart_attempts):
            if self.cfg.carry_restart_failures:
                ok = yield from self._work(
                    self._jit(self.cfg.restart_s), lambda _r: 0.0 if self._mask() else None
                )
            else:
                yield self.env.timeout(self._jit(self.cfg.restart_s))
                ok = True
            if ok or self.env.now >= self.limit:
                break
            self._epoch()  # a wipe-out while restarting: start the restart over
        else:
            self.limit = self.env.now  # no restart gets through: the job cannot progress
        self.restart_t += self.env.now - start
        self.restarting = False
        self.done, self.since_save, self.last_save = self.saved, 0.0, self.env.now
        return True

    def trainer(self, progress: Callable[[float], None] | None) -> Proc:
        every = max(1, self.cfg.steps // 100)
        while self.done < self.cfg.steps and self.env.now < self.limit:
            ok = yield from self._step()
            if ok and self.env.now - self.last_save >= self.t_c and self.done < self.cfg.steps:
                ok = yield from self._save()
            if not ok:
                yield from self._restart()
            elif progress is not None and self.done % every == 0:
                progress(self.done / self.cfg.steps)
        return self.done >= self.cfg.steps


def simulate(
    cfg: ClusterConfig,
    strategy: Strategy,
    redundancy: int = 1,
    checkpoint_s: float | None = None,
    seed: int = 0,
    progress: Callable[[float], None] | None = None,
) -> SimResult:
    """Simulate one training run to completion (or to ``cfg.give_up`` × T₀).

    Args:
        cfg: the cluster and job.
        strategy: CKPT, REPLICATION or SPARE.
        redundancy: r (ignored for CKPT).
        checkpoint_s: checkpoint period; None picks ``default_checkpoint``.
        seed: random seed; the same seed gives the same run.
        progress: called with the fraction of steps done, about a hundred times.

    Returns:
        TTT/T₀, availability, failures masked per wipe-out and the rest, as a SimResult.
    """
    r = 1 if strategy is Strategy.CKPT else redundancy
    t_c = default_checkpoint(cfg, strategy, r) if checkpoint_s is None else checkpoint_s
    if t_c <= 0:
        raise ValueError(f"checkpoint_s must be positive, got {t_c}")
    env = simpy.Environment()
    job = _Job(env, cfg, scheme_for(strategy, cfg.n_groups, r), strategy, t_c, seed)
    env.process(job.failures_proc())
    run = env.process(job.trainer(progress))
    env.run(until=run)
    wall = env.now
    productive = wall - job.restart_t - job.save_t - job.lost_t
    return SimResult(
        strategy=strategy,
        redundancy=r,
        checkpoint_s=t_c,
        ttt_s=wall,
        ttt_ratio=wall / cfg.t0 if run.value else math.inf,
        availability=productive / wall,
        uptime=1 - job.restart_t / wall,
        failures=job.failures,
        wipe_outs=job.wipes,
        masked_per_wipe=job.masked_total / max(job.wipes, 1),
        mean_stack=job.stack_t / max(job.step_t, 1e-9),
        completed=bool(run.value),
    )
