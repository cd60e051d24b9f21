"""Families per GPU type, the public GPU table, the per-type speed prior and its online correction, the gpu_types key,
typed GPU requests, and the helper building typed families from the snapshot's nodes and the store's measurements."""

from __future__ import annotations

import dataclasses
import math
import statistics
from pathlib import Path

import pytest

from slurm_elastico.errors import ConfigError
from slurm_elastico.helper.families import ScriptFamilies, limited
from slurm_elastico.inputs import load_yaml
from slurm_elastico.jobwrap.payload import Payload
from slurm_elastico.jobwrap.script import batch_script
from slurm_elastico.jobwrap.shape import choose_shape, family_from_spec
from slurm_elastico.jobwrap.submit import requested_types
from slurm_elastico.model import GresRequest, NodeView, Resources, Shape
from slurm_elastico.shapes import parse_family, parse_spec
from slurm_elastico.shapes.current import running_shape
from slurm_elastico.shapes.gpu_types import KNOWN, GpuSpec, UnknownGpuType, canonical, declare, resolve, supports
from slurm_elastico.shapes.type_speed import (MEASURED_SIGMA, SIGMA_FLOOR, Estimate, Mix, estimate, fit_gpu_share,
                                              ratio, spread_sigma)
from slurm_elastico.shapes.typed import (build_typed_family, enumerate_typed, family_memory, settings_family_memory,
                                         types_of_nodes, with_limit)
from slurm_elastico.slurm.sbatch_options import Option, gpu_types_requested
from slurm_elastico.store import Store
from tests.synthetic import cluster, pending, snapshot

TYPES = {"a100": 40960, "v100": 16384, "t4": 15360}
TRAIN = {
    "kind": "train", "name": "big", "global_batch": 256, "micro_batches": [32, 64, 128, 256],
    "precisions": ["fp32", "bf16"], "checkpointing": [False], "steps": 100, "mps_shares": [100],
    "model": {"params": 300e6, "activation_mib_per_sample": 120, "step_time_s": 1.0},
}


def typed(data=TRAIN, types=TYPES, **kw):
    return parse_family(dict(data), "fam.yaml", 16384, gpu_types=types, **kw)


# --- the GPU table -------------------------------------------------------------------------------------------------

def test_slurm_style_names_fold_to_the_table_case_insensitively():
    assert canonical("A100") == canonical("a100-40") == "a100-40gb"
    assert canonical("NVIDIA_A100-SXM4-80GB") == canonical("a100-80") == "a100-80gb"
    assert canonical("Tesla_V100") == "v100-16gb" and canonical("v100-32") == "v100-32gb"
    assert canonical("2080Ti") == "rtx-2080-ti" and canonical("RTX6000") == "quadro-rtx-6000"
    assert canonical("mi250") is None


def test_an_unknown_type_is_an_error_naming_it_and_how_to_declare_it():
    with pytest.raises(UnknownGpuType) as err:
        resolve("mi250")
    text = str(err.value)
    assert "mi250" in text and "gpu.types.mi250" in text and "like:" in text and "fp32_tflops" in text
    declared = resolve("mi250", {"mi250": {"like": "a100", "memory_gib": 64}})
    assert declared.fp32_tflops == KNOWN["a100-40gb"].fp32_tflops and declared.memory_gib == 64
    with pytest.raises(ConfigError, match="fp32_tflops: required"):
        declare("x9", {"mem_bw_gbs": 100})


def test_bf16_needs_compute_capability_8_and_fp16_volta():
    no_bf16 = [n for n, s in KNOWN.items() if not supports(s, "bf16")]
    assert sorted(no_bf16) == ["quadro-rtx-6000", "rtx-2080-ti", "t4", "v100-16gb", "v100-32gb"]
    assert all(supports(s, "fp16") and supports(s, "fp32") for s in KNOWN.values())
    pascal = GpuSpec("p100", 9.3, 0.0, 0.0, 732.0, 16.0, (6, 0))
    assert not supports(pascal, "fp16")


# --- the prior -----------------------------------------------------------------------------------------------------

def _spec(f=10.0, b=100.0, name="x"):
    return GpuSpec(name, f, f * 8, f * 8, b, 16.0, (8, 0))


