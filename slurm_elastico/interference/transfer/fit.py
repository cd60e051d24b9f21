"""Fitting the prior-corrected predictor: the config chosen on held-out folds, then the model on all the data.

`fit_transfer` fits the prior, tries every config of the grid on held-out folds (by MAPE), measures the chosen
one's held-out error per kind of fold and the admission thresholds from the same folds (`calibration`), and
trains on all the data. `format_transfer` is what `elastico iac train` says about the result; `cross_validate`
scores the whole procedure on held-out folds (`elastico iac evaluate --split`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from slurm_elastico.interference.admission import FLOORS
from slurm_elastico.interference.admission import TARGET as ADMISSION_TARGET
from slurm_elastico.interference.errors import MeasurementError
from slurm_elastico.interference.measurements import Colocation
from slurm_elastico.interference.scoring import Score, cross_score
from slurm_elastico.interference.splits import split
from slurm_elastico.interference.transfer.calibration import (
    ADMISSION_KINDS, FALSE_ADMISSION_TARGET, HELDOUT_KINDS, Cross, admission_tables, heldout_error,
)
from slurm_elastico.interference.transfer.encoding import Encoder, distinct_jobs, shift_direction
from slurm_elastico.interference.transfer.kernel import Kernels, KernelConfig, nearness, sample_kernels, solve
from slurm_elastico.interference.transfer.model import PriorCorrected
from slurm_elastico.interference.transfer.training import Fitted, Samples, fit_prior, samples_of

REPORT_FLOOR = 0.6  # the floor `format_transfer` shows the admission thresholds at

GRID = tuple(KernelConfig(lam=lam, num_scale=ns, family_sim=fs, batch=batch, linear=linear)
             for lam in (0.03, 0.2) for ns in (0.5, 1.5) for fs in (0.1, 0.5) for batch in (1.0, 0.0)
             for linear in (0.0, 0.3))


def _folds(observations: Sequence[Colocation], kind: str, seed: int) -> list[tuple[np.ndarray, np.ndarray]]:
    return [(np.array(tr, dtype=np.int64), np.array(te, dtype=np.int64))
            for _, tr, te in split(observations, kind, k=4, seed=seed)]


def _pooled(cross: Cross) -> tuple[np.ndarray, np.ndarray]:
    if not cross:
        return np.zeros((0, 2)), np.zeros((0, 2))
    return np.concatenate([p for p, _ in cross]), np.concatenate([t for _, t in cross])


def _cross(observations, smp: Samples, prior_log: np.ndarray, ker: Kernels, cfg: KernelConfig,
           folds: Sequence[tuple[np.ndarray, np.ndarray]]) -> Cross:
    """Held-out (predicted, true) pair norms of each fold of `folds` (`_folds`; pairs that ran in the test part)."""
    out = []
    for tr_pairs, te_pairs in folds:
        tr = np.flatnonzero(np.isin(smp.pair, tr_pairs))
        te = np.flatnonzero(np.isin(smp.pair, te_pairs))
        if len(tr) < 2 or len(te) < 2:
            continue
        k = ker.job[np.ix_(tr, tr)] * ker.gpu[np.ix_(tr, tr)]
        alpha = solve(k, smp.log_s[tr] - prior_log[tr], cfg.lam)
        job = ker.job[np.ix_(te, tr)]
        if ker.linear is not None:  # the test jobs' linear part, weighed by their nearness to the fold's training jobs
            near = nearness(ker.d2[:, np.unique(np.concatenate([ker.self_job[tr], ker.partner_job[tr]]))])
            weight = near[ker.self_job[te]] * near[ker.partner_job[te]]
            job = job + (weight[:, None] - 1.0) * ker.linear[np.ix_(te, tr)]
        log_s = prior_log[te] + (job * ker.gpu[np.ix_(te, tr)]) @ alpha
        norm = 1.0 / np.maximum(1.0, np.exp(log_s))
        # samples come in (a, b) order per pair, pairs in order: two samples make a pair
        out.append((norm.reshape(-1, 2),
                    np.array([[observations[i].norm_a, observations[i].norm_b] for i in smp.pair[te][::2]])))
    return out


def _kernels(smp: Samples, enc: Encoder, cfg: KernelConfig) -> Kernels:
    jobs, idx = distinct_jobs(enc.encode([*smp.selves, *smp.partners], [*smp.gpus, *smp.gpus]))
    n = len(smp.selves)
    return sample_kernels(jobs, idx[:n], idx[n:], smp.gpus, cfg)


def fit_transfer(observations: Sequence[Colocation], seed: int = 0,
                 grid: Sequence[KernelConfig] = GRID) -> PriorCorrected:
    """Chooses the config on held-out folds of `observations`, measures its held-out error, trains on all of it."""
    obs = list(observations)
    smp = samples_of(obs)
    if len(smp.log_s) < 4:
        raise MeasurementError(f"training needs at least 2 pairs that ran together; got {len(smp.log_s) // 2}")
    prior = fit_prior(smp)
    prior_log = np.log(prior.predict(smp.selves, smp.partners))
    enc = Encoder.fit([*smp.selves, *smp.partners], [*smp.gpus, *smp.gpus])
    families = {p.model_family for o in obs for p in (o.a, o.b) if p.model_family}
    select_kind = "leave-one-model-out" if len(families) >= 3 else "kfold"
    select_folds = _folds(obs, select_kind, seed)
    best = None
    for cfg in grid:
        ker = _kernels(smp, enc, cfg)
        cross = _cross(obs, smp, prior_log, ker, cfg, select_folds)
        err = heldout_error(*_pooled(cross))["mape_norm"] if cross else math.inf
        if best is None or err < best[0]:
            best = (err, cfg, ker, cross)
    assert best is not None
    _, cfg, ker, chosen = best
    crosses = {select_kind: chosen}
    if select_kind != "kfold":
        crosses["kfold"] = _cross(obs, smp, prior_log, ker, cfg, _folds(obs, "kfold", seed))
    if len({o.gpu_type for o in obs}) >= 2:
        gpu_folds = _folds(obs, "leave-one-gpu-out", seed)
        crosses["leave-one-gpu-out"] = _cross(obs, smp, prior_log, ker, cfg, gpu_folds)
        for direction in ("up", "down"):  # the folds whose test type is bigger (smaller) than all of their training's
            folds = [(tr, te) for tr, te in gpu_folds
                     if shift_direction(obs[te[0]].gpu_type, sorted({obs[i].gpu_type for i in tr})) == direction]
            if folds:
                crosses[f"gpu-{direction}"] = _cross(obs, smp, prior_log, ker, cfg, folds)
    heldout = {kind: heldout_error(*_pooled(c)) for kind, c in crosses.items() if kind in HELDOUT_KINDS}
    alpha = solve(ker.job * ker.gpu, smp.log_s - prior_log, cfg.lam)
    jobs, idx = distinct_jobs(enc.encode([*smp.selves, *smp.partners], [*smp.gpus, *smp.gpus]))
    n = len(smp.selves)
    fitted = Fitted(jobs, idx[:n], idx[n:], list(smp.gpus), alpha, smp.log_s - prior_log)
    mean_norm = 1.0 / float(np.mean(np.exp(smp.log_s)))
    model = PriorCorrected(prior, enc, cfg, fitted, mean_norm, heldout, sorted(set(smp.gpus)),
                           admission_tables(crosses))
    model.calibration = crosses
    return model


def cross_validate(observations: Sequence[Colocation], kind: str, k: int = 5, seed: int = 0,
                   floor: float = 0.6) -> Score:
    """`fit_transfer` scored on the held-out part of each `kind` fold of `observations` (`scoring.cross_score`), the
    config chosen on each training part only: what `elastico iac evaluate --split` prints."""
    obs = list(observations)
    return cross_score(obs, split(obs, kind, k=k, seed=seed), lambda part: fit_transfer(part, seed=seed), floor=floor)


def format_transfer(model: PriorCorrected, out: str) -> str:
    """What `elastico iac train` says about a prior-corrected model it saved at `out`."""
    c, m = model.config, model.margins
    lines = [f"chosen: lam={c.lam:g} num_scale={c.num_scale:g} family_sim={c.family_sim:g} batch={c.batch:g} "
             f"linear={c.linear:g} (gpu_scale={c.gpu_scale:g}, shared={c.shared:g}); "
             f"prior defaults sm={model.prior.default_sm:g} bw={model.prior.default_bw:g}; saved {out}",
             f"trained on GPU types {', '.join(model.gpu_types)}; {len(model.encoder.families)} families; "
             f"features {', '.join(model.encoder.numeric)}", "held-out error (normalized throughput):"]
    for kind, e in model.heldout.items():
        lines.append(f"  {kind:<20} MAPE {e['mape_norm']:.1%} over {int(e['n_pairs'])} pairs; "
                     f"{1 - FALSE_ADMISSION_TARGET:.0%} of pairs over-predicted by at most {e['over_q'] - 1:+.0%}")
    bars = {k: model.admission[k][FLOORS.index(REPORT_FLOOR)] for k in ADMISSION_KINDS}
    lines.append(f"admission at floor {REPORT_FLOOR}: a pair's worse job predicted at least {bars['seen']:.2f} (seen), "
                 f"{bars['family']:.2f} (an unseen family), {bars['gpu']:.2f} (an unseen GPU type; one with more "
                 f"bandwidth than all trained on {bars['gpu_up']:.2f}, less {bars['gpu_down']:.2f}), so that at most "
                 f"{ADMISSION_TARGET:.0%} of held-out bad pairs pass; gain-rule margins {m['gain_seen']:.2f} / "
                 f"{m['gain_family']:.2f} / {m['gain_gpu']:.2f}")
    return "\n".join(lines)
