"""A job whose family lists GPU counts runs one process per GPU under elastico-run, through the real local cluster.

Submitted with elastico-submit on one whole GPU; moved the way the helper moves it: AdminComment
`elastico:shape=<n-GPU shape>` first, then the gateway's `requeue_with_gpus` (requeuehold → SIGTERM → every rank
exits 75 → `Gres=gpu:P NumNodes=K-K` → release); and new knobs on the GPUs it holds the helper's in-place way
(AdminComment, then USR1 to the batch step: every rank exits 75 and is relaunched, no requeue). Each rank prints
its torch env:// variables, node and GPUs, so the test sees every rank of every run (Slurm 22.05 here, 24.11
through etc/dev/other-slurm).
"""

from __future__ import annotations

import json
import re
import time

import pytest

from slurm_elastico.model import GresRequest, JobState

from live_helpers import EXAMPLES, GRACE_S, Cluster
from test_wrappers_live import params, rel_diff, steps_after

pytestmark = pytest.mark.live

FAMILY = """kind: train
global_batch: 16
micro_batches: [2, 4]
precisions: [fp32]
checkpointing: [false]
steps: 20
mps_shares: [100]
gpus: [1, 2, 4]
gpus_per_node: 4
default: mb4-fp32-mps100
"""

RANKS = r"""#!/usr/bin/env python3
import os, signal, sys, time
e = os.environ
stop = []
signal.signal(signal.SIGUSR1, lambda *a: stop.append("USR1"))
signal.signal(signal.SIGTERM, lambda *a: stop.append("TERM"))
print("rank {} of {} local {} master {}:{} shape {} ranks {} node {} gpus {}".format(
    e.get("RANK", "-"), e.get("WORLD_SIZE", "-"), e.get("LOCAL_RANK", "-"), e.get("MASTER_ADDR", "-"),
    e.get("MASTER_PORT", "-"), e.get("ELASTICO_SHAPE"), e.get("ELASTICO_RANKS"), e.get("SLURMD_NODENAME"),
    e.get("CUDA_VISIBLE_DEVICES")), flush=True)
while not stop:
    if os.path.exists(os.path.join(e["ELASTICO_CKPT_DIR"], "done")):
        sys.exit(0)
    time.sleep(0.05)
print("rank {} stopping on {}".format(e.get("RANK", "-"), stop[0]), flush=True)
sys.exit(75)
"""

LINE = re.compile(r"^rank (\S+) of (\S+) local (\S+) master (\S+) shape (\S+) ranks (\S+) node (\S+) gpus (\S+)$")


def rank_lines(text: str) -> list[list[tuple[str, ...]]]:
    """Per start of the program (a line 'starting the program'), the rank lines printed after it."""
    runs: list[list[tuple[str, ...]]] = []
    for line in text.splitlines():
        if "starting the program as shape" in line:
            runs.append([])
        elif (m := LINE.match(line)) and runs:
            runs[-1].append(m.groups())
    return runs


@pytest.fixture
def cluster(slurm_cluster, tmp_path):
    c = Cluster(dict(slurm_cluster.env()), tmp_path, {"ranks.yaml": FAMILY})
    (tmp_path / "ranks.py").write_text(RANKS)
    yield c
    c.cancel_all()


def wait_ranks(c: Cluster, job: int, run: int, ranks: int) -> list[tuple[str, ...]]:
    c.wait_text(job, lambda t: len(rank_lines(t)) >= run and len(rank_lines(t)[run - 1]) >= ranks,
                f"start {run} with {ranks} rank(s)", timeout=60)
    return sorted(rank_lines(c.text(job))[run - 1])


def move(c: Cluster, job: int, shape: str, gpus: int, nodes: tuple[str, ...] = ()) -> float:
    """The helper's move: the shape in the AdminComment, then the requeue to `gpus` whole GPUs; its start time.

    The gateway reads the change back (a node-count change included: 22.05 shows a requeued job's new node count
    in `tres_req_str` at once, not in `node_count`) and sets `StartTime=now` itself on both versions.
    """
    began = time.monotonic()
    c.gateway.set_admin_comment(job, f"elastico:shape={shape}")
    c.gateway.requeue_with_gpus(job, gpus, nodes)
    return began


