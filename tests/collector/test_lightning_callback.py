"""The Lightning callback on a real Trainer: a tiny language model, a few steps on CPU."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader

from tests.collector.framework_helpers import Recorder, missing_framework_error, pauses

pl = pytest.importorskip("lightning.pytorch", reason="the lightning extra is not installed")

from collector.frameworks import lightning_callback  # noqa: E402

BATCH, SEQ, VOCAB = 4, 8, 32


class TinyLM(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Embedding(VOCAB, 16), nn.Linear(16, VOCAB))
        self.losses: list[float] = []
        self.norms: list[float] = []

    def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
        logits = self.net(batch[:, :-1])
        loss = nn.functional.cross_entropy(logits.reshape(-1, VOCAB), batch[:, 1:].reshape(-1))
        self.losses.append(float(loss.detach()))
        return loss

    def on_before_optimizer_step(self, optimizer: torch.optim.Optimizer) -> None:
        # An independent measure of what the callback must report.
        grads = [p.grad for p in self.parameters() if p.grad is not None]
        self.norms.append(float(torch.nn.utils.get_total_norm(grads)))

    def validation_step(self, batch: torch.Tensor, batch_idx: int) -> None:
        self.log("val_loss", self.net(batch[:, :-1]).mean())

    def configure_optimizers(self):  # type: ignore[no-untyped-def]
        opt = torch.optim.SGD(self.parameters(), lr=0.5)
        sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}


def _fit(tmp_path: Path, steps: int, accumulate: int = 1, **kw: object) -> tuple[TinyLM, dict]:
    torch.manual_seed(0)
    data = torch.randint(0, VOCAB, (64, SEQ))
    recorder = Recorder()
    model = TinyLM()
    trainer = pl.Trainer(
        max_steps=steps,
        accumulate_grad_batches=accumulate,
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=tmp_path,
        callbacks=[lightning_callback(recorder.hook, **kw)],  # type: ignore[arg-type]
    )
    trainer.fit(model, DataLoader(data, batch_size=BATCH))
    return model, recorder.steps()


def test_every_optimizer_step_reports_time_loss_lr_grad_norm_and_tokens(tmp_path: Path) -> None:
    model, steps = _fit(tmp_path, steps=4)
    assert sorted(steps) == [1, 2, 3, 4]
    for step, metrics in steps.items():
        assert metrics["step_time"] > 0
        assert metrics["loss"] == pytest.approx(model.losses[step - 1], rel=1e-6)
        assert metrics["grad_norm"] == pytest.approx(model.norms[step - 1], rel=1e-6)
        assert metrics["lr"] == pytest.approx(0.5 * 0.5 ** (step - 1))  # the step's own lr
        assert metrics["tokens"] == BATCH * SEQ


def test_gradient_accumulation_makes_one_step_of_several_batches(tmp_path: Path) -> None:
    model, steps = _fit(tmp_path, steps=3, accumulate=2)
    assert sorted(steps) == [1, 2, 3]
    for step, metrics in steps.items():
        assert metrics["tokens"] == 2 * BATCH * SEQ
        pair = model.losses[2 * step - 2 : 2 * step]
        assert metrics["loss"] == pytest.approx(sum(pair) / 2, rel=1e-6)  # the step's mean


def test_options_and_unreadable_batches_never_stop_training(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    def broken_counter(batch: object) -> int:
        raise ValueError("cannot count this batch")

    model, steps = _fit(tmp_path, steps=3, tokens_of=broken_counter, grad_norm=False)
    assert len(model.losses) == 3  # training went on
    assert sorted(steps) == [1, 2, 3]  # and every step was still reported, without tokens
    assert all("tokens" not in m and "grad_norm" not in m and "lr" in m for m in steps.values())
    warnings = [r for r in caplog.records if "cannot count this batch" in r.getMessage()]
    assert len(warnings) == 1  # logged once, not once per step


def test_a_clear_error_when_lightning_is_missing_and_no_import_without_it() -> None:
    message = missing_framework_error(
        ("lightning", "pytorch_lightning"),
        "lightning_callback",
        check=(
            "import collector, collector.frameworks, eagleeye\n"
            "assert 'lightning' not in sys.modules and 'transformers' not in sys.modules\n"
        ),
    )
    assert "pip install 'eagleeye[lightning]'" in message


def test_validation_and_checkpoint_saves_are_declared_pauses(tmp_path: Path) -> None:
    torch.manual_seed(0)
    data = DataLoader(torch.randint(0, VOCAB, (64, SEQ)), batch_size=BATCH)
    recorder = Recorder()
    saves = pl.callbacks.ModelCheckpoint(dirpath=tmp_path, every_n_train_steps=3)
    trainer = pl.Trainer(
        max_steps=4,
        val_check_interval=2,
        limit_val_batches=1,
        num_sanity_val_steps=0,
        accelerator="cpu",
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=tmp_path,
        callbacks=[lightning_callback(recorder.hook), saves],  # type: ignore[arg-type]
    )
    trainer.fit(TinyLM(), data, data)
    declared = pauses(recorder)
    assert declared.count(("validation", 1.0)) == declared.count(("validation", 0.0)) == 2
    assert ("checkpoint", 1.0) in declared
    assert declared.count(("checkpoint", 1.0)) == declared.count(("checkpoint", 0.0))
    assert recorder.hook._pauses == {}  # every pause ended


def test_the_session_hands_out_the_callback(tmp_path: Path) -> None:
    from eagleeye.config import ENV_CHECKPOINT_DIR
    from eagleeye.session import RankSession

    with RankSession({ENV_CHECKPOINT_DIR: str(tmp_path)}) as session:
        assert isinstance(session.lightning_callback(grad_norm=False), pl.Callback)
