"""Azure's LLM inference request trace: what sizes the simulator's inference jobs.

No public trace says what an inference job of a GPU cluster asks; the Azure
trace gives real requests' context and generated tokens over time, and a
job takes the mean of a random window of them (`llm_tokens`).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from slurm_elastico.errors import ConfigError
from slurm_elastico.sim.datafiles import DATA, read_rows


def azure_requests(path: str | Path | None = None, service: str | None = None) -> np.ndarray:
    """[t_s, context, generated] rows of the Azure LLM trace (both services unless one is named)."""
    rows = read_rows(Path(path) if path else DATA / "azure_llm.csv.gz")
    out = [(float(r["t_s"]), float(r["context_tokens"]), float(r["generated_tokens"])) for r in rows
           if service is None or r["service"] == service]
    if not out:
        raise ConfigError(str(path or "azure_llm"), [f"no requests for service {service!r}; allowed: conv, code"])
    return np.array(out)


def llm_tokens(req: np.ndarray, rng: np.random.Generator, window_s: float = 300.0) -> tuple[float, float]:
    """Mean context and generated tokens of the requests in a random window of the Azure trace."""
    t0 = float(rng.uniform(0, max(1.0, req[-1, 0] - window_s)))
    sel = req[(req[:, 0] >= t0) & (req[:, 0] < t0 + window_s)]
    if len(sel) == 0:
        sel = req
    return float(sel[:, 1].mean()), float(sel[:, 2].mean())
