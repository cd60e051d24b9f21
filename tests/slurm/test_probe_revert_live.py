"""Probe and revert through real Slurm: two jobs that really slow each other share a GPU; the helper undoes it.

The fake GPUs share nothing, so each fake GPU is backed here by a clock file: a step is one kernel of
`KERNEL_S` seconds on the job's GPU, run in the GPU's next free slot (taken under a file lock, first come first
served) and waited out asleep. Alone, a job has every slot, about 1 / `KERNEL_S` steps/s; two jobs on one GPU
take turns, each about half of that. That is a co-location that does not pay, measured, not predicted: the test
checks that `elastico sched` sees it from the progress reports, undoes it within a few epochs (the later job
requeued at its whole-GPU shape, journaled), records the observation the predictor learns from, and refuses the
pair.

The family's floor is 0.65 of a GPU's nominal speed (1 / `KERNEL_S`): the jobs run at most half of it side by side,
whatever else the machine runs, so the floor is what the test relies on. The gain rule would revert the pair too
(two jobs taking turns make one GPU's worth, under 1 + `base.MIN_GAIN`), but each solo speed is taken while the
helper shares the machine, so the test does not rest on it.

The jobs hardly use a CPU (they sleep through their kernels), so the slowdown does not depend on the machine's
other load. An earlier version backed each fake GPU by a CPU core, the jobs pinned to it: with other work on two
cores the kernel moved that work off a core the two jobs shared, so sharing cost them little (0.80 to 1.10 of
their solo speed each, load 5 to 9), and the pair was kept.
"""

from __future__ import annotations

import time

import pytest

from slurm_elastico.model import JobState

from live_helpers import KERNEL_S, Cluster, epoch, fake_gpu_program, idle_nodes, solo_rates, until, wait_report

pytestmark = [pytest.mark.live, pytest.mark.alone]  # it times jobs: other tests' CPU use would stretch their steps

SPEED = 1 / KERNEL_S
"""A job's nominal speed alone on a GPU, steps/s."""

PROGRAM = fake_gpu_program()
"""Each step is a kernel on the job's fake GPU (see the module's text); argv[1] is the clocks' directory."""

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
"""On a real GPU the whole of it is faster than half (here both are one clock): a shape no faster than another
that takes less would not be in the family, and the revert needs a whole-GPU shape to move a job to."""
FLOOR = 0.65
"""The jobs' floor, as a fraction of their nominal speed alone on a GPU."""
MAX_EPOCHS = 8
"""A few epochs: warm-up (5 s), two readings >= 5 s apart and 10 s side by side need 3 to 5 of them, 6 s apart."""


def gpu_of(c: Cluster, job_id: int) -> str:
    """The fake GPU the job's latest run took (its output's last "fake GPU node:index" line)."""
    lines = [x for x in c.text(job_id).splitlines() if x.startswith("fake GPU ")]
    assert lines, f"job {job_id} did not say its GPU: {c.text(job_id)}"
    return lines[-1].removeprefix("fake GPU ")


def samples(c: Cluster) -> dict:
    """What the helper accumulated of the jobs' speeds (for a failure's message)."""
    with c.store() as store:
        return {t: [dict(r) for r in store.query(f"SELECT * FROM {t}")]
                for t in ("solo_rate", "pair_rate", "colocation", "pair_refusal")}


def test_a_co_location_that_does_not_pay_is_undone_recorded_and_refused(slurm_cluster, tmp_path):
    program = tmp_path / "contend.py"
    program.write_text(PROGRAM)
    c = Cluster(dict(slurm_cluster.env()), tmp_path, {}, config="planner: {policy: static}\ngpu: {type: fake}\n")
    try:
        first, second = idle_nodes(c)  # no other job on these GPUs
        (tmp_path / "f.yaml").write_text(FAMILY.format(floor=FLOOR * SPEED, speed=SPEED, whole=1.8 * SPEED))
        clocks = tmp_path / "gpus"
        clocks.mkdir()
        a = c.submit("f.yaml", program, str(clocks), options=("-w", first))
        b = c.submit("f.yaml", program, str(clocks), options=("-w", second))
        wait_report(c, a, 0)
        wait_report(c, b, 0)
        assert gpu_of(c, a) != gpu_of(c, b), (c.text(a), c.text(b))  # alone, each on a GPU of its own
        until(c, lambda notes: solo_rates(c) == {a, b}, "a solo rate for each job")
        with c.store() as store:
            alone = {r["job_id"]: r["work"] / r["seconds"] for r in store.query("SELECT * FROM solo_rate")}
        assert min(alone.values()) > FLOOR * SPEED, (
            f"the jobs ran at {alone} steps/s alone, not above their floor {FLOOR * SPEED:.1f} (nominal "
            f"{SPEED:.1f} steps/s): each step took over {1 / (FLOOR * SPEED) - KERNEL_S:.3f} s besides its kernel")

        c.gateway.requeue_with_share(b, 50, (first,))  # b joins a's GPU (Slurm fills a GPU with shares in use)
        wait_report(c, b, 1)
        gpus = {j.job_id: {(n, i) for n, i, _ in j.gpu_alloc} for j in c.gateway.snapshot().jobs}
        assert gpus[a] == gpus[b], f"Slurm placed the jobs on different GPUs ({gpus[a]} vs {gpus[b]})"
        assert gpu_of(c, a) == gpu_of(c, b), ("Slurm placed both on one GPU, yet the jobs saw different ones",
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
        # The observation the predictor learns from: both jobs at about half speed (one GPU's slots taken in turns).
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
        assert gpu_of(c, a) != gpu_of(c, b), (c.text(a), c.text(b))
        assert "elastico:shape=mb8-fp32-mps100" in jobs[b].admin_comment
    finally:
        c.cancel_all()
