"""The trained slowdown predictor: a small PyTorch MLP over symmetric pair features.

Output S = 1 + softplus(net(x)) so a prediction is never a speed-up. Trained
full-batch with Adam on the relative error |Ŝ - S| / S, deterministically: a
fixed seed in a forked RNG (the caller's torch RNG is untouched) and one
thread, because multi-threaded float sums differ run to run. An ensemble of
`members` nets averages log S. Inference deduplicates profiles by identity, so
10,000 pairs of 100 jobs encode 100 jobs, not 20,000, and applies the first
layer per job (see `PairScorer`).

Outside what it was trained on the model is cautious (`Coverage`): it records
the GPU types and model families of its training data. A pair with a family
it never saw keeps its prediction but gets the larger `family_margin`
(calibrated on leave-one-model-out folds). On a GPU type it never saw,
`on_gpu` answers with the family-free `transfer` nets (family effects are
measured per GPU and do not carry over), shrunk toward the training mean
(`prior_norm`, weight `1 - shrink`), with `gpu_margin` (calibrated on
leave-one-GPU-out folds, or on leave-one-model-out folds when training saw a
single GPU type: the nearest shift its data can show). All of it is chosen
on training data only (`evaluation.fit_model`).
"""

from __future__ import annotations

import contextlib
import io
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn

from slurm_elastico.interference.base import SlowdownModel, SoloProfile, distinct
from slurm_elastico.interference.errors import MeasurementError, ModelFileError
from slurm_elastico.interference.features import FeatureSchema
from slurm_elastico.interference.files import check_header, write_atomically
from slurm_elastico.interference.measurements import Colocation, samples
from slurm_elastico.interference.scorers import ByScorer

FILE_FORMAT = "slurm-elastico/iac-mlp"
FILE_VERSION = 2  # 2: coverage (training GPU types and families, cautious margins) and transfer nets


@dataclass(frozen=True)
class TrainConfig:
    """Hyper-parameters; chosen by `evaluation.select_config` on folds of the training data only."""

    hidden: int = 32
    layers: int = 2
    weight_decay: float = 1e-3
    epochs: int = 400
    lr: float = 1e-2
    use_family: bool = True
    members: int = 1


