"""`elastico-run`: the command line of the in-job supervisor (`slurm_elastico.jobwrap`).

`elastico-run --family FILE [--] PROGRAM [ARGS]` supervises a program in a
hand-written batch script; `run_embedded` is the entry of the batch script
elastico-submit generates (its import line names this module, and jobs
already queued replay it, so it stays here). What the supervisor does:
`slurm_elastico.jobwrap.supervisor`.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from slurm_elastico import config
from slurm_elastico.errors import ElasticoError
from slurm_elastico.inputs import read_text
from slurm_elastico.jobwrap.job import run_payload, stderr_log, supervise
from slurm_elastico.jobwrap.payload import Payload
from slurm_elastico.jobwrap.shape import family_from_spec


def run_embedded(blob: str) -> int:
    """Entry of the batch script elastico-submit generates: decode the payload and run its job; errors on stderr."""
    log = stderr_log(os.environ.get("SLURM_JOB_ID"))
    try:
        return run_payload(Payload.decode(blob))
    except ElasticoError as exc:
        log(f"error: {exc}")
        return exc.exit_code


def main(argv: Sequence[str] | None = None) -> None:
    """`elastico-run --family FILE [--grace S] [--] PROGRAM [ARGS]`: the same supervision for a hand-written batch script."""
    p = argparse.ArgumentParser(prog="elastico-run", description=main.__doc__)
    p.add_argument("--family", required=True, help="shape family YAML")
    p.add_argument("--grace", type=float, default=None, help="seconds the program has after SIGTERM (default: submit.grace_s)")
    p.add_argument("program", nargs=argparse.REMAINDER, help="the program and its arguments")
    args = p.parse_args(sys.argv[1:] if argv is None else argv)
    program = args.program[1:] if args.program[:1] == ["--"] else args.program
    log = stderr_log(os.environ.get("SLURM_JOB_ID"))
    if not program:
        p.error("no program given")
    try:
        settings = config.load()
        family, candidates = family_from_spec(read_text(args.family, "family file"), args.family,
                                              settings.gpu.memory_mib)
        sys.exit(supervise(program, family, candidates, grace_s=args.grace or settings.submit.grace_s,
                           lead_s=settings.submit.signal_lead_s, slurm_conf=settings.slurm.conf))
    except ElasticoError as exc:
        log(f"error: {exc}")
        sys.exit(exc.exit_code)
