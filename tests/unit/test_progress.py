"""Progress reports: the file format, atomic writes, rate limiting, and the runtime loops that write them."""

import json
import os

import pytest
import torch

from slurm_elastico.runtime.engines import TorchEngine
from slurm_elastico.runtime.infer import run_inference
from slurm_elastico.runtime.journal import Request
from slurm_elastico.runtime.progress import (ENV, Progress, ProgressReporter, ReportError, progress_path,
                                             read_progress, write_progress)
from slurm_elastico.runtime.shape import InferShape, TrainShape
from slurm_elastico.runtime.tinylm import TinyConfig, build_tiny_lm, lm_loss, synthetic_tokens
from slurm_elastico.runtime.train import train


def test_a_report_round_trips_and_the_path_rule_is_one_function(tmp_path):
    path = progress_path(tmp_path, 42)
    assert path == tmp_path / ".elastico" / "42" / "progress.json"
    assert read_progress(path) is None  # no report yet is not an error
    write_progress(path, Progress(3, 10, 1000.5, "m8", 2, 990.0))
    assert read_progress(path) == Progress(3.0, 10.0, 1000.5, "m8", 2, 990.0)
    assert [p.name for p in path.parent.iterdir()] == ["progress.json"]  # no temporary file left behind


@pytest.mark.parametrize("text, problem", [
    ("{", "not JSON"),
    # Deep nesting is refused before parsing, the same on every Python (3.11's json raises RecursionError near
    # 1,000 levels, 3.14's parses 30,000), also inside a report that is otherwise valid.
    ("[" * 30000 + "]" * 30000, "nested deeper than 32 levels"),
    ('{"version": 1, "done": 1, "total": 2, "updated": 3, "x": ' + "[" * 1500 + "]" * 1500 + "}",
     "nested deeper than 32 levels"),
    ('{"version": 1, "done": 1, "total": 2, "updated": 3, "x": ' + "[" * 32 + "]" * 32 + "}", "nested deeper than 32"),
    ('{"version": 9, "done": 1, "total": 2, "updated": 3}', "version 1"),
    ('{"version": 1, "done": -1, "total": 2, "updated": 3}', "done = -1"),
    ('{"version": 1, "done": 1e400, "total": 2, "updated": 3}', "done = inf"),
    ('{"version": 1, "done": 1' + "0" * 400 + ', "total": 2, "updated": 3}', "done = 1000"),  # a huge int
    ('{"version": 1, "done": 3, "total": 2, "updated": 3}', "exceeds total"),
    ('{"version": 1, "done": 1, "total": 2}', "updated = None"),
    ('{"version": 1, "done": true, "total": 2, "updated": 3}', "done = True"),
    ('{"version": 1, "done": 1, "total": 2, "updated": 3, "restarts": "x"}', "restarts"),
    ('{"version": 1, "done": 1, "total": 2, "updated": 3, "restarts": 1180591620717411303424}', "restarts"),
    ('{"version": 1, "pad": "' + "x" * 70000 + '"}', "larger than"),
])
def test_a_bad_report_is_refused_with_the_file_and_the_field(tmp_path, text, problem):
    path = tmp_path / "progress.json"
    path.write_text(text)
    with pytest.raises(ReportError, match=problem) as err:
        read_progress(path)
    assert str(err.value).startswith(f"{path}: ")


def test_nesting_up_to_the_limit_is_read_and_brackets_inside_strings_do_not_count(tmp_path):
    path = tmp_path / "progress.json"
    deep = '{"version": 1, "done": 1, "total": 2, "updated": 3, "x": ' + "[" * 31 + "]" * 31 + "}"  # 32 levels
    path.write_text(deep)
    assert read_progress(path).done == 1.0
    brackets = '[{"' * 200 + '\\"[{'  # unbalanced brackets and an escaped quote, all inside one string
    path.write_text(json.dumps({"version": 1, "done": 1, "total": 2, "updated": 3, "shape": brackets}))
    assert read_progress(path).shape == brackets[:200]


