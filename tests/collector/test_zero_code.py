"""Zero-code telemetry: steps, loss and collectives of scripts that never call Eagle Eye."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from collector.autostep import AutoSteps
from collector.ddp import watch_ddp
from collector.hooks import TrainingHook
from collector.instrument import patch_collectives
from collector.transport import TelemetryReceiver

REPO = Path(__file__).resolve().parents[2]


def booted(tmp_path: Path, script: str, *args: str) -> tuple[subprocess.CompletedProcess, list]:
    """Runs ``script`` through ``python -m eagleeye.boot`` and collects its telemetry."""
    path = tmp_path / "sub" / "train.py"
    path.parent.mkdir()
    path.write_text(textwrap.dedent(script))
    receiver = TelemetryReceiver()
    env = {**os.environ, "EAGLEEYE_TELEMETRY": receiver.address, "RANK": "0"}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH")) if p)
    try:
        done = subprocess.run(
            [sys.executable, "-m", "eagleeye.boot", str(path), *args],
            env=env,
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=50,
            check=False,
        )
        samples, deadline = [], time.monotonic() + 5
        while time.monotonic() < deadline and not any(s.name == "closing" for s in samples):
            samples += receiver.receive(timeout_s=0.2)
    finally:
        receiver.close()
    return done, samples


def values(samples: list, name: str) -> dict[int, float]:
    return {s.step: s.value for s in samples if s.name == name}


TRAIN = """
    import sys
    import torch
    print(sys.argv[1:], __name__, sys.path[0].endswith("sub"))
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    for step in range(5):
        loss = model(torch.randn(8, 4)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        print(repr(loss.item()))
"""


@pytest.mark.integration
def test_an_unmodified_script_reports_steps_loss_and_lr_as_python_would_run_it(
    tmp_path,
) -> None:
    done, samples = booted(tmp_path, TRAIN, "--flag", "x")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == "['--flag', 'x'] __main__ True"  # argv, __main__, script folder first
    assert values(samples, "loss") == {s: float(v) for s, v in enumerate(lines[1:])}
    assert sorted(values(samples, "step_time")) == [0, 1, 2, 3, 4]
    assert set(values(samples, "lr").values()) == {0.05}
    assert all(s.labels["rank"] == "0" for s in samples)


@pytest.mark.integration
def test_a_script_that_never_imports_torch_is_spared_it_and_its_exit_code_passes(
    tmp_path,
) -> None:
    script = """
        import sys
        print("torch" in sys.modules)
        sys.exit(3)
    """
    done, samples = booted(tmp_path, script)
    assert (done.returncode, done.stdout.strip()) == (3, "False")
    assert [s.name for s in samples] == ["closing"]  # told it ended, nothing else


@pytest.mark.integration
def test_a_script_that_uses_the_hook_too_is_counted_once(tmp_path) -> None:
    script = """
        import torch
        import eagleeye
        ee = eagleeye.init()
        model = torch.nn.Linear(4, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for step in range(100, 104):
            ee.step_start(step)
            loss = model(torch.ones(2, 4)).sum()
            loss.backward()
            opt.step()
            ee.step_end(step, loss=7.0)
        ee.close()
    """
    done, samples = booted(tmp_path, script)
    assert done.returncode == 0, done.stderr
    assert sorted(values(samples, "step_time")) == [100, 101, 102, 103]
    assert [s.value for s in samples if s.name == "loss"] == [7.0] * 4


def _collect() -> tuple[TrainingHook, list]:
    rows: list = []
    return TrainingHook(lambda labels, batch: rows.extend(batch) or True, {}), rows


def test_the_loss_is_taken_before_scaling_and_summed_over_micro_batches() -> None:
    hook, rows = _collect()
    undo = AutoSteps(hook).install()
    try:
        model = torch.nn.Linear(3, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        other = torch.optim.SGD(torch.nn.Linear(1, 1).parameters(), lr=0.01)
        scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
        expected = []
        for _ in range(3):
            parts = [model(torch.ones(1, 3)).sum() / 2 for _ in range(2)]  # accumulation
            for part in parts:
                scaler.scale(part).backward()
            torch.ones(2, requires_grad=True).mul(2).backward(torch.ones(2))  # not a loss
            scaler.step(opt)
            scaler.update()
            other.step()  # a second optimizer is part of the same step
            expected.append(sum(p.item() for p in parts))
    finally:
        undo()
        hook.close()
    losses = {r[3]: r[1] for r in rows if r[0] == "loss"}
    assert losses == pytest.approx(dict(enumerate(expected)))
    assert sorted({r[3] for r in rows if r[0] == "step_time"}) == [0, 1, 2]


@pytest.fixture
def process_group(tmp_path):
    dist.init_process_group(
        "gloo", store=dist.FileStore(str(tmp_path / "s"), 1), rank=0, world_size=1
    )
    yield
    dist.destroy_process_group()


def test_ddp_gradient_all_reduce_is_timed_and_a_scripts_own_comm_hook_is_kept(
    process_group,
) -> None:
    from torch.nn.parallel import DistributedDataParallel as DDP

    hook, rows = _collect()
    undo = [patch_collectives(hook), watch_ddp(), AutoSteps(hook).install()]
    calls = []

    def own(state, bucket):  # a script's own hook, in the style of PowerSGD's
        calls.append(bucket.buffer().numel())
        return (
            dist.all_reduce(bucket.buffer(), async_op=True)
            .get_future()
            .then(lambda f: f.value()[0])
        )

    try:
        for custom in (False, True):
            model = DDP(torch.nn.Linear(64, 32))
            if custom:
                model.register_comm_hook(None, own)
            opt = torch.optim.SGD(model.parameters(), lr=0.1)
            for _ in range(2):
                model(torch.ones(4, 64)).sum().backward()
                opt.step()
    finally:
        for step in reversed(undo):
            step()
        hook.close()
    reduced = [r for r in rows if r[0] == "collective" and r[4]["op"] == "all_reduce"]
    grad_bytes = (64 * 32 + 32) * 4
    assert [int(r[4]["bytes"]) for r in reduced] == [grad_bytes] * 4
    assert calls == [64 * 32 + 32] * 2  # the script's hook ran, ours stood aside
    assert all(r[1] >= 0 for r in reduced)
    busy = [r for r in rows if r[0] == "collective_time"]
    assert len(busy) >= 3  # the steps' wall time inside collectives, overlaps counted once


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_a_cuda_loss_is_read_without_a_device_sync() -> None:
    hook, rows = _collect()
    undo = AutoSteps(hook).install()
    model = torch.nn.Linear(256, 1).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    torch.cuda.set_sync_debug_mode("error")  # any synchronising call raises
    try:
        for _ in range(20):
            loss = model(torch.ones(64, 256, device="cuda")).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
    finally:
        torch.cuda.set_sync_debug_mode("default")
        torch.cuda.synchronize()
        undo()
        hook.close()
    assert len([r for r in rows if r[0] == "loss"]) >= 15  # read later, never synced for
