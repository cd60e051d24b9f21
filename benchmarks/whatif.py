"""What-if fidelity on the local cluster's own accounting: does the replay reproduce what Slurm did, and does the
what-if on the demo's plain pass predict the elastico pass it ran beside?

Run from the repo root:

    python benchmarks/whatif.py [--quick] [--comparison FILE] [--state-dir DIR]

It reads a demo's comparison.json (`make demo` / `elastico demo` writes one and
leaves the cluster running; default: the newest under the cluster's state
directory, $ELASTICO_CLUSTER_DIR or the default one) and runs, on the cluster
that is still up, `elastico whatif --since --until --partition` over the plain
pass's window (`plain_pass` in the comparison), with the demo's helper settings
(its elastico.yaml; epoch 3 s and at most 2 GPUs a job, as the demo's helper
and families): the replay's start-time errors (median, p90) and mean-wait
ratio against what the real Slurm did, and the predicted JCT ratio plain /
elastico under each assumption (gpu-count: the default, none, and families from
the demo's own job names) beside the ratio the demo measured live.

Without a running cluster or a comparison with `plain_pass` it runs nothing
and says why ("not run"), and still ends with its JSON line. `--quick` skips
the `none` and `families` assumptions (under a minute either way). Targets
(issue: what-if): median start error <= 5 s, mean wait within 15 % (null
in the JSON when the plain pass did not queue: a mean wait of 0 has no ratio;
the demo's heavier list queues), predicted ratio within 15 % of the measured
one. Prints a table, then one line of JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from slurm_elastico import jsonout
from slurm_elastico.cluster import LocalCluster
from slurm_elastico.cluster.demo_figures import matched_line, shadow_line

BIN = Path(sys.executable).parent
TARGETS = {"median_start_error_s": 5.0, "mean_wait_ratio": 0.15, "predicted_ratio": 0.15}


def newest_comparison(state_dir: Path) -> Path | None:
    found = sorted((state_dir / "demo").glob("*/comparison.json"))
    return found[-1] if found else None


def demo_families(path: Path) -> Path:
    """The families file the demo's own job names give (`demo_workload.APPS`: app and global batch; inference)."""
    from slurm_elastico.cluster.demo_workload import APPS

    spec = {f"demo-*-train-{app}-*": {"kind": "train", "app": app, "global_batch": batch} for app, batch, _ in APPS}
    spec["demo-*-infer-*"] = {"kind": "infer"}
    path.write_text(json.dumps(spec))
    return path


