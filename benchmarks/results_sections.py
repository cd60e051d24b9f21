"""What each benchmark's figures mean on the results page: its title, what it measures, and its tables.

Pure functions from a benchmark's captured figures (its final JSON line) to
markdown lines. A key the benchmark's JSON lacks (an older capture, a section
not run) is shown as "n/a" or "not counted", never guessed; a count of
unfinished jobs or refused actions stands in the same row as the mean it
qualifies.
"""

from __future__ import annotations

import math
import re

USES_TORCH = frozenset({"checkpoint", "interference", "online", "planner", "reshape"})
"""The benchmarks whose figures depend on torch (the machine line names its version for them)."""
PLOTS = ("sim", "planner", "interference", "online", "checkpoint")
"""The benchmarks with a plot, docs/results/<name>.png (drawn by results_plots)."""
POLICY_WORDS = {"static": "plain Slurm", "pollux": "the Pollux baseline"}


def fmt(value, spec: str = ".2f") -> str:
    """A figure for the page; "n/a" for a missing, NaN or infinite one (never the text "nan")."""
    if isinstance(value, bool):
        return "yes" if value else "no"
    if not isinstance(value, int | float) or (isinstance(value, float) and not math.isfinite(value)):
        return "n/a"
    return format(value, spec)


def ms(seconds) -> str:
    """Seconds shown as milliseconds, one decimal."""
    return fmt(seconds * 1000.0 if isinstance(seconds, int | float) else None, ".1f")


def pct(value) -> str:
    return fmt(value, ".1%")


def count(d: dict, key: str) -> str:
    """A count beside a mean: the number, or "not counted" when this capture's JSON has no such count."""
    return fmt(d[key], "d") if key in d and isinstance(d[key], int) else ("not counted" if key not in d else "n/a")


def table(header: list[str], rows: list[list[str]]) -> list[str]:
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)] + ["| " + " | ".join(r) + " |" for r in rows]


def anchor(title: str) -> str:
    """The heading's anchor as GitHub and MkDocs both make it (titles here have no doubled spaces or hyphens)."""
    return re.sub(r"[\s]+", "-", re.sub(r"[^\w\s-]", "", title).strip().lower())


def verdict(unfinished) -> str:
    if not isinstance(unfinished, int):
        return "n/a"
    return "yes" if unfinished == 0 else f"**NOT A RESULT** ({unfinished} unfinished)"


# --------------------------------------------------------------------------------------------------------- sim


def _policy_table(policies: dict) -> list[str]:
    rows = []
    for name, p in sorted(policies.items(), key=lambda item: item[0] != "elastico"):  # elastico first, then as given
        over = "1 (reference)" if name == "elastico" else (
            f"{fmt(p.get('over_elastico'))} (paired {fmt(p.get('paired_ratio'))} ± {fmt(p.get('paired_ci95'))})")
        rows.append([name, f"{fmt(p.get('mean_jct_h'), '.3f')} ± {fmt(p.get('ci95'), '.3f')}", over,
                     fmt(p.get("ratio_to_lb")), count(p, "unfinished"), count(p, "refused_actions"),
                     verdict(p.get("unfinished"))])
    return table(["policy", "mean JCT h ± 95 %", "× elastico's mean JCT", "× lower bound", "unfinished jobs",
                  "refused actions", "a result"], rows)


def _comparison(c: dict) -> list[str]:
    return [f"**Mixed trace** ({c.get('label', 'n/a')}; plain Slurm keeps its GPUs "
            f"{pct(c.get('static_util_arrivals'))} allocated while jobs arrive). Mean job completion time (JCT, hours, "
            "over seeds, ± the 95 % Student-t half-width); `× elastico's` above 1 means elastico finished jobs "
            "sooner, paired by seed (the same trace) with its own interval; the lower bound is every job alone at "
            "its fastest shape (on at most the cluster's GPUs) from submission.", ""] + _policy_table(
        c.get("policies", {})) + [""] + _goodput_mixed(c.get("goodput"))


def _goodput_mixed(g: dict | None) -> list[str]:
    """Static's mean JCT over elastico-goodput's on the mixed trace, paired by seed, against issue 29's target."""
    if not g:
        return []
    return [f"**Goodput mode** on this trace: static's mean JCT over elastico-goodput's, paired by seed, "
            f"{fmt(g.get('static_over'))} ± {fmt(g.get('ci95'))} ({fmt(g.get('seeds'), 'd')} seeds; target "
            f"{g.get('target', 'n/a')}: {'met' if g.get('met') else '**not met**'}; unfinished jobs "
            f"{count(g, 'unfinished')}).{_headroom(g.get('headroom'))}", ""]


