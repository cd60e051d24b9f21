"""Report figures: JCT spans restarts, GPU-hours count MPS shares as GPU fractions, groups add up."""

from pathlib import Path

from slurm_elastico.model import JobState
from slurm_elastico.report import group_rows, job_rows
from slurm_elastico.report.render import table, to_csv, to_json
from slurm_elastico.slurm.accounting import SacctRecord, parse_sacct

DATA = Path(__file__).resolve().parents[1] / "data" / "slurm"


def run(job_id, state, submit, start, end, mps=0, gpu=0, user="ann", name="j"):
    tres = {"cpu": 1, **({"gres/mps": mps} if mps else {}), **({"gres/gpu": gpu} if gpu else {})}
    return SacctRecord(job_id=job_id, name=name, user=user, state=state, submit_time=submit, start_time=start,
                       end_time=end, elapsed_s=(end - start) if start and end else 0, tres_alloc=tres)


def test_requeued_job_jct_spans_every_run():
    records = [
        run(7, JobState.REQUEUED, 100, 110, 400, mps=25),       # first run, reshaped
        run(7, JobState.COMPLETED, 400, 403, 1003, mps=50),     # second run with the new share
        run(8, JobState.COMPLETED, 100, 160, 3760, gpu=1, user="bob"),
        run(9, JobState.RUNNING, 100, 200, None, mps=10),
    ]
    rows = {r.job_id: r for r in job_rows(records, {7: "train", 8: "infer"}, {7: 1})}
    a = rows[7]
    assert (a.jct_s, a.wait_s, a.runs, a.reshapes, a.kind) == (903.0, 10.0, 2, 1, "train")
    assert abs(a.gpu_hours - (290 * 0.25 + 600 * 0.5) / 3600) < 1e-12
    assert a.mps_share_hours == a.gpu_hours
    b = rows[8]
    assert (b.jct_s, b.wait_s, b.gpu_hours, b.mps_share_hours) == (3660.0, 60.0, 1.0, 0.0)
    assert rows[9].jct_s is None and rows[9].kind == "other"  # still running: no JCT yet
    groups = {g.group: g for g in group_rows(list(rows.values()))}
    assert groups["all"].jobs == 3 and groups["all"].finished == 2
    assert groups["all"].mean_jct_s == (903 + 3660) / 2
    assert groups["user=ann"].jobs == 2 and groups["kind=infer"].gpu_hours == 1.0
    assert groups["all"].reshapes == 1


def test_recorded_requeue_sample_counts_runs():
    records = parse_sacct((DATA / "22.05" / "sacct_requeued_duplicates.json").read_text())
    rows = job_rows(records, {}, {})
    requeued = {r.job_id for r in records if r.requeued}
    assert requeued, "the sample holds a requeued job"
    for row in rows:
        if row.job_id in requeued:
            assert row.runs >= 2
            if row.jct_s is not None:
                assert row.jct_s >= sum(r.elapsed_s for r in records if r.job_id == row.job_id)


def test_outputs_carry_the_same_rows():
    rows = job_rows([run(1, JobState.COMPLETED, 0, 5, 65, mps=50, name="a,b\n\"c\"")], {1: "train"}, {})
    groups = group_rows(rows)
    assert "65.0" in table(groups, rows) and "a,b\\n" in table(groups, rows)
    csv_text = to_csv(rows)
    assert csv_text.splitlines()[0].startswith("job_id,name,user") and '"a,b\n""c"""' in csv_text
    assert "\"jct_s\": 65.0" in to_json(groups, rows)


def test_plot_legends_sit_outside_the_curves(tmp_path):
    import matplotlib.pyplot as plt

    from slurm_elastico.report import plots

    series = {"plain (measured)": [50.0, 60.0, 90.0], "elastico (measured)": [40.0, 55.0, 70.0],
              "static (simulated)": [52.0, 61.0, 88.0]}
    fig = plots.cdf_figure(series, "t")
    fig.canvas.draw()
    ax = fig.axes[0]
    legend = ax.get_legend().get_window_extent()
    assert legend.x0 >= ax.get_window_extent().x1  # right of the axes: covers no curve
    assert [t.get_text() for t in ax.get_legend().get_texts()] == [f"{k} (3 jobs)" for k in series]
    plt.close(fig)
    out = plots.jct_cdf_compare(series, tmp_path / "c.png")
    assert out.stat().st_size > 1000


