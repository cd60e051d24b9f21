"""Pure argv builders for every Slurm command slurm-elastico runs.

Each returns a list of strings for `subprocess` without a shell: a job name,
comment or node list is one argv element, so quotes, `;`, `$()` and newlines
reach Slurm unchanged. Validation lives here too, so a bad action is refused
before any command runs (Slurm itself accepts `Gres=mps:500`).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from slurm_elastico.errors import InvalidActionError
from slurm_elastico.model import MPS_SHARES_PER_GPU, Action, ActionKind
from slurm_elastico.slurm.hostlist import expand_hostlist

SIGNALS = ("USR1", "USR2", "TERM", "INT", "HUP", "CONT", "STOP", "KILL")
_NODE_NAME = re.compile(r"^[A-Za-z0-9_.\-\[\],]+$")
_USER_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.@\-]*\$?$")
"""A user name as a reservation's `Users=` takes it: no `,` (its list separator), `=` or space; `@` for the fully
qualified names sssd sites use (`alice@corp.example`)."""


def _job_id(job_id: object) -> str:
    if isinstance(job_id, bool) or not isinstance(job_id, int) or job_id <= 0:
        raise InvalidActionError(f"job id must be a positive integer, not {job_id!r}")
    return str(job_id)


def validate_share(share: object, shares_per_gpu: int = MPS_SHARES_PER_GPU) -> int:
    """An MPS share is a whole number of Slurm's shares of one GPU: 1..shares_per_gpu.

    Counts, not percent: the planner converts a shape's percent with `shapes.units.shares_of`."""
    if isinstance(share, bool) or not isinstance(share, int) or not 1 <= share <= shares_per_gpu:
        raise InvalidActionError(f"MPS share must be an integer from 1 to {shares_per_gpu} per GPU, not {share!r}")
    return share


def squeue_json() -> list[str]:
    """The active jobs, for a snapshot: 24.11 lists only those; 22.05 adds the finished jobs it still holds
    in memory, which the gateway drops."""
    return ["squeue", "--all", "--json"]


def squeue_ids() -> list[str]:
    """The active jobs' ids, one a line, in plain text: the local cluster's `down` cancels jobs with it when the
    JSON parsers refuse a Slurm's output (a schema they do not know), since a job id reads the same on every
    version."""
    return ["squeue", "--noheader", "--format=%A"]


def squeue_job_json(job_id: int) -> list[str]:
    """One job's record, finished or not (a caller waits for a job to end through it).

    `--states=all`: without it 24.11 leaves a finished job out (an empty list), while 22.05 lists it either
    way and accepts the option. 22.05 ignores `--jobs` under `--json` and prints every job: callers filter
    by id.
    """
    return ["squeue", "--all", "--json", "--states=all", f"--jobs={_job_id(job_id)}"]


def nodes_json(slurm_version: str) -> list[str]:
    """Per-node records: `sinfo --json` on 22.05; `scontrol show node --json` from 23 on.

    24.11's `sinfo --json` groups alike nodes and sums their CPUs, so per-node
    allocation would be a guess; `scontrol show node --json` (absent in 22.05)
    is exact and parses the same way.
    """
    major = int(slurm_version.split(".")[0]) if slurm_version[:1].isdigit() else 0
    return ["scontrol", "show", "node", "--json"] if major >= 23 else ["sinfo", "--json"]


def sacct_json(*, start: str = "now-7days", end: str = "now", duplicates: bool = True, job_ids: tuple[int, ...] = (),
               states: str = "") -> list[str]:
    """`states` (e.g. "CANCELLED"): runs that were in one of them during the window, instead of every run."""
    argv = ["sacct", "--json", "--allusers", f"--starttime={start}", f"--endtime={end}"]
    if states:
        argv.append(f"--state={states}")
    if duplicates:
        argv.append("--duplicates")  # each run of a requeued job, with its own allocation
    if job_ids:
        argv.append("--jobs=" + ",".join(_job_id(j) for j in job_ids))
    return argv


def batch_script(job_id: int) -> list[str]:
    """A job's batch script as Slurm stored it, on stdout (22.05 and 24.11; squeue's JSON carries no script).

    Only root, SlurmUser and the job's owner may read it: the helper reads the family that elastico-submit
    embedded there, which the user cannot change after submission."""
    return ["scontrol", "write", "batch_script", _job_id(job_id), "-"]


