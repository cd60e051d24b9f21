"""elastico-run's supervisor with real child processes and real signals, but a scripted shape source instead of Slurm."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from contextlib import ExitStack
from pathlib import Path

import pytest

from slurm_elastico.cli.run import run_embedded
from slurm_elastico.errors import ConfigError, SlurmError
from slurm_elastico.jobwrap.job import OWN_LINGER_S, CkptDirBusy, ckpt_dir, ckpt_lock, fresh_ckpt_dir
from slurm_elastico.jobwrap.payload import Payload
from slurm_elastico.jobwrap.shape import Found, JobShapes, choose_shape, family_from_spec
from slurm_elastico.jobwrap.supervisor import MAX_QUICK_RELAUNCHES, Supervisor
from slurm_elastico.model import JobState, JobView
from slurm_elastico.shapes.current import named_in_comment as shape_name_from_comment

FAMILY = """kind: train
global_batch: 32
micro_batches: [8, 16, 32]
precisions: [fp32]
checkpointing: [false, true]
steps: 20
mps_shares: [25, 50]
default: mb8-fp32-mps25
"""

# The stand-in user program: records each launch's shape, then follows its mode.
PROGRAM = r"""
import json, os, signal, sys, time
log, mode = sys.argv[1], sys.argv[2]
runs = open(log).read().count("\n") if os.path.exists(log) else 0
with open(log, "a") as f:
    f.write(json.dumps({"shape": os.environ.get("ELASTICO_SHAPE"), "micro": os.environ.get("ELASTICO_MICRO_BATCH")}) + "\n")
asked = []
signal.signal(signal.SIGUSR1, lambda s, f: asked.append(s))
if mode == "ignore-term":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
else:
    signal.signal(signal.SIGTERM, lambda s, f: asked.append(s))
open(log + ".ready", "w").close()
if mode == "fail":
    sys.exit(3)
if mode == "quick75":
    sys.exit(75)
if mode == "done-second" and runs >= 1:
    sys.exit(0)
if mode == "done-at-mb16" and os.environ.get("ELASTICO_MICRO_BATCH") == "16":
    sys.exit(0)
offer = os.path.join(os.environ.get("ELASTICO_CKPT_DIR", "."), "next-shape.json")
deadline = time.time() + 20
while time.time() < deadline:
    if asked:
        os.unlink(log + ".ready")
        sys.exit(75)
    if mode.startswith("take-offer") and os.path.exists(offer):  # as runtime.train takes a new batch in process
        with open(log + ".offer", "w") as f:
            f.write(open(offer).read())
        os.unlink(offer)
        os.unlink(log + ".ready")
        if mode == "take-offer":
            sys.exit(0)
        time.sleep(0.2)
        open(log + ".ready", "w").close()  # "take-offer-wait": ready for the next signal
    time.sleep(0.02)
