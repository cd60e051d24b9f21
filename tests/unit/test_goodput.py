"""Goodput mode's arithmetic (`runtime.goodput`): efficiency, gain, progress accounting by hand, the estimator on
gradients of known mean and covariance, and the optimizers each learning-rate rule takes."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from slurm_elastico.runtime.goodput import NoiseScale, done, efficiency, optimizer_rule_problem, step_worth


def test_efficiency_and_gain_agree_with_pollux_and_adascale():
    # Pollux: E(B) = (phi + B0) / (phi + B); AdaScale: gain = (var + sqr) / (var / r + sqr), var = tr(S) / B0.
    phi, b0 = 48.0, 16
    ns = NoiseScale(b0, sqr=2.0, var=phi * 2.0 / b0, measured=True)
    assert ns.phi == pytest.approx(phi)
    for b in (4, 8, 16, 32, 64, 256):
        assert ns.gain(b) == pytest.approx(b / b0 * (phi + b0) / (phi + b), rel=1e-12)
        assert step_worth(phi, b, b0) == pytest.approx(ns.gain(b), rel=1e-12)
    assert ns.gain(b0) == 1.0  # exactly: the submitted batch counts one step per step
    assert efficiency(phi, 64, 16) == pytest.approx(64 / 112)
    assert efficiency(math.inf, 64, 16) == 1.0 and efficiency(0.0, 64, 16) == 0.25


def test_progress_accounting_matches_a_hand_calculation():
    # B0 = 16, phi = 48 (sqr = 1, var = 3). Steps: 2 at B = 16, 3 at B = 64, 1 at B = 8.
    # By hand: at 64, E = (48 + 16) / (48 + 64) = 64/112 = 4/7, worth 64/16 * 4/7 = 16/7 each;
    # at 8, E = 64/56 = 8/7, worth 8/16 * 8/7 = 4/7. Total = 2 + 3 * 16/7 + 4/7 = 2 + 52/7 = 66/7.
    ns = NoiseScale(16, sqr=1.0, var=3.0, measured=True)
    worth = [ns.count_step(b) for b in (16, 16, 64, 64, 64, 8)]
    assert worth[:2] == [1.0, 1.0]
    assert worth[2] == pytest.approx(16 / 7, rel=1e-12) and worth[5] == pytest.approx(4 / 7, rel=1e-12)
    assert ns.progress == pytest.approx(66 / 7, rel=1e-12)
    assert ns.samples == 2 * 16 + 3 * 64 + 8 and ns.steps == 6
    assert not done(ns.progress, 10) and done(ns.progress, 66 / 7) and done(ns.progress, 9)


def test_before_any_measurement_every_batch_counts_one_step():
    ns = NoiseScale(32)
    assert ns.phi is None
    assert ns.gain(32) == 1.0
    assert ns.gain(128) == pytest.approx(1.0, abs=1e-5) and ns.gain(8) == pytest.approx(1.0, abs=1e-5)


@pytest.mark.parametrize("sqr, var", [(-0.03, 0.5), (0.0, 0.5), (1e-7, 1e-8), (2.0, 6.0)])
def test_the_reported_noise_scale_prices_a_step_as_the_gain_counted_it(sqr, var):
    # The helper turns a job's progress back into steps at its batch with the noise scale the job reports
    # (`shapes.goodput.to_figure`): that needs step_worth(phi) to be the gain each step was counted at, also when
    # noise swamps |G|^2 (its estimate <= 0: every step counts B/B0) or the variance is below the gain's floor.
    ns = NoiseScale(8, sqr=sqr, var=var, measured=True)
    assert ns.phi is not None and ns.phi >= 0
    for b in (4, 8, 32):
        assert step_worth(ns.phi, b, 8) == pytest.approx(ns.gain(b), rel=1e-9)
    if sqr <= 0:
        assert ns.phi == math.inf and ns.gain(32) == 4.0


def test_a_report_carries_an_infinite_noise_scale_as_the_largest_number(tmp_path):
    from slurm_elastico.runtime.progress import MAX_NUMBER, ProgressReporter, read_progress

    path = tmp_path / "progress.json"
    ProgressReporter(path).report(3, 10, grad_noise_scale=math.inf, final=True)
    assert read_progress(path).grad_noise_scale == MAX_NUMBER
    ProgressReporter(path).report(3, 10, grad_noise_scale=float("nan"), final=True)
    assert read_progress(path).grad_noise_scale is None


def _draws(rng, n, b, mean, std):
    """n gradients, each the mean of b samples of N(mean, diag(std^2))."""
    d = mean.size
    return mean + rng.standard_normal((n, b, d)).mean(axis=1) * std


def test_estimator_recovers_the_noise_scale_of_known_gradients():
    # True |G|^2 = 0.25 * 400 = 100, tr(S) = 400 * 2.5^2 = 2500: phi = 25 samples.
    rng = np.random.default_rng(0)
    d, b0 = 400, 8
    mean, std = np.full(d, 0.5), 2.5
    ns = NoiseScale(b0)
    for _ in range(400):
        g = _draws(rng, 4, 8, mean, std)  # 4 micro-batches of 8: a step of 32
        local = float((g**2).sum(axis=1).mean())
        total = float((g.mean(axis=0) ** 2).sum())
        assert ns.observe(local, total, 4, 32)
    assert ns.sqr == pytest.approx(100.0, rel=0.1)
    assert ns.var * b0 == pytest.approx(2500.0, rel=0.1)
    assert ns.phi == pytest.approx(25.0, rel=0.15)


def test_the_gauge_measures_pieces_of_unequal_sizes_without_bias():
    # 64 samples in the 9 pieces 3 ranks make of it (22, 21, 21 in micro-batches of at most 8): a piece of b
    # samples has E|g|^2 = |G|^2 + S / b. The size-weighted mean of the pieces' squared norms expects what count
    # equal pieces would, so (local - total) * B / (count - 1) estimates S; the plain mean reads 4.6 % high here.
    from slurm_elastico.runtime.dist import Group, Membership
    from slurm_elastico.runtime.noise_gauge import NoiseGauge
    from slurm_elastico.runtime.shape import TrainShape

    shape = TrainShape(64, 8, 3, steps=1, ranks=3)
    sizes = [n for r in range(3) for _, n in shape.micro_parts(r)]
    assert sizes == [8, 8, 6, 8, 8, 5, 8, 8, 5] and shape.micro_count == 9

    class Seen:
        def __init__(self):
            self.steps = []

        def observe(self, local, total, count, batch):
            self.steps.append((local, total, count, batch))
            return True

    torch.manual_seed(0)
    d, sigma = 4000, 0.5  # S = d * sigma^2 = 1000, |G|^2 = 1
    grad = torch.zeros(d, dtype=torch.float64)
    grad[0] = 1.0
    gauge, seen = NoiseGauge(NoiseScale(32)), Seen()
    gauge.ns = seen
    param = torch.nn.Parameter(torch.zeros(d, dtype=torch.float64))
    gauge.params = [param]
    group = Group(Membership(), torch.device("cpu"))
    for _ in range(300):
        gauge.begin()
        step = torch.zeros(d, dtype=torch.float64)
        for b in sizes:
            piece = grad + sigma * torch.randn(b, d, dtype=torch.float64).mean(0)
            gauge.pending = float((piece * (b / 64)).pow(2).sum())  # what the hooks see: the weighted loss's gradient
            gauge.micro_done(b / 64)
            step += piece * (b / 64)
        param.grad = step
        gauge.measure(shape, 1.0, group)
    assert {(c, b) for _, _, c, b in seen.steps} == {(9, 64)}
    noise = np.mean([(local - total) * 64 / 8 for local, total, _, _ in seen.steps])
    sqr = np.mean([(9 * total - local) / 8 for local, total, _, _ in seen.steps])
    assert noise == pytest.approx(1000.0, rel=0.015)
    assert sqr == pytest.approx(1.0, abs=0.05)


def test_differenced_estimate_from_one_gradient_a_step_and_the_switch_back():
    rng = np.random.default_rng(1)
    d, b0 = 400, 8
    mean, std = np.full(d, 0.5), 2.5
    ns = NoiseScale(b0)
    prev = None
    for _ in range(400):
        g = _draws(rng, 1, 16, mean, std)[0]
        if prev is not None:
            local = float(((prev**2).sum() + (g**2).sum()) / 2)
            total = float((((prev + g) / 2) ** 2).sum())
            ns.observe_differenced(local, total, 16)
        prev = g
    assert ns.biased and ns.phi == pytest.approx(25.0, rel=0.15)
    # The first unbiased estimate starts the averages afresh: they then equal that one estimate.
    assert ns.observe(300.0, 200.0, 2, 16)
    assert not ns.biased and ns.sqr == pytest.approx(100.0) and ns.var == pytest.approx(100.0 * 2 / 1)


def test_unusable_statistics_change_nothing():
    ns = NoiseScale(8)
    assert not ns.observe(float("nan"), 1.0, 4, 32) and not ns.observe(2.0, 1.0, 1, 32)
    assert not ns.measured and ns.sqr == 1.0


def test_state_round_trip_is_exact():
    ns = NoiseScale(16, sqr=1.0, var=3.0, measured=True)
    ns.observe(5.0, 2.0, 4, 64)
    ns.count_step(64)
    back = NoiseScale.from_state(ns.to_state())
    assert back == ns


def test_lr_factors_per_rule_and_optimizer():
    ns = NoiseScale(16, sqr=1.0, var=3.0, measured=True)
    p = [torch.nn.Parameter(torch.zeros(2))]
    sgd, adam = torch.optim.SGD(p, lr=0.1), torch.optim.Adam(p, lr=0.1)
    assert ns.lr_factor("adascale", 64, sgd) == pytest.approx(16 / 7)
    assert ns.lr_factor("adascale", 64, adam) == pytest.approx(math.sqrt(16 / 7))
    assert ns.lr_factor("sqrt", 64, sgd) == 2.0 and ns.lr_factor("linear", 64, sgd) == 4.0
    assert ns.lr_factor("adascale", 16, sgd) == 1.0 and ns.lr_factor("sqrt", 16, adam) == 1.0


def test_optimizers_a_rule_does_not_support_are_named():
    p = [torch.nn.Parameter(torch.zeros(2))]
    assert optimizer_rule_problem("adascale", torch.optim.SGD(p, lr=0.1, momentum=0.9)) is None
    assert optimizer_rule_problem("adascale", torch.optim.AdamW(p, lr=0.1)) is None
    why = optimizer_rule_problem("adascale", torch.optim.Adagrad(p, lr=0.1))
    assert why and "batch.lr_scaling 'adascale' does not support the optimizer Adagrad" in why and "SGD" in why
    why = optimizer_rule_problem("linear", torch.optim.Adam(p, lr=0.1))
    assert why and "does not support the optimizer Adam" in why and "allowed with linear: torch.optim SGD" in why
    assert "not allowed" in (optimizer_rule_problem("cubic", torch.optim.SGD(p, lr=0.1)) or "")
