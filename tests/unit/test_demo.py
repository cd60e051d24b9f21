"""The demo's pure parts: what a reshape changed, from shape names; the side-by-side table; measured figures; the
start-up cost measured on the plain half; the two halves of the cluster; the progress line; the live loop's check
that each run stays on its half (a fake gateway, no cluster)."""

from __future__ import annotations

from collections import Counter

import pytest

from slurm_elastico.cluster import demo, demo_checks, demo_figures, demo_live, demo_shadow, halves
from slurm_elastico.cluster.demo_workload import DemoJob


def test_reshape_kinds_name_what_changed_between_starts():
    got = demo_figures.reshape_kinds(["mb12-fp32-mps100", "mb12-fp32-mps100", "mb6-fp32-mps50", "mb6-fp32-mps100",
                              "mb6-fp32-gpus2"])
    assert got == Counter({"share": 2, "micro-batch": 1, "gpus": 1})
    assert demo_figures.reshape_kinds(["gmu0.9-seqs256-kvauto-mps100", "gmu0.5-seqs64-kvfp8-mps100"]) == Counter(engine=1)
    assert demo_figures.reshape_kinds(["sbatch"]) == Counter()


def test_measured_figures_count_from_submission_and_weigh_utilisation_by_time():
    obs = demo_live.Observed("plain")
    job = DemoJob(0, "train", "bert", 0.0, 10, 12)
    obs.ids = {1: job, 2: job}
    obs.submit, obs.start, obs.end = {1: 0.0, 2: 10.0}, {1: 2.0, 2: 20.0}, {1: 40.0, 2: 50.0}
    obs.samples = [(0.0, 0.5), (20.0, 1.0), (50.0, 0.0)]
    obs.shapes = {1: ["mb12-fp32-mps100"], 2: ["mb12-fp32-mps100", "mb6-fp32-mps50"]}
    f = demo_figures.measured_figures(obs, 16)
    assert (f["mean_jct_s"], f["median_jct_s"], f["mean_wait_s"]) == (40.0, 40.0, 6.0)
    assert f["gpu_util"] == (0.5 * 20 + 1.0 * 30) / 50
    assert (f["restarts"], f["reshape_share"], f["reshape_micro-batch"]) == (1, 1, 1)
    table = demo_figures.comparison_table({"plain (measured)": f, "elastico (measured)": f})
    assert "mean JCT s" in table and "reshapes: share" in table and table.count("40.0") >= 2


def test_the_helpers_settings_are_the_simulators(tmp_path):
    from slurm_elastico import config
    from slurm_elastico.cluster import demo_workload

    plan = demo_workload.Plan()
    path = tmp_path / "elastico.yaml"
    (tmp_path / "slurm.conf").touch()  # the settings check that the cluster's slurm.conf exists
    path.write_text(demo.settings_yaml(tmp_path / "state", tmp_path / "slurm.conf", plan, "demo-elastico"))
    live = config.load(path)
    assert live.slurm.partition == "demo-elastico"  # the helper manages its half only (planner.epoch)
    planned = demo_workload.settings(plan)
    assert (live.gpu, live.planner, live.interference) == (planned.gpu, planned.planner, planned.interference)
    assert live.planner.reshape_cost_s == plan.restart_cost_s and live.gpu.type == ""
    assert live.submit.placement_window_s == plan.placement_window_s


