"""Where a report that names a host belongs in a job across hosts.

An Alertmanager alert on a DCGM metric names its host by dcgm-exporter's ``Hostname``
and its GPU by ``gpu``. The host is an agent's (the name it declared when it joined), the
GPU that of one of the agent's ranks (its ``CUDA_VISIBLE_DEVICES`` order, by index or
UUID): the alert lands on that rank, or on the agent's node when no rank uses the GPU. A
host no agent of the job runs on is left as it is (the controller records it and does not
act on it), and so is a host whose node rank a spare took (a lost or evicted host: its
later alerts are not the spare's).
"""

from __future__ import annotations

from collector.types import Subject
from eagleeye.agents.membership import AgentState
from eagleeye.hostsources import HostPlaces
from ft_runtime.layout import JobLayout


class AgentPlaces:
    """The agents' hosts, as their alerts name them (thread-safe: ``admit`` on the
    controller's thread, ``locate`` on the webhook's).

    >>> places = AgentPlaces(JobLayout(2, 2))
    >>> b = AgentState("b-1", "host-b", 1, b"b", 0.0, 0.0, info={"visible_devices": "3,2"})
    >>> places.admit(b)
    >>> places.locate(Subject(node="host-b"), "2")
    Subject(replica=0, rank=3, node='node1')
    >>> places.locate(Subject(node="host-b"), None)
    Subject(replica=None, rank=None, node='node1')
    >>> places.locate(Subject(node="host-z"), "0")
    Subject(replica=None, rank=None, node='host-z')
    >>> places.admit(AgentState("d-1", "host-d", 1, b"d", 0.0, 0.0))  # a spare took node 1
    >>> places.locate(Subject(node="host-b"), "2")
    Subject(replica=None, rank=None, node='host-b')
    """

    def __init__(self, layout: JobLayout) -> None:
        self.layout = layout
        self._holders: dict[int, AgentState] = {}  # node rank -> its agent, as admitted
        self._hosts: dict[str, HostPlaces] = {}

    def admit(self, agent: AgentState) -> None:
        """An agent holds its node rank (it joined, or a spare was given a lost or
        evicted host's): its host's name now places reports on that node's ranks, and the
        name of the host it replaces no longer does."""
        self._holders.pop(agent.node_rank, None)
        self._holders[agent.node_rank] = agent
        by_host: dict[str, list[int]] = {}
        for node_rank, holder in self._holders.items():
            by_host.setdefault(holder.host, []).append(node_rank)
        hosts = {}
        for host, node_ranks in by_host.items():  # a host may hold several nodes of the job
            ranks = [spec for spec in self.layout.ranks() if spec.node_rank in node_ranks]
            visible = self._holders[node_ranks[-1]].info.get("visible_devices")
            hosts[host] = HostPlaces(host, ranks, None if visible is None else str(visible))
        self._hosts = hosts  # one reference swap

    def locate(self, subject: Subject, gpu: str | None) -> Subject:
        """``subject``, placed on the job's rank or node when it names an agent's host."""
        places = self._hosts.get(subject.node or "")
        return subject if places is None else places.locate(subject, gpu)


__all__ = ["AgentPlaces"]
