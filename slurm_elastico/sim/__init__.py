"""The trace-driven simulator (`elastico sim`): the real planner on a simulated Slurm GPU cluster.

`engine.run(trace, policy, settings, sim, model)` replays a trace under one
policy of the planner's registry, acting through `cluster.SimCluster` (a
gateway like `SlurmGateway`), with job speeds and co-location slowdowns from
`truth.GroundTruth` — never from the model the policy consults. `trace`
holds a trace's jobs and its CSV format; `trace_pollux`, `trace_philly`,
`trace_alibaba` and `trace_synthetic` make traces from public ones and
synthetic mixes, and `trace_spec.load` picks one by name; `metrics`
summarises runs with confidence intervals over seeds; `plots` draws them.
"""