def test_every_rank_runs_once_per_gpu_with_its_rank_variables_through_1_2_4_1_gpus(cluster):
    c = cluster
    job = c.submit("ranks.yaml", c.root / "ranks.py", options=("--gres=gpu:1", "--nodes=1"))
    one = wait_ranks(c, job, 1, 1)
    assert [r[:3] for r in one] == [("-", "-", "-")] and one[0][4:6] == ("mb4-fp32-mps100", "1")  # no srun for 1
    seen = []
    legs = (("mb4-fp32-gpus2", 2, ()), ("mb2-fp32-gpus4", 4, ()), ("mb2-fp32-gpus4", 4, ("n2", "n3")),
            ("mb2-fp32-mps100", 1, ()))
    run = 1
    for shape, gpus, nodes in legs:
        run += 1
        began = move(c, job, shape, gpus, nodes)
        ranks = wait_ranks(c, job, run, gpus)
        seen.append((f"{gpus} GPU(s) on {len(nodes) or 1} node(s)", time.monotonic() - began))
        assert len(ranks) == gpus
        if gpus == 1:
            assert ranks[0][:3] == ("-", "-", "-") and ranks[0][4] == shape
            continue
        assert [r[0] for r in ranks] == [str(i) for i in range(gpus)]  # RANK 0..n-1, each once
        assert {r[1] for r in ranks} == {str(gpus)} and {r[5] for r in ranks} == {str(gpus)}  # WORLD_SIZE, ELASTICO_RANKS
        assert len({r[3] for r in ranks}) == 1 and {r[4] for r in ranks} == {shape}  # one rendezvous, one shape
        per_node = gpus // max(1, len(nodes))
        assert sorted(r[2] for r in ranks) == sorted(str(i % per_node) for i in range(gpus))  # LOCAL_RANK
        if nodes:
            assert {r[6] for r in ranks} == set(nodes)
        assert all(len(r[7].split(",")) == per_node for r in ranks)  # each rank sees its node's GPUs
        view = c.gateway.job(job)
        assert view.gres == GresRequest("gpu", per_node) and view.state is JobState.RUNNING
        if nodes:  # new knobs on the GPUs it holds, the helper's way (a USR1, no requeue): every rank relaunched
            held, restarts = view.gpu_alloc, view.restarts
            began = time.monotonic()
            c.gateway.set_admin_comment(job, "elastico:shape=mb4-fp32-gpus4")
            c.gateway.signal(job, "USR1")
            again = wait_ranks(c, job, run + 1, gpus)
            seen.append(("new knobs in place", time.monotonic() - began))
            assert {r[4] for r in again} == {"mb4-fp32-gpus4"} and {r[6] for r in again} == set(nodes)
            assert [r[0] for r in again] == [str(i) for i in range(gpus)]
            view = c.gateway.job(job)
            assert (view.gpu_alloc, view.restarts, view.state) == (held, restarts, JobState.RUNNING)
            assert c.text(job).count("stopping on USR1") == gpus
            run += 1
    text = c.text(job)
    assert text.count("stopping on TERM") == 1 + 2 + 4 + 4, text  # every rank of every moved run got the SIGTERM
    (c.ckpt(job) / "done").write_text("")
    c.wait_done(job)
    print("\nGPU-count moves and the in-place relaunch, action to every rank running: "
          + ", ".join(f"-> {g} {s:.1f} s" for g, s in seen))


# ----------------------------------------------------------------------------- data-parallel training

TRAIN_FAMILY = """kind: train
global_batch: 32
micro_batches: [4, 8, 16]
precisions: [fp32]
checkpointing: [false]
steps: 20
mps_shares: [100]
gpus: [1, 3, 4]
gpus_per_node: 4
default: mb8-fp32-mps100
"""


TRAIN_GRACE_S = 15