def _headroom(h: dict | None) -> str:
    """What the mixed-trace target asks of the training jobs, seed by seed, beside what a batch of their choice
    allows them (their mean JCT over their fixed-batch lower bound)."""
    if not h:
        return ""
    needed, bound = h.get("train_needed_over_lb_by_seed") or [], h.get("train_adaptive_lb_over_lb_by_seed") or []
    kinds = h.get("jct_over_lb_by_kind") or {}
    out = (f" Static is {fmt(h.get('static_over_lb'))}× the fixed-batch lower bound; under elastico-goodput the "
           "training jobs are at " + fmt(kinds.get("train")) + "× theirs")
    if needed and len(bound) == len(needed):
        out += (". The target needs them, seed by seed, at " + ", ".join(fmt(n) for n in needed)
                + "× their fixed-batch bound, where each alone with a batch of its choice is at best "
                + ", ".join(fmt(b) for b in bound) + "×")
    ceiling = h.get("static_over_best_alone_by_seed") or []
    if ceiling:
        out += (". No policy can make static's mean JCT more than " + fmt(sum(ceiling) / len(ceiling))
                + "× its own, on the mean over seeds (every job alone at its best from its submission, a training "
                "job with a batch of its choice)")
    return out + "."


def _pollux(p: dict) -> list[str]:
    names = list(p.get("mean_jct_s", {}))
    rows = []
    for w in p.get("workloads", []):
        left = w.get("unfinished", {})
        rows.append([str(w.get("workload"))] + [fmt(w["mean_jct_s"].get(n), ".0f") + ("*" if left.get(n) else "")
                                                for n in names]
                    + [fmt(min(w.get("lower_bound_s", {}).values(), default=None), ".0f")]
                    + [fmt(w.get("peer_mean_jct_s", {}).get(k), ".0f") for k in ("pollux", "tiresias", "optimus")])
    ci = p.get("ci95_s")  # over seeds; an older capture has none
    rows.append(["mean"] + [fmt(p["mean_jct_s"].get(n), ".0f") + (f" ± {fmt(ci.get(n), '.0f')}" if ci else "")
                            for n in names]
                + [fmt(min(p.get("lower_bound_s", {}).values(), default=None), ".0f")]
                + [fmt(p.get("peer_mean_jct_s", {}).get(k), ".0f") for k in ("pollux", "tiresias", "optimus")])
    refused = p.get("refused_actions")
    return ([f"**Pollux workloads** on the peer's cluster (64 GPUs, 16 nodes × 4, 60 s rounds, 30 s restarts; "
            f"{p.get('seeds', 'n/a')} seed(s)): mean JCT in seconds beside the peer's published means; `@peer` "
            "columns place gangs as the peer's simulator does and see a running job's statistical efficiency "
            "without error, as its policy does there (the calibration), the others as Slurm can be asked "
            "(the comparison); `*` marks a cell with unfinished jobs (not a result).", ""]
    + table(["workload", *names, "lower bound", "peer pollux", "peer tiresias", "peer optimus"], rows) + [
        "", "Unfinished jobs: " + ", ".join(f"{n} {fmt(v, 'd')}" for n, v in p.get("unfinished", {}).items())
        + "; refused actions: " + (", ".join(f"{n} {fmt(v, 'd')}" for n, v in refused.items()) if refused
                                   else "not counted") + ".", ""] + _goodput_pollux(p.get("goodput"), p.get("seeds")))


def _goodput_pollux(g: dict | None, seeds) -> list[str]:
    """elastico-goodput's mean JCT over each other column's, paired by seed, with issue 29's target where it has one
    (nothing for a capture without the goodput column)."""
    if not g:
        return []
    rows = [[f"elastico-goodput ÷ {n}", f"{fmt(r.get('ratio'), '.3f')} ± {fmt(r.get('ci95'), '.3f')}",
             r.get("target", "–"), fmt(r["met"]) if "met" in r else "–", count(r, "unfinished")]
            for n, r in g.items()]
    return ([f"**Goodput mode** on the Pollux workloads: each seed's mean JCT over the workloads, elastico-goodput's "
             f"over the other column's, paired by seed ({fmt(seeds, 'd')} seed(s); ± the 95 % interval, n/a with one "
             "seed); the target is issue 29's, against the calibrated Pollux (the peer's placement).", ""]
            + table(["ratio", "paired mean ± 95 %", "target", "met", "unfinished jobs"], rows) + [""])


