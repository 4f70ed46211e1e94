"""The character-level corpus and a sampler whose position is checkpointable state.

Every (step, rank) draws a distinct batch from a seeded permutation of window offsets, so
a run is deterministic for a seed and a resumed run sees exactly the batches that the
uninterrupted run would have seen.
"""

from __future__ import annotations

from importlib import resources

import torch

CORPUS = "corpus.txt"


def load_corpus() -> str:
    return resources.files("eagleeye.workload").joinpath(CORPUS).read_text(encoding="utf-8")


class CharTokenizer:
    def __init__(self, text: str) -> None:
        self.chars = sorted(set(text))
        self.index = {c: i for i, c in enumerate(self.chars)}

    @property
    def vocab_size(self) -> int:
        return len(self.chars)

    def encode(self, text: str) -> torch.Tensor:
        return torch.tensor([self.index[c] for c in text], dtype=torch.long)

    def decode(self, ids: torch.Tensor) -> str:
        return "".join(self.chars[i] for i in ids.tolist())


class ShardedSampler:
    """Batches of (input, target) windows; this rank's share of every global batch.

    The state is the epoch and the position in the epoch's permutation of window starts;
    ``state_dict``/``load_state_dict`` carry it through checkpoints.
    """

    def __init__(
        self,
        data: torch.Tensor,
        block_size: int,
        batch_size: int,
        rank: int,
        world_size: int,
        seed: int,
    ) -> None:
        self.data = data
        self.block_size = block_size
        self.batch_size = batch_size
        self.rank = rank
        self.world_size = world_size
        self.seed = seed
        self.epoch = 0
        self.position = 0
        self.num_windows = len(data) - block_size - 1
        self._order = self._permutation()

    def _permutation(self) -> torch.Tensor:
        gen = torch.Generator().manual_seed(self.seed * 1_000_003 + self.epoch)
        return torch.randperm(self.num_windows, generator=gen)

    def next_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The next global batch's share of this rank; advances the position for all ranks."""
        global_batch = self.batch_size * self.world_size
        if self.position + global_batch > self.num_windows:
            self.epoch += 1
            self.position = 0
            self._order = self._permutation()
        start = self.position + self.rank * self.batch_size
        starts = self._order[start : start + self.batch_size]
        self.position += global_batch
        offsets = torch.arange(self.block_size + 1)
        windows = self.data[starts[:, None] + offsets]
        return windows[:, :-1], windows[:, 1:]

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "position": self.position, "seed": self.seed}

    def load_state_dict(self, state: dict[str, int]) -> None:
        if state["seed"] != self.seed:
            raise ValueError(f"checkpoint was taken with seed {state['seed']}, not {self.seed}")
        self.epoch = int(state["epoch"])
        self.position = int(state["position"])
        self._order = self._permutation()