@pytest.mark.parametrize("mix", [Mix(0.9, 0.7), Mix(0.9, 0.4), Mix(0.5, 0.0), Mix(1.0, 1.0)])
def test_the_ratio_grows_with_every_figure_of_the_destination_and_falls_with_the_source(mix):
    src, dst = _spec(), _spec()
    base = ratio(src, dst, "fp32", mix)
    assert math.isclose(base, 1.0)
    faster_compute = ratio(src, _spec(f=20.0), "fp32", mix)
    faster_memory = ratio(src, _spec(b=200.0), "fp32", mix)
    assert faster_compute >= base and faster_memory >= base
    assert faster_compute > base or mix.compute == 0.0
    assert faster_memory > base or mix.compute == 1.0
    assert ratio(_spec(f=20.0, b=200.0), dst, "fp32", mix) < base


def test_the_sigma_is_the_floor_for_equal_specs_and_grows_with_the_spec_distance():
    a = KNOWN["v100-16gb"]
    same = spread_sigma(a, KNOWN["v100-32gb"], "fp32", Mix(0.9, 0.7))
    near = spread_sigma(KNOWN["quadro-rtx-6000"], KNOWN["rtx-2080-ti"], "fp32", Mix(0.9, 0.7))
    far = spread_sigma(KNOWN["t4"], KNOWN["h100"], "fp32", Mix(0.9, 0.7))
    assert math.isclose(same, SIGMA_FLOOR) and same < near < far


def test_a_conservative_estimate_is_below_the_value_and_a_measured_one_replaces_it():
    est = estimate({"t4": 2.0}, "a100", {"t4": KNOWN["t4"], "a100": KNOWN["a100-40gb"]}, "train", "fp32")
    assert est.value > 2.0 and est.sigma > SIGMA_FLOOR and not est.measured
    assert est.conservative() < est.value < est.quantile(0.9)
    got = estimate({"t4": 2.0, "a100": 3.1}, "a100", {"t4": KNOWN["t4"], "a100": KNOWN["a100-40gb"]}, "train", "fp32")
    assert got == Estimate(3.1, MEASURED_SIGMA, True)


def test_the_online_correction_refits_the_gpu_share_and_rescales_the_others_by_hand():
    # Three types whose compute and bandwidth both double from A to B and again to C: c does not matter, only g.
    specs = {"A": _spec(10, 100, "A"), "B": _spec(20, 200, "B"), "C": _spec(40, 400, "C")}
    one = estimate({"A": 1.0}, "C", specs, "train", "fp32")  # prior g = 0.9: 1 / (0.1 + 0.9 / 4)
    assert math.isclose(one.value, 1 / (0.1 + 0.9 * 0.25), rel_tol=1e-9)
    # B then shows only 1.5x A: 1 / ((1 - g) + g / 2) = 1.5 gives g = 2/3; on the grid, 0.67.
    mix, residual = fit_gpu_share({"A": 1.0, "B": 1.5}, specs, "fp32", Mix(0.9, 0.7))
    assert mix.gpu == 0.67 and residual < 0.01
    two = estimate({"A": 1.0, "B": 1.5}, "C", specs, "train", "fp32")
    from_a = 1.0 / (0.33 + 0.67 * 0.25)  # A -> C at g = 0.67
    from_b = 1.5 / (0.33 + 0.67 * 0.5)   # B -> C
    assert math.isclose(two.value, math.sqrt(from_a * from_b), rel_tol=1e-9)  # equal sigmas: geometric mean
    assert two.value < one.value  # what B showed lowered the estimate on C
    assert math.isclose(two.sigma, math.sqrt(SIGMA_FLOOR ** 2 + residual ** 2), rel_tol=1e-9)


# --- enumeration per type --------------------------------------------------------------------------------------------

def test_the_one_type_call_is_unchanged():
    fam = parse_family(dict(TRAIN), "fam.yaml", 16384)
    assert fam.shapes and all(s.gpu_type == "" and "@" not in s.name and s.throughput_sigma == 0 for s in fam.shapes)


def test_shapes_per_type_fit_its_memory_use_its_precisions_and_have_unique_names():
    fam = typed()
    names = [s.name for s in fam.shapes]
    assert len(names) == len(set(names)) and all(s.name.endswith("@" + s.gpu_type) for s in fam.shapes)
    by_type = {t: [s for s in fam.shapes if s.gpu_type == t] for t in TYPES}
    assert all(by_type.values())
    for t, shapes in by_type.items():
        assert all(s.resources.gpu_mem_mib <= TYPES[t] for s in shapes)
    assert not any(s.knob("precision") == "bf16" for t in ("v100", "t4") for s in by_type[t])
    assert any(s.knob("precision") == "bf16" for s in by_type["a100"])
    # micro-batch 256 needs more than 16 GiB: only the A100 has it
    assert any(s.knob("micro_batch") == 256 for s in by_type["a100"])
    assert not any(s.knob("micro_batch") == 256 for t in ("v100", "t4") for s in by_type[t])
    # the anchor (first type: no site type named) keeps the family's own figure, as uncertain as a transfer from
    # the nearest other type; the others are scaled from it, with the sigma of that transfer
    assert all(s.throughput_sigma > SIGMA_FLOOR for s in by_type["a100"])
    assert all(s.throughput_sigma > 0 for t in ("v100", "t4") for s in by_type[t])
    # named by the site (gpu.type), the family's figures are that type's: no sigma there
    named = typed(anchor="a100")
    assert all(s.throughput_sigma == 0 for s in named.shapes if s.gpu_type == "a100")
    fast = {s.name.split("@")[0]: s.throughput for s in by_type["v100"]}
    assert all(s.throughput < fast[s.name.split("@")[0]] for s in by_type["t4"] if s.name.split("@")[0] in fast)


