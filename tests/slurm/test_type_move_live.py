"""A training job moved between fake GPU types through real Slurm, ending exactly where it would have unmoved.

A local cluster of two fake types (`--gpu-types t4:1,a100:1`: n1 has `Gres=gpu:t4:4`, n2 `Gres=gpu:a100:4`) of
its own, beside the session cluster: the tiny training job (wrappers/examples/train_tiny.py under elastico-submit,
`--gres=gpu:1 --nodelist=n1`: untyped, free to move between types) is moved the helper's way, AdminComment then a
RESHAPE_RUNNING action with gpu_type a100 (requeuehold → SIGTERM → checkpoint → `Gres=gpu:a100:1`, on 22.05,
which keeps a job's first type, `Gres=gpu:1 ExcNodeList=n1` → StartTime=now → release), and its final parameters
are compared with a run that never moved. Slurm 22.05 here, 24.11 through etc/dev/other-slurm.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from slurm_elastico.cluster import LocalCluster, pacing
from slurm_elastico.errors import InvalidActionError, SlurmError
from slurm_elastico.model import Action, ActionKind, GresRequest, JobState
from slurm_elastico.sim.truth import GroundTruth
from slurm_elastico.slurm.gpu_count import TYPED_UPDATE_FROM

from conftest import worker_index
from live_helpers import BIN, EXAMPLES, Cluster, epoch, wait_for
from test_wrappers_live import params, steps_after

pytestmark = pytest.mark.live

PORT_BASE = 27617
"""Ports of this module's typed cluster (slurmd at base + 184): above test_cluster_live's, 100 apart per worker."""
FAMILY = """kind: train
global_batch: 32
micro_batches: [8, 16]
precisions: [fp32]
checkpointing: [false]
steps: 20
mps_shares: [100]
default: mb8-fp32-mps100
"""
PACED = Path(__file__).resolve().parents[2] / "wrappers" / "demo" / "train_paced.py"
SLEEPER = "#!/bin/bash\necho up on $SLURMD_NODENAME restarts=${SLURM_RESTART_COUNT:-0}\nwhile true; do sleep 0.1; done\n"


@pytest.fixture(scope="module")
def typed(tmp_path_factory, worker_id):
    """A running cluster of two fake types, n1 t4 and n2 a100 (4 GPUs each), with accounting (the what-if's
    sacct), and a Cluster of jobs on it."""
    cluster = LocalCluster(tmp_path_factory.mktemp("typed"), gpu_types="t4:1,a100:1", accounting=True,
                           port_base=PORT_BASE + 100 * worker_index(worker_id))
    try:
        cluster.up()
        c = Cluster(dict(cluster.env()), tmp_path_factory.mktemp("typed-jobs"), {"train.yaml": FAMILY},
                    config="gpu:\n  types:\n    t4: {memory_mib: 15360}\n    a100: {memory_mib: 40960}\n")
        (c.root / "sleeper.sh").write_text(SLEEPER)
        yield cluster, c
        c.cancel_all()
    finally:
        cluster.down()


def sbatch(c: Cluster, *options: str) -> int:
    done = subprocess.run(["sbatch", "--parsable", "--requeue", f"--output={c.root}/%j.out", *options,
                           str(c.root / "sleeper.sh")], env=c.env, capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    job = int(done.stdout.split(";")[0])
    c.ids.append(job)
    return job


def running_on(c: Cluster, job: int, restarts: int = 0):
    return wait_for(lambda: (lambda v: v if v.state is JobState.RUNNING and v.restarts >= restarts and v.nodes else None)(
        c.gateway.job(job)), f"job {job} running (restarts {restarts})", timeout=60)


def test_the_snapshot_has_each_nodes_type_and_its_memory(typed):
    cluster, c = typed
    c.gateway.type_memory = {"t4": 15360, "a100": 40960}
    nodes = {n.name: n for n in c.gateway.snapshot().nodes}
    assert [(nodes[n].gpu_type, nodes[n].gpu_memory_mib, len(nodes[n].gpus)) for n in ("n1", "n2")] == [
        ("t4", 15360, 4), ("a100", 40960, 4)]
    assert all(g.shares_total == 100 for n in nodes.values() for g in n.gpus)  # MPS keeps its 100 shares per GPU


def typed_slurm(cluster: LocalCluster) -> bool:
    """Whether this Slurm replaces a job's GPU request by `Gres=gpu:TYPE:N` (24.11; 22.05 keeps a job's first
    type, so there an untyped job reaches a100 by `ExcNodeList=`: `gpu_count.plan_update`)."""
    return cluster.spec.version >= TYPED_UPDATE_FROM


def test_training_moved_from_t4_to_a100_ends_bit_identical_to_the_unmoved_run(typed):
    cluster, c = typed
    # Untyped, so the job may move between types (a typed --gres limits its family to that type), started on t4.
    on_t4 = ("--gres=gpu:1", "--nodelist=n1")
    script, common = EXAMPLES / "train_tiny.py", ("--deterministic", "--step-sleep", "0.3")
    ref = c.submit("train.yaml", script, *common, options=on_t4)
    seed = c.submit("train.yaml", script, *common, "--data-seed", "1", options=on_t4)
    job = c.submit("train.yaml", script, *common, options=on_t4)
    assert running_on(c, job).nodes == ("n1",)
    # The family's shape on t4, and the same on a100: "mb8-fp32-mps100", or "...@t4" and "...@a100" where the
    # families are enumerated per type of gpu.types.
    first = c.wait_text(job, lambda t: re.search(r"train_tiny: shape (\S+):", t), "the program on t4")
    shape = re.search(r"train_tiny: shape (\S+):", first).group(1)
    target = shape.replace("@t4", "@a100")
    c.wait_text(job, lambda t: steps_after(t, f"train_tiny: shape {shape}:") >= 4, "4 steps on t4")
    began = time.monotonic()
    c.gateway.set_admin_comment(job, f"elastico:shape={target}")
    c.gateway.apply(Action(ActionKind.RESHAPE_RUNNING, job, "to a100", gpus=1, gpu_type="a100"))
    view = running_on(c, job, restarts=1)
    again = c.wait_text(job, lambda t: t.count("train_tiny: shape ") >= 2, "the program again")
    moved_s = time.monotonic() - began
    assert re.findall(r"train_tiny: shape (\S+):", again)[1] == target and view.nodes == ("n2",)
    assert view.gres == GresRequest("gpu", 1, "a100" if typed_slurm(cluster) else "")
    for j in (ref, seed, job):
        c.wait_done(j, timeout=180)
    runs = c.summaries(job)
    assert [r["status"] for r in runs] == ["checkpointed", "done"], c.text(job)
    assert runs[1]["resumed_from"] == runs[0]["step"] and sum(r["steps_run"] for r in runs) == 20
    reference = params(c.ckpt(ref))
    assert torch.equal(params(c.ckpt(job)), reference)  # same shape on another type: bit for bit
    assert runs[-1]["params_sha256"] == c.summaries(ref)[-1]["params_sha256"]
    assert not torch.equal(params(c.ckpt(seed)), reference)
    print(f"\nt4 -> a100 move on Slurm {cluster.spec.version}: the program running again {moved_s:.1f} s after the "
          "helper's action")


def test_a_move_slurm_would_strand_is_refused_before_the_job_is_touched(typed):
    """Slurm accepts an unknown type, another case or too many GPUs with exit 0 and the job then never runs."""
    cluster, c = typed
    job = sbatch(c, *(("--gres=gpu:t4:1",) if typed_slurm(cluster) else ("--gres=gpu:1", "--nodelist=n1")))
    # the job's partition holds both types' nodes: the types it could reach are named
    refusals = [(job, 1, "h100", f"GPU type 'h100': Slurm knows no such type on its partition "
                                 f"{c.gateway.job(job).partition}; the types its nodes have are t4, a100"),
                (job, 1, "A100", "GPU type 'A100'"),
                (job, 8, "a100", "8 GPU(s) of type a100 on each of 1 node(s): 0 node(s) have that many (n2: 4)")]
    if not typed_slurm(cluster):  # 22.05 keeps a job's first type
        refusals.append((sbatch(c, "--gres=gpu:t4:1"), 1, "a100", "keeps the type a job was submitted with"))
    for j, gpus, kind, said in refusals:
        running_on(c, j)
        with pytest.raises(InvalidActionError) as e:
            c.gateway.requeue_with_gpus(j, gpus, gpu_type=kind)
        assert said in str(e.value)
    for j in {r[0] for r in refusals}:
        view = c.gateway.job(j)
        assert view.state is JobState.RUNNING and not view.held and view.restarts == 0


def test_an_update_slurm_refuses_after_the_hold_releases_the_job_on_its_old_request(typed):
    """The guarantee the executor relies on: a requeue whose update fails leaves no job held (no node n9 exists:
    only Slurm, after the hold, says so)."""
    cluster, c = typed
    job = sbatch(c, "--gres=gpu:1", "--nodelist=n2")
    running_on(c, job)
    with pytest.raises(SlurmError, match="Invalid node name"):
        c.gateway.requeue_with_gpus(job, 1, ("n9",))
    view = running_on(c, job, restarts=1)
    assert not view.held and view.gres == GresRequest("gpu", 1) and view.nodes == ("n2",)


def test_a_pending_job_gets_its_type_and_runs_on_it(typed):
    cluster, c = typed
    job = sbatch(c, "--hold", "--gres=gpu:1")
    c.gateway.set_gpus(job, 2, gpu_type="a100")
    assert c.gateway.job(job).gres == GresRequest("gpu", 2, "a100" if typed_slurm(cluster) else "")
    c.gateway.release(job)
    view = running_on(c, job)
    assert view.nodes == ("n2",) and len(view.gpu_indices) == 2


def test_a_paced_job_steps_at_its_node_types_speed(typed):
    """The demo's paced training program (wrappers/demo/train_paced.py, plain sbatch) on each type: the rate it
    paces to is the simulator truth's times the type's speed (t4 1, a100 4.8), read from the cluster's saved
    settings beside the SLURM_CONF the job inherits."""
    cluster, c = typed
    emulated = pacing.Emulated("train", "bert", 12)
    truth_rate = pacing.rate(GroundTruth(), emulated, pacing.Knobs(micro_batch=12), 100)
    (c.root / "paced.sh").write_text(f"#!/bin/bash\nexec {sys.executable} {PACED} \"$@\"\n")
    jobs = {}
    for node in ("n1", "n2"):
        done = subprocess.run(["sbatch", "--parsable", f"--output={c.root}/%j.out", "--gres=gpu:1", f"--nodelist={node}",
                               str(c.root / "paced.sh"), "--emulate", emulated.to_json(), "--pace-dir",
                               str(c.root / "pace"), "--steps", "6", "--ckpt-dir", str(c.root / f"paced-{node}")],
                              env=c.env, capture_output=True, text=True, timeout=30)
        assert done.returncode == 0, done.stderr
        jobs[node] = int(done.stdout.split(";")[0])
        c.ids.append(jobs[node])
    rates = {}
    for node, job in jobs.items():
        text = c.wait_text(job, lambda t: '"status": "done"' in t, f"the paced job on {node} to finish", timeout=120)
        rates[node] = float(re.findall(r"^step \d+/6 .* rate ([\d.]+)/s$", text, re.M)[-1])
    assert rates["n1"] == pytest.approx(truth_rate, rel=1e-3) and rates["n2"] == pytest.approx(4.8 * truth_rate, rel=1e-3)


def test_the_helper_starts_each_job_on_its_own_partitions_type(typed):
    """One partition per type (t4p: n1, a100p: n2, made beside the default one), the helper managing every
    partition: of two jobs waiting out a BeginTime, the one of t4p,a100p is started on the a100 node (its shapes
    there are faster), the one of t4p alone on t4 (`planner.partitions`). Slurm accepts `NodeList=n2` for a job of
    t4p, which then never starts: the helper did just that before it read the jobs' partitions."""
    cluster, c = typed
    have = {p.name for p in c.gateway.snapshot().partitions}
    for name, node in (("t4p", "n1"), ("a100p", "n2")):
        argv = ["scontrol", "update" if name in have else "create", f"PartitionName={name}", f"Nodes={node}",
                "State=UP"]
        done = subprocess.run(argv, env=c.env, capture_output=True, text=True, timeout=30)
        assert done.returncode == 0, done.stderr
    (c.root / "small.yaml").write_text(FAMILY + "host_mem_mib: 2048\n")  # the fake nodes have 8,000 MiB each
    sleeper, later = c.root / "sleeper.sh", "--begin=now+3600"
    only_t4 = c.submit("small.yaml", sleeper, options=("--partition=t4p", "--gres=gpu:1", later))
    either = c.submit("small.yaml", sleeper, options=("--partition=t4p,a100p", "--gres=gpu:1", later))
    actions = epoch(c)["actions"]
    assert actions and all(a["status"] == "done" and not a["error"] for a in actions), actions
    assert {a["job_id"]: tuple(a["nodes"]) for a in actions if a["kind"] == "set_nodes"} == {
        only_t4: ("n1",), either: ("n2",)}, actions
    assert running_on(c, only_t4).nodes == ("n1",) and running_on(c, either).nodes == ("n2",)


