"""Probe and revert through real Slurm: two jobs that really slow each other share a GPU; the helper undoes it.

The fake GPUs share nothing, so each fake GPU is backed here by one CPU core: the job's program pins itself to
the core of the GPU Slurm gave it (node offset + GPU index, modulo the cores this process may use) and spends
every step on CPU work. Alone, a job has its core; two jobs on one GPU time-slice one core, so each runs at
about half its solo speed. That is a co-location that does not pay, measured, not predicted: the test checks
that `elastico sched` sees it from the progress reports, undoes it within a few epochs (the later job requeued
at its whole-GPU shape, journaled), records the observation the predictor learns from, and refuses the pair.

The family's floor is 0.65 of the program's speed on one core, measured here before the jobs start; the jobs
run at about 0.5 of it side by side, so the floor is what the test relies on. The gain rule would revert the pair
too (it measured 0.96 to 1.06 of one GPU's worth, under 1 + `base.MIN_GAIN`), but by less, and each solo speed
is taken while the helper shares the machine, so the test does not rest on it.
Needs two CPU cores, so that the two jobs' GPUs, apart, are two cores.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from slurm_elastico.model import JobState

from live_helpers import Cluster, epoch, idle_nodes, solo_rates, step_program, until, wait_report

pytestmark = [pytest.mark.live, pytest.mark.alone]  # it times jobs sharing one core: no other test may run

PROGRAM = step_program("work()", setup="""
def work():
    return sum(i * i for i in range(20000))


cores = sorted(os.sched_getaffinity(0))
if sys.argv[1] == "--calibrate":  # steps/s on core number argv[2] (of those this process may use)
    os.sched_setaffinity(0, {cores[int(sys.argv[2])]})
    work()
    n, t0 = 0, time.monotonic()
    while time.monotonic() - t0 < 2.0:
        work()
        n += 1
    print(n / (time.monotonic() - t0))
    sys.exit(0)
offsets = json.load(open(sys.argv[1]))
node = os.environ["SLURMD_NODENAME"]
gpu = int((os.environ.get("SLURM_JOB_GPUS") or os.environ["CUDA_VISIBLE_DEVICES"]).split(",")[0])
core = cores[(offsets[node] + gpu) % len(cores)]
os.sched_setaffinity(0, {core})
print(f"fake GPU {node}:{gpu} is CPU core {core}", flush=True)""")
"""Each step is CPU work on the job's own core (see the module's text); `--calibrate N` prints its steps/s on core N."""

FAMILY = """kind: train
name: contend-live
global_batch: 8
micro_batches: [8]
precisions: [fp32]
checkpointing: [false]
steps: 100000000
mps_shares: [50, 100]
throughput_floor: {floor:.3f}
cpus: 1
host_mem_mib: 512
default: mb8-fp32-mps50
declared:
  mb8-fp32-mps50: {{throughput: {speed:.3f}, gpu_mem_mib: 1000}}
  mb8-fp32-mps100: {{throughput: {whole:.3f}, gpu_mem_mib: 1000}}
"""
"""On a real GPU the whole of it is faster than half (here both are one core): a shape no faster than another
that takes less would not be in the family, and the revert needs a whole-GPU shape to move a job to."""
FLOOR = 0.65
"""The jobs' floor, as a fraction of their speed alone on one core."""
MAX_EPOCHS = 8
"""A few epochs: warm-up (5 s), two readings >= 5 s apart and 10 s side by side need 3 to 5 of them, 6 s apart."""


def calibrate(program) -> float:
    """The program's steps/s on one core, the slower of the first two, measured on both at once (as the jobs run)."""
    runs = [subprocess.Popen([sys.executable, str(program), "--calibrate", str(i)], stdout=subprocess.PIPE, text=True)
            for i in (0, 1)]
    try:
        out = [run.communicate(timeout=60)[0] for run in runs]
    finally:
        for run in runs:
            run.kill()
    assert all(run.returncode == 0 for run in runs), out
    return min(float(x) for x in out)


def core_of(c: Cluster, job_id: int) -> int:
    """The core the job's latest run pinned itself to (its output's last "is CPU core N" line)."""
    lines = [x for x in c.text(job_id).splitlines() if " is CPU core " in x]
    assert lines, f"job {job_id} did not say its core: {c.text(job_id)}"
    return int(lines[-1].rsplit(" ", 1)[1])


def samples(c: Cluster) -> dict:
    """What the helper accumulated of the jobs' speeds (for a failure's message)."""
    with c.store() as store:
        return {t: [dict(r) for r in store.query(f"SELECT * FROM {t}")]
                for t in ("solo_rate", "pair_rate", "colocation", "pair_refusal")}