def sbatch(options: Sequence[str], program: str | None = None) -> list[str]:
    """sbatch (or `program` in its place) reading the batch script from stdin; `options` are a user's own sbatch
    options, passed verbatim."""
    return [program or "sbatch", *options]


def set_share(job_id: int, share: int, shares_per_gpu: int = MPS_SHARES_PER_GPU) -> list[str]:
    """Pending or held job → new MPS share. `Gres=`, never `TresPerNode=` (22.05 ignores it at run time)."""
    return ["scontrol", "update", f"JobId={_job_id(job_id)}", f"Gres=mps:{validate_share(share, shares_per_gpu)}"]


_GPU_TYPE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]*$")


def gpu_spec(gpus: int, gpu_type: str = "") -> str:
    """`gpu:N` or `gpu:TYPE:N`, the form `Gres=` takes on 22.05 and 24.11; a bad type is refused here.

    Trap: a type of digits alone ("3090") would read back as a count where no count follows; here one always does.
    """
    if not isinstance(gpu_type, str) or (gpu_type and not _GPU_TYPE.match(gpu_type)):
        raise InvalidActionError(f"GPU type {gpu_type!r} is not a Slurm GPU type name (letters, digits, _ . -, "
                                 "as in Gres=gpu:a100:4), or empty for any type")
    return f"gpu:{gpu_type}:{gpus}" if gpu_type else f"gpu:{gpus}"


def set_gpus(job_id: int, gpus: int, nodes: tuple[str, ...] | list[str], gpu_type: str = "") -> list[str]:
    """The simulator's notation for a gang's GPU count (`TresPerJob=`); NOT what Slurm honours.

    Slurm 22.05 ignores `TresPerJob=` at run time and 24.11 refuses it on a `--gres` job; the live gateway
    uses `set_gpu_count` (verified on both). Kept only because the simulator prints this form.
    """
    if isinstance(gpus, bool) or not isinstance(gpus, int) or gpus < 1:
        raise InvalidActionError(f"GPUs of a job must be an integer >= 1, not {gpus!r}")
    *_, job, node_list = set_nodes(job_id, nodes)  # validates the id and every node name
    return ["scontrol", "update", job, f"TresPerJob=gres/{gpu_spec(gpus, gpu_type)}", node_list]


def set_gpu_count(job_id: int, gpus: int, nodes: tuple[str, ...] | list[str], gpu_type: str = "",
                  exclude: tuple[str, ...] | None = None) -> list[str]:
    """Pending or held job → `gpus` whole GPUs for the job, spread evenly over `nodes` (one node when empty),
    of `gpu_type` when one is given (`Gres=gpu:TYPE:P`, "" asks for any type), kept off `exclude` when given
    (`ExcNodeList=`; empty clears it). Which form moves a job to a type on which version: `gpu_count.plan_update`.

    `Gres=gpu:<per node> NumNodes=K-K NodeList=...` in one update, verified on Slurm 22.05 and 24.11
    (see `gpu_count`): 22.05 ignores `TresPerNode=`/`TresPerJob=` and refuses `NumNodes=K`. Empty `nodes`
    clears the pin and asks for one node.
    """
    if isinstance(gpus, bool) or not isinstance(gpus, int) or gpus < 1:
        raise InvalidActionError(f"GPUs of a job must be an integer >= 1, not {gpus!r}")
    *_, job, node_list = set_nodes(job_id, nodes)  # validates the id and every node name
    count = len(expand_hostlist(",".join(nodes))) or 1
    if gpus % count:
        raise InvalidActionError(f"{gpus} GPUs do not split evenly over {count} nodes ({','.join(nodes)}): "
                                 "Slurm's Gres= asks the same number of GPUs on every node")
    argv = ["scontrol", "update", job, f"Gres={gpu_spec(gpus // count, gpu_type)}", f"NumNodes={count}-{count}",
            node_list]
    if exclude is not None:
        argv.append("ExcNodeList=" + set_nodes(job_id, tuple(exclude))[-1].removeprefix("NodeList="))
    return argv


