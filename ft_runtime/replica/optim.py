"""``OptimizerWrapper``: an optimizer whose ``step()`` applies only what the replicas agreed.

``zero_grad()`` begins the step (the first one joins the quorum, catching up if this
replica was relaunched); ``step()`` flattens the gradients, averages them across the
replicas through the manager's fault-tolerant all-reduce (a replica that just caught up
sends zeros), scales the learning rate while replicas are missing, applies the average and
commits. The same ``apply`` trains and replays a peer's logged steps, so a joiner ends
bitwise equal to its source.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from ft_runtime.replica.manager import Manager

__all__ = ["OptimizerWrapper"]


class OptimizerWrapper:
    """Wraps ``optimizer`` so that it trains through ``manager``.

    Args:
        manager: the rank's replica manager.
        optimizer: any ``torch.optim.Optimizer``; its learning rates are the schedule's
            (the wrapper scales them for one step and puts them back).
    """

    def __init__(self, manager: Manager, optimizer: torch.optim.Optimizer) -> None:
        self.manager = manager
        self.optimizer = optimizer
        self.params = [p for group in optimizer.param_groups for p in group["params"]]
        manager.set_apply(self._apply)
        self.last_lr = 0.0

    # the optimizer's own interface, passed through
    @property
    def param_groups(self) -> list[dict[str, Any]]:
        return self.optimizer.param_groups

    @property
    def state(self) -> Any:
        return self.optimizer.state

    def state_dict(self) -> dict[str, Any]:
        return self.optimizer.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.optimizer.load_state_dict(state)

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Begins a step: clears the gradients (the first call joins the quorum)."""
        self.manager.begin_step()
        self.optimizer.zero_grad(set_to_none=set_to_none)

    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        """Averages the gradients across replicas and applies them once the replica
        committed. A ``closure`` (as ``torch.optim`` takes it: it computes the loss and the
        gradients) runs first, and its loss is returned; without one, True (a step that
        cannot commit raises ``LeftQuorum``, and the rank restarts and catches up)."""
        loss: Any = True
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        flat = torch.cat(
            [
                (p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1)
                for p in self.params
            ]
        )
        result = self.manager.allreduce(flat)
        lr = float(self.optimizer.param_groups[0]["lr"]) * result.lr_scale
        self._apply(flat, lr)
        self.manager.commit(flat, lr)
        return loss

    def _apply(self, flat: torch.Tensor, lr: float) -> None:
        """One optimizer step from an averaged flat gradient at learning rate ``lr`` (the
        first group's; the others keep their ratio to it)."""
        offset = 0
        for p in self.params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            p.grad.copy_(flat[offset : offset + p.numel()].view_as(p))
            offset += p.numel()
        groups = self.optimizer.param_groups
        base = [float(g["lr"]) for g in groups]
        ratio = lr / base[0] if base[0] else 1.0
        for index, (group, rate) in enumerate(zip(groups, base, strict=True)):
            group["lr"] = lr if index == 0 or not base[0] else rate * ratio
        try:
            self.optimizer.step()
        finally:
            for group, rate in zip(groups, base, strict=True):
                group["lr"] = rate
        self.last_lr = lr
