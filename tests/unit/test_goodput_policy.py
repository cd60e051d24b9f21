"""elastico-goodput: elastico with every training family adaptive in the simulator. Goodput (throughput ×
statistical efficiency relative to the submitted batch) is priced like any throughput, so the batch is chosen with
the GPU count and knobs; a running job changes batch only when the gain pays its restart; fixed-batch and
inference jobs beside adaptive ones keep today's treatment."""

from __future__ import annotations

import dataclasses

import pytest

from slurm_elastico.config import Settings
from slurm_elastico.errors import ConfigError
from slurm_elastico.interference.base import ContentionModel
from slurm_elastico.model import ActionKind, Family, GpuUse, Resources, Shape
from slurm_elastico.planner import policies
from slurm_elastico.sim import engine, trace_pollux
from slurm_elastico.sim import settings as sim_settings
from slurm_elastico.sim.settings import SimSettings
from slurm_elastico.sim.trace import INFER_APP, TraceJob
from slurm_elastico.sim.truth import GroundTruth
from tests.synthetic import cluster, family, pending, running, snapshot, with_users

NOW = 100_000.0
GOODPUT = policies.get("elastico-goodput")


@pytest.fixture(scope="module")
def truth() -> GroundTruth:
    return GroundTruth()


def adaptive_family(own: float, other: float, work: float = 10000.0) -> Family:
    """One whole GPU at the submitted global batch 256, and the same GPU at 1024 with a learning-rate rule whose
    throughput is goodput (steps of the batch of 256 per second)."""
    res = Resources(100, 1000, 1, 1024)
    shapes = (Shape("mb256", res, own, (("global_batch", 256),)),
              Shape("gb1024-mb256", res, other, (("global_batch", 1024), ("lr_scaling", "sqrt"))))
    return Family("train", shapes, work, default="mb256")


def plan(jobs, fams, gpus: int = 1, uses=None, progress=None):
    nodes = with_users(cluster(gpus), uses or {})
    return GOODPUT.plan(snapshot(nodes, jobs, NOW), fams, Settings(), ContentionModel(), NOW, progress)


def test_it_is_elastico_with_adaptive_families_and_nothing_else():
    plain = policies.get("elastico")
    assert GOODPUT.adapts_batch and not plain.adapts_batch
    assert dataclasses.replace(GOODPUT, name=plain.name, description=plain.description, adapts_batch=False) == plain
    # no fixed-batch policy of the registry adapts batches (their results must not move)
    assert [n for n, p in policies.REGISTRY.items() if getattr(p, "adapts_batch", False)] == [
        "elastico-goodput", "pollux", "sia"]


def test_the_simulator_gives_goodput_shapes_to_every_training_family_and_to_no_other(truth):
    train = TraceJob(1, 0.0, "train", "cifar10", 1, 1000.0, 512)
    infer = TraceJob(2, 0.0, "infer", INFER_APP, 1, 100.0, 0, 100, 500.0, 200.0)
    sim = SimSettings(gpus=4, gpus_per_node=4)

    def families(policy):
        e = engine.Engine([train, infer], policy, Settings(), sim, ContentionModel(), truth)
        for tj in (train, infer):
            e._arrive(tj)
        return e.families

    adaptive, fixed = families("elastico-goodput"), families("elastico")
    other = [s for s in adaptive[1].shapes if s.knob("global_batch") != 512]
    assert other and all(s.knob("lr_scaling") == "sqrt" for s in other)
    assert {s.knob("global_batch") for s in other} > {1024, 2048}
    assert all(s.knob("global_batch") == 512 for s in fixed[1].shapes)
    assert adaptive[2] == fixed[2]  # inference: the same family


