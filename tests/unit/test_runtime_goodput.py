"""Goodput mode in the training loop (real PyTorch, CPU, fp32, deterministic): the batch adapts, the learning rate
follows, progress is statistical, a resume is bit-identical, and training reaches the fixed batch's loss.

Convergence figure (the tolerance stated in `CONVERGENCE_TOL`): a tiny LM (`runtime.tinylm`) trained with SGD
(momentum 0.9) for `CONV_STEPS` steps of the submitted batch 16, against the same job run in goodput mode at
batch 16 for a quarter of its work and then, after a checkpoint and relaunch, at batch 64 with AdaScale until its
statistical progress reaches the same work. Same seed for weights and data; 3 seeds.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator, Sequence

import pytest
import torch

from slurm_elastico.errors import ConfigError
from slurm_elastico.model import Family, Resources, Shape
from slurm_elastico.runtime import rebatch
from slurm_elastico.runtime.checkpoint import load_latest
from slurm_elastico.runtime.progress import ProgressReporter, read_progress
from slurm_elastico.runtime.shape import TrainShape, current_shape, runtime_shape
from slurm_elastico.runtime.tinylm import TinyConfig, build_tiny_lm, lm_loss, synthetic_tokens
from slurm_elastico.runtime.train import stream_indices, train

CFG = TinyConfig(vocab_size=64, max_positions=32, d_model=32, n_heads=2, n_layers=2, d_ff=64)
DATA = synthetic_tokens(256, 16, 64, seed=1)
B0 = 16
WORK = 8


@pytest.fixture(autouse=True)
def _deterministic() -> Iterator[None]:
    threads = torch.get_num_threads()
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)
    yield
    torch.use_deterministic_algorithms(False)
    torch.set_num_threads(threads)


def ada(batch: int, micro: int, steps: int = WORK, rule: str = "adascale", base: int = B0) -> TrainShape:
    return TrainShape(batch, micro, batch // micro, steps=steps, lr_scaling=rule, base_batch=base)


def sgd(model: torch.nn.Module, lr: float = 0.1) -> torch.optim.Optimizer:
    return torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)


def run_job(ckpt_dir, runs: Sequence[tuple[TrainShape, int | None]], *, seed: int = 0, data=DATA, make_opt=sgd,
            progress: ProgressReporter | None = None):
    """Launches of one job: each builds model and optimizer afresh and stops after n steps (None: never)."""
    results = []
    model = None
    for s, stop_after in runs:
        model = build_tiny_lm(CFG, seed=seed)
        opt = make_opt(model)
        count = [0]

        def on_step(step: int, loss: float) -> None:
            count[0] += 1

        results.append(train(model, opt, s, data, lm_loss, ckpt_dir=ckpt_dir, data_seed=seed, on_step=on_step,
                             should_stop=lambda n=stop_after: n is not None and count[0] >= n,
                             progress=progress or ProgressReporter(env={})))
    params = torch.cat([p.detach().flatten() for p in model.parameters()])
    return params, results, model


def test_stream_pieces_of_any_size_are_the_fixed_batches_stream():
    whole = torch.cat([stream_indices(3, 0, 16, 100), stream_indices(3, 16, 64, 100), stream_indices(3, 80, 32, 100)])
    from slurm_elastico.runtime.train import batch_indices
    assert torch.equal(whole, torch.cat([batch_indices(3, s, 16, 100) for s in range(7)]))


def test_adaptive_at_the_submitted_batch_is_the_fixed_batch_job_bit_for_bit(tmp_path):
    fixed, [rf], _ = run_job(tmp_path / "fixed", [(TrainShape(B0, 4, 4, steps=WORK), None)])
    same, [ra], _ = run_job(tmp_path / "ada", [(ada(B0, 4), None)])
    assert torch.equal(fixed, same)
    assert rf.progress == ra.progress == WORK and ra.step == WORK and ra.samples == rf.samples == WORK * B0
    assert ra.grad_noise_scale is not None and ra.grad_noise_scale > 0


def test_a_larger_batch_finishes_in_fewer_steps_worth_their_gains(tmp_path):
    _, [r], _ = run_job(tmp_path, [(ada(64, 16), None)])
    assert r.status == "done" and r.progress >= WORK
    assert r.step < WORK  # each step at 4x the batch is worth more than one, less than four
    assert WORK / 4 < r.step and r.samples == 64 * r.step
    ckpt = load_latest(tmp_path)
    assert ckpt.data_position == r.samples and ckpt.state["goodput"]["progress"] == r.progress


def test_resume_is_bit_identical_across_batch_changes(tmp_path):
    # The batch sequence: 16 (accumulated 4 x 4) for 3 steps, 64 on one micro-batch (the differenced estimate,
    # whose previous gradient travels in the checkpoint) for 3, then 32 (2 x 16) to the end.
    a, b, c = ada(16, 4, 20), ada(64, 64, 20), ada(32, 16, 20)
    ref, ref_results, _ = run_job(tmp_path / "ref", [(a, 3), (b, 3), (c, None)])
    assert ref_results[-1].steps_run > 1
    got, results, _ = run_job(tmp_path / "split", [(a, 1), (a, 2), (b, 1), (b, 1), (b, 1), (c, 1), (c, None)])
    assert torch.equal(got, ref)
    assert results[-1].progress == ref_results[-1].progress and results[-1].samples == ref_results[-1].samples
    assert results[-1].grad_noise_scale == ref_results[-1].grad_noise_scale
    ckpt = load_latest(tmp_path / "split")
    assert ckpt.state["goodput_prev_grad"] is None  # the last shape accumulates: no previous gradient kept


def test_a_new_batch_taken_in_process_is_the_relaunch_at_that_batch_bit_for_bit(tmp_path):
    # The batch sequence of the resume test, 16 -> 64 -> 32 after 3 steps each: relaunched, against one run that
    # finds each new shape offered (`runtime.rebatch`) at a step boundary and goes on at it.
    a, b, c = ada(16, 4, 20), ada(64, 64, 20), ada(32, 16, 20)
    ref, ref_results, _ = run_job(tmp_path / "ref", [(a, 3), (b, 3), (c, None)])
    ckpt = tmp_path / "in-process"
    model = build_tiny_lm(CFG, seed=0)
    offers = {3: b, 6: c}
    result = train(model, sgd(model), a, DATA, lm_loss, ckpt_dir=ckpt, data_seed=0, should_stop=lambda: False,
                   on_step=lambda step, loss: step in offers and rebatch.offer(ckpt, offers[step]),
                   progress=ProgressReporter(env={}))
    assert torch.equal(torch.cat([p.detach().flatten() for p in model.parameters()]), ref)
    assert (result.status, result.switches, result.steps_run) == ("done", 2, ref_results[-1].step)
    assert (result.progress, result.samples) == (ref_results[-1].progress, ref_results[-1].samples)
    assert not rebatch.waiting(ckpt)


def test_an_offer_the_loop_cannot_take_in_process_is_a_checkpoint_and_is_removed(tmp_path):
    ckpt = tmp_path / "ckpt"
    model = build_tiny_lm(CFG, seed=0)
    bf16 = TrainShape(32, 8, 4, precision="bf16", steps=20, lr_scaling="adascale", base_batch=16)
    result = train(model, sgd(model), ada(16, 4, 20), DATA, lm_loss, ckpt_dir=ckpt, data_seed=0,
                   should_stop=lambda: False, on_step=lambda step, loss: step == 2 and rebatch.offer(ckpt, bf16),
                   progress=ProgressReporter(env={}))
    assert (result.status, result.step, result.switches) == ("checkpointed", 2, 0)  # relaunched at Slurm's shape
    assert not rebatch.waiting(ckpt) and load_latest(ckpt).step == 2
    (ckpt / rebatch.NEXT_SHAPE_FILE).write_text("{not json")
    model = build_tiny_lm(CFG, seed=0)
    again = train(model, sgd(model), ada(16, 4, 20), DATA, lm_loss, ckpt_dir=ckpt, data_seed=0,
                  should_stop=lambda: False, progress=ProgressReporter(env={}))
    assert (again.status, again.steps_run) == ("checkpointed", 0) and not rebatch.waiting(ckpt)
    fixed = TrainShape(16, 4, 4, steps=3)  # a fixed-batch loop never looks for an offer
    rebatch.offer(tmp_path / "fixed", ada(32, 8, 3))
    model = build_tiny_lm(CFG, seed=0)
    done = train(model, sgd(model), fixed, DATA, lm_loss, ckpt_dir=tmp_path / "fixed", data_seed=0,
                 should_stop=lambda: False, progress=ProgressReporter(env={}))
    assert (done.status, done.samples) == ("done", 3 * 16) and rebatch.waiting(tmp_path / "fixed")


def test_which_shapes_switch_in_process():
    fam = Family(kind="train", total_work=100.0, default="gb16", shapes=tuple(
        Shape(name, Resources(mps, 1000, 1, 1000, gpus=gpus), 1.0,
              knobs=(("global_batch", gb), ("micro_batch", mb), ("precision", prec), ("base_batch", 16),
                     ("lr_scaling", "adascale")))
        for name, mps, gpus, gb, mb, prec in (("gb16", 100, 0, 16, 8, "fp32"), ("gb32", 100, 0, 32, 8, "fp32"),
                                              ("gb32-mb16", 100, 0, 32, 16, "fp32"), ("gb32-bf16", 100, 0, 32, 8, "bf16"),
                                              ("gb32-half", 50, 0, 32, 8, "fp32"), ("gb32-2gpus", 0, 2, 32, 8, "fp32"))))
    by = {s.name: s for s in fam.shapes}
    assert rebatch.in_process(fam, by["gb16"], by["gb32"]) and rebatch.in_process(fam, by["gb16"], by["gb32-mb16"])
    assert rebatch.in_process(fam, by["gb32"], by["gb32-mb16"])  # the same batch split otherwise
    for other in ("gb16", "gb32-bf16", "gb32-half", "gb32-2gpus"):  # itself, precision, share, GPU count
        assert not rebatch.in_process(fam, by["gb16"], by[other]), other
    fixed = dataclasses.replace(fam, shapes=tuple(dataclasses.replace(s, knobs=tuple(
        (k, v) for k, v in s.knobs if k not in ("lr_scaling", "base_batch"))) for s in fam.shapes))
    assert not rebatch.in_process(fixed, fixed.shapes[1], fixed.shapes[2])  # a fixed batch: never in process
    assert not rebatch.in_process(dataclasses.replace(fam, kind="infer"), by["gb16"], by["gb32"])


def test_the_progress_report_carries_the_statistical_progress_and_the_noise_scale(tmp_path):
    report = tmp_path / "progress.json"
    _, [r], _ = run_job(tmp_path / "ck", [(ada(64, 16), None)], progress=ProgressReporter(report, env={}))
    p = read_progress(report)
    assert p is not None and p.total == WORK and p.done == min(r.progress, WORK)
    assert p.grad_noise_scale == pytest.approx(r.grad_noise_scale)
    assert "grad_noise_scale" in json.loads(report.read_text())


def test_a_fixed_batch_report_has_no_noise_scale(tmp_path):
    report = tmp_path / "progress.json"
    run_job(tmp_path / "ck", [(TrainShape(B0, 8, 2, steps=2), None)], progress=ProgressReporter(report, env={}))
    assert "grad_noise_scale" not in json.loads(report.read_text())


def test_resumes_that_change_the_batch_rule_are_refused(tmp_path):
    run_job(tmp_path, [(ada(32, 16), 1)])
    with pytest.raises(ConfigError, match="written in goodput mode .* this run is at a fixed global batch"):
        run_job(tmp_path, [(TrainShape(B0, 8, 2, steps=WORK), None)])
    with pytest.raises(ConfigError, match="submitted batch 32 differs from the checkpoint's 16"):
        run_job(tmp_path, [(ada(32, 16, base=32), None)])
    with pytest.raises(ConfigError, match="lr_scaling 'sqrt' differs from the checkpoint's 'adascale'"):
        run_job(tmp_path, [(ada(32, 16, rule="sqrt"), None)])


@pytest.mark.parametrize(("rule", "make_opt", "words"), [
    ("adascale", lambda m: torch.optim.Adagrad(m.parameters(), lr=0.1), "does not support the optimizer Adagrad"),
    ("linear", lambda m: torch.optim.AdamW(m.parameters(), lr=0.1), "does not support the optimizer AdamW"),
])
def test_an_optimizer_the_rule_does_not_support_is_a_clear_error(tmp_path, rule, make_opt, words):
    with pytest.raises(ConfigError, match="batch.lr_scaling") as err:
        run_job(tmp_path, [(ada(32, 16, rule=rule), None)], make_opt=make_opt)
    assert words in str(err.value)


def test_adam_with_adascale_and_sqrt_train(tmp_path):
    def adam(m):
        return torch.optim.AdamW(m.parameters(), lr=3e-3, eps=1e-6)
    for rule in ("adascale", "sqrt"):
        _, [r], _ = run_job(tmp_path / rule, [(ada(64, 32, rule=rule), None)], make_opt=adam)
        assert r.status == "done" and r.progress >= WORK


def test_elastico_run_exports_goodput_mode_for_every_shape_of_an_adaptive_family():
    res = Resources(mps=100, gpu_mem_mib=1000, cpus=1, host_mem_mib=1000)
    own = Shape("mb16-fp32-mps100", res, 1.0, (("accumulation", 1), ("global_batch", 16), ("micro_batch", 16)))
    other = Shape("gb64-mb16-fp32-mps100", res, 1.0, (("accumulation", 4), ("global_batch", 64),
                                                      ("lr_scaling", "sqrt"), ("micro_batch", 16)))
    fam = Family("train", (own, other), 100.0, default=own.name)
    for s, batch in ((own, 16), (other, 64)):
        shape = runtime_shape(fam, s)
        assert (shape.global_batch, shape.base_batch, shape.lr_scaling) == (batch, 16, "sqrt")
        assert current_shape(shape.to_env()) == shape
    fixed = runtime_shape(Family("train", (own,), 100.0, default=own.name), own)
    assert not fixed.adaptive and "ELASTICO_LR_SCALING" not in fixed.to_env()


def test_job_environment_without_a_rule_keeps_the_batch():
    env = TrainShape(32, 8, 4, steps=3).to_env() | {"ELASTICO_BASE_BATCH": "16"}
    with pytest.raises(ConfigError, match="ELASTICO_BASE_BATCH=16 differs from ELASTICO_GLOBAL_BATCH=32"):
        current_shape(env)
    env = ada(32, 8).to_env()
    del env["ELASTICO_BASE_BATCH"]
    with pytest.raises(ConfigError, match="ELASTICO_BASE_BATCH is not set"):
        current_shape(env)


# ---------------------------------------------------------------------------------------------------------------
# convergence

CONV_STEPS = 200
CONVERGENCE_TOL = 0.05
"""|validation loss in goodput mode - at the fixed batch| in nats, from about 4.2 at the start to about 0.15."""


def _val_loss(seed: int, runs: Sequence[tuple[TrainShape, int | None]], tmp) -> tuple[float, object]:
    data = synthetic_tokens(1024, 16, 64, seed=100 + seed)
    val = synthetic_tokens(256, 16, 64, seed=200 + seed)
    _, results, model = run_job(tmp, runs, seed=seed, data=data)
    with torch.no_grad():
        return lm_loss(model, val).item(), results[-1]


def test_goodput_mode_reaches_the_fixed_batch_validation_loss_over_three_seeds(tmp_path, capsys):
    rows = []
    for seed in range(3):
        fixed, rf = _val_loss(seed, [(TrainShape(B0, 16, 1, steps=CONV_STEPS), None)], tmp_path / f"f{seed}")
        adaptive, ra = _val_loss(seed, [(ada(B0, 16, CONV_STEPS), CONV_STEPS // 4), (ada(64, 16, CONV_STEPS), None)],
                                 tmp_path / f"a{seed}")
        short, _ = _val_loss(seed, [(ada(64, 16, CONV_STEPS // 4), None)], tmp_path / f"s{seed}")
        rows.append((seed, fixed, adaptive, short, rf, ra))
    with capsys.disabled():
        for seed, fixed, adaptive, short, rf, ra in rows:
            print(f"\n  seed {seed}: validation loss fixed {fixed:.4f} ({rf.step} steps, {rf.samples} samples), "
                  f"goodput {adaptive:.4f} ({ra.step} steps, {ra.samples} samples, progress {ra.progress:.2f}, "
                  f"noise scale {ra.grad_noise_scale:.1f}); a quarter of the work: {short:.4f}")
    for seed, fixed, adaptive, short, rf, ra in rows:
        assert rf.progress == CONV_STEPS and ra.progress >= CONV_STEPS
        assert ra.step < rf.step  # the larger batch took fewer steps ...
        assert abs(adaptive - fixed) <= CONVERGENCE_TOL, (seed, fixed, adaptive)  # ... to the same loss
        assert short - fixed > 2 * CONVERGENCE_TOL  # the tolerance tells a finished job from an unfinished one


def test_activation_checkpointing_measures_the_same_gradients(tmp_path):
    plain, [rp], _ = run_job(tmp_path / "plain", [(ada(64, 16), None)])
    ck = TrainShape(64, 16, 4, checkpointing=True, steps=WORK, lr_scaling="adascale", base_batch=B0)
    toggled, [rt], _ = run_job(tmp_path / "ck", [(ck, None)])
    assert torch.equal(plain, toggled) and rt.grad_noise_scale == rp.grad_noise_scale


def test_fp16_loss_scaling_is_taken_out_of_the_measured_norms(tmp_path):
    _, [r32], _ = run_job(tmp_path / "fp32", [(ada(64, 16), 2)])
    fp16 = TrainShape(64, 16, 4, precision="fp16", steps=WORK, lr_scaling="adascale", base_batch=B0)
    _, [r16], _ = run_job(tmp_path / "fp16", [(fp16, 2)])
    # The grad scaler multiplies the loss by 65536: unless divided out, |G|^2 and the noise scale would be off
    # by 2^32; autocast itself moves them by far less than a factor of 2.
    assert 0.5 < r16.grad_noise_scale / r32.grad_noise_scale < 2


def test_relaunch_after_completion_is_a_no_op_even_at_another_batch(tmp_path):
    first, [r1], _ = run_job(tmp_path, [(ada(64, 16), None)])
    again, [r2], _ = run_job(tmp_path, [(ada(32, 16), None)])
    assert r2.status == "done" and r2.steps_run == 0 and torch.equal(first, again)
    assert (r2.progress, r2.samples, r2.step) == (r1.progress, r1.samples, r1.step)


def test_after_a_switch_in_process_the_reports_name_the_new_shape_from_the_switch_on(tmp_path):
    # The helper's observer measures a shape's speed between two reports naming the same shape; a report that went
    # on naming the old shape after the switch would credit the new batch's progress to the old shape.
    seen: list[tuple[str, float]] = []

    class Reports(ProgressReporter):
        def report(self, done, total, final=False, **kw):
            seen.append((self.shape, done))
            return True

    a, b = dataclasses.replace(ada(16, 4, 20), name="gb16"), dataclasses.replace(ada(64, 64, 20), name="gb64")
    ckpt = tmp_path / "ckpt"
    model = build_tiny_lm(CFG, seed=0)
    result = train(model, sgd(model), a, DATA, lm_loss, ckpt_dir=ckpt, data_seed=0, should_stop=lambda: False,
                   on_step=lambda step, loss: step == 3 and rebatch.offer(ckpt, b),
                   progress=Reports(env={"ELASTICO_SHAPE": "gb16"}))
    assert result.switches == 1
    names = [n for n, _ in seen]
    first_new = names.index("gb64")
    assert set(names[:first_new]) == {"gb16"} and set(names[first_new:]) == {"gb64"}
    # the old shape's last report is at the switch: its progress is what the 3 steps at 16 were worth
    assert seen[first_new - 1][1] == pytest.approx(3.0) and seen[first_new][1] > seen[first_new - 1][1]


def test_an_offer_written_while_the_program_takes_the_last_one_waits_for_the_next_step(tmp_path, monkeypatch):
    """elastico-run may offer again while the training loop is taking its last offer: the loop read the file and
    then removed it, the newer offer with it, and ran on the older shape while elastico-run believed the newer."""
    from pathlib import Path

    cur = TrainShape(16, 4, 4, steps=9, lr_scaling="adascale", base_batch=16, name="gb16")
    b = TrainShape(32, 8, 4, steps=9, lr_scaling="adascale", base_batch=16, name="gb32")
    c = TrainShape(64, 16, 4, steps=9, lr_scaling="adascale", base_batch=16, name="gb64")
    rebatch.offer(tmp_path, b)
    read = Path.read_text

    def read_then_offer_again(self, *args, **kwargs):
        text = read(self, *args, **kwargs)
        monkeypatch.setattr(Path, "read_text", read)
        rebatch.offer(tmp_path, c)  # elastico-run's next offer, between the loop's read and its removal
        return text

    monkeypatch.setattr(Path, "read_text", read_then_offer_again)
    assert rebatch.take(tmp_path, cur).name == "gb32"
    assert rebatch.waiting(tmp_path) and rebatch.take(tmp_path, b).name == "gb64"
    assert not rebatch.waiting(tmp_path) and sorted(p.name for p in tmp_path.iterdir()) == []
