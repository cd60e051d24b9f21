"""Training loop helper for PyTorch: a job is `steps` optimizer steps at a fixed global batch, whatever the shape.

Each step takes the `global_batch` samples that `batch_indices(data_seed, step)`
names (a function of the seed and the step only, so any shape and any resume
sees the same data) and splits them into `accumulation` contiguous
micro-batches of `micro_batch`. Each micro-batch loss (a mean) is scaled by
micro_batch / global_batch, so the accumulated gradient is the mean over the
global batch for every split; only the summation order differs.

Data parallel: with `shape.ranks` > 1 the program runs once per rank under
torch's env:// variables (set by `elastico-run`; `runtime.dist` checks them:
WORLD_SIZE must equal `shape.ranks`). Every rank takes the same global batch
of the step and computes its contiguous slice of micro_batch x accumulation
samples (rank r: samples r*slice .. (r+1)*slice - 1) as `accumulation`
micro-batches with the same micro_batch / global_batch scaling; the gradients
are then summed over the ranks (a plain all-reduce of one flat buffer, no DDP
wrapper, so parameter names and checkpoints are those of the bare model), which
gives the global-batch mean as in one process, and every rank takes the same
optimizer step. Process group: gloo on the CPU, nccl on CUDA (put the model on
`runtime.dist.local_device()`); only gloo is tested here, nccl needs a GPU.
Rank 0 alone writes checkpoints (the unsharded model, optimizer, scaler,
scheduler and its RNG states) and progress reports; every rank loads the same
checkpoint, so a job can resume at any world size, micro-batch and
accumulation. The stop decision is agreed at each optimizer-step boundary (any
rank's `should_stop()` stops all), rank 0 saves, and every rank returns
`checkpointed` once the checkpoint is on disk. With WORLD_SIZE absent or 1
there is no process group: the loop is the single-process one, bit for bit.
A fresh start copies rank 0's initial parameters to every rank. On resume every
rank restores rank 0's RNG states, so random layers (dropout) draw the same
stream on each rank: a reshape across world sizes keeps such a model's
training statistically, not numerically, the same.

Precision: fp32 runs plain; bf16/fp16 run the forward under `torch.autocast`
on the model's device type. fp16 uses a `GradScaler` (on CUDA, and on CPU too,
where torch >= 2.3 supports it; CPU fp16 autocast covers fewer ops and is slow,
so it is for trying a family, not for speed). Activation checkpointing wraps
each of the model's `blocks` with `torch.utils.checkpoint` (use_reentrant=False)
without changing parameter names, so checkpoints load across the toggle.

Goodput mode (`shape.adaptive`: the family has `batch: {adaptive: true}` and
elastico-run set ELASTICO_LR_SCALING): the global batch may differ from run to
run. The data is then one stream of samples (`stream_indices`), each step
taking the next `global_batch` of it, so a resume at the same sequence of
batch sizes sees the same samples. Every step measures the gradient noise
scale from the squared norms of its micro-batch gradients on every rank
(parameter hooks see each micro-batch's gradient before accumulation) and of
their mean (`runtime.goodput.NoiseScale`; with one micro-batch on one rank,
from this and the previous step's gradient). The learning rate of each
parameter group is multiplied for that step by the rule's factor and put
back after it (a scheduler sees the unscaled value), and the step counts its
gain towards the job's progress: `shape.steps` are steps of the submitted
batch, and the job ends when the progress reaches them. The estimates, the
progress, the samples used and the previous gradient travel in the
checkpoint, so a resume is bit-identical to an uninterrupted run at the same
batch sizes. At the submitted batch the gain and the AdaScale factor are
exactly 1, so such a run matches a fixed-batch run bit for bit.

At every optimizer-step boundary the loop asks `should_stop()` (default:
`checkpoint_requested()`); on yes it saves and returns `EXIT_CHECKPOINTED`.
On start it resumes from the newest good checkpoint. Resuming restores model,
optimizer, scaler, scheduler and RNG states, so a resume without a shape
change gives bit-identical parameters (fp32, deterministic algorithms).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint as _checkpoint

from slurm_elastico.errors import ConfigError
from slurm_elastico.runtime.checkpoint import load_latest, restore_rng, save_checkpoint, state_path
from slurm_elastico.runtime.data_order import batch_indices, stream_indices
from slurm_elastico.runtime.dist import Group, membership
from slurm_elastico.runtime.goodput import NoiseScale, done, optimizer_rule_problem
from slurm_elastico.runtime.noise_gauge import NoiseGauge
from slurm_elastico.runtime import rebatch
from slurm_elastico.runtime.progress import ProgressReporter
from slurm_elastico.runtime.shape import EXIT_CHECKPOINTED, TrainShape
from slurm_elastico.runtime.signals import checkpoint_requested

log = logging.getLogger(__name__)

AMP_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


@dataclass(frozen=True)
class TrainResult:
    """How a run ended: `done` (all steps), or `checkpointed` (stopped on request; relaunch to continue)."""

    status: str
    step: int
    """Optimizer steps completed by the job so far (all runs together)."""
    steps_run: int
    """Steps this run executed."""
    resumed_from: int | None
    checkpoint: Path | None
    checkpoint_seconds: float = 0.0
    last_loss: float | None = None
    samples: int = 0
    """Samples the job used so far (all runs together)."""
    progress: float = 0.0
    """What the steps were worth in steps of the submitted batch: `step` for a fixed batch, the sum of the
    steps' gains in goodput mode."""
    grad_noise_scale: float | None = None
    """Goodput mode: the smoothed gradient noise scale at the end (samples); None otherwise or before measured."""
    switches: int = 0
    """Goodput mode: how often this run went on at a new batch in process (`runtime.rebatch`)."""

    @property
    def exit_code(self) -> int:
        return 0 if self.status == "done" else EXIT_CHECKPOINTED