def _scale(rows: list[dict]) -> list[str]:
    body = [[fmt(r.get("gpus"), "d"), fmt(r.get("jobs"), "d"), fmt(r.get("arrival_hours"), ".1f"),
             fmt(r.get("wall_s"), ".1f"), fmt(r.get("cpu_s"), ".1f"), fmt(r.get("events_per_s"), ".0f"),
             fmt(r.get("plan_ms_per_epoch"), ".0f"), fmt(r.get("mean_jct_h"), ".3f"), count(r, "unfinished"),
             count(r, "refused_actions")] for r in rows]
    return ["**Scale** (elastico on one core): wall and CPU seconds to replay the arrivals, events per second, "
            "the planner's milliseconds per planned epoch.", ""] + table(
        ["GPUs", "jobs", "arrivals over h", "wall s", "CPU s", "events/s", "plan ms/epoch", "mean JCT h",
         "unfinished jobs", "refused actions"], body) + [""]


def _heterogeneous(h: dict) -> list[str]:
    names = list(h.get("mean_jct_h", {}))
    rows = [[fmt(r.get("workload"), "d")] + [fmt(r["mean_jct_h"].get(n), ".2f") + ("*" if r.get("unfinished", {}).get(n)
                                                                                  else "") for n in names]
            for r in h.get("workloads", [])]
    published = h.get("published_h", {})
    rows.append(["**mean**"] + [fmt(h["mean_jct_h"][n], ".2f") + f" ± {fmt(h.get('std_jct_h', {}).get(n), '.2f')}"
                                for n in names])
    rows.append(["published"] + [fmt(published[n]["mean"], ".1f") if n in published else "–" for n in names])
    met = h.get("targets_met", {})
    paired = h.get("paired", {})
    ratios = [[k.replace("_over_", " ÷ "), fmt(v, ".2f"),
               (f"{fmt(paired[k]['mean'], '.2f')} ± {fmt(paired[k]['ci95'], '.2f')}" if k in paired else "–"),
               h.get("targets", {}).get(k, "–"), fmt(met[k]) if k in met else "–"]
              for k, v in h.get("ratios", {}).items()]
    return ([f"**Several GPU types**: Sia's Philly workloads on Sia's 64-GPU cluster of three types, mean JCT in "
             f"hours per workload ({h.get('seeds', 'n/a')}; `*`: jobs left unfinished), Sia's published Table 3 "
             "figures beside:", ""]
            + table(["workload", *names], rows)
            + ["", f"Lower bound {fmt((h.get('lower_bound_h') or {}).get('elastico'), '.2f')} h (every job alone at "
               f"its fastest shape); {len(rows) - 2} of the 8 workloads (the published figures are means over the 8); "
               "unfinished jobs: "
               + ", ".join(f"{n} {fmt(v, 'd')}" for n, v in h.get("unfinished", {}).items()) + ".", ""]
            + table(["ratio", "of the means", "paired mean ± 95 %", "target", "met"], ratios) + [""])


def _restart_sweep(w: dict) -> list[str]:
    rows = w.get("rows", [])
    names = list(rows[0]["over_elastico"]) if rows else []
    belief = rows[0].get("believed_restart_cost_s") if rows else None
    out = [f"**Restart-cost sweep** ({fmt(w.get('gpus'), 'd')} GPUs, {fmt(w.get('jobs'), 'd')} jobs, load "
           f"{fmt(w.get('load'), 'g')}, {fmt(w.get('seeds'), 'd')} seeds): the mixed trace again with every requeue "
           f"and relaunch truly costing the given seconds (plus its kind's measured overhead) while the planner "
           f"believes {fmt(belief, 'g')} s; each baseline's mean JCT over elastico's, paired by seed.", ""]
    body = [[fmt(r["true_restart_cost_s"], "g"), fmt(r["elastico_mean_jct_h"], ".3f")]
            + [f"{fmt(r['over_elastico'][n]['paired_ratio'])} ± {fmt(r['over_elastico'][n]['paired_ci95'])}"
               for n in names]
            + [str(sum(r["unfinished"].values())), str(sum(r["refused_actions"].values()))] for r in rows]
    return out + table(["true restart s", "elastico mean JCT h"] + [f"{n} ÷ elastico" for n in names]
                       + ["unfinished jobs", "refused actions"], body) + [""]


