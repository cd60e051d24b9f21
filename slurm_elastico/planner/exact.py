"""The exact optimum of one epoch's packing by MILP (scipy / HiGHS): the yardstick for small instances.

Maximises `Σ_j w_j·T_j(c)/T_j(c_max)` over pending family jobs (the planner's
objective up to the constant `Σ_j w_j`), with one shape and one GPU per job
at most, shares and memory per GPU, CPUs and memory per node, and no pair of
shapes on one GPU that the interference model puts under a floor (with its
admission margin, as packing checks it: speed >= floor × (1 + margin)) or that
does not gain (packing's gain rule: f_a + f_b >= 1 + the larger of the pair's
margin and `PairCache.gain_margin`, which is at least `MIN_GAIN`; f a
job's predicted co-located throughput ÷ its throughput alone at its family's
fastest single-GPU shape). Pairs only: the planner also refuses three-way
co-locations whose added slowdowns break a floor or the whole GPU's gain, and
it checks every pair it puts together, so this optimum is an upper bound on
what the planner may reach.

Only for idle clusters with pending jobs (no running jobs), and shapes on a
share of one GPU (a shape of whole GPUs, `Resources.gpus`, is left out): it
is a benchmark and test oracle, far too slow for a real epoch. Shares are in
Slurm's counts on each GPU (`shapes.units.shares_of` at the GPU's
`shares_total`), as the packing holds them.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from slurm_elastico.interference.base import SlowdownModel
from slurm_elastico.model import Family, JobState, Snapshot
from slurm_elastico.planner.slowdown import PairCache, for_gpu
from slurm_elastico.planner.weights import weight_of
from slurm_elastico.shapes.solo import solo_profile
from slurm_elastico.shapes.units import shares_of


def optimum(snapshot: Snapshot, families: Mapping[int, Family], fairness: str, now: float,
            model: SlowdownModel | None, floor: float, gpu_memory_mib: int, gpu_type: str = "") -> float:
    """Best achievable `Σ w_j·v_j` for the pending family jobs of an idle `snapshot` (GPUs of `gpu_type`)."""
    model = for_gpu(model, gpu_type)
    jobs = [j for j in snapshot.jobs if j.state is JobState.PENDING and not j.held and j.job_id in families]
    if any(j.state is JobState.RUNNING for j in snapshot.jobs):
        raise ValueError("exact.optimum handles idle clusters only")
    nodes = [n for n in snapshot.nodes if n.usable]
    gpus = [(ni, gv) for ni, n in enumerate(nodes) for gv in n.gpus]
    var: list[tuple[int, int, int]] = []  # (job k, slot c, gpu g)
    gain: list[float] = []
    opts: list[list[tuple[int, object]]] = []
    for k, jv in enumerate(jobs):
        fam = families[jv.job_id]
        w = weight_of(jv, fam, fairness, now)
        tmax = max(s.throughput for s in fam.shapes)
        mine = [(c, s) for c, s in enumerate(fam.shapes)
                if s.throughput >= fam.throughput_floor and not s.resources.gpus]
        opts.append(mine)
        for c, s in mine:
            for g, (ni, gv) in enumerate(gpus):
                mem = nodes[ni].gpu_memory_mib or gpu_memory_mib
                if shares_of(s.resources.mps, gv.shares_total) <= gv.shares_free and s.resources.gpu_mem_mib <= mem:
                    var.append((k, c, g))
                    gain.append(w * s.throughput / tmax)
    if not var:
        return 0.0
    index = {v: i for i, v in enumerate(var)}
    rows: list[tuple[dict[int, float], float]] = []

    def row(coefs: dict[int, float], ub: float) -> None:
        if coefs:
            rows.append((coefs, ub))

    for k in range(len(jobs)):
        row({i: 1.0 for i, v in enumerate(var) if v[0] == k}, 1.0)
    for g, (ni, gv) in enumerate(gpus):
        mem = nodes[ni].gpu_memory_mib or gpu_memory_mib
        here = [(i, families[jobs[v[0]].job_id].shapes[v[1]]) for i, v in enumerate(var) if v[2] == g]
        row({i: float(shares_of(s.resources.mps, gv.shares_total)) for i, s in here}, float(gv.shares_free))
        row({i: float(s.resources.gpu_mem_mib) for i, s in here}, float(mem))
    for ni, n in enumerate(nodes):
        here = [(i, families[jobs[v[0]].job_id].shapes[v[1]]) for i, v in enumerate(var) if gpus[v[2]][0] == ni]
        row({i: float(s.resources.cpus) for i, s in here}, float(n.cpus - n.cpus_alloc))
        if n.memory_mib > 0:
            row({i: float(s.resources.host_mem_mib) for i, s in here}, float(n.memory_mib - n.memory_alloc_mib))
    if model is not None:
        _conflicts(jobs, families, opts, gpus, index, model, floor, row)

    # scipy when a solve needs it: importing it costs about 0.3 s, every helper epoch otherwise
    from scipy.optimize import Bounds, LinearConstraint, milp
    from scipy.sparse import lil_matrix
    a = lil_matrix((len(rows), len(var)))
    ub = np.empty(len(rows))
    for r, (coefs, bound) in enumerate(rows):
        for i, v in coefs.items():
            a[r, i] = v
        ub[r] = bound
    res = milp(c=-np.array(gain), constraints=LinearConstraint(a.tocsr(), -np.inf, ub),
               integrality=np.ones(len(var)), bounds=Bounds(0, 1))
    if res.x is None:  # pragma: no cover - all-zero is always feasible
        raise RuntimeError(f"MILP failed: {res.message}")
    return float(-res.fun)


def _conflicts(jobs, families, opts, gpus, index, model, floor, row) -> None:
    """x_kcg + Σ_{d clashing with c} x_ldg ≤ 1: valid because job l takes one shape at most."""
    keys = [(k, c) for k, mine in enumerate(opts) for c, _ in mine]
    prof = {(k, c): solo_profile(families[jobs[k].job_id].shapes[c], families[jobs[k].job_id].kind,
                                 families[jobs[k].job_id].name) for k, c in keys}
    pairs = [(a, b) for a in keys for b in keys if a[0] != b[0]]
    if not pairs:
        return
    pa, pb = [prof[a] for a, _ in pairs], [prof[b] for _, b in pairs]
    s = np.asarray(model.predict(pa, pb), dtype=float)
    slow = {p: max(1.0, float(v)) for p, v in zip(pairs, s)}
    if hasattr(model, "admission_margins"):
        m = np.asarray(model.admission_margins(pa, pb), dtype=float)
        margin = {p: float(v) for p, v in zip(pairs, np.where(np.isfinite(m), m, np.inf))}
    else:
        margin = dict.fromkeys(pairs, float(getattr(model, "admission_margin", 0.0)))
    gain_floor = PairCache(model).gain_margin  # as packing's: the gain rule's least margin

    # The reference of each job's fraction of solo speed, as `seats.best_solo` gives the epoch's seats.
    best = {k: max((s.throughput for s in families[jobs[k].job_id].shapes if s.resources.gpus <= 1), default=0.0)
            for k in {a[0] for a in keys}}

    def fraction(a, tput: float, s: float) -> float:  # as admission.Admission.fraction
        ref = max(best[a[0]], tput)
        return tput / ref / s if ref > 0 else 0.0

    def bad(a, b) -> bool:
        fa, fb = families[jobs[a[0]].job_id], families[jobs[b[0]].job_id]
        m = max(margin[(a, b)], margin[(b, a)])  # as packing: the larger of the pair's two directions
        scale = 1.0 + m
        sa, sb = slow[(a, b)] * scale, slow[(b, a)] * scale
        ta, tb = fa.shapes[a[1]].throughput, fb.shapes[b[1]].throughput
        # The gain rule with a hair of slack: rounding must never make this stricter than packing.
        gain = fraction(a, ta, slow[(a, b)]) + fraction(b, tb, slow[(b, a)])
        return (sa * floor > 1.0 or sb * floor > 1.0 or ta < fa.throughput_floor * sa
                or tb < fb.throughput_floor * sb or gain < (1.0 + max(m, gain_floor)) * (1.0 - 1e-12))

    clash: dict[tuple, list] = {}
    for a, b in pairs:
        if bad(a, b):
            clash.setdefault((a, b[0]), []).append(b[1])
    for (a, l), ds in clash.items():
        for g in range(len(gpus)):
            ia = index.get((a[0], a[1], g))
            if ia is None:
                continue
            coefs = {ia: 1.0}
            for d in ds:
                ib = index.get((l, d, g))
                if ib is not None:
                    coefs[ib] = 1.0
            if len(coefs) > 1:
                row(coefs, 1.0)
