"""Probe and revert: a new pairing on one GPU is a trial, judged on the co-runners' observed progress.

The predictor's word is a hypothesis. Once both jobs of a pair have run side by
side long enough (`min_seconds` each, the observer's accumulated co-located
seconds) and a solo speed is there for each at its shape, the pairing is judged
on what it delivered: each job's observed normalized throughput (co-located
speed ÷ solo speed) and their sum, the GPU's combined speed. A solo speed is
measured where the job ran alone at that shape; a job that joined its partner
straight from the queue has none, and the caller gives its family's figure for
the shape instead (what the planner believed when it paired them), naming it in
`estimated` so the verdict says so (`helper.observer`).

* It is **reverted** when the combined speed is below 1 + margin (sharing the
  GPU did not gain: two jobs one after the other would do as well, without the
  risk) or when a job runs below its floor. The margin is the model's gain
  margin, and at least `base.MIN_GAIN`, the least gain the planner asks of a
  pairing too.
* Otherwise it is **kept**.

Pure logic: `judge_pairings` takes the observer's accumulated (work, seconds)
per direction (`helper.observe.PairKey` → (work, seconds)) and solo rates per
(job, shape), the same inputs `helper.observe.pair_observations` takes, so it
must run before that call spends them. The caller undoes a reverted pairing
(journaled like any action) and remembers it in a `Refusals` ledger; the
planner is then handed `Refusals.model(model)`, which answers an infinite
slowdown for a refused pair of profiles, so the planner does not pair them
again while the refusal lasts (a different shape is a different profile, and
may be tried). The observation itself goes where every observed pair goes
(the store's `colocation` table), which is how the predictor learns from it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, fields

import numpy as np

from slurm_elastico.interference.base import MIN_GAIN, SlowdownModel, SoloProfile
from slurm_elastico.interference.scorers import ByScorer, Derived, PairValues, scorer_of, values_against

PairKey = tuple[int, str, int, str]
"""(job, its shape, partner, partner's shape): one direction of a co-located pair, as the observer keys it."""
MIN_TRIAL_S = 10.0
"""Seconds each job of a pair must have run beside the other before the pairing is judged. The observer spends a
pair's accumulated time once it makes an observation of it (`helper.observe.MIN_PAIR_S`, also 10 s), so judge on
the same accumulation before that call, with a `min_seconds` no larger than it."""
REFUSE_S = 6 * 3600.0
"""How long a reverted pairing stays refused (its jobs may change phase; a later trial is allowed)."""


@dataclass(frozen=True)
class Verdict:
    jobs: tuple[int, int]
    shapes: tuple[str, str]
    norms: tuple[float, float]  # observed co-located / solo speed of each job
    combined: float  # their sum: the GPU's speed next to running the two jobs one after the other
    revert: bool
    reason: str


def _floor(floors: Mapping[int | tuple[int, str], float] | float, job: int, shape: str) -> float:
    if isinstance(floors, (int, float)):
        return float(floors)
    return float(floors.get((job, shape), floors.get(job, 0.0)))


def judge_pairings(beside: Mapping[PairKey, tuple[float, float]], solo_rates: Mapping[tuple[int, str], float],
                   floors: Mapping[int | tuple[int, str], float] | float, margin: float,
                   min_seconds: float = MIN_TRIAL_S, estimated: Collection[tuple[int, str]] = ()) -> list[Verdict]:
    """A verdict for every pair with enough side-by-side progress in both directions and both solo rates known.

    `floors`: one floor for every job, or a floor per (job id, shape), else per job id (a job not listed has
    none). `margin` >= 0: the combined speed must reach 1 + margin, or 1 + `MIN_GAIN` when that is more.
    `estimated`: the (job, shape)s whose rate in `solo_rates` is a figure, not a measurement (named in the
    reason). Pairs without enough evidence yet get no verdict (still on trial).
    """
    if not (margin >= 0 and math.isfinite(margin)):
        raise ValueError(f"margin {margin!r}: must be a finite number >= 0 (the gain a shared GPU must show)")
    margin = max(margin, MIN_GAIN)
    if not min_seconds > 0:
        raise ValueError(f"min_seconds {min_seconds!r}: must be > 0")
    out = []
    for key in sorted(beside):
        a, sa, b, sb = key
        back = (b, sb, a, sa)
        if a >= b or back not in beside:
            continue
        (wa, ta), (wb, tb) = beside[key], beside[back]
        ra, rb = solo_rates.get((a, sa)), solo_rates.get((b, sb))
        if min(ta, tb) < min_seconds or not ra or not rb:
            continue
        norms = (wa / ta / ra, wb / tb / rb)
        combined = norms[0] + norms[1]
        below = [(j, n, _floor(floors, j, s)) for j, s, n in ((a, sa, norms[0]), (b, sb, norms[1]))
                 if n < _floor(floors, j, s)]
        if below:
            j, n, f = below[0]
            reason = f"job {j} runs at {n:.2f} of its solo speed beside job {b if j == a else a}, below its floor {f:g}"
        elif combined < 1.0 + margin:
            reason = (f"jobs {a} and {b} together run at {combined:.2f} of one GPU's worth of solo speed "
                      f"({norms[0]:.2f} + {norms[1]:.2f}), below 1 + margin {margin:g}: sharing does not gain")
        else:
            reason = f"jobs {a} and {b} together run at {combined:.2f} ({norms[0]:.2f} + {norms[1]:.2f}): kept"
        guessed = [f"job {j}'s at {s}" for j, s in ((a, sa), (b, sb)) if (j, s) in estimated]
        if guessed:
            reason += f" (solo speed {' and '.join(guessed)}: its family's figure, never measured alone)"
        out.append(Verdict((a, b), (sa, sb), norms, combined, bool(below) or combined < 1.0 + margin, reason))
    return out


MEASURED = ("sm_util", "membw_util", "mem_used_mib", "power_w")
"""A profile's fields that a job's counters, measured alone, replace (`shapes.solo.solo_profile`)."""
UNKEYED = ("throughput", *MEASURED)
"""What a refusal's key leaves out: what measurement moves (the throughput too: `shapes.measured_speed`)."""


def profile_key(p: SoloProfile) -> tuple:
    """What a refusal is keyed on: the profile without its counters and throughput, so a pair stays refused once
    its jobs are measured alone again (on a GPU each solo interval gives new counters and a new solo speed) and
    for other jobs of the same family and shape; an unmeasured (NaN) field equals another unmeasured one."""
    return tuple(None if isinstance(v, float) and math.isnan(v) else v for k, v in vars(p).items() if k not in UNKEYED)


def pair_key(o) -> frozenset:
    """The pair a `measurements.Colocation` measured, whichever way round (`profile_key` of its two jobs): the same
    pair measured again has the same key."""
    return frozenset((profile_key(o.a), profile_key(o.b)))


def keys_among(profiles: Sequence[SoloProfile], others: Collection[SoloProfile]) -> list[tuple | None]:
    """`profile_key` of each of `profiles` that may equal the key of one of `others`; None for the rest, whose
    kind, model family or precision no one of `others` has (a key costs a pass over every field; the planner asks
    for hundreds of profiles an epoch, few of which were ever measured)."""
    coarse = {(p.kind, p.model_family, p.precision) for p in others}
    return [profile_key(p) if (p.kind, p.model_family, p.precision) in coarse else None for p in profiles]


class Refusals:
    """Pairs of solo profiles not to co-locate until a time; `model(m)` makes a planner model honour them."""

    def __init__(self) -> None:
        self._until: dict[frozenset, float] = {}

    def add(self, a: SoloProfile, b: SoloProfile, now: float, seconds: float = REFUSE_S) -> None:
        key = frozenset((profile_key(a), profile_key(b)))
        self._until[key] = max(self._until.get(key, 0.0), now + seconds)

    def expire(self, now: float) -> None:
        """Forgets refusals that ended by `now`."""
        self._until = {k: t for k, t in self._until.items() if t > now}

    def refused(self, a: SoloProfile, b: SoloProfile, now: float) -> bool:
        return self._until.get(frozenset((profile_key(a), profile_key(b))), 0.0) > now

    def __len__(self) -> int:
        return len(self._until)

    def to_list(self) -> list[dict]:
        """JSON-ready form (a helper that runs once per epoch keeps its refusals between runs)."""
        out = []
        for key, until in sorted(self._until.items(), key=lambda kv: kv[1]):
            pair = sorted(key, key=repr)
            out.append({"a": list(pair[0]), "b": list(pair[-1]), "until": until})
        return out

    @classmethod
    def from_list(cls, rows: list[dict]) -> Refusals:
        """Reads `to_list`'s form; a row that is not one raises ValueError naming it."""
        out = cls()
        every = [f.name for f in fields(SoloProfile)]
        # a row holds `profile_key`'s fields; older ones every field, or every field but the counters
        forms = {len(names): names for names in (every, [n for n in every if n not in MEASURED],
                                                 [n for n in every if n not in UNKEYED])}
        for i, row in enumerate(rows):
            try:
                a, b = (SoloProfile(**{"throughput": math.nan, **{n: (math.nan if v is None else v)
                                                                  for n, v in zip(forms[len(row[k])], row[k])}})
                        for k in ("a", "b"))
                until = float(row["until"])
            except (KeyError, TypeError, ValueError) as exc:
                raise ValueError(f"refusal {i}: not a pair of solo profiles with an end time ({exc})") from None
            key = frozenset((profile_key(a), profile_key(b)))  # old rows that differed in counters are one now
            out._until[key] = max(out._until.get(key, 0.0), until)
        return out

    def model(self, model: SlowdownModel, now: float) -> SlowdownModel:
        """`model` with an infinite slowdown (never admitted) for every pair refused at `now`; `model` itself when
        none is (so code that asks what the model is, e.g. for a stand-in's margin, sees it unwrapped)."""
        active = frozenset(k for k, t in self._until.items() if t > now)
        return RefusingModel(model, active) if active else model


class RefusingModel(ByScorer):
    """A `SlowdownModel` that answers as `inner` except for refused pairs of profiles: slowdown inf (never admitted).
    Margins are the inner model's. Through a scorer derived from the inner model's (`scorers.Derived`)."""

    def __init__(self, inner: SlowdownModel, refused: frozenset):
        self.inner, self.refused = inner, refused

    def scorer(self, profiles: Sequence[SoloProfile]) -> Derived:
        inner = scorer_of(self.inner, profiles)
        pairs = [tuple(key) for key in self.refused]
        both_ways = [(k[0], k[-1], math.inf) for k in pairs + [k[::-1] for k in pairs]]
        keys = [profile_key(p) for p in inner.profiles] if pairs else [None] * len(inner.profiles)
        refused = PairValues(keys, both_ways)

        def slow(model, ia, ib):
            s = model.slowdown(ia, ib)
            return np.where(np.isnan(refused.lookup(ia, ib)), s, math.inf) if len(refused) else s

        def against(model, ia, partners):
            s = model.against(ia, partners)
            if not pairs:
                return s
            refusing = values_against(keys, lambda ps: [profile_key(p) for p in ps], both_ways, ia, partners)
            return np.where(np.isnan(refusing), s, math.inf)

        pair = getattr(inner, "margin", None)  # (margins are the inner model's, pair by pair too where it has them)
        return Derived(inner, slow, lambda model, ia, ib, _: model.margins(ia, ib), against,
                       None if pair is None else lambda model, i, j, *_: pair(i, j))

    @property
    def admission_margin(self) -> float:
        return float(getattr(self.inner, "admission_margin", 0.0))

    @property
    def gain_margin(self) -> float:
        """The inner model's margin for the gain rule (its admission margin where it has none of its own)."""
        return float(getattr(self.inner, "gain_margin", self.admission_margin))

    def on_gpu(self, gpu_type: str) -> RefusingModel:
        on_gpu: Callable | None = getattr(self.inner, "on_gpu", None)
        return RefusingModel(on_gpu(gpu_type) if on_gpu else self.inner, self.refused)
