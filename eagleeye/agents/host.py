"""An agent's work on its host: start the host's ranks with torchrun's environment, watch
them, and do what the controller asks (launch, restart, kill, stop, checkpoint before a
stop, and read its ranks' stacks when the controller judges a hang), reporting each rank's
launch and exit and each action's outcome. With snapshots
on, the host's snapshot holder (``eagleeye.agents.snapshots``) runs beside its ranks and
backs up to another host's. The ranks'
telemetry comes to the agent (``HostTelemetry``): kept raw on the host, sent to the
controller as one summary per step, their events as they are. With sources configured,
the host's sources (``eagleeye.hostsources``: GPUs, kernel log, NCCL dumps, host
counters) are read on their period and their samples forwarded to the controller.

The ranks of node rank ``n`` of an ``nnodes × nproc_per_node`` job are its ranks
``n·nproc_per_node`` to ``(n+1)·nproc_per_node - 1``, with the controller's
``MASTER_ADDR``/``MASTER_PORT`` and attempt. Their output goes to
``<log_dir>/attempt-N/rank-R.log``. A spare host's agent starts with no node rank (-1)
and runs nothing until a launch names its node rank. A ``stop`` that says the host is
fenced (lost or evicted, its node rank given to a spare) or the agent refused ends the
ranks all the same, and says why (``ended_by``); when it names an agent to ``rejoin``
as (a lost host's, the job going on), the agent, its ranks ended, joins again as that
spare on a new link instead of ending. An evicted host's stop (``evicted``: suspected
hardware) ends the agent with what to do: check the host, then readmit it as a spare.
A leaving agent (a signal) whose node rank the controller gave to a spare is told it was
``drained``: it ends its ranks and ends; its host may join again as a spare.

The agent tells its link what it runs (``AgentLink.declare``: the attempt, each rank's
pid, the exit code of each that ended), which a controller that asks for a hello again
(restarted from its run store) adopts. A controller that went away never ends the ranks:
they train on, their exits are kept for the controller's return; once every rank ended
and the controller stayed unreachable ``controller_wait_s``, the agent ends (status 3).
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from collector.types import Sample
from detectors.errors import DetectorError
from detectors.progress import HangLimits
from eagleeye.agents.hangstacks import STACKS, StackRequest, answer
from eagleeye.agents.hostjudge import HOST_FINDINGS, HostJudge
from eagleeye.agents.link import AgentLink
from eagleeye.agents.ranktelemetry import HostTelemetry
from eagleeye.agents.snapshots import HostHolder
from eagleeye.agents.stopped import StopLooks
from eagleeye.agents.waits import RankProgress
from eagleeye.config import ENV_CHECKPOINT_DIR, ENV_RUN_DIR
from eagleeye.errors import EagleEyeError
from eagleeye.hostsources import HostSources, HostSourcesConfig
from eagleeye.stopping import REQUEST, request_checkpoint
from ft_runtime._children import die_with_parent
from ft_runtime.errors import CheckpointError
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
    ended_at: float | None = None  # time.monotonic() when its process ended (its waiter's)

    def __post_init__(self) -> None:
        name = f"wait-rank-{self.spec.rank}"
        threading.Thread(target=self._wait, daemon=True, name=name).start()

    def _wait(self) -> None:
        """Notes the moment the process ends, so exits seen in one look are reported in
        the order they happened (a killed rank before the peers its loss ended)."""
        self.proc.wait()
        self.ended_at = time.monotonic()


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
    stop_requested: str | None = None  # a signal's name: end the ranks and leave
    grace_period_s: float = 0.0  # on a signal: how long the controller has to checkpoint
    sources: HostSourcesConfig | None = None  # this host's sources, read once launched
    _sources: HostSources | None = None
    telemetry: HostTelemetry | None = None  # the ranks' telemetry, from the first launch
    holder_at: str = ""  # where this host's snapshot holder listens (declared in the hello)
    holder_token: str = ""  # the job's holder token (from its shared secret)
    _holder: HostHolder | None = None  # started at the first launch with snapshots on
    ended_by: str | None = None  # why the controller put this agent out (fenced, refused)
    on_rejoin: Callable[[str], None] = lambda line: None  # fenced, joined again as a spare
    _looks: StopLooks = field(default_factory=StopLooks)  # the ranks' processes, each tick
    _proc_samples: list[Sample] = field(default_factory=list)  # stops seen, to forward
    controller_wait_s: float = 300.0  # ranks all ended, no controller this long: the agent ends
    _attempt: int | None = None  # the attempt its ranks run
    _progress: RankProgress | None = None  # its ranks' progress, when the launch asks for it
    replica_env: Mapping[str, str] = field(default_factory=dict)  # this host's, for replicas
    # started by `eagleeye run --local-agents` on the controller's machine: a rank's given
    # environment and command line win over the agent's own, and its ranks die with it
    local: bool = False

    @property
    def specs(self) -> list[RankSpec]:
        return [s for s in self.layout.ranks() if s.node_rank == self.node_rank]

    def run(self, until_s: float = float("inf")) -> int:
        """Serves the controller until it says ``stop`` (0), the time is up (1) or a
        signal asked the agent to leave (1). On a signal the agent tells the controller
        why it leaves and, given a grace period, serves it that long more: the controller
        asks every host for a checkpoint at one step, then says ``stop``."""
        deadline = time.monotonic() + until_s
        leave_by: float | None = None
        while time.monotonic() < deadline:
            if self.stop_requested is not None and leave_by is None:
                body = {"cause": self.stop_requested, "grace_s": self.grace_period_s}
                self.link.report("leaving", body)
                leave_by = time.monotonic() + self.grace_period_s
            if leave_by is not None and time.monotonic() >= leave_by:
                break
            for message in self.link.take():
                if message.kind == "stop":
                    self.stop_all(float(message.body.get("grace_s", self.grace_s)))
                    self._forward()
                    self._close()
                    self.link.report("outcome", {"action": "stop", "status": "done"})
                    rejoin = message.body.get("rejoin")
                    if "fenced" in message.body and isinstance(rejoin, str) and rejoin:
                        self._rejoin(rejoin, str(message.body["fenced"]))
                        break  # what else came on the fenced link is not for the spare
                    return self._stopped(message.body)
                if message.kind == STACKS:
                    self._stacks(message.body)
                    continue
                self._act(message.kind, message.body)
            self._watch()
            self._forward()
            if self._orphaned():
                return 3
            time.sleep(0.05)
        self.stop_all()
        self._forward()
        self._close()
        if self.stop_requested is not None:
            status = f"stopped by {self.stop_requested}"
            self.link.report("outcome", {"action": "stop", "status": status})
        return 1

    def _orphaned(self) -> bool:
        """Whether every rank ended and the controller stayed away ``controller_wait_s``:
        the job ended on this host with nobody to tell (logged; the agent ends)."""
        if not self._ranks or any(r.proc.poll() is None for r in self._ranks.values()):
            return False
        away = self.link.unreachable_s()
        if away < self.controller_wait_s:
            return False
        codes = {r.spec.rank: r.proc.returncode for r in self._ranks.values()}
        self.ended_by = (
            f"the controller stayed unreachable for {away:.0f} s and every rank of this host "
            f"ended (attempt {self._attempt}, exit codes {codes}); nobody was told"
        )
        self._close()
        return True

    def _declare(self) -> None:
        """Tells the link what runs here (said in a hello again)."""
        ranks = [
            {
                "rank": r.spec.rank,
                "pid": r.proc.pid,
                "code": r.proc.returncode,
                "attempt": r.attempt,  # a replica job's ranks each have their own
            }
            for r in list(self._ranks.values())
        ]
        self.link.declare(resume={"attempt": self._attempt, "ranks": ranks})

    def _rejoin(self, agent: str, why: str) -> None:
        """Fenced with its ranks ended (``stop_all`` waited for each): joins the job again
        as the spare ``agent`` on a new link (a new session, no node rank), saying it was
        ``rejoined_from`` its old name with its ranks ended. The old link is closed."""
        old = self.link
        self.link = old.rejoin(agent, rejoined_from=old.agent, ranks_ended=True).start()
        old.close()
        self.node_rank = -1
        self.on_rejoin(
            f"fenced by the controller ({why}); its ranks ended; joined again as the spare {agent}"
        )

    def _stopped(self, body: Mapping[str, Any]) -> int:
        """The exit status of a ``stop``: 0, or 2 when the controller refused this agent
        (a spare where none is taken); a fenced host's agent ends as told (0)."""
        if "refused" in body:
            self.ended_by = f"refused by the controller: {body['refused']}"
            return 2
        if "fenced" in body and body.get("evicted") is True:
            self.ended_by = (
                f"evicted by the controller ({body['fenced']}); its ranks ended; this host "
                "stays out of the job: once its hardware is checked, readmit it as a spare "
                "with eagleeye agent --spare --readmit"
            )
        elif "fenced" in body:
            self.ended_by = f"fenced by the controller ({body['fenced']}); its ranks ended"
        elif "drained" in body:  # it left on a signal; a spare took its node rank
            self.ended_by = f"drained by the controller ({body['drained']}); its ranks ended"
        return 0

    def _act(self, kind: str, body: Mapping[str, Any]) -> None:
        if kind in ("launch", "restart"):
            self.stop_all()
            self.node_rank = int(body.get("node_rank", self.node_rank))  # a spare's, given
            self.layout = JobLayout(int(body["nnodes"]), int(body["nproc_per_node"]))
            self._open_sources()
            self._open_holder(body.get("snapshots"))
            self._launch(int(body["attempt"]), str(body["master_addr"]), int(body["master_port"]))
            self._follow_progress(body.get("progress"))
            status = "done"
        elif kind == "start_rank":  # replica recovery: one rank, its environment given
            status = self._start_rank(body)
            body = {k: v for k, v in body.items() if k != "env"}
        elif kind == "signal":
            status = self._signal(int(body["rank"]), signal.Signals(int(body["sig"])))
        elif kind == "stop_ranks":
            self.stop_ranks([int(r) for r in body.get("ranks", [])], float(body["grace_s"]))
            status = "done"
        elif kind == "kill":
            status = self._signal(int(body["rank"]), signal.SIGKILL)
        elif kind == "drain":
            self.stop_all()
            status = "done"
        elif kind == "checkpoint":  # read by the ranks' ee.checkpoint_requested()
            step = body.get("step")
            at_step = step if isinstance(step, int) and not isinstance(step, bool) else None
            request_checkpoint(self.log_dir.resolve(), str(body.get("cause", "")), at_step)
            status = "done"
        else:
            status = "unknown action"
        self.link.report("outcome", {"action": kind, "status": status, **dict(body)})

    def _stacks(self, body: Mapping[str, Any]) -> None:
        """The controller judged a hang: this host's ranks' stacks, read at once and
        answered one message per rank (``eagleeye.agents.hangstacks``), before whatever
        the controller sends next (a restart) is taken. A request that breaks the schema
        is refused, said in an outcome, and nothing is read."""
        try:
            request = StackRequest.parse(body)
        except ValueError as exc:
            log.warning("refused the controller's stacks request: %s", exc)
            self.link.report("outcome", {"action": STACKS, "status": f"refused: {exc}"})
            return
        live = {r: held.proc.pid for r, held in self._ranks.items() if held.proc.poll() is None}
        ranks = [spec.rank for spec in self.specs] if self.node_rank >= 0 else []
        run_dir = self.log_dir.resolve()
        for reply in answer(request, ranks, live, run_dir, self.link.host):
            self.link.report(STACKS, reply)

    def _launch(self, attempt: int, master_addr: str, master_port: int) -> None:
        folder = self.log_dir / f"attempt-{attempt}"
        folder.mkdir(parents=True, exist_ok=True)
        (self.log_dir / REQUEST).unlink(missing_ok=True)  # an earlier stop's request
        if self.telemetry is None:
            self.telemetry = HostTelemetry(self.log_dir, judge=HostJudge())
        self.telemetry.expect(spec.rank for spec in self.specs)
        run_dir = self.log_dir.resolve()
        ours = {
            **self.telemetry.env,
            **(self._holder.env if self._holder is not None else {}),
            ENV_RUN_DIR: str(run_dir),  # where a graceful stop's checkpoint request goes
            # a shared folder when the agent's environment names one (rank 0's manifest
            # then covers every rank), else this host's own
            ENV_CHECKPOINT_DIR: os.environ.get(ENV_CHECKPOINT_DIR, str(run_dir / "checkpoints")),
        }
        for spec in self.specs:
            env = {
                **os.environ,
                **self.layout.environment(spec, master_addr, master_port, attempt, self.run_id),
                **ours,
                **self.env,
            }
            with (folder / f"rank-{spec.rank}.log").open("wb") as out:
                proc = subprocess.Popen(
                    [sys.executable, *self.command],
                    env=env,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                    preexec_fn=die_with_parent(signal.SIGKILL),  # no rank outlives its agent
                )
            self._ranks[spec.rank] = _Rank(spec, proc, attempt)
            self.link.report("launched", {"rank": spec.rank, "pid": proc.pid, "attempt": attempt})
        self._attempt = attempt
        self.link.declare(node_rank=self.node_rank)  # a spare's, given by its launch
        self._declare()

    def _follow_progress(self, limits: object) -> None:
        """The launch's hang limits (``--recovery job``): its ranks' progress is followed,
        and reported when the host stalls (``eagleeye.agents.waits``)."""
        self._progress = None
        if not isinstance(limits, Mapping) or self._attempt is None:
            return
        try:
            given = HangLimits.from_mapping({str(k): float(v) for k, v in limits.items()})
        except (TypeError, ValueError, DetectorError) as exc:
            log.warning("no progress reports: the launch's hang limits %r: %s", limits, exc)
            return
        ranks = [spec.rank for spec in self.specs]
        self._progress = RankProgress(
            f"node{self.node_rank}", self._attempt, ranks, given, time.time()
        )

    def _start_rank(self, body: Mapping[str, Any]) -> str:
        """One rank of a replica job (``eagleeye.agents.replicas``): the controller gives
        its variables (torchrun's, its replica's, the quorum's address); the agent adds
        its host's (``replica_env``: the quorum's secret and the catch-up token, derived
        from the job's secret, and the address its catch-up server binds). A rank still
        running under that number is ended first. Its output goes to
        ``<log_dir>/replica-R-I/rank-N.log``."""
        rank, generation = int(body["rank"]), int(body["generation"])
        self.node_rank = int(body.get("node_rank", self.node_rank))  # a spare's, given
        self.layout = JobLayout(
            int(body["nnodes"]), int(body["nproc_per_node"]), int(body.get("replicas", 1))
        )
        if rank in self._ranks:
            self.stop_ranks([rank], 0.0)
        self._open_sources()
        if self.telemetry is None and not self.local:  # a local rank's goes to the run
            self.telemetry = HostTelemetry(self.log_dir, judge=HostJudge())
        if self.telemetry is not None:
            self.telemetry.expect([*self._ranks, rank])
        given = Path(str(body.get("log", f"replica-{generation}/rank-{rank}.log")))
        folder = self.log_dir / given.parent.name  # names only: nothing outside log_dir
        folder.mkdir(parents=True, exist_ok=True)
        run_dir = self.log_dir.resolve()
        given_env = {str(k): str(v) for k, v in dict(body.get("env", {})).items()}
        env = {
            **os.environ,
            **({} if self.local else given_env),
            **(self.telemetry.env if self.telemetry is not None else {}),
            ENV_RUN_DIR: str(run_dir),
            ENV_CHECKPOINT_DIR: os.environ.get(ENV_CHECKPOINT_DIR, str(run_dir / "checkpoints")),
            **self.replica_env,
            **self.env,
            **(given_env if self.local else {}),  # the run's telemetry, run folder, secrets
        }
        argv = [sys.executable, *self.command]
        if self.local and isinstance(body.get("argv"), list):  # a restart's resume flags
            argv = [str(a) for a in body["argv"]]
        try:
            with (folder / given.name).open("wb") as out:
                proc = subprocess.Popen(
                    argv,
                    env=env,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                    preexec_fn=die_with_parent(signal.SIGKILL),  # no rank outlives its agent
                )
        except OSError as exc:
            return f"failed: {exc}"
        self._ranks[rank] = _Rank(self.layout.rank(rank), proc, generation)
        self.link.report("launched", {"rank": rank, "pid": proc.pid, "attempt": generation})
        self.link.declare(node_rank=self.node_rank)  # a spare's, given by its start
        self._declare()
        return "done"

    def _open_holder(self, ring: object) -> None:
        """This host's snapshot holder in the controller's ring (once: it outlives the
        job's restarts). One that cannot start is reported, and the ranks save without.
        A later launch whose ring changed (a spare host took another node's place) is told
        to the running holder, which keeps what it holds."""
        if not isinstance(ring, str) or not ring:
            return
        if self._holder is not None:
            try:
                if self._holder.update(ring):
                    self.link.report("outcome", {"action": "snapshot ring", "status": "done"})
            except EagleEyeError as exc:
                log.error("%s", exc)
                self.link.report("outcome", {"action": "snapshot ring", "status": f"failed: {exc}"})
            return
        try:
            holder = HostHolder(
                ring,
                self.node_rank,
                self.holder_at,
                self.run_id,
                (self.log_dir / "snapshots").resolve(),
                self.holder_token,
                self.layout,
            )
            self._holder = holder.__enter__()
            status = "done"
        except (EagleEyeError, CheckpointError) as exc:
            log.error("this host's snapshot holder did not start: %s", exc)
            status = f"failed: {exc}"
        self.link.report("outcome", {"action": "snapshots", "status": status})

    def _open_sources(self) -> None:
        """This host's sources, for its node of the layout (once: the layout is fixed)."""
        if self.sources is None or self._sources is not None or not self.sources.any:
            return
        node = f"node{self.node_rank}"
        self._sources = HostSources(self.sources, self.layout, nodes=[node]).__enter__()

    def _forward(self) -> None:
        """To the controller: the host's samples and the ranks' events, in messages of at
        most ``CHUNK`` samples, and one summary per step of the ranks' telemetry."""
        if self._sources is not None:
            self._send("samples", self._sources.take())
        if self._proc_samples:
            self._send("samples", self._proc_samples)
            self._proc_samples = []
        if self.telemetry is not None:
            summaries, events = self.telemetry.take()
            self._send("events", events)
            for summary in summaries:
                self.link.summary(summary)
            self._send_findings()
            if self._progress is not None:
                now = time.time()
                self._progress.observe(self.telemetry.marks, now)
                live = {
                    r: held.proc.pid for r, held in self._ranks.items() if held.proc.poll() is None
                }
                self._send("progress", self._progress.report(now, live, live))

    def _send_findings(self) -> None:
        """What the host's judge of its ranks found (``HostJudge``), one report per
        attempt, for the controller to check and answer."""
        assert self.telemetry is not None
        found, self.telemetry.steps.findings = self.telemetry.steps.findings, []
        for attempt in sorted({a for a, _ in found}):
            rows = [f.to_json() for a, f in found if a == attempt]
            for start in range(0, len(rows), CHUNK):
                body = {"attempt": attempt, "findings": rows[start : start + CHUNK]}
                self.link.report(HOST_FINDINGS, body)

    def _send(self, kind: str, samples: Sequence[Sample]) -> None:
        for start in range(0, len(samples), CHUNK):
            rows = [s.to_json() for s in samples[start : start + CHUNK]]
            self.link.report(kind, {"samples": rows})

    def _close(self) -> None:
        if self._sources is not None:
            self._sources.close()
            self._sources = None
        if self.telemetry is not None:
            self.telemetry.close()
            self.telemetry = None
        if self._holder is not None:
            self._holder.__exit__(None, None, None)
            self._holder = None

    def _watch(self) -> None:
        live: dict[int, tuple[int, int]] = {}
        ended: list[_Rank] = []
        for rank in self._ranks.values():
            if rank.proc.poll() is None:
                live[rank.spec.rank] = (rank.proc.pid, rank.attempt)
            elif not rank.reported:
                ended.append(rank)
        now = time.monotonic()
        for rank in sorted(ended, key=lambda r: now if r.ended_at is None else r.ended_at):
            rank.reported = True
            body = {"rank": rank.spec.rank, "code": rank.proc.returncode, "attempt": rank.attempt}
            body["ended_s_ago"] = round(now - (now if rank.ended_at is None else rank.ended_at), 4)
            self._declare()
            self.link.report("exit", body)
        node = f"node{self.node_rank}"
        self._proc_samples += self._looks.look(live, node, time.time())

    def _signal(self, rank: int, sig: signal.Signals) -> str:
        held = self._ranks.get(rank)
        if held is None or held.proc.poll() is not None:
            return f"rank {rank} is not running here"
        held.proc.send_signal(sig)
        return "done"

    def stop_all(self, grace_s: float | None = None) -> None:
        """Ends every rank: stopped ones continued, SIGTERM, SIGKILL after the grace
        (``grace_s``, the agent's own by default)."""
        self.stop_ranks(list(self._ranks), grace_s)
        self._ranks.clear()
        self._declare()

    def stop_ranks(self, ranks: Sequence[int], grace_s: float | None = None) -> None:
        """Ends these ranks as ``stop_all`` does; their exits are not reported (the
        controller asked for them)."""
        chosen = [self._ranks[r] for r in ranks if r in self._ranks]
        live = [r for r in chosen if r.proc.poll() is None]
        for rank in live:
            for sig in (signal.SIGCONT, signal.SIGTERM):
                try:
                    os.killpg(rank.proc.pid, sig)
                except ProcessLookupError:
                    pass
        deadline = time.monotonic() + (self.grace_s if grace_s is None else grace_s)
        for rank in live:
            try:
                rank.proc.wait(timeout=max(deadline - time.monotonic(), 0.0))
            except subprocess.TimeoutExpired:
                try:
                    os.killpg(rank.proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                rank.proc.wait()
        for rank in chosen:
            rank.reported = True  # an exit the agent caused is no failure to report


__all__ = ["HostAgent"]
