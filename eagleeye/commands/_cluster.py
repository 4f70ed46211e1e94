"""What `eagleeye controller` and `eagleeye agent` share: the secret and heartbeat flags,
and one JSON line per event on stdout."""

from __future__ import annotations

import argparse
import json
from collections.abc import Mapping
from dataclasses import fields, is_dataclass

from eagleeye.commands._args import seconds

CLUSTER_DOC = """`eagleeye controller` and `eagleeye agent`: one job across hosts.

The controller listens on an explicit address for the agents (one per host, one node
rank each), authenticated by the job's shared secret from a file; it launches the job
through them, answers its findings with the remediation policy (with --remediate: a
failed rank restarts the job on every host, a fatal GPU error evicts its host; without,
the actions are recorded as a dry run), finds a lost host from its agent's silence on
the controller's clock, and records everything in the run store; --metrics-port serves
its exporter and --webhook Alertmanager's alerts, placed on the agent of their host. Each
agent starts its host's ranks with torchrun's environment, keeps their telemetry on its
host and sends the controller one summary per step (the host's statistics and the ranks
that stand out). An agent started with --spare instead of --node-rank runs nothing until
a lost or evicted host's node rank is given to it (the job then restarts on the new set
of hosts; the replaced host is fenced, and a lost host's agent, its ranks ended, joins
again as a spare when its link comes back; an evicted host's agent ends, and the host
comes back only as a spare started with --readmit, once its hardware is checked). Both
print one JSON line per event on stdout.
SIGTERM or SIGINT to either stops the job on every host and records why; with
--grace-period the loops (under --recovery replica, the replicas, through the checkpoint
command) are asked for a checkpoint first. With --recovery replica
--replicas N the job is N replicas training through the replica library: a failed rank,
a lost host or an evicted one costs only its replicas, restarted (a lost or evicted
host's on a spare) and caught up from a healthy replica while the others train on
(docs/multihost.md). A job's controller
that is killed never ends the ranks: the agents keep them training and wait for it;
started again with the same command line (the same --runs-dir and --run-id), it goes on
with the run in its store and adopts the running ranks. Under --recovery replica the
quorum's store runs in a process of its own on the controller's host, which outlives the
controller: a controller started again on the same host reconnects to it (on another
host, or with that host lost, the restart is refused and the job must start anew).
"""
"""The help page of both commands."""


def add_common(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--secret-file",
        required=True,
        metavar="FILE",
        help="the job's shared secret (16 bytes or more); every message carries its HMAC",
    )
    p.add_argument(
        "--heartbeat",
        type=seconds,
        default=1.0,
        metavar="S",
        help="the agents' heartbeat period; 3 missed periods lose a host (default: 1)",
    )


def show(item: object) -> None:
    """One JSON line per event, finding and report."""
    to_json = getattr(item, "to_json", None)
    if to_json is not None:
        data = to_json()
    elif is_dataclass(item) and not isinstance(item, type):
        data = {f.name: getattr(item, f.name) for f in fields(item)}
    else:
        data = dict(item) if isinstance(item, dict) else {}
    line = json.dumps({"type": type(item).__name__, **data}, default=_plain)
    print(line, flush=True)


def _plain(value: object) -> object:
    if isinstance(value, Mapping):
        return dict(value)
    return str(value)
