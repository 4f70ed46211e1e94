"""What the replica supervisor knows of each replica, in one frozen record.

>>> s = ReplicaState()
>>> s.relaunched().incarnation, s.relaunched().phase.value
(1, 'recovering')
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from ft_runtime.types import Phase


@dataclass(frozen=True, slots=True)
class ReplicaState:
    """One replica: the incarnation its ranks run as (0 at launch, one more for each
    relaunch), the restarts its budget has paid for, its lifecycle phase, and when it was
    dropped from the quorum (None while it is a member or on its way back): exits of its
    ranks after that are the collateral of the drop, not new failures."""

    incarnation: int = 0
    restarts: int = 0
    phase: Phase = Phase.LAUNCH
    dropped_at: float | None = None

    def with_phase(self, phase: Phase) -> ReplicaState:
        return dataclasses.replace(self, phase=phase)

    def dropped(self, when: float) -> ReplicaState:
        return dataclasses.replace(self, dropped_at=when)

    def relaunched(self, budgeted: bool = True) -> ReplicaState:
        """The next incarnation, on its way back (paid from the budget unless the whole
        job restarts, which gives every replica a fresh budget)."""
        return ReplicaState(
            self.incarnation + 1,
            self.restarts + 1 if budgeted else 0,
            Phase.RECOVERING,
            None,
        )
