"""Planner quality bars: epoch latency at three sizes, and the optimality gap against an exact MILP.

Run from the repository root: `python benchmarks/planner.py` (or `--quick`,
under a minute). Prints a table per part and ends with one line of JSON.

Latency: one `elastico` epoch on a synthetic snapshot already in memory
(`tests/synthetic.py`, ~8 shapes per job, a fifth of the jobs
running), median of repeats, one thread: its wall time and its CPU time
(`time.thread_time`). Targets: 200 jobs / 64 GPUs ≤ 15 ms, 1,000 / 512 ≤
150 ms, 10,000 / 4,096 ≤ 1.5 s, judged on the CPU time: on a machine whose
cores other processes share, the wall time also counts the time the epoch
waited for a core (the load average is printed beside it); on a helper's own
core the two are the same. The growth exponent between two
sizes is log(t2/t1) / log(jobs2/jobs1). The same targets hold on a cluster
of 3 GPU types (nodes of t4, v100 and a100 in turn, every family's shapes on
each, 30 % of the families data-parallel): those epochs take turns with the
same snapshots on one type (the baseline, measured in the same run), and the
JSON's `latency_type_targets` says for each size whether its target is met
and the typed time over the one-type time. `--latency-only` stops after the
latency tables. The same epochs at the two smaller
sizes are timed again with predictors trained on tests/data/gavel (the
helper's `interference.model`): the default, prior-corrected one (target:
within 2× of the contention model's epoch), the MLP, and the default one
trained on K80 pairs only and adapting online on P100 after its first 35
measured pairs (`interference.adapt_online`, what the helper runs with
`interference.adapt_online: true` on a GPU type its model never saw; the
same target), beside the contention model; CPU time too, the models taking
turns epoch by epoch.

Optimality: random small instances (≤ 12 jobs, ≤ 4 GPUs on nodes of 2, idle)
planned by `elastico` without queue-head reservation (the MILP knows no
queue) and compared with `slurm_elastico.planner.exact.optimum` on
`Σ w_j·T_j/T_j,max` of the started jobs: gap = (optimum − planner) / optimum.
Two interference models: the default contention model, and a bandwidth model
(co-runners add their memory-bandwidth demand whatever their MPS share) under
which some pairs break the floor.
"""

from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import argparse  # noqa: E402
import contextlib  # noqa: E402
import sys  # noqa: E402
import dataclasses  # noqa: E402
import math  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # for `tests.synthetic`, the fixtures the unit tests share

from slurm_elastico import jsonout  # noqa: E402
from slurm_elastico.config import Settings  # noqa: E402
from slurm_elastico.interference.base import ContentionModel  # noqa: E402
from slurm_elastico.model import JobState  # noqa: E402
from slurm_elastico.planner import exact, policies  # noqa: E402
from slurm_elastico.planner.weights import weight_of  # noqa: E402
from tests import synthetic  # noqa: E402

NOW = 1_000_000.0
SIZES = ((200, 64, 0.015), (1000, 512, 0.150), (10000, 4096, 1.5))
TYPES = ("t4", "v100", "a100")
"""The typed latency's GPU types (nodes of each in turn; each family's shapes on all three)."""


class BandwidthModel:
    """Slowdown = the larger of summed SM and summed memory-bandwidth demand; bandwidth is not capped by the share."""

    def predict(self, a, b):
        def demand(p):
            sm = p.sm_util if not math.isnan(p.sm_util) else 0.7 * p.mps_share / 100
            bw = p.membw_util if not math.isnan(p.membw_util) else 0.5
            return sm, bw

        da = np.array([demand(p) for p in a]).reshape(-1, 2)
        db = np.array([demand(p) for p in b]).reshape(-1, 2)
        return np.maximum(1.0, (da + db).max(axis=1))


def latency(quick: bool, gang_frac: float = 0.0, types: tuple[str, ...] = ()) -> list[dict]:
    """Median epoch time per size; `gang_frac` of the family templates with data-parallel shapes (2, 4, 8 GPUs);
    with `types`, nodes of those GPU types in turn and every family's shapes on each (`synthetic.with_types`)."""
    return latency_beside(quick, {"": (gang_frac, types)})[""]


