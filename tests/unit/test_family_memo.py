"""helper.families: jobs submitted with one family file have their family text's YAML parsed once an epoch, with the
same families (and so the same plans) as parsing each job's text, and each bad family still named by its own job."""

from __future__ import annotations

from unittest import mock

from slurm_elastico.helper import families as fam_mod
from slurm_elastico.errors import SlurmError, SlurmUnavailable, UnknownJobError
from slurm_elastico.helper.families import ScriptFamilies, read_scripts, yaml_memo
from slurm_elastico.inputs import load_yaml
from slurm_elastico.shapes import parse_family
from tests.synthetic import cluster, snapshot
from tests.unit.test_trust import FAMILY, Scripts, elastico_script, jobs, store  # noqa: F401 (fixture)

OTHER = FAMILY.replace("steps: 100", "steps: 700")
BAD = "kind: train\nsteps: [\n"


def test_a_family_text_shared_by_many_jobs_is_parsed_once_and_gives_the_same_families(store):  # noqa: F811
    texts = {j: (FAMILY if j % 3 else OTHER) for j in range(1, 31)}
    src = ScriptFamilies(store, Scripts({j: elastico_script(t) for j, t in texts.items()}), 16000)
    snap = snapshot(cluster(2), jobs(*texts))
    with mock.patch.object(fam_mod, "load_yaml", wraps=load_yaml) as spy, \
            mock.patch.object(fam_mod, "parse_family", wraps=parse_family) as checked:
        assert src.admit(snap, dry_run=False) == []
        admitted, checks = spy.call_count, checked.call_count
        fams, warnings = src.families(set(texts))
        after = spy.call_count, checked.call_count
        src._built.clear()  # a ScriptFamilies that did not admit them this epoch builds them again, once each
        again, _ = src.families(set(texts))
    assert admitted == 2 and checks == 2  # two texts, each read and built once in admission
    assert after == (2, 2)  # families reused what admission built
    assert again == fams and (spy.call_count, checked.call_count) == (4, 4)
    assert warnings == [] and set(fams) == set(texts)
    for j, text in texts.items():  # what parsing each job's own text gives
        assert fams[j] == parse_family(load_yaml(text, f"job {j}"), f"job {j} (/home/u/fam.yaml)", 16000)


def test_the_memo_hands_out_copies_and_names_each_job_in_its_own_error():
    load = yaml_memo()
    first = load(FAMILY, "job 1")
    first["steps"] = -5
    assert load(FAMILY, "job 2")["steps"] == 100
    errors = []
    for job in ("job 3", "job 4"):
        try:
            load(BAD, job)
        except Exception as exc:  # noqa: BLE001 - the ConfigError names its source
            errors.append(str(exc))
    assert len(errors) == 2 and "job 3" in errors[0] and "job 4" in errors[1]


def test_a_bad_family_shared_by_two_jobs_is_reported_for_each(store):  # noqa: F811
    src = ScriptFamilies(store, Scripts({1: elastico_script(BAD), 2: elastico_script(BAD),
                                         3: elastico_script()}), 16000)
    notes = src.admit(snapshot(cluster(2), jobs(1, 2, 3)), dry_run=False)
    assert [n.split(":")[0] for n in notes] == ["job 1", "job 2"]
    assert set(src.families({1, 2, 3})[0]) == {3}


def test_scripts_read_at_once_give_what_reads_one_by_one_give_each_answer_with_its_job():
    answers = {j: elastico_script(FAMILY if j % 2 else OTHER) for j in range(1, 41)}
    answers[7] = SlurmError(["scontrol"], 1, "", "Access/permission denied")
    answers[8] = UnknownJobError(["scontrol"], 1, "Invalid job id")
    answers[9] = SlurmUnavailable(["scontrol"], 1, "", "no controller")
    ids = list(answers)
    together, alone = Scripts(answers), Scripts(answers)
    many, one = read_scripts(together, ids, workers=4), read_scripts(alone, ids, workers=1)
    assert list(many) == ids and many == one
    assert many[7] is answers[7] and many[9] is answers[9] and many[3] == answers[3]
    assert sorted(together.reads) == ids and alone.reads == ids  # each script read once


def test_a_job_with_its_own_measurements_gets_its_own_family():
    from slurm_elastico.helper.families import _parse_all

    items = [(1, FAMILY, "job 1"), (2, FAMILY, "job 2"), (3, FAMILY, "job 3")]
    types = {"t4": 16000, "a100": 40000}
    plain, _ = _parse_all(items, 16000, types)
    fast, _ = _parse_all(items, 16000, types, measured={2: {"mb8-fp32-mps25": {"t4": 50.0}}})
    assert plain[1] is plain[2] is plain[3]  # one text, no measurement: built once, shared
    assert fast[1] == plain[1] and fast[3] == plain[3] and fast[2] != plain[2]
    assert fast[2] == parse_family(load_yaml(FAMILY, "job 2"), "job 2", 16000, gpu_types=types,
                                   measured={"mb8-fp32-mps25": {"t4": 50.0}})