def sim_body(f: dict) -> list[str]:
    out = []
    for c in f.get("comparison", []):
        out += _comparison(c)
    if f.get("restart_sweep"):
        out += _restart_sweep(f["restart_sweep"])
    if f.get("pollux"):
        out += _pollux(f["pollux"])
    if f.get("alibaba"):
        out += ["**Alibaba GPU-sharing trace** " + f"({f['alibaba'].get('label', 'n/a')}).", ""]
        out += _policy_table(f["alibaba"].get("policies", {})) + [""]
    else:
        out += [f"**Alibaba GPU-sharing trace**: not run ({f.get('alibaba_not_run', 'no reason given')}).", ""]
    if f.get("heterogeneous"):
        out += _heterogeneous(f["heterogeneous"])
    else:
        out += [f"**Several GPU types (Sia's Philly workloads)**: not run "
                f"({f.get('heterogeneous_not_run', 'no reason given')}).", ""]
    if f.get("scale"):
        out += _scale(f["scale"])
    out.append(f"Unfinished jobs over every section: {fmt(f.get('unfinished_jobs'), 'd')} "
               f"({'complete' if f.get('complete') else '**NOT COMPLETE: not a result**'}); the whole run took "
               f"{fmt(f.get('wall_s'), '.0f')} s on {fmt(f.get('workers'), 'd')} worker process(es).")
    return out


# ----------------------------------------------------------------------------------------------------- planner


def _latency(rows: list[dict]) -> list[str]:
    body = [[fmt(r.get("jobs"), "d"), fmt(r.get("gpus"), "d"), ms(r.get("cpu_median_s")), ms(r.get("median_s")),
             ms(r.get("target_s")),
             fmt(r["cpu_median_s"] <= r["target_s"]) if isinstance(r.get("cpu_median_s"), float) else "n/a",
             fmt(r.get("growth_exponent")), fmt(r.get("load_avg_1m"), ".1f"), fmt(r.get("started"), "d")]
            for r in rows]
    return table(["jobs", "GPUs", "CPU ms", "wall ms", "target ms", "within target", "growth exponent",
                  "load (1 min)", "jobs started"], body)


def planner_body(f: dict) -> list[str]:
    out = ["**Epoch latency** (median of repeats, one thread; judged on CPU time, since on a shared machine the "
           "wall time also counts waiting for a core; the growth exponent is log(t2/t1) / log(jobs2/jobs1)):", ""]
    out += _latency(f.get("latency", [])) + ["", "The same with 30 % of the families data-parallel "
                                                 "(2, 4 and 8-GPU shapes):", ""]
    out += _latency(f.get("latency_gangs", [])) + [""]
    typed = f.get("latency_type_targets", [])
    if typed:
        out += ["The same snapshots on 3 GPU types (nodes of t4, v100 and a100 in turn, every family's shapes on "
                "each), taking turns with the one-type epochs of the table above (CPU ms, medians; the targets are "
                "the one-type ones):", ""]
        out += table(["case", "3 types ms", "one type ms", "ratio", "target ms", "within target"],
                     [[r.get("case", "n/a"), ms(r.get("cpu_median_s")), ms(r.get("one_type_cpu_median_s")),
                       fmt(r.get("typed_over_one_type")), ms(r.get("target_s")), fmt(r.get("met"))]
                      for r in typed]) + [""]
    rows = []
    for r in f.get("latency_trained", []):
        c = r.get("contention_median_s")
        row = [fmt(r.get("jobs"), "d"), fmt(r.get("gpus"), "d"), ms(c)]
        for key in ("trained_median_s", "adapted_median_s"):
            t = r.get(key)
            ratio = t / c if isinstance(c, float) and isinstance(t, float) and c > 0 else None
            row += [ms(t), fmt(ratio), fmt(ratio <= 2.0) if ratio is not None else "n/a"]
        rows.append(row + [ms(r.get("mlp_median_s")), fmt(r.get("load_avg_1m"), ".1f")])
    out += ["**Epoch latency with a trained predictor** (the default prior-corrected one, trained on the bundled "
            "Gavel pairs; adapted: the same trained on K80 pairs only, adapting online on P100 after its first 35 "
            "measured pairs; target: within 2× the contention model's epoch; CPU ms, medians):", ""]
    out += table(["jobs", "GPUs", "contention ms", "trained ms", "ratio", "within 2×", "adapted ms", "ratio",
                  "within 2×", "MLP ms", "load (1 min)"], rows) + [""]
    opt = f.get("optimality", {})
    out += ["**Optimality gap** against an exact MILP on small random instances (≤ 12 jobs, ≤ 4 GPUs; "
            "gap = (optimum − planner) / optimum of Σ w·T/T_max):", ""]
    out += table(["interference model", "instances", "mean gap", "worst gap", "optimal"],
                 [[m, fmt(r.get("instances"), "d"), pct(r.get("mean_gap")), pct(r.get("worst_gap")),
                   fmt(r.get("optimal_share"), ".0%")] for m, r in opt.items()]) + [""]
    mono = f.get("monotonicity", {})
    out.append(f"**Weight monotonicity**: raising a pending job's weight lowered its throughput in "
               f"{fmt(mono.get('drops'), 'd')} of {fmt(mono.get('cases'), 'd')} random cases.")
    return out


