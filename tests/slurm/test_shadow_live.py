"""`elastico sched --shadow --once --json` against the real local cluster: it lists what the acting helper would do
and changes no job.

Jobs queued (held back by a BeginTime, as elastico-submit's placement window does) and running (on a quarter
GPU, requeueable: the plan moves them to a whole GPU). Every job's `scontrol show job` is compared before and
after the shadow epoch, and slurmctld's log must show no update, requeue, signal, hold or release in that time.
Then one acting epoch on the same jobs: it must take the actions the shadow epoch listed, and the same checks must
see its changes (so they can fail).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from slurm_elastico.model import JobState
from slurm_elastico.helper.shadow import SLURMCTLD_CHANGES
from slurm_elastico.slurm.gateway import SlurmGateway
from slurm_elastico.slurm.runner import SubprocessRunner
from slurm_elastico.store import Store

from live_helpers import PLANNED_FAMILY

pytestmark = pytest.mark.live

JOB = """#!/bin/bash
sleep 300
"""
VOLATILE = {"RunTime", "LastSchedEval", "last_sched_evaluation"}
"""Fields that change with time alone (a running job's run time, the scheduler's last look at a pending job)."""


def env_with(slurm_env):
    return {**os.environ, **slurm_env}


def elastico(*args: str) -> subprocess.CompletedProcess:
    exe = Path(sys.executable).with_name("elastico")
    return subprocess.run([str(exe), *args], capture_output=True, text=True, timeout=180)


def jobs_as_slurm_shows_them(slurm_env, ids) -> dict[int, dict]:
    """`scontrol show job --json` of each job (24.11); on 22.05, which has no --json there, its one-line form."""
    env = env_with(slurm_env)
    out = subprocess.run(["scontrol", "show", "job", "--json"], env=env, capture_output=True, text=True, timeout=30)
    if out.returncode == 0 and out.stdout.lstrip().startswith("{"):
        return {j["job_id"]: {k: v for k, v in j.items() if k not in VOLATILE}
                for j in json.loads(out.stdout)["jobs"] if j["job_id"] in ids}
    shown = {}
    for i in ids:
        line = subprocess.run(["scontrol", "show", "job", "--oneliner", "--details", str(i)], env=env,
                              capture_output=True, text=True, timeout=30, check=True).stdout
        fields = dict(re.findall(r"(\S+?)=(\S*)", line))
        shown[i] = {k: v for k, v in fields.items() if k not in VOLATILE}
    return shown


def steady(slurm_env, ids, timeout=30.0) -> dict[int, dict]:
    """The jobs as Slurm shows them once two reads a second apart agree: slurmctld's first scheduling pass of a new
    job sets fields of its own (AccrueTime, Reason), which must not be taken for the helper's doing."""
    last = jobs_as_slurm_shows_them(slurm_env, ids)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        time.sleep(1.0)
        now = jobs_as_slurm_shows_them(slurm_env, ids)
        if now == last:
            return now
        last = now
    raise AssertionError(f"the jobs' records did not settle within {timeout:g} s: {last}")


@pytest.fixture
def setup(slurm_cluster, slurm_env, tmp_path):
    conf = tmp_path / "elastico.yaml"
    conf.write_text(json.dumps({"state_dir": str(tmp_path / "state"), "slurm": {"conf": slurm_env["SLURM_CONF"]},
                                "gpu": {"memory_mib": 16000}, "helper": {"mode": "shadow"}}))
    fams = tmp_path / "families"
    fams.mkdir()
    script = tmp_path / "job.sh"
    script.write_text(JOB)
    ids: list[int] = []

    def submit(*opts: str) -> int:
        out = subprocess.run(["sbatch", "--parsable", f"--output={tmp_path}/%j.out", *opts, str(script)],
                             env=env_with(slurm_env), capture_output=True, text=True, timeout=30, check=True)
        job_id = int(out.stdout.strip().split(";")[0])
        ids.append(job_id)
        (fams / f"{job_id}.yaml").write_text(PLANNED_FAMILY)
        return job_id

    log = slurm_cluster.layout.log_file("slurmctld")
    yield conf, fams, submit, tmp_path, log, ids
    if ids:
        subprocess.run(["scancel", *map(str, ids)], env=env_with(slurm_env), capture_output=True, timeout=30)


