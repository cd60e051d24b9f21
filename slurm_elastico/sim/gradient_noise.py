"""Statistical efficiency: what one step at another global batch is worth, from measured gradient noise.

Statistical efficiency (measured, Pollux's validation runs, `pollux_validation.csv.gz`): at each
measured global batch, per epoch, the iterations done and the gradient's squared mean and variance
(`grad_sqr`, `grad_var`). As Pollux's simulator has it, one step at global batch b during epoch e
makes `gain = (var + sqr) / (var / s + sqr)` steps' worth of progress at the app's smallest
measured batch (s = b / that batch), with the statistics linearly interpolated between the measured
batches around b (`gain`). A job's epochs are those of its own batch: epoch e ends at the measured
iterations after e + 1 epochs, as a fraction of the iterations to the end (`epoch_ends`). So one step
at b is worth `gain(b, e) / gain(B, e)` steps of the job's own batch B (`GroundTruth.efficiency_ratio`),
which changes as training goes on (the gradient noise grows, and large batches lose less); at B itself
it is exactly 1, so a job that keeps its batch finishes after its measured iterations, as before.
"""

from __future__ import annotations

import numpy as np

from slurm_elastico.errors import ConfigError


class GradientNoise:
    """One app's measured gradient statistics and iterations per epoch at each measured global batch.

    From (global batch, epoch, iteration, grad_sqr, grad_var) rows; every batch must have the same epochs.
    """

    def __init__(self, app: str, rows: list[tuple[int, int, float, float, float]]):
        per: dict[int, dict[int, tuple[float, float, float]]] = {}
        for batch, epoch, it, sqr, var in rows:
            per.setdefault(batch, {})[epoch] = (it, sqr, var)
        counts = {len(v) for v in per.values()}
        if len(counts) != 1 or any(sorted(v) != list(range(len(v))) for v in per.values()):
            raise ConfigError("ground truth", [f"validation rows of app {app!r} must give epochs 0..E-1 at every "
                                               f"global batch; got {sorted((b, len(v)) for b, v in per.items())}"])
        self.app = app
        epochs = counts.pop()
        self.batches = np.array(sorted(per), dtype=float)
        table = np.array([[per[int(b)][e] for e in range(epochs)] for b in self.batches])
        self.iterations, self.sqr, self.var = table[:, :, 0], table[:, :, 1], table[:, :, 2]

    @property
    def epochs(self) -> int:
        return self.iterations.shape[1]

    def _at(self, values: np.ndarray, batch: float) -> np.ndarray:
        """The row of `values` at `batch`: linear between the measured batches around it, clamped outside them."""
        b = self.batches
        if batch <= b[0]:
            return values[0]
        if batch >= b[-1]:
            return values[-1]
        hi = int(np.searchsorted(b, batch))
        if b[hi] == batch:
            return values[hi]
        w = (batch - b[hi - 1]) / (b[hi] - b[hi - 1])
        return (1.0 - w) * values[hi - 1] + w * values[hi]

    def gain(self, batch: float, epoch: int) -> float:
        """Progress of one step at `batch` during `epoch`, in steps at the smallest measured batch."""
        e = min(max(epoch, 0), self.epochs - 1)
        sqr, var = float(self._at(self.sqr[:, e], batch)), float(self._at(self.var[:, e], batch))
        scale = float(batch / self.batches[0])
        denom = var / scale + sqr
        return (var + sqr) / denom if denom > 0 else 1.0

    def epoch_ends(self, batch: float) -> np.ndarray:
        """Fraction of the training done at the end of each epoch at `batch` (the last is 1)."""
        it = self._at(self.iterations, batch)
        return it / it[-1]