def whatif(env: dict, conf: Path, window: dict, *extra: str) -> dict:
    argv = [str(BIN / "elastico"), "--config", str(conf), "whatif", "--since", window["since"], "--until",
            window["until"], "--epoch-s", "3", "--max-gpus", "2", "--json", *extra]
    if window.get("partition"):
        argv += ["--partition", window["partition"]]
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=300)
    if done.returncode != 0:
        raise RuntimeError(f"elastico whatif failed ({done.returncode}): {done.stderr.strip()[-2000:]}")
    print(done.stdout.rstrip())
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="the default assumption only")
    ap.add_argument("--comparison", type=Path, default=None, help="a demo's comparison.json (default: the newest)")
    ap.add_argument("--state-dir", default=None, help="the local cluster's state directory")
    args = ap.parse_args()
    cluster = LocalCluster.from_state_dir(args.state_dir, accounting=True)
    comparison = args.comparison or newest_comparison(cluster.state_dir)
    # The demo run by its name only (its directory's): the JSON line is kept in the docs, without this machine's paths.
    out: dict = {"status": "not run", "reason": "", "demo": comparison.parent.name if comparison else None}
    data = json.loads(comparison.read_text()) if comparison and comparison.is_file() else None
    if data is None:
        out["reason"] = "no demo comparison.json in the local cluster's state directory (run make demo)"
        print(f"whatif: looked in {cluster.state_dir / 'demo'}")
    elif "plain_pass" not in data:
        out["reason"] = (f"demo {comparison.parent.name}'s comparison.json has no plain_pass (written before the demo "
                         "recorded it; run make demo again)")
    elif not cluster.status().running:
        out["reason"] = "the local cluster is not running (make demo leaves it up)"
        print(f"whatif: the cluster in {cluster.state_dir} is not running")
    if out["reason"]:
        print(f"whatif: not run: {out['reason']}")
        print(jsonout.dumps(out))
        return 0
    env = {**os.environ, **cluster.env()}
    conf = Path(data["work"]) / "elastico.yaml"
    window = data["plain_pass"]
    measured = data["ratio"]["measured"]
    runs = {"gpu-count": whatif(env, conf, window)}
    if not args.quick:
        runs["none"] = whatif(env, conf, window, "--assume", "none")
        with tempfile.TemporaryDirectory() as tmp:
            runs["families"] = whatif(env, conf, window, "--assume", "families",
                                      str(demo_families(Path(tmp) / "families.json")))
    rep = runs["gpu-count"]["replay"]
    print()
    print(f"plain pass {window['since']} .. {window['until']}, partition {window['partition'] or '(all)'}; "
          f"demo {comparison.parent.name}")
    print(f"  replay: {rep['compared']} jobs, start error median {rep['median_start_error_s']} s, p90 "
          f"{rep['p90_start_error_s']} s, max {rep['max_start_error_s']} s; mean wait simulated "
          f"{rep['mean_wait_simulated_s']} s / measured {rep['mean_wait_actual_s']} s = "
          f"{rep['mean_wait_ratio'] if rep['mean_wait_actual_s'] else 'no ratio (the plain pass did not queue)'}")
    print(f"  {'assumption':12} {'predicted':>10} {'range':>16} {'measured':>9} {'miss':>7}")
    for name, r in runs.items():
        p = r["predicted_ratio"]
        lo, hi = r["predicted_ratio_range"]
        print(f"  {name:12} {p:>10.2f} {f'{lo:.2f}-{hi:.2f}':>16} {measured:>9.2f} {100 * (p / measured - 1):>+6.0f}%")
    shadow = data.get("shadow_pass")
    if shadow:
        print(f"  shadow pass: Slurm changes {shadow['slurm_changes']} (epochs), {shadow['slurmctld_changes']} "
              f"(slurmctld's log), {shadow.get('job_records_changed', 'not read')} (scontrol show job); "
              f"{shadow_line(shadow['agreement'])}")
        if "matched" in shadow:
            print(f"  {matched_line(shadow['matched'])}")
        if "agreement_where_slurm_moved_nothing" in shadow:
            still = shadow_line(shadow["agreement_where_slurm_moved_nothing"])
            print(f"  the {shadow['pairs_where_slurm_moved_nothing']} of {shadow['shadow_epochs']} pairs where Slurm "
                  f"moved no job before the acting epoch acted: {still}")
    else:
        print("  shadow pass: not in this demo (run elastico demo --shadow-pass)")
    wait_ratio = rep["mean_wait_ratio"]
    out.update({
        "status": "run", "plain_pass": window, "slurm_version": data.get("slurm_version"),
        "replay": rep, "measured_ratio": measured,
        # The demo's own simulator on the same run (in process, from its job list), and how late its live jobs ended
        # beside their emulated GPUs: a loaded machine slows the elastico pass beyond what any simulator predicts.
        "demo_simulated_ratio": data["ratio"].get("simulated"), "demo_ended_late_s": data.get("ended_late_s"),
        "predicted_ratio": {k: r["predicted_ratio"] for k, r in runs.items()},
        "predicted_ratio_range": {k: r["predicted_ratio_range"] for k, r in runs.items()},
        "skipped": runs["gpu-count"]["skipped"],
        "table": {k: runs["gpu-count"][k] for k in ("measured", "static", "elastico")},  # the default's side by side
        "shadow_pass": shadow,
        "targets": {
            "median_start_error_s": rep["median_start_error_s"] is not None
            and rep["median_start_error_s"] <= TARGETS["median_start_error_s"],
            "mean_wait_within_15pct": None if not rep["mean_wait_actual_s"] else
            wait_ratio is not None and abs(wait_ratio - 1) <= TARGETS["mean_wait_ratio"],
            "predicted_within_15pct": abs(runs["gpu-count"]["predicted_ratio"] / measured - 1)
            <= TARGETS["predicted_ratio"],
            "shadow_changes_nothing_and_agrees": None if not shadow else
            shadow["slurm_changes"] == 0 and shadow["slurmctld_changes"] == 0
            and shadow.get("job_records_changed") == 0 and shadow["agreement"]["agree"]}})
    print(jsonout.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
