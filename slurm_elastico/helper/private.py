"""The helper's state is private to it: nobody else may write what it trusts (journal, admissions, readings).

A journal row that `recovery.recover` settles, or an admission that says a job
is elastico-submit's, would be a way to make the helper act on someone else's
job if a user could write the store. So the acting helper creates everything
with umask 077 (`helper.service.held`) and refuses to start on a state directory or store file that
another user owns or that group or others may write.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from slurm_elastico.errors import ConfigError

STORE_FILES = ("elastico.sqlite", "elastico.sqlite-wal", "elastico.sqlite-shm")


def make_private(state_dir: str | Path) -> list[str]:
    """Create `state_dir` (0700) if missing and check it; the problems found (empty: private).

    A path is private when it is owned by this process's user or root and neither group nor others may write it.
    The caller runs with umask 077 (`elastico sched` does), so what it creates later is private too.
    """
    d = Path(state_dir)
    try:
        d.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError as exc:
        return [f"{d}: cannot create the state directory ({exc.strerror}); allowed: a state_dir that is a "
                "directory the helper's user may create and write"]
    problems = []
    for p in (d, *(d / n for n in STORE_FILES)):
        try:
            st = p.lstat()
        except FileNotFoundError:
            continue
        except OSError as exc:
            problems.append(f"{p}: cannot be checked ({exc.strerror})")
            continue
        if st.st_uid not in (os.geteuid(), 0):
            problems.append(f"{p}: owned by uid {st.st_uid}; allowed: the helper's own user ({os.geteuid()}) or root")
        if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
            problems.append(f"{p}: mode {stat.filemode(st.st_mode)} lets others write the helper's state; "
                            f"allowed: no group or other write (chmod go-w {p})")
        if p != d and not stat.S_ISREG(st.st_mode):
            problems.append(f"{p}: not a regular file")
    return problems


def require_private(state_dir: str | Path) -> None:
    """`make_private`, raising one `ConfigError` naming every problem."""
    problems = make_private(state_dir)
    if problems:
        raise ConfigError("state_dir", problems)
