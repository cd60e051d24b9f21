"""sbatch for `elastico-submit`: the batch script on stdin, sbatch's output and exit code passed through as they come.

Unlike the gateway's commands (`slurm_elastico.slurm.runner`) this one has no
timeout and does not capture stderr: with `--wait` sbatch lasts as long as the
job, and what it prints, and its exit code, are the user's answer unchanged.
"""

from __future__ import annotations

import subprocess
from collections.abc import Mapping, Sequence
from typing import TextIO

from slurm_elastico.errors import SlurmError, SlurmNotFound
from slurm_elastico.slurm import commands

def sbatch(options: Sequence[str], script: str, *, env: Mapping[str, str], out: TextIO,
           program: str | None = None) -> int:
    """Run sbatch (or `program`) with `script` on stdin; returns its exit code. Raises SlurmNotFound when it is
    not on PATH.

    Its stdout is copied to `out` line by line (with --wait sbatch prints the id long before it exits); its
    stderr is the caller's own.
    """
    cmd = commands.sbatch(options, program)
    try:
        # UTF-8 whatever the locale: #SBATCH lines may carry any text; bytes that are not UTF-8 pass unchanged
        proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=dict(env),
                                encoding="utf-8", errors="surrogateescape")
    except FileNotFoundError:
        raise SlurmNotFound(cmd, None, "", f"`{cmd[0]}` is not installed or not on PATH") from None
    assert proc.stdin is not None and proc.stdout is not None
    unread = False
    try:
        proc.stdin.write(script)
        proc.stdin.close()
    except BrokenPipeError:
        unread = True  # sbatch exited early (a bad option, say): its message and exit code follow
    for line in proc.stdout:
        out.write(line)
        out.flush()
    code = proc.wait()
    if unread and code == 0:
        raise SlurmError(cmd, code, "", f"`{cmd[0]}` exited with 0 before it read the whole batch script; "
                         "whatever it submitted may lack part of the script: check it with `squeue --me`")
    return code