def test_a_fifo_device_or_symlink_is_refused_without_blocking(tmp_path):
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)  # nobody writes: a plain open would block the helper forever
    with pytest.raises(ReportError, match="not a regular file"):
        read_progress(fifo)
    link = tmp_path / "link.json"
    link.symlink_to("/dev/zero")
    with pytest.raises(ReportError, match="cannot be read"):
        read_progress(link)


def test_the_reporter_is_rate_limited_but_always_writes_a_final_report(tmp_path):
    t = [100.0]
    path = tmp_path / "p.json"
    rep = ProgressReporter(path, min_interval_s=5, env={"ELASTICO_SHAPE": "s1", "SLURM_RESTART_COUNT": "3"},
                           clock=lambda: t[0])
    assert rep.report(1, 10)
    t[0] = 102.0
    assert not rep.report(2, 10)  # too soon
    assert read_progress(path).done == 1
    assert rep.report(3, 10, final=True)
    t[0] = 108.0
    assert rep.report(4, 10)
    assert read_progress(path) == Progress(4, 10, 108.0, "s1", 3, started=100.0)


def test_without_a_report_file_nothing_is_written(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert not ProgressReporter(env={}).report(1, 2, final=True)
    assert list(tmp_path.iterdir()) == []


def test_an_unwritable_report_never_fails_the_job(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    rep = ProgressReporter(blocker / "sub" / "p.json", env={})  # a parent that is a file: OSError
    assert not rep.report(1, 2, final=True)
    assert rep.path is None  # stops trying for this run


def test_the_training_loop_reports_steps_done(tmp_path, monkeypatch):
    monkeypatch.setenv(ENV, str(tmp_path / "progress.json"))
    model = build_tiny_lm(TinyConfig(vocab_size=64, max_positions=16, d_model=16, n_heads=2, n_layers=1, d_ff=32), seed=0)
    shape = TrainShape(global_batch=8, micro_batch=4, accumulation=2, steps=6)
    result = train(model, torch.optim.SGD(model.parameters(), lr=0.1), shape, synthetic_tokens(64, 16, 64, seed=1),
                   lm_loss, ckpt_dir=tmp_path / "ck", should_stop=lambda: False)
    assert result.status == "done"
    report = json.loads((tmp_path / "progress.json").read_text())
    assert (report["done"], report["total"]) == (6, 6)


def test_the_inference_runner_reports_requests_done(tmp_path):
    path = tmp_path / "progress.json"
    reqs = [Request(f"r{i}", "hello", 2) for i in range(5)]
    stops = iter([False, False, True])
    result = run_inference(reqs, tmp_path / "journal.jsonl", TorchEngine(), InferShape(max_num_seqs=2),
                           should_stop=lambda: next(stops), progress=ProgressReporter(path, env={}))
    assert result.status == "checkpointed"
    assert (read_progress(path).done, read_progress(path).total) == (4, 5)


def test_status_shows_the_work_a_running_job_reports_done(tmp_path):
    from dataclasses import replace

    from slurm_elastico.cli.view import progress_of, render, snapshot_dict
    from tests.synthetic import cluster, pending, running, snapshot

    job = replace(running(7, "n0000", 0, 50), work_dir=str(tmp_path))
    snap = snapshot(cluster(1), [job, pending(8)])
    write_progress(progress_path(tmp_path, 7), Progress(30, 120, 1.0))
    progress = progress_of(snap)
    assert list(progress) == [7]
    line = next(ln for ln in render(snap, progress).splitlines() if ln.strip().startswith("7 "))
    assert " 25% " in line
    assert snapshot_dict(snap, progress)["jobs"][0]["progress"]["done"] == 30
    assert snapshot_dict(snap, progress)["jobs"][1]["progress"] is None
