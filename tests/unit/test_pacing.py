"""The emulated GPU's step time (cluster.pacing) is the simulator's: the same jobs, run by the simulator's engine,
end when the pacing's rate says they do, alone, on a share, and next to a co-runner."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from slurm_elastico.cluster import pacing
from slurm_elastico.config import Settings
from slurm_elastico.errors import ConfigError
from slurm_elastico.model import JobState, JobView
from slurm_elastico.sim import engine
from slurm_elastico.sim import settings as sim_settings
from slurm_elastico.sim.trace import TraceJob, default_micro
from slurm_elastico.sim.truth import GroundTruth

TRUTH = GroundTruth()
SETTINGS = dataclasses.replace(Settings(), gpu=dataclasses.replace(Settings().gpu, memory_mib=16384))


def _sim(trace, policy, gpus=1):
    sim = sim_settings.from_mapping({"gpus": gpus, "gpus_per_node": 4, "placement_window_s": 0, "profile_noise": 0.0,
                                     "max_gpus_per_job": 0, "epoch_s": 1})
    return engine.run(trace, policy, SETTINGS, sim, None, TRUTH)


@pytest.mark.parametrize("app,batch", [("bert", 12), ("deepspeech2", 40), ("cifar10", 1024)])
def test_whole_gpu_training_ends_when_the_pacing_rate_says(app, batch):
    run = _sim([TraceJob(1, 0.0, "train", app, 1, 50, batch, 100)], "static")
    job = pacing.Emulated("train", app, batch)
    knobs = pacing.Knobs(micro_batch=default_micro(TRUTH, app, batch))
    assert run.jobs[0].jct == pytest.approx(pacing.seconds_for(50, pacing.rate(TRUTH, job, knobs, 100)), rel=1e-9)


def test_two_jobs_sharing_a_gpu_run_at_the_colocated_rate_the_simulator_gives():
    # static-mps: each job at its submitted knobs on half a GPU; Slurm's best fit puts both on the one GPU.
    # deepspeech2 at micro-batch 10 fills 60 % of a GPU, so half a GPU alone costs it little; the pair costs more.
    trace = [TraceJob(i, 0.0, "train", "deepspeech2", 1, 40, 10, 50) for i in (1, 2)]
    run = _sim(trace, "static-mps")
    job = pacing.Emulated("train", "deepspeech2", 10)
    knobs = pacing.Knobs(micro_batch=default_micro(TRUTH, "deepspeech2", 10))
    me = pacing.identity(TRUTH, job, knobs)
    paired = pacing.rate(TRUTH, job, knobs, 50, [me])
    alone = pacing.rate(TRUTH, job, knobs, 50)
    assert paired < alone  # the co-runner costs something: the test could fail
    for r in run.jobs:
        assert r.jct == pytest.approx(40 / paired, rel=1e-9)


def test_inference_rate_is_the_decode_model_and_a_share_slows_it():
    job = pacing.Emulated("infer", "llm", context_tokens=1024, generated_tokens=512)
    knobs = pacing.Knobs(gpu_memory_utilization=0.9, max_num_seqs=64, kv_cache_dtype="auto")
    whole = pacing.rate(TRUTH, job, knobs, 100)
    assert whole == TRUTH.infer_speed(1024, 512, 0.9, 64, "auto", 100, 16384.0)
    assert pacing.rate(TRUTH, job, knobs, 25) < whole
    run = _sim([TraceJob(1, 0.0, "infer", "llm", 1, 30, 0, 100, 1024, 512)], "static")
    default = pacing.Knobs(gpu_memory_utilization=0.9, max_num_seqs=256, kv_cache_dtype="auto")
    assert run.jobs[0].jct == pytest.approx(30 / pacing.rate(TRUTH, job, default, 100), rel=1e-9)


@pytest.mark.parametrize("gpus,placement", [(4, (4,)), (8, (4, 4))])
def test_a_data_parallel_job_ends_when_the_pacing_rate_on_its_placement_says(gpus, placement):
    # A job holding `gpus` whole GPUs, as Slurm places it (full nodes first), runs at the gang speed of that
    # placement in the simulator; the pacing of the same ranks and micro-batch on the same nodes gives it.
    run = _sim([TraceJob(1, 0.0, "train", "bert", gpus, 50, 48, 100)], "static", gpus=8)
    job = pacing.Emulated("train", "bert", 48)
    knobs = pacing.Knobs(micro_batch=48 // gpus, ranks=gpus)
    speed = pacing.rate(TRUTH, job, knobs, 100, nodes=placement)
    assert speed != pacing.rate(TRUTH, job, pacing.Knobs(micro_batch=12), 100)  # not the one-GPU rate
    assert run.jobs[0].jct == pytest.approx(50 / speed, rel=1e-9)
    with pytest.raises(ConfigError, match=f"on {gpus} ranks does not split global batch 48: micro_batch "
                                          f"{48 // gpus + 1} is larger than a rank's part \\({48 // gpus}\\); "
                                          f"allowed: at most {48 // gpus}"):
        pacing.rate(TRUTH, job, pacing.Knobs(micro_batch=48 // gpus + 1, ranks=gpus), 100)  # larger than a part


def test_a_gangs_placement_counts_its_gpus_per_node_and_the_pacer_rates_it_alone(tmp_path):
    jobs = [_view(1, [("n1", 2, 0), ("n1", 3, 0), ("n2", 0, 0), ("n2", 1, 0)]), _view(2, [("n2", 0, 0)])]
    assert pacing.placement_of(1, jobs).nodes == (2, 2)
    job = pacing.Emulated("train", "bert", 24)
    knobs = pacing.Knobs(micro_batch=6, ranks=4)
    clock = _Clock()
    p = pacing.Pacer(TRUTH, job, knobs, lambda: pacing.placement_of(1, jobs), lambda o: ("Transformer", 16),
                     refresh_s=0.0, clock=clock, sleep=clock.sleep)
    p.start()
    p.pad()
    assert clock.t == pytest.approx(1 / TRUTH.gang_speed("bert", 24, (2, 2), 6))
    assert TRUTH.gang_speed("bert", 24, (2, 2), 6) != TRUTH.gang_speed("bert", 24, (4,), 6)


def _view(job_id, alloc, start=0):
    return JobView(job_id=job_id, name="j", user="u", partition="p", state=JobState.RUNNING, reason="", held=False,
                   gres=None, nodes=tuple({n for n, _, _ in alloc}), gpu_indices=(), cpus=1, memory_mib=1,
                   submit_time=0, start_time=start, restarts=0, requeue=True, admin_comment="", gpu_alloc=tuple(alloc))


def test_placement_reads_share_and_the_co_runners_on_the_same_gpu_only():
    jobs = [_view(1, [("n1", 0, 25)]), _view(2, [("n1", 0, 50)]), _view(3, [("n1", 1, 25)]),
            _view(4, [("n2", 0, 25)]), _view(5, [("n1", 2, 0)])]
    assert pacing.placement_of(1, jobs) == pacing.Placement(25, (2,), node="n1")
    assert pacing.placement_of(5, jobs) == pacing.Placement(100, (), node="n1")  # a whole GPU (gres gpu:1)
    assert pacing.placement_of(1, jobs, shares_per_gpu=50) == pacing.Placement(50, (2,), node="n1")
    assert pacing.placement_of(9, jobs) is None
    assert pacing.placement_of(6, [_view(6, [("n3", 1, 50)], start=1700)]) == pacing.Placement(50, (), 1700.0,
                                                                                               node="n3")


class _Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t

    def sleep(self, s):
        self.t += s


def test_pacer_pads_to_the_current_rate_and_follows_a_new_co_runner(tmp_path):
    job = pacing.Emulated("train", "bert", 12)
    knobs = pacing.Knobs(micro_batch=4)
    clock = _Clock()
    where = {"p": pacing.Placement(50, ())}
    pacing.publish(tmp_path, 7, ("Transformer", 16))
    p = pacing.Pacer(TRUTH, job, knobs, lambda: where["p"], lambda o: pacing.read_identity(tmp_path, o),
                     refresh_s=0.0, clock=clock, sleep=clock.sleep)
    p.start()
    clock.t += 0.01  # the real work of the step
    p.pad()
    assert clock.t == pytest.approx(1 / pacing.rate(TRUTH, job, knobs, 50))
    where["p"] = pacing.Placement(50, (7,))
    t0 = clock.t
    p.pad()
    assert clock.t - t0 == pytest.approx(1 / pacing.rate(TRUTH, job, knobs, 50, [("Transformer", 16)]))
    assert pacing.read_identity(tmp_path, 8) == pacing.UNKNOWN


def test_pacer_keeps_the_last_rate_when_slurm_does_not_answer_and_late_steps_catch_up():
    job = pacing.Emulated("train", "bert", 12)
    knobs = pacing.Knobs(micro_batch=12)
    step = 1 / pacing.rate(TRUTH, job, knobs, 100)
    clock = _Clock()
    p = pacing.Pacer(TRUTH, job, knobs, lambda: None, lambda o: pacing.UNKNOWN, refresh_s=0.0, clock=clock,
                     sleep=clock.sleep)
    p.start()
    clock.t += 2.5 * step  # start-up or slow real work: 2.5 steps' worth
    assert p.pad() == 0.0 and p.pad() == 0.0  # two steps were already due: no padding
    assert p.late == pytest.approx(1.5 * step)
    assert p.pad() == pytest.approx(0.5 * step)  # the third is due half a step from now
    assert clock.t == pytest.approx(3 * step)  # the run ends where the emulated GPU would
    assert pacing.finish(p, Path("unused"), checkpointed=False)["ended_late_s"] == 0.0
    clock.t += 4 * step  # real work slower than the emulated GPU's next step: it cannot catch up
    p.pad()
    assert pacing.finish(p, Path("unused"), checkpointed=False)["ended_late_s"] == pytest.approx(3 * step, abs=1e-3)


def test_origin_is_slurms_start_and_a_later_run_pays_the_restart_cost():
    assert pacing.origin(100.0, 104.0, None, 10.0) == 100.0  # start-up overlaps the emulated work
    assert pacing.origin(None, 104.0, None, 10.0) == 104.0  # Slurm did not say: the program's start
    assert pacing.origin(100.0, 204.0, 200.0, 10.0) == 210.0  # relaunched in place at 200: Slurm's start is older
    assert pacing.origin(300.0, 304.0, 200.0, 10.0) == 310.0  # requeued: started again at 300


def test_a_stop_is_recorded_for_the_next_run(tmp_path):
    assert pacing.read_stop(tmp_path, 3) is None
    pacing.record_stop(tmp_path, 3, 123.5)
    assert pacing.read_stop(tmp_path, 3) == 123.5


@pytest.mark.parametrize("kwargs,word", [
    ({"kind": "serve", "app": "x"}, "kind"),
    ({"kind": "train", "app": "bert"}, "global_batch"),
    ({"kind": "infer", "app": "llm"}, "context_tokens"),
    ({"kind": "train", "app": "bert", "global_batch": 12, "colocation": "magic"}, "colocation"),
    ({"kind": "train", "app": "bert", "global_batch": 12, "restart_cost_s": -1}, "restart_cost_s"),
])
def test_bad_emulated_jobs_are_refused_with_what_is_allowed(kwargs, word):
    with pytest.raises(ConfigError, match=word):
        pacing.Emulated(**kwargs)


def test_emulated_round_trips_through_json_and_refuses_unknown_keys():
    job = pacing.Emulated("infer", "llm", context_tokens=10, generated_tokens=5)
    assert pacing.Emulated.from_json(job.to_json()) == job
    with pytest.raises(ConfigError, match="unknown key"):
        pacing.Emulated.from_json('{"kind": "train", "app": "bert", "global_batch": 12, "speed": 3}')
    with pytest.raises(ConfigError, match="micro_batch"):
        pacing.rate(TRUTH, pacing.Emulated("train", "bert", 12), pacing.Knobs(micro_batch=5), 100)


def test_finish_records_the_stop_only_of_a_checkpointed_run(tmp_path):
    clock = _Clock()
    p = pacing.Pacer(TRUTH, pacing.Emulated("train", "bert", 12), pacing.Knobs(micro_batch=12), lambda: None,
                     lambda o: pacing.UNKNOWN, clock=clock, sleep=clock.sleep)
    p.job_id = 5
    assert pacing.finish(p, tmp_path, checkpointed=False) == {"padded_s": 0.0, "late_s": 0.0, "ended_late_s": 0.0}
    assert pacing.read_stop(tmp_path, 5) is None
    pacing.finish(p, tmp_path, checkpointed=True)
    assert pacing.read_stop(tmp_path, 5) is not None