def gpu_count_argv(action: Action) -> list[list[str]]:
    """The verified commands for a GPU-count action (SET_GPUS, or RESHAPE_RUNNING with `gpus`) on a live Slurm."""
    jid = action.job_id
    update = set_gpu_count(jid, need(action.gpus, action), action.nodes, action.gpu_type)
    if action.kind is ActionKind.SET_GPUS:
        return [update]
    if action.kind is ActionKind.RESHAPE_RUNNING:
        return [requeue_hold(jid), update, start_now(jid), release(jid)]
    raise InvalidActionError(f"{action.kind.value} action for job {jid} does not change a GPU count")


def update_job(job_id: int, *fields: str) -> list[str]:
    """`scontrol update JobId=<id>` with `fields` (`Key=value` each, as given): what an error about updating the
    job names when no single builder below fits (the simulator's)."""
    return ["scontrol", "update", f"JobId={_job_id(job_id)}", *fields]


def srun_tasks(command: Sequence[str], ranks: int, nodes: int) -> list[str]:
    """srun running `command` as `ranks` tasks inside the job, `ranks // nodes` on each of its `nodes` nodes.

    Overcommitted (the tasks share the job's CPUs), each task's failure left to its supervisor
    (`--kill-on-bad-exit=0`), the job's environment exported to every task. Trap: `ranks` must be a multiple
    of `nodes` (the caller checks it, naming its own input).
    """
    return ["srun", f"--ntasks={ranks}", f"--ntasks-per-node={ranks // nodes}", f"--nodes={nodes}", "--overcommit",
            "--kill-on-bad-exit=0", "--export=ALL", *command]


def set_nodes(job_id: int, nodes: tuple[str, ...] | list[str]) -> list[str]:
    """Pending or held job → run only on these nodes (`NodeList=`); empty clears the pin."""
    for n in nodes:
        if not isinstance(n, str) or not _NODE_NAME.match(n):
            raise InvalidActionError(f"node name {n!r} is not a valid Slurm node name (letters, digits, _ . - [ ] ,)")
    return ["scontrol", "update", f"JobId={_job_id(job_id)}", f"NodeList={','.join(nodes)}"]


def requeue(job_id: int) -> list[str]:
    """Requeue a running job (it becomes pending, BeginTime ~120 s later); the job itself may ask this."""
    return ["scontrol", "requeue", _job_id(job_id)]


def requeue_hold(job_id: int) -> list[str]:
    return ["scontrol", "requeuehold", _job_id(job_id)]


def start_now(job_id: int) -> list[str]:
    # Without this a requeued job waits ~120 s (its BeginTime) after release.
    return ["scontrol", "update", f"JobId={_job_id(job_id)}", "StartTime=now"]


def release(job_id: int) -> list[str]:
    return ["scontrol", "release", _job_id(job_id)]


def place_name(job_id: int) -> str:
    """The reservation that keeps a requeued job's place (`reserve_place`): one per job, so a stale one is found."""
    return f"elastico-requeue-{_job_id(job_id)}"


def reserve_place(job_id: int, nodes: tuple[str, ...] | list[str], user: str, minutes: int) -> list[str]:
    """Reserve `nodes` for the requeued job `job_id` of `user` alone, from now for `minutes`.

    `IGNORE_JOBS`: the nodes' running jobs (the job itself among them) go on; only jobs not in the reservation
    are kept from starting there. `NO_HOLD_JOBS_AFTER_END`: should the helper die before it clears the job's
    reservation, the job is not held when the reservation ends, it runs anywhere. Whole nodes, since Slurm
    22.05 reserves no GPUs alone.
    """
    if not nodes:
        raise InvalidActionError(f"a place for job {job_id} needs at least one node")
    *_, node_list = set_nodes(job_id, nodes)  # validates the id and every node name
    if not isinstance(user, str) or not _USER_NAME.match(user):
        raise InvalidActionError(f"user name {user!r} is not a valid user name (letters, digits, _ . - @)")
    if isinstance(minutes, bool) or not isinstance(minutes, int) or minutes < 1:
        raise InvalidActionError(f"a reservation lasts a whole number of minutes >= 1, not {minutes!r}")
    return ["scontrol", "create", "reservation", f"ReservationName={place_name(job_id)}", "StartTime=now",
            f"Duration={minutes}", "Nodes" + node_list.removeprefix("NodeList"), f"Users={user}",
            "Flags=IGNORE_JOBS,NO_HOLD_JOBS_AFTER_END"]


