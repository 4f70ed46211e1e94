from __future__ import annotations

import numpy as np
import pytest

from collector.types import JOB, Frame
from detectors.changepoint import ThroughputChange
from detectors.numerics import SeriesSpike


def _feed(det: object, values: np.ndarray, feature: str) -> list:
    found = []
    for s, v in enumerate(values):
        found += det.process(Frame(JOB, s, float(s), {feature: float(v)}))  # type: ignore[attr-defined]
    return found


def test_loss_spike_fires_once_and_a_decaying_loss_does_not() -> None:
    rng = np.random.default_rng(0)
    loss = (2 + 8 * np.exp(-np.arange(300) / 80)) * (1 + 0.01 * rng.standard_normal(300))
    assert _feed(SeriesSpike(), loss, "loss") == []
    loss[200:203] *= 3.0
    found = _feed(SeriesSpike(), loss, "loss")
    assert [(f.kind, f.step) for f in found] == [("loss_spike", 200)]
    assert found[0].evidence["ratio"] > 2.5


def test_throughput_change_needs_a_lasting_shift_above_the_minimum() -> None:
    rng = np.random.default_rng(0)
    base = 1.0 + 0.02 * rng.standard_normal(300)
    base[::50] *= 2.5  # checkpoint steps
    assert _feed(ThroughputChange(), base, "step_time") == []
    small = base.copy()
    small[150:] *= 1.04
    assert _feed(ThroughputChange(), small, "step_time") == []
    big = base.copy()
    big[150:] *= 1.25
    found = _feed(ThroughputChange(), big, "step_time")
    assert len(found) == 1
    assert 150 <= found[0].step <= 160
    assert found[0].evidence["relative_shift"] > 0.15


def test_scores_are_zero_in_warm_up_and_grow_with_anomaly() -> None:
    det = SeriesSpike(warmup=10)
    frame = Frame(JOB, 0, 0.0, {"loss": 5.0})
    assert det.score_one(frame) == 0.0
    for s in range(20):
        det.learn_one(Frame(JOB, s, 0.0, {"loss": 2.0 + 0.01 * (s % 3)}))
    assert det.score_one(Frame(JOB, 21, 0.0, {"loss": 4.0})) > det.score_one(
        Frame(JOB, 21, 0.0, {"loss": 2.1})
    )


def test_divergence_needs_a_lasting_climb_not_a_spike() -> None:
    from detectors.numerics import Divergence

    rng = np.random.default_rng(0)
    loss = (2 + 8 * np.exp(-np.arange(400) / 80)) * (1 + 0.01 * rng.standard_normal(400))
    spiky = loss.copy()
    spiky[200:203] *= 4.0
    assert _feed(Divergence(), spiky, "loss") == []
    diverging = loss.copy()
    diverging[250:] *= np.linspace(1.0, 3.0, 150)
    found = _feed(Divergence(), diverging, "loss")
    assert [f.kind for f in found] == ["divergence"]
    assert 250 < found[0].step < 330
    assert found[0].evidence["ratio"] > 1.3


def test_loss_spike_on_one_rank_is_seen_in_max_mode_and_names_the_rank() -> None:
    import pytest

    from detectors.errors import DetectorError
    from tests.detectors._batches import batch

    median, highest = SeriesSpike(warmup=5), SeriesSpike(warmup=5, reduce="max")
    found = []
    for s in range(30):
        loss = 3.0 - 0.01 * s + 0.01 * np.arange(8)
        if s == 25:
            loss[6] *= 10
        b = batch(s, {"loss": loss})
        assert list(median.process_step(b)) == []  # one rank of eight: the median hides it
        found += highest.process_step(b)
    assert [(f.kind, f.subject.rank, f.step) for f in found] == [("loss_spike", 6, 25)]
    with pytest.raises(DetectorError, match="reduce"):
        SeriesSpike(reduce="mean")


