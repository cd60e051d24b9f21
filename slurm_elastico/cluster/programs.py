"""This installation's console scripts (`elastico`, `elastico-submit`, ...), and how to write one in a hint.

A hint such as "stop it with: elastico cluster down" must run as printed. After `make setup` the scripts
live in the project's venv, which is not on PATH: the hint then names the script by its path, relative
to the working directory when it lies below it (`.venv/bin/elastico`).
"""

from __future__ import annotations

import os
import shlex
import shutil
import sys
from pathlib import Path


def program(name: str) -> Path:
    """A console script of this installation: the one beside the running interpreter."""
    return Path(sys.executable).with_name(name)


def typed(name: str) -> str:
    """`name` as a person types it here to run this installation's script: the bare name when PATH finds
    this very script, else its path (relative below the working directory), quoted for a POSIX shell."""
    path = program(name)
    found = shutil.which(name)
    if found is not None and path.exists() and os.path.samefile(found, path):
        return name
    absolute = Path(os.path.abspath(path))
    cwd = Path(os.path.abspath(os.getcwd()))
    shown = str(absolute.relative_to(cwd)) if absolute.is_relative_to(cwd) else str(absolute)
    return shlex.quote(shown)
