"""The helper at a real cluster's scale: one `elastico sched --once` epoch over 2,000 queued or running jobs.

Run from the repo root, as root, with no other cluster starting or stopping meanwhile:

    python benchmarks/helper_scale.py [--quick] [--jobs N] [--state-dir DIR] [--port-base P]

It starts the local Slurm cluster (`elastico cluster up`: 4 nodes x 4 fake GPUs, 100 MPS shares each; in a fresh
temporary state directory unless --state-dir names one) and submits N jobs (default 2,000): training and inference
families (five variants of the bundled examples' families: other global batches, steps and requests) through
elastico-submit (with --distinct-families every job has its own family text, as when no two jobs share a
family file: the helper then builds every job's family; by default jobs share five texts, as a user's jobs
submitted with one family file do), and one job in fifty as a plain sbatch job (held back by an hour's --begin, as they would
otherwise take the GPUs the moment they are submitted). elastico-submit is called in-process: the function
`slurm_elastico.cli.submit.submit(argv)` is exactly what the `elastico-submit` command runs (its `main` passes it
sys.argv), so the submissions go the same way (validation, generated batch script, sbatch on stdin) without 2,000
interpreter starts. Each job's program is a shell that sleeps and exits 75 on the reshape signal (elastico-run's
checkpoint contract). The first 8 jobs have no placement window, so Slurm starts them (half the GPUs); the rest have
an hour's window (elastico-submit's --begin), so they stay pending until the helper starts them.

Then it times helper epochs, each a separate `elastico sched --once --json` process: wall time, and peak resident
memory of that process (its VmHWM from /proc, read every 20 ms until it exits; and beside it `os.wait4`'s
ru_maxrss, the largest of the process and the Slurm commands it waited for, whose forks count the parent's pages):
  shadow cold        --shadow, a fresh state directory: the first epoch, which reads new jobs' batch scripts until
                     its reading budget (helper.script_read_budget_s) is spent and defers the rest
  shadow catch-up N  --shadow again, as long as the last epoch deferred some: each reads where the last stopped
  shadow warm        --shadow once every family is read: what every later epoch costs
  act cold, act catch-up N, act warm
                     the same acting, on another fresh state directory, each epoch 15 s after the last (the jobs
                     the one before started launch their wrappers meanwhile)
For each mode it reports the first epoch's wall time and deferred families, and how many epochs (and their summed
wall time) it took until every job's family was read. Target (issue: what-if and shadow): each epoch <= 5 s wall
and <= 500 MiB resident, with 2,000 jobs. Afterwards every submitted job must be accounted for: pending, running or
completed in Slurm, none missing and none left held.
`--quick` submits 300 jobs so it runs in about a minute; its figures are not the target's. Prints a table and ends
with one line of JSON. The cluster is stopped at the end unless it was already running.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from slurm_elastico.cluster import LocalCluster

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
EXAMPLES = ROOT / "wrappers" / "examples"
TARGET = {"wall_s": 5.0, "rss_mib": 500.0}
PROGRAM = "#!/bin/bash\ntrap 'exit 75' USR1 TERM\nsleep 3600 &\nwait\n"
PLAIN_EVERY = 50
RUN_FIRST = 8
CATCH_UP_MAX = 50
"""Epochs after the first that may still find families unread before the run says it never caught up."""
SETTLE_S = 15
"""Before the second acting epoch: the jobs the first one started start their wrappers (a Python interpreter
each), which on a small machine would otherwise be timed as the helper's epoch."""
"""Jobs submitted without a placement window: half the cluster's GPUs busy, room left for the helper."""


def families(workdir: Path) -> list[Path]:
    """A few variants of the bundled training and inference families (other batches, steps and requests)."""
    import yaml

    out = []
    train = yaml.safe_load((EXAMPLES / "train_tiny.family.yaml").read_text())
    infer = yaml.safe_load((EXAMPLES / "infer_tiny.family.yaml").read_text())
    for i, (batch, steps) in enumerate(((32, 200), (64, 1000), (128, 5000))):
        spec = {**train, "name": f"train-{i}", "global_batch": batch, "steps": steps,
                "micro_batches": [m for m in (8, 16, 32, 64) if batch % m == 0]}
        out.append(workdir / f"train-{i}.yaml")
        out[-1].write_text(yaml.safe_dump(spec))
    for i, requests in enumerate((24, 500)):
        out.append(workdir / f"infer-{i}.yaml")
        out[-1].write_text(yaml.safe_dump({**infer, "name": f"infer-{i}", "requests": requests}))
    return out


