"""How well the per-type speed prior predicts a job's speed on one GPU type from what it measured on others.

Run from the repo root with the project's venv:

    python benchmarks/type_prior.py [--quick] [--profiles DIR]

`--profiles` is a directory in Sia's layout (`<app>/placements-<type>.csv`,
columns placement, local_bsz, step_time; Sia's SOSP 2023 artifact, not
bundled with this project: the user names where it is). Sia's type names map
to GPUs as its README says: aws = T4, rtx = RTX 2080 Ti, dgx-ext = A100 40 GB,
quad = Quadro RTX 6000, azure = V100 32 GB (ND40rs_v2).

For every app, local batch size and ordered pair of types (from, to) with a
one-GPU step time (placement "1") on both, the prior
(`slurm_elastico.shapes.type_speed.estimate`, training, fp32: the apps'
profiles are fp32 training as far as their scripts say) predicts the speed on
`to` from the measured speed on `from`; the error is log(predicted / true).
Then the online rule: from two measured types, each third one. Nothing here
feeds back into the constants: the profiles are the evaluation, and every
constant of the prior states its own source.

Prints a table per (from, to): median |error| (as a ratio), the fraction of
cases within 1 sigma and 2 sigma (a calibrated sigma covers about 68 % and
95 %); then one line of JSON with the summary.
"""

from __future__ import annotations

import argparse
import csv
import itertools
import json
import math
import statistics
import sys
from pathlib import Path

from slurm_elastico.shapes.gpu_types import KNOWN
from slurm_elastico.shapes.type_speed import estimate

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_PROFILES = ROOT.parent / "shared" / "peers" / "sia" / "profiles"
SIA_TYPES = {"aws": "t4", "rtx": "rtx-2080-ti", "dgx-ext": "a100-40gb", "quad": "quadro-rtx-6000", "azure": "v100-32gb"}
"""Sia's type names -> this project's GPU table (Sia's README)."""