def test_a_paced_program_outside_slurm_says_it_needs_a_job(tmp_path):
    import subprocess
    import sys

    from slurm_elastico.cluster import pacing

    env = {k: v for k, v in __import__("os").environ.items() if not k.startswith(("SLURM_", "ELASTICO_"))}
    out = subprocess.run([sys.executable, str(demo_live.PROGRAM["train"]), "--emulate",
                          pacing.Emulated("train", "bert", 12).to_json(), "--pace-dir", str(tmp_path)],
                         env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and "SLURM_JOB_ID" in out.stderr


def test_without_keep_the_cluster_is_stopped_even_when_the_demo_fails(monkeypatch):
    """`elastico demo --down` (keep=False): a demo that fails part-way still stops its cluster, so the next live run
    finds its ports free; with keep the cluster stays up either way."""
    import pytest

    events = []

    class Stub:  # stands for LocalCluster: the control flow only
        state_dir = "unused"

        def up(self):
            events.append("up")
            return type("Up", (), {"version": "slurm-wlm 0", "already_running": True, "seconds": 0.0})()

        def down(self):
            events.append("down")

    def failing(cluster, load, say, began, progress):
        raise demo_checks.DemoError("a job failed")

    monkeypatch.setattr(demo.LocalCluster, "from_state_dir", staticmethod(lambda *a, **k: Stub()))
    monkeypatch.setattr(demo, "_run_on", failing)
    for keep, expected in ((False, ["up", "down"]), (True, ["up"])):
        events.clear()
        with pytest.raises(demo_checks.DemoError, match="a job failed"):
            demo.run(None, say=lambda line: None, keep=keep)
        assert events == expected


def test_the_prediction_simulates_the_slurm_version_it_is_given(monkeypatch):
    # The demo passes the live cluster's version: on 22.05 the simulated Slurm and the planner in it follow 22.05's
    # GPU choice (`sim.cluster`, `planner.gpu_choice`). The real engine runs; the spy only records its settings.
    from slurm_elastico.cluster import demo_workload as w
    from slurm_elastico.sim import engine

    seen, models = [], []
    real = engine.Engine.__init__

    def spy(self, trace, policy, settings, sim, model, *args, **kwargs):
        seen.append((policy, sim.slurm_version))
        models.append(model)
        real(self, trace, policy, settings, sim, model, *args, **kwargs)

    monkeypatch.setattr(engine.Engine, "__init__", spy)
    jobs = w.job_list(train=2, infer=1, gap_s=1.0)
    got = w.predict(jobs, w.Plan(gpus=2), slurm_version="22.05.8")
    assert seen == [("static", "22.05.8"), ("elastico", "22.05.8")]
    assert all(result.unfinished == 0 for result, _ in got.values())
    seen.clear()
    w.predict(jobs, w.Plan(gpus=2))
    assert seen == [("static", "24.11.5"), ("elastico", "24.11.5")]  # the simulator's default
    # The simulated helper plans with the interference model the live helper loads from the same settings (no model
    # file: the contention model), not with none: planned without one it shared GPUs the live helper never did.
    from slurm_elastico.interference import ContentionModel

    assert w.settings(w.Plan()).interference.model == ""
    assert models and all(isinstance(m, ContentionModel) for m in models)


def test_a_run_that_fell_behind_its_emulated_gpus_is_flagged(tmp_path):
    out = tmp_path / "7.out"
    out.write_text('train_paced: shape mb12-fp32-mps100: ...\n{"status": "checkpointed", "ended_late_s": 9.0}\n'
                   'train_paced: shape mb6-fp32-gpus2: ...\n{"status": "done", "step": 60, "ended_late_s": 1.5}\n')
    assert demo_checks.ended_late(out) == 10.5  # the checkpointed run's delay carries over to the relaunched run's end
    assert demo_checks.ended_late(tmp_path / "missing.out") == 0.0
    old = tmp_path / "8.out"
    old.write_text('{"status": "done", "step": 60, "late_s": 2.0}\n')  # a program that does not report it
    with pytest.raises(demo_checks.DemoError, match=r"run\(s\) \[0\] printed no ended_late_s"):
        demo_checks.ended_late(old)
    figures = {"plain": {"mean_jct_s": 50.0}, "elastico": {"mean_jct_s": 40.0}}
    kept = demo_checks.pace_lines({"plain": [0.0, 1.0], "elastico": [1.5, 0.5]}, figures)
    assert len(kept) == 1 and "plain mean 0.5 s, max 1.0 s" in kept[0] and "elastico mean 1.0 s" in kept[0]
    behind = demo_checks.pace_lines({"plain": [0.0, 1.0], "elastico": [10.0, 2.0]}, figures)
    assert len(behind) == 2 and behind[1].startswith("warning: the elastico run did not keep pace")
    assert "15 %" in behind[1]


def test_each_jobs_live_and_simulated_figures_sit_side_by_side():
    from slurm_elastico.cluster import demo_workload as w

    jobs = w.job_list(train=2, infer=1, gap_s=1.0)
    simulated = w.predict(jobs, w.Plan(gpus=2))
    live = {}
    for mode, first in (("plain", 100), ("elastico", 200)):
        obs = demo_live.Observed(mode)
        obs.ids = {first + j.index: j for j in jobs}
        obs.submit = {first + j.index: 10.0 + j.index for j in jobs}
        obs.start = {first + j.index: 12.0 + 2 * j.index for j in jobs}
        obs.end = {first + j.index: 30.0 + 3 * j.index for j in jobs}
        obs.shapes = {first + j.index: [f"s{j.index}"] for j in jobs}
        live[mode] = obs
    rows = demo_figures.per_job(jobs, live, simulated)
    assert [r["job"] for r in rows] == [j.name for j in jobs]
    last = rows[-1]
    assert last["plain"] == {"wait_s": 4.0, "jct_s": 24.0, "shapes": ["s2"]}  # submitted at 12, ran 16 to 36
    sim = next(r for r in simulated["elastico"][0].jobs if r.job_id == 3)
    assert last["elastico (simulated)"]["jct_s"] == sim.jct and last["static (simulated)"]["shapes"]


def test_the_gap_line_splits_the_jobs_that_ran_on_several_gpus():
    def row(plain, static, live, sim, shapes):
        return {"plain": {"jct_s": plain}, "static (simulated)": {"jct_s": static},
                "elastico": {"jct_s": live, "shapes": shapes}, "elastico (simulated)": {"jct_s": sim}}

    rows = [row(41.0, 40.0, 30.0, 22.0, ["mb8-fp32-gpus2"]),
            row(42.0, 40.0, 40.0, 38.0, ["gmu0.9-seqs256-kvfp8-mps100"]),
            row(40.0, 40.0, 50.0, 40.0, ["mb40-fp32-mps100", "mb20-fp32-gpus4"])]
    line = demo_figures.gap_line(rows)
    assert line.endswith("plain +1.0 s mean; elastico +6.7 s mean (+9.0 s for the 2 jobs that ran on several GPUs, "
                         "+2.0 s for the other 1)"), line
    assert demo_figures.gap_line(rows[1:2]).endswith("elastico +2.0 s mean (+2.0 s)")  # none on several GPUs: no "0 jobs"
    rows[1]["elastico (simulated)"]["jct_s"] = None  # a job the simulator did not finish
    assert demo_figures.gap_line(rows).endswith("(+9.0 s for the 2 jobs that ran on several GPUs); 1 simulated job(s) did "
                                        "not finish, left out")


def test_the_start_cost_is_what_plain_jobs_held_their_gpu_beyond_their_work():
    from slurm_elastico.cluster import demo_workload as w
    from slurm_elastico.sim.truth import GroundTruth

    truth, plan = GroundTruth(), w.Plan()
    jobs = w.job_list(train=2, infer=1, gap_s=1.0)
    work = {j.index: w.solo_seconds(truth, j, plan) for j in jobs}
    assert work[0] == pytest.approx(60 / 130, rel=0.05)  # ncf: sub-second on its emulated GPU
    obs = demo_live.Observed("plain")
    obs.ids = {10 + j.index: j for j in jobs}
    obs.start = {10 + j.index: 100.0 for j in jobs}
    obs.end = {10 + j.index: 100.0 + work[j.index] + extra for j, extra in zip(jobs, (1.0, 2.0, 6.0))}
    assert demo_figures.start_cost(obs, truth, plan) == pytest.approx(3.0)
    obs.end = {i: obs.start[i] + work[j.index] - 1.0 for i, j in obs.ids.items()}  # poll noise: never below 0
    assert demo_figures.start_cost(obs, truth, plan) == 0.0


def _node(name, gpus=4, state="idle", partitions=("debug",)):
    from slurm_elastico.model import GpuView, NodeView

    return NodeView(name, state, partitions, 8, 0, 8000, 0, tuple(GpuView(name, i) for i in range(gpus)))


def test_the_cluster_splits_into_two_equal_halves_in_node_order():
    nodes = [_node(n) for n in ("n10", "n2", "n1", "n3")]
    plain, elastico = halves.split(nodes, 8, 4)
    assert (plain.mode, plain.partition, plain.nodes) == ("plain", "demo-plain", ("n1", "n2"))
    assert (elastico.mode, elastico.partition, elastico.nodes) == ("elastico", "demo-elastico", ("n3", "n10"))
    with pytest.raises(halves.HalvesError, match=r"two halves of 2 usable node\(s\) with 4 GPUs.*n3 \(4 GPUs, not "
                                                 r"usable\).*n4 \(2 GPUs\)"):
        halves.split([_node("n1"), _node("n2"), _node("n3", state="down"), _node("n4", gpus=2)], 8, 4)
    with pytest.raises(halves.HalvesError, match="multiple of the GPUs per node"):
        halves.split(nodes, 6, 4)


def test_a_halfs_partition_is_made_or_updated_up_every_time():
    from slurm_elastico.model import PartitionView

    half = halves.Half("elastico", "demo-elastico", ("n3", "n4"))
    assert halves.partition_argv(half, [PartitionView("debug", ("n1", "n2", "n3", "n4"))]) == [
        "scontrol", "create", "PartitionName=demo-elastico", "Nodes=n3,n4", "State=UP", "MaxTime=INFINITE",
        "Default=NO"]
    # Even when it looks right: Slurm 22.05 reads every partition as UP, so one left DOWN is brought up all the same.
    same = halves.partition_argv(half, [PartitionView("demo-elastico", ("n4", "n3"))])
    assert same[:2] == ["scontrol", "update"] and "State=UP" in same
    assert halves.partition_argv(half, [PartitionView("demo-elastico", ("n2", "n3"))])[1] == "update"


def test_the_halves_are_refused_while_an_earlier_demo_left_jobs_in_them(tmp_path):
    from types import SimpleNamespace

    from slurm_elastico.model import JobState, JobView, PartitionView

    nodes = [_node(n, partitions=("debug", "demo-plain")) for n in ("n1", "n2", "n3", "n4")]

    class Gateway:
        def __init__(self, jobs):
            self.jobs, self.ran = jobs, []

        def snapshot(self):
            return SimpleNamespace(nodes=nodes, jobs=self.jobs, partitions=(PartitionView("demo-plain", ("n1", "n2")),))

        def runner(self, argv):
            self.ran.append(argv)
            return SimpleNamespace(returncode=0, stdout="", stderr="")

    others = (JobView(3, "j", "root", "debug", JobState.RUNNING),  # another partition's job
              JobView(4, "j", "root", "demo-elastico", JobState.COMPLETED))  # 22.05 lists ended jobs a while
    gateway = Gateway(others)
    plain, elastico = halves.ensure(gateway, 8, 4)
    assert [argv[1:3] for argv in gateway.ran] == [["update", "PartitionName=demo-plain"],
                                                    ["create", "PartitionName=demo-elastico"]]
    left = (JobView(12, "j", "root", "demo-plain", JobState.RUNNING),
            JobView(11, "j", "root", "debug,demo-elastico", JobState.PENDING))
    gateway = Gateway(others + left)
    with pytest.raises(halves.HalvesError, match=r"still hold 2 job\(s\).*: 11 \(debug,demo-elastico, pending\), 12 "
                                                 r"\(demo-plain, running\);.*scancel 11 12 .*cluster down --state-dir "):
        halves.ensure(gateway, 8, 4, tmp_path)
    assert gateway.ran == []  # nothing changed on the cluster


def test_each_run_submits_to_its_halfs_partition(tmp_path, monkeypatch):
    from slurm_elastico.cluster import demo_workload as w
    from slurm_elastico.sim.truth import GroundTruth

    monkeypatch.setattr(demo_live, "_sbatch", lambda: "sbatch")
    job = w.job_list(train=1, infer=0)[0]
    plain = demo_live.submit_argv(halves.Half("plain", "demo-plain", ("n1",)), job, tmp_path, w.Plan(), GroundTruth())
    assert plain[0] == "sbatch" and "--partition=demo-plain" in plain and "--gres=gpu:1" in plain
    elastic = demo_live.submit_argv(halves.Half("elastico", "demo-elastico", ("n2",)), job, tmp_path, w.Plan(),
                                    GroundTruth())
    assert elastic[0].endswith("elastico-submit") and "--partition=demo-elastico" in elastic
    assert not any(a.startswith("--gres") for a in elastic)  # the family's shapes decide


class _Stream:
    def __init__(self, tty):
        self.text, self.tty = "", tty

    def write(self, s):
        self.text += s

    def flush(self):
        pass

    def isatty(self):
        return self.tty


def test_the_progress_line_rewrites_itself_on_a_terminal_and_prints_every_few_seconds_elsewhere():
    from slurm_elastico.cluster.progress import ProgressLine

    term = _Stream(True)
    line = ProgressLine(term)
    line.update("a")
    line.update("b")
    line.end()
    line.end()  # nothing shown: no second newline
    assert term.text == "\ra\x1b[K\rb\x1b[K\n"
    now = [0.0]
    log = _Stream(False)
    line = ProgressLine(log, every_s=15, clock=lambda: now[0])
    for t, text in ((0, "first"), (5, "skipped"), (15, "second"), (29, "skipped"), (31, "third")):
        now[0] = t
        line.update(text)
    line.end()
    assert log.text == "first\nsecond\nthird\n"
    with pytest.raises(ValueError, match="every_s"):
        ProgressLine(log, every_s=0)


def test_the_live_loop_times_each_job_and_refuses_a_job_outside_its_half(tmp_path, monkeypatch):
    from slurm_elastico.cluster import demo_workload as w
    from slurm_elastico.model import JobState, JobView
    from slurm_elastico.sim.truth import GroundTruth

    job = w.job_list(train=1, infer=0)[0]
    half = halves.Half("plain", "demo-plain", ("n1",))
    monkeypatch.setattr(demo_live, "submit_argv", lambda *a: ["sbatch"])
    monkeypatch.setattr(demo_live, "_submit_at", lambda due, argv, env, cwd, job, stop, quiet: (7, 0.0, 0.1))
    monkeypatch.setattr(demo_live.time, "sleep", lambda s: None)

    class Gateway:
        def __init__(self, answers):
            self.answers = list(answers)

        def jobs(self):
            return self.answers.pop(0) if self.answers else ()

    def running(node):
        return (JobView(7, "j", "root", "demo-plain", JobState.RUNNING, gpu_alloc=((node, 0, 0),)),)

    args = ([half], [job], tmp_path, {}, None, w.Plan(), GroundTruth(), 60.0, lambda line: None,
            demo_live.ProgressLine(_Stream(False)))
    got = demo_live.run_halves(*args[:4], Gateway([running("n1"), running("n1")]), *args[5:])
    obs = got["plain"]
    assert set(obs.ids) == {7} and obs.start[7] <= obs.end[7] and obs.shapes[7] == []
    assert max(u for _, u in obs.samples) == 1 / w.Plan().gpus  # one whole GPU of the half
    with pytest.raises(demo_checks.DemoError, match=r"job 7 of the plain run holds GPUs on n3, outside its half "
                                                    r"\(n1\)"):
        demo_live.run_halves(*args[:4], Gateway([running("n3")]), *args[5:])


class _Helper:
    """Stands for the helper's process: records how it was started and stopped."""

    def __init__(self, kwargs):
        self.kwargs, self.calls = kwargs, []

    def poll(self):
        return 0 if "terminate" in self.calls else None

    def terminate(self):
        self.calls.append("terminate")

    def wait(self, timeout=None):
        self.calls.append("wait")
        return 0


class _Subprocess:
    """Stands for `subprocess` in demo_live: a submission returns the next job id at once (41, 42, ...)."""

    import subprocess as real

    STDOUT, DEVNULL, TimeoutExpired = real.STDOUT, real.DEVNULL, real.TimeoutExpired

    def __init__(self):
        self.submitted, self.helpers = [], []

    def run(self, argv, **kwargs):
        self.submitted.append(argv[1])
        return self.real.CompletedProcess(argv, 0, f"{40 + len(self.submitted)};cluster\n", "")

    def Popen(self, argv, **kwargs):
        self.helpers.append(_Helper(kwargs))
        return self.helpers[-1]


@pytest.mark.parametrize("error", ["outside its half", "ctrl-c"])
def test_an_error_stops_the_submissions_cancels_the_submitted_jobs_and_stops_the_helper(tmp_path, monkeypatch, error):
    import time

    from slurm_elastico.cluster import demo_workload as w
    from slurm_elastico.model import JobState, JobView
    from slurm_elastico.sim.truth import GroundTruth

    fake = _Subprocess()
    monkeypatch.setattr(demo_live, "subprocess", fake)
    monkeypatch.setattr(demo_live, "submit_argv", lambda half, job, *a: ["submit", f"{half.mode}-{job.name}"])
    jobs = w.job_list(train=3, infer=0, gap_s=60.0)  # the first at 0 s, the others a minute apart
    (tmp_path / "elastico").mkdir()

    class Gateway:
        def __init__(self):
            self.ran = []

        def jobs(self):
            if len(fake.submitted) < 2:  # both halves' first job; as squeue, it lists what was submitted (41 first)
                return tuple(JobView(40 + n, "j", "root", "demo-plain", JobState.PENDING)
                             for n in range(1, len(fake.submitted) + 1))
            if error == "ctrl-c":
                raise KeyboardInterrupt
            return (JobView(41, "j", "root", "demo-plain", JobState.RUNNING, gpu_alloc=(("n9", 0, 0),)),)

        def runner(self, argv):
            self.ran.append(argv)
            return fake.real.CompletedProcess(argv, 0, "", "")

    gateway, said = Gateway(), []
    pair = [halves.Half("plain", "demo-plain", ("n1",)), halves.Half("elastico", "demo-elastico", ("n2",))]
    began = time.monotonic()
    with pytest.raises(KeyboardInterrupt if error == "ctrl-c" else demo_checks.DemoError):
        demo_live.run_halves(pair, jobs, tmp_path, {}, gateway, w.Plan(), GroundTruth(), 600.0, said.append,
                             demo_live.ProgressLine(_Stream(False)))
    assert time.monotonic() - began < 20  # not at the next arrival (60 s) nor the last (120 s)
    assert sorted(fake.submitted) == sorted(f"{m}-{jobs[0].name}" for m in ("plain", "elastico"))  # nothing more
    assert gateway.ran == [["scancel", "41", "42"]] and "cancelled the demo's job(s) 41 42" in said[-1]
    (helper,) = fake.helpers
    assert helper.kwargs["start_new_session"] is True and helper.calls == ["terminate", "wait"]


class _Quiet:
    """Stands for the paired helper's lock: counts the submissions made under it."""

    def __init__(self):
        self.held = 0

    def __enter__(self):
        self.held += 1

    def __exit__(self, *exc):
        return False


def test_the_shadow_pass_pairs_shadow_and_acting_epochs_and_submits_through_elastico_submit(tmp_path, monkeypatch):
    from slurm_elastico.cluster import demo_workload as w
    from slurm_elastico.model import JobState, JobView
    from slurm_elastico.sim.truth import GroundTruth

    job = w.job_list(train=1, infer=0)[0]
    shadow = halves.Half("shadow", "demo-elastico", ("n3",))
    assert demo_live.submit_argv(shadow, job, tmp_path, w.Plan(), GroundTruth())[0].endswith("elastico-submit")
    fake = _Subprocess()
    monkeypatch.setattr(demo_live, "subprocess", fake)
    monkeypatch.setattr(demo_live, "submit_argv", lambda half, job, *a: ["submit", f"{half.mode}-{job.name}"])
    monkeypatch.setattr(demo_live.time, "sleep", lambda s: None)
    (tmp_path / "shadow").mkdir()
    made = []

    class Paired:  # stands for demo_shadow.PairedHelper: started once, stopped, its logs read after the run
        def __init__(self, env, interval_s, work, slurmctld_log):
            self.args, self.calls, self.error = (interval_s, work, slurmctld_log), [], None
            self.quiet = _Quiet()
            made.append(self)
            self.pairs = [demo_shadow.Pair(1.0, 0, {}, [], 1.5, [(41, "set_share")], 1),
                          demo_shadow.Pair(4.0, 0, {}, [], 4.5, [(41, "set_share"), (41, "set_nodes")], 1)]

        def start(self):
            self.calls.append("start")

        def stop(self):
            self.calls.append("stop")

    class Gateway:
        runner = object()

        def __init__(self):
            self.polls = 0

        def jobs(self):
            self.polls += 1
            if not fake.submitted or self.polls > 3:
                return ()
            return (JobView(41, "j", "root", "demo-elastico", JobState.RUNNING, gpu_alloc=(("n3", 0, 50),)),)

    monkeypatch.setattr(demo_live, "PairedHelper", Paired)
    log = tmp_path / "slurmctld.log"
    got = demo_live.run_halves([shadow], [job], tmp_path, {}, Gateway(), w.Plan(), GroundTruth(), 60.0,
                               lambda line: None, demo_live.ProgressLine(_Stream(False)), slurmctld_log=log)["shadow"]
    (paired,) = made
    assert fake.helpers == [] and paired.calls[0] == "start" and "stop" in paired.calls
    assert paired.quiet.held == 1  # the submission waited for the pair under way
    assert paired.args == (w.Plan().interval_s, tmp_path / "shadow", log) and got.paired is paired
    assert set(got.ids) == {41} and got.actions == {"set_share": 2, "set_nodes": 1}  # the pairs' acting actions

    def failing(*args):
        helper = Paired(*args)
        helper.error = demo_checks.DemoError("a shadow epoch failed (exit 1)")
        return helper

    monkeypatch.setattr(demo_live, "PairedHelper", failing)
    fake.submitted.clear()
    with pytest.raises(demo_checks.DemoError, match="a shadow epoch failed"):
        demo_live.run_halves([shadow], [job], tmp_path, {}, Gateway(), w.Plan(), GroundTruth(), 60.0,
                             lambda line: None, demo_live.ProgressLine(_Stream(False)))
    assert made[-1].calls[-1] == "stop"
    with pytest.raises(ValueError, match="one run with the helper at a time"):
        demo_live.run_halves([shadow, halves.Half("elastico", "demo-elastico", ("n4",))], [job], tmp_path, {},
                             Gateway(), w.Plan(), GroundTruth(), 60.0, lambda line: None,
                             demo_live.ProgressLine(_Stream(False)))


def test_the_shadow_pass_agrees_when_it_proposes_the_acting_kinds_within_the_tolerance():
    from collections import Counter

    from slurm_elastico.cluster.demo_figures import shadow_agreement, shadow_line

    acting = Counter(set_share=10, set_admin_comment=10, release=4)
    near = shadow_agreement(acting, {"set_share": 13, "set_admin_comment": 7, "release": 4})
    assert near["agree"] and near["kinds"]["set_share"]["relative"] == pytest.approx(0.3)
    assert "the same kinds, each within 30 %" in shadow_line(near)
    assert not shadow_agreement(acting, {"set_share": 14, "set_admin_comment": 10, "release": 4})["agree"]
    extra = shadow_agreement(acting, {"set_share": 10, "set_admin_comment": 10, "release": 4, "preempt": 1})
    assert not extra["agree"] and extra["kinds"]["preempt"] == {"acting": 0, "shadow": 1, "relative": None}
    missing = shadow_agreement(acting, {"set_share": 10, "set_admin_comment": 10})
    assert not missing["agree"] and missing["kinds"]["release"]["relative"] == -1
    assert not shadow_agreement(Counter(), {})["agree"]  # nothing to compare is no agreement
    assert "NOT the same kinds" in shadow_line(missing)


def test_the_elastico_runs_actions_are_the_done_ones_of_its_helpers_epoch_lines(tmp_path):
    log = tmp_path / "sched.log"
    log.write_text('{"actions": [{"kind": "set_share", "status": "done"}, {"kind": "release", "status": "failed"}]}\n'
                   "elastico sched: note: a log line\n"
                   '{"actions": [{"kind": "set_share", "status": "done"}, {"kind": "start_now", "status": "done"}]}\n')
    assert demo_live._actions(log) == {"set_share": 2, "start_now": 1}
