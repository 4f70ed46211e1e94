"""Eagle Eye under stock ``torchrun``: the ``eagleeye`` rendezvous backend.

Users who keep ``torchrun`` get detection and job restarts by naming this backend::

    torchrun --nnodes 2 --nproc-per-node 8 --rdzv-backend eagleeye \\
        --rdzv-endpoint host0:29400 --rdzv-id job1 \\
        --rdzv-conf eagleeye_runs_dir=/shared/runs,eagleeye_remediate=1 \\
        -m eagleeye.boot train.py --its-flags

The package registers it under torchrun's ``torchrun.handlers`` entry point. The
rendezvous itself is torch's own (the c10d dynamic rendezvous, with every option torch
documents for it); around it, in each host's agent process, Eagle Eye runs the same
controller as ``eagleeye run``: the ranks' telemetry (from ``-m eagleeye.boot``, the hook
or both) on loopback with the run's key, the live detectors, hang evidence from the
workers' process states and stacks, and the remediation policy, everything recorded in
a run store per host (``RUNS_DIR/RDZV_ID-HOSTNAME-TIME-XXXX``, a run like any other).

What it can do to the job is what a rendezvous backend may: ask for a new rendezvous
round, which makes every host's agent stop its workers and start them again (a restart
that torchrun does not count against ``--max-restarts``). Failed workers are restarted
by torchrun itself. Remediation is a dry run unless ``eagleeye_remediate=1`` is given.

Keys of ``--rdzv-conf`` read here (the others go to torch's c10d rendezvous):

- ``eagleeye_runs_dir``: where the run folder is made (default ``runs``).
- ``eagleeye_remediate``: ``1`` to act; by default findings are recorded and actions
  only decided (dry run).
- ``eagleeye_telemetry_address``: the address the ranks' telemetry is received on
  (default ``127.0.0.1``; the ranks are on this host).
"""

from __future__ import annotations

import atexit
import dataclasses
import logging
import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from eagleeye.errors import EagleEyeError
from ft_runtime.layout import ENV_NODE, ENV_RESUME_FROM

if TYPE_CHECKING:
    from eagleeye.hostwatch import HostWatch

log = logging.getLogger(__name__)

BACKEND = "eagleeye"
_CONF_PREFIX = "eagleeye_"
_OWN_STORE_PER_ROUND = "TORCH_DISABLE_SHARE_RDZV_TCP_STORE"


@dataclasses.dataclass(frozen=True, slots=True)
class BackendOptions:
    """Eagle Eye's keys of ``--rdzv-conf``."""

    runs_dir: str = "runs"
    remediate: bool = False
    telemetry_address: str = "127.0.0.1"

    @classmethod
    def from_conf(cls, conf: dict[str, Any]) -> BackendOptions:
        known = {f"{_CONF_PREFIX}{f.name}" for f in dataclasses.fields(cls)}
        unknown = sorted(k for k in conf if k.startswith(_CONF_PREFIX) and k not in known)
        if unknown:
            raise EagleEyeError(
                f"unknown --rdzv-conf keys {unknown}; Eagle Eye reads {sorted(known)}"
            )
        remediate = str(conf.get(f"{_CONF_PREFIX}remediate", "0")).strip().lower()
        if remediate not in ("0", "1", "true", "false", "yes", "no"):
            raise EagleEyeError(
                f"--rdzv-conf eagleeye_remediate={remediate!r}: give 1 (act) or 0 (dry run)"
            )
        defaults = cls()
        return cls(
            runs_dir=str(conf.get(f"{_CONF_PREFIX}runs_dir", defaults.runs_dir)),
            remediate=remediate in ("1", "true", "yes"),
            telemetry_address=str(
                conf.get(f"{_CONF_PREFIX}telemetry_address", defaults.telemetry_address)
            ),
        )