# ------------------------------------------------------------------------------------------------ interference

SPEED = (("prior-corrected_predictab", "prior-corrected predict(a, b)"),
         ("prior-corrected_predict_matrix", "prior-corrected predict_matrix"),
         ("mlp_predictab", "MLP predict(a, b)"), ("mlp_predict_matrix", "MLP predict_matrix"),
         ("contention_predictab", "contention predict(a, b)"),
         ("prior-corrected_paircache_epoch", "prior-corrected PairCache epoch"),
         ("mlp_paircache_epoch", "MLP PairCache epoch"), ("contention_paircache_epoch", "contention PairCache epoch"))


def _adaptation(a: dict) -> list[str]:
    def band(x: dict | None, as_pct: bool) -> str:
        x = x or {}
        show = pct if as_pct else (lambda v: fmt(v, ".2f"))
        return f"{show(x.get('mean'))} [{show(x.get('low'))}–{show(x.get('high'))}]"

    rows = []
    for direction, d in a.get("directions", {}).items():
        for fraction, r in d.get("fractions", {}).items():
            rows.append([direction.replace("->", " → "), fraction, fmt(r.get("adapt_pairs"), "d"), pct(r.get("mape")),
                         pct(r.get("unadapted_mape")), pct(r.get("trivial_mape")),
                         band(r.get("mape_over_trivial"), False), band(r.get("false_admit"), True),
                         band(r.get("good_admitted"), True)])
    new = [f"{direction.replace('->', ' → ')}: MAPE {pct(n.get('mape'))}, false admissions {pct(n.get('false_admit'))} "
           f"(at most {pct(n.get('false_admit_max'))} in a draw), good admitted {pct(n.get('good_admitted'))}"
           for direction, d in a.get("directions", {}).items() for n in [d.get("new_jobs") or {}]]
    return [f"**Few-shot adaptation, leave one GPU type out** (a model trained on one type, adapted on a fraction F "
            f"of the other's pairs, scored on the rest; {fmt(a.get('seeds'), 'd')} draws; "
            f"floor {a.get('floor', 'n/a')}; "
            "mean [95 % interval]):", ""] + table(
        ["model → data", "F", "adaptation pairs", "adapted MAPE", "unadapted MAPE", "trivial MAPE",
         "adapted / trivial", "false admissions", "good admitted"], rows) + [
        "", "New jobs (adapted on 35 pairs among a random half of the jobs, scored on the pairs of the other half, "
        "10 draws): " + "; ".join(new or ["n/a"]) + ".", ""]


