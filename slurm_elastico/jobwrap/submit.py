"""elastico-submit's checks: family and script checked before anything is submitted.

`prepare` reports every problem at once (ConfigError) and builds the batch
script (`slurm_elastico.jobwrap.script`) and the options a reshape needs
(`slurm_elastico.jobwrap.additions`). The family travels inside that batch
script and nowhere else: the helper reads it from Slurm
(`slurm_elastico.helper.families`), so elastico-submit writes no file of the
helper's and needs no access to its state. The command:
`slurm_elastico.cli.submit`; sbatch itself runs in `slurm_elastico.slurm.submit`.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from slurm_elastico import config
from slurm_elastico.errors import ConfigError
from slurm_elastico.jobwrap.additions import added_options, signal_lead
from slurm_elastico.jobwrap.options import SubmitArgs
from slurm_elastico.slurm.sbatch_options import Option, directive_options, gpu_types_requested
from slurm_elastico.jobwrap.payload import Payload
from slurm_elastico.jobwrap.script import batch_script
from slurm_elastico.inputs import load_yaml, read_bytes, read_text
from slurm_elastico.model import NodeView
from slurm_elastico.shapes import family_of, parse_spec
from slurm_elastico.shapes.nodes import partition_fit_problems, start_request
from slurm_elastico.shapes.typed import figures_by_type, memory_by_type, settings_family_memory, with_limit
from slurm_elastico.shapes.units import ShareUnitError, shares_of


class Prepared:
    """A checked submission: the batch script for sbatch's stdin, the options to add, notes for the user, the family."""

    def __init__(self, script: str, additions: tuple[str, ...], notes: tuple[str, ...], spec: str, source: str):
        self.script, self.additions, self.notes, self.spec, self.source = script, additions, notes, spec, source


def prepare(args: SubmitArgs, settings: config.Settings, env: Mapping[str, str], interpreter: str,
            nodes: Callable[[], Sequence[NodeView]] | None = None) -> Prepared:
    """Check everything before submitting (every problem at once) and build the batch script and added options.

    `nodes` reads the cluster's nodes; it is called only for a family that lists GPU counts above 1, whose
    layout must fit the job's partition (`shapes.nodes.partition_fit_problems`); None: not checked.
    """
    problems: list[str] = []
    if any(o.name == "wrap" for o in args.options):
        problems.append("--wrap is not supported: put the command in a script file")
    if args.family is None:
        problems.append("--family FILE is required (the job's shape family, YAML)")
    script_bytes = b""
    if args.script is None:
        problems.append("no job script given: elastico-submit [sbatch options] --family FILE script [args] (stdin is not read)")
    else:
        try:
            script_bytes = read_bytes(args.script, "job script")
        except ConfigError as exc:
            problems += [f"job script {exc.source}: {p}" for p in exc.problems]
        else:
            if not script_bytes.startswith(b"#!"):
                problems.append(f"job script {args.script}: the first line must start with #! (as sbatch requires)")
    user_text = script_bytes.decode("utf-8", errors="surrogateescape")
    options = (*directive_options(user_text), *args.options)  # command line last: it wins, as in sbatch
    limit = requested_types(directive_options(user_text), args.options, env)
    types = memory_by_type(getattr(settings.gpu, "types", None))
    memory = settings_family_memory(types, settings.gpu.memory_mib)  # what the helper sizes the family for
    types = types if len(types) > 1 else {}
    family = spec_text = spec = None
    if args.family is not None:
        try:  # read once: the text checked is the text that travels with the job
            spec_text = read_text(args.family, "family file")
            spec = with_limit(parse_spec(load_yaml(spec_text, args.family), args.family), limit)
            family = family_of(spec, memory, gpu_types=types,
                               figures=figures_by_type(getattr(settings.gpu, "types", None)))
        except ConfigError as exc:
            spec_text = None
            problems += [f"family {exc.source}: {p}" for p in exc.problems]
    notes: list[str] = []
    whole_gpus = None  # (nodes, GPUs per node) a family with GPU counts above 1 starts on
    if spec is not None and family is not None and max(spec.gpus) > 1:
        whole_gpus = start_request(spec, family.default_shape)
        partition = _partition(options, env)
        if nodes is not None and partition is not None:
            problems += [f"family {args.family}: {p}" for p in partition_fit_problems(spec, nodes(), partition)]
        elif nodes is not None:
            notes.append("no --partition chosen: the family's GPU counts were not checked against the default "
                         "partition's nodes")
    share = 0  # the default shape's MPS share in Slurm's counts (what --gres=mps: asks)
    if family is not None and family.default_shape.resources.mps:
        try:
            share = shares_of(family.default_shape.resources.mps, settings.gpu.shares_per_gpu)
        except ShareUnitError as exc:
            problems.append(f"family {args.family}: default shape {family.default_shape.name}: {exc}")
    if problems:
        raise ConfigError("elastico-submit", problems)
    assert family is not None and spec_text is not None and args.script is not None
    lead = signal_lead(options, settings.submit.signal_lead_s)
    payload = Payload(
        script=script_bytes,
        script_name=os.path.basename(args.script),
        args=args.script_args,
        family_spec=spec_text,
        family_source=str(Path(args.family).absolute()),
        gpu_memory_mib=memory,
        grace_s=settings.submit.grace_s,
        signal_lead_s=lead,
        slurm_conf=settings.slurm.conf,
        shares_per_gpu=settings.gpu.shares_per_gpu,
        gpu_types=tuple(types.items()),
        type_limit=limit,
        type_like=tuple((t, str(f["like"])) for t, f in figures_by_type(getattr(settings.gpu, "types", None)).items()
                        if f.get("like")),
    )
    additions = added_options(options, env, share=share,
                              window_s=settings.submit.placement_window_s, lead_s=settings.submit.signal_lead_s,
                              job_name=os.path.basename(args.script), whole_gpus=whole_gpus)
    return Prepared(batch_script(interpreter, user_text, payload), additions.argv, (*notes, *additions.notes),
                     spec_text, payload.family_source)



GPU_REQUEST_ENV = (("gres", "SBATCH_GRES"), ("gpus", "SBATCH_GPUS"), ("gpus-per-node", "SBATCH_GPUS_PER_NODE"),
                   ("gpus-per-task", "SBATCH_GPUS_PER_TASK"), ("gpus-per-socket", "SBATCH_GPUS_PER_SOCKET"))
"""Each GPU request option and the input environment variable sbatch reads it from."""


def requested_types(script: Sequence[Option], command_line: Sequence[Option], env: Mapping[str, str]
                    ) -> tuple[str, ...]:
    """The GPU types the job's own request names (`--gres=gpu:a100:2`, `--gpus=a100:2`): its family is limited to
    them (`shapes.typed.with_limit`). Each option's value as sbatch takes it: the command line's, else its input
    environment variable's (SBATCH_GRES, SBATCH_GPUS*), else the script's #SBATCH line."""
    chosen: list[Option] = []
    for name, var in GPU_REQUEST_ENV:
        given = [o for o in command_line if o.name == name]
        chosen += given or ([Option(name, env[var])] if env.get(var) else [o for o in script if o.name == name])
    return gpu_types_requested(chosen)


def _partition(options: Sequence[Option], env: Mapping[str, str]) -> str | None:
    """The partition the job asks for (the last --partition wins, as in sbatch; then SBATCH_PARTITION); None: the
    cluster's default. A list (`-p a,b`) is checked on its first partition."""
    given = [o.value for o in options if o.name == "partition" and o.value]
    chosen = given[-1] if given else env.get("SBATCH_PARTITION") or None
    return chosen.split(",")[0] if chosen else None
