"""The reference workload: deterministic for a seed, resumable bit for bit."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import torch

from eagleeye.workload.data import CharTokenizer, ShardedSampler, load_corpus
from eagleeye.workload.model import GPT, PRESETS, GPTConfig
from tests.workload_args import tiny_workload

ARGS = tiny_workload(12, 5)


def train(tmp_path, name: str, inject: str = "") -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "EAGLEEYE_CHECKPOINT_DIR": str(tmp_path / name),
        "EAGLEEYE_INJECT": inject,
        "OMP_NUM_THREADS": "1",
    }
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "eagleeye.workload.train",
            *ARGS,
            "--result",
            str(tmp_path / f"{name}.json"),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_a_killed_run_resumes_to_the_same_loss_as_an_uninterrupted_one(tmp_path) -> None:
    clean = train(tmp_path, "clean")
    assert clean.returncode == 0, clean.stderr
    killed = train(tmp_path, "resumed", inject="kill:rank=0@step=8")
    assert killed.returncode == -signal.SIGKILL
    assert not (tmp_path / "resumed.json").exists()
    resumed = train(tmp_path, "resumed")  # same checkpoint folder: resumes from step 4
    assert resumed.returncode == 0, resumed.stderr
    expected = json.loads((tmp_path / "clean.json").read_text())["final_loss"]
    assert json.loads((tmp_path / "resumed.json").read_text())["final_loss"] == expected


def test_the_sampler_position_is_checkpointable_state() -> None:
    data = torch.arange(1000)
    first = ShardedSampler(data, 8, 4, rank=1, world_size=2, seed=3)
    for _ in range(30):  # past an epoch boundary (991 windows / 8 per step)
        first.next_batch()
    resumed = ShardedSampler(data, 8, 4, rank=1, world_size=2, seed=3)
    resumed.load_state_dict(first.state_dict())
    assert first.epoch == resumed.epoch == 0
    for _ in range(200):
        assert torch.equal(first.next_batch()[0], resumed.next_batch()[0])
    assert first.epoch >= 1


def test_ranks_draw_disjoint_windows_and_targets_are_shifted_inputs() -> None:
    data = torch.arange(500)
    batches = [ShardedSampler(data, 8, 4, r, 2, seed=0).next_batch() for r in range(2)]
    starts = [set(x[:, 0].tolist()) for x, _ in batches]
    assert starts[0].isdisjoint(starts[1])
    x, y = batches[0]
    assert torch.equal(x[:, 1:], y[:, :-1])


def test_the_model_has_a_few_million_parameters_and_learns() -> None:
    text = load_corpus()
    tokenizer = CharTokenizer(text)
    assert tokenizer.decode(tokenizer.encode("print(x)")) == "print(x)"
    base = GPT(GPTConfig(vocab_size=tokenizer.vocab_size, **PRESETS["base"]))
    assert 2_000_000 <= base.num_parameters() <= 5_000_000
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=tokenizer.vocab_size, block_size=32, **PRESETS["tiny"]))
    sampler = ShardedSampler(tokenizer.encode(text[:20000]), 32, 8, 0, 1, seed=0)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(60):
        x, y = sampler.next_batch()
        _, loss = model(x, y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert sum(losses[-10:]) / 10 < 0.9 * sum(losses[:10]) / 10