def test_a_family_limited_to_types_gets_only_those_and_a_type_the_cluster_lacks_is_an_error():
    fam = typed({**TRAIN, "gpu_types": ["A100", "h100"]})
    assert {s.gpu_type for s in fam.shapes} == {"a100"}
    with pytest.raises(ConfigError) as err:
        typed({**TRAIN, "gpu_types": ["h100"]})
    assert "a100 (40960 MiB)" in str(err.value) and "h100" in str(err.value)


def test_a_family_that_fits_no_type_is_an_error_naming_it_and_the_types_with_their_memory():
    huge = {**TRAIN, "model": {"params": 20e9}}
    with pytest.raises(ConfigError) as err:
        typed(huge)
    text = str(err.value)
    assert "'big'" in text and all(f"{t} ({m} MiB)" in text for t, m in TYPES.items())


def _all(data=TRAIN, **kw):
    """Every typed shape, before the Pareto front: {name: shape}."""
    return {s.name: s for s in enumerate_typed(parse_spec(dict(data), "fam.yaml"), TYPES, **kw)}


def test_typed_declared_figures_win_and_measured_speeds_replace_and_rescale():
    base = "mb64-fp32-mps100"
    shapes = _all({**TRAIN, "declared": {f"{base}@t4": {"throughput": 0.123}}})
    assert shapes[f"{base}@t4"].throughput == 0.123 and shapes[f"{base}@t4"].throughput_sigma == 0
    before = _all()
    after = _all(measured={base: {"v100": 0.5}})
    assert after[f"{base}@v100"].throughput == 0.5 and after[f"{base}@v100"].throughput_sigma == 0
    assert after[f"{base}@t4"].throughput < 0.5 < after[f"{base}@a100"].throughput
    assert after[f"{base}@t4"].throughput != before[f"{base}@t4"].throughput
    assert after[f"{base}@t4"].throughput_sigma > 0
    # a second measured type refits the mix: the third type's estimate moves again
    third = _all(measured={base: {"v100": 0.5, "a100": 0.6}})
    assert third[f"{base}@a100"].throughput == 0.6
    assert third[f"{base}@t4"].throughput != after[f"{base}@t4"].throughput


def test_the_default_is_the_named_shape_on_the_first_type_where_it_fits():
    fam = typed({**TRAIN, "default": "mb256-fp32-mps100"})
    assert fam.default == "mb256-fp32-mps100@a100"
    with pytest.raises(ConfigError, match="fits none of the GPU types"):
        typed({**TRAIN, "default": "mb256-fp32-mps100"}, {"v100": 16384, "t4": 15360})


# --- the family key, typed requests, names back from AdminComment ----------------------------------------------------

def test_the_gpu_types_key_is_validated_and_listed_among_the_allowed_keys():
    with pytest.raises(ConfigError) as err:
        parse_spec({**TRAIN, "gpu_types": ["a100", "A100", "bad type!"]})
    assert "gpu_types[2]" in str(err.value)
    with pytest.raises(ConfigError, match="types repeat"):
        parse_spec({**TRAIN, "gpu_types": ["a100", "A100"]})
    with pytest.raises(ConfigError, match="gpu_types"):
        parse_spec({**TRAIN, "gpu_type": ["a100"]})  # the unknown key's message lists gpu_types
    with pytest.raises(ConfigError, match="not in the family's gpu_types"):
        parse_spec({**TRAIN, "gpu_types": ["a100"], "declared": {"mb64-fp32-mps100@t4": {"throughput": 1.0}}})
    assert parse_spec({**TRAIN, "gpu_types": ["a100"]}).gpu_types == ("a100",)


