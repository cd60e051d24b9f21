"""gpu.types: each GPU type's memory (and MPS shares) in elastico.yaml, and each bad input named with what is allowed."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from slurm_elastico import config
from slurm_elastico.cli import main
from slurm_elastico.errors import ConfigError


def test_types_are_read_with_their_memory_and_shares():
    s = config.from_mapping({"gpu": {"memory_mib": 16384, "shares_per_gpu": 100, "types": {
        "a100": {"memory_mib": 40960}, "t4": {"memory_mib": 15360, "shares_per_gpu": 100}}}})
    assert s.gpu.types["a100"] == config.GpuTypeSettings(memory_mib=40960, shares_per_gpu=0)
    assert (s.gpu.memory_of("a100"), s.gpu.memory_of("t4"), s.gpu.memory_of("")) == (40960, 15360, 16384)
    with pytest.raises(ConfigError, match="'T4' has no memory"):  # Slurm's type names are case-sensitive
        s.gpu.memory_of("T4")
    assert s.gpu.type_memory() == {"a100": 40960, "t4": 15360}


def test_a_type_with_other_mps_shares_than_every_gpu_is_refused_not_ignored():
    # The planner, the gateway and elastico-submit count every GPU's shares by gpu.shares_per_gpu: a T4 of 50
    # shares would be given mps:50 as half a GPU when it is the whole of it.
    with pytest.raises(ConfigError) as e:
        config.from_mapping({"gpu": {"shares_per_gpu": 100, "types": {"t4": {"memory_mib": 15360,
                                                                             "shares_per_gpu": 50}}}})
    assert e.value.problems == ("gpu.types.t4.shares_per_gpu: 50 differs from gpu.shares_per_gpu (100); allowed: 0 "
                                "or 100 (every GPU must have the same MPS shares: per-type counts are not supported "
                                "yet)",)


def test_a_one_type_cluster_keeps_working_unchanged():
    s = config.from_mapping({"gpu": {"memory_mib": 32768}})
    assert s.gpu.types == {} and s.gpu.type_memory() == {}
    assert s.gpu.memory_of("") == s.gpu.memory_of("v100") == 32768  # every type has gpu.memory_mib


def test_a_type_without_memory_is_named_with_the_types_configured():
    s = config.from_mapping({"gpu": {"types": {"a100": {"memory_mib": 40960}, "t4": {"memory_mib": 15360}}}})
    with pytest.raises(ConfigError) as e:
        s.gpu.memory_of("h100")
    assert "GPU type 'h100' has no memory configured; gpu.types names a100, t4" in str(e.value)
    assert "add gpu.types.h100.memory_mib" in str(e.value)


@pytest.mark.parametrize("types,problem", [
    (["a100"], "gpu.types: expected a mapping of GPU type to its settings (e.g. {a100: {memory_mib: 40960}}), "
               "got list"),
    ({"a100": {"memory": 1}}, "gpu.types.a100.memory: unknown key; valid keys here: gpu.types.a100.memory_mib, "
                              "gpu.types.a100.shares_per_gpu"),
    ({"a100": {}}, "gpu.types.a100.memory_mib: missing; allowed: a number from 1 to 16777216"),
    ({"a100": None}, "gpu.types.a100.memory_mib: missing"),
    ({"a100": 40960}, "gpu.types.a100: expected a mapping, got int"),
    ({"a100": {"memory_mib": "40G"}}, "gpu.types.a100.memory_mib: expected int, got str"),
    ({"a100": {"memory_mib": 0}}, "gpu.types.a100.memory_mib: 0 is below the minimum 1"),
    ({"a100": {"memory_mib": 40960, "shares_per_gpu": 101}}, "gpu.types.a100.shares_per_gpu: 101 is above the "
                                                             "maximum 100"),
    ({"a 100": {"memory_mib": 1}}, "gpu.types: 'a 100' is not a GPU type name; allowed: letters, digits, _ . -"),
    # a type the helper cannot estimate is said here, not in every family it builds later
    ({"mi250": {"memory_mib": 1}}, "gpu.types.mi250: unknown GPU type, so its speed cannot be estimated"),
    ({"mi250": {"memory_mib": 1, "like": "mi300"}}, "gpu.types.mi250.like: 'mi300' is not a known GPU type"),
    ({"gpu:a100": {"memory_mib": 1}}, "gpu.types: 'gpu:a100' is not a GPU type name"),
])
def test_each_bad_input_is_named_with_what_is_allowed(types, problem):
    with pytest.raises(ConfigError) as e:
        config.from_mapping({"gpu": {"types": types}})
    assert any(p.startswith(problem) for p in e.value.problems), e.value.problems
    # one problem each; a misspelt key also leaves the memory missing, which is said too
    assert len(e.value.problems) == (2 if types == {"a100": {"memory": 1}} else 1), e.value.problems


def test_bad_types_are_reported_with_every_other_problem_at_once():
    with pytest.raises(ConfigError) as e:
        config.from_mapping({"gpu": {"memory_mib": -1, "types": {"a100": {}, "t4": {"speed": 2}}}, "bogus": 1})
    assert len(e.value.problems) == 5  # memory_mib, a100's memory, t4's unknown key and missing memory, bogus


def test_valid_keys_and_config_keys_list_the_type_keys():
    keys = config.valid_keys()
    assert "gpu.types.TYPE.memory_mib" in keys and "gpu.types.TYPE.shares_per_gpu" in keys
    done = CliRunner().invoke(main, ["config", "--keys"])
    assert done.exit_code == 0 and "gpu.types.TYPE.memory_mib" in done.output.split()


def test_elastico_config_prints_the_types_in_force(tmp_path):
    path = tmp_path / "elastico.yaml"
    path.write_text(f"state_dir: {tmp_path}\ngpu:\n  types:\n    a100: {{memory_mib: 40960}}\n")
    done = CliRunner().invoke(main, ["--config", str(path), "config"])
    assert done.exit_code == 0, done.output
    assert "types:\n    a100:\n      memory_mib: 40960\n      shares_per_gpu: 0" in done.output