def latency_beside(quick: bool, cases: dict[str, tuple[float, tuple[str, ...]]]) -> dict[str, list[dict]]:
    """`latency` for several cases ({name: (gang_frac, types)}) at each size, taking turns epoch by epoch, so
    that a change of load on a shared machine falls on all of them alike."""
    policy = policies.REGISTRY["elastico"]
    settings = Settings()
    out: dict[str, list[dict]] = {name: [] for name in cases}
    for jobs, gpus, target in SIZES:
        snaps = {name: synthetic.instance(np.random.default_rng(jobs), jobs, gpus, running_frac=0.2,
                                          gang_frac=gang_frac, types=types)
                 for name, (gang_frac, types) in cases.items()}
        model = ContentionModel()
        repeats = (3 if jobs >= 10000 else 5) if quick else (5 if jobs >= 10000 else 20)
        plans = {name: policy.plan(snap, fams, settings, model, NOW)  # warm-up: first-call imports and allocations
                 for name, (snap, fams) in snaps.items()}
        times: dict[str, list[float]] = {name: [] for name in cases}
        cpu: dict[str, list[float]] = {name: [] for name in cases}
        for _ in range(repeats):
            for name, (snap, fams) in snaps.items():
                t0, c0 = time.perf_counter(), time.thread_time()
                plans[name] = policy.plan(snap, fams, settings, model, NOW)
                cpu[name].append(time.thread_time() - c0)
                times[name].append(time.perf_counter() - t0)
        for name in cases:
            c = statistics.median(cpu[name])
            out[name].append({"jobs": jobs, "gpus": gpus, "median_s": statistics.median(times[name]),
                              "min_s": min(times[name]), "cpu_median_s": c, "target_s": target,
                              "target_met": c <= target, "load_avg_1m": os.getloadavg()[0],
                              "started": len(plans[name].placements), "actions": len(plans[name].actions)})
    for rows in out.values():
        for prev, cur in zip(rows, rows[1:]):
            cur["growth_exponent"] = (math.log(cur["cpu_median_s"] / prev["cpu_median_s"])
                                      / math.log(cur["jobs"] / prev["jobs"]))
    return out


def typed_targets(typed: list[dict], baseline: list[dict]) -> list[dict]:
    """The typed epochs against their targets, each beside the same snapshot without GPU types (the baseline,
    timed in the same run, epoch for epoch)."""
    out = []
    for t, b in zip(typed, baseline):
        out.append({"case": f"{len(TYPES)} GPU types, {t['jobs']} jobs / {t['gpus']} GPUs", "jobs": t["jobs"],
                    "gpus": t["gpus"], "cpu_median_s": t["cpu_median_s"], "target_s": t["target_s"],
                    "met": t["target_met"], "one_type_cpu_median_s": b["cpu_median_s"],
                    "one_type_met": b["target_met"], "typed_over_one_type": t["cpu_median_s"] / b["cpu_median_s"]})
    return out


def latency_trained(quick: bool) -> list[dict]:
    """Epoch latency with a trained predictor (Gavel data) beside the contention model, same snapshots.

    Training is outside the timing. As in `latency`, each epoch's CPU time (`time.thread_time`) is what is
    compared, the wall time printed beside it; the models take turns, one epoch each per round, so a change of
    load on a shared machine falls on all of them alike."""
    from slurm_elastico.interference.adapt_online import OnlineAdapted
    from slurm_elastico.interference.adapt_score import draw
    from slurm_elastico.interference.gavel import import_gavel
    from slurm_elastico.interference.predictor import TrainConfig, train
    from slurm_elastico.interference.transfer.fit import fit_transfer

    data = ROOT / "tests" / "data" / "gavel"
    obs = import_gavel(data / "throughputs_pairs.csv", data / "throughputs_isolated.csv").observations
    p100 = [o for o in obs if o.gpu_type == "p100"]
    adapted = OnlineAdapted(fit_transfer([o for o in obs if o.gpu_type == "k80"], seed=0), "p100")
    adapted.observe([p100[i] for i in draw(p100, 0.1, 0)[0]])  # its first measured pairs: 10 %, as iac evaluate
    models = {"contention": ContentionModel(),
              "trained": fit_transfer(obs, seed=0),  # `elastico iac train`'s default, prior-corrected
              "mlp": train(obs, TrainConfig(hidden=32, weight_decay=1e-4, epochs=200, use_family=True), seed=0),
              "adapted": adapted}
    policy, settings, rows = policies.REGISTRY["elastico"], Settings(), []
    for jobs, gpus, _ in SIZES[:2]:
        snap, fams = synthetic.instance(np.random.default_rng(jobs), jobs, gpus, running_frac=0.2)
        row = {"jobs": jobs, "gpus": gpus}
        cpu: dict[str, list[float]] = {name: [] for name in models}
        wall: dict[str, list[float]] = {name: [] for name in models}
        for name, model in models.items():
            plan = policy.plan(snap, fams, settings, model, NOW)  # warm-up
            row[f"{name}_started"] = len(plan.placements)
        for _ in range(5 if quick else 15):
            for name, model in models.items():
                t0, c0 = time.perf_counter(), time.thread_time()
                policy.plan(snap, fams, settings, model, NOW)
                cpu[name].append(time.thread_time() - c0)
                wall[name].append(time.perf_counter() - t0)
        for name in models:
            row[f"{name}_median_s"] = statistics.median(cpu[name])
            row[f"{name}_wall_median_s"] = statistics.median(wall[name])
        row["load_avg_1m"] = os.getloadavg()[0]
        rows.append(row)
    return rows


