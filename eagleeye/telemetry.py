"""A rank's telemetry connection, light enough for the zero-code boot to load before the
script (no torch): the hook, its publisher, the labels of every sample, and the one
connection a booted process shares with the sessions its script opens."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from collector.hooks import TrainingHook
from collector.transport import TelemetryPublisher
from eagleeye.config import ENV_TELEMETRY, ENV_TELEMETRY_KEY
from ft_runtime.layout import ENV_ATTEMPT, ENV_NODE, ENV_REPLICA


@dataclass(frozen=True, slots=True)
class RankTelemetry:
    """A rank's hook and the publisher it sends through (None: telemetry goes nowhere)."""

    hook: TrainingHook
    publisher: TelemetryPublisher | None

    @classmethod
    def from_env(cls, env: Mapping[str, str], labels: Mapping[str, str]) -> RankTelemetry:
        address = env.get(ENV_TELEMETRY)
        key = telemetry_key(env)
        publisher = TelemetryPublisher(address, key=key) if address else None
        send = publisher.send if publisher else (lambda labels, rows: True)
        return cls(TrainingHook(send, labels), publisher)

    def close(self) -> None:
        self.hook.close()
        if self.publisher is not None:
            self.publisher.close()


def telemetry_key(env: Mapping[str, str]) -> bytes | None:
    """The job's telemetry key from the launcher's environment (None: unsigned)."""
    text = env.get(ENV_TELEMETRY_KEY)
    return text.encode() if text else None


class _Process:
    """The telemetry of this process when the zero-code boot set it up."""

    telemetry: RankTelemetry | None = None


_PROCESS = _Process()


def share_telemetry(telemetry: RankTelemetry | None) -> None:
    """Makes ``telemetry`` the one every session of this process reports through (the
    zero-code boot calls it); None stops sharing."""
    _PROCESS.telemetry = telemetry


def shared_telemetry() -> RankTelemetry | None:
    """The telemetry the zero-code boot shares, if it runs this process."""
    return _PROCESS.telemetry


def rank_labels(env: Mapping[str, str]) -> dict[str, str]:
    """The labels of every sample of this rank, from the launcher's environment."""
    return {
        "rank": str(int(env.get("RANK", 0))),
        "replica": str(int(env.get(ENV_REPLICA, 0))),
        "node": env.get(ENV_NODE, "node0"),
        "attempt": str(int(env.get(ENV_ATTEMPT, 0))),
    }
