"""How the simulated job's ranks and GPUs behave, healthy and faulty, one step at a time.

Healthy behaviour has its own structure, unlike an i.i.d. jitter: every GPU has a fixed
speed (a spread of a few per cent, a few GPUs markedly slower), a fixed temperature offset
(its place in the rack) under a slowly drifting room, and its own memory footprint; step
noise is heavy-tailed (Student's t, garbage-collection pauses, data-loader hiccups, power
brakes that dip the clock); every rank warms up after each launch at its own pace; every
``ckpt_every`` steps all ranks write a checkpoint.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from detectors.eval.fleet.plan import Fault, FleetSpec

CAPACITY_GB = 80.0
THERMAL_BIT, POWER_BRAKE_BIT = 0x40, 0x80  # NVML clock-event reasons


@dataclass(frozen=True)
class Traits:
    """What is fixed for a job: its hardware's spread and its workload's shape."""

    node_of: np.ndarray
    speed: np.ndarray  # compute-time factor per GPU
    warm_size: np.ndarray
    warm_pace: np.ndarray
    temp_offset: np.ndarray
    room_period: np.ndarray  # per node, seconds
    room_phase: np.ndarray
    clock_base: np.ndarray
    mem_base: np.ndarray  # GB
    data_median: np.ndarray  # seconds
    compute_s: float
    transfer_s: float
    ckpt_every: int
    ckpt_s: float
    poll_s: float
    step_bytes: float

    @classmethod
    def draw(cls, spec: FleetSpec, rng: np.random.Generator) -> Traits:
        n = spec.ranks
        speed = np.exp(rng.normal(0.0, 0.03, n))
        speed[rng.random(n) < 0.05] *= 1.06  # a few markedly slow GPUs, for ever
        compute = float(rng.uniform(1.0, 2.5))
        return cls(
            node_of=np.repeat(np.arange(spec.nodes), spec.gpus_per_node),
            speed=speed,
            warm_size=rng.uniform(0.2, 1.0, n),
            warm_pace=rng.uniform(2.0, 6.0, n),
            temp_offset=rng.uniform(-6.0, 8.0, n),
            room_period=rng.uniform(1800.0, 3600.0, spec.nodes),
            room_phase=rng.uniform(0.0, 2 * np.pi, spec.nodes),
            clock_base=1980.0 * (1.0 + rng.normal(0.0, 0.004, n)),
            mem_base=rng.uniform(58.0, 62.0) + rng.uniform(0.0, 2.0, n),
            data_median=compute * 0.02 * np.exp(rng.normal(0.0, 0.2, n)),
            compute_s=compute,
            transfer_s=compute * float(rng.uniform(0.1, 0.25)),
            ckpt_every=int(rng.integers(40, 71)),
            ckpt_s=float(rng.uniform(3.0, 8.0)),
            poll_s=float(rng.uniform(2.0, 6.0)),
            step_bytes=float(rng.uniform(1e9, 4e9)),
        )


@dataclass
class StepState:
    """One executed step: per-rank times (seconds) and the GPUs' state during it."""

    data: np.ndarray
    compute: np.ndarray
    transfer: float
    ckpt: np.ndarray | None
    loss: np.ndarray
    grad_norm: float
    temp: np.ndarray
    clock: np.ndarray
    throttle: np.ndarray
    mem: np.ndarray  # GB
    util: np.ndarray

    def arrival(self) -> np.ndarray:
        arrival: np.ndarray = self.data + self.compute
        return arrival