def test_a_typed_gpu_request_names_its_types_and_limits_the_family():
    assert gpu_types_requested([Option("gres", "gpu:a100:2")]) == ("a100",)
    assert gpu_types_requested([Option("gres", "gpu:2"), Option("gpus", "v100:1,t4:2")]) == ("v100", "t4")
    assert gpu_types_requested([Option("gres", "gpu:a100:2"), Option("gres", "mps:50")]) == ()  # the last one counts
    assert requested_types((), (), {"SBATCH_GRES": "gpu:t4:1"}) == ("t4",)
    # sbatch's order: the command line, then its input environment, then the script's #SBATCH lines
    script, env = [Option("gres", "gpu:t4:1")], {"SBATCH_GRES": "gpu:a100:1"}
    assert requested_types(script, [Option("gres", "gpu:2")], env) == ()  # an untyped request on the command line
    assert requested_types(script, (), env) == ("a100",)
    assert requested_types(script, (), {}) == ("t4",)
    assert requested_types(script, [Option("gpus", "v100:1")], {}) == ("t4", "v100")  # other options: both count
    spec = parse_spec({**TRAIN, "gpu_types": ["a100", "v100"]})
    assert with_limit(spec, ("v100",)).gpu_types == ("v100",)
    with pytest.raises(ConfigError, match="allows only"):
        with_limit(spec, ("t4",))
    assert "gpu_types:\n- t4" in limited("kind: train\n", "x", ("t4",))


def test_a_typed_name_in_the_admin_comment_is_found_by_typed_and_by_one_type_candidates():
    import yaml
    text = yaml.safe_dump(TRAIN)
    fam, candidates = family_from_spec(text, "f", 16384, tuple(TYPES.items()))
    shape, origin = choose_shape(fam, candidates, "elastico:shape=mb64-fp32-mps100@v100", None, 100, 1, "v100")
    assert (shape.name, origin) == ("mb64-fp32-mps100@v100", "AdminComment")
    # a job of another type runs that type's shape, never a bf16 one on a V100
    shape, _ = choose_shape(fam, candidates, "", None, 100, 1, "v100")
    assert shape.gpu_type == "v100" and shape.knob("precision") != "bf16"
    one = [Shape("mb64-fp32-mps100", Resources(mps=100), 1.0), Shape("mb32-fp32-mps100", Resources(mps=100), 0.9)]
    assert running_shape(one, one[1], "elastico:shape=mb64-fp32-mps100@v100", None)[0].name == "mb64-fp32-mps100"


# --- the helper ------------------------------------------------------------------------------------------------------

def _typed_nodes():
    a, b = cluster(8, 4)[:2]
    return (dataclasses.replace(a, gpu_type="a100", gpu_memory_mib=40960),
            dataclasses.replace(b, name="n0001", gpu_type="v100", gpu_memory_mib=16384))


def test_the_cluster_types_come_from_the_nodes_and_one_type_is_the_one_type_path():
    nodes = _typed_nodes()
    assert types_of_nodes(nodes, 16000) == {"a100": 40960, "v100": 16384}
    one = tuple(dataclasses.replace(n, gpu_type="a100") for n in nodes)
    assert types_of_nodes(one, 16000) == {} and types_of_nodes(cluster(8), 16000) == {}
    assert types_of_nodes((dataclasses.replace(nodes[0], gpu_memory_mib=0), nodes[1]), 1234)["a100"] == 1234


def test_a_one_type_cluster_sizes_its_families_for_that_types_memory(tmp_path):
    # gpu.types names one type (a100, 40 GiB) and gpu.memory_mib is left at 80 GiB: the families are sized for
    # the nodes' 40 GiB, in the helper and (from the settings) in elastico-submit, so the two agree.
    import yaml
    one = tuple(dataclasses.replace(n, gpu_type="a100", gpu_memory_mib=40960) for n in _typed_nodes())
    assert family_memory(one, 81920) == 40960 and family_memory(_typed_nodes(), 81920) == 81920
    assert family_memory(cluster(8), 81920) == 81920  # untyped gres: gpu.memory_mib
    assert settings_family_memory({"a100": 40960}, 81920) == 40960
    assert settings_family_memory({"a100": 40960, "t4": 15360}, 81920) == 81920
    big = {**TRAIN, "model": {**TRAIN["model"], "activation_mib_per_sample": 400}}  # mb128 needs ~50 GiB
    assert parse_family(big, "x", 40960).shapes != parse_family(big, "x", 81920).shapes
    with Store(tmp_path / "s.sqlite") as store:
        src = ScriptFamilies(store, Scripts({1: _script(yaml.safe_dump(big))}), 81920)
        src.admit(snapshot(one, [dataclasses.replace(pending(1), submit_time=100)]), dry_run=False)
        fams, _ = src.families({1})
    assert fams[1].shapes == parse_family(big, "x", 40960).shapes
    assert max(s.resources.gpu_mem_mib for s in fams[1].shapes) <= 40960