def set_activation_checkpointing(model: nn.Module, enabled: bool, blocks: Any = None) -> None:
    """Turn activation checkpointing on or off for each module in `blocks` (default `model.blocks`).

    Patches each block's `forward` on the instance rather than wrapping the
    module, so parameter names and checkpoints stay the same either way.
    """
    blocks = model.blocks if blocks is None else blocks  # type: ignore[union-attr]
    for block in blocks:
        if "forward" in vars(block):
            del block.forward  # back to the class's forward
        if enabled:
            block.forward = partial(_checkpoint, block.forward, use_reentrant=False)  # type: ignore[method-assign]


def autocast_for(precision: str, device: torch.device) -> contextlib.AbstractContextManager[Any]:
    """`torch.autocast` for bf16/fp16 on the device's type; a null context for fp32."""
    dtype = AMP_DTYPES.get(precision)
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=dtype)


def _to_device(batch: Any, device: torch.device) -> Any:
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=True)
    if isinstance(batch, (tuple, list)):
        return type(batch)(_to_device(b, device) for b in batch)
    if isinstance(batch, dict):
        return {k: _to_device(v, device) for k, v in batch.items()}
    return batch


def _micro_batches(indices: torch.Tensor, shape: TrainShape, rank: int) -> Iterator[torch.Tensor]:
    """`rank`'s micro-batches of the step whose global batch is `indices` (`TrainShape.micro_parts`)."""
    first, _ = shape.rank_part(rank)
    for k, n in shape.micro_parts(rank):
        yield indices[first + k : first + k + n]