class Physics:
    """Draws each executed step from the traits, the time, and the faults in force."""

    def __init__(self, traits: Traits, rng: np.random.Generator) -> None:
        self.t, self.rng = traits, rng
        self.alloc = np.zeros(len(traits.speed))  # caching-allocator growth since launch

    def launch(self) -> None:
        """A (re)launch: memory is freed and grows again; the warm-up starts over."""
        self.alloc[:] = 0.0

    def step(self, step: int, since_launch: int, now: float, faults: Sequence[Fault]) -> StepState:
        t, rng = self.t, self.rng
        n = len(t.speed)
        warm = 1.0 + t.warm_size * np.exp(-since_launch / t.warm_pace)
        noise = 1.0 + 0.012 * rng.standard_t(3, n)
        gc = np.where(rng.random(n) < 0.002, 1.0 + rng.uniform(0.05, 0.3, n), 1.0)
        compute = t.compute_s * t.speed * warm * np.clip(noise, 0.9, None) * gc
        if since_launch == 0:  # compiling and loading before the first step
            compute += rng.uniform(20.0, 45.0) * rng.uniform(0.95, 1.05, n)
        data = t.data_median * rng.lognormal(0.0, 0.3, n)
        data *= np.where(rng.random(n) < 0.004, rng.uniform(4.0, 15.0, n), 1.0)
        transfer = t.transfer_s * (1.0 + 0.03 * rng.standard_normal())
        if since_launch < 8:
            self.alloc += np.where(rng.random(n) < 0.15, rng.uniform(0.2, 0.6, n), 0.0)
        ckpt = None
        if step % t.ckpt_every == t.ckpt_every - 1:
            ckpt = t.ckpt_s * rng.uniform(0.9, 1.1, n)
        state = StepState(
            data=data,
            compute=compute,
            transfer=transfer,
            ckpt=ckpt,
            loss=_loss(step) * (1.0 + 0.025 * rng.standard_t(4, n)),
            grad_norm=float((0.6 + 2.0 * np.exp(-step / 150.0)) * rng.lognormal(0.0, 0.1)),
            temp=np.zeros(n),
            clock=t.clock_base * (1.0 + 0.002 * rng.standard_normal(n)),
            throttle=np.zeros(n, dtype=np.int64),
            mem=t.mem_base + self.alloc + 0.03 * rng.standard_normal(n),
            util=np.clip(97.0 + rng.normal(0.0, 1.0, n), 0.0, 100.0),
        )
        brake = rng.random(n) < 0.003  # a healthy power-brake dip slows this step a little
        state.compute[brake] *= 1.03
        if ckpt is not None:
            state.mem += rng.uniform(0.5, 1.0)  # staging buffers while saving
        for fault in faults:
            _apply(fault, step, state, t, rng)
        room = 1.5 * np.sin(2 * np.pi * now / t.room_period + t.room_phase)[t.node_of]
        state.temp += 42.0 + t.temp_offset + 0.2 * state.util + room
        return state

    def scrape(self, s: StepState) -> StepState:
        """What one scrape reads of a step's GPUs: the step's state with the moment's own
        noise (a sensor's jitter, a power-brake dip of the clock)."""
        rng, n = self.rng, len(s.temp)
        brake = rng.random(n) < 0.003
        clock = s.clock * np.where(brake, 0.93, 1.0) * (1.0 + 0.001 * rng.standard_normal(n))
        return StepState(
            s.data,
            s.compute,
            s.transfer,
            s.ckpt,
            s.loss,
            s.grad_norm,
            temp=s.temp + rng.normal(0.0, 0.4, n),
            clock=clock,
            throttle=s.throttle | np.where(brake, POWER_BRAKE_BIT, 0),
            mem=s.mem + 0.02 * rng.standard_normal(n),
            util=np.clip(s.util + rng.normal(0.0, 0.5, n), 0.0, 100.0),
        )


def _loss(step: int) -> float:
    return 2.3 + 5.5 * float(np.exp(-step / 300.0))


def _apply(f: Fault, step: int, s: StepState, t: Traits, rng: np.random.Generator) -> None:
    """Changes a step's state by one fault in force (``f.covers(step)`` or a leak's ramp)."""
    k = step - f.step
    on_node = t.node_of == f.node
    if f.kind == "slow_rank":
        s.compute[f.rank] *= 1.0 + f.size
    elif f.kind == "slow_node":
        s.compute[on_node] *= 1.0 + f.size
    elif f.kind == "nic_degradation":
        s.transfer /= 1.0 - f.size  # the ring runs at its slowest link
    elif f.kind == "dataloader_stall":
        s.data[f.rank] += f.size * t.compute_s
        s.util[f.rank] /= 1.0 + f.size  # the GPU idles while the rank waits for data
    elif f.kind == "thermal":
        s.temp[f.rank] += (6.0 + 60.0 * f.size) * min(1.0, (k + 1) / 8.0)
        if k >= 4:  # the clock gives way once the GPU is hot
            s.clock[f.rank] *= 1.0 - f.size
            s.compute[f.rank] /= (1.0 - f.size) ** 0.85
            s.throttle[f.rank] |= THERMAL_BIT
    elif f.kind == "memory_leak":
        s.mem[f.rank] += (CAPACITY_GB - s.mem[f.rank]) * min(1.0, (k + 1) / f.size)
    elif f.kind == "loss_spike":
        factor = 1.0 + (f.size - 1.0) * 0.5**k
        s.loss *= factor
        s.grad_norm *= 1.0 + 3.0 * (factor - 1.0)
    elif f.kind == "nan":
        s.loss[f.rank] = np.nan
        s.grad_norm = np.nan  # the all-reduce hands it to every rank