def interference_body(f: dict) -> list[str]:
    out = []
    for kind, h in f.get("heldout", {}).items():
        rows = [[m, pct(x.get("mape_norm")), pct(x.get("mape_slowdown")), pct(x.get("false_admission")),
                 pct(x.get("good_admitted")), pct(x.get("bad_of_admitted"))]
                for m, x in h.get("metrics", {}).items() if not m.startswith("target ")]
        out += [f"**Held out, {kind}** ({fmt(h.get('folds'), 'd')} folds, pooled; floor 0.6; best trivial predictor: "
                f"{h.get('best_trivial', 'n/a')}): MAPE of normalized throughput and of slowdown, bad pairs admitted "
                "(false admissions), good pairs admitted, and the share of admitted pairs that were bad.", ""]
        out += table(["method", "MAPE norm", "MAPE slowdown", "false admissions", "good admitted", "bad of admitted"],
                     rows) + [""]
    out += _adaptation(f.get("adaptation") or {})
    out += [f"**Speed** ({fmt(f.get('pairs'), 'd')} pairs in one call, {fmt(f.get('threads'), 'd')} torch thread(s), "
            f"asked as on an unseen GPU; target {fmt(f.get('target_ms'), 'g')} ms for predict(a, b); a PairCache "
            "epoch is 2,000 planner lookups):", ""]
    out += table(["call", "median ms"], [[label, fmt(f.get(key), ".2f")] for key, label in SPEED])
    return out


# ----------------------------------------------------------------------------------------------------- online


def online_body(f: dict) -> list[str]:
    rows = []
    for fam, r in f.get("families", {}).items():
        seen = r.get("observed") or [None]
        rows.append([fam or "(none)", pct((r.get("mape_online") or [None])[0]), fmt(seen[-1], "d"),
                     pct((r.get("mape_online") or [None])[-1]), pct((r.get("mape_frozen") or [None])[-1]),
                     fmt(r.get("accepted"), "d")])
    rows.append(["**mean**", pct(f.get("mean_mape_unseen")), fmt(f.get("batch", 0) * f.get("steps", 0), "d"),
                 pct(f.get("mean_mape_online")), pct(f.get("mean_mape_frozen")), ""])
    return [f"The {f.get('predictor', 'n/a')} predictor, one held-out model family at a time, observing "
            f"{fmt(f.get('batch'), 'd')} pairs per epoch for up to {fmt(f.get('steps'), 'd')} epochs; MAPE of "
            "normalized throughput on the family's pairs not yet observed, online against the same model frozen.",
            ""] + table(["held-out family", "MAPE unseen", "pairs observed", "MAPE online", "MAPE frozen",
                         "updates kept"], rows)


# ------------------------------------------------------------------------------------------------- checkpoint


def checkpoint_body(f: dict) -> list[str]:
    rows = [[fmt(r.get("mib"), "g"), ms(r.get("save_s")), ms(r.get("load_s")), fmt(r.get("save_mib_s"), ".0f"),
             fmt(r.get("load_mib_s"), ".0f")] for r in f.get("rows", [])]
    return ["Median of repeats, in a temporary directory (often tmpfs or local disk, which flatters a network file "
            "system; `--dir` measures the jobs' own):", ""] + table(
        ["state MiB", "save ms", "verified load ms", "save MiB/s", "load MiB/s"], rows) + [
        "", f"The example job's (train_tiny) whole checkpoint saves in {ms(f.get('tiny_example_save_s'))} ms."]


# --------------------------------------------------------------------------------------------------- reshape

RESHAPE_PATHS = (("requeue", "requeue, new share (elastico)"), ("in_place", "in place, same share (elastico)"),
                 ("plain_requeue", "requeue, no checkpoint (plain Slurm)"),
                 ("gpus_1_to_2", "GPUs 1 → 2, every rank up"), ("gpus_2_to_4", "GPUs 2 → 4, every rank up"),
                 ("type_move", "another GPU type"))


def reshape_body(f: dict) -> list[str]:
    def cell(fig: dict, key: str) -> str:
        x = fig.get(key)
        return f"{fmt(x.get('median'))} [{fmt(x.get('min'))}–{fmt(x.get('max'))}]" if x else "–"

    rows = [[label] + [cell(f.get(key, {}), k) for k in ("stop_s", "checkpoint_s", "running_s", "first_step_s")]
            for key, label in RESHAPE_PATHS]
    return [f"Seconds from the helper's action, median [min–max] over {fmt(f.get('reps'), 'd')} repetitions "
            f"({fmt(f.get('gpu_reps'), 'd')} for GPU counts), on a local Slurm cluster started for the run:", ""] + table(
        ["path", "checkpointed, exit", "checkpoint save", "running, new shape", "first step"], rows) + [
        "", f"elastico's requeue costs {fmt(f.get('requeue_extra_running_s'), '+.2f')} s over a plain requeue until "
            "the job runs again. A move to another GPU type ends with parameters at a maximum relative difference of "
            f"{fmt(f.get('type_move_max_rel_diff'), '.1e')} from an unmoved run (n/a: the cluster had one type)."]