sys.exit(9)
"""


@pytest.fixture
def family():
    return family_from_spec(FAMILY, "test family", 81920)


def shape(family, name):
    return next(s for s in family[1] if s.name == name)


class Script:
    """A scripted shape source: returns the given Founds in turn, the last one forever."""

    def __init__(self, *found: Found):
        self.found, self.calls = list(found), 0

    def __call__(self) -> Found:
        self.calls += 1
        return self.found.pop(0) if len(self.found) > 1 else self.found[0]


def make(tmp_path, family, source, mode, grace_s=5.0, requeues=None):
    prog = tmp_path / "prog.py"
    prog.write_text(PROGRAM)
    log = tmp_path / "launches.jsonl"
    messages: list[str] = []
    env = {**os.environ, "ELASTICO_CKPT_DIR": str(tmp_path / "ckpt")}
    sup = Supervisor([sys.executable, str(prog), str(log), mode], family[0], source, env,
                     grace_s=grace_s, lead_s=60, requeue=lambda: requeues.append(1) if requeues is not None else None,
                     log=messages.append)
    return sup, log, messages


def signal_when_ready(log: Path, sig: int, times: int = 1) -> threading.Thread:
    """Send `sig` to this process (the supervisor) each time the program says it is ready, `times` times."""
    def go():
        for _ in range(times):
            deadline = time.time() + 15
            while not Path(str(log) + ".ready").exists() and time.time() < deadline:
                time.sleep(0.02)
            os.kill(os.getpid(), sig)
            while Path(str(log) + ".ready").exists() and time.time() < deadline:
                time.sleep(0.02)
    t = threading.Thread(target=go, daemon=True)
    t.start()
    return t


def launches(log: Path) -> list[str]:
    return [json.loads(line)["shape"] for line in log.read_text().splitlines()]


def test_program_that_finishes_runs_once_with_the_shape_exported(tmp_path, family):
    a = shape(family, "mb16-fp32-mps25")
    sup, log, _ = make(tmp_path, family, Script(Found(a, "AdminComment")), "done-second")
    log.write_text("{}\n")  # pretend it ran before: exits 0 at once
    assert sup.run() == 0
    assert json.loads(log.read_text().splitlines()[-1]) == {"shape": "mb16-fp32-mps25", "micro": "16"}


def test_each_launch_is_watched_by_a_counter_recorder_stopped_when_the_program_exits(tmp_path, family):
    a, b = shape(family, "mb8-fp32-mps25"), shape(family, "mb32-fp32-mps25")
    sup, log, _ = make(tmp_path, family, Script(Found(a, "default", 25), Found(b, "AdminComment", 25)), "done-second")
    recorders = []

    class Recorder:
        def __init__(self, pid):
            self.pid, self.alive_at_start, self.stopped = pid, _alive(pid), False
            recorders.append(self)

        def stop(self):
            self.stopped = True

    sup.counters = Recorder
    signal_when_ready(log, signal.SIGUSR1)
    assert sup.run() == 0
    assert len(recorders) == 2 and recorders[0].pid != recorders[1].pid  # one per launch, of that launch's program
    assert all(r.alive_at_start and r.stopped for r in recorders)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_usr1_with_a_new_shape_at_the_same_share_relaunches_in_place(tmp_path, family):
    a, b = shape(family, "mb8-fp32-mps25"), shape(family, "mb32-fp32-mps25")
    sup, log, messages = make(tmp_path, family, Script(Found(a, "default", 25), Found(b, "AdminComment", 25)), "done-second")
    signal_when_ready(log, signal.SIGUSR1)
    assert sup.run() == 0
    assert launches(log) == ["mb8-fp32-mps25", "mb32-fp32-mps25"]
    assert any("reshape in place" in m for m in messages)


def test_usr1_with_a_shape_needing_another_share_keeps_the_old_shape(tmp_path, family):
    a, b = shape(family, "mb8-fp32-mps25"), shape(family, "mb8-fp32-mps50")
    sup, log, messages = make(tmp_path, family, Script(Found(a, "default", 25), Found(b, "AdminComment", 25)), "done-second")
    signal_when_ready(log, signal.SIGUSR1)
    assert sup.run() == 0
    assert launches(log) == ["mb8-fp32-mps25", "mb8-fp32-mps25"]
    assert any("a requeue moves it" in m for m in messages)


ADAPTIVE = """kind: train
global_batch: 8
micro_batches: [8]
precisions: [fp32]
checkpointing: [false]
steps: 20
mps_shares: [50, 100]
batch: {adaptive: true, min: 8, max: 32, lr_scaling: adascale}
default: mb8-fp32-mps50
"""


def test_usr1_with_a_new_batch_on_the_same_share_is_handed_to_the_running_goodput_program(tmp_path):
    fam = family_from_spec(ADAPTIVE, "adaptive family", 81920)
    a, b, c = shape(fam, "mb8-fp32-mps50"), shape(fam, "gb32-mb8-fp32-mps50"), shape(fam, "gb32-mb8-fp32-mps100")
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / "next-shape.json").write_text("{}")  # an offer an earlier run never took: removed
    sup, log, messages = make(tmp_path, fam, Script(Found(a, "default", 50), Found(b, "AdminComment", 50)),
                              "take-offer")
    signal_when_ready(log, signal.SIGUSR1)
    assert sup.run() == 0
    assert launches(log) == ["mb8-fp32-mps50"]  # no relaunch
    offered = json.loads(Path(str(log) + ".offer").read_text())
    assert (offered["ELASTICO_SHAPE"], offered["ELASTICO_GLOBAL_BATCH"], offered["ELASTICO_ACCUMULATION"]) == (
        "gb32-mb8-fp32-mps50", "32", "4")
    assert any("new batch in process: mb8-fp32-mps50 -> gb32-mb8-fp32-mps50" in m for m in messages)
    # A new batch on another share is no switch in process: the USR1 goes to the program, as always.
    (tmp_path / "launches.jsonl").unlink()
    sup, log, messages = make(tmp_path, fam, Script(Found(a, "default", 50), Found(c, "AdminComment", 50)),
                              "done-second")
    signal_when_ready(log, signal.SIGUSR1)
    assert sup.run() == 0
    assert launches(log) == ["mb8-fp32-mps50", "mb8-fp32-mps50"] and not any("in process" in m for m in messages)


def test_the_time_limit_warning_after_a_new_batch_in_process_still_requeues_the_job(tmp_path):
    fam = family_from_spec(ADAPTIVE, "adaptive family", 81920)
    a, b = shape(fam, "mb8-fp32-mps50"), shape(fam, "gb32-mb8-fp32-mps50")
    requeues: list[int] = []
    sup, log, messages = make(tmp_path, fam, Script(Found(a, "default", 50, 3600, 0), Found(b, "AdminComment", 50, 3600, 100),
                                                    Found(b, "AdminComment", 50, 50, 550)), "take-offer-wait",
                              requeues=requeues)
    signal_when_ready(log, signal.SIGUSR1, times=2)
    assert sup.run() == 75
    # the program runs the new batch when the warning comes: checkpointed and requeued, not relaunched
    assert requeues == [1] and launches(log) == ["mb8-fp32-mps50"]
    assert any("new batch in process" in m for m in messages) and not any("reshape in place" in m for m in messages)


def test_usr1_near_the_time_limit_requeues_the_job(tmp_path, family):
    a = shape(family, "mb8-fp32-mps25")
    requeues: list[int] = []
    sup, log, messages = make(tmp_path, family, Script(Found(a, "default", 25, 3600, 0), Found(a, "default", 25, 50, 550)),
                              "loop", requeues=requeues)
    signal_when_ready(log, signal.SIGUSR1)
    assert sup.run() == 75
    assert requeues == [1] and launches(log) == ["mb8-fp32-mps25"]


def test_early_time_limit_warning_does_not_requeue_a_job_that_just_started(tmp_path, family):
    a = shape(family, "mb8-fp32-mps25")
    requeues: list[int] = []
    sup, log, messages = make(tmp_path, family, Script(Found(a, "default", 25, 100, 200), Found(a, "default", 25, 50, 10)),
                              "done-second", requeues=requeues)
    signal_when_ready(log, signal.SIGUSR1)
    assert sup.run() == 0
    assert requeues == [] and launches(log) == ["mb8-fp32-mps25", "mb8-fp32-mps25"]
    assert any("after only 10 s" in m for m in messages)


def test_usr1_far_from_the_time_limit_relaunches_the_same_shape(tmp_path, family):
    a = shape(family, "mb8-fp32-mps25")
    requeues: list[int] = []
    sup, log, _ = make(tmp_path, family, Script(Found(a, "default", 25, None)), "done-second", requeues=requeues)
    signal_when_ready(log, signal.SIGUSR1)
    assert sup.run() == 0
    assert requeues == [] and launches(log) == ["mb8-fp32-mps25", "mb8-fp32-mps25"]


def test_usr1_between_two_runs_reaches_the_next_run(tmp_path, family):
    a, b = shape(family, "mb8-fp32-mps25"), shape(family, "mb16-fp32-mps25")
    sup, log, messages = make(tmp_path, family, Script(Found(a, "default", 25), Found(b, "AdminComment", 25)), "done-at-mb16")
    sup.pending.append(signal.SIGUSR1)  # as if it arrived while no program ran
    t0 = time.monotonic()
    assert sup.run() == 0
    assert time.monotonic() - t0 < 10  # the first run did not wait for a signal that never came
    # the first run was stopped at once (perhaps before it could log); the second ran the new shape
    assert launches(log)[-1] == "mb16-fp32-mps25" and any("reshape in place" in m for m in messages)


def test_sigterm_is_forwarded_and_the_checkpointed_program_is_not_relaunched(tmp_path, family):
    a = shape(family, "mb8-fp32-mps25")
    sup, log, _ = make(tmp_path, family, Script(Found(a, "default")), "loop")
    signal_when_ready(log, signal.SIGTERM)
    assert sup.run() == 75
    assert launches(log) == ["mb8-fp32-mps25"]


def test_program_ignoring_sigterm_is_killed_after_the_grace(tmp_path, family):
    a = shape(family, "mb8-fp32-mps25")
    sup, log, messages = make(tmp_path, family, Script(Found(a, "default")), "ignore-term", grace_s=1.0)
    signal_when_ready(log, signal.SIGTERM)
    t0 = time.monotonic()
    assert sup.run() == 128 + signal.SIGKILL
    assert 1.0 <= time.monotonic() - t0 < 10
    assert any("grace" in m for m in messages)


def test_failure_is_passed_on_and_a_relaunch_loop_gives_up(tmp_path, family):
    a = shape(family, "mb8-fp32-mps25")
    sup, log, _ = make(tmp_path, family, Script(Found(a, "default")), "fail")
    assert sup.run() == 3 and len(launches(log)) == 1
    (tmp_path / "quick").mkdir()
    sup, log2, messages = make(tmp_path / "quick", family, Script(Found(a, "default")), "quick75")
    assert sup.run() == 75
    assert len(launches(log2)) == MAX_QUICK_RELAUNCHES + 1
    assert "giving up" in messages[-1]


# ----------------------------------------------------------------------------- shape lookup


class FakeGateway:
    def __init__(self, *views_or_errors):
        self.items = list(views_or_errors)

    def job(self, job_id):
        item = self.items.pop(0)
        if isinstance(item, Exception):
            raise item
        return item


def view(comment: str, share: int = 25) -> JobView:
    from slurm_elastico.model import GresRequest

    return JobView(job_id=5, name="j", user="u", partition="p", state=JobState.RUNNING, admin_comment=comment,
                   gres=GresRequest("mps", share), end_time=int(time.time()) + 100, time_limit_s=600)


def test_shape_comes_from_the_admin_comment_else_the_default(family):
    fam, candidates = family
    assert shape_name_from_comment("x=1,elastico:shape=mb16-fp32-ckpt-mps50, y") == "mb16-fp32-ckpt-mps50"
    assert choose_shape(fam, candidates, "elastico:shape=mb32-fp32-mps25")[0].name == "mb32-fp32-mps25"
    s, origin = choose_shape(fam, candidates, "elastico:shape=mb7-fp99")
    assert s.name == "mb8-fp32-mps25" and "unknown shape" in origin
    assert choose_shape(fam, candidates, "")[0].name == "mb8-fp32-mps25"


def test_job_shapes_retries_then_falls_back_to_the_default(family):
    err = SlurmError(["squeue"], 1, "down")
    found = JobShapes(family[0], family[1], 5, FakeGateway(err, view("elastico:shape=mb16-fp32-mps50", 50)),
                      log=print, sleep=lambda s: None)()
    assert (found.shape.name, found.allocated_share) == ("mb16-fp32-mps50", 50)
    assert 50 < found.remaining_s <= 100
    messages: list[str] = []
    found = JobShapes(family[0], family[1], 5, FakeGateway(err, err, err), log=messages.append, sleep=lambda s: None)()
    assert found.shape.name == "mb8-fp32-mps25" and "cannot read job 5" in messages[0]


def test_candidates_include_shapes_the_pareto_front_dropped(family):
    fam, candidates = family
    assert {s.name for s in fam.shapes} < {s.name for s in candidates}


def test_ckpt_dir_is_per_job_under_the_submit_dir_unless_set():
    assert ckpt_dir({"SLURM_JOB_ID": "12", "SLURM_SUBMIT_DIR": "/home/u/w"}) == "/home/u/w/.elastico/12"
    assert ckpt_dir({"SLURM_JOB_ID": "12", "ELASTICO_CKPT_DIR": "/c"}) == "/c"


def test_a_first_start_moves_aside_another_jobs_files_under_the_same_id(tmp_path):
    """Slurm gives an id again once its state is reset: job 12's first start found the checkpoints of an earlier
    job 12 in its per-job directory, resumed them and ended at once, having trained nothing (and pruned them)."""
    env = {"SLURM_JOB_ID": "12", "SLURM_SUBMIT_DIR": str(tmp_path)}
    old = tmp_path / ".elastico" / "12"
    old.mkdir(parents=True)
    (old / "step-0000000010.manifest.json").write_text("{}")
    said: list[str] = []
    got = fresh_ckpt_dir(env, said.append, now=1000.0)
    assert got == str(old) and old.is_dir() and not any(old.iterdir())
    aside = tmp_path / ".elastico" / "12.stale-1000"
    assert (aside / "step-0000000010.manifest.json").exists() and "moved to" in said[0]
    # A restart of the job (a requeue) resumes its own; a directory the user names is resumed as it is.
    (old / "step-0000000020.manifest.json").write_text("{}")
    assert fresh_ckpt_dir({**env, "SLURM_RESTART_COUNT": "1"}, said.append) == str(old) and any(old.iterdir())
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "x").write_text("")
    assert fresh_ckpt_dir({**env, "ELASTICO_CKPT_DIR": str(mine)}, said.append) == str(mine) and (mine / "x").exists()
    assert len(said) == 1


def _embedded(tmp_path, name: str, ckpt: Path, body: str) -> subprocess.Popen:
    """A real elastico-run of a generated batch script (`run_embedded`) running `body`, outside Slurm."""
    script = (f"#!{sys.executable}\nimport os, pathlib, sys, time\nd = pathlib.Path(os.environ['ELASTICO_CKPT_DIR'])\n"
              + body)
    blob = Payload(script=script.encode(), script_name=f"{name}.py", args=(), family_spec=FAMILY,
                   family_source="f.yaml", gpu_memory_mib=81920, grace_s=5, signal_lead_s=60).encode()
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")} | {"ELASTICO_CKPT_DIR": str(ckpt)}
    return subprocess.Popen([sys.executable, "-c", "import sys; from slurm_elastico.cli.run import run_embedded; "
                             f"sys.exit(run_embedded({blob!r}))"], env=env, cwd=tmp_path, stderr=subprocess.PIPE,
                            text=True)


def test_a_second_job_in_a_checkpoint_directory_another_job_runs_in_is_refused_before_it_touches_it(tmp_path):
    """Two jobs exporting one ELASTICO_CKPT_DIR at once resumed and pruned each other's checkpoints: now the second
    one's elastico-run stops with an error naming the directory and the job in it, before its program starts, and
    the first one's files are left as they were. Once the first has ended, the directory is free again."""
    ckpt = tmp_path / "shared"
    first = _embedded(tmp_path, "first", ckpt, "(d / 'step-1.ckpt').write_text('mine')\n"
                      "(d.parent / 'first.ready').touch()\n"
                      "while not (d.parent / 'first.go').exists(): time.sleep(0.05)\n")
    try:
        deadline = time.time() + 60
        while not (tmp_path / "first.ready").exists():
            assert first.poll() is None and time.time() < deadline, first.stderr.read() if first.poll() else "slow"
            time.sleep(0.05)
        second = _embedded(tmp_path, "second", ckpt, "(d / 'step-1.ckpt').write_text('theirs')\n")
        _, err = second.communicate(timeout=60)
        assert second.returncode == 2
        assert f"{ckpt} is in use by job unknown (pid {first.pid} on " in err and "one running job per directory" in err
        assert (ckpt / "step-1.ckpt").read_text() == "mine"
    finally:
        (tmp_path / "first.go").touch()
        first.communicate(timeout=60)
    assert first.returncode == 0
    third = _embedded(tmp_path, "third", ckpt, "(d / 'step-2.ckpt').write_text('later')\n")
    third.communicate(timeout=60)
    assert third.returncode == 0 and (ckpt / "step-2.ckpt").read_text() == "later"