def set_reservation(job_id: int, name: str) -> list[str]:
    """Put a pending or running job into reservation `name`; "" takes it out (allowed on a running job)."""
    if not isinstance(name, str) or (name and not _NODE_NAME.match(name)):
        raise InvalidActionError(f"reservation name {name!r} is not valid (letters, digits, _ . -)")
    return ["scontrol", "update", f"JobId={_job_id(job_id)}", f"Reservation={name}"]


def delete_place(job_id: int) -> list[str]:
    return ["scontrol", "delete", f"ReservationName={place_name(job_id)}"]


def with_place(cmds: list[list[str]], job_id: int, reserve: list[str]) -> list[list[str]]:
    """A requeue's commands (hold, updates, StartTime=now, release) with its place kept (`reserve_place`): the
    reservation first, the job put in it before StartTime=now, taken out and the reservation deleted at the end."""
    return [reserve, *cmds[:-2], set_reservation(job_id, place_name(job_id)), *cmds[-2:],
            set_reservation(job_id, ""), delete_place(job_id)]


def signal(job_id: int, sig: str, *, whole_job: bool = False) -> list[str]:
    """`--batch` reaches only the batch shell (elastico-run); `--full` every process of the job."""
    name = sig.upper().removeprefix("SIG") if isinstance(sig, str) else sig
    if name not in SIGNALS:
        raise InvalidActionError(f"signal {sig!r} is not one of {', '.join(SIGNALS)}")
    return ["scancel", f"--signal={name}", "--full" if whole_job else "--batch", _job_id(job_id)]


def cancel(job_ids: tuple[int, ...] | list[int]) -> list[str]:
    """Cancel jobs outright (the local cluster's `down` does, before it stops its daemons)."""
    return ["scancel", *(_job_id(j) for j in job_ids)]


def set_admin_comment(job_id: int, text: str) -> list[str]:
    if not isinstance(text, str):
        raise InvalidActionError(f"admin comment must be text, not {type(text).__name__}")
    if "\x00" in text:
        raise InvalidActionError("admin comment must not contain NUL characters")
    return ["scontrol", "update", f"JobId={_job_id(job_id)}", f"AdminComment={text}"]


def need(value, action: Action):
    """An action's value, or `InvalidActionError` when the planner left it out."""
    if value is None:
        raise InvalidActionError(f"{action.kind.value} action for job {action.job_id} lacks its value")
    return value


def argv_for(action: Action, shares_per_gpu: int = MPS_SHARES_PER_GPU) -> list[list[str]]:
    """The exact commands that carry out a planner action (the gateway runs them; `--dry-run` prints them)."""
    jid = action.job_id
    if action.kind is ActionKind.SET_SHARE:
        return [set_share(jid, need(action.share, action), shares_per_gpu)]
    if action.kind is ActionKind.SET_NODES:
        return [set_nodes(jid, action.nodes)]
    if action.kind is ActionKind.SET_GPUS:
        return [set_gpus(jid, need(action.gpus, action), action.nodes, action.gpu_type)]
    if action.kind is ActionKind.RESHAPE_RUNNING and action.gpus is not None:
        # As below with the gang's GPU count; set_gpus carries the NodeList itself. Not yet verified live (set_gpus).
        return [requeue_hold(jid), set_gpus(jid, action.gpus, action.nodes, action.gpu_type), start_now(jid),
                release(jid)]
    if action.kind is ActionKind.RESHAPE_RUNNING:
        cmds = [requeue_hold(jid), set_share(jid, need(action.share, action), shares_per_gpu)]
        if action.nodes:
            cmds.append(set_nodes(jid, action.nodes))
        return cmds + [start_now(jid), release(jid)]
    if action.kind is ActionKind.SIGNAL:
        return [signal(jid, need(action.signal, action))]
    if action.kind is ActionKind.SET_ADMIN_COMMENT:
        return [set_admin_comment(jid, need(action.text, action))]
    if action.kind is ActionKind.START_NOW:
        return [start_now(jid)]
    if action.kind is ActionKind.PREEMPT:
        return [requeue_hold(jid)]
    if action.kind is ActionKind.RESUME:
        # StartTime=now as a reshape does: a requeued job otherwise waits out Slurm's ~120 s BeginTime.
        return [*([set_nodes(jid, action.nodes)] if action.nodes else []), start_now(jid), release(jid)]
    raise InvalidActionError(f"unknown action kind {action.kind!r}")  # pragma: no cover - enum is closed
