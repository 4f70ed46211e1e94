"""The controller of one host's torchrun workers, in a thread of torchrun's process (the
``eagleeye`` rendezvous backend, ``eagleeye.torchrun``): ``eagleeye run``'s controller
driving ``ft_runtime.elastic.ElasticWorkers``."""

from __future__ import annotations

import logging
import os
import secrets
import socket
import threading

from collector.transport import TelemetryReceiver
from detectors.progress import ProgressStall
from eagleeye.config import ENV_CHECKPOINT_DIR, ENV_RUN_DIR, ENV_TELEMETRY, ENV_TELEMETRY_KEY
from eagleeye.console import LiveLog
from eagleeye.controller import Controller
from eagleeye.detection import live_detectors
from eagleeye.launch import detector_config, resume_env
from eagleeye.stacks import StackCapture
from eagleeye.store import RunStore, create_run_dir, new_run_id
from ft_runtime.elastic import ElasticWorkers
from remediation.policy import synchronous_restart_policy
from remediation.remediator import Remediator

log = logging.getLogger(__name__)


class HostWatch:
    """The controller of this host's workers, in a thread of the agent's process.

    Started once, at the first rendezvous: makes the run folder and store, receives the
    ranks' telemetry and puts its address and key into this process's environment, which
    the agent hands to every worker it starts.
    """

    def __init__(self, run_id: str, runs_dir: str, remediate: bool, telemetry_address: str) -> None:
        self.workers = ElasticWorkers(run_id)
        name = new_run_id(_run_name(f"{run_id}-{socket.gethostname()}"))
        self.run_dir = create_run_dir(runs_dir, name)
        self.store = RunStore(self.run_dir)
        key = secrets.token_hex(32)
        self.receiver = TelemetryReceiver(f"tcp://{telemetry_address}", key=key.encode())
        os.environ.update(
            {
                ENV_TELEMETRY: self.receiver.address,
                ENV_TELEMETRY_KEY: key,
                ENV_RUN_DIR: str(self.run_dir.resolve()),
                ENV_CHECKPOINT_DIR: str((self.run_dir / "checkpoints").resolve()),
            }
        )
        limits, fused = detector_config()  # $EAGLEEYE_DETECTORS_CONFIG, as for `eagleeye run`
        detectors = live_detectors(limits, fused)
        policy = synchronous_restart_policy()
        self.remediator = Remediator(policy, self.workers, dry_run=not remediate)
        self.store.set_meta("run_id", self.run_dir.name)
        self.store.set_meta(
            "config",
            {
                "launcher": "torchrun",
                "rdzv_id": run_id,
                "recovery": "job",
                "remediate": remediate,
                "policy": policy.name,
            },
        )
        self.controller = Controller(
            self.workers,
            self.receiver,
            self.store,
            detectors,
            self.remediator,
            on_update=LiveLog(),
            stacks=StackCapture(self.run_dir),
            progress=next((d for d in detectors if isinstance(d, ProgressStall)), None),
            run_dir=self.run_dir,
        )
        self.workers.attempt_env = resume_env(self.controller)
        self._thread = threading.Thread(target=self._run, name="eagleeye-watch", daemon=True)
        self._closed = False

    def start(self) -> None:
        log.info("eagleeye watches this host's workers; run folder %s", self.run_dir)
        self._thread.start()

    def _run(self) -> None:
        try:
            report = self.controller.run()
            self.store.set_meta(
                "result",
                {
                    "succeeded": report.succeeded,
                    "started": report.started,
                    "ended": report.ended,
                    "attempts": self.workers.attempt + 1,
                    "stopped_by": None,
                },
            )
        except Exception:
            log.exception("eagleeye's watch of the workers failed; training goes on")
        finally:
            self.receiver.close()
            self.store.close()

    def close(self) -> None:
        """The agent is done: the last exits are judged, the run's result recorded."""
        if self._closed:
            return
        self._closed = True
        self.workers.end()
        self._thread.join(timeout=30)


def _run_name(name: str) -> str:
    cleaned = "".join(c if c.isalnum() or c in "._-" else "-" for c in name)
    return cleaned[:96] or "torchrun"


__all__ = ["HostWatch"]