def test_a_shadow_epoch_lists_the_acting_helpers_actions_and_changes_no_job(setup, slurm_env):
    conf, fams, submit, tmp, log, ids = setup
    gw = SlurmGateway(SubprocessRunner(env=slurm_env))
    running = [submit("--gres=mps:25", "--requeue") for _ in range(2)]
    queued = [submit("--gres=mps:25", "--begin=now+600", "--requeue") for _ in range(3)]
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not all(gw.job(i).state is JobState.RUNNING for i in running):
        time.sleep(0.3)
    assert all(gw.job(i).state is JobState.RUNNING for i in running)
    assert all(gw.job(i).state is JobState.PENDING for i in queued)
    before = steady(slurm_env, set(ids))  # and slurmctld's scheduling passes of the new jobs are logged before it
    log_from = log.stat().st_size
    started = time.monotonic()
    shadow = elastico("--config", str(conf), "sched", "--shadow", "--once", "--json", "--families", str(fams))
    wall = time.monotonic() - started
    assert shadow.returncode == 0, shadow.stderr
    epoch = json.loads(shadow.stdout.strip().splitlines()[-1])
    logged = log.read_text(errors="replace")[log_from:]
    after = jobs_as_slurm_shows_them(slurm_env, set(ids))
    assert epoch["mode"] == "shadow" and epoch["slurm_changes"] == 0
    assert {a["status"] for a in epoch["actions"]} == {"shadow"}
    touched = {a["job_id"] for a in epoch["actions"]}
    assert set(queued) <= touched and set(running) <= touched, epoch["actions"]
    kinds = {a["kind"] for a in epoch["actions"]}
    assert {"set_share", "reshape_running", "set_admin_comment"} <= kinds, kinds
    assert all(a["argv"] for a in epoch["actions"]) and any(a["predicted_gain_s"] for a in epoch["actions"])
    changed = {i: {k: (before[i].get(k), after[i].get(k)) for k in before[i].keys() | after[i].keys()
                   if before[i].get(k) != after[i].get(k)} for i in ids}
    assert {i: c for i, c in changed.items() if c} == {}, "the shadow epoch changed no job"
    assert [line for line in logged.splitlines() if SLURMCTLD_CHANGES.search(line)] == [], "slurmctld logged no change"
    with Store(tmp / "state" / "elastico.sqlite") as store:
        assert store.query("SELECT COUNT(*) AS n FROM journal")[0]["n"] == 0  # the acting journal is untouched
        shadow_rows = store.query("SELECT COUNT(*) AS n FROM shadow_journal")[0]["n"]
    assert shadow_rows == len(epoch["actions"])
    report = elastico("--config", str(conf), "report", "--shadow", "--format", "json")
    assert report.returncode == 0, report.stderr
    summary = json.loads(report.stdout)
    assert set(summary["jobs_touched"]) == touched and summary["actions"]["total"] == len(epoch["actions"])
    print(f"shadow epoch: {len(epoch['actions'])} actions on {len(touched)} jobs, {wall:.2f} s wall")

    # The control: the acting helper on the same jobs takes those actions, and the checks above see it.
    log_from = log.stat().st_size
    act = elastico("--config", str(conf), "sched", "--act", "--once", "--json", "--families", str(fams))
    assert act.returncode == 0, act.stderr
    acting = json.loads(act.stdout.strip().splitlines()[-1])
    assert acting["mode"] == "act" and acting["slurm_changes"] > 0

    def decisions(e):
        return sorted((a["job_id"], a["kind"], a["share"], a["gpus"], tuple(a["nodes"]), a["shape"])
                      for a in e["actions"])

    assert decisions(acting) == decisions(epoch), "the shadow epoch listed what the acting helper did"
    assert {a["status"] for a in acting["actions"]} == {"done"}
    assert any(SLURMCTLD_CHANGES.search(line) for line in log.read_text(errors="replace")[log_from:].splitlines())
    now = jobs_as_slurm_shows_them(slurm_env, set(ids))
    assert any(now[i] != after[i] for i in queued)


