"""The demo's figures: each run's JCT, waiting, GPU utilisation and reshapes, measured or simulated, side by side.

Pure: they read the driver's observations (`demo_live.Observed`) and the simulator's results
(`demo_workload.predict`). A reshape's kind comes from the shape names of a job's starts (`reshape_kinds`); the
per-job rows put each job's live and simulated figures together, so a user sees which jobs the simulator got
wrong; `start_cost` measures the per-job start-up and exit the simulator replays with.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from slurm_elastico.cluster import demo_workload as workload

if TYPE_CHECKING:
    from slurm_elastico.cluster.demo_live import Observed

RESHAPE_KINDS = ("share", "micro-batch", "engine", "gpus")
"""What a reshape changed, from the shape names before and after: the MPS share, the training micro-batch, the
inference engine's arguments (gpu_memory_utilization, max_num_seqs, kv_cache_dtype), the GPU count."""


def reshape_kinds(shapes: Sequence[str]) -> Counter:
    """What each change of shape between a job's starts changed (`RESHAPE_KINDS`), from the shape names."""
    out: Counter[str] = Counter()
    for a, b in zip(shapes, shapes[1:]):
        if a == b:
            continue
        ka, _, ta = a.rpartition("-")
        kb, _, tb = b.rpartition("-")
        if ta != tb:
            out["gpus" if "gpus" in (ta[:4], tb[:4]) else "share"] += 1
        if ka != kb:
            out["micro-batch" if a.startswith("mb") else "engine"] += 1
    return out


def _figures(jct: list[float], wait: list[float], util: float, kinds: Counter, restarts: int) -> dict:
    arr = np.array(jct, dtype=float)
    return {"jobs": len(jct), "mean_jct_s": float(arr.mean()), "median_jct_s": float(np.median(arr)),
            "p99_jct_s": float(np.percentile(arr, 99)), "mean_wait_s": float(np.mean(wait)), "gpu_util": util,
            "restarts": restarts, **{f"reshape_{k}": kinds.get(k, 0) for k in RESHAPE_KINDS}, "jct": list(jct)}


def measured_figures(obs: Observed, gpus: int) -> dict:
    ids = sorted(obs.ids)
    jct = [obs.end[i] - obs.submit[i] for i in ids]
    wait = [obs.start[i] - obs.submit[i] for i in ids]
    t = [s[0] for s in obs.samples]
    u = [s[1] for s in obs.samples]
    span = (min(obs.submit.values()), max(obs.end.values()))
    area = sum(u[k] * (t[k + 1] - t[k]) for k in range(len(t) - 1) if span[0] <= t[k] < span[1])
    kinds: Counter = Counter()
    restarts = 0
    for i in ids:
        kinds += reshape_kinds(obs.shapes[i])
        restarts += max(0, len(obs.shapes[i]) - 1)
    return _figures(jct, wait, area / max(span[1] - span[0], 1e-9), kinds, restarts)


def simulated_figures(result, shapes: dict[int, list[str]]) -> dict:
    """The figures of a simulated run (`workload.predict`), with the shapes its jobs ran at each start."""
    kinds: Counter = Counter()
    for seq in shapes.values():
        kinds += reshape_kinds(seq)
    return _figures([j.jct for j in result.jobs], [j.queued for j in result.jobs], result.util_makespan, kinds,
                    sum(j.restarts for j in result.jobs))


def start_cost(obs: Observed, truth, plan: workload.Plan) -> float:
    """Seconds each job of the plain run held its GPU beyond its work (`workload.solo_seconds`: plain Slurm runs a
    job at its default shape alone on a whole GPU), on average, at least 0: its processes starting and exiting,
    Slurm's completing state, as this machine's load made them. The simulator replays both runs with it
    (`start_cost_s`). Measured on the plain run, whose jobs' time on their GPU the schedule does not change, so
    the elastico run's own costs (elastico-run, ranks, relaunches) stay part of what the comparison checks."""
    extra = [(obs.end[i] - obs.start[i]) - workload.solo_seconds(truth, job, plan) for i, job in obs.ids.items()]
    return max(0.0, float(np.mean(extra))) if extra else 0.0


COLUMNS = (("mean_jct_s", "mean JCT s"), ("median_jct_s", "median JCT s"), ("p99_jct_s", "p99 JCT s"),
           ("mean_wait_s", "mean wait s"), ("gpu_util", "GPU util"), ("restarts", "restarts"),
           *((f"reshape_{k}", f"reshapes: {k}") for k in RESHAPE_KINDS))


def per_job(jobs: Sequence[workload.DemoJob], live: dict[str, Observed], simulated: dict) -> list[dict]:
    """Each job's wait, JCT and shapes, live (`live`: plain and elastico) and simulated at the same arrivals
    (`simulated`: `workload.predict`'s static and elastico), so a user sees which jobs the simulator got wrong."""
    policy = {"plain": "static", "elastico": "elastico"}
    ids = {mode: {j.index: i for i, j in obs.ids.items()} for mode, obs in live.items()}
    done = {mode: {r.job_id: r for r in simulated[policy[mode]][0].jobs} for mode in live}  # trace ids: index + 1
    out = []
    for job in jobs:
        row: dict = {"job": job.name}
        for mode, obs in live.items():
            job_id = ids[mode][job.index]
            sim = done[mode].get(job.index + 1)  # None: it did not finish
            shapes = simulated[policy[mode]][1]
            row[mode] = {"wait_s": obs.start[job_id] - obs.submit[job_id],
                         "jct_s": obs.end[job_id] - obs.submit[job_id], "shapes": obs.shapes[job_id]}
            row[f"{policy[mode]} (simulated)"] = {"wait_s": sim.queued if sim else None,
                                                   "jct_s": sim.jct if sim else None,
                                                   "shapes": shapes.get(job.index + 1, [])}
        out.append(row)
    return out