def train(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    shape: TrainShape,
    data: Any,
    loss_fn: Callable[[nn.Module, Any], torch.Tensor],
    *,
    ckpt_dir: str | os.PathLike[str],
    data_seed: int = 0,
    scheduler: Any = None,
    device: str | torch.device | None = None,
    should_stop: Callable[[], bool] = checkpoint_requested,
    checkpoint_every: int | None = None,
    max_grad_norm: float | None = None,
    keep: int = 2,
    on_step: Callable[[int, float], None] | None = None,
    progress: ProgressReporter | None = None,
    env: Mapping[str, str] | None = None,
) -> TrainResult:
    """Run (or resume) the job's `shape.steps` optimizer steps; stop and checkpoint when `should_stop()` says so.

    `data` is indexable by a LongTensor of sample indices (a tensor is) and
    has a len(); `loss_fn(model, micro_batch)` returns the micro-batch's mean
    loss. The model and optimizer must be built the same way on every
    (re)start; their state comes from the checkpoint. `on_step(step, loss)`
    is called after each optimizer step (step counts from 1). Progress
    (steps done of `shape.steps`; in goodput mode the statistical progress and
    the gradient noise scale) goes to `progress` (default: the report file
    elastico-run names, see `runtime.progress`). Rank membership comes from
    torch's env:// variables in `env` (default `os.environ`); a WORLD_SIZE
    other than `shape.ranks` is a ConfigError, and so is, in goodput mode, an
    optimizer the shape's learning-rate rule does not support (`runtime.goodput`). On ranks other than 0,
    `progress` is ignored and `checkpoint_seconds` is 0; `on_step` runs on
    every rank with the global batch's mean loss (the same on all ranks).
    If one rank fails, the others wait in the next collective until the
    process group's timeout: the launcher must end them all.
    """
    member = membership(shape.ranks, env)
    device = torch.device(device) if device is not None else next(model.parameters()).device
    with Group(member, device) as group:
        return _train(model, optimizer, shape, data, loss_fn, ckpt_dir, data_seed, scheduler, device, should_stop,
                      checkpoint_every, max_grad_norm, keep, on_step, progress, group)