@contextlib.contextmanager
def _deterministic(seed: int) -> Iterator[None]:
    """One thread and a seeded, forked RNG for the duration; restores the caller's settings."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            yield
    finally:
        torch.set_num_threads(threads)


@dataclass(frozen=True)
class Coverage:
    """What a model was trained on, and how cautious it is outside that; saved with the model.

    `families` holds every family name seen in training ("" if family-less
    jobs were seen). Margins are safety margins on the admission floor (see
    `base.admissible`); `prior_norm` is the training data's mean normalized
    throughput (1 / mean slowdown) and `shrink` the weight kept on the model
    on an unseen GPU type (1 = no shrinkage). Empty `gpu_types` means every
    GPU type counts as seen.
    """

    gpu_types: tuple[str, ...] = ()
    families: tuple[str, ...] = ()
    family_margin: float = 0.0
    gpu_margin: float = 0.0
    prior_norm: float = 1.0
    shrink: float = 1.0

    def to_dict(self) -> dict:
        return {**asdict(self), "gpu_types": list(self.gpu_types), "families": list(self.families)}

    @classmethod
    def from_dict(cls, d: dict, source: str) -> Coverage:
        try:
            return cls(tuple(map(str, d["gpu_types"])), tuple(map(str, d["families"])), float(d["family_margin"]),
                       float(d["gpu_margin"]), float(d["prior_norm"]), float(d["shrink"]))
        except (KeyError, TypeError, ValueError) as exc:
            raise ModelFileError(f"{source}: coverage (training GPU types and families) is incomplete ({exc!r})") from None


def _net(d_in: int, cfg: TrainConfig) -> nn.Module:
    layers: list[nn.Module] = []
    width = d_in
    for _ in range(cfg.layers):
        layers += [nn.Linear(width, cfg.hidden), nn.SiLU()]
        width = cfg.hidden
    layers.append(nn.Linear(width, 1))
    return nn.Sequential(*layers)


def _slowdown(net: nn.Module, x: torch.Tensor) -> torch.Tensor:
    return 1.0 + nn.functional.softplus(net(x).squeeze(1))


def _fit_nets(nets: Sequence[nn.Module], x: torch.Tensor, s: torch.Tensor, epochs: int, lr: float,
              weight_decay: float) -> None:
    for net in nets:
        opt = torch.optim.Adam(net.parameters(), lr=lr, weight_decay=weight_decay)
        for _ in range(epochs):
            opt.zero_grad()
            loss = ((_slowdown(net, x) - s).abs() / s).mean()
            loss.backward()
            opt.step()


def _rest_inplace(rest: nn.Sequential, h: torch.Tensor) -> torch.Tensor:
    """`rest(h).squeeze(1)` for [SiLU, Linear, ..., SiLU, Linear], reusing buffers (inference only)."""
    for layer in rest:
        if isinstance(layer, nn.SiLU):
            h = nn.functional.silu(h, inplace=True)
        elif layer.out_features == 1:
            h = torch.addmv(layer.bias, h, layer.weight[0])
        else:
            h = torch.addmm(layer.bias, h, layer.weight.t())
    return h


class MlpPredictor(ByScorer):
    """A trained model; implements `SlowdownModel`. Build with `train()` or `MlpPredictor.load()`."""

    def __init__(self, schema: FeatureSchema, nets: list[nn.Module], config: TrainConfig,
                 admission_margin: float = 0.0, seed: int = 0, coverage: Coverage = Coverage(),
                 transfer: MlpPredictor | None = None):
        self.schema = schema
        self.nets = nets
        self.config = config
        self.admission_margin = admission_margin  # see base.admissible: a safety margin on the floor
        self.seed = seed
        self.coverage = coverage
        self.transfer = transfer  # family-free nets for unseen GPU types; None: these nets serve there too
        for net in nets:
            net.eval()

    @property
    def training_mean_norm(self) -> float:
        """Mean normalized throughput of the training data (1 / its mean slowdown): the trivial predictor beside it."""
        return self.coverage.prior_norm

    # -- outside the training data ---------------------------------------------
    def seen_gpu(self, gpu_type: str) -> bool:
        return not self.coverage.gpu_types or gpu_type in self.coverage.gpu_types

    def on_gpu(self, gpu_type: str) -> SlowdownModel:
        """The model to use on GPUs of `gpu_type`: itself if it was trained on that type, else the cautious view."""
        return self if self.seen_gpu(gpu_type) else UnseenGpu(self)

    # -- inference -----------------------------------------------------------
    def features(self, a: Sequence[SoloProfile], b: Sequence[SoloProfile]) -> np.ndarray:
        """Pair features of (a[k], b[k]) as the net sees them (training and tests; `predict` is faster)."""
        profiles, ia, ib = distinct(a, b)
        if not profiles:
            return np.zeros((0, len(self.schema.names())), dtype=np.float32)
        enc, codes = self.schema.encode(profiles)
        return self.schema.pairs(enc[ia], enc[ib], codes[ia], codes[ib])

    def predict_features(self, x: np.ndarray) -> np.ndarray:
        with torch.inference_mode():
            t = torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32))
            logs = torch.stack([torch.log(_slowdown(net, t)) for net in self.nets]).mean(0)
            return torch.exp(logs).double().numpy()

    def scorer(self, profiles: Sequence[SoloProfile]) -> PairScorer:
        """Slowdowns and margins of pairs of `profiles` by index, the profiles encoded once (see `PairScorer`)."""
        cov = self.coverage
        return PairScorer(self, profiles, cov.families, self.admission_margin,
                          max(self.admission_margin, cov.family_margin))

    # -- learning ------------------------------------------------------------
    def fine_tune(self, observations: Sequence[Colocation], epochs: int, lr: float) -> None:
        """Continues training on `observations` in place (the schema stays; new families map to unknown)."""
        selves, partners, norms, _ = samples(observations)
        if not norms:
            return
        x = torch.from_numpy(self.features(selves, partners))
        s = torch.tensor([1.0 / v for v in norms], dtype=torch.float32)
        with _deterministic(self.seed):
            for net in self.nets:
                net.train()
            _fit_nets(self.nets, x, s, epochs, lr, self.config.weight_decay)
            for net in self.nets:
                net.eval()

    def state(self) -> list[dict]:
        """A copy of the weights, for rollback."""
        return [{k: v.detach().clone() for k, v in net.state_dict().items()} for net in self.nets]

    def restore(self, state: list[dict]) -> None:
        for net, sd in zip(self.nets, state, strict=True):
            net.load_state_dict(sd)

    # -- files -----------------------------------------------------------------
    def save(self, path: str | Path) -> None:
        """Writes weights, feature schema, config and versions to one file (atomically)."""
        path = Path(path)
        blob = {"format": FILE_FORMAT, "version": FILE_VERSION, "schema": self.schema.to_dict(),
                "config": asdict(self.config), "admission_margin": float(self.admission_margin),
                "seed": int(self.seed), "nets": [net.state_dict() for net in self.nets],
                "coverage": self.coverage.to_dict(),
                "transfer": None if self.transfer is None else {
                    "schema": self.transfer.schema.to_dict(), "config": asdict(self.transfer.config),
                    "nets": [net.state_dict() for net in self.transfer.nets]}}
        buffer = io.BytesIO()
        torch.save(blob, buffer)
        write_atomically(path, buffer.getvalue())

    @classmethod
    def load(cls, path: str | Path) -> MlpPredictor:
        """Reads a file written by `save`; refuses another format, file version or feature schema."""
        path = Path(path)
        try:
            blob = torch.load(path, map_location="cpu", weights_only=True)
        except FileNotFoundError:
            raise ModelFileError(f"{path}: no such model file") from None
        except Exception as exc:  # torch raises many types for a file that is not its format
            raise ModelFileError(f"{path}: not a slurm-elastico predictor file ({type(exc).__name__})") from None
        check_header(blob, path, FILE_FORMAT, FILE_VERSION)
        schema, config, nets = _parts(blob, str(path))
        coverage = Coverage.from_dict(blob.get("coverage") or {}, str(path))
        transfer = None
        if blob.get("transfer") is not None:
            t_schema, t_config, t_nets = _parts(blob["transfer"], f"{path} (transfer nets)")
            transfer = cls(t_schema, t_nets, t_config, seed=int(blob["seed"]))
        return cls(schema, nets, config, float(blob["admission_margin"]), int(blob["seed"]), coverage, transfer)


def _parts(blob: dict, source: str) -> tuple[FeatureSchema, TrainConfig, list[nn.Module]]:
    """(schema, config, nets) of a saved net set; refuses weights that do not match the schema."""
    schema = FeatureSchema.from_dict(blob["schema"], source)
    try:
        config = TrainConfig(**blob["config"])
    except TypeError as exc:
        raise ModelFileError(f"{source}: unknown training config ({exc})") from None
    d_in = len(schema.names())
    nets = []
    for sd in blob["nets"]:
        net = _net(d_in, config)
        try:
            net.load_state_dict(sd)
        except RuntimeError as exc:
            raise ModelFileError(f"{source}: weights do not match its schema ({exc})") from None
        nets.append(net)
    return schema, config, nets


TABLE_PAIRS = 4_000_000
"""Largest table of distinct-profile pairs `PairScorer.tabulate` fills (2,000 distinct profiles: ~1.5 s)."""
BLOCK = 131_072
"""Pairs computed at once while tabulating (hidden 32: ~17 MB of activations)."""


class PairScorer:
    """Slowdowns and admission margins of pairs (profiles[ia[k]], profiles[ib[k]]) by index.

    The profiles are encoded and each net's first layer applied once, here:
    W·[s, p, f, j] + c = (W_s·s + c) + W_p·p + w_f·f + w_j·j, the first two
    terms per profile, gathered per pair; f (same family) and j (same job) are
    rare 0/1 flags, added only where set. A call then costs only the pairs it
    asks for, which is what the planner's many small lookups need
    (`planner.slowdown.PairCache`). Predictions are the ensemble's mean log S,
    shrunk toward `prior_norm` with weight `1 − shrink` (an unseen GPU type);
    the margin is `margin_unseen` where either profile's family is not in
    `known_families` (none known: every family counts as seen).
    """

    def __init__(self, model: MlpPredictor, profiles: Sequence[SoloProfile], known_families: Sequence[str],
                 margin_seen: float, margin_unseen: float, shrink: float = 1.0, prior_norm: float = 1.0):
        self.profiles = list(profiles)
        self._args = (model, known_families, margin_seen, margin_unseen, shrink, prior_norm)
        enc, self.codes = model.schema.encode(self.profiles)
        _, row_id = np.unique(enc, axis=0, return_inverse=True)
        self.row_id = row_id.reshape(-1)
        d = enc.shape[1]
        self.layers = []
        with torch.inference_mode():
            e = torch.from_numpy(enc)
            for net in model.nets:
                first, rest = net[0], net[1:]
                w = first.weight
                # Column slices are strided: make them contiguous, or matmul takes a slow path.
                self.layers.append((nn.functional.linear(e, w[:, :d].contiguous(), first.bias),
                                    nn.functional.linear(e, w[:, d:2 * d].contiguous()),
                                    w[:, 2 * d].clone(), w[:, 2 * d + 1].clone(), rest))
        known = set(known_families)
        self.unseen = np.array([bool(known) and p.model_family not in known for p in profiles], dtype=bool)
        self.margin_seen, self.margin_unseen = margin_seen, margin_unseen
        self.shrink, self.prior_norm = shrink, prior_norm
        # Profiles that look the same to the net (same encoding and family) share one row of the table of
        # every pair's slowdown that `tabulate` fills: then a call is a lookup.
        _, first, self.kind_of = np.unique(np.stack([self.row_id, self.codes], axis=1), axis=0, return_index=True,
                                           return_inverse=True)
        self.kind_of = self.kind_of.reshape(-1)
        self._kinds = first
        self._table: np.ndarray | None = None

    def tabulate(self, limit: int = TABLE_PAIRS) -> bool:
        """Fill the table of every pair of distinct profiles if it has at most `limit` pairs; True if it is filled.

        Worth it when many calls follow (the planner's lookups) or one call asks for more pairs than the
        table has (`predict_matrix`); computed in blocks so memory stays bounded.
        """
        k = len(self._kinds)
        if self._table is None and k * k <= limit:
            ka, kb = np.divmod(np.arange(k * k), k)
            ka, kb = self._kinds[ka], self._kinds[kb]
            self._table = np.concatenate([np.zeros(0)] + [self._compute(ka[i:i + BLOCK], kb[i:i + BLOCK])
                                                          for i in range(0, k * k, BLOCK)]).reshape(k, k)
        return self._table is not None

    def slowdown(self, ia: np.ndarray, ib: np.ndarray) -> np.ndarray:
        """Slowdown S >= 1 of profiles[ia[k]] next to profiles[ib[k]]."""
        ia, ib = np.asarray(ia, dtype=np.int64), np.asarray(ib, dtype=np.int64)
        if self._table is not None:
            return self._table[self.kind_of[ia], self.kind_of[ib]]
        return self._compute(ia, ib)

    def matrices(self) -> tuple[np.ndarray, np.ndarray]:
        """(slowdowns, margins) of every pair, [i, j] for profiles[i] next to profiles[j]; after `tabulate`."""
        assert self._table is not None, "matrices() before tabulate()"
        k = self.kind_of
        return (self._table[np.ix_(k, k)],
                np.where(self.unseen[:, None] | self.unseen, self.margin_unseen, self.margin_seen))

    def _compute(self, ia: np.ndarray, ib: np.ndarray) -> np.ndarray:
        if len(ia) == 0:
            return np.zeros(0)
        codes, row_id = self.codes, self.row_id
        flag_f = torch.from_numpy(np.flatnonzero((codes[ia] == codes[ib]) & (codes[ia] >= 0)))
        flag_j = torch.from_numpy(np.flatnonzero(row_id[ia] == row_id[ib]))
        with torch.inference_mode():
            ta, tb = torch.from_numpy(ia), torch.from_numpy(ib)
            total = None
            for per_self, per_partner, w_f, w_j, rest in self.layers:
                h = per_self.index_select(0, ta).add_(per_partner.index_select(0, tb))
                if len(flag_f):
                    h.index_add_(0, flag_f, w_f.expand(len(flag_f), -1))
                if len(flag_j):
                    h.index_add_(0, flag_j, w_j.expand(len(flag_j), -1))
                log_s = torch.log1p(nn.functional.softplus(_rest_inplace(rest, h)))
                total = log_s if total is None else total.add_(log_s)
            s = torch.exp(total / len(self.layers)).double().numpy()
        if self.shrink == 1.0:
            return s
        return 1.0 / (self.shrink / s + (1.0 - self.shrink) * self.prior_norm)

    def margins(self, ia: np.ndarray, ib: np.ndarray) -> np.ndarray:
        """Admission margin of each pair (see `interference.base.admissible`)."""
        unseen = self.unseen[np.asarray(ia, dtype=np.int64)] | self.unseen[np.asarray(ib, dtype=np.int64)]
        return np.where(unseen, self.margin_unseen, self.margin_seen)

    def against(self, ia: np.ndarray, partners: Sequence[SoloProfile]) -> np.ndarray:
        """Slowdown of profiles[ia[k]] next to partners[k], profiles this scorer does not hold (the planner's
        stand-in neighbours; a wrapping model's scorer asks its inner one this): one scorer over both lists."""
        ia = np.asarray(ia, dtype=np.int64).reshape(-1)
        k = len(ia)
        if k != len(partners):
            raise ValueError(f"against: {k} indices but {len(partners)} partners; one partner per index")
        if k == 0:
            return np.zeros(0)
        both = PairScorer(self._args[0], [*(self.profiles[i] for i in ia.tolist()), *partners], *self._args[1:])
        return both.slowdown(np.arange(k), np.arange(k, 2 * k))


class UnseenGpu(ByScorer):
    """A predictor on a GPU type it was not trained on: family-free nets shrunk toward the training mean.

    Normalized throughput = shrink·model + (1 − shrink)·prior_norm, so it stays
    in (0, 1] and the slowdown >= 1; every pair gets `gpu_margin` (and the
    family margin too where a family is unseen). Implements `SlowdownModel`.
    """

    def __init__(self, model: MlpPredictor):
        self.model = model
        self.inner = model.transfer if model.transfer is not None else model

    def scorer(self, profiles: Sequence[SoloProfile]) -> PairScorer:
        cov = self.model.coverage
        gpu = max(self.model.admission_margin, cov.gpu_margin)
        return PairScorer(self.inner, profiles, cov.families, gpu, max(gpu, cov.family_margin), cov.shrink,
                          cov.prior_norm)


def coverage_of(observations: Sequence[Colocation], family_margin: float = 0.0, gpu_margin: float = 0.0,
                shrink: float = 1.0) -> Coverage:
    """The GPU types, families and mean normalized throughput of `observations`, with the given caution."""
    _, _, norms, _ = samples(observations)
    prior = 1.0 / float(np.mean([1.0 / v for v in norms])) if norms else 1.0
    return Coverage(tuple(sorted({o.gpu_type for o in observations})),
                    tuple(sorted({p.model_family for o in observations for p in (o.a, o.b)})),
                    family_margin, gpu_margin, prior, shrink)


def train(observations: Sequence[Colocation], config: TrainConfig = TrainConfig(), seed: int = 0,
          admission_margin: float = 0.0, coverage: Coverage | None = None,
          transfer: MlpPredictor | None = None) -> MlpPredictor:
    """Trains a predictor on the fitting pairs (both directions of each); same inputs and seed → same weights.

    Without `coverage` it records the training GPU types and families with no
    extra caution (margins = `admission_margin`, no shrinkage); `evaluation.fit_model` calibrates them.
    """
    selves, partners, norms, _ = samples(observations)
    if len(norms) < 2:
        raise MeasurementError(f"training needs observed pairs that ran together; got {len(norms)} sample(s)")
    if coverage is None:
        coverage = coverage_of(observations, admission_margin, admission_margin)
    schema = FeatureSchema.fit([*selves, *partners], config.use_family)
    with _deterministic(seed):
        nets = [_net(len(schema.names()), config) for _ in range(config.members)]
        model = MlpPredictor(schema, nets, config, admission_margin, seed, coverage, transfer)
        x = torch.from_numpy(model.features(selves, partners))
        s = torch.tensor([1.0 / v for v in norms], dtype=torch.float32)
        for net in nets:
            net.train()
        _fit_nets(nets, x, s, config.epochs, config.lr, config.weight_decay)
        for net in nets:
            net.eval()
    return model
