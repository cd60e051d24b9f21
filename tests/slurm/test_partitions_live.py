"""Partitions through real Slurm, on the session cluster (4 nodes of 4 fake GPUs): a job submitted to two
partitions gets its data-parallel gang within one of them.

Slurm allocates a job in one of its partitions (`sbatch -p pa,pb`): a gang spread over a node of pa and a node of
pb is a request Slurm leaves pending for good. The helper managing every partition must then plan the gang within
one (`Seat.gang_nodes`, `allot.Claim.node_sets`): it did not, and asked for 8 GPUs over both every epoch.
"""

from __future__ import annotations

import subprocess

import pytest

from slurm_elastico.model import JobState

from live_helpers import Cluster, epoch, idle_nodes, wait_for

pytestmark = pytest.mark.live

GANG = """kind: train
global_batch: 32
micro_batches: [4]
precisions: [fp32]
checkpointing: [false]
steps: 20
mps_shares: [100]
gpus: [1, 2, 4, 8]
gpus_per_node: 4
cpus: 1
host_mem_mib: 512
"""
"""Estimated faster on more GPUs (8 ranks: 3.2 steps/s, 4: 1.6), so alone on idle nodes it would take all 8."""
SLEEPER = "#!/bin/bash\necho up on $SLURM_JOB_NODELIST\nwhile true; do sleep 0.1; done\n"


def test_a_job_of_two_partitions_gets_its_gang_within_one_of_them(slurm_cluster, tmp_path):
    """pa is n1 and n2, pb n3 and n4 (made at run time beside the default partition); jobs without a family hold
    n2 and n3 whole. A job of pa,pb whose family runs fastest on 8 GPUs (which either partition holds, so
    elastico-submit takes it) gets 4 on n1 or n4, and Slurm runs it there; not 8 over n1 and n4."""
    c = Cluster(dict(slurm_cluster.env()), tmp_path, {"gang.yaml": GANG})
    (c.root / "sleeper.sh").write_text(SLEEPER)
    idle_nodes(c)
    n1, n2, n3, n4 = sorted(n.name for n in c.gateway.snapshot().nodes if n.usable)[:4]
    made = []
    try:
        for name, nodes in (("pa", f"{n1},{n2}"), ("pb", f"{n3},{n4}")):
            done = subprocess.run(["scontrol", "create", f"PartitionName={name}", f"Nodes={nodes}", "State=UP"],
                                  env=c.env, capture_output=True, text=True, timeout=30)
            assert done.returncode == 0, done.stderr
            made.append(name)
        for node in (n2, n3):  # held whole by jobs the helper does not manage
            done = subprocess.run(["sbatch", "--parsable", f"--nodelist={node}", "--gres=gpu:4",
                                   f"--output={c.root}/%j.out", str(c.root / "sleeper.sh")],
                                  env=c.env, capture_output=True, text=True, timeout=30)
            assert done.returncode == 0, done.stderr
            c.ids.append(int(done.stdout.split(";")[0]))
        for held in c.ids:
            wait_for(lambda: c.gateway.job(held).state is JobState.RUNNING, f"job {held} running", timeout=60)
        job = c.submit("gang.yaml", c.root / "sleeper.sh",
                       options=("--partition=pa,pb", "--gres=gpu:1", "--begin=now+3600"))
        actions = epoch(c)["actions"]
        mine = [a for a in actions if a["job_id"] == job]
        assert mine and all(a["status"] == "done" and not a["error"] for a in mine), actions
        sized = [(a["gpus"], tuple(a["nodes"])) for a in mine if a["kind"] == "set_gpus"]
        assert sized in ([(4, (n1,))], [(4, (n4,))]), mine
        view = wait_for(lambda: (v := c.gateway.job(job)).state is JobState.RUNNING and v.nodes and v,
                        f"job {job} running", timeout=60)
        assert view.nodes == sized[0][1] and len({(n, g) for n, g, _ in view.gpu_alloc}) == 4, view
    finally:
        c.cancel_all()
        for name in made:
            subprocess.run(["scontrol", "delete", f"PartitionName={name}"], env=c.env, capture_output=True,
                           text=True, timeout=30)
