"""The live helper's probe budget (`interference.probe_budget`): the ledger's arithmetic, the observer keeping it in
the store and telling the adapting model when it may probe, and the setting's checks."""

import pytest

from slurm_elastico.config import ConfigError, from_mapping
from slurm_elastico.helper.observer import ProgressObserver
from slurm_elastico.interference.adapt_online import OnlineAdapted
from slurm_elastico.interference.probe_budget import MAX_GAP_S, Ledger
from slurm_elastico.store import Store
from test_adapt_online_helper import Flat
from test_observe import FAM, T0, alone_then_shared, job, report
from tests.synthetic import cluster, snapshot
from slurm_elastico.runtime.progress import progress_path, write_progress


def test_the_ledger_counts_the_gpus_time_between_epochs_and_the_probes_against_the_budget():
    ledger = Ledger().tick(1000.0, 8)
    assert ledger.gpu_s == 0 and not ledger.allows(0.5)  # the first epoch only starts the clock
    ledger = ledger.tick(1100.0, 8)
    assert ledger.gpu_s == 800 and ledger.allows(0.05)  # 0 of 40 GPU-s spent
    ledger = ledger.spend(40.0)
    assert not ledger.allows(0.05) and ledger.allows(0.06)  # 40 of 40: spent; 40 of 48: not yet
    assert ledger.tick(1050.0, 8) == ledger.tick(1100.0, 8) == ledger  # a clock that stepped back adds nothing
    later = ledger.tick(1100.0 + 10 * MAX_GAP_S, 8)  # a helper that was not running probed nothing meanwhile
    assert later.gpu_s == 800 + 8 * MAX_GAP_S and later.last == 1100.0 + 10 * MAX_GAP_S
    assert not Ledger(gpu_s=1e9).allows(0.0)  # no budget: never


def epochs(observer, root, model):
    """Jobs 1 and 2 alone at +0 and +20 s, then on one GPU from +30 s (2 GPUs, snapshots taken at each epoch: the
    pair's first 10 s after the context changed are its warm-up, so it is measured at +50 over 10 s):
    `model.probing` after each epoch."""
    d1, d2 = root / "w1", root / "w2"
    a1, a2 = job(1, 0, 50, work_dir=str(d1)), job(2, 1, 50, work_dir=str(d2))
    s2 = job(2, 0, 50, start=T0 + 25, work_dir=str(d2))
    out = []
    for jobs, done1, done2, at in [((a1, a2), 10, 0, T0), ((a1, a2), 50, 20, T0 + 20), ((a1, s2), 60, 20, T0 + 30),
                                   ((a1, s2), 72, 25, T0 + 40), ((a1, s2), 84, 30, T0 + 50)]:
        write_progress(progress_path(d1, 1), report(done1, at, "mps50-0"))
        write_progress(progress_path(d2, 2), report(done2, at, "mps50-0"))
        observer(snapshot(cluster(2), list(jobs), now=at), {1: FAM, 2: FAM}, dry_run=False)
        out.append(model.probing)
    return out


@pytest.mark.parametrize("budget, probing", [(0.1, [False, True, True, True, False]),
                                             (0.5, [False, True, True, True, True])])
def test_the_observer_lets_the_model_probe_while_the_first_measurements_stay_within_the_budget(tmp_path, budget,
                                                                                               probing):
    model = OnlineAdapted(Flat(), "p100", untrained_margin=0.4, probe_optimism=0.4)
    with Store(tmp_path / "s.sqlite") as store:
        assert epochs(ProgressObserver(store, "p100", model, probe_budget=budget), tmp_path, model) == probing
        (row,) = store.query("SELECT * FROM probe_ledger")
        assert (row["gpu_type"], row["gpu_s"], row["probe_gpu_s"]) == ("p100", 100.0, 10.0)
        # a second measurement of the pair is no probe
        assert model.knows(next(iter(model.measured.values())))
        # a helper started again reads the ledger: a dry run plans as the last epoch left it, writing nothing
        again = OnlineAdapted(Flat(), "p100", untrained_margin=0.4, probe_optimism=0.4)
        again.probing = not probing[-1]
        ProgressObserver(store, "p100", again, probe_budget=budget)(
            snapshot(cluster(2), [job(1, 0, 50)], now=T0 + 60), {1: FAM}, dry_run=True)
        assert again.probing is probing[-1]
        assert tuple(store.query("SELECT * FROM probe_ledger")[0]) == tuple(row)


