"""`elastico-submit`: sbatch with a shape family; the job runs under `elastico-run`.

    elastico-submit [sbatch options] --family FILE script [script args]

Same options, `#SBATCH` lines, output and exit code as sbatch. Before
anything is submitted it checks the family file and the script, and reports
every problem at once (exit 2). It then gives sbatch, on stdin, a generated
batch script that carries the user's script, arguments and family inside it
(a requeue replays it; no shared filesystem is assumed), and adds what a
reshape needs unless the user chose it: --requeue, --open-mode=append,
--signal=B:USR1@<lead>, --gres=mps:<default share>, --begin=now+<window>, and
the script's name as job name (as sbatch would). After sbatch succeeds the
family is recorded in the store for `elastico sched`.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TextIO

from slurm_elastico import config
from slurm_elastico.errors import ConfigError, ElasticoError
from slurm_elastico.shapes import load_family
from slurm_elastico.store import Store
from slurm_elastico.wrap import Payload, added_options, batch_script, directive_options, job_id_from, signal_lead, split_argv

USAGE = """usage: elastico-submit [sbatch options] --family FILE script [script args]

Submits `script` like sbatch does (every sbatch option and #SBATCH line
works), running it under elastico-run with the shape the scheduler picks from
the shape family in FILE (YAML; see slurm_elastico/shapes/spec.py).
Unless you set them yourself it adds --requeue, --open-mode=append,
--signal=B:USR1@<submit.signal_lead_s>, --gres=mps:<the family default's
share> and --begin=now+<submit.placement_window_s>.
Settings: $ELASTICO_CONFIG, then /etc/slurm-elastico/elastico.yaml.
"""


def main(argv: Sequence[str] | None = None) -> None:
    sys.exit(submit(sys.argv[1:] if argv is None else argv))


def submit(argv: Sequence[str], *, env: Mapping[str, str] | None = None, out: TextIO | None = None,
           err: TextIO | None = None, sbatch: str = "sbatch", interpreter: str | None = None) -> int:
    """Validate, submit through sbatch, record the family; returns the exit code (sbatch's once it ran)."""
    env = dict(os.environ if env is None else env)
    out = out or sys.stdout
    err = err or sys.stderr
    try:
        args = split_argv(argv)
        if args.script is None and any(o.name in ("help", "usage") for o in args.options):
            out.write(USAGE)
            return 0
        settings = config.load(env.get(config.ENV_VAR) or None)
        job = _prepare(args, settings, env, interpreter or sys.executable)
    except ElasticoError as exc:
        err.write(f"elastico-submit: error: {exc}\nnothing was submitted\n")
        return exc.exit_code
    for note in job.notes:
        err.write(f"elastico-submit: note: {note}\n")
    cmd = [sbatch, *job.additions, *args.sbatch_argv]
    try:
        # UTF-8 whatever the locale: #SBATCH lines may carry any text; bytes that are not UTF-8 pass unchanged
        proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env,
                                encoding="utf-8", errors="surrogateescape")
    except FileNotFoundError:
        err.write(f"elastico-submit: error: `{sbatch}` is not installed or not on PATH; nothing was submitted\n")
        return 127
    assert proc.stdin is not None and proc.stdout is not None
    try:
        proc.stdin.write(job.script)
        proc.stdin.close()
    except BrokenPipeError:
        pass  # sbatch exited early (bad option); its message and exit code follow
    job_id = None
    for line in proc.stdout:  # streamed: with --wait sbatch prints the id long before it exits
        out.write(line)
        out.flush()
        if job_id is None:
            job_id = job_id_from(line)
            if job_id is not None:
                _record(settings, job_id, job, err)
    rc = proc.wait()
    return rc


class _Prepared:
    def __init__(self, script: str, additions: tuple[str, ...], notes: tuple[str, ...], spec: str, source: str):
        self.script, self.additions, self.notes, self.spec, self.source = script, additions, notes, spec, source


def _prepare(args, settings: config.Settings, env: Mapping[str, str], interpreter: str) -> _Prepared:
    """Check everything before submitting (every problem at once) and build the batch script and added options."""
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
            script_bytes = Path(args.script).read_bytes()
        except OSError as exc:
            problems.append(f"job script {args.script}: cannot read it: {exc.strerror}")
        else:
            if not script_bytes.startswith(b"#!"):
                problems.append(f"job script {args.script}: the first line must start with #! (as sbatch requires)")
    family = spec_text = None
    if args.family is not None:
        try:
            spec_text = Path(args.family).read_text()
            family = load_family(args.family, settings.gpu.memory_mib)
        except OSError as exc:
            problems.append(f"family {args.family}: cannot read it: {exc.strerror}")
        except UnicodeDecodeError:
            problems.append(f"family {args.family}: not UTF-8 text (a YAML file is expected)")
        except ConfigError as exc:
            problems += [f"family {exc.source}: {p}" for p in exc.problems]
    if family is not None and family.default_shape.resources.mps > settings.gpu.shares_per_gpu:
        problems.append(f"family {args.family}: default shape {family.default_shape.name} asks for "
                        f"{family.default_shape.resources.mps} MPS shares, above gpu.shares_per_gpu={settings.gpu.shares_per_gpu}")
    if problems:
        raise ConfigError("elastico-submit", problems)
    assert family is not None and spec_text is not None and args.script is not None
    user_text = script_bytes.decode("utf-8", errors="surrogateescape")
    options = (*directive_options(user_text), *args.options)  # command line last: it wins, as in sbatch
    lead = signal_lead(options, settings.submit.signal_lead_s)
    payload = Payload(
        script=script_bytes,
        script_name=os.path.basename(args.script),
        args=args.script_args,
        family_spec=spec_text,
        family_source=str(Path(args.family).absolute()),
        gpu_memory_mib=settings.gpu.memory_mib,
        grace_s=settings.submit.grace_s,
        signal_lead_s=lead,
        slurm_conf=settings.slurm.conf,
    )
    additions = added_options(options, env, share=family.default_shape.resources.mps,
                              window_s=settings.submit.placement_window_s, lead_s=settings.submit.signal_lead_s,
                              job_name=os.path.basename(args.script))
    return _Prepared(batch_script(interpreter, user_text, payload), additions.argv, additions.notes,
                     spec_text, payload.family_source)


def _record(settings: config.Settings, job_id: int, job: _Prepared, err: TextIO) -> None:
    """Store the family for the helper; a failure leaves the job running at its default shape, so it only warns."""
    try:
        with Store(settings.store_path) as store:
            store.execute("INSERT OR REPLACE INTO job_family (job_id, spec, source, submitted_at) VALUES (?, ?, ?, ?)",
                          (job_id, job.spec, job.source, time.time()))
    except Exception as exc:  # noqa: BLE001 - any store failure must not hide that the job was submitted
        err.write(f"elastico-submit: warning: job {job_id} was submitted but its family was not recorded in "
                  f"{settings.store_path} ({exc}); the helper will leave it at its default shape\n")
