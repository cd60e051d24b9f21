"""A documented first-order throughput and GPU-memory model for shapes nobody declared or profiled.

Its job is to rank a family's shapes sensibly before a profile exists; the
absolute numbers are guesses, so a declared or profiled figure always wins
(see `slurm_elastico.shapes.enumerate`). Each formula is in the docstring of
its function; constants are named and the spec's `model:` hints override them.

Share: MPS caps the SMs a job may use, not memory bandwidth, so speed grows
sub-linearly with the share: `speed(s) = (s/100) ** alpha`, with alpha 0.9 for
training (compute bound) and 0.6 for inference decode (bandwidth bound).

GPU count (n > 1 whole GPUs), the scaling rule: a training shape runs n
data-parallel ranks, each computing global/n samples a step, then an all-reduce
of the gradients (`train`); an inference shape runs n independent engine
replicas (n times the rate) or one engine with tensor_parallel_size n (weights
split n ways, speed `n ** TP_EXPONENT`; `infer`). A declared or profiled
throughput for the shape's name overrides the rule, as for every shape.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from slurm_elastico.runtime.split import accumulation_for, largest_part

MIB = 1024.0 * 1024.0
CUDA_CONTEXT_MIB = 600.0
"""Per-process CUDA context and allocator slack, on every shape."""

ALPHA = {"train": 0.9, "infer": 0.6}

TRAIN_DEFAULTS = {
    "params": 25e6,
    "activation_mib_per_sample": 40.0,
    "step_time_s": 1.0,
    "micro_batch_knee": 8.0,
    "allreduce_gib_s": 10.0,
}
GRAD_BYTES = 4.0
"""Bytes per parameter in the gradient all-reduce (fp32 gradients, whatever the compute precision)."""
TP_EXPONENT = 0.8
"""Tensor-parallel speed-up at n GPUs: n ** 0.8 (an all-reduce per layer eats the rest)."""
PRECISION_SPEED = {"fp32": 1.0, "bf16": 0.5, "fp16": 0.5}
"""Step-time factor: half precision runs on tensor cores at about twice the speed."""
PRECISION_ACTIVATION = {"fp32": 1.0, "bf16": 0.55, "fp16": 0.55}
PARAM_BYTES = {"fp32": 16.0, "bf16": 18.0, "fp16": 18.0}
"""fp32 weights, grads and two Adam moments; mixed precision adds a half copy of the weights."""
CKPT_ACTIVATION = 0.3
"""Activation checkpointing keeps about this fraction of activations ..."""
CKPT_TIME = 1.33
"""... and pays about one more forward pass."""

INFER_DEFAULTS = {
    "weights_mib": 15000.0,
    "kv_mib_per_seq": 128.0,
    "requests_per_s": 10.0,
    "concurrency_knee": 32.0,
}
KV_BYTES = {"auto": 1.0, "fp8": 0.5}
KV_SPEED = {"auto": 1.0, "fp8": 0.95}
"""fp8 KV halves the cache per sequence and costs a little dequantisation time."""


def speed(kind: str, share: int) -> float:
    """Fraction of whole-GPU speed at an MPS share (percent)."""
    return (max(1, min(share, 100)) / 100.0) ** ALPHA[kind]


def train(hints: Mapping[str, float], global_batch: int, micro: int, precision: str, ckpt: bool,
          share: int, ranks: int = 1, base_batch: int | None = None) -> tuple[float, float]:
    """(steps/s, GPU MiB per GPU) of one training shape; `ranks` > 1: that many whole GPUs (share 100).

    A micro-batch of m samples takes `t_s * (m + knee)`: the `knee` term is the
    fixed per-launch cost that makes small micro-batches inefficient. One step
    runs global/m micro-batches, so `step = t_s * (G + (G/m) * knee)`, with
    `t_s` set so that the step at m = G, fp32, no checkpointing, whole GPU
    equals the `step_time_s` hint. Memory = parameter state + m × activation
    per sample (scaled by precision and checkpointing) + CUDA context.

    With n ranks each computes b = G/n samples in b/m micro-batches,
    `t_s * (b + (b/m) * knee)`, then a ring all-reduce of the gradients moves
    `2 (n-1)/n × params × GRAD_BYTES` at `allreduce_gib_s`; the step is the sum
    (no overlap of compute and communication assumed). At n = 1 the all-reduce
    is 0 and the step is the one above.

    `base_batch`: the batch `step_time_s` was given for, when `global_batch` is another one (an adaptive
    family's shape at another batch): the time per sample comes from it.
    """
    h = {**TRAIN_DEFAULTS, **hints}
    knee = h["micro_batch_knee"]
    t_sample = h["step_time_s"] / ((base_batch or global_batch) + knee)
    per_rank = largest_part(global_batch, ranks)
    accumulation = accumulation_for(global_batch, micro, ranks)
    step = t_sample * (per_rank + accumulation * knee) * PRECISION_SPEED[precision]
    if ckpt:
        step *= CKPT_TIME
    if ranks > 1:
        step += 2.0 * (ranks - 1) / ranks * h["params"] * GRAD_BYTES / (h["allreduce_gib_s"] * 1024.0 * MIB)
    throughput = speed("train", share) / step
    act = micro * h["activation_mib_per_sample"] * PRECISION_ACTIVATION[precision] * (CKPT_ACTIVATION if ckpt else 1.0)
    mem = h["params"] * PARAM_BYTES[precision] / MIB + act + CUDA_CONTEXT_MIB
    return throughput, mem


def infer(hints: Mapping[str, float], gpu_memory_mib: int, gmu: float, max_num_seqs: int, kv_dtype: str,
          share: int, gpus: int = 1, parallel: str = "") -> tuple[float, float]:
    """(requests/s, GPU MiB per GPU) of one vLLM shape; throughput 0 when the KV cache has no room.

    vLLM takes `gmu × GPU memory` up front; what the weights and context leave
    is KV cache, holding `kv_room / kv_per_seq` sequences. Concurrency n =
    min(max_num_seqs, that); throughput saturates as `n / (n + knee)` of the
    `requests_per_s` hint (batching amortises the weight reads).

    On `gpus` whole GPUs: `parallel` "replicas" runs that many engines, each as
    above (the rate times `gpus`); "tensor" splits the weights over the GPUs
    (weights/gpus on each) and runs `gpus ** TP_EXPONENT` times faster.
    """
    h = {**INFER_DEFAULTS, **hints}
    mem = gmu * gpu_memory_mib
    tensor = gpus if gpus > 1 and parallel == "tensor" else 1
    kv_room = mem - h["weights_mib"] / tensor - CUDA_CONTEXT_MIB
    kv_per_seq = h["kv_mib_per_seq"] * KV_BYTES[kv_dtype]
    fits = math.floor(kv_room / kv_per_seq) if kv_room > 0 else 0
    n = min(max_num_seqs, fits)
    if n < 1:
        return 0.0, mem
    rate = h["requests_per_s"] * (n / (n + h["concurrency_knee"])) * KV_SPEED[kv_dtype] * speed("infer", share)
    if gpus > 1:
        rate *= tensor ** TP_EXPONENT if parallel == "tensor" else gpus
    return rate, mem
