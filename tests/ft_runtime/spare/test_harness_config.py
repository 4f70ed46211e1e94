from __future__ import annotations

import pytest

from ft_runtime.spare._model import reference_run
from ft_runtime.spare.harness import HarnessConfig


def test_kills_must_name_distinct_groups_and_steps_in_range() -> None:
    with pytest.raises(ValueError, match="distinct groups"):
        HarnessConfig(kills=((1, 2), (3, 2)))
    with pytest.raises(ValueError, match="distinct groups"):
        HarnessConfig(kills=((1, 4),))
    with pytest.raises(ValueError, match="kill steps must be distinct"):
        HarnessConfig(steps=3, kills=((3, 1),))
    with pytest.raises(ValueError, match="kill steps must be distinct"):
        HarnessConfig(kills=((2, 1), (2, 3)))
    with pytest.raises(ValueError, match="ckpt_every"):
        HarnessConfig(ckpt_every=0)


def test_reference_is_deterministic_and_depends_on_every_shard() -> None:
    a = reference_run(4, 3, 0.1, 0, 8, 4)
    b = reference_run(4, 3, 0.1, 0, 8, 4)
    c = reference_run(4, 3, 0.1, 0, 8, 4, drop=((0, 3),))
    assert bool((a == b).all())
    assert float((a - c).abs().max()) > 1e-4
