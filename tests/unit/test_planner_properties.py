"""Planner invariants over random snapshots (hypothesis): capacity, determinism, floors, gain, weights, optimum."""

from __future__ import annotations

import dataclasses
import itertools
from collections import defaultdict

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from slurm_elastico.config import Settings
from slurm_elastico.interference.base import ContentionModel
from slurm_elastico.model import JobState
from slurm_elastico.planner import exact, narrowers, policies
from slurm_elastico.planner.weights import weight_of
from slurm_elastico.shapes.solo import solo_profile
from tests import synthetic

NOW = 1_000_000.0
FAST = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])


class Bandwidth:
    """Test double with real conflicts: summed SM or summed bandwidth demand, bandwidth not capped by the share."""

    def predict(self, a, b):
        da = np.array([(p.sm_util, p.membw_util) for p in a]).reshape(-1, 2)
        db = np.array([(p.sm_util, p.membw_util) for p in b]).reshape(-1, 2)
        return np.maximum(1.0, np.nan_to_num((da + db).max(axis=1), nan=1.0))


class Margined(Bandwidth):
    """Bandwidth with a calibrated safety margin for every pair: floors are checked at floor × 1.2."""

    admission_margin = 0.2
    least_margin = 0.2


class PairMargins(Bandwidth):
    """Bandwidth with per-pair margins: 0.3 when an inference job is in the pair, else 0.05."""

    least_margin = 0.05

    def admission_margins(self, a, b):
        return np.array([0.3 if "infer" in (x.kind, y.kind) else 0.05 for x, y in zip(a, b)])


MODELS = {"contention": ContentionModel(), "bandwidth": Bandwidth(), "margined": Margined(),
          "pair-margins": PairMargins()}


@st.composite
def cases(draw, running=True):
    seed = draw(st.integers(0, 2**32 - 1))
    jobs = draw(st.integers(1, 24))
    gpus = draw(st.integers(1, 8))
    frac = draw(st.sampled_from([0.0, 0.3])) if running else 0.0
    snap, fams = synthetic.instance(np.random.default_rng(seed), jobs, gpus, running_frac=frac, templates=6,
                                    gpus_per_node=draw(st.sampled_from([1, 2, 4])), now=NOW)
    policy = draw(st.sampled_from(sorted(policies.REGISTRY)))
    model = draw(st.sampled_from(sorted(MODELS)))
    return snap, fams, policies.REGISTRY[policy], MODELS[model]


def planned_shape(fams, full, p):
    """The placement's shape: from the policy's narrowed family, or (a running job kept as it runs) the full one."""
    names = {s.name for s in fams[p.job_id].shapes}
    return (fams if p.shape in names else full)[p.job_id].shape(p.shape)


def check_capacity(snap, fams, plan, floor, full=None):
    settings_ = Settings()
    full = full or fams
    placed = {p.job_id: p for p in plan.placements}
    share = defaultdict(int)
    mem = defaultdict(float)
    cpus = defaultdict(float)
    for n in snap.nodes:
        for g in n.gpus:
            for u in g.users:
                if u.job_id not in placed:  # someone the plan leaves as is
                    share[(n.name, g.index)] += g.shares_total if u.whole else u.shares
                    mem[(n.name, g.index)] += n.gpu_memory_mib * (1 if u.whole else u.shares / 100)
    for p in plan.placements:
        shape = planned_shape(fams, full, p)
        share[(p.node, p.gpu)] += p.share
        mem[(p.node, p.gpu)] += shape.resources.gpu_mem_mib
        if snap.job(p.job_id).state is JobState.PENDING:
            cpus[p.node] += shape.resources.cpus
    for n in snap.nodes:
        assert cpus[n.name] <= n.cpus - n.cpus_alloc
        for g in n.gpus:
            assert share[(n.name, g.index)] <= g.shares_total
            assert mem[(n.name, g.index)] <= (n.gpu_memory_mib or settings_.gpu.memory_mib) + 1e-6
    for p in plan.placements:  # nobody is planned under its own floor or the co-location floor
        fam = fams[p.job_id]
        solo = planned_shape(fams, full, p).throughput
        if snap.job(p.job_id).state is JobState.PENDING:
            assert p.throughput >= fam.throughput_floor * (1 - 1e-9)
            assert p.throughput >= floor * solo * (1 - 1e-9) or floor == 0


def check_gain(snap, fams, plan, model, full):
    """Every pair sharing a GPU with a job the plan starts gains: f_a + f_b >= 1 + the pair's margin, each f the
    job's speed next to the other alone ÷ its speed alone at the fastest single-GPU shape of its (narrowed)
    family (packing's gain rule; three or more on a GPU are also checked as a whole there, not here)."""
    by_gpu = defaultdict(list)
    for p in plan.placements:
        if p.share > 0:
            by_gpu[(p.node, p.gpu)].append(p)
    for group in by_gpu.values():
        for a, b in itertools.combinations(group, 2):
            if JobState.PENDING not in (snap.job(a.job_id).state, snap.job(b.job_id).state):
                continue  # two running jobs were put together before this epoch
            shapes = [planned_shape(fams, full, p) for p in (a, b)]
            prof = [solo_profile(s, fams[p.job_id].kind, fams[p.job_id].name) for s, p in zip(shapes, (a, b))]
            slow = np.maximum(1.0, np.asarray(model.predict(prof, prof[::-1]), dtype=float))
            if hasattr(model, "admission_margins"):
                m = float(np.max(model.admission_margins(prof, prof[::-1])))
            else:
                m = float(getattr(model, "admission_margin", 0.0))
            gain = 0.0
            for p, shape, s in zip((a, b), shapes, slow):
                best = max((x.throughput for x in fams[p.job_id].shapes if x.resources.gpus <= 1), default=0.0)
                gain += shape.throughput / max(best, shape.throughput) / s
            assert gain >= (1.0 + m) * (1 - 1e-9), (a, b, gain, m)


