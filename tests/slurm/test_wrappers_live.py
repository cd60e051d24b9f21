"""elastico-submit and elastico-run through the real local Slurm cluster: reshapes that lose no work, and faults.

The reshapes go the way the helper does them: AdminComment `elastico:shape=<new>`
first, then `requeue_with_share` (requeuehold → SIGTERM → checkpoint → exit 75 →
new share → release), or, at the same share, `scancel --signal=USR1 --batch` for
an in-place relaunch. The training and inference jobs of each test run side by
side to keep the file short.
"""

from __future__ import annotations

import json
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch

from slurm_elastico.jobwrap.shape import family_from_spec
from slurm_elastico.model import JobState
from slurm_elastico.runtime.checkpoint import load_latest

from live_helpers import EXAMPLES, GRACE_S, Cluster

pytestmark = pytest.mark.live

TRAIN_FAMILY = """kind: train
global_batch: 32
micro_batches: [8, 16, 32]
precisions: [fp32]
checkpointing: [false, true]
steps: 20
mps_shares: [25, 50]
default: mb8-fp32-mps25
"""
INFER_FAMILY = """kind: infer
requests: 24
gpu_memory_utilization: [0.9]
max_num_seqs: [4, 8, 16]
kv_cache_dtype: [auto]
mps_shares: [25, 50]
"""
FAMILIES = {"train.yaml": TRAIN_FAMILY, "infer.yaml": INFER_FAMILY}
HOSTILE = "it's \"q\"; $(touch /nonexistent/x) `id` | ünï ✓\nsecond line"


def steps_after(text: str, marker: str) -> int:
    """Optimizer steps printed after the last line containing `marker`."""
    tail = text[text.rfind(marker):] if marker in text else ""
    return sum(1 for line in tail.splitlines() if line.startswith("step "))


def params(ckpt_dir: Path) -> torch.Tensor:
    ck = load_latest(ckpt_dir)
    assert ck is not None and ck.step == 20, f"no final checkpoint in {ckpt_dir}"
    return torch.cat([v.flatten().double() for v in ck.state["model"].values()])


def rel_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max() / a.abs().max())


# ----------------------------------------------------------------------------- training


@pytest.fixture(scope="module")
def train_runs(slurm_cluster, tmp_path_factory):
    """Five training jobs side by side: reference, other data seed, reshaped twice, requeued, checkpointing toggled in place."""
    c = Cluster(dict(slurm_cluster.env()), tmp_path_factory.mktemp("train"), FAMILIES)
    script = EXAMPLES / "train_tiny.py"
    common = ("--deterministic", "--step-sleep", "0.3")

    def reference():
        return c.submit("train.yaml", script, *common)

    def other_seed():
        return c.submit("train.yaml", script, *common, "--data-seed", "1")

    def reshaped_twice():
        j = c.submit("train.yaml", script, *common)
        c.wait_text(j, lambda t: steps_after(t, "shape mb8-fp32-mps25") >= 4, "4 steps as mb8")
        c.reshape(j, "mb16-fp32-mps50", 50)
        c.wait_text(j, lambda t: steps_after(t, "shape mb16-fp32-mps50") >= 4, "4 steps as mb16")
        c.reshape(j, "mb32-fp32-mps25", 25)
        return j

    def requeued():
        j = c.submit("train.yaml", script, *common)
        c.wait_text(j, lambda t: steps_after(t, "shape mb8-fp32-mps25") >= 6, "6 steps")
        c.gateway.requeue_with_share(j, 25)
        return j

    def toggled_in_place():
        j = c.submit("train.yaml", script, *common)
        c.wait_text(j, lambda t: steps_after(t, "shape mb8-fp32-mps25") >= 6, "6 steps")
        c.gateway.set_admin_comment(j, "elastico:shape=mb8-fp32-ckpt-mps25")
        c.gateway.signal(j, "USR1")  # same share: elastico-run relaunches in place, no requeue
        return j

    scenarios = {"reference": reference, "other_seed": other_seed, "reshaped_twice": reshaped_twice,
                 "requeued": requeued, "toggled_in_place": toggled_in_place}
    try:
        with ThreadPoolExecutor(len(scenarios)) as pool:
            futures = {name: pool.submit(fn) for name, fn in scenarios.items()}
            jobs = {name: f.result() for name, f in futures.items()}
        for j in jobs.values():
            c.wait_done(j)
        yield c, jobs
    finally:
        c.cancel_all()