def test_a_start_waits_for_its_own_jobs_earlier_run_to_let_go_of_the_directory(tmp_path):
    """A requeued job's new start may find its old batch step still being killed: it waits for it (up to
    OWN_LINGER_S), where another job's lock is refused at once."""
    said: list[str] = []
    now = [0.0]
    with ExitStack() as old:
        old.enter_context(ckpt_lock(str(tmp_path), {"SLURM_JOB_ID": "7"}, said.append))
        with pytest.raises(CkptDirBusy, match=r"in use by job 7 \(pid \d+ on .*\); two jobs"):
            with ckpt_lock(str(tmp_path), {"SLURM_JOB_ID": "8"}, said.append, clock=lambda: now[0]):
                pass
        assert now[0] == 0.0

        def sleep(s):
            now[0] += s
            if now[0] >= 3:
                old.close()  # the old step ends after 3 s

        with ckpt_lock(str(tmp_path), {"SLURM_JOB_ID": "7"}, said.append, clock=lambda: now[0], sleep=sleep):
            assert now[0] == 3.0
    with ExitStack() as old:
        old.enter_context(ckpt_lock(str(tmp_path), {"SLURM_JOB_ID": "7"}, said.append))
        now[0] = 0.0
        with pytest.raises(CkptDirBusy, match=rf"in use by job 7 .* for over {OWN_LINGER_S:.0f} s"):
            with ckpt_lock(str(tmp_path), {"SLURM_JOB_ID": "7"}, said.append, clock=lambda: now[0],
                           sleep=lambda s: now.__setitem__(0, now[0] + s)):
                pass
        assert now[0] >= OWN_LINGER_S
    assert said == []


