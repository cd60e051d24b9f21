"""Progress reports through real Slurm: two jobs, first alone, then on one GPU; `elastico sched` reads their
reports, learns each job's solo speed, and records the slowdown they show side by side.

The jobs are a loop that reports through the runtime API (`report_progress`), so the test needs no torch and
runs on both Slurm versions (the training loop's own reports are tested in tests/unit/test_progress.py). The
fake GPUs share nothing but this machine's CPUs, so the jobs mostly wait and their slowdown stays near 1; the
test checks that the path records a valid observation, not what its value is.
"""

from __future__ import annotations

import json
import subprocess

import pytest

from slurm_elastico.interference.measurements import load_from_store
from slurm_elastico.model import JobState
from slurm_elastico.helper.observe import MAX_NORM

from live_helpers import BIN, Cluster, idle_nodes, solo_rates, step_program, until, wait_report

pytestmark = pytest.mark.live

# One shape: the planner has nothing to change, so the test alone decides where the jobs run.
FAMILY = """kind: train
name: observe-live
global_batch: 8
micro_batches: [8]
precisions: [fp32]
checkpointing: [false]
steps: 100000
mps_shares: [50]
throughput_floor: 0.01
cpus: 1
host_mem_mib: 512
"""


# A little CPU work and a short wait each step, so other load on this machine hardly moves the job's speed.
PROGRAM = step_program("sum(i * i for i in range(2000)); time.sleep(0.01)")


def test_helper_learns_solo_speeds_and_records_the_observed_slowdown(slurm_cluster, tmp_path):
    c = Cluster(dict(slurm_cluster.env()), tmp_path, {"f.yaml": FAMILY}, config="planner: {policy: static}\ngpu: {type: fake}\n")
    program = tmp_path / "busy.py"
    program.write_text(PROGRAM)
    try:
        first, second = idle_nodes(c)  # jobs of other tests must not share these jobs' GPUs
        a = c.submit("f.yaml", program, options=("-w", first))
        b = c.submit("f.yaml", program, options=("-w", second))
        wait_report(c, a, 0)
        wait_report(c, b, 0)
        until(c, lambda notes: solo_rates(c) == {a, b}, "a solo rate for each job")
        status = subprocess.run([str(BIN / "elastico"), "status", "--json"], env=c.env, capture_output=True, text=True,
                                timeout=60)
        jobs = {j["job_id"]: j for j in json.loads(status.stdout)["jobs"]}
        assert 0 < jobs[a]["progress"]["done"] < jobs[a]["progress"]["total"] == 100000  # what `elastico status` shows

        c.gateway.requeue_with_share(b, 50, (first,))  # b joins a's node; with mps:50 each they fit one GPU
        wait_report(c, b, 1)
        gpus = {j.job_id: {(n, i) for n, i, _ in j.gpu_alloc} for j in c.gateway.snapshot().jobs}
        # Slurm fills the GPU that already has MPS shares in use (first fit): that is what puts b beside a.
        assert gpus[a] == gpus[b], f"Slurm placed the jobs on different GPUs ({gpus[a]} vs {gpus[b]})"
        until(c, lambda notes: any(f"observed: jobs {min(a, b)} and {max(a, b)}" in n for n in notes),
              "the co-location observed")
        with c.store() as store:
            (obs,) = load_from_store(store, source="observed")
        assert 0 < obs.norm_a <= MAX_NORM and 0 < obs.norm_b <= MAX_NORM
        print(f"\n  two jobs on one fake GPU (shared CPUs): {obs.norm_a:.2f} and {obs.norm_b:.2f} of solo speed")
        assert obs.a.mps_share == 50 and obs.a.kind == "train" and obs.a.model_family == "observe-live"
        assert c.gateway.job(a).state is JobState.RUNNING  # the helper changed nothing
    finally:
        c.cancel_all()
