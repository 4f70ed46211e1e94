"""The Hugging Face Trainer callback on a real Trainer: a tiny GPT-2 built from a config
(no download), a few steps on CPU."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from tests.collector.framework_helpers import Recorder, missing_framework_error, pauses

transformers = pytest.importorskip("transformers", reason="the hf extra is not installed")
pytest.importorskip("accelerate", reason="the hf extra is not installed")

from collector.frameworks import hf_callback  # noqa: E402

BATCH, SEQ, VOCAB, STEPS = 2, 16, 64, 4
LR = 1e-3


class TokenRows(torch.utils.data.Dataset):  # type: ignore[type-arg]
    def __init__(self) -> None:
        self.ids = torch.randint(0, VOCAB, (64, SEQ), generator=torch.Generator().manual_seed(0))

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def _train(tmp_path: Path, logging_steps: int, **args: Any) -> tuple[Any, dict]:
    torch.manual_seed(0)
    config = transformers.GPT2Config(
        n_layer=1, n_head=2, n_embd=16, vocab_size=VOCAB, n_positions=SEQ
    )
    recorder = Recorder()
    trainer = transformers.Trainer(
        model=transformers.GPT2LMHeadModel(config),
        args=transformers.TrainingArguments(
            output_dir=str(tmp_path),
            max_steps=STEPS,
            per_device_train_batch_size=BATCH,
            learning_rate=LR,
            lr_scheduler_type="linear",
            logging_steps=logging_steps,
            save_strategy="no",
            report_to=[],
            use_cpu=True,
            disable_tqdm=True,
            dataloader_num_workers=0,
            **args,
        ),
        train_dataset=TokenRows(),
        callbacks=[hf_callback(recorder.hook)],
    )
    trainer.train()
    return trainer, recorder.steps()


def _logged(trainer: Any) -> dict[int, dict[str, float]]:
    return {e["step"]: e for e in trainer.state.log_history if "loss" in e}


def test_every_step_reports_time_lr_tokens_and_the_logged_loss_and_grad_norm(
    tmp_path: Path,
) -> None:
    trainer, steps = _train(tmp_path, logging_steps=1, include_num_input_tokens_seen=True)
    assert sorted(steps) == list(range(1, STEPS + 1))
    logged = _logged(trainer)
    for step, metrics in steps.items():
        assert metrics["step_time"] > 0
        assert metrics["tokens"] == BATCH * SEQ
        assert metrics["lr"] == pytest.approx(LR * (1 - (step - 1) / STEPS))  # the step's lr
        assert metrics["loss"] == pytest.approx(logged[step]["loss"])
        assert metrics["grad_norm"] == pytest.approx(logged[step]["grad_norm"])
        assert 0 < metrics["loss"] < 10
        assert metrics["grad_norm"] > 0


def test_steps_between_logs_close_at_once_without_loss(tmp_path: Path) -> None:
    trainer, steps = _train(tmp_path, logging_steps=2)
    assert sorted(steps) == list(range(1, STEPS + 1))
    assert set(_logged(trainer)) == {2, 4}
    for step, metrics in steps.items():
        assert ("loss" in metrics) == (step % 2 == 0)
        assert "tokens" not in metrics  # the Trainer does not count tokens unless asked
        assert metrics["lr"] > 0


def test_evaluation_and_checkpoint_saves_are_declared_pauses(tmp_path: Path) -> None:
    recorder = Recorder()
    trainer = transformers.Trainer(
        model=transformers.GPT2LMHeadModel(
            transformers.GPT2Config(
                n_layer=1, n_head=2, n_embd=16, vocab_size=VOCAB, n_positions=SEQ
            )
        ),
        args=transformers.TrainingArguments(
            output_dir=str(tmp_path),
            max_steps=4,
            per_device_train_batch_size=BATCH,
            eval_strategy="steps",
            eval_steps=2,
            save_strategy="steps",
            save_steps=2,
            report_to=[],
            use_cpu=True,
            disable_tqdm=True,
        ),
        train_dataset=TokenRows(),
        eval_dataset=TokenRows(),
        callbacks=[hf_callback(recorder.hook)],
    )
    trainer.train()
    # After steps 2 and 4: an evaluation, then a save, one pause each time (the hook sends
    # when the first pause begins and when the last one ends)
    assert pauses(recorder) == [("evaluation", 1.0), ("checkpoint", 0.0)] * 2
    assert recorder.hook._pauses == {}


def test_a_clear_error_when_transformers_is_missing() -> None:
    message = missing_framework_error(("transformers",), "hf_callback")
    assert "pip install 'eagleeye[hf]'" in message


def test_the_session_hands_out_the_callback(tmp_path: Path) -> None:
    from eagleeye.config import ENV_CHECKPOINT_DIR
    from eagleeye.session import RankSession

    with RankSession({ENV_CHECKPOINT_DIR: str(tmp_path)}) as session:
        assert isinstance(session.hf_callback(), transformers.TrainerCallback)
