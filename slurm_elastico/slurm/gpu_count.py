"""A job's whole-GPU request as Slurm holds it, what a version lets the helper change, and the check after.

Verified on a live cluster (Slurm 22.05.8 and 24.11.5, fake GPUs, `tests/slurm/test_gpu_count_live.py`):

- `scontrol update JobId=N Gres=gpu:P NumNodes=K-K NodeList=a,b` on a pending or held job asks for P whole
  GPUs on each of K nodes on both versions; the job then runs on K nodes with P GPUs each (`SLURM_JOB_GPUS`).
  `NumNodes=K` (a single number) is refused by 22.05 ("Node count specification invalid"); `K-K` works on
  both. Slurm scales the task count with the node count; CPUs and memory grow with it but do not shrink back.
- 22.05 accepts `TresPerNode=gres/gpu:P` and `TresPerJob=gres/gpu:G` with exit 0 and shows them, but the
  job still runs on its old GPU count: never use them there. 24.11 honours `TresPerNode=`, and `TresPerJob=`
  only for a job that asked per job (`--gpus`); it refuses `TresPerJob=` on a `--gres` job.
- What squeue's JSON shows at once after that update of a held job (the read-back): `tres_per_node`,
  `required_nodes` and `tres_req_str` (`node=K`, `gres/gpu=P×K`, with CPUs and memory) on both versions.
  `node_count` is updated at once by 24.11 and, on 22.05, only for a job that never ran: on a job that already
  ran (requeued and held) 22.05 keeps the node count of its last run in `node_count` (and in `scontrol show job`'s
  `NumNodes=`) until the job starts again, though it then runs on K nodes. So the node count is read from
  `tres_req_str`'s `node=`, and `node_count` only where the TRES string has none. (22.05's `scontrol show job`
  has no `--json`; its `ReqNodeList=` and `TRES=` lines carry the same new values as the JSON.)
- 22.05 refuses to switch a pending job between `mps` and `gpu` ("Invalid generic resource (gres)
  specification"), and refuses `Gres=gpu:P` on a job that asked per job (`--gpus`); 24.11 switches `mps`↔`gpu`.

Pure functions of squeue's JSON text; the gateway runs the commands.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace

from slurm_elastico.errors import InvalidActionError, SlurmError
from slurm_elastico.slurm.gres import parse_gres_request, parse_tres
from slurm_elastico.slurm.hostlist import expand_hostlist
from slurm_elastico.slurm.nodes import NodeRecord
from slurm_elastico.slurm.schema import Fields, load

__all__ = ["GpuCountMismatch", "GpuRequest", "check_change", "check_type", "cluster_types", "request_of", "verify"]


class GpuCountMismatch(SlurmError):
    """Slurm accepted a GPU-count update but the job's request read back afterwards is not the one asked for."""


@dataclass(frozen=True)
class GpuRequest:
    """One job's GRES request: per node (`kind` "gpu"/"mps", `count`), or per job (`kind` "gpus")."""

    kind: str  # "gpu", "mps", "gpus" or "" (none)
    count: int
    node_count: int
    required_nodes: tuple[str, ...]
    gpu_type: str = ""
    """The GPU type the request names (`gpu:a100:2`); "" for any type."""

    def __str__(self) -> str:
        typed = f"{self.gpu_type}:" if self.gpu_type else ""
        what = f"{self.kind}:{typed}{self.count}" if self.kind else "no GPU"
        pin = f" on {','.join(self.required_nodes)}" if self.required_nodes else ""
        return f"{what} × {self.node_count} node(s){pin}"


