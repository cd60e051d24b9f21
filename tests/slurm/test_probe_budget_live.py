"""The probe budget through real Slurm: a pair the adapting model is unsure of is tried only with budget, charged to
the ledger, undone after its one measurement, and the measurement reaches the adaptation.

The helper is given a model trained on Gavel's K80 pairs (`elastico iac train`, a few seconds) and runs on the
test cluster's `fake` GPUs, a type the model never saw, with `interference.adapt_online` and
`interference.probe_budget`. Two inference jobs of one family at half a GPU each: the untrained model predicts
each slowed 1.6x next to the other, which the gain rule refuses on a GPU type with no measured pair (summed
fractions 1.23 < 1 + the untrained margin 0.4); probing, the model's optimism on a pair never measured lets it
through (`interference.adapt_online`). The planner's only choice is where a job goes: under the `no-shapes`
policy each job runs at its family's default (half a GPU), so a share of the other job's GPU is chosen over an
empty GPU only when the pair is admitted.

Each fake GPU is a clock file, as in test_probe_revert_live: a step (here a request) is one kernel of `KERNEL_S`
on the job's GPU, so two jobs on one GPU take turns, each at about half its solo speed: below the family's floor
(0.65 of its speed alone), a probe that loses.

A pair becomes an observation the adaptation learns from only once both jobs' solo speeds at their shapes are
known (`helper.observe.pair_observations`), so in the first test the job that joins is one that ran alone at that
shape before and was requeued (requeuehold, a begin time in the future, release: the state of a job in
elastico-submit's placement window, and of one Slurm requeued, which waits about two minutes to start again); the
helper places it. In the second it joins straight from the queue (elastico-submit's placement window), never having
run alone: the probe is judged against its family's figure for the shape, charged, undone, and teaches the model
nothing (`helper.observer`).
"""

from __future__ import annotations

import json
import re
import subprocess
import time
from pathlib import Path

import pytest

from slurm_elastico.config import load
from slurm_elastico.helper.metrics import Metrics
from slurm_elastico.helper.service import open_service
from slurm_elastico.model import JobState

from live_helpers import BIN, Cluster, epoch, fake_gpu_program, idle_nodes, solo_rates, until, wait_report
from test_probe_revert_live import SPEED, gpu_of

pytestmark = [pytest.mark.live, pytest.mark.alone]  # it times jobs: other tests' CPU use would stretch their steps

GAVEL = Path(__file__).resolve().parents[1] / "data" / "gavel"
PROGRAM = fake_gpu_program('os.environ.setdefault("ELASTICO_STEPS", "100000000")  # an inference job: requests, reported like steps')
"""test_probe_revert_live's job on a fake GPU, as an inference job (argv[1]: the clocks' directory)."""

HALF, WHOLE = "gmu0.9-seqs16-kvauto-mps50", "gmu0.9-seqs16-kvauto-mps100"
FAMILY = f"""kind: infer
name: probe-live
requests: 100000000
gpu_memory_utilization: [0.9]
max_num_seqs: [16]
kv_cache_dtype: [auto]
mps_shares: [50, 100]
throughput_floor: {0.65 * SPEED:.3f}
cpus: 1
host_mem_mib: 512
default: {HALF}
declared:
  {HALF}: {{throughput: {SPEED:.3f}, gpu_mem_mib: 1000}}
  {WHOLE}: {{throughput: {1.8 * SPEED:.3f}, gpu_mem_mib: 1000}}
"""
"""Half a GPU by default (where the planner places it); the whole-GPU shape is where a probe that lost moves it."""
BUDGET = 0.1
"""`interference.probe_budget`: a tenth of the fake GPUs' time (16 GPUs: 9.6 GPU-s per 6 s epoch)."""
CONFIG = """planner: {{policy: no-shapes}}
gpu: {{type: fake}}
interference: {{model: {model}, adapt_online: true, probe_budget: {budget}}}
"""
MAX_EPOCHS = 8
"""Epochs 6 s apart for the probe to be measured: warm-up (5 s), two readings >= 5 s apart and 10 s side by side."""
START = re.compile(r"at 50% of GPU (\S+):(\d+) \(")
"""Where a start action's reason says the job goes (`planner.actions`)."""


def train(root) -> str:
    """A prior-corrected model trained on the K80 pairs of Gavel's measurements (no `fake` GPU among them)."""
    data, model = root / "k80.csv", root / "k80.json"
    for argv in (["import-gavel", "--pairs", GAVEL / "throughputs_pairs.csv", "--isolated",
                  GAVEL / "throughputs_isolated.csv", "--gpu-type", "k80", "--out", data],
                 ["train", "--data", data, "--out", model]):
        done = subprocess.run([str(BIN / "elastico"), "iac", *map(str, argv)], capture_output=True, text=True,
                              timeout=120)
        assert done.returncode == 0, done.stderr
    return str(model)


