"""An agent's work on its host: start the host's ranks with torchrun's environment, watch
them, and do what the controller asks (launch, restart, kill, stop), reporting each rank's
launch and exit and each action's outcome. With sources configured, the host's sources
(``eagleeye.hostsources``: GPUs, kernel log, NCCL dumps, host counters) are read on their
period and their samples forwarded to the controller.

The ranks of node rank ``n`` of an ``nnodes × nproc_per_node`` job are its ranks
``n·nproc_per_node`` to ``(n+1)·nproc_per_node - 1``, with the controller's
``MASTER_ADDR``/``MASTER_PORT`` and attempt. Their output goes to
``<log_dir>/attempt-N/rank-R.log``.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from eagleeye.agents.link import AgentLink
from eagleeye.hostsources import HostSources, HostSourcesConfig
from ft_runtime.layout import JobLayout, RankSpec

log = logging.getLogger(__name__)
#: Host samples per message to the controller (well under the wire's 1 MiB).
CHUNK = 1000


@dataclass
class _Rank:
    spec: RankSpec
    proc: subprocess.Popen[bytes]
    attempt: int
    reported: bool = False


@dataclass
class HostAgent:
    """Runs ``command`` (after the interpreter) as this host's ranks of ``layout``.

    Args:
        link: the connection to the controller (started by ``run``).
        node_rank: the node rank this host runs (of the layout the controller sends).
        command: the rank's command line after ``python`` (``script.py args`` or
            ``-m module args``).
        log_dir: where each rank's output goes.
        run_id: the job's id (``TORCHELASTIC_RUN_ID``).
        env: added to every rank's environment (GLOO_SOCKET_IFNAME, ...).
        grace_s: how long a rank asked to stop may take before SIGKILL.
    """

    link: AgentLink
    node_rank: int
    command: Sequence[str]
    log_dir: Path
    run_id: str = "eagleeye"
    env: Mapping[str, str] = field(default_factory=dict)
    grace_s: float = 5.0
    layout: JobLayout = field(default_factory=JobLayout)  # the controller's, at launch
    _ranks: dict[int, _Rank] = field(default_factory=dict)
    stop_requested: bool = False  # a signal: end the ranks and leave
    sources: HostSourcesConfig | None = None  # this host's sources, read once launched
    _sources: HostSources | None = None

    @property
    def specs(self) -> list[RankSpec]:
        return [s for s in self.layout.ranks() if s.node_rank == self.node_rank]

    def run(self, until_s: float = float("inf")) -> int:
        """Serves the controller until it says ``stop`` (0) or the time is up (1)."""
        deadline = time.monotonic() + until_s
        while time.monotonic() < deadline and not self.stop_requested:
            for message in self.link.take():
                if message.kind == "stop":
                    self.stop_all()
                    self._forward()
                    self._close_sources()
                    self.link.report("outcome", {"action": "stop", "status": "done"})
                    return 0
                self._act(message.kind, message.body)
            self._watch()
            self._forward()
            time.sleep(0.05)
        self.stop_all()
        self._close_sources()
        if self.stop_requested:
            self.link.report("outcome", {"action": "stop", "status": "stopped by a signal"})
        return 1

    def _act(self, kind: str, body: Mapping[str, Any]) -> None:
        if kind in ("launch", "restart"):
            self.stop_all()
            self.layout = JobLayout(int(body["nnodes"]), int(body["nproc_per_node"]))
            self._open_sources()
            self._launch(int(body["attempt"]), str(body["master_addr"]), int(body["master_port"]))
            status = "done"
        elif kind == "kill":
            status = self._signal(int(body["rank"]), signal.SIGKILL)
        elif kind == "drain":
            self.stop_all()
            status = "done"
        else:
            status = "unknown action"
        self.link.report("outcome", {"action": kind, "status": status, **dict(body)})

    def _launch(self, attempt: int, master_addr: str, master_port: int) -> None:
        folder = self.log_dir / f"attempt-{attempt}"
        folder.mkdir(parents=True, exist_ok=True)
        for spec in self.specs:
            env = {
                **os.environ,
                **self.layout.environment(spec, master_addr, master_port, attempt, self.run_id),
                **self.env,
            }
            with (folder / f"rank-{spec.rank}.log").open("wb") as out:
                proc = subprocess.Popen(
                    [sys.executable, *self.command],
                    env=env,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            self._ranks[spec.rank] = _Rank(spec, proc, attempt)
            self.link.report("launched", {"rank": spec.rank, "pid": proc.pid, "attempt": attempt})

    def _open_sources(self) -> None:
        """This host's sources, for its node of the layout (once: the layout is fixed)."""
        if self.sources is None or self._sources is not None or not self.sources.any:
            return
        node = f"node{self.node_rank}"
        self._sources = HostSources(self.sources, self.layout, nodes=[node]).__enter__()

    def _forward(self) -> None:
        """The host's samples to the controller, in messages of at most ``CHUNK``."""
        if self._sources is None:
            return
        samples = self._sources.take()
        for start in range(0, len(samples), CHUNK):
            rows = [s.to_json() for s in samples[start : start + CHUNK]]
            self.link.report("samples", {"samples": rows})

    def _close_sources(self) -> None:
        if self._sources is not None:
            self._sources.close()
            self._sources = None

    def _watch(self) -> None:
        for rank in self._ranks.values():
            code = rank.proc.poll()
            if code is not None and not rank.reported:
                rank.reported = True
                body = {"rank": rank.spec.rank, "code": code, "attempt": rank.attempt}
                self.link.report("exit", body)

    def _signal(self, rank: int, sig: signal.Signals) -> str:
        held = self._ranks.get(rank)
        if held is None or held.proc.poll() is not None:
            return f"rank {rank} is not running here"
        held.proc.send_signal(sig)
        return "done"

    def stop_all(self) -> None:
        """Ends every rank: stopped ones continued, SIGTERM, SIGKILL after the grace."""
        live = [r for r in self._ranks.values() if r.proc.poll() is None]
        for rank in live:
            for sig in (signal.SIGCONT, signal.SIGTERM):
                try:
                    os.killpg(rank.proc.pid, sig)
                except ProcessLookupError:
                    pass
        deadline = time.monotonic() + self.grace_s
        for rank in live:
            try:
                rank.proc.wait(timeout=max(deadline - time.monotonic(), 0.0))
            except subprocess.TimeoutExpired:
                try:
                    os.killpg(rank.proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                rank.proc.wait()
        for rank in live:
            rank.reported = True  # an exit the agent caused is no failure to report
        self._ranks.clear()


__all__ = ["HostAgent"]
