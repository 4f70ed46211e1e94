"""The facade a training loop uses: telemetry hook, checkpoints and fault injection.

``eagleeye.init()`` reads what the launcher put in the environment and returns a
``RankSession``. Outside `eagleeye run` it still works: telemetry goes nowhere and
checkpoints go to ``./checkpoints``.

Under `eagleeye run` the rank's interpreter may already report through the zero-code
telemetry (``eagleeye.boot``): the session then shares its hook, and the steps the loop
reports replace the ones found automatically, so nothing is counted twice.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from contextlib import AbstractContextManager
from typing import Any

from eagleeye.config import ENV_CHECKPOINT_DIR, ENV_CHECKPOINT_KEEP
from eagleeye.snapshots import RankSnapshots
from eagleeye.stackdump import enable_stack_dumps
from eagleeye.stopping import EVENT_LISTENING, CheckpointRequest
from eagleeye.telemetry import RankTelemetry, rank_labels, shared_telemetry
from ft_runtime.checkpoint import DiskCheckpointer, SavedCheckpoint
from ft_runtime.faults import EVENT_INJECTOR_ARMED, FaultInjector, FaultSpec
from ft_runtime.layout import ENV_ATTEMPT, ENV_NODE, ENV_REPLICA


class RankSession:
    """One rank's connection to Eagle Eye. Its hook methods never raise into the loop."""

    def __init__(self, env: Mapping[str, str] | None = None) -> None:
        env = os.environ if env is None else env
        self.rank = int(env.get("RANK", 0))
        self.world_size = int(env.get("WORLD_SIZE", 1))
        self.local_rank = int(env.get("LOCAL_RANK", 0))
        self.replica = int(env.get(ENV_REPLICA, 0))
        self.node = env.get(ENV_NODE, "node0")
        self.attempt = int(env.get(ENV_ATTEMPT, 0))
        labels = rank_labels(env)
        shared = shared_telemetry()
        self._owned = shared is None
        telemetry = shared if shared is not None else RankTelemetry.from_env(env, labels)
        self._publisher = telemetry.publisher
        self.hook = telemetry.hook
        enable_stack_dumps(env, self.rank, self.attempt)
        self.faults = FaultInjector.from_env(
            self.rank, self.attempt, self._announce_fault, armed=self._announce_armed
        )
        self.checkpoints = DiskCheckpointer(
            env.get(ENV_CHECKPOINT_DIR, "checkpoints"),
            self.rank,
            self.world_size,
            barrier=_barrier_if_distributed,
            keep=int(env.get(ENV_CHECKPOINT_KEEP, 2)),
        )
        self._stop_request = CheckpointRequest(env)
        self._listening = False
        # with snapshot holders (`eagleeye run` with snapshots on), checkpoints go to memory
        self.snapshots = RankSnapshots.from_env(
            env, self.node, self.local_rank, int(env.get("LOCAL_WORLD_SIZE", 1))
        )

    # ---- telemetry, delegated to the hook -----------------------------------------------
    def step_start(self, step: int) -> None:
        self.hook.step_start(step)

    def step_end(self, step: int | None = None, **metrics: float) -> None:
        self.hook.step_end(step, **metrics)

    def section(self, name: str) -> AbstractContextManager[None]:
        return self.hook.section(name)

    def collective(
        self, op: str, nbytes: int = 0, group: str = "world"
    ) -> AbstractContextManager[None]:
        return self.hook.collective(op, nbytes, group)

    def pause(self, name: str) -> AbstractContextManager[None]:
        """Declares a pause (``with ee.pause("eval"):``): no step completes while it lasts,
        and the hang detector does not take that for a hang."""
        return self.hook.pause(name)

    def begin_pause(self, name: str) -> None:
        """Starts a declared pause (for code that cannot use ``with``)."""
        self.hook.begin_pause(name)

    def end_pause(self, name: str) -> None:
        """Ends a declared pause."""
        self.hook.end_pause(name)

    def instrument_collectives(self) -> AbstractContextManager[None]:
        """Times every torch.distributed collective issued while the context is open."""
        from collector.instrument import instrument_collectives

        return instrument_collectives(self.hook)

    # ---- framework callbacks (optional extras) ------------------------------------------
    def lightning_callback(self, **options: Any) -> Any:
        """A PyTorch Lightning ``Callback`` reporting each optimizer step to this session
        (extra ``lightning``; options as ``collector.frameworks.lightning_callback``)."""
        from collector.frameworks import lightning_callback

        return lightning_callback(self.hook, **options)

    def hf_callback(self) -> Any:
        """A Hugging Face ``TrainerCallback`` reporting each optimizer step to this session
        (extra ``hf``)."""
        from collector.frameworks import hf_callback

        return hf_callback(self.hook)

    # ---- checkpoints --------------------------------------------------------------------
    def checkpoint_requested(self) -> bool:
        """Whether `eagleeye run` is stopping the job with a grace period and asks for a
        checkpoint now: save (``save_checkpoint``) and end the loop. Cheap at every step.
        Every rank of a job answers True at the same step (the one reported last by
        ``step_start`` or the zero-code telemetry), so ranks in lockstep leave together."""
        if not self._listening:
            self._listening = True  # the supervisor waits for this rank's save from now on
            self.hook.event(EVENT_LISTENING, 0.0)
        return self._stop_request.requested(self.hook.step)

    def save_checkpoint(self, state: Mapping[str, Any], step: int) -> None:
        """Saves synchronously and reports it; the checkpoint error propagates (it is the
        loop's decision whether to go on without a checkpoint). With snapshot holders the
        save is a copy into the node's holder instead, and a failed one is reported, not
        raised (the holder keeps the previous snapshot)."""
        with self.hook.pause("checkpoint"):
            if self.snapshots is not None:
                self._snapshot(state, step)
                return
            self.report_saved(self.checkpoints.save(state, step), step)

    def report_saved(self, saved: SavedCheckpoint, step: int) -> None:
        """Reports a checkpoint written to disk (the store's checkpoints table)."""
        self.hook.event(
            "event.checkpoint",
            float(step),
            tier="disk",
            path=saved.path,
            bytes=str(saved.nbytes),
            seconds=f"{saved.seconds:.6f}",
        )

    def load_checkpoint(
        self, like: Mapping[str, Any] | None = None
    ) -> tuple[int, dict[str, Any]] | None:
        """The newest intact checkpoint as (step, state), or None to start fresh.

        ``like``: the state it will be loaded into; a checkpoint whose tensors differ from
        it in shape or dtype is refused. Raises CheckpointsUnusable when checkpoints exist
        but none can be loaded: starting fresh would silently lose the run's progress.
        """
        if self.snapshots is not None:
            return self._restore_snapshot(self.snapshots)
        restored = self.checkpoints.load(like=like)
        if restored is not None:
            self.hook.event("event.restore", float(restored[0]), tier="disk")
        return restored

    def _snapshot(self, state: Mapping[str, Any], step: int) -> None:
        assert self.snapshots is not None
        saved = self.snapshots.save(state, step)
        labels = {"bytes": str(saved.nbytes), "seconds": f"{saved.seconds:.6f}"}
        if not saved.ok:
            labels["error"] = saved.error[:200]
        self.hook.event("event.checkpoint", float(step), tier="memory", **labels)

    def _restore_snapshot(self, snapshots: RankSnapshots) -> tuple[int, dict[str, Any]] | None:
        """The newest snapshot, memory first; the restore's tier and time are reported."""
        got = snapshots.load()
        if got is None:
            return None
        self.hook.event(
            "event.restore", float(got.step), tier=got.tier, seconds=f"{got.seconds:.6f}"
        )
        return got.step, got.state

    def close(self) -> None:
        # Training is over: the time until the process exits is no step's silence.
        self.hook.event("closing")
        if self.snapshots is not None:
            self.snapshots.close()
        if not self._owned:  # the zero-code telemetry closes it when the script ends
            self.hook.flush()
            return
        self.hook.close()
        if self._publisher is not None:
            self._publisher.close()

    def __enter__(self) -> RankSession:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _announce_armed(self) -> None:
        # Sent before any step of the loop: the supervisor sees it before a fault's step.
        self.hook.event(EVENT_INJECTOR_ARMED, 0.0)

    def _announce_fault(self, spec: FaultSpec) -> None:
        # A kill follows at once: hand the record to the transport before returning.
        self.hook.event("event.fault", float(spec.step), kind=spec.kind, spec=str(spec))
        self.hook.flush(timeout_s=1.0)
        if spec.kind in ("kill", "stop"):
            import time

            time.sleep(0.05)  # let ZeroMQ's I/O thread put it on the wire


def _barrier_if_distributed() -> None:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.barrier()


def init(env: Mapping[str, str] | None = None) -> RankSession:
    """Connects this rank to Eagle Eye from the launcher's environment."""
    return RankSession(env)


__all__ = ["RankSession", "init"]
