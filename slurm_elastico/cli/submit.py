"""`elastico-submit`: sbatch with a shape family; the job runs under `elastico-run`.

    elastico-submit [sbatch options] --family FILE script [script args]

Same options, `#SBATCH` lines, output and exit code as sbatch. Before
anything is submitted it checks the family file and the script, and reports
every problem at once (exit 2). It then gives sbatch, on stdin, a generated
batch script that carries the user's script, arguments and family inside it
(a requeue replays it; no shared filesystem is assumed), and adds what a
reshape needs unless the user chose it: --requeue, --open-mode=append,
--signal=B:USR1@<lead>, --gres=mps:<default share>, --begin=now+<window>, and
the script's name as job name (as sbatch would). `elastico sched` reads the
family from the job's batch script through Slurm. This module parses and
prints; the logic is in `slurm_elastico.jobwrap` and sbatch runs in
`slurm_elastico.slurm.submit`.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence
from typing import TextIO

from slurm_elastico import config
from slurm_elastico.errors import ElasticoError, SlurmError, SlurmNotFound
from slurm_elastico.jobwrap.options import split_argv
from slurm_elastico.jobwrap.submit import prepare
from slurm_elastico.slurm.submit import sbatch as run_sbatch

USAGE = """usage: elastico-submit [sbatch options] --family FILE script [script args]

Submits `script` like sbatch does (every sbatch option and #SBATCH line
works), running it under elastico-run with the shape the scheduler picks from
the shape family in FILE. Unless you set them yourself it adds --requeue,
--open-mode=append, --signal=B:USR1@<submit.signal_lead_s>, --gres=mps:<the
family default's share> and --begin=now+<submit.placement_window_s>.
Settings: $ELASTICO_CONFIG, then /etc/slurm-elastico/elastico.yaml.

The family file (YAML) lists the equivalent ways the job may run; each list
is a choice and the shapes are every combination:
  kind: train    steps, global_batch (fixed in every shape), micro_batches
                 (divisors of global_batch), precisions (fp32 bf16 fp16),
                 checkpointing (false true)
  kind: infer    requests, gpu_memory_utilization (0..1], max_num_seqs,
                 kv_cache_dtype (auto fp8); with gpus, parallel (replicas:
                 n engine replicas, or tensor: tensor_parallel_size n)
  both           mps_shares (percent of one GPU); optional: gpus (whole
                 GPUs per shape), gpus_per_node and max_nodes (at most so
                 many of a shape's GPUs on one node, and nodes per shape),
                 throughput_floor, cpus, host_mem_mib, name, default, model
                 (estimate hints), declared
Example:
  kind: train
  global_batch: 64
  micro_batches: [16, 32, 64]
  precisions: [fp32, bf16]
  checkpointing: [false]
  steps: 1000
  mps_shares: [50, 100]
Full reference: docs/users/families.md in the project's documentation.
"""


def main(argv: Sequence[str] | None = None) -> None:
    sys.exit(submit(sys.argv[1:] if argv is None else argv))


def _nodes(settings: config.Settings, env: Mapping[str, str]):
    """The cluster's nodes, for the check that a family's GPU counts fit the job's partition."""
    from slurm_elastico.slurm.gateway import SlurmGateway
    from slurm_elastico.slurm.runner import SubprocessRunner

    conf = settings.slurm.conf or env.get("SLURM_CONF")
    runner = SubprocessRunner(env={"SLURM_CONF": conf} if conf else {}, timeout=settings.slurm.timeout_s)
    return SlurmGateway(runner, shares_per_gpu=settings.gpu.shares_per_gpu,
                        gpu_memory_mib=settings.gpu.memory_mib,
                        type_memory=settings.gpu.type_memory()).snapshot().nodes


def submit(argv: Sequence[str], *, env: Mapping[str, str] | None = None, out: TextIO | None = None,
           err: TextIO | None = None, sbatch: str | None = None, interpreter: str | None = None) -> int:
    """Validate and submit through sbatch (`sbatch`: another program in its place); returns the exit code
    (sbatch's once it ran)."""
    env = dict(os.environ if env is None else env)
    out = out or sys.stdout
    err = err or sys.stderr
    try:
        args = split_argv(argv)
        if args.script is None and any(o.name in ("help", "usage") for o in args.options):
            out.write(USAGE)
            return 0
        settings = config.load(env.get(config.ENV_VAR) or None)
        job = prepare(args, settings, env, interpreter or sys.executable, nodes=lambda: _nodes(settings, env))
    except ElasticoError as exc:
        err.write(f"elastico-submit: error: {exc}\nnothing was submitted\n")
        return exc.exit_code
    for note in job.notes:
        err.write(f"elastico-submit: note: {note}\n")
    try:
        return run_sbatch([*job.additions, *args.sbatch_argv], job.script, env=env, out=out, program=sbatch)
    except SlurmNotFound as exc:
        err.write(f"elastico-submit: error: {exc}; nothing was submitted\n")
        return 127
    except SlurmError as exc:
        err.write(f"elastico-submit: error: {exc}\n")
        return exc.exit_code
