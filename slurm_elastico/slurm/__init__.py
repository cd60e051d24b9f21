"""The only code that runs Slurm: argv builders, the runner, JSON parsers per object, the gateway.

`commands` builds every argv; `runner` runs one with a timeout; `answers`
reads a command's answer into typed errors; `schema` loads a command's JSON
and detects its schema (22.05 v0.0.38, 24.11 v0.0.42); `jobs`, `nodes` and
`accounting` parse squeue/scontrol-job, sinfo/scontrol-node and sacct output;
`snapshot` turns records into the model's node and partition views; `gateway`
sequences them, with `places` keeping a requeued job's nodes and `gpu_count`
changing a job's GPU count; `gres` and `hostlist` read Slurm's GRES, TRES and
host-list strings.
"""