def test_the_fixed_batch_ablation_holds_every_policy_to_the_submitted_batch(truth):
    train = TraceJob(1, 0.0, "train", "cifar10", 1, 1000.0, 512)
    for policy in ("elastico-goodput", "sia", "pollux"):
        sim = SimSettings(gpus=4, gpus_per_node=4, fixed_batch=True)
        e = engine.Engine([train], policy, Settings(), sim, ContentionModel(), truth)
        e._arrive(train)
        assert {s.knob("global_batch") for s in e.families[1].shapes} == {512}, policy
    with pytest.raises(ConfigError, match=r"sim.fixed_batch: true contradicts sim.adaptive_batch"):
        sim_settings.from_mapping({"fixed_batch": True, "adaptive_batch": True})


def test_a_pending_job_starts_at_the_batch_of_highest_goodput():
    better = plan([pending(1, NOW - 60)], {1: adaptive_family(1.0, 1.5)})
    assert [p.shape for p in better.placements] == ["gb1024-mb256"]
    worse = plan([pending(1, NOW - 60)], {1: adaptive_family(1.0, 0.8)})
    assert [p.shape for p in worse.placements] == ["mb256"]


def test_a_fixed_batch_job_beside_an_adaptive_one_keeps_its_batch():
    fixed = family((100, 1.0, 1000), work=10000.0)
    p = plan([pending(1, NOW - 60), pending(2, NOW - 60)], {1: adaptive_family(1.0, 1.5), 2: fixed}, gpus=2)
    assert sorted((x.job_id, x.shape) for x in p.placements) == [(1, "gb1024-mb256"), (2, "mps100-0")]


def test_a_running_job_changes_batch_only_when_the_gain_pays_the_restart():
    fam = adaptive_family(1.0, 1.5, work=10000.0)
    uses = {("n0000", 0): (GpuUse(1, 100),)}
    job = running(1, "n0000", 0, 100, start=NOW - 600, shape="mb256")
    # 9,400 steps left: 9,400 s now, 6,267 s + a 60 s restart at the larger batch
    early = plan([job], {1: fam}, uses=uses, progress={1: 600.0})
    # the same GPU, other knobs: relaunched in place (its shape named, then the checkpoint signal)
    assert [(a.kind, a.shape) for a in early.actions] == [(ActionKind.SET_ADMIN_COMMENT, "gb1024-mb256"),
                                                          (ActionKind.SIGNAL, "gb1024-mb256")]
    assert "saves 3073 s of 9400 s remaining after a 60 s restart" in early.actions[1].reason
    # 100 steps left: 100 s now, 67 s + 60 s after: the restart costs more than the batch gains
    late = plan([job], {1: fam}, uses=uses, progress={1: 9900.0})
    assert late.actions == () and [p.shape for p in late.placements] == ["mb256"]


def test_a_new_batch_the_running_loop_takes_in_process_is_charged_no_restart():
    # The family above with the knobs the runtime runs (a micro-batch): the new batch on the same GPU is taken
    # in process (`runtime.rebatch`), so even 100 steps from the end (100 s now, 67 s at the larger batch, where
    # a 60 s restart did not pay) the move is worth its hysteresis margin.
    def fam(other: float) -> Family:
        res = Resources(100, 1000, 1, 1024)
        return Family("train", (Shape("mb256", res, 1.0, (("global_batch", 256), ("micro_batch", 256))),
                                Shape("gb1024-mb256", res, other, (("global_batch", 1024), ("micro_batch", 256),
                                                                   ("lr_scaling", "sqrt")))), 10000.0, default="mb256")
    uses = {("n0000", 0): (GpuUse(1, 100),)}
    job = running(1, "n0000", 0, 100, start=NOW - 600, shape="mb256")
    late = plan([job], {1: fam(1.5)}, uses=uses, progress={1: 9900.0})
    assert [(a.kind, a.shape) for a in late.actions] == [(ActionKind.SET_ADMIN_COMMENT, "gb1024-mb256"),
                                                         (ActionKind.SIGNAL, "gb1024-mb256")]
    assert "saves 33 s of 100 s remaining with no restart" in late.actions[1].reason
    # 5 % faster: 5 s of 100 saved, under the hysteresis margin (10 % of the time left), so it stays
    assert plan([job], {1: fam(1.05)}, uses=uses, progress={1: 9900.0}).actions == ()


