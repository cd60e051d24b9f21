"""GPU types by their public specifications: peak throughput per precision, memory bandwidth and size, features.

Why: on a cluster that mixes GPU generations a family is enumerated per type
(`shapes.typed`) and a job's speed on a type where it never ran is estimated
from the types where it did (`shapes.type_speed`); both need each type's
figures. The table holds the vendor's published peak figures, nothing fitted.

Sources (each row's `source` names its own): NVIDIA's product datasheets
(T4, V100, A100, H100 SXM5, L4, L40S, A10, Quadro RTX 6000, RTX A6000) and,
for the GeForce RTX 2080 Ti, NVIDIA's Turing architecture whitepaper
(appendix table, reference-clock card). Figures are *dense* peaks (the
datasheets' "with sparsity" figures are halved); the half-precision figure is
the tensor-core rate with FP32 accumulate, what mixed-precision training uses
(GeForce Turing runs it at half its FP16-accumulate rate: 53.8, not 107.6).
`fp32_tflops` is the non-tensor FP32 rate. Trap: PyTorch runs cuDNN
convolutions in TF32 by default on Ampere and later, so an "fp32" convolution
job there can beat the FP32 peak ratio; `type_speed` carries that in its
uncertainty rather than guessing the job's kernels.

Precision support (`supports`): bf16 needs compute capability 8.0 or later
(CUDA C++ Programming Guide, `__nv_bfloat16` arithmetic and the bf16 tensor
core MMA shapes start with sm_80; PyTorch's `torch.cuda.is_bf16_supported()`
checks the same), so no bf16 on V100 (7.0), T4, RTX 2080 Ti or Quadro RTX 6000
(7.5). fp16 tensor cores exist from Volta (7.0), so fp16 is offered from 7.0;
fp32 everywhere. Compute capabilities from NVIDIA's CUDA GPUs list.

Names: Slurm sites name types freely in gres.conf (`a100`, `A100-SXM4-80GB`,
`tesla_v100`...). `canonical` lower-cases, drops vendor words (nvidia, tesla,
geforce, quadro is kept where it is the product) and maps the aliases below;
a type it does not know needs declared figures (`declare`), else
`UnknownGpuType` names it and says how to declare it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from slurm_elastico.errors import ConfigError


@dataclass(frozen=True)
class GpuSpec:
    """One GPU type's public figures: dense peak TFLOPS per precision, memory bandwidth (GB/s) and size (GiB)."""

    name: str
    fp32_tflops: float
    fp16_tflops: float
    """Tensor-core FP16 with FP32 accumulate, dense (0: no fp16 tensor cores)."""
    bf16_tflops: float
    """Tensor-core BF16, dense (0: the type has no bf16)."""
    mem_bw_gbs: float
    memory_gib: float
    capability: tuple[int, int]
    """CUDA compute capability (major, minor)."""
    source: str = ""

    def peak(self, precision: str) -> float:
        """Peak dense TFLOPS at `precision` (fp32, fp16, bf16); for a half precision the type lacks, its fp32 rate."""
        half = {"fp16": self.fp16_tflops, "bf16": self.bf16_tflops}.get(precision, 0.0)
        return half if half > 0 else self.fp32_tflops