def submit_all(n: int, workdir: Path, env: dict, confs: tuple[Path, Path], distinct: bool = False
               ) -> tuple[list[int], int, float]:
    """Submit n jobs: through elastico-submit's own function, one in PLAIN_EVERY through sbatch. (ids, plain, s).

    The first RUN_FIRST under `confs[0]` (no placement window: Slurm starts them), the rest under `confs[1]`
    (a window of an hour: pending until the helper starts them)."""
    from slurm_elastico.cli.submit import submit

    script = workdir / "job.sh"
    script.write_text(PROGRAM)
    fams = families(workdir)
    ids, plain, started = [], 0, time.monotonic()
    out_opt = f"--output={workdir / 'out'}/%j.out"
    (workdir / "out").mkdir(exist_ok=True)
    for i in range(n):
        if i % PLAIN_EVERY == PLAIN_EVERY - 1:
            done = subprocess.run(["sbatch", "--parsable", out_opt, "--gres=mps:25", "--begin=now+3600", str(script)],
                                  env=env,
                                  capture_output=True, text=True, timeout=60, check=True)
            text, plain = done.stdout, plain + 1
        else:
            buf, err = io.StringIO(), io.StringIO()
            env["ELASTICO_CONFIG"] = str(confs[0] if i < RUN_FIRST else confs[1])
            fam = fams[i % len(fams)]
            if distinct:  # this job's own text: the same family with its own step or request count
                own = workdir / "own" / f"{i}.yaml"
                own.parent.mkdir(exist_ok=True)
                text = fam.read_text()
                own.write_text(text.replace("steps: ", f"steps: {i + 1}", 1) if "steps: " in text
                               else text.replace("requests: ", f"requests: {i + 1}", 1))
                fam = own
            code = submit(["--parsable", out_opt, "--family", str(fam), str(script)], env=env,
                          out=buf, err=err)
            if code != 0:
                raise SystemExit(f"elastico-submit failed (exit {code}): {err.getvalue()}")
            text = buf.getvalue()
        ids.append(int(text.strip().split(";")[0]))
        if (i + 1) % 250 == 0:
            print(f"  submitted {i + 1}/{n} ({time.monotonic() - started:.0f} s)", file=sys.stderr, flush=True)
    return ids, plain, time.monotonic() - started


def epoch(conf: Path, env: dict, shadow: bool, profile: Path | None = None) -> dict:
    """One `elastico sched --once --json` (shadow or acting) as a child: wall, peak RSS and its JSON result."""
    argv = [str(BIN / "elastico"), "--config", str(conf), "sched", "--once", "--json",
            "--shadow" if shadow else "--act"]
    if profile is not None:
        argv = [sys.executable, "-m", "cProfile", "-o", str(profile), *argv]
    started = time.monotonic()
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen(argv, env=env, stdout=out, stderr=err, text=True)
        hwm = 0
        while True:  # the helper's own high-water mark (VmHWM), read until it exits
            hwm = max(hwm, own_peak_kib(proc.pid))
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                break
            time.sleep(0.02)
        wall = time.monotonic() - started
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0), err.seek(0)
        stdout, stderr = out.read(), err.read()
    lines = [ln for ln in stdout.splitlines() if ln.startswith("{")]
    result = json.loads(lines[-1]) if lines else {}
    return {"wall_s": round(wall, 2), "rss_mib": round(hwm / 1024, 1),
            "tree_rss_mib": round(usage.ru_maxrss / 1024, 1), "rc": proc.returncode,
            "actions": len(result.get("actions") or result.get("outcomes") or []),
            "slurm_changes": result.get("slurm_changes"), "managed": result.get("managed"),
            "deferred": result.get("families_deferred"),
            "target_met": proc.returncode == 0 and wall <= TARGET["wall_s"] and hwm / 1024 <= TARGET["rss_mib"],
            "stderr": stderr[-2000:] if proc.returncode else ""}