def planner_value(plan, snap, fams, fairness: str) -> float:
    total = 0.0
    for p in plan.placements:
        fam = fams[p.job_id]
        tmax = max(s.throughput for s in fam.shapes)
        total += weight_of(snap.job(p.job_id), fam, fairness, NOW) * fam.shape(p.shape).throughput / tmax
    return total


def optimality(n: int, model, seed: int) -> dict:
    rng = np.random.default_rng(seed)
    settings = Settings()
    settings = dataclasses.replace(settings, planner=dataclasses.replace(settings.planner, reserve_queue_head=False))
    policy = policies.REGISTRY["elastico"]
    gaps, worst = [], (0.0, None)
    t0 = time.perf_counter()
    for i in range(n):
        jobs, gpus = int(rng.integers(2, 13)), int(rng.integers(1, 5))
        snap, fams = synthetic.instance(rng, jobs, gpus, templates=jobs, gpus_per_node=2)
        assert not any(j.state is JobState.RUNNING for j in snap.jobs)
        plan = policy.plan(snap, fams, settings, model, NOW)
        got = planner_value(plan, snap, fams, settings.planner.fairness)
        with quiet_stdout():
            best = exact.optimum(snap, fams, settings.planner.fairness, NOW, model, settings.interference.floor,
                                 settings.gpu.memory_mib)
        gap = (best - got) / best if best > 0 else 0.0
        gaps.append(gap)
        if gap > worst[0]:
            worst = (gap, (i, jobs, gpus))
    return {"instances": n, "mean_gap": float(np.mean(gaps)), "worst_gap": float(max(gaps)),
            "optimal_share": float(np.mean(np.array(gaps) <= 1e-9)), "worst_instance": worst[1],
            "seconds": time.perf_counter() - t0}


@contextlib.contextmanager
def quiet_stdout():
    """HiGHS prints progress lines from C on file descriptor 1; keep them out of the table."""
    sys.stdout.flush()
    saved = os.dup(1)
    with open(os.devnull, "wb") as null:
        os.dup2(null.fileno(), 1)
        try:
            yield
        finally:
            os.dup2(saved, 1)
            os.close(saved)