def test_a_spike_of_most_ranks_in_max_mode_is_the_job_s() -> None:
    from collector.types import JOB
    from tests.detectors._batches import batch

    det = SeriesSpike(warmup=5, reduce="max")
    found = []
    for s in range(30):
        loss = 3.0 - 0.01 * s + 0.01 * np.arange(8)
        if s == 25:
            loss[1:] *= 3  # seven ranks of eight
        found += det.process_step(batch(s, {"loss": loss}))
    assert [(f.kind, f.subject, f.step) for f in found] == [("loss_spike", JOB, 25)]
    assert found[0].evidence["ranks_spiking"] == 7


def test_a_spike_of_the_ranks_median_in_max_mode_is_the_job_s() -> None:
    # Losses spread from 2 to 4 over 16 ranks, every one 1.5 times higher at step 25: only
    # the highest five pass the highest rank's bar, but the median rose by half.
    from collector.types import JOB
    from tests.detectors._batches import batch

    det = SeriesSpike(warmup=5, reduce="max")
    found = []
    for s in range(30):
        loss = (2.0 + 2.0 * np.arange(16) / 15) * (1.0 - 0.001 * s)
        if s == 25:
            loss *= 1.5
        found += det.process_step(batch(s, {"loss": loss}))
    assert [(f.kind, f.subject, f.step) for f in found] == [("loss_spike", JOB, 25)]
    assert found[0].evidence["ranks_spiking"] < 8


def _norm_and_loss(spike_at: int, loss_after: float, lasting: int = 10) -> list[Frame]:
    """A decaying gradient norm with a twelvefold jump at ``spike_at``; the loss after it
    multiplied by ``loss_after`` for ``lasting`` steps."""
    rng = np.random.default_rng(1)
    frames = []
    for s in range(120):
        norm = (0.8 + 2.0 * np.exp(-s / 15)) * rng.lognormal(0.0, 0.15)
        loss = 3.2 + 0.1 * rng.standard_normal()
        if s == spike_at:
            norm *= 12.0
        if spike_at < s <= spike_at + lasting:
            loss *= loss_after
        frames.append(Frame(JOB, s, float(s), {"grad_norm": norm, "loss": loss}))
    return frames


def test_a_gradient_norm_spike_is_a_finding_only_when_the_loss_reacts() -> None:
    from detectors.numerics import grad_norm_spike

    def run(loss_after: float, lasting: int = 10, **params: float) -> list:
        det = grad_norm_spike(warmup=20, min_ratio=1.0, **params)
        frames = _norm_and_loss(60, loss_after, lasting)
        return [f for frame in frames for f in det.process(frame)]

    # A hard batch: the norm jumps twelvefold, clipping absorbs it, the loss goes on, or
    # rises by half for three steps and recovers.
    assert run(1.0) == []
    assert run(1.5, lasting=3) == []
    # The same spike judged alone (no confirming series) is a finding, as before.
    assert [f.step for f in run(1.0, confirm="")] == [60]
    # A spike that set training back: the loss of the ten steps after it is 60 % higher.
    (found,) = run(1.6)
    assert (found.kind, found.step) == ("grad_spike", 60)
    assert found.evidence["ratio"] > 5.0
    assert found.evidence["loss_after"] > 1.4 * found.evidence["loss_baseline"]


def test_a_gradient_spike_followed_by_a_non_finite_loss_is_confirmed() -> None:
    from detectors.numerics import grad_norm_spike

    det = grad_norm_spike(warmup=20, min_ratio=1.0)
    frames = _norm_and_loss(60, 1.0)
    frames[62] = Frame(JOB, 62, 62.0, {"grad_norm": 1.0, "loss": float("nan")})
    found = [f for frame in frames for f in det.process(frame)]
    assert [(f.kind, f.step, f.evidence["loss_non_finite"]) for f in found] == [
        ("grad_spike", 60, 1.0)
    ]


