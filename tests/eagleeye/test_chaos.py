"""Seeded chaos over real runs of `eagleeye run` (job mode with snapshot holders, and
replica mode): SIGKILL and SIGSTOP of ranks, holders, the quorum's store process and the
controller itself, pauses of each, two faults at once, a checkpoint folder on a full small
tmpfs, and forged or malformed messages on every endpoint (telemetry, holder RPC, the
Alertmanager webhook, the metrics server, the catch-up servers), in an order and at times
drawn from a seed (``tests/eagleeye/chaos_harness.py``, ``chaos_forgery.py``).

After each schedule: the job ended, succeeded or failed with its cause recorded (a run
whose controller was killed is resumed with ``eagleeye run --resume`` and must end); every
finding and action its controllers printed is in the store; the newest checkpoint written
is there; nothing was acted on a forged message, every endpoint still answers as it
should; no process of the job and no segment in /dev/shm is left.

The seed is printed and in the test id; replay one with ``EAGLEEYE_CHAOS_SEEDS=7`` (a list
``1,5,7`` or a range ``0-29``). The default runs 15 schedules, which draw every kind of
fault that 30 do.
"""

from __future__ import annotations

import os
import time
import warnings
from contextlib import suppress

import psutil
import pytest

from tests.eagleeye.chaos_harness import ChaosRun, Fault, Schedule, check_invariants, draw

pytestmark = [pytest.mark.slow, pytest.mark.integration, pytest.mark.timeout(600)]


def _seeds() -> list[int]:
    text = os.environ.get("EAGLEEYE_CHAOS_SEEDS", "0-14")
    seeds: list[int] = []
    for part in text.split(","):
        low, _, high = part.partition("-")
        seeds += range(int(low), int(high or low) + 1)
    return seeds


def test_schedules_are_drawn_from_the_seed_alone() -> None:
    assert [str(draw(s)) for s in range(30)] == [str(draw(s)) for s in range(30)]
    kinds = {f.kind for s in range(30) for f in draw(s).faults}
    assert {"kill_rank", "stop_rank", "kill_controller", "kill_store", "forge_holder"} <= kinds
    if "EAGLEEYE_CHAOS_SEEDS" not in os.environ:  # the default seeds miss no kind of fault
        assert {f.kind for s in _seeds() for f in draw(s).faults} == kinds
        assert {draw(s).mode for s in _seeds()} == {"job", "replica"}


# Faults of the hardening issue that a seed may not draw, as fixed schedules: the quorum's
# store process killed together with a rank (a traceback after 30 s, no finding or action
# recorded, before), and the controller of a replica-mode run killed (a run that could
# not be resumed and had no result, before).
NAMED = {
    "store-and-rank-killed-at-once": Schedule(
        -1, "replica", (Fault("kill_store", 0.5), Fault("kill_rank", 0.5, together=True)), False
    ),
    "replica-controller-killed": Schedule(-2, "replica", (Fault("kill_controller", 0.8),), False),
}


def _run(schedule: Schedule, root, replay: str) -> None:
    """Runs the schedule; one that breaks an invariant runs once more in a fresh folder
    and fails the test only if it breaks one again. A schedule's timing against a loaded
    machine varies from run to run: the first failure is printed (and warned) either way,
    so an intermittent one is seen without failing a build."""
    try:
        _run_once(schedule, root / "first", replay, "")
    except AssertionError as exc:
        warnings.warn(f"chaos {schedule}: failed once, run again: {str(exc)[:2000]}", stacklevel=1)
        _run_once(schedule, root / "again", replay, "-again")  # a job of its own


def _run_once(schedule: Schedule, root, replay: str, tag: str) -> None:
    root.mkdir()
    print(f"chaos {schedule} (replay: {replay})")
    run = ChaosRun(schedule, root, tag)
    started = time.monotonic()
    try:
        outcome = run.run()
        print(
            f"chaos seed {schedule.seed}: did {outcome.done}, skipped {outcome.skipped}, "
            f"{time.monotonic() - started:.1f} s"
        )
        try:
            check_invariants(outcome)  # before close(): it unmounts the tmpfs, continues stops
        except AssertionError as exc:
            print(f"chaos seed {schedule.seed} FAILED: {str(exc)[:4000]}")  # seen at once
            for proc in run.outcome.seen.values():  # nothing of it is left for the next
                with suppress(psutil.Error):
                    proc.kill()
            raise
    finally:
        run.close()


@pytest.mark.parametrize("name", sorted(NAMED))
def test_a_named_schedule_leaves_every_invariant_holding(tmp_path, name: str) -> None:
    _run(NAMED[name], tmp_path, f"-k {name}")


@pytest.mark.parametrize("seed", _seeds())
def test_a_seeded_schedule_of_faults_leaves_every_invariant_holding(tmp_path, seed: int) -> None:
    _run(draw(seed), tmp_path, f"EAGLEEYE_CHAOS_SEEDS={seed}")
