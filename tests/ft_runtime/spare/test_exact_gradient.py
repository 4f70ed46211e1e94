"""SPARe keeps the exact gradient: real gloo processes, real SIGKILLs, parameters compared."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from ft_runtime.spare._model import reference_run
from ft_runtime.spare._worker import EXIT_WIPE_OUT
from ft_runtime.spare.harness import HarnessConfig, HarnessResult, run_spare

pytestmark = [pytest.mark.slow, pytest.mark.integration, pytest.mark.timeout(150)]

KILLS = ((2, 2), (5, 0))  # group 2 mid-step 2, group 0 mid-step 5: survivors 1 and 3


def _reference(cfg: HarnessConfig, drop: tuple[tuple[int, int], ...] = ()) -> np.ndarray:
    return reference_run(
        cfg.n_groups, cfg.steps, cfg.lr, cfg.seed, cfg.batch, cfg.dim, drop=drop
    ).numpy()


@pytest.fixture(scope="module")
def fault_free() -> HarnessResult:
    return run_spare(HarnessConfig())


@pytest.fixture(scope="module")
def with_kills() -> HarnessResult:
    return run_spare(HarnessConfig(kills=KILLS))


def test_fault_free_processes_match_the_single_process_reference(fault_free: HarnessResult) -> None:
    assert fault_free.survivors == (0, 1, 2, 3)
    np.testing.assert_allclose(fault_free.params, _reference(HarnessConfig()), rtol=0, atol=1e-12)


def test_killed_groups_leave_the_parameters_of_the_fault_free_run(
    fault_free: HarnessResult, with_kills: HarnessResult
) -> None:
    assert with_kills.survivors == (1, 3)
    assert with_kills.exit_codes[0][0] < 0  # SIGKILLed
    assert with_kills.exit_codes[0][2] < 0
    assert with_kills.wipe_outs == 0
    np.testing.assert_allclose(with_kills.params, fault_free.params, rtol=0, atol=1e-12)
    # Plain elastic DP (drop the dead group's shards, average the rest) ends elsewhere:
    # the tolerance above can tell the two apart.
    naive = _reference(HarnessConfig(), drop=KILLS)
    assert np.abs(naive - fault_free.params).max() > 1e-3


def test_the_controller_raised_the_stack_and_covered_every_shard(with_kills: HarnessResult) -> None:
    stacks = [p.stack for p in with_kills.plans]
    assert stacks == [1, 2, 2]
    for plan in with_kills.plans:
        assert sorted(t for ts in plan.computes.values() for t in ts) == [0, 1, 2, 3]
    assert sorted(with_kills.plans[-1].computes) == [1, 3]


def test_a_wipe_out_restarts_from_checkpoint_and_still_ends_exact(tmp_path: Path) -> None:
    # Groups 0 and 3 are the only holders of shard type 0 (offsets 0, 1).
    cfg = HarnessConfig(steps=5, kills=((1, 0), (2, 3)), ckpt_every=1)
    result = run_spare(cfg, ckpt_dir=tmp_path)
    assert result.wipe_outs == 1
    assert result.completed
    first, second = result.exit_codes
    assert {first[g] for g in (1, 2)} == {EXIT_WIPE_OUT}
    assert set(second.values()) == {0}
    assert result.survivors == (0, 1, 2, 3)  # the restart replaced the dead groups
    assert [p.stack for p in result.plans] == [1, 2, 1]  # S back to 1 after the restart
    np.testing.assert_allclose(result.params, _reference(cfg), rtol=0, atol=1e-12)
