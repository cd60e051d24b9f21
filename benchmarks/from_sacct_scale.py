"""`elastico trace from-sacct` on a 10,000-job accounting database: wall time and peak memory.

Run from the repo root, as root, with no other cluster starting or stopping meanwhile:

    python benchmarks/from_sacct_scale.py [--quick] [--jobs N] [--state-dir DIR] [--port-base P]

It starts the local Slurm cluster with accounting (`elastico cluster up --accounting`: real slurmdbd and MariaDB;
a fresh temporary state directory unless --state-dir names one), runs a few real jobs through Slurm (whole GPUs,
MPS shares, a failing one, a CPU-only one, a cancelled pending one) and waits until slurmdbd has recorded them. Then
it loads rows as slurmdbd writes them: the job table's and the step table's rows of those real jobs are cloned by
SQL on the cluster's own database, with new job ids and their times moved back by a few minutes per copy, until the
database holds N jobs (default 10,000) in that window. The columns are read from information_schema, so the same
SQL serves the schemas of Slurm 22.05 and 24.11. Finally it times `elastico trace from-sacct --since --until --json`
over the window as a child process (wall, and peak resident memory from `os.wait4`: the largest of the process and
the sacct commands it waited for) and checks that it saw every run sacct lists over the window (`sacct --parsable2`,
light) and kept or skipped each with a reason. (Copies of the cancelled pending job whose --begin time falls after
the window are not listed by sacct: it takes a job eligible before the window's end.)
Target (issue: what-if and shadow): <= 60 s and <= 1 GiB for 10,000 jobs. `--quick`: 1,000 jobs (its figures are
not the target's). Prints a table and ends with one line of JSON. The cluster is stopped at the end unless it was
already running.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from slurm_elastico.cluster import LocalCluster
from slurm_elastico.slurm.conf import read_cluster_name

BIN = Path(sys.executable).parent
TARGET = {"wall_s": 60.0, "rss_mib": 1024.0}
TEMPLATES = (("--gres=gpu:1", "sleep 1"), ("--gres=gpu:2", "sleep 2"), ("--gres=mps:25", "sleep 1"),
             ("--gres=mps:50", "sleep 2"), ("--gres=gpu:1", "exit 3"), ("--gres=mps:100", "sleep 1"),
             ("", "sleep 1"), ("--gres=gpu:1", "sleep 1"))
"""The real jobs: (sbatch option, program); a failing one and a CPU-only one among them."""
SHIFTED = ("time_submit", "time_eligible", "time_start", "time_end")
"""Timestamps moved back per copy (0 means unset and stays 0); mod_time is the row's write time."""


class Database:
    """The cluster's accounting database through the mariadb client on its socket (as root)."""

    def __init__(self, socket: Path, name: str = "slurm_acct_db"):
        self.argv = ["mariadb", "--no-defaults", "-uroot", f"--socket={socket}", "--batch", "--skip-column-names",
                     name]

    def sql(self, text: str) -> list[list[str]]:
        out = subprocess.run([*self.argv, "-e", text], capture_output=True, text=True, timeout=600)
        if out.returncode:
            raise SystemExit(f"SQL failed: {out.stderr.strip()}\n{text[:500]}")
        return [line.split("\t") for line in out.stdout.splitlines()]

    def columns(self, table: str) -> list[str]:
        return [r[0] for r in self.sql("SELECT column_name FROM information_schema.columns WHERE table_schema = "
                                       f"DATABASE() AND table_name = '{table}' ORDER BY ordinal_position")]


def clone_sql(job_table: str, step_table: str, job_cols: list[str], step_cols: list[str], templates: list[int],
              copies: int, base: int, shift_s: int) -> list[str]:
    """SQL that copies the template jobs' rows `copies` times: template r (0-based) of copy c (1-based) gets the job id
    base + (c - 1) * len(templates) + r and its times - c * shift_s (its steps follow it through the new job_db_inx).
    Helper tables list the copies and the templates' ranks, and are dropped at the end."""
    new_id = f"{base} + (k.c - 1) * {len(templates)} + r.r"
    def moved(col: str, table: str) -> str:
        if col in SHIFTED:
            return f"IF({table}.{col} > 0, {table}.{col} - k.c * {shift_s}, 0)"
        if col == "id_job":
            return new_id
        if col == "mod_time":
            return "UNIX_TIMESTAMP()"
        return f"{table}.`{col}`"

    jcols = [c for c in job_cols if c != "job_db_inx"]
    scols = [c for c in step_cols if c != "job_db_inx"]
    return [
        "DROP TABLE IF EXISTS bench_copies", "CREATE TABLE bench_copies (c INT PRIMARY KEY)",
        "INSERT INTO bench_copies (c) SELECT seq FROM seq_1_to_%d" % copies,
        "DROP TABLE IF EXISTS bench_templates", "CREATE TABLE bench_templates (id_job INT PRIMARY KEY, r INT)",
        "INSERT INTO bench_templates VALUES " + ",".join(f"({j},{i})" for i, j in enumerate(templates)),
        f"INSERT INTO {job_table} ({', '.join(f'`{c}`' for c in jcols)}) SELECT {', '.join(moved(c, 't') for c in jcols)} "
        f"FROM {job_table} t JOIN bench_templates r ON r.id_job = t.id_job JOIN bench_copies k",
        f"INSERT INTO {step_table} (job_db_inx, {', '.join(f'`{c}`' for c in scols)}) SELECT n.job_db_inx, "
        f"{', '.join(moved(c, 's') for c in scols)} FROM {step_table} s JOIN {job_table} t ON "
        f"s.job_db_inx = t.job_db_inx JOIN bench_templates r ON r.id_job = t.id_job JOIN bench_copies k "
        f"JOIN {job_table} n ON n.id_job = {new_id} AND n.time_submit = t.time_submit - k.c * {shift_s}",
        "DROP TABLE bench_copies", "DROP TABLE bench_templates",
    ]


