"""The cluster's own history: its past GPU jobs from accounting (`past`), written as a trace file (`trace_file`)."""