def test_the_whatif_of_a_typed_history_runs_each_type_and_keeps_a_typed_job_on_its_type(typed):
    """Real sacct and a real typed snapshot: two `gpu:t4:4` jobs one after the other on n1 (the second waits for
    the first though n2 is idle), then an untyped job that ran on n2 (the a100). `elastico whatif` runs each type at
    its prior's speed (gpu_speedups), finds every job's node (no type guessed), and its plain Slurm reproduces the
    history: the second t4 job waits for the t4 node again, and the untyped job, calibrated on the a100 it ran on,
    takes as long as it did."""
    from test_whatif_live import quiet_window

    from slurm_elastico.history.past import past_jobs

    cluster, c = typed
    c.cancel_all()  # the sleepers of this module's earlier tests
    since = quiet_window(c)
    ours = []
    for gres, seconds in (("gpu:t4:4", 8), ("gpu:t4:4", 8), ("gpu:4", 5)):
        path = c.root / f"w{len(ours)}.sh"
        path.write_text(f"#!/bin/bash\nsleep {seconds}\n")
        done = subprocess.run(["sbatch", "--parsable", f"--output={c.root}/%j.out", f"--gres={gres}",
                               "--job-name=whatif-typed", str(path)], env=c.env, capture_output=True, text=True,
                              timeout=30)
        assert done.returncode == 0, done.stderr
        ours.append(int(done.stdout.split(";")[0]))
        c.ids.append(ours[-1])
        time.sleep(0.5)

    def ended():
        jobs, _ = past_jobs(c.gateway.sacct(start=since))
        mine = [j for j in jobs if int(j.job_id) in ours]
        return mine if len(mine) == 3 and all(j.end is not None for j in mine) else None

    jobs = {int(j.job_id): j for j in wait_for(ended, "accounting to show the three jobs ended", 120)}
    # sacct names the type asked (AccountingStorageTRES lists gres/gpu:t4), the node each ran on and the type it got
    assert [(jobs[j].gpu_type, jobs[j].ran_on, jobs[j].ran_type) for j in ours] == [
        ("t4", "n1", "t4"), ("t4", "n1", "t4"), ("", "n2", "a100")]
    assert jobs[ours[1]].wait_s >= 5
    cli = subprocess.run([str(BIN / "elastico"), "--config", str(c.root / "elastico.yaml"), "whatif", "--since", since,
                          "--epoch-s", "5", "--assume", "none", "--json"], env=c.env, capture_output=True, text=True,
                         timeout=300)
    assert cli.returncode == 0, cli.stderr
    out = json.loads(cli.stdout.strip().splitlines()[-1])
    print(f"typed what-if: {out['gpu_speedups']}, notes {out['notes']}, measured {out['measured']}, static "
          f"{out['static']}")
    assert set(out["gpu_speedups"]) == {"t4", "a100"} and out["gpu_speedups"]["a100"] > 1.5 * out["gpu_speedups"]["t4"]
    assert out["notes"] == {} and "GPU types" in cli.stdout
    assert out["replay"]["compared"] == 3 and out["replay"]["median_start_error_s"] <= 2
    measured, static = out["measured"], out["static"]
    assert static["mean_wait_s"]["value"] == pytest.approx(measured["mean_wait_s"], abs=2)
    assert static["mean_jct_s"]["value"] == pytest.approx(measured["mean_jct_s"], abs=3)