def run_templates(env: dict, work: Path) -> list[int]:
    """Submit the real jobs and a cancelled pending one; wait until slurmdbd shows them all ended."""
    ids = []
    for option, program in TEMPLATES:
        argv = ["sbatch", "--parsable", f"--output={work}/%j.out", *([option] if option else []),
                f"--wrap={program}"]
        ids.append(int(subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60,
                                      check=True).stdout.strip().split(";")[0]))
    held = int(subprocess.run(["sbatch", "--parsable", "--gres=gpu:1", "--begin=now+3600", "--wrap=true"], env=env,
                              capture_output=True, text=True, timeout=60, check=True).stdout.strip().split(";")[0])
    subprocess.run(["scancel", str(held)], env=env, timeout=60, check=True)
    ids.append(held)
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        out = subprocess.run(["sacct", "-n", "-X", "-P", "--format=JobID,State", "--jobs=" + ",".join(map(str, ids))],
                             env=env, capture_output=True, text=True, timeout=60).stdout
        states = dict(line.split("|", 1) for line in out.splitlines() if "|" in line)
        if len(states) == len(ids) and not any(s in ("PENDING", "RUNNING", "COMPLETING") for s in states.values()):
            return ids
        time.sleep(1)
    raise SystemExit(f"the template jobs did not all end within 180 s: {states}")


def settled(db: Database, job_table: str, step_table: str, templates: list[int], timeout: float = 120) -> None:
    """Until slurmdbd has written the templates' rows whole: sacct shows a job ended before its row has its eligible
    time (written later, seen on a freshly started slurmdbd), and its steps may still be on their way."""
    ids = ",".join(map(str, templates))
    last, deadline = None, time.monotonic() + timeout
    while time.monotonic() < deadline:
        now = db.sql(f"SELECT SUM(time_eligible > 0), COUNT(*), (SELECT COUNT(*) FROM {step_table} s JOIN {job_table} t "
                     f"ON s.job_db_inx = t.job_db_inx WHERE t.id_job IN ({ids})) FROM {job_table} WHERE id_job IN ({ids})")[0]
        if now == last and now[0] == now[1] == str(len(templates)):
            return
        last = now
        time.sleep(2)
    raise SystemExit(f"the template jobs' rows were not complete within {timeout:g} s: {last}")


def from_sacct(conf: Path, env: dict, since: str, until: str, out: Path) -> dict:
    argv = [str(BIN / "elastico"), "--config", str(conf), "trace", "from-sacct", "--since", since, "--until", until,
            "--out", str(out), "--json"]
    started = time.monotonic()
    with tempfile.TemporaryFile("w+") as so, tempfile.TemporaryFile("w+") as se:
        proc = subprocess.Popen(argv, env=env, stdout=so, stderr=se, text=True)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.monotonic() - started
        so.seek(0), se.seek(0)
        stdout, stderr = so.read(), se.read()
    lines = [ln for ln in stdout.splitlines() if ln.startswith("{")]
    return {"wall_s": round(wall, 2), "rss_mib": round(usage.ru_maxrss / 1024, 1),
            "rc": os.waitstatus_to_exitcode(status), "summary": json.loads(lines[-1]) if lines else {},
            "stderr": stderr[-1500:]}