def own_peak_kib(pid: int) -> int:
    """VmHWM of a running process (0 once it is gone)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def accounted(ids: list[int], env: dict) -> dict:
    """Each submitted job as slurmctld knows it (MinJobAge keeps finished ones): counts by state; missing; held."""
    out = subprocess.run(["squeue", "--all", "--states=all", "--noheader", "--format=%i|%T|%r"], env=env,
                         capture_output=True, text=True, timeout=60, check=True).stdout
    seen = {}
    for line in out.splitlines():
        job, state, reason = line.split("|", 2)
        if job.isdigit():
            seen[int(job)] = (state, reason)
    states: dict[str, int] = {}
    for i in ids:
        if i in seen:
            states[seen[i][0]] = states.get(seen[i][0], 0) + 1
    ok = {"PENDING", "RUNNING", "COMPLETED", "COMPLETING", "CONFIGURING"}
    held = sorted(i for i in ids if i in seen and "Held" in seen[i][1])
    return {"states": states, "missing": sorted(set(ids) - set(seen))[:20],
            "missing_count": len(set(ids) - set(seen)), "held": held[:20], "held_count": len(held),
            "other_states": sorted(i for i in ids if i in seen and seen[i][0] not in ok)[:20]}


def config(path: Path, state: Path, slurm_conf: Path, window_s: int = 0, read_budget_s: float | None = None
           ) -> Path:
    helper = {} if read_budget_s is None else {"helper": {"script_read_budget_s": read_budget_s}}
    path.write_text(json.dumps({"state_dir": str(state), "slurm": {"conf": str(slurm_conf)},
                                "gpu": {"memory_mib": 16000}, "submit": {"placement_window_s": window_s}, **helper}))
    return path


def run_mode(mode: str, conf: Path, env: dict, shadow: bool, figures: dict, profile: str | None) -> dict:
    """The cold epoch, the catch-up epochs while families are deferred, then the warm one (into `figures`); the
    mode's summary."""
    def one(name: str) -> dict:
        if not shadow and name != f"{mode} cold":
            time.sleep(SETTLE_S)  # the jobs the last acting epoch started launch their wrappers meanwhile
        prof = Path(f"{profile}-{name.replace(' ', '-')}.prof") if profile else None
        figures[name] = f = epoch(conf, env, shadow, prof)
        if f["rc"] != 0:
            print(f"{name}: exit {f['rc']}: {f['stderr']}", file=sys.stderr)
        return f

    first = one(f"{mode} cold")
    walls, last = [first["wall_s"]], first
    while last["rc"] == 0 and last["deferred"] and len(walls) <= CATCH_UP_MAX:
        last = one(f"{mode} catch-up {len(walls)}")
        walls.append(last["wall_s"])
    caught_up = last["rc"] == 0 and not last["deferred"]
    warm = one(f"{mode} warm")
    return {"first_epoch_wall_s": first["wall_s"], "first_epoch_rss_mib": first["rss_mib"],
            "first_epoch_deferred": first["deferred"], "all_read": caught_up,
            "epochs_until_all_read": len(walls) if caught_up else None,
            "wall_until_all_read_s": round(sum(walls), 2) if caught_up else None,
            "warm_wall_s": warm["wall_s"], "warm_rss_mib": warm["rss_mib"], "managed": warm["managed"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="300 jobs (figures not the target's)")
    ap.add_argument("--jobs", type=int, default=None)
    ap.add_argument("--distinct-families", action="store_true",
                    help="every job its own family text (the helper then parses and builds each job's family)")
    ap.add_argument("--state-dir", default=None, help="the cluster's state directory (default: a fresh one)")
    ap.add_argument("--port-base", type=int, default=None, help="slurmctld port (default 25000 for a fresh cluster)")
    ap.add_argument("--script-read-budget", type=float, default=None, metavar="S",
                    help="the helper's helper.script_read_budget_s (default: the settings' default; 0: no limit)")
    ap.add_argument("--profile", default=None, metavar="PREFIX",
                    help="run each epoch under cProfile, written to PREFIX-<epoch>.prof (its timings then include "
                         "the profiler's cost)")
    args = ap.parse_args()
    n = args.jobs or (300 if args.quick else 2000)
    work = Path(tempfile.mkdtemp(prefix="helper-scale-"))
    port = args.port_base or (None if args.state_dir else 25000)
    cluster = LocalCluster.from_state_dir(args.state_dir or work / "cluster", port_base=port)
    up = cluster.up()
    env = {**os.environ, **cluster.env(), "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"}
    figures: dict[str, dict] = {}
    modes: dict[str, dict] = {}
    ids: list[int] = []
    try:
        confs = (config(work / "submit0.yaml", work / "submit-state", cluster.slurm_conf),
                 config(work / "submit.yaml", work / "submit-state", cluster.slurm_conf, 3600))
        ids, plain, submit_s = submit_all(n, work, env, confs, args.distinct_families)
        time.sleep(3)  # slurmctld's first scheduling passes over the new jobs
        before = accounted(ids, env)
        budget = args.script_read_budget
        shadow_conf = config(work / "shadow.yaml", work / "shadow-state", cluster.slurm_conf, read_budget_s=budget)
        act_conf = config(work / "act.yaml", work / "act-state", cluster.slurm_conf, read_budget_s=budget)
        load = os.getloadavg()[0]
        for mode, conf, shadow in (("shadow", shadow_conf, True), ("act", act_conf, False)):
            modes[mode] = run_mode(mode, conf, env, shadow, figures, args.profile)
        after = accounted(ids, env)
    finally:
        if not up.already_running:
            cluster.down()
        elif ids:  # leave the cluster as it was found
            for i in range(0, len(ids), 500):
                subprocess.run(["scancel", *map(str, ids[i:i + 500])], env=env, capture_output=True, timeout=120)
        if not up.already_running or args.state_dir:  # its cluster (stopped) or only its configs and states
            shutil.rmtree(work, ignore_errors=True)
    met = bool(figures) and all(f["target_met"] for f in figures.values())
    caught_up = all(m["all_read"] for m in modes.values())
    fine = after["missing_count"] == 0 and after["held_count"] == 0 and not after["other_states"]
    print(f"{n} jobs ({n - plain} through elastico-submit, {plain} plain sbatch) submitted in {submit_s:.0f} s; "
          f"load {load:.2f} (1-min) at the first epoch")
    print(f"before the epochs: {before['states']}")
    print(f"{'epoch':<18} {'wall s':>7} {'RSS MiB':>8} {'tree MiB':>9} {'actions':>8} {'changes':>8} "
          f"{'managed':>8} {'deferred':>9} {'target':>7}")
    for name, f in figures.items():
        print(f"{name:<18} {f['wall_s']:>7.2f} {f['rss_mib']:>8.1f} {f['tree_rss_mib']:>9.1f} {f['actions']:>8} "
              f"{str(f['slurm_changes']):>8} {str(f['managed']):>8} {str(f['deferred']):>9} "
              f"{'met' if f['target_met'] else 'missed':>7}")
    for mode, m in modes.items():
        print(f"{mode}: first epoch {m['first_epoch_wall_s']:.2f} s with {m['first_epoch_deferred']} families "
              "deferred; " + (f"every family read after {m['epochs_until_all_read']} epoch(s), "
                              f"{m['wall_until_all_read_s']:.2f} s in all" if m["all_read"] else
                              f"NOT every family read after {CATCH_UP_MAX + 1} epochs")
              + f"; warm epoch {m['warm_wall_s']:.2f} s")
    print(f"after: {after['states']}; missing {after['missing_count']}, held {after['held_count']}, "
          f"other states {after['other_states']}")
    print(f"target (2,000 jobs): <= {TARGET['wall_s']:g} s and <= {TARGET['rss_mib']:g} MiB per epoch: "
          + ("met" if met else "missed") + ("" if n >= 2000 else f" (only {n} jobs: not the target's figures)"))
    print(json.dumps({"benchmark": "helper_scale", "quick": args.quick, "jobs": n, "plain": plain,
                      "distinct_families": args.distinct_families,
                      "script_read_budget_s": args.script_read_budget,
                      "submit_s": round(submit_s, 1), "load_1min": round(load, 2),
                      "epochs": {k: {x: v for x, v in f.items() if x != "stderr"} for k, f in figures.items()},
                      "modes": modes, "all_families_read": caught_up,
                      "accounted": after, "target": TARGET, "target_met": met and n >= 2000,
                      "all_accounted": fine, "self_rusage_mib": round(resource.getrusage(
                          resource.RUSAGE_SELF).ru_maxrss / 1024, 1)}))


if __name__ == "__main__":
    main()