def _train(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    shape: TrainShape,
    data: Any,
    loss_fn: Callable[[nn.Module, Any], torch.Tensor],
    ckpt_dir: str | os.PathLike[str],
    data_seed: int,
    scheduler: Any,
    device: torch.device,
    should_stop: Callable[[], bool],
    checkpoint_every: int | None,
    max_grad_norm: float | None,
    keep: int,
    on_step: Callable[[int, float], None] | None,
    progress: ProgressReporter | None,
    group: Group,
) -> TrainResult:
    main = group.member.is_main
    if not main:
        progress = ProgressReporter(env={})  # reports nothing: rank 0 speaks for the job
    progress = progress if progress is not None else ProgressReporter()
    dataset_len = len(data)
    scaler = torch.amp.GradScaler(device.type, enabled=shape.precision == "fp16")
    set_activation_checkpointing(model, shape.checkpointing)
    gauge: NoiseGauge | None = None
    if shape.adaptive:
        why = optimizer_rule_problem(shape.lr_scaling, optimizer)
        if why:
            raise ConfigError("goodput mode", [why])
        gauge = NoiseGauge(NoiseScale(shape.base_batch))

    step = 0
    resumed_from = None
    ckpt = load_latest(ckpt_dir, map_location=device)
    if ckpt is not None:
        _check_compatible(ckpt.state, shape, data_seed, ckpt.path)
        model.load_state_dict(ckpt.state["model"])
        optimizer.load_state_dict(ckpt.state["optimizer"])
        if scheduler is not None and ckpt.state.get("scheduler") is not None:
            scheduler.load_state_dict(ckpt.state["scheduler"])
        if scaler.is_enabled() and ckpt.state.get("scaler"):
            scaler.load_state_dict(ckpt.state["scaler"])  # fp32/bf16 -> fp16 starts a fresh scale
        restore_rng(ckpt.rng, device)
        step = resumed_from = ckpt.step
        if gauge is not None:
            gauge.restore(ckpt.state, shape.global_batch, device)
        log.info("resumed from %s at step %d (shape %s)", ckpt.path, step, shape)
    else:
        group.broadcast_module(model)  # a fresh start: every rank begins from rank 0's initial parameters
    step = group.agreed_step(step)
    saved_step = step if ckpt is not None else None

    def report(final: bool = False) -> None:
        if gauge is None:
            progress.report(step, shape.steps, final=final, steps=step, samples=step * shape.global_batch)
        else:  # a report's done may not exceed its total; the last step may overshoot the work
            progress.report(min(gauge.ns.progress, shape.steps), shape.steps, final=final,
                            grad_noise_scale=gauge.ns.phi, steps=gauge.ns.steps, samples=gauge.ns.samples)

    def result(status: str) -> TrainResult:
        if gauge is None:
            return TrainResult(status, step, steps_run, resumed_from, path, seconds, last_loss,
                               step * shape.global_batch, float(step))
        return TrainResult(status, step, steps_run, resumed_from, path, seconds, last_loss, gauge.ns.samples,
                           gauge.ns.progress, gauge.ns.phi, switches)

    def unfinished() -> bool:
        return step < shape.steps if gauge is None else not done(gauge.ns.progress, shape.steps)

    report(final=True)

    def save() -> tuple[Path, float]:
        """Rank 0 writes the checkpoint; every rank returns once it is on disk."""
        if not main:
            group.barrier()
            return state_path(Path(ckpt_dir), step), 0.0
        t0 = time.perf_counter()
        state = {
            "model": model.state_dict(),
            "optimizer": optimizer.state_dict(),
            "scheduler": scheduler.state_dict() if scheduler is not None else None,
            "scaler": scaler.state_dict(),
            "data_seed": data_seed,
            "global_batch": shape.global_batch,
            "shape": dataclasses.asdict(shape),
        }
        position = step * shape.global_batch
        if gauge is not None:
            state.update(gauge.state())
            position = gauge.ns.samples
        path = save_checkpoint(ckpt_dir, step, state, data_position=position, keep=keep)
        seconds = time.perf_counter() - t0
        group.barrier()
        return path, seconds

    model.train()
    steps_run = switches = 0
    last_loss = None
    path = ckpt.path if ckpt is not None else None
    seconds = 0.0
    if gauge is not None:
        gauge.attach(model, optimizer)
    try:
        while unfinished():
            stop = should_stop()
            if gauge is None:
                stop = group.any(stop)
            else:  # goodput mode: a new batch offered in process (`runtime.rebatch`), agreed with the stop
                stop, new = rebatch.agree(stop, shape, ckpt_dir, group)
                if new is not None:
                    if main:
                        log.info("step %d: batch %d -> %d in process (shape %s: micro %d x %d x %d ranks)", step,
                                 shape.global_batch, new.global_batch, new.name, new.micro_batch, new.accumulation,
                                 new.ranks)
                    report(final=True)  # the old shape's last report, then reports name the new one: no measured
                    progress.shape = new.name or progress.shape  # interval spans the switch (`helper.observe`)
                    shape, switches = new, switches + 1
            if stop:
                if saved_step != step:
                    path, seconds = save()
                report(final=True)
                return result("checkpointed")
            last_loss = _optimizer_step(
                model, optimizer, scaler, shape, data, loss_fn, data_seed, step, dataset_len, device, max_grad_norm,
                group, gauge
            )
            if scheduler is not None:
                scheduler.step()
            step += 1
            steps_run += 1
            report()
            if on_step is not None:
                on_step(step, last_loss)
            if checkpoint_every and step % checkpoint_every == 0 and unfinished():
                path, seconds = save()
                saved_step = step
    finally:
        if gauge is not None:
            gauge.detach()
    if saved_step != step:
        path, seconds = save()  # the final state, so a relaunch after completion is a no-op
    report(final=True)
    if gauge is not None and main:
        log.info("done: %d steps, %d samples, worth %.6g steps of the submitted batch %d (work %d); noise scale %s",
                 step, gauge.ns.samples, gauge.ns.progress, shape.base_batch, shape.steps, gauge.ns.phi)
    return result("done")