def test_reshaped_twice_ends_within_rounding_of_the_uninterrupted_run(train_runs):
    c, jobs = train_runs
    j = jobs["reshaped_twice"]
    text = c.text(j)
    runs = c.summaries(j)
    assert [r["status"] for r in runs] == ["checkpointed", "checkpointed", "done"], text
    assert [r["requested_by"] for r in runs[:2]] == ["SIGTERM", "SIGTERM"]
    assert runs[1]["resumed_from"] == runs[0]["step"] and runs[2]["resumed_from"] == runs[1]["step"]
    assert sum(r["steps_run"] for r in runs) == 20  # no step lost or repeated
    for shape in ("mb8-fp32-mps25 (default)", "mb16-fp32-mps50 (AdminComment)", "mb32-fp32-mps25 (AdminComment)"):
        assert f"as shape {shape}" in text
    view = c.gateway.job(j)
    assert view.restarts == 2 and view.mps_share == 25
    ref = params(c.ckpt(jobs["reference"]))
    reshaped = rel_diff(ref, params(c.ckpt(j)))
    seed = rel_diff(ref, params(c.ckpt(jobs["other_seed"])))
    print(f"\nmax relative parameter difference vs the uninterrupted run: reshaped 8x4 -> 16x2 -> 32x1: {reshaped:.2e}; "
          f"another data seed: {seed:.2e}")
    assert 0 < reshaped < 1e-5, "a micro-batch change should differ only by summation-order rounding"
    assert seed > 1e3 * reshaped


def test_requeue_without_a_shape_change_is_bit_identical(train_runs):
    c, jobs = train_runs
    runs = c.summaries(jobs["requeued"])
    assert [r["status"] for r in runs] == ["checkpointed", "done"]
    assert runs[-1]["params_sha256"] == c.summaries(jobs["reference"])[-1]["params_sha256"]
    assert torch.equal(params(c.ckpt(jobs["requeued"])), params(c.ckpt(jobs["reference"])))


def test_checkpointing_toggled_in_place_is_bit_identical(train_runs):
    c, jobs = train_runs
    j = jobs["toggled_in_place"]
    text = c.text(j)
    runs = c.summaries(j)
    assert [(r["status"], r["requested_by"]) for r in runs] == [("checkpointed", "SIGUSR1"), ("done", None)]
    assert "reshape in place: mb8-fp32-mps25 -> mb8-fp32-ckpt-mps25" in text
    assert "checkpointing on" in text.split("reshape in place")[1]
    assert c.gateway.job(j).restarts == 0  # the same allocation all along
    assert runs[-1]["params_sha256"] == c.summaries(jobs["reference"])[-1]["params_sha256"]


# ----------------------------------------------------------------------------- inference


def test_inference_reshaped_mid_run_writes_exactly_the_uninterrupted_outputs(slurm_cluster, tmp_path):
    c = Cluster(dict(slurm_cluster.env()), tmp_path, FAMILIES)
    _, candidates = family_from_spec(INFER_FAMILY, "infer", 81920)
    by_seqs = {(s.knob("max_num_seqs"), s.resources.mps): s.name for s in candidates}
    args = ("--requests", str(EXAMPLES / "requests.jsonl"), "--batch-sleep", "0.4")
    try:
        ref = c.submit("infer.yaml", EXAMPLES / "infer_tiny.py", *args)
        j = c.submit("infer.yaml", EXAMPLES / "infer_tiny.py", *args, options=("--gres=mps:25", "--hold"))
        # the family default is its fastest shape at the largest share; the helper shapes the pending job first
        c.gateway.set_admin_comment(j, f"elastico:shape={by_seqs[(4, 25)]}")
        c.gateway.release(j)
        c.wait_text(j, lambda t: "journaled 8/24" in t, "two batches")
        c.reshape(j, by_seqs[(16, 50)], 50)
        c.wait_done(j)
        c.wait_done(ref)
    finally:
        c.cancel_all()
    text = c.text(j)
    assert "max_num_seqs 4" in text and "max_num_seqs 16" in text
    runs = c.summaries(j)
    assert [r["status"] for r in runs] == ["checkpointed", "done"] and sum(r["written"] for r in runs) == 24

    def journal(job_id):
        lines = (c.ckpt(job_id) / "journal.jsonl").read_text().splitlines()
        return [json.loads(line) for line in lines]

    got, want = journal(j), journal(ref)
    ids = [r["id"] for r in got]
    assert len(ids) == len(set(ids)) == 24  # each request once
    assert {r["shape"] for r in got} == {by_seqs[(4, 25)], by_seqs[(16, 50)]}
    key = lambda rs: sorted((r["id"], r["text"], r["token_ids"]) for r in rs)  # noqa: E731
    assert key(got) == key(want)