@pytest.mark.alone  # it asserts every stop of four ranks ends inside the grace: under make test's six workers on
# two cores, the four ranks' step, agreement, save and exit took over 15 s (twice, on Debian 12 and 13); alone, 42 s
# for the whole test with its cluster's start
def test_training_reshaped_1_3_4_1_ranks_ends_within_rounding_of_the_one_rank_run(slurm_cluster, tmp_path):
    """Micro-batch x accumulation x ranks: 8x4x1 -> 3 ranks (11 + 11 + 10, in micro-batches of 8 and 3) -> 4x2x4
    -> 16x2x1, the helper's way, against one rank: three ranks do not divide the batch of 32."""
    c = Cluster(dict(slurm_cluster.env()), tmp_path, {"train.yaml": TRAIN_FAMILY})
    # Four ranks on two CPUs need more than live_helpers' 3 s to finish their step, agree, save and exit (KillWait
    # is 30 s): with 3 s elastico-run kills srun after rank 0's checkpoint is on disk, which loses nothing but
    # leaves the ranks to Slurm's KillWait and hides how long a clean stop takes.
    config = c.root / "elastico.yaml"
    config.write_text(config.read_text().replace(f"grace_s: {GRACE_S},", f"grace_s: {TRAIN_GRACE_S},"))
    script, common, gpu = EXAMPLES / "train_tiny.py", ("--deterministic", "--step-sleep", "0.3"), ("--gres=gpu:1",)
    try:
        ref = c.submit("train.yaml", script, *common, options=gpu)
        seed = c.submit("train.yaml", script, *common, "--data-seed", "1", options=gpu)
        job = c.submit("train.yaml", script, *common, options=gpu)
        legs = (("mb8-fp32-gpus3", 3), ("mb4-fp32-gpus4", 4), ("mb16-fp32-mps100", 1))
        current, moves = "mb8-fp32-mps100", []
        for shape, gpus in legs:
            c.wait_text(job, lambda t, s=current: steps_after(t, f"train_tiny: shape {s}:") >= 4, f"4 steps as {current}",
                        timeout=120)
            stops = c.text(job).count("after the stop signal")
            began = move(c, job, shape, gpus)
            times = []
            for what, seen in (("every rank stopped", lambda t, n=stops: t.count("after the stop signal") > n),
                               ("elastico-run started again", lambda t, s=shape: f"program as shape {s} " in t),
                               ("the program running", lambda t, s=shape: f"train_tiny: shape {s}:" in t),
                               ("its first step", lambda t, s=shape: steps_after(t, f"train_tiny: shape {s}:") >= 1)):
                c.wait_text(job, seen, f"{shape}: {what}", timeout=120)
                times.append(f"{what} {time.monotonic() - began:.1f} s")
            moves.append(f"-> {gpus} rank(s): {', '.join(times)}")
            current = shape
        for j in (ref, seed, job):
            c.wait_done(j, timeout=180)
        text = c.text(job)
        runs = c.summaries(job)  # rank 0's, one per run
        assert [r["status"] for r in runs] == ["checkpointed"] * 3 + ["done"], text
        assert all(runs[i + 1]["resumed_from"] == runs[i]["step"] for i in range(3))
        assert sum(r["steps_run"] for r in runs) == 20  # no step lost or repeated across world sizes
        for shape, line in (("mb8-fp32-gpus3", "micro 8 x 2 at most a rank, 3 ranks of 11 + 11 + 10 = 32"),
                            ("mb4-fp32-gpus4", "micro 4 x 2 x 4 ranks = 32"), ("mb16-fp32-mps100", "micro 16 x 2 = 32")):
            assert f"train_tiny: shape {shape}: {line}" in text, shape
        assert c.gateway.job(job).restarts == 3
        assert "did not exit within" not in text, text  # every multi-rank stop was clean, inside the grace
        reference = params(c.ckpt(ref))
        reshaped = rel_diff(reference, params(c.ckpt(job)))
        other = rel_diff(reference, params(c.ckpt(seed)))
        print("\nGPU-count moves, seconds after the helper's action:\n  " + "\n  ".join(moves))
        print(f"max relative parameter difference vs the uninterrupted one-rank run: reshaped 1 -> 3 -> 4 -> 1 ranks "
              f"(8x4x1 -> 11+11+10 -> 4x2x4 -> 16x2x1): {reshaped:.2e}; another data seed: {other:.2e}")
        assert reshaped <= 1e-5, "a rank or micro-batch change should differ only by summation-order rounding"
        assert other > 1e3 * max(reshaped, 1e-9)
    finally:
        c.cancel_all()


