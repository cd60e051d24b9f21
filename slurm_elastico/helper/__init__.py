"""The backfill helper (`elastico sched`): one epoch = read, recover, observe, plan, act.

- `epoch`: the epoch driver (`run_once`) and its result; `main_loop` for `--interval`.
- `executor`: the one action executor — journal, issue, settle, stop a job's
  actions at its first failure. The helper and the simulator both act through it.
- `journal`: the journal in the store (`Journal`) and in memory (`MemoryJournal`,
  the simulator's); `recovery`: settling what an interrupted epoch left open, from
  Slurm's state of each job (a row stays open until that state settles it).
- `families`: where the helper finds each job's shape family.
- `observe` (pure) and `observer` (I/O): what the jobs' progress reports teach.
- `lock`: one helper per cluster (and per state directory) for the process's life;
  `epoch.render`: an epoch for a person.

The planner is pure (`slurm_elastico.planner`); this package is the I/O around it.
"""