def test_the_peers_too_change_batch_in_process_without_paying_a_restart():
    # Sia and Pollux (as AdaptDL's agent) on a job keeping its GPUs: 100 steps left, 33 s saved at the larger
    # batch; a 60 s restart does not pay it, a new batch taken in process (the runtime's micro-batch knob) does.
    from slurm_elastico.planner.sia import retune

    def shapes(knobs: tuple) -> tuple[Shape, Shape, Family]:
        res = Resources(100, 1000, 1, 1024)
        cur = Shape("mb256", res, 1.0, (("global_batch", 256),) + knobs)
        best = Shape("gb1024-mb256", res, 1.5, (("global_batch", 1024), ("lr_scaling", "sqrt")) + knobs)
        return cur, best, Family("train", (cur, best), 10000.0, default="mb256")

    cur, best, fam = shapes((("micro_batch", 256),))
    assert retune(cur, best, fam, 9900.0, 60.0, 0.1) is best
    cur, best, fam = shapes(())  # no split the runtime can run: a relaunch, which does not pay
    assert retune(cur, best, fam, 9900.0, 60.0, 0.1) is cur


def test_a_pollux_workload_slice_ends_with_batches_of_its_choice_taken_in_process(truth, monkeypatch):
    jobs = trace_pollux.pollux(1, truth)[:30]
    shapes: dict[int, set[str]] = {}
    start = engine.SimCluster.start

    def watch(self, job, alloc):
        start(self, job, alloc)
        shapes.setdefault(job.job_id, set()).add(job.shape)

    monkeypatch.setattr(engine.SimCluster, "start", watch)
    sim = SimSettings(gpus=32, gpus_per_node=4, epoch_s=60.0, placement_window_s=-1.0, restart_cost_s=30.0, audit=True)
    adaptive = engine.run(jobs, "elastico-goodput", Settings(), sim, ContentionModel(), truth)
    assert adaptive.unfinished == 0 and adaptive.counters["refused_actions"] == 0
    assert all(j.done == j.work for j in adaptive.jobs)  # completion stays the submitted batch's work
    assert any(name.startswith("gb") for seen in shapes.values() for name in seen)  # batches it chose
    assert adaptive.counters["switches"] > 0  # new batches on the GPUs held: taken in process, no restart
    shapes.clear()
    fixed = engine.run(jobs, "elastico", Settings(), sim, ContentionModel(), truth)
    assert fixed.unfinished == 0 and not any(name.startswith("gb") for seen in shapes.values() for name in seen)
    assert fixed.counters["switches"] == 0
    # Whether it ends sooner is the benchmark's question (benchmarks/sim.py, every workload, seeds): on this one
    # slice on half the peer's GPUs, one ImageNet job of 24,000 steps is most of the mean, and its path decides it.


# -- the benchmark's paired ratios and targets ------------------------------------------------------------------