def comparison_table(rows: dict[str, dict]) -> str:
    labels = list(rows)
    width = max(len(c[1]) for c in COLUMNS)
    colw = max(12, *(len(label) for label in labels))
    lines = [" " * width + "  " + "  ".join(label.rjust(colw) for label in labels)]
    for key, title in COLUMNS:
        cells = []
        for label in labels:
            v = rows[label][key]
            cells.append((f"{v:.2f}" if key == "gpu_util" else f"{v:.1f}" if isinstance(v, float) else str(v))
                         .rjust(colw))
        lines.append(title.ljust(width) + "  " + "  ".join(cells))
    return "\n".join(lines)


def gap_line(rows: list[dict]) -> str:
    """How much longer the jobs took live than simulated at the same arrivals (`per_job` rows): the time the
    simulator does not model beyond its start cost (the elastico run's own processes: elastico-run, a process per
    rank, relaunches; the helper's epoch), apart for the elastico run's jobs that ran on several GPUs."""
    def mean_gap(mode: str, sim: str, keep=lambda r: True) -> tuple[float, int]:
        gaps = [r[mode]["jct_s"] - r[sim]["jct_s"] for r in rows if keep(r) and r[sim]["jct_s"] is not None]
        return (float(np.mean(gaps)) if gaps else math.nan), len(gaps)

    def gang(r: dict) -> bool:
        return any("-gpus" in s for s in r["elastico"]["shapes"])

    plain, _ = mean_gap("plain", "static (simulated)")
    elastico, _ = mean_gap("elastico", "elastico (simulated)")
    several, n = mean_gap("elastico", "elastico (simulated)", gang)
    one, m = mean_gap("elastico", "elastico (simulated)", lambda r: not gang(r))
    parts = [f"{several:+.1f} s for the {n} jobs that ran on several GPUs"] if n else []
    if m:
        parts.append(f"{one:+.1f} s for the other {m}" if n else f"{one:+.1f} s")
    split = ", ".join(parts)
    unfinished = sum(r[s]["jct_s"] is None for r in rows for s in ("static (simulated)", "elastico (simulated)"))
    return (f"live minus simulated JCT per job (what the simulator's start cost does not cover: the elastico run's "
            f"own processes and relaunches, the helper's epoch): plain {plain:+.1f} s mean; elastico {elastico:+.1f} s "
            f"mean ({split})" + (f"; {unfinished} simulated job(s) did not finish, left out" if unfinished else ""))


SHADOW_TOLERANCE = 0.30
"""The shadow pass agrees with the acting one when it proposes the same kinds of action, each counted within 30 %
of the acting helper's (issue: shadow mode over the demo list)."""


def shadow_agreement(acting: Counter, shadow: dict[str, int], tolerance: float = SHADOW_TOLERANCE) -> dict:
    """The acting helper's actions by kind (done) beside the shadow journal's rows by kind (the demo's shadow pass:
    those of the shadow epoch before each acting one): each kind's counts and relative difference
    (shadow / acting - 1; None where the acting helper took none), and whether they agree (the same kinds, each
    within `tolerance`)."""
    kinds = sorted(set(acting) | set(shadow))
    rows = {k: {"acting": acting.get(k, 0), "shadow": shadow.get(k, 0),
                "relative": shadow.get(k, 0) / acting[k] - 1 if acting.get(k) else None} for k in kinds}
    agree = all(r["relative"] is not None and abs(r["relative"]) <= tolerance + 1e-9 for r in rows.values())
    return {"kinds": rows, "agree": agree and bool(kinds), "tolerance": tolerance}


def shadow_line(agreement: dict) -> str:
    """One line: each kind's acting and shadow counts, and whether they agree."""
    parts = [f"{k} {r['acting']} / {r['shadow']}" for k, r in agreement["kinds"].items()]
    verdict = ("the same kinds, each within " if agreement["agree"] else "NOT the same kinds within ") + \
        f"{100 * agreement['tolerance']:.0f} %"
    return f"actions by kind, acting / shadow: {', '.join(parts) or 'none'}: {verdict}"


def matched_line(matched: dict) -> str:
    """One line: how many of the acting epochs' actions the shadow epoch just before listed (`demo_shadow.matched`)."""
    if not matched["acting"]:
        return f"one by one: the acting epochs took no action; the shadow journal listed {matched['journaled']}"
    return (f"one by one: {matched['matched']} of the {matched['acting']} actions the acting epochs took "
            f"({100 * matched['share_matched']:.0f} %) were listed, same job and kind, by the shadow epoch just "
            f"before; {matched['not_taken']} listed were not taken; of these {matched['acting'] - matched['matched']}"
            f" + {matched['not_taken']} misses, {matched['misses_where_slurm_moved_a_job']} fell in pairs where Slurm "
            f"submitted, started or ended a job before the acting epoch acted")
