"""Goodput mode's measuring inside the training loop: each micro-batch's squared gradient norm, on every rank.

Parameter hooks see each backward pass's contribution to a parameter's gradient before it is accumulated,
that is the micro-batch's own gradient (times the loss weight and the fp16 loss scale, both divided out).
After the gradients are summed over the ranks, the step's squared norms go to `runtime.goodput.NoiseScale`.
With one micro-batch on one rank there is only one gradient a step: it is kept (fp32, the size of the
parameters) for the next step's pair, and travels in the checkpoint so a resume measures what an
uninterrupted run would. The hooks change no gradient, so goodput mode at the submitted batch computes
exactly what the fixed-batch loop computes.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from slurm_elastico.runtime.dist import Group
from slurm_elastico.runtime.goodput import NoiseScale
from slurm_elastico.runtime.shape import TrainShape


class NoiseGauge:
    """Goodput mode's measuring in the loop: per-micro-batch squared gradient norms from parameter hooks, the
    previous step's gradient for the one-gradient case, and the `NoiseScale` they feed."""

    def __init__(self, ns: NoiseScale):
        self.ns = ns
        self.params: list[nn.Parameter] = []
        self.handles: list[Any] = []
        self.pending: torch.Tensor | float = 0.0
        self.micro_sqr: list[float] = []
        self.prev: torch.Tensor | None = None
        self.prev_batch = 0

    def attach(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
        self.params = [p for g in optimizer.param_groups for p in g["params"] if p.requires_grad]
        self.handles = [p.register_hook(self._hook) for p in self.params]

    def detach(self) -> None:
        for h in self.handles:
            h.remove()
        self.handles = []

    def _hook(self, grad: torch.Tensor) -> None:
        # This backward's contribution to the parameter's gradient (before accumulation): the micro-batch's.
        self.pending = self.pending + grad.detach().pow(2).sum(dtype=torch.float64)  # a tensor: no device sync here

    def begin(self) -> None:
        self.pending = 0.0
        self.micro_sqr = []

    def micro_done(self, weight: float) -> None:
        """The micro-batch just computed is done; its loss was weighted by `weight` (its samples / the batch).

        Kept: its squared gradient norm (the hook saw weight × the micro-batch's mean gradient) times its weight,
        so that their sum over the step is the size-weighted mean of the pieces' squared norms (`measure`)."""
        self.micro_sqr.append(float(self.pending) / weight)
        self.pending = 0.0

    def measure(self, shape: TrainShape, loss_scale: float, group: Group) -> None:
        """Fold this step's statistics (after the gradients were summed over the ranks) into the estimates.

        The pieces' squared norms are averaged weighted by their sizes b_i (Σ b_i = B): a piece's expected squared
        norm is |G|² + S / b_i, so the weighted mean expects |G|² + S · count / B whatever the sizes, which is
        what `NoiseScale.observe` expects of `count` equal pieces. A split that does not divide the batch (pieces
        one sample apart, or a shorter last one) is measured without bias; an even split as the plain mean."""
        local_sqr = group.sum_scalar(sum(self.micro_sqr) / loss_scale**2)  # ... and the loss scale
        count = shape.micro_count
        grads = [p.grad.detach() for p in self.params if p.grad is not None]
        total_sqr = sum(float(g.pow(2).sum(dtype=torch.float64)) for g in grads) / loss_scale**2
        if count >= 2:  # no copy of the gradient: the norms are all it takes
            self.ns.observe(local_sqr, total_sqr, count, shape.global_batch)
            self.prev = None
            return
        # One gradient a step: keep it (fp32, one copy of the parameters' size) for the next step's pair.
        flat = torch.cat([g.reshape(-1).float() for g in grads]) / loss_scale if grads else torch.zeros(0)
        if self.prev is not None and self.prev_batch == shape.global_batch and self.prev.numel() == flat.numel():
            local = (float(self.prev.pow(2).sum(dtype=torch.float64)) + total_sqr) / 2
            both = float(((self.prev + flat) / 2).pow(2).sum(dtype=torch.float64))
            self.ns.observe_differenced(local, both, shape.global_batch)
        if math.isfinite(total_sqr):
            self.prev, self.prev_batch = flat, shape.global_batch

    def state(self) -> dict[str, Any]:
        return {"goodput": self.ns.to_state(), "goodput_prev_grad": None if self.prev is None else self.prev.cpu(),
                "goodput_prev_batch": self.prev_batch, "base_batch": self.ns.base_batch}

    def restore(self, state: Mapping[str, Any], batch: int, device: torch.device) -> None:
        self.ns = NoiseScale.from_state(state["goodput"])
        prev = state.get("goodput_prev_grad")
        self.prev_batch = int(state.get("goodput_prev_batch", 0))
        self.prev = prev.to(device) if prev is not None and self.prev_batch == batch else None
