"""Few-shot adaptation judged as it will be used: adapt on a random fraction of a new GPU type's pairs, score the rest.

`elastico iac evaluate --model M --data D --adapt-fraction F [--seed S] [--seeds N]` prints `score_adaptation`:
per draw (seed), F of D's pairs of each GPU type (rounded, at least `adapt.MIN_PAIRS` that ran together) are
the first measured pairs; the model is adapted on them (`adapt.adapt`) and scored on the others beside

- `unadapted`: the model as it is (its view of the GPU type, its own margins);
- `trivial`: the mean slowdown of the same adaptation pairs (of each GPU type, as the adaptation is), for every
  pair of that type (admits with no margin, as the trivial predictors of `scoring` do).

A GPU type whose draw leaves too few pairs to adapt on or none to score is skipped, and said so (`skipped`);
the command fails only when every type is.

Over N draws each figure is given as the mean and a 95 % Student-t interval (null with one draw), and the
ratio of the adapted model's MAPE to the trivial one's per draw (paired: the same pairs), with its interval.
The top-level `mape`, `trivial_mape`, `unadapted_mape`, `false_admit` and `good_admitted` are means over
draws, of normalized throughput (co-located / solo), as `iac evaluate --model` reports it; the `_slowdown`
twins are the MAPE of slowdown.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy import stats

from slurm_elastico.interference.adapt import MIN_PAIRS, adapt
from slurm_elastico.interference.errors import MeasurementError
from slurm_elastico.interference.measurements import Colocation
from slurm_elastico.interference.probe import pair_key
from slurm_elastico.interference.scoring import metrics, model_norms_and_margins, true_norms

METHODS = ("adapted", "unadapted", "trivial")
FIGURES = ("mape_norm", "mape_slowdown", "false_admission", "good_admitted", "bad_of_admitted")


def draw(observations: Sequence[Colocation], fraction: float, seed: int) -> tuple[list[int], list[int], dict[str, str]]:
    """(adaptation pair indices, test pair indices, skipped GPU types with the reason): `fraction` of each GPU
    type's pairs at random, by `seed`; a pair measured more than once (either way round) has all its rows on one
    side, or the scored part would hold pairs the adaptation saw.

    A type is skipped (neither adapted nor scored) when its adaptation part would hold fewer than `MIN_PAIRS`
    pairs that ran together, or its test part none; `MeasurementError` when every type is, naming each."""
    if not 0.0 < fraction < 1.0:
        raise MeasurementError(f"adaptation fraction {fraction:g} is outside (0, 1): it is the share of the data's "
                               "pairs adapted on, the rest being scored")
    rng = np.random.default_rng(seed)
    by_type: dict[str, dict[frozenset, list[int]]] = {}  # per type, the rows of each pair (measured once or more)
    for i, o in enumerate(observations):
        by_type.setdefault(o.gpu_type, {}).setdefault(pair_key(o), []).append(i)
    if not by_type:
        raise MeasurementError("the data holds no pairs")
    chosen, rest, skipped = [], [], {}
    for gpu, groups in sorted(by_type.items()):
        pairs = list(groups.values())
        order = [pairs[j] for j in rng.permutation(len(pairs))]
        k = int(round(fraction * len(pairs)))
        head, tail = [i for rows in order[:k] for i in rows], [i for rows in order[k:] for i in rows]
        fitting = sum(observations[i].fits for i in head)
        if fitting < MIN_PAIRS:
            skipped[gpu] = (f"too few pairs to adapt on GPU type {gpu}: {fraction:g} of its {len(pairs)} pairs is {k}, "
                            f"of which {fitting} ran together; adaptation needs at least {MIN_PAIRS} (a larger "
                            "--adapt-fraction or more data)")
        elif not any(observations[i].fits for i in tail):
            skipped[gpu] = (f"nothing left to score on GPU type {gpu}: the {len(tail)} pairs outside the adaptation "
                            f"fraction {fraction:g} have none that ran together (a smaller --adapt-fraction)")
        else:
            chosen += head
            rest += tail
    if len(skipped) == len(by_type):
        raise MeasurementError("; ".join(skipped.values()))
    return sorted(chosen), sorted(rest), skipped


def trivial_norm(pairs: Sequence[Colocation]) -> float:
    """1 / the mean slowdown of the pairs that ran together (both jobs of each): the trivial predictor."""
    slow = [1.0 / v for o in pairs if o.fits for v in (o.norm_a, o.norm_b)]
    return 1.0 / float(np.mean(slow))


def score_draw(model, observations: Sequence[Colocation], fraction: float, seed: int,
               floor: float = 0.6) -> dict:
    """One draw: {"seed", "n_adapt_pairs", "n_test_pairs", "skipped" (GPU type: why), "trivial_norm" (per GPU
    type), "metrics": {method: figures}, "adaptation": per GPU type}."""
    obs = list(observations)
    head, tail, skipped = draw(obs, fraction, seed)
    adapt_obs, test_obs = [obs[i] for i in head], [obs[i] for i in tail]
    adapted = adapt(model, adapt_obs)
    truth = true_norms(test_obs)
    trivial = {g: trivial_norm([o for o in adapt_obs if o.gpu_type == g]) for g in sorted(adapted.fits)}
    table = {
        "adapted": model_norms_and_margins(adapted, test_obs),
        "unadapted": model_norms_and_margins(model, test_obs),
        "trivial": (np.array([[trivial[o.gpu_type]] * 2 for o in test_obs]).reshape(-1, 2), np.zeros(len(test_obs))),
    }
    return {"seed": seed, "n_adapt_pairs": len(adapt_obs), "n_test_pairs": len(test_obs), "skipped": skipped,
            "trivial_norm": trivial,
            "metrics": {m: metrics(truth, p, mg, floor) for m, (p, mg) in table.items()},
            "adaptation": {g: f.to_dict() for g, f in adapted.fits.items()}}


FRACTIONS = ("false_admission", "good_admitted", "bad_of_admitted")  # shares: their intervals end at 0 and 1


def interval(values: Sequence[float], high: float = math.inf) -> dict[str, float]:
    """Mean and 95 % Student-t interval of `values` over draws (NaN values left out; NaN bounds with fewer than 2),
    the bounds clipped to [0, `high`]: every figure here is at least 0, a share at most 1."""
    v = np.array([x for x in values if not math.isnan(x)], dtype=float)
    if not len(v):
        return {"mean": math.nan, "low": math.nan, "high": math.nan, "n": 0}
    mean = float(v.mean())
    if len(v) < 2:
        return {"mean": mean, "low": math.nan, "high": math.nan, "n": 1}
    half = float(stats.t.ppf(0.975, len(v) - 1) * v.std(ddof=1) / math.sqrt(len(v)))
    return {"mean": mean, "low": max(0.0, mean - half), "high": min(high, mean + half), "n": int(len(v))}


@dataclass
class AdaptationScore:
    fraction: float
    floor: float
    seeds: list[int]
    draws: list[dict]

    def summary(self) -> dict[str, dict[str, dict[str, float]]]:
        """method -> figure -> interval over draws."""
        return {m: {f: interval([d["metrics"][m][f] for d in self.draws], 1.0 if f in FRACTIONS else math.inf)
                    for f in FIGURES} for m in METHODS}

    def ratio(self, figure: str = "mape_norm") -> dict[str, float]:
        """The adapted model's `figure` over the trivial one's, per draw, as an interval."""
        return interval([d["metrics"]["adapted"][figure] / d["metrics"]["trivial"][figure]
                         if d["metrics"]["trivial"][figure] > 0 else math.nan for d in self.draws])

    def to_dict(self) -> dict:
        s = self.summary()
        return {"adapt_fraction": self.fraction, "floor": self.floor, "seeds": self.seeds,
                "target": "normalized throughput (co-located / solo); _slowdown: slowdown (solo / co-located)",
                "mape": s["adapted"]["mape_norm"]["mean"], "trivial_mape": s["trivial"]["mape_norm"]["mean"],
                "unadapted_mape": s["unadapted"]["mape_norm"]["mean"],
                "mape_slowdown": s["adapted"]["mape_slowdown"]["mean"],
                "trivial_mape_slowdown": s["trivial"]["mape_slowdown"]["mean"],
                "unadapted_mape_slowdown": s["unadapted"]["mape_slowdown"]["mean"],
                "false_admit": s["adapted"]["false_admission"]["mean"],
                "good_admitted": s["adapted"]["good_admitted"]["mean"],
                "mape_over_trivial": self.ratio("mape_norm"),
                "mape_slowdown_over_trivial": self.ratio("mape_slowdown"),
                "methods": s, "draws": self.draws}


def score_adaptation(model, observations: Sequence[Colocation], fraction: float, seed: int = 0, seeds: int = 1,
                     floor: float = 0.6) -> AdaptationScore:
    """`score_draw` for seeds `seed` .. `seed + seeds − 1`."""
    if seeds < 1:
        raise MeasurementError(f"seeds {seeds}: the number of draws must be at least 1")
    if not 0 < floor < 1:
        raise MeasurementError(f"floor {floor:g} is outside (0, 1): it is the least normalized throughput admitted")
    obs = list(observations)
    if not any(o.fits for o in obs):
        raise MeasurementError("nothing to adapt on or score: the data has no pair that ran together")
    run = list(range(seed, seed + seeds))
    return AdaptationScore(fraction, floor, run, [score_draw(model, obs, fraction, s, floor) for s in run])


def format_adaptation(score: AdaptationScore) -> str:
    """A readable table of `score_adaptation`'s figures: mean [95 % interval] per method."""
    s = score.summary()
    d0 = score.draws[0]
    lines = [f"adapted on {score.fraction:g} of the pairs of each GPU type ({d0['n_adapt_pairs']} pairs), scored on the "
             f"other {d0['n_test_pairs']}; {len(score.seeds)} draw(s) (seeds {score.seeds[0]}..{score.seeds[-1]}); "
             f"floor {score.floor}; mean [95 % interval]", "",
             f"{'method':<11}{'MAPE norm':>24}{'MAPE slowdown':>24}{'false adm.':>24}{'good admitted':>24}"]

    def cell(x: dict) -> str:
        if math.isnan(x["mean"]):
            return "n/a"
        if math.isnan(x["low"]):
            return f"{x['mean']:.1%}"
        return f"{x['mean']:.1%} [{x['low']:.1%}, {x['high']:.1%}]"

    for m in METHODS:
        lines.append(f"{m:<11}" + "".join(f"{cell(s[m][f]):>24}" for f in FIGURES[:4]))
    for reason in sorted({r for d in score.draws for r in d["skipped"].values()}):
        lines.append(f"skipped: {reason}")
    r = score.ratio()
    band = "" if math.isnan(r["low"]) else f" [{r['low']:.2f}, {r['high']:.2f}]"
    lines.append(f"\nadapted / trivial MAPE on normalized throughput (paired by draw): {r['mean']:.2f}{band}")
    return "\n".join(lines)
