"""The peers' baselines on a cluster of several GPU types: Sia's configurations, bootstrapped goodputs and integer
programme; Gavel's allocation, round order and rounds; Pollux blind to types and repaired as Sia's evaluation ran
it. Hand-built snapshots and typed families (shape `<name>@<type>`, `gpu_type` set)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from slurm_elastico.config import Settings
from slurm_elastico.model import (ActionKind, Family, GpuUse, GresRequest, JobState, JobView, NodeView, Resources,
                                  Shape)
from slurm_elastico.planner import policies
from slurm_elastico.planner.gavel import GavelPolicy, allocation, round_order
from slurm_elastico.planner.per_type import speed_table, state_of, with_state
from slurm_elastico.planner.pollux import PolluxPolicy
from slurm_elastico.planner.pollux_types import TypeBlindPollux, blind
from slurm_elastico.planner.sia import NO_ALLOC, SiaPolicy, cost, goodputs, sia_counts, solve
from tests.synthetic import cluster, snapshot

NOW = 1_000_000.0
SIA = SiaPolicy("sia", "under test")
GAVEL = GavelPolicy("gavel", "under test")
POLLUX = TypeBlindPollux("pollux", "under test")


def nodes_of(gpu_type: str, n_nodes: int, per_node: int, prefix: str) -> list[NodeView]:
    out = []
    for i, n in enumerate(cluster(n_nodes * per_node, per_node, cpus_per_gpu=16)):
        name = f"{prefix}{i}"
        out.append(dataclasses.replace(n, name=name, gpu_type=gpu_type,
                                       gpus=tuple(dataclasses.replace(g, node=name) for g in n.gpus)))
    return out


def mixed(t4_nodes: int = 6, a100_nodes: int = 2, a100_first: bool = False) -> tuple[NodeView, ...]:
    """T4 nodes of 4 GPUs and A100 nodes of 8 (Sia's aws and dgx-ext)."""
    t4, a100 = nodes_of("t4", t4_nodes, 4, "aws"), nodes_of("a100", a100_nodes, 8, "dgx")
    return tuple(a100 + t4 if a100_first else t4 + a100)


def typed_family(speed: dict[str, float], counts=(1, 2, 4, 8, 12, 16), scaling: float = 0.8, gpus: int = 1,
                 work: float = 1000.0, other_batch: float = 0.0) -> Family:
    """Shapes `gpus<n>@<type>` at the job's own batch 64 (throughput speed·n^scaling), and with `other_batch` > 0 a
    goodput shape at batch 128 on each count (that factor times the own batch's)."""
    shapes = []
    for t, s in speed.items():
        for n in counts:
            res = Resources(100, 1000, 1, 1024) if n == 1 else Resources(0, 1000, n, 1024 * n, gpus=n)
            shapes.append(Shape(f"gpus{n}@{t}", res, s * n ** scaling, (("global_batch", 64), ("ranks", n)),
                                gpu_type=t))
            if other_batch:
                shapes.append(Shape(f"gb128-gpus{n}@{t}", res, other_batch * s * n ** scaling,
                                    (("global_batch", 128), ("lr_scaling", "sqrt"), ("ranks", n)), gpu_type=t))
    default = next(s.name for s in shapes if s.name == f"gpus{gpus}@{next(iter(speed))}")
    return Family("train", tuple(shapes), work, name="app", default=default)


def waiting(jid: int, comment: str = "", gpus: int = 1, age: float = 600.0) -> JobView:
    gres = GresRequest("gpus", gpus) if gpus > 1 else GresRequest("mps", 100)
    return JobView(jid, f"j{jid}", "u", "gpu", JobState.PENDING, reason="BeginTime", gres=gres, cpus=1,
                   memory_mib=1024, submit_time=int(NOW - age), admin_comment=comment, requeue=True)


def running(jid: int, gpus: list[tuple[str, int]], comment: str, age: float = 3600.0, started: float = 600.0,
            restarts: int = 0) -> JobView:
    gres = GresRequest("gpus", len(gpus)) if len(gpus) > 1 else GresRequest("mps", 100)
    return JobView(jid, f"j{jid}", "u", "gpu", JobState.RUNNING, gres=gres,
                   nodes=tuple(dict.fromkeys(n for n, _ in gpus)), cpus=1, memory_mib=1024,
                   submit_time=int(NOW - age), start_time=int(NOW - started), restarts=restarts, requeue=True,
                   admin_comment=comment, gpu_alloc=tuple((n, g, 0 if len(gpus) > 1 else 100) for n, g in gpus))


def with_users(nodes, uses) -> tuple[NodeView, ...]:
    """The nodes (types kept) with GPU users from {(node, gpu index): uses}."""
    return tuple(dataclasses.replace(n, gpus=tuple(dataclasses.replace(g, users=uses.get((n.name, g.index), g.users))
                                                   for g in n.gpus)) for n in nodes)


def plan(policy, nodes, jobs, fams, now=NOW, progress=None, foreign=()):
    uses = {(n, g): (GpuUse(j.job_id, share, whole=share == 0),) for j in jobs for n, g, share in j.gpu_alloc}
    uses.update({(n, g): (GpuUse(99, 0, whole=True),) for n, g in foreign})
    return policy.plan(snapshot(with_users(nodes, uses), list(jobs), now), fams, Settings(), None, now, progress)


def starts(p, jid: int) -> tuple[str, int, tuple[str, ...]] | None:
    """(type, GPUs, nodes) a plan starts or moves job `jid` on; None when it does neither."""
    for a in p.actions:
        if a.job_id == jid and a.kind in (ActionKind.SET_GPUS, ActionKind.RESHAPE_RUNNING):
            return a.gpu_type, a.gpus or 1, a.nodes
    share = [a for a in p.actions if a.job_id == jid and a.kind is ActionKind.SET_SHARE]
    nodes = [a for a in p.actions if a.job_id == jid and a.kind is ActionKind.SET_NODES]
    if nodes:
        return (share[0].gpu_type if share else None), 1, nodes[0].nodes
    return None


def kinds(p, jid: int) -> list[ActionKind]:
    return [a.kind for a in p.actions if a.job_id == jid]


# ----------------------------------------------------------------------------------------------------- Sia


def test_sia_counts_are_the_artifacts_configurations():
    assert sia_counts(4, 6) == (1, 2, 4, 8, 12, 16, 20, 24)
    assert sia_counts(8, 2) == (1, 2, 4, 8, 16)
    assert sia_counts(8, 3) == (1, 2, 4, 8, 16, 24)
    with pytest.raises(ValueError, match="at least one node"):
        sia_counts(0, 3)


def test_sia_goodputs_bootstrap_then_project_by_one_gpu_ratio():
    fam = typed_family({"t4": 1.0, "a100": 3.0}, scaling=0.5)
    table = speed_table(fam, ("t4", "a100"))
    counts = {"t4": sia_counts(4, 6), "a100": sia_counts(8, 2)}
    # never ran: one GPU on each type, all worth 1
    assert goodputs(table, counts, (), cap=8) == {("t4", 1): 1.0, ("a100", 1): 1.0}
    # ran on t4 only: its goodput there, a100 projected by the one-GPU ratio (3), normalised to the least (t4, 1)
    g = goodputs(table, counts, ("t4",), cap=8)
    assert g[("t4", 1)] == 1.0 and g[("a100", 1)] == pytest.approx(3.0)
    assert g[("t4", 4)] == pytest.approx(2.0) and g[("a100", 4)] == pytest.approx(6.0)
    assert max(n for _, n in g) == 8  # twice the most it held, at most


def test_sia_projection_differs_from_the_type_own_profile():
    """Projected goodput scales the reference type's curve; the type's own profile is used once the job ran there."""
    shapes = list(typed_family({"t4": 1.0}, scaling=0.5).shapes) + list(
        typed_family({"a100": 3.0}, scaling=1.0).shapes)
    fam = Family("train", tuple(shapes), 1000.0, default="gpus1@t4")
    table = speed_table(fam, ("t4", "a100"))
    counts = {"t4": (1, 2, 4), "a100": (1, 2, 4)}
    assert goodputs(table, counts, ("t4",), 4)[("a100", 4)] == pytest.approx(6.0)
    assert goodputs(table, counts, ("t4", "a100"), 4)[("a100", 4)] == pytest.approx(12.0)


def test_sia_cost_rounds_clips_and_no_alloc_is_dearer_than_the_least_configuration():
    assert cost(4.0) == 0.5 and cost(1.0) == 1.0 < NO_ALLOC
    assert cost(1e-9) == 3000.0 and cost(0.0) == 3000.0


def test_sia_solve_respects_type_capacity_and_fixed_jobs():
    costs = [{("a", 2): 0.5, ("b", 1): 0.9}, {("a", 2): 0.6, ("b", 1): 0.95}, {("a", 1): 1.0}]
    out = solve(costs, [None, None, None], {"a": 2, "b": 1})
    used_a = sum(k[1] for k in out if k is not None and k[0] == "a")
    assert used_a <= 2 and sum(1 for k in out if k == ("b", 1)) <= 1
    assert out[0] == ("a", 2) and out[1] == ("b", 1) and out[2] is None  # the optimum: 0.5 + 0.95 + 1.1
    forced = solve(costs, [None, ("a", 2), None], {"a": 2, "b": 1})
    assert forced[1] == ("a", 2) and forced[0] == ("b", 1)


def test_sia_moves_a_job_that_ran_on_t4_to_a100_with_its_type():
    fam = typed_family({"t4": 1.0, "a100": 3.0})
    job = running(1, [("aws0", 0)], with_state("", "gpus1@t4", "elastico:sia.", {"top": 1, "ran": "t4"}))
    p = plan(SIA, mixed(), [job], {1: fam})
    t, n, on = starts(p, 1)
    assert t == "a100" and n == 2 and all(x.startswith("dgx") for x in on)
    comment = next(a.text for a in p.actions if a.kind is ActionKind.SET_ADMIN_COMMENT)
    assert state_of(comment, "elastico:sia.") == {"top": "2", "ran": "t4+a100"}
    assert next(a for a in p.actions if a.kind is ActionKind.RESHAPE_RUNNING).shape == "gpus2@a100"


def test_sia_keeps_a_job_still_restoring_and_starts_new_ones_on_one_gpu():
    fam = typed_family({"t4": 1.0, "a100": 3.0})
    job = running(1, [("aws0", 0)], with_state("", "gpus1@t4", "elastico:sia.", {"top": 1, "ran": "t4"}), started=10.0)
    p = plan(SIA, mixed(), [job, waiting(2), waiting(3)], {1: fam, 2: fam, 3: fam})
    assert starts(p, 1) is None and ActionKind.PREEMPT not in kinds(p, 1)
    for jid in (2, 3):
        assert starts(p, jid)[1] == 1


def test_sia_keeps_the_running_job_where_handing_its_gpu_over_costs_a_restart():
    """Two old jobs, one T4 GPU: the running one keeps it (a move would cost it its restart factor); the held one
    stays held."""
    fam = typed_family({"t4": 1.0}, counts=(1,))
    a = running(1, [("aws0", 0)], with_state("", "gpus1@t4", "elastico:sia.", {"top": 1, "ran": "t4"}))
    b = waiting(2, with_state("", "gpus1@t4", "elastico:sia.", {"top": 1, "ran": "t4", "held": "1"}))
    b = dataclasses.replace(b, held=True, reason="JobHeldAdmin")
    p = plan(SIA, tuple(nodes_of("t4", 1, 1, "aws")), [a, b], {1: fam, 2: fam})
    assert starts(p, 1) is None and starts(p, 2) is None  # the running one keeps it: moving costs its restart
    assert not any(k is ActionKind.PREEMPT for k in kinds(p, 1))


def test_sia_on_one_untyped_type_plans_like_a_goodput_scheduler():
    fam = typed_family({"": 1.0}, counts=(1, 2, 4))
    fam = dataclasses.replace(fam, shapes=tuple(dataclasses.replace(s, gpu_type="") for s in fam.shapes))
    p = plan(SIA, cluster(8, 4, cpus_per_gpu=16), [waiting(1, "elastico:sia.top=2,elastico:sia.ran=-")], {1: fam})
    assert starts(p, 1)[:2] == ("", 4)


# --------------------------------------------------------------------------------------------------- Gavel


def test_gavel_sum_allocation_gives_each_type_to_its_best_throughput_per_gpu():
    tput = np.array([[1.0, 3.0], [1.0, 1.5]])
    x = allocation(tput, np.array([1.0, 1.0]), np.array([1.0, 1.0]), "sum")
    assert x[0, 1] == pytest.approx(1.0) and x[1, 0] == pytest.approx(1.0)
    assert (x.sum(axis=1) <= 1 + 1e-9).all()


def test_gavel_maxmin_shares_time_where_sum_would_starve():
    tput = np.array([[10.0, 10.0], [0.1, 0.1]])
    scale = np.array([1.0, 1.0])
    cap = np.array([1.0, 0.0])
    s = allocation(tput, scale, cap, "sum")
    m = allocation(tput, scale, cap, "maxmin")
    assert s[1].sum() == pytest.approx(0.0) and m[1].sum() > 0.3
    with pytest.raises(ValueError, match="allowed: sum, maxmin"):
        allocation(tput, scale, cap, "fifo")


def test_gavel_round_order_favours_jobs_behind_their_allocation():
    x = np.array([[0.5, 0.0], [0.5, 0.0]])
    received = np.array([[1000.0, 180.0], [180.0, 180.0]])  # job 0 has had type 0 much more
    order = round_order(x, received)
    assert order.index((1, 0)) < order.index((0, 0))
    assert order[-1][0] in (0, 1) and x[order[-1]] == 0.0


def test_gavel_runs_jobs_at_their_submitted_count_and_waits_for_the_next_round():
    fam = typed_family({"t4": 1.0, "a100": 3.0}, gpus=4, other_batch=2.0)
    nodes = mixed()
    p = plan(GAVEL, nodes, [waiting(1, gpus=4), waiting(2)], {1: fam, 2: typed_family({"t4": 1.0, "a100": 1.1})})
    t, n, _ = starts(p, 1)
    assert n == 4 and t == "a100"  # its submitted count, on the type where it is fastest per GPU
    assert next(a.shape for a in p.actions if a.job_id == 1 and a.kind is ActionKind.SET_GPUS) == "gpus4@a100"
    rnd = int(NOW // 360)
    comment = next(a.text for a in p.actions if a.job_id == 1 and a.kind is ActionKind.SET_ADMIN_COMMENT)
    assert state_of(comment, "elastico:gavel.") == {"t.a100": "540", "round": str(rnd)}
    again = plan(GAVEL, nodes, [waiting(1, comment, gpus=4), waiting(3)], {1: fam, 3: fam}, now=NOW + 60)
    assert not again.actions  # the round is under way


def test_gavel_maxmin_preempts_a_job_that_had_its_share_for_one_that_had_none():
    fam = typed_family({"t4": 1.0}, counts=(1,))
    old = running(1, [("aws0", 0)], "elastico:gavel.t.t4=5000,elastico:gavel.round=1")
    fair = GavelPolicy("gavel-maxmin", "under test", objective="maxmin")
    p = plan(fair, tuple(nodes_of("t4", 1, 1, "aws")), [old, waiting(2)], {1: fam, 2: fam})
    assert ActionKind.PREEMPT in kinds(p, 1) and starts(p, 2) == ("t4", 1, ("aws0",))


# -------------------------------------------------------------------------------------------------- Pollux


def test_pollux_on_one_type_is_exactly_pollux():
    fam = typed_family({"": 1.0}, counts=(1, 2, 4))
    fam = dataclasses.replace(fam, shapes=tuple(dataclasses.replace(s, gpu_type="") for s in fam.shapes))
    jobs = [waiting(1, "pollux:top=2"), waiting(2)]
    nodes = cluster(8, 4, cpus_per_gpu=16)
    inner = PolluxPolicy("pollux", "under test")
    assert plan(POLLUX, nodes, jobs, {1: fam, 2: fam}) == plan(inner, nodes, jobs, {1: fam, 2: fam})
    assert isinstance(policies.get("pollux"), PolluxPolicy)


def test_pollux_sees_the_type_the_job_ran_on():
    fam = typed_family({"t4": 1.0, "a100": 3.0})
    view = blind(fam, "a100")
    assert {s.gpu_type for s in view.shapes} == {""} and view.default == "gpus1@a100"
    assert all(s.name.endswith("@a100") for s in view.shapes)


def test_pollux_mixed_placement_keeps_the_majority_type_faster_on_a_tie():
    """8 GPUs wanted, no node holds 8: Pollux splits 4 + 4 over an A100 node and a T4 node; Sia's repair keeps the
    A100 half (a tie, the faster type) and drops the rest."""
    fam = typed_family({"t4": 1.0, "a100": 3.0})
    nodes = tuple(nodes_of("a100", 1, 8, "dgx") + nodes_of("t4", 2, 4, "aws"))
    p = plan(POLLUX, nodes, [waiting(1, "pollux:top=4,elastico:pollux-on.type=a100")], {1: fam},
             foreign=[("dgx0", g) for g in range(4)])
    t, n, on = starts(p, 1)
    assert (t, n, on) == ("a100", 4, ("dgx0",))
    assert {a.shape for a in p.actions if a.job_id == 1} == {"gpus4@a100"}
    comment = next(a.text for a in p.actions if a.kind is ActionKind.SET_ADMIN_COMMENT)
    assert state_of(comment, "elastico:pollux-on.") == {"type": "a100"} and "pollux:top=" in comment
    assert any("dropped" in n for n in p.notes)


def test_registry_has_the_peers():
    for name in ("sia", "gavel", "gavel-maxmin", "pollux"):
        assert policies.get(name).name == name


def test_sia_solve_exact_and_relaxed_agree_on_a_random_instance():
    rng = np.random.default_rng(3)
    costs = []
    for _ in range(30):
        costs.append({(t, n): round(float(rng.uniform(0.2, 1.3)), 2) for t, ns in (("a", (1, 2, 4, 8)), ("b", (1, 4)))
                      for n in ns if rng.random() < 0.7})
    fixed = [None] * 30
    cap = {"a": 16, "b": 8}
    exact = solve(costs, fixed, cap)

    def total(choice):
        return sum(costs[j][k] if k is not None else NO_ALLOC for j, k in enumerate(choice))

    for t in cap:
        assert sum(k[1] for k in exact if k is not None and k[0] == t) <= cap[t]
    from slurm_elastico.planner.sia import _solve_lp
    options = [[k for k, c in cs.items() if c < NO_ALLOC] for cs in costs]
    relaxed = _solve_lp(costs, fixed, options, list(cap), cap, NO_ALLOC)
    assert total(exact) <= total(relaxed) + 1e-9
    assert total(relaxed) - total(exact) < 0.15 * len(cap) + 1e-9  # at most a few fractional jobs rounded


def test_policy_state_is_the_helpers_own_part_and_does_not_pile_up():
    from slurm_elastico.helper.executor import merged_comment
    old = with_state("", "gpus1@t4", "elastico:sia.", {"top": 1, "ran": "t4"})
    new = with_state(old, "gpus2@a100", "elastico:sia.", {"top": 2, "ran": "t4+a100"})
    merged = merged_comment(old, new)
    assert merged.count("elastico:sia.top=") == 1 and state_of(merged, "elastico:sia.")["top"] == "2"
    assert merged == new


def test_goodput_at_a_later_epoch_keeps_each_shapes_type():
    """The simulator refreshes goodput shapes per epoch of statistical efficiency; a typed shape must stay typed
    (untyped, it would count on every type at one type's speed, and Sia would see no difference between types)."""
    from slurm_elastico.sim.families import at_epoch, family_of
    from slurm_elastico.sim.trace import TraceJob
    from slurm_elastico.sim.truth import GroundTruth
    truth = GroundTruth()
    job = TraceJob(1, 0.0, "train", "cifar10", 1, float(truth.iterations_to_end("cifar10", 512)), 512)
    fam = family_of(job, truth, (100,), 16384, adaptive=True, max_gpus=4, gpus_per_node=4)
    fam = dataclasses.replace(fam, shapes=tuple(dataclasses.replace(s, name=f"{s.name}@t4", gpu_type="t4")
                                                for s in fam.shapes))
    later = at_epoch(fam, job, truth, 3)
    assert {s.gpu_type for s in later.shapes} == {"t4"}
    assert any(a.throughput != b.throughput for a, b in zip(fam.shapes, later.shapes))


@pytest.fixture(scope="module")
def sia_runs(tmp_path_factory):
    """30 jobs in Sia's workload format on Sia's 64-GPU cluster, over made-up profiles in Sia's layout
    (`tests.sia_layout`: no peer's data), under sia, pollux and gavel, with the simulator's audit after every
    event. What the peers do on Sia's own measurements is the heterogeneous table's (`benchmarks/sim.py`)."""
    from slurm_elastico.interference.base import ContentionModel
    from slurm_elastico.sim import engine, trace_pollux
    from slurm_elastico.sim.settings import SimSettings
    from slurm_elastico.sim.truth_types import TypedTruth
    from tests.sia_layout import made_up_profiles, made_up_workload
    root = tmp_path_factory.mktemp("sia")
    profiles = made_up_profiles(root / "profiles")
    truth = TypedTruth.from_sia(str(profiles), ["aws", "dgx-ext", "rtx"])
    jobs = trace_pollux.pollux(made_up_workload(root / "workload.csv"), truth.reference)
    sim = SimSettings(cluster="sia", profiles=str(profiles), placement_window_s=-1.0, audit=True)
    return {p: engine.run(jobs, p, Settings(), sim, ContentionModel(), truth) for p in ("sia", "pollux", "gavel")}


def test_the_peers_finish_a_sia_workload_on_its_cluster_and_sia_moves_jobs_between_types_and_counts(sia_runs):
    assert all(r.unfinished == 0 and len(r.jobs) == 30 for r in sia_runs.values())
    assert all(j.end > j.submit for r in sia_runs.values() for j in r.jobs)  # the audit held after every event
    assert sia_runs["sia"].counters["actions"].get("reshape_running", 0) > 0  # it moves jobs between types/counts
    # Which peer is faster is a measurement, on Sia's own profiles: the heterogeneous table (benchmarks/sim.py).


def test_gavel_finishes_a_synthetic_trace_its_rounds_leave_idle_between():
    """Gavel changes nothing mid-round; the simulator must still plan it when its next round comes, even when all
    that runs has ended and nothing arrives (it planned only after a change or an action, and gave up)."""
    from slurm_elastico.sim import engine, experiment
    s = experiment.setup(Settings(), "synthetic", 40, 2.0, 0.3, 24.0, 8, None, None, None, None)
    for policy in ("gavel", "gavel-maxmin"):
        r = engine.run(s.make(0), policy, s.cfg, s.sim, s.model, s.truth, seed=0)
        assert r.unfinished == 0 and len(r.jobs) == 40
