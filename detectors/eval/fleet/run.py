"""The simulated job's timeline: steps, scrapes, a frozen job, an out-of-memory crash, and
the relaunch from the last checkpoint that follows either.

Every step is synchronous: each rank waits for its data, computes, and enters one ring
all-reduce, which starts when the last rank arrives and runs at the slowest link's pace;
a rank's collective time is its wait for the last arrival plus the transfer. GPUs and NICs
are scraped every ``poll_s`` seconds, whatever the steps do. A hang freezes the whole job:
its culprit never reaches the collective, the others wait inside it, and only their wait
reports and the scrapes arrive until the job is killed and relaunched.
"""

from __future__ import annotations

import numpy as np

from detectors.eval.fleet.emit import MIB_PER_GB, Recorder, node_name, to_trace
from detectors.eval.fleet.physics import CAPACITY_GB, Physics, StepState, Traits
from detectors.eval.fleet.plan import Fault, FleetSpec, plan_faults
from detectors.eval.trace import FaultWindow, Trace

WAIT_REPORT_S = 1.0  # the hook reports a collective still open after this long
T0 = 1.75e9


def simulate(spec: FleetSpec) -> Trace:
    """A labelled trace of the simulated job (same spec, same trace)."""
    rng = np.random.default_rng(spec.seed)
    traits = Traits.draw(spec, rng)
    faults, length = plan_faults(spec, rng)
    job = _Job(spec, traits, faults, rng)
    job.run(length)
    return to_trace(job.rec, f"fleet-{spec.seed}", traits.node_of, spec.replicas, job.labels)


