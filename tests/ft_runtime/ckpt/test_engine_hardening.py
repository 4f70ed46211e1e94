"""The checkpoint engine: manifests and metadata of the wrong shape fall back like corrupt
ones, a target of another shape or dtype is refused, and "every checkpoint unusable" is an
error, not "no checkpoint"."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from ft_runtime.ckpt import CkptState, CorruptCheckpoint, _persist, _stored
from ft_runtime.errors import CheckpointsUnusable
from tests.ft_runtime.ckpt.conftest import RingFactory, wait_for
from tests.ft_runtime.ckpt.test_format import _pack
from tests.ft_runtime.ckpt.test_holder import Events, client, same, state

pytestmark = pytest.mark.integration


def persisted(root: Path, step: int) -> Path:
    meta, bufs = _pack({"w": torch.randn(100) + step, "step": step}, 1)
    _persist.persist(str(root), bufs[0], meta, step, 0, 1, 5)
    return root / f"step_{step:010d}/shard_0-of-1/manifest.json"


@pytest.mark.parametrize(
    "damage",
    [
        lambda m: None,
        lambda m: [],
        lambda m: {**m, "files": []},
        lambda m: {**m, "meta": None},
        lambda m: {**m, "meta": {**m["meta"], "entries": [[]]}},
        lambda m: {**m, "meta": {**m["meta"], "entries": [["w", "float32", [100], 100]]}},
        lambda m: {**m, "meta": {**m["meta"], "entries": 5}},
        lambda m: {**m, "data": {"w": []}},
    ],
)
def test_a_manifest_of_the_wrong_shape_is_a_corrupt_checkpoint(tmp_path: Path, damage) -> None:
    manifest = persisted(tmp_path, 3)
    manifest.write_text(json.dumps(damage(json.loads(manifest.read_text()))))
    with pytest.raises(CorruptCheckpoint):
        _stored.read(str(tmp_path), 3, 0, 1)


def test_engine_falls_back_refuses_other_shapes_and_tells_all_unusable(
    holders: RingFactory, tmp_path: Path
) -> None:
    ring, procs = holders(1, storage=str(tmp_path))
    ev = Events(ring)
    c = client(ring, storage=str(tmp_path))
    for step in (1, 2):
        assert c.save(state(step), step).ok
    wait_for(lambda: CkptState.PERSISTENT in ev.states(2), what="step 2 persisted")
    procs[0].stop()  # memory tier gone: only storage is left
    (tmp_path / "step_0000000002/shard_0-of-1/manifest.json").write_text("null")
    got = client(ring, storage=str(tmp_path)).load()
    assert got is not None
    assert got.step == 1
    assert same(got.state, state(1))
    wrong = {"model": {"w": torch.zeros(10_000, dtype=torch.float64)}}
    with pytest.raises(CheckpointsUnusable, match="tensor .*w is float32"):
        client(ring, storage=str(tmp_path)).load(into=wrong)
    (tmp_path / "step_0000000001/shard_0-of-1/manifest.json").write_text('{"format": 5}')
    with pytest.raises(CheckpointsUnusable, match="none could be loaded"):
        client(ring, storage=str(tmp_path)).load()
