"""Which cluster a slurm.conf describes: its `ClusterName`, read from the file itself.

The helper keys its one-per-cluster lock on it (`helper.lock`). The file, not
`scontrol show config`: a helper must be able to start, and say so, while
slurmctld is down. Slurm itself refuses to start without a ClusterName.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from slurm_elastico.errors import ConfigError

DEFAULT_SLURM_CONF = "/etc/slurm/slurm.conf"
"""Where Debian's Slurm (22.05 and 24.11) reads its configuration when SLURM_CONF is not set."""

_CLUSTER_NAME = re.compile(r"^\s*ClusterName\s*=\s*(\S+)", re.IGNORECASE)


def cluster_name(text: str) -> str | None:
    """The ClusterName a slurm.conf text sets (the last one wins, as in Slurm), or None.

    Keys are case-insensitive in slurm.conf; `#` starts a comment; Slurm lowercases the name.
    """
    name = None
    for line in text.splitlines():
        m = _CLUSTER_NAME.match(line.split("#", 1)[0])
        if m:
            name = m.group(1).strip("\"'").lower()
    return name or None


def slurm_conf_path(configured: str = "") -> Path:
    """The slurm.conf Slurm's commands read: `slurm.conf` of elastico's settings, else $SLURM_CONF, else Debian's."""
    return Path(configured or os.environ.get("SLURM_CONF") or DEFAULT_SLURM_CONF)


def read_cluster_name(configured: str = "") -> str:
    """The ClusterName of the slurm.conf Slurm's commands read; `ConfigError` naming the file when there is none."""
    path = slurm_conf_path(configured)
    try:
        text = path.read_text(errors="replace")
    except OSError as exc:
        raise ConfigError("slurm.conf", [f"cannot read {path} to learn the cluster's name: {exc.strerror or exc} "
                                         "(set slurm.conf in elastico.yaml, or SLURM_CONF, to the cluster's "
                                         "slurm.conf)"]) from None
    name = cluster_name(text)
    if name is None:
        raise ConfigError("slurm.conf", [f"{path} sets no ClusterName= (Slurm needs one; the helper keys its "
                                         "one-per-cluster lock on it)"])
    return name