def test_a_co_location_that_does_not_pay_is_undone_recorded_and_refused(slurm_cluster, tmp_path):
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs two CPU cores: each job's fake GPU is backed by a core of its own")
    program = tmp_path / "contend.py"
    program.write_text(PROGRAM)
    c = Cluster(dict(slurm_cluster.env()), tmp_path, {}, config="planner: {policy: static}\ngpu: {type: fake}\n")
    try:
        first, second = idle_nodes(c)  # nothing else runs: this machine's cores are the jobs' GPUs
        speed = calibrate(program)
        (tmp_path / "f.yaml").write_text(FAMILY.format(floor=FLOOR * speed, speed=speed, whole=1.8 * speed))
        offsets = tmp_path / "offsets.json"
        offsets.write_text(json.dumps({first: 0, second: 1}))  # GPU 0 of each node: two different cores
        a = c.submit("f.yaml", program, str(offsets), options=("-w", first))
        b = c.submit("f.yaml", program, str(offsets), options=("-w", second))
        wait_report(c, a, 0)
        wait_report(c, b, 0)
        assert core_of(c, a) != core_of(c, b), (c.text(a), c.text(b))  # alone, each on a core of its own
        until(c, lambda notes: solo_rates(c) == {a, b}, "a solo rate for each job")
        with c.store() as store:
            alone = {r["job_id"]: r["work"] / r["seconds"] for r in store.query("SELECT * FROM solo_rate")}
        assert min(alone.values()) > FLOOR * speed, (
            f"the jobs ran at {alone} steps/s alone, not above their floor {FLOOR * speed:.1f} (this machine "
            f"measured {speed:.1f} steps/s on one core): something else took their cores")

        c.gateway.requeue_with_share(b, 50, (first,))  # b joins a's GPU (Slurm fills a GPU with shares in use)
        wait_report(c, b, 1)
        gpus = {j.job_id: {(n, i) for n, i, _ in j.gpu_alloc} for j in c.gateway.snapshot().jobs}
        assert gpus[a] == gpus[b], f"Slurm placed the jobs on different GPUs ({gpus[a]} vs {gpus[b]})"
        assert core_of(c, a) == core_of(c, b), ("one GPU, yet two cores: does Slurm narrow the jobs' CPU affinity?",
                                                c.text(a), c.text(b))
        undone, notes = None, []
        for n in range(1, MAX_EPOCHS + 1):
            result = epoch(c)
            notes += [f"epoch {n}: {x}" for x in result["notes"]]
            undone = [x for x in result["actions"] if x["kind"] == "reshape_running"]
            if undone:
                break
            time.sleep(6)
        assert undone, (f"the pairing was not undone within {MAX_EPOCHS} epochs; the epochs' notes: {notes}; "
                        f"the helper's samples: {samples(c)}; job {a}: {c.text(a)}; job {b}: {c.text(b)}")
        (move,) = undone
        assert move["job_id"] == b and move["status"] == "done", move  # the later arrival moves
        assert move["shape"] == "mb8-fp32-mps100" and move["nodes"] == [first], move
        assert "undo a co-location that did not pay" in move["reason"] and "below its floor" in move["reason"]
        print(f"\n  undone after {n} epoch(s) side by side: {move['reason']}")

        with c.store() as store:
            journal = [(r["job_id"], r["kind"], r["status"]) for r in
                       store.query("SELECT * FROM journal WHERE job_id = ? ORDER BY id", (b,))]
            observed = store.query("SELECT a_norm, b_norm FROM colocation WHERE source = 'observed'")
            refused = store.query("SELECT body FROM pair_refusal")
        assert journal[-2:] == [(b, "set_admin_comment", "done"), (b, "reshape_running", "done")], journal
        # The observation the predictor learns from: both jobs at about half speed (one core time-sliced).
        assert len(observed) == 1, observed
        norms = observed[0]["a_norm"], observed[0]["b_norm"]
        assert max(norms) < FLOOR and sum(norms) < 1.25, norms  # about half speed each, far from a gain
        print(f"  observed side by side: {norms[0]:.3f} + {norms[1]:.3f} = {sum(norms):.3f} of solo speed")
        assert len(refused) == 1, refused  # kept for the planner (unit tests: it never pairs them while refused)

        wait_report(c, b, 2)
        jobs = {j.job_id: j for j in c.gateway.snapshot().jobs}
        apart = {j: {(n, i) for n, i, _ in jobs[j].gpu_alloc} for j in (a, b)}
        assert jobs[a].state is JobState.RUNNING and jobs[b].state is JobState.RUNNING
        assert not apart[a] & apart[b] and {n for n, _ in apart[b]} == {first}, apart
        assert core_of(c, a) != core_of(c, b)
        assert "elastico:shape=mb8-fp32-mps100" in jobs[b].admin_comment
    finally:
        c.cancel_all()