class Scripts:
    def __init__(self, scripts):
        self.scripts = scripts

    def batch_script(self, job_id):
        return self.scripts[job_id]


def _script(spec: str, limit=()):
    payload = Payload(script=b"#!/bin/sh\n", script_name="job.sh", args=(), family_spec=spec, family_source="f.yaml",
                      gpu_memory_mib=16384, grace_s=5, signal_lead_s=60, type_limit=tuple(limit))
    return batch_script("/usr/bin/python3", "#!/bin/sh\n", payload)


def test_the_helper_builds_typed_families_limited_by_the_request_and_rescaled_by_measured_speeds(tmp_path):
    import yaml
    spec = yaml.safe_dump(TRAIN)
    with Store(tmp_path / "s.sqlite") as store:
        src = ScriptFamilies(store, Scripts({1: _script(spec), 2: _script(spec, ["v100"])}), 16384)
        jobs = [dataclasses.replace(pending(j), submit_time=100) for j in (1, 2)]
        assert src.admit(snapshot(cluster(8), jobs), dry_run=False) == []
        fams, _ = src.families({1, 2})
        assert all(s.gpu_type == "" for f in fams.values() for s in f.shapes)  # one type: as it always was
        src.admit(snapshot(_typed_nodes(), jobs), dry_run=False)
        fams, warnings = src.families({1, 2})
        assert warnings == [] and {s.gpu_type for s in fams[1].shapes} == {"a100", "v100"}
        assert {s.gpu_type for s in fams[2].shapes} == {"v100"}
        name = "mb64-fp32-mps100"
        store.execute("INSERT INTO solo_rate VALUES (?,?,?,?)", (1, f"{name}@v100", 300.0, 60.0))
        fams, _ = src.families({1})
        assert fams[1].shape(f"{name}@v100").throughput == 5.0  # measured there: replaces the estimate
        assert fams[1].shape(f"{name}@v100").throughput_sigma == 0
        a100 = [s for s in fams[1].shapes if s.gpu_type == "a100"]
        assert max(s.throughput for s in a100) > 5.0 and all(s.throughput_sigma > 0 for s in a100)


def test_families_from_the_administrators_directory_take_the_speeds_measured_per_type_too(tmp_path):
    """`elastico sched --families DIR` on a cluster of several types: the families read from the directory never
    took what their jobs measured on a type (the observer's correction skips typed shapes; the speeds per type are
    read from the store, which only the script families read)."""
    import yaml

    from slurm_elastico.helper.families import DirectoryFamilies

    (tmp_path / "fams").mkdir()
    (tmp_path / "fams" / "1.yaml").write_text(yaml.safe_dump(TRAIN))
    name = "mb64-fp32-mps100"
    with Store(tmp_path / "s.sqlite") as store:
        src = DirectoryFamilies(tmp_path / "fams", 16384, store=store)
        src.admit(snapshot(_typed_nodes(), [pending(1)]), dry_run=False)
        before = src.families({1})[0][1].shape(f"{name}@v100").throughput
        store.execute("INSERT INTO solo_rate VALUES (?,?,?,?)", (1, f"{name}@v100", 300.0, 60.0))
        fams, _ = src.families({1})
        assert before != 5.0 and fams[1].shape(f"{name}@v100").throughput == 5.0
        assert fams[1].shape(f"{name}@v100").throughput_sigma == 0


# --- against per-type profiles in Sia's layout ---------------------------------------------------------------------