def test_jobs_sharing_one_family_object_get_the_plan_they_get_with_a_copy_each():
    """The helper now hands jobs with one family text one shared `Family`; the planner's per-family tables (keyed by
    object) must plan exactly as with a separate, equal copy per job."""
    import copy

    import numpy as np

    from slurm_elastico.config import Settings
    from slurm_elastico.planner import policies
    from slurm_elastico.planner.epoch import plan_epoch
    from tests.synthetic import instance

    for seed in range(3):
        snap, shared = instance(np.random.default_rng(seed), 60, 16, templates=3, running_frac=0.3)
        assert len({id(f) for f in shared.values()}) <= 3 < len(shared)
        copies = {j: copy.deepcopy(f) for j, f in shared.items()}
        policy = policies.get("elastico")
        one = plan_epoch(snap, shared, Settings(), None, snap.taken_at, policy)
        each = plan_epoch(snap, copies, Settings(), None, snap.taken_at, policy)
        assert one.actions == each.actions and one.actions


def test_texts_that_differ_only_in_their_work_share_their_shapes_and_build_as_each_alone(store):  # noqa: F811
    """A sweep: one model, each job its own steps, name or floor. Its shapes are enumerated once; each job's family is
    what building its own text alone gives, in admission and in a later epoch's `families`."""
    from slurm_elastico.shapes import enumerate as enum_mod

    texts = {j: FAMILY.replace("steps: 100", f"steps: {100 + j}") + (f"name: run-{j}\n" if j % 2 else "")
             + (f"throughput_floor: {j / 10}\n" if j % 3 == 0 else "") for j in range(1, 13)}
    texts[13] = FAMILY.replace("[8, 32]", "[8, 16, 32]")  # other knobs: its own shapes
    src = ScriptFamilies(store, Scripts({j: elastico_script(t) for j, t in texts.items()}), 16000)
    with mock.patch.object(enum_mod, "enumerate_shapes", wraps=enum_mod.enumerate_shapes) as enumerated:
        assert src.admit(snapshot(cluster(2), jobs(*texts)), dry_run=False) == []
        in_admission = enumerated.call_count
        src._built.clear()  # as a later epoch's process: built again from the stored texts
        fams, warnings = src.families(set(texts))
    assert in_admission == 2 and enumerated.call_count == 4
    assert warnings == [] and set(fams) == set(texts)
    for j, text in texts.items():
        alone = parse_family(load_yaml(text, f"job {j}"), f"job {j} (/home/u/fam.yaml)", 16000)
        assert fams[j] == alone
    assert fams[1].shapes == fams[2].shapes and fams[1].name == "run-1" and fams[2].name == ""
    assert [fams[j].total_work for j in (1, 2, 3)] == [101, 102, 103] and fams[3].throughput_floor == 0.3


def test_a_shared_build_that_fails_is_reported_for_each_job():
    from slurm_elastico.helper.families import _parse_all

    unfit = FAMILY.replace("mps_shares: [25, 100]", "mps_shares: [25, 100]\nmodel: {params: 9.0e12}")
    items = [(1, unfit, "job 1"), (2, unfit.replace("steps: 100", "steps: 5"), "job 2"), (3, FAMILY, "job 3")]
    fams, warnings = _parse_all(items, 16000)
    assert set(fams) == {3}
    assert [w.split(":")[0] for w in warnings] == ["job 1", "job 2"] and "job 2" in warnings[1].split(": ", 1)[1]


def test_the_shape_key_tells_apart_what_shapes_depend_on():
    from slurm_elastico.shapes import parse_spec
    from slurm_elastico.shapes.shape_key import shape_key

    def key(text: str, *build):
        return shape_key(parse_spec(load_yaml(text, "f"), "f"), *build)

    assert key(FAMILY, 16000) == key(FAMILY.replace("steps: 100", "steps: 9") + "name: x\nthroughput_floor: 2\n", 16000)
    assert key(FAMILY, 16000) != key(FAMILY, 40000)
    assert key(FAMILY, 16000) != key(FAMILY.replace("[8, 32]", "[32, 8]"), 16000)  # the order of the shapes
    assert key(FAMILY, 16000, {"a": 1}) != key(FAMILY, 16000, {"a": 1.0}) != key(FAMILY, 16000, {"a": True})
    assert key(FAMILY, 16000, {"a": 1, "b": 2}) != key(FAMILY, 16000, {"b": 2, "a": 1})  # order: as enumerated
    assert key(FAMILY, 16000, object()) != key(FAMILY, 16000, object())  # a type it does not know: never shared