def request_of(text: str, job_id: int) -> GpuRequest:
    """The request of `job_id` in `squeue --json` text (22.05 or 24.11); `InvalidActionError` when absent.

    The node count is the one requested (`tres_req_str`'s `node=`), which both versions update at once; see
    the module's docstring for 22.05's stale `node_count` on a requeued job.
    """
    doc = load(text, "squeue --json")
    for i, rec in enumerate(Fields(doc.data, "", doc).items("jobs", required=True)):
        f = Fields(rec, f"jobs[{i}]", doc)
        if f.integer("job_id") != job_id:
            continue
        per_node = f.parsed("tres_per_node", parse_gres_request)
        per_job = f.parsed("tres_per_job", parse_gres_request)
        if per_node is not None:
            kind, count, typ = per_node.kind, per_node.count, per_node.gpu_type
        elif per_job is not None:
            kind, count, typ = "gpus", per_job.count, per_job.gpu_type
        else:
            kind, count, typ = "", 0, ""
        node_count = f.parsed("tres_req_str", parse_tres).get("node") or f.integer("node_count") or 1
        return GpuRequest(kind, count, node_count, f.parsed("required_nodes", expand_hostlist), typ)
    raise InvalidActionError(f"job {job_id} is not in squeue: its GPU count cannot be changed")


def _major_minor(version: str) -> tuple[int, int]:
    parts = version.split(".")
    try:
        return int(parts[0]), int(parts[1])
    except (IndexError, ValueError):
        raise InvalidActionError(f"Slurm version {version!r} is not MAJOR.MINOR[.MICRO]") from None


def check_change(version: str, job_id: int, current: GpuRequest) -> None:
    """Refuse, before any command runs, a GPU-count change this Slurm version would refuse or ignore."""
    if _major_minor(version) >= (23, 0):
        return
    if current.kind == "mps":
        raise InvalidActionError(
            f"job {job_id} asks for an MPS share ({current.kind}:{current.count}); Slurm {version} refuses to "
            "switch a pending job from mps to whole GPUs (Invalid generic resource specification): "
            "resubmit it with --gres=gpu:N, or use Slurm 23.02 or later")
    if current.kind == "gpus":
        raise InvalidActionError(
            f"job {job_id} asks for GPUs per job (--gpus={current.count}); Slurm {version} refuses Gres= on such "
            "a job and ignores TresPerJob=: resubmit it with --gres=gpu:N, or use Slurm 23.02 or later")


def cluster_types(records: Iterable[NodeRecord]) -> tuple[str, ...]:
    """The GPU types the nodes' gres name, in first-seen order (a node of several types adds each)."""
    out: list[str] = []
    for r in records:
        out += [t for t, _ in r.gpu_types if t and t not in out]
    return tuple(out)


def check_type(records: Iterable[NodeRecord], job_id: int, gpu_type: str) -> None:
    """Refuse, before any command runs, a move to a GPU type no node of the cluster has (Slurm compares type
    names ignoring case): `InvalidActionError` naming the type and the types the cluster has."""
    if not gpu_type:
        return
    known = cluster_types(records)
    if gpu_type.lower() not in {t.lower() for t in known}:
        have = f"the types its nodes have are {', '.join(known)}" if known else "its nodes' gres name no GPU type"
        raise InvalidActionError(f"job {job_id} cannot be moved to GPU type {gpu_type!r}: Slurm knows no such type "
                                 f"on this cluster; {have}")


def verify(text: str, job_id: int, gpus: int, nodes: tuple[str, ...] | list[str], argv: list[str],
           gpu_type: str = "") -> GpuRequest:
    """The job's request read back after `argv`; `GpuCountMismatch` naming both when it is not `gpus` of
    `gpu_type` on `nodes` (type names compared ignoring case)."""
    names = expand_hostlist(",".join(nodes))
    count = len(names) or 1
    want = GpuRequest("gpu", gpus // count, count, names, gpu_type)
    got = request_of(text, job_id)
    if replace(got, gpu_type=got.gpu_type.lower()) != replace(want, gpu_type=gpu_type.lower()):
        raise GpuCountMismatch(argv, 0, "", f"job {job_id}: asked Slurm for {want}, it holds {got}")
    return got