def test_another_user_continuing_in_a_shared_checkpoint_directory_is_not_refused():
    """Review finding: the lock file the first user's job made (0644 under its umask) could not be opened for
    writing by a second user continuing the work in the same group-writable directory: refused, exit 2, though
    nothing ran there. The lock is made 0666 now (its owner's next job sets that on an older one); one this user
    still may not write is refused naming its owner and the fix, not locked read-only (its stale record would
    name the wrong job)."""
    import shutil
    import tempfile
    said: list[str] = []
    tmp_path = Path(tempfile.mkdtemp())  # not under pytest's own 0700 directory: the other user must reach it
    try:
        _shared_directory(tmp_path, said)
    finally:
        shutil.rmtree(tmp_path, ignore_errors=True)


def _shared_directory(tmp_path: Path, said: list[str]) -> None:
    import stat
    lock = tmp_path / ".elastico-run.lock"
    lock.write_text("")
    lock.chmod(0o644)  # as an older version, or a stricter umask, left it
    with ckpt_lock(str(tmp_path), {"SLURM_JOB_ID": "11"}, said.append):
        pass
    assert stat.S_IMODE(lock.stat().st_mode) == 0o666  # its owner's job set it
    if os.geteuid() == 0:  # another user (root may write any file): 0666 lets it in, 0644 is refused with the fix
        tmp_path.chmod(0o777)
        os.chown(lock, 12345, 12345)
        script = ("import os, sys\nfrom slurm_elastico.jobwrap.job import ckpt_lock\n"  # imports before the uid
                  "os.setgid(65534); os.setuid(65534)\n"
                  f"with ckpt_lock({str(tmp_path)!r}, {{'SLURM_JOB_ID': '12'}}, print): print('ran')\n")
        done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
        assert done.returncode == 0 and "ran" in done.stdout, done.stderr
        lock.chmod(0o644)
        done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
        assert done.returncode != 0 and "ran" not in done.stdout
        assert "it is uid 12345's" in done.stderr and "chmod 0666" in done.stderr, done.stderr
    else:  # this user may not write it
        lock.chmod(0o444)
        with pytest.raises(ConfigError, match="chmod 0666"):
            with ckpt_lock(str(tmp_path), {"SLURM_JOB_ID": "12"}, said.append):
                pass
    assert said == []


