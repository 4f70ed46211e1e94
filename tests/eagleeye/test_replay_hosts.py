"""`eagleeye eval trace FILE --hosts`: a labelled trace replayed through the agents' and
the controller's path. Every fault class of a generated trace (4 hosts of 8 ranks) is
found on its rank or node, as the controller would answer it; a trace whose nodes are not
blocks of ranks of one size is refused with the reason."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from detectors.errors import DetectorError
from detectors.eval.generators import Shape, make_trace
from detectors.eval.metrics import score_trace
from detectors.eval.trace import write_trace
from eagleeye.agents.replay import layout_of, run_trace_across_hosts
from eagleeye.cli import main

pytestmark = pytest.mark.slow  # a whole trace through every host's path: tens of seconds

CLASSES_ON_THE_HOSTS = {  # what the controller and the agents judge, not the forwarded rules
    "slow_rank",
    "slow_node",
    "dataloader_stall",
    "memory_leak",
    "nic_degradation",
    "thermal",
}


@pytest.fixture(scope="module")
def trace():
    return make_trace("default", Shape(4, 8, seed=12001))


def test_the_hosts_path_finds_and_places_each_fault(trace) -> None:
    emitted = run_trace_across_hosts(trace)
    result = score_trace(trace, emitted)
    by_kind = {m.window.kind: m for m in result.matches}
    assert set(by_kind) >= CLASSES_ON_THE_HOSTS
    for kind in CLASSES_ON_THE_HOSTS:
        assert by_kind[kind].found, kind
        assert by_kind[kind].localised, kind
    detectors = {e.finding.detector for e in emitted}
    assert "host:peer_outlier/quiet" in detectors  # the agents' judge
    assert "hosts:peer_outlier/quiet" in detectors  # the hosts compared on the controller


def test_eval_trace_hosts_writes_the_report(trace, tmp_path: Path, capsys) -> None:
    path = tmp_path / "t.parquet"
    write_trace(trace, path)
    assert main(["eval", "trace", str(path), "--hosts", "--json", str(tmp_path / "r.json")]) == 0
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["classes"]["slow_node"]["detected"] == 1
    assert "slow_node" in capsys.readouterr().out


def test_nodes_that_are_not_blocks_of_ranks_are_refused(trace) -> None:
    assert layout_of(trace)[0].nproc_per_node == 8
    shuffled = replace(trace, nodes=np.roll(trace.nodes, 3))
    with pytest.raises(DetectorError, match="blocks of one size per node"):
        layout_of(shuffled)
