"""GPU specifications the slowdown predictor reads, so a GPU type it never trained on is not a blank.

Per type: streaming multiprocessors (SMs), memory bandwidth (GB/s) and memory
(GiB) of one GPU as CUDA sees it (a K80 board is two GPUs: one is listed).
Figures are the vendor's data-sheet numbers for the common (SXM where there
is one) variant. Names are matched case-insensitively after dropping an
`nvidia`/`tesla` prefix, spaces, dashes and underscores, so `NVIDIA A100-SXM4-80GB`
and `a100-80g` both find `a100-80g`. A type not listed has no spec: the
predictor then treats it as unlike every training GPU (see `transfer`).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass


@dataclass(frozen=True)
class GpuSpec:
    sms: int
    mem_bw_gbs: float
    mem_gib: float

    def vector(self) -> tuple[float, float, float]:
        """(ln SMs, ln bandwidth, ln memory): the scale on which GPUs are compared (a factor e apart = 1)."""
        return (math.log(self.sms), math.log(self.mem_bw_gbs), math.log(self.mem_gib))


SPECS: dict[str, GpuSpec] = {
    "k80": GpuSpec(13, 240.0, 12.0),
    "p100": GpuSpec(56, 732.0, 16.0),
    "v100": GpuSpec(80, 900.0, 16.0),
    "v100-32g": GpuSpec(80, 900.0, 32.0),
    "t4": GpuSpec(40, 320.0, 16.0),
    "a10": GpuSpec(72, 600.0, 24.0),
    "a30": GpuSpec(56, 933.0, 24.0),
    "a40": GpuSpec(84, 696.0, 48.0),
    "l4": GpuSpec(58, 300.0, 24.0),
    "l40s": GpuSpec(142, 864.0, 48.0),
    "a100-40g": GpuSpec(108, 1555.0, 40.0),
    "a100-80g": GpuSpec(108, 2039.0, 80.0),
    "h100": GpuSpec(132, 3350.0, 80.0),
    "h100-pcie": GpuSpec(114, 2000.0, 80.0),
    "h200": GpuSpec(132, 4800.0, 141.0),
}
_ALIASES = {"a100": "a100-40g", "a10040gb": "a100-40g", "a100sxm440gb": "a100-40g", "a10080gb": "a100-80g",
            "a100sxm480gb": "a100-80g", "h100sxm": "h100", "h100sxm580gb": "h100", "h10080gb": "h100",
            "h100pcie80gb": "h100-pcie", "h200sxm141gb": "h200", "v10032gb": "v100-32g", "v100sxm232gb": "v100-32g",
            "v100sxm216gb": "v100", "p100sxm216gb": "p100", "p100pcie16gb": "p100"}


def _key(name: str) -> str:
    text = re.sub(r"^(nvidia|tesla)[\s_-]*", "", name.strip().lower())
    text = re.sub(r"^(nvidia|tesla)[\s_-]*", "", text)
    return re.sub(r"[\s_-]", "", text)


_BY_KEY = {_key(k): k for k in SPECS} | _ALIASES


def spec_of(gpu_type: str) -> GpuSpec | None:
    """The spec of `gpu_type`, or None when it is not listed."""
    name = _BY_KEY.get(_key(gpu_type))
    return None if name is None else SPECS[name]