def iso(t: int) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(t))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="1,000 jobs (figures not the target's)")
    ap.add_argument("--jobs", type=int, default=None)
    ap.add_argument("--state-dir", default=None, help="the cluster's state directory (default: a fresh one)")
    ap.add_argument("--port-base", type=int, default=None, help="slurmctld port (default 26000 for a fresh cluster)")
    ap.add_argument("--keep", action="store_true", help="leave the cluster running (to look at its database)")
    args = ap.parse_args()
    n = args.jobs or (1000 if args.quick else 10000)
    work = Path(tempfile.mkdtemp(prefix="from-sacct-scale-"))
    port = args.port_base or (None if args.state_dir else 26000)
    cluster = LocalCluster.from_state_dir(args.state_dir or work / "cluster", accounting=True, port_base=port)
    up = cluster.up()
    env = {**os.environ, **cluster.env()}
    try:
        templates = run_templates(env, work)
        db = Database(cluster.layout.mariadb_socket)
        name = read_cluster_name(str(cluster.slurm_conf))
        job_table, step_table = f"{name}_job_table", f"{name}_step_table"
        settled(db, job_table, step_table, templates)
        copies = -(-(n - len(templates)) // len(templates))
        first, last = (int(x) for x in db.sql(f"SELECT MIN(time_submit), MAX(GREATEST(time_end, time_submit)) FROM "
                                              f"{job_table} WHERE id_job IN ({','.join(map(str, templates))})")[0])
        shift_s = max(60, last - first + 5)
        # the copies' ids above every id in the database and the next ones Slurm gives
        base = max(int(db.sql(f"SELECT MAX(id_job) FROM {job_table}")[0][0]), max(templates)) + 1000
        started = time.monotonic()
        for stmt in clone_sql(job_table, step_table, db.columns(job_table), db.columns(step_table), templates,
                              copies, base, shift_s):
            db.sql(stmt)
        load_s = time.monotonic() - started
        since, until = iso(first - copies * shift_s - 60), iso(last + 60)
        made = len(templates) * (copies + 1)
        in_window = int(db.sql(f"SELECT COUNT(*) FROM {job_table} WHERE time_submit BETWEEN {first - copies * shift_s - 60}"
                               f" AND {last + 60}")[0][0])
        conf = work / "elastico.yaml"
        conf.write_text(json.dumps({"state_dir": str(work / "state"), "slurm": {"conf": str(cluster.slurm_conf)}}))
        load = os.getloadavg()[0]
        result = from_sacct(conf, env, since, until, work / "trace.csv")
        # sacct's own answer over the whole period, as text (light): the runs from-sacct must have seen
        listed = subprocess.run(["sacct", "--allusers", "--duplicates", "-X", "-n", "-P", "--format=JobIDRaw,Submit",
                                 f"--starttime={since}", f"--endtime={until}"], env=env, capture_output=True,
                                text=True, timeout=600, check=True).stdout
        expected = len(set(listed.split()))
    finally:
        if not up.already_running and not args.keep:
            cluster.down()
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)  # its cluster's database, logs and trace (hundreds of MiB)
    s = result["summary"]
    skipped = sum((s.get("skipped") or {}).values())
    accounted = s.get("jobs_seen") == s.get("kept", 0) + skipped == expected
    met = accounted and result["rc"] == 0 and result["wall_s"] <= TARGET["wall_s"] and result["rss_mib"] <= TARGET["rss_mib"]
    print(f"{len(templates)} real jobs cloned {copies} times by SQL in {load_s:.1f} s: {made} jobs made, "
          f"{in_window} submitted in the window {since} .. {until}; load {load:.2f} (1-min) before from-sacct")
    print(f"{'from-sacct':<12} {'wall s':>7} {'RSS MiB':>8} {'seen':>7} {'kept':>7} {'skipped':>8}")
    print(f"{'':<12} {result['wall_s']:>7.2f} {result['rss_mib']:>8.1f} {s.get('jobs_seen', 0):>7} "
          f"{s.get('kept', 0):>7} {skipped:>8}")
    print(f"skipped by reason: {s.get('skipped')}; every run sacct lists ({expected}) seen, each kept or "
          f"skipped: {accounted}")
    if result["rc"]:
        print(f"exit {result['rc']}: {result['stderr']}")
    print(f"target (10,000 jobs): <= {TARGET['wall_s']:g} s and <= {TARGET['rss_mib']:g} MiB: "
          + ("met" if met else "missed") + ("" if n >= 10000 else f" (only {n} jobs: not the target's figures)"))
    print(json.dumps({"benchmark": "from_sacct_scale", "quick": args.quick, "jobs": n, "jobs_made": made, "jobs_in_window": in_window,
                      "templates": len(templates), "copies": copies, "load_s": round(load_s, 1),
                      "load_1min": round(load, 2), "wall_s": result["wall_s"], "rss_mib": result["rss_mib"],
                      "rc": result["rc"], "jobs_seen": s.get("jobs_seen"), "sacct_lists": expected, "kept": s.get("kept"),
                      "skipped": s.get("skipped"), "all_accounted": accounted, "target": TARGET,
                      "target_met": met and n >= 10000}))


if __name__ == "__main__":
    main()
