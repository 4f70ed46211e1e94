"""A small real training loop checkpointing every step, for the SIGKILL tests.

Run as a process: ``python -m tests.ft_runtime.ckpt._trainer RING NODE STEPS OUT
[--kill-at STEP --kill-when during|after]``. It resumes from whatever the engine restores,
prints ``resumed <step>`` and finally writes its state with torch.save to OUT.
"""

from __future__ import annotations

import argparse
import os
import signal
from datetime import timedelta
from typing import Any

import torch
from torch import nn

from ft_runtime.ckpt import CheckpointClient, ClientConfig, Ring


def build() -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 256), nn.ReLU(), nn.Dropout(0.1), nn.Linear(256, 32))
    return model, torch.optim.Adam(model.parameters(), lr=1e-3)


def train_step(model: nn.Module, opt: torch.optim.Optimizer, step: int) -> None:
    g = torch.Generator().manual_seed(1000 + step)  # the data position decides the batch
    x, y = torch.randn(64, 32, generator=g), torch.randn(64, 32, generator=g)
    opt.zero_grad()
    nn.functional.mse_loss(model(x), y).backward()  # dropout draws from the global RNG
    opt.step()


def snapshot(model: nn.Module, opt: torch.optim.Optimizer, step: int) -> dict[str, Any]:
    return {
        "model": model.state_dict(),
        "optim": opt.state_dict(),
        "rng": torch.get_rng_state(),
        "step": step,
        "data": {"position": step + 1},
    }


def restore(model: nn.Module, opt: torch.optim.Optimizer, state: dict[str, Any]) -> int:
    model.load_state_dict(state["model"])
    opt.load_state_dict(state["optim"])
    torch.set_rng_state(state["rng"])
    return int(state["data"]["position"])


def reference(steps: int) -> dict[str, Any]:
    """The state after ``steps`` uninterrupted steps."""
    model, opt = build()
    for step in range(1, steps + 1):
        train_step(model, opt, step)
    return snapshot(model, opt, steps)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("ring")
    ap.add_argument("node")
    ap.add_argument("steps", type=int)
    ap.add_argument("out")
    ap.add_argument("--kill-at", type=int, default=-1)
    ap.add_argument("--kill-when", choices=["during", "after"], default="after")
    a = ap.parse_args()
    ring = Ring(tuple(tuple(p.split("=", 1)) for p in a.ring.split(",")))  # type: ignore[misc]
    model, opt = build()
    step_now = {"step": 0}

    def hook(i: int) -> None:  # SIGKILL ourselves halfway through copying the snapshot
        if a.kill_when == "during" and step_now["step"] == a.kill_at and i == 2:
            os.kill(os.getpid(), signal.SIGKILL)

    client = CheckpointClient(ClientConfig(a.node, ring, timeout=timedelta(seconds=5)), hook)
    got = client.load()
    start = restore(model, opt, got.state) if got is not None else 1
    print(f"resumed {start - 1} {got.tier.value if got else 'none'}", flush=True)
    for step in range(start, a.steps + 1):
        train_step(model, opt, step)
        step_now["step"] = step
        assert client.save(snapshot(model, opt, step), step).ok
        if a.kill_when == "after" and step == a.kill_at:
            os.kill(os.getpid(), signal.SIGKILL)
    torch.save(snapshot(model, opt, a.steps), a.out)


if __name__ == "__main__":
    main()
