"""Trust on the real local cluster: the helper acts only on jobs elastico-submit made, whoever submits them.

A plain sbatch job given a forged family row (what elastico-submit used to
write into the helper's store) is never touched. A non-root user created here
submits with elastico-submit, writing nothing of the helper's, and the helper
(root, private state) reads the family from the job's batch script and sets
the job's share. The user is removed afterwards. For the user to run the
project's interpreter and reach the cluster's config and munge socket, the
directories above them get the search bit (o+x) for the test's duration only;
their modes are put back afterwards.
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import stat
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path

import pytest

from slurm_elastico.model import JobState
from slurm_elastico.store import Store

from live_helpers import BIN, PLANNED_FAMILY, wait_for

pytestmark = pytest.mark.live

JOB = "#!/bin/bash\nsleep 30\n"


def sched_once(conf: Path, env: dict[str, str]) -> dict:
    run = subprocess.run([str(BIN / "elastico"), "--config", str(conf), "sched", "--once", "--json"],
                         env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    return json.loads(run.stdout.strip().splitlines()[-1])


@pytest.fixture
def helper(slurm_env, tmp_path):
    """The helper's config (state private to root in pytest's own directory) and an environment for Slurm."""
    conf = tmp_path / "elastico.yaml"
    conf.write_text(json.dumps({"state_dir": str(tmp_path / "state"), "slurm": {"conf": slurm_env["SLURM_CONF"]},
                                "gpu": {"memory_mib": 16000}}))
    env = {**os.environ, **slurm_env}
    ids: list[int] = []
    yield conf, env, ids
    if ids:
        subprocess.run(["scancel", *map(str, ids)], env=env, capture_output=True, timeout=30)


def test_a_plain_sbatch_job_with_a_forged_family_row_is_never_touched(helper, gateway, tmp_path):
    conf, env, ids = helper
    script = tmp_path / "plain.sh"
    script.write_text(JOB)
    out = subprocess.run(["sbatch", "--parsable", "--gres=mps:25", "--begin=now+600", f"--output={tmp_path}/%j.out",
                          str(script)], env=env, capture_output=True, text=True, timeout=30, check=True)
    job_id = int(out.stdout.strip().split(";")[0])
    ids.append(job_id)
    with Store(tmp_path / "state" / "elastico.sqlite") as store:  # the row elastico-submit used to write
        store.execute("INSERT INTO job_family (job_id, spec, source, submitted_at) VALUES (?, ?, 'forged', 0)",
                      (job_id, PLANNED_FAMILY))
    for _ in range(2):
        epoch = sched_once(conf, env)
        assert [a for a in epoch["actions"] if a["job_id"] == job_id] == []
    view = gateway.job(job_id)
    assert (view.state, view.mps_share, view.admin_comment) == (JobState.PENDING, 25, "")
    with Store(tmp_path / "state" / "elastico.sqlite") as store:
        row = store.query("SELECT managed FROM job_admission WHERE job_id = ?", (job_id,))
    assert [r["managed"] for r in row] == [0]  # its script was read once: not elastico-submit's


def _searchable(paths: list[Path]) -> list[tuple[Path, int]]:
    """Give every directory above `paths` the search bit for others; returns what to put back."""
    changed = []
    for path in paths:
        for d in [*reversed(path.parents)]:
            mode = d.stat().st_mode
            if not mode & stat.S_IXOTH:
                changed.append((d, stat.S_IMODE(mode)))
                d.chmod(stat.S_IMODE(mode) | stat.S_IXOTH)
    return changed


@pytest.fixture
def user():
    """A fresh non-root user (no home directory); removed afterwards with whatever jobs it left."""
    if shutil.which("useradd") is None:
        pytest.fail("useradd is missing: the trust test needs to create a non-root user (Debian's passwd package)")
    name = f"elastico-t{uuid.uuid4().hex[:8]}"
    subprocess.run(["useradd", "--no-create-home", "--shell", "/bin/sh", name], check=True, capture_output=True,
                   timeout=30)
    try:
        yield pwd.getpwnam(name)
    finally:
        subprocess.run(["scancel", f"--user={name}"], capture_output=True, timeout=30)
        subprocess.run(["userdel", name], capture_output=True, timeout=30)


def test_a_non_root_user_submits_with_elastico_submit_and_the_helper_manages_the_job(helper, gateway, user,
                                                                                     slurm_cluster):
    conf, env, ids = helper
    work = Path(tempfile.mkdtemp(prefix="elastico-trust-"))
    restore = _searchable([Path(sys.executable).resolve(), Path(env["SLURM_CONF"]), work])
    try:
        work.chmod(0o755)
        os.chown(work, user.pw_uid, user.pw_gid)
        (work / "fam.yaml").write_text(PLANNED_FAMILY)
        (work / "job.sh").write_text(JOB)
        (work / "elastico.yaml").write_text("submit: {placement_window_s: 600}\n")
        for p in ("fam.yaml", "job.sh", "elastico.yaml"):
            (work / p).chmod(0o644)
        user_env = {k: v for k, v in env.items() if not k.startswith("ELASTICO_")}
        user_env.update(ELASTICO_CONFIG=str(work / "elastico.yaml"), HOME=str(work), USER=user.pw_name)
        done = subprocess.run(["runuser", "-u", user.pw_name, "--", str(BIN / "elastico-submit"), "--parsable",
                               f"--output={work}/%j.out", "--family", "fam.yaml", "job.sh"],
                              cwd=work, env=user_env, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        assert "warning" not in done.stderr, done.stderr
        job_id = int(done.stdout.strip().split(";")[0])
        ids.append(job_id)
        view = gateway.job(job_id)
        assert view.user == user.pw_name and view.state is JobState.PENDING and view.mps_share == 25
        epoch = sched_once(conf, env)
        mine = {a["kind"]: a for a in epoch["actions"] if a["job_id"] == job_id}
        assert mine["set_share"]["share"] == 100 and all(a["status"] == "done" for a in mine.values()), mine
        view = wait_for(lambda: (v := gateway.job(job_id)).mps_share == 100 and v, "the job's share set to 100", 30)
        assert view.admin_comment.startswith("elastico:shape=mb")
        state = Path(json.loads(conf.read_text())["state_dir"])
        assert stat.S_IMODE(state.stat().st_mode) == 0o700
        assert stat.S_IMODE((state / "elastico.sqlite").stat().st_mode) & 0o077 == 0, "the helper's store is private"
    finally:
        for d, mode in reversed(restore):
            d.chmod(mode)
        shutil.rmtree(work, ignore_errors=True)