@FAST
@given(cases())
def test_no_plan_exceeds_a_capacity_or_a_floor(case):
    snap, fams, policy, model = case
    plan = policy.plan(snap, fams, Settings(), model, NOW)
    floor = Settings().interference.floor * (1 + getattr(model, "least_margin", 0.0)) if policy.interference else 0.0
    narrowed = {k: policy.narrow(f) for k, f in fams.items()} if policy.narrow is not narrowers.all_shapes else fams
    check_capacity(snap, narrowed, plan, floor, full=fams)
    if policy.interference:
        check_gain(snap, narrowed, plan, model, fams)
    assert all(p >= 0 for p in plan.prices)


@FAST
@given(cases())
def test_the_same_snapshot_gives_the_same_plan(case):
    snap, fams, policy, model = case
    first = policy.plan(snap, fams, Settings(), model, NOW)
    # Fresh family objects with the same content: the plan must not depend on object identity.
    copies = {k: dataclasses.replace(f) for k, f in fams.items()}
    assert policy.plan(snap, copies, Settings(), model, NOW) == first


@FAST
@given(cases(), st.integers(0, 10**6))
def test_a_job_whose_every_shape_is_under_its_floor_is_never_started(case, pick):
    snap, fams, policy, model = case
    pend = [j.job_id for j in snap.jobs if j.state is JobState.PENDING]
    if not pend:
        return
    victim = pend[pick % len(pend)]
    fam = fams[victim]
    fams = {**fams, victim: dataclasses.replace(fam, throughput_floor=max(s.throughput for s in fam.shapes) * 1.01)}
    plan = policies.REGISTRY["elastico"].plan(snap, fams, Settings(), model, NOW)
    assert victim not in {p.job_id for p in plan.placements}
    assert victim not in {a.job_id for a in plan.actions}


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True)
@given(cases(running=False), st.integers(0, 10**6), st.floats(600.0, 36000.0))
def test_raising_a_jobs_weight_never_lowers_its_throughput(case, pick, earlier):
    """Under `waiting` fairness, submitting earlier raises w_j; j's planned throughput must not drop.

    A theorem for the choice at given prices (test_pricing); for the whole
    heuristic it holds on all but about 1 in 1,000 random cases (prices and
    GPU choice move with the weight), which `benchmarks/planner.py` counts.
    Derandomized so that this test is a fixed, reproducible sample.
    """
    snap, fams, _, model = case
    pend = [j for j in snap.jobs if j.state is JobState.PENDING]
    job = pend[pick % len(pend)]
    policy = policies.REGISTRY["elastico"]
    cfg = Settings()

    def rate(s):
        plan = policy.plan(s, fams, cfg, model, NOW)
        return next((p.throughput for p in plan.placements if p.job_id == job.job_id), 0.0)

    raised = dataclasses.replace(job, submit_time=int(job.submit_time - earlier))
    snap2 = dataclasses.replace(snap, jobs=tuple(raised if j is job else j for j in snap.jobs))
    assert weight_of(raised, fams[job.job_id], "waiting", NOW) > weight_of(job, fams[job.job_id], "waiting", NOW)
    assert rate(snap2) >= rate(snap) - 1e-9


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(0, 2**32 - 1), st.integers(2, 8), st.integers(1, 3), st.sampled_from(sorted(MODELS)))
@example(229, 3, 2, "margined")  # a job placed alone once slipped under its floor × margin when a partner came
def test_planner_never_beats_the_exact_optimum(seed, jobs, gpus, model_name):
    snap, fams = synthetic.instance(np.random.default_rng(seed), jobs, gpus, templates=jobs, gpus_per_node=2)
    s = Settings()
    s = dataclasses.replace(s, planner=dataclasses.replace(s.planner, reserve_queue_head=False))
    model = MODELS[model_name]
    plan = policies.REGISTRY["elastico"].plan(snap, fams, s, model, NOW)
    got = sum(weight_of(snap.job(p.job_id), fams[p.job_id], "waiting", NOW) * fams[p.job_id].shape(p.shape).throughput
              / max(x.throughput for x in fams[p.job_id].shapes) for p in plan.placements)
    best = exact.optimum(snap, fams, "waiting", NOW, model, s.interference.floor, s.gpu.memory_mib)
    assert got <= best + 1e-6
    assert best == 0 or got > 0  # something fits, so the planner starts something


def test_the_exact_optimum_counts_shares_in_slurms_units():
    """At 4 MPS shares per GPU a 25 % shape takes 1 share: the optimum is the one at 100 shares per GPU."""
    from tests.synthetic import cluster, family, pending, snapshot

    fams = {k: family((25, 0.45, 1000), (50, 0.8, 1000), (100, 1.0, 1000)) for k in range(1, 6)}
    jobs = [pending(k, submit=NOW - 60 * k) for k in fams]
    got = {per_gpu: exact.optimum(snapshot(cluster(2, gpus_per_node=2, shares=per_gpu), jobs, NOW), fams, "waiting",
                                  NOW, None, 0.6, 81920) for per_gpu in (100, 4)}
    assert got[4] == pytest.approx(got[100]) and got[100] > 2.0  # five jobs on two GPUs: shares must be used
