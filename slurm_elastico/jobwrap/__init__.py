"""The logic of `elastico-submit` and `elastico-run` (their command lines are in `slurm_elastico.cli`).

elastico-submit: `options` splits sbatch's command line and `#SBATCH` lines
the way sbatch does, `additions` says which options a reshape needs that the
user has not chosen, `payload` and `script` build the batch script sbatch
stores with the job, and `submit` checks the family and the script before
anything is submitted and records the family after. sbatch itself runs in
`slurm_elastico.slurm.submit` (the only place that runs Slurm commands).

elastico-run, inside the job: `shape` reads the shape to run (the family spec
and the job's AdminComment), `supervisor` runs the program and holds the
relaunch and requeue rules, `ranks` starts a shape on several GPUs as one
srun step of ranks with torch's env:// variables, and `job` wires it to the
job (checkpoint directory, progress file, GPU counters, Slurm gateway, the
embedded payload).
"""
