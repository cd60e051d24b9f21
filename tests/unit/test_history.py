"""The cluster's past GPU jobs from sacct: every job kept or skipped with a reason, runs merged, the file round trip."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from slurm_elastico.errors import ConfigError
from slurm_elastico.history import trace_file
from slurm_elastico.history.past import (SKIP_BAD, SKIP_CANCELLED, SKIP_HET, SKIP_NO_GPU, SKIP_PARTITION, Family,
                                         past_jobs)
from slurm_elastico.model import JobState
from slurm_elastico.slurm.accounting import SacctRecord, parse_sacct_each

DATA = Path(__file__).resolve().parents[1] / "data" / "slurm"


def run(job_id, state, submit, start=None, end=None, gpu=0, mps=0, typed="", partition="gpu", nodes=("n1",),
        **kw):
    tres = {"cpu": 2, "mem": 4000, "node": 1, **({"gres/gpu": gpu} if gpu else {}),
            **({f"gres/gpu:{typed}": gpu} if typed else {}), **({"gres/mps": mps} if mps else {})}
    return SacctRecord(job_id=job_id, name="j", user="ann", state=state, submit_time=submit, start_time=start,
                       end_time=end, elapsed_s=(end - start) if start and end else 0, tres_req=tres,
                       partition=partition, nodes=nodes if start else (), account="ml", **kw)


def test_every_kind_of_job_is_kept_or_skipped_with_its_reason():
    records = [
        run(1, JobState.COMPLETED, 100, 110, 400, gpu=2, typed="a100", time_limit_s=3600),
        run(2, JobState.REQUEUED, 100, 120, 300, mps=25),  # requeued, then ran again to the end
        run(2, JobState.COMPLETED, 300, 305, 900, mps=50),
        run(3, JobState.FAILED, 150, 160, 170, gpu=1),
        run(4, JobState.RUNNING, 200, 210, None, gpu=1),
        run(5, JobState.PENDING, 250, gpu=4),
        run(6, JobState.CANCELLED, 260, None, 280, gpu=1),  # left the queue before it started
        run(7, JobState.COMPLETED, 100, 110, 400),  # no GPU
        run(8, JobState.COMPLETED, 100, 110, 400, gpu=1, het_job_id=8, het_job_offset=0),
        run(9, JobState.COMPLETED, 100, 110, 400, gpu=1, partition="debug"),
        run(21, JobState.COMPLETED, 300, 310, 330, gpu=1, array_job_id=20, array_task_id=1),
        run(22, JobState.CANCELLED, 300, 320, 340, gpu=1),  # cancelled while running: it held a GPU
    ]
    jobs, s = past_jobs(records, "gpu", {2: Family("tiny-lm", "train")}, bad=["job 99: jobs[12].time.start ..."])
    by_id = {j.job_id: j for j in jobs}
    assert sorted(by_id) == ["1", "2", "20_1", "22", "3", "4", "5"]
    assert dict(s.skipped) == {SKIP_NO_GPU: 1, SKIP_HET: 1, SKIP_PARTITION: 1, SKIP_CANCELLED: 1, SKIP_BAD: 1}
    assert s.seen == 12 == len({r.job_id for r in records}) + 1  # every distinct job, and the unreadable one
    assert (s.kept, s.finished, s.failed, s.running, s.pending) == (7, 5, 2, 1, 1)
    assert (s.requeued, s.array_tasks, s.with_family) == (1, 1, 1)
    a = by_id["1"]
    assert (a.gpus, a.mps, a.gpu_type, a.cpus, a.mem_mib, a.wait_s, a.run_s, a.time_limit_s) == \
        (2, 0, "a100", 2, 4000, 10, 290, 3600)
    b = by_id["2"]  # its runs merged: first submission and start, last end, the first run's request
    assert (b.submit, b.start, b.end, b.restarts, b.mps, b.state, b.family, b.kind) == \
        (100, 120, 900, 1, 25, "COMPLETED", "tiny-lm", "train")
    assert (a.ran_on, b.ran_on, by_id["5"].ran_on) == ("n1", "n1", "")  # where it last ran: none for a pending job
    assert by_id["4"].end is None and by_id["4"].run_s is None and by_id["5"].start is None
    assert by_id["3"].state == "FAILED" and by_id["22"].state == "CANCELLED"
    assert [j.job_id for j in jobs] == ["1", "2", "3", "4", "5", "20_1", "22"]  # submission order


def test_the_type_a_run_was_given_is_read_from_its_allocated_tres():
    """An untyped request (`--gres=gpu:2`) that Slurm gave A100s: where typed GPUs are accounted, the allocated TRES
    name the type; the what-if calibrates the job on it."""
    alloc = {"cpu": 2, "mem": 4000, "node": 1, "gres/gpu": 2, "gres/gpu:a100": 2}
    records = [run(1, JobState.COMPLETED, 100, 110, 400, gpu=2, tres_alloc=alloc),
               run(2, JobState.COMPLETED, 100, 110, 400, gpu=2, tres_alloc={"gres/gpu": 2})]
    jobs, _ = past_jobs(records)
    assert [(j.gpu_type, j.ran_type) for j in jobs] == [("", "a100"), ("", "")]


def test_recorded_accounting_of_both_versions_is_accounted_for():
    for name, jobs_in_file in (("22.05/sacct_requeued_duplicates.json", 1), ("24.11/sacct_json_D_X_S_now_1hour.json", 12)):
        records, bad = parse_sacct_each((DATA / name).read_text())
        jobs, s = past_jobs(records, bad=bad)
        assert s.seen == jobs_in_file and not bad, name
        assert s.kept == len(jobs) and s.kept + sum(s.skipped.values()) == jobs_in_file
        # where each started job last ran, as the what-if reads its GPU type (the local cluster's nodes n1..n4)
        assert all(re.fullmatch(r"n\d+", j.ran_on) for j in jobs if j.start is not None), [j.ran_on for j in jobs]
        assert any(j.start is not None for j in jobs), name
    # 24.11: job 8 asked for no GPU, jobs 2-6 were cancelled while pending; job 11 was requeued
    assert s.skipped[SKIP_NO_GPU] == 1 and s.requeued == 1


def test_an_unreadable_record_is_set_aside_naming_its_job_and_field():
    doc = json.loads((DATA / "24.11" / "sacct_json_D_X_S_now_1hour.json").read_text())
    doc["jobs"][3]["time"]["start"] = "soon"
    doc["jobs"][5]["job_id"] = "x"
    records, bad = parse_sacct_each(json.dumps(doc))
    assert len(records) == len(doc["jobs"]) - 2
    assert bad[0].startswith(f"job {doc['jobs'][3]['job_id']}: ") and "jobs[3].time.start" in bad[0]
    assert bad[1].startswith("job (no job_id): ") and "jobs[5].job_id" in bad[1]


def test_the_trace_file_reads_back_what_was_written_and_names_a_bad_cell(tmp_path: Path):
    records = [run(1, JobState.COMPLETED, 100, 110, 400, gpu=2, typed="a100", nodes=("gpu-a7", "gpu-a8")),
               run(5, JobState.PENDING, 250, mps=50)]
    jobs, _ = past_jobs(records)
    assert jobs[0].ran_on == "gpu-a7"
    path = tmp_path / "t.csv"
    trace_file.write(jobs, path)
    assert trace_file.read(path) == jobs
    lines = path.read_text().splitlines()
    assert lines[0] == ",".join(trace_file.COLUMNS)
    assert lines[2].split(",")[:6] == ["5", "250", "", "", "", ""]  # pending: no start, end, wait or run time
    path.write_text(path.read_text().replace(",COMPLETED,2,", ",COMPLETED,two,"))
    with pytest.raises(ConfigError, match=r"line 2, gpus = 'two': not an integer"):
        trace_file.read(path)
    path.write_text("job_id,submit\n1,2\n")
    with pytest.raises(ConfigError, match="missing column.*start"):
        trace_file.read(path)


def test_a_write_that_fails_leaves_the_old_file_and_no_temporary(tmp_path: Path):
    path = tmp_path / "t.csv"
    path.write_text("old\n")
    jobs, _ = past_jobs([run(1, JobState.COMPLETED, 100, 110, 400, gpu=1)])

    def broken():
        yield jobs[0]
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        trace_file.write(broken(), path)
    assert path.read_text() == "old\n" and [p.name for p in tmp_path.iterdir()] == ["t.csv"]


def test_a_job_with_one_unreadable_run_is_skipped_whole_and_counted_once():
    """Its other runs alone would give it the reshaped request and the later submission, and no restart."""
    doc = json.loads((DATA / "22.05" / "sacct_requeued_duplicates.json").read_text())
    assert [j["job_id"] for j in doc["jobs"]] == [22, 22]
    readable, _ = parse_sacct_each(json.dumps(doc))
    jobs, _ = past_jobs(readable, bad=())
    assert [j.job_id for j in jobs] == ["22"] and jobs[0].restarts == 1
    doc["jobs"][0]["time"]["submission"] = "yesterday"
    records, bad = parse_sacct_each(json.dumps(doc))
    jobs, summary = past_jobs(records, bad=bad)
    assert jobs == [] and summary.seen == 1 and summary.skipped[SKIP_BAD] == 1 and len(summary.bad) == 1
    doc["jobs"][1]["job_id"] = "x"  # a record without a job id counts by itself
    records, bad = parse_sacct_each(json.dumps(doc))
    assert past_jobs(records, bad=bad)[1].skipped[SKIP_BAD] == 2


def test_a_family_stored_for_an_earlier_job_of_the_same_id_is_not_this_jobs():
    records = [run(5, JobState.COMPLETED, 1000, 1010, 1100, gpu=1), run(6, JobState.REQUEUED, 1000, 1010, 1050, gpu=1),
               run(6, JobState.COMPLETED, 1060, 1070, 1100, gpu=1)]
    stored = {5: Family("old", "train", 400.0), 6: Family("lm", "train", 1060.0)}  # 6: read at its second submission
    jobs, summary = past_jobs(records, families=stored)
    assert {j.job_id: j.family for j in jobs} == {"5": "", "6": "lm"} and summary.with_family == 1


def test_an_array_none_of_whose_tasks_started_is_one_pending_job_per_task():
    """sacct prints such an array as one record: 22.05 names its tasks as a hex bitmap (seen live: 0x7)."""
    from slurm_elastico.errors import ParseError
    from slurm_elastico.slurm.accounting import array_tasks

    assert array_tasks("0x7") == (0, 1, 2) and array_tasks("0x12") == (1, 4)
    assert array_tasks("0-2,5") == (0, 1, 2, 5) and array_tasks("0-10:5%2") == (0, 5, 10) and array_tasks("") == ()
    with pytest.raises(ParseError, match="hex bitmap"):
        array_tasks("a-b")
    doc = json.loads((DATA / "24.11" / "sacct_json_D_X_S_now_1hour.json").read_text())
    rec = doc["jobs"][0]
    rec["array"]["job_id"], rec["array"]["task_id"], rec["array"]["task"] = rec["job_id"], {"set": False,
                                                                                         "infinite": False,
                                                                                         "number": 0}, "0x7"
    records, bad = parse_sacct_each(json.dumps({**doc, "jobs": [rec]}))
    assert bad == () and records[0].array_pending == (0, 1, 2)
    pending = run(9, JobState.PENDING, 100, gpu=1, array_job_id=9, array_pending=(0, 1, 2))
    jobs, summary = past_jobs([pending])
    assert [j.job_id for j in jobs] == ["9_0", "9_1", "9_2"] and all(j.start is None for j in jobs)
    assert (summary.kept, summary.pending, summary.array_tasks, summary.seen) == (3, 3, 3, 3)
