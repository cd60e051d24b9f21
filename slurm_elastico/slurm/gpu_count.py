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
from slurm_elastico.model import partition_names
from slurm_elastico.slurm import commands
from slurm_elastico.slurm.gres import parse_gres_request, parse_tres
from slurm_elastico.slurm.hostlist import expand_hostlist
from slurm_elastico.slurm.nodes import NodeRecord
from slurm_elastico.slurm.schema import Fields, load

__all__ = ["GpuCountMismatch", "GpuRequest", "GpuUpdate", "check_change", "check_type", "cluster_types", "plan_update",
           "request_of", "verify"]


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
    excluded_nodes: tuple[str, ...] = ()
    """Nodes the job may not run on (`ExcNodeList=`): how a 22.05 job is kept to a type (`plan_update`)."""

    def __str__(self) -> str:
        typed = f"{self.gpu_type}:" if self.gpu_type else ""
        what = f"{self.kind}:{typed}{self.count}" if self.kind else "no GPU"
        pin = f" on {','.join(self.required_nodes)}" if self.required_nodes else ""
        away = f" not on {','.join(self.excluded_nodes)}" if self.excluded_nodes else ""
        return f"{what} × {self.node_count} node(s){pin}{away}"


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
        return GpuRequest(kind, count, node_count, f.parsed("required_nodes", expand_hostlist), typ,
                          f.parsed("excluded_nodes", expand_hostlist))
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


def _type_count(record: NodeRecord, gpu_type: str) -> int:
    return sum(n for t, n in record.gpu_types if t == gpu_type)


def check_type(records: Iterable[NodeRecord], job_id: int, gpu_type: str, per_node: int = 1, node_count: int = 1,
               nodes: tuple[str, ...] = (), where: str = "this cluster") -> None:
    """Refuse, before any command runs, a move to `per_node` GPUs of `gpu_type` on `node_count` nodes (`nodes`
    when pinned) that no node set of the cluster can hold: `InvalidActionError` naming the type and the types
    the cluster has, or the nodes and their counts.

    Slurm accepts such an update of a held job (exit 0: an unknown type, `gpu:h100:1`, or more GPUs of a type
    than any node has) and the job then never runs ("BadConstraints"). Type names are compared exactly, as
    Slurm compares them (`gpu:A100:1` is refused where nodes have `gpu:a100:4`).
    """
    if not gpu_type:
        return
    records = tuple(records)
    known = cluster_types(records)
    if gpu_type not in known:
        have = f"the types its nodes have are {', '.join(known)}" if known else "its nodes' gres name no GPU type"
        raise InvalidActionError(f"job {job_id} cannot be moved to GPU type {gpu_type!r}: Slurm knows no such type "
                                 f"on {where}; {have}")
    counts = {r.name: _type_count(r, gpu_type) for r in records}
    fit = [n for n, c in counts.items() if c >= per_node]
    if nodes:
        short = [f"{n} ({counts[n]})" if n in counts else f"{n} (not on {where})" for n in nodes
                 if counts.get(n, 0) < per_node]
        if short:
            raise InvalidActionError(f"job {job_id} cannot have {per_node} GPU(s) of type {gpu_type} on each of "
                                     f"{', '.join(nodes)}: {', '.join(short)} of that type")
    elif len(fit) < node_count:
        raise InvalidActionError(f"job {job_id} cannot have {per_node} GPU(s) of type {gpu_type} on each of "
                                 f"{node_count} node(s): {len(fit)} node(s) have that many "
                                 f"({', '.join(f'{n}: {c}' for n, c in counts.items() if c) or 'none'})")


TYPED_UPDATE_FROM = (23, 2)
"""The first Slurm version whose `Gres=gpu:TYPE:N` update moves a pending job to another type (see `plan_update`)."""


@dataclass(frozen=True)
class GpuUpdate:
    """The one `scontrol update` that gives a job its new GPUs, and the request Slurm must show after it."""

    argv: list[str]
    want: GpuRequest
    check_excluded: bool = False
    """Whether the read-back's excluded nodes are part of the change (the 22.05 way to a type)."""
    keep_place: bool = True
    """Whether a requeue keeps the job's present nodes for it (`places`): not when it moves to another type
    without named nodes, since it runs elsewhere and a place there would hold it pending for its whole time."""