def test_the_helpers_lock_files_are_its_own():
    """Anyone who can open a lock file can take it: the helper's are 0600, so no user can hold the helper off."""
    import stat
    import tempfile
    from slurm_elastico.helper.lock import helper_lock
    with tempfile.TemporaryDirectory() as d:
        run, state = Path(d) / "run", Path(d) / "state"
        run.mkdir()
        (run / "alpha.lock").write_text("")
        (run / "alpha.lock").chmod(0o644)  # as an older version left it
        with helper_lock("alpha", state, run):
            pass
        assert {stat.S_IMODE(p.stat().st_mode) for p in (run / "alpha.lock", state / "sched.lock")} == {0o600}


def test_run_embedded_gives_the_program_its_exact_argv_outside_slurm(tmp_path, monkeypatch):
    hostile = ["it's \"q\"; $(touch x) `id`", "ünï ✓\nsecond", "", "--family", "*"]
    out = tmp_path / "argv.json"
    script = f"#!{sys.executable}\nimport json, os, sys\njson.dump([sys.argv[1:], os.environ['ELASTICO_SHAPE']], open({str(out)!r}, 'w'))\n"
    p = Payload(script=script.encode(), script_name="job.py", args=tuple(hostile), family_spec=FAMILY,
                family_source="f.yaml", gpu_memory_mib=81920, grace_s=5, signal_lead_s=60)
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    monkeypatch.setenv("ELASTICO_CKPT_DIR", str(tmp_path / "ck"))
    assert run_embedded(p.encode()) == 0
    assert json.loads(out.read_text()) == [hostile, "mb8-fp32-mps25"]