# ----------------------------------------------------------------------------- inference replicas

INFER_FAMILY = """kind: infer
requests: 24
gpu_memory_utilization: [0.9]
max_num_seqs: [2]
kv_cache_dtype: [auto]
mps_shares: [100]
gpus: [1, 2]
parallel: replicas
default: gmu0.9-seqs2-kvauto-mps100
"""


def test_inference_moved_1_2_1_engine_replicas_answers_each_request_exactly_once(slurm_cluster, tmp_path):
    """The CPU engine (`infer_tiny.py --engine torch`): 1 replica, then 2 (each its share of the request list, its own
    journal shard), then 1 again, moved the helper's way; the journal shards hold every request once, as the
    uninterrupted one-replica run wrote them."""
    from slurm_elastico.runtime.journal import journal_shards

    c = Cluster(dict(slurm_cluster.env()), tmp_path, {"infer.yaml": INFER_FAMILY})
    args, gpu = ("--requests", str(EXAMPLES / "requests.jsonl"), "--batch-sleep", "0.8"), ("--gres=gpu:1",)
    one, two = "gmu0.9-seqs2-kvauto-mps100", "gmu0.9-seqs2-kvauto-dp2"
    try:
        ref = c.submit("infer.yaml", EXAMPLES / "infer_tiny.py", *args, options=gpu)
        job = c.submit("infer.yaml", EXAMPLES / "infer_tiny.py", *args, options=gpu)
        c.wait_text(job, lambda t: "journaled 4/24" in t, "two batches on one replica", timeout=120)
        move(c, job, two, 2)
        c.wait_text(job, lambda t: t.count(f"infer_tiny: shape {two}:") == 2 and "journaled" in t.split(two)[-1],
                    "both replicas answering", timeout=120)
        move(c, job, one, 1)
        c.wait_done(job, timeout=180)
        c.wait_done(ref, timeout=180)
    finally:
        c.cancel_all()
    text = c.text(job)
    runs = c.summaries(job)  # one per replica per run
    assert [r["status"] for r in runs] == ["checkpointed"] * 3 + ["done"], text
    assert sum(r["written"] for r in runs) == 24

    def records(job_id):
        return [json.loads(line) for p in journal_shards(c.ckpt(job_id) / "journal.jsonl")
                for line in p.read_text().splitlines()]

    got, want = records(job), records(ref)
    ids = [r["id"] for r in got]
    assert len(ids) == len(set(ids)) == 24  # each request answered exactly once over the three runs
    assert {r["shape"] for r in got} == {one, two}
    key = lambda rs: sorted((r["id"], r["text"], r["token_ids"]) for r in rs)  # noqa: E731
    assert key(got) == key(want)
    print(f"\ninference 1 -> 2 -> 1 replicas: {len(ids)} requests, each once; shards "
          f"{[p.name for p in journal_shards(c.ckpt(job) / 'journal.jsonl')]}")


def test_elastico_submit_checks_gpu_counts_against_the_partitions_real_nodes(cluster):
    """The partition check reads the live cluster's nodes (4 fake GPUs each): too many per node is refused before
    anything reaches Slurm; a family that fits is submitted."""
    c = cluster
    (c.root / "wide.yaml").write_text(FAMILY.replace("gpus_per_node: 4", "gpus_per_node: 8"))
    before = {j.job_id for j in c.gateway.jobs()}
    refused = c.submit_cmd("-p", "debug", "--family", "wide.yaml", str(c.root / "ranks.py"))
    assert refused.returncode == 2, refused.stderr
    assert "gpus_per_node: 8" in refused.stderr and "at most 4" in refused.stderr, refused.stderr
    assert "nothing was submitted" in refused.stderr
    assert not {j.job_id for j in c.gateway.jobs()} - before  # nothing new (earlier tests' jobs may age out meanwhile)
    job = c.submit("ranks.yaml", c.root / "ranks.py", options=("-p", "debug"))
    assert c.gateway.job(job).job_id == job