def test_helper_mode_shadow_reads_elastico_submit_families_through_the_guard_and_repeats_its_plan(slurm_cluster,
                                                                                                  tmp_path):
    from live_helpers import Cluster, epoch

    c = Cluster(dict(slurm_cluster.env()), tmp_path / "c", {"f.yaml": PLANNED_FAMILY}, config="helper: {mode: shadow}\n")
    script = tmp_path / "c" / "job.sh"
    script.write_text(JOB)
    try:
        ids = [c.submit("f.yaml", script, options=("--gres=mps:25", "--begin=now+600")) for _ in range(2)]
        before = steady(dict(slurm_cluster.env()), set(ids))
        first, second = epoch(c), epoch(c)  # the config key alone: no --shadow on the command line
        after = jobs_as_slurm_shows_them(dict(slurm_cluster.env()), set(ids))
        for e in (first, second):
            assert e["mode"] == "shadow" and e["slurm_changes"] == 0
            assert {a["job_id"] for a in e["actions"]} == set(ids), e["actions"]
        # Nothing happened, so the second epoch proposes the same (an acting one would wait for its starts).
        assert [(a["job_id"], a["kind"], a["share"]) for a in second["actions"]] == \
               [(a["job_id"], a["kind"], a["share"]) for a in first["actions"]]
        changed = {i: {k: (before[i].get(k), after[i].get(k)) for k in before[i].keys() | after[i].keys()
                       if before[i].get(k) != after[i].get(k)} for i in ids}
        assert {i: d for i, d in changed.items() if d} == {}, "the shadow epochs changed no job"
        with c.store() as store:
            managed = {r["job_id"] for r in store.query("SELECT job_id FROM job_admission WHERE managed = 1")}
        assert managed == set(ids)  # each batch script was read (scontrol write batch_script JOB -) and kept
    finally:
        c.cancel_all()


def test_the_demos_paired_epoch_checks_the_shadow_epoch_and_sees_the_acting_ones_changes(slurm_cluster, tmp_path):
    """`demo_shadow.PairedHelper.pair` on real jobs: the shadow epoch changes no record and logs no change, and the
    acting epoch right after it takes what the shadow journal listed, which the same record check sees."""
    from live_helpers import Cluster

    from slurm_elastico.cluster import demo_shadow

    c = Cluster(dict(slurm_cluster.env()), tmp_path / "c", {"f.yaml": PLANNED_FAMILY})
    script = tmp_path / "c" / "job.sh"
    script.write_text(JOB)
    try:
        ids = [c.submit("f.yaml", script, options=("--gres=mps:25", "--begin=now+600")) for _ in range(2)]
        steady(dict(slurm_cluster.env()), set(ids))  # slurmctld's own first pass over the new jobs is done
        paired = demo_shadow.PairedHelper(c.env, 3.0, tmp_path / "c", slurm_cluster.layout.log_file("slurmctld"))
        pair = paired.pair()
        assert pair.changed == {} and pair.logged == [] and pair.shadow_changes == 0 and not pair.outage
        assert not pair.acting_failed and {j for j, _ in pair.acting} == set(ids), pair.acting
        assert pair.acting_changed == len(ids)  # the control: the acting epoch's changes are seen
        with c.store() as store:
            (journaled,) = demo_shadow.journal_pairs(store, [pair])
        assert demo_shadow.matched([pair], [journaled])["share_matched"] == 1.0, (journaled, pair.acting)
    finally:
        c.cancel_all()
