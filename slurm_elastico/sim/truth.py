"""Ground truth of the simulated cluster: how fast a job really runs at a shape, alone and next to others.

Kept apart from everything the policy sees: the planner gets families with
*profiled* throughputs (this module's solo speeds plus measurement noise, as
`elastico profile` would record them) and its own interference model (by
default `ContentionModel`); it never sees the co-location factors below.

Training: the measured step times of `sim.step_times`, on one GPU by the
single-node rule (`train_speed`: G/m micro-steps of `step_time(m)` plus one
`sync_time`) and on several by placement (`gang_speed`, and `rigid_speed`,
which places them as Slurm fills nodes); at a global batch other than the
job's own, the statistical efficiency of `sim.gradient_noise` (`gain`,
`efficiency_ratio`, `epoch_ends`).

MPS share: a job at micro-batch m uses a fraction
`d(m) = τ_min / τ(m)` of the GPU (τ = step time per sample; small batches
leave SMs idle). MPS caps its SMs at the share s, so its speed is
`min(1, s / (100·d))` of whole-GPU speed — a roofline: no loss until the cap
bites, then proportional. GPU memory: parameter state (`PARAM_MIB`) + CUDA
context + m × a per-sample activation size that makes the largest measured
batch fill 90 % of the GPU's usable memory (`mem_mib`: the T4's 15 GiB of the
bundled profiles; `from_rows` takes another GPU's, as `sim.profiles_sia` does
for each type of a mixed cluster).

Inference (a documented decode model; no public measurement exists): a vLLM
engine with n sequences in flight takes `W_READ_S + n·SEQ_S/s` per decode
step (the weight read is bandwidth bound, which MPS does not partition; the
per-sequence compute scales with the share s); prefill costs
`PREFILL_S/s` per context token. n = min(max_num_seqs, sequences the KV cache
holds). Requests/s = n / (generated·step + n·context·prefill).

Co-location (measured, Gavel on P100): each job is mapped to a Gavel job
(model, batch) by `identity`. Gavel ran pairs without MPS limits; `norm_ab`
is the fraction of solo speed a kept next to b. Under MPS the truth is
`speed_a = min(solo_a(s_a), solo_a(100) · Π_b norm_ab)`: partitioning SMs
cannot give a job back what the unpartitioned pair measured it losing to
memory bandwidth and caches, and it cannot run faster than its share allows.
Pairs Gavel could not fit take the mean of both jobs' measured factors.
Three or more co-runners multiply (more pessimistic than the planner's
additive rule, on purpose: a different composition than the one it predicts
with). This is the `gavel` ground truth: Gavel's measured co-run speed is a
ceiling, which makes sharing at best neutral for jobs that fill the GPU.

`gavel-residual`, the optimistic reading of the same data: Gavel's jobs fill
the GPU, so time-slicing alone would leave each at 0.5 of solo; only the loss
beyond that (`r_ab = min(1, 2·norm_ab)`) is contention MPS does not
partition, and `speed_a = solo_a(s_a) · Π_b r_ab`. The truth lies between
the two; runs should be reported under both.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from functools import lru_cache
from pathlib import Path

import numpy as np

from slurm_elastico.errors import ConfigError
from slurm_elastico.sim.datafiles import DATA, read_rows
from slurm_elastico.sim.gradient_noise import GradientNoise
from slurm_elastico.sim.step_times import GangTable, TrainProfile, ring, slurm_placement

T4_MEM_MIB = 15360.0
GPU_MEM_MIB = 16384.0
"""The simulated GPU: a 16 GiB T4-class card, the one the training profiles were measured on."""
CUDA_CONTEXT_MIB = 600.0
PARAM_MIB = {"bert": 1760.0, "cifar10": 180.0, "deepspeech2": 610.0, "imagenet": 410.0, "ncf": 60.0, "yolov3": 990.0}
"""fp32 weights + gradients + two Adam moments (16 bytes per parameter) of each Pollux model."""

GAVEL_OF_APP = {"cifar10": "ResNet-18", "imagenet": "ResNet-50", "yolov3": "ResNet-50", "bert": "Transformer",
                "deepspeech2": "LM", "ncf": "Recommendation"}
"""The Gavel job standing in for each Pollux model (same architecture family); inference decode → LM."""
GAVEL_OF_INFER = "LM"

# Inference decode model for a ~1.5 B-parameter fp16 LLM on the same class of GPU.
INFER_WEIGHTS_MIB = 3000.0
KV_MIB_PER_TOKEN = {"auto": 0.11, "fp8": 0.055}
KV_SPEED = {"auto": 1.0, "fp8": 0.95}
W_READ_S = 0.010
SEQ_S = 0.0004
PREFILL_S = 0.00005


@lru_cache(maxsize=None)
def bundled(name: str) -> tuple[dict[str, str], ...]:
    """The rows of a bundled data file, read once per process (a truth per GPU type reads them again for each:
    `GroundTruth.scaled`); nothing changes them."""
    return tuple(read_rows(DATA / name))


class GroundTruth:
    """Solo speeds, memory and co-location factors from documented files (defaults: the bundled copies)."""

    def __init__(self, profiles: Path | None = None, iterations: Path | None = None, pairs: Path | None = None,
                 placements: Path | None = None, validation: Path | None = None):
        def rows(path: Path | None, name: str):
            return read_rows(path) if path is not None else bundled(name)

        self._build(rows(placements, "pollux_placements.csv.gz"), rows(profiles, "pollux_profiles.csv"),
                    rows(validation, "pollux_validation.csv.gz"), rows(iterations, "pollux_iterations.csv"),
                    rows(pairs, "gavel_pairs_p100.csv"))

    @classmethod
    def from_rows(cls, placements: Iterable[Mapping[str, str]], profiles: Iterable[Mapping[str, str]],
                  validation: Iterable[Mapping[str, str]], iterations: Iterable[Mapping[str, str]],
                  pairs: Iterable[Mapping[str, str]] | None = None, memory_mib: float = T4_MEM_MIB) -> GroundTruth:
        """A ground truth from rows in the bundled files' formats (`sim.profiles_sia` reads another layout into
        them), for a GPU whose largest measured batch fills 90 % of `memory_mib` (`train_mem_mib`); `pairs`
        default to the bundled Gavel pairs."""
        truth = cls.__new__(cls)
        truth._build(placements, profiles, validation, iterations,
                     bundled("gavel_pairs_p100.csv") if pairs is None else pairs, memory_mib)
        return truth

    @classmethod
    def scaled(cls, speedup: float) -> GroundTruth:
        """The bundled profiles as if run on another GPU: every step's compute time divided by `speedup` (its
        speed over the T4 the profiles were measured on), the all-reduce's time (`sync_time`: the network's, not
        the GPU's) kept, and each job's memory as the T4 measured it (which shapes fit is the other GPU's memory's
        business: `families.family_of`'s `gpu_mem_mib`). What the what-if runs on a cluster of several types
        (`history.whatif_types`), where only the public specifications say how fast each is."""
        if not (speedup > 0 and math.isfinite(speedup)):
            raise ValueError(f"speedup must be a finite number > 0, not {speedup!r}")

        def faster(rows, holds_sync: bool):
            # A placement row's step holds its all-reduce (`gang_speed`: a·(step − sync) + sync); a one-GPU profile
            # row's does not (`train_speed` adds sync apart).
            def step(r):
                sync = float(r["sync_time"]) if holds_sync else 0.0
                return (float(r["step_time"]) - sync) / speedup + sync

            return [{**r, "step_time": repr(step(r))} for r in rows]

        return cls.from_rows(faster(bundled("pollux_placements.csv.gz"), True),
                             faster(bundled("pollux_profiles.csv"), False),
                             bundled("pollux_validation.csv.gz"), bundled("pollux_iterations.csv"))

    def _build(self, placements, profiles, validation, iterations, pairs, memory_mib: float = T4_MEM_MIB) -> None:
        self.mem_mib = float(memory_mib)
        """Usable memory of the GPU the profiles were measured on (`train_mem_mib`)."""
        self.placement_rows: dict[str, list[tuple[str, int, int, float, float, float]]] = {}
        for r in placements:
            self.placement_rows.setdefault(r["app"], []).append(
                (r["placement"], int(r["num_nodes"]), int(r["num_replicas"]), float(r["local_bsz"]),
                 float(r["step_time"]), float(r["sync_time"])))
        self._several = {app for app, rs in self.placement_rows.items() if any(r[2] > 1 for r in rs)}
        self._gangs: dict[str, GangTable] = {}
        self.profiles: dict[tuple[str, int], TrainProfile] = {}
        rows: dict[tuple[str, int], list[tuple[float, float, float]]] = {}
        for r in profiles:
            rows.setdefault((r["app"], int(r["gpus"])), []).append(
                (float(r["local_bsz"]), float(r["step_time"]), float(r["sync_time"])))
        for key, vals in rows.items():
            a = np.array(sorted(vals))
            self.profiles[key] = TrainProfile(key[0], key[1], a[:, 0], a[:, 1], a[:, 2])
        noise_rows: dict[str, list[tuple[int, int, float, float, float]]] = {}
        for r in validation:
            noise_rows.setdefault(r["app"], []).append(
                (int(r["global_batch"]), int(r["epoch"]), float(r["iteration"]), float(r["grad_sqr"]),
                 float(r["grad_var"])))
        self.noise = {app: GradientNoise(app, rows) for app, rows in noise_rows.items()}
        self.iterations: dict[str, dict[int, int]] = {}
        for r in iterations:
            self.iterations.setdefault(r["app"], {})[int(r["global_batch"])] = int(r["iterations"])
        self.norm: dict[tuple[tuple[str, int], tuple[str, int]], float] = {}
        self.gavel_batches: dict[str, list[int]] = {}
        unfit: list[tuple[tuple[str, int], tuple[str, int]]] = []
        for r in pairs:
            a = (r["model1"], int(r["bs1"]) if r["bs1"] else 0)
            b = (r["model2"], int(r["bs2"]) if r["bs2"] else 0)
            for m, bs in (a, b):
                self.gavel_batches.setdefault(m, [])
                if bs not in self.gavel_batches[m]:
                    self.gavel_batches[m].append(bs)
            if r["norm1"] == "":
                unfit.append((a, b))
                continue
            self.norm[(a, b)] = float(r["norm1"])
            self.norm[(b, a)] = float(r["norm2"])
        means: dict[tuple[str, int], list[float]] = {}
        for (a, _), v in self.norm.items():
            means.setdefault(a, []).append(v)
        for a, b in unfit:
            v = float(np.mean(means.get(a, [0.5]) + means.get(b, [0.5])))
            self.norm.setdefault((a, b), v)
            self.norm.setdefault((b, a), v)
        for m in self.gavel_batches:
            self.gavel_batches[m].sort()
        self.apps = tuple(sorted({a for a, g in self.profiles if g == 1}))

    # -- training ------------------------------------------------------------

    def profile(self, app: str, gpus: int = 1) -> TrainProfile:
        try:
            return self.profiles[(app, gpus)]
        except KeyError:
            raise ConfigError("ground truth", [f"no measured profile for app {app!r} on {gpus} GPU(s); "
                                               f"apps: {', '.join(self.apps)}"]) from None

    def batch_range(self, app: str) -> tuple[int, int]:
        p = self.profile(app)
        return int(p.bsz[0]), int(p.bsz[-1])

    def demand(self, app: str, micro: float) -> float:
        """Fraction of the GPU's peak per-sample rate the job reaches at this micro-batch (0, 1]."""
        p = self.profile(app)
        tau = p.step / p.bsz
        step, _ = p.at(micro)
        return float(min(1.0, tau.min() / (step / min(max(micro, p.bsz[0]), p.bsz[-1]))))

    @lru_cache(maxsize=65536)
    def train_speed(self, app: str, global_batch: int, micro: int, share: int) -> float:
        """Optimizer steps/s at (global batch, micro-batch) with an MPS share, running alone."""
        step, sync = self.profile(app).at(micro)
        whole = 1.0 / ((global_batch / micro) * step + sync)
        return whole * min(1.0, share / (100.0 * self.demand(app, micro)))

    def train_mem_mib(self, app: str, micro: int) -> float:
        lo, hi = self.batch_range(app)
        base = PARAM_MIB.get(app, 500.0) + CUDA_CONTEXT_MIB
        per_sample = max(1.0, 0.9 * self.mem_mib - base) / hi
        return base + micro * per_sample

    def measured_on_several_gpus(self, app: str) -> bool:
        """Whether the placement data measure the app on 2 or more GPUs (so `gang_speed` can answer for it)."""
        return app in self._several

    def gang(self, app: str) -> GangTable:
        if app not in self._gangs:
            rows = self.placement_rows.get(app)
            if not rows:
                raise ConfigError("ground truth", [f"no measured placements for app {app!r}; "
                                                   f"apps: {', '.join(sorted(self.placement_rows))}"])
            self._gangs[app] = GangTable(app, rows)
        return self._gangs[app]

    def gang_speed(self, app: str, global_batch: int, placement: Sequence[int], micro: int | None = None) -> float:
        """Optimizer steps/s of a data-parallel job on `placement` (GPUs on each node) at a fixed global batch.

        Each of the r = sum(placement) GPUs holds G/r samples per step, in `a = ceil(G/r / micro)` micro-steps;
        a step takes `a·(step − sync) + sync` at that micro-batch and placement (see `sim.step_times` for
        the lookup). `micro` defaults to the fewest micro-steps the largest measured per-GPU batch allows
        (micro = ceil(G/r / a)); a micro above G/r is G/r. Nodes holding no GPU are dropped, and a placement
        counts up to a rotation ((2, 1) = (1, 2)).

        One GPU: the simulator uses `train_speed` (and `rigid_speed`, which keeps the same single-GPU profile
        rule) so its one-GPU figures stay as they were; `gang_speed((1,))` follows the measured placement "1"
        rows and differs from those only in counting the sync time once (at a measured batch it is exactly
        1 / step_time).
        """
        p = tuple(int(n) for n in placement if n)
        if not p or min(p) < 0 or global_batch <= 0 or (micro is not None and micro < 1):
            raise ConfigError("ground truth", [f"gang_speed({app!r}, {global_batch}, {tuple(placement)}, {micro}): "
                                               "needs GPUs, a positive global batch and micro-batch"])
        return self._gang_speed(app, global_batch, ring(p), micro)

    @lru_cache(maxsize=65536)
    def _gang_speed(self, app: str, global_batch: int, placement: tuple[int, ...], micro: int | None) -> float:
        table = self.gang(app)
        local = global_batch / sum(placement)
        if micro is None:
            accumulation = max(1, math.ceil(local / table.bsz_range[1] - 1e-9))
            m = float(math.ceil(local / accumulation - 1e-9))
        else:
            accumulation = max(1, math.ceil(local / micro - 1e-9))
            m = min(float(micro), local)
        step, sync = table.at(placement, m)
        return 1.0 / (accumulation * (step - sync) + sync)

    def rigid_speed(self, app: str, global_batch: int, gpus: int, *, gpus_per_node: int = 4) -> float:
        """Steps/s of a whole-GPU job that keeps `gpus` GPUs, placed as Slurm fills nodes of `gpus_per_node`.

        Several GPUs: `gang_speed` at `slurm_placement(gpus, gpus_per_node)`. One GPU, or an app not measured
        on several GPUs (a custom profile file): the single-node profile rule of earlier versions (measured up to
        4 GPUs of one node, linear beyond), so one-GPU figures are unchanged.
        """
        if gpus > 1 and self.measured_on_several_gpus(app):
            return self.gang_speed(app, global_batch, slurm_placement(gpus, gpus_per_node))
        g = min(gpus, max(n for a, n in self.profiles if a == app))
        step, sync = self.profile(app, g).at(global_batch / g)
        lo, hi = self.batch_range(app)
        local = global_batch / g
        accumulation = max(1.0, local / hi)
        return (1.0 / (accumulation * step + sync)) * (gpus / g)

    def iterations_to_end(self, app: str, global_batch: int) -> int:
        """Measured iterations to the app's end at this global batch (log-log interpolated)."""
        table = self.iterations.get(app)
        if not table:
            raise ConfigError("ground truth", [f"no measured iterations for app {app!r}"])
        b = np.array(sorted(table), dtype=float)
        it = np.array([table[int(x)] for x in b], dtype=float)
        return int(round(float(np.exp(np.interp(math.log(global_batch), np.log(b), np.log(it))))))

    def gradient_noise(self, app: str) -> GradientNoise:
        try:
            return self.noise[app]
        except KeyError:
            raise ConfigError("ground truth", [f"no measured gradient statistics for app {app!r} (needed for other "
                                               f"global batches); apps: {', '.join(sorted(self.noise))}"]) from None

    def batch_limits(self, app: str) -> tuple[int, int]:
        """The smallest and largest global batch the app's statistical efficiency was measured at."""
        b = self.gradient_noise(app).batches
        return int(b[0]), int(b[-1])

    @lru_cache(maxsize=262144)
    def gain(self, app: str, batch: float, epoch: int) -> float:
        """Progress of one step at global batch `batch` during `epoch` (see `sim.gradient_noise`)."""
        return self.gradient_noise(app).gain(batch, epoch)

    def efficiency_ratio(self, app: str, own_batch: int, batch: float, epoch: int) -> float:
        """Steps of `own_batch` one step at `batch` is worth during `epoch`: exactly 1 at the own batch."""
        if batch == own_batch:
            return 1.0
        return self.gain(app, batch, epoch) / self.gain(app, own_batch, epoch)

    @lru_cache(maxsize=4096)
    def epoch_ends(self, app: str, own_batch: int) -> tuple[float, ...]:
        """Fraction of a job's work done at the end of each of its epochs, at its own global batch."""
        return tuple(float(x) for x in self.gradient_noise(app).epoch_ends(own_batch))

    # -- inference -----------------------------------------------------------

    @staticmethod
    @lru_cache(maxsize=65536)
    def infer_speed(context: float, generated: float, gmu: float, seqs: int, kv: str, share: int,
                    gpu_mem_mib: float) -> float:
        """Requests/s of a decode engine at these knobs and share, running alone (0 when nothing fits)."""
        room = gmu * gpu_mem_mib - INFER_WEIGHTS_MIB - CUDA_CONTEXT_MIB
        per_seq = (context + generated) * KV_MIB_PER_TOKEN[kv]
        n = min(seqs, math.floor(room / per_seq)) if room > 0 else 0
        if n < 1:
            return 0.0
        s = max(share, 1) / 100.0
        step = W_READ_S + n * SEQ_S / s
        per_request = (generated * step + n * context * PREFILL_S / s) / n
        return KV_SPEED[kv] / per_request

    # -- co-location -----------------------------------------------------------

    def identity(self, kind: str, app: str, batch: float) -> tuple[str, int]:
        """The Gavel job (model, batch) standing in for this job: same family, nearest batch in log scale."""
        model = GAVEL_OF_INFER if kind == "infer" else GAVEL_OF_APP.get(app, "ResNet-50")
        sizes = self.gavel_batches.get(model) or [0]
        if not batch or batch != batch or sizes == [0]:
            return model, sizes[0]
        return model, min(sizes, key=lambda b: abs(math.log(max(b, 1)) - math.log(batch)))

    def colocated(self, solo_share: float, solo_whole: float, me: tuple[str, int],
                  others: Sequence[tuple[str, int]], mode: str = "gavel") -> float:
        """Speed of a job next to `others` on one GPU under `mode` (see the module docstring)."""
        if not others or mode == "none":
            return solo_share
        f = 1.0
        if mode == "gavel-residual":
            for o in others:
                f *= min(1.0, 2.0 * self.norm.get((me, o), 0.5))
            return solo_share * f
        for o in others:
            f *= self.norm.get((me, o), 0.5)
        return min(solo_share, solo_whole * f)
