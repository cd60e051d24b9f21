"""The local development cluster: a real Slurm cluster on this one machine, with fake GPUs.

`local` holds `LocalCluster` (up, down, status; it reads its Slurm through
`slurm.commands` and the gateway's JSON parsers), `status` what it reports,
`config` the pure writers of its slurm.conf, gres.conf, slurmdbd.conf and
cgroup.conf, `gpu_types` its fake GPU types (`--gpu-types t4:2,a100:2`),
`startup` how each daemon starts, `daemons` the pid-file start
and stop of its daemons, `host` the ports, private files and fake GPUs it
takes from the machine, `install` the Debian packages it needs, and `demo`
the main job (`elastico demo`) run on it: its job list (`demo_workload`,
paced by `pacing`), the cluster's two halves (`halves`), the two runs at once
(`demo_live`, shown by `progress`), their figures (`demo_figures`) and the
checks of their work (`demo_checks`).
"""

from slurm_elastico.cluster.config import DEFAULT_PORT_BASE
from slurm_elastico.cluster.local import STATE_DIR_ENV, LocalCluster, default_state_dir
from slurm_elastico.cluster.status import ClusterStatus, DaemonStatus, DownResult, UpResult

__all__ = ["DEFAULT_PORT_BASE", "STATE_DIR_ENV", "ClusterStatus", "DaemonStatus", "DownResult", "LocalCluster",
           "UpResult", "default_state_dir"]