def test_the_prior_beats_assuming_every_type_equally_fast_on_profiles_in_sias_layout(tmp_path):
    # Made-up profiles (`tests.sia_layout`: no peer's data) whose types differ as their public figures order them
    # (T4 slowest, A100 fastest); the benchmark's own reading and scoring, as on Sia's measurements
    # (`benchmarks/type_prior.py --sia DIR`, whose figures the results page carries).
    import importlib.util

    from tests.sia_layout import made_up_profiles
    spec = importlib.util.spec_from_file_location("type_prior", Path(__file__).resolve().parents[2] / "benchmarks" / "type_prior.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    speeds = bench.read_speeds(made_up_profiles(tmp_path / "profiles"), quick=False)
    cases = [c for cs in bench.evaluate(speeds, 1).values() for c in cs]
    naive = bench.naive_errors(speeds)
    assert len(cases) == len(naive) > 50
    assert statistics.median(abs(e) for e, _ in cases) < statistics.median(naive)
    # compute-bound models follow the specs: the prior is within 25 % for most of their cases
    big = [c for cs in bench.evaluate({k: v for k, v in speeds.items() if k[0] in ("bert", "imagenet")}, 1).values()
           for c in cs]
    assert statistics.median(abs(e) for e, _ in big) < math.log(1.25)


def test_gres_request_type_travels_in_the_model_words():
    assert str(GresRequest("gpu", 2, "a100")) == "gpu:a100:2"
    assert NodeView("n", "idle", (), 1, 0, 1, 0, gpu_type="t4").gpu_type == "t4"


def test_what_the_job_measured_sets_the_scale_of_its_shapes_measured_nowhere():
    base, other = "mb64-fp32-mps100", "mb32-fp32-mps100"
    before = _all()
    guess = before[f"{base}@v100"].throughput
    after = _all(measured={base: {"v100": 3.0 * guess}})
    for t in TYPES:  # three times faster than the family's guess: every unmeasured shape too, ranking kept
        assert math.isclose(after[f"{other}@{t}"].throughput, 3.0 * before[f"{other}@{t}"].throughput, rel_tol=1e-9)


def test_the_payload_carries_the_cluster_types_and_the_request_limit_and_reads_old_payloads():
    p = Payload(script=b"#!/bin/sh\n", script_name="j", args=(), family_spec="kind: train\n", family_source="f",
                gpu_memory_mib=16384, grace_s=5, signal_lead_s=60, gpu_types=(("a100", 40960), ("t4", 15360)),
                type_limit=("a100",))
    back = Payload.decode(p.encode())
    assert back.gpu_types == (("a100", 40960), ("t4", 15360)) and back.type_limit == ("a100",)
    old = Payload.decode(dataclasses.replace(p, gpu_types=(), type_limit=()).encode())
    assert old.gpu_types == () and old.type_limit == ()


def test_elastico_submit_refuses_a_typed_request_the_family_excludes_and_carries_an_allowed_one(tmp_path):
    import sys

    from slurm_elastico import config
    from slurm_elastico.jobwrap.options import split_argv
    from slurm_elastico.jobwrap.script import payload_from_script
    from slurm_elastico.jobwrap.submit import prepare

    (tmp_path / "f.yaml").write_text("kind: train\nglobal_batch: 8\nmicro_batches: [8]\nprecisions: [fp32]\n"
                                     "checkpointing: [false]\nsteps: 5\nmps_shares: [100]\ngpu_types: [a100]\n")
    (tmp_path / "job.sh").write_text("#!/bin/sh\necho hi\n")
    settings = config.from_mapping({})

    def run(*opts):
        return prepare(split_argv([*opts, "--family", str(tmp_path / "f.yaml"), str(tmp_path / "job.sh")]),
                       settings, {}, sys.executable)

    with pytest.raises(ConfigError, match=r"GPU type\(s\) \['t4'\].*allows only \['a100'\]"):
        run("--gres=gpu:t4:1")
    job = run("--gres=gpu:A100:1")
    assert payload_from_script(job.script).type_limit == ("A100",)


def test_a_type_the_table_lacks_is_refused_by_name_unless_the_settings_declare_it():
    with pytest.raises(UnknownGpuType, match="x1"):
        typed(types={"a100": 40960, "x1": 8192})
    from slurm_elastico.shapes.typed import figures_by_type
    figures = figures_by_type({"x1": {"memory_mib": 8192, "like": "t4"}, "a100": {"memory_mib": 40960}})
    assert figures == {"x1": {"like": "t4"}}
    fam = typed(types={"a100": 40960, "x1": 16384}, figures=figures)
    assert {s.gpu_type for s in fam.shapes} == {"a100", "x1"}


def test_the_settings_declare_an_unknown_type_by_a_known_one_it_resembles():
    from slurm_elastico import config
    from slurm_elastico.shapes.typed import figures_by_type
    cfg = config.from_mapping({"gpu": {"types": {"x1": {"memory_mib": 16384, "like": "T4"}, "a100": {"memory_mib": 40960}}}})
    figures = figures_by_type(cfg.gpu.types)
    assert figures == {"x1": {"like": "T4"}}
    assert resolve("x1", figures).fp32_tflops == KNOWN["t4"].fp32_tflops
    with pytest.raises(ConfigError, match=r"gpu.types.x1.like: 'nope' is not a known GPU type"):
        resolve("x1", {"x1": {"like": "nope"}})


def test_elastico_run_falls_back_to_untyped_shapes_when_a_type_has_no_figures_and_still_reads_typed_names():
    import yaml
    fam, candidates = family_from_spec(yaml.safe_dump(TRAIN), "f", 16384, (("a100", 40960), ("x9", 16384)))
    assert all(not c.gpu_type for c in candidates)
    shape, origin = choose_shape(fam, candidates, "elastico:shape=mb64-fp32-mps100@x9", None, 100, 1, "x9")
    assert (shape.name, origin) == ("mb64-fp32-mps100", "AdminComment")


def test_with_no_site_type_the_order_slurm_lists_two_near_equal_types_in_does_not_pick_one():
    """Review finding: with no gpu.type, the family's figures stood for the first type with sigma 0, every other
    type's were discounted, so of two near-equal types the one Slurm listed first won whatever their figures."""
    from slurm_elastico.shapes.type_speed import discounted
    figures = {"slow": {"like": "a100", "fp32_tflops": 19.0}, "fast": {"like": "a100", "fp32_tflops": 19.8}}
    spec = parse_spec(load_yaml(BIG, "x"), "x")
    for order in (("slow", "fast"), ("fast", "slow")):
        types = {t: 40960 for t in order}
        shapes = enumerate_typed(spec, types, figures=figures)
        got = {s.name: discounted(s.throughput, s.throughput_sigma) for s in shapes}
        assert got["mb64-fp32-mps100@fast"] > got["mb64-fp32-mps100@slow"], order


def test_a_floor_near_the_familys_own_figure_still_admits_its_shapes_on_an_uncertain_type():
    """Review finding: the anchor's new uncertainty, discounted, put a family whose floor is 90 % of its own
    figure below its floor on every type: the helper never started it. The floor holds against the expected
    speed (as `planner.exact` does); the discount only ranks near ties."""
    import numpy as np

    from slurm_elastico.planner.slowdown import PairCache
    from slurm_elastico.planner.tables import fill_tables, make_table
    data = dict(TRAIN, precisions=["fp32"], micro_batches=[32, 64], gpu_types=["t4"])
    best = max(s.throughput for s in parse_family(dict(data), "fam.yaml", 15360).shapes)
    types = {"t4": 15360, "a100": 40960}
    fam = parse_family(dict(data, throughput_floor=0.9 * best), "fam.yaml", 15360, gpu_types=types)
    assert all(s.throughput_sigma > 0 for s in fam.shapes)  # no site type: the first one is uncertain too
    cache = PairCache(None)
    table = make_table(fam, cache, 100, tuple(types))
    fill_tables([table], cache, np.array([100.0, 15360.0, 16.0, 64000.0]), 100, tuple(types))
    expected = [s.throughput >= 0.9 * best for s in fam.shapes]
    assert any(expected) and table.allowed.tolist() == expected


def test_a_planner_can_discount_an_uncertain_throughput():
    from slurm_elastico.shapes.type_speed import discounted
    assert discounted(2.0, 0.0) == 2.0
    assert discounted(2.0, 0.1) > discounted(2.0, 0.3) and discounted(2.0, 0.3) < 2.0


BIG = """
kind: train
name: big
global_batch: 64
micro_batches: [8, 64]
precisions: [fp32]
checkpointing: [false]
steps: 100
mps_shares: [100]
cpus: 1
host_mem_mib: 1024
model: {params: 1.0e+8, activation_mib_per_sample: 400, step_time_s: 1.0}
"""


def test_elastico_run_knows_the_shapes_of_a_type_declared_like_a_known_one(tmp_path):
    # gpu.types.h200x.like: h100 reaches elastico-run in the payload, so it runs the @h200x shape the helper names
    # (without the figures it fell back to the untyped shapes and ran its default).
    types = {"t4": 15360, "h200x": 143000}
    figures = {"h200x": {"like": "h100"}}
    helper = build_typed_family(parse_spec(load_yaml(BIG, "x"), "x"), types, figures=figures)
    assert "mb64-fp32-mps100@h200x" in {s.name for s in helper.shapes}
    payload = Payload(script=b"#!/bin/sh\n", script_name="job.sh", args=(), family_spec=BIG, family_source="f.yaml",
                      gpu_memory_mib=16384, grace_s=5, signal_lead_s=60, gpu_types=tuple(types.items()),
                      type_like=(("h200x", "h100"),))
    back = Payload.decode(payload.encode())
    assert back.type_like == (("h200x", "h100"),)
    fam, cands = family_from_spec(back.family_spec, "x", back.gpu_memory_mib, back.gpu_types, (),
                                  {t: {"like": k} for t, k in back.type_like})
    shape, why = choose_shape(fam, cands, "elastico:shape=mb64-fp32-mps100@h200x", 100, 100, None, "")
    assert shape.name == "mb64-fp32-mps100@h200x", why


def test_a_requested_type_stays_on_its_slurm_name_where_another_name_is_the_same_card():
    """Slurm matches a job's `gpu:dgx:1` on nodes of type dgx only; dgx-ext is the same A100 card under another
    name. The family of a job that asked dgx had shapes on both, so the helper moved it to dgx-ext. A family's
    own type word still finds the cluster's type of the same card (`A100` -> a100-sxm4-40gb)."""
    import yaml

    types = {"dgx": 40960, "dgx-ext": 40960, "aws": 15360}
    fam = parse_family(yaml.safe_load(limited(yaml.safe_dump(TRAIN), "job 1", ("dgx",))), "job 1", 16384,
                       gpu_types=types)
    assert {s.gpu_type for s in fam.shapes} == {"dgx"}
    own = parse_family({**TRAIN, "gpu_types": ["A100"]}, "f", 16384, gpu_types={"a100-sxm4-40gb": 40960, "t4": 15360})
    assert {s.gpu_type for s in own.shapes} == {"a100-sxm4-40gb"}


@pytest.mark.parametrize("anchor", ["a100", "A100", "nvidia_a100"])
def test_the_anchor_type_is_found_however_the_settings_spell_it(anchor):
    """The family's figures are for the anchor type (`gpu.type`); spelt otherwise than Slurm's name, the anchor was
    taken to be the cluster's first type (t4) and every A100 speed came out 2.4 times too high."""
    spec = parse_spec(dict(TRAIN), "fam.yaml")
    got = {s.name: s.throughput for s in enumerate_typed(spec, {"t4": 15360, "a100": 40960}, anchor=anchor)}
    from slurm_elastico.shapes.enumerate import enumerate_shapes

    plain = {s.name: s.throughput for s in enumerate_shapes(spec, 40960, {})}
    name = next(n for n in plain if n.startswith("mb64-fp32"))
    assert got[f"{name}@a100"] == pytest.approx(plain[name]) and got[f"{name}@t4"] < plain[name]


def test_the_helper_gives_its_families_directory_the_store(tmp_path):
    from slurm_elastico.config import from_mapping
    from slurm_elastico.helper.metrics import Metrics
    from slurm_elastico.helper.service import open_service

    (tmp_path / "fams").mkdir()
    service = open_service(from_mapping({"state_dir": str(tmp_path)}), None, families_dir=str(tmp_path / "fams"),
                           dry_run=False, metrics=Metrics(), metrics_file=None, log=lambda level, line: None)
    try:
        assert service.families.store is service.store
    finally:
        service.store.close()


def test_an_inference_speed_measured_as_predicted_on_one_type_leaves_the_others_as_predicted():
    """An engine's speed depends on how many sequences its GPU's memory holds, which the family's figure on each
    type already counts. A job that measured on the A100 80GB exactly its figure there moved its L4 estimate by
    18 %: the A100's concurrency was carried to the L4 by the specs' ratio alone."""
    spec = parse_spec({"kind": "infer", "requests": 1000, "gpu_memory_utilization": [0.9], "max_num_seqs": [256],
                       "kv_cache_dtype": ["auto"], "mps_shares": [100],
                       "model": {"weights_mib": 9000, "kv_mib_per_seq": 128}}, "f")
    types = {"a100-80gb": 81920, "l4": 24576}
    before = {s.name: s for s in enumerate_typed(spec, types, anchor="a100-80gb")}
    a100 = next(s for n, s in before.items() if n.endswith("@a100-80gb"))
    l4 = before[a100.name.replace("@a100-80gb", "@l4")]
    base = a100.name.partition("@")[0]
    after = {s.name: s for s in enumerate_typed(spec, types, anchor="a100-80gb",
                                                measured={base: {"a100-80gb": a100.throughput}})}
    assert after[a100.name].throughput == pytest.approx(a100.throughput)
    assert after[l4.name].throughput == pytest.approx(l4.throughput, rel=1e-6)
    twice = {s.name: s for s in enumerate_typed(spec, types, anchor="a100-80gb",
                                                measured={base: {"a100-80gb": 2 * a100.throughput}})}
    assert twice[l4.name].throughput == pytest.approx(2 * l4.throughput, rel=1e-6)  # the job's own scale carries