def read_speeds(profiles: Path, quick: bool) -> dict[tuple[str, int], dict[str, float]]:
    """(app, local batch) -> {Sia type: one-GPU samples/s}, from every `placements-<type>.csv` with placement 1."""
    out: dict[tuple[str, int], dict[str, float]] = {}
    for app_dir in sorted(p for p in profiles.iterdir() if p.is_dir()):
        for sia in SIA_TYPES:
            path = app_dir / f"placements-{sia}.csv"
            if not path.is_file():
                continue
            with path.open(newline="") as f:
                for row in csv.DictReader(f):
                    if row.get("placement", "").strip() != "1":
                        continue
                    bsz, step = int(float(row["local_bsz"])), float(row["step_time"])
                    if step > 0:
                        out.setdefault((app_dir.name, bsz), {})[sia] = bsz / step
    if quick:  # one batch size per app: the middle of those measured on the most types
        keep = {}
        for app in sorted({a for a, _ in out}):
            mine = {b: v for (a, b), v in out.items() if a == app}
            most = max(len(v) for v in mine.values())
            sizes = sorted(b for b, v in mine.items() if len(v) == most)
            keep[(app, sizes[len(sizes) // 2])] = mine[sizes[len(sizes) // 2]]
        out = keep
    return out


def evaluate(speeds: dict[tuple[str, int], dict[str, float]], anchors: int) -> dict[tuple[str, str], list[tuple[float, float]]]:
    """(from types joined by +, to) -> [(log error, sigma)] over apps and batch sizes."""
    specs = {t: KNOWN[name] for t, name in SIA_TYPES.items()}
    found: dict[tuple[str, str], list[tuple[float, float]]] = {}
    for (app, bsz), by_type in sorted(speeds.items()):
        for dst in sorted(by_type):
            for src in itertools.combinations(sorted(t for t in by_type if t != dst), anchors):
                est = estimate({t: by_type[t] for t in src}, dst, specs, "train", "fp32")
                found.setdefault(("+".join(src), dst), []).append((math.log(est.value / by_type[dst]), est.sigma))
    return found


def naive_errors(speeds: dict[tuple[str, int], dict[str, float]]) -> list[float]:
    """|log error| of assuming a job runs equally fast on every type (what a type-blind scheduler assumes)."""
    return [abs(math.log(v[b] / v[a])) for v in speeds.values() for a in v for b in v if a != b]


def summary(cases: list[tuple[float, float]]) -> dict:
    errs = [abs(e) for e, _ in cases]
    return {"n": len(cases), "median_ratio_error": math.exp(statistics.median(errs)) - 1.0,
            "median_abs_log_error": statistics.median(errs),
            "mean_abs_log_error": statistics.fmean(errs), "bias_log": statistics.fmean(e for e, _ in cases),
            "within_1_sigma": sum(abs(e) <= s for e, s in cases) / len(cases),
            "within_2_sigma": sum(abs(e) <= 2 * s for e, s in cases) / len(cases),
            "median_sigma": statistics.median(s for _, s in cases)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profiles", type=Path, default=None,
                    help="a directory of per-type profiles in Sia's layout (default ../shared/peers/sia/profiles "
                         "beside the repository; without it the benchmark says it was not run)")
    ap.add_argument("--quick", action="store_true", help="one local batch size per app")
    args = ap.parse_args(argv)
    profiles = args.profiles or DEFAULT_PROFILES
    if not profiles.is_dir():
        why = f"no profiles directory {profiles}; give --profiles DIR (Sia's layout, not bundled)"
        if args.profiles is not None:
            ap.error(f"--profiles: {why}")
        print(f"type_prior: not run ({why})")
        print(json.dumps({"quick": args.quick, "not_run": why}, sort_keys=True))
        return 0
    speeds = read_speeds(profiles, args.quick)
    result: dict = {"quick": args.quick, "apps": sorted({a for a, _ in speeds}), "app_batches": len(speeds),
                    "naive_median_abs_log_error": statistics.median(naive_errors(speeds))}
    for anchors in (1, 2):
        found = evaluate(speeds, anchors)
        every = [c for cases in found.values() for c in cases]
        print(f"\nfrom {anchors} measured type(s): predicted / true speed on another type "
              f"({len(every)} cases, {len(speeds)} app x batch)")
        print(f"{'from':>16} {'to':>8} {'n':>4} {'median err':>10} {'bias':>7} {'in 1 sigma':>10} {'in 2 sigma':>10} {'sigma':>6}")
        for (src, dst), cases in sorted(found.items()):
            s = summary(cases)
            print(f"{src:>16} {dst:>8} {s['n']:>4} {s['median_ratio_error']:>9.0%} {math.exp(s['bias_log']) - 1:>+7.0%} "
                  f"{s['within_1_sigma']:>10.0%} {s['within_2_sigma']:>10.0%} {s['median_sigma']:>6.2f}")
        total = summary(every)
        print(f"{'all':>16} {'':>8} {total['n']:>4} {total['median_ratio_error']:>9.0%} "
              f"{math.exp(total['bias_log']) - 1:>+7.0%} {total['within_1_sigma']:>10.0%} "
              f"{total['within_2_sigma']:>10.0%} {total['median_sigma']:>6.2f}")
        print(f"median |log error| {total['median_abs_log_error']:.3f}; assuming every type equally fast: "
              f"{result['naive_median_abs_log_error']:.3f}")
        result[f"anchors_{anchors}"] = {k: round(v, 4) if isinstance(v, float) else v for k, v in total.items()}
    print(f"\nper app, from 1 measured type: {'n':>4} {'median err':>10} {'equal-speed err':>15} {'in 1 sigma':>10}")
    per_app = {}
    for app in result["apps"]:
        mine = {k: v for k, v in speeds.items() if k[0] == app}
        cases = [c for cs in evaluate(mine, 1).values() for c in cs]
        if not cases:
            continue
        s, naive = summary(cases), statistics.median(naive_errors(mine))
        per_app[app] = round(s["median_ratio_error"], 4)
        print(f"{app:>30} {s['n']:>4} {s['median_ratio_error']:>9.0%} {math.exp(naive) - 1:>14.0%} "
              f"{s['within_1_sigma']:>10.0%}")
    result["per_app_median_ratio_error"] = per_app
    print(json.dumps(result, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
