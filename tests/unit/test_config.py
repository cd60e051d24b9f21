"""Settings: defaults, every problem reported at once, valid keys listed."""

import os

import pytest

from slurm_elastico import config
from slurm_elastico.errors import ConfigError


def test_defaults_when_empty():
    s = config.from_mapping(None)
    assert s.planner.fairness == "waiting" and s.gpu.shares_per_gpu == 100


def test_values_are_read_and_typed(tmp_path):
    p = tmp_path / "elastico.yaml"
    p.write_text("state_dir: /srv/e\nplanner:\n  rounds: 5\n  step: 1\ninterference:\n  floor: 0.5\n")
    s = config.load(p)
    assert (s.state_dir, s.planner.rounds, s.planner.step, s.interference.floor) == ("/srv/e", 5, 1.0, 0.5)
    assert isinstance(s.planner.step, float)


def test_every_problem_in_one_message(tmp_path):
    p = tmp_path / "elastico.yaml"
    p.write_text("bogus: 1\nplanner:\n  rounds: zero\n  fairness: lottery\n  colour: red\ngpu:\n  shares_per_gpu: 500\n")
    with pytest.raises(ConfigError) as e:
        config.load(p)
    msg = str(e.value)
    assert len(e.value.problems) == 5
    assert str(p) in msg
    assert "bogus: unknown key" in msg and "planner.rounds: expected int" in msg
    assert "'lottery' is not one of 'waiting', 'remaining', 'equal'" in msg
    assert "planner.colour: unknown key; valid keys here: planner.policy" in msg
    assert "gpu.shares_per_gpu: 500 is above the maximum 100" in msg


def test_section_must_be_mapping():
    with pytest.raises(ConfigError, match="planner: expected a mapping"):
        config.from_mapping({"planner": [1, 2]})


def test_bool_is_not_int():
    with pytest.raises(ConfigError, match="planner.rounds: expected int, got bool"):
        config.from_mapping({"planner": {"rounds": True}})


