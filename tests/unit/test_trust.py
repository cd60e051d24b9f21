"""Trust boundaries of the helper: families only from elastico-submit's batch scripts, forged rows ignored, rows of
gone jobs forgotten, AdminComment parts of others kept, reports believed only from the job's owner, private state."""

from __future__ import annotations

import dataclasses
import os
import stat

import pytest

from slurm_elastico.errors import ConfigError, SlurmError, SlurmUnavailable, UnknownJobError
from slurm_elastico.helper.executor import keep_others_comments, merged_comment
from slurm_elastico.helper.families import ScriptFamilies
from slurm_elastico.helper.private import make_private, require_private
from slurm_elastico.jobwrap.payload import Payload
from slurm_elastico.jobwrap.script import batch_script
from slurm_elastico.model import Action, ActionKind
from slurm_elastico.runtime.progress import Progress, ReportError, check_owner, progress_path, read_job_reports, write_progress
from slurm_elastico.store import Store
from tests.synthetic import USER, cluster, pending, running, snapshot

FAMILY = """kind: train
global_batch: 32
micro_batches: [8, 32]
precisions: [fp32]
checkpointing: [false]
steps: 100
mps_shares: [25, 100]
default: mb8-fp32-mps25
"""


def elastico_script(spec: str = FAMILY) -> str:
    payload = Payload(script=b"#!/bin/sh\necho hi\n", script_name="job.sh", args=(), family_spec=spec,
                      family_source="/home/u/fam.yaml", gpu_memory_mib=16000, grace_s=5, signal_lead_s=60)
    return batch_script("/usr/bin/python3", "#!/bin/sh\n#SBATCH --time=5\n", payload)


class Scripts:
    """Batch scripts by job id, as `scontrol write batch_script` would give them (a fake for the pure logic)."""

    def __init__(self, scripts: dict[int, str | Exception]):
        self.scripts, self.reads = scripts, []

    def batch_script(self, job_id: int) -> str:
        self.reads.append(job_id)
        value = self.scripts[job_id]
        if isinstance(value, Exception):
            raise value
        return value


def jobs(*ids, submit=1000):
    return [dataclasses.replace(pending(j), submit_time=submit) for j in ids]


@pytest.fixture
def store(tmp_path):
    with Store(tmp_path / "elastico.sqlite") as s:
        yield s


def test_only_jobs_whose_script_elastico_submit_made_get_a_family_and_each_script_is_read_once(store):
    scripts = Scripts({1: elastico_script(), 2: "#!/bin/sh\nsleep 60\n", 3: elastico_script("kind: train\nsteps: -1\n")})
    src = ScriptFamilies(store, scripts, 16000)
    snap = snapshot(cluster(2), jobs(1, 2, 3))
    notes = src.admit(snap, dry_run=False)
    fams, warnings = src.families({1, 2, 3})
    assert set(fams) == {1} and warnings == []
    assert len(notes) == 1 and notes[0].startswith("job 3: family ignored")
    src.admit(snap, dry_run=False)
    assert sorted(scripts.reads) == [1, 2, 3]  # known jobs are not read again
    managed = {r["job_id"]: r["managed"] for r in store.query("SELECT job_id, managed FROM job_admission")}
    assert managed == {1: 1, 2: 0, 3: 0}


def test_a_forged_row_for_a_plain_job_is_never_believed(store):
    # What elastico-submit used to write (and a user could forge): the helper no longer reads it to decide.
    store.execute("INSERT INTO job_family (job_id, spec, source, submitted_at) VALUES (2, ?, 'forged', 0)", (FAMILY,))
    src = ScriptFamilies(store, Scripts({2: "#!/bin/sh\nsleep 60\n"}), 16000)
    src.admit(snapshot(cluster(2), jobs(2)), dry_run=False)
    assert src.families({2}) == ({}, [])


def test_a_reused_job_id_is_a_new_job_and_rows_of_gone_jobs_are_forgotten(store):
    scripts = Scripts({5: elastico_script(), 6: elastico_script()})
    src = ScriptFamilies(store, scripts, 16000)
    src.admit(snapshot(cluster(2), jobs(5, 6)), dry_run=False)
    scripts.scripts[5] = "#!/bin/sh\nsleep 1\n"  # job 5 left; Slurm gave its id to a plain job
    src.admit(snapshot(cluster(2), jobs(5, submit=2000)), dry_run=False)
    assert scripts.reads.count(5) == 2
    assert src.families({5, 6}) == ({}, [])
    assert [tuple(r) for r in store.query("SELECT job_id, submit_time FROM job_admission")] == [(5, 2000)]
    # the history for `elastico report` keeps the managed jobs' kinds
    assert {r["job_id"] for r in store.query("SELECT job_id FROM job_family")} == {5, 6}