# ----------------------------------------------------------------------------- faults

ARGV_PROGRAM = """#!{python}
import json, os, sys
json.dump({{"argv": sys.argv[1:], "name": os.environ.get("SLURM_JOB_NAME")}}, open(os.path.join({out!r}, os.environ["SLURM_JOB_ID"] + ".argv"), "w"))
"""

STUBBORN = """#!{python}
# Ignores SIGTERM; checkpoints every step; resumes from the newest good checkpoint.
import os, signal, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
from slurm_elastico.runtime.checkpoint import load_latest, save_checkpoint
d = os.environ["ELASTICO_CKPT_DIR"]
ck = load_latest(d)
step = ck.step if ck else 0
print("resumed from", step, flush=True)
while step < 30:  # long enough that it cannot finish inside the grace
    time.sleep(0.3)
    step += 1
    save_checkpoint(d, step, {{"step": step}})
    print("step", step, flush=True)
"""


def test_bad_family_or_missing_script_fails_at_submit_time_and_submits_nothing(slurm_cluster, tmp_path):
    c = Cluster(dict(slurm_cluster.env()), tmp_path, FAMILIES)
    (tmp_path / "bad.yaml").write_text("kind: train\nglobal_batch: 32\nmicro_batches: [5]\nsteps: 10\nmps_shares: [250]\n")
    before = c.queue()
    done = c.submit_cmd("--family", "bad.yaml", "missing.sh")
    assert done.returncode == 2 and done.stdout == ""
    assert "missing.sh: cannot read it" in done.stderr and "bad.yaml" in done.stderr and "nothing was submitted" in done.stderr
    done = c.submit_cmd("--family", "nope.yaml", str(EXAMPLES / "train_tiny.py"))
    assert done.returncode == 2 and "nope.yaml: cannot read it" in done.stderr
    # No new job: jobs of earlier tests may still leave the queue meanwhile, none may join it.
    assert c.queue() <= before


def test_hostile_name_comment_and_args_reach_slurm_and_the_program_unharmed(slurm_cluster, tmp_path):
    c = Cluster(dict(slurm_cluster.env()), tmp_path, FAMILIES)
    prog = tmp_path / "argv.py"
    prog.write_text(ARGV_PROGRAM.format(python=sys.executable, out=str(tmp_path)))
    args = [HOSTILE, "--family", "", "-J", "$HOME", "*", "a;b"]
    try:
        j = c.submit("train.yaml", prog, *args, options=(f"--job-name={HOSTILE}", f"--comment={HOSTILE}", "--hold"))
        view = c.gateway.job(j)
        assert view.name == HOSTILE and view.comment == HOSTILE and view.held
        c.gateway.release(j)
        c.wait_done(j, timeout=60)
    finally:
        c.cancel_all()
    seen = json.loads((tmp_path / f"{j}.argv").read_text())
    assert seen == {"argv": args, "name": HOSTILE}
    assert not Path("/nonexistent/x").exists()


def test_program_ignoring_sigterm_is_killed_after_the_grace_and_resumes_from_its_last_checkpoint(slurm_cluster, tmp_path):
    c = Cluster(dict(slurm_cluster.env()), tmp_path, FAMILIES)
    prog = tmp_path / "stubborn.py"
    prog.write_text(STUBBORN.format(python=sys.executable))
    try:
        j = c.submit("train.yaml", prog)
        c.wait_text(j, lambda t: "step 4\n" in t, "4 steps")
        t0 = time.monotonic()
        c.gateway.requeue_with_share(j, 25)
        held_for = time.monotonic() - t0
        text = c.wait_done(j, timeout=90)
        final = c.gateway.wait_state(j, (JobState.COMPLETED,), 30)
    finally:
        c.cancel_all()
    assert final.restarts == 1
    assert f"did not exit within the {GRACE_S:g} s grace" in text
    assert held_for >= GRACE_S - 0.5, "the job went pending before the grace ran out: was the program really killed?"
    first, second = [int(line.split()[-1]) for line in text.splitlines() if line.startswith("resumed from")]
    last_before = max(int(line.split()[1]) for line in text.split("grace")[0].splitlines() if line.startswith("step "))
    # resumed from the newest checkpoint it wrote (saved before printing, so perhaps one past the last line)
    assert first == 0 and 4 <= second <= last_before + 1
    assert [line for line in text.splitlines() if line.startswith("step ")][-1] == "step 30"
