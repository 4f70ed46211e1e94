from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from collector.aggregate import StepAggregator
from collector.hooks import TrainingHook
from collector.instrument import instrument_collectives
from collector.types import Frame, Subject


@pytest.fixture
def process_group(tmp_path):
    store = dist.FileStore(str(tmp_path / "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def test_real_collectives_are_timed_with_op_bytes_and_sequence(process_group) -> None:
    batches = []
    hook = TrainingHook(lambda labels, rows: batches.append(rows) or True, {"rank": "0"})
    original = dist.all_reduce
    with instrument_collectives(hook):
        hook.step_start(0)
        tensor = torch.ones(256)
        dist.all_reduce(tensor)
        work = dist.all_reduce(tensor, async_op=True)
        work.wait()
        dist.barrier()
        hook.step_end(0)
    assert dist.all_reduce is original  # restored on exit
    hook.close()
    rows = [row for batch in batches for row in batch if row[0] == "collective"]
    assert [(r[4]["op"], r[4]["bytes"], r[4]["seq"]) for r in rows] == [
        ("all_reduce", "1024", "0"),
        ("all_reduce", "1024", "1"),
        ("barrier", "0", "2"),
    ]
    assert all(r[1] >= 0 for r in rows)
    assert torch.equal(tensor, torch.ones(256))  # the collective itself is unchanged


def test_a_failing_collective_still_raises_its_own_error(process_group) -> None:
    hook = TrainingHook(lambda labels, rows: True, {})
    with instrument_collectives(hook), pytest.raises(Exception, match="(?i)invalid|rank"):
        dist.broadcast(torch.ones(2), src=5)
    hook.close()


def test_a_missing_rank_shows_in_its_node_frame_and_never_blocks_it() -> None:
    agg = StepAggregator(wait_s=2.0)
    for rank in range(4):
        agg.expect(Subject(replica=rank // 2, rank=rank, node=f"node{rank // 2}"))
    out = []
    for rank in (0, 1, 2):  # rank 3 never reports step 7
        out += agg.add(
            Frame(
                Subject(replica=rank // 2, rank=rank, node=f"node{rank // 2}"),
                7,
                100.0,
                {"step_time": 0.1 * (rank + 1)},
            )
        )
    complete = {f.subject: f for f in out}
    node0 = complete[Subject(node="node0")]
    assert node0.values["step_time.max"] == pytest.approx(0.2)
    assert node0.values["ranks_missing"] == 0
    assert Subject(node="node1") not in complete
    assert agg.flush(now=101.0) == []
    late = {f.subject: f for f in agg.flush(now=102.5)}
    assert late[Subject(node="node1")].values["ranks_missing"] == 1
    assert late[Subject(replica=1)].values["ranks_reporting"] == 1
