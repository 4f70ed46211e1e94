"""The tiny model and data of the exact-gradient harness, shared by workers and the reference.

A two-layer tanh MLP in float64 on synthetic regression shards. Shard type ``t`` at step
``s`` is generated from a seed of its own, so any group that holds ``t`` can compute it.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch

HIDDEN = 16


def init_params(seed: int, dim: int) -> torch.Tensor:
    """The flat initial parameter vector: W1 (HIDDEN × dim), b1, W2 (HIDDEN), b2."""
    gen = torch.Generator().manual_seed(seed)
    n = HIDDEN * dim + HIDDEN + HIDDEN + 1
    return torch.randn(n, generator=gen, dtype=torch.float64) * 0.3


def shard_batch(seed: int, step: int, shard: int, batch: int, dim: int) -> tuple[torch.Tensor, ...]:
    """Inputs and targets of shard type ``shard`` at ``step``: the same in every process."""
    gen = torch.Generator().manual_seed(seed * 1_000_003 + step * 10_007 + shard)
    x = torch.randn(batch, dim, generator=gen, dtype=torch.float64)
    y = torch.sin(x.sum(dim=1, keepdim=True)) + 0.1 * shard
    return x, y


def shard_grad(
    params: torch.Tensor, seed: int, step: int, shard: int, batch: int, dim: int
) -> torch.Tensor:
    """Gradient of the mean squared error on one shard, as a flat vector."""
    p = params.detach().clone().requires_grad_(True)
    w1 = p[: HIDDEN * dim].view(HIDDEN, dim)
    b1 = p[HIDDEN * dim : HIDDEN * dim + HIDDEN]
    w2 = p[HIDDEN * dim + HIDDEN : HIDDEN * dim + 2 * HIDDEN].view(1, HIDDEN)
    b2 = p[-1]
    x, y = shard_batch(seed, step, shard, batch, dim)
    out = torch.tanh(x @ w1.T + b1) @ w2.T + b2
    loss = ((out - y) ** 2).mean()
    (grad,) = torch.autograd.grad(loss, p)
    return grad


def sum_grads(
    params: torch.Tensor, shards: Iterable[int], seed: int, step: int, batch: int, dim: int
) -> torch.Tensor:
    """Σ over ``shards`` of their gradients (zeros when there are none)."""
    total = torch.zeros_like(params)
    for t in shards:
        total += shard_grad(params, seed, step, t, batch, dim)
    return total


def reference_run(
    n_shards: int,
    steps: int,
    lr: float,
    seed: int,
    batch: int,
    dim: int,
    drop: Sequence[tuple[int, int]] = (),
) -> torch.Tensor:
    """Single-process synchronous SGD with ḡ = (1/N)·Σ_types g_type: the fault-free result.

    Args:
        drop: (from_step, shard) pairs whose gradient is left out from that step on, divided
            by the shards kept. That is what plain elastic data parallelism does when a
            group dies; tests use it to show the tolerance can tell the difference.
    """
    params = init_params(seed, dim)
    for step in range(steps):
        gone = {t for s, t in drop if s <= step}
        kept = [t for t in range(n_shards) if t not in gone]
        params = params - lr * sum_grads(params, kept, seed, step, batch, dim) / len(kept)
    return params