def sched(c: Cluster, config, *flags: str) -> dict:
    """One `elastico sched --once --json` epoch under another configuration file (same state directory)."""
    done = subprocess.run([str(BIN / "elastico"), "sched", "--once", "--json", *flags],
                          env={**c.env, "ELASTICO_CONFIG": str(config)}, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def placed(result: dict, job_id: int) -> tuple[str, int] | None:
    """The GPU (node, index) the epoch starts `job_id` on, from its start action's reason; None if not started."""
    for action in result["actions"]:
        if action["job_id"] == job_id and (m := START.search(action["reason"])):
            return m.group(1), int(m.group(2))
    return None


def ledger(c: Cluster) -> tuple[float, float]:
    """(GPU-seconds up, GPU-seconds spent on probes) of the fake GPUs' probe ledger."""
    with c.store() as store:
        rows = store.query("SELECT gpu_s, probe_gpu_s FROM probe_ledger WHERE gpu_type = 'fake'")
    return (rows[0]["gpu_s"], rows[0]["probe_gpu_s"]) if rows else (0.0, 0.0)


def adapted_pairs(c: Cluster) -> int:
    """Pairs the helper's adapting model knows on `fake` when it starts (as every `sched --once` epoch does)."""
    service = open_service(load(c.root / "elastico.yaml"), None, families_dir=None, dry_run=True,
                           metrics=Metrics(), metrics_file=None, log=lambda level, line: None)
    try:
        return len(service.model.measured)
    finally:
        service.store.close()


def wait_begin_time(c: Cluster, job_id: int, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        view = c.gateway.job(job_id)
        if view.state is JobState.PENDING and view.reason == "BeginTime" and not view.held:
            return
        time.sleep(0.3)
    raise AssertionError(f"job {job_id} is not pending for its begin time: {c.gateway.job(job_id)}")


def test_a_probe_is_made_only_with_budget_charged_undone_after_one_measurement_and_learned(slurm_cluster, tmp_path):
    program = tmp_path / "contend.py"
    program.write_text(PROGRAM)
    model = train(tmp_path)
    c = Cluster(dict(slurm_cluster.env()), tmp_path, {"f.yaml": FAMILY},
                config=CONFIG.format(model=model, budget=BUDGET))
    no_budget = tmp_path / "no-budget.yaml"
    settings = (tmp_path / "elastico.yaml").read_text()
    no_budget.write_text(settings.replace(CONFIG.format(model=model, budget=BUDGET),
                                          CONFIG.format(model=model, budget=0)))
    assert load(no_budget).interference.probe_budget == 0 and load(tmp_path / "elastico.yaml").interference.probe_budget
    try:
        first, second = idle_nodes(c)
        clocks = tmp_path / "gpus"
        clocks.mkdir()
        a = c.submit("f.yaml", program, str(clocks), options=("-w", first))
        b = c.submit("f.yaml", program, str(clocks), options=("-w", second))
        wait_report(c, a, 0)
        wait_report(c, b, 0)
        assert gpu_of(c, a) != gpu_of(c, b), (c.text(a), c.text(b))  # alone, each on a GPU of its own
        until(c, lambda notes: solo_rates(c) == {a, b}, "a solo speed for each job")
        assert ledger(c)[1] == 0 and adapted_pairs(c) == 0

        # b waits to be placed again (its solo speed at half a GPU is known)
        subprocess.run(["scontrol", "requeuehold", str(b)], env=c.env, check=True, capture_output=True, timeout=30)
        c.gateway.wait_state(b, (JobState.PENDING,), 60)
        subprocess.run(["scontrol", "update", f"JobId={b}", "StartTime=now+600"], env=c.env, check=True,
                       capture_output=True, timeout=30)
        c.gateway.release(b)
        wait_begin_time(c, b)
        (_, a_gpu, _), = c.gateway.job(a).gpu_alloc
        shared = (first, a_gpu)

        # (2) without budget the same situation makes no probe: b goes to a GPU of its own (a dry run: nothing moves)
        plain = sched(c, no_budget, "--dry-run")
        alone = placed(plain, b)
        assert alone is not None and alone != shared, (shared, plain)
        assert not [n for n in plain["notes"] if n.startswith("probe:")], plain["notes"]
        # (1) with budget b joins a's GPU: a pair never measured on `fake`, tried within the budget
        up, spent = ledger(c)
        result = epoch(c)
        probe = placed(result, b)
        assert probe == shared, (shared, result)
        assert [x for x in result["actions"] if x["job_id"] == b and x["status"] != "done"] == [], result["actions"]
        assert any("pairs never measured may be tried" in n for n in result["notes"]), result["notes"]
        noted = [n for n in result["notes"] if n.startswith("probe:")]
        assert noted == [f"probe: jobs {a} and {b} on GPU {first}:{a_gpu}, a pair never measured on fake, tried "
                         "within interference.probe_budget (undone after its first measurement if it does not pay)"
                         ], result["notes"]
        print(f"\n  without budget: job {b} to GPU {alone[0]}:{alone[1]}; with budget {BUDGET:g} "
              f"({spent:.0f} of {BUDGET * up:.0f} GPU-s spent): beside job {a} on GPU {first}:{a_gpu}")
        wait_report(c, b, 1)
        joined = time.monotonic()
        assert gpu_of(c, a) == gpu_of(c, b), (c.text(a), c.text(b))

        # (3) measured once, charged, undone in that epoch; the measurement reaches the adaptation
        # charged in the epoch that judged it: at least the 10 s a measurement needs, at most the time side by side
        move, charged, side_by_side = undone_once_judged(c, b, joined)
        assert "undo a co-location that did not pay" in move["reason"], move
        assert adapted_pairs(c) == 1
        print(f"  probe measured after {side_by_side:.0f} s side by side, charged {charged:.1f} GPU-s "
              f"(ledger {ledger(c)[1]:.1f} of {BUDGET * ledger(c)[0]:.0f}), undone: {move['reason']}")

        wait_report(c, b, 2)
        view = c.gateway.job(b)
        assert view.state is JobState.RUNNING and gpu_of(c, a) != gpu_of(c, b), (c.text(a), c.text(b))
    finally:
        c.cancel_all()


def undone_once_judged(c: Cluster, b: int, joined: float) -> tuple[dict, float, float]:
    """Epochs 6 s apart until one undoes a pairing or charges the probe ledger, at most MAX_EPOCHS; it must undo
    job b's (back to a whole GPU) and charge between the 10 s a judgement needs and the time side by side since
    `joined`: (the undoing action, the GPU-s charged, the seconds side by side)."""
    undone: list[dict] = []
    charged, notes = 0.0, []
    for n in range(1, MAX_EPOCHS + 1):
        time.sleep(6)
        before = ledger(c)[1]
        result = epoch(c)
        notes += [f"epoch {n}: {x}" for x in result["notes"]]
        charged = ledger(c)[1] - before
        undone = [x for x in result["actions"] if x["kind"] == "reshape_running"]
        if undone or charged:
            break
    side_by_side = time.monotonic() - joined
    assert undone, f"the probe was not undone within {MAX_EPOCHS} epochs; notes: {notes}"
    (move,) = undone
    assert move["job_id"] == b and move["status"] == "done" and move["shape"] == WHOLE, move
    assert 10 <= charged <= side_by_side, (charged, side_by_side, notes)
    return move, charged, side_by_side


def test_a_probe_straight_from_the_queue_is_judged_against_its_familys_figure_charged_and_undone(slurm_cluster,
                                                                                                  tmp_path):
    program = tmp_path / "contend.py"
    program.write_text(PROGRAM)
    c = Cluster(dict(slurm_cluster.env()), tmp_path, {"f.yaml": FAMILY},
                config=CONFIG.format(model=train(tmp_path), budget=BUDGET))
    try:
        first, _ = idle_nodes(c)
        clocks = tmp_path / "gpus"
        clocks.mkdir()
        a = c.submit("f.yaml", program, str(clocks), options=("-w", first))
        wait_report(c, a, 0)
        until(c, lambda notes: solo_rates(c) == {a}, "a solo speed for job a")

        # b waits for its begin time, as in elastico-submit's placement window; the helper puts it beside a, a probe
        b = c.submit("f.yaml", program, str(clocks), options=("--begin=now+120",))
        wait_begin_time(c, b)
        (_, a_gpu, _), = c.gateway.job(a).gpu_alloc
        result = epoch(c)
        assert placed(result, b) == (first, a_gpu), result
        assert [n for n in result["notes"] if n.startswith(f"probe: jobs {a} and {b} on GPU")], result["notes"]
        wait_report(c, b, 0)
        joined = time.monotonic()
        assert gpu_of(c, a) == gpu_of(c, b), (c.text(a), c.text(b))

        # b never ran alone at half a GPU: judged against its family's figure there, charged, undone in that epoch
        move, charged, side_by_side = undone_once_judged(c, b, joined)
        assert re.search(r"runs at 0\.\d+ of its solo speed beside job \d+, below its floor 0\.6", move["reason"]), move
        assert f"job {b}'s at {HALF}: its family's figure, never measured alone" in move["reason"], move
        assert b not in solo_rates(c) and adapted_pairs(c) == 0  # a ratio against a figure is not learned
        print(f"\n  probe from the queue judged after {side_by_side:.0f} s side by side, charged {charged:.1f} GPU-s,"
              f" undone: {move['reason']}")
    finally:
        c.cancel_all()