def monotonicity(n: int, seed: int) -> dict:
    """Random cases: submit one pending job earlier (raising w_j under `waiting`); count drops of its throughput."""
    rng = np.random.default_rng(seed)
    policy = policies.REGISTRY["elastico"]
    settings = Settings()
    drops = 0
    for i in range(n):
        jobs, gpus = int(rng.integers(1, 25)), int(rng.integers(1, 9))
        snap, fams = synthetic.instance(rng, jobs, gpus, templates=6, gpus_per_node=int(rng.choice([1, 2, 4])), now=NOW)
        model = BandwidthModel() if i % 2 else ContentionModel()
        pend = [j for j in snap.jobs if j.state is JobState.PENDING]
        job = pend[int(rng.integers(0, len(pend)))]
        raised = dataclasses.replace(job, submit_time=int(job.submit_time - rng.uniform(600, 36000)))
        snap2 = dataclasses.replace(snap, jobs=tuple(raised if j is job else j for j in snap.jobs))

        def rate(s):
            plan = policy.plan(s, fams, settings, model, NOW)
            return next((p.throughput for p in plan.placements if p.job_id == job.job_id), 0.0)

        drops += rate(snap2) < rate(snap) - 1e-9
    return {"cases": n, "drops": int(drops)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer repeats and instances (under a minute)")
    ap.add_argument("--latency-only", action="store_true", help="only the epoch latency tables (no trained "
                    "predictors, optimality gap or monotonicity)")
    args = ap.parse_args()

    lat = latency(args.quick)
    paired = latency_beside(args.quick, {"gangs": (0.3, ()), "types": (0.3, TYPES)})
    gang, typed = paired["gangs"], paired["types"]
    targets = typed_targets(typed, gang)
    for title, rows in (("", lat), (", 30 % of families with 2/4/8-GPU shapes", gang),
                        (f", the same on {len(TYPES)} GPU types, taking turns with the one above", typed)):
        print(f"epoch latency (policy elastico, one thread{title}; medians; ok: CPU time within the target)")
        print(f"{'jobs':>6} {'GPUs':>5} {'CPU':>10} {'wall':>10} {'load':>5} {'target':>8} {'ok':>3} {'growth':>7} "
              f"{'started':>8}")
        for r in rows:
            ok = "yes" if r["target_met"] else "NO"
            growth = f"{r['growth_exponent']:.2f}" if "growth_exponent" in r else "-"
            print(f"{r['jobs']:>6} {r['gpus']:>5} {1000 * r['cpu_median_s']:>8.1f}ms {1000 * r['median_s']:>8.1f}ms "
                  f"{r['load_avg_1m']:>5.1f} {1000 * r['target_s']:>6.0f}ms {ok:>3} {growth:>7} {r['started']:>8}")
    print()
    print(f"targets on {len(TYPES)} GPU types (CPU time, medians), beside the same snapshots on one type:")
    print(f"{'case':>38} {'typed':>10} {'one type':>10} {'ratio':>6} {'target':>8} {'met':>4}")
    for t in targets:
        print(f"{t['case']:>38} {1000 * t['cpu_median_s']:>8.1f}ms {1000 * t['one_type_cpu_median_s']:>8.1f}ms "
              f"{t['typed_over_one_type']:>6.2f} {1000 * t['target_s']:>6.0f}ms {'yes' if t['met'] else 'NO':>4}")
    if args.latency_only:
        print(jsonout.dumps({"latency": lat, "latency_gangs": gang, "latency_types": typed,
                             "latency_type_targets": targets}))
        return

    trained = latency_trained(args.quick)
    print()
    print("epoch latency with a predictor trained on tests/data/gavel beside the contention model (trained: the "
          "default, prior-corrected; target: within 2x of the contention model; CPU time, medians; wall in brackets; "
          "started: jobs each model's plan starts)")
    print(f"{'jobs':>6} {'GPUs':>5} {'contention':>20} {'trained':>20} {'ratio':>6} {'ok':>3} {'mlp':>20} "
          f"{'adapted':>20} {'ratio':>6} {'ok':>3} {'load':>5} {'started c/t/m/a':>16}")
    for r in trained:
        ratio = r["trained_median_s"] / r["contention_median_s"]
        adapted_ratio = r["adapted_median_s"] / r["contention_median_s"]
        cells = [f"{1000 * r[f'{m}_median_s']:>7.1f}ms ({1000 * r[f'{m}_wall_median_s']:>6.1f}ms)"
                 for m in ("contention", "trained", "mlp", "adapted")]
        started = "/".join(str(r[f"{m}_started"]) for m in ("contention", "trained", "mlp", "adapted"))
        print(f"{r['jobs']:>6} {r['gpus']:>5} {cells[0]:>20} {cells[1]:>20} {ratio:>6.2f} "
              f"{'yes' if ratio <= 2 else 'NO':>3} {cells[2]:>20} {cells[3]:>20} {adapted_ratio:>6.2f} "
              f"{'yes' if adapted_ratio <= 2 else 'NO':>3} {r['load_avg_1m']:>5.1f} {started:>16}")

    n = 200 if args.quick else 500
    opt = {"contention": optimality(n, ContentionModel(), 7), "bandwidth": optimality(n, BandwidthModel(), 8)}
    print()
    print("optimality gap vs exact MILP (elastico, no queue-head reservation)")
    print(f"{'model':>11} {'instances':>10} {'mean gap':>9} {'worst gap':>10} {'optimal':>8}")
    for name, r in opt.items():
        print(f"{name:>11} {r['instances']:>10} {100 * r['mean_gap']:>8.2f}% {100 * r['worst_gap']:>9.2f}% "
              f"{100 * r['optimal_share']:>7.0f}%")
    mono = monotonicity(300 if args.quick else 1500, 11)
    print()
    print(f"weight monotonicity: raising w_j lowered job j's throughput in {mono['drops']} of {mono['cases']} "
          "random cases")
    print(jsonout.dumps({"latency": lat, "latency_gangs": gang, "latency_types": typed,
                         "latency_type_targets": targets, "latency_trained": trained, "optimality": opt,
                         "monotonicity": mono}))


if __name__ == "__main__":
    main()
