"""A finished job through the gateway's one-job query, on recorded output of both Slurm versions (no cluster).

Recorded on a local cluster: job 1 (`sleep 1`) had COMPLETED while job 2 still ran. Slurm 24.11 leaves a
finished job out of `squeue --all --json --jobs=1` (an empty list, "Zero jobs to dump") and lists it with
`--states=all`; 22.05 lists it either way, accepts `--states=all`, and ignores `--jobs` under `--json`.
"""

from pathlib import Path

import pytest

from slurm_elastico.errors import UnknownJobError
from slurm_elastico.model import JobState
from slurm_elastico.slurm import commands
from slurm_elastico.slurm.gateway import SlurmGateway
from slurm_elastico.slurm.jobs import parse_squeue
from slurm_elastico.slurm.runner import Completed
from slurm_elastico.slurm.schema import slurm_version

DATA = Path(__file__).resolve().parents[1] / "data" / "slurm"


class RecordedSqueue:
    """Answers the squeue argv it was recorded for with that output; any other command is a test failure."""

    def __init__(self, argv: list[str], path: Path):
        self.argv, self.text = argv, path.read_text()
        self.calls: list[list[str]] = []

    def __call__(self, argv, *, timeout=None):
        self.calls.append(list(argv))
        assert list(argv) == self.argv, f"unexpected command {argv}"
        return Completed(tuple(argv), 0, self.text, "")


def test_the_one_job_query_asks_for_finished_jobs():
    assert commands.squeue_job_json(1) == ["squeue", "--all", "--json", "--states=all", "--jobs=1"]


@pytest.mark.parametrize("version, sample, listed", [
    ("24.11", "squeue_json_states_all_finished.json", {1}),
    ("22.05", "squeue_json_states_all_finished.json", {1, 2}),  # --jobs ignored under --json
])
def test_gateway_sees_a_finished_job(version, sample, listed):
    runner = RecordedSqueue(commands.squeue_job_json(1), DATA / version / sample)
    gateway = SlurmGateway(runner, sleep=lambda s: None)
    view = gateway.job(1)
    assert view.job_id == 1 and view.state is JobState.COMPLETED and not view.state.active
    assert gateway.wait_state(1, [JobState.COMPLETED], timeout_s=0).state is JobState.COMPLETED
    assert runner.calls == [commands.squeue_job_json(1)] * 2
    assert {j.job_id for j in parse_squeue(runner.text)} == listed
    assert slurm_version(runner.text).startswith(version)


def test_without_states_all_24_11_lists_no_finished_job():
    # Why the query carries --states=all: the same moment without it, as 24.11 printed it.
    text = (DATA / "24.11" / "squeue_json_finished_no_states.json").read_text()
    assert slurm_version(text).startswith("24.11") and parse_squeue(text) == ()
    listed = (DATA / "24.11" / "squeue_json_states_all_finished.json").read_text()
    assert slurm_version(listed).startswith("24.11") and [j.job_id for j in parse_squeue(listed)] == [1]
