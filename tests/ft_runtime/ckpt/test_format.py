"""Unit tests of the tensor-only format, DP shard layout and persisted checkpoints."""

from __future__ import annotations

import hashlib
import json
from collections import OrderedDict
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from ft_runtime.ckpt import (
    CorruptCheckpoint,
    _layout,
    _manifest,
    _persist,
    _shm,
    _stored,
    _tree,
)
from ft_runtime.ckpt.config import ClientConfig, HolderConfig, Ring
from ft_runtime.errors import CheckpointError


def _state() -> dict[object, object]:
    return {
        "model": OrderedDict(w=torch.randn(3, 4), b=torch.arange(5, dtype=torch.int64)),
        "optim": {"state": {0: {"step": torch.tensor(3.0)}}, "groups": [{"betas": (0.9, 0.99)}]},
        "rng": torch.get_rng_state(),
        "flags": [True, None, 1.5, "x", b"\x00\xff"],
        7: "int key",
    }


def _pack(state: object, nshards: int) -> tuple[dict[str, object], list[torch.Tensor]]:
    tree, tensors = _tree.flatten(state)
    entries, size = _layout.plan(tensors, nshards)
    bufs = []
    for r in range(nshards):
        buf = torch.full((size,), 0xAB, dtype=torch.uint8)
        _layout.copy_in(buf, entries, tensors, r)
        bufs.append(buf)
    return {"entries": [e.to_json() for e in entries], "tree": tree}, bufs


def _unpack(meta: dict[str, object], bufs: list[torch.Tensor]) -> object:
    entries = [_layout.Entry.from_json(e) for e in meta["entries"]]  # type: ignore[attr-defined]
    return _tree.unflatten(
        meta["tree"], _layout.assemble(entries, [_layout.BufferSource(b) for b in bufs])
    )


def _assert_same(a: object, b: object) -> None:
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor)
        assert a.dtype == b.dtype
        assert a.shape == b.shape
        assert torch.equal(a, b)
    elif isinstance(a, dict):
        assert isinstance(b, dict)
        assert list(a) == list(b)
        for k in a:
            _assert_same(a[k], b[k])
    elif isinstance(a, list | tuple):
        assert type(a) is type(b)
        assert len(a) == len(b)
        for x, y in zip(a, b, strict=True):
            _assert_same(x, y)
    else:
        assert a == b
        assert type(a) is type(b)


@pytest.mark.parametrize("nshards", [1, 2, 3, 8])
def test_state_round_trips_through_shards_bitwise(nshards: int) -> None:
    state = _state()
    meta, bufs = _pack(state, nshards)
    json.dumps(meta)  # the metadata is plain JSON: nothing to unpickle
    _assert_same(state, _unpack(meta, bufs))