def test_a_gone_job_whose_co_location_pair_is_open_keeps_its_family(store):
    src = ScriptFamilies(store, Scripts({7: elastico_script(), 8: elastico_script()}), 16000)
    src.admit(snapshot(cluster(2), jobs(7, 8)), dry_run=False)
    store.execute("INSERT INTO pair_rate VALUES (8, 's', 7, 's', 1.0, 1.0)")
    src.admit(snapshot(cluster(2), jobs(8)), dry_run=False)
    assert set(src.families({7})[0]) == {7}


def test_a_dry_run_reads_scripts_but_writes_nothing(store):
    src = ScriptFamilies(store, Scripts({1: elastico_script()}), 16000)
    src.admit(snapshot(cluster(2), jobs(1)), dry_run=True)
    assert set(src.families({1})[0]) == {1}
    assert store.query("SELECT * FROM job_admission") == []


def test_a_script_slurm_will_not_show_leaves_the_job_alone_and_an_outage_propagates(store):
    refused = SlurmError(["scontrol"], 1, "Access/permission denied")
    src = ScriptFamilies(store, Scripts({1: refused, 2: UnknownJobError(["scontrol"], 1, "Invalid job id")}), 16000)
    notes = src.admit(snapshot(cluster(2), jobs(1, 2)), dry_run=False)
    assert len(notes) == 1 and "job 1: left alone" in notes[0] and "permission denied" in notes[0]
    assert [r["job_id"] for r in store.query("SELECT job_id FROM job_admission")] == [1]  # 2 is tried again later
    down = ScriptFamilies(store, Scripts({3: SlurmUnavailable(["scontrol"], 1, "", "no controller")}), 16000)
    with pytest.raises(SlurmUnavailable):
        down.admit(snapshot(cluster(2), jobs(3)), dry_run=False)


# ----------------------------------------------------------------------------- AdminComment


@pytest.mark.parametrize("current, ours, expected", [
    ("", "elastico:shape=a", "elastico:shape=a"),
    ("site:acct=42", "elastico:shape=a", "elastico:shape=a,site:acct=42"),
    ("elastico:shape=b,elastico:held=1,site: keep  me", "elastico:shape=a", "elastico:shape=a,site: keep  me"),
    ("tiresias:gpu_s=5,x,pollux:top=2", "elastico:shape=a,elastico:held=1", "elastico:shape=a,elastico:held=1,x"),
])
def test_the_admin_comment_keeps_what_others_wrote(current, ours, expected):
    assert merged_comment(current, ours) == expected


def test_a_comment_that_would_change_nothing_is_not_sent():
    acts = [Action(ActionKind.SET_ADMIN_COMMENT, 1, "r", text="elastico:shape=a"),
            Action(ActionKind.SET_ADMIN_COMMENT, 2, "r", text="elastico:shape=a"),
            Action(ActionKind.SET_SHARE, 2, "r", share=50)]
    out = keep_others_comments(acts, {1: "site:x,elastico:shape=b", 2: "elastico:shape=a,site:y"})
    assert [(a.job_id, a.kind, a.text) for a in out] == [
        (1, ActionKind.SET_ADMIN_COMMENT, "elastico:shape=a,site:x"), (2, ActionKind.SET_SHARE, None)]


# ----------------------------------------------------------------------------- reports and state


def test_a_report_is_believed_only_from_the_jobs_owner(tmp_path):
    job = dataclasses.replace(running(7, "n0000", 0, 50), work_dir=str(tmp_path), user=USER)
    path = progress_path(tmp_path, 7)
    check_owner(path, USER)  # no report yet: nothing to refuse
    write_progress(path, Progress(3, 10, 1.0))
    path.parent.chmod(0o755)
    assert list(read_job_reports([job])[0]) == [7]
    with pytest.raises(ReportError, match="unknown on this host"):
        check_owner(path, "no-such-user-elastico")
    path.parent.chmod(0o777)
    found, notes = read_job_reports([job])
    assert found == {} and "group or others may write it" in notes[0]
    path.parent.chmod(0o755)
    if os.geteuid() == 0:  # giving a file away needs root
        os.chown(path, 65534, 65534)
        found, notes = read_job_reports([job])
        assert found == {} and "owned by uid 65534" in notes[0]


def test_the_state_directory_must_be_private(tmp_path):
    state = tmp_path / "state"
    assert make_private(state) == [] and stat.S_IMODE(state.stat().st_mode) == 0o700
    (state / "elastico.sqlite").write_text("")
    (state / "elastico.sqlite").chmod(0o666)
    with pytest.raises(ConfigError, match="lets others write the helper's state"):
        require_private(state)
    (state / "elastico.sqlite").chmod(0o600)
    require_private(state)
    afile = tmp_path / "afile"
    afile.write_text("")
    assert "cannot create the state directory" in make_private(afile)[0]