def test_shadow_mode_reads_the_ledger_and_never_writes_it(tmp_path):
    model = OnlineAdapted(Flat(), "p100", untrained_margin=0.4, probe_optimism=0.4)
    with Store(tmp_path / "s.sqlite") as store:
        epochs(ProgressObserver(store, "p100", model, probe_budget=0.5), tmp_path, model)
        (row,) = store.query("SELECT * FROM probe_ledger")
        shadow = OnlineAdapted(Flat(), "p100", untrained_margin=0.4, probe_optimism=0.4)
        ProgressObserver(store, "p100", shadow, probe_budget=0.5, shadow=True)(
            snapshot(cluster(2), [job(1, 0, 50)], now=T0 + 500), {1: FAM}, dry_run=False)
        assert shadow.probing is True and tuple(store.query("SELECT * FROM probe_ledger")[0]) == tuple(row)


def test_without_a_budget_the_model_is_never_told_to_probe(tmp_path):
    model = OnlineAdapted(Flat(), "p100", untrained_margin=0.4)
    with Store(tmp_path / "s.sqlite") as store:
        alone_then_shared(ProgressObserver(store, "p100", model), tmp_path)
        assert model.probing is False and store.query("SELECT COUNT(*) AS n FROM probe_ledger")[0]["n"] == 0


def test_the_setting_needs_adapt_online_and_a_share():
    assert from_mapping({"interference": {"adapt_online": True, "probe_budget": 0.05}}).interference.probe_budget == 0.05
    with pytest.raises(ConfigError, match=r"interference.probe_budget: 0.05 without interference.adapt_online"):
        from_mapping({"interference": {"probe_budget": 0.05}})
    with pytest.raises(ConfigError, match=r"interference.probe_budget"):
        from_mapping({"interference": {"adapt_online": True, "probe_budget": 1.5}})


def test_the_helper_gives_the_adapting_model_its_optimism_and_the_observer_its_budget_only_with_a_budget(tmp_path):
    from slurm_elastico.helper.metrics import Metrics
    from slurm_elastico.helper.service import open_service
    from slurm_elastico.planner.slowdown import UNCALIBRATED_GAIN_MARGIN

    for budget, optimism in ((0.05, UNCALIBRATED_GAIN_MARGIN), (0.0, 0.0)):
        settings = from_mapping({"state_dir": str(tmp_path / str(budget)), "gpu": {"type": "p100"},
                                 "interference": {"adapt_online": True, "probe_budget": budget}})
        service = open_service(settings, None, families_dir=None, dry_run=False, metrics=Metrics(),
                               metrics_file=None, log=lambda level, line: None)
        try:
            assert isinstance(service.model, OnlineAdapted) and service.model.probe_optimism == optimism
            assert service.observer.probe_budget == budget and service.observer.model is service.model
        finally:
            service.store.close()


def test_the_epoch_notes_each_new_pairing_that_is_a_probe():
    from dataclasses import replace

    from slurm_elastico.helper.probes import probe_notes
    from slurm_elastico.interference.measurements import Colocation
    from slurm_elastico.model import Action, ActionKind, Placement, Plan
    from slurm_elastico.shapes.solo import solo_profile
    from tests.synthetic import pending

    model = OnlineAdapted(Flat(), "p100", untrained_margin=0.4, probe_optimism=0.4)
    fams = {1: FAM, 2: FAM}
    snap = snapshot(cluster(2), [job(1, 0, 50), pending(2, share=50)])
    start = (Action(ActionKind.SET_NODES, 2, "start", nodes=("n0000",)),)
    beside = Plan(actions=start, placements=(Placement(1, "n0000", 0, "mps50-0", 50, 1.0),
                                             Placement(2, "n0000", 0, "mps50-0", 50, 1.0)))
    assert probe_notes(beside, snap, fams, model) == []  # not probing: the model admitted it on its own word
    model.probing = True
    (note,) = probe_notes(beside, snap, fams, model)
    assert note.startswith("probe: jobs 1 and 2 on GPU n0000:0, a pair never measured on p100"), note
    elsewhere = replace(beside, placements=(beside.placements[0], replace(beside.placements[1], gpu=1)))
    assert probe_notes(elsewhere, snap, fams, model) == []  # no pairing
    together = snapshot(cluster(2), [job(1, 0, 50), job(2, 0, 50)])
    assert probe_notes(replace(beside, actions=()), together, fams, model) == []  # they share the GPU already
    assert probe_notes(beside, snap, fams, Flat()) == []  # a model that does not adapt never probes
    half = solo_profile(FAM.shape("mps50-0"), FAM.kind, FAM.name)
    model.observe([Colocation("p100", half, half, 0.6, 0.6)])
    assert probe_notes(beside, snap, fams, model) == []  # measured: no longer a probe
