"""The two trace generators behind one call, so every evaluation can use either.

``default`` is detectors.eval.generate (independent draws per step around per-rank
offsets); ``fleet`` is detectors.eval.fleet (an event simulation of a synchronous job and
of what its sources report). They share no code and were designed apart; tuning on one
and reporting on the other is the cross-generator check (detectors.eval.protocol).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType

from detectors.eval.fleet import FLEET_FAULTS, FleetSpec, simulate
from detectors.eval.generate import FAULT_KINDS, TraceSpec, generate
from detectors.eval.trace import Trace


@dataclass(frozen=True)
class Shape:
    """What to generate: the job's layout, a seed, faults or none, a healthy length."""

    nodes: int
    ranks_per_node: int
    seed: int
    healthy: bool = False
    steps: int = 400


def _default(shape: Shape) -> Trace:
    faults = () if shape.healthy else FAULT_KINDS
    return generate(
        TraceSpec(
            shape.nodes, shape.ranks_per_node, faults=faults, steps=shape.steps, seed=shape.seed
        )
    )


def _fleet(shape: Shape) -> Trace:
    faults: Sequence[str] = () if shape.healthy else FLEET_FAULTS
    return simulate(
        FleetSpec(
            shape.nodes, shape.ranks_per_node, faults=faults, steps=shape.steps, seed=shape.seed
        )
    )


GENERATORS: Mapping[str, Callable[[Shape], Trace]] = MappingProxyType(
    {"default": _default, "fleet": _fleet}
)


def make_trace(generator: str, shape: Shape) -> Trace:
    """A trace of the named generator.

    Raises:
        ValueError: the generator is unknown.
    """
    try:
        make = GENERATORS[generator]
    except KeyError:
        known = ", ".join(GENERATORS)
        raise ValueError(f"unknown generator {generator!r}; known: {known}") from None
    return make(shape)