class EagleEyeRendezvous:
    """torch's dynamic rendezvous, watched: each round starts a new attempt of the run, a
    restart Eagle Eye asks for shows as a waiting node.

    Args:
        delegate: torch's rendezvous handler.
        start_watch: makes the host's watch (at the first round).
    """

    def __init__(self, delegate: Any, start_watch: Callable[[], HostWatch]) -> None:
        self._delegate = delegate
        self._start_watch = start_watch
        self._watch: HostWatch | None = None

    def get_backend(self) -> str:
        return BACKEND

    @property
    def use_agent_store(self) -> bool:
        return bool(self._delegate.use_agent_store)

    def next_rendezvous(self) -> Any:
        if self._watch is None:
            self._watch = self._start_watch()
            atexit.register(self._watch.close)  # torchrun ended by a signal skips shutdown()
            self._watch.start()
        info = self._delegate.next_rendezvous()
        group_rank = info[1] if isinstance(info, tuple) else info.rank
        node = f"node{group_rank}"
        # the agent starts this round's workers after we return, with this environment
        os.environ[ENV_NODE] = node
        os.environ.pop(ENV_RESUME_FROM, None)
        os.environ.update(self._watch.workers.begin_round(node))
        return info

    def is_closed(self) -> bool:
        return bool(self._delegate.is_closed())

    def set_closed(self) -> None:
        self._delegate.set_closed()

    def num_nodes_waiting(self) -> int:
        """Nodes waiting for the next round; one more when Eagle Eye asked for a restart.
        The agent stops its workers next: a stopped one is continued so it can end."""
        waiting = int(self._delegate.num_nodes_waiting())
        if self._watch is None:
            return waiting
        if self._watch.workers.restart_requested:
            waiting = max(waiting, 1)
        if waiting:
            self._watch.workers.continue_stopped()
        return waiting

    def get_run_id(self) -> str:
        return str(self._delegate.get_run_id())

    def shutdown(self) -> bool:
        try:
            return bool(self._delegate.shutdown())
        finally:
            if self._watch is not None:
                self._watch.close()


def create_handler(params: Any) -> Any:
    """torchrun's handler for ``--rdzv-backend eagleeye`` (torch's c10d rendezvous,
    watched). Raises EagleEyeError on a bad Eagle Eye key of ``--rdzv-conf``."""
    from torch.distributed.elastic.rendezvous import RendezvousHandler, RendezvousParameters
    from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import create_backend
    from torch.distributed.elastic.rendezvous.dynamic_rendezvous import (
        create_handler as dynamic_handler,
    )

    options = BackendOptions.from_conf(dict(params.config))
    # A store of each round's own, hosted by its rank 0 on a new port: with the agents'
    # shared store, a round after a restart that torchrun does not count reads the keys
    # the previous round's workers left (gloo addresses of dead processes) and hangs.
    os.environ[_OWN_STORE_PER_ROUND] = "1"
    torch_conf = {k: v for k, v in params.config.items() if not k.startswith(_CONF_PREFIX)}
    c10d_params = RendezvousParameters(
        "c10d",
        params.endpoint,
        params.run_id,
        params.min_nodes,
        params.max_nodes,
        params.local_addr,
        **torch_conf,
    )
    backend, store = create_backend(c10d_params)
    delegate = dynamic_handler(store, backend, c10d_params)
    handler = EagleEyeRendezvous(delegate, lambda: _host_watch(params.run_id, options))
    RendezvousHandler.register(EagleEyeRendezvous)  # an ABC: torch checks nothing more
    return handler


def rendezvous_handlers() -> Callable[[Any], Any]:
    """The ``torchrun.handlers`` entry point: torch calls it for the handler's creator."""
    return create_handler


def _host_watch(run_id: str, options: BackendOptions) -> HostWatch:
    # the controller's modules load at the first round, not when torch lists its backends
    from eagleeye.hostwatch import HostWatch

    return HostWatch(run_id, options.runs_dir, options.remediate, options.telemetry_address)


__all__ = ["BACKEND", "BackendOptions", "EagleEyeRendezvous", "create_handler"]
