"""sbatch for `elastico-submit`: the batch script on stdin, sbatch's output and exit code passed through as they come.

Unlike the gateway's commands (`slurm_elastico.slurm.runner`) this one has no
timeout and does not capture stderr: with `--wait` sbatch lasts as long as the
job, and what it prints, and its exit code, are the user's answer unchanged.
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Callable, Mapping, Sequence
from typing import TextIO

from slurm_elastico.errors import SlurmNotFound
from slurm_elastico.slurm import commands

_SUBMITTED = re.compile(r"^Submitted batch job (\d+)")
_PARSABLE = re.compile(r"^(\d+)(;\S+)?$")


def job_id_from(line: str) -> int | None:
    """The job id in a line sbatch printed ("Submitted batch job N[ on cluster C]" or, with --parsable, "N[;C]")."""
    text = line.strip()
    m = _SUBMITTED.match(text) or _PARSABLE.match(text)
    return int(m.group(1)) if m else None


def sbatch(options: Sequence[str], script: str, *, env: Mapping[str, str], out: TextIO,
           on_job_id: Callable[[int], None], program: str = "sbatch") -> int:
    """Run sbatch with `script` on stdin; returns its exit code. Raises SlurmNotFound when `program` is not on PATH.

    Its stdout is copied to `out` line by line and `on_job_id` gets the first
    job id printed; its stderr is the caller's own.
    """
    cmd = commands.sbatch(options, program)
    try:
        # UTF-8 whatever the locale: #SBATCH lines may carry any text; bytes that are not UTF-8 pass unchanged
        proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=dict(env),
                                encoding="utf-8", errors="surrogateescape")
    except FileNotFoundError:
        raise SlurmNotFound(cmd, None, "", f"`{program}` is not installed or not on PATH") from None
    assert proc.stdin is not None and proc.stdout is not None
    try:
        proc.stdin.write(script)
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
                on_job_id(job_id)
    return proc.wait()