_DS = "NVIDIA {} datasheet"
KNOWN: dict[str, GpuSpec] = {s.name: s for s in (
    GpuSpec("t4", 8.1, 65.0, 0.0, 320.0, 16.0, (7, 5), _DS.format("T4 Tensor Core GPU")),
    GpuSpec("v100-16gb", 15.7, 125.0, 0.0, 900.0, 16.0, (7, 0), _DS.format("V100 Tensor Core GPU (SXM2)")),
    GpuSpec("v100-32gb", 15.7, 125.0, 0.0, 900.0, 32.0, (7, 0), _DS.format("V100 Tensor Core GPU (SXM2)")),
    GpuSpec("a100-40gb", 19.5, 312.0, 312.0, 1555.0, 40.0, (8, 0), _DS.format("A100 Tensor Core GPU (SXM4 40GB)")),
    GpuSpec("a100-80gb", 19.5, 312.0, 312.0, 2039.0, 80.0, (8, 0), _DS.format("A100 Tensor Core GPU (SXM4 80GB)")),
    GpuSpec("h100", 67.0, 989.5, 989.5, 3350.0, 80.0, (9, 0), _DS.format("H100 Tensor Core GPU (SXM5)")),
    GpuSpec("l4", 30.3, 121.0, 121.0, 300.0, 24.0, (8, 9), _DS.format("L4 Tensor Core GPU")),
    GpuSpec("l40s", 91.6, 362.05, 362.05, 864.0, 48.0, (8, 9), _DS.format("L40S")),
    GpuSpec("a10", 31.2, 125.0, 125.0, 600.0, 24.0, (8, 6), _DS.format("A10 Tensor Core GPU")),
    GpuSpec("rtx-2080-ti", 13.4, 53.8, 0.0, 616.0, 11.0, (7, 5),
            "NVIDIA Turing GPU Architecture whitepaper, appendix (GeForce RTX 2080 Ti, reference clocks)"),
    GpuSpec("quadro-rtx-6000", 16.3, 130.5, 0.0, 672.0, 24.0, (7, 5), _DS.format("Quadro RTX 6000")),
    GpuSpec("rtx-a6000", 38.7, 154.8, 154.8, 768.0, 48.0, (8, 6), _DS.format("RTX A6000")),
)}

ALIASES: dict[str, str] = {
    "t4": "t4",
    "v100": "v100-16gb", "v100-16": "v100-16gb", "v100-sxm2-16gb": "v100-16gb", "v100-pcie-16gb": "v100-16gb",
    "v100-32": "v100-32gb", "v100-sxm2-32gb": "v100-32gb", "v100-pcie-32gb": "v100-32gb",
    "a100": "a100-40gb", "a100-40": "a100-40gb", "a100-sxm4-40gb": "a100-40gb", "a100-pcie-40gb": "a100-40gb",
    "a100-80": "a100-80gb", "a100-sxm4-80gb": "a100-80gb", "a100-pcie-80gb": "a100-80gb", "a100-80g": "a100-80gb",
    "h100": "h100", "h100-sxm": "h100", "h100-sxm5": "h100", "h100-80gb": "h100", "h100-sxm5-80gb": "h100",
    "l4": "l4", "l40s": "l40s", "a10": "a10",
    "rtx-2080-ti": "rtx-2080-ti", "rtx2080ti": "rtx-2080-ti", "2080ti": "rtx-2080-ti", "2080-ti": "rtx-2080-ti",
    "rtx-2080ti": "rtx-2080-ti",
    "quadro-rtx-6000": "quadro-rtx-6000", "rtx6000": "quadro-rtx-6000", "rtx-6000": "quadro-rtx-6000",
    "quadro-rtx6000": "quadro-rtx-6000",
    "rtx-a6000": "rtx-a6000", "a6000": "rtx-a6000", "rtxa6000": "rtx-a6000",
    **{name: name for name in ("v100-16gb", "v100-32gb", "a100-40gb", "a100-80gb")},
    # the type names of Sia's published simulator cluster and profiles (its artifact's README)
    "aws": "t4", "rtx": "rtx-2080-ti", "dgx-ext": "a100-40gb", "dgx": "a100-40gb", "quad": "quadro-rtx-6000",
    "azure": "v100-32gb",
}
"""Slurm-style spellings (after `normalise`) -> a row of `KNOWN`. `rtx6000` is the Turing Quadro, not the Ada
"RTX 6000 Ada Generation", which a site must declare. A site whose words mean other cards declares them
(`resolve` reads declared figures first)."""

FIGURE_KEYS = ("fp32_tflops", "fp16_tflops", "bf16_tflops", "mem_bw_gbs", "memory_gib", "compute_capability")
"""What a declared type gives (`declare`): its datasheet's figures."""
_VENDOR = re.compile(r"^(nvidia|tesla|geforce)-")


class UnknownGpuType(ConfigError):
    """A GPU type neither the table nor the settings describe."""


def normalise(name: str) -> str:
    """`NVIDIA_A100-SXM4-80GB` -> `a100-sxm4-80gb`: lower case, `_` and spaces as `-`, vendor words dropped."""
    text = re.sub(r"[\s_]+", "-", str(name).strip().lower())
    while _VENDOR.match(text):
        text = _VENDOR.sub("", text, count=1)
    return text