def test_the_highest_rank_s_gradient_spike_is_confirmed_by_the_job_s_loss() -> None:
    from detectors.numerics import grad_norm_spike
    from tests.detectors._batches import batch

    found = []
    for reacted in (False, True):
        det = grad_norm_spike(warmup=20, min_ratio=1.0, reduce="max")
        found.append([])
        for frame in _norm_and_loss(60, 2.0 if reacted else 1.0):
            norm = np.full(4, frame.values["grad_norm"])
            loss = np.full(4, frame.values["loss"])
            loss[3] = np.nan  # one rank without a loss: the others' median confirms
            found[-1] += det.process_step(batch(frame.step, {"grad_norm": norm, "loss": loss}))
    assert found[0] == []
    assert [(f.kind, f.step) for f in found[1]] == [("grad_spike", 60)]
    assert found[1][0].subject.rank is None  # the all-reduced norm: every rank's, the job's


def test_a_confirmed_spike_names_the_rank_that_spiked_not_the_highest_when_confirmed() -> None:
    from detectors.numerics import grad_norm_spike
    from tests.detectors._batches import batch

    det = grad_norm_spike(warmup=20, min_ratio=1.0, reduce="max")
    found = []
    for frame in _norm_and_loss(60, 2.0):
        norm = np.full(4, frame.values["grad_norm"])
        if frame.step != 60:
            norm[1] *= 1.01  # rank 1 the highest on every other step
        else:
            norm[[0, 1, 3]] = norm[2] / 12  # rank 2's own norm jumped
        loss = np.full(4, frame.values["loss"])
        found += det.process_step(batch(frame.step, {"grad_norm": norm, "loss": loss}))
    assert [(f.kind, f.step, f.subject.rank) for f in found] == [("grad_spike", 60, 2)]


def _live_loss(spread: float, spike: float, seed: int = 0, fall: float = 0.0) -> list:
    """The live loss bars (the highest rank's loss, three times its level, a quarter while
    quiet) over 300 steps of 8 ranks whose loss falls from 6 to 3 (and by ``fall`` more
    each step) with lognormal noise of ``spread``; every rank's loss ``spike`` times higher
    at step 200."""
    from tests.detectors._batches import batch

    rng = np.random.default_rng(seed)
    det = SeriesSpike(reduce="max", min_ratio=2.0, warmup=20, quiet_ratio=0.25)
    found = []
    for s in range(300):
        loss = (3.0 + 3.0 * np.exp(-s / 40)) * np.exp(-fall * s) * rng.lognormal(0, spread, 8)
        if s == 200:
            loss *= spike
        found += det.process_step(batch(s, {"loss": loss}))
    return found


@pytest.mark.parametrize(("spike", "fall"), [(1.4, 0.0), (2.5, 0.0), (1.4, 0.015)])
def test_a_quiet_loss_is_judged_by_the_quiet_bar(spike: float, fall: float) -> None:
    # A large batch's loss, a per cent of noise: a rise of 40 % is a spike, though the
    # series' everyday bar is three times its level. A loss falling 1.5 % a step, each
    # value 3 % under the level of the last five, is as quiet: the fall is no noise.
    assert _live_loss(0.01, 1.0, fall=fall) == []
    found = _live_loss(0.01, spike, fall=fall)
    assert [(f.kind, f.subject, f.step) for f in found] == [("loss_spike", JOB, 200)]
    assert found[0].evidence["bar_ratio"] == 0.25


@pytest.mark.parametrize("seed", range(5))
def test_a_noisy_loss_keeps_the_everyday_bar(seed: int) -> None:
    # The loss of a few dozen tokens: a fifth of noise, its highest rank doubling now and
    # then. Neither that nor a rise of 80 % is a spike; three and a half times is.
    assert _live_loss(0.2, 1.8, seed) == []
    found = _live_loss(0.2, 4.5, seed)
    assert [(f.kind, f.step) for f in found] == [("loss_spike", 200)]
    assert found[0].evidence["bar_ratio"] == 2.0


def test_a_quiet_bar_above_the_everyday_one_is_refused() -> None:
    from detectors.errors import DetectorError

    with pytest.raises(DetectorError, match="quiet_ratio"):
        SeriesSpike(min_ratio=0.25, quiet_ratio=0.5)
    with pytest.raises(DetectorError, match="quiet_window"):
        SeriesSpike(quiet_ratio=0.1, quiet_window=5)