def test_collect_shows_a_job_whose_stored_family_no_longer_reads_and_not_another_job_of_the_same_id(tmp_path, monkeypatch):
    from slurm_elastico.report import UNREADABLE, collect
    from slurm_elastico.store import Store

    store = Store(tmp_path / "s.sqlite")
    rows = [(1, "kind: train\nsteps: 3\n", 100), (2, "kind: [unclosed\n", 100), (3, "kind: train\nkind: infer\n", 100),
            (4, "kind: infer\n", 50), (5, "kind: train\n", 400)]
    for job_id, spec, at in rows:
        store.execute("INSERT INTO job_family (job_id, spec, source, submitted_at) VALUES (?, ?, ?, ?)",
                      (job_id, spec, "t", float(at)))

    class Accounting:
        def jobs(self):
            return ()

        def sacct(self, **kwargs):
            self.asked = kwargs
            # job 4: the same id as a job the helper once managed, submitted at another time (a rebuilt cluster);
            # job 5: requeued, the helper read it at its second submission
            return [run(j, JobState.COMPLETED, 100, 110, 200) for j in (1, 2, 3, 4)] + [
                run(5, JobState.REQUEUED, 100, 110, 300), run(5, JobState.COMPLETED, 400, 410, 500)]

    kinds_seen = {}
    monkeypatch.setattr("slurm_elastico.report.job_rows",
                        lambda records, kinds, reshapes, shares, active, at, work=None: kinds_seen.update(kinds) or [])
    collect(Accounting(), store)
    assert kinds_seen == {1: "train", 2: UNREADABLE, 3: UNREADABLE, 5: "train"}  # 3: a duplicate key, refused


def test_a_job_accounting_shows_active_that_slurmctld_no_longer_knows_is_runaway_and_its_open_run_uncounted():
    at = 10_000.0
    records = [
        run(20, JobState.REQUEUED, 100, 110, 400, gpu=1),  # a first run that ended properly
        run(20, JobState.RUNNING, 400, 410, None, gpu=1),  # its end never reached accounting
        run(21, JobState.RUNNING, 100, 200, None, gpu=1),  # running, and slurmctld lists it
        run(22, JobState.PENDING, 100, None, None),  # pending in accounting only: runaway too
        run(23, JobState.RUNNING, int(at) - 5, int(at) - 2, None, gpu=1),  # submitted as slurmctld was asked
        run(24, JobState.COMPLETED, 100, 200, 300, gpu=1),  # finished: slurmctld need not know it
    ]
    for r in records:
        if r.state is JobState.RUNNING:  # sacct counts a running run's time up to now
            object.__setattr__(r, "elapsed_s", int(at) + 50 - r.start_time)
    rows = {r.job_id: r for r in job_rows(records, {}, {}, controller_jobs={21}, controller_at=at)}
    assert {j for j, r in rows.items() if r.runaway} == {20, 22}
    assert rows[20].gpu_hours == 290 / 3600  # the open run's ever-growing time left out
    assert rows[21].gpu_hours == (at + 50 - 200) / 3600 and rows[23].gpu_hours > 0
    assert rows[20].jct_s is None and rows[20].state == "RUNNING"
    groups = group_rows(list(rows.values()))
    assert groups[0].group == "all" and groups[0].runaway == 2
    text = table(groups, list(rows.values()))
    assert "RUNNING (runaway)" in text and "2 runaway job(s)" in text and "sacctmgr show runawayjobs" in text
    # not checked without slurmctld's list (as before), and no footnote without a runaway job
    assert not any(r.runaway for r in job_rows(records, {}, {}))
    assert "runaway" not in table(group_rows(job_rows(records[2:3], {}, {}, controller_jobs={21}, controller_at=at)))