def canonical(name: str) -> str | None:
    """The `KNOWN` row a type name means (aliases and spelling folded), or None."""
    return ALIASES.get(normalise(name))


def declare(name: str, figures: Mapping[str, object], where: str = "gpu.types") -> GpuSpec:
    """A `GpuSpec` from declared figures (`FIGURE_KEYS`), or `like: <known type>` to borrow a row; ConfigError."""
    problems: list[str] = []
    like = figures.get("like")
    base = KNOWN.get(canonical(str(like)) or "") if like is not None else None
    if like is not None and base is None:
        problems.append(f"{where}.{name}.like: {like!r} is not a known GPU type; allowed: {', '.join(sorted(KNOWN))} "
                        "(or a usual spelling of one: a100, v100, h100, 2080ti ...)")
    values: dict[str, object] = {}
    for key in FIGURE_KEYS:
        if key not in figures:
            if base is None and like is None and key != "bf16_tflops":  # a wrong like: is said above
                problems.append(f"{where}.{name}.{key}: required for a type not in the table (or give like: <type>)")
            continue
        v = figures[key]
        if key == "compute_capability":
            cap = _capability(v)
            if cap is None:
                problems.append(f"{where}.{name}.{key}: {v!r}; allowed: a version like 8.0 or '7.5'")
            values["capability"] = cap
        elif isinstance(v, bool) or not isinstance(v, (int, float)) or not (v > 0 or (v == 0 and key != "fp32_tflops")):
            problems.append(f"{where}.{name}.{key}: {v!r}; allowed: a number > 0 (bf16_tflops, fp16_tflops: 0 = none)")
        else:
            values[key] = float(v)
    if problems:
        raise ConfigError(where, problems)
    b = base or GpuSpec(name, 0.0, 0.0, 0.0, 0.0, 0.0, (0, 0))
    return GpuSpec(normalise(name), float(values.get("fp32_tflops", b.fp32_tflops)),  # type: ignore[arg-type]
                   float(values.get("fp16_tflops", b.fp16_tflops)),  # type: ignore[arg-type]
                   float(values.get("bf16_tflops", b.bf16_tflops)),  # type: ignore[arg-type]
                   float(values.get("mem_bw_gbs", b.mem_bw_gbs)),  # type: ignore[arg-type]
                   float(values.get("memory_gib", b.memory_gib)),  # type: ignore[arg-type]
                   values.get("capability", b.capability), f"declared in {where}")  # type: ignore[arg-type]


def resolve(name: str, declared: Mapping[str, Mapping[str, object]] | None = None) -> GpuSpec:
    """The figures of GPU type `name`: declared ones first (the site knows its hardware), else the table.

    Raises `UnknownGpuType` naming the type, the known names, and how to declare its figures.
    """
    for key, figures in (declared or {}).items():
        if normalise(key) == normalise(name) and any(k in figures for k in (*FIGURE_KEYS, "like")):
            return declare(key, figures)
    row = canonical(name)
    if row is not None:
        return KNOWN[row]
    raise UnknownGpuType("gpu.types", [
        f"{name}: unknown GPU type, so its speed cannot be estimated from public figures; allowed: a known type "
        f"({', '.join(sorted(KNOWN))}, or a usual spelling of one: a100, a100-80, v100, h100, 2080ti ...), or declare "
        f"it in the settings as gpu.types.{name}.like: <the known type whose figures it shares> (programs may "
        f"declare its datasheet figures instead: {', '.join(FIGURE_KEYS)})"])


def supports(spec: GpuSpec, precision: str) -> bool:
    """Can a job compute at `precision` on this type? bf16 from compute capability 8.0, fp16 from 7.0, fp32 always."""
    if precision == "bf16":
        return spec.capability >= (8, 0)
    if precision == "fp16":
        return spec.capability >= (7, 0)
    return True


def _capability(v: object) -> tuple[int, int] | None:
    text = str(v).strip()
    m = re.fullmatch(r"(\d{1,2})\.(\d)", text) or re.fullmatch(r"(\d{1,2})", text)
    if m is None:
        return None
    return int(m.group(1)), int(m.group(2)) if m.lastindex and m.lastindex > 1 else 0