def test_run_embedded_refuses_a_damaged_payload(capsys):
    assert run_embedded("not base64!") == 2
    assert "unreadable" in capsys.readouterr().err


def test_a_named_shape_for_another_share_is_not_run(family):
    """A stale AdminComment (a plan whose share change failed) must not put a shape's knobs on the wrong share."""
    fam, candidates = family
    named = "elastico:shape=mb32-fp32-mps25"
    assert choose_shape(fam, candidates, named, 25)[0].name == "mb32-fp32-mps25"
    s, origin = choose_shape(fam, candidates, named, 50)
    assert s.resources.mps == 50 and "needs share 25" in origin


def test_a_job_whose_request_names_no_type_runs_its_nodes_types_shape():
    # An untyped mps:100 job Slurm started on a T4 node of a t4+a100 cluster, with no AdminComment yet or a stale
    # one naming an A100 shape: it runs a T4 shape (bf16 or an A100's memory would not suit the T4).
    from slurm_elastico.jobwrap.shape import family_from_spec

    text = (Path(__file__).resolve().parents[2] / "wrappers" / "examples" / "train_tiny.family.yaml").read_text()
    fam, candidates = family_from_spec(text, "x", 16384, (("t4", 15360), ("a100", 40960)))

    class OnType(FakeGateway):
        def job_on_type(self, job_id):
            return self.job(job_id), "t4"

    for comment in ("", "elastico:shape=" + next(c.name for c in candidates if c.gpu_type == "a100")):
        found = JobShapes(fam, candidates, 5, OnType(view(comment, share=100)), log=print, sleep=lambda s: None)()
        assert found.shape.gpu_type == "t4", (comment, found)
