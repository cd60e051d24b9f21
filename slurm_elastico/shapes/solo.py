"""The solo profile an interference model sees for one shape: the one place that mapping lives.

A shape a job was measured at alone (`Shape.measured`, from the NVML
counters elastico-run records, see `slurm_elastico.helper.observe`) gives its
measured counters. Otherwise utilisation is a first-order guess from the kind
and the share: training fills the SMs it is given and reads memory moderately;
inference decode reads memory hard whatever its share (MPS partitions SMs,
not bandwidth).
"""

from __future__ import annotations

import math
from slurm_elastico.interference.base import SoloProfile
from slurm_elastico.model import Shape

UTIL = {"train": (0.9, 0.5), "infer": (0.5, 0.8)}
"""(SM, memory bandwidth) utilisation of the whole GPU at share 100, per kind."""


def solo_profile(shape: Shape, kind: str, model_family: str = "") -> SoloProfile:
    """A `SoloProfile` for `shape` of a job of `kind` ("train" or "infer")."""
    share = shape.resources.mps
    sm, bw = UTIL.get(kind, UTIL["train"])
    if kind == "infer":
        batch = shape.knob("max_num_seqs", float("nan"))
        precision = "fp8" if shape.knob("kv_cache_dtype") == "fp8" else "bf16"
    else:
        batch = shape.knob("micro_batch", float("nan"))
        precision = str(shape.knob("precision", "fp32"))
    fields = dict(
        kind=kind if kind in UTIL else "train",
        throughput=shape.throughput,
        batch=float(batch),
        precision=precision,
        model_family=model_family,
        sm_util=sm * share / 100.0,
        membw_util=bw if kind == "infer" else bw * share / 100.0,
        mem_used_mib=float(shape.resources.gpu_mem_mib),
        mps_share=share,
    )
    m = shape.measured  # a counter NVML did not give (NaN) keeps the guess
    if m is not None:
        fields.update({f: getattr(m, f) for f in ("sm_util", "membw_util", "mem_used_mib", "power_w")
                       if math.isfinite(getattr(m, f))})
    return SoloProfile.of(fields)
