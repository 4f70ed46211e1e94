"""The controller's tick survives an exception in any stage: recorded, and the loop goes on."""

from __future__ import annotations

import pytest

from collector.transport import TelemetryReceiver
from eagleeye.controller import Controller
from eagleeye.store import RunReader, RunStore
from ft_runtime.layout import JobLayout
from ft_runtime.supervisor import JobSupervisor, LaunchSpec
from ft_runtime.types import LifecycleEvent
from remediation.policy import synchronous_restart_policy
from remediation.remediator import Remediator


class FlakySupervisor(JobSupervisor):
    """A real supervisor whose first polls fail, as a bug in any stage would."""

    failures = 3

    def poll(self) -> list[LifecycleEvent]:
        if self.failures:
            self.failures -= 1
            raise RuntimeError("poll broke")
        return super().poll()


@pytest.mark.timeout(60)
def test_a_failing_stage_is_recorded_and_the_loop_goes_on(tmp_path) -> None:
    launch = LaunchSpec(["-c", "import time; time.sleep(0.5)"], JobLayout(), "r", str(tmp_path))
    supervisor = FlakySupervisor(launch)
    receiver = TelemetryReceiver()
    store = RunStore(tmp_path)
    remediator = Remediator(synchronous_restart_policy(), supervisor)
    try:
        report = Controller(supervisor, receiver, store, [], remediator).run()
    finally:
        receiver.close()
        store.close()
    assert report.succeeded
    with RunReader(tmp_path) as reader:
        events = reader.events()
    failures = events[events["subject"] == "controller"]
    assert [d["count"] for d in failures["detail"]] == [1, 2]  # the 3rd is only counted
    assert failures["detail"].iloc[0]["error"] == "RuntimeError: poll broke"
    assert "succeeded" in set(events["phase"])