def _optimizer_step(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    scaler: torch.amp.GradScaler,
    shape: TrainShape,
    data: Any,
    loss_fn: Callable[[nn.Module, Any], torch.Tensor],
    data_seed: int,
    step: int,
    dataset_len: int,
    device: torch.device,
    max_grad_norm: float | None,
    group: Group,
    gauge: NoiseGauge | None = None,
) -> float:
    """One optimizer step over the global batch of `step`: this rank's slice as `accumulation` micro-batches,
    gradients summed over the ranks; returns the global batch's mean loss. In goodput mode (`gauge`) the
    batch is the next `global_batch` samples of the stream, the noise scale is updated, the learning rate
    scaled for this step and the step's gain counted."""
    optimizer.zero_grad(set_to_none=True)
    total = 0.0
    if gauge is None:
        indices = batch_indices(data_seed, step, shape.global_batch, dataset_len)
    else:
        indices = stream_indices(data_seed, gauge.ns.samples, shape.global_batch, dataset_len)
        gauge.begin()
    for micro in _micro_batches(indices, shape, group.member.rank):
        weight = len(micro) / shape.global_batch  # the micro-batch's mean loss counts for its samples
        batch = _to_device(data[micro], device)
        with autocast_for(shape.precision, device):
            loss = loss_fn(model, batch)
        scaler.scale(loss.float() * weight).backward()
        total += loss.item() * weight
        if gauge is not None:
            gauge.micro_done(weight)
    group.sum_grads(model.parameters())
    total = group.sum_scalar(total)
    if gauge is not None:
        gauge.measure(shape, scaler.get_scale() if scaler.is_enabled() else 1.0, group)
    if max_grad_norm is not None:
        scaler.unscale_(optimizer)
        nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
    if gauge is None:
        scaler.step(optimizer)
    else:
        factor = gauge.ns.lr_factor(shape.lr_scaling, shape.global_batch, optimizer)
        saved = [g["lr"] for g in optimizer.param_groups]
        for g in optimizer.param_groups:
            g["lr"] = g["lr"] * factor
        try:
            scaler.step(optimizer)
        finally:
            for g, lr in zip(optimizer.param_groups, saved):
                g["lr"] = lr
        gauge.ns.count_step(shape.global_batch)
    scaler.update()
    return total


def _check_compatible(state: dict[str, Any], shape: TrainShape, data_seed: int, path: Path) -> None:
    """Refuse a resume that would change the job's mathematics (global batch, data order); in goodput mode the
    global batch may change, the submitted batch and the learning-rate rule may not."""
    problems = []
    was_adaptive = "goodput" in state
    if was_adaptive != shape.adaptive:
        problems.append(
            f"the checkpoint was written {'in goodput mode (an adaptive batch)' if was_adaptive else 'at a fixed global batch'}"
            f" but this run is {'in goodput mode' if shape.adaptive else 'at a fixed global batch'};"
            " a job keeps its family's batch rule"
        )
    elif shape.adaptive:
        if state.get("base_batch") != shape.base_batch:
            problems.append(f"submitted batch {shape.base_batch} differs from the checkpoint's {state.get('base_batch')};"
                            " the job's work is counted in steps of one submitted batch")
        old_rule = (state.get("shape") or {}).get("lr_scaling")
        if old_rule != shape.lr_scaling:
            problems.append(f"lr_scaling {shape.lr_scaling!r} differs from the checkpoint's {old_rule!r};"
                            " a job keeps its learning-rate rule")
    elif state.get("global_batch") != shape.global_batch:
        problems.append(
            f"global batch {shape.global_batch} differs from the checkpoint's {state.get('global_batch')};"
            " a reshape must keep the global batch"
        )
    if state.get("data_seed") != data_seed:
        problems.append(f"data seed {data_seed} differs from the checkpoint's {state.get('data_seed')}; the data order would change")
    if problems:
        raise ConfigError(f"resume from {path}", problems)