def test_the_benchmark_pairs_goodput_with_each_column_by_seed_and_judges_the_targets(capsys):
    from benchmarks import sim as bench

    means = {"elastico-goodput": [800.0, 880.0], "pollux@peer": [1000.0, 1000.0], "elastico": [900.0, 1000.0]}
    got = bench.goodput_over(means, {"elastico-goodput": 0, "pollux@peer": 0, "elastico": 0})
    assert got["pollux@peer"]["ratio"] == pytest.approx(0.84) and got["pollux@peer"]["met"] is True
    assert got["pollux@peer"]["target"] == "<= 0.85" and got["pollux@peer"]["ci95"] > 0
    assert got["elastico"]["ratio"] == pytest.approx((800 / 900 + 0.88) / 2) and "met" not in got["elastico"]
    # a job left unfinished makes it no result, whatever the ratio
    left = bench.goodput_over(means, {"elastico-goodput": 1, "pollux@peer": 0, "elastico": 0})
    assert left["pollux@peer"]["met"] is False and left["pollux@peer"]["unfinished"] == 1
    assert "NOT met" in capsys.readouterr().out.splitlines()[-2]

    class Job:
        def __init__(self, kind, jct, best_s):
            self.kind, self.jct, self.best_s = kind, jct, best_s

    class Run:
        def __init__(self, jobs, unfinished=0):
            self.jobs, self.unfinished = jobs, unfinished

    static = [Job("train", 300.0, 100.0), Job("infer", 300.0, 100.0)]
    goodput = [Job("train", 200.0, 100.0), Job("infer", 110.0, 100.0)]

    class Res:
        summaries = {"static": [{"mean_jct_h": 3.0}, {"mean_jct_h": 2.0}],
                     "elastico-goodput": [{"mean_jct_h": 1.0}, {"mean_jct_h": 1.0}]}
        runs = {"static": [Run(static), Run(static)], "elastico-goodput": [Run(goodput), Run(goodput)]}

    mixed = bench.static_over_goodput(Res())
    assert mixed["static_over"] == pytest.approx(2.5) and mixed["met"] is True and mixed["seeds"] == 2
    room = mixed["headroom"]
    assert room["static_over_lb"] == pytest.approx(3.0)
    assert room["jct_over_lb_by_kind"] == pytest.approx({"infer": 1.1, "train": 2.0})
    # static's 300 s / 2.5 over two jobs, less the inference job's 110 s, leaves 130 s for the training job: 1.3x
    assert room["train_needed_over_lb_by_seed"] == pytest.approx([1.3, 1.3])
    Res.summaries["static"][1] = {"mean_jct_h": 1.9}
    assert bench.static_over_goodput(Res())["met"] is False


def test_the_lower_bound_counts_no_more_gpus_than_the_cluster_has_and_the_adaptive_one_is_below_it(truth):
    from benchmarks import sim as bench
    from slurm_elastico.sim.families import fastest_speed

    job = trace_pollux.pollux(1, truth)[0]
    job = dataclasses.replace(job, submit_s=0.0, work=min(job.work, 300.0), gpus=2)  # as many as the cluster has
    sim = SimSettings(gpus=2, gpus_per_node=2, epoch_s=60.0, placement_window_s=-1.0)
    run = engine.run([job], "elastico", Settings(), sim, ContentionModel(), truth)
    on_two = job.work / fastest_speed(job, truth, sim.gpu_memory_mib, False, 2, 2)
    on_sixteen = job.work / fastest_speed(job, truth, sim.gpu_memory_mib, False, sim.max_gpus_per_job, 2)
    assert on_sixteen < on_two  # the app's gangs scale: a bound at 16 GPUs would be one no 2-GPU cluster reaches
    assert run.unfinished == 0 and run.jobs[0].best_s == pytest.approx(on_two)
    assert run.jobs[0].jct >= run.jobs[0].best_s
    # with a batch of the job's choice the bound is lower (its own batch is one of the choices), never higher
    assert bench.alone_s([job], truth, sim, False) == [pytest.approx(on_two)]
    ratio = bench.alone_s([job], truth, sim, True)[0] / on_two
    assert 0 < ratio < 1
    # the mixed trace's headroom: with the trace at hand it says how far any policy could go
    runs = {n: [engine.run([job], n, Settings(), sim, ContentionModel(), truth, 0)] for n in ("static",
                                                                                            "elastico-goodput")}

    class Res:
        traces = {0: [job]}
        summaries = {n: [{"mean_jct_h": r[0].jobs[0].jct / 3600}] for n, r in runs.items()}

    Res.runs = runs
    room = bench.static_over_goodput(Res(), truth, sim)["headroom"]
    assert room["train_adaptive_lb_over_lb_by_seed"] == [pytest.approx(ratio)]
    best = bench.alone_s([job], truth, sim, True)[0]
    assert room["static_over_best_alone_by_seed"] == [pytest.approx(runs["static"][0].jobs[0].jct / best)]
    assert room["static_over_best_alone_by_seed"][0] > 1  # alone at its best from submission: nobody does better
