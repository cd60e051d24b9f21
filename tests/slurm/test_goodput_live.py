"""Goodput mode through the real local cluster: the helper moves an adaptive training job to the batch its
measured gradient noise scale pays for, and the job ends when its statistical progress reaches its work.

The job is the tiny LM (`wrappers/examples/train_tiny.py`, real PyTorch on the CPU) submitted through
elastico-submit with a family that adapts its batch between 8 (submitted) and 32. The family declares its
shapes' figures so the planner's choice does not hang on this machine's speed: at the submitted batch 1.0
step/s, at 16 and 32 steps/s of 0.9 and 0.8 (a larger batch takes longer a step). Before the job has measured
its noise scale a larger batch is worth at least one step of 8 per step, so 0.8 < 1.0 keeps it at 8; the tiny
LM measures a noise scale of about 20 samples, at which one step of 32 is worth 4 x 28/52 = 2.15 steps of 8,
so one `elastico sched --once` epoch moves it to 32 (AdminComment, then SIGUSR1: the same share, so elastico-run
hands the new batch to the running program, which takes it at its next step without a relaunch:
`runtime.rebatch`). The job then needs fewer optimizer steps than its 300 of batch 8; `elastico report` lists
the progress, the steps and the samples it used, from the last report the helper read once the job had left
the queue.

The second test moves the batch together with the GPU share: started on half a GPU, the job is requeued onto
a whole one at batch 32 (AdminComment, requeue with the new share), and the next epoch, with the job running
and reporting at 32, leaves it there.
"""

from __future__ import annotations

import json
import subprocess
import time

import pytest

from slurm_elastico.helper.observe import MIN_PAIR_S
from slurm_elastico.runtime.goodput import step_worth
from slurm_elastico.runtime.progress import progress_path, read_progress

from live_helpers import BIN, EXAMPLES, Cluster, epoch, wait_for, wait_report

pytestmark = pytest.mark.live

WORK = 300
FAMILY = f"""kind: train
name: goodput-live
global_batch: 8
micro_batches: [8]
precisions: [fp32]
checkpointing: [false]
steps: {WORK}
mps_shares: [100]
throughput_floor: 0.01
cpus: 1
host_mem_mib: 512
batch: {{adaptive: true, min: 8, max: 32, lr_scaling: adascale}}
declared:
  mb8-fp32-mps100: {{throughput: 1.0, gpu_mem_mib: 1000}}
  gb16-mb8-fp32-mps100: {{throughput: 0.9, gpu_mem_mib: 1000}}
  gb32-mb8-fp32-mps100: {{throughput: 0.8, gpu_mem_mib: 1000}}
"""