def test_invalid_yaml_and_missing_env_file(tmp_path, monkeypatch):
    bad = tmp_path / "bad.yaml"
    bad.write_text("planner: [unclosed\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        config.load(bad)
    monkeypatch.setenv(config.ENV_VAR, str(tmp_path / "missing.yaml"))
    with pytest.raises(ConfigError, match="does not exist"):
        config.load()


def test_shipped_example_is_valid():
    from pathlib import Path

    example = Path(__file__).resolve().parents[2] / "etc" / "elastico.yaml"
    s = config.load(example)  # raises ConfigError if the example drifted from the schema
    assert s.planner.reserve_queue_head is True and s.slurm.timeout_s == 30.0
    assert set(config.valid_keys()) >= {"planner.fairness", "interference.floor", "slurm.conf"}


@pytest.mark.parametrize("data, expected", [
    ({"planner": {"step": float("nan")}}, "planner.step: expected float (finite), got float nan"),
    ({"planner": {"reshape_cost_s": float("inf")}}, "planner.reshape_cost_s: expected float (finite), got float inf"),
    ({"gpu": {"memory_mib": 10**15}}, "gpu.memory_mib: 1000000000000000 is above the maximum 16777216; "
                                          "allowed: from 1 to 16777216"),
    ({"planner": {"step": 1e9}}, "planner.step: 1000000000.0 is above the maximum 1000; allowed: from 0 to 1000"),
    ({"state_dir": "x" * 5000}, f"state_dir: 5000 characters; allowed: at most {config.MAX_TEXT}"),
])
def test_absurd_values_are_refused(data, expected):
    with pytest.raises(ConfigError) as err:
        config.from_mapping(data, "e.yaml")
    assert err.value.problems == (expected,)


def test_limits_keep_ordinary_values():
    s = config.from_mapping({"gpu": {"memory_mib": 196608}, "planner": {"step": 2, "reshape_cost_s": 600},
                             "state_dir": "/srv/" + "d" * 100})
    assert (s.gpu.memory_mib, s.planner.step, s.planner.reshape_cost_s) == (196608, 2.0, 600.0)


def test_the_file_is_read_strictly(tmp_path):
    f = tmp_path / "e.yaml"
    f.write_text("planner:\n  rounds: 5\nplanner:\n  rounds: 6\n")
    with pytest.raises(ConfigError, match="duplicate key 'planner'"):
        config.load(f)
    fifo = tmp_path / "fifo.yaml"
    os.mkfifo(fifo)
    with pytest.raises(ConfigError, match="FIFO"):
        config.load(fifo)


# ----------------------------------------------------------------------------- paths checked on this host

def _settings_file(tmp_path, text: str):
    p = tmp_path / "elastico.yaml"
    p.write_text(text)
    return p


def test_a_state_dir_that_is_a_regular_file_is_refused_naming_key_path_kind_and_what_is_allowed(tmp_path):
    (tmp_path / "statefile").write_text("")
    p = _settings_file(tmp_path, f"state_dir: {tmp_path / 'statefile'}\n")
    with pytest.raises(ConfigError) as err:
        config.load(p)
    assert err.value.source == str(p)
    assert err.value.problems == (f"state_dir: {tmp_path / 'statefile'} is a regular file; allowed: a directory, "
                                  "or a path that can be created as one",)


def test_a_state_dir_below_a_regular_file_cannot_be_created_and_an_empty_one_is_refused(tmp_path):
    (tmp_path / "statefile").write_text("")
    p = _settings_file(tmp_path, f"state_dir: {tmp_path / 'statefile' / 'a' / 'b'}\n")
    with pytest.raises(ConfigError, match=f"state_dir: {tmp_path}/statefile/a/b cannot be created: "
                                          f"{tmp_path}/statefile is a regular file; allowed: a directory"):
        config.load(p)
    p = _settings_file(tmp_path, "state_dir: ''\n")
    with pytest.raises(ConfigError, match="state_dir: empty; allowed: a directory"):
        config.load(p)


def test_a_state_dir_that_exists_as_a_directory_or_can_be_created_is_accepted(tmp_path):
    (tmp_path / "state").mkdir()
    for state in (tmp_path / "state", tmp_path / "new" / "deeper"):
        assert config.load(_settings_file(tmp_path, f"state_dir: {state}\n")).state_dir == str(state)
    assert not (tmp_path / "new").exists()  # checking creates nothing


def test_a_slurm_conf_that_is_missing_or_not_a_regular_file_is_refused(tmp_path):
    (tmp_path / "confdir").mkdir()
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "slurm.conf").write_text("ClusterName=c\n")
    allowed = "allowed: the path of the cluster's slurm.conf (a regular file), or empty for Slurm's default"
    for name, what in (("nosuch.conf", "does not exist"), ("confdir", "is a directory"),
                       ("fifo", "is a FIFO (named pipe)")):
        p = _settings_file(tmp_path, f"state_dir: {tmp_path}\nslurm:\n  conf: {tmp_path / name}\n")
        with pytest.raises(ConfigError) as err:
            config.load(p)
        assert err.value.problems == (f"slurm.conf: {tmp_path / name} {what}; {allowed}",)
    for conf in (tmp_path / "slurm.conf", ""):
        assert config.load(_settings_file(tmp_path, f"state_dir: {tmp_path}\nslurm:\n  conf: '{conf}'\n"))


def test_every_path_problem_is_reported_at_once(tmp_path):
    (tmp_path / "statefile").write_text("")
    p = _settings_file(tmp_path, f"state_dir: {tmp_path / 'statefile'}\nslurm:\n  conf: {tmp_path / 'no.conf'}\n")
    with pytest.raises(ConfigError) as err:
        config.load(p)
    assert [q.split(":")[0] for q in err.value.problems] == ["state_dir", "slurm.conf"]


def test_elastico_config_refuses_a_state_dir_that_is_a_file(tmp_path):
    from click.testing import CliRunner

    from slurm_elastico.cli import main

    (tmp_path / "statefile").write_text("")
    p = _settings_file(tmp_path, f"state_dir: {tmp_path / 'statefile'}\n")
    result = CliRunner().invoke(main, ["--config", str(p), "config"])
    assert result.exit_code == 2
    assert f"state_dir: {tmp_path / 'statefile'} is a regular file; allowed: a directory" in result.output