class _Job:
    def __init__(
        self, spec: FleetSpec, traits: Traits, faults: list[Fault], rng: np.random.Generator
    ) -> None:
        self.spec, self.t, self.faults, self.rng = spec, traits, faults, rng
        self.physics = Physics(traits, rng)
        self.rec = Recorder(spec.ranks)
        self.now, self.step, self.since_launch, self.resume_from = T0, 0, 0, 0
        self.next_poll = T0 + traits.poll_s * float(rng.random())
        self.expired: set[int] = set()  # faults over (a relaunch does not bring them back)
        self.xid = np.zeros(spec.ranks)  # dcgm-exporter's sticky last-XID gauge
        self.nic = np.zeros((4, spec.nodes))  # rx bytes, tx bytes, rx errors, tx drops
        self.labels = [_window(f, spec) for f in faults]
        self.labels += [  # a leak ends in an out-of-memory crash of its rank
            FaultWindow("process_exit", f"rank:{f.rank}", f.step + f.length, f.step + f.length)
            for f in faults
            if f.kind == "memory_leak"
        ]
        self.state: StepState | None = None

    def run(self, length: int) -> None:
        self.rec.add(self.now, 0, "launched", 1.0)
        while self.step < length:
            now_faults = self._in_force()
            stop = next((f for f in now_faults if f.kind == "hang" and f.step == self.step), None)
            oom = next((f for f in now_faults if _fills(f, self.step)), None)
            state = self.physics.step(self.step, self.since_launch, self.now, now_faults)
            self.state = state
            if stop is not None:
                self._freeze(stop, state)
            elif oom is not None:
                self._crash(oom, state)
            else:
                self._complete(state, now_faults)

    def _in_force(self) -> list[Fault]:
        return [
            f
            for i, f in enumerate(self.faults)
            if i not in self.expired
            and (f.covers(self.step) or (f.kind == "memory_leak" and f.step <= self.step))
        ]

    def _complete(self, s: StepState, faults: list[Fault]) -> None:
        arrival = s.arrival()
        last = float(arrival.max())
        collective = last - arrival + s.transfer
        ckpt = s.ckpt if s.ckpt is not None else np.zeros_like(arrival)
        step_time = last + s.transfer + ckpt
        end = self.now + float(step_time.max())
        for f in faults:
            if f.kind == "xid" and f.step == self.step:
                at = self.now + float(arrival[f.rank])
                self._polls_until(at)
                self.rec.add(at, self.step, "gpu_xid", float(f.code), np.array([f.rank]))
                self.xid[f.rank] = f.code
        self._polls_until(end)
        self._report(end, s, step_time, collective)
        self.nic[:2] += self.t.step_bytes
        self.now, self.since_launch = end, self.since_launch + 1
        if s.ckpt is not None:
            self.resume_from = self.step + 1
        self.step += 1

    def _report(self, at: float, s: StepState, step_time: np.ndarray, coll: np.ndarray) -> None:
        add, step = self.rec.add, self.step
        add(at, step, "step_time", step_time)
        add(at, step, "section.data", s.data)
        add(at, step, "section.forward", 0.35 * s.compute)
        add(at, step, "section.backward", 0.65 * s.compute)
        add(at, step, "collective_time", coll)
        if s.ckpt is not None:
            add(at, step, "section.checkpoint", s.ckpt)
        add(at, step, "loss", s.loss)
        add(at, step, "grad_norm", s.grad_norm)
        add(at, step, "tokens", 32768.0)

    def _polls_until(self, until: float) -> None:
        while self.next_poll <= until:
            self._poll(self.next_poll)
            self.next_poll += self.t.poll_s * float(self.rng.uniform(0.9, 1.1))

    def _poll(self, at: float) -> None:
        assert self.state is not None
        s, add, step = self.physics.scrape(self.state), self.rec.add, self.step
        add(at, step, "DCGM_FI_DEV_GPU_TEMP", np.round(s.temp))
        add(at, step, "DCGM_FI_DEV_SM_CLOCK", np.round(s.clock))
        add(at, step, "DCGM_FI_DEV_FB_USED", np.round(s.mem * MIB_PER_GB))
        add(at, step, "DCGM_FI_DEV_GPU_UTIL", np.round(s.util))
        add(at, step, "DCGM_FI_DEV_POWER_USAGE", 300.0 + 3.5 * s.util + (s.clock - 1980.0) * 0.2)
        add(at, step, "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS", s.throttle.astype(float))
        add(at, step, "DCGM_FI_DEV_XID_ERRORS", self.xid)
        self._nic_noise(at)
        names = (
            "host_net_rx_bytes_total",
            "host_net_tx_bytes_total",
            "host_net_rx_errors_total",
            "host_net_tx_drops_total",
        )
        for row, name in enumerate(names):
            add(at, step, name, self.nic[row][self.t.node_of])

    def _nic_noise(self, at: float) -> None:
        """Background traffic, rare healthy error bursts, and a degraded NIC's errors."""
        dt, rng, nodes = self.t.poll_s, self.rng, self.spec.nodes
        self.nic[:2] += 1e6 * dt
        self.nic[2] += rng.poisson(0.002 * dt, nodes)
        burst = rng.random(nodes) < 0.002
        self.nic[2] += np.where(burst, rng.integers(5, 40, nodes), 0)
        for f in self._in_force():
            if f.kind == "nic_degradation":
                rate = 300.0 + 3000.0 * f.size
                self.nic[2, f.node] += rng.poisson(rate * dt)
                self.nic[3, f.node] += rng.poisson(0.5 * rate * dt)

    def _freeze(self, f: Fault, s: StepState) -> None:
        """The culprit never reaches the collective; everyone else waits in it."""
        arrival = self.now + s.arrival()
        s.util[:] = 100.0  # spinning in the collective's kernel
        s.util[f.rank] = 0.0  # stuck outside it
        waiting = np.flatnonzero(np.arange(self.spec.ranks) != f.rank)
        for rank in waiting[np.argsort(arrival[waiting])]:
            self._polls_until(arrival[rank] + WAIT_REPORT_S)
            self.rec.add(
                arrival[rank] + WAIT_REPORT_S,
                self.step,
                "in_collective",
                WAIT_REPORT_S,
                np.array([rank]),
            )
        self._relaunch(self.now + f.hold_s, culprit=None)

    def _crash(self, f: Fault, s: StepState) -> None:
        """The leaking rank runs out of memory mid-step; its peers die of it."""
        s.mem[f.rank] = CAPACITY_GB
        self._relaunch(self.now + float(s.arrival()[f.rank]), culprit=f.rank)

    def _relaunch(self, at: float, culprit: int | None) -> None:
        self._polls_until(at)
        ranks = np.arange(self.spec.ranks)
        others = ranks if culprit is None else ranks[ranks != culprit]
        if culprit is not None:
            self.rec.add(at, self.step, "exit_code", 1.0, np.array([culprit]))
            self.rec.add(at, self.step, "collateral", 0.0, np.array([culprit]))
        died = at + float(self.rng.uniform(0.05, 1.0))
        self.rec.add(died, self.step, "exit_code", -9.0 if culprit is None else -6.0, others)
        self.rec.add(died, self.step, "collateral", 1.0, others)
        self.expired |= {i for i, f in enumerate(self.faults) if f.step <= self.step}
        self.now = died + float(self.rng.uniform(20.0, 60.0))
        self.step, self.since_launch = self.resume_from, 0
        self.physics.launch()
        self.rec.add(self.now, self.step, "launched", 1.0)
        self.next_poll = max(self.next_poll, self.now)


def _fills(f: Fault, step: int) -> bool:
    return f.kind == "memory_leak" and step >= f.step + int(f.size)


def _window(f: Fault, spec: FleetSpec) -> FaultWindow:
    if f.kind in ("slow_node", "nic_degradation"):
        subject = f"node:{node_name(f.node)}"
    elif f.kind == "loss_spike":
        subject = "job"
    else:
        subject = f"rank:{f.rank}"
    return FaultWindow(f.kind, subject, f.step, f.step + f.length - 1)