def test_helper_moves_an_adaptive_job_in_process_to_the_batch_its_noise_scale_pays_for_and_reports_its_cost(
        slurm_cluster, tmp_path):
    c = Cluster(dict(slurm_cluster.env()), tmp_path, {"g.yaml": FAMILY}, config="planner: {reshape_cost_s: 5}\n")
    try:
        job = c.submit("g.yaml", EXAMPLES / "train_tiny.py", "--step-sleep", "0.1")
        measured = wait_for(lambda: (r := read_progress(progress_path(c.root, job))) is not None
                            and r.grad_noise_scale is not None and r.done >= 5 and r,
                            "a progress report with the job's noise scale", timeout=120)
        assert measured.steps == measured.done and measured.samples == 8 * measured.steps  # at its own batch
        phi = measured.grad_noise_scale
        assert 4 < phi < 200, phi  # the figures above assume the tiny LM's ~20 samples

        first = epoch(c)
        mine = [a for a in first["actions"] if a["job_id"] == job]
        assert [(a["kind"], a["status"]) for a in mine] == [("set_admin_comment", "done"), ("signal", "done")], first
        assert mine[0]["shape"] == "gb32-mb8-fp32-mps100" and "steps/s" in mine[0]["reason"]
        assert "no restart" in mine[0]["reason"]  # the same share, another batch: taken in process

        text = c.wait_done(job, timeout=240)
        assert "new batch in process: mb8-fp32-mps100 -> gb32-mb8-fp32-mps100" in text and "steps of batch 8" in text
        runs = c.summaries(job)
        assert [(r["status"], r["switches"]) for r in runs] == [("done", 1)], text  # one run: no relaunch
        last = runs[0]
        total_steps = last["step"]
        at_32, rest = divmod(last["samples"] - 8 * total_steps, 32 - 8)  # each step took 8 or 32 samples
        at_8 = total_steps - at_32
        assert rest == 0 and at_8 >= 5 and at_32 > 0, last
        assert WORK <= last["progress"] < WORK + 4  # reached its work; the last step's gain is at most 4
        assert total_steps < WORK  # fewer optimizer steps than at the submitted batch

        wait_for(lambda: job not in c.queue(), "the job to leave the queue", timeout=60)
        epoch(c)  # reads the job's last report once more and keeps it
        out = subprocess.run([str(BIN / "elastico"), "report", "--start", "now-1hours", "--format", "json"],
                             env=c.env, capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr
        row = next(j for j in json.loads(out.stdout)["jobs"] if j["job_id"] == job)
        assert row["kind"] == "train", row  # its stored family matched to this job by its submission time
        assert (row["progress"], row["work"], row["steps"], row["samples"]) == (WORK, WORK, total_steps,
                                                                                 last["samples"])
        table = subprocess.run([str(BIN / "elastico"), "report", "--start", "now-1hours"], env=c.env,
                               capture_output=True, text=True, timeout=120)
        assert table.returncode == 0 and "SAMPLES" in table.stdout, table.stderr
        print(f"\n  noise scale {phi:.1f}: batch 32 in process after {at_8} steps of 8, then {at_32} steps of 32; "
              f"{total_steps} steps, {last['samples']} samples for {last['progress']:.2f} steps of 8 (work {WORK})")
    finally:
        c.cancel_all()


SHARED = FAMILY.replace("mps_shares: [100]", "mps_shares: [50, 100]\ndefault: mb8-fp32-mps50").replace(
    """  mb8-fp32-mps100: {throughput: 1.0, gpu_mem_mib: 1000}
  gb16-mb8-fp32-mps100: {throughput: 0.9, gpu_mem_mib: 1000}
  gb32-mb8-fp32-mps100: {throughput: 0.8, gpu_mem_mib: 1000}""",
    """  mb8-fp32-mps50: {throughput: 1.0, gpu_mem_mib: 1000}
  mb8-fp32-mps100: {throughput: 1.05, gpu_mem_mib: 1000}
  gb16-mb8-fp32-mps50: {throughput: 0.5, gpu_mem_mib: 1000}
  gb16-mb8-fp32-mps100: {throughput: 0.7, gpu_mem_mib: 1000}
  gb32-mb8-fp32-mps50: {throughput: 0.5, gpu_mem_mib: 1000}
  gb32-mb8-fp32-mps100: {throughput: 0.8, gpu_mem_mib: 1000}""")
"""Half a GPU at batch 8 (1.0 step/s), a whole one 1.05 (not worth a restart); at batch 32, 0.5 and 0.8 steps/s."""


def test_helper_requeues_an_adaptive_job_onto_a_whole_gpu_at_another_batch_and_keeps_it_there(slurm_cluster,
                                                                                               tmp_path):
    c = Cluster(dict(slurm_cluster.env()), tmp_path, {"g.yaml": SHARED}, config="planner: {reshape_cost_s: 5}\n")
    try:
        job = c.submit("g.yaml", EXAMPLES / "train_tiny.py", "--step-sleep", "0.1")
        wait_for(lambda: (r := read_progress(progress_path(c.root, job))) is not None
                 and r.grad_noise_scale is not None and r.done >= 5, "the job's noise scale reported", timeout=120)
        assert c.gateway.job(job).mps_share == 50
        first = epoch(c)
        mine = [(a["kind"], a["shape"], a["share"], a["status"]) for a in first["actions"] if a["job_id"] == job]
        assert mine == [("set_admin_comment", "gb32-mb8-fp32-mps100", None, "done"),
                        ("reshape_running", "gb32-mb8-fp32-mps100", 100, "done")], first
        wait_report(c, job, 1)  # running again, reporting at batch 32
        assert c.gateway.job(job).mps_share == 100
        again = epoch(c)
        assert [a for a in again["actions"] if a["job_id"] == job] == [], again  # priced at its noise scale: stays
        text = c.wait_done(job, timeout=240)
        assert "shape gb32-mb8-fp32-mps100: micro 8 x 4 = 32" in text
        runs = c.summaries(job)
        assert [r["status"] for r in runs] == ["checkpointed", "done"], text
        assert WORK <= runs[1]["progress"] < WORK + 4 and runs[1]["step"] < WORK
    finally:
        c.cancel_all()


LONG = FAMILY.replace(f"steps: {WORK}", "steps: 100000")
"""The first test's family with work for far longer than the test waits: it measures the job at batch 32, then
cancels it."""
AT_32 = "gb32-mb8-fp32-mps100"


def test_the_planner_prices_the_batch_the_job_ran_alone_at_the_speed_it_showed_there(slurm_cluster, tmp_path):
    """The job runs batch 32 alone, moved there by the helper. Its progress there is goodput, which the observer
    keeps as the shape's figure (steps of 32 per second: `shapes.goodput.to_figure`), and the planner's next
    epoch prices that shape at the job's noise scale. So the speed the epoch's JSON plans for the job is its real
    progress rate, not its family's declared 0.8 steps/s (`shapes.measured_speed.refined` takes a shape at
    another batch than the submitted one too)."""
    c = Cluster(dict(slurm_cluster.env()), tmp_path, {"g.yaml": LONG}, config="planner: {reshape_cost_s: 5}\n")
    try:
        job = c.submit("g.yaml", EXAMPLES / "train_tiny.py", "--step-sleep", "0.1")
        wait_for(lambda: (r := read_progress(progress_path(c.root, job))) is not None
                 and r.grad_noise_scale is not None and r.done >= 5, "the job's noise scale reported", timeout=120)
        first = epoch(c)
        assert [a["shape"] for a in first["actions"] if a["job_id"] == job] == [AT_32, AT_32], first  # in process
        wait_for(lambda: (r := read_progress(progress_path(c.root, job))) is not None and r.shape == AT_32,
                 "a report at batch 32", timeout=60)

        def rate_at_32() -> float:
            with c.store() as store:
                rows = store.query("SELECT work, seconds FROM solo_rate WHERE job_id = ? AND shape = ?", (job, AT_32))
            return rows[0]["work"] / rows[0]["seconds"] if rows and rows[0]["seconds"] >= MIN_PAIR_S else 0.0

        deadline = time.monotonic() + 120
        while not rate_at_32():  # epochs 6 s apart: a solo speed needs reports 5 s apart after a 5 s warm-up
            assert time.monotonic() < deadline, "no solo speed at batch 32 within 120 s"
            later = epoch(c)
            assert [a for a in later["actions"] if a["job_id"] == job] == [], later  # it stays at batch 32
            time.sleep(6)
        figure = rate_at_32()

        # The job's own counts over a few seconds, read apart from the helper: optimizer steps and progress.
        before = read_progress(progress_path(c.root, job))
        b = wait_for(lambda: (r := read_progress(progress_path(c.root, job))) is not None
                     and r.updated >= before.updated + 5 and r, "reports 5 s apart", timeout=30)
        planned = epoch(c)
        seconds = b.updated - before.updated
        steps_per_s, progress_per_s = (b.steps - before.steps) / seconds, (b.done - before.done) / seconds
        mine = [p for p in planned["placements"] if p["job_id"] == job]
        assert [p["shape"] for p in mine] == [AT_32], planned
        assert 0.6 < figure / steps_per_s < 1.67, (figure, steps_per_s)  # the figure: steps of 32 per second
        assert 0.6 < mine[0]["throughput"] / progress_per_s < 1.67, (mine, progress_per_s, figure)
        declared = 0.8 * step_worth(b.grad_noise_scale, 32, 8)  # what the plan would say from the family alone
        assert not 0.67 < mine[0]["throughput"] / declared < 1.5, (mine, declared)
        print(f"\n  at batch 32: {steps_per_s:.2f} steps/s ({progress_per_s:.2f} steps of 8/s); the helper's figure "
              f"{figure:.2f} steps/s, planned {mine[0]['throughput']:.2f} steps of 8/s (declared: {declared:.2f})")
    finally:
        c.cancel_all()