# ------------------------------------------------------------------------------------------------ type_prior


def type_prior_body(f: dict) -> list[str]:
    if f.get("not_run"):
        return [f"Not run: {f['not_run']}."]
    rows = [[f"{k[-1]} measured type(s)", fmt(r.get("n"), "d"), pct(r.get("median_ratio_error")),
             pct(r.get("within_1_sigma")), pct(r.get("within_2_sigma")), fmt(r.get("median_sigma"))]
            for k, r in sorted((k, v) for k, v in f.items() if k.startswith("anchors_"))]
    naive = f.get("naive_median_abs_log_error")
    apps = [[app, pct(e)] for app, e in sorted(f.get("per_app_median_ratio_error", {}).items())]
    return ([f"Sia's one-GPU profiles ({fmt(f.get('app_batches'), 'd')} app × batch sizes): the speed on a type "
            "predicted from the types measured, median error of predicted ÷ true speed, and how often the truth "
            "lies within the estimate's 1 and 2 sigma (a calibrated sigma: 68 % and 95 %). Assuming every type "
            f"equally fast is off by {pct(math.exp(naive) - 1 if isinstance(naive, float) else None)} (median).", ""]
            + table(["from", "cases", "median error", "within 1 sigma", "within 2 sigma", "median sigma"], rows)
            + ["", "Per app, from one measured type:", ""] + table(["app", "median error"], apps))


# ------------------------------------------------------------------------------------------------ whatif


def whatif_body(f: dict) -> list[str]:
    if f.get("status") != "run":
        return [f"Not run: {f.get('reason') or 'no reason given'}."]
    r = f.get("replay", {})
    measured = f.get("measured_ratio")
    rows = [[name, fmt(p), f"{fmt(lo)}–{fmt(hi)}", fmt(measured),
             pct(p / measured - 1 if isinstance(p, float) and isinstance(measured, float) else None)]
            for name, p in f.get("predicted_ratio", {}).items()
            for lo, hi in [f.get("predicted_ratio_range", {}).get(name, [None, None])]]
    return [f"The demo's plain pass ({f.get('plain_pass', {}).get('partition') or 'whole cluster'}, Slurm "
            f"{f.get('slurm_version')}): {fmt(r.get('compared'), 'd')} jobs replayed on the partition's nodes, start "
            f"error median {fmt(r.get('median_start_error_s'), '.1f')} s, p90 {fmt(r.get('p90_start_error_s'), '.1f')} "
            f"s; mean wait simulated {fmt(r.get('mean_wait_simulated_s'))} s against "
            f"{fmt(r.get('mean_wait_actual_s'))} s measured. The JCT gain plain ÷ elastico the what-if predicts from "
            "that history, under each assumption, beside the gain the demo measured live in the same run (its own "
            f"in-process simulator predicted {fmt(f.get('demo_simulated_ratio'))}):", ""] + table(
        ["assumption", "predicted", "range", "measured", "miss"], rows)


def helper_scale_body(f: dict) -> list[str]:
    rows = [[name, fmt(e.get("wall_s")), fmt(e.get("rss_mib"), ".0f"), fmt(e.get("tree_rss_mib"), ".0f"),
             fmt(e.get("actions"), "d"), fmt(e.get("slurm_changes"), "d"), fmt(e.get("deferred"), "d")]
            for name, e in f.get("epochs", {}).items()]
    acc = f.get("accounted", {})
    target = f.get("target", {})
    caught = "".join(f" {mode}: the first epoch deferred {fmt(m.get('first_epoch_deferred'), 'd')} families; every "
                     f"family was read after {fmt(m.get('epochs_until_all_read'), 'd')} epoch(s), "
                     f"{fmt(m.get('wall_until_all_read_s'))} s in all." for mode, m in (f.get("modes") or {}).items())
    return [f"One `elastico sched --once` epoch (a process of its own) over {fmt(f.get('jobs'), 'd')} jobs on a local "
            f"Slurm cluster ({fmt(f.get('plain'), 'd')} of them plain `sbatch`, the others through elastico-submit's "
            f"own function; every job's family text {'its own' if f.get('distinct_families') else 'one of a few'}), "
            "shadow then acting, each first on a new state directory (cold: it reads new jobs' batch scripts until "
            "its reading budget is spent and defers the rest), again until every family is read (catch-up), and once "
            f"more (warm); load {fmt(f.get('load_1min'))} at the first epoch. Memory: the helper's own peak, and with "
            f"the Slurm commands it ran.{caught}", ""] + table(
        ["epoch", "wall s", "helper MiB", "with Slurm's MiB", "actions", "Slurm changes", "families deferred"], rows) + [
        "", f"Afterwards: {fmt(acc.get('missing_count'), 'd')} job(s) missing, {fmt(acc.get('held_count'), 'd')} left "
            f"held. Target (2,000 jobs): at most {fmt(target.get('wall_s'), 'g')} s and "
            f"{fmt(target.get('rss_mib'), 'g')} MiB an epoch: {'met' if f.get('target_met') else 'not met'}."]