@settings(max_examples=40, deadline=None)
@given(
    numel=st.integers(0, 50),
    nshards=st.integers(1, 9),
    dtype=st.sampled_from([torch.float32, torch.bfloat16, torch.int8, torch.bool]),
)
def test_each_replica_stores_a_padded_1_over_d_shard(
    numel: int, nshards: int, dtype: torch.dtype
) -> None:
    t = (torch.arange(numel) % 7).to(dtype)
    entries, size = _layout.plan([("t", t)], nshards)
    e = entries[0]
    assert e.shard_len == -(-numel // nshards)  # ceil: 1/D of the tensor, padded
    assert e.shape == (numel,)
    assert e.numel == numel
    meta, bufs = _pack({"t": t}, nshards)
    out = _unpack(meta, bufs)
    assert isinstance(out, dict)
    assert torch.equal(out["t"], t)
    for r, buf in enumerate(bufs):  # the padding past the tensor's end is zero
        n = max(0, min(numel, (r + 1) * e.shard_len) - r * e.shard_len)
        assert not _layout.view(buf, e)[n:].to(torch.float32).any()


def test_objects_that_would_need_pickle_are_refused_with_their_path() -> None:
    with pytest.raises(CheckpointError, match=r"set at 'model/extra'.*plain data"):
        _tree.flatten({"model": {"extra": {1, 2}}})
    with pytest.raises(CheckpointError, match="not plain data"):
        _tree.flatten({(1, 2): 3})


def _persisted(root: Path | str, step: int, keep_last: int = 5) -> dict[str, object]:
    state = {"w": torch.randn(1000) + step, "step": step}
    meta, bufs = _pack(state, 1)
    _persist.persist(str(root), bufs[0], meta, step, 0, 1, keep_last)
    return state


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")
def test_persisted_shard_reads_back_bitwise_and_is_a_dcp_checkpoint(tmp_path: Path) -> None:
    state = _persisted(tmp_path, 3)
    meta, buf = _stored.read(str(tmp_path), 3, 0, 1)
    _assert_same(state, _unpack(meta, [buf]))
    import torch.distributed.checkpoint as dcp

    target = {"w": torch.zeros(1000)}
    dcp.load(target, checkpoint_id=str(tmp_path / "step_0000000003/shard_0-of-1"), no_dist=True)
    assert torch.equal(target["w"], state["w"])  # type: ignore[arg-type]
    assert not list(tmp_path.glob("**/.tmp-*"))  # the temporary name is gone after rename


@pytest.mark.parametrize("damage", ["flip", "truncate", "manifest"])
def test_damaged_persisted_files_are_detected(tmp_path: Path, damage: str) -> None:
    _persisted(tmp_path, 1)
    d = tmp_path / "step_0000000001/shard_0-of-1"
    data = d / "__0_0.distcp"
    if damage == "flip":
        raw = bytearray(data.read_bytes())
        raw[len(raw) // 2] ^= 0x10
        data.write_bytes(bytes(raw))
    elif damage == "truncate":
        data.write_bytes(data.read_bytes()[:-100])
    else:
        (d / "manifest.json").write_text("{not json")
    with pytest.raises(CorruptCheckpoint):
        _stored.read(str(tmp_path), 1, 0, 1)


def test_retention_keeps_the_newest_k(tmp_path: Path) -> None:
    for step in range(1, 6):
        _persisted(tmp_path, step, keep_last=2)
    assert [s for s, _, _ in _persist.catalog(str(tmp_path))] == [5, 4]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step_0000000004", "step_0000000005"]


def test_fsspec_urls_are_persisted_read_and_retained(tmp_path: Path) -> None:
    url = f"memory://ckpt-{tmp_path.name}"
    states = [_persisted(url, step, keep_last=2) for step in (1, 2, 3)]
    assert [s for s, _, _ in _persist.catalog(url)] == [3, 2]
    meta, buf = _stored.read(url, 3, 0, 1)
    _assert_same(states[2], _unpack(meta, [buf]))


def test_configs_reject_bad_values_with_clear_messages() -> None:
    ring = Ring((("node0", "tcp://127.0.0.1:1"), ("node1", "tcp://127.0.0.1:2")))
    assert ring.next("node1") == ("node0", "tcp://127.0.0.1:1")
    assert ring.prev("node0") == ("node1", "tcp://127.0.0.1:2")
    with pytest.raises(CheckpointError, match="unique"):
        Ring((("a", "x"), ("a", "y")))
    with pytest.raises(CheckpointError, match="not in the ring"):
        HolderConfig("job", "node9", ring)
    with pytest.raises(CheckpointError, match="dp_rank must be in"):
        ClientConfig("node0", ring, dp_rank=2, dp_size=2)
    with pytest.raises(CheckpointError, match="not a valid name"):
        HolderConfig("bad job/..", "node0", ring)


def _shard_files(root: Path, step: int) -> Path:
    return root / f"step_{step:010d}/shard_0-of-1"


def test_block_checksums_catch_a_flip_in_any_block_and_name_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_manifest, "BLOCK_BYTES", 1000)  # many blocks, some across tensors
    state = {"a": torch.randn(700), "b": torch.arange(900, dtype=torch.int64), "c": torch.ones(3)}
    meta, bufs = _pack(state, 1)
    _persist.persist(str(tmp_path), bufs[0], meta, 1, 0, 1, 5)
    d = _shard_files(tmp_path, 1)
    manifest = json.loads((d / "manifest.json").read_text())
    data = d / "__0_0.distcp"
    check = manifest["files"][data.name]["checksum"]
    assert check["algorithm"] == "sha256"
    assert len(check["digests"]) == -(-data.stat().st_size // 1000) > 8
    got_meta, buf = _stored.read(str(tmp_path), 1, 0, 1)
    _assert_same(state, _unpack(got_meta, [buf]))
    clean = data.read_bytes()
    for pos in (5, 2500, len(clean) - 3):  # a header, a tensor's bytes, the zip's end
        raw = bytearray(clean)
        raw[pos] ^= 0x04
        data.write_bytes(bytes(raw))
        block = pos // 1000
        span = f"bytes {block * 1000}-{min(len(clean), block * 1000 + 1000)}"
        with pytest.raises(CorruptCheckpoint, match=f"sha256 mismatch in {span}"):
            _stored.read(str(tmp_path), 1, 0, 1)
    data.write_bytes(clean)
    got_meta, buf = _stored.read(str(tmp_path), 1, 0, 1)
    _assert_same(state, _unpack(got_meta, [buf]))


def _as_first_format(d: Path) -> None:
    """Rewrites a shard's manifest as the first format wrote it: one sha256 per file, no
    offsets of the raw tensor bytes."""
    manifest = json.loads((d / "manifest.json").read_text())
    manifest["format"] = "eagleeye-ckpt/1"
    del manifest["data"]
    manifest["files"] = {
        name: {"sha256": hashlib.sha256((d / name).read_bytes()).hexdigest(), "bytes": f["bytes"]}
        for name, f in manifest["files"].items()
    }
    (d / "manifest.json").write_text(json.dumps(manifest))


def test_first_format_manifests_still_load_and_are_verified(tmp_path: Path) -> None:
    state = _persisted(tmp_path, 4)
    d = _shard_files(tmp_path, 4)
    _as_first_format(d)
    meta, buf = _stored.read(str(tmp_path), 4, 0, 1)
    _assert_same(state, _unpack(meta, [buf]))
    data = d / "__0_0.distcp"
    raw = bytearray(data.read_bytes())
    raw[len(raw) // 2] ^= 0x01
    data.write_bytes(bytes(raw))
    with pytest.raises(CorruptCheckpoint, match="sha256 mismatch"):
        _stored.read(str(tmp_path), 4, 0, 1)


def test_unknown_checksum_algorithm_is_refused_by_name(tmp_path: Path) -> None:
    _persisted(tmp_path, 2)
    m = _shard_files(tmp_path, 2) / "manifest.json"
    manifest = json.loads(m.read_text())
    for f in manifest["files"].values():
        f["checksum"]["algorithm"] = "crc7"
    m.write_text(json.dumps(manifest))
    with pytest.raises(CorruptCheckpoint, match="algorithm 'crc7' is not one of"):
        _stored.read(str(tmp_path), 2, 0, 1)


@pytest.mark.parametrize("nshards", [1, 3])
def test_storage_restore_fills_the_given_tensors_in_place(tmp_path: Path, nshards: int) -> None:
    state = {"w": torch.randn(5, 7), "n": torch.arange(11, dtype=torch.int32), "s": 3}
    meta, bufs = _pack(state, nshards)
    for r, buf in enumerate(bufs):
        _persist.persist(str(tmp_path), buf, meta, 6, r, nshards, 5)
    into = {"w": torch.zeros(5, 7), "n": torch.zeros(11, dtype=torch.int32)}
    ptrs = {k: t.data_ptr() for k, t in into.items()}
    srcs = [_stored.open_shard(str(tmp_path), 6, r, nshards)[1] for r in range(nshards)]
    entries = [_layout.Entry.from_json(e) for e in meta["entries"]]  # type: ignore[attr-defined]
    out = _layout.assemble(entries, srcs, into)
    assert [t.data_ptr() for t in out] == [ptrs["w"], ptrs["n"]]
    assert torch.equal(into["w"], state["w"])  # type: ignore[arg-type]
    assert torch.equal(into["n"], state["n"])  # type: ignore[arg-type]


@settings(max_examples=40, deadline=None)
@given(
    numels=st.lists(st.integers(0, 40), min_size=1, max_size=4),
    nshards=st.integers(1, 5),
    dtype=st.sampled_from([torch.float32, torch.bfloat16, torch.int8, torch.bool]),
)
def test_a_replayed_copy_plan_writes_what_copy_in_writes(
    numels: list[int], nshards: int, dtype: torch.dtype
) -> None:
    tensors = [(f"t{i}", (torch.arange(n) % 5 + i).to(dtype)) for i, n in enumerate(numels)]
    entries, size = _layout.plan(tensors, nshards)
    for rank in range(nshards):
        want = torch.zeros(size, dtype=torch.uint8)
        _layout.copy_in(want, entries, tensors, rank)
        got = torch.full((size,), 0xAB, dtype=torch.uint8)  # stale bytes of a recycled segment
        views = [_layout.view(got, e) for e in entries]
        copies = _layout.host_copies(views, entries, tensors, rank)
        assert copies is not None
        _layout.run_copies(copies)
        for e in entries:  # every shard byte and its zero padding, alignment gaps aside
            assert torch.equal(_layout.view(got, e), _layout.view(want, e))


def test_a_copy_plan_replays_current_contents_and_refuses_strided_tensors() -> None:
    w = torch.arange(12, dtype=torch.float32)
    entries, size = _layout.plan([("w", w)], 1)
    buf = torch.zeros(size, dtype=torch.uint8)
    copies = _layout.host_copies([_layout.view(buf, entries[0])], entries, [("w", w)], 0)
    assert copies is not None
    w.mul_(3)  # trained in place: same address, new values
    assert _layout.addresses([("w", w)]) == _layout.addresses([("w", w.detach())])
    _layout.run_copies(copies)
    assert torch.equal(_layout.view(buf, entries[0]), w)
    strided = torch.arange(24, dtype=torch.float32).view(2, 12)[:, ::2]
    s_entries, _ = _layout.plan([("s", strided)], 1)
    s_view = [buf[:48].view(torch.float32)]
    assert _layout.host_copies(s_view, s_entries, [("s", strided)], 0) is None
    assert _layout.addresses([("s", strided)]) != _layout.addresses([("s", strided.contiguous())])


MOUNTS = """\
tmpfs /dev/shm tmpfs rw,nosuid,nodev 0 0
tmpfs /mnt/snap tmpfs rw,size=8388608k,huge=within_size 0 0
tmpfs /mnt/snap/plain tmpfs rw,size=1g 0 0
tmpfs /mnt/always tmpfs rw,huge=always 0 0
tmpfs /mnt/advise tmpfs rw,huge=advise 0 0
/dev/vda / ext4 rw,huge=always 0 0
"""


@pytest.mark.parametrize(
    ("directory", "huge"),
    [
        ("/dev/shm", False),
        ("/mnt/snap", True),
        ("/mnt/snap/job1", True),
        ("/mnt/snap/plain/job1", False),  # the innermost mount decides
        ("/mnt/snapshots", False),  # a name that only starts like a mount point
        ("/mnt/always", True),
        ("/mnt/advise", False),  # files there get huge pages only where madvise asks
        ("/var/tmp", False),  # not a tmpfs at all
    ],
)
def test_huge_page_tmpfs_mounts_are_told_apart(directory: str, huge: bool) -> None:
    assert _shm.huge_pages(directory, MOUNTS) is huge