def plan_update(version: str, current: GpuRequest, records: Iterable[NodeRecord], job_id: int, gpus: int,
                nodes: tuple[str, ...], gpu_type: str = "", on: tuple[str, ...] = (), partition: str = "") -> GpuUpdate:
    """The update that moves a pending or held job to `gpus` whole GPUs (of `gpu_type` when given) on `nodes`,
    refused before any command runs where this Slurm version would refuse, ignore or strand it. `partition`: the
    job's (Slurm's comma-separated list); only its nodes can hold it, so a type or node elsewhere is refused.

    Measured on a local cluster of two fake types (22.05.8 and 24.11.5; tests/slurm/test_type_move_live.py):

    - 24.11: `Gres=gpu:a100:1` on a held job replaces its request, typed (`gpu:t4:1`) or not, and the job runs
      on an a100 node; `Gres=gpu:1` makes a typed job untyped. Taken to hold from 23.02 (`TYPED_UPDATE_FROM`,
      as `check_change`); the versions between were not tried.
    - 22.05 keeps the GPU type a job was submitted with: `Gres=gpu:a100:1` on a held `gpu:t4:1` job exits 0 and
      the job then never runs (BadConstraints), as with `gpu:a100:1,gpu:t4:0` or two updates; `TresPerNode=` is
      ignored; untyped → typed and typed → untyped are refused ("with and without type identification"). So an
      untyped job reaches a type by excluding every node of another type (`ExcNodeList=`, read back in
      `excluded_nodes`), and a typed job keeps its type (a count change within it works). Trap: an untyped
      change afterwards leaves that exclusion as it is (the next typed move replaces it).
    - Both accept an unknown type, a type in another case (`gpu:A100:1`: names are case-sensitive) or more GPUs
      of a type than a node has with exit 0, and the job then never runs: `check_type` refuses those first.
    """
    check_change(version, job_id, current)
    typed_update = _major_minor(version) >= TYPED_UPDATE_FROM
    if not typed_update and current.gpu_type and gpu_type != current.gpu_type:
        raise InvalidActionError(
            f"job {job_id} asks for GPUs of type {current.gpu_type} ({current}); Slurm {version} keeps the type a job "
            f"was submitted with (an update to {f'gpu:{gpu_type}' if gpu_type else 'an untyped gpu'} is refused, or "
            "accepted and the job then never runs): submit it with an untyped --gres=gpu:N to let it move between "
            "types, or use Slurm 23.02 or later")
    names = expand_hostlist(",".join(nodes))
    count = len(names) or 1
    argv = commands.set_gpu_count(job_id, gpus, nodes, gpu_type)  # validates the id, nodes, type and the split
    per_node = gpus // count
    if not gpu_type:
        return GpuUpdate(argv, GpuRequest("gpu", per_node, count, names))
    mine = partition_names(partition)
    records = tuple(r for r in records if not mine or mine & set(r.partitions))
    check_type(records, job_id, gpu_type, per_node, count, names,
               f"its partition {partition}" if mine else "this cluster")
    # `on`: the nodes the job runs on now; leaving them for unnamed nodes of the type, it keeps no place there.
    stays = bool(names) or all(_type_count(r, gpu_type) for r in records if r.name in on)
    if typed_update or current.gpu_type == gpu_type:
        return GpuUpdate(argv, GpuRequest("gpu", per_node, count, names, gpu_type), keep_place=stays)
    others = tuple(r.name for r in records if not _type_count(r, gpu_type))
    argv = commands.set_gpu_count(job_id, gpus, nodes, "", exclude=others)
    return GpuUpdate(argv, GpuRequest("gpu", per_node, count, names, "", others), check_excluded=True,
                     keep_place=stays)


def verify(text: str, job_id: int, update: GpuUpdate) -> GpuRequest:
    """The job's request read back after `update`; `GpuCountMismatch` naming both when it is not the one wanted
    (its excluded nodes compared only where the update set them)."""
    got = request_of(text, job_id)
    seen = got if update.check_excluded else replace(got, excluded_nodes=update.want.excluded_nodes)
    # excluded nodes as a set: Slurm prints its own order (sorted), not the one they were given in
    if (replace(seen, excluded_nodes=tuple(sorted(seen.excluded_nodes)))
            != replace(update.want, excluded_nodes=tuple(sorted(update.want.excluded_nodes)))):
        raise GpuCountMismatch(update.argv, 0, "", f"job {job_id}: asked Slurm for {update.want}, it holds {got}")
    return got
