"""Jobs from `squeue --json` (22.05 and 24.11) and `scontrol show job --json` (24.11) as `JobView`s.

Pure functions of the text a command printed; the gateway runs the commands.

Traps handled here (see tests/unit/test_parse.py for the recorded output):

- `gres_detail` has one entry per allocated node, in node order; 22.05
  prints "mps:25(IDX:0)", 24.11 "mps:10(10/100,0/100,...)", which lists
  *this job's* shares on each GPU of the node (not the GPU's total use: two
  jobs on GPU 0 print 10/100 and 35/100 while the node's `gres_used` prints
  45/100). Each becomes the job's `gpu_alloc`, from which `snapshot.build_nodes`
  rebuilds per-GPU use.
- Memory: 22.05 prints `memory_per_node` as null and 24.11 as 0 when the job
  took the default; the requested `mem=` TRES is then the only record.
"""

from __future__ import annotations

import math

from slurm_elastico.errors import ParseError
from slurm_elastico.model import JobState, JobView
from slurm_elastico.slurm.gres import parse_gres_detail, parse_gres_request, parse_tres
from slurm_elastico.slurm.hostlist import expand_hostlist
from slurm_elastico.slurm.schema import Fields, load, state_of

__all__ = ["HELD_REASONS", "parse_squeue"]

HELD_REASONS = frozenset({"JobHeldUser", "JobHeldAdmin"})
"""`state_reason` of a job held by `scontrol hold`/`requeuehold` (user or admin)."""


def _memory_mib(f: Fields, cpus: int, node_count: int) -> int:
    """Memory per node: memory_per_node, else per-CPU x CPUs per node, else the requested TRES.

    22.05 prints memory_per_node as null and 24.11 as 0 when the job took the
    default; the requested `mem=` TRES is then the only record (for the job,
    so it is divided by the node count).
    """
    per_node = f.integer("memory_per_node") or 0
    if per_node > 0:
        return per_node
    per_cpu = f.integer("memory_per_cpu") or 0
    if per_cpu > 0:
        return per_cpu * math.ceil(cpus / max(1, node_count))
    for key in ("tres_alloc_str", "tres_req_str"):
        mem = f.parsed(key, parse_tres).get("mem", 0)
        if mem > 0:
            return mem // max(1, node_count)
    return 0


def _job(f: Fields) -> JobView:
    state, held_flag = state_of(f, "job_state")
    reason = f.text("state_reason")
    priority = f.integer("priority")  # None when absent: not a hold
    nodes = f.parsed("nodes", expand_hostlist)
    node_count = f.integer("node_count") or max(1, len(nodes))
    cpus = f.integer("cpus") or 1
    gres = f.parsed("tres_per_node", parse_gres_request)
    if gres is None and node_count <= 1:
        # --gpus=N asks per job; on one node that is the per-node request.
        gres = f.parsed("tres_per_job", parse_gres_request)
    # gres_detail has one entry per allocated node, in node order.
    alloc: list[tuple[str, int, int]] = []
    for k, (node, detail) in enumerate(zip(nodes, f.strs("gres_detail"))):
        try:
            holds = parse_gres_detail(detail)
        except ParseError as exc:
            raise f.error(f"gres_detail[{k}]", f"= {detail!r}: {exc}") from None
        alloc.extend((node, h.index, 0 if h.whole else h.shares) for h in holds)
    limit = f.integer("time_limit")
    return JobView(
        job_id=f.integer("job_id", required=True),  # type: ignore[arg-type]
        name=f.text("name", required=True),
        user=f.text("user_name", required=True),
        partition=f.text("partition", required=True),
        state=state,
        reason="" if reason == "None" else reason,
        held=state is JobState.PENDING
        and (held_flag or f.raw("hold") is True or priority == 0 or reason in HELD_REASONS),
        gres=gres,
        nodes=nodes,
        gpu_indices=tuple(sorted({i for n, i, _ in alloc if nodes and n == nodes[0]})),
        cpus=cpus,
        memory_mib=_memory_mib(f, cpus, node_count),
        submit_time=f.time("submit_time"),
        start_time=f.time("start_time"),
        end_time=f.time("end_time"),
        time_limit_s=None if limit is None else limit * 60,
        restarts=f.integer("restart_cnt", 0) or 0,
        priority=priority or 0,
        requeue=bool(f.raw("requeue")),
        comment=f.text("comment"),
        admin_comment=f.text("admin_comment"),
        gpu_alloc=tuple(alloc),
        work_dir=f.text("current_working_directory"),
    )


def parse_squeue(text: str, source: str = "squeue --json") -> tuple[JobView, ...]:
    """Jobs from `squeue --json` (both schemas) or `scontrol show job --json` (24.11).

    `held` is true only for a PENDING job that needs a release: priority 0,
    a JobHeld* reason, 24.11's `hold`, or a REQUEUE_HOLD state. A "None"
    reason becomes "".
    """
    doc = load(text, source)
    top = Fields(doc.data, "", doc)
    jobs = top.items("jobs", required=True)
    return tuple(_job(Fields(j, f"jobs[{i}]", doc)) for i, j in enumerate(jobs))