def from_sacct_scale_body(f: dict) -> list[str]:
    target = f.get("target", {})
    skipped = ", ".join(f"{k} {v}" for k, v in (f.get("skipped") or {}).items())
    return [f"`elastico trace from-sacct` over an accounting database of {fmt(f.get('jobs_made'), 'd')} jobs "
            f"({fmt(f.get('templates'), 'd')} real jobs' rows cloned by SQL as slurmdbd writes them; "
            f"{fmt(f.get('jobs_in_window'), 'd')} submitted in the window read): {fmt(f.get('wall_s'))} s and "
            f"{fmt(f.get('rss_mib'), '.0f')} MiB at load {fmt(f.get('load_1min'))}. Of the "
            f"{fmt(f.get('sacct_lists'), 'd')} runs sacct lists, {fmt(f.get('kept'), 'd')} kept and the rest skipped "
            f"by reason ({skipped or 'none'}); every one accounted for: {fmt(f.get('all_accounted'))}. Target "
            f"(10,000 jobs): at most {fmt(target.get('wall_s'), 'g')} s and {fmt(target.get('rss_mib'), 'g')} MiB: "
            f"{'met' if f.get('target_met') else 'not met'}."]


ABOUT = {
    "sim": ("Simulation: mean JCT against plain Slurm and the baselines",
            "The trace-driven simulator runs the same planner code as the helper; every registered policy on a "
            "mixed training/inference trace, the Pollux workloads beside the peer's published figures, and the "
            "simulator's own speed."),
    "planner": ("Planner: epoch latency and optimality gap",
                "One planning epoch on synthetic clusters of three sizes, and the plan's value against an exact "
                "MILP on small instances."),
    "interference": ("Interference prediction: held-out accuracy and speed",
                     "The slowdown predictors on the bundled Gavel pairs, trained on one part and scored on GPU "
                     "types and model families they never saw, and the time one batched call takes."),
    "online": ("Online learning on an unseen model family",
               "How fast the predictor's error falls as the helper feeds it the slowdowns it observes."),
    "checkpoint": ("Checkpoint save and verified load",
                   "Atomic write, fsync and SHA-256 verification of a model-like state, by size."),
    "reshape": ("Reshape overhead on a live Slurm cluster",
                "A job reshaped the way the helper does it (signal, checkpoint, requeue or relaunch in place), "
                "against a plain Slurm requeue, and a move to another GPU type."),
    "type_prior": ("GPU type speed prior: error and calibration",
                   "How well a job's speed on one GPU type is predicted from public GPU figures and what it "
                   "measured on other types, on Sia's measured per-type profiles."),
    "whatif": ("What-if on the cluster's own history",
               "elastico whatif on the accounting of the demo's plain pass: does the replay start the jobs when the "
               "real Slurm did, and does the predicted gain match the one the demo measured beside it?"),
    "helper_scale": ("The helper at a real cluster's scale",
                     "One helper epoch, in shadow mode and acting, over 2,000 queued jobs on a live local cluster: "
                     "wall time, memory, and every job accounted for afterwards."),
    "from_sacct_scale": ("Accounting import at scale",
                         "The trace import (`elastico trace from-sacct`) over a 10,000-job accounting database of "
                         "the real slurmdbd: time and memory."),
}
"""Per benchmark: the section's title and what it measures."""
BODIES = {"sim": sim_body, "planner": planner_body, "interference": interference_body, "online": online_body,
          "checkpoint": checkpoint_body, "reshape": reshape_body, "type_prior": type_prior_body,
          "whatif": whatif_body, "helper_scale": helper_scale_body, "from_sacct_scale": from_sacct_scale_body}
